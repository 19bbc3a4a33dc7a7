"""Requantize table: per-channel (bias, multiplier, shift) entries for the SFU.

``config.requant_table_rows`` rows of ``config.cols`` entries; entry ``c`` of a row serves output
channel ``c`` of a STORE whose ``qrow`` names the row (docs/isa.md, STORE). The DMA writes entries
(LOAD ``dst=table``, with an element mask). A row is ``config.requant_table_words`` (W) memory
words of :func:`requant_word_bits` bits (the row's bits in order, the last word padded; word k of
row r at address r * 2**ceil(log2 W) + k).

How the SFU reads it depends on ``config.sfu_engine``:

* ``"pipelined"``: a word is one lane group (``config.sfu_lanes`` entries; W =
  ``config.sfu_row_cycles``), and the SFU reads the group it needs every cycle through ``lookup``
  (a synchronous read: the group's entries one cycle after the row and group are given). No row
  is held anywhere: a one-lane SFU takes 70 wires from the block RAM, not the row's C x 70.
* ``"serial"``: ``read``, one row per STORE into registers (word by word with W > 1: narrower and
  deeper block RAMs, on iCE40 a 16 x 70-bit-entry x 2-channel table is one 256 x 16 RAM instead of
  nine, at W cycles per row read), the response pending while the STORE runs.

Ports (see docs/arch-memory-sfu.md):

* ``write`` — stream of (row address, group, the group's ``table_load_entries`` entries, their
  element mask): :func:`requant_write_layout`. The table has its own write port, nothing
  competes with it: with W = 1 a row is accepted in the cycle it is written; with
  W > 1 one word is written per cycle, from the first word holding an enabled entry to the last,
  and the row is accepted with the last (the payload held as the stream requires): a LOAD of one
  lane group's entries takes one cycle. Written entries are readable from the next cycle.
* ``lookup`` (pipelined SFU) — :func:`lookup_signature`: ``row`` and ``group`` in, ``entries``
  (the group's ``sfu_lanes`` entries) out the next cycle, every cycle.
* ``read`` (serial SFU) — a :func:`~systolic.hw.scratchpad.read_port_signature` port: ``req``
  carries a row address, ``resp`` returns the row :data:`TABLE_READ_LATENCY` (2) cycles after
  ``req`` is accepted, from registers. One response at a time (the table is read once per STORE):
  ``req`` is accepted whenever no response is owed or the pending one is taken in the same cycle
  (with W words: in the cycle it reads the last word, the W - 1 earlier words read in the cycles
  before, from the first cycle it could have been accepted), so back-to-back reads are W + 1
  cycles apart; a pending response does not change.

A read sees a write of the same cycle word by word in simulation (transparent; undefined on an
FPGA built by ``systolic synth``, hw/rtlil.py): the ISA's token rules order a LOAD of a table row
and every STORE reading it, before or after it (docs/isa.md), so neither port ever reads a row
while it is written.
"""

from __future__ import annotations

from typing import Any

from amaranth import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.hdl import Shape
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..sim.arith import MAX_SHIFT, MULT_BITS
from .config import AcceleratorConfig
from .isa import Memory as Destination
from .rtlil import UNDEFINED_COLLISION
from .scratchpad import read_port_signature

__all__ = ["REQUANT_ENTRY", "TABLE_READ_LATENCY", "RequantTable", "lane_group_shape", "lookup_signature",
           "requant_group_layout", "requant_row_layout", "requant_word_bits", "requant_write_layout",
           "table_group_shape", "table_load_fields"]

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


def requant_group_layout(config: AcceleratorConfig) -> data.ArrayLayout:
    """One lane group of a row: ``config.sfu_lanes`` entries (channels ``g * sfu_lanes`` on of
    group ``g``)."""
    return data.ArrayLayout(REQUANT_ENTRY, config.sfu_lanes)


def lane_group_shape(config: AcceleratorConfig) -> Shape:
    """The index of a lane group within a row (0 to ``config.sfu_row_cycles`` - 1): the table's
    ``lookup.group`` and the pipelined SFU's ``param_group``."""
    return unsigned((config.sfu_row_cycles - 1).bit_length())


