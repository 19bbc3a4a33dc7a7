"""Golden model: queues, dependency tokens, hazards, deadlocks and the cycle estimate."""

from __future__ import annotations

import re

import numpy as np
import pytest
from systolic.hw.accumulator import WRITE_LATENCY
from systolic.hw.array import array_latency, os_cycles, ws_cycles
from systolic.hw.config import AcceleratorConfig
from systolic.hw.isa import Instruction, Program, encode
from systolic.sim.catalogue import GEMM_DEPTH_ONE, GEMM_MISSING_TOKEN, GEMM_OVERLAP
from systolic.sim.golden import (
    DeadlockError,
    ExecutionError,
    GoldenModel,
    HazardError,
    InstrTiming,
    run_golden,
)
from systolic.sim.programs import tile_load

CONFIG = AcceleratorConfig()   # 8 x 8, 8-byte bus (8 cycles per instruction fetch), latency 16


def _i(op, **fields):
    return Instruction(op, **fields)


def _spad_load(row, dram_addr, rows=1, **flags):
    return tile_load("spad", row, dram_addr, rows, 8, row_bytes=8, elem_bytes=1, **flags)


def _store_raw(acc_addr, dram_addr, **flags):
    return _i("STORE", acc_addr=acc_addr, n=1, in_h=1, in_w=1, out_h=1, out_w=1, out_type="raw",
              dram_addr=dram_addr, **flags)


def _run(program, config=CONFIG, size=1 << 16, **kw):
    return run_golden(config, program, np.zeros(size, np.uint8), **kw)


# -- cycle estimate ---------------------------------------------------------------------------

def test_cycle_estimate_by_hand():
    """8 x 8 WS: array latency R + C + 4 = 20, a row readable in the accumulator 7 cycles after
    its result (WRITE_LATENCY); SFU latency 16 (residual and pooling configured); DRAM latency 16."""
    program = [
        # 16 aligned 8-byte rows: 16 beats + latency 16 = 32 cycles
        tile_load("spad", 0, 0x1000, 16, 8, row_bytes=8, elem_bytes=1),
        # 8 rows at an address 4 bytes into a beat: 2 beats each, 16 + 16 = 32 cycles
        tile_load("spad", 16, 0x2004, 8, 8, row_bytes=8, elem_bytes=1, push_next=1),
        # preload from 72: weight rows 72..79, input rows 80..95 (busy k + m = 24); last result
        # row at 95 + 20 = 115, readable at 122
        _i("COMPUTE", b_addr=16, m=16, k=8, n=8, preload=1, pop_prev=1, push_next=1),
        # reuse: input rows follow at 96..111 (busy m = 16), result 131, readable at 138
        _i("COMPUTE", acc_addr=16, m=16, k=8, n=8, push_next=1),
        _i("CONFIG", zp_out=1),
        # raw, 16 pixels of 32 aligned bytes: 64 beats > 16 SFU cycles; + SFU latency 16 = 80
        _i("STORE", n=8, in_h=16, in_w=1, out_h=16, out_w=1, out_type="raw", dram_addr=0x3000,
           pitch_y=32, pitch_c=4, pop_prev=1),
        # int with residual: 16 output beats + 16 residual rows of 2 beats + latency 16 = 64;
        # + SFU latency 16 = 80, after the previous STORE
        _i("STORE", acc_addr=16, n=8, in_h=16, in_w=1, out_h=16, out_w=1, dram_addr=0x4000,
           pitch_y=8, pitch_c=1, residual=1, res_addr=0x5003, pop_prev=1),
        _i("FINISH"),
    ]
    result = _run(program)
    assert result.timings == [
        InstrTiming(0, "LOAD", "load", 8, 8, 40),
        InstrTiming(1, "LOAD", "load", 16, 40, 72),
        InstrTiming(2, "COMPUTE", "compute", 24, 72, 122),
        InstrTiming(3, "COMPUTE", "compute", 32, 96, 138),
        InstrTiming(4, "CONFIG", "store", 40, 40, 41),
        InstrTiming(5, "STORE", "store", 48, 122, 202),
        InstrTiming(6, "STORE", "store", 56, 202, 282),
        InstrTiming(7, "FINISH", "dispatcher", 64, 282, 283),
    ]
    assert result.cycles == 283
    assert result.busy == {"load": 64, "compute": 24 + 16, "store": 1 + 80 + 80}
    assert result.macs == 2 * 16 * 8 * 8
    # bus bytes: the 64 bytes from 0x2004 span 9 beats, the 128 residual bytes from 0x5003 17
    assert result.dram_read_bytes == 128 + 9 * 8 + 17 * 8
    assert result.dram_write_bytes == 16 * 32 + 128
    assert result.instructions == 8
    assert result.utilization == pytest.approx(2048 / (64 * 283))
    assert result.summary()["cycles"] == 283


