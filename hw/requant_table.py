"""Requantize table: per-channel (bias, multiplier, shift) entries for the SFU.

``config.requant_table_rows`` rows of ``config.cols`` entries; entry ``c`` of a row serves output
channel ``c`` of a STORE whose ``qrow`` names the row (docs/isa.md, STORE). The DMA writes entries
(LOAD ``dst=table``, with an element mask); the store unit reads one row at the start of a STORE and
keeps the response pending (``resp.valid`` high, ``resp.ready`` low) while the SFU uses it, so the
row stays on ``resp.payload`` without any extra register.

Ports (see docs/arch-memory-sfu.md):

* ``write`` — stream of (row address, C entries, C-bit element mask). Always ready: the table has
  its own write port, nothing competes with it. Written entries are readable from the next cycle.
* ``read`` — a :func:`~systolic.hw.scratchpad.read_port_signature` port: ``req`` carries a row
  address, ``resp`` returns the row exactly :data:`READ_LATENCY` cycle after ``req`` is accepted.
  ``req`` is accepted whenever no response is pending or the pending one is taken in the same cycle.
  A read sees a write of the same cycle (transparent); a pending response does not change.
"""

from __future__ import annotations

from amaranth import Module, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In

from ..sim.arith import MAX_SHIFT, MULT_BITS
from .config import AcceleratorConfig
from .scratchpad import READ_LATENCY, drive_read_response, read_port_signature

__all__ = ["REQUANT_ENTRY", "RequantTable", "requant_row_layout", "requant_write_layout"]

#: One channel's requantize entry: int32 bias, int32 multiplier, shift 0..62 (6 bits).
REQUANT_ENTRY = data.StructLayout({
    "bias": signed(32),
    "mult": signed(MULT_BITS),
    "shift": unsigned(MAX_SHIFT.bit_length()),
})


def requant_row_layout(config: AcceleratorConfig) -> data.ArrayLayout:
    """One table row: ``config.cols`` entries of :data:`REQUANT_ENTRY` (70 bits each)."""
    return data.ArrayLayout(REQUANT_ENTRY, config.cols)


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
        return READ_LATENCY

    def elaborate(self, platform: object) -> Module:
        cfg = self._config
        m = Module()

        m.submodules.memory = memory = Memory(shape=requant_row_layout(cfg), depth=_table_depth(cfg),
                                              init=[])
        write_port = memory.write_port(granularity=1)
        read_port = memory.read_port(transparent_for=(write_port,))   # cheapest collision rule

        m.d.comb += [
            write_port.addr.eq(self.write.payload.addr),
            write_port.data.eq(self.write.payload.data),
            self.write.ready.eq(1),
        ]
        with m.If(self.write.valid):
            m.d.comb += write_port.en.eq(self.write.payload.mask)

        # The only reader: the port's data register keeps the row while no new read is enabled,
        # so a pending response needs no hold register.
        free = ~self.read.resp.valid | self.read.resp.ready
        granted = self.read.req.valid & free
        m.d.comb += [
            self.read.req.ready.eq(granted),
            read_port.addr.eq(self.read.req.payload.addr),
            read_port.en.eq(granted),
        ]
        drive_read_response(m, self.read.resp, granted, read_port.data, hold=False)
        return m
