"""The ``systolic`` command line: every subcommand, and every user error as one line without a traceback."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from systolic.compiler.asm import assemble, disassemble
from systolic.compiler.cli import build_parser, config_fields_markdown, main
from systolic.hw.config import AcceleratorConfig
from systolic.hw.isa import ISA_VERSION, Instruction, Opcode, Program

PROGRAM = """\
# GEMM tile: C[16x8] = A[16x8] @ B[8x8]
LOAD dst=spad dram_addr=0x1000 pitch_y=8 pitch_c=1 rows_outer=1 rows_inner=16 inner_dy=1 segs=1 \
seg_len=8 elem_dc=1
LOAD dst=spad dst_addr=16 dram_addr=0x2000 pitch_y=8 pitch_c=1 rows_outer=1 rows_inner=8 inner_dy=1 segs=1 \
seg_len=8 elem_dc=1 push_next
COMPUTE b_addr=16 m=16 k=8 n=8 preload pop_prev push_next
STORE n=8 in_h=16 in_w=1 out_h=16 out_w=1 dram_addr=0x4000 pitch_y=32 pitch_c=4 out_type=raw pop_prev
FINISH
"""


def run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_user_error(result: tuple[int, str, str], code: int, message: str) -> None:
    """Exit status ``code``, nothing on stdout, one line ``systolic: error: ...`` matching the
    regex ``message`` on stderr, no traceback."""
    status, out, err = result
    assert status == code, err
    assert out == ""
    assert "Traceback" not in err
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert re.match(r"^systolic: error: " + message + r"\n\Z", err), err


# -- config --------------------------------------------------------------------------------------

def test_config_default(capsys) -> None:
    code, out, err = run(capsys, "config")
    assert (code, err) == (0, "")
    assert out == AcceleratorConfig().describe() + "\n"


def test_config_file_overrides_json_and_out(capsys, tmp_path) -> None:
    source = tmp_path / "in.toml"
    source.write_text("rows = 16\ncols = 4\n")
    saved = tmp_path / "out.toml"
    code, out, err = run(capsys, "config", source, "--set", "dataflow=os", "--set", 'sfu_pooling=["max"]',
                         "--set", "clock_mhz=125", "--set", "sfu_residual = false", "--json", "--out", saved)
    assert (code, err) == (0, "")
    expected = AcceleratorConfig(rows=16, cols=4, dataflow="os", sfu_pooling=("max",), clock_mhz=125.0,
                                 sfu_residual=False)
    report = json.loads(out)
    assert report["fields"] == expected.to_dict()
    assert report["hash"] == expected.hash_hex
    assert report["derived"]["spad_rows"] == expected.spad_rows == 4096
    assert report["derived"]["acc_rows"] == expected.acc_rows == 1024
    assert report["derived"]["output_range"] == [-128, 127]
    assert AcceleratorConfig.from_toml(saved) == expected


def test_config_help_fields(capsys) -> None:
    code, out, _ = run(capsys, "config", "--help-fields")
    assert code == 0 and out == config_fields_markdown()
    assert out.count("\n") == 2 + len(AcceleratorConfig().to_dict())


def test_config_errors(capsys, tmp_path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("rows = = 8\n")
    assert_user_error(run(capsys, "config", bad), 1, re.escape(f"{bad}: not valid TOML: ") + ".*")
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("rows = 8\nbanks = 4\n")
    assert_user_error(run(capsys, "config", unknown), 1,
                      re.escape(f"{unknown}: unknown field 'banks'; known fields are acc_bits, ") + ".*")
    table = tmp_path / "table.toml"
    table.write_text("[array]\nrows = 8\n")
    assert_user_error(run(capsys, "config", table), 1, re.escape(
        f"{table}: tables are not used in a config file; write fields at top level, not [array]"))
    missing = tmp_path / "missing.toml"
    assert_user_error(run(capsys, "config", missing), 1,
                      re.escape(f"{missing}: cannot read config file: No such file or directory"))
    assert_user_error(run(capsys, "config", tmp_path), 1,
                      re.escape(f"{tmp_path}: cannot read config file: Is a directory"))
    assert_user_error(run(capsys, "config", "--set", "rows=12"), 1,
                      re.escape("rows must be a power of two between 2 and 64, not 12"))
    assert_user_error(run(capsys, "config", "--set", "row=16"), 1,
                      re.escape("--set: unknown field 'row'; known fields are acc_bits, ") + ".*")
    assert_user_error(run(capsys, "config", "--set", "rows"), 2,
                      re.escape("--set expects field=value, not 'rows'"))
    assert_user_error(run(capsys, "config", "--set", "rows=[1,"), 2, re.escape(
        "--set rows: '[1,' is not a TOML value (write e.g. 16, true, \"os\" or [\"relu\"])"))
    assert_user_error(run(capsys, "config", "--set", "rows=sixteen"), 1,
                      re.escape("rows must be an integer, not 'sixteen'"))
    assert_user_error(run(capsys, "config", "--out", tmp_path / "no" / "such" / "dir.toml"), 1,
                      re.escape(f"{tmp_path / 'no' / 'such' / 'dir.toml'}: cannot write config: "
                                f"No such file or directory"))


# -- asm / disasm --------------------------------------------------------------------------------

def test_asm_then_disasm(capsys, tmp_path) -> None:
    source = tmp_path / "gemm.s"
    source.write_text(PROGRAM)
    binary = tmp_path / "gemm.bin"
    config = AcceleratorConfig()
    code, out, err = run(capsys, "asm", source, "-o", binary)
    assert (code, err) == (0, "")
    assert out == f"{binary}: 5 instructions for config {config.hash_hex}\n"
    instrs = assemble(PROGRAM)
    assert binary.read_bytes() == Program(tuple(instrs), config.hash).to_bytes()

    code, out, err = run(capsys, "disasm", binary)
    assert (code, err) == (0, "")
    header, body = out.split("\n", 1)
    assert header == (f"# systolic program: ISA version {ISA_VERSION}, config {config.hash_hex}, "
                      "5 instructions")
    assert body == disassemble(instrs)

    # The listing assembles back to the same binary (the header line is a comment).
    listing = tmp_path / "again.s"
    listing.write_text(out)
    again = tmp_path / "again.bin"
    assert run(capsys, "asm", listing, "--output", again)[0] == 0
    assert again.read_bytes() == binary.read_bytes()


def test_asm_and_disasm_with_config(capsys, tmp_path) -> None:
    config = AcceleratorConfig(rows=16, cols=16)
    config_file = tmp_path / "c16.toml"
    config.save(config_file)
    source = tmp_path / "p.s"
    source.write_text("SYNC queue=compute push_next\nFINISH\n")
    binary = tmp_path / "p.bin"
    assert run(capsys, "asm", source, "-o", binary, "--config", config_file)[0] == 0
    program = Program.from_bytes(binary.read_bytes())
    assert program.config_hash == config.hash
    assert program.instructions == (Instruction(Opcode.SYNC, queue=1, push_next=1),
                                    Instruction(Opcode.FINISH))
    code, out, _ = run(capsys, "disasm", binary, "--config", config_file)
    assert code == 0 and out.endswith("SYNC queue=compute push_next\nFINISH\n")

    # The default config has another hash: a mismatch names both.
    default = tmp_path / "default.toml"
    AcceleratorConfig().save(default)
    assert_user_error(run(capsys, "disasm", binary, "--config", default), 1, re.escape(
        f"{binary}: program was built for config {config.hash_hex}, but the accelerator's config is "
        f"{AcceleratorConfig().hash_hex}; recompile for this config"))


def test_asm_errors(capsys, tmp_path) -> None:
    bad = tmp_path / "bad.s"
    bad.write_text("FINISH\n\nCOMPUTE m=16 k=300000\n")
    out = tmp_path / "bad.bin"
    assert_user_error(run(capsys, "asm", bad, "-o", out), 1, re.escape(
        f"{bad}:3: COMPUTE field k must be in [0, 65535] (16-bit unsigned), not 300000"))
    assert not out.exists()
    bad.write_text("LOAD dst=dram\n")
    assert_user_error(run(capsys, "asm", bad, "-o", out), 1,
                      re.escape(f"{bad}:1: LOAD field dst must be one of spad, acc, table, not 'dram'"))
    missing = tmp_path / "missing.s"
    assert_user_error(run(capsys, "asm", missing, "-o", out), 1,
                      re.escape(f"{missing}: cannot read assembly source: No such file or directory"))
    binary_junk = tmp_path / "junk.s"
    binary_junk.write_bytes(b"FINISH\n\xff\n")
    assert_user_error(run(capsys, "asm", binary_junk, "-o", out), 1,
                      re.escape(f"{binary_junk}: assembly source must be UTF-8 text (byte 7 is not)"))
    good = tmp_path / "good.s"
    good.write_text("FINISH\n")
    assert_user_error(run(capsys, "asm", good, "-o", tmp_path / "nodir" / "x.bin"), 1,
                      re.escape(f"{tmp_path / 'nodir' / 'x.bin'}: cannot write program: ") + "No such file.*")
    assert_user_error(run(capsys, "asm", good, "-o", out, "--config", tmp_path / "none.toml"), 1,
                      re.escape(f"{tmp_path / 'none.toml'}: cannot read config file: ") + "No such file.*")
    assert_user_error(run(capsys, "asm", good), 2,
                      re.escape("the following arguments are required: -o/--output "
                                "(see 'systolic asm --help')"))


def test_disasm_errors(capsys, tmp_path) -> None:
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x7fELF" + bytes(60))
    assert_user_error(run(capsys, "disasm", junk), 1, re.escape(
        f"{junk}: not a systolic program (magic must be b'SYST', not b'\\x7fELF')"))
    good = Program((Instruction(Opcode.FINISH),) * 2, 7).to_bytes()
    truncated = tmp_path / "truncated.bin"
    truncated.write_bytes(good[:-10])
    assert_user_error(run(capsys, "disasm", truncated), 1, re.escape(
        f"{truncated}: header says 2 instructions (160 bytes) but the file has 150 bytes"))
    corrupt = tmp_path / "corrupt.bin"
    corrupt.write_bytes(good[:32 + 64] + b"\x0f" + good[32 + 65:])
    assert_user_error(run(capsys, "disasm", corrupt), 1,
                      re.escape(f"{corrupt}: instruction 1: field opcode: illegal opcode 15"))
    assert_user_error(run(capsys, "disasm", tmp_path / "none.bin"), 1,
                      re.escape(f"{tmp_path / 'none.bin'}: cannot read program: No such file or directory"))


# -- demo and the parser -------------------------------------------------------------------------

def test_usage_errors(capsys) -> None:
    assert_user_error(run(capsys), 2, re.escape("the following arguments are required: COMMAND "
                                                "(see 'systolic --help')"))
    assert_user_error(run(capsys, "frobnicate"), 2,
                      re.escape("argument COMMAND: invalid choice: 'frobnicate' ") + ".*")
    assert_user_error(run(capsys, "config", "--jsn"), 2,
                      re.escape("unrecognized arguments: --jsn (see 'systolic --help')"))


def test_help(capsys) -> None:
    code, out, err = run(capsys, "--help")
    assert code == 0 and err == ""
    for command in ("config", "asm", "disasm", "demo"):
        assert re.search(rf"^\s+{command}\s", out, re.M), command
    for command in ("config", "asm", "disasm", "demo"):
        code, out, _ = run(capsys, command, "--help")
        assert code == 0 and out.startswith(f"usage: systolic {command}")


def test_parser_has_only_real_commands() -> None:
    subparsers = next(a for a in build_parser()._actions if a.dest == "command")
    assert list(subparsers.choices) == ["config", "asm", "disasm", "generate", "synth", "compile", "run",
                                        "demo"]


def _console_script() -> str:
    candidates = [Path(sysconfig.get_path("scripts")) / "systolic", Path(sys.executable).parent / "systolic"]
    for path in candidates:
        if path.exists():
            return str(path)
    found = shutil.which("systolic")
    assert found, "the `systolic` console script is not installed: run pip install -e \".[dev]\""
    return found


def test_console_script(tmp_path) -> None:
    script = _console_script()
    done = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.startswith("usage: systolic")
    missing = tmp_path / "missing.toml"
    done = subprocess.run([script, "config", str(missing)], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == f"systolic: error: {missing}: cannot read config file: No such file or directory\n"