def test_serial_gather_engine_load_and_residual_cycles_by_hand():
    """gather_engine = "serial" (hw/dma_serial.py): a LOAD takes its setup (a cycle per bit of
    each product's multiplier, at least one, 15 products), a cycle per destination byte and per
    row, and dram_latency + 3 per beat read; a residual read costs the same for the command the
    store unit gives the reader."""
    config = AcceleratorConfig(gather_engine="serial")
    program = [
        # 3 rows of 8 bytes from 0x1004, 8 apart: beats 0x200..0x203, 4 beats. Products:
        # elem_bytes 1 (1 bit), elem_dc 1 (1), inner_dy 1 (1), the other 12 zero (1 each): 15
        tile_load("spad", 0, 0x1004, 3, 8, row_bytes=8, elem_bytes=1),
        # residual: rows_outer 2, rows_inner 1, seg_len 8 of 1 byte, at 0x2000 (2 beats):
        # setup 15, 16 bytes, 2 rows, 2 beats
        _i("STORE", n=8, in_h=2, in_w=1, out_h=2, out_w=1, dram_addr=0x3000, pitch_y=8,
           pitch_c=1, residual=1, res_addr=0x2000),
        _i("FINISH"),
    ]
    result = _run(program, config)
    load = result.timings[0]
    assert load.end - load.start == 15 + 24 + 3 + 4 * (16 + 3)
    store = result.timings[1]
    residual = 15 + 16 + 2 + 2 * (16 + 3)
    assert store.end - store.start == max(2 * config.sfu_row_cycles, 2 + residual) + 16


def test_serial_scatter_engine_store_cycles_by_hand():
    """scatter_engine = "serial": a STORE's writes take a cycle for the command, one per byte and
    three per beat; the STORE ends when the slower of the SFU and the writes ends, plus the SFU
    latency (16)."""
    config = AcceleratorConfig(scatter_engine="serial")
    # 4 pixels of 8 int8 channels, 16 apart from 0x3003: each pixel spans 2 beats (8-byte bus)
    store = _i("STORE", n=8, in_h=4, in_w=1, out_h=4, out_w=1, dram_addr=0x3003, pitch_y=16,
               pitch_c=1)
    result = _run([store, _i("FINISH")], config)
    timing = result.timings[0]
    assert timing.end - timing.start == max(4 * config.sfu_row_cycles, 1 + 32 + 3 * 8) + 16
    assert result.dram_write_bytes == 8 * 8


def test_serial_sfu_store_cycles_by_hand():
    """sfu_engine = "serial": a STORE's SFU time is a cycle per beat plus, per channel of the
    accumulator row (all C, whatever n), the bias, 32 multiply, rounding (1 for shift 0), zero
    point and activation cycles; the output is valid SERIAL_LATENCY (1) cycle later."""
    config = AcceleratorConfig(sfu_engine="serial")
    # the table is all zero (shift 0): 36 cycles per channel, 8 channels, 2 pixels
    store = _i("STORE", n=8, in_h=2, in_w=1, out_h=2, out_w=1, dram_addr=0x3000, pitch_y=8,
               pitch_c=1)
    result = _run([store, _i("FINISH")], config)
    timing = result.timings[0]
    assert timing.end - timing.start == 2 * (1 + 8 * (1 + 32 + 1 + 2)) + 1


