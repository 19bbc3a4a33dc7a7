# amaranth: UnusedElaboratable=no
"""The SFU's wide multiplier (hw/sfu.py ``SplitMultiplier``) and the ECP5 DSP builder
(hw/dsp.py ``mult18x18d``).

* Generic elaboration, in the Amaranth simulator: random operands and every pair of extremes
  (min, max, 0, -1, 1, a low chunk of all ones) of the three shapes the SFU uses, each product
  checked exactly (or wrapped to 64 bits) three cycles after its operands.
* ECP5 elaboration (``platform.family == "ecp5"``): one MULT18X18D per partial product, with the
  output register and no input registers; in Verilator, with the behavioural MULT18X18D model
  (tests/hw/mult18x18d_model.py), the same kinds of operands, a new pair every cycle, every
  product checked three cycles later by the testbench.
* The SFU on ECP5 takes its multipliers' MULT18X18D instances and no others.
* ``mult18x18d`` alone, in Verilator with the model: signed and unsigned operands of 1 to 18
  bits (every pair of 8-bit values, random and extreme pairs of wider ones), a narrow signed
  operand in the block's upper inputs with constant zeros below it.
* The errors of both.
"""

from __future__ import annotations

import itertools
import os
import random
import re

import pytest
from amaranth import Module, Shape, Signal, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator
from systolic.hw.config import AcceleratorConfig
from systolic.hw.dsp import mult18x18d
from systolic.hw.sfu import SPLIT_MULTIPLIER_LATENCY, SpecialFunctionUnit, SplitMultiplier
from systolic.sim.tools import to_verilog

from tests.boards.clocked_testbench import (
    operand_assign,
    operand_declarations,
    random_top,
    run_clocked_testbench,
)
from tests.hw.ecp5_stand import Ecp5Stand
from tests.hw.mult18x18d_model import mult18x18d_model

SEED = int(os.environ.get("SYSTOLIC_TEST_SEED", "1"))

#: (a_width, b_width, wrap) of the SFU's multipliers: the requantize product of a 32-bit
#: accumulator value (33 bits when the accumulator is unsigned), the residual product and the
#: average's product of a window sum.
SHAPES = [(32, 32, 64), (33, 32, 64), (17, 32, None), (35, 32, 64)]


def _extremes(width: int) -> list[int]:
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
    low_ones = (1 << min(16, width - 1)) - 1            # a low chunk of all ones
    return sorted({lo, hi, 0, -1, 1, low_ones, lo + low_ones, -low_ones - 1})


def _expected(a: int, b: int, width: int) -> int:
    value = (a * b) % (1 << width)
    return value - (1 << width) if value >> (width - 1) else value


@pytest.mark.parametrize("a_width, b_width, wrap", SHAPES)
def test_generic_products_exact_three_cycles_later(a_width: int, b_width: int, wrap: int | None) -> None:
    dut = SplitMultiplier(a_width, b_width, wrap=wrap)
    assert SPLIT_MULTIPLIER_LATENCY == 3
    rng = random.Random(SEED)
    pairs = list(itertools.product(_extremes(a_width), _extremes(b_width)))
    pairs += [(rng.randrange(-(1 << (a_width - 1)), 1 << (a_width - 1)),
               rng.randrange(-(1 << (b_width - 1)), 1 << (b_width - 1))) for _ in range(300)]
    width = len(dut.product)
    assert width == (wrap if wrap is not None else a_width + b_width)
    seen: list[tuple[int, int]] = []

    async def bench(ctx):
        for cycle in range(len(pairs) + SPLIT_MULTIPLIER_LATENCY):
            if cycle < len(pairs):
                ctx.set(dut.a, pairs[cycle][0])
                ctx.set(dut.b, pairs[cycle][1])
            await ctx.tick()
            if cycle >= SPLIT_MULTIPLIER_LATENCY - 1 and len(seen) < len(pairs):
                seen.append((ctx.get(dut.product), len(seen)))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert len(seen) == len(pairs)
    for product, index in seen:
        a, b = pairs[index]
        assert product == _expected(a, b, width), (a, b, product)


def _instances(verilog: str) -> list[str]:
    return re.findall(r"^\s*MULT18X18D\s*#\((.*?)\);", verilog, re.MULTILINE | re.DOTALL)


@pytest.mark.parametrize("a_width, b_width, wrap, count",
                         [(32, 32, 64, 4), (17, 32, None, 2), (18, 18, None, 1)])
def test_ecp5_partial_products_are_mult18x18d_output_registers(a_width, b_width, wrap, count) -> None:
    verilog = to_verilog(SplitMultiplier(a_width, b_width, wrap=wrap), "mul", platform=Ecp5Stand())
    instances = _instances(verilog)
    assert len(instances) == count
    for text in instances:
        for name, value in (("REG_INPUTA_CLK", "NONE"), ("REG_INPUTB_CLK", "NONE"),
                            ("REG_OUTPUT_CLK", "CLK0"), ("RESETMODE", "SYNC")):
            assert re.search(rf'\.{name}\("{value}"\)', text), (name, text[:300])
    assert not _instances(to_verilog(SplitMultiplier(a_width, b_width, wrap=wrap), "mul"))