def table_group_shape(config: AcceleratorConfig) -> Shape:
    """The index of a table LOAD's group of ``config.table_load_entries`` entries within a row
    (0 to ``cols // table_load_entries`` - 1): the table write's ``group`` and the LOAD unit's,
    carried with each LOAD in flight."""
    return unsigned((config.cols // config.table_load_entries - 1).bit_length())


def lookup_signature(config: AcceleratorConfig) -> wiring.Signature:
    """The pipelined SFU's read port of the table, from the reader's side: ``row`` and ``group``
    (a lane group, 0 to ``sfu_row_cycles`` - 1; no such member when there is one group) out,
    ``entries`` (:func:`requant_group_layout`) in, one cycle after the row and group that name
    them."""
    members = {"row": Out(unsigned(config.requant_addr_bits))}
    if config.sfu_row_cycles > 1:
        members["group"] = Out(lane_group_shape(config))
    return wiring.Signature(members | {"entries": In(requant_group_layout(config))})


def requant_word_bits(config: AcceleratorConfig) -> int:
    """Width of one memory word of the table: a row's bits over ``config.requant_table_words``
    words, rounded up, bits (with the pipelined SFU exactly one lane group's entries)."""
    return -(-Shape.cast(requant_row_layout(config)).width // config.requant_table_words)


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
    """Payload of the table's DMA write stream: one aligned group of E =
    ``config.table_load_entries`` entries of a row (what one table LOAD may write there): row
    address, ``group`` (the group's index, entries ``group * E`` on; no such field when E is the
    whole row), the E entries and their mask (bit j enables entry j of the group)."""
    entries = config.table_load_entries
    fields: dict[str, Any] = {"addr": unsigned(config.requant_addr_bits)}
    if entries < config.cols:
        fields["group"] = table_group_shape(config)
    return data.StructLayout(fields | {
        "data": data.ArrayLayout(REQUANT_ENTRY, entries),
        "mask": unsigned(entries),
    })


class RequantTable(wiring.Component):
    """The SFU's requantize table (one simple dual-port block RAM, ``cols`` x 70 bits a row).

    Parameters
    ----------
    config : AcceleratorConfig
        Uses ``cols``, ``requant_table_rows``, ``requant_table_words`` and ``sfu_engine`` (which
        read port: ``lookup`` for the pipelined SFU, ``read`` for the serial one).
    """

    def __init__(self, config: AcceleratorConfig) -> None:
        if not isinstance(config, AcceleratorConfig):
            raise TypeError(f"config must be an AcceleratorConfig, not {config!r}")
        self._config = config
        members = {"write": In(stream.Signature(requant_write_layout(config)))}
        if config.sfu_engine == "pipelined":
            members["lookup"] = In(lookup_signature(config))
        else:
            addr = data.StructLayout({"addr": unsigned(config.requant_addr_bits)})
            members["read"] = In(read_port_signature(addr, requant_row_layout(config)))
        super().__init__(members)

    @property
    def config(self) -> AcceleratorConfig:
        return self._config

    @property
    def read_latency(self) -> int:
        """Cycles from an accepted ``read`` request to its response (``lookup``: 1)."""
        return TABLE_READ_LATENCY if self._config.sfu_engine == "serial" else 1

    def elaborate(self, platform: object) -> Module:
        cfg = self._config
        m = Module()
        words = cfg.requant_table_words
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
        # between the block RAM and its reader; simulation reads the new word
        read_port = memory.read_port(transparent_for=(write_port,))
        self._write(m, write_port)
        if cfg.sfu_engine == "pipelined":
            # every cycle the group named the cycle before, straight from the block RAM
            lookup = self.lookup
            m.d.comb += [
                read_port.addr.eq(Cat(lookup.group, lookup.row) if words > 1 else lookup.row),
                lookup.entries.eq(read_port.data),
            ]
        else:
            self._read_rows(m, read_port)
        return m

    def _write(self, m: Module, write_port: Any) -> None:
        cfg = self._config
        words = cfg.requant_table_words
        payload = self.write.payload
        group = cfg.table_load_entries          # entries a write carries, an aligned group
        # entry c of the row is entry c % group of the payload, enabled when its group is the
        # payload's and its mask bit set
        row_mask = Signal(cfg.cols)
        m.d.comb += row_mask.eq(Cat(*(payload.mask[c % group] & (payload.group == c // group)
                                      if group < cfg.cols else payload.mask[c] for c in range(cfg.cols))))
        group_bits = payload.data.as_value()
        row_bits = group_bits.replicate(cfg.cols // group)
        if words == 1:
            m.d.comb += [
                write_port.addr.eq(payload.addr),
                write_port.data.eq(row_bits),
                self.write.ready.eq(1),
            ]
            with m.If(self.write.valid):
                m.d.comb += write_port.en.eq(row_mask)
            return
        width = requant_word_bits(cfg)
        entry_bits = Shape.cast(REQUANT_ENTRY).width
        padded = words * width
        # bit b of the row is written when its entry's mask bit is set
        enables = Signal(padded)
        m.d.comb += enables.eq(Cat(*(row_mask[c].replicate(entry_bits) for c in range(cfg.cols))))
        # the words holding an enabled entry, the first and the last of them (0 and 0 if none)
        used = Signal(words)
        m.d.comb += used.eq(Cat(*(enables[k * width:(k + 1) * width].any() for k in range(words))))
        first = Signal(range(words))
        last = Signal(range(words))
        for k in reversed(range(words)):
            with m.If(used[k]):
                m.d.comb += first.eq(k)
        for k in range(words):
            with m.If(used[k]):
                m.d.comb += last.eq(k)
        # one word per cycle from the first to the last, the row accepted with the last
        started = Signal()                      # the row's first word has been written
        following = Signal(range(words))        # the word after the one written last cycle
        current = Signal(range(words))
        done = Signal()
        m.d.comb += [current.eq(Mux(started, following, first)), done.eq(current == last)]
        lanes = cfg.sfu_lanes
        if cfg.sfu_engine == "pipelined" and group >= lanes:
            # a word is a lane group, and the write's group holds group / lanes of them, in order
            per_write = group // lanes
            index = current[:(per_write - 1).bit_length()]
            word = group_bits.word_select(index, width) if per_write > 1 else group_bits
        elif cfg.sfu_engine == "pipelined":
            word = group_bits.replicate(lanes // group)      # the group's place in the word is enabled
        else:
            word = Cat(row_bits, Const(0, padded - len(row_bits))).word_select(current, width)
        m.d.comb += [
            write_port.addr.eq(Cat(current, payload.addr)),
            write_port.data.eq(word),
            self.write.ready.eq(done),
        ]
        with m.If(self.write.valid):
            m.d.comb += write_port.en.eq(enables.word_select(current, width))
            m.d.sync += [started.eq(~done), following.eq(current + 1)]

    def _read_rows(self, m: Module, read_port: Any) -> None:
        """The serial SFU's ``read`` port: the row into registers (with W words, word by word as
        read); the response comes from them the cycle after (TABLE_READ_LATENCY), so the block
        RAM's clock-to-output and the SFU's use of the entries are in different cycles. One
        response at a time: a request is accepted (with its last word) only while no response is
        owed or one is taken."""
        cfg = self._config
        words = cfg.requant_table_words
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
            granted = self.read.req.valid & free
            m.d.comb += [
                self.read.req.ready.eq(granted),
                read_port.addr.eq(self.read.req.payload.addr),
                read_port.en.eq(granted),
            ]
            m.d.sync += fetched.eq(granted)
            with m.If(fetched):
                m.d.sync += row.eq(read_port.data)
            return

        # word k into register k the cycle after it is read; the request is accepted with the last
        # word, whose register completes the row (fetched)
        width = requant_word_bits(cfg)
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
