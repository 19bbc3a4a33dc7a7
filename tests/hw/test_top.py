"""The whole accelerator (hw/top.py) in the Amaranth simulator runs the golden model's test
programs bit-exactly, under AXI backpressure too, and reports errors as docs/architecture.md says."""

from __future__ import annotations

import numpy as np
import pytest
from systolic.hw.config import AcceleratorConfig
from systolic.hw.controller import ERR_FLAGS, ERR_ILLEGAL, ERR_NO_FINISH, ERR_SLVERR
from systolic.hw.isa import FIELDS, INSTR_BYTES, Instruction, Opcode, Program, encode
from systolic.sim.golden import run_golden
from systolic.sim.programs import conv_case, gemm_case, pool_case, residual_case

from tests.hw.accel_harness import run_accelerator

SMALL = dict(rows=4, cols=4, scratchpad_bytes=4096, accumulator_bytes=2048, requant_table_rows=8)
WS = AcceleratorConfig(**SMALL)
OS = AcceleratorConfig(**SMALL, dataflow="os")


def _check_against_golden(case, *, stall=0.0, latency=(0, 0), seed=0):
    golden = run_golden(case.config, case.program, case.dram)
    case.check(golden.dram)
    rtl = run_accelerator(case.config, case.program, case.dram, prog_addr=case.program_addr,
                          stall=stall, latency=latency, seed=seed)
    assert rtl.done and rtl.error == 0, (rtl.status, rtl.error_pc)
    case.check(rtl.dram)
    # the whole image, not only the expected outputs: nothing else was written
    assert np.array_equal(rtl.dram, golden.dram)
    assert rtl.counters["macs"] == golden.macs
    assert rtl.counters["instructions"] == len(case.program.instructions)
    assert rtl.counters["cycles"] > 0
    return rtl, golden


@pytest.mark.parametrize("config", [WS, OS], ids=["ws", "os"])
@pytest.mark.parametrize("shape", [(9, 7, 6), (1, 1, 1), (4, 9, 4)])
def test_gemm(config, shape):
    _check_against_golden(gemm_case(config, *shape, seed=sum(shape)))


def test_gemm_without_residual_reads():
    """Without sfu_residual the load unit has no residual port and the store unit no reads;
    without sfu_pooling the store unit walks pixels, not windows."""
    config = AcceleratorConfig(**SMALL, sfu_residual=False, sfu_pooling=())
    _check_against_golden(gemm_case(config, 7, 5, 3, seed=11, act="relu"))


def test_residual_without_pooling_hardware():
    config = AcceleratorConfig(**SMALL, sfu_pooling=())
    _check_against_golden(residual_case(config, 9, 5, 3, seed=12))


@pytest.mark.parametrize("config", [WS, OS], ids=["ws", "os"])
def test_gemm_raw_extremes(config):
    _check_against_golden(gemm_case(config, 5, 11, 4, requant=False, extremes=True))


def test_conv_padding_stride_relu():
    _check_against_golden(conv_case(WS, 5, 6, 3, 5, 3, 3, stride=2, pad=1, act="relu", seed=4))


def test_conv_output_stationary_nchw():
    _check_against_golden(conv_case(OS, 5, 5, 2, 3, 3, 3, pad=1, layout="nchw", seed=5))


@pytest.mark.parametrize("pool", ["max", "avg"])
def test_pooling(pool):
    _check_against_golden(pool_case(WS, 5, 5, 4, pool=pool, kernel=3, stride=2, pad=1, seed=6))


def test_residual():
    _check_against_golden(residual_case(WS, 6, 5, 4, seed=7))


@pytest.mark.parametrize("seed", [1, 2])
def test_random_backpressure_does_not_change_results(seed):
    _check_against_golden(gemm_case(WS, 6, 9, 5, seed=seed), stall=0.4, latency=(0, 6), seed=seed)


def _program_image(instrs, config=WS, extra=256):
    program = Program(tuple(instrs), config.hash)
    words = program.words()
    dram = np.zeros(len(words) + extra, np.uint8)
    dram[:len(words)] = np.frombuffer(words, np.uint8)
    return program, dram


