"""Control and status registers on an AXI4-Lite subordinate port.

The register map is defined once here (:data:`REGISTERS`); ``systolic generate`` writes it to JSON
and the RTL runner and host drivers read it from there. All registers are 32 bits; each counter is
two registers, low word first, whatever its width (``config.counter_bits``, 16 to 64: the bits
above it read 0). Reading the low word of a counter latches its high word, so a 64-bit read is
consistent; the counters share one latch, so a counter's high word must be read right after its
low word (with no other counter's low word read in between). The counters are kept in a memory
(:class:`CSRBank`): exact once STATUS.done is set, a few cycles behind while a program runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .axi import RESP_OKAY, RESP_SLVERR, AXI4LiteSignature
from .rtlil import UNDEFINED_COLLISION

__all__ = ["Register", "REGISTERS", "COUNTERS", "ERROR_CODES", "CORE_FAULT", "NO_FIRMWARE", "CSR_ADDR_BITS",
           "FW_ADDR_BITS", "CSRBank", "register_map"]

CSR_ADDR_BITS = 8
#: Width of fw_addr: word indices of a core RAM of up to 256 KiB.
FW_ADDR_BITS = 16


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
    ("stall_fetch", "cycles the dispatcher waited for an instruction word's next beat from DRAM"),
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
    6: "the firmware control's core stopped on a fault (a firmware bug); ERROR_PC holds the core's "
       "byte address of the faulting instruction",
    7: "start without firmware: load the core's RAM (fw_addr, fw_data) and set CTRL bit 2 first",
}
#: The error whose ERROR_PC is the core's byte address, not an instruction index.
CORE_FAULT = 6
#: Start under firmware control before the core's RAM holds a firmware.
NO_FIRMWARE = 7


def _registers() -> tuple[Register, ...]:
    regs = [
        Register("ctrl", 0x00, "wo", "bit 0: start (prog_addr, dram_base must be set); bit 1: soft reset; "
                                     "bit 2: firmware loaded (fw_addr, fw_data)"),
        Register("status", 0x04, "ro", "bit 0: busy, bit 1: done, bit 2: firmware ready (firmware "
                                       "control; 0 under hardware control), bits 7:4: error code "
                                       "(ERROR_CODES)"),
        Register("error_pc", 0x08, "ro", "index of the instruction that raised the error"),
        Register("prog_addr", 0x0C, "rw", "byte address of the first instruction word in DRAM"),
        Register("dram_base", 0x10, "rw", "added to every DRAM address in LOAD and STORE"),
        Register("config_hash_lo", 0x14, "ro", "config hash, low 32 bits"),
        Register("config_hash_hi", 0x18, "ro", "config hash, high 32 bits"),
        Register("pc", 0x1C, "ro", "index of the next instruction to dispatch"),
        Register("prog_len", 0x20, "rw", "instructions in the program (the fetcher reads no further; taken "
                                         "at start, at most dram_bytes / 64)"),
        Register("fw_addr", 0x24, "rw", "firmware control with a loaded core RAM: word index the next "
                                        "fw_data write goes to (reads 0, writes ignored under hardware "
                                        "control)"),
        Register("fw_data", 0x28, "wo", "firmware control with a loaded core RAM: a word of the core's "
                                        "RAM image, written at fw_addr, which then advances (firmware "
                                        "ready drops until CTRL bit 2)"),
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
    """AXI4-Lite register file of the accelerator, with the performance counters.

    Ports toward the core: ``start``/``soft_reset`` pulses (registered: high for one cycle, the
    one in which the write's response becomes valid), ``prog_addr``, ``dram_base``,
    ``busy``/``done``/``error``/``error_pc``/``pc`` status inputs, and per counter its increment in
    this cycle (``increment_<name>``, ``increment_bits[name]`` bits, 1 by default). Unknown
    addresses answer SLVERR.

    With ``firmware`` (``control = "firmware"``), the firmware loading ports: each FW_DATA write
    is a ``fw_write`` pulse with ``fw_write_addr`` (FW_ADDR, which then advances) and
    ``fw_write_data``; CTRL bit 2 pulses ``fw_loaded``; STATUS bit 2 reads ``fw_ready``. Without
    it FW_ADDR reads 0, the FW_* writes do nothing and STATUS bit 2 reads 0.

    The counters (``counter_bits`` wide, wrapping) live in a memory of one word per counter (block
    RAM on iCE40, distributed RAM on ECP5), not in flip-flops, so that neither their adders nor the
    read multiplexer grow with their number: each counter gathers its increments in a short
    *pending* counter, and an update pipeline visits the counters in turn, one per cycle, adding
    the pending count to the memory word (the low and the high 32 bits in two cycles, so no carry
    chain is longer than 32 bits). ``settled`` is high when every increment so far is in the
    memory: it takes at most ``2 * len(COUNTERS) + 4`` cycles after the increments stop, so
    ``done`` should reach the host only with ``settled`` (the top level does that). ``start``
    and ``soft_reset`` clear the counters (each reads 0 until the pipeline's next visit writes it).
    The core takes the pulses a cycle late (through registers of its own): STATUS reads as after
    the pulse from the cycle of the pulse on (busy after start, idle after soft reset, done and
    error clear), and the counters stay clear in the cycle after the pulse too.

    A counter's low word is read from the memory: the host's read takes the pipeline's turn in
    the cycle after its address (or later, while the pipeline writes that counter: the memory
    never reads a row in the cycle it writes it, which synthesis leaves undefined), and answers
    two or more cycles later than other registers; its high word is latched at the same time:
    one latch of ``counter_bits`` - 32 flip-flops for all counters, none with ``counter_bits``
    <= 32 (the high words read 0).
    """

    def __init__(self, config_hash: int, *, counter_bits: int = 64,
                 increment_bits: dict[str, int] | None = None, firmware: bool = False):
        if not isinstance(counter_bits, int) or not 1 <= counter_bits <= 64:
            raise ValueError(f"counter_bits must be an integer between 1 and 64, not {counter_bits!r}")
        increment_bits = dict(increment_bits or {})
        for name, bits in increment_bits.items():
            if name not in _COUNTER_NAMES:
                raise ValueError(f"increment_bits names counters ({', '.join(n for n, _ in COUNTERS)}), "
                                 f"not {name!r}")
            if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 32:
                raise ValueError(f"increment_bits[{name!r}] must be an integer between 1 and 32, "
                                 f"not {bits!r}")
        self.config_hash = config_hash
        self.firmware = bool(firmware)
        self.counter_bits = counter_bits
        self.increment_bits = {name: increment_bits.get(name, 1) for name, _ in COUNTERS}
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
            "settled": Out(1),
            # firmware control: the core's RAM image from the host, word by word
            "fw_write": Out(1), "fw_write_addr": Out(FW_ADDR_BITS), "fw_write_data": Out(32),
            "fw_loaded": Out(1), "fw_ready": In(1),
        }
        for name, _ in COUNTERS:
            members[f"increment_{name}"] = In(self.increment_bits[name])
        super().__init__(members)

    @staticmethod
    def pending_bits(increment_bits: int) -> int:
        """Width of a counter's pending count: the increments of the longest gap between two
        visits of the update pipeline (``2 * len(COUNTERS) + 2`` cycles: host reads of counters
        take at most every other turn)."""
        return (((1 << increment_bits) - 1) * (2 * len(COUNTERS) + 2)).bit_length()

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        bits = self.counter_bits
        # read by _read_source; without firmware control FW_ADDR reads 0 and the FW_* writes do
        # nothing (no logic)
        self._fw_addr = Signal(FW_ADDR_BITS, name="fw_addr") if self.firmware else Const(0, FW_ADDR_BITS)
        count = len(COUNTERS)
        # the core takes start and soft_reset through registers of its own (the top level's reset
        # distribution), a cycle after these pulses: until it has, the status reads as it will be
        # then, and the counters stay clear
        starting, resetting = Signal(), Signal()
        m.d.sync += [starting.eq(self.start), resetting.eq(self.soft_reset)]
        pulses = (Signal(name="start_pending"), Signal(name="reset_pending"))
        m.d.comb += [pulses[0].eq(self.start | starting), pulses[1].eq(self.soft_reset | resetting)]
        clear = Signal()
        m.d.comb += clear.eq(pulses[0] | pulses[1])

        # -- counters: pending counts, memory, update pipeline ----------------------------------
        # no row is read in the cycle it is written (the pipeline visits another counter then;
        # a host read waits a cycle instead), so synthesis needs no logic for it (hw/rtlil.py)
        m.submodules.counters = counters = Memory(shape=bits, depth=count, init=[],
                                                  attrs={UNDEFINED_COLLISION: 1})
        rp = counters.read_port()
        wp = counters.write_port()
        self._counter_ports = (rp, wp)       # for the tests
        slot = Signal(range(count))          # the counter the pipeline visits this cycle
        host_read = Signal()                 # the host reads a counter's low word: it has the port
        host_index = Signal(range(count))    # ... of this counter
        advance = Signal()
        m.d.comb += [advance.eq(~host_read), rp.addr.eq(Mux(host_read, host_index, slot))]
        with m.If(advance):
            m.d.sync += slot.eq(Mux(slot == count - 1, 0, slot + 1))

        # a counter is stale from a clear until the pipeline writes it: it reads as 0
        stale = Signal(count, init=(1 << count) - 1)
        pending = []
        arriving = []
        for index, (name, _) in enumerate(COUNTERS):
            # the increment is registered first (dropped in a clear, as it would be in the
            # pending count): the array's input handshake and the units' states reach no adder
            raw_increment = getattr(self, f"increment_{name}")
            increment = Signal.like(raw_increment, name=f"arriving_{name}")
            m.d.sync += increment.eq(Mux(clear, 0, raw_increment))
            arriving.append(increment)
            p = Signal(self.pending_bits(len(increment)), name=f"pending_{name}")
            pending.append(p)
            with m.If(clear):
                m.d.sync += p.eq(0)
            with m.Elif(advance & (slot == index)):
                m.d.sync += p.eq(increment)          # the visit takes what came before
            with m.Else():
                m.d.sync += p.eq(p + increment)
        delta = Signal(max(len(p) for p in pending))
        with m.Switch(slot):
            for index, p in enumerate(pending):
                with m.Case(index):
                    m.d.comb += delta.eq(p)

        # stage 1: the memory word arrives; low half + pending count
        valid1, valid2 = Signal(), Signal()
        addr1, addr2 = Signal(range(count)), Signal(range(count))
        delta1 = Signal(len(delta))
        stale1 = Signal()
        m.d.sync += [valid1.eq(advance & ~clear), addr1.eq(slot), delta1.eq(delta),
                     stale1.eq(stale.bit_select(slot, 1))]
        base = Signal(bits)
        m.d.comb += base.eq(Mux(stale1, 0, rp.data))
        lo_bits = min(32, bits)
        lo_sum = Signal(lo_bits + 1)
        m.d.comb += lo_sum.eq(base[:lo_bits] + delta1[:lo_bits])
        # stage 2: high half + carry, write back
        lo2 = Signal(lo_bits)
        m.d.sync += [valid2.eq(valid1 & ~clear), addr2.eq(addr1), lo2.eq(lo_sum[:lo_bits])]
        if bits > lo_bits:
            hi2 = Signal(bits - lo_bits)
            carry2 = Signal()
            hi_delta = delta1[lo_bits:] if len(delta1) > lo_bits else 0
            m.d.sync += [hi2.eq(base[lo_bits:] + hi_delta), carry2.eq(lo_sum[lo_bits])]
            word = Cat(lo2, hi2 + carry2)
        else:
            word = lo2
        m.d.comb += [wp.addr.eq(addr2), wp.data.eq(word), wp.en.eq(valid2 & ~clear)]
        with m.If(clear):
            m.d.sync += stale.eq((1 << count) - 1)
        with m.Elif(valid2):
            m.d.sync += stale.bit_select(addr2, 1).eq(0)
        # the pipeline runs all the time; a turn changes a word only if it adds a count (or
        # clears a stale word, which keeps `stale` nonzero until its write)
        moving1, moving2 = Signal(), Signal()
        m.d.comb += moving1.eq(valid1 & (delta1 != 0))
        m.d.sync += moving2.eq(moving1 & ~clear)
        m.d.comb += self.settled.eq(~Cat(*arriving).any() & ~Cat(*pending).any() & ~moving1 & ~moving2
                                    & (stale == 0))

        # -- reads: one outstanding; answered the cycle after the address, a counter's low word
        # (from the memory) two or more cycles later
        high_bits = max(0, bits - 32)
        # no latch at all for counters of 32 bits or less (their high words read 0)
        latched_hi = Signal(high_bits) if high_bits else None
        read_value = Signal(32)
        read_resp = Signal(2)
        counter_read = Signal()              # a counter's low word comes from the memory next cycle
        counter_stale = Signal()
        with m.If(bus.r.valid & bus.r.ready):
            m.d.sync += bus.r.valid.eq(0)
        is_counter = Signal()
        decoded_index = Signal(range(count))
        # a counter's read is asked for in the address's cycle and made from registers in a later
        # one, in which the memory does not write that counter (the read would be undefined)
        asked = Signal()
        m.d.comb += [
            bus.ar.ready.eq(~bus.r.valid & ~counter_read & ~asked),
            host_read.eq(asked & ~(wp.en & (wp.addr == host_index))),
        ]
        m.d.sync += counter_read.eq(0)
        with m.If(counter_read):
            m.d.sync += [bus.r.valid.eq(1),
                         bus.r.payload.data.eq(Mux(counter_stale, 0, rp.data[:32]))]
            if latched_hi is not None:
                m.d.sync += latched_hi.eq(Mux(counter_stale, 0, rp.data[32:]))
        fire = bus.ar.valid & bus.ar.ready
        m.d.comb += read_resp.eq(RESP_OKAY)
        word = bus.ar.payload.addr[2:]
        with m.Switch(word):
            for reg in REGISTERS:
                with m.Case(reg.offset >> 2):
                    if reg.name.endswith("_lo") and reg.name[:-3] in _COUNTER_NAMES:
                        index = [name for name, _ in COUNTERS].index(reg.name[:-3])
                        m.d.comb += [is_counter.eq(1), decoded_index.eq(index)]
                    elif reg.access != "wo":
                        m.d.comb += read_value.eq(self._read_source(reg, latched_hi, pulses))
            with m.Default():
                m.d.comb += read_resp.eq(RESP_SLVERR)
        with m.If(bus.ar.payload.addr[:2] != 0):
            m.d.comb += read_resp.eq(RESP_SLVERR)
        with m.If(fire):
            m.d.sync += bus.r.payload.resp.eq(read_resp)
            with m.If(is_counter & (read_resp == RESP_OKAY)):
                m.d.sync += [asked.eq(1), host_index.eq(decoded_index)]
            with m.Else():
                m.d.sync += [bus.r.valid.eq(1), bus.r.payload.data.eq(read_value)]
        with m.If(host_read):
            m.d.sync += [asked.eq(0), counter_read.eq(1), counter_stale.eq(stale.bit_select(host_index, 1))]

        # writes: address and data may arrive in any order; both are held until the response
        aw_addr = Signal(CSR_ADDR_BITS)
        aw_full = Signal()
        w_data = Signal(32)
        w_strb = Signal(4)
        w_full = Signal()
        m.d.comb += [bus.aw.ready.eq(~aw_full), bus.w.ready.eq(~w_full)]
        # start and soft_reset are registered pulses (in the cycle the response goes out), so
        # that the address decode does not lie on the paths into everything they clear
        m.d.sync += [self.start.eq(0), self.soft_reset.eq(0), self.fw_write.eq(0), self.fw_loaded.eq(0)]
        fw_addr = self._fw_addr
        if self.firmware:
            # the word and its address are the held write data and FW_ADDR, unchanged in the
            # pulse's cycle (FW_ADDR advances at its end; a new W beat lands at its end; no write
            # completes while the response is valid): no copies in flip-flops
            m.d.comb += [self.fw_write_addr.eq(fw_addr), self.fw_write_data.eq(w_data)]
            with m.If(self.fw_write):
                m.d.sync += fw_addr.eq(fw_addr + 1)
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
                    m.d.sync += [self.start.eq(w_data[0] & w_strb[0]),
                                 self.soft_reset.eq(w_data[1] & w_strb[0]),
                                 self.fw_loaded.eq(w_data[2] & w_strb[0])]
                with m.Case(_BY_NAME["fw_addr"].offset >> 2):
                    if self.firmware:
                        m.d.sync += fw_addr.eq(w_data[:FW_ADDR_BITS])
                with m.Case(_BY_NAME["fw_data"].offset >> 2):
                    if self.firmware:
                        m.d.sync += self.fw_write.eq(1)
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

    def _read_source(self, reg: Register, latched_hi: Signal | None, pulses: tuple[Signal, Signal]):
        name = reg.name
        if name == "status":
            start_pending, reset_pending = pulses
            busy = (self.busy | start_pending) & ~reset_pending
            settling = start_pending | reset_pending
            return (busy | ((self.done & ~settling) << 1) | (self.fw_ready << 2)
                    | (Mux(settling, 0, self.error) << 4))
        if name == "error_pc":
            return self.error_pc
        if name == "pc":
            return self.pc
        if name == "fw_addr":
            return self._fw_addr
        if name in ("prog_addr", "dram_base", "prog_len"):
            return getattr(self, name)
        if name == "config_hash_lo":
            return self.config_hash & 0xFFFF_FFFF
        if name == "config_hash_hi":
            return self.config_hash >> 32
        # a counter's high word (the low words come from the counter memory)
        return 0 if latched_hi is None else latched_hi

