# amaranth: UnusedElaboratable=no
"""The block-RAM multiplier on ECP5 (hw/pe.py ``PipelinedMultiplier(kind="bram")``): one DP16KD
whose INITVAL parameters hold the quarter-square table, read on both ports through their output
registers.

* hw/bankram.py's INITVAL layout is yosys's: yosys maps a 1024 x 16 amaranth ROM of random words
  to one DP16KD, and its INITVAL parameters equal ``dp16kd_initval`` of the same words.
* In Verilator, with the behavioural DP16KD model (tests/boards/dp16kd_model.v, which reads the
  same layout): every a of the operand range times b at both ends of its range, 0, 1 (-1) and
  random b, under a random enable (stall), each product checked against a * b three enabled
  cycles after its operands. Twice: with the output registers enabled by OCE alone, and by OCE
  and CE.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
from amaranth import Module, Shape, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from systolic.hw.bankram import dp16kd_initval
from systolic.hw.config import int_range
from systolic.hw.pe import PipelinedMultiplier
from systolic.sim.tools import build_cache_dir, to_verilog, yosys_synth

from tests.boards.clocked_testbench import random_top, run_clocked_testbench
from tests.boards.test_memory_ecp5 import MODEL, _instances

SEED = int(os.environ.get("SYSTOLIC_TEST_SEED", "1"))


class _ECP5:
    family = "ecp5"


class _Rom(wiring.Component):
    """A 1024 x 16 ROM of ``words`` with one synchronous read port."""

    def __init__(self, words: list[int]) -> None:
        self.words = words
        super().__init__({"addr": In(10), "data": Out(16)})

    def elaborate(self, platform) -> Module:
        m = Module()
        m.submodules.rom = rom = Memory(shape=16, depth=1024, init=self.words)
        port = rom.read_port()
        m.d.comb += [port.addr.eq(self.addr), self.data.eq(port.data)]
        return m


def test_initval_layout_is_yosys_layout() -> None:
    words = np.random.default_rng(SEED).integers(0, 1 << 16, 1024).tolist()
    netlist = build_cache_dir("synth", f"rom-initval-{SEED}") / "rom.json"
    result = yosys_synth(to_verilog(_Rom(words), "rom"), "rom", "ecp5", netlist=netlist)
    assert result["cells"].get("DP16KD") == 1, result["cells"]
    cell, = [c for c in json.loads(netlist.read_text())["modules"]["rom"]["cells"].values()
             if c["type"] == "DP16KD"]
    params = cell["parameters"]
    assert int(params["DATA_WIDTH_A"], 2) == int(params["DATA_WIDTH_B"], 2) == 18, params
    # yosys connects the ROM's 16 bits to DO15:0 of one port: the words are DO's values
    expected = dp16kd_initval(words)
    for key, const in expected.items():
        name = key[2:]                          # p_INITVAL_xx -> INITVAL_xx
        assert int(params[name], 2) == const.value, name


@pytest.mark.parametrize("a_shape, b_shape", [(signed(8), signed(8)), (unsigned(8), unsigned(8)),
                                              (unsigned(8), signed(8))])
def test_ecp5_elaboration_is_one_dp16kd_through_output_registers(a_shape: Shape, b_shape: Shape) -> None:
    verilog = to_verilog(PipelinedMultiplier(a_shape, b_shape, kind="bram"), "mul", platform=_ECP5())
    instance, = _instances(verilog)
    assert re.search(r'\.REGMODE_A\("OUTREG"\)', instance) and re.search(r'\.REGMODE_B\("OUTREG"\)', instance)
    assert len(re.findall(r"\.INITVAL_[0-9A-F]{2}\(320'h", instance)) == 64


def _testbench(a_shape: Shape, b_shape: Shape) -> tuple[list[str], int]:
    """The ECP5 multiplier (module ``mul``) and a testbench ``bram_mul_check`` that checks every
    product; returns the sources and the number of operand pairs."""
    mul = to_verilog(PipelinedMultiplier(a_shape, b_shape, kind="bram"), "mul", platform=_ECP5())
    lo_a, hi_a = int_range(a_shape.width, a_shape.signed)
    lo_b, hi_b = int_range(b_shape.width, b_shape.signed)
    fixed = [lo_b, hi_b, 0, 1, -1 if b_shape.signed else 2]       # then three random b
    pairs = (hi_a - lo_a + 1) * (len(fixed) + 3)
    sa = "signed " if a_shape.signed else ""
    sb = "signed " if b_shape.signed else ""
    cases = "\n".join(f"      3'd{i}: b = {b_shape.width}'d{value % (1 << b_shape.width)};"
                      for i, value in enumerate(fixed))
    body = f"""
  logic [15:0] n = 0;                  // operand pair: a from its low bits, b's choice above them
  logic en;
  logic {sa}[{a_shape.width - 1}:0] a;
  logic {sb}[{b_shape.width - 1}:0] b;
  logic signed [{len(PipelinedMultiplier(a_shape, b_shape).product) - 1}:0] product;
  logic signed [31:0] expected0, expected1, expected2;
  logic [1:0] filled = 0;
  logic [31:0] checked = 0, bad = 0;
  assign en = x3[0] | x3[1];
  assign a = n[{a_shape.width - 1}:0] + {a_shape.width}'d{lo_a % (1 << a_shape.width)};
  always_comb begin
    case (n[{a_shape.width + 2}:{a_shape.width}])
{cases}
      default: b = x2[{b_shape.width - 1}:0] ^ x1[{b_shape.width + 20}:21];
    endcase
  end
  mul dut(.clk(clk), .rst(rst), .a(a), .b(b), .enable(en), .product(product));
  always @(posedge clk) if (!rst) begin
    if (filled == 3) begin
      checked <= checked + 1;
      if (product != expected2[{len(PipelinedMultiplier(a_shape, b_shape).product) - 1}:0]) begin
        bad <= bad + 1;
        if (bad < 5) $display("cycle %0d: product %0d, expected %0d", cycle, product, expected2);
      end
    end
    if (en) begin
      expected0 <= 32'(a) * 32'(b);
      expected1 <= expected0;
      expected2 <= expected1;
      if (filled != 3) filled <= filled + 1;
      n <= n + 1;
      if (n == {pairs - 1}) $finish;
    end
  end
  final $display("compared %0d products, %0d mismatches, %0d pairs", checked, bad, n);
"""
    top = random_top("bram_mul_check", SEED, 4 * pairs, body)
    return [MODEL.read_text(), mul, top], pairs


@pytest.mark.slow
@pytest.mark.parametrize("ce_gates_outreg", [False, True])
@pytest.mark.parametrize("a_shape, b_shape", [(signed(8), signed(8)), (unsigned(8), unsigned(8)),
                                              (signed(8), unsigned(8))])
def test_ecp5_products_under_random_stalls(a_shape: Shape, b_shape: Shape, ce_gates_outreg: bool) -> None:
    sources, pairs = _testbench(a_shape, b_shape)
    defines = ("DP16KD_CE_GATES_OUTREG",) if ce_gates_outreg else ()
    output = run_clocked_testbench("bram_mul_check", sources, defines=defines)
    found = re.search(r"compared (\d+) products, (\d+) mismatches", output)
    assert found is not None, output
    checked, bad = map(int, found.groups())
    assert bad == 0, output
    assert checked >= pairs, output
