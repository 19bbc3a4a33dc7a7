"""Golden model: GEMM programs (sim/programs.py gemm_case) against numpy, both dataflows,
several array shapes, partial tiles, K accumulation, accumulator wrap-around and extremes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from systolic.hw.config import AcceleratorConfig
from systolic.hw.isa import Instruction, Opcode, Program
from systolic.sim.catalogue import (
    GEMM_ACTIVATIONS,
    GEMM_CORRUPTED,
    GEMM_EXTREMES,
    GEMM_HAZARD_CHECK,
    GEMM_INT32_WRAP,
    GEMM_PER_TENSOR,
    GEMM_RAW,
    GEMM_SMALL,
    GEMM_TRANSPOSED,
    GEMM_WEIGHT_REUSE,
)
from systolic.sim.golden import GoldenModel, run_golden
from systolic.sim.programs import gemm_case, tile_load

# Small memories force tiling over every dimension; the defaults exercise the large-tile path.
CONFIGS = {
    "ws8": AcceleratorConfig(),
    "os8": AcceleratorConfig(dataflow="os"),
    "ws4": AcceleratorConfig(rows=4, cols=4, scratchpad_bytes=128, accumulator_bytes=256),
    "os4": AcceleratorConfig(rows=4, cols=4, scratchpad_bytes=64, accumulator_bytes=128,
                             dataflow="os"),
    "ws4x8": AcceleratorConfig(rows=4, cols=8, scratchpad_bytes=256, accumulator_bytes=512),
    "os4x8": AcceleratorConfig(rows=4, cols=8, scratchpad_bytes=256, accumulator_bytes=512,
                               dataflow="os"),
    "ws8x4": AcceleratorConfig(rows=8, cols=4, scratchpad_bytes=256, accumulator_bytes=256),
}
# The programs (shapes, seeds, options) come from sim/catalogue.py, which the RTL tests run too.


def _run(case, **kw):
    result = run_golden(case.config, case.program, case.dram, **kw)
    case.check(result.dram)
    return result


def _numpy_gemm(case, m, k, n):
    """A and B as stored in the case's DRAM image, multiplied by numpy (int64)."""
    c = case.config
    x_addr, _ = case.regions["x"]
    w_addr, _ = case.regions["weights"]
    dt_a = np.dtype(f"<{'i' if c.input_signed else 'u'}{c.spad_elem_bytes}")
    dt_b = np.dtype(f"<{'i' if c.weight_signed else 'u'}{c.spad_elem_bytes}")
    a = np.frombuffer(case.dram[x_addr:x_addr + m * k * dt_a.itemsize].tobytes(), dt_a).reshape(m, k)
    b = np.frombuffer(case.dram[w_addr:w_addr + k * n * dt_b.itemsize].tobytes(), dt_b).reshape(k, n)
    return a.astype(np.int64) @ b.astype(np.int64)


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("spec", GEMM_RAW, ids=lambda s: s.id)
def test_raw_gemm_matches_numpy(name, spec):
    config = CONFIGS[name]
    shape = spec.args
    case = spec.build(config)
    result = _run(case)
    addr, out = case.expected["out"]
    np.testing.assert_array_equal(out, _numpy_gemm(case, *shape))   # no wrap at these sizes
    assert result.macs == case.macs == shape[0] * shape[1] * shape[2]


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("spec", GEMM_ACTIVATIONS, ids=lambda s: s.kwargs["act"])
def test_requantized_gemm(name, spec):
    case = spec.build(CONFIGS[name])
    _run(case)
    out = case.expected["out"][1]
    lo, hi = CONFIGS[name].output_range
    assert out.min() >= lo and out.max() <= hi
    assert np.unique(out).size > 8      # a real spread, not a constant or saturated output


def test_per_tensor_scale():
    case = GEMM_PER_TENSOR.build(CONFIGS["ws4"])
    _run(case)


@pytest.mark.parametrize("name", ["ws8", "os4x8"])
def test_result_differs_when_an_operand_byte_changes(name):
    """The check is real: corrupting one input byte makes the expected result fail."""
    case = GEMM_CORRUPTED.build(CONFIGS[name])
    addr, _ = case.regions["x"]
    dram = case.dram.copy()
    dram[addr] ^= 0x01
    result = run_golden(case.config, case.program, dram)
    with pytest.raises(AssertionError, match=r"^gemm 5x7x3: out\[0, \d+\] is -?\d+, expected"):
        case.check(result.dram)


def test_extremes_saturate_requantize():
    """All -128 operands with a long K reach the int32 range; the table holds the edge entries
    (largest multipliers, shifts 0 and 62, biases at the accumulator limits)."""
    config = CONFIGS["ws8"]
    case = GEMM_EXTREMES.build(config)
    _run(case)
    out = case.expected["out"][1]
    assert {-128, 127} <= set(np.unique(out).tolist())


def test_int32_sum_wraps_output_stationary():
    """K = 131073 products of -128 * -128 sum to 2**31 + 16384, which an int32 accumulator wraps
    to a negative number (the OS dataflow takes long K per COMPUTE)."""
    config = CONFIGS["os8"]
    k = GEMM_INT32_WRAP.args[1]
    assert k == (1 << 31) // (128 * 128) + 1
    case = GEMM_INT32_WRAP.build(config)
    result = _run(case)
    expected = k * 16384 - (1 << 32)
    np.testing.assert_array_equal(case.expected["out"][1], np.full((1, 2), expected))
    assert expected < 0
    assert result.macs == 2 * k


