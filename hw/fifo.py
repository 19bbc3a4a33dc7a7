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
crossings of a config with a compute clock of its own :class:`BlockRamAsyncFIFO`, or into the
compute core :class:`FetchAheadAsyncFIFO`, whose block RAM is read at a register, by the same
rule on all their ``width * depth`` bits, hw/cdc.py); the fetcher's beat FIFO,
whose read data feed the instruction decoder, does not (in block RAM it made the OrangeCrab's
critical path). The three that the OrangeCrab preset's 512 bits move (the LOAD engine's runs,
whose read data go into a register; the STORE engine's beats, onto the AXI W channel; the SFU's
output rows, through one multiplexer into a stream register) were measured there; a lower
threshold moves small FIFOs whose timing in block RAM has not been measured (``yosys.log`` of
``systolic synth`` lists each memory's mapping).
"""

from __future__ import annotations

import functools
import operator

from amaranth import Cat, DomainRenamer, Elaboratable, Module, Mux, ResetSignal, Signal, Value
from amaranth.lib import fifo
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.memory import Memory

from .config import AcceleratorConfig
from .dsp import group_enables, reset_synchronizer_copies
from .rtlil import UNDEFINED_COLLISION

__all__ = ["FETCH_AHEAD_BUFFER", "RAM_STYLE", "BlockRamFIFO", "BlockRamAsyncFIFO", "FetchAheadAsyncFIFO",
           "buffered_fifo", "fifo_storage_bits", "gray_binary", "gray_code", "wants_block_ram"]

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


def gray_code(value):
    """The Gray code of ``value`` (as wide as ``value``: truncate first to count modulo a power of
    two)."""
    return value ^ (value >> 1)


def gray_binary(gray: Signal):
    """The binary value of the Gray code ``gray``, as wide."""
    bits = [gray[-1]]
    for k in reversed(range(len(gray) - 1)):
        bits.insert(0, gray[k] ^ bits[0])
    return Cat(*bits)


#: Entries of a :class:`FetchAheadAsyncFIFO`'s buffer: an entry fetched comes two cycles later,
#: and the fetch does not wait for this cycle's take, so four keep a consumer that takes one every
#: cycle busy.
FETCH_AHEAD_BUFFER = 4


class FetchAheadAsyncFIFO(Elaboratable):
    """An asynchronous FIFO with the ports and the write side of Amaranth's ``AsyncFIFO`` (Gray
    pointers through synchronizers, reset from the write domain, ``r_rst``), whose storage is read
    at a register: the read side fetches entries ahead into a buffer of registers
    (:data:`FETCH_AHEAD_BUFFER` entries), and ``r_data`` and ``r_rdy`` come from that buffer.
    ``AsyncFIFO`` reads its memory at the pointer advanced by this cycle's read (an adder after
    the consumer's ``r_en`` and the emptiness comparison), so the route to a block RAM far from
    the reader ends a path that starts at the consumer's handshake (on the 16x16 ULX3S SoC at
    78f3c41 the accumulator-write crossing's block RAM address, 11.8 ns with 4.5 ns of it that
    route, was the compute clock's critical path, docs/boards.md); here the memory's address is
    the fetch pointer itself, a register.

    An entry is fetched in a cycle where it has been written (as the write side's synchronized
    pointer says) and the buffer will have room for it when its data come, two cycles later: fewer
    than :data:`FETCH_AHEAD_BUFFER` entries are in it and on their way (the fetch does not look
    at this cycle's take, so that the consumer's handshake, which may sit far from the FIFO,
    reaches neither the fetch pointer's adder nor the block RAM's address: on the 16x16 ULX3S SoC
    at 5832802 that term was the compute clock's critical path, 11.9 ns). The storage is
    read in every cycle at the fetch pointer into a register with no enable (so that a block
    RAM's late read data have a cycle for the route to it), whose fetched data enter the buffer
    a cycle later. A fetched entry is free for the write side (the pointer sent back is the fetch
    pointer), so the FIFO holds ``depth`` entries in its storage and four more in the buffer.
    An entry written into an empty FIFO is readable (``r_rdy``) three read-domain cycles after
    ``AsyncFIFO`` would show it (the fetch, the read data register and the buffer). The buffer is
    a ring: an entry loads only with a fetched entry's data, under registers made a cycle ahead,
    and the head (``r_data``) is picked by one-hot registers of the read pointer, both in copies
    (on ECP5 ``TRELLIS_FF``, one per :data:`~systolic.hw.dsp.COPY_GROUP_BITS` bits of an entry;
    elsewhere yosys may merge them): the consumer's take reaches neither the entries' enables
    nor one net to all their bits (so ``r_data`` is a multiplexer of four registers). A
    write-domain reset empties the FIFO, the buffer too, and raises ``r_rst`` as ``AsyncFIFO``
    does. ``block_ram``: the storage carries :data:`RAM_STYLE` (as :class:`BlockRamAsyncFIFO`'s).
    ``depth`` is a power of two, at least 2. Ports: ``w_data``, ``w_en``, ``w_rdy``; ``r_data``,
    ``r_en``, ``r_rdy``, ``r_rst`` (no levels).
    """

    def __init__(self, *, width: int, depth: int, r_domain: str = "read", w_domain: str = "write",
                 block_ram: bool = False) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 2 or depth & (depth - 1):
            raise ValueError(f"depth must be a power of two of at least 2, not {depth!r}")
        self.width, self.depth = width, depth
        self.w_data, self.w_en, self.w_rdy = Signal(width), Signal(), Signal()
        self.r_data, self.r_en, self.r_rdy, self.r_rst = Signal(width), Signal(), Signal(), Signal()
        self._r_domain, self._w_domain = r_domain, w_domain
        self._bits = depth.bit_length()          # pointers: one bit more than the address
        self.block_ram = block_ram

    def elaborate(self, platform) -> Module:
        m = Module()
        r, w = self._r_domain, self._w_domain
        bits = self._bits
        do_write = self.w_rdy & self.w_en
        produce_bin = Signal(bits)
        produce_next = Signal(bits)
        produce_gray = Signal(bits)
        m.d.comb += produce_next.eq(produce_bin + do_write)
        m.d[w] += [produce_bin.eq(produce_next), produce_gray.eq(gray_code(produce_next))]
        produce_r_gray = Signal(bits)
        m.submodules.produce_cdc = FFSynchronizer(produce_gray, produce_r_gray, o_domain=r)

        # the fetch pointer: the read domain's (reset through r_rst below, as AsyncFIFO's)
        fetch_bin = Signal(bits, reset_less=True)
        fetch_gray = Signal(bits, reset_less=True)
        fetch_next = Signal(bits)               # (wraps: the Gray code is of the pointer's bits)
        fetch_w_gray = Signal(bits)
        m.submodules.consume_cdc = FFSynchronizer(fetch_gray, fetch_w_gray, o_domain=w)
        m.d.comb += self.w_rdy.eq(~((produce_gray[-1] != fetch_w_gray[-1])
                                    & (produce_gray[-2] != fetch_w_gray[-2])
                                    & (produce_gray[:-2] == fetch_w_gray[:-2])))

        storage = Memory(shape=self.width, depth=self.depth, init=[])
        if self.block_ram:
            storage.attrs[RAM_STYLE[0]] = RAM_STYLE[1]
        m.submodules.storage = storage
        w_port = storage.write_port(domain=w)
        r_port = storage.read_port(domain=r)
        m.d.comb += [w_port.addr.eq(produce_bin[:-1]), w_port.data.eq(self.w_data), w_port.en.eq(do_write),
                     r_port.addr.eq(fetch_bin[:-1]), r_port.en.eq(1)]

        # a synchronizer of this FIFO's own (on ECP5 one that yosys does not merge with the other
        # crossings' into the same domain, hw/dsp.py), placed by this FIFO's reset logic; its
        # second stage twice, the copy `r_rst_ready` for `r_rdy` alone, so that it can sit by the
        # consumer's handshake (on the 16x16 ULX3S SoC at b9a0bbe the one stage, drawn to the
        # buffer's enables by the block RAM, reached the scratchpad-row crossing's read register
        # 33 columns away, 5.7 ns of the compute clock's critical path, 10.4 ns, docs/boards.md)
        r_rst, r_rst_ready = reset_synchronizer_copies(m, "rst_cdc", ResetSignal(w, allow_reset_less=True),
                                                       domain=r, platform=platform, copies=2)
        # The storage's read data (a block RAM's come 5.8 ns after the clock edge on ECP5 at speed
        # grade 6) go into `data_d` with no enable and no logic, so that it can sit by the block
        # RAM (on the 16x16 ULX3S SoC at 1434618 the route from the scratchpad-row crossing's
        # block RAM to its buffer, 5.9 ns, ended the compute clock's critical path), then into the
        # buffer: FETCH_AHEAD_BUFFER entries in a ring, `held[read]` the head (r_data). `fetched`
        # and `arriving`: an entry was fetched one and two cycles ago; the second's data are in
        # `data_d` now and enter `held[write]`. An entry loads only with an arriving entry, so its
        # load enables are registers made a cycle ahead (copies, one per COPY_GROUP_BITS bits: no
        # logic of the consumer's take reaches them, nor one net all of their bits; at 854da92 the
        # take into a shifting buffer's enables, one net to 134 flip-flops, took 7.7 ns), and the
        # head is chosen by one-hot copies of the read pointer.
        entries = FETCH_AHEAD_BUFFER
        held = [Signal(self.width, name=f"held{k}", reset_less=True) for k in range(entries)]
        data_d = Signal(self.width, reset_less=True)
        stored = Signal(range(entries + 1))        # entries in the buffer
        fetched = Signal()
        arriving = Signal()
        write = Signal(range(entries))             # the entry the next arriving one enters
        read = Signal(range(entries))              # the head
        take = Signal()
        fetch = Signal()
        # stored + fetched + arriving, a register of its own (kept from each cycle's fetch and
        # take), and the fetch pointer's next values made from the pointer alone, chosen by the
        # fetch: no adder after the fetch decision (on the 16x16 ULX3S SoC at 941a5dc the sum, its
        # comparison, the fetch and the pointer's carry chain into its Gray code took 10.7 ns)
        count = Signal(range(entries + 3))
        m.d.comb += [
            self.r_rdy.eq((stored != 0) & ~r_rst_ready),
            take.eq(self.r_en & self.r_rdy),
            # written and not fetched; room when the data come (at most `entries` then, whatever
            # is taken meanwhile: no term of this cycle's take)
            fetch.eq((fetch_gray != produce_r_gray) & ~r_rst & (count <= entries - 1)),
        ]

        def following(pointer: Signal) -> Value:
            return Mux(pointer == entries - 1, 0, pointer + 1)

        write_next = Mux(r_rst, 0, Mux(arriving, following(write), write))
        read_next = Mux(r_rst, 0, Mux(take, following(read), read))
        m.d.comb += fetch_next.eq(fetch_bin + 1)
        copies = Module()
        loads = [group_enables(copies, f"load{k}_", fetched & ~r_rst & (write_next == k), self.width,
                               platform=platform) for k in range(entries)]
        heads = [group_enables(copies, f"head{k}_", read_next == k, self.width, platform=platform,
                               init=int(k == 0)) for k in range(entries)]
        m.submodules.copies = DomainRenamer({"sync": r})(copies)
        m.d[r] += data_d.eq(r_port.data)
        for k in range(entries):
            for bits, load in loads[k]:
                with m.If(load):
                    m.d[r] += held[k][bits].eq(data_d[bits])
        for group, (bits, _) in enumerate(heads[0]):
            m.d.comb += self.r_data[bits].eq(functools.reduce(operator.or_, (
                Mux(heads[k][group][1], held[k][bits], 0) for k in range(entries))))
        with m.If(r_rst):
            m.d[r] += [fetch_gray.eq(produce_r_gray), fetch_bin.eq(gray_binary(produce_r_gray)),
                       stored.eq(0), fetched.eq(0), arriving.eq(0), count.eq(0), write.eq(0), read.eq(0),
                       self.r_rst.eq(1)]
        with m.Else():
            m.d[r] += [fetch_bin.eq(Mux(fetch, fetch_next, fetch_bin)),
                       fetch_gray.eq(Mux(fetch, gray_code(fetch_next), fetch_gray)), fetched.eq(fetch),
                       arriving.eq(fetched), stored.eq(stored + arriving - take),
                       count.eq(count + fetch - take), write.eq(write_next), read.eq(read_next),
                       self.r_rst.eq(0)]
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
