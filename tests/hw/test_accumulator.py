"""Accumulator against a Python model: read-modify-write from the array (with forwarding), masked
DMA writes and store-path reads, all concurrent, with random gaps and backpressure.

Model of the timing (docs/arch-memory-sfu.md): writes take effect in accept order (a DMA write to
a bank waits while an array beat for it is in flight, so no other interleaving can be seen); a
read accepted at edge n sees the DMA writes of edges up to n - 1 and the array beats of edges up
to n - write_latency (7; 4 without the memory registers). The bank memories read the old row in
simulation when a read meets a write of its cycle (an FPGA build leaves it undefined), so these
tests also check that the read-modify-write never uses such a read: its forwarding covers every
beat ahead. Every test runs with the memory registers (read latency 5) and without
(``memory_registers = false``, read latency 2).
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest
from systolic.hw.accumulator import (
    ACC_BANKS,
    Accumulator,
    acc_read_latency,
    acc_response_register,
    array_write_spacing,
    store_read_queue,
    write_latency,
)
from systolic.hw.config import AcceleratorConfig
from systolic.hw.scratchpad import read_latency
from systolic.sim.arith import wrap
from systolic.sim.tools import to_verilog

from tests.hw.ecp5_stand import Ecp5Stand

from .test_scratchpad import collect, construct_rejected, drive, simulate

SEED = int(os.environ.get("SYSTOLIC_TEST_SEED", "1"))

# 2 banks of 8 rows of 4 int32
SMALL = AcceleratorConfig(rows=4, cols=4, scratchpad_bytes=256, accumulator_bytes=256)
# unsigned 16-bit accumulator (uint8 x uint8), 2 banks of 8 rows of 2 elements
NARROW = AcceleratorConfig(rows=2, cols=2, input_signed=False, weight_signed=False, acc_signed=False,
                           acc_bits=16, scratchpad_bytes=1024, accumulator_bytes=64)
#: SMALL without the memory registers
DIRECT = SMALL.replace(memory_registers=False)
BOTH = pytest.mark.parametrize("config", [SMALL, DIRECT], ids=["registered", "direct"])
#: SMALL in a config whose compute core has a clock of its own: the read port's responses cross
#: to the control clock, through one more register (acc_response_register)
TWO_CLOCKS = SMALL.replace(clock_mhz=50.0, compute_clock_mhz=100.0)


class AccumulatorModel:
    def __init__(self, config: AcceleratorConfig) -> None:
        self.config = config
        self.rows = [[0] * config.cols for _ in range(config.acc_rows)]

    def replay(self, array: list[tuple[int, dict[str, Any]]], dma: list[tuple[int, dict[str, Any]]],
               reads: list[tuple[int, int]]) -> list[list[int]]:
        # logical order: a DMA write at (e + 1, 0), an array beat at (e + write_latency, 1) (its
        # write-back), a read at (n, 1.5)
        events = [(e + 1, 0.0, "dma", w) for e, w in dma]
        events += [(e + write_latency(self.config), 1.0, "array", w) for e, w in array]
        events += [(e, 1.5, "read", addr) for e, addr in reads]
        out = []
        cfg = self.config
        for _, _, kind, item in sorted(events, key=lambda x: (x[0], x[1])):
            if kind == "read":
                out.append(list(self.rows[item]))
                continue
            row = self.rows[item["addr"]]
            for c, value in enumerate(item["data"]):
                if kind == "dma":
                    if item["mask"] >> c & 1:
                        row[c] = value
                elif item["accumulate"]:
                    row[c] = int(wrap(row[c] + value, cfg.acc_bits, cfg.acc_signed))
                else:
                    row[c] = value
        return out


def _value(rng: random.Random, config: AcceleratorConfig) -> int:
    lo, hi = config.acc_range
    return rng.choice([lo, hi, 0, -1 if lo < 0 else 1, rng.randint(lo, hi), rng.randint(-1000, 1000)
                       if lo < 0 else rng.randint(0, 1000)])


def run_traffic(config: AcceleratorConfig, array: list[dict[str, Any]], dma: list[dict[str, Any]],
                reads: list[int], *, seed: int, gap: float, stall: float, array_gap: float | None = None,
                starts: tuple[int, int, int] = (0, 0, 0), read_queue: int | None = None,
                forwarding: bool = True) -> dict[str, Any]:
    dut = Accumulator(config, read_queue=read_queue, forwarding=forwarding)
    result: dict[str, Any] = {}

    async def array_port(ctx):
        result["array"] = await drive(ctx, dut.array_write, array, rng=random.Random(seed),
                                      gap=gap if array_gap is None else array_gap, start=starts[0])

    async def dma_port(ctx):
        result["dma"] = await drive(ctx, dut.dma_write, dma, rng=random.Random(seed + 1), gap=gap,
                                    start=starts[1])

    async def read_req(ctx):
        result["req"] = await drive(ctx, dut.read.req, [{"addr": a} for a in reads],
                                    rng=random.Random(seed + 2), gap=gap, start=starts[2])

    async def read_resp(ctx):
        taken = await collect(ctx, dut.read.resp, len(reads), rng=random.Random(seed + 3), stall=stall)
        result["resp"] = [(e, [row[c] for c in range(config.cols)]) for e, row in taken]

    simulate(dut, array_port, dma_port, read_req, read_resp)
    return result


def check_against_model(config: AcceleratorConfig, array: list[dict[str, Any]], dma: list[dict[str, Any]],
                        reads: list[int], result: dict[str, Any]) -> None:
    expected = AccumulatorModel(config).replay(list(zip(result["array"], array, strict=True)),
                                               list(zip(result["dma"], dma, strict=True)),
                                               list(zip(result["req"], reads, strict=True)))
    got = [row for _, row in result["resp"]]
    for k, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g == e, f"read {k} of row {reads[k]} at edge {result['req'][k]}: got {g}, expected {e}"
    for (resp_edge, _), req_edge in zip(result["resp"], result["req"], strict=True):
        assert resp_edge >= req_edge + 1


def _readback(config: AcceleratorConfig) -> list[int]:
    return list(range(config.acc_rows))


# -- tests -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("config, read_queue", [(SMALL, None), (NARROW, None), (DIRECT, None),
                                                (NARROW.replace(memory_registers=False), None),
                                                (SMALL, 1), (DIRECT, 1), (TWO_CLOCKS, None), (TWO_CLOCKS, 1)],
                         ids=["int32", "uint16", "int32-direct", "uint16-direct", "int32-queue1",
                              "int32-direct-queue1", "int32-two-clocks", "int32-two-clocks-queue1"])
def test_random_concurrent_traffic_matches_model(config: AcceleratorConfig, read_queue: int | None) -> None:
    rng = random.Random(SEED)
    hot = [rng.randrange(config.acc_rows) for _ in range(3)]

    def addr() -> int:
        return rng.choice(hot) if rng.random() < 0.6 else rng.randrange(config.acc_rows)

    full = (1 << config.cols) - 1
    array = [{"addr": addr(), "data": [_value(rng, config) for _ in range(config.cols)],
              "accumulate": int(rng.random() < 0.75)} for _ in range(300)]
    dma = [{"addr": addr(), "data": [_value(rng, config) for _ in range(config.cols)],
            "mask": rng.choice([full, 1, rng.randrange(full + 1)])} for _ in range(120)]
    reads = [addr() for _ in range(200)]
    result = run_traffic(config, array, dma, reads, seed=SEED, gap=0.4, stall=0.3, array_gap=0.2,
                         read_queue=read_queue)
    check_against_model(config, array, dma, reads, result)
    # and the final contents, read after everything settled
    final = run_traffic(config, array, dma, reads + _readback(config), seed=SEED, gap=0.4, stall=0.3,
                        array_gap=0.2, read_queue=read_queue)
    check_against_model(config, array, dma, reads + _readback(config), final)


def _spaced_array_traffic(config: AcceleratorConfig, rng: random.Random, count: int) -> list[dict[str, Any]]:
    """Array beats whose accumulating ones name no row of the array_write_spacing - 1 beats
    before them (so, whatever the gaps, they come that many cycles after them), most of them on
    three hot rows."""
    hot = [rng.randrange(config.acc_rows) for _ in range(3)]
    spacing = array_write_spacing(config)
    beats: list[dict[str, Any]] = []
    while len(beats) < count:
        addr = rng.choice(hot) if rng.random() < 0.6 else rng.randrange(config.acc_rows)
        accumulate = int(rng.random() < 0.75)
        if accumulate and addr in [b["addr"] for b in beats[-(spacing - 1):]]:
            continue
        beats.append({"addr": addr, "data": [_value(rng, config) for _ in range(config.cols)],
                      "accumulate": accumulate})
    return beats


@BOTH
def test_without_forwarding_spaced_traffic_matches_model(config: AcceleratorConfig) -> None:
    """Accumulator(forwarding=False) with its beats spaced as array_write_spacing says (6 cycles
    with the memory registers, 3 without), DMA writes and reads all concurrent: the model's
    rows, whether the array's beats come back to back (other rows between) or with gaps."""
    assert array_write_spacing(config) == read_latency(config) + 1
    rng = random.Random(SEED)
    full = (1 << config.cols) - 1
    array = _spaced_array_traffic(config, rng, 300)
    dma = [{"addr": rng.randrange(config.acc_rows), "data": [_value(rng, config) for _ in range(config.cols)],
            "mask": rng.choice([full, 1, rng.randrange(full + 1)])} for _ in range(60)]
    reads = [rng.randrange(config.acc_rows) for _ in range(100)] + _readback(config)
    for gap in (0.0, 0.3):
        result = run_traffic(config, array, dma, reads, seed=SEED, gap=0.3, stall=0.2, array_gap=gap,
                             forwarding=False)
        check_against_model(config, array, dma, reads, result)