def _testbench(a_width: int, b_width: int, wrap: int | None, cycles: int) -> list[str]:
    dut = SplitMultiplier(a_width, b_width, wrap=wrap)
    width = len(dut.product)
    mul = to_verilog(dut, "mul", platform=Ecp5Stand())

    def operand(width: int, mode: str, random_bits: str) -> str:
        extremes = _extremes(width)
        cases = "\n".join(f"      3'd{i}: {{name}} = {width}'d{value % (1 << width)};"
                          for i, value in enumerate(extremes[:7]))
        return (f"    case ({mode})\n{cases}\n"
                f"      default: {{name}} = {random_bits};\n    endcase\n")

    a_case = operand(a_width, "x3[2:0]", f"x1[{a_width - 1}:0]").format(name="a")
    b_case = operand(b_width, "x3[5:3]", f"x2[{b_width - 1}:0]").format(name="b")
    body = f"""
  logic signed [{a_width - 1}:0] a;
  logic signed [{b_width - 1}:0] b;
  logic signed [{width - 1}:0] product;
  logic signed [127:0] expected [0:2];
  logic [1:0] filled = 0;
  logic [31:0] checked = 0, bad = 0;
  always_comb begin
{a_case}{b_case}  end
  mul dut(.clk(clk), .rst(rst), .a(a), .b(b), .product(product));
  always @(posedge clk) if (!rst) begin
    expected[0] <= 128'(a) * 128'(b);
    expected[1] <= expected[0];
    expected[2] <= expected[1];
    if (filled != 3) filled <= filled + 1;
    else begin
      checked <= checked + 1;
      if (product != expected[2][{width - 1}:0]) begin
        bad <= bad + 1;
        if (bad < 5) $display("cycle %0d: product %0d, expected %0d", cycle, product, expected[2]);
      end
    end
  end
  final $display("compared %0d products, %0d mismatches", checked, bad);
"""
    return [mult18x18d_model(), mul, random_top("split_mul_check", SEED, cycles, body)]


@pytest.mark.slow
@pytest.mark.parametrize("a_width, b_width, wrap", SHAPES)
def test_ecp5_products_on_verilator(a_width: int, b_width: int, wrap: int | None) -> None:
    cycles = 100_000
    output = run_clocked_testbench("split_mul_check", _testbench(a_width, b_width, wrap, cycles))
    checked, bad = map(int, re.search(r"compared (\d+) products, (\d+) mismatches", output).groups())
    assert bad == 0, output
    assert checked >= cycles - 4, output


def test_sfu_on_ecp5_takes_its_multipliers_dsp_blocks() -> None:
    """4 lanes x (requantize, residual, average) products: 4 + 2 + 4 MULT18X18D a lane, and one
    for the average's count times zero point."""
    config = AcceleratorConfig(rows=4, cols=4)
    assert config.sfu_residual and "avg" in config.sfu_pooling and config.sfu_lanes == 4
    verilog = to_verilog(SpecialFunctionUnit(config), "sfu", platform=Ecp5Stand())
    assert len(_instances(verilog)) == 4 * (4 + 2 + 4) + 1
    assert not _instances(to_verilog(SpecialFunctionUnit(config), "sfu"))


