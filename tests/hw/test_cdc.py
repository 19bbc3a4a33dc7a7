# amaranth: UnusedElaboratable=no
"""hw/cdc.py: the crossings between two clock domains, simulated with unrelated clock periods
(either side faster, and a ratio that never lines the edges up)."""

import random

import pytest
from amaranth import Cat, ClockDomain, Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator
from systolic.hw.cdc import (
    COUNT_BITS,
    SHIFT_ENABLE_BITS,
    CountCrossing,
    DrainedGate,
    EventCrossing,
    ResetCrossing,
    StreamCrossing,
)
from systolic.hw.fifo import FETCH_AHEAD_BUFFER
from systolic.sim.tools import to_verilog

from tests.hw.ecp5_stand import Ecp5Stand, async_set_flip_flops

#: (write / source period, read / destination period), ns
PERIODS = [(10, 7), (7, 10), (10, 23), (23, 10), (10, 10)]


def _simulate(dut, periods, *testbenches, sync=None):
    """Simulate ``dut`` with the domains ``sync`` (``sync``: a ClockDomain of the caller's, whose
    reset the testbenches may drive) and ``fast`` of ``periods`` ns."""
    m = Module()
    m.domains.sync = sync or ClockDomain()
    m.domains.fast = ClockDomain()
    m.submodules.dut = dut
    sim = Simulator(m)
    sim.add_clock(periods[0] * 1e-9, domain="sync")
    # a phase offset, so that the edges of equal periods do not coincide either
    sim.add_clock(periods[1] * 1e-9, domain="fast", phase=periods[1] * 0.37e-9)
    for bench, background in testbenches:
        sim.add_testbench(bench, background=background)
    sim.run()          # until the foreground testbenches are done


#: Cycles a writer waits for ``ready`` before the test fails: a crossing that stops taking items
#: (one whose reader sees items that are not there, say) fails rather than hangs.
READY_BUDGET = 1000


async def _until_ready(ctx, stream):
    """Tick the ``sync`` clock until ``stream.ready`` is high at an edge (the item is taken), at
    most READY_BUDGET cycles."""
    for _ in range(READY_BUDGET):
        _, _, ready = await ctx.tick("sync").sample(stream.ready)
        if ready:
            return
    raise AssertionError(f"the crossing took no item for {READY_BUDGET} cycles")


#: (read_register, write_register)
REGISTERS = [(False, False), (True, False), (False, True), (True, True), (False, "half"), (True, "half")]


def _held(register: bool | int | str) -> int:
    """Items a crossing's registers hold: a StreamRegister two (``2``: two of them, four), a
    HalfRateRegister one."""
    return 1 if register == "half" else 2 * register


def _read_held(read_register: bool | int, pieces: int) -> int:
    """Items a crossing's read register holds: a HalfRateRegister's one when items cross in
    pieces (they arrive every ``pieces`` cycles at most), else a StreamRegister's two."""
    return _held("half" if read_register and pieces > 1 else read_register)


#: (read_register, write_register) with two or three read registers in series (whole items only)
TWO_READ_REGISTERS = [(2, False), (2, "half"), (3, False)]


#: (item width, pieces): whole items, and items crossing in pieces (13 bits: the last piece padded)
PIECES = [(16, 1), (16, 2), (13, 4)]


@pytest.mark.parametrize("width,pieces", PIECES)
@pytest.mark.parametrize("registers", REGISTERS)
@pytest.mark.parametrize("periods", PERIODS)
def test_stream_crossing_in_order_under_random_traffic(periods, registers, width, pieces):
    _random_traffic(periods, registers, width, pieces)


@pytest.mark.parametrize("registers", TWO_READ_REGISTERS)
@pytest.mark.parametrize("periods", PERIODS)
def test_stream_crossing_two_read_registers_in_order_under_random_traffic(periods, registers):
    _random_traffic(periods, registers, 16, 1)


#: (read_register, write_register) with a fetch-ahead FIFO
FETCH_AHEAD_REGISTERS = [(False, False), (True, "half"), (2, False), (3, False)]


@pytest.mark.parametrize("registers,width,pieces", [(registers, width, pieces)
                                                     for registers in FETCH_AHEAD_REGISTERS
                                                     for width, pieces in ((16, 1), (13, 4))
                                                     if registers[0] in (False, True) or pieces == 1])
