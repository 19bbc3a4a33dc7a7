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

* the *setup* stage computes the next command's coordinate steps (five multiply-adds) while the
  generator still walks the current one, so consecutive commands follow without a gap;
* the *generator* walks the loops (one run per cycle) and queues runs, and for each read run the
  bus beats it still needs: a run whose first beat is the previous read run's last beat reuses it
  (the aligner keeps the last beat), so consecutive rows or elements sharing a beat fetch it once;
* the *burst issuer* merges the beat ranges of consecutive runs that are contiguous in DRAM into
  AXI4 INCR bursts (at most ``dma_max_burst`` beats, never across a 4 KiB boundary) and keeps at
  most ``dma_outstanding`` bursts in flight. A burst leaves as soon as the address channel is free
  while fewer beats than the DRAM latency are in flight; otherwise it keeps growing until it is
  full or the next range is not contiguous;
* the *aligner* rotates each returned beat (and the kept previous beat) into place in a row buffer
  of bytes and hands out a finished destination row (row index, bytes, byte mask) per ``rows``
  transfer, one row per cycle when a row needs at most one new beat.

:class:`ScatterWriter` turns each output pixel into runs (the pixel's elements, or each element
alone when they are not consecutive in DRAM), packs consecutive runs into bus beats (runs that meet
in one beat share it) and contiguous beats into bursts; address, data and responses are pipelined,
so the next burst's address goes out while the current one's data flows.

Element sizes (bytes) are given per command, so one engine serves the scratchpad, the accumulator
and the requantize table; the consumer converts the bytes of a row into its memory's format.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from .axi import RESP_OKAY, AddressLayout, ReadDataLayout, ResponseLayout, WriteDataLayout
from .config import AcceleratorConfig

__all__ = ["LoadCommandLayout", "RowWriteLayout", "GatherReader", "row_buffer_bytes",
           "read_run_fifo_depth", "StoreCommandLayout", "ScatterWriter", "write_burst_beats"]

_ADDR = 32          # DRAM address bits
# Signed width of a y or x coordinate of a LOAD: |y0| < 2**15, plus less than 65536 * 128 from
# each of the outer and inner loops and 256 * 128 from each of the segment and element loops.
_COORD = 27
_PAGE = 4096        # AXI4 bursts never cross a 4 KiB boundary, bytes


def row_buffer_bytes(config: AcceleratorConfig) -> int:
    """Bytes of the widest destination row: scratchpad, accumulator or requantize table."""
    return max(config.spad_row_bytes, config.acc_row_bytes,
               config.cols * config.requant_entry_bytes)


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
    """``a * b`` (unsigned) as shifted additions over the shorter operand's bits: logic, never a
    DSP block (the products here are short: element sizes, row positions)."""
    if len(a) > len(b):
        a, b = b, a
    return sum(Mux(a[i], b << i, 0) for i in range(len(a)))


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


class _RunLayout(data.StructLayout):
    def __init__(self, row_bytes: int, beat_bytes: int):
        pos_bits = (row_bytes - 1).bit_length() + 1
        super().__init__({
            "read": unsigned(1),             # 1: bytes from DRAM, 0: padding
            "row": unsigned(16),
            "row_end": unsigned(1),          # the last run of its destination row
            "last": unsigned(1),             # the last run of its command
            "pos": unsigned(pos_bits),       # first byte in the row buffer
            "nbytes": unsigned(pos_bits),
            "offset": unsigned(max(1, (beat_bytes - 1).bit_length())),  # address mod beat size
            "beats": unsigned(pos_bits + 1), # bus beats the run's bytes lie in
            "share": unsigned(1),            # its first beat is the previous read run's last one
            "pad": signed(16),               # padding: the pad element
            "pad_mask": unsigned(2),         # padding: (element bytes - 1) mod 4
        })


class _RangeLayout(data.StructLayout):
    """Beats a read run needs from the bus: ``beats`` from beat index ``beat`` (address / beat size)."""

    def __init__(self, row_bytes: int, beat_bits: int):
        super().__init__({"beat": unsigned(_ADDR - beat_bits),
                          "beats": unsigned((row_bytes - 1).bit_length() + 2)})


