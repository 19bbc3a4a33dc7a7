"""The generated SystolicArray Verilog on Verilator, through cocotb_tools.runner: both dataflows
at 4x4 and 8x8, plus the ECP5 elaboration (MULT18X18D multipliers) against a behavioural model
of that primitive. The cocotb side is tests/hw/cocotb_array.py; builds are cached per config
hash and design hash (systolic.sim.tools.cocotb_build)."""

from __future__ import annotations

import json
import shutil

import pytest
from systolic.hw.array import SystolicArray
from systolic.hw.config import AcceleratorConfig
from systolic.sim.tools import cocotb_build, cocotb_test, to_verilog

TOP = "systolic_array"
SEED = 20240601


class _Ecp5Stand:
    """Stands in for an Amaranth Lattice ECP5 platform: elaboration reads only ``family``."""
    family = "ecp5"


def _mult18x18d_model() -> str:
    """Behavioural Verilog of the Lattice MULT18X18D in the mode PipelinedMultiplier uses
    (A, B and output registers on CLK0/CE0/RST0, synchronous reset, no pipeline register); any
    other mode stops the simulation."""
    bits = {"A": 18, "B": 18, "C": 18}
    ports = [f"{p}{n}" for p, width in bits.items() for n in range(width)]
    ports += ["SIGNEDA", "SIGNEDB", "SOURCEA", "SOURCEB"]
    ports += [f"{s}{n}" for s in ("CLK", "CE", "RST") for n in range(4)]
    outputs = [f"P{n}" for n in range(36)]
    lines = ["/* verilator lint_off UNUSEDSIGNAL */", "module MULT18X18D #("]
    params = ["REG_INPUTA_CLK", "REG_INPUTA_CE", "REG_INPUTA_RST", "REG_INPUTB_CLK", "REG_INPUTB_CE",
              "REG_INPUTB_RST", "REG_OUTPUT_CLK", "REG_OUTPUT_CE", "REG_OUTPUT_RST", "RESETMODE"]
    lines.append(",\n".join(f'  parameter {p} = "NONE"' for p in params))
    lines.append(") (")
    lines.append(",\n".join([f"  input {p}" for p in ports] + [f"  output {p}" for p in outputs]))
    lines.append(");")
    lines.append(f"  wire [17:0] a = {{{', '.join(f'A{n}' for n in reversed(range(18)))}}};")
    lines.append(f"  wire [17:0] b = {{{', '.join(f'B{n}' for n in reversed(range(18)))}}};")
    lines.append("""  reg [17:0] ra = 0, rb = 0;
  reg sa = 0, sb = 0;
  reg [35:0] rp = 0;
  wire signed [36:0] ea = sa ? {{19{ra[17]}}, ra} : {19'b0, ra};
  wire signed [36:0] eb = sb ? {{19{rb[17]}}, rb} : {19'b0, rb};
  wire signed [73:0] product = ea * eb;
  initial begin
    if (REG_INPUTA_CLK != "CLK0" || REG_INPUTB_CLK != "CLK0" || REG_OUTPUT_CLK != "CLK0" ||
        REG_INPUTA_CE != "CE0" || REG_INPUTB_CE != "CE0" || REG_OUTPUT_CE != "CE0" ||
        REG_INPUTA_RST != "RST0" || REG_INPUTB_RST != "RST0" || REG_OUTPUT_RST != "RST0" ||
        RESETMODE != "SYNC")
      $fatal(1, "MULT18X18D model: unsupported register mode");
  end
  always @(posedge CLK0) begin
    if (RST0) begin
      ra <= 0; rb <= 0; sa <= 0; sb <= 0; rp <= 0;
    end else if (CE0) begin
      ra <= a; rb <= b; sa <= SIGNEDA; sb <= SIGNEDB; rp <= product[35:0];
    end
  end""")
    lines += [f"  assign P{n} = rp[{n}];" for n in range(36)]
    lines.append("endmodule")
    return "\n".join(lines) + "\n"


#: Only the array's ports are visible to cocotb (it drives and reads nothing else), and the C++ is
#: compiled without optimization: the simulation takes seconds, the build less than half as long
#: (8x8: 17 s instead of 40 s here).
BUILD_ARGS = ("--no-public-flat-rw", "--public-depth", "1", "-CFLAGS", "-O0")

CASES = [
    pytest.param("ws", 4, 4, False, {}, id="ws-4x4"),
    pytest.param("ws", 8, 8, False, {}, id="ws-8x8"),
    pytest.param("os", 4, 4, False, {}, id="os-4x4"),
    pytest.param("os", 8, 8, False, {}, id="os-8x8"),
    pytest.param("ws", 4, 4, True, {}, id="ws-4x4-ecp5"),
    # 16-bit operands: products wider than 18 bits, so the sign pins of the DSP matter
    pytest.param("os", 4, 4, True, {"input_bits": 16, "weight_bits": 16}, id="os-4x4-int16-ecp5"),
]


@pytest.mark.slow
@pytest.mark.parametrize("dataflow, rows, cols, ecp5, kwargs", CASES)
def test_array_on_verilator(dataflow: str, rows: int, cols: int, ecp5: bool, kwargs: dict) -> None:
    config = AcceleratorConfig(rows=rows, cols=cols, dataflow=dataflow, **kwargs)
    verilog = to_verilog(SystolicArray(config), TOP, platform=_Ecp5Stand() if ecp5 else None)
    if ecp5:
        assert verilog.count("MULT18X18D ") == rows * cols
        verilog += _mult18x18d_model()
    build = cocotb_build(verilog, TOP, config.hash_hex + ("-ecp5" if ecp5 else ""), build_args=BUILD_ARGS)
    results = cocotb_test(build, TOP, "tests.hw.cocotb_array", seed=SEED,
                          extra_env={"SYSTOLIC_ARRAY_CONFIG": json.dumps(config.to_dict())})
    shutil.rmtree(results.parent)       # a failed run keeps its directory for a look
