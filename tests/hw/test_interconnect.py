"""The stream registers (``hw/interconnect.py``): items in order, none lost or repeated, under random
valid/ready; one cycle of latency and a transfer per cycle (the half-rate register: every other
cycle) when the consumer is always ready; and no combinational path from ``o.ready`` to
``i.ready``."""

from __future__ import annotations

import os
import random

import pytest
from amaranth.sim import Simulator
from systolic.hw.interconnect import HalfRateRegister, StreamRegister

from .test_scratchpad import collect, drive, simulate

SEED = int(os.environ.get("SYSTOLIC_TEST_SEED", "1"))


def _run(items: list[int], *, gap: float, stall: float, seed: int, kind=StreamRegister
         ) -> tuple[list[int], list[tuple[int, int]]]:
    dut = kind(16)
    result: dict[str, object] = {}

    async def producer(ctx):
        result["in"] = await drive(ctx, dut.i, items, rng=random.Random(seed), gap=gap)

    async def consumer(ctx):
        result["out"] = await collect(ctx, dut.o, len(items), rng=random.Random(seed + 1), stall=stall)

    simulate(dut, producer, consumer)
    return result["in"], result["out"]


@pytest.mark.parametrize("kind", [StreamRegister, HalfRateRegister], ids=["full", "half"])
def test_random_traffic_keeps_order_and_every_item(kind) -> None:
    rng = random.Random(SEED)
    items = [rng.choice([0, 0xFFFF, 0x8000, rng.randrange(1 << 16)]) for _ in range(400)]
    for gap, stall in ((0.0, 0.0), (0.3, 0.0), (0.0, 0.5), (0.4, 0.6), (0.0, 0.9)):
        accepted, taken = _run(items, gap=gap, stall=stall, seed=SEED, kind=kind)
        assert [value for _, value in taken] == items, (gap, stall)
        # an item leaves no earlier than the cycle after it entered
        assert all(out_edge > in_edge for in_edge, (out_edge, _) in zip(accepted, taken, strict=True))


def test_full_rate_with_one_cycle_of_latency() -> None:
    items = list(range(50))
    accepted, taken = _run(items, gap=0.0, stall=0.0, seed=SEED)
    assert accepted == list(range(1, 51))
    assert [edge for edge, _ in taken] == [edge + 1 for edge in accepted]


def test_half_rate_takes_every_other_cycle_with_one_cycle_of_latency() -> None:
    items = list(range(50))
    accepted, taken = _run(items, gap=0.0, stall=0.0, seed=SEED, kind=HalfRateRegister)
    assert accepted == list(range(1, 100, 2))
    assert [edge for edge, _ in taken] == [edge + 1 for edge in accepted]


def _ready_trace(dut: StreamRegister | HalfRateRegister, values: tuple[int, ...]) -> list[tuple]:
    """Offer ``values`` one per cycle with the consumer stalled, keep offering the last, then
    toggle ``o.ready`` within one cycle: (o.ready, i.ready, o.valid, o.payload) each time."""
    seen = []

    async def bench(ctx):
        ctx.set(dut.i.valid, 1)
        for value in values:
            ctx.set(dut.i.payload, value)
            await ctx.tick()
        for ready in (0, 1, 0, 1):
            ctx.set(dut.o.ready, ready)
            seen.append((ready, ctx.get(dut.i.ready), ctx.get(dut.o.valid), ctx.get(dut.o.payload)))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return seen


def test_half_rate_input_ready_does_not_follow_output_ready_within_a_cycle() -> None:
    # full (7 held, 8 refused) whatever o.ready does in this cycle
    assert _ready_trace(HalfRateRegister(8), (7, 8)) == [(ready, 0, 1, 7) for ready in (0, 1, 0, 1)]


def test_input_ready_does_not_follow_output_ready_within_a_cycle() -> None:
    # full (two items held, the third refused) whatever o.ready does in this cycle
    assert _ready_trace(StreamRegister(8), (1, 2, 3)) == [(ready, 0, 1, 1) for ready in (0, 1, 0, 1)]
