"""Instruction fetch, dispatch, dependency tokens and per-queue sequencing.

* :class:`Fetcher` reads ``prog_len`` instruction words from DRAM at ``prog_addr`` in AXI4 bursts,
  ahead of the dispatcher, into a FIFO of bus beats, and hands them out one beat per cycle.
* :class:`Dispatcher` checks each word (opcode, dependency flags legal for its queue, reserved
  bits) as its beats pass into a decode register, writes them from there into the
  :class:`InstructionQueue` of the word's queue (no whole word is ever assembled in between),
  commits the entry with the last beat, and executes FINISH: once every queue is empty and every
  unit idle it raises ``done``. An illegal word stops dispatch with an error code and the program
  counter of the word.
* :class:`InstructionQueue` holds a queue's instructions, keeping only the bits its units read.
* :class:`TokenChannel` counts dependency tokens from one queue to a neighbour.
* :class:`Sequencer` runs one queue: pops the tokens an instruction asks for, issues it to its unit,
  and pushes its tokens once the unit reports it complete — without holding back the next
  instruction, so that consecutive instructions of a unit overlap (no bubble between COMPUTEs).
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.hdl import ResetInserter
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .axi import RESP_OKAY, AddressLayout, ReadDataLayout
from .config import AcceleratorConfig
from .isa import HEADER_LAYOUT, INSTR_BITS, INSTR_BYTES, LAYOUTS, QUEUE_OF, Opcode, Queue

__all__ = ["InstructionLayout", "BeatLayout", "Fetcher", "InstructionQueue", "Dispatcher", "TokenChannel",
           "Sequencer", "queue_kept_ranges", "ERR_ILLEGAL", "ERR_SLVERR", "ERR_DECERR", "ERR_FLAGS",
           "ERR_NO_FINISH", "used_bits"]

ERR_ILLEGAL, ERR_SLVERR, ERR_DECERR, ERR_FLAGS, ERR_NO_FINISH = 1, 2, 3, 4, 5


class InstructionLayout(data.StructLayout):
    """An instruction word with its program counter (index in the program)."""

    def __init__(self):
        super().__init__({"word": INSTR_BITS, "pc": 32})


def _beats_per_instr(config: AcceleratorConfig) -> int:
    """Bus beats of one instruction word."""
    return INSTR_BYTES // config.dma_bytes


class BeatLayout(data.StructLayout):
    """One bus beat of an instruction word: ``data`` (beat ``index`` holds word bits
    ``[index * dma_data_bits, (index + 1) * dma_data_bits)``) and the word's program counter."""

    def __init__(self, config: AcceleratorConfig):
        super().__init__({"data": config.dma_data_bits, "index": range(_beats_per_instr(config)),
                          "pc": config.pc_bits})


