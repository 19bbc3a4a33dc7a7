"""Control and status registers (hw/csr.py): the performance counters count their increments
exactly (random and all-ones increments, wrapping at every width, carries from the low into the
high word), also while the host reads them; every count is in the counter memory when
``settled`` rises; reading a low word latches the high word (one latch shared by the counters);
start clears the counts; widths up to 32 bits read 0 in the high word."""

from __future__ import annotations

import random
from typing import Any

import pytest
from amaranth.sim import Simulator
from systolic.hw.axi import RESP_OKAY, RESP_SLVERR
from systolic.hw.csr import COUNTERS, REGISTERS, CSRBank

from .test_scratchpad import construct_rejected

REG = {r.name: r.offset for r in REGISTERS}
NAMES = [name for name, _ in COUNTERS]
#: Increment widths of the tests: "macs" as wide as allowed (carries into the high word within a
#: few cycles), "dram_read_bytes" 5 bits, the others 1 bit.
WIDTHS = {"macs": 32, "dram_read_bytes": 5}
#: Cycles the pipeline may take after the last increment, host reads or not.
SETTLE_CYCLES = 2 * len(COUNTERS) + 4


async def _read(ctx: Any, bus: Any, addr: int) -> tuple[int, int]:
    ctx.set(bus.ar.valid, 1)
    ctx.set(bus.ar.payload.addr, addr)
    await ctx.tick().until(bus.ar.ready)
    ctx.set(bus.ar.valid, 0)
    ctx.set(bus.r.ready, 1)
    data, resp = await ctx.tick().sample(bus.r.payload.data, bus.r.payload.resp).until(bus.r.valid)
    ctx.set(bus.r.ready, 0)
    return data, resp


async def _write(ctx: Any, bus: Any, addr: int, value: int) -> int:
    ctx.set(bus.aw.valid, 1)
    ctx.set(bus.aw.payload.addr, addr)
    ctx.set(bus.w.valid, 1)
    ctx.set(bus.w.payload.data, value)
    ctx.set(bus.w.payload.strb, 0xF)
    await ctx.tick().until(bus.aw.ready & bus.w.ready)
    ctx.set(bus.aw.valid, 0)
    ctx.set(bus.w.valid, 0)
    ctx.set(bus.b.ready, 1)
    (resp,) = await ctx.tick().sample(bus.b.payload.resp).until(bus.b.valid)
    ctx.set(bus.b.ready, 0)
    return resp


async def _read_counters(ctx: Any, dut: CSRBank) -> dict[str, int]:
    values = {}
    for name in NAMES:
        lo, r1 = await _read(ctx, dut.bus, REG[f"{name}_lo"])
        hi, r2 = await _read(ctx, dut.bus, REG[f"{name}_hi"])
        assert r1 == r2 == RESP_OKAY
        values[name] = hi << 32 | lo
    return values


async def _settle(ctx: Any, dut: CSRBank) -> int:
    """Cycles until ``settled`` (increments held at zero)."""
    for name in NAMES:
        ctx.set(getattr(dut, f"increment_{name}"), 0)
    for cycles in range(SETTLE_CYCLES + 1):
        if ctx.get(dut.settled):
            return cycles
        await ctx.tick()
    raise AssertionError(f"settled did not rise within {SETTLE_CYCLES} cycles")


def _simulate(dut: CSRBank, testbench: Any, *background: Any) -> None:
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    for process in background:
        sim.add_testbench(process, background=True)
    sim.add_testbench(testbench)
    sim.run()


