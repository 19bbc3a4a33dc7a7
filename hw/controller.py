"""Instruction fetch, dispatch, dependency tokens and per-queue sequencing.

* :class:`Fetcher` reads ``prog_len`` instruction words from DRAM at ``prog_addr`` in AXI4 bursts,
  ahead of the dispatcher, into a small FIFO.
* :class:`Dispatcher` checks each word (opcode, reserved bits, dependency flags legal for its queue),
  hands it to the queue FIFO of its unit in program order, and executes FINISH: once every queue is
  empty and every unit idle it raises ``done``. An illegal word stops dispatch with an error code and
  the program counter of the word.
* :class:`TokenChannel` counts dependency tokens from one queue to a neighbour.
* :class:`Sequencer` runs one queue: pops the tokens an instruction asks for, issues it to its unit,
  and pushes its tokens once the unit reports it complete — without holding back the next
  instruction, so that consecutive instructions of a unit overlap (no bubble between COMPUTEs).
"""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from .axi import RESP_OKAY, AddressLayout, ReadDataLayout
from .config import AcceleratorConfig
from .isa import HEADER_LAYOUT, INSTR_BITS, INSTR_BYTES, LAYOUTS, QUEUE_OF, Opcode, Queue

__all__ = ["InstructionLayout", "Fetcher", "Dispatcher", "TokenChannel", "Sequencer", "queue_word_bits",
           "ERR_ILLEGAL", "ERR_SLVERR", "ERR_DECERR", "ERR_FLAGS", "ERR_NO_FINISH"]

ERR_ILLEGAL, ERR_SLVERR, ERR_DECERR, ERR_FLAGS, ERR_NO_FINISH = 1, 2, 3, 4, 5


class InstructionLayout(data.StructLayout):
    """An instruction word with its program counter (index in the program)."""

    def __init__(self):
        super().__init__({"word": INSTR_BITS, "pc": 32})


