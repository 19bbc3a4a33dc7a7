"""The serial DMA engines, the small alternatives to :mod:`systolic.hw.dma`'s for FPGAs where
logic, not speed, is scarce: :class:`SerialGatherReader` for LOADs (``gather_engine = "serial"``)
and :class:`SerialScatterWriter` for STOREs (``scatter_engine = "serial"``, see its docstring).

It has the same ports and produces the same rows (``RowWriteLayout``) and the same bus beats as
the pipelined reader, so the LoadUnit, the golden model's DRAM byte counts and every test of the
rows apply unchanged; it is only slower. It works in three phases per LOAD:

* **setup**, while the command is offered and before it is taken (a stream's payload stays
  unchanged until it is taken, so nothing of the command but what the walk needs is copied):
  one shift-and-add multiplier, a 32-bit adder, forms the byte step of each loop level
  (``d_y * pitch_y + d_x * pitch_x + d_c * pitch_c`` for the element, segment, inner and outer
  steps), the start address ``dram_addr + y0 * pitch_y + x0 * pitch_x`` and the first row byte
  ``dst_col * elem_bytes``: 15 products, each taking one cycle per bit of its multiplier's
  magnitude (at least one), so ``setup_cycles`` = sum of ``max(1, bit_length(|m|))``;
* **walk**, one row byte per cycle: the current element's coordinates (y, x and the byte
  address) step through the four loops with one adder per coordinate, restarting a loop from the
  saved start of the level above (three saved coordinate vectors). An element outside a
  ``bounded`` image writes the pad value's bytes; an element inside reads its bytes from the
  last bus beat fetched, and a byte in another beat first fetches that beat with a single-beat
  read (address registered, then the data). So a beat that consecutive elements share is read
  once, exactly as docs/isa.md counts bus bytes; the kept beat is forgotten between commands;
* **emit**: a finished row (index, bytes, byte mask, last, the first error response of the
  beats read for it) is offered from registers; the walk resumes once it is taken.

Cycles of a LOAD, with a memory that offers a read's data ``L`` cycles after the cycle it takes
its address and a row consumer that is always ready: ``setup_cycles + bytes + rows +
beats * (L + 3)`` (a beat costs the walk cycle that finds it missing, the address cycle, ``L``
and the data cycle), where
``bytes`` are the destination bytes written (padding included) and ``beats`` the beats read
(:func:`serial_load_cycles` computes it for the golden model's estimate, with ``L`` =
``dram_latency``).
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, signed, unsigned

from .dma import _ADDR, _COORD, GatherPorts, ScatterPorts, _row_bits

__all__ = ["SerialGatherReader", "SerialScatterWriter", "serial_setup_cycles", "serial_load_cycles",
           "serial_store_write_cycles"]

#: Loop levels, innermost first: the step each one adds to the coordinates.
_LEVELS = ("elem", "seg", "inner", "outer")


def _terms() -> list[tuple[str, str, str]]:
    """The setup's products in order: (target, multiplier field, multiplicand field). The terms
    of one target follow each other; ``start`` begins from ``dram_addr``, every other from 0."""
    terms = [("pos", "elem_bytes", "dst_col")]
    for level in _LEVELS:
        terms += [(level, f"{level}_d{axis}", f"pitch_{axis}") for axis in "yxc"]
    terms += [("start", "y0", "pitch_y"), ("start", "x0", "pitch_x")]
    return terms


TERMS = _terms()


def serial_setup_cycles(fields: dict[str, int], elem_bytes: int) -> int:
    """Cycles the serial reader's setup takes for LOAD ``fields`` (missing fields are 0)."""
    values = dict(fields, elem_bytes=elem_bytes)
    return sum(max(1, abs(int(values.get(mul, 0))).bit_length()) for _, mul, _ in TERMS)


def serial_load_cycles(fields: dict[str, int], elem_bytes: int, beats: int, latency: int) -> int:
    """Cycles of one LOAD on the serial reader (module docstring): setup, a cycle per destination
    byte and per row, ``latency + 3`` per bus beat read."""
    rows = fields["rows_outer"] * fields["rows_inner"]
    nbytes = rows * fields["segs"] * fields["seg_len"] * elem_bytes
    return serial_setup_cycles(fields, elem_bytes) + nbytes + rows + beats * (latency + 3)


