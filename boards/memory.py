"""The SoC's on-chip memory: one single-port RAM shared by the accelerator's AXI4 manager port and
the host bridge.

Every access goes through one arbiter in front of one single-port core (one access per cycle), for
both kinds of core:

* ``"bram"``: :class:`amaranth.lib.memory.Memory` (block RAM: iCE40 EBR, ECP5 DP16KD; simulated
  by Amaranth and Verilator). Up to :data:`BANK_BYTES` it is one memory read in one cycle.
  Larger, it is split into up to :data:`MAX_BANKS` banks (256 KiB: 32 banks of four DP16KD) and
  pipelined, so that no path crosses the chip between its block RAMs in one cycle: the access is
  registered, registered again beside a flag per bank (whether the access is for that bank, so
  that no decoding lies on the nets that cross the chip), then copied into registers of its bank
  (beside the bank's block RAMs), the block RAM's read data is registered (its output register),
  registered again beside the bank, and the row is selected from 4 banks (or groups of 4) per
  registered level: read data 9 cycles after the grant for 32 banks
  (:attr:`SoCMemory.read_latency`), still one access per cycle. On ECP5
  (``platform.family == "ecp5"``) banks of :data:`DP16KD_WORDS` words (a 64-bit bus, 16 to 256
  KiB) are DP16KD instances with their output register (REGMODE_A "OUTREG"), which yosys never
  uses, so that the block RAM's slow clock-to-output does not share a cycle with the route; other
  banks, and every bank elsewhere, are amaranth memories followed by a register, with the same
  latency;
* ``"spram"``: iCE40UP5K ``SB_SPRAM256KA`` blocks (16K x 16 bits, 32 KiB each; the device has 4),
  side by side for the bus width and stacked for the depth; byte enables become nibble write
  masks.

The arbiter gives the bridge priority (it makes one access per UART character or so; in a
``"bram"`` memory its accesses reach the arbiter through a register, so the bridge's reads take a
cycle more: :func:`bridge_register`) and
alternates between the AXI read and write engines when both want the port. The read engine keeps
one burst in progress and the next one's address waiting, and an output buffer of
``read_latency + 2`` beats whose credit depends only on registered state; the R channel comes
from that buffer's registers only (the RAM's output never reaches the accelerator in the same
cycle, for the clock), so a beat arrives ``read_latency + 1`` cycles after its address; with the
port free and ``rready`` high it returns one beat per cycle, back to back across bursts. In a
``"bram"`` memory the W channel enters through a :class:`~systolic.hw.interconnect.StreamRegister`
(:func:`w_register`): ``wready`` comes from a register, so the arbiter's choice between the read
and write engines does not reach the manager's W register in the same cycle (on the 4x4 ULX3S
SoC that path crossed the die twice); its beats reach the memory a cycle later, one per cycle.

AXI4 support: INCR bursts of full-width beats (``size`` = log2 of the bus bytes; other sizes and
burst types are not decoded), ``wstrb`` byte enables, one write burst at a time. A beat whose
address lies outside ``[0, memory_bytes)`` answers DECERR (reads return zero, writes are dropped);
a write burst's response is DECERR if any of its beats was.

Units: addresses in bytes on AXI, in bus words on the memory port; widths in bits.
"""

from __future__ import annotations

from typing import Any

from amaranth import Cat, ClockSignal, Const, Instance, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from systolic.hw.axi import (
    RESP_DECERR,
    RESP_OKAY,
    AddressLayout,
    AXI4Signature,
    ReadDataLayout,
    ResponseLayout,
    WriteDataLayout,
)
from systolic.hw.bankram import DP16KD_ROWS, DP16KDPort, dp16kd
from systolic.hw.dsp import is_ecp5
from systolic.hw.interconnect import StreamRegister

__all__ = [
    "MEMORY_KINDS", "SPRAM_BYTES", "SPRAM_COUNT", "BANK_BYTES", "MAX_BANKS", "DP16KD_WORDS", "check_memory",
    "memory_read_latency", "bridge_register", "w_register", "MemoryRequestLayout", "MemoryPortSignature",
    "SoCMemory",
]