def test_illegal_instruction_halts_with_its_pc():
    program, dram = _program_image([Instruction("SYNC", queue="load"), Instruction("FINISH")])
    raw = bytearray(dram.tobytes())
    raw[INSTR_BYTES] = 0          # opcode 0 at instruction 1
    rtl = run_accelerator(WS, program, np.frombuffer(bytes(raw), np.uint8), prog_addr=0)
    assert rtl.done and rtl.error == ERR_ILLEGAL and rtl.error_pc == 1


@pytest.mark.parametrize(("op", "where"), [(op, "first") for op in Opcode] + [(Opcode.LOAD, "last")],
                         ids=lambda v: v.name.lower() if isinstance(v, Opcode) else v)
def test_a_reserved_bit_halts(op, where):
    """A word with a reserved bit set (the first one above the opcode's fields, or bit 511) is
    illegal: the queue FIFOs keep only the fields, so the dispatcher must catch it."""
    used = max(f.offset + f.width for f in FIELDS[op]) if FIELDS[op] else 8
    program, dram = _program_image([Instruction(op), Instruction("FINISH")])
    raw = bytearray(dram.tobytes())
    bit = used if where == "first" else INSTR_BYTES * 8 - 1
    raw[bit // 8] |= 1 << (bit % 8)
    rtl = run_accelerator(WS, program, np.frombuffer(bytes(raw), np.uint8), prog_addr=0)
    assert rtl.done and rtl.error == ERR_ILLEGAL and rtl.error_pc == 0


def test_illegal_flags_halt():
    program, dram = _program_image([Instruction("LOAD", pop_prev=1, rows_outer=1, rows_inner=1,
                                                segs=1, seg_len=1), Instruction("FINISH")])
    rtl = run_accelerator(WS, program, dram, prog_addr=0)
    assert rtl.done and rtl.error == ERR_FLAGS and rtl.error_pc == 0


def test_program_without_finish_halts():
    program, dram = _program_image([Instruction("SYNC", queue="compute")])
    rtl = run_accelerator(WS, program, dram, prog_addr=0)
    assert rtl.done and rtl.error == ERR_NO_FINISH


def test_slverr_on_a_load_halts():
    load = Instruction("LOAD", dst="spad", dram_addr=512, pitch_y=4, pitch_c=1, rows_outer=1,
                       rows_inner=2, inner_dy=1, segs=1, seg_len=4, elem_dc=1)
    program, dram = _program_image([load, Instruction("FINISH")], extra=1024)
    rtl = run_accelerator(WS, program, dram, prog_addr=0, error_at={512})
    assert rtl.done and rtl.error == ERR_SLVERR and rtl.error_pc == 0


def test_slverr_on_a_residual_read_halts_at_the_store():
    """The residual rows come from the load unit's reader: an error response on them is the
    STORE's error, with the STORE's pc."""
    case = residual_case(WS, 6, 5, 4, seed=7)
    residual_addr, _ = case.regions["residual"]
    store = next(i for i, ins in enumerate(case.program.instructions)
                 if ins.op is Opcode.STORE and ins.residual)
    rtl = run_accelerator(WS, case.program, case.dram, prog_addr=case.program_addr,
                          error_at={residual_addr - residual_addr % WS.dma_bytes})
    assert rtl.done and rtl.error == ERR_SLVERR and rtl.error_pc == store


def test_narrow_counters_count_the_same_and_read_zero_high_words():
    """counter_bits = 16: the counters of a short program are the golden model's (they fit), and
    every high word reads 0."""
    config = AcceleratorConfig(**SMALL, counter_bits=16)
    rtl, golden = _check_against_golden(gemm_case(config, 5, 6, 3, seed=3))
    assert rtl.counters["macs"] == golden.macs < 1 << 16
    assert all(value < 1 << 16 for value in rtl.counters.values()), rtl.counters
    assert rtl.high_words == {name: 0 for name in rtl.counters}


def test_the_instruction_words_are_those_of_the_isa():
    # a guard for the harness: the image really holds the encoded program
    program, dram = _program_image([Instruction("FINISH")])
    assert bytes(dram[:INSTR_BYTES]) == encode(Instruction("FINISH"))