@pytest.mark.parametrize("dataflow", ["ws", "os"])
def test_int16_accumulator_wraps(dataflow):
    """With acc_bits=16 a sum of three -128 * -128 products (49152) wraps to -16384, across
    K tiles of the small array too."""
    config = AcceleratorConfig(rows=2, cols=2, acc_bits=16, dataflow=dataflow,
                               scratchpad_bytes=64, accumulator_bytes=64)
    case = gemm_case(config, 3, 3, 3, requant=False, extremes=True)
    _run(case)
    np.testing.assert_array_equal(case.expected["out"][1], np.full((3, 3), 49152 - 65536))
    case = gemm_case(config, 5, 7, 3, seed=1, requant=False)
    _run(case)


@pytest.mark.parametrize("dataflow", ["ws", "os"])
@pytest.mark.parametrize("types", [(16, True, 16, True), (8, True, 16, True), (8, False, 8, False),
                                   (8, False, 8, True)], ids=str)
def test_element_types(dataflow, types):
    input_bits, input_signed, weight_bits, weight_signed = types
    config = AcceleratorConfig(rows=4, cols=4, input_bits=input_bits, input_signed=input_signed,
                               weight_bits=weight_bits, weight_signed=weight_signed,
                               acc_bits=32, acc_signed=input_signed or weight_signed,
                               dataflow=dataflow, scratchpad_bytes=512, accumulator_bytes=512)
    for requant in (False, True):
        case = gemm_case(config, 9, 11, 6, seed=2, requant=requant, act="relu")
        _run(case)
    raw = gemm_case(config, 9, 11, 6, seed=2, requant=False)
    np.testing.assert_array_equal(raw.expected["out"][1], _numpy_gemm(raw, 9, 11, 6))


def test_weight_stationary_reuses_weights():
    """One preload per (k, n) tile: M tiles stream through the same stationary weights."""
    config = AcceleratorConfig(rows=4, cols=4, scratchpad_bytes=128, accumulator_bytes=1024)
    case = GEMM_WEIGHT_REUSE.build(config)
    computes = [i for i in case.program.instructions if i.op is Opcode.COMPUTE]
    assert len(computes) > 1
    assert [i.preload for i in computes] == [1] + [0] * (len(computes) - 1)
    _run(case)


def test_output_stationary_loads_transposed_tiles():
    case = GEMM_TRANSPOSED.build(CONFIGS["os8"])
    loads = [i for i in case.program.instructions if i.op is Opcode.LOAD]
    assert any(i.elem_dy == 1 and i.inner_dc == 1 for i in loads)
    _run(case)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(CONFIGS)), m=st.integers(1, 24), k=st.integers(1, 40),
       n=st.integers(1, 20), seed=st.integers(0, 2**16), requant=st.booleans())
def test_random_shapes(name, m, k, n, seed, requant):
    case = gemm_case(CONFIGS[name], m, k, n, seed=seed, requant=requant)
    _run(case)
    if not requant:
        np.testing.assert_array_equal(case.expected["out"][1], _numpy_gemm(case, m, k, n))


def test_hazard_check_does_not_change_results():
    case = GEMM_HAZARD_CHECK.build(CONFIGS["ws4x8"])
    checked = _run(case)
    unchecked = _run(case, check_hazards=False)
    np.testing.assert_array_equal(checked.dram, unchecked.dram)
    assert checked.cycles == unchecked.cycles


def test_accepts_program_words_and_instruction_lists():
    case = GEMM_SMALL.build(CONFIGS["ws8"])
    model = GoldenModel(case.config)
    by_program = model.run(case.program, case.dram)
    by_list = model.run(list(case.program.instructions), case.dram)
    by_words = model.run(case.program.words(), case.dram)
    by_ints = model.run([int.from_bytes(case.program.words()[i:i + 64], "little")
                         for i in range(0, len(case.program.words()), 64)], case.dram)
    for result in (by_program, by_list, by_words, by_ints):
        case.check(result.dram)
        assert result.cycles == by_program.cycles


def test_dram_is_not_modified_in_place():
    case = GEMM_SMALL.build(CONFIGS["ws8"])
    before = case.dram.copy()
    result = _run(case)
    np.testing.assert_array_equal(case.dram, before)
    assert result.dram is not case.dram


def test_program_words_are_in_the_image():
    case = GEMM_SMALL.build(CONFIGS["ws8"])
    words = case.program.words()
    assert case.dram[case.program_addr:case.program_addr + len(words)].tobytes() == words


def test_tile_load_then_store_round_trip():
    """A plain tile through the accumulator (LOAD acc, STORE raw) reproduces the bytes."""
    config = CONFIGS["ws8"]
    rng = np.random.default_rng(0)
    values = rng.integers(-2**31, 2**31, (5, 6)).astype("<i4")
    dram = np.zeros(4096, np.uint8)
    dram[:values.nbytes] = values.view(np.uint8).ravel()
    program = Program((
        tile_load("acc", 3, 0, 5, 6, row_bytes=24, elem_bytes=4, push_next=1),
        Instruction("SYNC", queue="compute", pop_prev=1, push_next=1),
        Instruction("STORE", acc_addr=3, n=6, in_h=5, in_w=1, out_h=5, out_w=1, out_type="raw",
                    dram_addr=1024, pitch_y=24, pitch_c=4, pop_prev=1),
        Instruction("FINISH"),
    ), config.hash)
    result = run_golden(config, program, dram)
    np.testing.assert_array_equal(result.dram[1024:1024 + values.nbytes].view("<i4").reshape(5, 6),
                                  values)
