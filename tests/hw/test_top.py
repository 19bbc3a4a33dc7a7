"""The whole accelerator (hw/top.py) in the Amaranth simulator runs the golden model's test
programs bit-exactly, under AXI backpressure too, and reports errors as docs/architecture.md says."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from systolic.hw.accumulator import store_read_queue
from systolic.hw.config import AcceleratorConfig
from systolic.hw.controller import ERR_FLAGS, ERR_ILLEGAL, ERR_NO_FINISH, ERR_SLVERR
from systolic.hw.generate import TOP_NAME, top_verilog
from systolic.hw.isa import FIELDS, INSTR_BYTES, Instruction, Opcode, Program, encode
from systolic.sim.golden import ExecutionError, run_golden
from systolic.sim.programs import conv_case, gemm_case, pool_case, residual_case, tile_load
from systolic.sim.tools import verilator_lint

from tests.hw.accel_harness import run_accelerator
from tests.illegal_computes import FIRST_MACS, compute, first_compute, illegal_computes, illegal_program

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


SERIAL = AcceleratorConfig(**SMALL, gather_engine="serial", scatter_engine="serial",
                           sfu_engine="serial", command_registers=False, memory_registers=False)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["conv", "residual", "gemm_os"])
def test_serial_engines_without_command_registers(case):
    """The serial DMA engines and SFU, no command or memory registers (the small FPGAs'
    choices): the same results and DRAM traffic as the golden model, for an im2col gather with
    padding, a residual add (its reads go through the same reader) and an output-stationary
    GEMM from an NCHW image."""
    if case == "conv":
        built = conv_case(SERIAL, 5, 6, 3, 5, 3, 3, stride=2, pad=1, act="relu", seed=4)
    elif case == "residual":
        built = residual_case(SERIAL, 6, 5, 4, seed=7)
    else:
        built = conv_case(SERIAL.replace(dataflow="os"), 5, 5, 2, 3, 3, 3, pad=1, layout="nchw",
                          seed=5)
    rtl, golden = _check_against_golden(built, stall=0.2, latency=(0, 4), seed=3)
    assert rtl.counters["dram_read_bytes"] == golden.dram_read_bytes
    assert rtl.counters["dram_write_bytes"] == golden.dram_write_bytes


@pytest.mark.slow
@pytest.mark.parametrize("field, value", [("command_registers", False), ("memory_registers", False),
                                          ("sfu_engine", "serial"), ("gather_engine", "serial"),
                                          ("scatter_engine", "serial")])
def test_each_small_fpga_option_alone(field, value):
    """Each area option on its own, the others at their defaults: a residual add (LOADs,
    residual reads, requantized STOREs) and an average-pooled image, as the golden model has
    them."""
    config = AcceleratorConfig(**SMALL, **{field: value})
    _check_against_golden(residual_case(config, 6, 5, 4, seed=7), stall=0.2, latency=(0, 3), seed=2)
    _check_against_golden(pool_case(config, 5, 5, 4, pool="avg", kernel=3, stride=2, pad=1, seed=6))


def test_serial_engines_slverr_on_a_load_halts():
    load = Instruction("LOAD", dst="spad", dram_addr=512, pitch_y=4, pitch_c=1, rows_outer=1,
                       rows_inner=2, inner_dy=1, segs=1, seg_len=4, elem_dc=1)
    program, dram = _program_image([load, Instruction("FINISH")], config=SERIAL, extra=1024)
    rtl = run_accelerator(SERIAL, program, dram, prog_addr=0, error_at={512})
    assert rtl.done and rtl.error == ERR_SLVERR and rtl.error_pc == 0


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


_ILLEGAL = [(config, bad, field) for config in (WS, OS) for _, bad, field in illegal_computes(config)]
_ILLEGAL_IDS = [f"{config.dataflow}-{name}" for config in (WS, OS) for name, _, _ in illegal_computes(config)]


@pytest.mark.parametrize(("config", "bad", "field"), _ILLEGAL, ids=_ILLEGAL_IDS)
def test_an_illegal_compute_halts_with_its_pc(config, bad, field):
    """A COMPUTE the golden model refuses (docs/isa.md) halts the program with ERR_ILLEGAL and its
    pc, after the legal COMPUTE before it has run, instead of reaching the compute unit (whose
    counters keep only a legal COMPUTE's bits: it could hang); the later words are not run."""
    program, dram = _program_image(illegal_program(config, bad), config=config)
    with pytest.raises(ExecutionError, match=rf"^instruction 1 \(COMPUTE\): field {field}: "):
        run_golden(config, program, dram)
    rtl = run_accelerator(config, program, dram, prog_addr=0)
    assert rtl.done and rtl.error == ERR_ILLEGAL and rtl.error_pc == 1, (rtl.status, rtl.error_pc)
    assert rtl.counters["macs"] == FIRST_MACS         # the first COMPUTE only


def test_the_computes_after_an_illegal_one_are_not_run():
    """Long COMPUTEs fill the compute unit, so the illegal one waits at the head of the compute
    queue with legal ones behind it; when it moves on they follow a cycle apart, before the halt
    reaches the sequencer. None of them reaches the array."""
    bad = compute(acc_addr=WS.acc_rows - 1)
    program, dram = _program_image([first_compute(WS)] + [compute(m=40)] * 4 + [bad]
                                   + [compute(m=40)] * 3 + [Instruction("FINISH")])
    rtl = run_accelerator(WS, program, dram, prog_addr=0)
    assert rtl.done and rtl.error == ERR_ILLEGAL and rtl.error_pc == 5, (rtl.status, rtl.error_pc)
    assert rtl.counters["macs"] == 5 * FIRST_MACS


def test_reusing_the_stationary_weights_needs_a_preload_in_this_program():
    """WS preload = 0 with the last preload's k and n is legal; as a program's first COMPUTE it
    is not, even right after a program that preloaded them (each program starts without)."""
    legal, legal_dram = _program_image([first_compute(WS), compute(), compute(m=3, acc_addr=5),
                                        Instruction("FINISH")])
    golden = run_golden(WS, legal, legal_dram)
    reuse, reuse_dram = _program_image([compute(), Instruction("FINISH")])
    with pytest.raises(ExecutionError, match=r"^instruction 0 \(COMPUTE\): field preload: "):
        run_golden(WS, reuse, reuse_dram)
    runs = [(legal_dram, 0, len(legal.instructions)), (reuse_dram, 0, len(reuse.instructions)),
            (legal_dram, 0, len(legal.instructions))]
    (_, status0, _, _), (_, status1, pc1, _), (_, status2, _, _) = _run_back_to_back(WS, runs)
    assert status0 == status2 == 0b10, (status0, status2)
    assert (status1 >> 4, status1 & 0b11, pc1) == (ERR_ILLEGAL, 0b10, 0)
    assert golden.macs == (40 + 2 + 3) * 2 * 2


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


def _run_back_to_back(config, runs, *, stall=0.0, latency=(0, 0), seed=0, error_at=None,
                      max_cycles=50_000, soft_reset_after=None):
    """Runs programs one after the other on one accelerator, without a soft reset: for each
    ``(dram image, prog_addr, prog_len)`` the image is written into the memory (back door), then
    prog_addr and prog_len, then start. ``error_at``: per run, the beat addresses that answer
    SLVERR. ``soft_reset_after``: the first program is soft-reset that many cycles after its
    start (its entry is (None, STATUS after the reset, None, None)). Returns (final image, status,
    error_pc, counters {macs, instructions}: their low words) per run."""
    from amaranth.sim import Simulator
    from systolic.hw.top import Accelerator

    from tests.hw.accel_harness import (
        REG,
        add_compute_clock,
        axi_view,
        lite_read,
        lite_write,
        start,
        start_and_wait,
    )
    from tests.hw.axi_model import AXIMemory

    dut = Accelerator(config)
    size = max(len(image) for image, _, _ in runs)
    memory = bytearray(size)
    axi = AXIMemory(memory, config.dma_bytes, seed=seed, stall=stall, latency=latency)
    results = []

    async def testbench(ctx):
        for run, (image, prog_addr, prog_len) in enumerate(runs):
            axi.error_at = error_at[run] if error_at else set()
            memory[:] = bytes(np.asarray(image, np.uint8)) + bytes(size - len(image))
            if soft_reset_after is not None and run == 0:
                # start the first program, then soft-reset it part way through
                await start(ctx, dut, prog_addr, prog_len)
                for _ in range(soft_reset_after):
                    await ctx.tick()
                await lite_write(ctx, dut, REG["ctrl"], 2)
                status, _ = await lite_read(ctx, dut, REG["status"])
                results.append((None, status, None, None))
                continue
            status = await start_and_wait(ctx, dut, prog_addr, prog_len, max_cycles)
            error_pc, _ = await lite_read(ctx, dut, REG["error_pc"])
            counters = {}
            for name in ("macs", "instructions"):
                counters[name], _ = await lite_read(ctx, dut, REG[f"{name}_lo"])
            results.append((np.frombuffer(bytes(memory), np.uint8).copy(), status, error_pc, counters))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    add_compute_clock(sim, dut)
    axi.add_to(sim, axi_view(dut), read=True, write=True)
    sim.add_testbench(testbench)
    sim.run()
    return results


@pytest.mark.parametrize("order", ["long_first", "short_first"])
def test_back_to_back_programs_without_reset(order):
    """Programs of different lengths run one after the other without a soft reset: each start
    fetches from its own program's first word (no stale words of the last program or of words
    prefetched past its end), under random backpressure and latency."""
    cases = [gemm_case(WS, 9, 7, 6, seed=1), gemm_case(WS, 1, 3, 2, seed=2)]
    if order == "short_first":
        cases.reverse()
    assert len(cases[0].program.instructions) != len(cases[1].program.instructions)
    runs = [(case.dram, case.program_addr, len(case.program.instructions)) for case in cases]
    results = _run_back_to_back(WS, runs, stall=0.3, latency=(0, 5), seed=3)
    for case, (dram, status, error_pc, _) in zip(cases, results, strict=True):
        assert status == 0b10, (status, error_pc)        # done, no error
        golden = run_golden(case.config, case.program, case.dram)
        assert np.array_equal(dram, golden.dram)


@pytest.mark.parametrize("config", [WS, SERIAL], ids=["ws", "serial"])
def test_a_program_after_an_error_and_a_longer_prog_len(config):
    """After a program halted on an illegal word (its later words were prefetched), a program
    with another prog_len runs from its first word; the error and its pc are cleared."""
    bad, bad_dram = _program_image([Instruction("SYNC", queue="load")] * 5 + [Instruction("FINISH")],
                                   config=config)
    raw = bytearray(bad_dram.tobytes())
    raw[INSTR_BYTES] = 0          # opcode 0 at instruction 1
    case = gemm_case(config, 5, 6, 3, seed=4)
    runs = [(np.frombuffer(bytes(raw), np.uint8), 0, len(bad.instructions)),
            (case.dram, case.program_addr, len(case.program.instructions))]
    (_, status0, pc0, _), (dram, status1, _, _) = _run_back_to_back(config, runs)
    assert (status0 >> 4, status0 & 0b11, pc0) == (ERR_ILLEGAL, 0b10, 1)
    assert status1 == 0b10
    assert np.array_equal(dram, run_golden(case.config, case.program, case.dram).dram)


@pytest.mark.parametrize("config", [WS, SERIAL], ids=["ws", "serial"])
def test_a_program_after_a_unit_error_starts_clean(config):
    """A LOAD's SLVERR halts a program; the next one runs without the old error (start clears
    the units' errors)."""
    load = Instruction("LOAD", dst="spad", dram_addr=1024, pitch_y=4, pitch_c=1, rows_outer=1,
                       rows_inner=2, inner_dy=1, segs=1, seg_len=4, elem_dc=1)
    failing, failing_dram = _program_image([Instruction("SYNC", queue="load"), load, Instruction("FINISH")],
                                           config=config, extra=2048)
    case = gemm_case(config, 4, 4, 4, seed=9)
    runs = [(failing_dram, 0, len(failing.instructions)),
            (case.dram, case.program_addr, len(case.program.instructions))]
    (_, status0, pc0, _), (dram, status1, _, _) = _run_back_to_back(config, runs, error_at=[{1024}, set()])
    assert (status0 >> 4, status0 & 0b11, pc0) == (ERR_SLVERR, 0b10, 1)
    assert status1 == 0b10
    assert np.array_equal(dram, run_golden(case.config, case.program, case.dram).dram)


def test_each_program_starts_with_the_initial_config_registers():
    """docs/isa.md: the CONFIG registers start at zero. A program whose STORE runs without a
    CONFIG, after one that set zp_out and the bounds, requantizes with zeros (as the golden model
    does), not with the last program's values."""
    case = gemm_case(WS, 4, 4, 4, seed=9)
    first = case.program.instructions[0]
    assert first.op is Opcode.CONFIG and first.zp_out != 0
    program = Program(case.program.instructions[1:], WS.hash)
    dram = case.dram.copy()
    words = np.frombuffer(program.words(), np.uint8)
    dram[case.program_addr:case.program_addr + len(words)] = words
    runs = [(case.dram, case.program_addr, len(case.program.instructions)),
            (dram, case.program_addr, len(program.instructions))]
    (_, status0, _, _), (after, status1, _, _) = _run_back_to_back(WS, runs)
    assert status0 == status1 == 0b10
    golden = run_golden(WS, program, dram).dram
    assert not np.array_equal(golden, run_golden(WS, case.program, dram).dram)   # zp_out matters
    assert np.array_equal(after, golden)


@pytest.mark.parametrize("config", [
    AcceleratorConfig.from_toml(Path(__file__).parents[2] / "boards" / "presets" / "icebreaker.toml"),
    AcceleratorConfig(**SMALL, dma_data_bits=128, dma_max_burst=4, load_queue_depth=1,
                      compute_queue_depth=4, store_queue_depth=1, token_depth=1, counter_bits=16),
], ids=["icebreaker", "depth1-128bit"])
def test_shallow_queues_and_narrow_counters_lint_cleanly(config):
    """Queues of depth 1 and 2 (no zero-width FIFO pointers) and counters of 32 bits or less
    (no zero-width high-word latch) give Verilog that Verilator lints without new waivers."""
    verilator_lint(top_verilog(config), TOP_NAME)


@pytest.mark.parametrize("depths", [(1, 2, 4), (2, 1, 1)], ids=["1-2-4", "2-1-1"])
def test_shallow_queues(depths):
    """Queue depths 1 (one entry), 2 (entry and output register) and 4 (memory): bit-exact, with
    back-pressure from full queues at dispatch."""
    load, compute, store = depths
    config = AcceleratorConfig(**SMALL, load_queue_depth=load, compute_queue_depth=compute,
                               store_queue_depth=store, token_depth=1)
    rtl, _ = _check_against_golden(conv_case(config, 5, 6, 3, 5, 3, 3, stride=2, pad=1, act="relu", seed=8),
                                   stall=0.2, latency=(0, 3), seed=5)
    assert rtl.counters["stall_dispatch"] > 0


# -- a compute clock of its own (config.compute_clock_mhz) ---------------------------------------

@pytest.mark.parametrize("compute_mhz, sfu_row_cycles, pieces",
                         [(150.0, 1, 1), (25.0, 1, 1), (100.0, 1, 1), (150.0, 4, 1), (150.0, 1, 4),
                          (150.0, 4, 2), (25.0, 1, 8)],
                         ids=["faster", "quarter", "same", "faster-sfu4", "faster-pieces4",
                              "faster-sfu4-pieces2", "quarter-pieces8"])
def test_compute_clock_of_its_own(compute_mhz, sfu_row_cycles, pieces):
    """The compute core behind clock-domain crossings, its clock faster, a quarter and as fast as the
    rest (edges offset): the same DRAM image and MAC count as the golden model, for a GEMM with
    a requantized, activated STORE, a residual, and a bias LOADed into the accumulator that a
    COMPUTE accumulates onto. With an SFU of 4 cycles a row and the core 1.5 times as fast, the
    accumulator's read port owes one response at a time and its rows cross through a half-rate
    register (hw/top.py). With ``acc_crossing_pieces`` the accumulator's rows cross in pieces."""
    config = AcceleratorConfig(**SMALL, compute_clock_mhz=compute_mhz, sfu_row_cycles=sfu_row_cycles,
                               acc_crossing_pieces=pieces)
    assert (store_read_queue(config) == 1) == (sfu_row_cycles == 4)
    _check_against_golden(gemm_case(config, 9, 7, 6, seed=5, act="relu"))
    _check_against_golden(residual_case(config, 9, 5, 3, seed=6))
    _check_bias_then_accumulate(config)


def _check_bias_then_accumulate(config):
    """LOADs of inputs, weights and an int32 bias tile into the accumulator (extremes
    included), a COMPUTE that accumulates onto the bias, a raw STORE: the accumulator's DMA
    writes must reach it before the COMPUTE's beats (a LOAD completes only once its rows are
    in), and the STORE must read the sums. Compared with the golden model's whole image."""
    rng = np.random.default_rng(3)
    m, k, n = 6, 4, 4
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    a[0] = -128
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    b[:, 0] = -128
    bias = rng.integers(-2**31, 2**31, (m, n)).astype("<i4")
    bias[1] = [2**31 - 1, -2**31, 0, -1]
    dram = np.zeros(0x2000, np.uint8)
    dram[0x000:0x000 + a.size] = a.view(np.uint8).ravel()
    dram[0x100:0x100 + b.size] = b.view(np.uint8).ravel()
    dram[0x200:0x200 + bias.nbytes] = bias.view(np.uint8).ravel()
    program = Program((
        tile_load("spad", 0, 0x000, m, k, row_bytes=k, elem_bytes=1),
        tile_load("spad", 8, 0x100, k, n, row_bytes=n, elem_bytes=1, push_next=1),
        tile_load("acc", 2, 0x200, m, n, row_bytes=4 * n, elem_bytes=4, push_next=1),
        Instruction("SYNC", queue="compute", pop_prev=1),
        Instruction("COMPUTE", a_addr=0, b_addr=8, acc_addr=2, m=m, k=k, n=n, preload=1, accumulate=1,
                    pop_prev=1, push_next=1),
        Instruction("STORE", acc_addr=2, n=n, in_h=m, in_w=1, out_h=m, out_w=1, out_type="raw",
                    dram_addr=0x400, pitch_y=4 * n, pitch_c=4, pop_prev=1),
        Instruction("FINISH"),
    ), config.hash)
    words = program.words()
    dram[0x1000:0x1000 + len(words)] = np.frombuffer(words, np.uint8)
    golden = run_golden(config, program, dram)
    expected = (bias.astype(np.int64) + a.astype(np.int64) @ b.astype(np.int64))
    expected = ((expected + 2**31) % 2**32 - 2**31).astype("<i4")
    np.testing.assert_array_equal(golden.dram[0x400:0x400 + expected.nbytes].view("<i4").reshape(m, n),
                                  expected)
    rtl = run_accelerator(config, program, dram, prog_addr=0x1000)
    assert rtl.done and rtl.error == 0, (rtl.status, rtl.error_pc)
    assert np.array_equal(rtl.dram, golden.dram)
    assert rtl.counters["macs"] == golden.macs == m * k * n


def test_bias_then_accumulate_on_one_clock():
    _check_bias_then_accumulate(WS)


def _short_computes_program(config):
    """COMPUTEs of 1 to 5 rows back to back, most reusing the weights, accumulating into
    overlapping accumulator rows (a row again 1 to 5 rows later), then a raw STORE."""
    rng = np.random.default_rng(12)
    k, n, rows = 4, 4, 8
    dram = np.zeros(0x2000, np.uint8)
    dram[:rows * k] = rng.integers(0, 256, rows * k, dtype=np.uint8)
    dram[0x400:0x400 + 2 * k * n] = rng.integers(0, 256, 2 * k * n, dtype=np.uint8)
    # (a row, acc row, m, preload: 0 reuses the weights, 1 the first tile, 2 the second)
    plan = [(0, 0, 1, 1), (1, 0, 1, 0), (2, 0, 1, 0), (0, 1, 2, 0), (3, 0, 3, 0), (2, 2, 1, 2), (0, 2, 4, 0),
            (4, 3, 2, 0), (1, 0, 5, 0), (5, 1, 3, 1), (0, 0, 4, 0), (6, 3, 2, 0)]
    ws = config.dataflow == "ws"
    computes = []
    for i, (a_row, acc_row, m, preload) in enumerate(plan):
        # (output-stationary: no preloads, at most R rows a tile)
        computes.append(Instruction("COMPUTE", a_addr=a_row, b_addr=rows + k * max(preload - 1, 0),
                                    acc_addr=acc_row, m=m if ws else min(m, config.rows), k=k, n=n,
                                    preload=int(ws and preload > 0),
                                    accumulate=int(i > 0), pop_prev=int(i == 0),
                                    push_next=int(i == len(plan) - 1)))
    program = Program((
        tile_load("spad", 0, 0x000, rows, k, row_bytes=k, elem_bytes=1),
        tile_load("spad", rows, 0x400, 2 * k, n, row_bytes=n, elem_bytes=1, push_next=1),
        *computes,
        Instruction("STORE", acc_addr=0, n=n, in_h=6, in_w=1, out_h=6, out_w=1, out_type="raw",
                    dram_addr=0x800, pitch_y=4 * n, pitch_c=4, pop_prev=1),
        Instruction("FINISH"),
    ), config.hash)
    words = program.words()
    dram[0x1C00:0x1C00 + len(words)] = np.frombuffer(words, np.uint8)
    return program, dram


@pytest.mark.parametrize("config", [WS, WS.replace(memory_registers=False), OS,
                                    WS.replace(compute_clock_mhz=150.0)],
                         ids=["ws", "ws-direct", "os", "ws-faster-core"])
def test_short_computes_into_the_same_rows(config):
    """Back-to-back COMPUTEs of a few rows each into the same accumulator rows: without
    forwarding in the accumulator (WS) the compute unit spaces the rows, with it (OS) the
    accumulator forwards; either way the golden model's image."""
    program, dram = _short_computes_program(config)
    golden = run_golden(config, program, dram)
    rtl = run_accelerator(config, program, dram, prog_addr=0x1C00)
    assert rtl.done and rtl.error == 0, (rtl.status, rtl.error_pc)
    assert np.array_equal(rtl.dram, golden.dram)
    assert rtl.counters["macs"] == golden.macs


def _long_compute_program(config):
    """LOADs of 120 input rows and a weight tile, then four COMPUTEs of 120 rows each into the
    same accumulator rows (about 480 compute-clock cycles of work after ~150 cycles of LOADs),
    a STORE and FINISH."""
    m, k, n = 120, 4, 4
    rng = np.random.default_rng(8)
    dram = np.zeros(0x2000, np.uint8)
    dram[:m * k] = rng.integers(0, 256, m * k, dtype=np.uint8)
    dram[0x400:0x400 + k * n] = rng.integers(0, 256, k * n, dtype=np.uint8)
    computes = [Instruction("COMPUTE", a_addr=0, b_addr=m, acc_addr=0, m=m, k=k, n=n, preload=int(i == 0),
                            accumulate=int(i > 0), pop_prev=int(i == 0), push_next=int(i == 3))
                for i in range(4)]
    program = Program((
        tile_load("spad", 0, 0x000, m, k, row_bytes=k, elem_bytes=1),
        tile_load("spad", m, 0x400, k, n, row_bytes=n, elem_bytes=1, push_next=1),
        *computes,
        Instruction("STORE", acc_addr=0, n=n, in_h=m, in_w=1, out_h=m, out_w=1, out_type="raw",
                    dram_addr=0x800, pitch_y=4 * n, pitch_c=4, pop_prev=1),
        Instruction("FINISH"),
    ), config.hash)
    words = program.words()
    dram[0x1C00:0x1C00 + len(words)] = np.frombuffer(words, np.uint8)
    return program, dram, 0x1C00


@pytest.mark.parametrize("compute_mhz, after", [(150.0, 300), (40.0, 800), (0.0, 400)],
                         ids=["faster", "slower", "one-clock"])
def test_soft_reset_during_computes(compute_mhz, after):
    """A program soft-reset while its COMPUTEs run, ``after`` cycles after its start (its LOADs,
    throttled by the compute clock, are done by then: no AXI transaction is in flight, which a
    soft reset does not wait for), then another program: it leaves the golden model's image, and
    the counters hold only its own counts (no count, completion or item from before the reset
    crossed into it)."""
    config = AcceleratorConfig(**SMALL, compute_clock_mhz=compute_mhz)
    program, image, prog_addr = _long_compute_program(config)
    second = gemm_case(config, 5, 9, 7, seed=2, act="relu")
    runs = [(image, prog_addr, len(program.instructions)),
            (second.dram, second.program_addr, len(second.program.instructions))]
    (_, status0, _, _), (dram, status1, _, counters) = _run_back_to_back(config, runs,
                                                                          soft_reset_after=after)
    assert status0 & 3 == 0                # idle after the soft reset: neither busy nor done
    assert status1 & 2 and (status1 >> 4) & 0xF == 0, status1
    golden = run_golden(config, second.program, second.dram)
    assert np.array_equal(dram[:golden.dram.size], golden.dram) and not dram[golden.dram.size:].any()
    assert counters == {"macs": golden.macs, "instructions": len(second.program.instructions)}
    # the first program alone runs to the golden model's result (a guard for the program)
    first = run_accelerator(config, program, image, prog_addr=prog_addr)
    assert first.done and first.error == 0
    assert np.array_equal(first.dram, run_golden(config, program, image).dram)
    assert first.counters["cycles"] > after + 100          # the reset met it running


def test_the_compute_clock_domains_are_local():
    """The accelerator's own clock domains (the compute core's and the crossings') are local: a
    design around it may have domains of those names."""
    from amaranth import ClockDomain, Module, Signal
    from amaranth.back import rtlil
    from systolic.hw.top import Accelerator

    outer = Module()
    outer.domains.compute = ClockDomain()
    outer.domains.crossing = ClockDomain()
    accelerator = Accelerator(AcceleratorConfig(**SMALL, compute_clock_mhz=150.0))
    outer.submodules.accelerator = accelerator
    flags = Signal(2)
    outer.d.compute += flags[0].eq(~flags[0])
    outer.d.crossing += flags[1].eq(~flags[1])
    text = rtlil.convert(outer, ports=[accelerator.compute_clk, accelerator.irq, flags])
    assert "compute_clk" in text


def test_the_crossings_fifos_follow_fifo_block_ram_bits() -> None:
    """With fifo_block_ram_bits = 1 the clock-domain crossings' asynchronous FIFOs (every one
    stores more than a bit) are marked for block RAM (without it none is: wants_block_ram,
    tests/hw/test_fifo.py), but the COMPUTE instructions' (few of their bits are read, and a
    block RAM's fixed place drew that crossing apart on the 16x16 ULX3S SoC, hw/top.py); it does
    not read ahead either."""
    from amaranth.back import rtlil
    from systolic.hw.fifo import RAM_STYLE
    from systolic.hw.top import Accelerator

    config = AcceleratorConfig(**SMALL, compute_clock_mhz=150.0, fifo_block_ram_bits=1)
    text = rtlil.convert(Accelerator(config), ports=None)
    marked, module, attributes = [], None, []
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["module"]:
            module = words[1]
        elif words[:1] == ["attribute"]:
            attributes.append(line.strip())
        elif words[:1] == ["memory"]:
            if f'attribute \\{RAM_STYLE[0]} "{RAM_STYLE[1]}"' in attributes:
                marked.append(module)
            attributes = []
        elif words:
            attributes = []
    crossings = sorted(name.split(".")[-2] for name in marked if ".crossings." in name)
    expected = ["acc_read_req", "acc_read_resp", "acc_write", "spad_write"]
    assert crossings == expected
    # those into the core read their block RAM at a register (FetchAheadAsyncFIFO), the one out
    # of it (read by the slower logic outside) does not
    fetching, module = [], None
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["module"]:
            module = words[1]
        elif words[:1] == ["wire"] and words[-1] == "\\fetch_bin" and ".crossings." in module:
            fetching.append(module.split(".")[-2])
    ahead = sorted(fetching)
    assert ahead == ["acc_read_req", "acc_write", "spad_write"]


def test_whole_items_reach_the_core_through_read_registers_in_series() -> None:
    """Whole items into the compute core leave their crossing through two StreamRegisters in
    series, the scratchpad rows and the accumulator's read requests through three (the hop
    between the first two, and the accumulator's grant, are then a register away from the
    consumer, docs/arch-system.md)."""
    from amaranth.back import rtlil
    from systolic.hw.top import Accelerator

    config = AcceleratorConfig(**SMALL, compute_clock_mhz=150.0)
    text = rtlil.convert(Accelerator(config), ports=None)
    registers: dict[str, list[str]] = {}
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["module"] and ".crossings." in words[1]:
            *_, crossing, name = words[1].split(".")
            if name.startswith("r_register"):
                registers.setdefault(crossing, []).append(name)
    assert {crossing: sorted(names) for crossing, names in registers.items()} == {
        "cmd": ["r_register", "r_register1"],
        "spad_write": ["r_register", "r_register1", "r_register2"],
        "acc_write": ["r_register", "r_register1"],          # whole rows in this config
        "acc_read_req": ["r_register", "r_register1", "r_register2"],
    }