@pytest.mark.parametrize("periods", PERIODS)
def test_stream_crossing_fetch_ahead_in_order_under_random_traffic(periods, registers, width, pieces):
    _random_traffic(periods, registers, width, pieces, fetch_ahead=True)


#: (read_register, write_register, fetch_ahead, pieces) with a write reset of the crossing's own
OWN_WRITE_RESET = [(3, False, False, 1), (False, True, False, 4), (2, False, True, 1),
                   (True, "half", True, 4)]


@pytest.mark.parametrize("read_register,write_register,fetch_ahead,pieces", OWN_WRITE_RESET)
@pytest.mark.parametrize("periods", [(10, 7), (10, 23)])
def test_stream_crossing_own_write_reset_in_order_under_random_traffic(periods, read_register, write_register,
                                                                        fetch_ahead, pieces):
    _random_traffic(periods, (read_register, write_register), 16, pieces, fetch_ahead=fetch_ahead,
                    own_write_reset=True)


def _random_traffic(periods, registers, width, pieces, *, fetch_ahead=False, own_write_reset=False):
    rng = random.Random(sum(periods))
    dut = StreamCrossing(width, depth=4, w_domain="sync", r_domain="fast", read_register=registers[0],
                         write_register=registers[1], pieces=pieces, fetch_ahead=fetch_ahead,
                         own_write_reset=own_write_reset)
    top = (1 << width) - 1
    items = [0, top] + [rng.randrange(1 << width) for _ in range(300)] + [top, 0]
    received, checks = [], []
    done = []

    async def writer(ctx):
        sent = 0
        for item in items:
            while rng.random() < 0.3:
                ctx.set(dut.i.valid, 0)
                await ctx.tick("sync")
            ctx.set(dut.i.valid, 1)
            ctx.set(dut.i.payload, item)
            await _until_ready(ctx, dut.i)
            sent += 1
            # the write side's counts: every item sent, never more drained than sent
            assert ctx.get(dut.sent) == sent % (1 << COUNT_BITS)
            checks.append((sent - ctx.get(dut.drained)) % (1 << COUNT_BITS))
        ctx.set(dut.i.valid, 0)
        # every item is reported drained a few cycles after the reader took the last one
        for _ in range(READY_BUDGET):
            if len(received) == len(items):
                break
            await ctx.tick("sync")
        for _ in range(12):
            await ctx.tick("sync")
        assert ctx.get(dut.drained) == len(items) % (1 << COUNT_BITS)
        done.append(True)

    async def reader(ctx):
        while len(received) < len(items):
            ctx.set(dut.o.ready, int(rng.random() < 0.7))
            _, _, valid, ready, payload = await ctx.tick("fast").sample(
                dut.o.valid, dut.o.ready, dut.o.payload)
            if valid and ready:
                received.append(payload)
        ctx.set(dut.o.ready, 0)

    _simulate(dut, periods, (writer, False), (reader, True))
    assert done
    assert received == items
    # drained never ran ahead of sent (the difference would wrap to a large number) and the
    # FIFO's depth (and each register's two entries, and a fetch-ahead FIFO's buffered pieces)
    # bound what is in flight besides the synchronizers' lag
    assert max(checks) <= (4 + 2 + _read_held(registers[0], pieces) + _held(registers[1])
                           + FETCH_AHEAD_BUFFER * fetch_ahead)