@BOTH
def test_without_forwarding_a_beat_too_close_misses_the_one_before(config: AcceleratorConfig) -> None:
    """The spacing is a requirement: two accumulating beats to one row back to back lose the
    first one's sum without forwarding (and keep it with)."""
    beats = [{"addr": 2, "data": [5] * config.cols, "accumulate": 1},
             {"addr": 2, "data": [7] * config.cols, "accumulate": 1}]
    got = {}
    for forwarding in (True, False):
        result = run_traffic(config, beats, [], [2], seed=SEED, gap=0.0, stall=0.0,
                             starts=(0, 0, 20), forwarding=forwarding)
        got[forwarding] = result["resp"][0][1]
    assert got[True] == [12] * config.cols
    assert got[False] == [7] * config.cols


def test_forwarding_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match=r"^forwarding must be a bool, not 1$"):
        construct_rejected(lambda: Accumulator(SMALL, forwarding=1))


@BOTH
def test_back_to_back_accumulate_into_one_row_wraps(config: AcceleratorConfig) -> None:
    # beats every cycle into row 3, then rows 5, 6, 5, 6 (distance two) and 9, 10, 11, 9, ...
    lo, hi = config.acc_range
    rng = random.Random(SEED)
    array = [{"addr": 3, "data": [hi, lo, lo, rng.randint(lo, hi)], "accumulate": 1} for _ in range(9)]
    array += [{"addr": 5 + k % 2, "data": [hi, lo, -1, rng.randint(lo, hi)], "accumulate": 1}
              for k in range(8)]
    array += [{"addr": 9 + k % 3, "data": [hi, lo, 1, rng.randint(lo, hi)], "accumulate": 1}
              for k in range(9)]
    reads = [3, 5, 6, 9, 10, 11]
    result = run_traffic(config, array, [], reads, seed=SEED, gap=0.0, stall=0.0, starts=(0, 0, 40))
    assert result["array"] == list(range(1, len(array) + 1)), "one array beat per cycle"
    check_against_model(config, array, [], reads, result)
    # row 3: nine times 2**31 - 1 and nine times -2**31, wrapped to 32 bits
    assert result["resp"][0][1][:3] == [int(wrap(9 * hi, 32)), int(wrap(9 * lo, 32)), int(wrap(9 * lo, 32))]