def _words_per_burst(config: AcceleratorConfig) -> int:
    """Instruction words the Fetcher asks for in one burst: as many as ``dma_max_burst`` beats
    hold, at most 2 (so that two bursts in flight fit a small FIFO)."""
    return max(1, min(2, config.dma_max_burst // _beats_per_instr(config)))


class Fetcher(wiring.Component):
    """Reads the program and hands its words out on ``beats``, one bus beat per cycle; ``error``
    is an AXI error response code (SLVERR/DECERR) of a beat of the program.

    The beats of ``depth`` words (default: two bursts' worth, 2 or 4 words) are fetched ahead of
    the dispatcher into a FIFO of beats (block RAM, not flip-flops). A burst is only asked for
    when the FIFO has room for all its beats, so the read channel never waits for the fetcher
    (other managers' data behind it would wait too); :attr:`max_bursts` bursts are at most in
    flight. The address request is a register: once offered, it stays until it is taken.

    ``start`` begins a program whatever came before (one finished, halted, or never started):
    it empties the FIFO, takes ``prog_len`` (at most ``dram_bytes / 64`` words) and ``prog_addr``,
    and drops the beats of earlier bursts still in flight; the new program's first burst is asked
    for once they have all arrived. ``abort`` stops fetching. Later writes of ``prog_len`` do not
    change a running program.
    """

    def __init__(self, config: AcceleratorConfig, *, depth: int | None = None):
        self.config = config
        self.depth = 2 * _words_per_burst(config) if depth is None else depth
        if not isinstance(self.depth, int) or self.depth < _words_per_burst(config):
            raise ValueError(f"depth must be an integer of at least {_words_per_burst(config)} words "
                             f"(one burst), not {depth!r}")
        super().__init__({
            "start": In(1),
            "abort": In(1),
            "prog_addr": In(32),
            "prog_len": In(32),
            "ar": Out(stream.Signature(AddressLayout(32))),
            "r": In(stream.Signature(ReadDataLayout(config.dma_data_bits))),
            "beats": Out(stream.Signature(BeatLayout(config))),
            "error": Out(2),
            "exhausted": Out(1),      # every instruction of the program was handed out
        })

    @property
    def max_bursts(self) -> int:
        """Bursts the fetcher may have in flight (each holds at least one word)."""
        return self.depth

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        BB = cfg.dma_bytes
        beats_per_instr = _beats_per_instr(cfg)
        instrs_per_burst = _words_per_burst(cfg)   # a burst fetches whole words
        capacity = self.depth * beats_per_instr    # beats
        max_words = cfg.dram_bytes // INSTR_BYTES

        # start empties the FIFO (its pointers and level; the stale entries are never read). Never
        # in block RAM (hw/fifo.py): its read data feed the instruction decoder.
        beats = fifo.SyncFIFOBuffered(width=8 * BB, depth=capacity)
        m.submodules.beats = ResetInserter(self.start)(beats)

        active = Signal()
        remaining = Signal(cfg.pc_bits)            # words not yet asked for
        received = Signal(cfg.pc_bits)            # words handed out: the pc of the next one
        reserved = Signal(range(capacity + 1))    # FIFO entries promised to this program's beats
        stale = Signal(range(capacity + 1))       # beats of an earlier program still to arrive
        next_addr = Signal(32)
        index = Signal(range(beats_per_instr))    # beat of the current word handed out next

        # -- address requests: one registered request at a time -------------------------------
        # The next burst's size and whether the FIFO has room for it are registers, computed
        # from the cycle before: `settled` holds requests off for the cycle after a request or
        # a start, whose new counts they do not reflect yet. Room only grows otherwise (the
        # FIFO's reader frees entries, arriving beats move from `reserved` to the FIFO), so a
        # cycle-old answer is safe.
        wanted = Signal(range(instrs_per_burst + 1))
        m.d.comb += wanted.eq(Mux(remaining > instrs_per_burst, instrs_per_burst, remaining))
        # a burst must not cross a 4 KiB boundary (instruction words are 64-byte aligned)
        to_boundary = Signal(range(4096 // INSTR_BYTES + 1))
        m.d.comb += to_boundary.eq((4096 - next_addr[:12]) // INSTR_BYTES)
        count = Signal(range(instrs_per_burst + 1))
        free = Signal(range(capacity + 1))
        room = Signal()
        settled = Signal()
        m.d.comb += free.eq(capacity - beats.level - reserved)
        m.d.sync += [
            count.eq(Mux(to_boundary < wanted, to_boundary, wanted)),
            room.eq(free >= Mux(to_boundary < wanted, to_boundary, wanted) * beats_per_instr),
            settled.eq(1),
        ]
        issue = Signal()
        m.d.comb += issue.eq(active & settled & ~self.start & ~self.abort & ~self.ar.valid &
                             (stale == 0) & (count != 0) & room)
        with m.If(self.ar.valid & self.ar.ready):
            m.d.sync += self.ar.valid.eq(0)
        with m.If(issue):
            m.d.sync += [
                self.ar.valid.eq(1),
                self.ar.payload.addr.eq(next_addr),
                self.ar.payload.len.eq(count * beats_per_instr - 1),
                remaining.eq(remaining - count),
                next_addr.eq(next_addr + count * INSTR_BYTES),
                settled.eq(0),
            ]
        m.d.comb += self.ar.payload.size.eq((BB - 1).bit_length())

        # -- data beats: an earlier program's first, then this program's into the FIFO ---------
        arriving = self.r.valid
        dropping = Signal()
        m.d.comb += [
            dropping.eq(stale != 0),
            self.r.ready.eq(1),
            beats.w_data.eq(self.r.payload.data),
            beats.w_en.eq(arriving & ~dropping & active),
        ]
        with m.If(arriving & ~dropping & active & (self.r.payload.resp != RESP_OKAY)):
            m.d.sync += self.error.eq(self.r.payload.resp)
        m.d.sync += [
            reserved.eq(reserved + Mux(issue, count * beats_per_instr, 0) - (arriving & ~dropping)),
            stale.eq(stale - (arriving & dropping)),
        ]

        # -- beats out ------------------------------------------------------------------------
        m.d.comb += [
            self.beats.valid.eq(active & beats.r_rdy),
            self.beats.payload.data.eq(beats.r_data),
            self.beats.payload.index.eq(index),
            self.beats.payload.pc.eq(received),
            beats.r_en.eq(self.beats.ready),
            self.exhausted.eq(active & (remaining == 0) & ~self.ar.valid & (reserved == 0) &
                              (beats.level == 0)),
        ]
        with m.If(self.beats.valid & self.beats.ready):
            with m.If(index == beats_per_instr - 1):
                m.d.sync += [index.eq(0), received.eq(received + 1)]
            with m.Else():
                m.d.sync += index.eq(index + 1)

        with m.If(self.start):
            # every beat still to arrive (this cycle's excepted) belongs to an earlier program
            m.d.sync += [
                active.eq(1), received.eq(0), index.eq(0), reserved.eq(0), self.error.eq(0), settled.eq(0),
                stale.eq(stale + reserved - arriving),
                remaining.eq(Mux(self.prog_len > max_words, max_words, self.prog_len)),
                next_addr.eq(self.prog_addr),
            ]
        with m.Elif(self.abort):
            m.d.sync += active.eq(0)
        return m


_LEGAL_FLAGS = {
    # queue: (pop_prev, pop_next, push_prev, push_next) allowed
    Queue.LOAD: (0, 1, 0, 1),
    Queue.COMPUTE: (1, 1, 1, 1),
    Queue.STORE: (1, 0, 1, 0),
}


def used_bits(op: Opcode) -> int:
    """Bits of an ``op`` instruction word up to the end of its last field (the rest reserved)."""
    return max(f.offset + f.width for name, f in LAYOUTS[op] if name != "_reserved")


#: Opcodes each queue executes (SYNC on any).
_QUEUE_OPS = {q: [op for op, queue in QUEUE_OF.items() if queue is q] + [Opcode.SYNC] for q in Queue}

_POOL_FIELDS = ("pool", "pool_h", "pool_w", "stride_h", "stride_w", "pad_top", "pad_left")


def _kept_widths(config: AcceleratorConfig, op: Opcode) -> dict[str, int]:
    """Low bits of each field of ``op`` that the units of ``config`` read, for every program the
    ISA allows: row addresses need no more bits than their memory has rows (a row past it is an
    error), the fields of SFU features the config lacks are unused (a STORE asking for one is an
    error, a CONFIG's value for it is never read), and a SYNC's queue is spent at dispatch."""
    widths = {name: f.width for name, f in LAYOUTS[op] if name != "_reserved"}

    def cut(name: str, bits: int) -> None:
        widths[name] = min(widths[name], bits)

    acts, pools = config.sfu_activations, config.sfu_pooling
    if op is Opcode.LOAD:
        cut("dst_addr", max(config.spad_addr_bits, config.acc_addr_bits, config.requant_addr_bits))
    elif op is Opcode.COMPUTE:
        cut("a_addr", config.spad_addr_bits)
        cut("b_addr", config.spad_addr_bits)
        cut("acc_addr", config.acc_addr_bits)
    elif op is Opcode.STORE:
        cut("acc_addr", config.acc_addr_bits)
        cut("qrow", config.requant_addr_bits)
        if not config.sfu_residual:
            cut("residual", 0)
            cut("res_addr", 0)
        if not pools:
            for name in _POOL_FIELDS:
                cut(name, 0)
        if not acts:
            cut("act", 0)
    elif op is Opcode.CONFIG:
        if "clip" not in acts:
            cut("act_lo", 0)
        if "relu6" not in acts and "clip" not in acts:
            cut("act_hi", 0)
        if "avg" not in pools:
            for name in ("avg_mult", "avg_shift", "avg_tie_out"):
                cut(name, 0)
        if not config.sfu_residual:
            cut("res_zp", 0)
            cut("res_mult", 0)
    elif op is Opcode.SYNC:
        cut("queue", 0)
    return widths


def queue_kept_ranges(config: AcceleratorConfig, queue: Queue) -> list[tuple[int, int]]:
    """Bit ranges ``[start, stop)`` of an instruction word that :class:`InstructionQueue` keeps
    for ``queue``: every bit an opcode executed by the queue has its units read
    (:func:`_kept_widths`); the other bits reach the units as zeros."""
    kept = set()
    for op in _QUEUE_OPS[queue]:
        for name, f in LAYOUTS[op]:
            if name != "_reserved":
                kept.update(range(f.offset, f.offset + _kept_widths(config, op).get(name, f.width)))
    ranges: list[tuple[int, int]] = []
    for bit in sorted(kept):
        if ranges and ranges[-1][1] == bit:
            ranges[-1] = (ranges[-1][0], bit + 1)
        else:
            ranges.append((bit, bit + 1))
    return ranges


class InstructionQueue(wiring.Component):
    """The ``depth`` instructions of one queue, written beat by beat.

    ``w`` takes the beats of a word in order (``w.ready`` when an entry is free; it stays high
    until the word is done); ``commit`` with the last beat makes the entry visible on ``r``,
    without it the entry is dropped (an illegal word) and the next word overwrites it. Only the
    bits of :func:`queue_kept_ranges` are stored, the others read zero. ``depth`` 1 is a single
    entry of flip-flops; otherwise an output entry and ``depth - 1`` entries of storage
    (flip-flops for one, memories for more: distributed RAM on ECP5), one memory per beat; the
    output entry takes the next instruction only while it is empty (its enables depend on no
    ``ready``), so instructions leave at most every other cycle.
    """

    def __init__(self, config: AcceleratorConfig, queue: Queue, depth: int):
        if not isinstance(depth, int) or not 1 <= depth <= 256:
            raise ValueError(f"depth must be an integer between 1 and 256, not {depth!r}")
        self.config = config
        self.queue = queue
        self.depth = depth
        super().__init__({
            "w": In(stream.Signature(BeatLayout(config))),
            "commit": In(1),
            "r": Out(stream.Signature(InstructionLayout())),
            "empty": Out(1),
        })

    def _lanes(self) -> list[tuple[int, list[tuple[int, int]]]]:
        """Per beat holding kept bits: (beat index, its kept word ranges)."""
        width = self.config.dma_data_bits
        lanes = []
        for beat in range(_beats_per_instr(self.config)):
            lo, hi = beat * width, (beat + 1) * width
            parts = [(max(a, lo), min(b, hi)) for a, b in queue_kept_ranges(self.config, self.queue)
                     if a < hi and b > lo]
            if parts:
                lanes.append((beat, parts))
        return lanes

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        width = cfg.dma_data_bits
        lanes = self._lanes()
        # lane 0 (beat 0 always holds the header) carries the pc too
        widths = [sum(b - a for a, b in parts) + (cfg.pc_bits if beat == 0 else 0) for beat, parts in lanes]
        beat_in = self.w.payload

        def lane_data(beat, parts):
            bits = [beat_in.data[a - beat * width:b - beat * width] for a, b in parts]
            return Cat(*bits, beat_in.pc) if beat == 0 else Cat(*bits)

        writing = self.w.valid & self.w.ready
        head = [Signal(w, name=f"head_{beat}") for w, (beat, _) in zip(widths, lanes, strict=True)]
        pop = self.r.valid & self.r.ready

        if self.depth == 1:
            full = Signal()
            m.d.comb += [self.w.ready.eq(~full), self.r.valid.eq(full), self.empty.eq(~full)]
            for reg, (beat, parts) in zip(head, lanes, strict=True):
                with m.If(writing & (beat_in.index == beat)):
                    m.d.sync += reg.eq(lane_data(beat, parts))
            with m.If(writing & self.commit):
                m.d.sync += full.eq(1)
            with m.Elif(pop):
                m.d.sync += full.eq(0)
        else:
            inner = self.depth - 1
            inner_level = Signal(range(inner + 1))
            inner_read = Signal()
            m.d.comb += [
                self.w.ready.eq(inner_level != inner),
                # the output entry is loaded only while it is empty, so that its enables come
                # from registers and not from the consumer's ready (whose logic crosses the
                # sequencer and the unit): an entry leaves at most every other cycle, far more
                # than the dispatcher's one word per beats_per_instruction cycles
                inner_read.eq((inner_level != 0) & ~self.r.valid),
                self.empty.eq((inner_level == 0) & ~self.r.valid),
            ]
            if inner == 1:
                for reg, (beat, parts), w in zip(head, lanes, widths, strict=True):
                    slot = Signal(w, name=f"slot_{beat}")
                    with m.If(writing & (beat_in.index == beat)):
                        m.d.sync += slot.eq(lane_data(beat, parts))
                    with m.If(inner_read):
                        m.d.sync += reg.eq(slot)
            else:
                produce = Signal(range(inner))
                consume = Signal(range(inner))
                for reg, (beat, parts), w in zip(head, lanes, widths, strict=True):
                    mem = Memory(shape=w, depth=inner, init=[])
                    m.submodules[f"lane_{beat}"] = mem
                    wp = mem.write_port()
                    rp = mem.read_port()
                    m.d.comb += [
                        wp.addr.eq(produce), wp.data.eq(lane_data(beat, parts)),
                        wp.en.eq(writing & (beat_in.index == beat)),
                        rp.addr.eq(consume), rp.en.eq(inner_read), reg.eq(rp.data),
                    ]
                with m.If(writing & self.commit):
                    m.d.sync += produce.eq(Mux(produce == inner - 1, 0, produce + 1))
                with m.If(inner_read):
                    m.d.sync += consume.eq(Mux(consume == inner - 1, 0, consume + 1))
            m.d.sync += inner_level.eq(inner_level + (writing & self.commit) - inner_read)
            with m.If(inner_read):
                m.d.sync += self.r.valid.eq(1)
            with m.Elif(self.r.ready):
                m.d.sync += self.r.valid.eq(0)

        # the word: kept bits where they belong, zeros elsewhere
        pieces = []
        for reg, (_, parts) in zip(head, lanes, strict=True):
            offset = 0
            for a, b in parts:
                pieces.append((a, reg[offset:offset + b - a]))
                offset += b - a
        word = []
        at = 0
        for a, value in sorted(pieces, key=lambda piece: piece[0]):
            if a > at:
                word.append(Const(0, a - at))
            word.append(value)
            at = a + len(value)
        m.d.comb += [self.r.payload.word.eq(Cat(*word)), self.r.payload.pc.eq(head[0][-cfg.pc_bits:])]
        return m


class Dispatcher(wiring.Component):
    """Checks instructions and hands them to the three queues; executes FINISH.

    Takes the program's words on ``beats``, one bus beat per cycle, decodes each beat into a
    register (one cycle) and writes it from there into the queue of its word; beat 0 (opcode,
    flags, a SYNC's queue) decides the queue and waits in the register until it has a free entry,
    every beat is checked for reserved bits, and the last one commits the word (or stops dispatch
    with its error). ``queues[q]`` are the queue outputs
    (``Queue`` order: load, compute, store). ``idle`` must be high when no unit or sequencer holds
    work. ``done`` rises after FINISH (or an error) once everything is idle. A unit's error
    (``unit_error``, with the index of its instruction, ``unit_error_pc``) stops dispatch a cycle
    after it appears (a word committed in that cycle is dropped with the rest of the queues).
    """

    def __init__(self, config: AcceleratorConfig):
        self.config = config
        super().__init__({
            "beats": In(stream.Signature(BeatLayout(config))),
            "queues": Out(stream.Signature(InstructionLayout())).array(3),
            "exhausted": In(1),
            "idle": In(1),
            "start": In(1),
            "fetch_error": In(2),
            "unit_error": In(4),
            "unit_error_pc": In(32),
            "halt": Out(1),
            "done": Out(1),
            "error": Out(4),
            "error_pc": Out(32),
            "stall_dispatch": Out(1),
            "stall_fetch": Out(1),
            "dispatched": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        width = cfg.dma_data_bits
        last_index = _beats_per_instr(cfg) - 1
        depths = (cfg.load_queue_depth, cfg.compute_queue_depth, cfg.store_queue_depth)
        beat = self.beats.payload
        queues = []
        for q, depth in enumerate(depths):
            queue = InstructionQueue(cfg, Queue(q), depth)
            m.submodules[f"queue_{Queue(q).name.lower()}"] = queue
            queues.append(queue)
            m.d.comb += [
                self.queues[q].valid.eq(queue.r.valid & ~self.halt),
                self.queues[q].payload.eq(queue.r.payload),
                queue.r.ready.eq(self.queues[q].ready | self.halt),
            ]

        # -- beat 0: opcode, queue, flags (kept for the word's other beats) ---------------------
        first = beat.index == 0
        header = data.View(HEADER_LAYOUT, beat.data[:8])
        opcode = header.opcode.as_value()
        head_target = Signal(range(3))
        head_known = Signal()          # an opcode of the ISA, and a SYNC names a queue
        head_queued = Signal()         # it goes to a queue (all but FINISH)
        head_flags_ok = Signal()
        with m.Switch(opcode):
            for op in Opcode:
                with m.Case(op.value):
                    m.d.comb += head_known.eq(1)
                    if op is Opcode.FINISH:
                        m.d.comb += head_flags_ok.eq(beat.data[4:8] == 0)
                        continue
                    m.d.comb += head_queued.eq(1)
                    if op is Opcode.SYNC:
                        queue = dict(LAYOUTS[op])["queue"]
                        queue_field = beat.data[queue.offset:queue.offset + queue.width]
                        m.d.comb += head_target.eq(queue_field)
                        with m.If(queue_field == 3):
                            m.d.comb += [head_known.eq(0), head_queued.eq(0)]
                    else:
                        m.d.comb += head_target.eq(QUEUE_OF[op].value)
                    with m.Switch(head_target):
                        for q, allowed in _LEGAL_FLAGS.items():
                            with m.Case(q.value):
                                bad = 0
                                bits = (header.pop_prev, header.pop_next, header.push_prev, header.push_next)
                                for bit, ok in zip(bits, allowed, strict=True):
                                    if not ok:
                                        bad = bad | bit
                                m.d.comb += head_flags_ok.eq(~bad)
        # head_known stays 0 for opcodes outside Opcode

        word_is = Signal(len(Opcode))      # the word's opcode, one-hot in Opcode order
        word_target = Signal(range(3))
        word_queued = Signal()
        word_illegal = Signal()        # unknown opcode or a reserved bit set, so far
        word_flags_bad = Signal()
        target = Mux(first, head_target, word_target)
        queued = Mux(first, head_queued, word_queued)

        # reserved bits in this beat: those at or above the end of the opcode's fields. Beat 0
        # decodes its opcode (only the shortest instructions end in it); the later beats use the
        # word's opcode, one-hot from beat 0 (a short path: timing)
        reserved_set = Signal()
        beat_any = beat.data.any()
        partial = {}

        def reserved_in_beat(code: Opcode):
            k, r = divmod(used_bits(code), width)
            if r not in partial:
                partial[r] = beat.data[r:].any()
            return Mux(beat.index > k, beat_any, Mux(beat.index == k, partial[r], 0))

        first_reserved = []
        later_reserved = []
        for i, code in enumerate(Opcode):
            if used_bits(code) < width:
                first_reserved.append((opcode == code.value) & beat.data[used_bits(code):].any())
            later_reserved.append(word_is[i] & reserved_in_beat(code))
        m.d.comb += reserved_set.eq(Mux(first, Cat(*first_reserved).any(), Cat(*later_reserved).any()))
        illegal = Signal()
        flags_bad = Signal()
        m.d.comb += [
            illegal.eq(Mux(first, ~head_known, word_illegal) | reserved_set),
            flags_bad.eq(Mux(first, ~head_flags_ok, word_flags_bad)),
        ]

        # A beat is decoded as it comes from the fetcher and waits in a decode register (`d_*`)
        # with its decisions (queue, legality); the queues are written from that register. So
        # no path runs from the fetcher's beat through the decoder into the queues' write
        # enables (timing); the register still passes one beat per cycle.
        dispatching = Signal()         # RUN, no error pending
        d_valid = Signal()
        d_beat = Signal.like(beat)
        d_first = Signal()
        d_last = Signal()
        d_target = Signal(range(3))
        d_queued = Signal()
        d_illegal = Signal()
        d_flags_bad = Signal()
        room = Signal()
        advance = Signal()             # the beat in the decode register goes into its queue
        m.d.comb += [
            room.eq(Cat(*(queue.w.ready for queue in queues)).bit_select(d_target, 1)),
            advance.eq(d_valid & dispatching & (~d_first | ~d_queued | room)),
        ]
        take = Signal()                # a beat from the fetcher enters the decode register
        m.d.comb += take.eq(self.beats.valid & self.beats.ready & dispatching)
        with m.If(take):
            m.d.sync += [word_illegal.eq(illegal), word_flags_bad.eq(flags_bad),
                         d_valid.eq(1), d_beat.eq(beat), d_first.eq(first),
                         d_last.eq(beat.index == last_index), d_target.eq(target), d_queued.eq(queued),
                         d_illegal.eq(illegal), d_flags_bad.eq(flags_bad)]
            with m.If(first):
                m.d.sync += [word_is.eq(Cat(*(opcode == code.value for code in Opcode))),
                             word_target.eq(head_target), word_queued.eq(head_queued)]
        with m.Elif(advance | ~dispatching):
            # a beat left behind when dispatch stops (FINISH, an error) is dropped
            m.d.sync += d_valid.eq(0)
        last = advance & d_last
        for q, queue in enumerate(queues):
            m.d.comb += [queue.w.payload.eq(d_beat),
                         queue.w.valid.eq(advance & d_queued & (d_target == q)),
                         queue.commit.eq(last & ~d_illegal & ~d_flags_bad)]

        emptied = Signal()
        m.d.comb += emptied.eq(queues[0].empty & queues[1].empty & queues[2].empty)
        # a unit's error stops dispatch a cycle late, from a register of its own, so that it
        # reaches the queues' write enables through no logic of the units (cleared by start, as
        # the units' errors are; FINISH looks at the units' errors themselves)
        unit_error = Signal.like(self.unit_error)
        unit_error_pc = Signal.like(self.unit_error_pc)
        m.d.sync += [unit_error.eq(Mux(self.start, 0, self.unit_error)),
                     unit_error_pc.eq(self.unit_error_pc)]
        with m.FSM(name="dispatch"):
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [self.done.eq(0), self.error.eq(0), self.error_pc.eq(0)]
                    m.next = "RUN"
            with m.State("RUN"):
                with m.If(self.fetch_error != 0):
                    m.d.sync += [self.error.eq(self.fetch_error), self.error_pc.eq(beat.pc)]
                    m.next = "HALT"
                with m.Elif(unit_error != 0):
                    m.d.sync += [self.error.eq(unit_error), self.error_pc.eq(unit_error_pc)]
                    m.next = "HALT"
                with m.Elif(self.beats.valid | d_valid):
                    # a word's first beat waits in the decode register for room in its queue;
                    # the rest follow
                    m.d.comb += [dispatching.eq(1), self.beats.ready.eq(~d_valid | advance),
                                 self.stall_dispatch.eq(d_valid & d_first & d_queued & ~room)]
                    # an illegal word halts dispatch (its verdict is a register: a short path)
                    with m.If(last & (d_illegal | d_flags_bad)):
                        m.d.sync += [self.error.eq(Mux(d_illegal, ERR_ILLEGAL, ERR_FLAGS)),
                                     self.error_pc.eq(d_beat.pc)]
                        m.next = "HALT"
                    with m.Elif(last):
                        m.d.comb += self.dispatched.eq(1)
                        with m.If(~d_queued):
                            m.next = "FINISH"
                with m.Elif(self.exhausted):
                    m.d.sync += [self.error.eq(ERR_NO_FINISH), self.error_pc.eq(beat.pc)]
                    m.next = "HALT"
                with m.Else():
                    m.d.comb += self.stall_fetch.eq(1)
            with m.State("FINISH"):
                with m.If(self.unit_error != 0):
                    m.d.sync += [self.error.eq(self.unit_error), self.error_pc.eq(self.unit_error_pc)]
                    m.next = "HALT"
                with m.Elif(self.idle & emptied):
                    m.d.sync += self.done.eq(1)
                    m.next = "IDLE"
            with m.State("HALT"):
                m.d.comb += self.halt.eq(1)
                m.d.comb += self.beats.ready.eq(1)      # drain the fetcher
                with m.If(self.idle & emptied):     # no stale entry for the next program
                    m.d.sync += self.done.eq(1)
                    m.next = "IDLE"
        return m


class TokenChannel(wiring.Component):
    """Tokens from one queue to a neighbour: at most ``depth``. ``push`` and ``pop`` are pulses; a
    pop is only legal when ``available`` and a push only when not ``full``."""

    def __init__(self, depth: int):
        self.depth = depth
        super().__init__({
            "push": In(1), "pop": In(1), "clear": In(1),
            "available": Out(1), "full": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        count = Signal(range(self.depth + 1))
        m.d.comb += [self.available.eq(count != 0), self.full.eq(count == self.depth)]
        m.d.sync += count.eq(count + self.push - self.pop)
        with m.If(self.clear):
            m.d.sync += count.eq(0)
        return m


class Sequencer(wiring.Component):
    """Runs one queue: token pops before issue, token pushes after completion.

    ``unit_cmd`` issues the instruction to the unit, which must raise ``unit_completed`` for one
    cycle when an instruction has completed (writes visible), in issue order.
    ``prev_*``/``next_*`` connect to the token channels toward the neighbouring queues.
    ``pending_depth``: instructions issued and not yet retired (their pushes still owed) that it
    keeps track of; when they are that many, the next issue waits. 8 covers the instructions a
    unit has in flight (at most 4 each) with SYNCs between them.
    """

    def __init__(self, *, pending_depth: int = 8):
        self.pending_depth = pending_depth
        super().__init__({
            "queue": In(stream.Signature(InstructionLayout())),
            "unit_cmd": Out(stream.Signature(InstructionLayout())),
            "unit_completed": In(1),
            "halt": In(1),
            "prev_available": In(1), "prev_pop": Out(1), "prev_full": In(1), "prev_push": Out(1),
            "next_available": In(1), "next_pop": Out(1), "next_full": In(1), "next_push": Out(1),
            "idle": Out(1),
            "stall_token": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        header = data.View(HEADER_LAYOUT, self.queue.payload.word[:8])
        is_sync = Signal()
        m.d.comb += is_sync.eq(header.opcode == Opcode.SYNC)

        # per issued instruction, in issue order: its pushes, and whether it is a SYNC (which
        # the sequencer executes itself: it completes when everything before it has)
        m.submodules.owed = owed = fifo.SyncFIFOBuffered(width=3, depth=self.pending_depth)

        # issue: pops first, both in one cycle when both are available
        pops_ok = Signal()
        m.d.comb += pops_ok.eq((~header.pop_prev | self.prev_available) &
                               (~header.pop_next | self.next_available))
        can_issue = Signal()
        m.d.comb += can_issue.eq(self.queue.valid & pops_ok & owed.w_rdy & ~self.halt)
        issue = Signal()
        m.d.comb += [
            self.unit_cmd.valid.eq(can_issue & ~is_sync),
            self.unit_cmd.payload.eq(self.queue.payload),
            issue.eq(can_issue & (is_sync | self.unit_cmd.ready)),
            self.queue.ready.eq(issue | self.halt),
            self.stall_token.eq(self.queue.valid & ~pops_ok & ~self.halt),
            self.prev_pop.eq(issue & header.pop_prev),
            self.next_pop.eq(issue & header.pop_next),
            owed.w_data.eq(Cat(header.push_prev, header.push_next, is_sync)),
            owed.w_en.eq(issue),
        ]

        # completion: count unit completions not yet retired from `owed`
        completed = Signal(range(self.pending_depth + 1))
        push_prev, push_next, head_sync = owed.r_data[0], owed.r_data[1], owed.r_data[2]
        room = Signal()
        m.d.comb += room.eq((~push_prev | ~self.prev_full) & (~push_next | ~self.next_full))
        done = Signal()
        m.d.comb += done.eq(head_sync | (completed != 0) | self.unit_completed)
        retire = Signal()
        # after a halt nothing is pushed: completed instructions retire silently
        m.d.comb += retire.eq(owed.r_rdy & done & (room | self.halt))
        m.d.sync += completed.eq(completed + self.unit_completed - (retire & ~head_sync))
        m.d.comb += [
            owed.r_en.eq(retire),
            self.prev_push.eq(retire & push_prev & ~self.halt),
            self.next_push.eq(retire & push_next & ~self.halt),
            self.idle.eq(owed.level == 0),
        ]
        return m