@pytest.mark.parametrize("width, pieces, copies", [(530, 4, 9), (13, 2, 1), (200, 8, 4)])
def test_stream_crossing_in_pieces_shifts_under_register_copies(width, pieces, copies):
    """With ``read_register`` and ``pieces`` > 1 the item register's enables on ECP5 are
    TRELLIS_FF copies of one register of the read, one per SHIFT_ENABLE_BITS bits of the item
    (pieces x ceil(width / pieces) bits), so that no logic and no single net drives them all."""
    dut = StreamCrossing(width, depth=4, r_domain="fast", read_register=True, pieces=pieces)
    verilog = to_verilog(dut, "crossing", platform=Ecp5Stand())
    assert verilog.count("TRELLIS_FF ") == copies
    assert copies == -(-(pieces * -(-width // pieces)) // SHIFT_ENABLE_BITS)
    plain = StreamCrossing(width, depth=4, r_domain="fast", read_register=True, pieces=1)
    assert "TRELLIS_FF " not in to_verilog(plain, "crossing", platform=Ecp5Stand())


@pytest.mark.parametrize("registers,pieces,fetch_ahead",
                         [(registers, pieces, False) for registers in REGISTERS[1:] for pieces in (1, 4)]
                         + [(registers, 1, False) for registers in TWO_READ_REGISTERS]
                         + [((2, False), 1, True), ((True, "half"), 4, True), ((False, False), 1, True)])
def test_stream_crossing_registers_buffer_and_drained_counts_the_consumer(registers, pieces, fetch_ahead):
    """Each register holds two items more while the consumer waits (a half-rate one one item,
    as the read register is when items cross in pieces), a fetch-ahead FIFO FETCH_AHEAD_BUFFER more pieces
    (whole items only when pieces are items), and ``drained`` counts only what the consumer
    took, not what waits in the read register. (That the registers cut the paths to the FIFO's
    pointers and memory is :class:`StreamRegister`'s property, tests/hw/test_interconnect.py.)"""
    read_register, write_register = registers
    dut = StreamCrossing(8, depth=4, w_domain="sync", r_domain="fast", read_register=read_register,
                         write_register=write_register, pieces=pieces, fetch_ahead=fetch_ahead)
    result = {}

    async def bench(ctx):
        for _ in range(4):
            await ctx.tick("sync")
        # the consumer is not ready: at most the FIFO's 4 items and the registers' 2 each go in
        ctx.set(dut.i.valid, 1)
        sent = 0
        for _ in range(20 * pieces):
            ctx.set(dut.i.payload, sent + 1)        # held until taken
            _, _, accepted = await ctx.tick("sync").sample(dut.i.ready)
            sent += accepted
        ctx.set(dut.i.valid, 0)
        for _ in range(30):
            await ctx.tick("sync")
        result["sent"] = sent
        result["drained_before"] = ctx.get(dut.drained)
        # the consumer takes one item: drained says one, a few cycles later
        taken = []
        ctx.set(dut.o.ready, 1)
        while not taken:
            _, _, valid, payload = await ctx.tick("fast").sample(dut.o.valid, dut.o.payload)
            if valid:
                taken.append(payload)
        ctx.set(dut.o.ready, 0)
        for _ in range(30):
            await ctx.tick("sync")
        result["taken"] = taken
        result["drained_after"] = ctx.get(dut.drained)

    _simulate(dut, PERIODS[0], (bench, False))
    assert result["sent"] == 4 + _read_held(read_register, pieces) + _held(write_register) + \
        (FETCH_AHEAD_BUFFER // pieces if fetch_ahead else 0)
    assert result["drained_before"] == 0
    assert result["taken"] == [1]
    assert result["drained_after"] == 1


def test_stream_crossing_depth_rule():
    with pytest.raises(ValueError, match=r"^depth must be a power of two of at least 2, not 3$"):
        StreamCrossing(8, depth=3, r_domain="fast")
    with pytest.raises(ValueError, match=r"^depth must be below 2\*\*\(COUNT_BITS - 1\) = 128, not 128$"):
        StreamCrossing(8, depth=128, r_domain="fast")
    with pytest.raises(ValueError, match=r"^w_domain and r_domain must differ, both are 'sync'$"):
        StreamCrossing(8, depth=4, r_domain="sync")
    for wrong in (4, 1.0, "two"):
        with pytest.raises(ValueError, match=rf"^read_register must be False, True, 2 or 3, not {wrong!r}$"):
            StreamCrossing(8, depth=4, r_domain="fast", read_register=wrong)
    for registers in (2, 3):
        with pytest.raises(ValueError, match=rf"^read_register={registers} needs whole items \(pieces=1; "
                                             r"items in pieces have their own read registers\), not "
                                             r"pieces=2$"):
            StreamCrossing(8, depth=4, r_domain="fast", read_register=registers, pieces=2)
    with pytest.raises(ValueError, match=r"^write_register must be False, True or 'half', not 'spare'$"):
        StreamCrossing(8, depth=4, r_domain="fast", write_register="spare")
    for wrong in (1, "yes"):
        with pytest.raises(ValueError, match=rf"^fetch_ahead must be True or False, not {wrong!r}$"):
            StreamCrossing(8, depth=4, r_domain="fast", fetch_ahead=wrong)
    for pieces in (0, 3, 16, True):
        with pytest.raises(ValueError, match=rf"^pieces must be a power of two between 1 and the item's "
                                             rf"width \(8 bits\), not {pieces!r}$"):
            StreamCrossing(8, depth=4, r_domain="fast", pieces=pieces)


@pytest.mark.parametrize("periods", PERIODS)
def test_event_crossing_gives_every_event_once(periods):
    rng = random.Random(7 * sum(periods))
    dut = EventCrossing(i_domain="sync", o_domain="fast")
    # bursts of back-to-back events (up to 40 in flight, the counter's bound is 127), gaps
    pattern = []
    for _ in range(30):
        pattern += [1] * rng.randrange(1, 40) + [0] * rng.randrange(0, 60)
    total = sum(pattern)
    got = []

    async def source(ctx):
        for bit in pattern:
            ctx.set(dut.i, bit)
            await ctx.tick("sync")
        ctx.set(dut.i, 0)
        for _ in range(100):          # the last events cross
            await ctx.tick("sync")

    async def sink(ctx):
        while True:
            _, _, o = await ctx.tick("fast").sample(dut.o)
            got.append(o)

    _simulate(dut, periods, (source, False), (sink, True))
    assert sum(got) == total
    assert got[-1] == 0


@pytest.mark.parametrize("periods", PERIODS)
@pytest.mark.parametrize("cycles", [1, 4])
def test_reset_crossing_holds_the_destination_in_reset(periods, cycles):
    dut = ResetCrossing(i_domain="sync", o_domain="fast", cycles=cycles)
    trace = []          # (reset, busy) at each destination edge
    results = {}

    async def destination(ctx):
        while True:
            _, _, reset = await ctx.tick("fast").sample(dut.reset)
            trace.append(reset)

    async def source(ctx):
        # power-on: the destination starts in reset for `cycles` cycles, then leaves it
        for _ in range(10 * cycles + 20):
            await ctx.tick("sync")
        results["power_on"] = list(trace)
        assert ctx.get(dut.busy) == 0
        for request in range(3):
            start = len(trace)
            ctx.set(dut.request, 1)
            await ctx.tick("sync")
            ctx.set(dut.request, 0)
            busy_cycles = 0
            while ctx.get(dut.busy):
                # a second request while busy is covered by the one in progress
                ctx.set(dut.request, int(request == 1 and busy_cycles == 1))
                await ctx.tick("sync")
                ctx.set(dut.request, 0)
                busy_cycles += 1
            # busy has dropped: the destination has left its reset
            assert ctx.get(dut.reset) == 0
            for _ in range(5):
                await ctx.tick("sync")
            results[request] = trace[start:]

    _simulate(dut, periods, (source, False), (destination, True))
    power_on = results["power_on"]
    assert power_on[:cycles] == [1] * cycles and power_on[-1] == 0
    for request in range(3):
        window = results[request]
        high = [n for n, r in enumerate(window) if r]
        # one reset of at least `cycles` destination cycles, then none
        assert len(high) >= cycles
        assert high == list(range(high[0], high[-1] + 1))
        assert window[-1] == 0


@pytest.mark.parametrize("periods", PERIODS)
def test_count_crossing_totals_and_settling(periods):
    """Random increments (including the largest, every cycle) in the source domain; an event
    crosses with the last one. The destination's sums equal the source's, and by the second
    snapshot after the event has crossed they hold every increment."""
    rng = random.Random(11 * sum(periods))
    counts = CountCrossing({"macs": 9, "busy": 1}, total_bits=16, i_domain="sync", o_domain="fast")
    event = EventCrossing(i_domain="sync", o_domain="fast")
    top = Module()
    top.submodules.counts = counts
    top.submodules.event = event
    sent = {"macs": 0, "busy": 0}
    seen = {"macs": 0, "busy": 0}
    at_settle = []

    async def source(ctx):
        for phase in range(6):
            for _ in range(rng.randrange(20, 200)):
                macs = 511 if phase == 2 else rng.choice([0, 0, 1, 256, 511, rng.randrange(512)])
                busy = rng.randrange(2)
                ctx.set(counts.i_macs, macs)
                ctx.set(counts.i_busy, busy)
                await ctx.tick("sync")
                sent["macs"] += macs
                sent["busy"] += busy
            # the event is raised in the cycle of the last increment of the phase
            ctx.set(counts.i_macs, 5)
            ctx.set(counts.i_busy, 0)
            ctx.set(event.i, 1)
            await ctx.tick("sync")
            sent["macs"] += 5
            ctx.set(counts.i_macs, 0)
            ctx.set(event.i, 0)
            expected = dict(sent)
            settle = len(at_settle)
            while len(at_settle) == settle:
                await ctx.tick("sync")
            assert at_settle[-1] == expected

    async def sink(ctx):
        since = 2
        while True:
            _, _, rnd, macs, busy, ev = await ctx.tick("fast").sample(
                counts.round, counts.o_macs, counts.o_busy, event.o)
            seen["macs"] += macs
            seen["busy"] += busy
            assert rnd or (macs == 0 and busy == 0)
            if ev:
                since = 0
            elif rnd and since < 2:
                since += 1
                if since == 2:
                    at_settle.append(dict(seen))

    _simulate(top, periods, (source, False), (sink, True))
    assert len(at_settle) == 6


def test_count_crossing_rules():
    with pytest.raises(ValueError, match=r"^increment_bits\['macs'\] must be between 1 and total_bits "
                                         r"\(8\), not 9$"):
        CountCrossing({"macs": 9}, total_bits=8, i_domain="fast")
    with pytest.raises(ValueError, match=r"^increment_bits must name at least one counter$"):
        CountCrossing({}, i_domain="fast")


@pytest.mark.parametrize("periods", PERIODS)
def test_drained_gate_waits_for_the_items_sent_before_each_event(periods):
    """Two crossings, their readers held back: an event is given out only after the reader
    side has taken every item sent before it, on both crossings; events stay in order."""
    top = Module()
    top.submodules.a = a = StreamCrossing(8, depth=4, w_domain="sync", r_domain="fast")
    top.submodules.b = b = StreamCrossing(8, depth=4, w_domain="sync", r_domain="fast")
    top.submodules.gate = gate = DrainedGate(2, depth=8)
    top.d.comb += [gate.sent_0.eq(a.sent), gate.drained_0.eq(a.drained),
                   gate.sent_1.eq(b.sent), gate.drained_1.eq(b.drained)]
    taken = {"a": 0, "b": 0}
    allow = {"a": 0, "b": 0}          # how many items each reader may take so far
    released = []                     # (taken a, taken b) when each event came out

    async def reader(ctx, port, name):
        while True:
            ctx.set(port.o.ready, int(taken[name] < allow[name]))
            _, _, valid, ready = await ctx.tick("fast").sample(port.o.valid, port.o.ready)
            if valid and ready:
                taken[name] += 1

    async def writer(ctx):
        async def send(port, count):
            for value in range(count):
                ctx.set(port.i.valid, 1)
                ctx.set(port.i.payload, value)
                await _until_ready(ctx, port.i)
            ctx.set(port.i.valid, 0)

        async def event():
            ctx.set(gate.i, 1)
            await ctx.tick("sync")
            ctx.set(gate.i, 0)

        async def watch(cycles):
            for _ in range(cycles):
                _, _, o = await ctx.tick("sync").sample(gate.o)
                if o:
                    released.append((taken["a"], taken["b"]))

        await send(a, 3)
        await event()                        # event 1: after 3 items of a
        await send(b, 2)
        await event()                        # event 2: after 3 of a and 2 of b
        await watch(60)
        assert released == []                # nothing taken yet: both wait
        allow["a"] = 2
        await watch(60)
        assert released == []
        allow["a"] = 3
        await watch(60)
        assert released == [(3, 0)]          # event 1 needs nothing of b
        allow["b"] = 1
        await watch(60)
        assert released == [(3, 0)]
        allow["b"] = 2
        await watch(60)
        assert released == [(3, 0), (3, 2)]
        assert ctx.get(gate.pending) == 0

    def bench(port, name):
        async def run(ctx):
            await reader(ctx, port, name)
        return run

    _simulate(top, periods, (writer, False), (bench(a, "a"), True), (bench(b, "b"), True))
    assert len(released) == 2


def test_drained_gate_rules():
    with pytest.raises(ValueError, match=r"^crossings must be a positive integer, not 0$"):
        DrainedGate(0)
    with pytest.raises(ValueError, match=r"^depth must be a positive integer, not 0$"):
        DrainedGate(1, depth=0)


def test_crossing_rules():
    with pytest.raises(ValueError, match=r"^i_domain and o_domain must differ, both are 'sync'$"):
        EventCrossing(o_domain="sync")
    with pytest.raises(ValueError, match=r"^cycles must be a positive integer, not 0$"):
        ResetCrossing(o_domain="fast", cycles=0)
    with pytest.raises(ValueError, match=r"^i_domain and o_domain must differ, both are 'fast'$"):
        ResetCrossing(i_domain="fast", o_domain="fast")


@pytest.mark.parametrize("fetch_ahead,registers",
                         [(False, (3, False)), (True, (2, False)), (False, (True, True))])
def test_stream_crossing_own_write_reset_empties_and_waits_a_cycle(fetch_ahead, registers):
    """With own_write_reset, a reset of the write domain with items inside empties the crossing
    (nothing of them comes out afterwards); the crossing takes no item in the first write cycle
    after the reset (ready low) and takes one in the second (with a write register, that takes
    it at once), and items written afterwards come out alone, in order."""
    write = ClockDomain("sync")
    dut = StreamCrossing(8, depth=4, w_domain="sync", r_domain="fast", read_register=registers[0],
                         write_register=registers[1], fetch_ahead=fetch_ahead, own_write_reset=True)
    seen: dict[str, object] = {}

    async def bench(ctx):
        ctx.set(dut.i.valid, 1)
        for item in (1, 2, 3):
            ctx.set(dut.i.payload, item)
            await _until_ready(ctx, dut.i)
        ctx.set(dut.i.valid, 0)
        ctx.set(write.rst, 1)
        for _ in range(3):
            await ctx.tick("sync")
        ctx.set(write.rst, 0)
        ctx.set(dut.i.valid, 1)
        ctx.set(dut.i.payload, 40)
        ticks = 0
        while True:
            ticks += 1
            _, _, ready = await ctx.tick("sync").sample(dut.i.ready)
            if ready or ticks == 10:
                break
        seen["ticks"] = ticks
        ctx.set(dut.i.payload, 41)
        await _until_ready(ctx, dut.i)
        ctx.set(dut.i.valid, 0)
        ctx.set(dut.o.ready, 1)
        out = []
        for _ in range(60):
            _, _, valid, payload = await ctx.tick("fast").sample(dut.o.valid, dut.o.payload)
            if valid:
                out.append(payload)
        seen["out"] = out

    _simulate(dut, (10, 7), (bench, False), sync=write)
    # the write register (its own reset is the domain's) takes the item at once and holds it
    assert seen["ticks"] == (1 if registers[1] else 2)
    assert seen["out"] == [40, 41]


class _TwoCrossings(wiring.Component):
    """Two crossings from ``sync`` to ``fast`` (one write reset), own_write_reset or not."""

    def __init__(self, own: bool) -> None:
        self._own = own
        super().__init__({"data": In(16), "out": Out(16)})

    def elaborate(self, platform):
        m = Module()
        a = m.submodules.a = StreamCrossing(8, depth=4, r_domain="fast", own_write_reset=self._own)
        b = m.submodules.b = StreamCrossing(8, depth=4, r_domain="fast", own_write_reset=self._own)
        m.d.comb += [a.i.payload.eq(self.data[:8]), b.i.payload.eq(self.data[8:]), a.i.valid.eq(1),
                     b.i.valid.eq(1), a.o.ready.eq(1), b.o.ready.eq(1),
                     self.out.eq(Cat(a.o.payload, b.o.payload))]
        return m


def test_ecp5_crossings_with_own_write_reset_keep_a_reset_synchronizer_each(tmp_path):
    """Through synth_ecp5 two crossings from one reset keep two read-side reset synchronizers
    (four flip-flops with an asynchronous set) with own_write_reset, where without it yosys
    merges them into one (two)."""
    def async_flip_flops(own: bool) -> int:
        return async_set_flip_flops(_TwoCrossings(own), Ecp5Stand(), tmp_path / f"{own}.json")

    assert async_flip_flops(True) == 4
    assert async_flip_flops(False) == 2
    with pytest.raises(ValueError, match=r"^own_write_reset must be True or False, not 1$"):
        StreamCrossing(8, depth=4, r_domain="fast", own_write_reset=1)