@BOTH
def test_overwrite_ignores_the_old_row_and_then_accumulates(config: AcceleratorConfig) -> None:
    array = [{"addr": 2, "data": [7, 7, 7, 7], "accumulate": 1},
             {"addr": 2, "data": [1, 2, 3, 4], "accumulate": 0},
             {"addr": 2, "data": [10, 20, 30, 40], "accumulate": 1}]
    result = run_traffic(config, array, [], [2], seed=SEED, gap=0.0, stall=0.0, starts=(0, 0, 10))
    assert result["resp"][0][1] == [11, 22, 33, 44]


@BOTH
def test_dma_write_offered_with_an_accumulating_beat_is_ordered_first(config: AcceleratorConfig) -> None:
    # a masked DMA write offered at the same edge as an accumulating beat to the same bank is taken
    # at once and reaches the block RAM before the beat's read (the beat waits in the input
    # register), in either bank: the beat adds onto the DMA's elements
    dma = [{"addr": 4, "data": [100, 200, 300, 400], "mask": 0b0110},
           {"addr": 12, "data": [5, 5, 5, 5], "mask": 0b1111}]
    array = [{"addr": 4, "data": [1, 1, 1, 1], "accumulate": 1},
             {"addr": 12, "data": [1, 2, 3, 4], "accumulate": 1}]
    result = run_traffic(config, array, dma, [4, 12], seed=SEED, gap=0.0, stall=0.0, starts=(0, 0, 10))
    assert result["array"] == [1, 2]
    assert result["dma"] == [1, 2]
    check_against_model(config, array, dma, [4, 12], result)
    assert [row for _, row in result["resp"]] == [[1, 201, 301, 1], [6, 7, 8, 9]]