def _counting(dut: CSRBank, totals: dict[str, int], cycles: int, seed: int, extremes: bool):
    """A background process: random (or all-ones, every fourth cycle with ``extremes``)
    increments on every counter for ``cycles`` cycles, summed into ``totals``."""
    rng = random.Random(seed)

    async def process(ctx: Any) -> None:
        for cycle in range(cycles):
            for name in NAMES:
                top = (1 << dut.increment_bits[name]) - 1
                value = top if extremes and cycle % 4 == 0 else rng.randint(0, top)
                ctx.set(getattr(dut, f"increment_{name}"), value)
                totals[name] += value
            await ctx.tick()
        for name in NAMES:
            ctx.set(getattr(dut, f"increment_{name}"), 0)
        totals["done"] = 1
    return process


@pytest.mark.parametrize("counter_bits", [64, 48, 33, 32, 16])
@pytest.mark.parametrize("extremes", [False, True], ids=["random", "extremes"])
def test_counters_count_every_increment_and_wrap(counter_bits: int, extremes: bool) -> None:
    """150 cycles of increments while the host reads counters (stealing the pipeline's turns):
    once settled, every counter is the sum of its increments modulo 2**counter_bits, and the
    high words read 0 for widths up to 32."""
    dut = CSRBank(0x0123_4567_89AB_CDEF, counter_bits=counter_bits, increment_bits=WIDTHS)
    totals = dict.fromkeys(NAMES, 0)
    got = {}

    collisions = []

    async def monitor(ctx: Any) -> None:
        # synthesis leaves a read of the row being written undefined (hw/rtlil.py): never
        rp, wp = dut._counter_ports
        async for _, _, raddr, waddr, wen in ctx.tick().sample(rp.addr, wp.addr, wp.en):
            if wen and raddr == waddr:
                collisions.append(raddr)

    async def testbench(ctx: Any) -> None:
        rng = random.Random(1)
        while "done" not in totals:                       # reads during counting
            await _read(ctx, dut.bus, REG[f"{rng.choice(NAMES)}_lo"])
        got["settle"] = await _settle(ctx, dut)
        got.update(await _read_counters(ctx, dut))

    _simulate(dut, testbench, _counting(dut, totals, 150, seed=counter_bits, extremes=extremes), monitor)
    assert collisions == []
    mask = (1 << counter_bits) - 1
    assert totals["macs"] > 1 << 32                       # carries into the high word
    assert {name: got[name] for name in NAMES} == {name: totals[name] & mask for name in NAMES}
    if counter_bits <= 32:
        assert all(got[name] < 1 << 32 for name in NAMES)
    assert got["settle"] <= SETTLE_CYCLES


def test_settled_waits_for_an_increment_of_the_last_cycle() -> None:
    """An increment given in one cycle (registered on arrival) is in its counter when ``settled``
    is first high after it: settled never rises over an increment still on its way."""
    dut = CSRBank(0, increment_bits=WIDTHS)
    got = {}

    async def testbench(ctx: Any) -> None:
        await _settle(ctx, dut)
        ctx.set(dut.increment_macs, 12345)
        await ctx.tick()
        ctx.set(dut.increment_macs, 0)
        while not ctx.get(dut.settled):
            await ctx.tick()
        got["macs"] = (await _read(ctx, dut.bus, REG["macs_lo"]))[0]

    _simulate(dut, testbench)
    assert got["macs"] == 12345


def test_the_counters_share_one_high_word_latch() -> None:
    """The high word read is that of the counter whose low word was read last, as it was then."""
    dut = CSRBank(0, increment_bits={"macs": 32, "cycles": 32})
    got = []

    async def testbench(ctx: Any) -> None:
        ctx.set(dut.increment_macs, (1 << 32) - 1)
        ctx.set(dut.increment_cycles, 1 << 31)
        for _ in range(6):
            await ctx.tick()
        await _settle(ctx, dut)       # macs = 6 * (2**32 - 1), cycles = 3 * 2**32
        await _read(ctx, dut.bus, REG["cycles_lo"])
        await _read(ctx, dut.bus, REG["macs_lo"])
        ctx.set(dut.increment_macs, (1 << 32) - 1)      # counting on after the latch
        got.append(await _read(ctx, dut.bus, REG["cycles_hi"]))
        got.append(await _read(ctx, dut.bus, REG["macs_hi"]))

    _simulate(dut, testbench)
    assert got == [(5, RESP_OKAY), (5, RESP_OKAY)]