class SerialGatherReader(GatherPorts):
    """Executes LOAD address patterns over AXI4 single-beat reads, one row byte per cycle.

    Ports (as :class:`~systolic.hw.dma.GatherReader`'s):
      ``cmd``  — one LOAD (``LoadCommandLayout``). It must stay offered, unchanged, until it is
                 taken (the stream rule): the reader sets it up first and takes it when it starts
                 walking, only while idle.
      ``ar``/``r`` — the AXI4 read address and data channels; one single-beat burst at a time.
      ``rows`` — finished destination rows (``RowWriteLayout``), in command order; ``last`` marks
                 the last row of each command.
      ``busy`` — a taken command's rows are not all handed out yet.
      ``error`` — sticky AXI error response (SLVERR 2 / DECERR 3) seen since ``clear_error``.
    """

    def elaborate(self, platform):
        m = Module()
        RB, BB = self.row_bytes, self.beat_bytes
        BBL = (BB - 1).bit_length()           # BB >= 4
        pos_shape = unsigned((RB - 1).bit_length() + 1)
        c = self.cmd.payload

        # -- setup: one shift-and-add multiplier ------------------------------------------------
        term = Signal(range(len(TERMS)))
        first = Signal(init=1)                # the term's first cycle: its operands from c
        mag = Signal(16)                      # the multiplier's magnitude, bits not yet used
        neg = Signal()
        shifted = Signal(_ADDR)               # the multiplicand, shifted by the bits used
        acc = Signal(_ADDR)
        step_addr = {level: Signal(_ADDR, name=f"step_addr_{level}") for level in _LEVELS}
        first_pos = Signal(pos_shape)

        multiplier = Signal(signed(17))
        multiplicand = Signal(24)
        with m.Switch(term):
            for k, (_, mul, cand) in enumerate(TERMS):
                with m.Case(k):
                    m.d.comb += [multiplier.eq(getattr(c, mul)), multiplicand.eq(getattr(c, cand))]
        m_now = Signal(16)
        p_now = Signal(_ADDR)
        neg_now = Signal()
        m_abs = Signal(16)
        m.d.comb += m_abs.eq(Mux(multiplier < 0, -multiplier, multiplier))
        m.d.comb += [m_now.eq(Mux(first, m_abs, mag)), p_now.eq(Mux(first, multiplicand, shifted)),
                     neg_now.eq(Mux(first, multiplier < 0, neg))]
        starts = [k for k, t in enumerate(TERMS) if k == 0 or TERMS[k - 1][0] != t[0]]
        ends = [k for k, t in enumerate(TERMS) if k == len(TERMS) - 1 or TERMS[k + 1][0] != t[0]]
        job_start = Signal()
        job_end = Signal()
        m.d.comb += [job_start.eq(Cat(*(term == k for k in starts)).any()),
                     job_end.eq(Cat(*(term == k for k in ends)).any())]
        base = Signal(_ADDR)
        start_term = next(k for k, (target, _, _) in enumerate(TERMS) if target == "start")
        m.d.comb += base.eq(Mux(first & job_start, Mux(term == start_term, c.dram_addr, 0), acc))
        addend = Signal(_ADDR)
        m.d.comb += addend.eq(Mux(m_now[0], Mux(neg_now, ~p_now, p_now), 0))
        acc_next = Signal(_ADDR)
        m.d.comb += acc_next.eq(base + addend + (m_now[0] & neg_now))
        term_done = Signal()
        m.d.comb += term_done.eq((m_now >> 1) == 0)
        setup_done = Signal()
        m.d.comb += setup_done.eq(term_done & (term == len(TERMS) - 1))

        # -- walk state -------------------------------------------------------------------------
        cur = {a: Signal(signed(_COORD), name=f"cur_{a}") for a in "yx"}
        cur_addr = Signal(_ADDR)
        saved = {level: (Signal(signed(_COORD), name=f"{level}_y"),
                         Signal(signed(_COORD), name=f"{level}_x"),
                         Signal(_ADDR, name=f"{level}_addr")) for level in _LEVELS[1:]}
        step_yx = {level: (Signal(signed(8), name=f"step_{level}_y"),
                           Signal(signed(8), name=f"step_{level}_x")) for level in _LEVELS}
        count = {"elem": Signal(8), "seg": Signal(8), "inner": Signal(16), "outer": Signal(16)}
        reload = {"elem": Signal(8), "seg": Signal(8), "inner": Signal(16)}    # count - 1
        elem_bytes = Signal(4)
        byte = Signal(4)                      # byte of the current element
        bounded = Signal()
        height, width = Signal(16), Signal(16)
        pad = Signal(signed(16))
        pos = Signal(pos_shape)               # row byte written next
        row = Signal(_row_bits(self.config))
        row_data = [Signal(8, name=f"row_byte_{k}") for k in range(RB)]
        row_mask = Signal(RB)
        row_resp = Signal(2)
        last_row = Signal()

        kept_valid = Signal()                 # the last beat read, its index and response
        kept_beat = Signal(_ADDR - BBL)
        kept_data = Signal(self.config.dma_data_bits)
        kept_resp = Signal(2)
        ar_beat = Signal(_ADDR - BBL)

        byte_addr = Signal(_ADDR)
        m.d.comb += byte_addr.eq(cur_addr + byte)
        inside = Signal()
        y, x = cur["y"], cur["x"]
        m.d.comb += inside.eq(~bounded | ((y >= 0) & (y < height) & (x >= 0) & (x < width)))
        hit = Signal()
        m.d.comb += hit.eq(kept_valid & (kept_beat == byte_addr[BBL:]))
        pad32 = Signal(32)
        m.d.comb += pad32.eq(pad)
        value = Signal(8)
        m.d.comb += value.eq(Mux(inside, kept_data.word_select(byte_addr[:BBL], 8),
                                 pad32.word_select(byte[:2], 8)))

        last = {level: Signal(name=f"{level}_last") for level in count}
        for level, sig in last.items():
            m.d.comb += sig.eq(count[level] == 0)
        elem_end = Signal()
        m.d.comb += elem_end.eq(byte == elem_bytes - 1)

        # the coordinate adders: the level that steps, from its saved start (element: current).
        # When a command starts, the same adders load every coordinate register with 0 + the
        # start (y0, x0, the start address): the registers have one source, the adders
        starting = Signal()
        level_now = Signal(range(len(_LEVELS)))
        with m.If(~last["elem"] & ~starting):
            m.d.comb += level_now.eq(0)
        with m.Elif(~last["seg"] & ~starting):
            m.d.comb += level_now.eq(1)
        with m.Elif(~last["inner"] & ~starting):
            m.d.comb += level_now.eq(2)
        with m.Else():
            m.d.comb += level_now.eq(3)
        src_y, src_x, src_addr = Signal(signed(_COORD)), Signal(signed(_COORD)), Signal(_ADDR)
        step_y, step_x, d_addr = Signal(signed(8)), Signal(signed(8)), Signal(_ADDR)
        with m.Switch(level_now):
            for k, level in enumerate(_LEVELS):
                with m.Case(k):
                    src = (cur["y"], cur["x"], cur_addr) if level == "elem" else saved[level]
                    m.d.comb += [src_y.eq(src[0]), src_x.eq(src[1]), src_addr.eq(src[2]),
                                 step_y.eq(step_yx[level][0]), step_x.eq(step_yx[level][1]),
                                 d_addr.eq(Mux(starting, acc_next, step_addr[level]) if level == "outer"
                                           else step_addr[level])]
        d_y, d_x = Signal(signed(16)), Signal(signed(16))
        m.d.comb += [d_y.eq(Mux(starting, c.y0, step_y)), d_x.eq(Mux(starting, c.x0, step_x))]
        new_y, new_x, new_addr = Signal(signed(_COORD)), Signal(signed(_COORD)), Signal(_ADDR)
        m.d.comb += [new_y.eq(Mux(starting, 0, src_y) + d_y), new_x.eq(Mux(starting, 0, src_x) + d_x),
                     new_addr.eq(Mux(starting, 0, src_addr) + d_addr)]
        advance = Signal()                    # the walk steps to the next element

        m.d.comb += [
            self.ar.payload.addr.eq(Cat(Const(0, BBL), ar_beat)),
            self.ar.payload.len.eq(0),
            self.ar.payload.size.eq(BBL),
            self.rows.payload.row.eq(row),
            self.rows.payload.data.eq(Cat(*row_data)),
            self.rows.payload.mask.eq(row_mask),
            self.rows.payload.last.eq(last_row),
            self.rows.payload.resp.eq(row_resp),
        ]

        with m.FSM() as fsm:
            with m.State("IDLE"):
                # set the offered command up; take it with the last product
                with m.If(self.cmd.valid):
                    m.d.sync += [acc.eq(acc_next), mag.eq(m_now >> 1), shifted.eq(p_now << 1),
                                 neg.eq(neg_now), first.eq(term_done)]
                    with m.If(term_done):
                        m.d.sync += term.eq(Mux(setup_done, 0, term + 1))
                        with m.If(job_end):
                            with m.Switch(term):
                                for k, (target, _, _) in enumerate(TERMS):
                                    if k in ends and target in step_addr:
                                        with m.Case(k):
                                            m.d.sync += step_addr[target].eq(acc_next)
                                    elif k in ends and target == "pos":
                                        with m.Case(k):
                                            m.d.sync += [first_pos.eq(acc_next), pos.eq(acc_next)]
                    with m.If(setup_done):
                        m.d.comb += [self.cmd.ready.eq(1), starting.eq(1)]
                        m.d.sync += [
                            *(step_yx[level][0].eq(getattr(c, f"{level}_dy")) for level in _LEVELS),
                            *(step_yx[level][1].eq(getattr(c, f"{level}_dx")) for level in _LEVELS),
                            count["elem"].eq(c.seg_len - 1), reload["elem"].eq(c.seg_len - 1),
                            count["seg"].eq(c.segs - 1), reload["seg"].eq(c.segs - 1),
                            count["inner"].eq(c.rows_inner - 1), reload["inner"].eq(c.rows_inner - 1),
                            count["outer"].eq(c.rows_outer - 1),
                            elem_bytes.eq(c.elem_bytes), byte.eq(0),
                            bounded.eq(c.bounded), height.eq(c.height), width.eq(c.width),
                            pad.eq(c.pad_value), row.eq(c.dst_addr),
                            row_mask.eq(0), row_resp.eq(0), kept_valid.eq(0),
                        ]
                        m.next = "WALK"

            with m.State("WALK"):
                with m.If(inside & ~hit):
                    m.d.sync += ar_beat.eq(byte_addr[BBL:])
                    m.next = "ADDRESS"
                with m.Else():
                    with m.Switch(pos):
                        for k in range(RB):
                            with m.Case(k):
                                m.d.sync += [row_data[k].eq(value), row_mask[k].eq(1)]
                    with m.If(inside & (row_resp == 0)):
                        m.d.sync += row_resp.eq(kept_resp)
                    m.d.sync += [pos.eq(pos + 1), byte.eq(byte + 1)]
                    with m.If(elem_end):
                        m.d.sync += byte.eq(0)
                        # the next element: step the innermost level that is not at its end
                        # and restart the levels inside it
                        m.d.comb += advance.eq(~(last["elem"] & last["seg"] & last["inner"] & last["outer"]))
                        for k, level in enumerate(_LEVELS):
                            with m.If(level_now == k):
                                m.d.sync += count[level].eq(count[level] - 1)
                            if level in reload:
                                with m.If(level_now > k):
                                    m.d.sync += count[level].eq(reload[level])
                        with m.If(last["elem"] & last["seg"]):
                            m.d.sync += [last_row.eq(last["inner"] & last["outer"]), pos.eq(first_pos)]
                            m.next = "EMIT"

            with m.State("ADDRESS"):
                m.d.comb += self.ar.valid.eq(1)
                with m.If(self.ar.ready):
                    m.next = "DATA"

            with m.State("DATA"):
                m.d.comb += self.r.ready.eq(1)
                with m.If(self.r.valid):
                    m.d.sync += [kept_valid.eq(1), kept_beat.eq(ar_beat), kept_data.eq(self.r.payload.data),
                                 kept_resp.eq(self.r.payload.resp)]
                    with m.If(self.r.payload.resp != 0):
                        m.d.sync += self.error.eq(self.r.payload.resp)
                    m.next = "WALK"

            with m.State("EMIT"):
                m.d.comb += self.rows.valid.eq(1)
                with m.If(self.rows.ready):
                    m.d.sync += [row.eq(row + 1), row_mask.eq(0), row_resp.eq(0)]
                    m.next = "WALK"
                    with m.If(last_row):
                        m.next = "IDLE"
        # the coordinate registers, loaded from the adders only
        with m.If(advance | starting):
            m.d.sync += [cur["y"].eq(new_y), cur["x"].eq(new_x), cur_addr.eq(new_addr)]
            for k, level in enumerate(_LEVELS[1:], start=1):
                with m.If(level_now >= k):
                    m.d.sync += [s.eq(v) for s, v in
                                 zip(saved[level], (new_y, new_x, new_addr), strict=True)]
        m.d.comb += self.busy.eq(~fsm.ongoing("IDLE"))
        with m.If(self.clear_error):         # after the FSM: a clear wins over an error
            m.d.sync += self.error.eq(0)
        return m


