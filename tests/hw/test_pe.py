# amaranth: UnusedElaboratable=no
"""ProcessingElement and PipelinedMultiplier, cycle by cycle, against numpy (Amaranth simulator)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from amaranth import Shape, signed, unsigned
from amaranth.sim import Simulator
from systolic.hw.config import AcceleratorConfig, int_range
from systolic.hw.pe import (
    MAC_LATENCY,
    MULTIPLIER_LATENCY,
    PipelinedMultiplier,
    ProcessingElement,
    element_shapes,
)
from systolic.sim.arith import wrap
from systolic.sim.tools import to_verilog

from tests.hw.ecp5_stand import Ecp5Stand


def _range(shape: Shape) -> tuple[int, int]:
    return int_range(shape.width, shape.signed)


def _operands(rng: np.random.Generator, shape: Shape, count: int) -> np.ndarray:
    """Random values of ``shape`` with both extremes and zero mixed in."""
    lo, hi = _range(shape)
    values = rng.integers(lo, hi + 1, count)
    values[rng.random(count) < 0.3] = lo
    values[rng.random(count) < 0.15] = hi
    values[rng.random(count) < 0.05] = 0
    return values


def _run(dut, testbench) -> None:
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.run()


# -- multiplier ------------------------------------------------------------------------------------

_EIGHT_BIT = [(signed(8), signed(8)), (unsigned(8), unsigned(8)), (unsigned(8), signed(8)),
              (signed(8), unsigned(8))]


_WIDE = [(signed(16), signed(16)), (unsigned(16), signed(8)), (signed(16), unsigned(16))]


@pytest.mark.parametrize("kind, a_shape, b_shape, latency", [
    *[(kind, a, b, MULTIPLIER_LATENCY) for kind in ("dsp", "logic") for a, b in [*_EIGHT_BIT, *_WIDE]],
    # the logic multiplier of a PE whose operands come a cycle late (two stages)
    *[("logic", a, b, 2) for a, b in [*_EIGHT_BIT, *_WIDE, (signed(8), signed(1)), (signed(5), signed(3))]],
    *[("bram", a, b, MULTIPLIER_LATENCY) for a, b in [*_EIGHT_BIT, (signed(9), signed(9))]],  # a full table
])
def test_multiplier_products_and_latency(kind: str, a_shape: Shape, b_shape: Shape, latency: int) -> None:
    rng = np.random.default_rng(a_shape.width * 7 + b_shape.width + a_shape.signed + 2 * b_shape.signed)
    count = 60
    a = _operands(rng, a_shape, count)
    b = _operands(rng, b_shape, count)
    enable = rng.random(count + latency) < 0.8
    dut = PipelinedMultiplier(a_shape, b_shape, kind=kind, latency=latency)
    assert dut.latency == latency
    seen = []

    async def testbench(ctx):
        for t in range(count + latency):
            ctx.set(dut.a, int(a[min(t, count - 1)]))
            ctx.set(dut.b, int(b[min(t, count - 1)]))
            ctx.set(dut.enable, int(enable[t]))
            await ctx.tick()
            seen.append(ctx.get(dut.product))

    _run(dut, testbench)
    # The pipeline advances only in enabled cycles: the product of the operands presented in the
    # n-th enabled cycle appears after the (n + latency)-th enabled cycle.
    enabled = [t for t in range(count + latency) if enable[t]]
    operands = [min(t, count - 1) for t in enabled]
    for n in range(len(enabled) - latency):
        later = enabled[n + latency - 1]
        # value after the edge that ended the later cycle, held until the next enabled edge
        source = operands[n]
        assert seen[later] == int(a[source]) * int(b[source]), (n, later)
    assert any(seen), "the products must not all be zero"


@pytest.mark.parametrize("kind", ["dsp", "logic"])
def test_multiplier_extreme_products(kind: str) -> None:
    dut = PipelinedMultiplier(signed(16), signed(16), kind=kind)
    cases = [(-32768, -32768), (-32768, 32767), (32767, -32768), (32767, 32767), (-1, -1),
             (0, -32768), (-32768, 0), (1, -32768), (-32768, 1), (-1, 32767)]
    seen = []

    async def testbench(ctx):
        for t in range(len(cases) + MULTIPLIER_LATENCY):
            a, b = cases[min(t, len(cases) - 1)]
            ctx.set(dut.a, a)
            ctx.set(dut.b, b)
            await ctx.tick()
            seen.append(ctx.get(dut.product))

    _run(dut, testbench)
    for n, (a, b) in enumerate(cases):
        assert seen[n + MULTIPLIER_LATENCY - 1] == a * b


def test_logic_multiplier_every_int8_a() -> None:
    """The logic multiplier (array_lut_multipliers): every int8 a times the extreme, the
    bit-boundary and some random int8 b."""
    dut = PipelinedMultiplier(signed(8), signed(8), kind="logic")
    rng = np.random.default_rng(8)
    b_values = [-128, -127, -65, -64, -1, 0, 1, 15, 16, 63, 64, 127, *rng.integers(-128, 128, 4)]
    grid = np.array([(a, b) for b in b_values for a in range(-128, 128)])
    products = np.array(_stream_products(dut, grid.tolist()))
    np.testing.assert_array_equal(products, grid[:, 0] * grid[:, 1])


async def _activate_weight(ctx, dut: ProcessingElement, weight: int) -> None:
    """Capture ``weight`` into the WS PE's shadow register, then make it the active weight (two
    cycles)."""
    ctx.set(dut.w_in, weight)
    ctx.set(dut.w_capture_in, 1)
    await ctx.tick()
    ctx.set(dut.w_capture_in, 0)
    ctx.set(dut.new_weights_in, 1)
    await ctx.tick()
    ctx.set(dut.new_weights_in, 0)


def _stream_products(dut: PipelinedMultiplier, cases: list) -> list[int]:
    """``dut``'s products of the operand pairs ``cases``, one pair per cycle."""
    seen = []

    async def testbench(ctx):
        for t in range(len(cases) + MULTIPLIER_LATENCY - 1):
            a, b = cases[min(t, len(cases) - 1)]
            ctx.set(dut.a, int(a))
            ctx.set(dut.b, int(b))
            await ctx.tick()
            seen.append(ctx.get(dut.product))

    _run(dut, testbench)
    return seen[MULTIPLIER_LATENCY - 1:]