@pytest.mark.parametrize("value, pulse", [(1, "start"), (2, "soft_reset"), (3, "both"), (0, "none")])
def test_ctrl_pulses_are_registered_and_one_cycle_long(value: int, pulse: str) -> None:
    """A CTRL write raises start (bit 0) and soft_reset (bit 1) for exactly one cycle, from a
    register: the first cycle of the write's response, not the cycle the write is decoded."""
    dut = CSRBank(0, counter_bits=32)
    trace = []

    async def testbench(ctx: Any) -> None:
        ctx.set(dut.bus.aw.valid, 1)
        ctx.set(dut.bus.aw.payload.addr, REG["ctrl"])
        ctx.set(dut.bus.w.valid, 1)
        ctx.set(dut.bus.w.payload.data, value)
        ctx.set(dut.bus.w.payload.strb, 0xF)
        await ctx.tick().until(dut.bus.aw.ready & dut.bus.w.ready)
        ctx.set(dut.bus.aw.valid, 0)
        ctx.set(dut.bus.w.valid, 0)
        for _ in range(6):          # b.ready low: the response stays valid
            trace.append((ctx.get(dut.bus.b.valid), ctx.get(dut.start), ctx.get(dut.soft_reset)))
            await ctx.tick()

    _simulate(dut, testbench)
    first = [b for b, _, _ in trace].index(1)
    expect_start, expect_reset = value & 1, value >> 1 & 1
    assert [s for _, s, _ in trace] == [expect_start if i == first else 0 for i in range(len(trace))]
    assert [r for _, _, r in trace] == [expect_reset if i == first else 0 for i in range(len(trace))]


def _status_around_ctrl_write(value: int, delay: int, raw: tuple[int, int, int]) -> dict[int, tuple]:
    """STATUS (busy, done, error) as read in each cycle a read was issued, by cycle relative to
    the CTRL write's pulse, with the core's status inputs held at ``raw``; the write starts
    after ``delay`` cycles, a read is issued every other cycle."""
    dut = CSRBank(0, counter_bits=32)
    pulses, samples = [], {}

    async def reader(ctx: Any) -> None:
        ctx.set(dut.busy, raw[0])
        ctx.set(dut.done, raw[1])
        ctx.set(dut.error, raw[2])
        ctx.set(dut.bus.ar.payload.addr, REG["status"])
        ctx.set(dut.bus.ar.valid, 1)
        ctx.set(dut.bus.r.ready, 1)
        fired_at = None
        cycle = 0
        async for _, _, ar_fire, r_valid, data, start, reset in ctx.tick().sample(
                dut.bus.ar.valid & dut.bus.ar.ready, dut.bus.r.valid, dut.bus.r.payload.data,
                dut.start, dut.soft_reset):
            if start or reset:
                pulses.append(cycle)
            if r_valid and fired_at is not None:
                samples[fired_at] = (data & 1, data >> 1 & 1, data >> 4 & 0xF)
            if ar_fire:
                fired_at = cycle
            cycle += 1

    async def testbench(ctx: Any) -> None:
        await ctx.tick().repeat(4 + delay)
        assert await _write(ctx, dut.bus, REG["ctrl"], value) == RESP_OKAY
        await ctx.tick().repeat(8)

    _simulate(dut, testbench, reader)
    (pulse,) = pulses
    return {cycle - pulse: status for cycle, status in samples.items()}


@pytest.mark.parametrize("value, expect", [(1, (1, 0, 0)), (2, (0, 0, 0)), (3, (0, 0, 0))],
                         ids=["start", "soft_reset", "both"])
