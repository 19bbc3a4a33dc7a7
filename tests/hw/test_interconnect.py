# amaranth: UnusedElaboratable=no
"""The stream registers (``hw/interconnect.py``): items in order, none lost or repeated, under random
valid/ready; one cycle of latency and a transfer per cycle (the half-rate register: every other
cycle) when the consumer is always ready; and no combinational path from ``o.ready`` to
``i.ready``."""

from __future__ import annotations

import os
import random

import pytest
from amaranth import Cat, Const, Module, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator
from systolic.hw.interconnect import HalfRateRegister, SpacedStreamRegister, StreamRegister
from systolic.sim.tools import to_verilog

from tests.hw.ecp5_stand import Ecp5Stand

from .test_scratchpad import collect, drive, simulate

SEED = int(os.environ.get("SYSTOLIC_TEST_SEED", "1"))


def _run(items: list[int], *, gap: float, stall: float, seed: int, kind=StreamRegister, width: int = 16
         ) -> tuple[list[int], list[tuple[int, int]]]:
    dut = kind(width)
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


def _copied_half_rate(width: int) -> HalfRateRegister:
    return HalfRateRegister(width, enable_copies=True)


def test_half_rate_register_with_enable_copies_keeps_order_every_item_and_every_bit() -> None:
    """With enable_copies a payload of several 64-bit groups (200 bits: four) loads each under
    its own copy of the emptiness: random and extreme items keep order and every bit, at one
    transfer every other cycle with back-to-back items, a cycle of latency."""
    rng = random.Random(SEED)
    full = (1 << 200) - 1
    items = [rng.choice([0, full, 1 << 199, 1 << 64, (1 << 64) - 1, rng.randrange(full + 1)])
             for _ in range(300)]
    items[0] = full         # offered in the first cycle: the copies start empty, as the register
    for gap, stall in ((0.0, 0.0), (0.3, 0.0), (0.0, 0.5), (0.4, 0.6), (0.0, 0.9)):
        accepted, taken = _run(items, gap=gap, stall=stall, seed=SEED, kind=_copied_half_rate, width=200)
        assert [value for _, value in taken] == items, (gap, stall)
        assert all(out_edge > in_edge for in_edge, (out_edge, _) in zip(accepted, taken, strict=True))
    accepted, taken = _run(items[:50], gap=0.0, stall=0.0, seed=SEED, kind=_copied_half_rate, width=200)
    assert accepted == list(range(1, 100, 2))
    assert [edge for edge, _ in taken] == [edge + 1 for edge in accepted]


def test_half_rate_register_enable_copies_on_ecp5() -> None:
    """On ECP5 a payload wider than 64 bits loads under TRELLIS_FF copies of the emptiness, one
    per 64 bits (no net to every bit); without enable_copies, or 64 bits or fewer, none."""
    verilog = to_verilog(HalfRateRegister(200, enable_copies=True), "half", platform=Ecp5Stand())
    assert {n for n in range(5) if f" empty{n}_ff (" in verilog} == {0, 1, 2, 3}
    for dut in (HalfRateRegister(200), HalfRateRegister(64, enable_copies=True)):
        assert "empty0_ff" not in to_verilog(dut, "half", platform=Ecp5Stand())
    with pytest.raises(TypeError, match=r"^enable_copies must be a bool, not 1$"):
        HalfRateRegister(8, enable_copies=1)


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


# -- the spaced register -----------------------------------------------------------------------------

_SPACED = data.StructLayout({"key": unsigned(2), "flag": 1, "tag": unsigned(10)})


class _HeldRegister(wiring.Component):
    """The reference: a StreamRegister whose output waits by a comparison of its own payload with
    the keys that left (the hold made in the same cycle)."""

    def __init__(self, spacing: int) -> None:
        self.spacing = spacing
        super().__init__({"i": In(stream.Signature(_SPACED)), "o": Out(stream.Signature(_SPACED))})

    def elaborate(self, platform):
        m = Module()
        m.submodules.register = register = StreamRegister(_SPACED)
        wiring.connect(m, wiring.flipped(self.i), register.i)
        head = register.o.payload
        left = [(Signal(), Signal(2)) for _ in range(self.spacing - 1)]
        same = [valid & (key == head.key) for valid, key in left]
        hold = head.flag & (Cat(*same).any() if same else Const(0))
        m.d.comb += [self.o.valid.eq(register.o.valid & ~hold), self.o.payload.eq(head),
                     register.o.ready.eq(self.o.ready & ~hold)]
        previous = (self.o.valid & self.o.ready, head.key)
        for entry in left:
            m.d.sync += [entry[0].eq(previous[0]), entry[1].eq(previous[1])]
            previous = entry
        return m