def test_output_stationary_compute_cycles():
    config = AcceleratorConfig(dataflow="os")
    program = [_i("COMPUTE", m=8, k=20, n=8), _i("COMPUTE", m=3, k=5, n=2, acc_addr=8), _i("FINISH")]
    result = _run(program, config)
    # array latency R + C + 3 = 19. First: beats 8..27; result rows 27 + 19 = 46 .. 53,
    # readable 7 cycles later. Second: its last beat waits until 27 + R = 35, so beats 31..35
    # (busy 5 + 3 cycles of cooldown); rows 54 .. 61, readable at 68.
    assert result.timings[0] == InstrTiming(0, "COMPUTE", "compute", 8, 8, 60)
    assert result.timings[1] == InstrTiming(1, "COMPUTE", "compute", 16, 31, 68)
    assert result.busy["compute"] == 20 + 8


def _back_to_back(config, tiles, m, k):
    """A long LOAD, then ``tiles`` COMPUTEs (each preloading in WS) that are all dispatched before
    the first may start, so that the array runs them back to back."""
    rows = 8 * (tiles + 2)
    program = [tile_load("spad", 0, 0, rows, 8, row_bytes=8, elem_bytes=1, push_next=1)]
    for t in range(tiles):
        fields = {"m": m, "k": k, "n": 1, "pop_prev": int(t == 0)}
        program.append(_i("COMPUTE", b_addr=200, preload=int(config.dataflow == "ws"), **fields))
    result = _run(program + [_i("FINISH")], config)
    assert all(t.dispatch < result.timings[0].end for t in result.timings[1:tiles + 1])
    return result, result.timings[1:tiles + 1]


#: (tiles, m, k): m below, equal to and above k, 1-row tiles and 1-row weights
WS_TILES = [(1, 1, 1), (1, 1, 8), (1, 16, 8), (4, 3, 8), (3, 8, 8), (3, 20, 5), (5, 1, 1), (2, 2, 7)]


@pytest.mark.parametrize("config", [CONFIG, CONFIG.replace(rows=4, cols=16)], ids=["8x8", "4x16"])
@pytest.mark.parametrize("tiles,m,k", WS_TILES, ids=str)
def test_back_to_back_ws_tiles_take_the_arrays_cycles(config, tiles, m, k):
    """From the first weight row to the last result row: hw.array's ws_cycles, then the
    accumulator's write latency; the array's input is busy for all but the array latency."""
    k = min(k, config.rows)
    result, computes = _back_to_back(config, tiles, m, k)
    first, last = computes[0], computes[-1]
    assert last.end == first.start + ws_cycles(config, m=m, k=k, tiles=tiles) - 1 + WRITE_LATENCY
    assert result.busy["compute"] == ws_cycles(config, m=m, k=k, tiles=tiles) - array_latency(config)
    # a tile's preload starts the cycle after its predecessor's first row: first rows (and,
    # after the first, preloads) max(m, k + 1) apart
    assert [t.start - first.start for t in computes] == [
        k + 1 + (t - 1) * max(m, k + 1) if t else 0 for t in range(tiles)]


@pytest.mark.parametrize("config", [CONFIG.replace(dataflow="os"),
                                    CONFIG.replace(dataflow="os", rows=4, cols=16)], ids=["8x8", "4x16"])