@pytest.mark.parametrize("a_shape, b_shape", [
    (signed(8), signed(1)), (signed(5), signed(3)), (unsigned(3), unsigned(17)), (signed(18), signed(5)),
    (unsigned(7), signed(2)), (signed(4), unsigned(9)),
])
def test_logic_multiplier_odd_widths(a_shape: Shape, b_shape: Shape) -> None:
    """The logic multiplier's adder tree for weight widths that are not a power of two (an odd
    number of partial products at some level, the subtracted top one alone or paired) and a
    1-bit signed weight (the product is -a or 0)."""
    rng = np.random.default_rng(a_shape.width * 31 + b_shape.width)
    lo_a, hi_a = _range(a_shape)
    lo_b, hi_b = _range(b_shape)
    corners = [(x, y) for x in (lo_a, hi_a, 0, -1 if a_shape.signed else 1)
               for y in (lo_b, hi_b, 0, -1 if b_shape.signed else 1)]
    cases = corners + list(zip(_operands(rng, a_shape, 80).tolist(), _operands(rng, b_shape, 80).tolist(),
                               strict=True))
    dut = PipelinedMultiplier(a_shape, b_shape, kind="logic")
    assert _stream_products(dut, cases) == [int(a) * int(b) for a, b in cases]


@pytest.mark.parametrize("a_shape, b_shape", _EIGHT_BIT)
def test_bram_multiplier_every_table_entry(a_shape: Shape, b_shape: Shape) -> None:
    """The block-RAM multiplier (array_bram_multipliers): every a times b at both ends of its
    range (so both ports read every entry of the quarter-square table: a + b and a - b cover
    every value between their extremes), times 0, 1 (and -1) and random b."""
    rng = np.random.default_rng(a_shape.width * 3 + 5 * a_shape.signed + b_shape.signed)
    lo_a, hi_a = _range(a_shape)
    lo_b, hi_b = _range(b_shape)
    b_values = [lo_b, hi_b, 0, 1, *([-1] if b_shape.signed else []), *_operands(rng, b_shape, 3).tolist()]
    grid = np.array([(a, b) for b in b_values for a in range(lo_a, hi_a + 1)])
    products = np.array(_stream_products(PipelinedMultiplier(a_shape, b_shape, kind="bram"), grid.tolist()))
    np.testing.assert_array_equal(products, grid[:, 0] * grid[:, 1])