def serial_store_write_cycles(nbytes: int, beats: int) -> int:
    """Cycles the serial writer takes for a STORE's ``nbytes`` output bytes in ``beats`` bus beats,
    from taking the command to its last write response, when its pixels are always there and the
    memory never stalls (it takes a beat's data the cycle after its address and answers the cycle
    after that, as the SoC memory does): one cycle for the command, one per byte, and three per
    beat (the walk cycle that finds the byte in another beat, the address, the data; the last
    beat's response instead of a walk cycle)."""
    return 1 + nbytes + 3 * beats


class SerialScatterWriter(ScatterPorts):
    """Writes the output pixels of a STORE one byte per cycle, with single-beat AXI4 writes
    (``scatter_engine = "serial"``); the small alternative to :class:`~systolic.hw.dma.ScatterWriter`,
    with the same ports and the same bus beats (so the same DRAM counts).

    The output element (oy, ox, c) is at ``dram_addr + oy * pitch_y + ox * pitch_x + c * pitch_c``:
    three address registers (the row's, the pixel's and the element's) step with one adder. The
    bytes of the elements, in order, go into one open beat (data and strobes); a byte in another
    beat first sends the open one (address and data in the same cycle when the bus is ready), so
    elements that meet in a beat share it, as docs/isa.md counts. Write responses are counted, not
    waited for (at most 15 beats unanswered); ``busy`` falls with the last one. A STORE takes
    :func:`serial_store_write_cycles` when nothing stalls.
    """

    def elaborate(self, platform):
        m = Module()
        RB, BB = self.row_bytes, self.config.dma_bytes
        BBL = (BB - 1).bit_length()           # BB >= 4
        c = self.cmd.payload

        elem_bytes = Signal(3)
        n_last = Signal(8)                    # n - 1
        w_last = Signal(16)                   # out_w - 1
        pitch = {a: Signal(24, name=f"pitch_{a}") for a in "yxc"}
        row_addr, pix_addr, el_addr = Signal(_ADDR), Signal(_ADDR), Signal(_ADDR)
        oy_left, ox_left, c_left = Signal(16), Signal(16), Signal(8)
        byte = Signal(2)                      # byte of the current element
        k = Signal(range(RB))                 # byte of the current pixel
        open_valid = Signal()
        open_beat = Signal(_ADDR - BBL)
        open_data = Signal(8 * BB)
        open_strb = Signal(BB)
        final = Signal()                      # the open beat is the STORE's last
        aw_done, w_done = Signal(), Signal()
        unanswered = Signal(4)

        addr = Signal(_ADDR)
        m.d.comb += addr.eq(el_addr + byte)
        # The byte to write: byte 0 of a pixel straight from the stream, the others from `held`,
        # a shift register that takes the pixel's later bytes with byte 0 and moves down a byte
        # with each byte written, so that the byte is always its lowest: no RB:1 byte select
        # (its 6 levels of logic from `k` missed the lean 16x16 ULX3S SoC's control clock at
        # bd14ae3, and before that, when it read the stream's source, the SFU's output FIFO, a
        # block RAM with most of a cycle of clock-to-output, docs/boards.md). The pixel is the
        # same one until its last byte is taken; bytes are taken in order (k counts them).
        held = Signal(8 * (RB - 1), reset_less=True)
        value = Signal(8)
        m.d.comb += value.eq(Mux(k == 0, self.pixels.payload[0], held[:8]))

        # the one address adder: the next element, pixel or row from the current one
        level = Signal(2)                     # 0 element, 1 pixel, 2 row
        with m.If(c_left != 0):
            m.d.comb += level.eq(0)
        with m.Elif(ox_left != 0):
            m.d.comb += level.eq(1)
        with m.Else():
            m.d.comb += level.eq(2)
        stepped = Signal(_ADDR)
        m.d.comb += stepped.eq(Mux(level == 0, el_addr, Mux(level == 1, pix_addr, row_addr))
                               + Mux(level == 0, pitch["c"], Mux(level == 1, pitch["x"], pitch["y"])))

        aw_fire = self.aw.valid & self.aw.ready
        w_fire = self.w.valid & self.w.ready
        b_fire = self.b.valid & self.b.ready
        m.d.comb += [
            self.aw.payload.addr.eq(Cat(Const(0, BBL), open_beat)),
            self.aw.payload.len.eq(0),
            self.aw.payload.size.eq(BBL),
            self.w.payload.data.eq(open_data),
            self.w.payload.strb.eq(open_strb),
            self.w.payload.last.eq(1),
            self.b.ready.eq(1),
        ]
        m.d.sync += unanswered.eq(unanswered + aw_fire - b_fire)
        with m.If(b_fire & (self.b.payload.resp != 0)):
            m.d.sync += self.error.eq(self.b.payload.resp)

        with m.FSM() as fsm:
            with m.State("IDLE"):
                m.d.comb += self.cmd.ready.eq(1)
                with m.If(self.cmd.valid):
                    m.d.sync += [
                        elem_bytes.eq(c.elem_bytes), n_last.eq(c.n - 1), w_last.eq(c.out_w - 1),
                        *(pitch[a].eq(getattr(c, f"pitch_{a}")) for a in "yxc"),
                        row_addr.eq(c.dram_addr), pix_addr.eq(c.dram_addr), el_addr.eq(c.dram_addr),
                        oy_left.eq(c.out_h - 1), ox_left.eq(c.out_w - 1), c_left.eq(c.n - 1),
                        byte.eq(0), k.eq(0), open_valid.eq(0), open_strb.eq(0), final.eq(0),
                    ]
                    m.next = "WALK"

            with m.State("WALK"):
                with m.If(self.pixels.valid):
                    with m.If(open_valid & (open_beat != addr[BBL:])):
                        m.next = "SEND"
                    with m.Else():
                        with m.Switch(addr[:BBL]):
                            for lane in range(BB):
                                with m.Case(lane):
                                    m.d.sync += [open_data.word_select(lane, 8).eq(value),
                                                 open_strb[lane].eq(1)]
                        m.d.sync += [open_valid.eq(1), open_beat.eq(addr[BBL:]),
                                     byte.eq(byte + 1), k.eq(k + 1)]
                        with m.If(k == 0):
                            m.d.sync += held.eq(self.pixels.payload.as_value()[8:])
                        with m.Else():
                            m.d.sync += held.eq(held[8:])
                        with m.If(byte == elem_bytes - 1):
                            m.d.sync += byte.eq(0)
                            with m.If(level == 0):
                                m.d.sync += [c_left.eq(c_left - 1), el_addr.eq(stepped)]
                            with m.Else():
                                m.d.comb += self.pixels.ready.eq(1)
                                m.d.sync += [k.eq(0), c_left.eq(n_last)]
                                with m.If(level == 1):
                                    m.d.sync += [ox_left.eq(ox_left - 1), pix_addr.eq(stepped),
                                                 el_addr.eq(stepped)]
                                with m.Elif(oy_left != 0):
                                    m.d.sync += [oy_left.eq(oy_left - 1), ox_left.eq(w_last),
                                                 row_addr.eq(stepped), pix_addr.eq(stepped),
                                                 el_addr.eq(stepped)]
                                with m.Else():
                                    m.d.sync += final.eq(1)
                                    m.next = "SEND"

            with m.State("SEND"):
                # the open beat: address and data, each until taken (at most 15 unanswered)
                room = unanswered != 15
                m.d.comb += [self.aw.valid.eq(~aw_done & room), self.w.valid.eq(~w_done & room)]
                sent_aw = aw_done | aw_fire
                sent_w = w_done | w_fire
                m.d.sync += [aw_done.eq(sent_aw), w_done.eq(sent_w)]
                with m.If(sent_aw & sent_w):
                    m.d.sync += [aw_done.eq(0), w_done.eq(0), open_valid.eq(0), open_strb.eq(0)]
                    m.next = "WALK"
                    with m.If(final):
                        m.next = "DRAIN"

            with m.State("DRAIN"):
                with m.If((unanswered == 0) | ((unanswered == 1) & b_fire)):
                    m.next = "IDLE"
        m.d.comb += self.busy.eq(~fsm.ongoing("IDLE"))
        with m.If(self.clear_error):         # after the response: a clear wins over an error
            m.d.sync += self.error.eq(0)
        return m
