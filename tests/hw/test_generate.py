"""`generate` writes the top-level Verilog, the resolved config and an interface description
that agree with each other."""

from __future__ import annotations

import json
import re

import pytest
from systolic.hw.config import AcceleratorConfig
from systolic.hw.csr import REGISTERS
from systolic.hw.generate import TOP_NAME, generate


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    config = AcceleratorConfig(rows=4, cols=4, scratchpad_bytes=4096, accumulator_bytes=2048,
                               requant_table_rows=8, dma_data_bits=128, dma_max_burst=8)
    out = tmp_path_factory.mktemp("gen")
    return config, generate(config, out)


def test_files_and_config_round_trip(generated):
    config, paths = generated
    assert AcceleratorConfig.from_toml(paths["config_toml"]) == config
    data = json.loads(paths["config_json"].read_text())
    assert data["hash"] == config.hash_hex
    assert AcceleratorConfig.from_dict(data["fields"]) == config


def test_interface_ports_are_the_verilog_ports(generated):
    config, paths = generated
    verilog = paths["verilog"].read_text()
    header = re.search(rf"module {TOP_NAME}\((.*?)\);", verilog, re.S)
    assert header, "no systolic_top module in the Verilog"
    names = {p.strip() for p in header.group(1).split(",")}
    interface = json.loads(paths["interface"].read_text())
    described = {p["name"] for p in interface["ports"]}
    assert names == described
    widths = {}
    top = verilog[header.start():verilog.index("endmodule", header.start())]    # not submodules' ports
    for direction, width, name in re.findall(r"^\s*(input|output)\s+(?:wire\s+|reg\s+)?(\[\d+:0\]\s+)?(\w+);",
                                             top, re.M):
        widths[name] = (direction[:-3] if direction == "output" else "in",
                        int(width.strip()[1:].split(":")[0]) + 1 if width else 1)
    for port in interface["ports"]:
        assert widths[port["name"]] == (port["direction"], port["width"]), port
    assert interface["axi4"]["data_width"] == 128
    assert next(p for p in interface["ports"] if p["name"] == "m_axi_rdata")["width"] == 128


def test_register_map(generated):
    _, paths = generated
    registers = json.loads(paths["interface"].read_text())["registers"]
    offsets = [r["offset"] for r in registers.values()]
    assert len(set(offsets)) == len(offsets) == len(REGISTERS)
    assert all(o % 4 == 0 for o in offsets)
    assert registers["ctrl"]["offset"] == 0 and registers["status"]["offset"] == 4


def test_generate_rejects_a_non_config(tmp_path):
    with pytest.raises(TypeError, match=r"^config must be an AcceleratorConfig, not 'x'$"):
        generate("x", tmp_path)


def test_cli_generate(tmp_path, capsys):
    from systolic.compiler.cli import main

    code = main(["generate", "--rows", "4", "--cols", "2", "--dataflow", "os",
                 "--set", "scratchpad_bytes=4096", "--set", "accumulator_bytes=1024",
                 "--set", "requant_table_rows=4", "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    config = AcceleratorConfig.from_toml(tmp_path / "config.toml")
    assert (config.rows, config.cols, config.dataflow) == (4, 2, "os")
    assert out.startswith(f"config {config.hash_hex}: 4x2 os\n")
    assert (tmp_path / f"{TOP_NAME}.v").read_text().count(f"module {TOP_NAME}(") == 1


def test_cli_generate_rejects_an_invalid_config(tmp_path, capsys):
    from systolic.compiler.cli import main

    code = main(["generate", "--rows", "3", "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    assert err == "systolic: error: rows must be a power of two between 2 and 64, not 3\n"
    assert not (tmp_path / f"{TOP_NAME}.v").exists()
