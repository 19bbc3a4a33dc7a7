"""The host bridge: speaks the host link protocol (``boards/protocol.py``, docs/board.md) over a
byte stream from and to the UART, and turns requests into accesses on the SoC memory (a
:class:`~systolic.boards.memory.MemoryPortSignature` port) and on the accelerator's AXI4-Lite CSR
port.

One request at a time: bytes that arrive while the bridge executes a request or sends its response
are ignored, so the host waits for each response. A request is executed only after its CRC byte
checked: a MEM_WRITE or CSR_WRITE payload (up to 256 bytes) is buffered and committed afterwards.
Inside a frame, a gap of ``timeout_cycles`` without a byte drops the partial frame and answers
TIMEOUT.

``run_busy`` and ``run_error`` (for LEDs) are what the bridge has seen of the accelerator: busy from
a CSR write that sets CTRL.start until ``irq`` (done) rises or a CTRL.soft_reset; error from the
last STATUS read whose error field was nonzero, cleared by start or soft reset.

Units: addresses in bytes, counts in 32-bit words, ``timeout_cycles`` in clock cycles.
"""

from __future__ import annotations

from functools import reduce
from operator import xor

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from systolic.hw.axi import RESP_OKAY, AXI4LiteSignature
from systolic.hw.csr import CSR_ADDR_BITS, REGISTERS
from systolic.hw.rtlil import UNDEFINED_COLLISION

from .memory import MemoryPortSignature
from .protocol import (
    INFO_BYTES,
    MAX_WORDS,
    PROTOCOL_VERSION,
    REQUEST_SYNC,
    RESPONSE_SYNC,
    Command,
    Info,
    Status,
    crc8,
    encode_info,
)

__all__ = ["Bridge"]

_OFFSET = {register.name: register.offset for register in REGISTERS}


def _crc8_step(crc, byte):
    """CRC-8/SMBUS after one more byte: a linear map of ``crc ^ byte`` over GF(2), each output
    bit the XOR of the input bits whose unit vectors set it (taken from the protocol's table)."""
    x = crc ^ byte
    columns = [crc8(bytes([1 << i])) for i in range(8)]
    bits = []
    for out in range(8):
        terms = [x[i] for i in range(8) if columns[i] >> out & 1]
        bits.append(reduce(xor, terms) if terms else Const(0, 1))
    return Cat(*bits)