def test_status_reads_as_after_a_ctrl_pulse_until_the_core_has_taken_it(
        value: int, expect: tuple[int, int, int]) -> None:
    """The core takes start and soft reset through registers of its own, a cycle after the
    CSR's pulses. In the pulse's cycle and the next, STATUS reads as after the pulse (busy after
    start, idle after a soft reset; done and error clear); before and after, the core's status
    (held here: idle, done, error 3)."""
    raw = (0, 1, 3)
    seen = {}
    for delay in (0, 1):            # reads go out every other cycle: the two runs cover each cycle
        seen.update(_status_around_ctrl_write(value, delay, raw))
    assert {0, 1, 2, -1} <= set(seen)
    assert {offset: status for offset, status in seen.items()} == {
        offset: expect if offset in (0, 1) else raw for offset in seen}


def test_start_clears_the_counters() -> None:
    """After start every counter reads 0 (also before the pipeline has written it) and counts
    anew; a soft reset clears them too."""
    dut = CSRBank(0, counter_bits=64, increment_bits=WIDTHS)
    got = []

    async def testbench(ctx: Any) -> None:
        for name in NAMES:
            ctx.set(getattr(dut, f"increment_{name}"), 1)
        for _ in range(40):
            await ctx.tick()
        await _settle(ctx, dut)
        before = await _read_counters(ctx, dut)
        assert before == dict.fromkeys(NAMES, 40)
        assert await _write(ctx, dut.bus, REG["ctrl"], 1) == RESP_OKAY      # start
        got.append(await _read_counters(ctx, dut))
        ctx.set(dut.increment_store_busy, 1)
        for _ in range(7):
            await ctx.tick()
        await _settle(ctx, dut)
        got.append(await _read_counters(ctx, dut))
        assert await _write(ctx, dut.bus, REG["ctrl"], 2) == RESP_OKAY      # soft reset
        got.append(await _read_counters(ctx, dut))

    _simulate(dut, testbench)
    assert got[0] == dict.fromkeys(NAMES, 0)
    assert got[1] == {**dict.fromkeys(NAMES, 0), "store_busy": 7}
    assert got[2] == dict.fromkeys(NAMES, 0)


def test_unknown_register_answers_slverr() -> None:
    dut = CSRBank(0)
    got = []

    async def testbench(ctx: Any) -> None:
        got.append(await _read(ctx, dut.bus, 0xFC))
        got.append(await _read(ctx, dut.bus, REG["config_hash_lo"] + 1))
        got.append(await _read(ctx, dut.bus, REG["macs_lo"] + 2))

    _simulate(dut, testbench)
    assert [resp for _, resp in got] == [RESP_SLVERR] * 3


def test_config_hash_and_registers_read_back() -> None:
    dut = CSRBank(0x0123_4567_89AB_CDEF)
    got = {}

    async def testbench(ctx: Any) -> None:
        assert await _write(ctx, dut.bus, REG["prog_len"], 0xDEAD_BEEF) == RESP_OKAY
        for name in ("config_hash_lo", "config_hash_hi", "prog_len", "ctrl"):
            got[name] = await _read(ctx, dut.bus, REG[name])

    _simulate(dut, testbench)
    assert got == {"config_hash_lo": (0x89AB_CDEF, RESP_OKAY), "config_hash_hi": (0x0123_4567, RESP_OKAY),
                   "prog_len": (0xDEAD_BEEF, RESP_OKAY), "ctrl": (0, RESP_OKAY)}


@pytest.mark.parametrize("counter_bits", [0, 65, "32"])
def test_counter_bits_must_be_1_to_64(counter_bits: Any) -> None:
    with pytest.raises(ValueError, match=rf"^counter_bits must be an integer between 1 and 64, "
                                         rf"not {counter_bits!r}$"):
        construct_rejected(lambda: CSRBank(0, counter_bits=counter_bits))


