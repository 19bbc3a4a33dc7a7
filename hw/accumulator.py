"""Accumulator memory: the array's results, read-modify-written at one row per cycle.

``config.acc_rows`` rows of ``config.cols`` elements of ``config.acc_bits`` bits (signed when
``config.acc_signed``), wrap-around arithmetic (docs/isa.md). The rows are split into
:data:`ACC_BANKS` banks (bank = row // (acc_rows / ACC_BANKS)) so that the store path can read one
half while the array updates the other: the two halves are the double buffer of output tiles that
``AcceleratorConfig`` guarantees room for. Each bank is one :class:`~amaranth.lib.memory.Memory`
with one write port and one read port (simple dual-port block RAM).

Ports (see docs/arch-memory-sfu.md):

* ``array_write`` — stream of (row, C values, accumulate) from the array controller, accepted every
  cycle (``ready`` is always 1, so the array never stalls for it). ``accumulate`` adds the values
  to the stored row (wrapping), else they overwrite it. Pipelined read-modify-write: every bank's
  requests are registered beside it (as the scratchpad's are), so a beat accepted in cycle t has
  its row read by the block RAM in t+1, the row in the bank's data register in t+3 (a block RAM's
  clock-to-out takes most of a cycle on ECP5, and the block RAM may be far away), the addition in
  t+3, the result in a register in t+4, its write request in the bank's register then and the
  block RAM writes it in t+5. The read sees the writes of its own cycle (transparent port); the
  results of the three beats ahead are forwarded, so back-to-back beats to one row add up exactly.
* ``dma_write`` — stream of (row, C values, element mask) from the DMA (LOAD dst=acc). Waits
  (``ready`` low) while an array beat for the same bank is in stages 1 to 4.
* ``read`` — store-path read port (:func:`~systolic.hw.scratchpad.read_port_signature`): the row
  arrives :data:`~systolic.hw.scratchpad.READ_LATENCY` cycles after the request is accepted (one
  row per cycle while the consumer takes them). A request waits only in a cycle where an
  accumulating array beat reads the same bank, or while READ_LATENCY responses are owed.

All writes take effect in accept order (a DMA write before the array beat accepted in the same
cycle). A ``read`` accepted in cycle n sees the DMA writes accepted up to cycle n and the array
beats accepted up to cycle n - 4 (:data:`WRITE_LATENCY`).
"""

from __future__ import annotations

import functools
import operator

from amaranth import Cat, Module, Mux, Signal, signed, unsigned
from amaranth.hdl import Shape
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In
from amaranth.utils import exact_log2

from .config import AcceleratorConfig
from .scratchpad import (
    READ_LATENCY,
    bank_data_registers,
    drive_read_response,
    read_port_signature,
    select_bank_row,
)

__all__ = [
    "ACC_BANKS", "WRITE_LATENCY", "Accumulator", "acc_elem_shape", "acc_row_layout", "acc_array_write_layout",
    "acc_dma_write_layout",
]

#: Banks of the accumulator: the two halves of the output-tile double buffer.
ACC_BANKS = 2

#: Cycles from accepting an ``array_write`` beat until a ``read`` request accepted then sees its
#: result: a request reaches the block RAM the cycle after its grant, the beat's write-back five
#: cycles after its acceptance (the read ports are transparent).
WRITE_LATENCY = 4


def acc_elem_shape(config: AcceleratorConfig) -> Shape:
    """One accumulator element: ``acc_bits`` wide, signed when ``acc_signed``."""
    return signed(config.acc_bits) if config.acc_signed else unsigned(config.acc_bits)


def acc_row_layout(config: AcceleratorConfig) -> data.ArrayLayout:
    """One accumulator row: ``cols`` elements."""
    return data.ArrayLayout(acc_elem_shape(config), config.acc_row_elems)


def acc_array_write_layout(config: AcceleratorConfig) -> data.StructLayout:
    """Payload of the array's write stream."""
    return data.StructLayout({
        "addr": unsigned(config.acc_addr_bits),
        "data": acc_row_layout(config),
        "accumulate": unsigned(1),      # 1: add to the row; 0: overwrite it
    })


def acc_dma_write_layout(config: AcceleratorConfig) -> data.StructLayout:
    """Payload of the DMA's write stream."""
    return data.StructLayout({
        "addr": unsigned(config.acc_addr_bits),
        "data": acc_row_layout(config),
        "mask": unsigned(config.acc_row_elems),   # bit c enables element c
    })


