"""Tests of ``sim/hdl/axi_ram.sv``, the DRAM model of the RTL runner.

cocotbext-axi's ``AxiMaster`` drives three instances (32-, 64- and 128-bit buses) of one Verilator
build through ``systolic.sim.tools`` (the runner's build and test machinery); a bytearray per
instance is the reference model. The cocotb tests are in this module too; one pytest case runs
all of them in one simulator process. Random sample counts come from ``SYSTOLIC_RTL_SAMPLES``
(default 12).
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import cocotb
import pytest
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, Combine, RisingEdge
from cocotbext.axi import AxiBurstType, AxiBus, AxiMaster, AxiResp
from systolic.sim import tools
from systolic.sim.rtl import hdl_source, read_memh, write_memh

WIDTHS = (32, 64, 128)
MEM_BYTES = 1 << 16
READ_LATENCY = 6
MAX_READS = 4
ID_WIDTH = 4
SAMPLES = int(os.environ.get("SYSTOLIC_RTL_SAMPLES", "12"))
BENCH = "axi_ram_bench"

_PORT = re.compile(r"^\s*(input|output)\s+logic\s*(\[[^\]]+\])?\s*(\w+)", re.MULTILINE)


def _bench_verilog() -> str:
    """axi_ram.sv plus a top with one instance per bus width; instance W's ports are top-level
    ports ``r<W>_<port>`` (clk and rst are shared), its back-door files ``ram<W>_load.hex`` and
    ``ram<W>_dump.hex``."""
    source = hdl_source("axi_ram.sv")
    header = source[source.index("module axi_ram"):source.index(");")]
    ports = _PORT.findall(header)
    decls = ["input logic clk", "input logic rst"]
    instances = []
    for width in WIDTHS:
        connections = [".clk(clk)", ".rst(rst)"]
        for direction, dims, name in ports:
            if name in ("clk", "rst"):
                continue
            dims = dims.replace("DATA_WIDTH", str(width)).replace("ID_WIDTH", str(ID_WIDTH)) \
                .replace("ADDR_WIDTH", "32")
            decls.append(f"{direction} logic {dims} r{width}_{name}")
            connections.append(f".{name}(r{width}_{name})")
        instances.append(
            f"axi_ram #(.DATA_WIDTH({width}), .ID_WIDTH({ID_WIDTH}), .MEM_BYTES(64'd{MEM_BYTES}), "
            f".READ_LATENCY({READ_LATENCY}), .MAX_READS({MAX_READS}), .MAX_WRITES(4), "
            f'.LOAD_FILE("ram{width}_load.hex"), .DUMP_FILE("ram{width}_dump.hex")) ram{width} (\n    '
            + ",\n    ".join(connections) + "\n);")
    top = f"module {BENCH} (\n  " + ",\n  ".join(decls) + "\n);\n" + "\n".join(instances) + "\nendmodule\n"
    return source + "\n" + top


@pytest.fixture(scope="module")
def bench_build() -> Path:
    return tools.cocotb_build(_bench_verilog(), BENCH, "axi-ram")


@pytest.mark.slow
def test_axi_ram(bench_build: Path) -> None:
    # every cocotb test below in one simulator process (starting one costs seconds); a failure
    # names the failed cocotb tests
    results = tools.cocotb_test(bench_build, BENCH, __name__, seed=1234)
    shutil.rmtree(results.parent)      # its memory files; a failed run keeps them for a look


def test_axi_ram_is_lint_clean() -> None:
    # clean under -Wall without any waiver, unlike generated Verilog
    tools.verilator_lint(hdl_source("axi_ram.sv"), "axi_ram", waivers=())


@pytest.mark.parametrize("override, message", [
    ("-GDATA_WIDTH=48", r"DATA_WIDTH must be 32, 64 or 128, not 48"),
    ("-GMEM_BYTES=64'd1000", r"MEM_BYTES must be a power of two between the bus width and "
                             r"2\*\*ADDR_WIDTH, not 1000"),
    ("-GREAD_LATENCY=1", r"READ_LATENCY must be at least 2 cycles, not 1"),
    ("-GMAX_READS=3", r"MAX_READS must be a power of two between 2 and 128, not 3"),
    ("-GMAX_WRITES=6", r"MAX_WRITES must be a power of two of at least 2, not 6"),
])
def test_axi_ram_parameter_errors(override: str, message: str) -> None:
    with pytest.raises(tools.ToolError, match=r"^verilator lint of 'axi_ram' reported \d+ problem\(s\):\n"
                                              r"%Warning-USERFATAL: \S+ axi_ram: " + message
                                              + r"\n%Error: Exiting due to 1 warning\(s\)$"):
        tools.verilator_lint(hdl_source("axi_ram.sv"), "axi_ram", waivers=(override,))


# -- cocotb side ---------------------------------------------------------------------------------

class RamPort:
    """One instance: its AxiMaster, its control inputs and a bytearray reference model."""

    def __init__(self, dut: Any, width: int) -> None:
        self.dut = dut
        self.width = width
        self.bytes = width // 8
        self.prefix = f"r{width}_"
        self.master = AxiMaster(AxiBus.from_prefix(dut, f"r{width}_s_axi"), dut.clk, dut.rst)
        self.model = bytearray(MEM_BYTES)
        self.set(random_en=0, random_seed=0, err_lo=0, err_hi=0, limit_bytes=0, load=0, dump=0,
                 dump_bytes=0)

    def sig(self, name: str) -> Any:
        return getattr(self.dut, self.prefix + name)

    def set(self, **values: int) -> None:
        for name, value in values.items():
            self.sig(name).value = value

    async def write(self, addr: int, data: bytes, **kw: Any) -> None:
        """AXI write that must succeed; updates the model."""
        resp = await self.master.write(addr, data, **kw)
        assert resp.resp == AxiResp.OKAY, (self.width, hex(addr), len(data), resp.resp)
        self.model[addr:addr + len(data)] = data

    async def check(self, addr: int, length: int, **kw: Any) -> None:
        """AXI read that must succeed and equal the model."""
        resp = await self.master.read(addr, length, **kw)
        assert resp.resp == AxiResp.OKAY, (self.width, hex(addr), length, resp.resp)
        expected = bytes(self.model[addr:addr + length])
        assert resp.data == expected, (self.width, hex(addr), length, _first_difference(resp.data, expected))

    async def fill(self, rng: random.Random) -> None:
        """Random contents everywhere (through the back door), so that a stray byte shows."""
        self.model[:] = rng.randbytes(MEM_BYTES)
        write_memh(f"ram{self.width}_load.hex", self.model, self.bytes)
        await self.pulse("load")

    async def check_all(self) -> None:
        """The whole memory (through the back door) equals the model."""
        self.set(dump_bytes=0)
        await self.pulse("dump")
        data = read_memh(f"ram{self.width}_dump.hex", self.bytes, MEM_BYTES).tobytes()
        assert data == bytes(self.model), (self.width, _first_difference(data, bytes(self.model)))

    async def pulse(self, name: str) -> None:
        self.sig(name).value = 1
        await RisingEdge(self.dut.clk)
        self.sig(name).value = 0
        await RisingEdge(self.dut.clk)


class BusMonitor:
    """Samples one instance's handshakes at every rising edge (cocotb drives the clock, so the
    values read there are those before the edge): AR and first-R-beat edges, stalls, the most
    read bursts in flight, and the subordinate's side of the protocol (an R or B response once
    offered stays valid and unchanged until taken)."""

    _PAYLOAD = {"r": ("rid", "rdata", "rresp", "rlast"), "b": ("bid", "bresp")}

    def __init__(self, port: RamPort) -> None:
        self.port = port
        self.ar_edges: list[int] = []
        self.first_beat_edges: list[int] = []
        self.beats = 0
        self.stalls = {"ar": 0, "aw": 0, "w": 0, "r": 0, "b": 0}
        self.held = {"r": 0, "b": 0}          # responses offered and not taken at an edge
        self.max_in_flight = 0
        cocotb.start_soon(self._run())

    async def _run(self) -> None:
        p = self.port
        edge = 0
        burst_open = False
        offered: dict[str, tuple[int, ...] | None] = {"r": None, "b": None}
        while True:
            await RisingEdge(p.dut.clk)
            edge += 1
            for ch, names in self._PAYLOAD.items():
                valid = int(p.sig(f"s_axi_{ch}valid").value)
                payload = tuple(int(p.sig(f"s_axi_{n}").value) for n in names) if valid else ()
                if offered[ch] is not None:
                    assert valid and payload == offered[ch], (
                        f"{p.width}-bit RAM: {ch.upper()} response {offered[ch]} withdrawn or changed "
                        f"to {payload if valid else 'nothing'} before it was taken (edge {edge})")
                taken = int(p.sig(f"s_axi_{ch}ready").value)
                offered[ch] = payload if valid and not taken else None
                self.held[ch] += offered[ch] is not None
            for ch in ("ar", "aw", "w"):
                if int(p.sig(f"s_axi_{ch}valid").value) and not int(p.sig(f"s_axi_{ch}ready").value):
                    self.stalls[ch] += 1
            for ch in ("r", "b"):   # the subordinate holding off a response the manager would take
                if not int(p.sig(f"s_axi_{ch}valid").value) and int(p.sig(f"s_axi_{ch}ready").value):
                    self.stalls[ch] += 1
            if int(p.sig("s_axi_arvalid").value) and int(p.sig("s_axi_arready").value):
                self.ar_edges.append(edge)
            if int(p.sig("s_axi_rvalid").value) and int(p.sig("s_axi_rready").value):
                self.beats += 1
                if not burst_open:
                    self.first_beat_edges.append(edge)
                burst_open = not int(p.sig("s_axi_rlast").value)
            self.max_in_flight = max(self.max_in_flight, int(p.sig("reads_in_flight").value))


async def _start(dut: Any) -> dict[int, RamPort]:
    """Clock, reset, a RamPort per instance, random memory contents (every cocotb test of the
    module runs in the same simulation, so none may rely on what another left)."""
    logging.getLogger(f"cocotb.{BENCH}").setLevel(logging.WARNING)   # one line per AXI burst
    Clock(dut.clk, 10, unit="ns").start()
    ports = {w: RamPort(dut, w) for w in WIDTHS}
    dut.rst.value = 1
    await ClockCycles(dut.clk, 4)
    dut.rst.value = 0
    await ClockCycles(dut.clk, 2)
    rng = random.Random(0)
    for port in ports.values():
        await port.fill(rng)
    return ports


def _first_difference(got: bytes, expected: bytes) -> str:
    for i, (a, b) in enumerate(zip(got, expected, strict=False)):
        if a != b:
            return f"first difference at offset {i}: {a:#04x} != {b:#04x}"
    return f"lengths {len(got)} != {len(expected)}"


def _spans(rng: random.Random, port: RamPort, count: int) -> list[tuple[int, int]]:
    """Disjoint (address, length) spans: extremes first (one byte, one full 256-beat burst from
    a 4 KiB boundary, both ends unaligned, the last bytes of memory), then ``count`` random ones
    in the rest of memory, each starting at a random byte lane."""
    spans = [(0, 1), (0x1000, 256 * port.bytes), (0x3001, 2 * port.bytes + 1), (MEM_BYTES - 3, 3)]
    base, top = 0x4000, MEM_BYTES - 16
    slot = (top - base) // count
    for i in range(count):
        start = base + i * slot + rng.randrange(port.bytes)
        spans.append((start, rng.randint(1, min(slot - port.bytes, 1024))))
    return spans


async def _write_and_check(rng: random.Random, port: RamPort, count: int) -> None:
    await port.fill(rng)
    spans = _spans(rng, port, count)
    writes = [cocotb.start_soon(port.write(a, rng.randbytes(n))) for a, n in spans]
    # the model is updated as each write completes; spans are disjoint, so the order is free
    for task in writes:
        await task
    reads = [cocotb.start_soon(port.check(a, n)) for a, n in spans]
    reads += [cocotb.start_soon(port.check(a + n // 3, max(1, n // 2))) for a, n in spans]
    for task in reads:
        await task
    await port.check_all()


@cocotb.test()
async def random_bursts(dut: Any) -> None:
    """Concurrent random INCR bursts, written then read back, on every bus width."""
    ports = await _start(dut)
    rng = random.Random(1)
    await Combine(*[cocotb.start_soon(_write_and_check(rng, p, SAMPLES))
                                    for p in ports.values()])


@cocotb.test()
async def narrow_bursts(dut: Any) -> None:
    """Bursts of beats narrower than the bus (AxSIZE < log2(bus bytes)), unaligned starts."""
    ports = await _start(dut)
    rng = random.Random(2)
    for port in ports.values():
        await port.fill(rng)
        for size in range(port.bytes.bit_length() - 1):
            for _ in range(max(2, SAMPLES // 4)):
                addr = rng.randrange(MEM_BYTES - 300)
                await port.write(addr, rng.randbytes(rng.randint(1, 200)), size=size)
                await port.check(addr, 260, size=size)
                await port.check(addr + 1, 33)


@cocotb.test()
async def backdoor_load(dut: Any) -> None:
    """$readmemh of a write_memh file, then AXI reads equal the file's bytes; words past the
    file's end keep their contents."""
    ports = await _start(dut)
    rng = random.Random(3)
    for port in ports.values():
        await port.write(MEM_BYTES - 64, rng.randbytes(64))
        image = rng.randbytes(5000 + port.bytes // 2)   # not a whole number of words
        write_memh(f"ram{port.width}_load.hex", image, port.bytes)
        await port.pulse("load")
        port.model[:len(image)] = image
        padded = -(-len(image) // port.bytes) * port.bytes
        port.model[len(image):padded] = bytes(padded - len(image))   # the padding bytes
        await port.check(0, padded)
        await port.check(MEM_BYTES - 64, 64)
        for _ in range(SAMPLES):
            a = rng.randrange(padded)
            await port.check(a, rng.randint(1, padded - a))


@cocotb.test()
async def writes_then_dump(dut: Any) -> None:
    """AXI writes, then $writememh of the first dump_bytes bytes (0: all) equals the model."""
    ports = await _start(dut)
    rng = random.Random(4)
    for port in ports.values():
        await _write_and_check(rng, port, SAMPLES // 2)
        for nbytes in (1001, port.bytes, 0):
            port.set(dump_bytes=nbytes)
            await port.pulse("dump")
            expect = nbytes or MEM_BYTES
            data = read_memh(f"ram{port.width}_dump.hex", port.bytes, expect)
            assert data.tobytes() == bytes(port.model[:expect]), (port.width, nbytes)
            lines = Path(f"ram{port.width}_dump.hex").read_text().split()
            assert len(lines) == -(-expect // port.bytes), (port.width, nbytes, len(lines))


@cocotb.test()
async def error_responses(dut: Any) -> None:
    """SLVERR for bus words in [err_lo, err_hi) (dropped writes, zero read data), DECERR at and
    past limit_bytes, SLVERR for FIXED bursts; the neighbours are served normally."""
    ports = await _start(dut)
    rng = random.Random(5)
    lo, hi, limit = 0x1000, 0x1100, 0x8000
    for port in ports.values():
        before = rng.randbytes(0x300)
        await port.write(0x0F00, before)
        port.set(err_lo=lo, err_hi=hi, limit_bytes=limit)
        # a burst straddling the range: SLVERR, words outside are written, words inside are not
        data = rng.randbytes(0x140)
        resp = await port.master.write(0x0FE0, data)
        assert resp.resp == AxiResp.SLVERR, (port.width, resp.resp)
        port.model[0x0FE0:lo] = data[:lo - 0x0FE0]
        port.model[hi:0x0FE0 + 0x140] = data[hi - 0x0FE0:]
        resp = await port.master.read(0x0FF0, 0x120)
        assert resp.resp == AxiResp.SLVERR, (port.width, resp.resp)
        expect = bytearray(port.model[0x0FF0:0x1110])
        expect[lo - 0x0FF0:hi - 0x0FF0] = bytes(hi - lo)        # erroring beats read zero
        assert resp.data == bytes(expect), (port.width, _first_difference(resp.data, bytes(expect)))
        await port.check(0x0F00, lo - 0x0F00)
        await port.check(hi, 0x40)
        # a read wholly inside, a one-byte write at its last byte
        resp = await port.master.read(hi - port.bytes, port.bytes)
        assert (resp.resp, resp.data) == (AxiResp.SLVERR, bytes(port.bytes)), (port.width, resp)
        assert (await port.master.write(hi - 1, b"\xAA")).resp == AxiResp.SLVERR, port.width
        # DECERR at the limit, OKAY just below it
        await port.write(limit - port.bytes, rng.randbytes(port.bytes))
        await port.check(limit - port.bytes, port.bytes)
        assert (await port.master.read(limit, 4)).resp == AxiResp.DECERR, port.width
        assert (await port.master.write(limit + 4, b"1234")).resp == AxiResp.DECERR, port.width
        # FIXED bursts are not supported
        resp = await port.master.read(0x2000, 4 * port.bytes, burst=AxiBurstType.FIXED)
        assert resp.resp == AxiResp.SLVERR, (port.width, resp.resp)
        assert (await port.master.write(0x2000, bytes(2 * port.bytes),
                                        burst=AxiBurstType.FIXED)).resp == AxiResp.SLVERR
        # nothing in the range or past the limit changed: look through the back door
        port.set(err_lo=0, err_hi=0, limit_bytes=0)
        await port.check(0x0F00, 0x300)
        await port.check(0x2000, 4 * port.bytes)
        port.set(dump_bytes=limit + 64)
        await port.pulse("dump")
        data = read_memh(f"ram{port.width}_dump.hex", port.bytes, limit + 64)
        assert data.tobytes() == bytes(port.model[:limit + 64]), port.width


@cocotb.test()
async def random_backpressure(dut: Any) -> None:
    """With random_en every channel stalls at random and reads take extra latency; concurrent
    random bursts still read back what was written."""
    ports = await _start(dut)
    monitors = {w: BusMonitor(p) for w, p in ports.items()}
    rng = random.Random(6)
    for w, port in ports.items():
        port.set(random_seed=0x1234_5678_9ABC_DEF0 + w)
        port.set(random_en=1)
        # the manager stalls responses too, so that the RAM must hold them
        port.master.read_if.r_channel.set_pause_generator(_pauses(random.Random(rng.random())))
        port.master.write_if.b_channel.set_pause_generator(_pauses(random.Random(rng.random())))
    count = max(4, SAMPLES // 3)        # a monitor samples every edge in Python: slow
    await Combine(*[cocotb.start_soon(_write_and_check(rng, p, count)) for p in ports.values()])
    for w, monitor in monitors.items():
        assert all(count > 0 for count in monitor.stalls.values()), (w, monitor.stalls)
        assert all(count > 0 for count in monitor.held.values()), (w, monitor.held)
        assert monitor.max_in_flight >= 2, (w, monitor.max_in_flight)


def _pauses(rng: random.Random):
    while True:
        yield rng.random() < 0.3


@cocotb.test()
async def outstanding_reads(dut: Any) -> None:
    """Without random_en: MAX_READS bursts queue while one is answered, the first beat of a burst
    comes READ_LATENCY cycles after its AR handshake, and queued bursts follow back to back."""
    ports = await _start(dut)
    rng = random.Random(7)
    for port in ports.values():
        monitor = BusMonitor(port)
        beats = 8
        length = beats * port.bytes
        await port.write(0, rng.randbytes(8 * length))
        monitor.ar_edges.clear()
        monitor.first_beat_edges.clear()
        monitor.beats = 0
        reads = [cocotb.start_soon(port.check(i * length, length)) for i in range(8)]
        for task in reads:
            await task
        assert monitor.max_in_flight == MAX_READS + 1, (port.width, monitor.max_in_flight)
        assert monitor.first_beat_edges[0] - monitor.ar_edges[0] == READ_LATENCY, (
            port.width, monitor.ar_edges, monitor.first_beat_edges)
        # once the pipeline is full, bursts follow each other without a gap
        gaps = [b - a for a, b in zip(monitor.first_beat_edges, monitor.first_beat_edges[1:],
                                      strict=False)]
        assert gaps[-3:] == [beats] * 3, (port.width, gaps)
        assert monitor.beats == 8 * beats, (port.width, monitor.beats)