@pytest.mark.parametrize("bits", [0, 33, True])
def test_increment_bits_must_be_1_to_32(bits: Any) -> None:
    with pytest.raises(ValueError, match=rf"^increment_bits\['macs'\] must be an integer between 1 "
                                         rf"and 32, not {bits!r}$"):
        construct_rejected(lambda: CSRBank(0, increment_bits={"macs": bits}))


def test_increment_bits_name_counters() -> None:
    with pytest.raises(ValueError, match=r"^increment_bits names counters \(cycles, load_busy, .*\), "
                                         r"not 'mac'$"):
        construct_rejected(lambda: CSRBank(0, increment_bits={"mac": 4}))


def test_firmware_words_go_out_at_fw_addr_which_advances() -> None:
    """fw_data writes come out as one-cycle fw_write pulses with the word and the fw_addr it was
    written at, fw_addr advancing after each (and reading back); CTRL bit 2 pulses fw_loaded;
    STATUS bit 2 is the controller's fw_ready."""
    dut = CSRBank(0, counter_bits=32, firmware=True)
    writes, loaded, status = [], [], {}

    async def monitor(ctx: Any) -> None:
        async for _, _, write, addr, data, done in ctx.tick().sample(
                dut.fw_write, dut.fw_write_addr, dut.fw_write_data, dut.fw_loaded):
            if write:
                writes.append((addr, data))
            if done:
                loaded.append(len(writes))

    async def testbench(ctx: Any) -> None:
        ctx.set(dut.fw_ready, 0)
        status["not ready"], _ = await _read(ctx, dut.bus, REG["status"])
        assert await _write(ctx, dut.bus, REG["fw_addr"], 0x1234) == RESP_OKAY
        for value in (0xDEAD_BEEF, 7, 0xFFFF_FFFF):
            assert await _write(ctx, dut.bus, REG["fw_data"], value) == RESP_OKAY
        status["fw_addr"], _ = await _read(ctx, dut.bus, REG["fw_addr"])
        assert await _write(ctx, dut.bus, REG["fw_addr"], 0xFFFF) == RESP_OKAY
        assert await _write(ctx, dut.bus, REG["fw_data"], 1) == RESP_OKAY
        assert await _write(ctx, dut.bus, REG["fw_data"], 2) == RESP_OKAY     # wraps to 0
        assert await _write(ctx, dut.bus, REG["ctrl"], 4) == RESP_OKAY
        await ctx.tick().repeat(3)
        ctx.set(dut.fw_ready, 1)
        status["ready"], _ = await _read(ctx, dut.bus, REG["status"])

    _simulate(dut, testbench, monitor)
    assert writes == [(0x1234, 0xDEAD_BEEF), (0x1235, 7), (0x1236, 0xFFFF_FFFF), (0xFFFF, 1), (0, 2)]
    assert loaded == [5]
    assert status["fw_addr"] == 0x1237
    assert status["not ready"] & 4 == 0 and status["ready"] & 4 == 4


def test_without_firmware_control_the_firmware_registers_do_nothing() -> None:
    """Under hardware control FW_ADDR reads 0 and FW_* writes raise no fw_write (no logic for a
    feature the design does not have); both answer OKAY, as registers of the map."""
    dut = CSRBank(0, counter_bits=32)
    pulses, got = [], {}

    async def monitor(ctx: Any) -> None:
        async for _, _, write in ctx.tick().sample(dut.fw_write):
            pulses.append(write)

    async def testbench(ctx: Any) -> None:
        got["addr write"] = await _write(ctx, dut.bus, REG["fw_addr"], 0x1234)
        got["data write"] = await _write(ctx, dut.bus, REG["fw_data"], 5)
        got["addr"] = await _read(ctx, dut.bus, REG["fw_addr"])

    _simulate(dut, testbench, monitor)
    assert got == {"addr write": RESP_OKAY, "data write": RESP_OKAY, "addr": (0, RESP_OKAY)}
    assert not any(pulses)