@pytest.mark.parametrize("spacing", [1, 2, 3, 6])
@pytest.mark.parametrize("gap, stall", [(0.0, 0.0), (0.3, 0.2), (0.0, 0.5)])
def test_spaced_register_is_the_held_register_with_a_registered_wait(spacing: int, gap: float,
                                                                     stall: float) -> None:
    """In every cycle the same i.ready, o.valid and o.payload as a StreamRegister held by a
    comparison of its own output (random keys of 2 bits, flags, gaps and stalls); and on its
    output every item in order, each flagged one at least ``spacing`` cycles after the last item
    with its key."""
    dut = SpacedStreamRegister(_SPACED, key="key", flag="flag", spacing=spacing)
    reference = _HeldRegister(spacing)
    top = Module()
    top.submodules.dut, top.submodules.reference = dut, reference
    rng = random.Random(SEED * 100 + spacing)
    count = 300
    items = [{"key": rng.randrange(4), "flag": int(rng.random() < 0.7), "tag": n} for n in range(count)]
    taken: list[tuple[int, dict]] = []

    async def bench(ctx):
        sent = cycle = 0
        offered = False
        while len(taken) < count:
            assert cycle < 20 * count, "no progress"
            if not offered and sent < count and rng.random() >= gap:
                offered = True
            for side in (dut, reference):
                ctx.set(side.i.valid, offered)
                ctx.set(side.i.payload, items[sent] if offered else items[0])
            ready = int(rng.random() >= stall)
            ctx.set(dut.o.ready, ready)
            ctx.set(reference.o.ready, ready)
            seen = [(ctx.get(side.i.ready), ctx.get(side.o.valid), ctx.get(side.o.payload.as_value()))
                    for side in (dut, reference)]
            assert seen[0] == seen[1], (cycle, seen)
            if ctx.get(dut.o.valid) and ready:
                taken.append((cycle, {name: ctx.get(getattr(dut.o.payload, name))
                                      for name in _SPACED.members}))
            if offered and ctx.get(dut.i.ready):
                sent += 1
                offered = False
            await ctx.tick()
            cycle += 1

    sim = Simulator(top)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert [item for _, item in taken] == items
    last: dict[int, int] = {}
    distances = []
    for cycle, item in taken:
        if item["flag"] and item["key"] in last:
            distances.append(cycle - last[item["key"]])
        last[item["key"]] = cycle
    assert min(distances) >= spacing
    if spacing > 1:     # items waited, and left as soon as they could
        assert distances.count(spacing) >= 5


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(payload_shape=unsigned(8), key="key", flag="flag", spacing=2), TypeError,
     r"^payload_shape must be a StructLayout, not unsigned\(8\)$"),
    (dict(payload_shape=_SPACED, key="row", flag="flag", spacing=2), ValueError,
     r"^key must name a field of the payload \(key, flag, tag\), not 'row'$"),
    (dict(payload_shape=_SPACED, key="key", flag="last", spacing=2), ValueError,
     r"^flag must name a field of the payload \(key, flag, tag\), not 'last'$"),
    (dict(payload_shape=_SPACED, key="key", flag="tag", spacing=2), ValueError,
     r"^flag must name a one-bit field, not 'tag' of unsigned\(10\)$"),
    (dict(payload_shape=_SPACED, key="key", flag="flag", spacing=0), ValueError,
     r"^spacing must be an integer of at least 1, not 0$"),
    (dict(payload_shape=_SPACED, key="key", flag="flag", spacing=True), ValueError,
     r"^spacing must be an integer of at least 1, not True$"),
])
def test_spaced_register_errors(kwargs: dict, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        SpacedStreamRegister(**kwargs)
