"""Golden model: the STORE path through the SFU (bias, requantize, zero point, residual,
activation, saturation, pooling) against the formulas of docs/isa.md written out in Python
integers, at the edges: ties (to even, on either side of the zero point), the largest
multipliers, shifts 0 and 62, saturation at both ends."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
from systolic.hw.config import AcceleratorConfig
from systolic.hw.isa import Instruction, Program
from systolic.sim.catalogue import POOL, POOL_GLOBAL_ROW, POOL_RECTANGULAR, RESIDUAL
from systolic.sim.golden import run_golden
from systolic.sim.programs import tile_load

WIDE = AcceleratorConfig(rows=2, cols=64)   # 64 channels per STORE: many entries per run
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
ACT = {"none": 0, "relu": 1, "relu6": 2, "clip": 3}


# -- the documented formulas, in Python integers --------------------------------------------

def _round(x: int, s: int, zp: int, tie_out: int) -> int:
    """x * 2**-s + zp to the nearest integer, ties to even: the even output with ``tie_out``,
    else the even value before zp is added (Python's round() of a Fraction rounds half to even)."""
    if tie_out:
        return round(Fraction(x, 1 << s) + zp)
    return round(Fraction(x, 1 << s)) + zp


def _act(q: int, act: str, regs: dict[str, int]) -> int:
    if act == "relu":
        return max(q, regs["zp_out"])
    if act == "relu6":
        return min(max(q, regs["zp_out"]), regs["act_hi"])
    if act == "clip":
        return min(max(q, regs["act_lo"]), regs["act_hi"])
    return q


def _pointwise(a, entry, regs, act, config, r=None):
    bias, mult, shift = (int(v) for v in entry)
    lo, hi = config.acc_range
    t = min(max(int(a) + bias, lo), hi)
    x = t * mult
    if r is not None:
        x += (int(r) - regs["res_zp"]) * regs["res_mult"]
    q = _round(x, shift, regs["zp_out"], regs["tie_out"])
    out_lo, out_hi = config.output_range
    return min(max(_act(q, act, regs), out_lo), out_hi)


# -- a program: LOAD table and accumulator image, CONFIG, STORE ---------------------------------

REGS0 = {"zp_out": 0, "act_lo": 0, "act_hi": 0, "avg_mult": 0, "avg_shift": 0, "res_zp": 0,
         "res_mult": 0, "tie_out": 0, "avg_tie_out": 0}


def _store_run(config, acc, entries, regs, *, residual=None, **store):
    """Run LOAD table + LOAD acc (image h x w x n) + CONFIG + STORE; return the output
    (out_h, out_w, n) as ints."""
    h, w, n = acc.shape
    out_h, out_w = store.pop("out_h", h), store.pop("out_w", w)
    ab = config.acc_bytes
    dt = np.dtype(f"<i{config.input_bytes}")
    dram = np.zeros(1 << 16, np.uint8)
    acc_bytes = np.asarray(acc, np.int64).astype(f"<i{ab}").tobytes()
    dram[:len(acc_bytes)] = np.frombuffer(acc_bytes, np.uint8)
    table = np.asarray(entries, np.int64).astype("<i4").tobytes()
    dram[0x8000:0x8000 + len(table)] = np.frombuffer(table, np.uint8)
    fields = {}
    if residual is not None:
        res = np.asarray(residual, np.int64).astype(dt).tobytes()
        dram[0xA000:0xA000 + len(res)] = np.frombuffer(res, np.uint8)
        fields = {"residual": 1, "res_addr": 0xA000}
    program = Program((
        Instruction("CONFIG", **regs),
        tile_load("table", 0, 0x8000, 1, n, row_bytes=0, elem_bytes=12),
        tile_load("acc", 0, 0, h * w, n, row_bytes=n * ab, elem_bytes=ab, push_next=1),
        Instruction("SYNC", queue="compute", pop_prev=1, push_next=1),
        Instruction("STORE", n=n, in_h=h, in_w=w, out_h=out_h, out_w=out_w, dram_addr=0xC000,
                    pitch_y=out_w * n * dt.itemsize, pitch_x=n * dt.itemsize, pitch_c=dt.itemsize,
                    pop_prev=1, **fields, **store),
        Instruction("FINISH"),
    ), config.hash)
    result = run_golden(config, program, dram)
    size = out_h * out_w * n * dt.itemsize
    return result.dram[0xC000:0xC000 + size].view(dt).reshape(out_h, out_w, n).astype(np.int64)


def test_rounding_ties_go_to_even():
    # x * 1 >> 1 for x = 1, 3, 5, -1, -3, -5, 2, -2: 0.5 1.5 2.5 -0.5 -1.5 -2.5 1 -1
    acc = np.array([1, 3, 5, -1, -3, -5, 2, -2]).reshape(8, 1, 1)
    out = _store_run(WIDE, acc, [(0, 1, 1)], REGS0)
    assert out.reshape(-1).tolist() == [0, 2, 2, 0, -2, -2, 1, -1]
    # an odd zero point: tie_out 0 keeps the value before it even, tie_out 1 the output
    out = _store_run(WIDE, acc, [(0, 1, 1)], dict(REGS0, zp_out=1))
    assert out.reshape(-1).tolist() == [1, 3, 3, 1, -1, -1, 2, 0]
    out = _store_run(WIDE, acc, [(0, 1, 1)], dict(REGS0, zp_out=1, tie_out=1))
    assert out.reshape(-1).tolist() == [2, 2, 4, 0, 0, -2, 2, 0]


def test_ties_at_the_largest_shift_and_product():
    # INT32_MIN * -2**30 = 2**61: 0.5 at shift 62, and -0.5 for +2**30; one off is no tie
    acc = np.array([-(1 << 30), 1 << 30, -(1 << 30) - 1, (1 << 30) + 1, INT32_MIN]).reshape(5, 1, 1)
    for zp, tie_out, want in [(0, 0, [0, 0, 1, -1, 1]), (3, 0, [3, 3, 4, 2, 4]), (3, 1, [4, 2, 4, 2, 4])]:
        out = _store_run(WIDE, acc, [(0, INT32_MIN, 62)], dict(REGS0, zp_out=zp, tie_out=tie_out))
        assert out.reshape(-1).tolist() == want, (zp, tie_out)


def test_shift_zero_is_identity_and_shift_62_rounds():
    # acc 2**31 - 1 with mult 2**31 - 1 and shift 62: (2**62 - 2**32 + 1 + 2**61) >> 62 = 1
    acc = np.array([INT32_MAX, INT32_MIN, 100, -100]).reshape(4, 1, 1)
    out = _store_run(WIDE, np.repeat(acc, 2, axis=2), [(0, INT32_MAX, 62), (0, 1, 0)], REGS0)
    # -2**31 * (2**31 - 1) / 2**62 = -0.99999995 rounds to -1
    assert out[:, 0, 0].tolist() == [1, -1, 0, 0]
    assert out[:, 0, 1].tolist() == [127, -128, 100, -100]


@pytest.mark.parametrize("act", list(ACT))
def test_requantize_edges(act):
    """64 channels of edge entries times 32 accumulator values of the edges and random ones."""
    rng = np.random.default_rng(ACT[act])
    mults = [INT32_MAX, INT32_MIN, 0, 1, -1, 1 << 30, 1518500250, -77]
    shifts = [0, 1, 2, 31, 32, 40, 61, 62]
    biases = [INT32_MIN, INT32_MAX, 0, 1, -1, 12345, -(1 << 20)]
    combos = list(itertools.product(mults, shifts))
    rng.shuffle(combos)
    channels = [(biases[i % len(biases)], m, s) for i, (m, s) in enumerate(combos[:64])]
    values = [INT32_MIN, INT32_MAX, INT32_MIN + 1, INT32_MAX - 1, 0, 1, -1, 2, -2, 127, -128,
              1 << 24, -(1 << 24)]
    values += rng.integers(INT32_MIN, INT32_MAX, 32 - len(values), endpoint=True).tolist()
    acc = np.array(values).reshape(32, 1, 1).repeat(64, axis=2)
    regs = dict(REGS0, zp_out=int(rng.integers(-20, 20)), act_lo=-90, act_hi=100)
    out = _store_run(WIDE, acc, channels, regs, act=ACT[act])
    expected = [[_pointwise(a, channels[c], regs, act, WIDE) for c in range(64)] for a in values]
    np.testing.assert_array_equal(out[:, 0, :], np.array(expected))
    if act == "none":   # saturation at both ends is reached
        assert out.min() == -128 and out.max() == 127
    else:               # and the activation bounds
        low = regs["act_lo"] if act == "clip" else regs["zp_out"]
        high = 127 if act == "relu" else regs["act_hi"]
        assert out.min() == low and out.max() == high


@pytest.mark.parametrize("act", list(ACT))
@pytest.mark.parametrize("zp_out", [-128, -5, 0, 17, 127])
def test_activations(act, zp_out):
    rng = np.random.default_rng(zp_out + 200)
    regs = dict(REGS0, zp_out=zp_out, act_lo=int(rng.integers(-128, 0)),
                act_hi=int(rng.integers(0, 128)))
    acc = rng.integers(-300, 300, (16, 1, 64))
    entries = [(int(b), 1, 0) for b in rng.integers(-50, 50, 64)]
    out = _store_run(WIDE, acc, entries, regs, act=ACT[act])
    expected = [[_pointwise(acc[p, 0, c], entries[c], regs, act, WIDE) for c in range(64)]
                for p in range(16)]
    np.testing.assert_array_equal(out[:, 0, :], np.array(expected))


def test_bias_add_saturates_before_the_multiplier():
    # INT32_MAX + 10 saturates to INT32_MAX, then * 1 >> 24 = 128 - 1 (rounded) -> 127 (saturated)
    acc = np.array([INT32_MAX, INT32_MIN]).reshape(2, 1, 1)
    out = _store_run(WIDE, acc, [(10, 1, 24)], REGS0)
    assert out.reshape(-1).tolist() == [127, -128]
    out = _store_run(WIDE, acc, [(-10, 1, 30)], REGS0)   # 2**31 / 2**30 = 2; -2**31 / 2**30 = -2
    assert out.reshape(-1).tolist() == [2, -2]


@pytest.mark.parametrize("tie_out", [0, 1])
def test_residual_add_edges(tie_out):
    rng = np.random.default_rng(3 + tie_out)
    for res_mult, shift, res_zp in [(INT32_MAX, 31, -128), (INT32_MIN, 31, 127), (1, 0, 0),
                                    (1 << 30, 62, 5), (-3, 2, -32768), (1 << 11, 12, -1)]:
        regs = dict(REGS0, zp_out=-3, act_hi=90, res_zp=res_zp, res_mult=res_mult, tie_out=tie_out)
        acc = rng.integers(-5000, 5000, (8, 1, 64))
        acc[2] = INT32_MAX
        acc[3] = INT32_MIN
        residual = rng.integers(-128, 128, (8, 1, 64))
        residual[0] = -128
        residual[1] = 127
        # multipliers of the shift's scale, small ones and the largest: many exact ties
        mults = [1 << min(max(shift - 1, 0), 30), INT32_MAX, INT32_MIN, -(1 << min(max(shift - 2, 0), 30))]
        mults += rng.integers(1, 4096, 60).tolist()
        entries = [(0, int(m), shift) for m in mults]
        out = _store_run(WIDE, acc, entries, regs, residual=residual, act=ACT["relu6"])
        expected = [[_pointwise(acc[p, 0, c], entries[c], regs, "relu6", WIDE, residual[p, 0, c])
                     for c in range(64)] for p in range(8)]
        np.testing.assert_array_equal(out[:, 0, :], np.array(expected))


def test_residual_is_rounded_once_with_the_channel_shift():
    """0.5 + 0.5 = 1: rounding the two terms separately would give 0 + 0 (ties to even) or
    1 + 1 (ties up); one rounding gives 1. The residual term uses each channel's table shift."""
    acc = np.array([1, 3, -1]).reshape(3, 1, 1).repeat(2, axis=2)
    residual = np.array([1, 1, -3]).reshape(3, 1, 1).repeat(2, axis=2)
    # channel 0: shift 1 (a/2 + r/2); channel 1: shift 2 (a/4 + r/4)
    out = _store_run(WIDE, acc, [(0, 1, 1), (0, 1, 2)], dict(REGS0, res_mult=1), residual=residual)
    assert out[:, 0, 0].tolist() == [1, 2, -2]           # 1, 2, -2 exactly
    assert out[:, 0, 1].tolist() == [0, 1, -1]           # 0.5 -> 0, 1, -1


def test_config_registers_hold_until_the_next_config():
    config = AcceleratorConfig()
    dram = np.zeros(4096, np.uint8)
    dram[0:4] = np.frombuffer(np.array([40], "<i4").tobytes(), np.uint8)
    dram[256:268] = np.frombuffer(np.array([0, 1, 0], "<i4").tobytes(), np.uint8)
    store = {"n": 1, "in_h": 1, "in_w": 1, "out_h": 1, "out_w": 1}
    program = [
        tile_load("table", 0, 256, 1, 1, row_bytes=0, elem_bytes=12),
        tile_load("acc", 0, 0, 1, 1, row_bytes=4, elem_bytes=4, push_next=1),
        Instruction("SYNC", queue="compute", pop_prev=1, push_next=1),
        Instruction("CONFIG", zp_out=5),
        Instruction("STORE", dram_addr=1024, pop_prev=1, **store),
        Instruction("STORE", dram_addr=1025, **store),
        Instruction("CONFIG", zp_out=-7),
        Instruction("STORE", dram_addr=1026, **store),
        Instruction("FINISH"),
    ]
    result = run_golden(config, program, dram)
    assert result.dram[1024:1027].view(np.int8).tolist() == [45, 45, 33]


# -- pooling --------------------------------------------------------------------------------

def test_average_pool_counts_padding_as_the_zero_point():
    """2x2 image, 3x3 window, pad 1, stride 1: every window holds the 4 pixels and 5 padding
    pixels. Identity requantize with zp_out 3 gives v = 13, 23, 33, 43."""
    acc = np.array([10, 20, 30, 40]).reshape(2, 2, 1)
    window = {"pool": 2, "pool_h": 3, "pool_w": 3, "stride_h": 1, "stride_w": 1, "pad_top": 1,
              "pad_left": 1}
    # sum = 112 + 5 * 3 = 127; centred 127 - 9 * 3 = 100; times 1 >> 0 = 100; + 3 = 103
    out = _store_run(WIDE, acc, [(0, 1, 0)], dict(REGS0, zp_out=3, avg_mult=1), **window)
    assert out.reshape(-1).tolist() == [103] * 4
    # (100 * 7282 + 2**15) >> 16 = 11; + 3 = 14
    out = _store_run(WIDE, acc, [(0, 1, 0)], dict(REGS0, zp_out=3, avg_mult=7282, avg_shift=16),
                     **window)
    assert out.reshape(-1).tolist() == [14] * 4


@pytest.mark.parametrize("zp_out", [-7, 0, 4, 5])
def test_average_pool_ties_go_to_even(zp_out):
    """2x2 windows with avg_mult/2**avg_shift = 1/4 exactly: centred sums of 2 mod 4 are ties.
    An even zero point makes both tie choices agree; an odd one tells them apart."""
    rng = np.random.default_rng(zp_out + 50)
    acc = rng.integers(-128, 128, (6, 6, 64))
    acc[0:2, 0:2] = 127          # saturation at the top...
    acc[2:4, 0:2] = -128         # ... and at the bottom
    window = {"pool": 2, "pool_h": 2, "pool_w": 2, "stride_h": 2, "stride_w": 2}
    # identity requantize with zero point zp_out: pixel v = a + zp_out, centred sum = sum of a
    v = np.clip(acc + zp_out, -128, 127)
    centred = v.reshape(3, 2, 3, 2, 64).sum(axis=(1, 3)) - 4 * zp_out
    assert np.count_nonzero(centred % 4 == 2) > 60       # many ties
    for tie_out in (0, 1):
        regs = dict(REGS0, zp_out=zp_out, avg_mult=1 << 30, avg_shift=32, avg_tie_out=tie_out)
        out = _store_run(WIDE, acc, [(0, 1, 0)] * 64, regs, out_h=3, out_w=3, **window)
        expected = [[[min(127, max(-128, _round(int(x) << 30, 32, zp_out, tie_out))) for x in pixel]
                     for pixel in row] for row in centred]
        np.testing.assert_array_equal(out, np.array(expected))


def test_max_pool_ignores_padding():
    """All pixels below the zero point: padding must not win the maximum."""
    acc = np.array([-100, -90, -80, -70, -60, -50]).reshape(2, 3, 1)
    window = {"pool": 1, "pool_h": 2, "pool_w": 2, "stride_h": 2, "stride_w": 2, "pad_top": 1,
              "pad_left": 1}
    out = _store_run(WIDE, acc, [(0, 1, 0)], REGS0, out_h=2, out_w=2, **window)
    # windows (rows -1..0, cols -1..0), (-1..0, 1..2), (1..2, -1..0), (1..2, 1..2)
    assert out[:, :, 0].tolist() == [[-100, -80], [-70, -50]]


def test_max_pool_applies_activation_per_pixel():
    acc = np.array([-100, 50, -20, 7]).reshape(2, 2, 1)
    window = {"pool": 1, "pool_h": 2, "pool_w": 2, "stride_h": 1, "stride_w": 1}
    out = _store_run(WIDE, acc, [(0, 1, 0)], dict(REGS0, act_hi=40), act=ACT["relu6"],
                     out_h=1, out_w=1, **window)
    assert out.reshape(-1).tolist() == [40]


# The pooling and residual programs come from sim/catalogue.py, which the RTL tests run too.

@pytest.mark.parametrize("config", [AcceleratorConfig(), AcceleratorConfig(rows=4, cols=8,
                                                                           dataflow="os")],
                         ids=["ws8", "os4x8"])
@pytest.mark.parametrize("spec", POOL, ids=lambda s: s.id)
def test_pool_case(config, spec):
    case = spec.build(config)
    case.check(run_golden(config, case.program, case.dram).dram)


def test_pool_case_rectangular_window():
    config = AcceleratorConfig()
    case = POOL_RECTANGULAR.build(config)
    case.check(run_golden(config, case.program, case.dram).dram)


def test_global_average_of_a_single_row():
    config = AcceleratorConfig(rows=4, cols=4)
    case = POOL_GLOBAL_ROW.build(config)
    case.check(run_golden(config, case.program, case.dram).dram)


@pytest.mark.parametrize("dataflow", ["ws", "os"])
@pytest.mark.parametrize("spec", RESIDUAL, ids=lambda s: s.kwargs["act"])
def test_residual_case(dataflow, spec):
    config = AcceleratorConfig(rows=4, cols=8, dataflow=dataflow, scratchpad_bytes=256,
                               accumulator_bytes=512)
    case = spec.build(config)
    case.check(run_golden(config, case.program, case.dram).dram)


def test_raw_store_of_a_16_bit_accumulator():
    config = AcceleratorConfig(rows=2, cols=2, acc_bits=16)
    acc = np.array([-32768, 32767, -1, 5]).reshape(2, 1, 2)
    dram = np.zeros(1024, np.uint8)
    dram[:8] = acc.astype("<i2").view(np.uint8).ravel()
    program = [
        tile_load("acc", 0, 0, 2, 2, row_bytes=4, elem_bytes=2, push_next=1),
        Instruction("SYNC", queue="compute", pop_prev=1, push_next=1),
        Instruction("STORE", n=2, in_h=2, in_w=1, out_h=2, out_w=1, out_type="raw",
                    dram_addr=512, pitch_y=4, pitch_c=2, pop_prev=1),
        Instruction("FINISH"),
    ]
    result = run_golden(config, program, dram)
    assert result.dram[512:520].view("<i2").tolist() == [-32768, 32767, -1, 5]
