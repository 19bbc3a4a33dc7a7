"""Interconnect: the AXI4 read arbiter and a stream register.

:class:`ReadArbiter` — several read managers (instruction fetch, LOAD, residual reads) share one
AXI4 read channel pair with a single ID.

Bursts are granted round-robin on AR; the owner of each granted burst is queued so that the
in-order R beats go back to the manager that asked for them (a single-ID subordinate answers in
order). The owner FIFO is deep enough for every burst the managers can have in flight.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Shape, Signal, Value
from amaranth.hdl import ShapeLike
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from .axi import AddressLayout, ReadDataLayout
from .dsp import COPY_GROUP_BITS, group_enables

__all__ = ["ReadArbiter", "StreamRegister", "SpacedStreamRegister", "HalfRateRegister", "recent_keys"]


class ReadArbiter(wiring.Component):
    """``managers[i]`` are subordinate-side ports (``ar`` in, ``r`` out) for ``count`` managers;
    ``bus`` is the shared manager-side port."""

    def __init__(self, count: int, *, addr_width: int = 32, data_width: int = 64, max_in_flight: int = 16):
        if not isinstance(count, int) or count < 1:
            raise ValueError(f"count must be a positive integer, not {count!r}")
        if not isinstance(max_in_flight, int) or max_in_flight < 1:
            raise ValueError(f"max_in_flight must be a positive integer, not {max_in_flight!r}")
        self.count = count
        self.max_in_flight = max_in_flight
        port = wiring.Signature({
            "ar": Out(stream.Signature(AddressLayout(addr_width))),
            "r": In(stream.Signature(ReadDataLayout(data_width))),
        })
        super().__init__({
            "managers": In(port).array(count),
            "bus": Out(port),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.count
        m.submodules.owners = owners = fifo.SyncFIFOBuffered(width=max(1, (n - 1).bit_length()),
                                                             depth=self.max_in_flight)

        # AR: round-robin among requesting managers, only while the owner FIFO has room
        last = Signal(range(max(2, n)))
        grant = Signal(range(max(2, n)))
        any_req = Signal()
        for offset in reversed(range(n)):
            # the first requester after `last` wins; iterate so that the highest priority is assigned last
            for base in range(n):
                index = (base + 1 + offset) % n
                with m.If((last == base) & self.managers[index].ar.valid):
                    m.d.comb += [grant.eq(index), any_req.eq(1)]
        with m.Switch(grant):
            for i in range(n):
                with m.Case(i):
                    m.d.comb += [
                        self.bus.ar.valid.eq(self.managers[i].ar.valid & owners.w_rdy),
                        self.bus.ar.payload.eq(self.managers[i].ar.payload),
                        self.managers[i].ar.ready.eq(self.bus.ar.ready & owners.w_rdy),
                    ]
        ar_fire = self.bus.ar.valid & self.bus.ar.ready
        m.d.comb += [owners.w_data.eq(grant), owners.w_en.eq(ar_fire & any_req)]
        with m.If(ar_fire & any_req):
            m.d.sync += last.eq(grant)

        # R: to the owner at the head of the FIFO
        with m.Switch(owners.r_data):
            for i in range(n):
                with m.Case(i):
                    m.d.comb += [
                        self.managers[i].r.valid.eq(self.bus.r.valid & owners.r_rdy),
                        self.managers[i].r.payload.eq(self.bus.r.payload),
                        self.bus.r.ready.eq(self.managers[i].r.ready & owners.r_rdy),
                    ]
        m.d.comb += owners.r_en.eq(self.bus.r.valid & self.bus.r.ready & self.bus.r.payload.last)
        return m


class _StreamStage(wiring.Component):
    """A stream in (``i``) and the same stream out (``o``)."""

    def __init__(self, payload_shape: ShapeLike):
        super().__init__({
            "i": In(stream.Signature(payload_shape)),
            "o": Out(stream.Signature(payload_shape)),
        })


class StreamRegister(_StreamStage):
    """A two-entry stream register (skid buffer) that cuts every combinational path between its
    two sides: ``o.valid`` and ``o.payload`` come from registers, and ``i.ready`` is a register
    (high while the spare entry is empty), so a consumer's ``ready`` does not reach the producer
    in the same cycle. One cycle of latency; a transfer every cycle while ``o.ready`` stays high.
    Items leave in order, none lost or repeated.

    Only the two valid flags are reset: the payload registers, qualified by them, are not (a
    reset reaches a few flip-flops rather than two payloads' worth, which on a wide stream such
    as an accumulator row is over a thousand). The spare entry takes the input in every cycle it
    is empty, so its load enable is its own valid flag, a register: only the output register's
    enable depends on the consumer's ``ready`` (on the 16x16 ULX3S SoC the spare's enables, made
    from a far consumer's ``ready``, were many of the slowest endpoints, docs/boards.md)."""

    def elaborate(self, platform):
        m = Module()
        spare = Signal.like(self.i.payload, reset_less=True)
        spare_valid = Signal()
        payload = Signal.like(self.i.payload, reset_less=True)
        m.d.comb += [self.i.ready.eq(~spare_valid), self.o.payload.eq(payload)]
        # the spare takes the input in every cycle it is empty, needed or not (its valid flag says
        # whether it holds an item): its load enable is a register, not the consumer's `ready`
        with m.If(~spare_valid):
            m.d.sync += spare.eq(self.i.payload)
        with m.If(~self.o.valid | self.o.ready):        # the output register is free this cycle
            m.d.sync += [
                self.o.valid.eq(spare_valid | self.i.valid),
                payload.eq(Mux(spare_valid, spare, self.i.payload)),
                spare_valid.eq(0),
            ]
        with m.Elif(self.i.valid & ~spare_valid):       # the output waits: the item into the spare
            m.d.sync += spare_valid.eq(1)
        return m