def _acc_bank_rows(config: AcceleratorConfig) -> int:
    # TODO(lead): an `acc_bank_rows` property in AcceleratorConfig would be the one source.
    return config.acc_rows // ACC_BANKS


class Accumulator(wiring.Component):
    """The accumulator memory with the array's read-modify-write path, a DMA write port and a
    store-path read port.

    Parameters
    ----------
    config : AcceleratorConfig
        Uses ``acc_rows``, ``cols``, ``acc_bits``, ``acc_signed`` and ``acc_addr_bits``.
    """

    def __init__(self, config: AcceleratorConfig) -> None:
        if not isinstance(config, AcceleratorConfig):
            raise TypeError(f"config must be an AcceleratorConfig, not {config!r}")
        self._config = config
        addr = data.StructLayout({"addr": unsigned(config.acc_addr_bits)})
        super().__init__({
            "array_write": In(stream.Signature(acc_array_write_layout(config))),
            "dma_write": In(stream.Signature(acc_dma_write_layout(config))),
            "read": In(read_port_signature(addr, acc_row_layout(config))),
        })

    @property
    def config(self) -> AcceleratorConfig:
        return self._config

    @property
    def read_latency(self) -> int:
        """Cycles from an accepted ``read`` request to its response."""
        return READ_LATENCY

    @property
    def write_latency(self) -> int:
        """:data:`WRITE_LATENCY`, in cycles."""
        return WRITE_LATENCY

    def elaborate(self, platform: object) -> Module:
        cfg = self._config
        m = Module()
        row_layout = acc_row_layout(cfg)
        cols = cfg.acc_row_elems

        index_bits = exact_log2(_acc_bank_rows(cfg))   # row within a bank; the bank is above
        banks = []
        for k in range(ACC_BANKS):
            memory = Memory(shape=row_layout, depth=_acc_bank_rows(cfg), init=[])
            m.submodules[f"bank{k}"] = memory
            # Transparent: a read sees the write of its own cycle (part of the read-modify-write's
            # forwarding); yosys emulates it with one bypass register, half the cost of old-data.
            write_port = memory.write_port(granularity=1)
            banks.append((write_port, memory.read_port(transparent_for=(write_port,))))
        bank_data = bank_data_registers(m, [read_port for _, read_port in banks])

        # -- stage 0 (cycle t): an accumulating array beat reads its row; the store read uses idle
        # banks. Every bank's requests (reads here, writes below) are registered beside the bank:
        # its block RAM reads in cycle t+1, the data is out in t+2 and in the bank's register in t+3.
        beat = self.array_write.payload
        beat_bank = beat.addr[index_bits:]
        beat_reads = self.array_write.valid & beat.accumulate
        req = self.read.req.payload
        req_bank = req.addr[index_bits:]
        grant_read = Signal()
        resp_row = Signal(row_layout)
        free = drive_read_response(m, self.read.resp, grant_read, resp_row)
        m.d.comb += grant_read.eq(self.read.req.valid & free & ~(beat_reads & (beat_bank == req_bank)))
        m.d.comb += [self.read.req.ready.eq(grant_read), self.array_write.ready.eq(1)]
        for k, (_, read_port) in enumerate(banks):
            beat_here = beat_reads & (beat_bank == k)
            m.d.sync += [
                read_port.en.eq(beat_here | (grant_read & (req_bank == k))),
                read_port.addr.eq(Mux(beat_here, beat.addr[:index_bits], req.addr[:index_bits])),
            ]
        select_bank_row(m, bank_data, req_bank, resp_row)

        # -- stages 1 to 3: the beat's (valid, addr, data, accumulate), one register set per stage --
        stages = []
        previous = (self.array_write.valid, beat.addr, beat.data, beat.accumulate)
        for n in range(1, 4):
            stage = (Signal(name=f"s{n}_valid"), Signal.like(beat.addr, name=f"s{n}_addr"),
                     Signal(row_layout, name=f"s{n}_data"), Signal(name=f"s{n}_accumulate"))
            m.d.sync += [register.eq(value) for register, value in zip(stage, previous, strict=True)]
            stages.append(stage)
            previous = stage
        (s1_valid, s1_addr, _, _), (s2_valid, s2_addr, _, s2_accumulate), (s3_valid, s3_addr, s3_data, _) = (
            stages)

        # the results of the beats ahead, newest first: a beat's row is in s4_row the cycle after
        # its add (stage 3), in s5_row the cycle after that (while its write request is registered
        # beside the bank; the block RAM writes it in the next cycle)
        s4_valid, s4_addr, s4_row = Signal(), Signal.like(beat.addr), Signal(row_layout)
        s5_valid, s5_addr, s5_row = Signal(), Signal.like(beat.addr), Signal(row_layout)

        # -- stage 2 (t+2): where stage 3 takes the stored row from. The row was read in t+1 and saw
        # the writes of that cycle (transparent ports): those of the beats accepted up to t-4. The
        # three beats ahead write later, so their results are forwarded, the newest match wins:
        # the one now adding (in s4_row next cycle), or the two before it (in s4_row / s5_row now:
        # chosen here, into `older`). The accumulate flag is folded into the selects (0 + data). --
        newest = Signal()     # stage 3 adds to the result of the beat now in stage 3
        use_older = Signal()  # ... to `older`
        use_bank = Signal(ACC_BANKS)   # ... to the block RAM's row of this bank
        older = Signal(row_layout)
        match = [valid & (addr == s2_addr) for valid, addr in ((s3_valid, s3_addr), (s4_valid, s4_addr),
                                                                (s5_valid, s5_addr))]
        m.d.sync += [
            newest.eq(s2_accumulate & match[0]),
            use_older.eq(s2_accumulate & ~match[0] & (match[1] | match[2])),
            use_bank.eq(Mux(s2_accumulate & ~match[0] & ~match[1] & ~match[2],
                            1 << s2_addr[index_bits:], 0)),
            older.eq(Mux(match[1], s4_row, s5_row)),
        ]

        # -- stage 3 (t+3): add; the old row is an AND-OR of one-hot selects (all 0: overwrite) --
        result = Signal(row_layout)
        for c in range(cols):
            sources = [(newest, s4_row[c]), (use_older, older[c]),
                       *((use_bank[k], bank_data[k][c]) for k in range(ACC_BANKS))]
            old = Signal(acc_elem_shape(cfg), name=f"old{c}")
            m.d.comb += old.eq(functools.reduce(operator.or_, (Mux(sel, value, 0) for sel, value in sources)))
            m.d.comb += result[c].eq(old + s3_data[c])                                   # wraps

        # -- stage 4 (t+4): the result in a register, its write request registered beside the bank;
        # stage 5 (t+5): the block RAM writes it ----------------------------------------------------
        m.d.sync += [
            s4_valid.eq(s3_valid), s4_addr.eq(s3_addr), s4_row.eq(result),
            s5_valid.eq(s4_valid), s5_addr.eq(s4_addr), s5_row.eq(s4_row),
        ]
        s4_bank = s4_addr[index_bits:]

        # A DMA write waits while an array beat for its bank is past stage 0 (so it never needs
        # forwarding and never meets a write-back); a beat in stage 0 reads it transparently (the
        # beat's read and the DMA's write reach the block RAM in the same cycle).
        dma = self.dma_write.payload
        dma_bank = dma.addr[index_bits:]
        busy = Cat(*(valid & (addr[index_bits:] == dma_bank)
                     for valid, addr in ((s1_valid, s1_addr), (s2_valid, s2_addr), (s3_valid, s3_addr),
                                         (s4_valid, s4_addr))))
        grant_dma = Signal()
        m.d.comb += [
            grant_dma.eq(self.dma_write.valid & ~busy.any()),
            self.dma_write.ready.eq(grant_dma),
        ]
        for k, (write_port, _) in enumerate(banks):
            enable = Signal.like(write_port.en, name=f"bank{k}_write_en")
            m.d.comb += write_port.en.eq(enable)
            with m.If(s4_valid & (s4_bank == k)):
                m.d.sync += [
                    write_port.addr.eq(s4_addr[:index_bits]),
                    write_port.data.eq(s4_row),
                    enable.eq((1 << cols) - 1),
                ]
            with m.Elif(grant_dma & (dma_bank == k)):
                m.d.sync += [
                    write_port.addr.eq(dma.addr[:index_bits]),
                    write_port.data.eq(dma.data),
                    enable.eq(dma.mask),
                ]
            with m.Else():
                m.d.sync += enable.eq(0)
        return m