#: Memory kinds of :class:`SoCMemory`.
MEMORY_KINDS = ("bram", "spram")
#: Bytes of one SB_SPRAM256KA (16K x 16 bits).
SPRAM_BYTES = 32 * 1024
#: SB_SPRAM256KA blocks of the iCE40UP5K.
SPRAM_COUNT = 4
_SPRAM_WORDS = 16 * 1024
_MIN_BYTES = 1024
_MAX_BRAM_BYTES = 1 << 24
#: Bytes of one bank of a "bram" memory: larger memories are banked and pipelined. 8 KiB on a
#: 64-bit bus is 1024 words, one ECP5 DP16KD deep (1024 x 18): no select between a bank's
#: block RAMs before its data register.
BANK_BYTES = 8 * 1024
#: Banks of a "bram" memory at most (larger memories have larger banks).
MAX_BANKS = 32
#: Words of one ECP5 DP16KD in its 1024 x 18 mode (the accelerator's banks use the same mode,
#: :data:`systolic.hw.bankram.DP16KD_ROWS`): banks this deep are built from DP16KD instances on
#: ECP5 (see :func:`systolic.hw.bankram.dp16kd`).
DP16KD_WORDS = DP16KD_ROWS
_SELECT_FAN_IN = 4      # banks (or groups) one registered select level chooses from