@pytest.mark.parametrize("tiles,k", [(1, 1), (1, 20), (3, 1), (3, 4), (4, 8), (2, 13)], ids=str)
def test_back_to_back_os_tiles_take_the_arrays_cycles(config, tiles, k):
    """From the first operand beat to the last drained result row: hw.array's os_cycles, then
    the accumulator's write latency; tiles max(k, R) apart."""
    R = config.rows
    m = R
    result, computes = _back_to_back(config, tiles, m, k)
    first, last = computes[0], computes[-1]
    assert last.end == first.start + os_cycles(config, k=k, tiles=tiles) - 1 + WRITE_LATENCY
    assert [t.start - first.start for t in computes] == [t * max(k, R) for t in range(tiles)]
    assert result.busy["compute"] == k + (tiles - 1) * max(k, R)


def test_ws_preload_overlaps_the_previous_stream():
    """8 x 8 WS (array latency 20), tiles (m, k) = (2, 8) then (2, 3) from cycle s: weight rows
    s..s+7, input rows s+8, s+9; the second preload enters from s+9 (the cycle after the first
    tile's first input row takes the shadow registers' weights) to s+11 and its input rows follow
    at s+12, s+13: max(m, k_next + 1) = 4 after the first tile's. A reuse tile's rows then follow
    at s+14."""
    program = [
        _spad_load(0, 0, push_next=1),
        _i("COMPUTE", b_addr=8, m=2, k=8, n=8, preload=1, pop_prev=1),
        _i("COMPUTE", b_addr=8, m=2, k=3, n=8, preload=1),
        _i("COMPUTE", m=1, k=3, n=8),
        _i("FINISH"),
    ]
    t = _run(program).timings
    s = 25          # the LOAD: 1 beat + latency 16 from 8
    assert (t[1].start, t[1].end) == (s, s + 9 + 20 + WRITE_LATENCY)
    assert (t[2].start, t[2].end) == (s + 9, s + 13 + 20 + WRITE_LATENCY)
    assert (t[3].start, t[3].end) == (s + 14, s + 14 + 20 + WRITE_LATENCY)


@pytest.mark.parametrize("pool,latency", [(0, 16), (1, 16), (2, 27)], ids=["none", "max", "avg"])
def test_store_waits_for_the_sfu_pipeline(pool, latency):
    """A 2 x 2 image of 1 channel, 1-byte output pixels: 4 DRAM beats. Without pooling 4 SFU
    cycles; 3 x 3 windows (stride 1, pad 1): 36. Then the SFU's latency, with residual and
    pooling configured 12 + 1 + 1 stages and 2 of output FIFO = 16, and 11 more for the end of an
    average window (centre, 3 multiply, round, 2 shift, zero point, narrow, 2 activation)."""
    window = {"pool": pool, "pool_h": 3, "pool_w": 3, "stride_h": 1, "stride_w": 1,
              "pad_top": 1, "pad_left": 1} if pool else {}
    store = _i("STORE", n=1, in_h=2, in_w=2, out_h=2, out_w=2, dram_addr=0x100, pitch_y=2,
               pitch_x=1, pitch_c=1, **window)
    t = _run([store, _i("FINISH")]).timings[0]
    assert t.end - t.start == (36 if pool else 4) + latency


def test_store_latency_follows_the_configured_sfu():
    """Without residual and pooling the SFU has 12 stages and 2 of output FIFO: 4 + 14."""
    config = CONFIG.replace(sfu_pooling=(), sfu_residual=False)
    store = _i("STORE", n=1, in_h=2, in_w=2, out_h=2, out_w=2, dram_addr=0x100, pitch_y=2,
               pitch_x=1, pitch_c=1)
    t = _run([store, _i("FINISH")], config).timings[0]
    assert t.end - t.start == 4 + 14


def test_bounded_load_beats_skip_padding():
    """A row of 8 elements, x from -2: two padding elements, then a run of 6 bytes starting 6
    bytes into a beat (2 beats); a row entirely in padding costs 1 cycle."""
    load = _i("LOAD", dst="spad", dram_addr=0x106, pitch_x=1, bounded=1, height=1, width=100,
              x0=-2, rows_outer=1, rows_inner=2, inner_dy=1, segs=1, seg_len=8, elem_dx=1)
    result = _run([load, _i("FINISH")])
    assert result.timings[0].end - result.timings[0].start == 16 + 2 + 1
    assert result.dram_read_bytes == 2 * 8     # bus bytes: the 6 bytes lie in 2 beats


