"""Requantize table: per-channel (bias, multiplier, shift) entries for the SFU.

``config.requant_table_rows`` rows of ``config.cols`` entries; entry ``c`` of a row serves output
channel ``c`` of a STORE whose ``qrow`` names the row (docs/isa.md, STORE). The DMA writes entries
(LOAD ``dst=table``, with an element mask); the store unit reads one row at the start of a STORE and
keeps the response pending (``resp.valid`` high, ``resp.ready`` low) while the SFU uses it.

A row is ``config.requant_row_words`` memory words of :func:`requant_word_bits` bits (the row's
bits in order, the last word padded). A row read goes into registers, word by word, and the
response comes from them. With W > 1 words, narrower and deeper block RAMs (on iCE40 a 16 x
70-bit-entry x 2-channel table is one 256 x 16 RAM instead of nine) cost W cycles per row written
or read.

Ports (see docs/arch-memory-sfu.md):

* ``write`` — stream of (row address, C entries, C-bit element mask). The table has its own write
  port, nothing competes with it: a row is accepted in the cycle it writes its last word (every
  cycle with one word per row; otherwise after W - 1 cycles writing the earlier words, the payload
  held as the stream requires). Written entries are readable from the next cycle.
* ``read`` — a :func:`~systolic.hw.scratchpad.read_port_signature` port: ``req`` carries a row
  address, ``resp`` returns the row :data:`TABLE_READ_LATENCY` (2) cycles after ``req`` is
  accepted, from registers. One response at a time (the table is read once per
  STORE): ``req`` is accepted whenever no response is owed or the pending one is taken in the same
  cycle (with W words: in the cycle it reads the last word, the W - 1 earlier words read in the
  cycles before, from the first cycle it could have been accepted), so back-to-back reads are
  W + 1 cycles apart. A read sees a write of the same cycle word by word in simulation
  (transparent; undefined on an FPGA built by ``systolic synth``, hw/rtlil.py: the ISA's token
  rules order a LOAD of the table and a STORE reading it); a pending response does not change.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.hdl import Shape, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In

from ..sim.arith import MAX_SHIFT, MULT_BITS
from .config import AcceleratorConfig
from .isa import Memory as Destination
from .rtlil import UNDEFINED_COLLISION
from .scratchpad import read_port_signature

__all__ = ["REQUANT_ENTRY", "TABLE_READ_LATENCY", "RequantTable", "requant_row_layout", "requant_word_bits",
           "requant_write_layout", "table_load_fields"]

#: One channel's requantize entry: int32 bias, int32 multiplier, shift 0..62 (6 bits).
REQUANT_ENTRY = data.StructLayout({
    "bias": signed(32),
    "mult": signed(MULT_BITS),
    "shift": unsigned(MAX_SHIFT.bit_length()),
})
#: Cycles from an accepted read request to its response: the block RAM's read data goes straight
#: into the response registers (the operand and accumulator ports, whose rows also pass a bank
#: select, take :data:`~systolic.hw.scratchpad.READ_LATENCY`).
TABLE_READ_LATENCY = 2


def requant_row_layout(config: AcceleratorConfig) -> data.ArrayLayout:
    """One table row: ``config.cols`` entries of :data:`REQUANT_ENTRY` (70 bits each)."""
    return data.ArrayLayout(REQUANT_ENTRY, config.cols)


def requant_word_bits(config: AcceleratorConfig) -> int:
    """Width of one memory word of the table: a row's bits over ``config.requant_row_words``
    words, rounded up, bits."""
    return -(-Shape.cast(requant_row_layout(config)).width // config.requant_row_words)


def table_load_fields(config: AcceleratorConfig, *, dram_addr: int, dst_addr: int,
                      rows: int) -> list[dict[str, int]]:
    """The fields of the LOADs (docs/isa.md) that copy ``rows`` whole requantize-table rows,
    stored one after another at ``dram_addr`` (``cols`` entries of ``requant_entry_bytes`` each),
    into table rows ``dst_addr`` on: one LOAD per aligned group of ``config.table_load_entries``
    entries, the most one table LOAD may write in a row (one LOAD when that is the whole row)."""
    group, size = config.table_load_entries, config.requant_entry_bytes
    return [{"dst": Destination.TABLE.value, "dst_addr": dst_addr, "dst_col": first,
             "dram_addr": dram_addr + first * size, "pitch_c": size, "rows_outer": 1,
             "rows_inner": rows, "inner_dc": config.cols, "segs": 1, "seg_len": group, "elem_dc": 1}
            for first in range(0, config.cols, group)]


def _table_depth(config: AcceleratorConfig) -> int:
    # A one-row table is built with two rows so that addresses are never zero bits wide (Verilog
    # has no empty vectors); row 1 is never addressed by a valid STORE, and costs no block RAM.
    return max(2, config.requant_table_rows)


def requant_write_layout(config: AcceleratorConfig) -> data.StructLayout:
    """Payload of the table's DMA write stream: row address, entries, element mask (bit c
    enables entry c)."""
    return data.StructLayout({
        "addr": unsigned(config.requant_addr_bits),
        "data": requant_row_layout(config),
        "mask": unsigned(config.cols),
    })


class RequantTable(wiring.Component):
    """The SFU's requantize table (one simple dual-port block RAM, ``cols`` x 70 bits wide).

    Parameters
    ----------
    config : AcceleratorConfig
        Uses ``cols`` and ``requant_table_rows``.
    """

    def __init__(self, config: AcceleratorConfig) -> None:
        if not isinstance(config, AcceleratorConfig):
            raise TypeError(f"config must be an AcceleratorConfig, not {config!r}")
        self._config = config
        addr = data.StructLayout({"addr": unsigned(config.requant_addr_bits)})
        super().__init__({
            "write": In(stream.Signature(requant_write_layout(config))),
            "read": In(read_port_signature(addr, requant_row_layout(config))),
        })

    @property
    def config(self) -> AcceleratorConfig:
        return self._config

    @property
    def read_latency(self) -> int:
        """Cycles from an accepted read request to its response."""
        return TABLE_READ_LATENCY

    def elaborate(self, platform: object) -> Module:
        cfg = self._config
        m = Module()
        words = cfg.requant_row_words
        if words == 1:
            memory = Memory(shape=requant_row_layout(cfg), depth=_table_depth(cfg), init=[],
                            attrs={UNDEFINED_COLLISION: 1})
        else:
            # word k of row r at address r * 2**word_index_bits + k: no multiplier for the address
            memory = Memory(shape=requant_word_bits(cfg), depth=_table_depth(cfg) << (words - 1).bit_length(),
                            init=[], attrs={UNDEFINED_COLLISION: 1})
        m.submodules.memory = memory
        write_port = memory.write_port(granularity=1)
        # a STORE never reads a row that a LOAD writes in the same cycle (the token rules order
        # them): synthesis leaves that result undefined (hw/rtlil.py), so no bypass logic sits
        # between the block RAM and the row registers; simulation reads the new word
        read_port = memory.read_port(transparent_for=(write_port,))
        # -- read: the row goes into registers (with W words, word by word as read); the response
        # comes from them the cycle after (TABLE_READ_LATENCY), so the block RAM's clock-to-output and
        # the SFU's use of the entries are in different cycles. One response at a time: a request
        # is accepted (with its last word) only while no response is owed or one is taken.
        resp = self.read.resp
        fetched = Signal()                  # the accepted request's last word was read last cycle
        free = ~fetched & (~resp.valid | resp.ready)
        with m.If(fetched):
            m.d.sync += resp.valid.eq(1)
        with m.Elif(resp.ready):
            m.d.sync += resp.valid.eq(0)
        row = Signal(requant_row_layout(cfg))
        m.d.comb += resp.payload.eq(row)
        if words == 1:
            m.d.comb += [
                write_port.addr.eq(self.write.payload.addr),
                write_port.data.eq(self.write.payload.data),
                self.write.ready.eq(1),
            ]
            with m.If(self.write.valid):
                m.d.comb += write_port.en.eq(self.write.payload.mask)

            granted = self.read.req.valid & free
            m.d.comb += [
                self.read.req.ready.eq(granted),
                read_port.addr.eq(self.read.req.payload.addr),
                read_port.en.eq(granted),
            ]
            m.d.sync += fetched.eq(granted)
            with m.If(fetched):
                m.d.sync += row.eq(read_port.data)
            return m

        width = requant_word_bits(cfg)
        entry_bits = Shape.cast(REQUANT_ENTRY).width
        padded = words * width

        def word_of(row: Value, index: Value) -> Value:
            """Word ``index`` of a row's bits (zero-padded)."""
            bits = Cat(row, Const(0, padded - len(row)))
            return bits.word_select(index, width)

        # -- write: one word per cycle while the row is offered, accepted with its last word
        write_word = Signal(range(words))
        last_write = write_word == words - 1
        # bit b of the row is written when its entry's mask bit is set
        mask = self.write.payload.mask
        enables = Cat(*(mask[c].replicate(entry_bits) for c in range(cfg.cols)),
                      Const(0, padded - cfg.cols * entry_bits))
        m.d.comb += [
            write_port.addr.eq(Cat(write_word, self.write.payload.addr)),
            write_port.data.eq(word_of(self.write.payload.data.as_value(), write_word)),
            self.write.ready.eq(last_write),
        ]
        with m.If(self.write.valid):
            m.d.comb += write_port.en.eq(enables.word_select(write_word, width))
            m.d.sync += write_word.eq(Mux(last_write, 0, write_word + 1))
        with m.Else():
            m.d.sync += write_word.eq(0)

        # -- read: word k into register k the cycle after it is read; the request is accepted with
        # the last word, whose register completes the row (fetched)
        read_word = Signal(range(words))
        last_read = read_word == words - 1
        reading = self.read.req.valid & free
        granted = reading & last_read
        m.d.comb += [
            self.read.req.ready.eq(granted),
            read_port.addr.eq(Cat(read_word, self.read.req.payload.addr)),
            read_port.en.eq(reading),
        ]
        with m.If(reading):
            m.d.sync += read_word.eq(Mux(last_read, 0, read_word + 1))
        with m.Else():
            m.d.sync += read_word.eq(0)
        was_reading = Signal()
        previous = Signal(range(words))          # the word read last cycle, if was_reading
        m.d.sync += [was_reading.eq(reading), previous.eq(read_word), fetched.eq(granted)]
        registers = [Signal(width, name=f"row_word{k}") for k in range(words)]
        for k, register in enumerate(registers):
            with m.If(was_reading & (previous == k)):
                m.d.sync += register.eq(read_port.data)
        m.d.comb += row.eq(Cat(*registers)[:len(row.as_value())])
        return m
