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

from amaranth import Module
from amaranth.lib import fifo

from .config import AcceleratorConfig
from .rtlil import UNDEFINED_COLLISION

__all__ = ["RAM_STYLE", "BlockRamFIFO", "BlockRamAsyncFIFO", "buffered_fifo", "fifo_storage_bits",
           "wants_block_ram"]

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


class BlockRamAsyncFIFO(fifo.AsyncFIFO):
    """An ``AsyncFIFO`` whose storage (all ``depth`` entries, written in one domain and read,
    through a synchronous read port, in the other) is marked for block RAM: a true dual-port
    block RAM with a clock per port (ECP5 DP16KD). Same ports and timing as its base class."""

    def elaborate(self, platform) -> Module:
        m = super().elaborate(platform)
        m.submodules.storage.attrs[RAM_STYLE[0]] = RAM_STYLE[1]
        return m


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