def test_runs_break_at_non_consecutive_addresses():
    # 4 elements 2 bytes apart: 4 runs of one byte, each in one beat
    load = tile_load("spad", 0, 0, 1, 4, row_bytes=0, elem_bytes=2)
    result = _run([load, _i("FINISH")])
    assert result.timings[0].end - result.timings[0].start == 16 + 4


def test_dispatch_waits_for_a_full_queue():
    config = CONFIG.replace(load_queue_depth=1)
    program = [_spad_load(0, 0), _spad_load(1, 8), _spad_load(2, 16), _i("FINISH")]
    result = _run(program, config)
    assert [(t.dispatch, t.start, t.end) for t in result.timings] == [
        (8, 8, 25), (16, 25, 42), (25, 42, 59), (33, 59, 60)]


def test_push_into_full_channel_waits_for_room():
    """token_depth 1: the second token waits until COMPUTE 3 takes the first when the array is
    free of COMPUTE 2's 100 input rows; the load queue is held until then."""
    config = CONFIG.replace(token_depth=1)
    program = [
        _spad_load(0, 0, push_next=1),
        _spad_load(1, 8, push_next=1),
        _i("COMPUTE", a_addr=200, b_addr=300, acc_addr=0, m=100, k=8, n=8, preload=1),
        _i("COMPUTE", a_addr=0, acc_addr=100, m=1, k=8, n=8, pop_prev=1),
        _i("COMPUTE", a_addr=1, acc_addr=101, m=1, k=8, n=8, pop_prev=1),
        _spad_load(2, 16),
        _i("FINISH"),
    ]
    t = _run(program, config).timings
    # weights 24..31, inputs 32..131; last result 131 + 20, readable 7 cycles later
    assert (t[2].start, t[2].end) == (24, 158)
    assert (t[3].start, t[3].end) == (132, 159)         # takes token 0 at 132
    assert t[4].start == 133                            # token 1 arrived at max(42, 132)
    assert t[5].start == 132                            # the load queue waited for the push


def test_finish_waits_for_all_queues_and_ignores_what_follows():
    bad = _i("LOAD", dst="spad", rows_outer=0)
    result = _run([_spad_load(0, 0), _i("FINISH"), bad])
    assert result.instructions == 2
    words = encode(_spad_load(0, 0)) + encode(_i("FINISH")) + bytes(64)   # opcode 0 after it
    assert GoldenModel(CONFIG).run(words, np.zeros(4096, np.uint8)).instructions == 2


def test_finish_alone():
    result = _run([_i("FINISH")])
    assert result.timings == [InstrTiming(0, "FINISH", "dispatcher", 8, 8, 9)]
    assert result.cycles == 9 and result.utilization == 0


def test_gemm_case_overlaps_the_queues():
    """Double buffering: the estimate is well below the sum of the units' busy cycles."""
    case = GEMM_OVERLAP.build(AcceleratorConfig(rows=4, cols=4, scratchpad_bytes=128,
                                                accumulator_bytes=256))
    result = run_golden(case.config, case.program, case.dram)
    case.check(result.dram)
    assert result.cycles < sum(result.busy.values())
    assert max(result.busy.values()) <= result.cycles
    starts = [t.start for t in result.timings]
    ends = [t.end for t in result.timings]
    assert all(s <= e for s, e in zip(starts, ends, strict=True))


# -- hazards ----------------------------------------------------------------------------------

def _hazard(program, message, config=CONFIG):
    with pytest.raises(HazardError, match="^" + re.escape(message) + "$"):
        _run(program, config)
    _run(program, config, check_hazards=False)    # the same program runs unchecked