def test_pe_rejects_unknown_multiplier() -> None:
    with pytest.raises(ValueError, match=r"^multiplier must be one of 'dsp', 'bram', 'logic', not 'dsp48'$"):
        ProcessingElement(AcceleratorConfig(), multiplier="dsp48")


@pytest.mark.parametrize("kind, b_shape, latency, message", [
    ("dsp", signed(8), 2, r"^latency must be 3, or 2 for a 'logic' multiplier, not 2 for 'dsp'$"),
    ("logic", signed(8), 1, r"^latency must be 3, or 2 for a 'logic' multiplier, not 1 for 'logic'$"),
    ("logic", signed(8), True, r"^latency must be 3, or 2 for a 'logic' multiplier, not True for 'logic'$"),
    ("logic", signed(17), 2, r"^a 'logic' multiplier of latency 2 adds at most 16 partial products \(two "
                             r"adder levels a stage\); b_shape signed\(17\) gives 17$"),
])
def test_multiplier_rejects_bad_latency(kind: str, b_shape: Shape, latency: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PipelinedMultiplier(signed(8), b_shape, kind=kind, latency=latency)


def test_multiplier_rejects_unknown_kind() -> None:
    with pytest.raises(ValueError, match=r"^kind must be one of 'dsp', 'bram', 'logic', not 'lut'$"):
        PipelinedMultiplier(signed(8), signed(8), kind="lut")


@pytest.mark.parametrize("a_shape, b_shape, values", [
    (signed(16), signed(8), 65792), (unsigned(9), unsigned(9), 1534), (signed(10), signed(8), 1280),
])
def test_bram_multiplier_rejects_wide_operands(a_shape: Shape, b_shape: Shape, values: int) -> None:
    with pytest.raises(ValueError, match=rf"^a 'bram' multiplier's table holds at most 1024 sums and "
                                         rf"differences of its operands; {re.escape(repr(a_shape))} and "
                                         rf"{re.escape(repr(b_shape))} give {values}$"):
        PipelinedMultiplier(a_shape, b_shape, kind="bram")


@pytest.mark.parametrize("a_shape, b_shape, name, shape_text", [
    (signed(19), signed(8), "a_shape", "signed(19)"),
    (signed(8), unsigned(18), "b_shape", "unsigned(18)"),
])
def test_multiplier_rejects_wide_operands(a_shape: Shape, b_shape: Shape, name: str, shape_text: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name} must fit an 18-bit signed multiplier input "
                                         rf"\(at most 18 bits signed or 17 unsigned\), not "
                                         rf"{re.escape(shape_text)}$"):
        PipelinedMultiplier(a_shape, b_shape)