@BOTH
def test_dma_write_offered_after_an_accumulating_beat_waits_for_its_write_back(
        config: AcceleratorConfig) -> None:
    # offered one edge after the beat (then in stage 0): waits until the beat's write-back has
    # reached the block RAM, so the DMA's elements overwrite the sum
    dma = [{"addr": 4, "data": [100, 200, 300, 400], "mask": 0b0110}]
    array = [{"addr": 4, "data": [1, 1, 1, 1], "accumulate": 1}]
    result = run_traffic(config, array, dma, [4], seed=SEED, gap=0.0, stall=0.0, starts=(0, 1, 12))
    assert result["array"] == [1]
    assert result["dma"] == [1 + write_latency(config)]
    check_against_model(config, array, dma, [4], result)
    assert [row for _, row in result["resp"]] == [[1, 200, 300, 1]]


@BOTH
def test_dma_waits_only_for_array_writes_to_its_bank(config: AcceleratorConfig) -> None:
    bank = config.acc_rows // ACC_BANKS
    rng = random.Random(SEED)
    # array beats for bank 0 (the last at edge 10) are in flight until edge 10 + write_latency(config);
    # DMA writes to bank 0 wait, to bank 1 not
    array = [{"addr": k % bank, "data": [rng.randint(-9, 9) for _ in range(4)], "accumulate": k % 2}
             for k in range(10)]
    dma_other = [{"addr": bank + k, "data": [k] * 4, "mask": 0b1111} for k in range(4)]
    result = run_traffic(config, array, dma_other, [bank + k for k in range(4)], seed=SEED, gap=0.0,
                         stall=0.0, starts=(0, 2, 20))
    assert result["dma"] == [3, 4, 5, 6]
    check_against_model(config, array, dma_other, [bank + k for k in range(4)], result)
    dma_same = [{"addr": bank - 1 - k, "data": [k] * 4, "mask": 0b1111} for k in range(3)]
    reads = list(range(bank))
    result = run_traffic(config, array, dma_same, reads, seed=SEED, gap=0.0, stall=0.0, starts=(0, 2, 30))
    last = 10 + write_latency(config)
    assert result["dma"] == [last, last + 1, last + 2], "waits for the array's last write request"
    check_against_model(config, array, dma_same, reads, result)


