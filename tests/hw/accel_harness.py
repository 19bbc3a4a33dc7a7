"""Runs programs on the whole accelerator (``hw/top.py``) in the Amaranth simulator: an AXI4 memory
model on the DRAM port and an AXI4-Lite driver for the CSRs. Slow (a few thousand cycles per
second) but needs no Verilator; the Verilator runner in ``sim/rtl.py`` is for long programs."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
from amaranth.sim import Simulator
from systolic.hw.config import AcceleratorConfig
from systolic.hw.csr import COUNTERS, REGISTERS
from systolic.hw.isa import Program
from systolic.hw.top import Accelerator

from tests.hw.axi_model import AXIMemory

__all__ = ["AccelRun", "run_accelerator", "add_compute_clock", "start", "start_and_wait", "lite_read",
           "lite_write", "axi_view", "REG"]

REG = {r.name: r.offset for r in REGISTERS}


def axi_view(dut: Accelerator) -> SimpleNamespace:
    """The accelerator's flat ``m_axi_*`` ports grouped as AXI4 channels (``ar``, ``r``, ``aw``,
    ``w``, ``b``: valid, ready and payload fields), as the simulated memory expects them."""
    def port(channel: str, **payload: str) -> SimpleNamespace:
        s = lambda name: getattr(dut, f"m_axi_{channel}{name}")   # noqa: E731
        return SimpleNamespace(valid=s("valid"), ready=s("ready"),
                               payload=SimpleNamespace(**{k: s(v) for k, v in payload.items()}))
    return SimpleNamespace(
        ar=port("ar", addr="addr", len="len", size="size"),
        r=port("r", data="data", resp="resp", last="last"),
        aw=port("aw", addr="addr", len="len", size="size"),
        w=port("w", data="data", strb="strb", last="last"),
        b=port("b", resp="resp"),
    )


async def lite_write(ctx: Any, dut: Accelerator, addr: int, value: int) -> int:
    """One AXI4-Lite write; returns the response code."""
    ctx.set(dut.s_axil_awvalid, 1)
    ctx.set(dut.s_axil_awaddr, addr)
    ctx.set(dut.s_axil_wvalid, 1)
    ctx.set(dut.s_axil_wdata, value)
    ctx.set(dut.s_axil_wstrb, 0xF)
    aw_done = w_done = False
    while not (aw_done and w_done):
        _, _, aw_ready, w_ready = await ctx.tick().sample(dut.s_axil_awready, dut.s_axil_wready)
        if aw_ready and not aw_done:
            aw_done = True
            ctx.set(dut.s_axil_awvalid, 0)
        if w_ready and not w_done:
            w_done = True
            ctx.set(dut.s_axil_wvalid, 0)
    ctx.set(dut.s_axil_bready, 1)
    while True:
        _, _, valid, resp = await ctx.tick().sample(dut.s_axil_bvalid, dut.s_axil_bresp)
        if valid:
            break
    ctx.set(dut.s_axil_bready, 0)
    return resp


async def lite_read(ctx: Any, dut: Accelerator, addr: int) -> tuple[int, int]:
    """One AXI4-Lite read; returns (data, response code)."""
    ctx.set(dut.s_axil_arvalid, 1)
    ctx.set(dut.s_axil_araddr, addr)
    while True:
        _, _, ready = await ctx.tick().sample(dut.s_axil_arready)
        if ready:
            break
    ctx.set(dut.s_axil_arvalid, 0)
    ctx.set(dut.s_axil_rready, 1)
    while True:
        _, _, valid, data, resp = await ctx.tick().sample(dut.s_axil_rvalid, dut.s_axil_rdata,
                                                          dut.s_axil_rresp)
        if valid:
            break
    ctx.set(dut.s_axil_rready, 0)
    return data, resp


async def start(ctx: Any, dut: Accelerator, prog_addr: int, prog_len: int) -> None:
    """Write prog_addr, prog_len and dram_base = 0, then start."""
    await lite_write(ctx, dut, REG["prog_addr"], prog_addr)
    await lite_write(ctx, dut, REG["prog_len"], prog_len)
    await lite_write(ctx, dut, REG["dram_base"], 0)
    await lite_write(ctx, dut, REG["ctrl"], 1)


async def start_and_wait(ctx: Any, dut: Accelerator, prog_addr: int, prog_len: int, max_cycles: int) -> int:
    """:func:`start`, then wait for irq (at most ``max_cycles``); returns STATUS."""
    await start(ctx, dut, prog_addr, prog_len)
    for _ in range(max_cycles):
        _, _, irq = await ctx.tick().sample(dut.irq)
        if irq:
            break
    status, _ = await lite_read(ctx, dut, REG["status"])
    return status


def add_compute_clock(sim: Simulator, dut: Accelerator) -> None:
    """With ``compute_clock_mhz``: drive ``dut.compute_clk`` at the configured ratio to the
    10 ns clock of ``sim.add_clock(1e-8)``, its edges offset from that clock's."""
    config = dut.config
    if not config.compute_clock_mhz:
        return
    half = 5e-9 * config.clock_mhz / config.compute_clock_mhz

    async def compute_clock(ctx: Any) -> None:
        await ctx.delay(half * 0.37)
        while True:
            ctx.set(dut.compute_clk, 1)
            await ctx.delay(half)
            ctx.set(dut.compute_clk, 0)
            await ctx.delay(half)

    sim.add_testbench(compute_clock, background=True)


class AccelRun(SimpleNamespace):
    """dram (final image), status, error, error_pc, done, counters (dict), high_words (each
    counter's high register), cycles_waited."""


def run_accelerator(config: AcceleratorConfig, program: Program, dram: np.ndarray, *,
                    prog_addr: int, max_cycles: int = 50_000, stall: float = 0.0,
                    latency: tuple[int, int] = (0, 0), seed: int = 0,
                    error_at: set[int] | None = None) -> AccelRun:
    dut = Accelerator(config)
    memory = bytearray(np.asarray(dram, np.uint8).tobytes())
    axi = AXIMemory(memory, config.dma_bytes, seed=seed, stall=stall, latency=latency, error_at=error_at)
    result = AccelRun()

    async def testbench(ctx: Any) -> None:
        await lite_write(ctx, dut, REG["prog_addr"], prog_addr)
        await lite_write(ctx, dut, REG["prog_len"], len(program.instructions))
        await lite_write(ctx, dut, REG["dram_base"], 0)
        await lite_write(ctx, dut, REG["ctrl"], 1)
        waited = 0
        while waited < max_cycles:
            _, _, irq = await ctx.tick().sample(dut.irq)
            waited += 1
            if irq:
                break
        status, _ = await lite_read(ctx, dut, REG["status"])
        result.status = status
        result.done = bool(status & 2)
        result.error = (status >> 4) & 0xF
        result.error_pc, _ = await lite_read(ctx, dut, REG["error_pc"])
        result.pc, _ = await lite_read(ctx, dut, REG["pc"])
        result.cycles_waited = waited
        counters = {}
        high_words = {}
        for name, _ in COUNTERS:
            lo, _ = await lite_read(ctx, dut, REG[f"{name}_lo"])
            hi, _ = await lite_read(ctx, dut, REG[f"{name}_hi"])
            counters[name] = hi << 32 | lo
            high_words[name] = hi
        result.counters = counters
        result.high_words = high_words

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    add_compute_clock(sim, dut)
    axi.add_to(sim, axi_view(dut), read=True, write=True)
    sim.add_testbench(testbench)
    sim.run()
    result.dram = np.frombuffer(bytes(memory), np.uint8).copy()
    result.axi = axi
    return result