# -- weight-stationary PE --------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [
    {}, {"acc_bits": 16}, {"input_signed": False}, {"input_bits": 16, "weight_bits": 16},
    {"input_signed": False, "weight_signed": False, "acc_signed": False},
])
def test_ws_pe_cycle_model(kwargs: dict) -> None:
    """Drive one WS PE with random operands, partial sums, preloads and swaps; compare every
    output cycle with a cycle model built from the documented timing."""
    config = AcceleratorConfig(dataflow="ws", **kwargs)
    input_shape, weight_shape, acc_shape = element_shapes(config)
    rng = np.random.default_rng(len(kwargs) + 11)
    cycles = 120
    a = _operands(rng, input_shape, cycles)
    w = _operands(rng, weight_shape, cycles)
    psum = _operands(rng, acc_shape, cycles)
    capture = rng.random(cycles) < 0.3
    zero = rng.random(cycles) < 0.1
    swap = rng.random(cycles) < 0.15
    dut = ProcessingElement(config)
    trace = []

    async def testbench(ctx):
        for t in range(cycles):
            ctx.set(dut.a_in, int(a[t]))
            ctx.set(dut.w_in, int(w[t]))
            ctx.set(dut.psum_in, int(psum[t]))
            ctx.set(dut.w_capture_in, int(capture[t]))
            ctx.set(dut.w_zero_in, int(zero[t]))
            ctx.set(dut.new_weights_in, int(swap[t]))
            await ctx.tick()
            trace.append({name: ctx.get(getattr(dut, name)) for name in (
                "psum_out", "a_out", "w_out", "w_capture_out", "w_zero_out", "new_weights_out")})

    _run(dut, testbench)

    shadow = active = 0
    active_at = []              # the active weight during cycle t (the multiplier's operand)
    for t in range(cycles):
        active_at.append(active)
        if swap[t]:
            active = shadow
        if capture[t]:
            shadow = int(w[t])
        elif zero[t]:
            shadow = 0
    lag = MAC_LATENCY - 1
    for t in range(cycles):
        assert trace[t]["a_out"] == a[t]
        assert trace[t]["w_out"] == w[t]
        assert trace[t]["w_capture_out"] == capture[t]
        assert trace[t]["w_zero_out"] == zero[t]
        assert trace[t]["new_weights_out"] == swap[t]
        if t >= lag:
            expected = wrap(int(psum[t]) + int(a[t - lag]) * active_at[t - lag],
                            config.acc_bits, config.acc_signed)
            assert trace[t]["psum_out"] == expected, t


@pytest.mark.parametrize("kwargs, psum_shape", [
    ({}, signed(20)), ({}, signed(17)), ({"input_signed": False, "weight_signed": False,
                                          "acc_signed": False}, unsigned(18)),
    ({"acc_bits": 16}, signed(16)),
])
def test_ws_pe_narrow_partial_sums(kwargs: dict, psum_shape: Shape) -> None:
    """A PE with a narrow ``psum_shape``: psum_out = psum_in + a * w wrapped to that shape, with
    every product extreme (the array only narrows where the exact sum fits, see test_array)."""
    config = AcceleratorConfig(dataflow="ws", **kwargs)
    input_shape, weight_shape, _ = element_shapes(config)
    rng = np.random.default_rng(psum_shape.width)
    cycles = 80
    a = _operands(rng, input_shape, cycles)
    psum = _operands(rng, psum_shape, cycles)
    weight = int(_range(weight_shape)[0] if weight_shape.signed else _range(weight_shape)[1])
    dut = ProcessingElement(config, psum_shape=psum_shape)
    assert dut.psum_in.shape() == dut.psum_out.shape() == psum_shape
    trace = []

    async def testbench(ctx):
        await _activate_weight(ctx, dut, weight)
        for t in range(cycles):
            ctx.set(dut.a_in, int(a[t]))
            ctx.set(dut.psum_in, int(psum[t]))
            await ctx.tick()
            trace.append(ctx.get(dut.psum_out))

    _run(dut, testbench)
    lag = MAC_LATENCY - 1
    for t in range(lag, cycles):
        expected = wrap(int(psum[t]) + int(a[t - lag]) * weight, psum_shape.width, psum_shape.signed)
        assert trace[t] == expected, t


