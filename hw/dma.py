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
_WIDE = 42          # signed width of address arithmetic before bounds are known
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

        m.submodules.runs = runs = fifo.SyncFIFOBuffered(width=run_layout.size,
                                                         depth=read_run_fifo_depth(cfg))
        m.submodules.ranges = ranges = fifo.SyncFIFOBuffered(width=range_layout.size, depth=8)

        cur = Signal(run_layout)          # the run the aligner works on
        cur_valid = Signal()

        # -- setup: the next command's coordinate steps -----------------------------------------
        nxt = Signal(LoadCommandLayout())
        nxt_valid = Signal()
        setup = Signal(range(6))          # steps computed so far; 5: ready
        names = ("start", "outer", "inner", "seg", "elem")
        nstep = {name: Signal(signed(_WIDE), name=f"next_step_{name}") for name in names}
        mul_a = Signal(signed(17))
        mul_b = Signal(signed(17))
        mul_c = Signal(signed(17))
        product = Signal(signed(_WIDE))
        m.d.comb += product.eq(mul_a * nxt.pitch_y + mul_b * nxt.pitch_x + mul_c * nxt.pitch_c)
        m.d.comb += self.cmd.ready.eq(~nxt_valid)
        with m.If(self.cmd.valid & self.cmd.ready):
            m.d.sync += [nxt.eq(self.cmd.payload), nxt_valid.eq(1), setup.eq(0)]
        with m.Elif(nxt_valid & (setup != 5)):
            # one coordinate-step vector per cycle through one multiply-add
            vectors = [
                (nxt.y0, nxt.x0, 0),
                (nxt.outer_dy, nxt.outer_dx, nxt.outer_dc),
                (nxt.inner_dy, nxt.inner_dx, nxt.inner_dc),
                (nxt.seg_dy, nxt.seg_dx, nxt.seg_dc),
                (nxt.elem_dy, nxt.elem_dx, nxt.elem_dc),
            ]
            with m.Switch(setup):
                for index, (a, b, cc) in enumerate(vectors):
                    with m.Case(index):
                        m.d.comb += [mul_a.eq(a), mul_b.eq(b), mul_c.eq(cc)]
                        extra = nxt.dram_addr if index == 0 else 0
                        m.d.sync += nstep[names[index]].eq(product + extra)
            m.d.sync += setup.eq(setup + 1)

        # -- generator --------------------------------------------------------------------------
        c = Signal(LoadCommandLayout())   # the command being generated
        active = Signal()
        eb = c.elem_bytes
        step = {name: Signal(signed(_WIDE), name=f"step_{name}") for name in names}
        fast = Signal()
        merge = Signal()                  # a run covers several consecutive units (see below)

        o_cnt = Signal(16)
        i_cnt = Signal(16)
        s_cnt = Signal(8)
        e_cnt = Signal(8)
        # (y, x, address) at the start of the current outer row, row, segment and element
        lv = {}
        for level in ("out", "row", "seg", "el"):
            lv[level] = (Signal(signed(34), name=f"{level}_y"), Signal(signed(34), name=f"{level}_x"),
                         Signal(signed(_WIDE), name=f"{level}_addr"))

        # Coordinates of what the generator emits now.
        y_now = Mux(fast, lv["seg"][0], lv["el"][0])
        x_now = Mux(fast, lv["seg"][1], lv["el"][1])
        addr_now = Signal(signed(_WIDE))
        m.d.comb += addr_now.eq(Mux(fast, lv["seg"][2], lv["el"][2]))
        inside = Signal()
        y_in = Signal()
        m.d.comb += [
            y_in.eq(~c.bounded | ((y_now >= 0) & (y_now < c.height))),
            inside.eq(y_in & (~c.bounded | ((x_now >= 0) & (x_now < c.width)))),
        ]
        seg_bytes = Signal(range(RB + 1))
        m.d.comb += seg_bytes.eq(c.seg_len * eb)

        # A run is one *unit* (a segment on the fast path, an element otherwise) or, with `merge`,
        # as many consecutive units of the segment (fast: of the row) as are consecutive in DRAM
        # and all inside or all outside the image: units step x by 0 or 1 (and y by 0), so the
        # stretch ends at the image's left or right edge.
        rem = Signal(9)                   # units left in the row (fast) or the segment
        m.d.comb += rem.eq(Mux(fast, c.segs - s_cnt, c.seg_len - e_cnt))
        to_right = Signal(signed(36))
        to_left = Signal(signed(36))
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
        run_bytes = Signal(range(RB + 1))
        m.d.comb += run_bytes.eq(units * Mux(fast, seg_bytes, eb))
        row_idx = Signal(16)              # destination row of the current position
        seg_col = Signal(range(512))      # destination element of the current segment's start
        elem_index = Signal(range(1024))
        m.d.comb += elem_index.eq(seg_col + Mux(fast, 0, e_cnt))

        # beat reuse: the last beat of the previous read run of this command
        last_beat = Signal(BIX)
        have_last = Signal()
        first_beat = Signal(BIX)
        end_beat = Signal(BIX)
        m.d.comb += [first_beat.eq(addr_now[BBL:_ADDR]),
                     end_beat.eq((addr_now + run_bytes - 1)[BBL:_ADDR])]

        run = Signal(run_layout)
        last_elem = Signal()
        last_seg = Signal()
        last_row_inner = Signal()
        last_outer = Signal()
        m.d.comb += [
            last_elem.eq(fast | (e_cnt + units == c.seg_len)),
            last_seg.eq(s_cnt + Mux(fast, units, 1) == c.segs),
            last_row_inner.eq(i_cnt == c.rows_inner - 1),
            last_outer.eq(o_cnt == c.rows_outer - 1),
            run.read.eq(inside),
            run.row.eq(row_idx),
            run.row_end.eq(last_elem & last_seg),
            run.last.eq(last_elem & last_seg & last_row_inner & last_outer),
            run.pos.eq(elem_index * eb),
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
        seg_y, seg_x, seg_a = lv["seg"]
        el_y, el_x, el_a = lv["el"]
        row_y, row_x, row_a = lv["row"]
        out_y, out_x, out_a = lv["out"]
        with m.If(emit):
            with m.If(inside):
                m.d.sync += [last_beat.eq(end_beat), have_last.eq(1)]
            # advance the loops
            # merged units step x by 1 (or 0) each and y by 0, and are run_bytes long together
            with m.If(~last_elem):
                m.d.sync += [e_cnt.eq(e_cnt + units), el_y.eq(el_y + c.elem_dy),
                             el_x.eq(el_x + Mux(merge, units, c.elem_dx)),
                             el_a.eq(el_a + Mux(merge, run_bytes, step["elem"]))]
            with m.Elif(~last_seg):
                seg_units = Mux(fast, units, 1)
                ny = seg_y + c.seg_dy
                nx = seg_x + Mux(merge & fast, Mux(c.seg_dx == 0, 0, units), c.seg_dx)
                na = seg_a + Mux(merge & fast, run_bytes, step["seg"])
                m.d.sync += [e_cnt.eq(0), s_cnt.eq(s_cnt + seg_units),
                             seg_col.eq(seg_col + seg_units * c.seg_len),
                             seg_y.eq(ny), seg_x.eq(nx), seg_a.eq(na),
                             el_y.eq(ny), el_x.eq(nx), el_a.eq(na)]
            with m.Elif(~last_row_inner):
                ny, nx, na = row_y + c.inner_dy, row_x + c.inner_dx, row_a + step["inner"]
                m.d.sync += [e_cnt.eq(0), s_cnt.eq(0), i_cnt.eq(i_cnt + 1),
                             row_idx.eq(row_idx + 1), seg_col.eq(c.dst_col),
                             row_y.eq(ny), row_x.eq(nx), row_a.eq(na),
                             seg_y.eq(ny), seg_x.eq(nx), seg_a.eq(na),
                             el_y.eq(ny), el_x.eq(nx), el_a.eq(na)]
            with m.Elif(~last_outer):
                ny, nx, na = out_y + c.outer_dy, out_x + c.outer_dx, out_a + step["outer"]
                m.d.sync += [e_cnt.eq(0), s_cnt.eq(0), i_cnt.eq(0), o_cnt.eq(o_cnt + 1),
                             row_idx.eq(row_idx + 1), seg_col.eq(c.dst_col),
                             out_y.eq(ny), out_x.eq(nx), out_a.eq(na),
                             row_y.eq(ny), row_x.eq(nx), row_a.eq(na),
                             seg_y.eq(ny), seg_x.eq(nx), seg_a.eq(na),
                             el_y.eq(ny), el_x.eq(nx), el_a.eq(na)]
            with m.Else():
                m.d.sync += active.eq(0)

        # hand over the next command once set up, in the cycle the current one emits its last run
        handover = Signal()
        m.d.comb += handover.eq(nxt_valid & (setup == 5) & (~active | (emit & run.last)))
        next_fast = Signal()
        m.d.comb += next_fast.eq((nstep["elem"] == nxt.elem_bytes) &
                                 (~nxt.bounded | ((nxt.elem_dy == 0) & (nxt.elem_dx == 0))))
        next_merge = Signal()
        m.d.comb += next_merge.eq(Mux(
            next_fast,
            # segments back to back in DRAM, sharing y and stepping x by 0 or 1
            (nstep["seg"] == nxt.seg_len * nxt.elem_bytes) &
            (~nxt.bounded | ((nxt.seg_dy == 0) & ((nxt.seg_dx == 0) | (nxt.seg_dx == 1)))),
            # elements back to back in DRAM along x (a bounded transposing walk)
            (nstep["elem"] == nxt.elem_bytes) & (nxt.elem_dy == 0) & (nxt.elem_dx == 1)))
        with m.If(handover):
            m.d.sync += [
                c.eq(nxt), nxt_valid.eq(0), active.eq(1), have_last.eq(0),
                fast.eq(next_fast), merge.eq(next_merge),
                o_cnt.eq(0), i_cnt.eq(0), s_cnt.eq(0), e_cnt.eq(0),
                row_idx.eq(nxt.dst_addr), seg_col.eq(nxt.dst_col),
            ]
            m.d.sync += [step[name].eq(nstep[name]) for name in names]
            for level in lv.values():
                m.d.sync += [level[0].eq(nxt.y0), level[1].eq(nxt.x0), level[2].eq(nstep["start"])]
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
        pops_done = Signal(run_layout.members["beats"])    # new beats taken for the current run
        pops = Signal(run_layout.members["beats"])
        m.d.comb += pops.eq(cur.beats - cur.share)
        kept = Signal(8 * BB)             # the last beat taken from the bus
        buf = Signal(data.ArrayLayout(8, RB))
        mask = Signal(RB)
        row_resp = Signal(2)              # first error response among the current row's beats
        pad32 = Signal(32)
        m.d.comb += pad32.eq(cur.pad)     # the pad element, sign-extended

        out_free_rows = Signal()
        m.d.comb += out_free_rows.eq(~self.rows.valid | self.rows.ready)
        with m.If(self.rows.valid & self.rows.ready):
            m.d.sync += self.rows.valid.eq(0)

        wrote = Signal()
        finish_run = Signal()
        resp_now = Signal(2)
        new_buf = Signal(data.ArrayLayout(8, RB))
        new_mask = Signal(RB)
        m.d.comb += [new_buf.eq(buf), new_mask.eq(mask)]
        in_run = Signal(RB)
        for q in range(RB):
            m.d.comb += in_run[q].eq((q >= cur.pos) & (q < cur.pos + cur.nbytes))

        # Row byte q of a read run comes from the run's beat floor((q - pos + offset) / BB).
        # `lo` is the row byte at the start of the beat taken now; the kept beat is the one before.
        shift = Signal(BBL)
        m.d.comb += shift.eq(cur.pos - cur.offset)
        lo = Signal(signed(len(cur.pos) + len(cur.beats) + BBL + 2))
        m.d.comb += lo.eq(cur.pos - cur.offset + (cur.share + pops_done) * BB)

        def rotate(beat):
            """The beat rotated so that its byte for row byte q sits at q mod BB."""
            rot = Signal(8 * BB)
            m.d.comb += rot.eq((Cat(beat, beat) << (shift * 8))[8 * BB:16 * BB])
            return rot

        rot_new = rotate(self.r.payload.data)
        rot_kept = rotate(kept)

        def place(from_new):
            for q in range(RB):
                with m.If(in_run[q] & (q >= lo - BB) & (q < lo)):
                    m.d.comb += [new_buf[q].eq(rot_kept.word_select(q % BB, 8)), new_mask[q].eq(1)]
                if from_new:
                    with m.If(in_run[q] & (q >= lo) & (q < lo + BB)):
                        m.d.comb += [new_buf[q].eq(rot_new.word_select(q % BB, 8)), new_mask[q].eq(1)]

        with m.If(cur_valid & out_free_rows):
            with m.If(~cur.read):
                # padding: row byte q gets byte (q mod elem_bytes) of the pad element
                for q in range(RB):
                    with m.If(in_run[q]):
                        m.d.comb += [new_buf[q].eq(pad32.word_select(Const(q % 4, 2) & cur.pad_mask, 8)),
                                     new_mask[q].eq(1)]
                m.d.comb += [wrote.eq(1), finish_run.eq(1)]
            with m.Elif(pops == 0):
                # the whole run lies in the kept beat
                place(from_new=False)
                m.d.comb += [wrote.eq(1), finish_run.eq(1)]
            with m.Else():
                m.d.comb += self.r.ready.eq(1)
                with m.If(self.r.valid):
                    place(from_new=True)
                    m.d.comb += resp_now.eq(self.r.payload.resp)
                    with m.If(self.r.payload.resp != RESP_OKAY):
                        m.d.sync += self.error.eq(self.r.payload.resp)
                    m.d.sync += [pops_done.eq(pops_done + 1), kept.eq(self.r.payload.data)]
                    m.d.comb += [wrote.eq(1), finish_run.eq(pops_done == pops - 1)]
        row_resp_next = Signal(2)
        m.d.comb += row_resp_next.eq(Mux(row_resp != RESP_OKAY, row_resp, resp_now))
        with m.If(wrote):
            with m.If(finish_run & cur.row_end):
                m.d.sync += [
                    self.rows.valid.eq(1),
                    self.rows.payload.row.eq(cur.row),
                    self.rows.payload.data.eq(new_buf),
                    self.rows.payload.mask.eq(new_mask),
                    self.rows.payload.last.eq(cur.last),
                    self.rows.payload.resp.eq(row_resp_next),
                    mask.eq(0),
                    row_resp.eq(RESP_OKAY),
                ]
            with m.Else():
                m.d.sync += [buf.eq(new_buf), mask.eq(new_mask), row_resp.eq(row_resp_next)]

        m.d.comb += runs.r_en.eq(~cur_valid | finish_run)
        with m.If(runs.r_en):
            m.d.sync += [cur.eq(runs.r_data), cur_valid.eq(runs.r_rdy), pops_done.eq(0)]

        with m.If(self.clear_error):
            m.d.sync += self.error.eq(0)
        # runs.level counts a run from the edge that writes it, so there is no gap between the
        # generator's last run and the aligner
        m.d.comb += self.busy.eq(nxt_valid | active | (runs.level != 0) | cur_valid | self.rows.valid)
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
                        fast.eq(p.pitch_c == p.elem_bytes), pix_bytes.eq(p.n * p.elem_bytes),
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