def recent_keys(m: Module, taken: Value, key: Value, count: int, name: str) -> list[tuple[Signal, Signal]]:
    """Registers in ``m`` of the last ``count`` cycles' (``taken``, ``key``), newest first: entry j
    holds whether an item was taken ``j + 1`` cycles ago and its key. The history behind
    :class:`SpacedStreamRegister`'s wait, and behind the same wait made in the cycle."""
    entries = [(Signal(name=f"{name}{j}_valid"), Signal.like(key, name=f"{name}{j}_key"))
               for j in range(count)]
    previous = (taken, key)
    for entry in entries:
        m.d.sync += [register.eq(value) for register, value in zip(entry, previous, strict=True)]
        previous = entry
    return entries


class SpacedStreamRegister(_StreamStage):
    """A :class:`StreamRegister` whose items keep a distance: an item whose ``flag`` field is set
    does not leave within ``spacing - 1`` cycles after an item with the same ``key`` field
    (flagged or not) left; it waits at the output (``o.valid`` low) until then. Other items are
    not held, and none leaves before the item ahead of it.

    The wait is made a cycle ahead, in two registers: in each cycle one takes the comparison of
    the item the output register takes if it is free (the spare entry or the input) with the
    keys of the items that will then be the last ``spacing - 1`` to have left (those that left
    before and, when the register held an item, that one), the other the same for the item it
    holds if it stays; a third register says whether the output register was free, and picks.
    So ``o.valid`` is a function of four registers (one LUT4), neither wait depends on
    ``o.ready`` (on the 16x16 ULX3S SoC the consumer's take into the wait's comparisons and
    multiplexers ended a compute-clock path of 10.7 ns), and the output register's load enable
    depends on ``o.ready`` and those registers only, as a :class:`StreamRegister`'s: no
    comparison lies between the output register's payload and its own enable.

    ``payload_shape`` must be a :class:`~amaranth.lib.data.StructLayout` with the fields named by
    ``key`` and ``flag`` (one bit); ``spacing`` is at least 1 (1: never held).
    """

    def __init__(self, payload_shape: data.StructLayout, *, key: str, flag: str, spacing: int) -> None:
        if not isinstance(payload_shape, data.StructLayout):
            raise TypeError(f"payload_shape must be a StructLayout, not {payload_shape!r}")
        fields = dict(payload_shape.members)
        for role, name in (("key", key), ("flag", flag)):
            if name not in fields:
                raise ValueError(f"{role} must name a field of the payload ({', '.join(fields)}), "
                                 f"not {name!r}")
        flag_shape = fields[flag]
        if (flag_shape.size if isinstance(flag_shape, data.Layout) else Shape.cast(flag_shape).width) != 1:
            raise ValueError(f"flag must name a one-bit field, not {flag!r} of {fields[flag]!r}")
        if isinstance(spacing, bool) or not isinstance(spacing, int) or spacing < 1:
            raise ValueError(f"spacing must be an integer of at least 1, not {spacing!r}")
        self._key, self._flag, self.spacing = key, flag, spacing
        super().__init__(payload_shape)

    def elaborate(self, platform):
        m = Module()
        key, flag = self._key, self._flag
        spare = Signal.like(self.i.payload, reset_less=True)      # (qualified by the valids)
        spare_valid = Signal()
        out = Signal.like(self.i.payload, reset_less=True)
        out_valid = Signal()
        # the wait of the item in the output register: `hold_next` if the register took an item
        # in the last cycle (`took`), else `hold_stay`; both registers made without `o.ready`
        hold_next = Signal()
        hold_stay = Signal()
        took = Signal()
        hold = Mux(took, hold_next, hold_stay)
        fire = Signal()
        free = Signal()
        # the keys of the items that left in the last spacing - 1 cycles, newest first
        left = recent_keys(m, fire, out[key], self.spacing - 1, "left")
        m.d.comb += [
            self.i.ready.eq(~spare_valid),
            self.o.valid.eq(out_valid & ~hold),
            self.o.payload.eq(out),
            fire.eq(self.o.valid & self.o.ready),
            free.eq(~out_valid | fire),         # the output register takes the next item
        ]

        def waits(item: data.View, leaving: bool) -> object:
            """Whether ``item`` in the output register next cycle must wait then: its key among
            the items that will have left in the last spacing - 1 cycles (``leaving``: the item
            in the output register leaves in this cycle)."""
            same = [valid & (k == item[key]) for valid, k in left[:-1]]
            if leaving and left:
                same.append(out[key] == item[key])
            return item[flag] & (Cat(*same).any() if same else Const(0))

        # the next item: it enters the output register when that is free, which with an item in
        # it means that item leaves (out_valid, a register, tells which case without o.ready)
        # (the spare and the input compared each, the choice after the comparisons: on the 16x16
        # ULX3S SoC at 941a5dc the choice before them was one level of a 12.9 ns path)
        following = Signal.like(self.i.payload)
        m.d.comb += following.eq(Mux(spare_valid, spare, self.i.payload))

        def next_waits(leaving: bool) -> object:
            return Mux(spare_valid, waits(spare, leaving), waits(self.i.payload, leaving))

        m.d.sync += [
            took.eq(free),
            hold_next.eq(Mux(out_valid, next_waits(True), next_waits(False))),
            hold_stay.eq(waits(out, False)),
        ]
        with m.If(free):
            m.d.sync += [
                out_valid.eq(spare_valid | self.i.valid),
                out.eq(following),
                spare_valid.eq(0),
            ]
        with m.Else():                          # the item stays (none leaves this cycle)
            with m.If(self.i.valid & ~spare_valid):
                m.d.sync += spare_valid.eq(1)
        # as StreamRegister's: the spare's load enable is a register
        with m.If(~spare_valid):
            m.d.sync += spare.eq(self.i.payload)
        return m