def test_pe_rejects_bad_psum_shapes() -> None:
    with pytest.raises(ValueError, match=r"^psum_shape must be 1 to acc_bits \(16\) bits wide, "
                                         r"not signed\(17\)$"):
        ProcessingElement(AcceleratorConfig(dataflow="ws", acc_bits=16), psum_shape=signed(17))
    with pytest.raises(ValueError, match=r"^psum_shape needs dataflow 'ws' \(an output-stationary PE "
                                         r"keeps its sums in acc_bits\), not 'os'$"):
        ProcessingElement(AcceleratorConfig(dataflow="os"), psum_shape=signed(20))


def test_pe_enable_low_holds_every_register() -> None:
    config = AcceleratorConfig(dataflow="ws")
    dut = ProcessingElement(config)
    trace = []

    async def testbench(ctx):
        await _activate_weight(ctx, dut, -7)
        ctx.set(dut.a_in, 5)
        ctx.set(dut.psum_in, 1000)
        await ctx.tick()
        ctx.set(dut.enable, 0)                 # freeze with the product in flight
        ctx.set(dut.a_in, 99)
        for _ in range(5):
            await ctx.tick()
            trace.append((ctx.get(dut.a_out), ctx.get(dut.psum_out)))
        ctx.set(dut.enable, 1)
        for _ in range(MULTIPLIER_LATENCY):
            await ctx.tick()
            trace.append((ctx.get(dut.a_out), ctx.get(dut.psum_out)))

    _run(dut, testbench)
    assert trace[:5] == [(5, 1000)] * 5             # nothing moved while disabled
    # the product frozen in the multiplier (5 * -7) reaches the sum after the remaining stages
    assert trace[5:] == [(99, 1000), (99, 1000), (99, 1000 + 5 * -7)]


# -- output-stationary PE --------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [{}, {"acc_bits": 16}, {"input_bits": 16, "weight_bits": 16},
                                    {"weight_signed": False}])
def test_os_pe_accumulates_captures_and_drains(kwargs: dict) -> None:
    config = AcceleratorConfig(dataflow="os", **kwargs)
    input_shape, weight_shape, acc_shape = element_shapes(config)
    rng = np.random.default_rng(len(kwargs) + 5)
    cycles = 150
    a = _operands(rng, input_shape, cycles)
    b = _operands(rng, weight_shape, cycles)
    result_in = _operands(rng, acc_shape, cycles)
    last = rng.random(cycles) < 0.12
    last[cycles - MAC_LATENCY:] = False
    drain = rng.random(cycles) < 0.3
    # The array never drains a PE in the cycle its capture lands.
    for t in np.flatnonzero(last):
        drain[t + MAC_LATENCY - 1] = False
    dut = ProcessingElement(config)
    trace = []

    async def testbench(ctx):
        for t in range(cycles):
            ctx.set(dut.a_in, int(a[t]))
            ctx.set(dut.b_in, int(b[t]))
            ctx.set(dut.last_in, int(last[t]))
            ctx.set(dut.drain_in, int(drain[t]))
            ctx.set(dut.result_in, int(result_in[t]))
            await ctx.tick()
            trace.append({name: ctx.get(getattr(dut, name)) for name in (
                "result_out", "a_out", "b_out", "last_out", "drain_out")})

    _run(dut, testbench)

    lag = MAC_LATENCY - 1
    acc = result = 0
    captures = 0
    for t in range(cycles):
        if t >= lag:
            total = int(wrap(acc + int(a[t - lag]) * int(b[t - lag]), config.acc_bits,
                             config.acc_signed))
            if last[t - lag]:
                result, acc = total, 0
                captures += 1
            else:
                acc = total
                if drain[t]:
                    result = int(result_in[t])
        elif drain[t]:
            result = int(result_in[t])
        assert trace[t]["result_out"] == result, t
        assert (trace[t]["a_out"], trace[t]["b_out"]) == (a[t], b[t])
        assert (trace[t]["last_out"], trace[t]["drain_out"]) == (last[t], drain[t])
    assert captures >= 5