@BOTH
def test_store_read_waits_only_for_accumulating_reads_of_its_bank(config: AcceleratorConfig) -> None:
    bank = config.acc_rows // ACC_BANKS
    array = [{"addr": k, "data": [k] * 4, "accumulate": 1} for k in range(6)]         # bank 0
    array += [{"addr": k, "data": [k] * 4, "accumulate": 0} for k in range(6)]        # no reads
    reads_same = [bank - 1, bank - 2, bank - 3]
    result = run_traffic(config, array, [], reads_same, seed=SEED, gap=0.0, stall=0.0, starts=(0, 0, 1))
    # the beats (edges 1 to 6) read their rows from the input register, a cycle later
    assert result["req"] == [8, 9, 10], "bank 0 is busy with read-modify-writes until edge 7"
    check_against_model(config, array, [], reads_same, result)
    reads_other = [bank, bank + 1, bank + 2]
    result = run_traffic(config, array, [], reads_other, seed=SEED, gap=0.0, stall=0.0, starts=(0, 0, 1))
    assert result["req"] == [2, 3, 4]
    assert [e for e, _ in result["resp"]] == [edge + read_latency(config) for edge in (2, 3, 4)]
    check_against_model(config, array, [], reads_other, result)


def test_with_a_compute_clock_a_response_comes_a_cycle_later() -> None:
    """With a compute clock of its own (and the memory registers) a read's row passes one more
    register: its response comes read_latency + 1 cycles after the request, one per cycle still
    (the default queue has one entry more); the rows are the model's."""
    assert [acc_response_register(c) for c in (SMALL, DIRECT, TWO_CLOCKS)] == [False, False, True]
    assert acc_read_latency(TWO_CLOCKS) == read_latency(TWO_CLOCKS) + 1 == 6
    assert Accumulator(TWO_CLOCKS).read_latency == Accumulator(TWO_CLOCKS).read_queue == 6
    dma = [{"addr": k, "data": [k + 1, -k, 7, 1 << 30], "mask": 0xF} for k in range(4)]
    reads = [0, 1, 2, 3, 1]
    result = run_traffic(TWO_CLOCKS, [], dma, reads, seed=SEED, gap=0.0, stall=0.0, starts=(0, 0, 8))
    assert [e for e, _ in result["resp"]] == [edge + 6 for edge in result["req"]]
    assert result["req"] == list(range(result["req"][0], result["req"][0] + len(reads)))
    check_against_model(TWO_CLOCKS, [], dma, reads, result)


@BOTH
def test_read_sees_an_array_beat_write_latency_after_it(config: AcceleratorConfig) -> None:
    array = [{"addr": 2, "data": [10 * (k + 1)] * 4, "accumulate": 0} for k in range(3)]  # edges 1..3
    result = run_traffic(config, array, [], [2, 2], seed=SEED, gap=0.0, stall=0.0,
                         starts=(0, 0, write_latency(config) + 1))
    latency = write_latency(config)
    assert result["array"] == [1, 2, 3] and result["req"] == [latency + 2, latency + 3]
    assert result["req"][0] == result["array"][1] + write_latency(config)
    assert [row for _, row in result["resp"]] == [[20] * 4, [30] * 4]
    check_against_model(config, array, [], [2, 2], result)


def _paced_reads(config: AcceleratorConfig, read_queue: int, interval: int, count: int = 12) -> list[int]:
    """Edges at which a consumer like the store path's SFU, which takes a row at most every
    ``interval`` cycles, takes ``count`` rows whose requests are offered back to back."""
    dut = Accumulator(config, read_queue=read_queue)
    taken: list[int] = []

    async def requests(ctx):
        await drive(ctx, dut.read.req, [{"addr": k % config.acc_rows} for k in range(count)],
                    rng=random.Random(SEED))

    async def consumer(ctx):
        edge, last = 0, -interval
        while len(taken) < count:
            ready = edge - last >= interval
            ctx.set(dut.read.resp.ready, ready)
            _, _, valid = await ctx.tick().sample(dut.read.resp.valid)
            if valid and ready:
                taken.append(edge)
                last = edge
            edge += 1
        ctx.set(dut.read.resp.ready, 0)

    simulate(dut, requests, consumer)
    return taken