def _words_per_burst(config: AcceleratorConfig) -> int:
    """Instruction words the Fetcher asks for in one burst: as many as ``dma_max_burst`` beats
    hold, at most 2 (so that two bursts in flight fit a small FIFO)."""
    return max(1, min(2, config.dma_max_burst // (INSTR_BYTES // config.dma_bytes)))


class Fetcher(wiring.Component):
    """Reads the program into ``instr``; ``error`` is an AXI error response code (SLVERR/DECERR).

    The bus beats of ``depth`` words (default: two bursts' worth, 2 or 4 words) are fetched ahead
    of the dispatcher into a FIFO of beats (block RAM, not flip-flops); a word is assembled from
    its beats as the dispatcher asks for it, one beat per cycle, in a shift register of all but its
    last beat. A burst is only asked for when the FIFO has room for all its beats, so the read
    channel never waits for the fetcher (other managers' data behind it would wait too).
    :attr:`max_bursts` bursts are at most in flight.
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
            "instr": Out(stream.Signature(InstructionLayout())),
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
        beats_per_instr = INSTR_BYTES // BB
        # a burst fetches whole instructions, at most dma_max_burst beats
        instrs_per_burst = _words_per_burst(cfg)

        capacity = self.depth * beats_per_instr        # beats
        m.submodules.beats = beats = fifo.SyncFIFOBuffered(width=8 * BB, depth=capacity)

        active = Signal()
        requested = Signal(32)     # instructions requested on AR
        received = Signal(32)      # instructions handed out
        reserved = Signal(range(capacity + 1))   # FIFO entries promised to requested beats
        next_addr = Signal(32)

        remaining = Signal(32)
        m.d.comb += remaining.eq(self.prog_len - requested)
        wanted = Signal(range(instrs_per_burst + 1))
        m.d.comb += wanted.eq(Mux(remaining > instrs_per_burst, instrs_per_burst, remaining))
        # a burst must not cross a 4 KiB boundary (instruction words are 64-byte aligned)
        to_boundary = Signal(range(4096 // INSTR_BYTES + 1))
        m.d.comb += to_boundary.eq((4096 - next_addr[:12]) // INSTR_BYTES)
        count = Signal(range(instrs_per_burst + 1))
        m.d.comb += count.eq(Mux(to_boundary < wanted, to_boundary, wanted))

        free = Signal(range(capacity + 1))
        m.d.comb += free.eq(capacity - beats.level - reserved)
        m.d.comb += [
            self.ar.valid.eq(active & (remaining != 0) & (free >= count * beats_per_instr) & (count != 0)),
            self.ar.payload.addr.eq(next_addr),
            self.ar.payload.len.eq(count * beats_per_instr - 1),
            self.ar.payload.size.eq((BB - 1).bit_length()),
        ]
        ar_fire = self.ar.valid & self.ar.ready

        # beats into the FIFO (while a program runs)
        m.d.comb += [
            self.r.ready.eq(1),
            beats.w_data.eq(self.r.payload.data),
            beats.w_en.eq(self.r.valid & active),
        ]
        with m.If(self.r.valid & (self.r.payload.resp != RESP_OKAY)):
            m.d.sync += self.error.eq(self.r.payload.resp)
        m.d.sync += reserved.eq(reserved + Mux(ar_fire, count * beats_per_instr, 0) - (self.r.valid & active))
        with m.If(ar_fire):
            m.d.sync += [requested.eq(requested + count), next_addr.eq(next_addr + count * INSTR_BYTES)]

        # words out of the FIFO: the first beats into the shift register, the last one with them
        beat = Signal(range(beats_per_instr))      # beats of the current word shifted in
        last_beat = Signal()
        m.d.comb += last_beat.eq(beat == beats_per_instr - 1)
        if beats_per_instr > 1:
            shift = Signal(INSTR_BITS - 8 * BB)
            word = Cat(shift, beats.r_data)
        else:
            word = beats.r_data
        m.d.comb += [
            self.instr.valid.eq(active & beats.r_rdy & last_beat),
            self.instr.payload.word.eq(word),
            self.instr.payload.pc.eq(received),
            beats.r_en.eq(~active | ~last_beat | self.instr.ready),
            self.exhausted.eq(active & (received == self.prog_len)),
        ]
        with m.If(active & beats.r_rdy & beats.r_en):
            with m.If(last_beat):
                m.d.sync += beat.eq(0)
            with m.Else():
                m.d.sync += beat.eq(beat + 1)
                if beats_per_instr > 1:
                    m.d.sync += shift.eq(Cat(shift[8 * BB:], beats.r_data))
        with m.If(self.instr.valid & self.instr.ready):
            m.d.sync += received.eq(received + 1)

        with m.If(self.start):
            m.d.sync += [active.eq(1), requested.eq(0), received.eq(0), next_addr.eq(self.prog_addr),
                         self.error.eq(0), beat.eq(0)]
        with m.Elif(self.abort):
            m.d.sync += active.eq(0)
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


_LEGAL_FLAGS = {
    # queue: (pop_prev, pop_next, push_prev, push_next) allowed
    Queue.LOAD: (0, 1, 0, 1),
    Queue.COMPUTE: (1, 1, 1, 1),
    Queue.STORE: (1, 0, 1, 0),
}


def _used_bits(op: Opcode) -> int:
    return max(f.offset + f.width for name, f in LAYOUTS[op] if name != "_reserved")


#: Opcodes each queue executes (SYNC on any).
_QUEUE_OPS = {q: [op for op, queue in QUEUE_OF.items() if queue is q] + [Opcode.SYNC] for q in Queue}


def queue_word_bits(queue: Queue) -> int:
    """Low bits of an instruction word that the queue FIFO of ``queue`` stores: every field of
    the opcodes it executes (the bits above them are zero once the dispatcher has checked them)."""
    return max(_used_bits(op) for op in _QUEUE_OPS[queue])


class Dispatcher(wiring.Component):
    """Checks instructions and hands them to the three queues; executes FINISH.

    ``queues[q]`` are the queue outputs (``Queue`` order: load, compute, store). ``idle`` must be
    high when no unit or sequencer holds work. ``done`` rises after FINISH (or an error) once
    everything is idle.
    """

    def __init__(self, config: AcceleratorConfig):
        self.config = config
        super().__init__({
            "instr": In(stream.Signature(InstructionLayout())),
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
        depths = (cfg.load_queue_depth, cfg.compute_queue_depth, cfg.store_queue_depth)
        word = self.instr.payload.word
        pc = self.instr.payload.pc
        # each queue FIFO stores the fields of its opcodes and the pc; the reserved bits above
        # them are zero (checked below), so the queue outputs give them back as constants
        fifos = []
        for q, depth in enumerate(depths):
            bits = queue_word_bits(Queue(q))
            f = fifo.SyncFIFOBuffered(width=bits + len(pc), depth=depth)
            m.submodules[f"queue_{Queue(q).name.lower()}"] = f
            fifos.append(f)
            m.d.comb += [
                f.w_data.eq(Cat(word[:bits], pc)),
                self.queues[q].valid.eq(f.r_rdy & ~self.halt),
                self.queues[q].payload.word.eq(f.r_data[:bits]),
                self.queues[q].payload.pc.eq(f.r_data[bits:]),
                f.r_en.eq(self.queues[q].ready | self.halt),
            ]

        header = data.View(HEADER_LAYOUT, word[:8])
        opcode = header.opcode.as_value()
        target = Signal(range(3))
        legal = Signal()
        flags_ok = Signal()
        is_finish = Signal()
        # reserved bits: the word is cut at every opcode's end of fields; each piece is tested
        # for zero once, and an opcode's check ORs the pieces above its fields
        ends = sorted({_used_bits(op) for op in Opcode} | {INSTR_BITS})
        nonzero = {start: word[start:end].any() for start, end in zip(ends, ends[1:], strict=False)}

        def reserved_zero(op: Opcode):
            pieces = [flag for start, flag in nonzero.items() if start >= _used_bits(op)]
            return ~Cat(*pieces).any()

        with m.Switch(opcode):
            for op in Opcode:
                with m.Case(op.value):
                    m.d.comb += legal.eq(reserved_zero(op))
                    if op is Opcode.FINISH:
                        m.d.comb += [is_finish.eq(1), flags_ok.eq(word[4:8] == 0)]
                        continue
                    if op is Opcode.SYNC:
                        queue_field = data.View(LAYOUTS[op], word).queue.as_value()
                        m.d.comb += target.eq(queue_field)
                        with m.If(queue_field == 3):
                            m.d.comb += legal.eq(0)
                    else:
                        m.d.comb += target.eq(QUEUE_OF[op].value)
                    with m.Switch(target):
                        for q, allowed in _LEGAL_FLAGS.items():
                            with m.Case(q.value):
                                bad = 0
                                bits = (header.pop_prev, header.pop_next, header.push_prev, header.push_next)
                                for bit, ok in zip(bits, allowed, strict=True):
                                    if not ok:
                                        bad = bad | bit
                                m.d.comb += flags_ok.eq(~bad)
        # legal stays 0 for opcodes outside Opcode

        with m.FSM(name="dispatch"):
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [self.done.eq(0), self.error.eq(0), self.error_pc.eq(0)]
                    m.next = "RUN"
            with m.State("RUN"):
                with m.If(self.fetch_error != 0):
                    m.d.sync += [self.error.eq(self.fetch_error), self.error_pc.eq(self.instr.payload.pc)]
                    m.next = "HALT"
                with m.Elif(self.unit_error != 0):
                    m.d.sync += [self.error.eq(self.unit_error), self.error_pc.eq(self.unit_error_pc)]
                    m.next = "HALT"
                with m.Elif(self.instr.valid):
                    with m.If(~legal):
                        m.d.sync += [self.error.eq(ERR_ILLEGAL), self.error_pc.eq(self.instr.payload.pc)]
                        m.next = "HALT"
                    with m.Elif(~flags_ok):
                        m.d.sync += [self.error.eq(ERR_FLAGS), self.error_pc.eq(self.instr.payload.pc)]
                        m.next = "HALT"
                    with m.Elif(is_finish):
                        m.d.comb += [self.instr.ready.eq(1), self.dispatched.eq(1)]
                        m.next = "FINISH"
                    with m.Else():
                        with m.Switch(target):
                            for q in range(3):
                                with m.Case(q):
                                    m.d.comb += [
                                        fifos[q].w_en.eq(1),
                                        self.instr.ready.eq(fifos[q].w_rdy),
                                        self.dispatched.eq(fifos[q].w_rdy),
                                        self.stall_dispatch.eq(~fifos[q].w_rdy),
                                    ]
                with m.Elif(self.exhausted):
                    m.d.sync += [self.error.eq(ERR_NO_FINISH), self.error_pc.eq(self.instr.payload.pc)]
                    m.next = "HALT"
                with m.Else():
                    m.d.comb += self.stall_fetch.eq(1)
            with m.State("FINISH"):
                with m.If(self.unit_error != 0):
                    m.d.sync += [self.error.eq(self.unit_error), self.error_pc.eq(self.unit_error_pc)]
                    m.next = "HALT"
                with m.Elif(self.idle & ~fifos[0].r_rdy & ~fifos[1].r_rdy & ~fifos[2].r_rdy):
                    m.d.sync += self.done.eq(1)
                    m.next = "IDLE"
            with m.State("HALT"):
                m.d.comb += self.halt.eq(1)
                m.d.comb += self.instr.ready.eq(1)      # drain the fetcher
                with m.If(self.idle):
                    m.d.sync += self.done.eq(1)
                    m.next = "IDLE"
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
