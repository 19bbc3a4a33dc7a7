"""Control and status registers (hw/csr.py): counters of every width read as two 32-bit words,
the low word's read latching the high word (one latch shared by the counters); widths up to 32
bits read 0 in the high word."""

from __future__ import annotations

from typing import Any

import pytest
from amaranth.sim import Simulator
from systolic.hw.axi import RESP_OKAY, RESP_SLVERR
from systolic.hw.csr import COUNTERS, REGISTERS, CSRBank

from .test_scratchpad import construct_rejected

REG = {r.name: r.offset for r in REGISTERS}


async def _read(ctx: Any, bus: Any, addr: int) -> tuple[int, int]:
    ctx.set(bus.ar.valid, 1)
    ctx.set(bus.ar.payload.addr, addr)
    await ctx.tick().until(bus.ar.ready)
    ctx.set(bus.ar.valid, 0)
    ctx.set(bus.r.ready, 1)
    data, resp = await ctx.tick().sample(bus.r.payload.data, bus.r.payload.resp).until(bus.r.valid)
    ctx.set(bus.r.ready, 0)
    return data, resp


def _run(counter_bits: int, values: list[int]) -> list[tuple[int, int, int]]:
    """For each value: put it on every counter input, read the low word, then change the inputs
    (to value + 1 everywhere) and read the high word: (low, high, responses OR-ed)."""
    dut = CSRBank(0x0123_4567_89AB_CDEF, counter_bits=counter_bits)
    out = []

    async def testbench(ctx: Any) -> None:
        mask = (1 << counter_bits) - 1
        for value in values:
            for name, _ in COUNTERS:
                ctx.set(getattr(dut, f"counter_{name}"), value & mask)
            lo, r1 = await _read(ctx, dut.bus, REG["macs_lo"])
            for name, _ in COUNTERS:
                ctx.set(getattr(dut, f"counter_{name}"), (value + 1) & mask)
            hi, r2 = await _read(ctx, dut.bus, REG["macs_hi"])
            out.append((lo, hi, r1 | r2))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    return out


@pytest.mark.parametrize("counter_bits", [64, 48, 33, 32, 16])
def test_counter_words_and_latched_high_word(counter_bits: int) -> None:
    values = [0, 1, (1 << counter_bits) - 1, (1 << counter_bits) - 2, 0x0123_4567_89AB_CDEF,
              (1 << 32) - 1, 1 << 32]
    mask = (1 << counter_bits) - 1
    for value, (lo, hi, resp) in zip(values, _run(counter_bits, values), strict=True):
        v = value & mask
        assert resp == RESP_OKAY
        assert lo == v & 0xFFFF_FFFF, (counter_bits, value)
        # the high word is the one latched with the low word, not the later value + 1
        assert hi == v >> 32, (counter_bits, value)
        if counter_bits <= 32:
            assert hi == 0


def test_the_counters_share_one_high_word_latch() -> None:
    """The high word read is that of the counter whose low word was read last."""
    dut = CSRBank(0, counter_bits=64)
    got = []

    async def testbench(ctx: Any) -> None:
        for index, (name, _) in enumerate(COUNTERS):
            ctx.set(getattr(dut, f"counter_{name}"), (index + 1) << 32 | index)
        await _read(ctx, dut.bus, REG["cycles_lo"])
        await _read(ctx, dut.bus, REG["macs_lo"])
        got.append(await _read(ctx, dut.bus, REG["cycles_hi"]))
        got.append(await _read(ctx, dut.bus, REG["macs_hi"]))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    macs = [name for name, _ in COUNTERS].index("macs")
    assert got == [(macs + 1, RESP_OKAY), (macs + 1, RESP_OKAY)]


def test_unknown_register_answers_slverr() -> None:
    dut = CSRBank(0)
    got = []

    async def testbench(ctx: Any) -> None:
        got.append(await _read(ctx, dut.bus, 0xFC))
        got.append(await _read(ctx, dut.bus, REG["config_hash_lo"] + 1))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    assert [resp for _, resp in got] == [RESP_SLVERR, RESP_SLVERR]


@pytest.mark.parametrize("counter_bits", [0, 65, "32"])
def test_counter_bits_must_be_1_to_64(counter_bits: Any) -> None:
    with pytest.raises(ValueError, match=rf"^counter_bits must be an integer between 1 and 64, "
                                         rf"not {counter_bits!r}$"):
        construct_rejected(lambda: CSRBank(0, counter_bits=counter_bits))