class GatherReader(wiring.Component):
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

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        RB, BB = self.row_bytes, self.beat_bytes
        BBL = max(1, (BB - 1).bit_length())
        BIX = _ADDR - BBL                 # bits of a beat index
        run_layout = _RunLayout(RB, BB)
        range_layout = _RangeLayout(RB, BBL)
        pos_shape = run_layout.members["pos"]

        m.submodules.runs = runs = fifo.SyncFIFOBuffered(width=run_layout.size,
                                                         depth=read_run_fifo_depth(cfg))
        m.submodules.ranges = ranges = fifo.SyncFIFOBuffered(width=range_layout.size, depth=8)

        cur = Signal(run_layout)          # the run the aligner works on
        cur_valid = Signal()

        # -- setup: the offered command's coordinate steps ----------------------------------------
        # Each step (and the start address) is a sum of three products d * pitch, computed by
        # shift-and-add, the three at once, one multiplier bit per cycle from the low end; a
        # multiplier is done when what is left of it is 0 or -1 (the last, negative, weight), so
        # small steps take a cycle or two. All modulo 2**32: a step is exact (|d * pitch| < 2**31
        # each, three of them < 2**32 together for every legal LOAD, as docs/isa.md bounds the
        # bytes a row reads), the start address only matters modulo 2**32.
        p = self.cmd.payload
        names = ("start", "outer", "inner", "seg", "elem")
        operands = [(p.y0, p.x0, 0), (p.outer_dy, p.outer_dx, p.outer_dc),
                    (p.inner_dy, p.inner_dx, p.inner_dc), (p.seg_dy, p.seg_dx, p.seg_dc),
                    (p.elem_dy, p.elem_dx, p.elem_dc)]
        pitches = (p.pitch_y, p.pitch_x, p.pitch_c)
        nstep = {name: Signal(_ADDR, name=f"next_step_{name}") for name in names}
        vector = Signal(range(len(names) + 1))    # the vector being computed; 5: all done
        loaded = Signal()                         # vector 0's operands are in the registers
        multiplier = [Signal(signed(16), name=f"setup_mul_{a}") for a in "yx"] + \
                     [Signal(signed(8), name="setup_mul_c")]
        multiplicand = [Signal(_ADDR, name=f"setup_pitch_{a}") for a in "yxc"]
        total = Signal(_ADDR)
        total_next = Signal(_ADDR)
        left = []
        addends = [total]
        for mul, pitch in zip(multiplier, multiplicand, strict=True):
            negative = mul == -1          # the sign bit's weight is all that is left
            addends += [Mux(mul[0], pitch, 0) ^ negative.replicate(_ADDR), negative]
            left.append(Mux(negative, 0, mul >> 1))
        m.d.comb += total_next.eq(sum(addends))
        finished = Signal()
        m.d.comb += finished.eq(~Cat(*(value.any() for value in left)).any())

        def load(index):
            stmts = [total.eq(p.dram_addr if index == 0 else 0)]
            for mul, pitch, d, source in zip(multiplier, multiplicand, operands[index], pitches,
                                             strict=True):
                stmts += [mul.eq(d), pitch.eq(source)]
            return stmts

        accept = Signal()
        with m.If(~self.cmd.valid | accept):
            m.d.sync += [vector.eq(0), loaded.eq(0)]      # (re)start with the next offer
        with m.Elif(~loaded):
            m.d.sync += load(0) + [loaded.eq(1)]
        with m.Elif(vector != len(names)):
            with m.If(finished):
                with m.Switch(vector):
                    for index, name in enumerate(names):
                        with m.Case(index):
                            m.d.sync += nstep[name].eq(total_next)
                            if index + 1 < len(names):
                                m.d.sync += load(index + 1)
                m.d.sync += vector.eq(vector + 1)
            with m.Else():
                m.d.sync += total.eq(total_next)
                for mul, pitch, value in zip(multiplier, multiplicand, left, strict=True):
                    m.d.sync += [mul.eq(value), pitch.eq(pitch << 1)]

        # -- generator --------------------------------------------------------------------------
        c = Signal(LoadCommandLayout())   # the command being generated (its unused fields are
        active = Signal()                 # optimized away)
        eb = c.elem_bytes
        step = {name: Signal(_ADDR, name=f"step_{name}") for name in names[1:]}   # modulo 2**32
        fast = Signal()
        merge = Signal()                  # a run covers several consecutive units (see below)
        seg_bytes = Signal(range(RB + 1)) # bytes of a segment
        first_pos = Signal(pos_shape)     # row byte of element dst_col

        # units left in the current row (fast) or segment, and rows left, counting the current one
        o_left = Signal(16)
        i_left = Signal(16)
        s_left = Signal(9)
        e_left = Signal(9)
        # (y, x, address) at the start of the current outer row, row, segment and element
        lv = {}
        for level in ("out", "row", "seg", "el"):
            lv[level] = (Signal(signed(_COORD), name=f"{level}_y"), Signal(signed(_COORD), name=f"{level}_x"),
                         Signal(_ADDR, name=f"{level}_addr"))
        seg_pos = Signal(pos_shape)       # row byte of the current segment's first element
        el_pos = Signal(pos_shape)        # ... of the current element

        # Coordinates of what the generator emits now: the element level's, which equal the
        # segment level's on the fast path (no element steps there).
        y_now, x_now, addr_now = lv["el"]
        inside = Signal()
        y_in = Signal()
        m.d.comb += [
            y_in.eq(~c.bounded | ((y_now >= 0) & (y_now < c.height))),
            inside.eq(y_in & (~c.bounded | ((x_now >= 0) & (x_now < c.width)))),
        ]

        # A run is one *unit* (a segment on the fast path, an element otherwise) or, with `merge`,
        # as many consecutive units of the segment (fast: of the row) as are consecutive in DRAM
        # and all inside or all outside the image: units step x by 0 or 1 (and y by 0), so the
        # stretch ends at the image's left or right edge.
        rem = Signal(9)                   # units left in the row (fast) or the segment
        m.d.comb += rem.eq(Mux(fast, s_left, e_left))
        to_right = Signal(signed(_COORD + 1))
        to_left = Signal(signed(_COORD + 1))
        m.d.comb += [to_right.eq(c.width - x_now), to_left.eq(-x_now)]
        steps_x = Signal()
        m.d.comb += steps_x.eq(Mux(fast, c.seg_dx != 0, c.elem_dx != 0))
        units = Signal(9)
        with m.If(~merge):
            m.d.comb += units.eq(1)
        with m.Elif(~c.bounded | ~steps_x):
            m.d.comb += units.eq(rem)
        with m.Elif(inside):
            m.d.comb += units.eq(Mux(to_right < rem, to_right, rem))
        with m.Elif(y_in & (x_now < 0)):
            m.d.comb += units.eq(Mux(to_left < rem, to_left, rem))
        with m.Else():
            m.d.comb += units.eq(rem)
        # a run's bytes fit the row (units <= RB): its size is a short product
        run_bytes = Signal(range(RB + 1))
        m.d.comb += run_bytes.eq(_times(units[:(RB + 1).bit_length()], Mux(fast, seg_bytes, eb)))
        row_idx = Signal(16)              # destination row of the current position
        pos_now = el_pos                  # (seg_pos on the fast path, the same value)

        # beat reuse: the last beat of the previous read run of this command
        last_beat = Signal(BIX)
        have_last = Signal()
        first_beat = Signal(BIX)
        end_beat = Signal(BIX)
        m.d.comb += [first_beat.eq(addr_now[BBL:_ADDR]),
                     end_beat.eq((addr_now + run_bytes - 1)[BBL:_ADDR])]

        run = Signal(run_layout)
        seg_units = Signal(9)             # segments this run finishes
        m.d.comb += seg_units.eq(Mux(fast, units, 1))
        last_elem = Signal()
        last_seg = Signal()
        last_row_inner = Signal()
        last_outer = Signal()
        m.d.comb += [
            last_elem.eq(fast | (e_left == units)),
            last_seg.eq(s_left == seg_units),
            last_row_inner.eq(i_left == 1),
            last_outer.eq(o_left == 1),
            run.read.eq(inside),
            run.row.eq(row_idx),
            run.row_end.eq(last_elem & last_seg),
            run.last.eq(last_elem & last_seg & last_row_inner & last_outer),
            run.pos.eq(pos_now),
            run.nbytes.eq(run_bytes),
            run.offset.eq(addr_now[:BBL]),
            run.beats.eq((addr_now[:BBL] + run_bytes + BB - 1) >> BBL),
            run.share.eq(inside & have_last & (first_beat == last_beat)),
            run.pad.eq(c.pad_value),
            run.pad_mask.eq((eb - 1)[:2]),
        ]
        new_range = Signal(range_layout)
        m.d.comb += [new_range.beat.eq(first_beat + run.share), new_range.beats.eq(run.beats - run.share)]
        wants_range = Signal()
        m.d.comb += wants_range.eq(inside & (new_range.beats != 0))

        emit = Signal()
        m.d.comb += emit.eq(active & runs.w_rdy & (~wants_range | ranges.w_rdy))
        # Advancing a loop level moves that level and every level below it to the level's
        # position plus its step; the command's start loads every level (step 0). One adder
        # per coordinate does all of it. Merged units step x by 1 (or 0) each and y by 0, and
        # are run_bytes long together.
        levels = ("el", "seg", "row", "out")
        advance = Signal(len(levels) + 1)   # one-hot: element, segment, row, outer row, start
        base, delta, moved = ([Signal.like(value, name=f"{kind}_{axis}")
                               for axis, value in zip("yxa", lv["el"], strict=True)]
                              for kind in ("base", "delta", "moved"))
        deltas = [
            (c.elem_dy, Mux(merge, units, c.elem_dx), Mux(merge, run_bytes, step["elem"])),
            (c.seg_dy, Mux(merge & fast, Mux(c.seg_dx == 0, 0, units), c.seg_dx),
             Mux(merge & fast, run_bytes, step["seg"])),
            (c.inner_dy, c.inner_dx, step["inner"]),
            (c.outer_dy, c.outer_dx, step["outer"]),
        ]
        with m.Switch(advance):
            for index, level in enumerate(levels):
                with m.Case(1 << index):
                    m.d.comb += [b.eq(v) for b, v in zip(base, lv[level], strict=True)]
                    m.d.comb += [d.eq(v) for d, v in zip(delta, deltas[index], strict=True)]
            with m.Default():           # the start: (y0, x0, start address), nothing added
                m.d.comb += [base[0].eq(p.y0), base[1].eq(p.x0), base[2].eq(nstep["start"])]
        m.d.comb += [n.eq(b + d) for n, b, d in zip(moved, base, delta, strict=True)]
        for index, level in enumerate(levels):
            with m.If(advance[index:].any()):
                m.d.sync += [v.eq(n) for v, n in zip(lv[level], moved, strict=True)]

        with m.If(emit):
            with m.If(inside):
                m.d.sync += [last_beat.eq(end_beat), have_last.eq(1)]
            # advance the loops
            with m.If(~last_elem):
                m.d.comb += advance.eq(0b00001)
                m.d.sync += [e_left.eq(e_left - units), el_pos.eq(el_pos + run_bytes)]
            with m.Elif(~last_seg):
                m.d.comb += advance.eq(0b00010)
                npos = seg_pos + Mux(fast, run_bytes, seg_bytes)
                m.d.sync += [e_left.eq(c.seg_len), s_left.eq(s_left - seg_units),
                             seg_pos.eq(npos), el_pos.eq(npos)]
            with m.Elif(~last_row_inner):
                m.d.comb += advance.eq(0b00100)
                m.d.sync += [e_left.eq(c.seg_len), s_left.eq(c.segs), i_left.eq(i_left - 1),
                             row_idx.eq(row_idx + 1), seg_pos.eq(first_pos), el_pos.eq(first_pos)]
            with m.Elif(~last_outer):
                m.d.comb += advance.eq(0b01000)
                m.d.sync += [e_left.eq(c.seg_len), s_left.eq(c.segs), i_left.eq(c.rows_inner),
                             o_left.eq(o_left - 1),
                             row_idx.eq(row_idx + 1), seg_pos.eq(first_pos), el_pos.eq(first_pos)]
            with m.Else():
                m.d.sync += active.eq(0)

        # take the offered command once set up, in the cycle the current one emits its last run
        m.d.comb += [
            accept.eq(self.cmd.valid & (vector == len(names)) & (~active | (emit & run.last))),
            self.cmd.ready.eq(accept),
        ]
        next_fast = Signal()
        m.d.comb += next_fast.eq((nstep["elem"] == p.elem_bytes) &
                                 (~p.bounded | ((p.elem_dy == 0) & (p.elem_dx == 0))))
        next_seg_bytes = Signal(range(RB + 1))
        m.d.comb += next_seg_bytes.eq(_times(p.seg_len, p.elem_bytes))
        next_merge = Signal()
        m.d.comb += next_merge.eq(Mux(
            next_fast,
            # segments back to back in DRAM, sharing y and stepping x by 0 or 1 (a segment
            # longer than a row never is: the command is not legal)
            (nstep["seg"] == _times(p.seg_len, p.elem_bytes)) &
            (~p.bounded | ((p.seg_dy == 0) & ((p.seg_dx == 0) | (p.seg_dx == 1)))),
            # elements back to back in DRAM along x (a bounded transposing walk)
            (nstep["elem"] == p.elem_bytes) & (p.elem_dy == 0) & (p.elem_dx == 1)))
        with m.If(accept):
            m.d.sync += [
                c.eq(p), active.eq(1), have_last.eq(0),
                fast.eq(next_fast), merge.eq(next_merge), seg_bytes.eq(next_seg_bytes),
                o_left.eq(p.rows_outer), i_left.eq(p.rows_inner), s_left.eq(p.segs),
                e_left.eq(p.seg_len),
                row_idx.eq(p.dst_addr),
                seg_pos.eq(_times(p.dst_col, p.elem_bytes)), el_pos.eq(_times(p.dst_col, p.elem_bytes)),
                first_pos.eq(_times(p.dst_col, p.elem_bytes)),
            ]
            m.d.sync += [step[name].eq(nstep[name]) for name in names[1:]]
            m.d.comb += advance.eq(0b10000)     # every level to the start
        m.d.comb += [
            runs.w_data.eq(run),
            runs.w_en.eq(emit),
            ranges.w_data.eq(new_range),
            ranges.w_en.eq(emit & wants_range),
        ]

        # -- burst issuer -----------------------------------------------------------------------
        N, MB = cfg.dma_outstanding, cfg.dma_max_burst
        head = Signal(range_layout)
        m.d.comb += head.eq(ranges.r_data)
        have_head = ranges.r_rdy
        issued = Signal(range_layout.members["beats"])      # beats of the head range already taken
        head_beat = Signal(BIX)
        head_left = Signal(range_layout.members["beats"])
        m.d.comb += [head_beat.eq(head.beat + issued), head_left.eq(head.beats - issued)]

        len_shape = range(MB + 1)
        p_valid = Signal()                # the burst being merged
        p_beat = Signal(BIX)
        p_len = Signal(len_shape)
        p_cap = Signal(len_shape)
        o_valid = Signal()                # the burst offered on AR
        o_beat = Signal(BIX)
        o_len = Signal(len_shape)
        flight_bursts = Signal(range(N + 1))
        flight_beats = Signal(range((N + 1) * MB + 1))     # in o and requested, not yet returned

        ar_fire = self.ar.valid & self.ar.ready
        r_fire = self.r.valid & self.r.ready
        r_last_fire = r_fire & self.r.payload.last
        out_free = ~o_valid | ar_fire
        # fewer beats in flight than the latency covers: send what we have rather than merge more
        hungry = flight_beats < cfg.dram_latency + 4

        contiguous = Signal()
        m.d.comb += contiguous.eq(p_valid & have_head & (head_beat == p_beat + p_len) & (p_len != p_cap))
        grown = Signal(len_shape)
        m.d.comb += grown.eq(p_len + _min(head_left, p_cap - p_len))
        new_cap = Signal(len_shape)
        m.d.comb += new_cap.eq(_cap(head_beat, BB, MB))
        new_len = Signal(len_shape)
        m.d.comb += new_len.eq(_min(head_left, new_cap))

        take = Signal(range_layout.members["beats"])        # beats taken from the head range
        load_o = Signal()
        load_beat = Signal(BIX)
        load_len = Signal(len_shape)
        with m.If(contiguous):
            m.d.comb += take.eq(grown - p_len)
            with m.If(out_free & ((grown == p_cap) | hungry)):
                m.d.comb += [load_o.eq(1), load_beat.eq(p_beat), load_len.eq(grown)]
                m.d.sync += p_valid.eq(0)
            with m.Else():
                m.d.sync += p_len.eq(grown)
        with m.Elif(p_valid):
            # not extendable (full, a gap, or nothing queued): send it, start the next one
            with m.If(out_free):
                m.d.comb += [load_o.eq(1), load_beat.eq(p_beat), load_len.eq(p_len)]
                m.d.sync += p_valid.eq(have_head)
                with m.If(have_head):
                    m.d.comb += take.eq(new_len)
                    m.d.sync += [p_beat.eq(head_beat), p_len.eq(new_len), p_cap.eq(new_cap)]
        with m.Elif(have_head):
            m.d.comb += take.eq(new_len)
            with m.If(out_free & ((new_len == new_cap) | hungry)):
                m.d.comb += [load_o.eq(1), load_beat.eq(head_beat), load_len.eq(new_len)]
            with m.Else():
                m.d.sync += [p_valid.eq(1), p_beat.eq(head_beat), p_len.eq(new_len), p_cap.eq(new_cap)]
        with m.If(take != 0):
            with m.If(take == head_left):
                m.d.comb += ranges.r_en.eq(1)
                m.d.sync += issued.eq(0)
            with m.Else():
                m.d.sync += issued.eq(issued + take)

        with m.If(load_o):
            m.d.sync += [o_valid.eq(1), o_beat.eq(load_beat), o_len.eq(load_len)]
        with m.Elif(ar_fire):
            m.d.sync += o_valid.eq(0)
        m.d.sync += [
            flight_bursts.eq(flight_bursts + ar_fire - r_last_fire),
            flight_beats.eq(flight_beats + Mux(load_o, load_len, 0) - r_fire),
        ]
        # a burst's slot is free again in the cycle its last beat is taken (the count only falls
        # while AR waits, so ARVALID stays up until accepted)
        m.d.comb += [
            self.ar.valid.eq(o_valid & ((flight_bursts < N) | r_last_fire)),
            self.ar.payload.addr.eq(Cat(Const(0, BBL), o_beat)),
            self.ar.payload.len.eq(o_len - 1),
            self.ar.payload.size.eq(BBL),
        ]

        # -- aligner ----------------------------------------------------------------------------
        # The row buffer is the output: a finished row waits in it (rows.valid) and the next
        # row's first write goes in when it is taken. Row byte q = k * BB + l (slot k, lane l).
        pops_done = Signal(run_layout.members["beats"])    # new beats taken for the current run
        pops = Signal(run_layout.members["beats"])
        m.d.comb += pops.eq(cur.beats - cur.share)
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

        # Which row bytes the run covers: q >= pos and q < pos + nbytes, from slot and lane flags.
        slots = -(-RB // BB)
        end = Signal(len(cur.pos) + 1)
        m.d.comb += end.eq(cur.pos + cur.nbytes)
        pos_eq, pos_gt = _slot_flags(m, cur.pos[BBL:], slots, "pos_slot")
        end_eq, end_gt = _slot_flags(m, end[BBL:], slots, "end_slot")
        pos_lane = _lanes_at_least(m, cur.pos[:BBL], BB, "pos_lane")
        end_lane = _lanes_at_least(m, end[:BBL], BB, "end_lane")

        # Row byte q of a read run comes from the run's beat floor((q - pos + offset) / BB): the
        # beat taken now starts at row byte lo = pos - offset + (share + pops_done) * BB, in slot
        # lo // BB at lane `shift` = lo mod BB; the kept beat is the one before.
        shift = Signal(BBL)
        m.d.comb += shift.eq(cur.pos - cur.offset)
        base = Signal(signed(len(cur.pos) + 1))
        m.d.comb += base.eq(cur.pos - cur.offset)
        lo_slot = Signal(len(cur.beats) + 1)             # lo // BB + 1 (>= 0)
        m.d.comb += lo_slot.eq((base >> BBL) + 1 + cur.share + pops_done)
        at_lo, _ = _slot_flags(m, lo_slot, slots + 2, "lo_slot")
        shift_lane = _lanes_at_least(m, shift, BB, "shift_lane")

        def rotate(beat):
            """The beat rotated so that its byte for row byte q sits at q mod BB."""
            rot = Signal(8 * BB)
            m.d.comb += rot.eq((Cat(beat, beat) << (shift * 8))[8 * BB:16 * BB])
            return rot

        rot_new = rotate(self.r.payload.data)
        rot_kept = rotate(kept)

        new_mask = Signal(RB)
        for q in range(RB):
            k, lane = divmod(q, BB)
            in_run = ((~pos_gt[k] & ~pos_eq[k]) | (pos_eq[k] & pos_lane[lane])) & \
                     (end_gt[k] | (end_eq[k] & ~end_lane[lane]))
            # lo // BB == k is at_lo[k + 1]
            in_new = (at_lo[k + 1] & shift_lane[lane]) | (at_lo[k] & ~shift_lane[lane])
            in_kept = (at_lo[k + 2] & shift_lane[lane]) | (at_lo[k + 1] & ~shift_lane[lane])
            write = Signal(name=f"write_{q}")
            m.d.comb += write.eq(wrote & in_run & (~cur.read | in_kept | (from_new & in_new)))
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
            with m.Elif(pops == 0):
                # the whole run lies in the kept beat
                m.d.comb += [wrote.eq(1), finish_run.eq(1)]
            with m.Else():
                m.d.comb += self.r.ready.eq(1)
                with m.If(self.r.valid):
                    m.d.comb += [from_new.eq(1), resp_now.eq(self.r.payload.resp)]
                    with m.If(self.r.payload.resp != RESP_OKAY):
                        m.d.sync += self.error.eq(self.r.payload.resp)
                    m.d.sync += [pops_done.eq(pops_done + 1), kept.eq(self.r.payload.data)]
                    m.d.comb += [wrote.eq(1), finish_run.eq(pops_done == pops - 1)]
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

        m.d.comb += runs.r_en.eq(~cur_valid | finish_run)
        with m.If(runs.r_en):
            m.d.sync += [cur.eq(runs.r_data), cur_valid.eq(runs.r_rdy), pops_done.eq(0)]

        with m.If(self.clear_error):
            m.d.sync += self.error.eq(0)
        # runs.level counts a run from the edge that writes it, so there is no gap between the
        # generator's last run and the aligner
        m.d.comb += self.busy.eq(active | (runs.level != 0) | cur_valid | self.rows.valid)
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


class ScatterWriter(wiring.Component):
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

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        RB, BB = self.row_bytes, cfg.dma_bytes
        BBL = max(1, (BB - 1).bit_length())
        BIX = _ADDR - BBL
        WB = max(RB + BB, 2 * BB)         # bytes of a run placed at its offset in its first beat
        MB = write_burst_beats(cfg)

        beat_layout = data.StructLayout({"data": 8 * BB, "strb": BB})
        burst_layout = data.StructLayout({"beat": BIX, "len": 8})     # len: beats - 1
        m.submodules.beats = beats = fifo.SyncFIFOBuffered(width=beat_layout.size, depth=2 * MB)
        m.submodules.bursts = bursts = fifo.SyncFIFOBuffered(width=burst_layout.size, depth=4)
        m.submodules.lengths = lengths = fifo.SyncFIFOBuffered(width=8, depth=4)

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

        # -- pixels -> runs -----------------------------------------------------------------------
        c = Signal(StoreCommandLayout())
        eb = c.elem_bytes
        fast = Signal()
        pix_bytes = Signal(range(RB + 1))  # bytes of a pixel's run on the fast path
        more = Signal()                    # pixels still to come
        oy = Signal(16)
        ox = Signal(16)
        row_addr = Signal(_ADDR)           # address of (oy, 0, 0) of the next pixel
        pix_addr = Signal(_ADDR)           # address of the next pixel
        held = Signal()                    # a pixel is being split into runs
        pix = Signal(8 * RB)               # its remaining elements, from byte 0
        el = Signal(8)
        run_addr = Signal(_ADDR)

        a_bytes = Signal(range(RB + 1))
        m.d.comb += a_bytes.eq(Mux(fast, pix_bytes, eb))
        a_last = Signal()
        m.d.comb += a_last.eq(fast | (el == c.n - 1))
        a_data = Signal(8 * WB)
        a_mask = Signal(WB)
        offset = run_addr[:BBL]
        m.d.comb += [
            a_data.eq(pix << (offset * 8)),
            a_mask.eq(((Const(1, RB + 1) << a_bytes) - 1) << offset),
        ]

        # a run that spans more than the beats one step takes continues from here
        src_valid = Signal()
        src_data = Signal(8 * WB)
        src_mask = Signal(WB)
        src_beat = Signal(BIX)
        s_data = Signal(8 * WB)
        s_mask = Signal(WB)
        s_beat = Signal(BIX)
        s_valid = Signal()
        m.d.comb += [
            s_data.eq(Mux(src_valid, src_data, a_data)),
            s_mask.eq(Mux(src_valid, src_mask, a_mask)),
            s_beat.eq(Mux(src_valid, src_beat, run_addr[BBL:])),
            s_valid.eq(src_valid | held),
        ]

        # -- runs -> beats --------------------------------------------------------------------------
        cur_valid = Signal()               # the beat being filled
        cur_beat = Signal(BIX)
        cur_data = Signal(8 * BB)
        cur_strb = Signal(BB)
        slot0, mask0 = s_data[:8 * BB], s_mask[:BB]
        slot1, mask1 = s_data[8 * BB:16 * BB], s_mask[BB:2 * BB]
        merged = Signal(8 * BB)
        for b in range(BB):
            m.d.comb += merged.word_select(b, 8).eq(
                Mux(mask0[b], slot0.word_select(b, 8), cur_data.word_select(b, 8)))
        match = Signal()                   # the run starts in the beat being filled
        two = Signal()                     # ... and continues into the next: send the merged beat
        m.d.comb += [match.eq(cur_valid & (cur_beat == s_beat)), two.eq(match & (mask1 != 0))]

        # the beat that leaves now (to the beat FIFO), and burst bookkeeping
        e_valid = Signal()
        e_data = Signal(8 * BB)
        e_strb = Signal(BB)
        b_open = Signal()                  # the burst being assembled
        b_beat = Signal(BIX)
        b_len = Signal(range(MB + 1))
        b_cap = Signal(range(MB + 1))
        extends = Signal()
        m.d.comb += extends.eq(b_open & (cur_beat == b_beat + b_len) & (b_len != b_cap))
        close = Signal()                   # push the open burst (to AW and W length FIFOs)
        room = Signal()
        m.d.comb += room.eq((~e_valid | beats.w_rdy) & (~close | (bursts.w_rdy & lengths.w_rdy)))
        burst_out = Signal(burst_layout)
        m.d.comb += [
            burst_out.beat.eq(b_beat), burst_out.len.eq(b_len - 1),
            bursts.w_data.eq(burst_out), lengths.w_data.eq(b_len - 1),
        ]
        beat_in = Signal(beat_layout)
        m.d.comb += [beat_in.data.eq(e_data), beat_in.strb.eq(e_strb), beats.w_data.eq(beat_in)]
        go = Signal()                      # the step (or flush) happens this cycle
        with m.If(go):
            m.d.comb += [beats.w_en.eq(e_valid), bursts.w_en.eq(close), lengths.w_en.eq(close)]
            with m.If(e_valid):
                with m.If(extends):
                    m.d.sync += b_len.eq(b_len + 1)
                with m.Else():
                    m.d.sync += [b_open.eq(1), b_beat.eq(cur_beat), b_len.eq(1),
                                 b_cap.eq(_cap(cur_beat, BB, MB))]
            with m.Elif(close):
                m.d.sync += b_open.eq(0)

        step = Signal()
        accept = Signal()
        m.d.comb += accept.eq(self.pixels.valid & self.pixels.ready)
        with m.FSM(name="store"):
            with m.State("IDLE"):
                m.d.comb += self.cmd.ready.eq(1)
                with m.If(self.cmd.valid):
                    p = self.cmd.payload
                    m.d.sync += [
                        c.eq(p), oy.eq(0), ox.eq(0), more.eq(1), held.eq(0), src_valid.eq(0),
                        cur_valid.eq(0), b_open.eq(0),
                        row_addr.eq(p.dram_addr), pix_addr.eq(p.dram_addr),
                        fast.eq(p.pitch_c == p.elem_bytes), pix_bytes.eq(_times(p.n, p.elem_bytes)),
                    ]
                    m.next = "RUN"
            with m.State("RUN"):
                m.d.comb += [
                    e_valid.eq(Mux(match, two, cur_valid)),
                    e_data.eq(Mux(match, merged, cur_data)),
                    e_strb.eq(Mux(match, cur_strb | mask0, cur_strb)),
                    close.eq(e_valid & b_open & ~extends),
                    step.eq(s_valid & room),
                    go.eq(step),
                    self.pixels.ready.eq(more & (~held | (step & ~src_valid & a_last))),
                ]
                with m.If(step):
                    taken = Signal(2)      # beats of the run this step takes: 1 or 2
                    m.d.comb += taken.eq(Mux(two, 2, 1))
                    with m.If(two):
                        m.d.sync += [cur_beat.eq(s_beat + 1), cur_data.eq(slot1), cur_strb.eq(mask1)]
                    with m.Elif(match):
                        m.d.sync += [cur_data.eq(merged), cur_strb.eq(cur_strb | mask0)]
                    with m.Else():
                        m.d.sync += [cur_valid.eq(1), cur_beat.eq(s_beat), cur_data.eq(slot0),
                                     cur_strb.eq(mask0)]
                    rest_mask = Mux(two, s_mask >> (2 * BB), s_mask >> BB)
                    m.d.sync += [
                        src_valid.eq(rest_mask != 0),
                        src_data.eq(Mux(two, s_data >> (16 * BB), s_data >> (8 * BB))),
                        src_mask.eq(rest_mask),
                        src_beat.eq(s_beat + taken),
                    ]
                    with m.If(~src_valid):
                        # the held pixel's run moved on: its next element, or the pixel is done
                        with m.If(a_last):
                            m.d.sync += held.eq(0)
                        with m.Else():
                            m.d.sync += [el.eq(el + 1), run_addr.eq(run_addr + c.pitch_c),
                                         pix.eq(pix >> (eb * 8))]
                with m.If(accept):
                    m.d.sync += [held.eq(1), pix.eq(self.pixels.payload), el.eq(0), run_addr.eq(pix_addr)]
                    with m.If(ox != c.out_w - 1):
                        m.d.sync += [ox.eq(ox + 1), pix_addr.eq(pix_addr + c.pitch_x)]
                    with m.Elif(oy != c.out_h - 1):
                        m.d.sync += [oy.eq(oy + 1), ox.eq(0), row_addr.eq(row_addr + c.pitch_y),
                                     pix_addr.eq(row_addr + c.pitch_y)]
                    with m.Else():
                        m.d.sync += more.eq(0)
                with m.If(~more & ~held & ~src_valid):
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
        m.d.comb += self.busy.eq(~self.cmd.ready)
        return m