@pytest.mark.parametrize("a_width, message", [
    (0, r"^a_width must be 1 to 35 bits \(two DSP multiplier inputs\), not 0$"),
    (36, r"^a_width must be 1 to 35 bits \(two DSP multiplier inputs\), not 36$"),
])
def test_split_multiplier_rejects_operands_wider_than_two_dsp_inputs(a_width: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SplitMultiplier(a_width, 32)
    with pytest.raises(ValueError, match=message.replace("a_width", "b_width")):
        SplitMultiplier(32, a_width)


def test_mult18x18d_rejects_an_operand_wider_than_its_input() -> None:
    m = Module()
    with pytest.raises(ValueError, match=r"^operand a must fit an 18-bit signed MULT18X18D input \(at most "
                                         r"18 bits signed or 17 unsigned\), not unsigned\(18\)$"):
        mult18x18d(m, "mult", Signal(unsigned(18)), Signal(signed(18)), input_registers=False)
    with pytest.raises(ValueError, match=r"^operand b must fit .* not signed\(19\)$"):
        mult18x18d(m, "mult", Signal(unsigned(17)), Signal(signed(19)), input_registers=True)


class _DspProduct(wiring.Component):
    """``product`` = ``a * b`` from :func:`mult18x18d`'s output register (one cycle later)."""

    def __init__(self, a_shape: Shape, b_shape: Shape) -> None:
        self._a_shape, self._b_shape = a_shape, b_shape
        super().__init__({"a": In(a_shape), "b": In(b_shape),
                          "product": Out((Signal(a_shape) * Signal(b_shape)).shape())})

    def elaborate(self, platform: object) -> Module:
        m = Module()
        m.d.comb += self.product.eq(mult18x18d(m, "mult", self.a, self.b, input_registers=False))
        return m


#: Operand shapes for mult18x18d alone: the PE's int8 and uint8 pairs, and the widest and
#: narrowest of each signedness.
DSP_SHAPES = [(signed(8), signed(8)), (signed(8), unsigned(8)), (unsigned(8), signed(8)),
              (unsigned(8), unsigned(8)), (signed(1), signed(18)), (signed(18), unsigned(17)),
              (unsigned(17), signed(5)), (signed(3), unsigned(1))]


def test_mult18x18d_puts_a_narrow_signed_operand_in_its_upper_inputs() -> None:
    """int8 x int8: A0..A9 and B0..B9 are constant zeros (no sign extension to route), the
    operand's bits are A10..A17; the product is the output's bits 20..35. An unsigned operand is
    zero-extended: its upper inputs are the constants."""
    verilog = to_verilog(_DspProduct(signed(8), signed(8)), "d", platform=Ecp5Stand())
    for port in "AB":
        for n in range(10):
            assert re.search(rf"\.{port}{n}\(1'h0\)", verilog), (port, n)
        for n in range(8):
            assert re.search(rf"\.{port}{10 + n}\({port.lower()}\[{n}\]\)", verilog), (port, n)
    verilog = to_verilog(_DspProduct(unsigned(8), signed(8)), "d", platform=Ecp5Stand())
    for n in range(8):
        assert re.search(rf"\.A{n}\(a\[{n}\]\)", verilog), n
    for n in range(8, 18):
        assert re.search(rf"\.A{n}\(1'h0\)", verilog), n


@pytest.mark.slow
def test_mult18x18d_products_on_verilator() -> None:
    """Every shape of ``DSP_SHAPES`` beside each other in one testbench: shapes of at most 16
    operand bits in all take every pair of values (a counter), the others random pairs with
    minimum, maximum, all-ones, 0 and 1 mixed in; every product compared one cycle later."""
    cycles = 1 << 16
    sources = [mult18x18d_model()]
    body = ["  logic [31:0] checked = 0, bad = 0;\n"]
    for k, (a_shape, b_shape) in enumerate(DSP_SHAPES):
        dut = _DspProduct(a_shape, b_shape)
        sources.append(to_verilog(dut, f"dsp{k}", platform=Ecp5Stand()))
        wa, wb, wp = a_shape.width, b_shape.width, len(dut.product)
        exhaustive = wa + wb <= 16
        body.append(operand_declarations(k, a_shape, b_shape, wp) + f"  logic signed [63:0] e{k};\n")
        body.append(operand_assign(f"a{k}", a_shape, f"cycle[{wa - 1}:0]" if exhaustive else "",
                             f"x3[{4 * k + 2}:{4 * k}]", f"x1[{wa + k - 1}:{k}]"))
        body.append(operand_assign(f"b{k}", b_shape, f"cycle[{wa + wb - 1}:{wa}]" if exhaustive else "",
                             f"x3[{4 * k + 34}:{4 * k + 32}]", f"x2[{wb + k - 1}:{k}]"))
        # the product as the operands' signedness has it, in 64 bits
        ea = f"{{{{{64 - wa}{{a{k}[{wa - 1}]}}}}, a{k}}}" if a_shape.signed else f"64'(a{k})"
        eb = f"{{{{{64 - wb}{{b{k}[{wb - 1}]}}}}, b{k}}}" if b_shape.signed else f"64'(b{k})"
        body.append(f"  dsp{k} u{k}(.clk(clk), .rst(rst), .a(a{k}), .b(b{k}), .product(p{k}));\n"
                    f"  always @(posedge clk) if (!rst) e{k} <= {ea} * {eb};\n")
    compares = " + ".join(f"32'(p{k} != e{k}[{len(_DspProduct(*shapes).product) - 1}:0])"
                          for k, shapes in enumerate(DSP_SHAPES))
    body.append(f"""  always @(posedge clk) if (!rst && cycle >= 1 && cycle <= {cycles}) begin
    checked <= checked + 1;
    bad <= bad + ({compares});
  end
  final $display("compared %0d cycles, %0d mismatches", checked, bad);
""")
    sources.append(random_top("dsp_check", SEED, cycles + 1, "".join(body)))
    output = run_clocked_testbench("dsp_check", sources)
    checked, bad = map(int, re.search(r"compared (\d+) cycles, (\d+) mismatches", output).groups())
    assert bad == 0, output
    assert checked == cycles, output
