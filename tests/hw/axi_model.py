"""An AXI4 subordinate memory for Amaranth async testbenches, with random latency and
backpressure and injectable error responses. Shared by every test of a block with an AXI port."""

from __future__ import annotations

import collections
import random
from typing import Any

from systolic.hw.axi import RESP_OKAY, RESP_SLVERR

__all__ = ["AXIMemory"]


class AXIMemory:
    """Byte-addressed memory served over the ``ar``/``r`` (and ``aw``/``w``/``b``) streams of a
    manager port. ``stall`` is the probability that a channel holds off a cycle; ``error_at`` is a
    set of beat addresses whose reads or writes answer SLVERR; ``max_burst`` (beats), if given, is
    the longest burst the manager may request. ``latency`` is the range of cycles from accepting a
    read burst's address to offering its first beat; it runs concurrently for every burst in
    flight (a pipelined memory), and data returns in order."""

    def __init__(self, memory: bytearray, data_bytes: int, *, seed: int = 0, stall: float = 0.0,
                 latency: tuple[int, int] = (0, 0), error_at: set[int] | None = None,
                 max_burst: int | None = None):
        self.mem = memory
        self.data_bytes = data_bytes
        self.max_burst = max_burst
        self.longest_burst = 0          # beats of the longest read or write burst requested
        self.cycle = 0                  # clock edges seen by the read address channel
        self.rng = random.Random(seed)
        self.stall = stall
        self.latency = latency
        self.error_at = error_at or set()
        self.bursts: collections.deque = collections.deque()
        self.read_bursts = 0
        self.read_beats = 0
        self.max_outstanding = 0
        self.write_bursts: collections.deque = collections.deque()
        self.responses: collections.deque = collections.deque()
        self.write_beats = 0
        self.write_burst_count = 0

    def _stalled(self) -> bool:
        return self.stall > 0 and self.rng.random() < self.stall

    async def serve_ar(self, ctx: Any, bus: Any) -> None:
        accepted = completed = 0       # bursts accepted on AR, bursts whose last beat was taken
        while True:
            ready = not self._stalled()
            ctx.set(bus.ar.ready, ready)
            _, _, valid, addr, length, size, r_valid, r_ready, r_last = await ctx.tick().sample(
                bus.ar.valid, bus.ar.payload.addr, bus.ar.payload.len, bus.ar.payload.size,
                bus.r.valid, bus.r.ready, bus.r.payload.last)
            self.cycle += 1
            # counted here, at the edge itself: a burst that ends at the edge where another is
            # accepted does not count as in flight with it
            completed += bool(r_valid and r_ready and r_last)
            if not (ready and valid):
                continue
            assert 1 << size == self.data_bytes, f"AR size {size} for a {self.data_bytes}-byte bus"
            assert addr % self.data_bytes == 0, f"AR address {addr:#x} not aligned to the bus"
            beats = length + 1
            assert (addr % 4096) + beats * self.data_bytes <= 4096, f"burst at {addr:#x} crosses 4 KiB"
            assert self.max_burst is None or beats <= self.max_burst, \
                f"AR burst at {addr:#x} of {beats} beats, longer than {self.max_burst}"
            self.longest_burst = max(self.longest_burst, beats)
            # the edge from which its first beat may be offered
            self.bursts.append([addr, beats, self.cycle + self.rng.randint(*self.latency)])
            self.read_bursts += 1
            accepted += 1
            self.max_outstanding = max(self.max_outstanding, accepted - completed)

    async def serve_r(self, ctx: Any, bus: Any) -> None:
        while True:
            if not self.bursts:
                ctx.set(bus.r.valid, 0)
                await ctx.tick()
                continue
            burst = self.bursts[0]
            if self.cycle < burst[2]:
                ctx.set(bus.r.valid, 0)
                await ctx.tick()
                continue
            addr, beats, _ = burst
            for beat in range(beats):
                while self._stalled():
                    ctx.set(bus.r.valid, 0)
                    await ctx.tick()
                a = addr + beat * self.data_bytes
                chunk = bytes(self.mem[a:a + self.data_bytes]).ljust(self.data_bytes, b"\0")
                ctx.set(bus.r.payload.data, int.from_bytes(chunk, "little"))
                ctx.set(bus.r.payload.resp, RESP_SLVERR if a in self.error_at else RESP_OKAY)
                ctx.set(bus.r.payload.last, int(beat == beats - 1))
                ctx.set(bus.r.valid, 1)
                while True:
                    _, _, ready = await ctx.tick().sample(bus.r.ready)
                    if ready:
                        break
                self.read_beats += 1
            ctx.set(bus.r.valid, 0)
            self.bursts.popleft()

    async def serve_aw(self, ctx: Any, bus: Any) -> None:
        while True:
            ready = not self._stalled()
            ctx.set(bus.aw.ready, ready)
            _, _, valid, addr, length, size = await ctx.tick().sample(
                bus.aw.valid, bus.aw.payload.addr, bus.aw.payload.len, bus.aw.payload.size)
            if not (ready and valid):
                continue
            assert 1 << size == self.data_bytes, f"AW size {size} for a {self.data_bytes}-byte bus"
            assert addr % self.data_bytes == 0, f"AW address {addr:#x} not aligned to the bus"
            beats = length + 1
            assert (addr % 4096) + beats * self.data_bytes <= 4096, f"burst at {addr:#x} crosses 4 KiB"
            assert self.max_burst is None or beats <= self.max_burst, \
                f"AW burst at {addr:#x} of {beats} beats, longer than {self.max_burst}"
            self.longest_burst = max(self.longest_burst, beats)
            self.write_bursts.append([addr, beats, 0, RESP_OKAY])
            self.write_burst_count += 1

    async def serve_w(self, ctx: Any, bus: Any) -> None:
        while True:
            ready = bool(self.write_bursts) and not self._stalled()
            ctx.set(bus.w.ready, ready)
            _, _, valid, data, strb, last = await ctx.tick().sample(
                bus.w.valid, bus.w.payload.data, bus.w.payload.strb, bus.w.payload.last)
            if not (ready and valid):
                continue
            burst = self.write_bursts[0]
            addr = burst[0] + burst[2] * self.data_bytes
            if addr in self.error_at:
                burst[3] = RESP_SLVERR
            else:
                for b in range(self.data_bytes):
                    if strb >> b & 1:
                        self.mem[addr + b] = (data >> (8 * b)) & 0xFF
            burst[2] += 1
            self.write_beats += 1
            assert bool(last) == (burst[2] == burst[1]), f"WLAST wrong on beat {burst[2]} of {burst[1]}"
            if last:
                self.responses.append(burst[3])
                self.write_bursts.popleft()

    async def serve_b(self, ctx: Any, bus: Any) -> None:
        while True:
            if not self.responses or self._stalled():
                ctx.set(bus.b.valid, 0)
                await ctx.tick()
                continue
            ctx.set(bus.b.payload.resp, self.responses[0])
            ctx.set(bus.b.valid, 1)
            _, _, ready = await ctx.tick().sample(bus.b.ready)
            if ready:
                self.responses.popleft()
                ctx.set(bus.b.valid, 0)

    def add_to(self, sim: Any, bus: Any, *, read: bool = True, write: bool = False) -> None:
        """Serve ``bus`` from this memory in ``sim`` (background testbenches)."""
        channels = ([self.serve_ar, self.serve_r] if read else []) + \
                   ([self.serve_aw, self.serve_w, self.serve_b] if write else [])
        for serve in channels:
            async def process(ctx, serve=serve):
                await serve(ctx, bus)
            sim.add_testbench(process, background=True)
