"""The accelerator's FIFOs: Amaranth's ``SyncFIFOBuffered``, with their storage in block RAM when
the config asks for it.

yosys puts a small FIFO's storage in distributed RAM on ECP5 (TRELLIS_DPR16X4: a RAM cell and two
LUT4 cells per 16 entries of 4 bits). On a nearly full device those cells crowd the slices that
can hold them, and nextpnr's analytic placer can fail to legalize the placement (seen on the
OrangeCrab, docs/boards.md). :func:`buffered_fifo` makes every FIFO that stores at least
``config.fifo_block_ram_bits`` bits (``width * (depth - 1)``: the last entry is the output
register) carry the yosys attribute ``ram_style = "block"``, so that its storage becomes block
RAM (ECP5 DP16KD, iCE40 EBR), and :data:`~systolic.hw.rtlil.UNDEFINED_COLLISION`: a FIFO never
reads the row it writes in the same cycle (it reads only when not empty and writes only when not
full, and its write and read pointers meet only then), so the block RAM needs no logic for that
case. Simulation is unchanged: the attributes matter to yosys only.

A block RAM's read data come late in the cycle (ECP5 DP16KD: 4.3 ns clock to output). The DMA
engines', the units' and the SFU's FIFOs use :func:`buffered_fifo` (and the clock-domain
crossings of a config with a compute clock of its own :class:`BlockRamAsyncFIFO`, by the same
rule on all their ``width * depth`` bits, hw/cdc.py); the fetcher's beat FIFO,
whose read data feed the instruction decoder, does not (in block RAM it made the OrangeCrab's
critical path). The three that the OrangeCrab preset's 512 bits move (the LOAD engine's runs,
whose read data go into a register; the STORE engine's beats, onto the AXI W channel; the SFU's
output rows, through one multiplexer into a stream register) were measured there; a lower
threshold moves small FIFOs whose timing in block RAM has not been measured (``yosys.log`` of
``systolic synth`` lists each memory's mapping).
"""

from __future__ import annotations

from amaranth import Cat, Module, ResetSignal, Signal, Value
from amaranth.lib import fifo
from amaranth.lib.cdc import AsyncFFSynchronizer, FFSynchronizer
from amaranth.lib.memory import Memory

from .config import AcceleratorConfig
from .rtlil import UNDEFINED_COLLISION

__all__ = ["RAM_STYLE", "BlockRamFIFO", "RegisteredAsyncFIFO", "BlockRamAsyncFIFO", "buffered_fifo",
           "fifo_storage_bits", "wants_block_ram"]

#: yosys' memory attribute (name, value) that restricts a memory to block RAM. (``ram_block``
#: does not: yosys 0.70 still maps a 32-entry memory carrying it to distributed RAM.)
RAM_STYLE = ("ram_style", "block")


def fifo_storage_bits(width: int, depth: int) -> int:
    """Bits a ``SyncFIFOBuffered`` of ``width`` and ``depth`` keeps in its memory: ``depth - 1``
    entries (its last entry is the output register; a depth of 1 is that register alone)."""
    return width * max(0, depth - 1)


class BlockRamFIFO(fifo.SyncFIFOBuffered):
    """A ``SyncFIFOBuffered`` whose storage is marked for block RAM. Same ports and timing as its
    base class."""

    def elaborate(self, platform) -> Module:
        m = super().elaborate(platform)
        if fifo_storage_bits(self.width, self.depth):
            m.submodules.storage.attrs.update({RAM_STYLE[0]: RAM_STYLE[1], UNDEFINED_COLLISION: 1})
        return m


def _to_gray(value: Value) -> Value:
    return value ^ (value >> 1)


def _from_gray(gray: Value) -> Value:
    """The binary value of the Gray code ``gray``: bit n is the XOR of the code's bits n and up."""
    bits = [gray[-1]]
    for n in reversed(range(len(gray) - 1)):
        bits.insert(0, bits[0] ^ gray[n])
    return Cat(*bits)