def _is_pow2(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def check_memory(kind: object, memory_bytes: object, data_width: int) -> None:
    """Raise if ``memory_bytes`` of memory ``kind`` cannot be built for a ``data_width``-bit bus.

    ``bram``: a power of two from 1 KiB to 16 MiB. ``spram``: a power of two from 1 KiB that fits
    in the iCE40UP5K's four SB_SPRAM256KA blocks, ``data_width / 16`` of them side by side."""
    if kind not in MEMORY_KINDS:
        raise ValueError(f"memory must be one of {', '.join(repr(k) for k in MEMORY_KINDS)}, "
                         f"not {kind!r}")
    if isinstance(memory_bytes, bool) or not isinstance(memory_bytes, int):
        raise TypeError(f"memory_bytes must be an integer, not {memory_bytes!r}")
    if kind == "bram":
        if not (_is_pow2(memory_bytes) and _MIN_BYTES <= memory_bytes <= _MAX_BRAM_BYTES):
            raise ValueError(f"memory_bytes must be a power of two between {_MIN_BYTES} and "
                             f"{_MAX_BRAM_BYTES} for memory 'bram', not {memory_bytes!r}")
        return
    if not (_is_pow2(memory_bytes) and memory_bytes >= _MIN_BYTES):
        raise ValueError(f"memory_bytes must be a power of two of at least {_MIN_BYTES} for memory "
                         f"'spram', not {memory_bytes!r}")
    blocks = _spram_columns(data_width) * _spram_rows(memory_bytes, data_width)
    if blocks > SPRAM_COUNT:
        raise ValueError(
            f"memory 'spram' of {memory_bytes} bytes on a {data_width}-bit bus needs {blocks} "
            f"SB_SPRAM256KA blocks ({_spram_columns(data_width)} side by side, 16K x 16 bits "
            f"each), the iCE40UP5K has {SPRAM_COUNT}")


def _bram_banks(memory_bytes: int) -> int:
    return max(1, min(MAX_BANKS, memory_bytes // BANK_BYTES))


def _select_levels(banks: int) -> int:
    levels, reach = 0, 1
    while reach < banks:
        levels, reach = levels + 1, reach * _SELECT_FAN_IN
    return levels


def bridge_register(kind: str) -> bool:
    """Whether the bridge's accesses reach the arbiter through a register (one cycle more on its
    reads): for ``"bram"`` memories (ECP5's clocks want it), not for ``"spram"`` (the
    iCE40UP5K's, whose clocks are slow and whose logic cells are the scarce resource: the
    register would take about 50)."""
    return kind != "spram"


def w_register(kind: str) -> bool:
    """Whether the W channel enters through a stream register (``wready`` from a register): for
    the same memories as :func:`bridge_register` (``"bram"``; not ``"spram"``, whose iCE40UP5K
    has scarce logic cells and slow clocks)."""
    return bridge_register(kind)


def memory_read_latency(kind: str, memory_bytes: int) -> int:
    """Cycles from a read's grant to its data on ``rdata``: 1; for a banked "bram" memory (more
    than :data:`BANK_BYTES`) 6 plus a select level per factor of 4 banks (9 for 32 banks), on
    every platform (request, bank flags, bank, block RAM, its output register and bank data
    registers)."""
    banks = _bram_banks(memory_bytes) if kind == "bram" else 1
    return 1 if banks == 1 else 6 + _select_levels(banks)


def _spram_columns(data_width: int) -> int:
    return data_width // 16


def _spram_rows(memory_bytes: int, data_width: int) -> int:
    return max(1, memory_bytes // (SPRAM_BYTES * _spram_columns(data_width)))


class MemoryRequestLayout(data.StructLayout):
    """One memory access: word address, read (0) or write (1), write data and byte mask."""

    def __init__(self, addr_width: int, data_width: int):
        super().__init__({"addr": addr_width, "write": 1, "data": data_width,
                          "mask": data_width // 8})


class MemoryPortSignature(wiring.Signature):
    """A requester's port on the memory (the requester's side; ``.flip()`` for the memory's).

    ``cmd`` carries accesses; ``ready`` is the grant. A read granted in cycle n has its data on
    ``rdata`` in cycle n + ``read_latency``, for that cycle only; accesses take effect in grant
    order."""

    def __init__(self, *, addr_width: int, data_width: int, read_latency: int = 1):
        if isinstance(read_latency, bool) or not isinstance(read_latency, int) or read_latency < 1:
            raise ValueError(f"read_latency must be a positive integer (cycles), not {read_latency!r}")
        self.addr_width = addr_width
        self.data_width = data_width
        self.read_latency = read_latency
        super().__init__({
            "cmd": Out(stream.Signature(MemoryRequestLayout(addr_width, data_width))),
            "rdata": In(data_width),
        })

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, MemoryPortSignature) and self.addr_width == other.addr_width
                and self.data_width == other.data_width and self.read_latency == other.read_latency)

    def __repr__(self) -> str:
        return (f"MemoryPortSignature(addr_width={self.addr_width}, data_width={self.data_width}, "
                f"read_latency={self.read_latency})")


class _Core(wiring.Component):
    """The single-port RAM: one access per cycle, always ready, read data ``read_latency``
    cycles later.

    ``banks``: the amaranth memories of a "bram" memory, the simulation back door to its contents.
    When the banks are DP16KD instances (on ECP5, see :meth:`uses_dp16kd`) they are not
    elaborated, and the contents are not reachable through them (nor simulated by Amaranth)."""

    def __init__(self, kind: str, memory_bytes: int, data_width: int):
        self.kind = kind
        self.memory_bytes = memory_bytes
        self.data_width = data_width
        self.depth = memory_bytes // (data_width // 8)
        self.read_latency = memory_read_latency(kind, memory_bytes)
        addr_width = (self.depth - 1).bit_length()
        super().__init__({
            "cmd": In(stream.Signature(MemoryRequestLayout(addr_width, data_width), always_ready=True)),
            "rdata": Out(data_width),
        })
        self.bank_count = _bram_banks(memory_bytes) if kind == "bram" else 0
        self._banks: list[Memory] | None = None

    @property
    def banks(self) -> list[Memory]:
        """The banks' memories, created on first use (by a simulation reaching the contents,
        ``data``, as a back door, or by elaboration); never for DP16KD banks, so that no unused
        memory is left behind."""
        if self._banks is None:
            self._banks = [Memory(shape=self.data_width, depth=self.depth // self.bank_count, init=[])
                           for _ in range(self.bank_count)]
        return self._banks

    @property
    def ram(self) -> Memory | None:
        """The only bank of a memory of one bank, else None."""
        return self.banks[0] if self.bank_count == 1 else None

    def uses_dp16kd(self, platform: Any) -> bool:
        """Whether the banks are built from DP16KD instances for ``platform``: a banked "bram"
        memory on an ECP5 platform (``platform.family == "ecp5"``) whose banks are
        :data:`DP16KD_WORDS` deep (a 64-bit bus, up to 256 KiB)."""
        return (is_ecp5(platform) and self.bank_count > 1
                and self.depth // self.bank_count == DP16KD_WORDS)

    def _banked(self, m: Module, platform: Any) -> None:
        """The pipelined banks (see the module docstring): request register, bank registers,
        block RAM, the block RAM's output register, bank data register, select levels of 4
        (each a register)."""
        banks = self.bank_count
        index_bits = (self.depth // banks - 1).bit_length()    # word inside a bank; the bank above
        use_dp16kd = self.uses_dp16kd(platform)
        request = Signal.like(self.cmd.payload)
        requested = Signal()
        m.d.sync += [request.eq(self.cmd.payload), requested.eq(self.cmd.valid)]
        # the access again a cycle later, beside one flag per bank: whether it is for that bank
        # (and a write), so that the nets to the banks, which cross the chip, run from registers
        # to the bank registers' enables and data through one gate at most (the write mask's)
        staged = Signal.like(self.cmd.payload)
        m.d.sync += staged.eq(request)
        # the bank of a read, one register per stage: at the flags, at the bank registers, at the
        # block RAMs' data, at their output registers, at the bank data registers, then one per
        # select level
        bank_at = [request.addr[index_bits:]]
        for _ in range(4 + _select_levels(banks)):
            delayed = Signal.like(bank_at[0], name=f"bank_at{len(bank_at)}")
            m.d.sync += delayed.eq(bank_at[-1])
            bank_at.append(delayed)
        level = []
        for k in range(banks):
            here = Signal(name=f"bank{k}_sel")
            here_write = Signal(name=f"bank{k}_sel_wr")
            m.d.sync += [here.eq(requested & (bank_at[0] == k)),
                         here_write.eq(requested & request.write & (bank_at[0] == k))]
            # each bank's own copy of the access (loaded only for it, so that synthesis keeps
            # the copies apart), placed by its block RAMs
            addr = Signal(index_bits, name=f"bank{k}_addr")
            data = Signal(self.data_width, name=f"bank{k}_wdata")
            enables = Signal(self.data_width // 8, name=f"bank{k}_we")
            with m.If(here):
                m.d.sync += [addr.eq(staged.addr[:index_bits]), data.eq(staged.data)]
            m.d.sync += enables.eq(Mux(here_write, staged.mask, 0))
            # the block RAM's read data a cycle later (its output register): the last read's
            # data, kept while the bank writes or is idle
            held = Signal(self.data_width, name=f"bank{k}_dout")
            if use_dp16kd:
                # CEA is high in the access's cycle and in the next one, so that the output
                # register loads the read data even if CEA gates it as well as OCEA (the second
                # cycle reads the same word again, or keeps the data latch during a write)
                accessed = Signal(name=f"bank{k}_acc")
                active = Signal(name=f"bank{k}_ce")
                writing = Signal(name=f"bank{k}_wr")
                m.d.sync += [accessed.eq(here), active.eq(here | accessed), writing.eq(here_write)]
                for j in range(self.data_width // 16):
                    # a single-port RAM on port A, through its output register
                    word, _ = dp16kd(m, f"bank{k}_dp16kd{j}", a=DP16KDPort(
                        addr=addr, enable=active, write=writing,
                        byte_enables=enables.word_select(j, 2), data=data.word_select(j, 16),
                        output_register=True, output_enable=1))
                    m.d.comb += held.word_select(j, 16).eq(word)
            else:
                m.submodules[f"bank{k}"] = ram = self.banks[k]
                write = ram.write_port(granularity=8)
                read = ram.read_port()
                reading = Signal(name=f"bank{k}_re")
                m.d.sync += reading.eq(here & ~here_write)
                m.d.comb += [write.addr.eq(addr), write.data.eq(data), write.en.eq(enables),
                             read.addr.eq(addr), read.en.eq(reading)]
                m.d.sync += held.eq(read.data)
            # beside the block RAM: the trip to the select has a cycle of its own
            out = Signal(self.data_width, name=f"bank{k}_rdata")
            m.d.sync += out.eq(held)
            level.append(out)
        # select levels: each picks one of 4 with two bits of the bank, into a register
        for depth in range(_select_levels(banks)):
            bits = bank_at[5 + depth][2 * depth:2 * depth + 2]
            chosen = []
            for g in range(0, len(level), _SELECT_FAN_IN):
                group = level[g:g + _SELECT_FAN_IN]
                out = Signal(self.data_width, name=f"select{depth}_{g // _SELECT_FAN_IN}")
                if len(group) == 1:
                    m.d.sync += out.eq(group[0])
                else:
                    with m.Switch(bits[:(len(group) - 1).bit_length()]):
                        for i, value in enumerate(group):
                            with m.Case(i):
                                m.d.sync += out.eq(value)
                chosen.append(out)
            level = chosen
        assert len(level) == 1, len(level)
        m.d.comb += self.rdata.eq(level[0])

    def elaborate(self, platform):
        m = Module()
        cmd = self.cmd
        if self.bank_count > 1:
            self._banked(m, platform)
            return m
        if self.ram is not None:
            m.submodules.ram = ram = self.ram
            write = ram.write_port(granularity=8)
            read = ram.read_port()
            m.d.comb += [
                write.addr.eq(cmd.payload.addr), write.data.eq(cmd.payload.data),
                write.en.eq(Mux(cmd.valid & cmd.payload.write, cmd.payload.mask, 0)),
                read.addr.eq(cmd.payload.addr), read.en.eq(cmd.valid & ~cmd.payload.write),
                self.rdata.eq(read.data),
            ]
            return m

        columns = _spram_columns(self.data_width)
        rows = _spram_rows(self.memory_bytes, self.data_width)
        row_addr = cmd.payload.addr[14:]            # which stack of blocks
        if rows > 1:
            read_row = Signal(range(rows))          # the stack whose DATAOUT the last read set
            with m.If(cmd.valid & ~cmd.payload.write):
                m.d.sync += read_row.eq(row_addr)
        outputs = []
        for row in range(rows):
            chip_select = Signal(name=f"spram_cs_{row}")
            m.d.comb += chip_select.eq(cmd.valid & (row_addr == row if rows > 1 else 1))
            outs = []
            for column in range(columns):
                out = Signal(16, name=f"spram_out_{row}_{column}")
                mask = cmd.payload.mask[2 * column:2 * column + 2]
                m.submodules[f"spram_{row}_{column}"] = Instance(
                    "SB_SPRAM256KA",
                    i_ADDRESS=cmd.payload.addr[:14] if self.depth >= _SPRAM_WORDS
                    else Cat(cmd.payload.addr, Const(0, 14 - len(cmd.payload.addr))),
                    i_DATAIN=cmd.payload.data.word_select(column, 16),
                    i_MASKWREN=Cat(mask[0], mask[0], mask[1], mask[1]),
                    i_WREN=cmd.payload.write,
                    i_CHIPSELECT=chip_select,
                    i_CLOCK=ClockSignal("sync"),
                    i_STANDBY=0, i_SLEEP=0, i_POWEROFF=1,
                    o_DATAOUT=out,
                )
                outs.append(out)
            outputs.append(Cat(*outs))
        if rows == 1:
            m.d.comb += self.rdata.eq(outputs[0])
        else:
            with m.Switch(read_row):
                for row, value in enumerate(outputs):
                    with m.Case(row):
                        m.d.comb += self.rdata.eq(value)
        return m


class _Arbiter(wiring.Component):
    """Grants the core to one requester per cycle: ``bridge`` first, then ``reads`` and
    ``writes`` in turn."""

    def __init__(self, signature: MemoryPortSignature, core_signature: wiring.Signature):
        super().__init__({
            "bridge": In(signature), "reads": In(signature), "writes": In(signature),
            "core": Out(core_signature.flip()),
        })

    def elaborate(self, platform):
        m = Module()
        bridge, reads, writes = self.bridge.cmd, self.reads.cmd, self.writes.cmd
        read_last = Signal()        # the last grant between reads and writes went to reads
        grant_reads = Signal()
        grant_writes = Signal()
        m.d.comb += [
            grant_reads.eq(~bridge.valid & reads.valid & (~writes.valid | ~read_last)),
            grant_writes.eq(~bridge.valid & writes.valid & ~grant_reads),
            bridge.ready.eq(bridge.valid),
            reads.ready.eq(grant_reads),
            writes.ready.eq(grant_writes),
        ]
        with m.If(grant_reads | grant_writes):
            m.d.sync += read_last.eq(grant_reads)
        core = self.core.cmd
        m.d.comb += core.valid.eq(bridge.valid | reads.valid | writes.valid)
        # only the address has three sources: the read engine never writes
        with m.If(bridge.valid):
            m.d.comb += core.payload.addr.eq(bridge.payload.addr)
        with m.Elif(grant_reads):
            m.d.comb += core.payload.addr.eq(reads.payload.addr)
        with m.Else():
            m.d.comb += core.payload.addr.eq(writes.payload.addr)
        m.d.comb += [
            core.payload.write.eq(Mux(bridge.valid, bridge.payload.write, grant_writes)),
            core.payload.data.eq(Mux(bridge.valid, bridge.payload.data, writes.payload.data)),
            core.payload.mask.eq(Mux(bridge.valid, bridge.payload.mask, writes.payload.mask)),
        ]
        for port in (self.bridge, self.reads, self.writes):
            m.d.comb += port.rdata.eq(self.core.rdata)
        return m


def _beat_address(axi_addr, beat_log2: int, memory_beats_log2: int):
    """An AXI byte address as a beat address inside the memory plus an *outside* bit on top."""
    return Cat(axi_addr[beat_log2:beat_log2 + memory_beats_log2],
               axi_addr[beat_log2 + memory_beats_log2:] != 0)


def _next_beat(addr: Signal, memory_beats_log2: int):
    """The following beat's address; once outside the memory (a carry out of the memory's
    address bits), it stays outside for the rest of the burst."""
    following = addr + 1
    return Cat(following[:memory_beats_log2], addr[memory_beats_log2] | following[memory_beats_log2])


class _ReadEngine(wiring.Component):
    """AXI4 AR/R channels onto a memory port (see the module docstring)."""

    def __init__(self, port: MemoryPortSignature, memory_beats_log2: int, buffer: int | None = None):
        self.beat_log2 = (port.data_width // 8).bit_length() - 1
        self.memory_beats_log2 = memory_beats_log2
        self.latency = port.read_latency
        self.buffer = port.read_latency + 2 if buffer is None else buffer
        super().__init__({
            "ar": In(stream.Signature(AddressLayout(32))),
            "r": Out(stream.Signature(ReadDataLayout(port.data_width))),
            "mem": Out(port),
        })

    def elaborate(self, platform):
        m = Module()
        ar, r, mem = self.ar, self.r, self.mem
        beats_log2 = self.memory_beats_log2
        beat_width = beats_log2 + 1         # the beat inside the memory, and an outside bit

        # the burst being issued, and the next burst's address waiting behind it
        cur_valid = Signal()
        cur_addr = Signal(beat_width)
        cur_left = Signal(9)
        next_valid = Signal()
        next_addr = Signal(beat_width)
        next_len = Signal(8)

        # beats issued in the last `latency` cycles (the oldest one's data is on mem.rdata now)
        # and latency + 2 buffered beats: the R channel is driven from registers only (no path
        # from the RAM's output through to the accelerator in one cycle); that many entries keep
        # one beat per cycle back to back (fewer: a beat per latency + 2 cycles at worst)
        latency = self.latency
        buffer = self.buffer
        in_flight = [Signal(name=f"in_flight{i}") for i in range(latency)]   # youngest first
        flight_error = [Signal(name=f"flight_error{i}") for i in range(latency)]
        flight_last = [Signal(name=f"flight_last{i}") for i in range(latency)]
        pending, pending_error, pending_last = in_flight[-1], flight_error[-1], flight_last[-1]
        count = Signal(range(buffer + 1))
        beat = ReadDataLayout(len(r.payload.data))
        entries = [Signal(beat, name=f"entry{i}") for i in range(buffer)]
        # (at least one bit: a switch on a zero-width index matches no case)
        head = Signal(range(max(2, buffer)))      # index of the oldest buffered beat
        tail = Signal(range(max(2, buffer)))      # index where the next beat is buffered

        # the buffer's credit: ``taken`` is always count + sum(in_flight), kept in a register (an
        # adder of the in-flight bits in front of the issue would be a long path with 8 of them)
        taken = Signal(range(buffer + 1))
        inside = ~cur_addr[beats_log2]
        room = Signal()
        m.d.comb += room.eq(taken < buffer)
        m.d.comb += [
            mem.cmd.valid.eq(cur_valid & room & inside),
            mem.cmd.payload.addr.eq(cur_addr[:beats_log2]),
            mem.cmd.payload.write.eq(0),
        ]
        issue = Signal()
        m.d.comb += issue.eq(cur_valid & room & (mem.cmd.ready | ~inside))
        last_issue = Signal()
        m.d.comb += last_issue.eq(issue & (cur_left == 1))

        # address channel
        m.d.comb += ar.ready.eq(~next_valid)
        ar_fire = ar.valid & ar.ready
        with m.If(issue):
            m.d.sync += [cur_addr.eq(_next_beat(cur_addr, beats_log2)), cur_left.eq(cur_left - 1)]
        with m.If(~cur_valid | last_issue):
            with m.If(next_valid):
                m.d.sync += [cur_valid.eq(1), cur_addr.eq(next_addr), cur_left.eq(next_len + 1),
                             next_valid.eq(0)]
            with m.Elif(ar_fire):
                m.d.sync += [cur_valid.eq(1),
                             cur_addr.eq(_beat_address(ar.payload.addr, self.beat_log2, beats_log2)),
                             cur_left.eq(ar.payload.len + 1)]
            with m.Else():
                m.d.sync += cur_valid.eq(0)
        with m.Elif(ar_fire):
            m.d.sync += [next_valid.eq(1),
                         next_addr.eq(_beat_address(ar.payload.addr, self.beat_log2, beats_log2)),
                         next_len.eq(ar.payload.len)]

        # data channel
        m.d.sync += [in_flight[0].eq(issue), flight_error[0].eq(~inside), flight_last[0].eq(cur_left == 1)]
        for i in range(1, latency):
            m.d.sync += [in_flight[i].eq(in_flight[i - 1]), flight_error[i].eq(flight_error[i - 1]),
                         flight_last[i].eq(flight_last[i - 1])]
        incoming = Signal(beat)
        m.d.comb += [
            incoming.data.eq(Mux(pending_error, 0, mem.rdata)),
            incoming.resp.eq(Mux(pending_error, RESP_DECERR, RESP_OKAY)),
            incoming.last.eq(pending_last),
        ]
        with m.Switch(head):
            for index, entry in enumerate(entries):
                with m.Case(index):
                    m.d.comb += r.payload.eq(entry)
        m.d.comb += r.valid.eq(count != 0)
        pop = Signal()
        m.d.comb += pop.eq(r.valid & r.ready)
        with m.If(pending):
            m.d.sync += tail.eq(Mux(tail == buffer - 1, 0, tail + 1))
            for index, entry in enumerate(entries):
                with m.If(tail == index):
                    m.d.sync += entry.eq(incoming)
        with m.If(pop):
            m.d.sync += head.eq(Mux(head == buffer - 1, 0, head + 1))
        m.d.sync += [count.eq(count + pending - pop), taken.eq(taken + issue - pop)]
        return m


class _WriteEngine(wiring.Component):
    """AXI4 AW/W/B channels onto a memory port, one burst at a time."""

    def __init__(self, port: MemoryPortSignature, memory_beats_log2: int):
        self.beat_log2 = (port.data_width // 8).bit_length() - 1
        self.memory_beats_log2 = memory_beats_log2
        super().__init__({
            "aw": In(stream.Signature(AddressLayout(32))),
            "w": In(stream.Signature(WriteDataLayout(port.data_width))),
            "b": Out(stream.Signature(ResponseLayout())),
            "mem": Out(port),
        })

    def elaborate(self, platform):
        m = Module()
        aw, w, b, mem = self.aw, self.w, self.b, self.mem
        beats_log2 = self.memory_beats_log2
        beat_width = beats_log2 + 1         # the beat inside the memory, and an outside bit
        active = Signal()           # a burst's beats are being taken
        addr = Signal(beat_width)
        left = Signal(9)
        failed = Signal()           # a beat of this burst was outside the memory

        m.d.comb += aw.ready.eq(~active & ~b.valid)
        with m.If(aw.valid & aw.ready):
            m.d.sync += [active.eq(1), addr.eq(_beat_address(aw.payload.addr, self.beat_log2, beats_log2)),
                         left.eq(aw.payload.len + 1), failed.eq(0)]

        inside = ~addr[beats_log2]
        m.d.comb += [
            mem.cmd.valid.eq(active & w.valid & inside),
            mem.cmd.payload.addr.eq(addr[:beats_log2]),
            mem.cmd.payload.write.eq(1),
            mem.cmd.payload.data.eq(w.payload.data),
            mem.cmd.payload.mask.eq(w.payload.strb),
            w.ready.eq(active & Mux(inside, mem.cmd.ready, 1)),
        ]
        with m.If(w.valid & w.ready):
            m.d.sync += [addr.eq(_next_beat(addr, beats_log2)), left.eq(left - 1)]
            with m.If(~inside):
                m.d.sync += failed.eq(1)
            with m.If(left == 1):
                m.d.sync += [active.eq(0), b.valid.eq(1),
                             b.payload.resp.eq(Mux(failed | ~inside, RESP_DECERR, RESP_OKAY))]
        with m.If(b.valid & b.ready):
            m.d.sync += b.valid.eq(0)
        return m


class SoCMemory(wiring.Component):
    """``memory_bytes`` of on-chip RAM of ``kind`` (``"bram"`` or ``"spram"``) on a
    ``data_width``-bit bus, served to an AXI4 manager (``axi``) and to the bridge (``bridge``, a
    :class:`MemoryPortSignature` port with bus-word addresses).

    ``banks`` are the :class:`~amaranth.lib.memory.Memory` banks of a ``"bram"`` memory, each
    holding a contiguous ``1 / len(banks)`` of the words (simulations reach the contents through
    ``banks[k].data[word]``; empty for ``"spram"``; not for a memory elaborated for ECP5 whose
    banks are DP16KD instances, see the module docstring); ``ram`` is the only bank of a memory of
    one bank, else None. ``read_latency``: cycles from a bridge read's grant to its data, the same
    on every platform: the core's (:func:`memory_read_latency`) plus one for a ``"bram"`` memory,
    for the register between the bridge and the arbiter (:func:`bridge_register`).

    ``read_buffer``: the AXI read engine's output buffer, in beats; by default the read latency
    plus 2, which returns one beat per cycle back to back; 1 for a manager that reads one beat at
    a time (the firmware control), which saves the other entries' registers."""

    def __init__(self, *, memory_bytes: int, data_width: int, kind: str = "bram",
                 read_buffer: int | None = None):
        if data_width not in (32, 64, 128):
            raise ValueError(f"data_width must be 32, 64 or 128, not {data_width!r}")
        check_memory(kind, memory_bytes, data_width)
        if read_buffer is not None and (isinstance(read_buffer, bool) or not isinstance(read_buffer, int)
                                        or read_buffer < 1):
            raise ValueError(f"read_buffer must be a positive integer (beats), not {read_buffer!r}")
        self.read_buffer = read_buffer
        self.kind = kind
        self.memory_bytes = memory_bytes
        self.data_width = data_width
        self.bus_bytes = data_width // 8
        self._core = _Core(kind, memory_bytes, data_width)
        # the bridge's accesses reach the arbiter through a register: a cycle more than the core's
        self.read_latency = self._core.read_latency + bridge_register(kind)
        self.port_signature = self.port_signature_for(memory_bytes, data_width, kind)
        self._internal_signature = MemoryPortSignature(
            addr_width=self.port_signature.addr_width, data_width=data_width,
            read_latency=self._core.read_latency)
        super().__init__({
            "axi": In(AXI4Signature(addr_width=32, data_width=data_width)),
            "bridge": In(self.port_signature),
        })

    @property
    def bank_count(self) -> int:
        """Banks of a ``"bram"`` memory (0 for ``"spram"``)."""
        return self._core.bank_count

    @property
    def banks(self) -> list[Memory]:
        return self._core.banks

    @property
    def ram(self) -> Memory | None:
        return self._core.ram

    @staticmethod
    def port_signature_for(memory_bytes: int, data_width: int, kind: str = "bram") -> MemoryPortSignature:
        """The bridge port's signature of a memory of ``memory_bytes`` bytes of ``kind`` on a
        ``data_width``-bit bus (word addresses, its read latency)."""
        words = memory_bytes // (data_width // 8)
        return MemoryPortSignature(addr_width=max(1, (words - 1).bit_length()), data_width=data_width,
                                   read_latency=memory_read_latency(kind, memory_bytes)
                                   + bridge_register(kind))

    def elaborate(self, platform):
        m = Module()
        beats_log2 = (self.memory_bytes // self.bus_bytes).bit_length() - 1
        m.submodules.core = core = self._core
        internal = self._internal_signature
        m.submodules.arbiter = arbiter = _Arbiter(internal, core.signature)
        m.submodules.reads = reads = _ReadEngine(internal, beats_log2, self.read_buffer)
        m.submodules.writes = writes = _WriteEngine(internal, beats_log2)
        wiring.connect(m, arbiter=arbiter.core, core=core)
        # the bridge's access goes through a register (the arbiter grants it at once, so the
        # register never waits): no path from the bridge's state through the arbiter into the
        # AXI engines' handshakes (timing); its reads take a cycle more
        bridge, granted = self.bridge.cmd, arbiter.bridge.cmd
        m.d.comb += [bridge.ready.eq(1), self.bridge.rdata.eq(arbiter.bridge.rdata)]
        domain = m.d.sync if bridge_register(self.kind) else m.d.comb
        domain += [granted.valid.eq(bridge.valid), granted.payload.eq(bridge.payload)]
        wiring.connect(m, reads=reads.mem, arbiter=arbiter.reads)
        wiring.connect(m, writes=writes.mem, arbiter=arbiter.writes)
        wiring.connect(m, manager=wiring.flipped(self.axi.ar), reads=reads.ar)
        wiring.connect(m, reads=reads.r, manager=wiring.flipped(self.axi.r))
        wiring.connect(m, manager=wiring.flipped(self.axi.aw), writes=writes.aw)
        if w_register(self.kind):
            m.submodules.w_in = w_in = StreamRegister(self.axi.w.payload.shape())
            wiring.connect(m, manager=wiring.flipped(self.axi.w), w_in=w_in.i)
            wiring.connect(m, w_in=w_in.o, writes=writes.w)
        else:
            wiring.connect(m, manager=wiring.flipped(self.axi.w), writes=writes.w)
        wiring.connect(m, writes=writes.b, manager=wiring.flipped(self.axi.b))
        return m