class HalfRateRegister(_StreamStage):
    """A one-entry stream register for wide payloads that are rare: ``o.valid`` and ``o.payload``
    are registers, and ``i.ready`` is the register's emptiness, so no combinational path crosses
    it; unlike :class:`StreamRegister` it has no spare entry and no multiplexer per payload bit
    (the payload register is loaded through its enable), at the price of one transfer every other
    cycle at most. One cycle of latency; items leave in order, none lost or repeated. Used for
    the instructions of the load and store units, each of which takes many cycles. Only the
    valid flag is reset, not the payload register.

    The payload register takes the input in every cycle it is empty, needed or not (the valid
    flag says whether it holds an item), so its load enable is the emptiness, a register, not
    the producer's ``valid``. With ``enable_copies`` a payload wider than
    :data:`~systolic.hw.dsp.COPY_GROUP_BITS` loads in groups of that many bits, each under a copy
    of its own of the emptiness (:func:`~systolic.hw.dsp.group_enables`: on ECP5 TRELLIS_FFs
    that yosys does not merge), so that no net reaches every bit (on the 16x16 SoC at c9b81ec the
    accumulator-row crossing's 512 enables, one net, arrived at 11.3 ns). The copies are reset by
    the domain's own reset only (an instance's reset, which a ``ResetInserter`` does not reach):
    for a register in a domain whose reset is a real one, as a clock-domain crossing's side."""

    def __init__(self, payload_shape: ShapeLike, *, enable_copies: bool = False):
        if not isinstance(enable_copies, bool):
            raise TypeError(f"enable_copies must be a bool, not {enable_copies!r}")
        self.enable_copies = enable_copies
        super().__init__(payload_shape)

    def elaborate(self, platform):
        m = Module()
        payload = Signal.like(self.i.payload, reset_less=True)
        m.d.comb += [self.i.ready.eq(~self.o.valid), self.o.payload.eq(payload)]
        full_next = Mux(self.o.valid, ~self.o.ready, self.i.valid)
        m.d.sync += self.o.valid.eq(full_next)
        width = len(Value.cast(payload))
        loads = [(slice(0, width), ~self.o.valid)]
        if self.enable_copies and width > COPY_GROUP_BITS:
            loads = group_enables(m, "empty", ~full_next, width, platform=platform, init=1)
        for bits, empty in loads:
            with m.If(empty):
                m.d.sync += Value.cast(payload)[bits].eq(Value.cast(self.i.payload)[bits])
        return m