def test_os_pe_long_extreme_sum_wraps() -> None:
    """-128 * -128 summed 600 times is 9830400: it wraps in a 16-bit accumulator and does not
    in a 32-bit one."""
    for acc_bits in (16, 32):
        config = AcceleratorConfig(dataflow="os", acc_bits=acc_bits)
        dut = ProcessingElement(config)
        got = []

        async def testbench(ctx, dut=dut, got=got):
            ctx.set(dut.a_in, -128)
            ctx.set(dut.b_in, -128)
            for t in range(600):
                ctx.set(dut.last_in, int(t == 599))
                await ctx.tick()
            ctx.set(dut.last_in, 0)
            for _ in range(MAC_LATENCY):
                await ctx.tick()
            got.append(ctx.get(dut.result_out))

        _run(dut, testbench)
        assert got == [int(wrap(600 * 16384, acc_bits, True))]


def test_pe_rejects_a_non_config() -> None:
    with pytest.raises(TypeError, match=r"^config must be an AcceleratorConfig, not \{'rows': 4\}$"):
        ProcessingElement({"rows": 4})



#: The control bits a PE passes on, per dataflow.
_PASSED = {"ws": ("new_weights", "w_capture", "w_zero"), "os": ("last", "drain")}


@pytest.mark.parametrize("dataflow, copies", [("ws", ("a_late",)), ("os", ("a_late", "b_late"))])
def test_logic_pe_operands_are_copies_of_the_passed_on_registers_on_ecp5(
        dataflow: str, copies: tuple[str, ...]) -> None:
    """On ECP5 a logic multiplier's operands, a cycle late, are TRELLIS_FF copies (under the PE's
    enable) of the registers that pass them on to the next PE, one per bit: not those registers,
    which the placer puts by the next PE (a DSP PE may sit across the die). A DSP PE has none."""
    config = AcceleratorConfig(rows=2, cols=2, dataflow=dataflow)
    verilog = to_verilog(ProcessingElement(config, multiplier="logic"), "pe", platform=Ecp5Stand())
    for name in copies:
        assert [bit for bit in range(config.input_bits) if f" {name}_ff{bit} (" in verilog] == list(
            range(config.input_bits))
    assert verilog.count("TRELLIS_FF ") == config.input_bits * len(copies) + len(_PASSED[dataflow])
    dsp = to_verilog(ProcessingElement(config, multiplier="dsp"), "pe", platform=Ecp5Stand())
    assert "_late_ff" not in dsp


@pytest.mark.parametrize("dataflow", ["ws", "os"])
@pytest.mark.parametrize("multiplier", ["dsp", "logic"])
def test_pe_control_bits_pass_through_unmerged_registers_on_ecp5(dataflow: str, multiplier: str) -> None:
    """On ECP5 each control bit a PE passes on is a TRELLIS_FF of its own, reset by the sync reset
    and under the PE's enable: the array skews those bits along the grid, so registers of PEs
    far apart hold equal values and yosys would otherwise merge them into one."""
    config = AcceleratorConfig(rows=2, cols=2, dataflow=dataflow)
    verilog = to_verilog(ProcessingElement(config, multiplier=multiplier), "pe", platform=Ecp5Stand())
    for name in _PASSED[dataflow]:
        instance = re.search(rf"TRELLIS_FF #\((?P<params>[^;]*?)\) {name}_passed_ff0 \((?P<ports>[^;]*?)\);",
                             verilog, re.S)
        assert instance, name
        assert '.CEMUX("CE")' in instance["params"] and '.REGSET("RESET")' in instance["params"]
        assert ".LSR(rst)" in instance["ports"] and ".CE(enable)" in instance["ports"], instance["ports"]
