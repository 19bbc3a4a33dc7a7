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
  to the stored row (wrapping), else they overwrite it. Pipelined read-modify-write over four
  cycles: read the row (cycle t, when the beat is accepted), register it (t+1; a block RAM's
  clock-to-out takes most of a cycle on ECP5), add (t+2), write back (t+3). The read sees the
  writes of cycle t (transparent port); the results of the two beats ahead are forwarded, so
  back-to-back beats to one row add up exactly.
* ``dma_write`` — stream of (row, C values, element mask) from the DMA (LOAD dst=acc). Waits
  (``ready`` low) while an array beat for the same bank is in stages 1 to 3.
* ``read`` — store-path read port (:func:`~systolic.hw.scratchpad.read_port_signature`): the row
  arrives :data:`~systolic.hw.scratchpad.READ_LATENCY` cycles after the request is accepted (one
  row per cycle while the consumer takes them). A request waits only in a cycle where an
  accumulating array beat reads the same bank, or while READ_LATENCY responses are owed.

All writes take effect in accept order (a DMA write before the array beat accepted in the same
cycle). A ``read`` accepted in cycle n sees the DMA writes accepted up to cycle n and the array
beats accepted up to cycle n - 3 (:data:`WRITE_LATENCY`).
"""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal, signed, unsigned
from amaranth.hdl import Shape
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In
from amaranth.utils import exact_log2

from .config import AcceleratorConfig
from .scratchpad import READ_LATENCY, drive_read_response, read_port_signature

__all__ = [
    "ACC_BANKS", "WRITE_LATENCY", "Accumulator", "acc_elem_shape", "acc_row_layout", "acc_array_write_layout",
    "acc_dma_write_layout",
]

#: Banks of the accumulator: the two halves of the output-tile double buffer.
ACC_BANKS = 2

#: Cycles from accepting an ``array_write`` beat until a ``read`` request accepted then sees its
#: result: the write-back cycle (the read ports are transparent).
WRITE_LATENCY = 3


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

        # -- stage 0: an accumulating array beat reads its row; the store read uses idle banks --
        beat = self.array_write.payload
        beat_bank = beat.addr[index_bits:]
        beat_reads = self.array_write.valid & beat.accumulate
        req = self.read.req.payload
        req_bank = req.addr[index_bits:]
        grant_read = Signal()
        resp_row = Signal(row_layout)         # the bank's read data, two cycles after grant_read
        free = drive_read_response(m, self.read.resp, grant_read, resp_row)
        m.d.comb += grant_read.eq(self.read.req.valid & free & ~(beat_reads & (beat_bank == req_bank)))
        m.d.comb += [self.read.req.ready.eq(grant_read), self.array_write.ready.eq(1)]
        for k, (_, read_port) in enumerate(banks):
            beat_here = beat_reads & (beat_bank == k)
            m.d.comb += [
                read_port.en.eq(beat_here | (grant_read & (req_bank == k))),
                read_port.addr.eq(Mux(beat_here, beat.addr[:index_bits], req.addr[:index_bits])),
            ]

        # -- store-path response: each bank's read data into a register with no logic before it,
        # the row selected from those registers two cycles after the grant --------------------------
        bank_data = [Signal(row_layout, name=f"bank{k}_data") for k in range(len(banks))]
        for register, (_, read_port) in zip(bank_data, banks, strict=True):
            m.d.sync += register.eq(read_port.data)
        bank_read = Signal.like(req_bank)           # the bank requested last cycle
        bank_registered = Signal.like(req_bank)     # ... and the cycle before: its data is registered
        m.d.sync += [bank_read.eq(req_bank), bank_registered.eq(bank_read)]
        with m.Switch(bank_registered):
            for k, register in enumerate(bank_data):
                with m.Case(k):
                    m.d.comb += resp_row.eq(register)

        # -- stage 1: the block RAM's row goes straight into a register (its clock-to-out is most
        # of a cycle on ECP5); the forwarding decisions for stage 2 are made here ----------------
        s1_valid = Signal()
        s1_addr = Signal.like(beat.addr)
        s1_data = Signal(row_layout)
        s1_accumulate = Signal()
        m.d.sync += [
            s1_valid.eq(self.array_write.valid),
            s1_addr.eq(beat.addr),
            s1_data.eq(beat.data),
            s1_accumulate.eq(beat.accumulate),
        ]
        read_row = Signal(row_layout)
        with m.Switch(s1_addr[index_bits:]):
            for k, (_, read_port) in enumerate(banks):
                with m.Case(k):
                    m.d.comb += read_row.eq(read_port.data)

        # -- stage 2: add. The row was read in stage 0, seeing the writes of that cycle (the ports
        # are transparent); the two beats ahead (in stages 2 and 3 then) write back later, so their
        # results are forwarded: the nearer one wins. ----------------------------------------------
        s2_valid = Signal()
        s2_addr = Signal.like(beat.addr)
        s2_data = Signal(row_layout)
        s2_accumulate = Signal()
        stored = Signal(row_layout)
        s3_valid = Signal()
        s3_addr = Signal.like(beat.addr)
        s3_row = Signal(row_layout)          # stage 2's result, written back in stage 3
        written_row = Signal(row_layout)     # stage 3's row, written back the cycle before
        from_s3 = Signal()                   # stage 2's beat needs the row now in stage 3
        from_written = Signal()              # ... or the row written back last cycle
        m.d.sync += [
            s2_valid.eq(s1_valid),
            s2_addr.eq(s1_addr),
            s2_data.eq(s1_data),
            s2_accumulate.eq(s1_accumulate),
            stored.eq(read_row),
            from_s3.eq(s2_valid & (s2_addr == s1_addr)),
            from_written.eq(s3_valid & (s3_addr == s1_addr)),
        ]
        result = Signal(row_layout)
        for c in range(cols):
            old = Mux(from_s3, s3_row[c], Mux(from_written, written_row[c], stored[c]))
            m.d.comb += result[c].eq(Mux(s2_accumulate, old + s2_data[c], s2_data[c]))  # wraps

        # -- stage 3: write back from a register -----------------------------------------------------
        m.d.sync += [
            s3_valid.eq(s2_valid),
            s3_addr.eq(s2_addr),
            s3_row.eq(result),
            written_row.eq(s3_row),
        ]
        s3_bank = s3_addr[index_bits:]

        # A DMA write waits while an array beat for its bank is past stage 0 (so it never needs
        # forwarding and never meets a write-back); a beat in stage 0 reads it transparently.
        dma = self.dma_write.payload
        dma_bank = dma.addr[index_bits:]
        busy = Cat(*(valid & (addr[index_bits:] == dma_bank)
                     for valid, addr in ((s1_valid, s1_addr), (s2_valid, s2_addr), (s3_valid, s3_addr))))
        grant_dma = Signal()
        m.d.comb += [
            grant_dma.eq(self.dma_write.valid & ~busy.any()),
            self.dma_write.ready.eq(grant_dma),
        ]
        for k, (write_port, _) in enumerate(banks):
            with m.If(s3_valid & (s3_bank == k)):
                m.d.comb += [
                    write_port.addr.eq(s3_addr[:index_bits]),
                    write_port.data.eq(s3_row),
                    write_port.en.eq((1 << cols) - 1),
                ]
            with m.Elif(grant_dma & (dma_bank == k)):
                m.d.comb += [
                    write_port.addr.eq(dma.addr[:index_bits]),
                    write_port.data.eq(dma.data),
                    write_port.en.eq(dma.mask),
                ]
        return m