def test_hazard_read_after_write_scratchpad():
    program = [_spad_load(16, 0, rows=8), _spad_load(0, 64, rows=4, push_next=1),
               _i("COMPUTE", b_addr=16, m=4, k=8, n=8, preload=1), _i("FINISH")]
    _hazard(program, "instruction 2 (COMPUTE): reads scratchpad row 0 written by instruction 1 "
                     "(LOAD) without a token ordering them")
    program[2] = program[2].replace(pop_prev=1)   # the token orders both LOADs before it
    _run(program)
    program = [_spad_load(16, 0, rows=8), _i("COMPUTE", b_addr=16, m=4, k=8, n=8, preload=1),
               _i("FINISH")]
    _hazard(program, "instruction 1 (COMPUTE): reads scratchpad row 16 written by instruction 0 "
                     "(LOAD) without a token ordering them")


def test_hazard_write_after_read_scratchpad():
    program = [_spad_load(0, 0, rows=8, push_next=1),
               _i("COMPUTE", m=8, k=8, n=8, preload=1, pop_prev=1),
               _spad_load(0, 64), _i("FINISH")]
    _hazard(program, "instruction 2 (LOAD): writes scratchpad row 0 read by instruction 1 "
                     "(COMPUTE) without a token ordering them")


def test_hazard_write_after_write_accumulator():
    program = [tile_load("acc", 5, 0, 1, 8, row_bytes=32, elem_bytes=4),
               _i("COMPUTE", acc_addr=3, m=4, k=8, n=8, preload=1), _i("FINISH")]
    _hazard(program, "instruction 1 (COMPUTE): writes accumulator row 5 written by instruction 0 "
                     "(LOAD) without a token ordering them")


def test_hazard_store_reads_unfinished_accumulator():
    program = [_i("COMPUTE", m=1, k=8, n=8, preload=1), _store_raw(0, 0x100), _i("FINISH")]
    _hazard(program, "instruction 1 (STORE): reads accumulator row 0 written by instruction 0 "
                     "(COMPUTE) without a token ordering them")


def test_hazard_store_reads_table_without_token():
    program = [tile_load("table", 2, 0, 1, 8, row_bytes=0, elem_bytes=12),
               _i("STORE", n=1, in_h=1, in_w=1, out_h=1, out_w=1, qrow=2, dram_addr=0x100),
               _i("FINISH")]
    _hazard(program, "instruction 1 (STORE): reads requantize table row 2 written by instruction "
                     "0 (LOAD) without a token ordering them")


def test_hazard_dram_read_after_store():
    program = [_store_raw(0, 0x100), _spad_load(0, 0xFC), _i("FINISH")]
    _hazard(program, "instruction 1 (LOAD): reads DRAM byte 0x100 written by instruction 0 "
                     "(STORE) without a token ordering them")


def test_hazard_dram_write_after_load():
    program = [_spad_load(0, 0x100), _store_raw(0, 0x104), _i("FINISH")]
    _hazard(program, "instruction 1 (STORE): writes DRAM byte 0x104 read by instruction 0 "
                     "(LOAD) without a token ordering them")


def test_token_chain_through_sync_orders_store_and_load():
    """store -> compute -> load through a SYNC: the next layer may read the output."""
    program = [_store_raw(0, 0x100, push_prev=1),
               _i("SYNC", queue="compute", pop_next=1, push_prev=1),
               _spad_load(0, 0x100, pop_next=1), _i("FINISH")]
    result = _run(program)
    assert [t.queue for t in result.timings] == ["store", "compute", "load", "dispatcher"]
    assert result.timings[2].start >= result.timings[0].end


def test_program_order_orders_one_queue():
    """Same-queue accesses need no token: program order orders them."""
    program = [_spad_load(0, 0), _spad_load(0, 8), _store_raw(0, 0x100), _store_raw(0, 0x100),
               _i("FINISH")]
    _run(program)