@pytest.mark.parametrize("config, expected", [
    (SMALL, 5), (SMALL.replace(sfu_row_cycles=2), 3), (SMALL.replace(sfu_row_cycles=4), 2),
    (DIRECT, 2), (DIRECT.replace(sfu_row_cycles=2), 1),
    # the store path on a control clock of half (twice) the compute clock: 2 x 2 (2 / 2) cycles
    (SMALL.replace(sfu_row_cycles=2, clock_mhz=50.0, compute_clock_mhz=100.0), 2),
    # (a compute clock of its own: the read latency is 6, acc_response_register)
    (SMALL.replace(sfu_row_cycles=2, clock_mhz=100.0, compute_clock_mhz=50.0), 6),
    (SMALL.replace(sfu_row_cycles=4, clock_mhz=50.0, compute_clock_mhz=200.0), 1),
], ids=["1", "2", "4", "direct-1", "direct-2", "2-fast-core", "2-slow-core", "4-fast-core"])
def test_store_read_queue_keeps_up_with_the_sfu(config: AcceleratorConfig, expected: int) -> None:
    """store_read_queue is the smallest queue with which a consumer taking a row every
    sfu_row_cycles control cycles is never kept waiting; one entry fewer keeps it waiting."""
    queue = store_read_queue(config)
    assert queue == expected
    interval = config.sfu_row_cycles
    if config.compute_clock_mhz:
        interval = max(1, round(interval * config.compute_clock_mhz / config.clock_mhz))
    taken = _paced_reads(config, queue, interval)
    assert {b - a for a, b in zip(taken, taken[1:], strict=False)} == {interval}, taken
    if queue > 1:
        slower = _paced_reads(config, queue - 1, interval)
        assert max(b - a for a, b in zip(slower, slower[1:], strict=False)) > interval, slower


@pytest.mark.parametrize("read_queue", [0, 3, True, "1"])
def test_read_queue_must_be_1_to_the_read_latency(read_queue: Any) -> None:
    with pytest.raises(ValueError, match=rf"^read_queue must be an integer between 1 and the read latency "
                                         rf"\(2\), not {read_queue!r}$"):
        construct_rejected(lambda: Accumulator(DIRECT, read_queue=read_queue))


def test_a_one_entry_read_queue_owes_one_response_at_a_time() -> None:
    """With read_queue=1 a request waits until the previous response is taken, and every
    response is still the row (the consumer takes rows at random)."""
    config = DIRECT
    reads = list(range(config.acc_rows)) * 2
    result = run_traffic(config, [], [], reads, seed=SEED, gap=0.0, stall=0.3, read_queue=1)
    check_against_model(config, [], [], reads, result)
    edges = [e for e, _ in result["resp"]]
    for k in range(1, len(reads)):
        assert result["req"][k] >= edges[k - 1], (k, result["req"][k], edges[k - 1])


@pytest.mark.parametrize("forwarding", [True, False])
def test_bank_write_data_is_selected_by_register_copies_on_ecp5(forwarding: bool) -> None:
    """On ECP5 a bank's write data is the write-back's row or the DMA's, chosen by TRELLIS_FF
    copies of one register per bank and row element (whether a write-back for the bank is next),
    not by the DMA's grant: no logic of the grant before the write data registers' enables."""
    config = SMALL
    verilog = to_verilog(Accumulator(config, forwarding=forwarding), "accumulator", platform=Ecp5Stand())
    copies = {f"bank{k}_write_back_{c}_ff" for k in range(ACC_BANKS) for c in range(config.acc_row_elems)}
    assert {name for name in copies if f" {name} (" in verilog} == copies


def test_config_must_be_an_accelerator_config() -> None:
    with pytest.raises(TypeError, match=r"^config must be an AcceleratorConfig, not 3$"):
        construct_rejected(lambda: Accumulator(3))  # type: ignore[arg-type]
