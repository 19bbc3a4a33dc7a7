"""Clock-domain crossings between the accelerator's control clock and a compute clock.

Five blocks, each safe for any ratio of the two clocks (neither needs to be faster, and the
clocks need not be related):

* :class:`StreamCrossing` — a stream through an asynchronous FIFO (Amaranth's ``AsyncFIFO``:
  Gray-coded pointers, two-register synchronizers), and on either side, if asked, through a
  stream register that keeps the FIFO's memory and pointers out of the paths of the logic
  there. Its write side also counts the items whose read the other side has reported
  (``drained``), so that a producer can tell when items it sent have been taken (a LOAD
  completes once its rows are written).
* :class:`DrainedGate` — events of the write side (a LOAD's last row sent) held back until every
  item sent up to them through one or more :class:`StreamCrossing` has been taken on the other
  side.
* :class:`EventCrossing` — events (at most one per cycle of the source domain) carried as a
  Gray-coded count and given out one per cycle of the destination domain, none lost however
  close together they come.
* :class:`CountCrossing` — counters incremented in one domain (by up to a row's MACs a cycle)
  and read in the other: running totals whose snapshot crosses under a request / acknowledge
  handshake (the snapshot register holds still while it is read), given out as the increment
  since the last snapshot, one snapshot every few cycles.
* :class:`ResetCrossing` — a reset request of one cycle in the source domain held, as the
  destination domain's reset, until the destination has been in reset for ``cycles`` of its
  own cycles and the source has seen that (a request/acknowledge handshake); ``busy`` is high
  meanwhile.

Units: counts are items or events; ``depth`` in entries.
"""

from itertools import pairwise

from amaranth import (
    Cat,
    ClockDomain,
    ClockSignal,
    Const,
    DomainRenamer,
    Module,
    Mux,
    ResetInserter,
    ResetSignal,
    Shape,
    Signal,
)
from amaranth.lib import stream, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.fifo import AsyncFIFO, SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from .dsp import COPY_GROUP_BITS, fabric_register, group_enables
from .fifo import BlockRamAsyncFIFO, FetchAheadAsyncFIFO, gray_binary, gray_code
from .interconnect import HalfRateRegister, StreamRegister

__all__ = ["StreamCrossing", "DrainedGate", "EventCrossing", "CountCrossing", "ResetCrossing", "COUNT_BITS",
           "SHIFT_ENABLE_BITS"]

#: Width of the counters that carry events and drained items across: a difference between two
#: counts (events in flight, items sent and not yet reported) must stay below 2**(COUNT_BITS - 1).
COUNT_BITS = 8
#: Bits of a crossing's item register (``pieces`` > 1, ``read_register``) under one copy of its
#: shift enable: each copy, a register of its own, drives this many flip-flops.
SHIFT_ENABLE_BITS = COPY_GROUP_BITS


