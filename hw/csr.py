"""Control and status registers on an AXI4-Lite subordinate port.

The register map is defined once here (:data:`REGISTERS`); ``systolic generate`` writes it to JSON
and the RTL runner and host drivers read it from there. All registers are 32 bits; each counter is
two registers, low word first, whatever its width (``config.counter_bits``, 16 to 64: the bits
above it read 0). Reading the low word of a counter latches its high word, so a 64-bit read is
consistent; the counters share one latch, so a counter's high word must be read right after its
low word (with no other counter's low word read in between).
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .axi import RESP_OKAY, RESP_SLVERR, AXI4LiteSignature

__all__ = ["Register", "REGISTERS", "COUNTERS", "ERROR_CODES", "CSR_ADDR_BITS", "CSRBank", "register_map"]

CSR_ADDR_BITS = 8


@dataclass(frozen=True)
class Register:
    name: str
    offset: int          # bytes
    access: str          # "rw", "ro", "wo" (write-only strobes)
    doc: str


#: Performance counters (64-bit each), in register order.
COUNTERS = (
    ("cycles", "cycles since start until done"),
    ("load_busy", "cycles the load unit executed an instruction"),
    ("compute_busy", "cycles the compute unit executed an instruction"),
    ("store_busy", "cycles the store unit executed an instruction"),
    ("array_active", "cycles the MAC array accepted an input row"),
    ("macs", "multiply-accumulates performed (m*k*n per COMPUTE)"),
    ("stall_load_token", "cycles the load queue head waited for a token"),
    ("stall_compute_token", "cycles the compute queue head waited for a token"),
    ("stall_store_token", "cycles the store queue head waited for a token"),
    ("stall_dispatch", "cycles the dispatcher waited for a full queue"),
    ("stall_fetch", "cycles the dispatcher waited for an instruction from DRAM"),
    ("dram_read_bytes", "bus bytes (beats x bus width) read by LOADs and residual reads, fetch excluded"),
    ("dram_write_bytes", "bus bytes (beats x bus width) written by STOREs"),
    ("instructions", "instructions dispatched"),
)

#: Values of STATUS.error
ERROR_CODES = {
    0: "none",
    1: "illegal instruction (bad opcode, reserved bits or a field out of range)",
    2: "AXI SLVERR on a DMA or fetch access",
    3: "AXI DECERR on a DMA or fetch access",
    4: "illegal dependency flags for the instruction's queue",
    5: "the program ended (prog_len instructions) without FINISH",
}


def _registers() -> tuple[Register, ...]:
    regs = [
        Register("ctrl", 0x00, "wo", "bit 0: start (prog_addr, dram_base must be set); bit 1: soft reset"),
        Register("status", 0x04, "ro", "bit 0: busy, bit 1: done, bits 7:4: error code (ERROR_CODES)"),
        Register("error_pc", 0x08, "ro", "index of the instruction that raised the error"),
        Register("prog_addr", 0x0C, "rw", "byte address of the first instruction word in DRAM"),
        Register("dram_base", 0x10, "rw", "added to every DRAM address in LOAD and STORE"),
        Register("config_hash_lo", 0x14, "ro", "config hash, low 32 bits"),
        Register("config_hash_hi", 0x18, "ro", "config hash, high 32 bits"),
        Register("pc", 0x1C, "ro", "index of the next instruction to dispatch"),
        Register("prog_len", 0x20, "rw", "instructions in the program (the fetcher reads no further)"),
    ]
    offset = 0x40
    for name, doc in COUNTERS:
        regs.append(Register(f"{name}_lo", offset, "ro", doc + " (low word; latches the high word)"))
        regs.append(Register(f"{name}_hi", offset + 4, "ro", doc + " (high word)"))
        offset += 8
    assert offset <= 1 << CSR_ADDR_BITS
    return tuple(regs)


REGISTERS = _registers()
_BY_NAME = {r.name: r for r in REGISTERS}
_COUNTER_NAMES = {name for name, _ in COUNTERS}


def register_map() -> dict[str, dict[str, object]]:
    """JSON-ready register map."""
    return {r.name: {"offset": r.offset, "access": r.access, "doc": r.doc} for r in REGISTERS}


class CSRBank(wiring.Component):
    """AXI4-Lite register file of the accelerator.

    Ports toward the core: ``start``/``soft_reset`` pulses, ``prog_addr``, ``dram_base``,
    ``busy``/``done``/``error``/``error_pc``/``pc`` status inputs, one ``counter_bits``-bit input
    per counter (``counter_<name>``), and the constant config hash. Unknown addresses answer
    SLVERR. The high word of the counter whose low word was read last is latched (one latch of
    ``counter_bits`` - 32 flip-flops for all of them); with ``counter_bits`` <= 32 it reads 0.
    """

    def __init__(self, config_hash: int, *, counter_bits: int = 64):
        if not isinstance(counter_bits, int) or not 1 <= counter_bits <= 64:
            raise ValueError(f"counter_bits must be an integer between 1 and 64, not {counter_bits!r}")
        self.config_hash = config_hash
        self.counter_bits = counter_bits
        members = {
            "bus": In(AXI4LiteSignature(addr_width=CSR_ADDR_BITS)),
            "start": Out(1),
            "soft_reset": Out(1),
            "prog_addr": Out(32),
            "dram_base": Out(32),
            "prog_len": Out(32),
            "busy": In(1),
            "done": In(1),
            "error": In(4),
            "error_pc": In(32),
            "pc": In(32),
        }
        for name, _ in COUNTERS:
            members[f"counter_{name}"] = In(counter_bits)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        bus = self.bus

        # reads: one outstanding, answered the cycle after the address
        high_bits = max(0, self.counter_bits - 32)
        latched_hi = Signal(high_bits)
        read_value = Signal(32)
        read_resp = Signal(2)
        with m.If(bus.r.valid & bus.r.ready):
            m.d.sync += bus.r.valid.eq(0)
        m.d.comb += bus.ar.ready.eq(~bus.r.valid)
        with m.If(bus.ar.valid & bus.ar.ready):
            m.d.sync += [bus.r.valid.eq(1), bus.r.payload.data.eq(read_value),
                         bus.r.payload.resp.eq(read_resp)]
        m.d.comb += read_resp.eq(RESP_OKAY)
        word = bus.ar.payload.addr[2:]
        with m.Switch(word):
            for reg in REGISTERS:
                with m.Case(reg.offset >> 2):
                    m.d.comb += read_value.eq(self._read_source(reg, latched_hi))
                    if high_bits and reg.name.endswith("_lo") and reg.name[:-3] in _COUNTER_NAMES:
                        name = reg.name[:-3]
                        with m.If(bus.ar.valid & bus.ar.ready):
                            m.d.sync += latched_hi.eq(getattr(self, f"counter_{name}")[32:])
                    if reg.access == "wo":
                        m.d.comb += read_value.eq(0)
            with m.Default():
                m.d.comb += read_resp.eq(RESP_SLVERR)
        with m.If(bus.ar.payload.addr[:2] != 0):
            m.d.comb += read_resp.eq(RESP_SLVERR)

        # writes: address and data may arrive in any order; both are held until the response
        aw_addr = Signal(CSR_ADDR_BITS)
        aw_full = Signal()
        w_data = Signal(32)
        w_strb = Signal(4)
        w_full = Signal()
        m.d.comb += [bus.aw.ready.eq(~aw_full), bus.w.ready.eq(~w_full)]
        with m.If(bus.aw.valid & bus.aw.ready):
            m.d.sync += [aw_addr.eq(bus.aw.payload.addr), aw_full.eq(1)]
        with m.If(bus.w.valid & bus.w.ready):
            m.d.sync += [w_data.eq(bus.w.payload.data), w_strb.eq(bus.w.payload.strb), w_full.eq(1)]
        with m.If(bus.b.valid & bus.b.ready):
            m.d.sync += bus.b.valid.eq(0)
        with m.If(aw_full & w_full & ~bus.b.valid):
            m.d.sync += [aw_full.eq(0), w_full.eq(0), bus.b.valid.eq(1)]
            ok = Signal()
            m.d.comb += ok.eq(1)
            with m.Switch(aw_addr[2:]):
                with m.Case(_BY_NAME["ctrl"].offset >> 2):
                    m.d.comb += [self.start.eq(w_data[0] & w_strb[0]),
                                 self.soft_reset.eq(w_data[1] & w_strb[0])]
                for name in ("prog_addr", "dram_base", "prog_len"):
                    with m.Case(_BY_NAME[name].offset >> 2):
                        reg = getattr(self, name)
                        for b in range(4):
                            with m.If(w_strb[b]):
                                m.d.sync += reg.word_select(b, 8).eq(w_data.word_select(b, 8))
                with m.Default():
                    m.d.comb += ok.eq(0)
            with m.If(aw_addr[:2] != 0):
                m.d.comb += ok.eq(0)
            m.d.sync += bus.b.payload.resp.eq(Mux(ok, RESP_OKAY, RESP_SLVERR))
        return m

    def _read_source(self, reg: Register, latched_hi: Signal):
        name = reg.name
        if name == "status":
            return self.busy | (self.done << 1) | (self.error << 4)
        if name == "error_pc":
            return self.error_pc
        if name == "pc":
            return self.pc
        if name in ("prog_addr", "dram_base", "prog_len"):
            return getattr(self, name)
        if name == "config_hash_lo":
            return self.config_hash & 0xFFFF_FFFF
        if name == "config_hash_hi":
            return self.config_hash >> 32
        if name == "ctrl":
            return 0
        base = name[:-3]
        if name.endswith("_lo"):
            return getattr(self, f"counter_{base}")[:32]
        return latched_hi