class Bridge(wiring.Component):
    """Executes host link requests.

    Parameters: ``memory_bytes`` of SoC memory behind ``mem`` (whose words are ``port``'s data
    width), the accelerator's ``bus_bytes`` and ``config_hash`` (reported by INFO), and the
    inter-byte ``timeout_cycles``.
    """

    def __init__(self, *, port: MemoryPortSignature, memory_bytes: int, bus_bytes: int,
                 config_hash: int, timeout_cycles: int):
        if not isinstance(port, MemoryPortSignature):
            raise TypeError(f"port must be a MemoryPortSignature, not {port!r}")
        if isinstance(timeout_cycles, bool) or not isinstance(timeout_cycles, int) or timeout_cycles < 1:
            raise ValueError(f"timeout_cycles must be a positive integer, not {timeout_cycles!r}")
        self.port = port
        self.memory_bytes = memory_bytes
        self.bus_bytes = bus_bytes
        self.config_hash = config_hash
        self.timeout_cycles = timeout_cycles
        super().__init__({
            "rx": In(stream.Signature(8, always_ready=True)),
            "tx": Out(stream.Signature(8)),
            "csr": Out(AXI4LiteSignature(addr_width=CSR_ADDR_BITS)),
            "mem": Out(port),
            "irq": In(1),
            "run_busy": Out(1),
            "run_error": Out(1),
        })

    def _count_silence(self, m: Module, idle: Signal, status: Signal, response_words: Signal) -> None:
        """Inside a frame, a cycle without a byte; after ``timeout_cycles`` of them the partial
        frame is dropped and TIMEOUT answered."""
        m.d.sync += idle.eq(idle + 1)
        with m.If(idle == self.timeout_cycles - 1):
            m.d.sync += [status.eq(Status.TIMEOUT), response_words.eq(0)]
            m.next = "RESPOND"

    def elaborate(self, platform):
        m = Module()
        rx, tx, csr, mem = self.rx, self.tx, self.csr, self.mem
        data_width = self.port.data_width
        beat_log2 = (data_width // 8).bit_length() - 1

        # write payloads wait here until their CRC has checked
        # written while a payload arrives, read after its checksum: never a word in the cycle it
        # is written, so synthesis needs no logic for that case (hw/rtlil.py)
        m.submodules.buffer = buffer = Memory(shape=32, depth=MAX_WORDS, init=[],
                                              attrs={UNDEFINED_COLLISION: 1})
        buffer_write = buffer.write_port()
        buffer_read = buffer.read_port()

        cmd = Signal(8)
        addr = Signal(32)
        count = Signal(16)
        crc = Signal(8)
        status = Signal(3)
        header_index = Signal(range(7))
        payload_left = Signal(18)           # bytes; 4 * count fits 18 bits
        payload_index = Signal(8)           # bytes buffered so far, modulo 256
        payload_full = Signal()             # 256 bytes buffered: the rest is not kept
        idle = Signal(range(self.timeout_cycles + 1))
        word = Signal(32)                   # assembles and disassembles payload words
        word_index = Signal(range(MAX_WORDS + 1))
        response_words = Signal(range(MAX_WORDS + 1))
        byte_index = Signal(2)
        aw_done = Signal()
        w_done = Signal()
        ar_done = Signal()
        read_wait = Signal(range(max(2, self.port.read_latency)))   # cycles until a read's data arrives

        got = rx.valid
        byte = rx.payload
        crc_in = _crc8_step(crc, byte)
        m.d.comb += [buffer_read.addr.eq(word_index), buffer_read.en.eq(1)]
        # the word read is registered before it is used: a block RAM's clock-to-output (5.6 ns on
        # an ECP5 of speed grade 6) leaves no time for the route to the CSR bank's write logic
        # (a write's state takes two cycles to load a word: the read, then this register)
        buffered = Signal(32)
        loading = Signal()                  # the first cycle of a *_LOAD state
        m.d.sync += buffered.eq(buffer_read.data)

        # where a 32-bit word lies on the memory bus
        lane = addr[2:beat_log2] if beat_log2 > 2 else Const(0, 1)
        mem_word = addr[beat_log2:beat_log2 + self.port.addr_width]
        m.d.comb += [mem.cmd.payload.addr.eq(mem_word),
                     mem.cmd.payload.data.eq(Cat(*[buffered] * (data_width // 32)))]
        lanes = Const(0xF, 4) << (lane * 4) if beat_log2 > 2 else Const(0xF, 4)
        m.d.comb += mem.cmd.payload.mask.eq(Mux(mem.cmd.payload.write, lanes, 0))

        info = encode_info(Info(PROTOCOL_VERSION, self.bus_bytes, self.memory_bytes,
                                self.config_hash & 0xFFFF_FFFF))
        info_words = [int.from_bytes(info[i:i + 4], "little") for i in range(0, INFO_BYTES, 4)]

        # request rules (protocol.check_request); a memory range is checked once its count is
        # known to be at most MAX_WORDS, on the memory's address bits only
        memory_bits = (self.memory_bytes - 1).bit_length()
        misaligned = addr[:2] != 0
        end = Signal(memory_bits + 1)
        m.d.comb += end.eq(addr[:memory_bits] + (count[:(MAX_WORDS).bit_length()] << 2))
        outside = (addr[memory_bits:] != 0) | (end > self.memory_bytes)
        checked = Signal(3)

        def next_word(addr: Signal):
            # a checked range lies inside the memory: carries above its address bits never happen
            return addr[2:memory_bits].eq(addr[2:memory_bits] + 1)

        with m.Switch(cmd):
            with m.Case(Command.MEM_WRITE, Command.MEM_READ):
                with m.If((count == 0) | (count > MAX_WORDS) | misaligned):
                    m.d.comb += checked.eq(Status.BAD_REQUEST)
                with m.Elif(outside):
                    m.d.comb += checked.eq(Status.BUS_ERROR)
                with m.Else():
                    m.d.comb += checked.eq(Status.OK)
            with m.Case(Command.CSR_WRITE, Command.CSR_READ):
                with m.If((count != 1) | misaligned):
                    m.d.comb += checked.eq(Status.BAD_REQUEST)
                with m.Elif(addr[CSR_ADDR_BITS:] != 0):
                    m.d.comb += checked.eq(Status.BUS_ERROR)
                with m.Else():
                    m.d.comb += checked.eq(Status.OK)
            with m.Case(Command.INFO):
                with m.If((addr != 0) | (count != 0)):
                    m.d.comb += checked.eq(Status.BAD_REQUEST)
                with m.Else():
                    m.d.comb += checked.eq(Status.OK)
            with m.Default():
                m.d.comb += checked.eq(Status.BAD_REQUEST)

        # LEDs: what the bridge has seen of the accelerator
        with m.If(self.irq):
            m.d.sync += self.run_busy.eq(0)

        with m.FSM(name="bridge"):
            # -- receiving -----------------------------------------------------------------------
            with m.State("IDLE"):
                with m.If(got & (byte == REQUEST_SYNC)):
                    m.d.sync += [crc.eq(0), header_index.eq(0), idle.eq(0)]
                    m.next = "HEADER"
            with m.State("HEADER"):
                with m.If(got):
                    m.d.sync += [crc.eq(crc_in), header_index.eq(header_index + 1), idle.eq(0)]
                    with m.Switch(header_index):
                        with m.Case(0):
                            m.d.sync += cmd.eq(byte)
                        for i in range(4):
                            with m.Case(1 + i):
                                m.d.sync += addr.word_select(i, 8).eq(byte)
                        with m.Case(5):
                            m.d.sync += count[:8].eq(byte)
                        with m.Case(6):
                            m.d.sync += count[8:].eq(byte)
                            full_count = Cat(count[:8], byte)
                            m.d.sync += [payload_left.eq(full_count << 2), payload_index.eq(0),
                                         payload_full.eq(0)]
                            writes = (cmd == Command.MEM_WRITE) | (cmd == Command.CSR_WRITE)
                            with m.If(writes & (full_count != 0)):
                                m.next = "PAYLOAD"
                            with m.Else():
                                m.next = "CRC"
                with m.Else():
                    self._count_silence(m, idle, status, response_words)
            with m.State("PAYLOAD"):
                with m.If(got):
                    m.d.sync += [crc.eq(crc_in), idle.eq(0), word.eq(Cat(word[8:], byte)),
                                 payload_index.eq(payload_index + 1),
                                 payload_left.eq(payload_left - 1)]
                    with m.If(payload_index == 0xFF):
                        m.d.sync += payload_full.eq(1)
                    m.d.comb += [buffer_write.addr.eq(payload_index[2:]),
                                 buffer_write.data.eq(Cat(word[8:], byte)),
                                 buffer_write.en.eq((payload_index[:2] == 3) & ~payload_full)]
                    with m.If(payload_left == 1):
                        m.next = "CRC"
                with m.Else():
                    self._count_silence(m, idle, status, response_words)
            with m.State("CRC"):
                with m.If(got):
                    m.d.sync += word_index.eq(0)
                    with m.If(crc_in == 0):
                        m.next = "CHECK"
                    with m.Else():
                        m.d.sync += [status.eq(Status.BAD_CRC), response_words.eq(0)]
                        m.next = "RESPOND"
                with m.Else():
                    self._count_silence(m, idle, status, response_words)

            # -- executing -----------------------------------------------------------------------
            with m.State("CHECK"):
                m.d.sync += status.eq(checked)
                with m.If(checked != Status.OK):
                    m.d.sync += response_words.eq(0)
                    m.next = "RESPOND"
                with m.Else():
                    with m.Switch(cmd):
                        with m.Case(Command.MEM_WRITE):
                            m.d.sync += response_words.eq(0)
                            m.next = "MEM_WRITE_LOAD"
                        with m.Case(Command.MEM_READ):
                            m.d.sync += response_words.eq(count)
                            m.next = "RESPOND"
                        with m.Case(Command.CSR_WRITE):
                            m.d.sync += response_words.eq(0)
                            m.next = "CSR_WRITE_LOAD"
                        with m.Case(Command.CSR_READ):
                            m.next = "CSR_READ"
                        with m.Default():       # INFO
                            m.d.sync += response_words.eq(INFO_BYTES // 4)
                            m.next = "RESPOND"
            with m.State("MEM_WRITE_LOAD"):    # buffer word `word_index` is read out, then registered
                m.d.sync += loading.eq(~loading)
                with m.If(loading):
                    m.next = "MEM_WRITE"
            with m.State("MEM_WRITE"):
                m.d.comb += [mem.cmd.valid.eq(1), mem.cmd.payload.write.eq(1)]
                with m.If(mem.cmd.ready):
                    m.d.sync += [word_index.eq(word_index + 1), next_word(addr)]
                    with m.If(word_index == count - 1):
                        m.next = "RESPOND"
                    with m.Else():
                        m.next = "MEM_WRITE_LOAD"
            with m.State("CSR_WRITE_LOAD"):
                m.d.sync += [aw_done.eq(0), w_done.eq(0), loading.eq(~loading)]
                with m.If(loading):
                    m.next = "CSR_WRITE"
            with m.State("CSR_WRITE"):
                m.d.comb += [
                    csr.aw.valid.eq(~aw_done), csr.aw.payload.addr.eq(addr),
                    csr.w.valid.eq(~w_done), csr.w.payload.data.eq(buffered),
                    csr.w.payload.strb.eq(0xF),
                    csr.b.ready.eq(aw_done & w_done),
                ]
                with m.If(csr.aw.valid & csr.aw.ready):
                    m.d.sync += aw_done.eq(1)
                with m.If(csr.w.valid & csr.w.ready):
                    m.d.sync += w_done.eq(1)
                with m.If(csr.b.valid & csr.b.ready):
                    ok = csr.b.payload.resp == RESP_OKAY
                    m.d.sync += status.eq(Mux(ok, Status.OK, Status.BUS_ERROR))
                    with m.If(ok & (addr == _OFFSET["ctrl"])):
                        with m.If(buffered[0]):
                            m.d.sync += [self.run_busy.eq(1), self.run_error.eq(0)]
                        with m.If(buffered[1]):
                            m.d.sync += [self.run_busy.eq(0), self.run_error.eq(0)]
                    m.next = "RESPOND"
            with m.State("CSR_READ"):
                m.d.comb += [csr.ar.valid.eq(~ar_done), csr.ar.payload.addr.eq(addr),
                             csr.r.ready.eq(ar_done)]
                with m.If(csr.ar.valid & csr.ar.ready):
                    m.d.sync += ar_done.eq(1)
                with m.If(csr.r.valid & csr.r.ready):
                    ok = csr.r.payload.resp == RESP_OKAY
                    m.d.sync += [ar_done.eq(0), word.eq(csr.r.payload.data),
                                 status.eq(Mux(ok, Status.OK, Status.BUS_ERROR)),
                                 response_words.eq(ok)]
                    with m.If(ok & (addr == _OFFSET["status"])):
                        m.d.sync += self.run_error.eq(csr.r.payload.data[4:8] != 0)
                    m.next = "RESPOND"

            # -- responding ----------------------------------------------------------------------
            with m.State("RESPOND"):
                m.d.comb += [tx.valid.eq(1), tx.payload.eq(RESPONSE_SYNC)]
                with m.If(tx.ready):
                    m.next = "STATUS"
            with m.State("STATUS"):
                m.d.comb += [tx.valid.eq(1), tx.payload.eq(status)]
                with m.If(tx.ready):
                    m.d.sync += [crc.eq(_crc8_step(Const(0, 8), status)), word_index.eq(0)]
                    with m.If(response_words != 0):
                        m.next = "FETCH"
                    with m.Else():
                        m.next = "CHECKSUM"
            with m.State("FETCH"):
                m.d.sync += byte_index.eq(0)
                with m.Switch(cmd):
                    with m.Case(Command.MEM_READ):
                        m.d.comb += mem.cmd.valid.eq(1)
                        with m.If(mem.cmd.ready):
                            m.d.sync += read_wait.eq(self.port.read_latency - 1)
                            m.next = "FETCH_MEMORY"
                    with m.Case(Command.INFO):
                        with m.Switch(word_index):
                            for i, value in enumerate(info_words):
                                with m.Case(i):
                                    m.d.sync += word.eq(value)
                        m.next = "SEND"
                    with m.Default():           # CSR_READ: the word is in place
                        m.next = "SEND"
            with m.State("FETCH_MEMORY"):
                # the read data is on rdata read_latency cycles after the grant
                with m.If(read_wait == 0):
                    m.d.sync += [word.eq(mem.rdata.word_select(lane, 32)), next_word(addr)]
                    m.next = "SEND"
                with m.Else():
                    m.d.sync += read_wait.eq(read_wait - 1)
            with m.State("SEND"):
                m.d.comb += [tx.valid.eq(1), tx.payload.eq(word[:8])]
                with m.If(tx.ready):
                    m.d.sync += [crc.eq(_crc8_step(crc, word[:8])), word.eq(word[8:]),
                                 byte_index.eq(byte_index + 1)]
                    with m.If(byte_index == 3):
                        m.d.sync += word_index.eq(word_index + 1)
                        with m.If(word_index == response_words - 1):
                            m.next = "CHECKSUM"
                        with m.Else():
                            m.next = "FETCH"
            with m.State("CHECKSUM"):
                m.d.comb += [tx.valid.eq(1), tx.payload.eq(crc)]
                with m.If(tx.ready):
                    m.next = "IDLE"
        return m