class StreamCrossing(wiring.Component):
    """A stream of ``shape`` from domain ``w_domain`` (``i``) to ``r_domain`` (``o``) through an
    asynchronous FIFO of ``depth`` entries (a power of two, at least 2).

    ``drained`` (in ``w_domain``): how many items the read side has taken, modulo
    ``2**COUNT_BITS``, as far as the write side has learnt: it lags the read by a few cycles of
    both domains and never runs ahead of it. ``sent`` (in ``w_domain``): items taken from ``i``,
    modulo ``2**COUNT_BITS``. An item sent when ``sent`` read ``n`` has been taken by the read side
    once ``(drained - n - 1) % 2**COUNT_BITS < 2**(COUNT_BITS - 1)``.

    ``pieces``: an item crosses as that many FIFO entries of ``ceil(width / pieces)`` bits (a
    power of two, at most the item's width), low bits first, one a cycle of each side: the FIFO
    holds ``depth`` items in ``depth * pieces`` narrower entries, and the crossing carries an item
    every ``pieces`` cycles at most. The write side takes an item (``i.ready``) with its last
    piece; the read side shifts the earlier pieces into a register and offers the item with the
    last one. ``sent`` and ``drained`` count items.

    ``block_ram``: the FIFO's storage carries yosys' ``ram_style = "block"``
    (:class:`~systolic.hw.fifo.BlockRamAsyncFIFO`; synthesis only, the behaviour is the same).
    ``fetch_ahead``: the FIFO is a :class:`~systolic.hw.fifo.FetchAheadAsyncFIFO`, whose storage
    is read at a register (its read address is not made from the read side's handshake in the
    cycle: for a block RAM far from the reader); an item is readable three ``r_domain`` cycles
    later, and :data:`~systolic.hw.fifo.FETCH_AHEAD_BUFFER` more entries are buffered.

    ``read_register``: the items leave through a :class:`~systolic.hw.interconnect.StreamRegister`
    in ``r_domain``, so that neither the FIFO's read data (a block RAM's clock-to-output) nor its
    read address (the pointer advanced by a read) is in a combinational path with the consumer's
    logic: ``o`` comes from registers, and the FIFO is read whenever the register has room, not
    when the consumer is ready. ``drained`` counts the items the consumer took from the register.
    ``read_register=2`` (whole items only): two such registers in series, so that the first can
    sit by the FIFO's block RAM (its clock-to-output and the multiplexer into the register in one
    cycle) and the second by the consumer (the route between them in a cycle of its own); a cycle
    more of latency and two items more of buffering; ``drained`` still counts what the consumer
    took from the last one. ``read_register=3``: three in series, for a consumer far from the
    FIFO (each route between two of them in a cycle of its own), a cycle more again.
    With ``pieces`` > 1 every piece shifts into a register, two cycles after its read and under
    copies of a register of the read (one per :data:`SHIFT_ENABLE_BITS` bits), and ``o.payload``
    is a copy of that register a cycle later with no enable (no multiplexer per bit, and no load
    enable made by logic, nor one net to every bit): an item leaves four cycles after its last
    piece is read, and the next item's pieces are read once the consumer has taken it, which
    costs little where items come at most every ``pieces`` cycles.
    ``write_register``: the items enter through a ``StreamRegister`` in ``w_domain``, so that the
    producer's ``valid`` and payload reach the FIFO's write port (and the block RAM's data inputs)
    only from registers, and ``i.ready`` is a register; ``write_register="half"`` makes that
    register a :class:`~systolic.hw.interconnect.HalfRateRegister` (one item, no spare entry and
    no multiplexer per bit, an item every other cycle at most), for a producer that never offers
    items faster. Each adds a cycle of its domain's latency and up to two items of buffering (the
    half-rate register one). The read register is emptied with the FIFO's read side
    when the write side is reset; items it holds may still be given out while that reset
    crosses (up to a few ``r_domain`` cycles), so the consumer is to be reset with the write side
    (the accelerator resets its compute core so, hw/top.py).
    ``own_write_reset``: the FIFO's write side is reset by a register of the write domain's reset
    of this crossing's own, so that the FIFO's read side has a reset synchronizer of its own
    (yosys merges the synchronizers of crossings from one reset into one domain, and the one
    left drives every crossing's read logic, across the die: on the 16x16 ULX3S SoC at b76e74e
    9.9 ns of the compute clock's critical path, docs/boards.md); the crossing takes no item in
    the first ``w_domain`` cycle after that domain's reset (``i.ready`` low), while the copy is
    still high.
    """

    def __init__(self, shape, *, depth: int, w_domain: str = "sync", r_domain: str,
                 block_ram: bool = False, read_register: bool | int = False,
                 write_register: bool | str = False, pieces: int = 1, fetch_ahead: bool = False,
                 own_write_reset: bool = False):
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 2 or depth & (depth - 1):
            raise ValueError(f"depth must be a power of two of at least 2, not {depth!r}")
        width = Shape.cast(shape).width
        if (isinstance(pieces, bool) or not isinstance(pieces, int) or pieces < 1 or pieces & (pieces - 1)
                or pieces > width):
            raise ValueError(f"pieces must be a power of two between 1 and the item's width ({width} "
                             f"bits), not {pieces!r}")
        if depth >= 2 ** (COUNT_BITS - 1):
            raise ValueError(f"depth must be below 2**(COUNT_BITS - 1) = {2 ** (COUNT_BITS - 1)}, "
                             f"not {depth}")
        if not (isinstance(read_register, bool)
                or (isinstance(read_register, int) and 2 <= read_register <= 3)):
            raise ValueError(f"read_register must be False, True, 2 or 3, not {read_register!r}")
        if read_register > 1 and pieces > 1:
            raise ValueError(f"read_register={read_register} needs whole items (pieces=1; items in "
                             f"pieces have their own read registers), not pieces={pieces}")
        if not (isinstance(write_register, bool) or write_register == "half"):
            raise ValueError(f"write_register must be False, True or 'half', not {write_register!r}")
        if not isinstance(fetch_ahead, bool):
            raise ValueError(f"fetch_ahead must be True or False, not {fetch_ahead!r}")
        if not isinstance(own_write_reset, bool):
            raise ValueError(f"own_write_reset must be True or False, not {own_write_reset!r}")
        if w_domain == r_domain:
            raise ValueError(f"w_domain and r_domain must differ, both are {w_domain!r}")
        self.shape = shape
        self.depth = depth
        self.w_domain = w_domain
        self.r_domain = r_domain
        self.block_ram = bool(block_ram)
        self.read_register = bool(read_register)
        self.read_registers = int(read_register)       # StreamRegisters in series (whole items)
        self.write_register = write_register
        self.pieces = pieces
        self.fetch_ahead = bool(fetch_ahead)
        self.own_write_reset = own_write_reset
        super().__init__({
            "i": In(stream.Signature(shape)),
            "o": Out(stream.Signature(shape)),
            "sent": Out(COUNT_BITS),
            "drained": Out(COUNT_BITS),
        })

    def elaborate(self, platform):
        m = Module()
        width = Shape.cast(self.shape).width
        pieces = self.pieces
        piece = -(-width // pieces)          # bits of a piece (the last one zero-padded)
        # own_write_reset: the FIFO's write side is in a domain of its own, on the write clock,
        # reset by a register of the write domain's reset (one per crossing; on ECP5 a
        # TRELLIS_FF that yosys does not merge), and takes nothing while that copy is high
        # (the first cycle after the write domain's reset): each crossing's read side then has
        # a reset synchronizer of its own, where yosys merges those of crossings from one
        # reset into one, whose output reaches every crossing's read logic across the die
        fifo_w = self.w_domain
        w_closed = Const(0, 1)
        if self.own_write_reset:
            fifo_w = "fifo_write"
            m.domains.fifo_write = ClockDomain("fifo_write", local=True)
            copy = Module()
            w_closed = fabric_register(copy, "w_reset", ResetSignal("sync"), init=1, platform=platform)
            m.submodules.w_reset = DomainRenamer({"sync": self.w_domain})(copy)
            m.d.comb += [ClockSignal(fifo_w).eq(ClockSignal(self.w_domain)), ResetSignal(fifo_w).eq(w_closed)]
        if self.fetch_ahead:
            fifo = FetchAheadAsyncFIFO(width=piece, depth=self.depth * pieces, w_domain=fifo_w,
                                       r_domain=self.r_domain, block_ram=self.block_ram)
        else:
            kind = BlockRamAsyncFIFO if self.block_ram else AsyncFIFO
            fifo = kind(width=piece, depth=self.depth * pieces, exact_depth=True, w_domain=fifo_w,
                        r_domain=self.r_domain)
        m.submodules.fifo = fifo
        # the FIFO's two sides, each directly on a port or through a register of its domain
        w_side, r_side = self.i, self.o
        if self.write_register:
            # (the half-rate register's wide payload loads under copies of its emptiness, whose
            # reset is the write domain's own: the FIFO's write side needs a real reset anyway)
            register = (HalfRateRegister(self.shape, enable_copies=True) if self.write_register == "half"
                        else StreamRegister(self.shape))
            m.submodules.w_register = w_register = DomainRenamer(self.w_domain)(register)
            wiring.connect(m, wiring.flipped(self.i), w_register.i)
            w_side = w_register.o
        # an item goes in as `pieces` FIFO entries, low bits first, one a cycle; it is taken from
        # the write side with its last piece and given out on the read side with it
        w_last = r_last = 1
        if pieces > 1:
            w_piece = Signal(range(pieces))
            r_piece = Signal(range(pieces))
            w_last, r_last = w_piece == pieces - 1, r_piece == pieces - 1
        m.d.comb += [w_side.ready.eq(fifo.w_rdy & w_last & ~w_closed), fifo.w_en.eq(w_side.valid & ~w_closed)]
        read = fifo.r_en & fifo.r_rdy
        if pieces == 1:
            m.d.comb += fifo.w_data.eq(w_side.payload)
        else:
            padded = Cat(w_side.payload, Const(0, piece * pieces - width))
            m.d.comb += fifo.w_data.eq(padded.word_select(w_piece, piece))
            with m.If(fifo.w_en & fifo.w_rdy):
                m.d[self.w_domain] += w_piece.eq(w_piece + 1)        # (wraps: pieces is 2**n)
            # The count restarts with the FIFO's read-domain reset, as its pointers do (r_rst, a
            # register, is still high in the first cycle the FIFO may be read again: that
            # cycle's read counts, as `taken`'s below)
            m.d[self.r_domain] += r_piece.eq(Mux(fifo.r_rst, 0, r_piece) + read)

        # the consumer's take, a cycle late (a register)
        took = Signal()
        took_in_reset = Signal()
        m.d[self.r_domain] += took.eq(self.o.valid & self.o.ready)
        if self.read_register and pieces > 1:
            # Every piece, the last one too, shifts into `item`, and `shown`, the output register,
            # copies `item` in every cycle with no enable: nothing but the data crosses to where
            # the consumer sits. A piece read from the FIFO waits two cycles, in `piece_d` and
            # `piece_dd` (no enables): the first can sit by the block RAM, so that its
            # clock-to-output (5.6 ns on ECP5) and the route to `item` are in different cycles
            # (on the 16x16 SoC at 3925bf3 that path took 11.8 ns). `item` shifts it in under
            # copies of a register of the read a cycle late (`shift_N`, one per
            # SHIFT_ENABLE_BITS bits of `item`): no logic lies between a register and `item`'s
            # enables, and no enable net reaches all of its 530 bits (on the 16x16 SoC the
            # FIFO's read logic into such enables, 9.6 ns of routing across the die, was the
            # compute clock's critical path, docs/boards.md). `full`: an item's last piece has
            # been read and the item not yet taken, so the FIFO is not read; `complete`: `item`
            # holds that item; `o.valid` (a register) rises a cycle after `complete`, once
            # `shown` has the item; `complete` and `o.valid` fall as the consumer takes it,
            # `full` a cycle later, from a register of the take (`took`): the FIFO's read enable
            # is made from registers that can sit by the FIFO, not from the consumer's `ready`
            # far away (on the 16x16 SoC at b0247ed the accumulator-row crossing's take, 47
            # columns from its FIFO, into the fetch-ahead buffer: 12.8 ns). The read side's
            # reset (which follows the write side's) clears them and the last piece's flags on
            # their way, and there is no read in its last cycle (r_rst, a register, is then
            # still high).
            item = Signal(piece * pieces, reset_less=True)
            shown = Signal(piece * pieces, reset_less=True)
            piece_d = Signal(piece, reset_less=True)
            piece_dd = Signal(piece, reset_less=True)
            read_d = Signal()
            last_d = Signal()
            last_dd = Signal()
            full = Signal()
            complete = Signal()
            take = self.o.valid & self.o.ready
            m.d.comb += [fifo.r_en.eq(~full & ~fifo.r_rst), self.o.payload.eq(shown[:width])]
            m.d[self.r_domain] += [piece_d.eq(fifo.r_data), piece_dd.eq(piece_d), read_d.eq(read),
                                   last_d.eq(read & r_last), last_dd.eq(last_d & ~fifo.r_rst),
                                   shown.eq(item), self.o.valid.eq(complete & ~take & ~fifo.r_rst)]
            copies = Module()
            shifted = Cat(item[piece:], piece_dd)
            for bits, shift in group_enables(copies, "shift_", read_d, len(item), platform=platform):
                with m.If(shift):
                    m.d[self.r_domain] += item[bits].eq(shifted[bits])
            m.submodules.shift_enables = DomainRenamer({"sync": self.r_domain})(copies)
            with m.If(read & r_last):
                m.d[self.r_domain] += full.eq(1)
            with m.If(last_dd):
                m.d[self.r_domain] += complete.eq(1)
            with m.If(take | fifo.r_rst):
                m.d[self.r_domain] += complete.eq(0)
            with m.If(took | fifo.r_rst):
                m.d[self.r_domain] += full.eq(0)
        else:
            r_side = self.o
            if self.read_register:
                # emptied with the FIFO's read side (whose reset follows the write side's); no
                # read in the last cycle of that reset (r_rst, a register, is then still high),
                # so that no item leaves the FIFO for a register being reset
                registers = [ResetInserter({self.r_domain: fifo.r_rst})(
                    DomainRenamer(self.r_domain)(StreamRegister(self.shape)))
                    for _ in range(self.read_registers)]
                for k, register in enumerate(registers):
                    m.submodules[f"r_register{k or ''}"] = register
                for before, after in pairwise(registers):
                    wiring.connect(m, before.o, after.i)
                wiring.connect(m, registers[-1].o, wiring.flipped(self.o))
                r_side = registers[0].i
                m.d.comb += fifo.r_en.eq(Mux(r_last, r_side.ready, 1) & ~fifo.r_rst)
            else:
                m.d.comb += fifo.r_en.eq(Mux(r_last, self.o.ready, 1))
            m.d.comb += r_side.valid.eq(fifo.r_rdy & r_last)
            if pieces == 1:
                m.d.comb += r_side.payload.eq(fifo.r_data)
            else:
                # the earlier pieces shift into a register; the last one joins them from the FIFO
                earlier = Signal(piece * (pieces - 1), reset_less=True)     # (qualified by r_piece)
                with m.If(read & ~r_last):
                    m.d[self.r_domain] += earlier.eq(Cat(earlier[piece:], fifo.r_data))
                m.d.comb += r_side.payload.eq(Cat(earlier, fifo.r_data)[:width])
        with m.If(self.i.valid & self.i.ready):
            m.d[self.w_domain] += self.sent.eq(self.sent + 1)
        # items taken, counted in the read domain and sent back as a Gray code. The count
        # restarts from 0 with the FIFO's read-domain reset (which follows the write side's), as
        # the FIFO's own pointers do; r_rst is a register, still high in the first cycle the
        # FIFO may be read again, so that cycle's read counts. The count runs a cycle behind,
        # from registers of the take and of r_rst (the same counts a cycle later): the
        # consumer's `ready` reaches only a register here, not the count's adder and Gray code
        # (on the 16x16 SoC at badc2c0 that path, from the scratchpad's write port, was among
        # the compute clock's slowest, docs/boards.md).
        m.d[self.r_domain] += took_in_reset.eq(fifo.r_rst)
        taken = Signal(COUNT_BITS)
        taken_gray = Signal(COUNT_BITS)
        taken_next = Mux(took_in_reset, 0, taken) + took
        m.d[self.r_domain] += [taken.eq(taken_next), taken_gray.eq(gray_code(taken_next[:COUNT_BITS]))]
        synced = Signal(COUNT_BITS)
        m.submodules.drained_cdc = FFSynchronizer(taken_gray, synced, o_domain=self.w_domain)
        m.d[self.w_domain] += self.drained.eq(gray_binary(synced))
        return m


class DrainedGate(wiring.Component):
    """Events (``i``, one cycle each) given out on ``o`` (a register, in order, at most one per
    cycle) only once every item the ``crossings`` (:class:`StreamCrossing` write sides, their
    ``sent`` and ``drained`` inputs here) had been sent by the event's cycle has been taken
    on their read side. Up to ``depth`` events may wait; ``pending`` is high while one does
    (or is being given out). All in one domain, the crossings' write domain."""

    def __init__(self, crossings: int, *, depth: int = 8):
        if isinstance(crossings, bool) or not isinstance(crossings, int) or crossings < 1:
            raise ValueError(f"crossings must be a positive integer, not {crossings!r}")
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be a positive integer, not {depth!r}")
        self.crossings = crossings
        self.depth = depth
        members = {"i": In(1), "o": Out(1), "pending": Out(1)}
        for n in range(crossings):
            members[f"sent_{n}"] = In(COUNT_BITS)
            members[f"drained_{n}"] = In(COUNT_BITS)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.targets = targets = SyncFIFOBuffered(width=COUNT_BITS * self.crossings,
                                                          depth=self.depth)
        m.d.comb += [targets.w_en.eq(self.i),
                     targets.w_data.eq(Cat(*(getattr(self, f"sent_{n}") for n in range(self.crossings))))]
        half = 1 << (COUNT_BITS - 1)
        reached = []
        for n in range(self.crossings):
            target = targets.r_data[n * COUNT_BITS:(n + 1) * COUNT_BITS]
            # drained has come as far as target (modulo the count's range)
            reached.append((getattr(self, f"drained_{n}") - target)[:COUNT_BITS] < half)
        ready = Signal()
        m.d.comb += [ready.eq(targets.r_rdy & Cat(*reached).all()), targets.r_en.eq(ready)]
        m.d.sync += self.o.eq(ready)
        m.d.comb += self.pending.eq(targets.r_rdy | self.o)
        return m


class EventCrossing(wiring.Component):
    """Events from ``i_domain`` (``i`` high for one cycle per event, in any number of
    consecutive cycles) to ``o_domain`` (``o`` high for one cycle per event, at most one per
    cycle, in order). At most ``2**(COUNT_BITS - 1) - 1`` events may be in flight (raised on
    ``i`` and not yet given out on ``o``); ``pending`` (in ``o_domain``) is high while events
    have arrived and not been given out."""

    i: In(1)
    o: Out(1)
    pending: Out(1)

    def __init__(self, *, i_domain: str = "sync", o_domain: str):
        if i_domain == o_domain:
            raise ValueError(f"i_domain and o_domain must differ, both are {i_domain!r}")
        self.i_domain = i_domain
        self.o_domain = o_domain
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        count = Signal(COUNT_BITS)
        count_gray = Signal(COUNT_BITS)
        with m.If(self.i):
            m.d[self.i_domain] += [count.eq(count + 1), count_gray.eq(gray_code((count + 1)[:COUNT_BITS]))]
        synced = Signal(COUNT_BITS)
        m.submodules.count_cdc = FFSynchronizer(count_gray, synced, o_domain=self.o_domain)
        arrived = Signal(COUNT_BITS)
        given = Signal(COUNT_BITS)
        m.d[self.o_domain] += arrived.eq(gray_binary(synced))
        m.d.comb += [self.pending.eq(arrived != given), self.o.eq(self.pending)]
        with m.If(self.o):
            m.d[self.o_domain] += given.eq(given + 1)
        return m


class CountCrossing(wiring.Component):
    """Per-cycle increments in ``i_domain`` (input ``i_<name>`` for each ``name`` of
    ``increment_bits``, of that many bits) summed and carried to ``o_domain``, where ``o_<name>``
    (``total_bits`` wide) is the sum of the increments since the last snapshot in the cycle a
    snapshot arrives, 0 otherwise, and ``round`` is high in that cycle.

    Snapshots follow each other as fast as the handshake allows (about two synchronizer delays
    each way). A snapshot taken after an event in ``i_domain`` holds every increment up to it:
    the second snapshot to arrive after the event has crossed (as another signal of the same
    two-register kind) was taken after it (each increment enters the running total through a
    register, a cycle after its own, and a snapshot copies the total, so it holds the increments
    up to two cycles before it is taken; the second snapshot is taken later still, after the
    first one's acknowledgement has crossed back through two registers). The increments
    between two snapshots must sum to less than ``2**total_bits``."""

    def __init__(self, increment_bits: dict[str, int], *, total_bits: int = 24, i_domain: str,
                 o_domain: str = "sync"):
        if i_domain == o_domain:
            raise ValueError(f"i_domain and o_domain must differ, both are {i_domain!r}")
        if not increment_bits:
            raise ValueError("increment_bits must name at least one counter")
        for name, bits in increment_bits.items():
            if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= total_bits:
                raise ValueError(f"increment_bits[{name!r}] must be between 1 and total_bits "
                                 f"({total_bits}), not {bits!r}")
        self.increment_bits = dict(increment_bits)
        self.total_bits = total_bits
        self.i_domain = i_domain
        self.o_domain = o_domain
        members = {"round": Out(1)}
        for name, bits in increment_bits.items():
            members[f"i_{name}"] = In(bits)
            members[f"o_{name}"] = Out(total_bits)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        req, ack = Signal(), Signal()           # toggles: req in i_domain, ack in o_domain
        req_o, ack_i = Signal(), Signal()
        m.submodules.req_cdc = FFSynchronizer(req, req_o, o_domain=self.o_domain)
        m.submodules.ack_cdc = FFSynchronizer(ack, ack_i, o_domain=self.i_domain)
        take = ack_i == req                     # i_domain: the last snapshot has been read
        arrived = req_o != ack                  # o_domain: a snapshot waits to be read
        m.d.comb += self.round.eq(arrived)
        with m.If(take):
            m.d[self.i_domain] += req.eq(~req)
        with m.If(arrived):
            m.d[self.o_domain] += ack.eq(~ack)
        for name in self.increment_bits:
            total = Signal(self.total_bits, name=f"total_{name}")
            snapshot = Signal(self.total_bits, name=f"snapshot_{name}")
            previous = Signal(self.total_bits, name=f"previous_{name}")
            # the increment is registered as it arrives, so that the logic producing it (an
            # array's handshake) reaches no adder in the cycle it changes
            increment = Signal.like(getattr(self, f"i_{name}"), name=f"increment_{name}")
            m.d[self.i_domain] += increment.eq(getattr(self, f"i_{name}"))
            # the snapshot copies the running total register (no adder before it: on the 16x16
            # SoC at bd14ae3 the total's carry chain into the snapshot took 10.5 ns); it holds
            # the increments up to two cycles before the take
            m.d[self.i_domain] += total.eq((total + increment)[:self.total_bits])
            with m.If(take):
                m.d[self.i_domain] += snapshot.eq(total)
            with m.If(arrived):
                m.d.comb += getattr(self, f"o_{name}").eq((snapshot - previous)[:self.total_bits])
                m.d[self.o_domain] += previous.eq(snapshot)
        return m


class ResetCrossing(wiring.Component):
    """A reset requested in ``i_domain`` (``request`` high for a cycle) and applied in
    ``o_domain``: ``reset`` (a register of ``o_domain``, to drive that domain's reset) is high
    from when the request arrives for at least ``cycles`` cycles of ``o_domain``, and also for
    ``cycles`` cycles from power-on. ``busy`` (in ``i_domain``) is high from the request until
    ``reset`` has dropped and the source has seen that (a request / acknowledge handshake over
    two synchronizers). A request while ``busy`` is high is covered by the reset in progress.

    ``reset`` and the registers behind it are never reset themselves (they start as after a
    request, so the destination domain starts in reset)."""

    request: In(1)
    busy: Out(1)
    reset: Out(1)

    def __init__(self, *, i_domain: str = "sync", o_domain: str, cycles: int = 4):
        if i_domain == o_domain:
            raise ValueError(f"i_domain and o_domain must differ, both are {i_domain!r}")
        if isinstance(cycles, bool) or not isinstance(cycles, int) or cycles < 1:
            raise ValueError(f"cycles must be a positive integer, not {cycles!r}")
        self.i_domain = i_domain
        self.o_domain = o_domain
        self.cycles = cycles
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        # i_domain: the request is held until the destination acknowledges it, and busy lasts
        # until the acknowledgement has dropped too
        req = Signal()
        ack_i = Signal()
        with m.If(self.request & ~self.busy):
            m.d[self.i_domain] += req.eq(1)
        with m.Elif(ack_i):
            m.d[self.i_domain] += req.eq(0)
        m.d.comb += self.busy.eq(req | ack_i)
        # o_domain: in reset while the request is seen and until `cycles` cycles of reset have
        # passed; acknowledged once they have, and the acknowledgement drops the cycle after
        # the reset does (so busy outlasts the reset)
        req_o = Signal()
        m.submodules.req_cdc = FFSynchronizer(req, req_o, o_domain=self.o_domain)
        held = Signal(range(self.cycles + 1), reset_less=True)
        ack_o = Signal(reset_less=True)
        reset = Signal(init=1, reset_less=True)
        # the output: a copy of `reset` a cycle later whose only load is the port, so that the
        # register can sit beside whatever buffers the reset out to its domain (on ECP5 a global
        # clock buffer at a fixed site: hw/top.py); the acknowledgement follows the copy
        out = Signal(init=1, reset_less=True)
        enough = held == self.cycles
        m.d[self.o_domain] += [
            held.eq(Mux(reset, Mux(enough, held, held + 1), 0)),
            reset.eq(req_o | (reset & ~enough)),
            out.eq(reset),
            ack_o.eq(out & enough),
        ]
        m.d.comb += self.reset.eq(out)
        m.submodules.ack_cdc = FFSynchronizer(ack_o, ack_i, o_domain=self.i_domain)
        return m
