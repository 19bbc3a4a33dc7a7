"""DMA engines: the address pattern of a LOAD on AXI4 reads, the output pixels of a STORE on AXI4
writes.

:class:`GatherReader` walks the four-level coordinate loop of a LOAD (docs/isa.md) and turns it into
*runs*: a run is either a contiguous byte range read from DRAM or a stretch of padding. A segment is
one run when its elements are consecutive in DRAM and share one bounds test (the fast path: every
im2col gather of an NHWC tensor, every plain tile); otherwise each element is its own run (the
general path). When consecutive segments (fast path) or elements (a bounded walk along x) are back
to back in DRAM, one run covers as many of them as lie on the same side of the image's left or right
edge (an im2col row of several taps of few channels, an NCHW row cut by the padding). Four blocks,
decoupled by FIFOs so that many bursts are in flight:

* the *setup* stage computes the next command's coordinate steps (five multiply-adds) and its
  segment and row sizes while the generator still walks the current one, so consecutive commands
  follow without a gap (it restarts on a registered copy of the command's acceptance, loading the
  next offer in that same cycle);
* the *generator* is a pipeline that queues one run per cycle, and for each read run the bus
  beats it still needs: a run whose first beat is the previous read run's last beat reuses it (the
  aligner keeps the last beat), so consecutive rows or elements sharing a beat fetch it once. Its
  *walker* steps through the loops one *stretch* per cycle (a row, a segment or an element: the
  largest unit the command keeps contiguous in DRAM), with only loop counters and one adder per
  coordinate on its loop, and hands the stretch on through a skid register (it advances whenever
  that register is empty, a registered bit: no later stage's handshake reaches its registers);
  the next stage cuts the stretch at the image edges into at most three pieces (padding, bytes
  read, padding), counted in units, the one after multiplies them into bytes, and the *emitter*
  sends the pieces as runs, one per cycle (a read run's byte range goes to the burst issuer,
  which counts its beats);
* the *burst issuer* merges the beat ranges of consecutive runs that are contiguous in DRAM into
  AXI4 INCR bursts and keeps at most ``dma_outstanding`` bursts in flight. It cuts the ranges at
  the boundaries of aligned blocks of ``dma_max_burst`` beats (at most 4 KiB) and merges only
  within a block, so a burst is never longer than ``dma_max_burst`` nor crosses 4 KiB, and
  whether a piece extends the burst is one bit known a stage ahead; the pieces reach the merge
  through a skid register, so the merge's handshake (which waits for the address channel) reaches
  no earlier stage. A burst leaves as soon as the
  address channel is free while fewer beats than the DRAM latency are in flight; otherwise it
  keeps growing until it reaches its block's end or the next range is not contiguous;
* the *aligner* rotates each returned beat (and the kept previous beat) into place in a row buffer
  of bytes and hands out a finished destination row (row index, bytes, byte mask) per ``rows``
  transfer, one row per cycle when a row needs at most one new beat. A run is decoded (the row
  bytes it covers, its rotation, the slot of its next beat) in a register stage before it
  becomes the current run, so only the rotation and a byte select lie between the bus and the
  row buffer, and whether it needs no or one more beat is a registered bit.

:class:`ScatterWriter` turns each output pixel into runs (the pixel's elements, or each element
alone when they are not consecutive in DRAM), packs consecutive runs into bus beats (runs that meet
in one beat share it) and contiguous beats into bursts; address, data and responses are pipelined,
so the next burst's address goes out while the current one's data flows. Its stages (the pixel
being split into runs, the run being cut into beats, the beat being filled) are registers with
handshakes that read only registered state (the FIFOs' room from their levels a cycle earlier;
whether the beat being filled extends the open burst is a bit kept by the steps), so neither the
beat arithmetic nor a comparison lies on a ready path.

Element sizes (bytes) are given per command, so one engine serves the scratchpad, the accumulator
and the requantize table; the consumer converts the bytes of a row into its memory's format.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .axi import RESP_OKAY, AddressLayout, ReadDataLayout, ResponseLayout, WriteDataLayout
from .config import AcceleratorConfig
from .fifo import buffered_fifo
from .interconnect import StreamRegister

__all__ = ["LoadCommandLayout", "RowWriteLayout", "GatherPorts", "GatherReader", "residual_read_fields",
           "row_buffer_bytes",
           "read_run_fifo_depth", "StoreCommandLayout", "ScatterPorts", "ScatterWriter", "write_burst_beats"]

_ADDR = 32          # DRAM address bits
# Signed width of a y or x coordinate of a LOAD: |y0| < 2**15, plus less than 65536 * 128 from
# each of the outer and inner loops and 256 * 128 from each of the segment and element loops.
_COORD = 27
_PAGE = 4096        # AXI4 bursts never cross a 4 KiB boundary, bytes


def row_buffer_bytes(config: AcceleratorConfig) -> int:
    """Bytes of the widest destination row: scratchpad, accumulator or requantize table (a table
    LOAD's rows are the group of ``config.table_load_entries`` entries it may write, the load
    unit places them in the table row)."""
    return max(config.spad_row_bytes, config.acc_row_bytes,
               config.table_load_entries * config.requant_entry_bytes)


def read_run_fifo_depth(config: AcceleratorConfig) -> int:
    """Entries of the GatherReader's run FIFO. Every run waits there from its generation until the
    aligner has finished it, so the FIFO bounds the data requested ahead: enough for the DRAM
    latency (``dram_latency``, cycles, at one run per cycle) plus one burst being merged and one
    waiting for the address channel; a power of two, at most 128."""
    need = config.dram_latency + 2 * config.dma_max_burst + 8
    return min(128, 1 << (need - 1).bit_length())


def write_burst_beats(config: AcceleratorConfig) -> int:
    """Longest write burst of the ScatterWriter, beats: ``dma_max_burst``, at most 16 (a burst's
    beats are buffered until its length is known)."""
    return min(config.dma_max_burst, 16)


def _cap(beat: Signal, beat_bytes: int, max_burst: int):
    """Beats a burst starting at beat index ``beat`` may have: ``max_burst``, or fewer up to the
    next 4 KiB boundary."""
    per_page = _PAGE // beat_bytes
    to_boundary = per_page - beat[:(per_page - 1).bit_length()]
    return Mux(to_boundary < max_burst, to_boundary, max_burst)


def _min(a, b):
    return Mux(a < b, a, b)


def _times(a, b):
    """``a * b`` (unsigned) as shifted additions over the shorter operand's bits, added as a
    balanced tree (log2 adder levels, not one per bit): logic, never a DSP block (the products
    here are short: element sizes, row positions)."""
    if len(a) > len(b):
        a, b = b, a
    terms = [Mux(a[i], b << i, 0) for i in range(len(a))]
    while len(terms) > 1:
        terms = [terms[k] + terms[k + 1] if k + 1 < len(terms) else terms[k]
                 for k in range(0, len(terms), 2)]
    return terms[0] if terms else Const(0, 1)


def _slot_flags(m: Module, value, count: int, name: str) -> tuple[Signal, Signal]:
    """``(equal, above)``: bit ``j < count`` of ``equal`` is ``value == j``, of ``above`` is
    ``value > j``; a lookup on the (short) unsigned ``value``, no comparator chain per bit."""
    equal = Signal(count, name=f"{name}_equal")
    above = Signal(count, name=f"{name}_above")
    values = 1 << len(value)
    with m.Switch(value):
        for v in range(min(values, count + 1)):
            with m.Case(v):
                m.d.comb += [equal.eq((1 << v) & ((1 << count) - 1)), above.eq((1 << v) - 1)]
        if values > count + 1:
            with m.Default():
                m.d.comb += above.eq((1 << count) - 1)
    return equal, above


def _lanes_at_least(m: Module, value, lanes: int, name: str) -> Signal:
    """Bit ``l < lanes`` is ``l >= value`` (``value`` < ``lanes``, a lane of a beat)."""
    flags = Signal(lanes, name=name)
    with m.Switch(value):
        for v in range(min(lanes, 1 << len(value))):
            with m.Case(v):
                m.d.comb += flags.eq(((1 << lanes) - 1) & ~((1 << v) - 1))
    return flags


def residual_read_fields(out_h: int, out_w: int, n: int) -> dict[str, int]:
    """The LOAD fields of a STORE's residual read, as the store unit gives it to the read engine
    (the other fields are 0; ``dram_addr`` and the pitches are the STORE's): one row per output
    pixel (oy, ox), its n elements along c. The store unit, the golden model's estimate and the
    compiler's read them here."""
    return {"rows_outer": out_h, "rows_inner": out_w, "segs": 1, "seg_len": n,
            "outer_dy": 1, "inner_dx": 1, "elem_dc": 1}


class LoadCommandLayout(data.StructLayout):
    """What the engine needs of a LOAD: its fields (docs/isa.md) plus the element size."""

    def __init__(self):
        super().__init__({
            "elem_bytes": unsigned(4),       # 1, 2, 4 or 12
            "dst_addr": unsigned(16), "dst_col": unsigned(8),
            "dram_addr": unsigned(32),
            "pitch_y": unsigned(24), "pitch_x": unsigned(24), "pitch_c": unsigned(24),
            "bounded": unsigned(1), "height": unsigned(16), "width": unsigned(16),
            "y0": signed(16), "x0": signed(16), "pad_value": signed(16),
            "rows_outer": unsigned(16), "rows_inner": unsigned(16),
            "segs": unsigned(8), "seg_len": unsigned(8),
            "outer_dy": signed(8), "outer_dx": signed(8), "outer_dc": signed(8),
            "inner_dy": signed(8), "inner_dx": signed(8), "inner_dc": signed(8),
            "seg_dy": signed(8), "seg_dx": signed(8), "seg_dc": signed(8),
            "elem_dy": signed(8), "elem_dx": signed(8), "elem_dc": signed(8),
        })


class RowWriteLayout(data.StructLayout):
    """One finished destination row: its index, its bytes, which bytes the LOAD wrote, whether it
    is the last row of its command, and the first AXI error response (0: OKAY) of the beats it
    was read from."""

    def __init__(self, row_bytes: int):
        super().__init__({
            "row": unsigned(16),
            "data": data.ArrayLayout(8, row_bytes),
            "mask": unsigned(row_bytes),
            "last": unsigned(1),
            "resp": unsigned(2),
        })


def _row_bits(config: AcceleratorConfig) -> int:
    """Width of a destination row index inside the reader: the widest destination memory's row
    address (every consumer takes its own memory's low bits of ``RowWriteLayout.row``; rows past a
    memory wrap around, docs/arch-system.md)."""
    return max(config.spad_addr_bits, config.acc_addr_bits, config.requant_addr_bits)


class _RunLayout(data.StructLayout):
    def __init__(self, row_bytes: int, beat_bytes: int, row_bits: int):
        pos_bits = (row_bytes - 1).bit_length() + 1
        super().__init__({
            "read": unsigned(1),             # 1: bytes from DRAM, 0: padding
            "row": unsigned(row_bits),
            "row_end": unsigned(1),          # the last run of its destination row
            "last": unsigned(1),             # the last run of its command
            "pos": unsigned(pos_bits),       # first byte in the row buffer
            "nbytes": unsigned(pos_bits),
            "offset": unsigned(max(1, (beat_bytes - 1).bit_length())),  # address mod beat size
            "share": unsigned(1),            # its first beat is the previous read run's last one
            "pad": signed(16),               # padding: the pad element
            "pad_mask": unsigned(2),         # padding: (element bytes - 1) mod 4
        })


class _RangeLayout(data.StructLayout):
    """Beats a read run needs from the bus: the beats its ``nbytes`` bytes from byte ``offset`` of
    beat index ``beat`` (address / beat size) lie in, from beat ``beat + skip`` (``skip``: the
    run's first beat is the previous run's last, already read). (The burst issuer counts the
    beats: no adder between the emitter and the FIFO.)"""

    def __init__(self, row_bytes: int, beat_bits: int):
        super().__init__({"beat": unsigned(_ADDR - beat_bits), "skip": unsigned(1),
                          "offset": unsigned(max(1, beat_bits)),
                          "nbytes": unsigned((row_bytes - 1).bit_length() + 1)})


class GatherPorts(wiring.Component):
    """The ports of a LOAD engine (:class:`GatherReader`, or the serial one in
    ``hw/dma_serial.py``), for ``config``: see :class:`GatherReader`."""

    def __init__(self, config: AcceleratorConfig):
        if not isinstance(config, AcceleratorConfig):
            raise TypeError(f"config must be an AcceleratorConfig, not {config!r}")
        self.config = config
        self.row_bytes = row_buffer_bytes(config)
        self.beat_bytes = config.dma_bytes
        super().__init__({
            "cmd": In(stream.Signature(LoadCommandLayout())),
            "ar": Out(stream.Signature(AddressLayout(_ADDR))),
            "r": In(stream.Signature(ReadDataLayout(config.dma_data_bits))),
            "rows": Out(stream.Signature(RowWriteLayout(self.row_bytes))),
            "busy": Out(1),
            "error": Out(2),
            "clear_error": In(1),
        })


class GatherReader(GatherPorts):
    """Executes LOAD address patterns over AXI4 reads.

    Ports:
      ``cmd``  — one LOAD (``LoadCommandLayout``); accepted while the setup stage is free, which
                 is while the previous command's rows are still being generated and read.
      ``ar``/``r`` — the AXI4 read address and data channels.
      ``rows`` — finished destination rows (``RowWriteLayout``), in command order; ``last`` marks
                 the last row of each command.
      ``busy`` — a command is being executed (rows may still be pending).
      ``error`` — sticky AXI error response (SLVERR 2 / DECERR 3) seen since ``clear_error``.
    """

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        RB, BB = self.row_bytes, self.beat_bytes
        BBL = max(1, (BB - 1).bit_length())
        BIX = _ADDR - BBL                 # bits of a beat index
        RW = _row_bits(cfg)
        run_layout = _RunLayout(RB, BB, RW)
        beats_shape = unsigned((RB - 1).bit_length() + 2)   # beats a run spans
        range_layout = _RangeLayout(RB, BBL)
        pos_shape = run_layout.members["pos"]

        m.submodules.runs = runs = buffered_fifo(cfg, width=run_layout.size, depth=read_run_fifo_depth(cfg))
        m.submodules.ranges = ranges = buffered_fifo(cfg, width=range_layout.size, depth=8)

        cur = Signal(run_layout)          # the run the aligner works on
        cur_valid = Signal()

        # Read data reach the aligner through a register slice: a burst's slot is free again (and
        # its beats leave the count in flight) as its last beat enters the slice, a handshake of
        # registers on this side, so that the aligner's readiness (which waits for the rows
        # register) does not reach the burst issuer through AR in the same cycle.
        m.submodules.r_in = r_in = StreamRegister(self.r.payload.shape())
        m.d.comb += [r_in.i.valid.eq(self.r.valid), r_in.i.payload.eq(self.r.payload),
                     self.r.ready.eq(r_in.i.ready)]
        beat_in = r_in.o

        # -- setup: the offered command's coordinate steps ----------------------------------------
        # Each step (and the start address) is a sum of three products d * pitch, computed by
        # shift-and-add, the three at once, one multiplier bit per cycle from the low end; a
        # multiplier is done when what is left of it is 0 or -1 (the last, negative, weight), so
        # small steps take a cycle or two. All modulo 2**32: a step is exact (|d * pitch| < 2**31
        # each, three of them < 2**32 together for every legal LOAD, as docs/isa.md bounds the
        # bytes a row reads), the start address only matters modulo 2**32.
        p = self.cmd.payload
        # (the element and segment steps first: the flags below need them)
        names = ("elem", "seg", "start", "outer", "inner")
        operands = [(p.elem_dy, p.elem_dx, p.elem_dc), (p.seg_dy, p.seg_dx, p.seg_dc),
                    (p.y0, p.x0, 0), (p.outer_dy, p.outer_dx, p.outer_dc),
                    (p.inner_dy, p.inner_dx, p.inner_dc)]
        pitches = (p.pitch_y, p.pitch_x, p.pitch_c)
        nstep = {name: Signal(_ADDR, name=f"next_step_{name}") for name in names}
        vector = Signal(range(len(names) + 1))    # the vector being computed; 5: all done
        loaded = Signal()                         # vector 0's operands are in the registers
        multiplier = [Signal(signed(16), name=f"setup_mul_{a}") for a in "yx"] + \
                     [Signal(signed(8), name="setup_mul_c")]
        multiplicand = [Signal(_ADDR, name=f"setup_pitch_{a}") for a in "yxc"]
        # The running sum is kept in carry-save form (sum + carry, modulo 2**32): a step adds the
        # three partial products with three rows of full adders, no carry chain; a finished
        # vector's two halves are added in the next cycle (`pending`), while the next vector
        # starts. (The setup stage is registered, `set_up`, so a command is never taken before
        # the last vector's sum is resolved.)
        total_sum, total_carry = Signal(_ADDR), Signal(_ADDR)
        next_sum, next_carry = Signal(_ADDR), Signal(_ADDR)
        left = []
        row_sum, row_carry = total_sum, total_carry
        # a multiplier is -1 (the sign bit's weight is all that is left): registered with it
        negatives = [Signal(name=f"setup_neg_{a}") for a in "yxc"]
        for mul, pitch, negative in zip(multiplier, multiplicand, negatives, strict=True):
            term = Mux(mul[0], pitch, 0) ^ negative.replicate(_ADDR)
            # (the carry row moves up a bit: its free bit 0 takes the +1 of the negation)
            row_sum, row_carry = (row_sum ^ row_carry ^ term,
                                  Cat(negative, ((row_sum & row_carry) | (row_sum & term) |
                                                 (row_carry & term))[:-1]))
            left.append(Mux(negative, 0, mul >> 1))
        m.d.comb += [next_sum.eq(row_sum), next_carry.eq(row_carry)]
        pending = Signal()                # a finished vector's sum is resolved in this cycle
        pending_index = Signal(range(len(names)))
        pending_sum, pending_carry = Signal(_ADDR), Signal(_ADDR)
        m.d.sync += pending.eq(0)
        with m.If(pending):
            with m.Switch(pending_index):
                for index, name in enumerate(names):
                    with m.Case(index):
                        m.d.sync += nstep[name].eq(pending_sum + pending_carry)

        def done_after(values):
            """Nothing is left of the multipliers ``values`` after one more step."""
            rest = [Mux(v == -1, 0, v >> 1) for v in values]
            return ~Cat(*(r.any() for r in rest)).any()

        # the current step is the vector's last: registered, computed a step ahead (it enables
        # every setup register)
        finished = Signal()

        def load(index):
            values = [Const(d, signed(8)) if isinstance(d, int) else d for d in operands[index]]
            stmts = [total_sum.eq(p.dram_addr if names[index] == "start" else 0), total_carry.eq(0),
                     finished.eq(done_after(values))]
            for mul, pitch, negative, d, source in zip(multiplier, multiplicand, negatives, values,
                                                       pitches, strict=True):
                stmts += [mul.eq(d), pitch.eq(source), negative.eq(d == -1)]
            return stmts

        accept = Signal()
        # The setup restarts in the cycle after a command is taken (`took`, registered: `accept`
        # reaches no setup register), loading the next offer's first vector at once, as a
        # restart in the taking cycle followed by a load would; a taken command's setup state
        # rests meanwhile (vector == 5, flagged == 2: nothing moves).
        took = Signal()
        m.d.sync += took.eq(accept)
        restart = Signal()
        m.d.comb += restart.eq(~self.cmd.valid | took)
        with m.If(restart):
            m.d.sync += [vector.eq(0), loaded.eq(self.cmd.valid)]
            with m.If(self.cmd.valid):
                m.d.sync += load(0)
        with m.Elif(~loaded):
            m.d.sync += load(0) + [loaded.eq(1)]
        with m.Elif(vector != len(names)):
            with m.If(finished):
                m.d.sync += [pending.eq(1), pending_index.eq(vector), pending_sum.eq(next_sum),
                             pending_carry.eq(next_carry)]
                with m.Switch(vector):
                    for index in range(len(names) - 1):
                        with m.Case(index):
                            m.d.sync += load(index + 1)
                m.d.sync += vector.eq(vector + 1)
            with m.Else():
                m.d.sync += [total_sum.eq(next_sum), total_carry.eq(next_carry),
                             finished.eq(done_after(left))]
                for mul, pitch, negative, value in zip(multiplier, multiplicand, negatives, left,
                                                       strict=True):
                    m.d.sync += [mul.eq(value), pitch.eq(pitch << 1), negative.eq(value == -1)]

        # Meanwhile, one cycle each once the element and segment steps are known, what the
        # generator needs of the command besides its fields (so that no product or wide
        # comparison lies between the offered command and the generator): the sizes of a
        # segment and of a row, the first row byte and the path (fast: a segment is consecutive
        # in DRAM and shares one bounds test; merge: the units of a stretch are back to back in
        # DRAM, see the walker).
        seg_bytes_full = Signal(12)       # seg_len * elem_bytes, exact (compared with a step)
        n_first_pos = Signal(pos_shape)
        n_fast = Signal()
        n_merge = Signal()
        n_row_bytes = Signal(pos_shape)
        flagged = Signal(2)               # flag cycles done
        with m.If(restart):
            m.d.sync += flagged.eq(0)
        with m.Elif(loaded & (vector > names.index("seg"))):
            with m.Switch(flagged):
                with m.Case(0):
                    m.d.sync += [
                        seg_bytes_full.eq(_times(p.seg_len, p.elem_bytes)),
                        n_first_pos.eq(_times(p.dst_col, p.elem_bytes)),
                        n_fast.eq((nstep["elem"] == p.elem_bytes) &
                                  (~p.bounded | ((p.elem_dy == 0) & (p.elem_dx == 0)))),
                        flagged.eq(1),
                    ]
                with m.Case(1):
                    m.d.sync += [
                        n_row_bytes.eq(_times(p.segs, seg_bytes_full[:pos_shape.width])),
                        n_merge.eq(Mux(
                            n_fast,
                            # segments back to back in DRAM, sharing y and stepping x by 0 or 1
                            # (a segment longer than a row never is: the command is not legal)
                            (nstep["seg"] == seg_bytes_full) &
                            (~p.bounded | ((p.seg_dy == 0) & ((p.seg_dx == 0) | (p.seg_dx == 1)))),
                            # elements back to back in DRAM along x (a bounded transposing walk)
                            (nstep["elem"] == p.elem_bytes) & (p.elem_dy == 0) & (p.elem_dx == 1))),
                        flagged.eq(2),
                    ]
        set_up = Signal()                 # (registered: off the accept path)
        m.d.sync += set_up.eq(self.cmd.valid & ~accept & ~took & (vector == len(names)) & (flagged == 2))

        # -- generator: walker ------------------------------------------------------------------
        # The walker steps through the LOAD's loops one *stretch* per cycle: a stretch is a whole
        # destination row (fast path, segments merged: granularity ROW), one segment (fast path
        # alone, or the elements of a segment merged: SEG) or one element (EL). A merged
        # stretch's units (segments or elements) are back to back in DRAM and step x by
        # `stretch_dx` (0 or 1) and y by 0, so a bounded stretch is at most three runs: padding
        # left of the image, the bytes inside it, padding right of it. Only loop counters and
        # one adder per coordinate lie on the walker's own loop; the split into runs happens in
        # the stages after it.
        GRAN_ROW, GRAN_SEG, GRAN_EL = 0, 1, 2
        c = Signal(LoadCommandLayout())   # the command being walked (unused fields are optimized
        active = Signal()                 # away)
        eb = c.elem_bytes
        step = {name: Signal(_ADDR, name=f"step_{name}") for name in names if name != "start"}
        gran = Signal(2)
        seg_bytes = Signal(pos_shape)     # bytes of a segment
        first_pos = Signal(pos_shape)     # row byte of element dst_col
        count = Signal(9)                 # units per stretch
        unit_bytes = Signal(pos_shape)    # bytes per unit
        stretch_bytes = Signal(pos_shape) # bytes per stretch
        stretch_dx = Signal()             # the units of a stretch step x by 1 (else by 0)

        # what is left of each loop, counting the current iteration, and whether it is the last
        o_left, i_left = Signal(16), Signal(16)
        s_left, e_left = Signal(8), Signal(8)
        o_last, i_last, s_last, e_last = Signal(), Signal(), Signal(), Signal()
        s_first_last, e_first_last = Signal(), Signal()   # a loop of one iteration
        # (y, x, address) at the start of the current outer row, row, segment and element; the
        # element level's is the current stretch's (every level below an advanced one moves too)
        lv = {}
        for level in ("out", "row", "seg", "el"):
            lv[level] = (Signal(signed(_COORD), name=f"{level}_y"), Signal(signed(_COORD), name=f"{level}_x"),
                         Signal(_ADDR, name=f"{level}_addr"))
        seg_pos = Signal(pos_shape)       # row byte of the current segment's first element
        el_pos = Signal(pos_shape)        # ... of the current stretch
        row_idx = Signal(RW)              # destination row of the current stretch

        # The first stage after the walker classifies the stretch against the image (registered
        # comparisons only); the one after cuts it into (up to) three pieces, in units
        # [0, a) padding, [a, b) read, [b, count) padding, and in bytes.
        MODE_READ, MODE_PAD, MODE_SPLIT = 0, 1, 2
        q_valid = Signal()
        q_layout = data.StructLayout({
            "addr": _ADDR, "pos": pos_shape, "row": RW, "row_end": 1, "last": 1,
            "count": 9, "unit_bytes": pos_shape, "total": pos_shape,
            "pad": signed(16), "pad_mask": 2,
            "mode": 2,
            # MODE_SPLIT: a = 0 if l_zero, count if l_full, else l_raw; b likewise from r_*
            "l_zero": 1, "l_full": 1, "l_raw": 9, "r_zero": 1, "r_full": 1, "r_raw": 9,
        })
        q = Signal(q_layout)
        go = Signal()                     # the walker hands its stretch on and advances
        q_take = Signal()                 # the stage after q takes q's stretch

        y_now, x_now, addr_now = lv["el"]
        y_in = Signal()
        m.d.comb += y_in.eq((y_now >= 0) & (y_now < c.height))
        to_left = Signal(signed(_COORD + 1))      # units left of the image (if positive)
        to_right = Signal(signed(_COORD + 1))     # units left of the right edge
        m.d.comb += [to_left.eq(-x_now), to_right.eq(c.width - x_now)]
        mode = Signal(2)
        with m.If(~c.bounded):
            m.d.comb += mode.eq(MODE_READ)
        with m.Elif(~y_in):
            m.d.comb += mode.eq(MODE_PAD)
        with m.Elif(stretch_dx):
            m.d.comb += mode.eq(MODE_SPLIT)
        with m.Elif((to_left <= 0) & (to_right > 0)):
            m.d.comb += mode.eq(MODE_READ)
        with m.Else():
            m.d.comb += mode.eq(MODE_PAD)
        walk_last = Signal()              # the current stretch is the command's last
        row_last = Signal()               # ... the last of its destination row
        m.d.comb += [row_last.eq(e_last & s_last), walk_last.eq(row_last & i_last & o_last)]
        stretch = Signal(q_layout)        # the walker's current stretch, classified
        m.d.comb += [
            stretch.addr.eq(addr_now), stretch.pos.eq(el_pos), stretch.row.eq(row_idx),
            stretch.row_end.eq(row_last), stretch.last.eq(walk_last),
            stretch.count.eq(count), stretch.unit_bytes.eq(unit_bytes), stretch.total.eq(stretch_bytes),
            stretch.pad.eq(c.pad_value), stretch.pad_mask.eq((eb - 1)[:2]),
            stretch.mode.eq(mode),
            stretch.l_zero.eq(to_left <= 0), stretch.l_full.eq(to_left >= count),
            stretch.l_raw.eq(to_left),
            stretch.r_zero.eq(to_right <= 0), stretch.r_full.eq(to_right >= count),
            stretch.r_raw.eq(to_right),
        ]
        # A skid register between the walker and q: the walker advances whenever it is empty (a
        # registered bit, so the stages after q reach none of the walker's registers); a stretch
        # that q cannot take in that cycle waits there and goes to q first. It loads whenever it
        # is empty and q loads whenever it is free: both enables leave the handshake's data.
        skid_valid = Signal()
        skid = Signal(q_layout)
        q_free = Signal()
        m.d.comb += [q_free.eq(~q_valid | q_take), go.eq(active & ~skid_valid)]
        with m.If(~skid_valid):
            m.d.sync += skid.eq(stretch)
        with m.If(q_free):
            m.d.sync += [q.eq(Mux(skid_valid, skid, stretch)), q_valid.eq(skid_valid | go),
                         skid_valid.eq(0)]
        with m.Elif(go):
            m.d.sync += skid_valid.eq(1)

        # Advancing a loop level moves that level and every level below it to the level's
        # position plus its step: one adder per coordinate, its operands chosen by the loops'
        # last flags alone; `go` only enables the registers, and the command's start loads
        # every level past the adder.
        levels = ("el", "seg", "row", "out")
        advance = Signal(len(levels))     # one-hot: element, segment, row, outer row
        m.d.comb += advance.eq(Mux(~e_last, 0b0001, Mux(~s_last, 0b0010, Mux(~i_last, 0b0100, 0b1000))))
        base, delta, moved = ([Signal.like(value, name=f"{kind}_{axis}")
                               for axis, value in zip("yxa", lv["el"], strict=True)]
                              for kind in ("base", "delta", "moved"))
        deltas = [
            (c.elem_dy, c.elem_dx, step["elem"]),
            (c.seg_dy, c.seg_dx, step["seg"]),
            (c.inner_dy, c.inner_dx, step["inner"]),
            (c.outer_dy, c.outer_dx, step["outer"]),
        ]
        with m.Switch(advance):
            for index, level in enumerate(levels):
                with m.Case(1 << index):
                    m.d.comb += [b.eq(v) for b, v in zip(base, lv[level], strict=True)]
                    m.d.comb += [d.eq(v) for d, v in zip(delta, deltas[index], strict=True)]
        m.d.comb += [n.eq(b + d) for n, b, d in zip(moved, base, delta, strict=True)]
        for index, level in enumerate(levels):
            with m.If(accept):            # the start: (y0, x0, start address)
                m.d.sync += [v.eq(n) for v, n in zip(lv[level], (p.y0, p.x0, nstep["start"]),
                                                     strict=True)]
            with m.Elif(go & advance[index:].any()):
                m.d.sync += [v.eq(n) for v, n in zip(lv[level], moved, strict=True)]

        e_count = Signal(8)               # iterations of the element and segment loops
        s_count = Signal(8)
        m.d.comb += [e_count.eq(Mux(gran == GRAN_EL, c.seg_len, 1)),
                     s_count.eq(Mux(gran == GRAN_ROW, 1, c.segs))]
        with m.If(go):
            with m.If(~e_last):
                m.d.sync += [e_left.eq(e_left - 1), e_last.eq(e_left == 2),
                             el_pos.eq(el_pos + eb)]
            with m.Elif(~s_last):
                m.d.sync += [e_left.eq(e_count), e_last.eq(e_first_last),
                             s_left.eq(s_left - 1), s_last.eq(s_left == 2),
                             seg_pos.eq(seg_pos + seg_bytes), el_pos.eq(seg_pos + seg_bytes)]
            with m.Else():
                m.d.sync += [e_left.eq(e_count), e_last.eq(e_first_last),
                             s_left.eq(s_count), s_last.eq(s_first_last),
                             row_idx.eq(row_idx + 1), seg_pos.eq(first_pos), el_pos.eq(first_pos)]
                with m.If(~i_last):
                    m.d.sync += [i_left.eq(i_left - 1), i_last.eq(i_left == 2)]
                with m.Elif(~o_last):
                    m.d.sync += [i_left.eq(c.rows_inner), i_last.eq(c.rows_inner == 1),
                                 o_left.eq(o_left - 1), o_last.eq(o_left == 2)]
                with m.Else():
                    m.d.sync += active.eq(0)

        # take the offered command once set up and the walker is idle: `accept` enables every
        # walker register, so it is a function of three registers only (a command waits one
        # cycle after the previous one's last stretch)
        m.d.comb += [
            accept.eq(self.cmd.valid & set_up & ~active),
            self.cmd.ready.eq(accept),
        ]
        with m.If(accept):
            n_gran = Mux(n_fast & n_merge, GRAN_ROW, Mux(n_fast | n_merge, GRAN_SEG, GRAN_EL))
            n_e_count = Mux(~n_fast & ~n_merge, p.seg_len, 1)
            n_s_count = Mux(n_fast & n_merge, 1, p.segs)
            m.d.sync += [
                c.eq(p), active.eq(1),
                gran.eq(n_gran),
                seg_bytes.eq(seg_bytes_full), first_pos.eq(n_first_pos),
                count.eq(Mux(n_fast & n_merge, p.segs, Mux(~n_fast & n_merge, p.seg_len, 1))),
                unit_bytes.eq(Mux(n_fast, seg_bytes_full, p.elem_bytes)),
                stretch_bytes.eq(Mux(n_fast & n_merge, n_row_bytes,
                                     Mux(n_fast | n_merge, seg_bytes_full, p.elem_bytes))),
                stretch_dx.eq(Mux(n_fast, p.seg_dx == 1, 1) & n_merge),
                o_left.eq(p.rows_outer), o_last.eq(p.rows_outer == 1),
                i_left.eq(p.rows_inner), i_last.eq(p.rows_inner == 1),
                s_left.eq(n_s_count), s_last.eq(n_s_count == 1), s_first_last.eq(n_s_count == 1),
                e_left.eq(n_e_count), e_last.eq(n_e_count == 1), e_first_last.eq(n_e_count == 1),
                row_idx.eq(p.dst_addr),
                seg_pos.eq(n_first_pos), el_pos.eq(n_first_pos),
            ]
            m.d.sync += [value.eq(nstep[name]) for name, value in step.items()]

        # -- generator: pieces in bytes ---------------------------------------------------------
        r_valid = Signal()
        r_layout = data.StructLayout({
            "addr": _ADDR, "pos": pos_shape, "row": RW, "row_end": 1, "last": 1,
            "a_bytes": pos_shape, "b_bytes": pos_shape, "todo": 3, "total": pos_shape,
            "pad": signed(16), "pad_mask": 2,
            "left": 1,                    # the stretch starts with padding (a > 0)
        })
        r = Signal(r_layout)
        r_take = Signal()                 # the emitter finishes r's stretch
        m.d.comb += q_take.eq(q_valid & (~r_valid | r_take))

        def units(zero, full, raw):
            """(units, bytes) of a cut: 0, the whole stretch, or ``raw`` units."""
            n = Signal(9)
            nbytes = Signal(pos_shape)
            m.d.comb += [n.eq(Mux(zero, 0, Mux(full, q.count, raw))),
                         # raw < count, and the stretch fits the row: a short product
                         nbytes.eq(Mux(zero, 0, Mux(full, q.total, _times(raw, q.unit_bytes))))]
            return n, nbytes

        a_cut, a_cut_bytes = units(q.l_zero, q.l_full, q.l_raw)
        b_cut, b_cut_bytes = units(q.r_zero, q.r_full, q.r_raw)
        a_now, b_now = Signal(9), Signal(9)
        a_bytes, b_bytes = Signal(pos_shape), Signal(pos_shape)
        with m.Switch(q.mode):
            with m.Case(MODE_READ):
                m.d.comb += [a_now.eq(0), b_now.eq(q.count), a_bytes.eq(0), b_bytes.eq(q.total)]
            with m.Case(MODE_PAD):
                m.d.comb += [a_now.eq(q.count), b_now.eq(q.count), a_bytes.eq(q.total),
                             b_bytes.eq(q.total)]
            with m.Default():
                m.d.comb += [a_now.eq(a_cut), b_now.eq(b_cut), a_bytes.eq(a_cut_bytes),
                             b_bytes.eq(b_cut_bytes)]
        todo_now = Signal(3)
        m.d.comb += todo_now.eq(Cat(a_now != 0, b_now != a_now, b_now != q.count))
        with m.If(q_take):
            m.d.sync += [
                r_valid.eq(1),
                r.addr.eq(q.addr), r.pos.eq(q.pos), r.row.eq(q.row), r.row_end.eq(q.row_end),
                r.last.eq(q.last), r.total.eq(q.total), r.pad.eq(q.pad), r.pad_mask.eq(q.pad_mask),
                r.a_bytes.eq(a_bytes), r.b_bytes.eq(b_bytes),
                # a stretch of no unit (not a legal LOAD) still ends its row
                r.todo.eq(Mux(todo_now == 0, 0b010, todo_now)), r.left.eq(todo_now[0]),
            ]
        with m.Elif(r_take):
            m.d.sync += r_valid.eq(0)

        # -- generator: emitter, one run per cycle ------------------------------------------------
        # beat reuse: the last beat of the previous read run of this command
        last_beat = Signal(BIX)
        have_last = Signal()
        piece = Signal(3)                 # one-hot: the lowest piece still to emit
        m.d.comb += piece.eq(r.todo & -r.todo)
        final = Signal()                  # ... is the stretch's last
        m.d.comb += final.eq((r.todo & ~piece) == 0)
        read = piece[1]
        start = Signal(pos_shape)
        stop = Signal(pos_shape)
        with m.Switch(piece):
            with m.Case(0b001):
                m.d.comb += [start.eq(0), stop.eq(r.a_bytes)]
            with m.Case(0b010):
                m.d.comb += [start.eq(r.a_bytes), stop.eq(r.b_bytes)]
            with m.Default():
                m.d.comb += [start.eq(r.b_bytes), stop.eq(r.total)]
        # The read piece's first byte: the stretch's, or, after a padding piece, the address
        # registered while that piece left (no adder on the emitter's path).
        read_addr = Signal(_ADDR)
        after_pad = Signal(_ADDR)
        m.d.comb += read_addr.eq(Mux(r.left, after_pad, r.addr))
        read_end = Signal(_ADDR)          # ... and its last byte
        m.d.comb += read_end.eq(read_addr + (r.b_bytes - r.a_bytes) - 1)
        first_beat = Signal(BIX)
        m.d.comb += first_beat.eq(read_addr[BBL:])

        run = Signal(run_layout)
        m.d.comb += [
            run.read.eq(read),
            run.row.eq(r.row),
            run.row_end.eq(r.row_end & final),
            run.last.eq(r.last & final),
            run.pos.eq(r.pos + start),
            run.nbytes.eq(stop - start),
            run.offset.eq(read_addr[:BBL]),
            run.share.eq(read & have_last & (first_beat == last_beat)),
            run.pad.eq(r.pad),
            run.pad_mask.eq(r.pad_mask),
        ]
        new_range = Signal(range_layout)
        m.d.comb += [new_range.beat.eq(first_beat), new_range.skip.eq(run.share),
                     new_range.offset.eq(run.offset), new_range.nbytes.eq(run.nbytes)]

        # (the range FIFO's room is asked of every run, so that the emitter's handshake does not
        # wait for the beat comparison)
        emit = Signal()
        # room in both FIFOs, from their levels one cycle earlier (at most one write since)
        room = Signal()
        m.d.sync += room.eq((runs.level < runs.depth - 2) & (ranges.level < ranges.depth - 2))
        m.d.comb += [emit.eq(r_valid & room), r_take.eq(emit & final)]
        with m.If(emit & piece[0]):
            m.d.sync += after_pad.eq(r.addr + r.a_bytes)
        with m.If(emit):
            with m.If(~final):            # (a final piece leaves r to the next stretch)
                m.d.sync += r.todo.eq(r.todo & ~piece)
            with m.If(run.last):
                m.d.sync += have_last.eq(0)     # each command reads its own beats
            with m.Elif(read):
                m.d.sync += [last_beat.eq(read_end[BBL:]), have_last.eq(1)]
        m.d.comb += [
            runs.w_data.eq(run),
            runs.w_en.eq(emit),
            ranges.w_data.eq(new_range),
            # (every read run's range, also one of no new beat: the burst issuer drops it, so
            # that the write does not wait for the beat comparison)
            ranges.w_en.eq(emit & read),
        ]

        # -- burst issuer -----------------------------------------------------------------------
        # Three register stages, each a handshake on registered state and short comparisons: a
        # range taken from the FIFO (its first beat to read computed), the range being cut into
        # *chunks* at the boundaries of `block`-beat aligned blocks (a burst never crosses one, so
        # it never exceeds dma_max_burst beats nor crosses 4 KiB: a page is a whole number of
        # blocks), and the chunk being merged into the burst being assembled. A chunk knows
        # whether it continues the previous one in DRAM within its block (`h_cont`), so merging
        # is a one-bit decision and an addition of short lengths.
        N, MB = cfg.dma_outstanding, cfg.dma_max_burst
        block = min(MB, _PAGE // BB)
        BKL = (block - 1).bit_length()    # bits of a beat's index within its block
        len_shape = range(block + 1)
        left_shape = beats_shape
        head = Signal(range_layout)
        m.d.comb += head.eq(ranges.r_data)

        a_valid = Signal()                # a range taken from the FIFO
        a_first = Signal(BIX)             # its first beat to read
        a_beats = Signal(left_shape)
        b_valid = Signal()                # the range being cut into chunks
        b_beat = Signal(BIX)              # its next chunk's first beat
        b_left = Signal(left_shape)       # its beats not yet cut
        b_end = Signal(BIX)               # the beat after its last
        b_room = Signal(len_shape)        # beats from b_beat to the end of its block
        b_first = Signal()                # the next chunk is the range's first ...
        b_cont = Signal()                 # ... and continues the previous range in its block
        prev_end = Signal(BIX)            # b_end of the previous range
        h_valid = Signal()                # the chunk being merged
        h_beat = Signal(BIX)
        h_len = Signal(len_shape)
        h_full = Signal()                 # it ends at its block's end: no burst grows past it
        h_cont = Signal()                 # it continues the previous chunk in its block

        p_valid = Signal()                # the burst being assembled
        p_beat = Signal(BIX)
        p_len = Signal(len_shape)
        # the bursts for AR: a StreamRegister whose output register is the burst offered on AR
        # and whose spare entry takes the next one while AR waits, so the issuer loads a burst
        # when the spare is empty (a register) and the AR handshake (through the read arbiter)
        # reaches only the register's enables, not the merge and its counts
        m.submodules.offer = offer = StreamRegister(data.StructLayout({"beat": BIX, "len": len_shape}))
        flight_bursts = Signal(range(N + 1))
        # in o and requested, not yet returned, as of the cycle before (a burst loaded into o and
        # a returned beat count one cycle late: the handshakes of AR and R reach no adder)
        flight_beats = Signal(range((N + 1) * block + 2))
        r_fired = Signal()
        loaded_len = Signal(len_shape)

        ar_fire = self.ar.valid & self.ar.ready
        r_fire = self.r.valid & self.r.ready
        r_last_fire = r_fire & self.r.payload.last
        out_free = Signal()
        m.d.comb += out_free.eq(offer.i.ready)
        # fewer beats in flight than the latency covers: send what we have rather than merge more
        hungry = Signal()
        m.d.comb += hungry.eq(flight_beats < cfg.dram_latency + 4)

        # merging: a chunk that continues the burst joins it (and the burst leaves if it is now
        # full or the bus is hungry); otherwise the burst leaves when AR is free and the chunk
        # starts the next one
        h_take = Signal()
        load_o = Signal()
        load_beat = Signal(BIX)
        load_len = Signal(len_shape)
        with m.If(p_valid & h_valid & h_cont):
            m.d.comb += h_take.eq(1)
            with m.If(out_free & (h_full | hungry)):
                m.d.comb += [load_o.eq(1), load_beat.eq(p_beat), load_len.eq(p_len + h_len)]
                m.d.sync += p_valid.eq(0)
            with m.Else():
                m.d.sync += p_len.eq(p_len + h_len)
        with m.Elif(p_valid):
            with m.If(out_free):
                m.d.comb += [load_o.eq(1), load_beat.eq(p_beat), load_len.eq(p_len),
                             h_take.eq(h_valid)]
                m.d.sync += [p_valid.eq(h_valid), p_beat.eq(h_beat), p_len.eq(h_len)]
        with m.Elif(h_valid):
            m.d.comb += h_take.eq(1)
            with m.If(out_free & (h_full | hungry)):
                m.d.comb += [load_o.eq(1), load_beat.eq(h_beat), load_len.eq(h_len)]
            with m.Else():
                m.d.sync += [p_valid.eq(1), p_beat.eq(h_beat), p_len.eq(h_len)]

        # cutting: one chunk per cycle, up to the end of the block or of the range
        b_fits = Signal()                 # the rest of the range is the next chunk (b_left <= b_room,
                                          # registered: the handshake waits for no comparison)
        # A skid register between the cutter and h: the cutter moves on whenever it is empty (a
        # registered bit), so the merge's handshake (which waits for AR) reaches none of the
        # cutter's or the range stage's registers; a chunk h cannot take at once waits there and
        # goes to h first.
        chunk_layout = data.StructLayout({"beat": BIX, "len": len_shape, "full": 1, "cont": 1})
        chunk = Signal(chunk_layout)
        m.d.comb += [chunk.beat.eq(b_beat), chunk.len.eq(Mux(b_fits, b_left, b_room)),
                     chunk.full.eq(~b_fits | ~b_end[:BKL].any()), chunk.cont.eq(b_first & b_cont)]
        chunk_skid = Signal(chunk_layout)
        chunk_skid_valid = Signal()
        b_emit = Signal()
        b_load = Signal()
        m.d.comb += [b_emit.eq(b_valid & ~chunk_skid_valid),
                     b_load.eq(~b_valid | (b_emit & b_fits))]
        # (a range of no beat, from a read run of no byte, is no chunk)
        b_chunk = Signal()
        m.d.comb += b_chunk.eq(b_emit & (b_left != 0))
        with m.If(~chunk_skid_valid):
            m.d.sync += chunk_skid.eq(chunk)
        with m.If(~h_valid | h_take):
            m.d.sync += [h_valid.eq(chunk_skid_valid | b_chunk), chunk_skid_valid.eq(0)]
            m.d.sync += [Cat(h_beat, h_len, h_full, h_cont).eq(
                Mux(chunk_skid_valid, chunk_skid, chunk))]
        with m.Elif(b_chunk):
            m.d.sync += chunk_skid_valid.eq(1)
        with m.If(b_emit & ~b_fits):
            m.d.sync += [b_beat.eq(b_beat + b_room), b_left.eq(b_left - b_room),
                         b_room.eq(block), b_fits.eq(b_left - b_room <= block), b_first.eq(0)]
        with m.If(b_load):
            # the previous range's end: of the range finishing now, else of the last one (with
            # beats)
            prev = Mux(b_valid & b_left.any(), b_end, prev_end)
            m.d.sync += [
                b_valid.eq(a_valid), b_beat.eq(a_first), b_left.eq(a_beats),
                b_end.eq(a_first + a_beats), b_room.eq(block - a_first[:BKL]),
                b_fits.eq(a_beats <= block - a_first[:BKL]),
                b_first.eq(1), b_cont.eq((a_first == prev) & a_first[:BKL].any()),
                prev_end.eq(prev),
            ]
        m.d.comb += ranges.r_en.eq(~a_valid | b_load)
        with m.If(ranges.r_en):
            m.d.sync += [a_valid.eq(ranges.r_rdy), a_first.eq(head.beat + head.skip),
                         a_beats.eq(((head.offset + head.nbytes + BB - 1) >> BBL) - head.skip)]

        m.d.comb += [offer.i.valid.eq(load_o), offer.i.payload.beat.eq(load_beat),
                     offer.i.payload.len.eq(load_len)]
        m.d.sync += [
            flight_bursts.eq(flight_bursts + ar_fire - r_last_fire),
            r_fired.eq(r_fire), loaded_len.eq(Mux(load_o, load_len, 0)),
            flight_beats.eq(flight_beats + loaded_len - r_fired),
        ]
        # a burst's slot is free again in the cycle after its last beat enters the read slice:
        # ARVALID is a function of registers, so that the R handshake (the read slice's
        # readiness through the read arbiter) does not run through AR and the arbiter's grant into
        # the burst issuer in one cycle (the count only falls while AR waits, so ARVALID stays up
        # until accepted)
        m.d.comb += [
            self.ar.valid.eq(offer.o.valid & (flight_bursts < N)),
            offer.o.ready.eq(self.ar.ready & (flight_bursts < N)),
            self.ar.payload.addr.eq(Cat(Const(0, BBL), offer.o.payload.beat)),
            self.ar.payload.len.eq(offer.o.payload.len - 1),
            self.ar.payload.size.eq(BBL),
        ]

        # -- aligner ----------------------------------------------------------------------------
        # The row buffer is the output: a finished row waits in it (rows.valid) and the next
        # row's first write goes in when it is taken. Row byte q = k * BB + l (slot k, lane l).
        pops_left = Signal(beats_shape)   # new beats the current run still needs
        pops_zero = Signal()              # pops_left == 0 and == 1, registered (the bus handshake
        pops_one = Signal()               # and the run FIFO's read wait for no comparison)
        kept = Signal(8 * BB)             # the last beat taken from the bus
        buf = Signal(data.ArrayLayout(8, RB))
        mask = Signal(RB)
        fresh = Signal()                  # buf holds a finished row: the next write starts a row
        row_resp = Signal(2)              # first error response among the current row's beats
        pad32 = Signal(32)
        m.d.comb += [pad32.eq(cur.pad),   # the pad element, sign-extended
                     self.rows.payload.data.eq(buf), self.rows.payload.mask.eq(mask)]

        out_free_rows = Signal()
        m.d.comb += out_free_rows.eq(~self.rows.valid | self.rows.ready)
        with m.If(self.rows.valid & self.rows.ready):
            m.d.sync += self.rows.valid.eq(0)

        wrote = Signal()
        finish_run = Signal()
        from_new = Signal()               # a new beat is placed this cycle
        resp_now = Signal(2)

        # What the current run covers and where its beats go, decoded when the run is taken from
        # the FIFO (registers: nothing but the beat's own rotation and a byte select lies between
        # the bus and the row buffer). Row byte q of a read run comes from the run's beat
        # floor((q - pos + offset) / BB): the beat taken now starts at row byte lo = pos - offset
        # + (share + beats taken) * BB, in slot lo // BB at lane `shift` = lo mod BB; the kept beat
        # is the one before.
        slots = -(-RB // BB)
        # (the FIFO's output is a block RAM's on ECP5: one plain register stage first)
        head_run = Signal(run_layout)     # the next run, decoded into the current one's state
        head_valid = Signal()
        head_end = Signal(len(head_run.pos) + 1)
        m.d.comb += head_end.eq(head_run.pos + head_run.nbytes)
        pos_eq, pos_gt = _slot_flags(m, head_run.pos[BBL:], slots, "pos_slot")
        end_eq, end_gt = _slot_flags(m, head_end[BBL:], slots, "end_slot")
        pos_lane = _lanes_at_least(m, head_run.pos[:BBL], BB, "pos_lane")
        end_lane = _lanes_at_least(m, head_end[:BBL], BB, "end_lane")
        head_in_run = Signal(RB)          # q >= pos and q < pos + nbytes
        for q in range(RB):
            k, lane = divmod(q, BB)
            m.d.comb += head_in_run[q].eq(((~pos_gt[k] & ~pos_eq[k]) | (pos_eq[k] & pos_lane[lane])) &
                                          (end_gt[k] | (end_eq[k] & ~end_lane[lane])))
        # lo // BB + 1 (>= 0) of the first new beat is pos // BB + k, k = 1 + share - (a borrow
        # from the lane): its one-hot is pos // BB's, shifted by k (no adder before the decode)
        head_base = Signal(BBL)           # (pos - offset) mod BB
        m.d.comb += head_base.eq(head_run.pos[:BBL] - head_run.offset)
        head_k = Signal(2)
        m.d.comb += head_k.eq(1 + head_run.share - (head_run.pos[:BBL] < head_run.offset))
        pos_slot, _ = _slot_flags(m, head_run.pos[BBL:], slots + 2, "lo_slot")
        head_at_lo = Signal(slots + 2)
        m.d.comb += head_at_lo.eq(Mux(head_k == 0, pos_slot,
                                      Mux(head_k == 1, pos_slot << 1, pos_slot << 2)))
        head_shift_lane = _lanes_at_least(m, head_base, BB, "shift_lane")

        in_run = Signal(RB)
        shift = Signal(BBL)
        shift_lane = Signal(BB)
        at_lo = Signal(slots + 2)         # one-hot: lo // BB + 1 of the beat taken now

        def rotate(beat):
            """The beat rotated so that its byte for row byte q sits at q mod BB."""
            rot = Signal(8 * BB)
            m.d.comb += rot.eq((Cat(beat, beat) << (shift * 8))[8 * BB:16 * BB])
            return rot

        rot_new = rotate(beat_in.payload.data)
        rot_kept = rotate(kept)

        new_mask = Signal(RB)
        for q in range(RB):
            k, lane = divmod(q, BB)
            # lo // BB == k is at_lo[k + 1]
            in_new = (at_lo[k + 1] & shift_lane[lane]) | (at_lo[k] & ~shift_lane[lane])
            in_kept = (at_lo[k + 2] & shift_lane[lane]) | (at_lo[k + 1] & ~shift_lane[lane])
            write = Signal(name=f"write_{q}")
            m.d.comb += write.eq(wrote & in_run[q] & (~cur.read | in_kept | (from_new & in_new)))
            # padding: row byte q gets byte (q mod elem_bytes) of the pad element
            pad_byte = pad32.word_select(Const(lane % 4, 2) & cur.pad_mask, 8)
            byte = Mux(cur.read & in_kept, rot_kept.word_select(lane, 8),
                       Mux(cur.read, rot_new.word_select(lane, 8), pad_byte))
            with m.If(write):
                m.d.sync += buf[q].eq(byte)
            m.d.comb += new_mask[q].eq(write | (mask[q] & ~fresh))

        with m.If(cur_valid & out_free_rows):
            with m.If(~cur.read):
                m.d.comb += [wrote.eq(1), finish_run.eq(1)]
            with m.Elif(pops_zero):
                # the whole run lies in the kept beat
                m.d.comb += [wrote.eq(1), finish_run.eq(1)]
            with m.Else():
                m.d.comb += beat_in.ready.eq(1)
                with m.If(beat_in.valid):
                    m.d.comb += [from_new.eq(1), resp_now.eq(beat_in.payload.resp)]
                    with m.If(beat_in.payload.resp != RESP_OKAY):
                        m.d.sync += self.error.eq(beat_in.payload.resp)
                    m.d.sync += [pops_left.eq(pops_left - 1), pops_zero.eq(pops_one),
                                 pops_one.eq(pops_left == 2), at_lo.eq(at_lo << 1),
                                 kept.eq(beat_in.payload.data)]
                    m.d.comb += [wrote.eq(1), finish_run.eq(pops_one)]
        row_resp_next = Signal(2)
        m.d.comb += row_resp_next.eq(Mux(row_resp != RESP_OKAY, row_resp, resp_now))
        with m.If(wrote):
            m.d.sync += mask.eq(new_mask)
            with m.If(finish_run & cur.row_end):
                m.d.sync += [
                    self.rows.valid.eq(1),
                    self.rows.payload.row.eq(cur.row),
                    self.rows.payload.last.eq(cur.last),
                    self.rows.payload.resp.eq(row_resp_next),
                    fresh.eq(1),
                    row_resp.eq(RESP_OKAY),
                ]
            with m.Else():
                m.d.sync += [fresh.eq(0), row_resp.eq(row_resp_next)]


        # (after the beat bookkeeping: a run taken now replaces the finished one's state)
        take_run = Signal()
        m.d.comb += [take_run.eq(~cur_valid | finish_run),
                     runs.r_en.eq(~head_valid | take_run)]
        with m.If(runs.r_en):
            m.d.sync += [head_run.eq(runs.r_data), head_valid.eq(runs.r_rdy)]
        head_pops = Signal(beats_shape)
        m.d.comb += head_pops.eq(((head_run.offset + head_run.nbytes + BB - 1) >> BBL) - head_run.share)
        with m.If(take_run):
            m.d.sync += [cur.eq(head_run), cur_valid.eq(head_valid),
                         pops_left.eq(head_pops), pops_zero.eq(head_pops == 0),
                         pops_one.eq(head_pops == 1),
                         in_run.eq(head_in_run), shift.eq(head_base),
                         shift_lane.eq(head_shift_lane), at_lo.eq(head_at_lo)]

        with m.If(self.clear_error):
            m.d.sync += self.error.eq(0)
        # runs.level counts a run from the edge that writes it, so there is no gap between the
        # generator's last run and the aligner
        m.d.comb += self.busy.eq(active | skid_valid | q_valid | r_valid | (runs.level != 0) | head_valid |
                                 cur_valid | self.rows.valid)
        return m


class StoreCommandLayout(data.StructLayout):
    """What the write engine needs of a STORE: the output geometry (docs/isa.md) and element size."""

    def __init__(self):
        super().__init__({
            "elem_bytes": unsigned(3),       # 1, 2 or 4
            "n": unsigned(8),                # elements per pixel
            "out_h": unsigned(16), "out_w": unsigned(16),
            "dram_addr": unsigned(32),
            "pitch_y": unsigned(24), "pitch_x": unsigned(24), "pitch_c": unsigned(24),
        })


class ScatterPorts(wiring.Component):
    """The ports of a STORE write engine (:class:`ScatterWriter`, or the serial one in
    ``hw/dma_serial.py``), for ``config``: see :class:`ScatterWriter`."""

    def __init__(self, config: AcceleratorConfig):
        if not isinstance(config, AcceleratorConfig):
            raise TypeError(f"config must be an AcceleratorConfig, not {config!r}")
        self.config = config
        self.row_bytes = max(config.cols * config.acc_bytes, config.spad_row_bytes)
        super().__init__({
            "cmd": In(stream.Signature(StoreCommandLayout())),
            "pixels": In(stream.Signature(data.ArrayLayout(8, self.row_bytes))),
            "aw": Out(stream.Signature(AddressLayout(_ADDR))),
            "w": Out(stream.Signature(WriteDataLayout(config.dma_data_bits))),
            "b": In(stream.Signature(ResponseLayout())),
            "busy": Out(1),
            "error": Out(2),
            "clear_error": In(1),
        })


class ScatterWriter(ScatterPorts):
    """Writes output pixels of a STORE to DRAM over AXI4 writes.

    Ports:
      ``cmd``  — one STORE geometry (``StoreCommandLayout``), accepted when idle.
      ``pixels`` — the bytes of each output pixel, elements packed from byte 0
                   (``data.ArrayLayout(8, row_bytes)``), in (oy, ox) row-major order.
      ``aw``/``w``/``b`` — the AXI4 write channels.
      ``busy`` — a command is in progress (until its last write response).
      ``error`` — sticky AXI error response seen since ``clear_error``.

    A pixel whose elements are consecutive in DRAM (``pitch_c == elem_bytes``) is one run of
    bytes; otherwise each element is a run of its own. Runs are packed into bus beats with byte
    strobes in order: a run that starts in the beat the previous run ended in shares it, and a
    beat that follows the previous one in DRAM extends its burst (up to
    :func:`write_burst_beats` beats, never across 4 KiB). One pixel per cycle when a pixel needs
    at most one new beat.
    """

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        RB, BB = self.row_bytes, cfg.dma_bytes
        BBL = max(1, (BB - 1).bit_length())
        BIX = _ADDR - BBL
        WB = max(RB + BB, 2 * BB)         # bytes of a run placed at its offset in its first beat
        MB = write_burst_beats(cfg)
        span_shape = range(-(-WB // BB) + 1)    # beats a run spans

        beat_layout = data.StructLayout({"data": 8 * BB, "strb": BB})
        burst_layout = data.StructLayout({"beat": BIX, "len": 8})     # len: beats - 1
        # (a burst's beats wait here until it is closed, with room for the next one's and two
        # more, see `room`)
        beat_depth = max(2 * MB, MB + 4)
        m.submodules.beats = beats = buffered_fifo(cfg, width=beat_layout.size, depth=beat_depth)
        burst_depth = 8
        m.submodules.bursts = bursts = buffered_fifo(cfg, width=burst_layout.size, depth=burst_depth)
        m.submodules.lengths = lengths = buffered_fifo(cfg, width=8, depth=burst_depth)

        # -- write responses ----------------------------------------------------------------------
        outstanding = Signal(16)          # bursts sent on AW without a write response
        aw_fire = self.aw.valid & self.aw.ready
        b_fire = self.b.valid & self.b.ready
        m.d.comb += self.b.ready.eq(1)
        with m.If(b_fire & (self.b.payload.resp != RESP_OKAY)):
            m.d.sync += self.error.eq(self.b.payload.resp)
        with m.If(self.clear_error):
            m.d.sync += self.error.eq(0)
        m.d.sync += outstanding.eq(outstanding + aw_fire - b_fire)

        # -- AW and W senders ---------------------------------------------------------------------
        head = Signal(burst_layout)
        m.d.comb += [
            head.eq(bursts.r_data),
            self.aw.valid.eq(bursts.r_rdy),
            self.aw.payload.addr.eq(Cat(Const(0, BBL), head.beat)),
            self.aw.payload.len.eq(head.len),
            self.aw.payload.size.eq(BBL),
            bursts.r_en.eq(aw_fire),
        ]
        sent = Signal(8)                  # beats of the head length already sent on W
        beat_out = Signal(beat_layout)
        m.d.comb += [
            beat_out.eq(beats.r_data),
            self.w.valid.eq(beats.r_rdy & lengths.r_rdy),
            self.w.payload.data.eq(beat_out.data),
            self.w.payload.strb.eq(beat_out.strb),
            self.w.payload.last.eq(sent == lengths.r_data),
        ]
        w_fire = self.w.valid & self.w.ready
        m.d.comb += beats.r_en.eq(w_fire)
        with m.If(w_fire):
            with m.If(self.w.payload.last):
                m.d.sync += sent.eq(0)
                m.d.comb += lengths.r_en.eq(1)
            with m.Else():
                m.d.sync += sent.eq(sent + 1)

        # Three stages, each a register the next one takes from, so that no handshake runs
        # through the beat arithmetic: the pixel being split into runs, the run being cut into
        # beats, the beat being filled (and the burst being assembled).
        c = Signal(StoreCommandLayout())
        eb = c.elem_bytes
        fast = Signal()
        run_bytes = Signal(range(RB + 1)) # bytes of a run: a pixel's on the fast path, else one element
        run_mask = Signal(RB)             # its byte mask from byte 0
        more = Signal()                   # pixels still to come
        ox_left = Signal(16)              # output columns and rows left, counting the current one
        oy_left = Signal(16)
        row_addr = Signal(_ADDR)          # address of (oy, 0, 0) of the next pixel
        pix_addr = Signal(_ADDR)          # address of the next pixel
        n_left = Signal(8)                # elements of a pixel (the last one's run ends it)
        idle = Signal()

        # -- pixels -> runs -----------------------------------------------------------------------
        p_valid = Signal()                # a pixel is being split into runs
        p_data = Signal(8 * RB)           # its remaining elements, from byte 0
        p_addr = Signal(_ADDR)            # address of its next run
        p_left = Signal(8)                # runs left of it, counting the next one
        p_final = Signal()                # the next run is its last
        last_beat = Signal(BIX)           # the last beat of the previous run of this command
        last_next = Signal(BIX)           # ... plus one
        have_last = Signal()

        r_valid = Signal()                # the run being cut into beats, placed at its offset
        r_data = Signal(8 * WB)
        r_mask = Signal(WB)
        r_beat = Signal(BIX)              # its first beat not yet taken
        r_span = Signal(span_shape)       # beats of it not yet taken
        r_share = Signal()                # its first beat is the previous run's last one
        r_final = Signal()                # the packer's next step takes its last beat
        r_next = Signal()                 # r_beat follows the beat being filled (when there is one)
        r_done = Signal()                 # the packer takes its last beat now
        r_free = Signal()
        m.d.comb += r_free.eq(~r_valid | r_done)

        offset = p_addr[:BBL]
        end_addr = Signal(_ADDR)
        m.d.comb += end_addr.eq(p_addr + run_bytes - 1)
        p_take = Signal()                 # a run of the pixel moves on to the packer
        m.d.comb += p_take.eq(p_valid & r_free)
        p_done = Signal()
        m.d.comb += p_done.eq(p_take & p_final)
        span = Signal(span_shape)
        share = Signal()
        m.d.comb += [span.eq((offset + run_bytes + BB - 1) >> BBL),
                     share.eq(have_last & (p_addr[BBL:] == last_beat))]
        with m.If(p_take):
            m.d.sync += [
                r_data.eq(p_data << (offset * 8)),
                r_mask.eq(run_mask << offset),
                r_beat.eq(p_addr[BBL:]),
                r_span.eq(span),
                r_share.eq(share),
                # a shared first beat is merged in the step that takes the second one
                r_final.eq(span <= Mux(share, 2, 1)),
                r_next.eq(p_addr[BBL:] == last_next),
                last_beat.eq(end_addr[BBL:]), last_next.eq(end_addr[BBL:] + 1),
                have_last.eq(1),
                p_addr.eq(p_addr + c.pitch_c),
                p_data.eq(p_data >> (eb * 8)),
                p_left.eq(p_left - 1),
                p_final.eq(p_left == 2),
            ]

        # A pixel is accepted while the skid register is empty (a register: the acceptance and
        # the address counters it advances do not wait for the runs downstream). It goes
        # straight to the splitter when that is free this cycle, else into the skid register,
        # which the splitter takes from first.
        s_valid = Signal()                # the skid register holds a pixel
        s_data = Signal(8 * RB)
        s_addr = Signal(_ADDR)
        p_free = Signal()                 # the splitter takes a new pixel this cycle, if one is there
        accept = Signal()
        m.d.comb += [self.pixels.ready.eq(more & ~s_valid),
                     accept.eq(self.pixels.valid & self.pixels.ready),
                     p_free.eq(~p_valid | p_done)]
        with m.If(p_free):
            m.d.sync += [p_left.eq(n_left), p_final.eq(fast | (n_left == 1)),
                         p_valid.eq(s_valid | accept), s_valid.eq(0)]
            with m.If(s_valid):
                m.d.sync += [p_data.eq(s_data), p_addr.eq(s_addr)]
            with m.Else():
                m.d.sync += [p_data.eq(self.pixels.payload), p_addr.eq(pix_addr)]
        with m.Elif(accept):
            m.d.sync += [s_valid.eq(1), s_data.eq(self.pixels.payload), s_addr.eq(pix_addr)]
        with m.If(accept):
            with m.If(ox_left != 1):
                m.d.sync += [ox_left.eq(ox_left - 1), pix_addr.eq(pix_addr + c.pitch_x)]
            with m.Elif(oy_left != 1):
                m.d.sync += [oy_left.eq(oy_left - 1), ox_left.eq(c.out_w),
                             row_addr.eq(row_addr + c.pitch_y), pix_addr.eq(row_addr + c.pitch_y)]
            with m.Else():
                m.d.sync += more.eq(0)

        # -- runs -> beats --------------------------------------------------------------------------
        cur_valid = Signal()              # the beat being filled
        cur_beat = Signal(BIX)
        cur_data = Signal(8 * BB)
        cur_strb = Signal(BB)
        slot0, mask0 = r_data[:8 * BB], r_mask[:BB]
        slot1, mask1 = r_data[8 * BB:16 * BB], r_mask[BB:2 * BB]
        merged = Signal(8 * BB)
        for b in range(BB):
            m.d.comb += merged.word_select(b, 8).eq(
                Mux(mask0[b], slot0.word_select(b, 8), cur_data.word_select(b, 8)))

        # the burst being assembled: it grows by the beat that leaves when that beat follows it
        b_open = Signal()
        b_beat = Signal(BIX)
        b_next = Signal(BIX)              # b_beat + b_len
        b_len = Signal(range(MB + 1))
        b_cap = Signal(range(MB + 1))
        e_valid = Signal()                # the beat that leaves now (to the beat FIFO)
        e_data = Signal(8 * BB)
        e_strb = Signal(BB)
        # The beat that leaves is always the one being filled (a run sharing it merges into it
        # first); whether it follows the open burst is a registered bit, `follows`
        # (cur_beat == b_next while a beat is being filled), kept up to date by the packer's steps:
        # after a beat leaves, b_next is its index plus one, so the next beat being filled follows
        # it when it is the second beat of a run sharing it, the next beat of the same run, or
        # the first beat of a run starting right after it (r_next, compared when the run was
        # made).
        follows = Signal()
        extends = Signal()
        m.d.comb += extends.eq(b_open & follows & (b_len != b_cap))
        close = Signal()                  # push the open burst (to AW and W length FIFOs)
        burst_out = Signal(burst_layout)
        m.d.comb += [
            burst_out.beat.eq(b_beat), burst_out.len.eq(b_len - 1),
            bursts.w_data.eq(burst_out), lengths.w_data.eq(b_len - 1),
        ]
        # The beat leaving goes through a register into the beat FIFO: the FIFO's write enable
        # fans out to all of its memory cells, so it comes straight from a flip-flop.
        beat_in = Signal(beat_layout)
        beat_in_valid = Signal()
        m.d.comb += [beats.w_data.eq(beat_in), beats.w_en.eq(beat_in_valid)]
        # Room for whatever a step may push (asked of every step, so that the handshake does not
        # wait for the beat comparisons; the FIFOs drain on their own: the open burst holds at
        # most `MB` beats, fewer than `beat_depth - 2`), registered: the beat FIFO's level one
        # cycle ago below `beat_depth - 2` leaves room for the beat in the register and the one
        # of this step, a burst FIFO's below `burst_depth - 1` for the burst a step may close.
        room = Signal()
        m.d.sync += room.eq((beats.level < beat_depth - 2) & (bursts.level < burst_depth - 1) &
                            (lengths.level < burst_depth - 1))
        go = Signal()                     # the step (or flush) happens this cycle
        m.d.sync += [beat_in_valid.eq(go & e_valid), beat_in.data.eq(e_data), beat_in.strb.eq(e_strb)]
        with m.If(go):
            m.d.comb += [bursts.w_en.eq(close), lengths.w_en.eq(close)]
            with m.If(e_valid):
                with m.If(extends):
                    m.d.sync += [b_len.eq(b_len + 1), b_next.eq(b_next + 1)]
                with m.Else():
                    m.d.sync += [b_open.eq(1), b_beat.eq(cur_beat), b_next.eq(cur_beat + 1),
                                 b_len.eq(1), b_cap.eq(_cap(cur_beat, BB, MB))]
            with m.Elif(close):
                m.d.sync += b_open.eq(0)

        # The packer's step. A run that starts in the beat being filled (`r_share`: the previous
        # run, already stepped, ended in that beat) merges its first beat into it.
        taken = Signal(2)                 # beats of the run this step takes: 1 or 2
        step = Signal()
        m.d.comb += [
            step.eq(r_valid & room),
            go.eq(step),
            taken.eq(Mux(r_share & (r_span > 1), 2, 1)),
            r_done.eq(step & r_final),
            e_valid.eq(Mux(r_share, r_span > 1, cur_valid)),
            e_data.eq(Mux(r_share, merged, cur_data)),
            e_strb.eq(Mux(r_share, cur_strb | mask0, cur_strb)),
            close.eq(e_valid & b_open & ~extends),
        ]
        with m.If(step):
            with m.If(r_share & (r_span == 1)):
                m.d.sync += [cur_data.eq(merged), cur_strb.eq(cur_strb | mask0)]
            with m.Elif(r_share):
                m.d.sync += [cur_beat.eq(r_beat + 1), cur_data.eq(slot1), cur_strb.eq(mask1),
                             follows.eq(1)]
            with m.Else():
                m.d.sync += [cur_valid.eq(1), cur_beat.eq(r_beat), cur_data.eq(slot0),
                             cur_strb.eq(mask0), follows.eq(r_next)]
        # (a comparison with a constant beyond r_span's range is left out: lint)
        at_most_3 = r_span <= 3 if (1 << len(r_span)) - 1 > 3 else Const(1)
        with m.If(step & ~r_final):       # (a finished run leaves r to the next one)
            m.d.sync += [
                r_data.eq(Mux(taken == 2, r_data >> (16 * BB), r_data >> (8 * BB))),
                r_mask.eq(Mux(taken == 2, r_mask >> (2 * BB), r_mask >> BB)),
                r_beat.eq(r_beat + taken),
                r_span.eq(r_span - taken),
                r_share.eq(0), r_next.eq(1),
                r_final.eq(Mux(taken == 2, at_most_3, r_span <= 2)),      # r_span - taken <= 1
            ]
        with m.If(p_take):
            m.d.sync += r_valid.eq(1)
        with m.Elif(r_done):
            m.d.sync += r_valid.eq(0)

        with m.FSM(name="store"):
            with m.State("IDLE"):
                m.d.comb += [self.cmd.ready.eq(1), idle.eq(1)]
                with m.If(self.cmd.valid):
                    cmd = self.cmd.payload
                    m.d.sync += [
                        c.eq(cmd), ox_left.eq(cmd.out_w), oy_left.eq(cmd.out_h),
                        p_valid.eq(0), s_valid.eq(0), r_valid.eq(0), cur_valid.eq(0), b_open.eq(0),
                        have_last.eq(0),
                        row_addr.eq(cmd.dram_addr), pix_addr.eq(cmd.dram_addr),
                        fast.eq(cmd.pitch_c == cmd.elem_bytes),
                        run_bytes.eq(_times(cmd.n, cmd.elem_bytes)),
                    ]
                    m.next = "SETUP"
            with m.State("SETUP"):
                # the run size and mask from the registered command (no product on the command's
                # path)
                n_bytes = Mux(fast, run_bytes, eb)
                m.d.sync += [
                    more.eq(1), n_left.eq(Mux(fast, 1, c.n)), run_bytes.eq(n_bytes),
                    run_mask.eq((Const(1, RB + 1) << n_bytes) - 1),
                ]
                m.next = "RUN"
            with m.State("RUN"):
                with m.If(~more & ~s_valid & ~p_valid & ~r_valid):
                    m.next = "FLUSH"
            with m.State("FLUSH"):
                # send the last beat, then close the last burst
                m.d.comb += [
                    e_valid.eq(cur_valid), e_data.eq(cur_data), e_strb.eq(cur_strb),
                    close.eq(b_open & (~cur_valid | ~extends)),
                    go.eq(room),
                ]
                with m.If(room):
                    m.d.sync += cur_valid.eq(0)
                    with m.If(~cur_valid & ~b_open):
                        m.next = "WAIT"
            with m.State("WAIT"):
                with m.If((bursts.level == 0) & (lengths.level == 0) & (outstanding == 0)):
                    m.next = "IDLE"
        m.d.comb += self.busy.eq(~idle)
        return m