def test_tokens_order_transitively():
    """The table reaches the STORE through load -> compute -> store."""
    program = [tile_load("table", 0, 0, 1, 8, row_bytes=0, elem_bytes=12),
               _spad_load(8, 0x40, push_next=1),
               _i("SYNC", queue="compute", pop_prev=1, push_next=1),
               _i("STORE", n=1, in_h=1, in_w=1, out_h=1, out_w=1, dram_addr=0x100, pop_prev=1),
               _i("FINISH")]
    _run(program)


def test_missing_token_in_a_gemm_is_found():
    case = GEMM_MISSING_TOKEN.build(AcceleratorConfig(rows=4, cols=4, scratchpad_bytes=128,
                                                      accumulator_bytes=256))
    instrs = list(case.program.instructions)
    index = next(i for i, ins in enumerate(instrs) if ins.op.name == "LOAD" and ins.pop_next)
    instrs[index] = instrs[index].replace(pop_next=0)
    # its compute -> load token is left in the channel and the slot's rewrite is unordered
    with pytest.raises(HazardError, match=rf"^instruction {index} \(LOAD\): writes scratchpad "
                                          rf"row \d+ read by instruction \d+ \(COMPUTE\) without "
                                          rf"a token ordering them$"):
        run_golden(case.config, Program(tuple(instrs), case.config.hash), case.dram)


# -- deadlocks --------------------------------------------------------------------------------

def _deadlock(program, message, config=CONFIG):
    with pytest.raises(DeadlockError, match="^" + re.escape(message) + "$"):
        _run(program, config)


def test_deadlock_pop_without_push():
    _deadlock([_i("COMPUTE", m=1, k=1, n=1, preload=1, pop_prev=1), _i("FINISH")],
              "instruction 0 (COMPUTE): deadlock, no queue can progress: load queue: empty; "
              "compute queue: instruction 0 (COMPUTE) waits for a token from the load queue; "
              "store queue: empty; dispatcher: instruction 1 (FINISH) waits for every queue to "
              "be idle")


def test_deadlock_circular_wait():
    _deadlock([_i("SYNC", queue="compute", pop_next=1, push_next=1),
               _i("SYNC", queue="store", pop_prev=1, push_prev=1), _i("FINISH")],
              "instruction 0 (SYNC): deadlock, no queue can progress: load queue: empty; "
              "compute queue: instruction 0 (SYNC) waits for a token from the store queue; "
              "store queue: instruction 1 (SYNC) waits for a token from the compute queue; "
              "dispatcher: instruction 2 (FINISH) waits for every queue to be idle")


def test_deadlock_full_queue_blocks_the_dispatcher():
    program = [_i("SYNC", queue="compute", pop_prev=1), _i("SYNC", queue="compute"),
               _i("SYNC", queue="load", push_next=1), _i("FINISH")]
    _deadlock(program,
              "instruction 0 (SYNC): deadlock, no queue can progress: load queue: empty; "
              "compute queue: instruction 0 (SYNC) waits for a token from the load queue; "
              "store queue: empty; dispatcher: instruction 1 (SYNC) waits for room in the "
              "compute queue (1 of 1 entries used)", CONFIG.replace(compute_queue_depth=1))
    _run(program, CONFIG.replace(compute_queue_depth=2))   # one more entry and it runs


def test_deadlock_full_channel():
    _deadlock([_spad_load(0, 0, push_next=1), _spad_load(1, 0, push_next=1), _i("FINISH")],
              "instruction 1 (LOAD): deadlock, no queue can progress: load queue: instruction 1 "
              "(LOAD) waits to push a token into a full channel (load->compute holds 1 of 1); "
              "compute queue: empty; store queue: empty; dispatcher: instruction 2 (FINISH) "
              "waits for every queue to be idle", CONFIG.replace(token_depth=1))


