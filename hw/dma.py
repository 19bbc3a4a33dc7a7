"""DMA read engine: executes the address pattern of a LOAD (docs/isa.md) on an AXI4 read channel.

The engine walks the four-level coordinate loop of a LOAD and turns it into *runs*: a run is either
a contiguous byte range read from DRAM or a stretch of padding. A segment is one run when its
elements are consecutive in DRAM and share one bounds test (the fast path: every im2col gather of an
NHWC tensor, every plain tile); otherwise each element is its own run (the general path).

Three blocks, decoupled by FIFOs so that several bursts are in flight:

* the *generator* walks the loops (one run per cycle) and queues runs;
* the *burst issuer* splits read runs into AXI4 INCR bursts (``dma_max_burst`` beats, never across
  a 4 KiB boundary) and keeps at most ``dma_outstanding`` bursts in flight;
* the *aligner* rotates each returned beat into place in a row buffer of bytes and hands out a
  finished destination row (row index, bytes, byte mask) per ``rows`` transfer.

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
           "StoreCommandLayout", "ScatterWriter"]

_ADDR = 32          # DRAM address bits
_WIDE = 42          # signed width of address arithmetic before bounds are known


def row_buffer_bytes(config: AcceleratorConfig) -> int:
    """Bytes of the widest destination row: scratchpad, accumulator or requantize table."""
    return max(config.spad_row_bytes, config.acc_row_bytes,
               config.cols * config.requant_entry_bytes)


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
    """One finished destination row: its index, its bytes and which bytes the LOAD wrote."""

    def __init__(self, row_bytes: int):
        super().__init__({
            "row": unsigned(16),
            "data": data.ArrayLayout(8, row_bytes),
            "mask": unsigned(row_bytes),
        })


class _RunLayout(data.StructLayout):
    def __init__(self, row_bytes: int, beat_bytes: int):
        pos_bits = (row_bytes - 1).bit_length() + 1
        super().__init__({
            "read": unsigned(1),             # 1: bytes from DRAM, 0: padding
            "row": unsigned(16),
            "row_end": unsigned(1),          # the last run of its destination row
            "pos": unsigned(pos_bits),       # first byte in the row buffer
            "nbytes": unsigned(pos_bits),
            "offset": unsigned(max(1, (beat_bytes - 1).bit_length())),  # address mod beat size
            "beats": unsigned(pos_bits + 1),
        })


class _BurstRunLayout(data.StructLayout):
    def __init__(self, row_bytes: int):
        super().__init__({"addr": unsigned(_ADDR), "beats": unsigned((row_bytes - 1).bit_length() + 2)})


class GatherReader(wiring.Component):
    """Executes LOAD address patterns over AXI4 reads.

    Ports:
      ``cmd``  — one LOAD (``LoadCommandLayout``); accepted only when the engine is idle.
      ``ar``/``r`` — the AXI4 read address and data channels.
      ``rows`` — finished destination rows (``RowWriteLayout``), in order.
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
        run_layout = _RunLayout(RB, BB)
        burst_layout = _BurstRunLayout(RB)

        m.submodules.runs = runs = fifo.SyncFIFOBuffered(width=run_layout.size, depth=16)
        m.submodules.bursts = bursts = fifo.SyncFIFOBuffered(width=burst_layout.size,
                                                             depth=max(4, cfg.dma_outstanding))

        BBL = max(1, (BB - 1).bit_length())
        cur = Signal(run_layout)          # the run the aligner works on
        cur_valid = Signal()

        # -- generator ------------------------------------------------------------------------
        c = Signal(LoadCommandLayout())
        eb = c.elem_bytes
        step = {name: Signal(signed(_WIDE), name=f"step_{name}")
                for name in ("start", "outer", "inner", "seg", "elem")}
        fast = Signal()

        o_cnt = Signal(16)
        i_cnt = Signal(16)
        s_cnt = Signal(8)
        e_cnt = Signal(8)
        # (y, x, address) at the start of the current outer row, row, segment and element
        lv = {}
        for level in ("out", "row", "seg", "el"):
            lv[level] = (Signal(signed(34), name=f"{level}_y"), Signal(signed(34), name=f"{level}_x"),
                         Signal(signed(_WIDE), name=f"{level}_addr"))

        setup = Signal(range(6))
        mul_a = Signal(signed(17))
        mul_b = Signal(signed(17))
        mul_c = Signal(signed(17))
        product = Signal(signed(_WIDE))
        m.d.comb += product.eq(mul_a * c.pitch_y + mul_b * c.pitch_x + mul_c * c.pitch_c)

        # Coordinates of what the generator emits now.
        y_now = Mux(fast, lv["seg"][0], lv["el"][0])
        x_now = Mux(fast, lv["seg"][1], lv["el"][1])
        addr_now = Mux(fast, lv["seg"][2], lv["el"][2])
        inside = Signal()
        m.d.comb += inside.eq(~c.bounded | ((y_now >= 0) & (y_now < c.height) &
                                            (x_now >= 0) & (x_now < c.width)))
        seg_bytes = Signal(range(RB + 1))
        m.d.comb += seg_bytes.eq(c.seg_len * eb)
        run_bytes = Signal(range(RB + 1))
        m.d.comb += run_bytes.eq(Mux(fast, seg_bytes, eb))
        row_idx = Signal(16)              # destination row of the current position
        seg_col = Signal(range(512))      # destination element of the current segment's start
        elem_index = Signal(range(1024))
        m.d.comb += elem_index.eq(seg_col + Mux(fast, 0, e_cnt))
        run = Signal(run_layout)
        last_elem = Signal()
        last_seg = Signal()
        last_row_inner = Signal()
        last_outer = Signal()
        m.d.comb += [
            last_elem.eq(fast | (e_cnt == c.seg_len - 1)),
            last_seg.eq(s_cnt == c.segs - 1),
            last_row_inner.eq(i_cnt == c.rows_inner - 1),
            last_outer.eq(o_cnt == c.rows_outer - 1),
            run.read.eq(inside),
            run.row.eq(row_idx),
            run.row_end.eq(last_elem & last_seg),
            run.pos.eq(elem_index * eb),
            run.nbytes.eq(run_bytes),
            run.offset.eq(addr_now[:BBL]),
            run.beats.eq((addr_now[:BBL] + run_bytes + BB - 1) >> BBL),
        ]
        burst_run = Signal(burst_layout)
        m.d.comb += [
            burst_run.addr.eq(addr_now[:_ADDR] & ~Const(BB - 1, _ADDR)),
            burst_run.beats.eq(run.beats),
        ]

        emit = Signal()
        with m.FSM(name="gen"):
            with m.State("IDLE"):
                m.d.comb += self.cmd.ready.eq(1)
                with m.If(self.cmd.valid):
                    m.d.sync += [c.eq(self.cmd.payload), setup.eq(0)]
                    m.next = "SETUP"
            with m.State("SETUP"):
                # one coordinate-step vector per cycle through one multiply-add
                vectors = [
                    (c.y0, c.x0, 0),
                    (c.outer_dy, c.outer_dx, c.outer_dc),
                    (c.inner_dy, c.inner_dx, c.inner_dc),
                    (c.seg_dy, c.seg_dx, c.seg_dc),
                    (c.elem_dy, c.elem_dx, c.elem_dc),
                ]
                with m.Switch(setup):
                    for index, (a, b, cc) in enumerate(vectors):
                        with m.Case(index):
                            m.d.comb += [mul_a.eq(a), mul_b.eq(b), mul_c.eq(cc)]
                            name = ("start", "outer", "inner", "seg", "elem")[index]
                            if name == "start":
                                m.d.sync += step[name].eq(product + c.dram_addr)
                            else:
                                m.d.sync += step[name].eq(product)
                m.d.sync += setup.eq(setup + 1)
                with m.If(setup == 5):
                    m.d.sync += [
                        fast.eq((step["elem"] == eb) &
                                (~c.bounded | ((c.elem_dy == 0) & (c.elem_dx == 0)))),
                        o_cnt.eq(0), i_cnt.eq(0), s_cnt.eq(0), e_cnt.eq(0),
                        row_idx.eq(c.dst_addr), seg_col.eq(c.dst_col),
                    ]
                    for level in lv.values():
                        m.d.sync += [level[0].eq(c.y0), level[1].eq(c.x0), level[2].eq(step["start"])]
                    m.next = "GEN"
            with m.State("GEN"):
                can = Signal()
                m.d.comb += can.eq(runs.w_rdy & (~run.read | bursts.w_rdy))
                m.d.comb += emit.eq(can)
                with m.If(can):
                    # advance the loops
                    seg_y, seg_x, seg_a = lv["seg"]
                    el_y, el_x, el_a = lv["el"]
                    row_y, row_x, row_a = lv["row"]
                    out_y, out_x, out_a = lv["out"]
                    with m.If(~last_elem):
                        m.d.sync += [e_cnt.eq(e_cnt + 1), el_y.eq(el_y + c.elem_dy),
                                     el_x.eq(el_x + c.elem_dx), el_a.eq(el_a + step["elem"])]
                    with m.Elif(~last_seg):
                        ny, nx, na = seg_y + c.seg_dy, seg_x + c.seg_dx, seg_a + step["seg"]
                        m.d.sync += [e_cnt.eq(0), s_cnt.eq(s_cnt + 1), seg_col.eq(seg_col + c.seg_len),
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
                        m.next = "DRAIN"
            with m.State("DRAIN"):
                # runs.level, not r_rdy: a run written in the last GEN cycle takes two cycles
                # to reach the FIFO's output register
                with m.If((runs.level == 0) & ~cur_valid & ~self.rows.valid):
                    m.next = "IDLE"
        m.d.comb += [
            runs.w_data.eq(run),
            runs.w_en.eq(emit),
            bursts.w_data.eq(burst_run),
            bursts.w_en.eq(emit & run.read),
        ]

        # -- burst issuer -----------------------------------------------------------------------
        head = Signal(burst_layout)
        m.d.comb += head.eq(bursts.r_data)
        issued = Signal(burst_layout.members["beats"])       # beats of the head run already requested
        addr = Signal(_ADDR)
        m.d.comb += addr.eq(head.addr + issued * BB)
        remaining = Signal(burst_layout.members["beats"])
        m.d.comb += remaining.eq(head.beats - issued)
        to_boundary = Signal(range(4096 // BB + 1))
        m.d.comb += to_boundary.eq((4096 - addr[:12]) >> (BB - 1).bit_length())
        burst_len = Signal(range(257))
        limit = Mux(to_boundary < cfg.dma_max_burst, to_boundary, cfg.dma_max_burst)
        m.d.comb += burst_len.eq(Mux(remaining < limit, remaining, limit))
        in_flight = Signal(range(cfg.dma_outstanding + 1))
        m.d.comb += [
            self.ar.valid.eq(bursts.r_rdy & (in_flight < cfg.dma_outstanding)),
            self.ar.payload.addr.eq(addr),
            self.ar.payload.len.eq(burst_len - 1),
            self.ar.payload.size.eq((BB - 1).bit_length()),
        ]
        ar_fire = self.ar.valid & self.ar.ready
        r_last_fire = self.r.valid & self.r.ready & self.r.payload.last
        with m.If(ar_fire):
            with m.If(burst_len == remaining):
                m.d.comb += bursts.r_en.eq(1)
                m.d.sync += issued.eq(0)
            with m.Else():
                m.d.sync += issued.eq(issued + burst_len)
        m.d.sync += in_flight.eq(in_flight + ar_fire - r_last_fire)

        # -- aligner ----------------------------------------------------------------------------
        beat_index = Signal(run_layout.members["beats"])
        buf = Signal(data.ArrayLayout(8, RB))
        mask = Signal(RB)
        pad32 = Signal(32)
        m.d.comb += pad32.eq(c.pad_value.as_signed())  # the pad element, sign-extended

        out_free = Signal()
        m.d.comb += out_free.eq(~self.rows.valid | self.rows.ready)
        with m.If(self.rows.valid & self.rows.ready):
            m.d.sync += self.rows.valid.eq(0)

        wrote = Signal()
        finish_run = Signal()
        new_buf = Signal(data.ArrayLayout(8, RB))
        new_mask = Signal(RB)
        m.d.comb += [new_buf.eq(buf), new_mask.eq(mask)]
        in_run = Signal(RB)
        for q in range(RB):
            m.d.comb += in_run[q].eq((q >= cur.pos) & (q < cur.pos + cur.nbytes))

        with m.If(cur_valid & out_free):
            with m.If(~cur.read):
                # padding: row byte q gets byte (q mod elem_bytes) of the pad element
                for q in range(RB):
                    with m.If(in_run[q]):
                        m.d.comb += [new_buf[q].eq(pad32.word_select((Const(q, 4) & (eb - 1))[:2], 8)),
                                     new_mask[q].eq(1)]
                m.d.comb += [wrote.eq(1), finish_run.eq(1)]
            with m.Else():
                m.d.comb += self.r.ready.eq(1)
                with m.If(self.r.valid):
                    beat = self.r.payload.data
                    # rotate the beat so that its byte for row byte q sits at q mod BB
                    shift = Signal(BBL)
                    m.d.comb += shift.eq(cur.pos - cur.offset)
                    rot = Signal(8 * BB)
                    if BB > 1:
                        m.d.comb += rot.eq((Cat(beat, beat) << (shift * 8))[8 * BB:16 * BB])
                    else:
                        m.d.comb += rot.eq(beat)
                    lo = Signal(signed(24))   # row bytes covered by this beat: [lo, lo + BB)
                    m.d.comb += lo.eq(cur.pos - cur.offset + beat_index * BB)
                    for q in range(RB):
                        with m.If(in_run[q] & (q >= lo) & (q < lo + BB)):
                            m.d.comb += [new_buf[q].eq(rot.word_select(q % BB, 8)), new_mask[q].eq(1)]
                    with m.If(self.r.payload.resp != RESP_OKAY):
                        m.d.sync += self.error.eq(self.r.payload.resp)
                    m.d.sync += beat_index.eq(beat_index + 1)
                    m.d.comb += [wrote.eq(1), finish_run.eq(beat_index == cur.beats - 1)]
        with m.If(wrote):
            with m.If(finish_run & cur.row_end):
                m.d.sync += [
                    self.rows.valid.eq(1),
                    self.rows.payload.row.eq(cur.row),
                    self.rows.payload.data.eq(new_buf),
                    self.rows.payload.mask.eq(new_mask),
                    mask.eq(0),
                ]
            with m.Else():
                m.d.sync += [buf.eq(new_buf), mask.eq(new_mask)]

        m.d.comb += runs.r_en.eq(~cur_valid | finish_run)
        with m.If(runs.r_en):
            m.d.sync += [cur.eq(runs.r_data), cur_valid.eq(runs.r_rdy), beat_index.eq(0)]

        with m.If(self.clear_error):
            m.d.sync += self.error.eq(0)
        m.d.comb += self.busy.eq(~self.cmd.ready)
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
    bursts; otherwise each element is written by its own single-beat burst with byte strobes.
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
        RB, BB = self.row_bytes, self.config.dma_bytes
        BBL = max(1, (BB - 1).bit_length())

        c = Signal(StoreCommandLayout())
        eb = c.elem_bytes
        fast = Signal()
        oy = Signal(16)
        ox = Signal(16)
        el = Signal(8)
        row_addr = Signal(_ADDR)      # address of (oy, 0, 0)
        pix_addr = Signal(_ADDR)      # address of (oy, ox, 0)
        pix = Signal(data.ArrayLayout(8, RB))

        # the current run: bytes [pos, pos + nbytes) of the pixel go to address run_addr
        run_addr = Signal(_ADDR)
        pos = Signal(range(RB + 1))
        nbytes = Signal(range(RB + 1))
        beats_left = Signal(range(RB // BB + 3))     # beats of the run not yet sent
        burst_left = Signal(range(257))              # beats of the current burst not yet sent
        beat_addr = Signal(_ADDR)                    # address of the next beat (bus aligned)
        outstanding = Signal(16)                     # bursts without a write response

        b_fire = self.b.valid & self.b.ready
        m.d.comb += self.b.ready.eq(1)
        with m.If(b_fire & (self.b.payload.resp != RESP_OKAY)):
            m.d.sync += self.error.eq(self.b.payload.resp)
        with m.If(self.clear_error):
            m.d.sync += self.error.eq(0)

        aw_fire = self.aw.valid & self.aw.ready
        m.d.sync += outstanding.eq(outstanding + aw_fire - b_fire)

        # burst length for the beat at beat_addr
        to_boundary = Signal(range(4096 // BB + 1))
        m.d.comb += to_boundary.eq((4096 - beat_addr[:12]) >> BBL)
        limit = Mux(to_boundary < cfg.dma_max_burst, to_boundary, cfg.dma_max_burst)
        burst_len = Signal(range(257))
        m.d.comb += burst_len.eq(Mux(beats_left < limit, beats_left, limit))

        # data of the beat at beat_addr: beat byte b is pixel byte pos + (beat_addr + b - run_addr)
        beat_data = Signal(8 * BB)
        strobe = Signal(BB)
        for b in range(BB):
            rel = Signal(signed(_ADDR + 2), name=f"rel_{b}")
            m.d.comb += rel.eq(beat_addr + b - run_addr)
            src = Signal(range(RB + BB + 1), name=f"src_{b}")
            m.d.comb += src.eq(pos + rel)
            with m.If((rel >= 0) & (rel < nbytes)):
                m.d.comb += [strobe[b].eq(1), beat_data.word_select(b, 8).eq(pix[src])]

        def start_run(m, addr, first_pos, count):
            m.d.sync += [
                run_addr.eq(addr), pos.eq(first_pos), nbytes.eq(count),
                beat_addr.eq(addr & ~Const(BB - 1, _ADDR)),
                beats_left.eq((addr[:BBL] + count + BB - 1) >> BBL),
            ]

        with m.FSM(name="store"):
            with m.State("IDLE"):
                m.d.comb += self.cmd.ready.eq(1)
                with m.If(self.cmd.valid):
                    p = self.cmd.payload
                    m.d.sync += [
                        c.eq(p), oy.eq(0), ox.eq(0), el.eq(0),
                        row_addr.eq(p.dram_addr), pix_addr.eq(p.dram_addr),
                        fast.eq(p.pitch_c == p.elem_bytes),
                    ]
                    m.next = "PIXEL"
            with m.State("PIXEL"):
                m.d.comb += self.pixels.ready.eq(1)
                with m.If(self.pixels.valid):
                    m.d.sync += [pix.eq(self.pixels.payload), el.eq(0)]
                    with m.If(fast):
                        start_run(m, pix_addr, 0, c.n * eb)
                    with m.Else():
                        start_run(m, pix_addr, 0, eb)
                    m.next = "AW"
            with m.State("AW"):
                m.d.comb += [
                    self.aw.valid.eq(1),
                    self.aw.payload.addr.eq(beat_addr),
                    self.aw.payload.len.eq(burst_len - 1),
                    self.aw.payload.size.eq(BBL if BB > 1 else 0),
                ]
                with m.If(self.aw.ready):
                    m.d.sync += burst_left.eq(burst_len)
                    m.next = "W"
            with m.State("W"):
                m.d.comb += [
                    self.w.valid.eq(1),
                    self.w.payload.data.eq(beat_data),
                    self.w.payload.strb.eq(strobe),
                    self.w.payload.last.eq(burst_left == 1),
                ]
                with m.If(self.w.ready):
                    m.d.sync += [beat_addr.eq(beat_addr + BB), beats_left.eq(beats_left - 1),
                                 burst_left.eq(burst_left - 1)]
                    with m.If(burst_left == 1):
                        with m.If(beats_left != 1):
                            m.next = "AW"
                        with m.Elif(~fast & (el != c.n - 1)):
                            # next element of the same pixel
                            m.d.sync += el.eq(el + 1)
                            start_run(m, run_addr + c.pitch_c, pos + eb, eb)
                            m.next = "AW"
                        with m.Elif(ox != c.out_w - 1):
                            m.d.sync += [ox.eq(ox + 1), pix_addr.eq(pix_addr + c.pitch_x)]
                            m.next = "PIXEL"
                        with m.Elif(oy != c.out_h - 1):
                            m.d.sync += [oy.eq(oy + 1), ox.eq(0), row_addr.eq(row_addr + c.pitch_y),
                                         pix_addr.eq(row_addr + c.pitch_y)]
                            m.next = "PIXEL"
                        with m.Else():
                            m.next = "RESP"
            with m.State("RESP"):
                with m.If(outstanding == 0):
                    m.next = "IDLE"
        m.d.comb += self.busy.eq(~self.cmd.ready)
        return m