class RegisteredAsyncFIFO(fifo.AsyncFIFO):
    """An ``AsyncFIFO`` (same ports, the same reset from the write side, Gray-coded pointers
    through two-register synchronizers) whose ``r_rdy`` and ``w_rdy`` are registers.

    Amaranth's ``AsyncFIFO`` compares the read pointer with the synchronized write pointer (and
    the write pointer with the synchronized read pointer) in the cycle, so ``r_rdy`` is a
    comparison of two pointers, and in a consumer's read enable it lies before the read address
    (the pointer advanced by the read) and the load enables of whatever takes the data. Here each
    side decides in the cycle before, from the pointer as this cycle's transfer leaves it and the
    other side's pointer as synchronized now: the other side only moves away from full or empty
    meanwhile, so the flag is never wrong in the safe direction's opposite (never ready when
    empty, or when full), and an item is seen one cycle of the read domain later than by
    ``AsyncFIFO`` (a freed entry one cycle of the write domain later). A side that transfers
    every cycle keeps doing so while the other keeps up.

    While the read side's copy of the write-side reset is high, ``r_rdy`` is low (as
    ``AsyncFIFO``'s), and the read pointer takes the synchronized write pointer.

    ``block_ram``: the storage carries yosys' ``ram_style = "block"`` (a true dual-port block RAM
    with a clock per port, ECP5 DP16KD); synthesis only, the behaviour is the same.
    """

    def __init__(self, *, width: int, depth: int, r_domain: str = "read", w_domain: str = "write",
                 exact_depth: bool = False, block_ram: bool = False) -> None:
        super().__init__(width=width, depth=depth, r_domain=r_domain, w_domain=w_domain,
                         exact_depth=exact_depth)
        self.block_ram = block_ram

    def elaborate(self, platform) -> Module:
        m = Module()
        assert self.depth >= 2, self.depth
        bits = self._ctr_bits                   # log2(depth) + 1: full and empty differ
        w, r = self._w_domain, self._r_domain
        m.submodules.storage = storage = Memory(shape=self.width, depth=self.depth, init=[])
        if self.block_ram:
            storage.attrs[RAM_STYLE[0]] = RAM_STYLE[1]
        write = storage.write_port(domain=w)
        read = storage.read_port(domain=r)

        # -- write side: the pointer, its Gray code for the read side, and w_rdy a register
        w_ptr = Signal(bits)
        w_gray = Signal(bits)
        w_seen = Signal(bits)                   # the read side's Gray pointer, synchronized
        w_rdy = Signal()                        # (0 in the first cycle after a reset)
        wrote = Signal()
        w_next = Signal(bits)
        m.d.comb += [wrote.eq(self.w_en & w_rdy), w_next.eq(w_ptr + wrote), self.w_rdy.eq(w_rdy)]
        w_next_gray = _to_gray(w_next)
        # full: the pointers differ in their top two Gray bits only (depth entries apart)
        full = ((w_next_gray[-1] != w_seen[-1]) & (w_next_gray[-2] != w_seen[-2])
                & (w_next_gray[:-2] == w_seen[:-2]))
        m.d[w] += [w_ptr.eq(w_next), w_gray.eq(w_next_gray), w_rdy.eq(~full)]
        m.d.comb += [write.addr.eq(w_ptr[:-1]), write.data.eq(self.w_data), write.en.eq(wrote)]

        # -- read side: pointer and flag without a reset of their own (the write side's reset
        # reaches them through r_reset, below)
        r_ptr = Signal(bits, reset_less=True)
        r_gray = Signal(bits, reset_less=True)
        r_seen = Signal(bits)                   # the write side's Gray pointer, synchronized
        r_rdy = Signal(reset_less=True)
        r_reset = Signal()                      # the write side's reset, in the read domain
        took = Signal()
        r_next = Signal(bits)
        m.d.comb += [
            self.r_rdy.eq(r_rdy & ~r_reset),
            took.eq(self.r_en & self.r_rdy),
            r_next.eq(r_ptr + took),
            read.addr.eq(r_next[:-1]),          # first word fall-through: the next entry
            self.r_data.eq(read.data),
        ]
        r_next_gray = _to_gray(r_next)
        with m.If(r_reset):                     # empty: the read pointer joins the write pointer
            m.d[r] += [r_ptr.eq(_from_gray(r_seen)), r_gray.eq(r_seen), r_rdy.eq(0), self.r_rst.eq(1)]
        with m.Else():
            m.d[r] += [r_ptr.eq(r_next), r_gray.eq(r_next_gray), r_rdy.eq(r_next_gray != r_seen),
                       self.r_rst.eq(0)]

        m.submodules.w_to_r = FFSynchronizer(w_gray, r_seen, o_domain=r)
        m.submodules.r_to_w = FFSynchronizer(r_gray, w_seen, o_domain=w)
        m.submodules.reset_to_r = AsyncFFSynchronizer(ResetSignal(w, allow_reset_less=True), r_reset,
                                                      o_domain=r)
        m.d[w] += self.w_level.eq(w_ptr - _from_gray(w_seen))
        m.d.comb += self.r_level.eq(_from_gray(r_seen) - r_ptr)
        return m


class BlockRamAsyncFIFO(RegisteredAsyncFIFO):
    """A :class:`RegisteredAsyncFIFO` whose storage (all ``depth`` entries, written in one domain
    and read, through a synchronous read port, in the other) is marked for block RAM: a true
    dual-port block RAM with a clock per port (ECP5 DP16KD). Same ports and timing."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs, block_ram=True)


def wants_block_ram(config: AcceleratorConfig, bits: int) -> bool:
    """A FIFO storing ``bits`` bits keeps them in block RAM: ``config.fifo_block_ram_bits`` is not
    0 and ``bits`` is at least that."""
    return config.fifo_block_ram_bits != 0 and bits >= config.fifo_block_ram_bits


def buffered_fifo(config: AcceleratorConfig, *, width: int, depth: int) -> fifo.SyncFIFOBuffered:
    """A ``SyncFIFOBuffered`` of ``width`` bits and ``depth`` entries; a :class:`BlockRamFIFO`
    when ``config.fifo_block_ram_bits`` is not 0 and the FIFO stores at least that many bits
    (:func:`fifo_storage_bits`)."""
    block = wants_block_ram(config, fifo_storage_bits(width, depth))
    return (BlockRamFIFO if block else fifo.SyncFIFOBuffered)(width=width, depth=depth)
