"""Banked, double-buffered scratchpad for the array's A and B operands.

``config.spad_rows`` rows of ``config.spad_row_elems`` raw elements of ``config.spad_elem_bits``
bits, split into ``config.scratchpad_banks`` banks of ``config.spad_bank_rows`` rows: row ``r`` is
row ``r % spad_bank_rows`` of bank ``r // spad_bank_rows``. Each bank is one
:class:`~systolic.hw.bankram.BankRAM` with one write port and one read port: simple dual-port
block RAM (iCE40 SB_RAM40_4K, ECP5 DP16KD with its output register).

Ports (see docs/arch-memory-sfu.md):

* ``write`` — stream of (row address, row, element mask) from the DMA. Always ready: every bank has
  its own write port, so a write never waits, whichever banks the readers use. Bit ``e`` of the
  mask enables element ``e``; masked-off elements keep their value.
* ``read_a``, ``read_b`` — read ports for the array's A and B operands
  (:func:`read_port_signature`): ``req`` carries a row address, ``resp`` returns the row
  :data:`READ_LATENCY` cycles after ``req`` was accepted (later only while an earlier
  response waits) and holds it until taken; READ_LATENCY requests may be outstanding, so a
  port reads one row per cycle. Reads and writes reach a bank's block RAM through registers
  beside it, one cycle after they are accepted, so a read sees the writes accepted up to its own
  cycle.

Arbitration: a bank serves one read per cycle. When ``read_a`` and ``read_b`` request the same bank
in the same cycle, one waits (``req.ready`` low); the winner alternates between conflicts
(round-robin), so neither starves and each gets half the bank's rate. Requests to different banks,
and the write, proceed in the same cycle at full rate. A read of a row written in the same cycle
returns the new contents in simulation (transparent) and is undefined on an FPGA built by
``systolic synth`` (hw/rtlil.py: no collision logic before the bank registers); the ISA's token
rules forbid such an unordered pair anyway.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from typing import Any

from amaranth import Cat, Module, Mux, Signal, unsigned
from amaranth.hdl import ShapeLike, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from .bankram import BankRAM
from .config import AcceleratorConfig
from .dsp import COPY_GROUP_BITS, fabric_register, group_enables, is_ecp5

__all__ = [
    "READ_LATENCY", "DIRECT_READ_LATENCY", "LOAD_GROUP_BITS", "read_latency", "Scratchpad",
    "read_port_signature", "drive_read_response", "bank_data_registers", "select_bank_row", "spad_row_layout",
    "spad_write_layout",
]

#: Cycles from an accepted read request to its response, for the scratchpad's and the
#: accumulator's read ports. Every bank's requests (reads and writes alike, so their order is kept)
#: are registered beside the bank: the block RAM reads in the cycle after the grant, so the
#: arbitration's logic and the route to a block RAM across the die are in different cycles. The
#: block RAM's read data goes through two registers of its bank (:func:`bank_data_registers`),
#: then through the bank select into the response register: the block RAM's clock-to-output
#: and the route to the consumer (across the die on large FPGAs) are in different cycles too.
READ_LATENCY = 5
#: ... without those registers (``memory_registers = false``, for small, slow FPGAs): the grant
#: goes straight to the bank, whose block RAM reads at the end of the grant's cycle, and its read
#: data goes through the bank select into the response register.
DIRECT_READ_LATENCY = 2
#: Bits of a read-response entry loaded under one copy of the arriving row's register
#: (:func:`drive_read_response`).
LOAD_GROUP_BITS = COPY_GROUP_BITS


def read_latency(config: AcceleratorConfig) -> int:
    """Cycles from an accepted read request to its response on the scratchpad's and the
    accumulator's read ports for ``config``: :data:`READ_LATENCY` with ``memory_registers``, else
    :data:`DIRECT_READ_LATENCY`."""
    return READ_LATENCY if config.memory_registers else DIRECT_READ_LATENCY


def read_port_signature(addr_layout: ShapeLike, data_layout: ShapeLike) -> wiring.Signature:
    """A memory read port, seen from the requester: ``req`` (an address stream) goes out,
    ``resp`` (a data stream) comes in. A memory block has ``In(read_port_signature(...))``.

    Protocol: a request accepted in cycle t has its response valid from cycle t + L, the memory's
    ``read_latency`` (:data:`READ_LATENCY` for the scratchpad and the accumulator,
    ``TABLE_READ_LATENCY`` for the requantize table), or from the cycle after the
    previous response was taken if that is later; the response stays valid, unchanged, until
    ``resp.ready``. Responses come in request order.
    A port may accept a request while earlier responses are pending; with ``resp.ready`` held
    high it accepts one request per cycle.
    """
    return wiring.Signature({
        "req": Out(stream.Signature(addr_layout)),
        "resp": In(stream.Signature(data_layout)),
    })


def drive_read_response(m: Module, resp: stream.Interface, granted: Value, row: Value,
                        latency: int = READ_LATENCY, depth: int | None = None, *,
                        decoupled: bool = False, platform: Any = None) -> Value:
    """Drive the response stream of a read port whose memory was read for it in the cycles where
    ``granted`` is high; ``row`` is the data of that read ``latency`` - 1 cycles later (the
    memory and the registers after it are not held: they may serve someone else after that;
    :func:`select_bank_row` makes such a ``row``). ``latency`` is the port's read latency
    (:func:`read_latency`), at least 2.

    The rows go into a ring of ``depth`` (default ``latency``) registers: an arriving row is
    written into the entry after the last one written (a one-hot ``tail`` register), the response
    is the entry a one-hot ``head`` register names (an AND-OR of the entries' registers), and a
    take moves only ``head`` and the entries' valid bits: no entry register is loaded by the
    consumer's handshake (a shifting queue's entries were, all of them, through the take: that
    enable, a net to every bit of the queue made from the consumer's ``ready``, was the critical
    path of the 16x16 ULX3S SoC, docs/boards.md). Every entry's load enable is a register
    (below). At most ``depth`` responses are owed (in flight or
    queued), so with ``depth = latency`` a port reads one row per cycle while its consumer takes
    one per cycle, and a response comes ``latency`` cycles after its request when the ones before
    it have been taken. A smaller ``depth`` (at least 1) saves its registers for a consumer that
    reads one row at a time. ``resp.valid`` is a register.

    With ``decoupled``, ``free`` is a register: it does not count this cycle's take, so
    ``resp.ready`` has no combinational path to the grant (the consumer's handshake and the
    memory's arbitration are in different cycles), and the grant logic starts at a flip-flop
    (the count of rows owed is a register too, kept from each cycle's grant and take); the queue
    then has one register more (default ``depth`` ``latency`` + 1), which keeps one request per
    cycle.

    An entry loads in groups of :data:`LOAD_GROUP_BITS` bits, each group under a register of
    its own (``fabric_register``: on ECP5 ``platform`` a ``TRELLIS_FF`` that yosys does not merge
    back) that says, a cycle ahead, that a row arrives and goes into that entry (the row one
    stage from arriving, and ``tail``'s next value): no logic lies between a register and the
    entries' load enables, and no net reaches every bit of a row (the net from one register of
    the arrival to the 530 load enables of the 16x16 accumulator's response took 10.8 ns on the
    ULX3S-85F; at 5393477 the AND of a copy of that register with ``tail``, into 64 enables of
    the scratchpad's port A, 12.8 ns, the compute clock's critical path: docs/boards.md).

    Returns ``free``: high in a cycle where a request may be granted; the caller's ``granted``
    must imply it.
    """
    assert latency >= 2, latency
    depth = latency + decoupled if depth is None else depth
    assert 1 <= depth <= latency + decoupled, depth
    name = resp.valid.name
    delay = latency - 1
    in_flight = [Signal(name=f"{name}_in_flight{k}") for k in range(delay)]   # granted k+1 ago
    m.d.sync += [in_flight[0].eq(granted), *(in_flight[k].eq(in_flight[k - 1]) for k in range(1, delay))]
    arrives = in_flight[-1]
    rows = [Signal.like(row, name=f"{name}_queue{k}") for k in range(depth)]
    head = Signal(depth, init=1, name=f"{name}_head")      # one-hot: the entry that is the response
    tail = Signal(depth, init=1, name=f"{name}_tail")      # one-hot: the entry the next row goes into
    entries = Signal(depth, name=f"{name}_entries")        # bit k: entry k holds a row not yet taken
    # a take, as the ring sees it: `resp.valid` equals `entries.any()` in every cycle (it is the
    # register of `entries_next.any()`, below, as `entries` is of `entries_next`), so the ring's
    # logic reads its own entries and `resp.valid`'s loads are the consumer's alone. A consumer's
    # `ready` is commonly made from `resp.valid`: with the ring's logic on it too, `resp.valid` ->
    # the consumer's take -> the ring's state was a round trip between the two within a cycle (on
    # the 16x16 ULX3S SoC at 0aae96b scratchpad port A's
    # `resp.valid` at column 76 -> the compute unit's take at column 20 -> the ring's entries at
    # column 78, 13.2 ns, 11.5 of them routing, docs/boards.md); now each way is a path of its own
    taken = Signal(name=f"{name}_taken")
    m.d.comb += taken.eq(entries.any() & resp.ready)
    if decoupled:
        # the count of rows owed and free are registers, kept from this cycle's grant and take:
        # the grant logic starts at a flip-flop (the same values as counting the in-flight and
        # queued rows). Their next values are chosen by the grant and the take among values
        # made from the count alone (one more, one fewer, the same): no adder or comparison
        # after the grant (on the 16x16 SoC at c9b81ec the other port's grant into this count's
        # carry chains and the comparison after them was the compute clock's critical path,
        # 12.9 ns). The count is a thermometer code (bit k: more than k rows owed), so those
        # values are shifts and bits, no arithmetic for yosys to share back into one adder.
        free = Signal(name=f"{name}_free", init=1)
        owing = Signal(depth + 1, name=f"{name}_owing")        # at most depth rows are owed
        more, fewer = granted & ~taken, taken & ~granted
        # owed + 1 < depth: no more than depth - 2 owed; owed - 1 < depth: no more than depth
        free_if_more = ~owing[depth - 2] if depth >= 2 else 0
        m.d.sync += [
            owing.eq(Mux(more, Cat(1, owing[:-1]), Mux(fewer, owing[1:], owing))),
            free.eq(Mux(more, free_if_more, Mux(fewer, ~owing[depth], ~owing[depth - 1]))),
        ]
    else:
        free = Signal(name=f"{name}_free")
        owed = Signal(range(2 * depth + 1), name=f"{name}_owed")
        m.d.comb += [
            owed.eq(sum(in_flight) + sum(entries[k] for k in range(depth))),
            free.eq((owed < depth) | taken),
        ]

    def after(one_hot: Value) -> Value:   # the next entry round the ring
        return Cat(one_hot[-1], one_hot[:-1])

    # an arriving row always finds its entry free: at most `depth` rows are owed; each group of
    # an entry's bits loads under a register of its own, made a cycle ahead (the docstring): a
    # row arrives in the next cycle (`before`) into the entry `tail` names then (`tail_next`)
    width = len(Value.cast(row))
    before = in_flight[-2] if delay >= 2 else granted
    tail_next = Mux(arrives, after(tail), tail)
    for k in range(depth):
        for bits, load in group_enables(m, f"{name}_load{k}_", before & tail_next[k], width,
                                        platform=platform):
            with m.If(load):
                m.d.sync += Value.cast(rows[k])[bits].eq(Value.cast(row)[bits])
    head_next = Mux(taken, after(head), head)
    entries_next = (entries & ~Mux(taken, head, 0)) | Mux(arrives, tail, 0)
    m.d.sync += [
        head.eq(head_next),
        tail.eq(tail_next),
        entries.eq(entries_next),
        resp.valid.eq(entries_next.any()),     # the entries in use run on from head
    ]
    m.d.comb += resp.payload.eq(functools.reduce(operator.or_, (
        Mux(head[k], Value.cast(rows[k]), 0) for k in range(depth))) if depth > 1 else rows[0])
    return free


def bank_data_registers(m: Module, banks: Sequence[BankRAM], registered: bool = True) -> list[Value]:
    """One more register per bank after its :class:`~systolic.hw.bankram.BankRAM`'s registered
    read data (``read_data``: a register beside the block RAM, its output register on ECP5),
    taking it every cycle; returns them. A block RAM's clock-to-output is most of a cycle on ECP5
    (5.8 ns) and the block RAM may be far from the logic that uses its rows, so the route is in a
    cycle of its own. A read presented to a bank in cycle t (its request registered in t-1) is in
    the bank's register in cycle t+3. Without ``registered`` (``memory_registers = false``) the
    banks' read data themselves."""
    if not registered:
        return [bank.read_data for bank in banks]
    registers = []
    for k, bank in enumerate(banks):
        register = Signal.like(bank.read_data, name=f"bank{k}_data")
        m.d.sync += register.eq(bank.read_data)
        registers.append(register)
    return registers


def select_bank_row(m: Module, bank_data: Sequence[Value], bank: Value, row: Value,
                    latency: int = READ_LATENCY, *, platform: Any = None) -> None:
    """Drive ``row`` (combinationally) with the entry of :func:`bank_data_registers` of the
    bank that ``bank`` named ``latency`` - 1 cycles ago: the cycle of the grant, whose request
    reached the block RAM one cycle later (in the same cycle without the memory registers); the
    row :func:`drive_read_response` expects.

    On ECP5 (``platform``) a row wider than :data:`~systolic.hw.dsp.COPY_GROUP_BITS` is chosen in
    groups of that many bits, each by a copy of its own of the last register of ``bank``
    (``fabric_register``, which yosys does not merge back), so that no register drives the
    multiplexer of every bit (on the 16x16 ULX3S SoC at cb80062 the one register of scratchpad
    port A's bank, 5.8 ns from its multiplexer and that 4.2 ns from the response ring, ended
    the compute clock's critical path, docs/boards.md)."""
    name = getattr(Value.cast(row), "name", "row")
    delayed = bank
    # the request is registered, the block RAM reads, its data is out, in the bank's registered
    # read data, in the bank data register; without the memory registers: the block RAM reads
    stages = ("requested", "read", "out", "registered") if latency == READ_LATENCY else ("read",)
    assert len(stages) == latency - 1, latency
    *early, last = stages
    for stage in early:
        later = Signal.like(bank, name=f"{name}_bank_{stage}")
        m.d.sync += later.eq(delayed)
        delayed = later
    width = len(Value.cast(row))
    groups = [slice(low, min(low + COPY_GROUP_BITS, width)) for low in range(0, width, COPY_GROUP_BITS)]
    if is_ecp5(platform) and len(groups) > 1:
        selects = [Cat(*(fabric_register(m, f"{name}_bank_{last}{g}_{b}", delayed[b], init=0,
                                         platform=platform) for b in range(len(Value.cast(bank)))))
                   for g in range(len(groups))]
    else:
        later = Signal.like(bank, name=f"{name}_bank_{last}")
        m.d.sync += later.eq(delayed)
        selects = [later] * len(groups)
    for bits, select in zip(groups, selects, strict=True):
        with m.Switch(select):
            for k, register in enumerate(bank_data):
                with m.Case(k):
                    m.d.comb += Value.cast(row)[bits].eq(Value.cast(register)[bits])


def spad_row_layout(config: AcceleratorConfig) -> data.ArrayLayout:
    """One scratchpad row: ``spad_row_elems`` raw elements of ``spad_elem_bits`` bits."""
    return data.ArrayLayout(unsigned(config.spad_elem_bits), config.spad_row_elems)


def spad_write_layout(config: AcceleratorConfig) -> data.StructLayout:
    """Payload of the scratchpad's DMA write stream."""
    return data.StructLayout({
        "addr": unsigned(config.spad_addr_bits),      # scratchpad row
        "data": spad_row_layout(config),
        "mask": unsigned(config.spad_row_elems),      # bit e enables element e
    })


def _spad_addr_layout(config: AcceleratorConfig) -> data.StructLayout:
    return data.StructLayout({"addr": unsigned(config.spad_addr_bits)})


class Scratchpad(wiring.Component):
    """The operand scratchpad: one write port (DMA) and two read ports (A and B operands).

    Parameters
    ----------
    config : AcceleratorConfig
        Uses ``spad_rows``, ``spad_row_elems``, ``spad_elem_bits``, ``scratchpad_banks``,
        ``spad_bank_rows`` and ``spad_addr_bits``.
    """

    def __init__(self, config: AcceleratorConfig) -> None:
        if not isinstance(config, AcceleratorConfig):
            raise TypeError(f"config must be an AcceleratorConfig, not {config!r}")
        self._config = config
        read = read_port_signature(_spad_addr_layout(config), spad_row_layout(config))
        super().__init__({
            "write": In(stream.Signature(spad_write_layout(config))),
            "read_a": In(read),
            "read_b": In(read),
        })

    @property
    def config(self) -> AcceleratorConfig:
        return self._config

    @property
    def read_latency(self) -> int:
        """Cycles from an accepted read request to its response (:func:`read_latency`)."""
        return read_latency(self._config)

    def elaborate(self, platform: object) -> Module:
        cfg = self._config
        m = Module()

        index_bits = exact_log2(cfg.spad_bank_rows)   # row within a bank; the bank is above
        registered = cfg.memory_registers
        latency = read_latency(cfg)
        # requests registered beside the banks, or straight to them
        to_bank = m.d.sync if registered else m.d.comb
        banks = []
        for k in range(cfg.scratchpad_banks):
            # no read of a row in the cycle it is written (the ISA's token rules): its result is
            # left undefined on an FPGA (hw/bankram.py); simulation reads the new row
            bank = BankRAM(spad_row_layout(cfg), cfg.spad_bank_rows, transparent=True,
                           registered=registered)
            m.submodules[f"bank{k}"] = bank
            banks.append(bank)

        # -- write: the DMA owns every bank's write port; the write is registered beside the bank
        # (as the reads are, so a read still sees the writes accepted up to its own cycle) --------
        write = self.write.payload
        m.d.comb += self.write.ready.eq(1)
        for k, bank in enumerate(banks):
            enable = Signal.like(bank.write_en, name=f"bank{k}_write_en")
            to_bank += [
                bank.write_addr.eq(write.addr[:index_bits]),
                bank.write_data.eq(write.data),
                enable.eq(Mux(self.write.valid & (write.addr[index_bits:] == k), write.mask, 0)),
            ]
            m.d.comb += bank.write_en.eq(enable)

        # -- reads: A and B share each bank's read port ---------------------------------------
        a, b = self.read_a, self.read_b
        a_bank = a.req.payload.addr[index_bits:]
        b_bank = b.req.payload.addr[index_bits:]
        grant_a = Signal()
        grant_b = Signal()
        row_a = Signal(spad_row_layout(cfg))     # the bank's read data, four cycles after a grant
        row_b = Signal(spad_row_layout(cfg))
        # decoupled: the array's handshake (resp.ready) does not reach the A/B arbitration and
        # the compute unit's request counters in the same cycle (timing)
        free_a = drive_read_response(m, a.resp, grant_a, row_a, latency, decoupled=True, platform=platform)
        free_b = drive_read_response(m, b.resp, grant_b, row_b, latency, decoupled=True, platform=platform)
        want_a = a.req.valid & free_a
        want_b = b.req.valid & free_b
        conflict = want_a & want_b & (a_bank == b_bank)
        prefer_b = Signal()     # who wins the next conflict; flips after each conflict
        m.d.comb += [
            grant_a.eq(want_a & ~(conflict & prefer_b)),
            grant_b.eq(want_b & ~(conflict & ~prefer_b)),
            a.req.ready.eq(grant_a),
            b.req.ready.eq(grant_b),
        ]
        with m.If(conflict):
            m.d.sync += prefer_b.eq(~prefer_b)

        for k, bank in enumerate(banks):
            a_here = grant_a & (a_bank == k)
            b_here = grant_b & (b_bank == k)
            to_bank += [
                bank.read_en.eq(a_here | b_here),
                bank.read_addr.eq(Mux(a_here, a.req.payload.addr[:index_bits],
                                      b.req.payload.addr[:index_bits])),
            ]

        # the request registered beside the bank (cycle t+1: the block RAM reads), each bank's read
        # data through the BankRAM's register and the bank data register (t+2, t+3); a port's row
        # is selected from the latter four cycles after its grant (without the memory registers:
        # the block RAM reads at the end of the grant's cycle, its data is selected in the next)
        bank_data = bank_data_registers(m, banks, registered)
        select_bank_row(m, bank_data, a_bank, row_a, latency, platform=platform)
        select_bank_row(m, bank_data, b_bank, row_b, latency, platform=platform)
        return m