def test_pop_waits_for_the_token_not_deadlock():
    """A COMPUTE dispatched before its LOAD waits for it (the dispatcher runs ahead)."""
    program = [_i("COMPUTE", m=1, k=8, n=8, preload=1, pop_prev=1), _spad_load(0, 0, push_next=1),
               _i("FINISH")]
    result = _run(program)
    assert result.timings[0].start == result.timings[1].end


# -- token flags ------------------------------------------------------------------------------

@pytest.mark.parametrize("instr,flag,rule", [
    (_spad_load(0, 0, pop_prev=1), "pop_prev", "the load queue has no previous queue"),
    (_spad_load(0, 0, push_prev=1), "push_prev", "the load queue has no previous queue"),
    (_store_raw(0, 0, push_next=1), "push_next", "the store queue has no next queue"),
    (_store_raw(0, 0, pop_next=1), "pop_next", "the store queue has no next queue"),
    (_i("CONFIG", push_next=1), "push_next", "the store queue has no next queue"),
    (_i("CONFIG", pop_next=1), "pop_next", "the store queue has no next queue"),
    (_i("SYNC", queue="load", pop_prev=1), "pop_prev",
     "the load queue (SYNC queue=load) has no previous queue"),
    (_i("SYNC", queue="store", push_next=1), "push_next",
     "the store queue (SYNC queue=store) has no next queue"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_illegal_token_flags(instr, flag, rule):
    message = f"instruction 1 ({instr.op.name}): field {flag}: {rule}, so {flag} must be 0, not 1"
    with pytest.raises(ExecutionError, match="^" + re.escape(message) + "$"):
        _run([_i("SYNC", queue="compute"), instr, _i("FINISH")])


@pytest.mark.parametrize("flag", ["pop_prev", "pop_next", "push_prev", "push_next"])
def test_finish_takes_no_flags(flag):
    with pytest.raises(ExecutionError, match=rf"^instruction 0 \(FINISH\): field {flag}: FINISH "
                                             rf"takes no token flags, so {flag} must be 0, not 1$"):
        _run([_i("FINISH", **{flag: 1})])


# -- builders under the tightest queues -------------------------------------------------------

@pytest.mark.parametrize("dataflow", ["ws", "os"])
def test_builders_run_with_depth_one_queues_and_channels(dataflow):
    """The builders' token protocol never needs more than one token in flight per channel
    to make progress, nor more than one instruction per queue."""
    config = AcceleratorConfig(rows=4, cols=4, scratchpad_bytes=64, accumulator_bytes=128,
                               dataflow=dataflow, token_depth=1, load_queue_depth=1,
                               compute_queue_depth=1, store_queue_depth=1)
    roomy = config.replace(token_depth=8, load_queue_depth=8, compute_queue_depth=8,
                           store_queue_depth=8)
    case = GEMM_DEPTH_ONE.build(config)
    tight = run_golden(config, case.program, case.dram)
    case.check(tight.dram)
    case = GEMM_DEPTH_ONE.build(roomy)
    loose = run_golden(roomy, case.program, case.dram)
    case.check(loose.dram)
    assert loose.cycles <= tight.cycles


def test_large_sparse_dram_image():
    """A 96 MiB image touched only near its end: hazard bookkeeping allocates only what is
    touched."""
    size = 96 << 20
    dram = np.zeros(size, np.uint8)
    dram[size - 64:size - 56] = np.arange(8)
    program = [_spad_load(0, size - 64), _store_raw(0, size - 4), _i("FINISH")]
    with pytest.raises(HazardError, match=r"^instruction 1 \(STORE\): writes DRAM byte "
                                          rf"{size - 4:#x} read by"):
        run_golden(CONFIG, [_spad_load(0, size - 8), _store_raw(0, size - 4), _i("FINISH")], dram)
    result = run_golden(CONFIG, program, dram)
    assert result.dram[size - 4:].tolist() == [0, 0, 0, 0]
