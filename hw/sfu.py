"""Special-function unit: the store path's requantize / activation / pooling pipeline.

Bit-exact with ``systolic.sim.arith`` (docs/isa.md, STORE): every input beat is one pixel, a
vector of C accumulator values (plus C residual elements), and goes through
:func:`~systolic.sim.arith.sfu_pointwise`; with pooling, the pointwise values of a window are
combined (max over non-pad pixels, or sum with pad pixels counting as ``zp_out``) and an average
window ends with :func:`~systolic.sim.arith.avg_pool_finish`. The pipeline accepts one beat per
cycle and emits one vector per output pixel. Its stages run freely (no enable, for clock speed);
outputs queue in a FIFO and ``i.ready`` (a register) drops once every FIFO entry is promised.

Ports (see docs/arch-memory-sfu.md for the stage diagram):

* ``i`` — input stream of :func:`sfu_input_layout`: ``acc`` (C accumulator elements),
  ``residual`` (C output-type elements, only with ``config.sfu_residual``), and the pooling
  flags ``first``/``last`` (first and last beat of a window) and ``pad`` (a window pixel outside
  the image). Without pooling the flags are ignored.
* ``o`` — output stream of :func:`sfu_output_layout`: C elements of the accumulator element shape.
  ``out_type=int``: requantized values inside ``config.output_range`` (the store unit writes their
  low ``output_bits`` bits); ``out_type=raw``: the accumulator elements unchanged.
* ``params`` — the requantize table row (C x (bias, mult, shift)), e.g. the table's pending read
  response. ``regs`` — the CONFIG registers (:data:`SFU_REGS`, the CONFIG fields of the ISA).
  ``settings`` — the STORE's ``out_type``, ``act``, ``pool``, ``residual`` and ``pool_count``
  (= pool_h * pool_w, window pixels including pad, for the average).
  These three are sampled one cycle before use: they must be stable from the cycle before the
  first beat of a STORE is offered until ``idle`` is high again after its last beat.
* ``idle`` — no beat in the pipeline stages (outputs may still wait in the output FIFO).

Modes the config leaves out cost no logic: an ``act`` or ``pool`` code missing from
``config.sfu_activations`` / ``config.sfu_pooling`` behaves as ``none``, and without
``config.sfu_residual`` there is no residual input or datapath. ``out_type=raw`` ignores ``act``,
``pool`` and ``residual`` (the ISA forbids combining them).

Every 32x32 multiply is split into 18x18 signed partial products (one DSP each on ECP5) with
registers before and after, then summed over the next two stages; all 64-bit arithmetic wraps
modulo 2**64 exactly like the numpy int64 reference.

Rounding is half to even (:func:`~systolic.sim.arith.rounding_shift_even`): the shifter rounds
half up, a tie is recognized from the bits it shifts out (the low ``shift`` bits of ``x + half``
are all zero), and bit 0 of the result is cleared on a tie -- before the zero point is added
(``tie_out`` = 0) or after it (``tie_out`` = 1). The residual term joins the product before the
rounding, so that an Add is rounded once.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.hdl import Shape, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from .accumulator import acc_elem_shape
from .config import AcceleratorConfig
from .isa import HEADER_LAYOUT, LAYOUTS, Activation, Opcode, OutType, PoolMode
from .requant_table import REQUANT_ENTRY

__all__ = [
    "SFU_REGS", "SFU_SETTINGS", "SpecialFunctionUnit", "sfu_latency", "sfu_input_layout", "sfu_output_layout",
    "output_elem_shape",
]

#: The SFU registers, exactly the CONFIG instruction's fields (zp_out, act_lo, act_hi, avg_mult,
#: avg_shift, res_zp, res_mult, tie_out, avg_tie_out).
SFU_REGS = data.StructLayout({
    name: f.shape for name, f in LAYOUTS[Opcode.CONFIG]
    if name != "_reserved" and name not in dict(iter(HEADER_LAYOUT))
})

#: Per-STORE settings, from the STORE instruction.
SFU_SETTINGS = data.StructLayout({
    "out_type": OutType,
    "act": Activation,
    "pool": PoolMode,
    "residual": unsigned(1),
    "pool_count": unsigned(16),   # pool_h * pool_w, window pixels including pad ones
})

_WORD = 64          # width of the reference's int64 arithmetic
_CHUNK = 17         # low chunk of a split operand: 17 bits unsigned fit an 18-bit signed DSP input
_DSP_WIDTH = 18     # operands up to this many bits (signed) are not split
_NARROW = 19        # requantized values are clamped to 19 bits signed before the activation
_SUM_BITS = 34      # average window sum: up to 65535 elements of at most 17 bits signed
_FIFO_LATENCY = 2   # cycles from writing SyncFIFOBuffered to its output being valid


def output_elem_shape(config: AcceleratorConfig) -> Shape:
    """A requantized output element (the input type of the next layer)."""
    return signed(config.output_bits) if config.output_signed else unsigned(config.output_bits)


def sfu_input_layout(config: AcceleratorConfig) -> data.StructLayout:
    """Payload of the SFU's input stream: one pixel."""
    fields = {"acc": data.ArrayLayout(acc_elem_shape(config), config.cols)}
    if config.sfu_residual:
        fields["residual"] = data.ArrayLayout(output_elem_shape(config), config.cols)
    fields.update({"first": unsigned(1), "last": unsigned(1), "pad": unsigned(1)})
    return data.StructLayout(fields)


def sfu_output_layout(config: AcceleratorConfig) -> data.ArrayLayout:
    """Payload of the SFU's output stream: C elements of the accumulator element shape (int
    outputs lie in ``config.output_range``, which that shape always holds)."""
    return data.ArrayLayout(acc_elem_shape(config), config.cols)


def _wrap(value: Value, width: int = _WORD) -> Value:
    """``value`` modulo 2**width, as a signed value (what numpy's int64 arithmetic keeps)."""
    return value[:width].as_signed() if len(value) > width else value


def _clamp(value: Value, lo: Value | int, hi: Value | int) -> Value:
    """``min(max(value, lo), hi)``, in that order (as the reference's activation)."""
    low = Mux(value < lo, lo, value)
    return Mux(low > hi, hi, low)


def _saturate(value: Value, width: int, is_signed: bool) -> Value:
    """``value`` clamped to the range of a ``width``-bit (signed) integer, decided from the bits
    above that range (no comparator after the adder that made ``value``)."""
    if is_signed:
        top = value[width - 1:]
        fits = top.all() | ~top.any()
        limit = Mux(value[-1], -(1 << (width - 1)), (1 << (width - 1)) - 1)
        return Mux(fits, value[:width].as_signed(), limit)
    fits = ~value[width:].any()
    return Mux(fits, value[:width], Mux(value[-1], 0, (1 << width) - 1))


def _compare(value: Value, lo: Value, hi: Value) -> tuple[Value, Value]:
    """The two comparisons of ``min(max(value, lo), hi)``, side by side: (below lo, above hi)."""
    return value < lo, value > hi


def _select(value: Value, lo: Value, hi: Value, empty: Value, below: Value, above: Value) -> Value:
    """``min(max(value, lo), hi)`` from the registered comparisons; ``empty`` says lo > hi (then
    the result is always hi)."""
    return Mux(empty | above, hi, Mux(below, lo, value))


def _coarse(shift: Value) -> Value:
    """The multiple-of-8 part of a shift amount (a 64-bit shifter is split into two stages of
    three mux levels each: routing, not logic, dominates a single 64-bit shifter on ECP5)."""
    return Cat(Const(0, 3), shift[3:])


def _half(shift: Value) -> Value:
    """The rounding term of ``rounding_shift``: 2**(shift-1), or 0 for shift 0."""
    return (Const(1, 1) << shift)[1:]


def _low_mask(shift: Value) -> Value:
    """The bits a shift by ``shift`` drops: 2**shift - 1 (``_WORD - 1`` bits wide)."""
    return ~(Const((1 << (_WORD - 1)) - 1, _WORD - 1) << shift)[:_WORD - 1]


def _is_tie(x: Value, mask: Value, rounds: Value) -> Value:
    """``x`` = product + 2**(shift-1) came from an exact tie: the shift rounds (shift > 0) and
    drops only zero bits."""
    return rounds & ~(x[:_WORD - 1] & mask).any()


def _clear_lsb(value: Value, clear: Value) -> Value:
    """``value`` with bit 0 cleared when ``clear``: the even one of a tie's two neighbours."""
    return Cat(value[0] & ~clear, value[1:]).as_signed()


def _chunks(value: Value, width: int) -> list[tuple[Value, int]]:
    """Split a signed ``width``-bit value into (chunk, weight) pairs that each fit an 18-bit
    signed multiplier input: value = sum(chunk << weight)."""
    if width <= _DSP_WIDTH:
        return [(value, 0)]
    assert width <= _CHUNK + _DSP_WIDTH, width
    return [(value[:_CHUNK], 0), (value[_CHUNK:width].as_signed(), _CHUNK)]


class _Multiplier:
    """``a * b`` over three pipeline stages: partial products (one 18x18 DSP each), then two
    terms, then their sum (wrapped to ``wrap`` bits if given). Each stage is one adder deep."""

    def __init__(self, m: Module, a: Value, a_width: int, b: Value, b_width: int, *, name: str,
                 wrap: int | None) -> None:
        def register(suffix: str, value: Value) -> Signal:
            reg = Signal(value.shape(), name=f"{name}_{suffix}")
            m.d.sync += reg.eq(value)
            return reg

        partials = []
        for i, (a_chunk, a_weight) in enumerate(_chunks(a, a_width)):
            for j, (b_chunk, b_weight) in enumerate(_chunks(b, b_width)):
                partials.append((register(f"pp{i}{j}", a_chunk * b_chunk), a_weight + b_weight))
        if len(partials) == 4:
            # lo*lo is unsigned and below 2**(2*_CHUNK): hi*hi << 2*_CHUNK concatenates onto it.
            (ll, _), (lh, _), (hl, _), (hh, _) = partials
            base, middle = Cat(ll, hh).as_signed(), lh + hl
        elif len(partials) == 2:
            (base, _), (middle, _) = partials
        else:
            (base, _), middle = partials[0], Const(0)
        base, middle = register("base", base), register("middle", middle)
        total = base + (middle << _CHUNK)
        self.product = register("product", _wrap(total, wrap) if wrap is not None else total)


def sfu_latency(config: AcceleratorConfig, *, avg: bool = False) -> int:
    """Cycles from the SFU accepting a beat to its output being valid, without stalls, when the
    beat ends its window (or without pooling): input, bias, 3 multiply, [residual], round,
    2 shift, zero point, narrow, 2 activation, [pooling]. ``avg``: for the last beat of an
    average-pooling window, which adds centre, 3 multiply, round, 2 shift, zero point, narrow and
    2 activation stages."""
    latency = 12 + int(config.sfu_residual) + int(bool(config.sfu_pooling)) + _FIFO_LATENCY
    return latency + 11 if avg else latency


class SpecialFunctionUnit(wiring.Component):
    """The SFU: C lanes of bias add, requantize, residual add, activation and saturation, then
    max or average pooling over windows of beats, then an output FIFO.

    Parameters
    ----------
    config : AcceleratorConfig
        Uses ``cols``, the accumulator and output element types, ``sfu_activations``,
        ``sfu_pooling`` and ``sfu_residual``.
    """

    def __init__(self, config: AcceleratorConfig) -> None:
        if not isinstance(config, AcceleratorConfig):
            raise TypeError(f"config must be an AcceleratorConfig, not {config!r}")
        self._config = config
        super().__init__({
            "i": In(stream.Signature(sfu_input_layout(config))),
            "o": Out(stream.Signature(sfu_output_layout(config))),
            "params": In(data.ArrayLayout(REQUANT_ENTRY, config.cols)),
            "regs": In(SFU_REGS),
            "settings": In(SFU_SETTINGS),
            "idle": Out(1),
        })

    @property
    def config(self) -> AcceleratorConfig:
        return self._config

    @property
    def _fifo_depth(self) -> int:
        # Enough entries for every output the pipeline can hold when the consumer stops, so that
        # full throughput never waits for the registered credit.
        longest = self.avg_latency if "avg" in self._config.sfu_pooling else self.latency
        return 1 << (longest + 3 - 1).bit_length()

    @property
    def latency(self) -> int:
        """Cycles from accepting a beat to its output being valid (see :func:`sfu_latency`)."""
        return sfu_latency(self._config)

    @property
    def avg_latency(self) -> int:
        """:func:`sfu_latency` for the last beat of an average-pooling window; 0 without ``avg``."""
        return sfu_latency(self._config, avg=True) if "avg" in self._config.sfu_pooling else 0

    def elaborate(self, platform: object) -> Module:
        cfg = self._config
        m = Module()
        cols = cfg.cols
        has_residual = cfg.sfu_residual
        has_max = "max" in cfg.sfu_pooling
        has_avg = "avg" in cfg.sfu_pooling
        out_lo, out_hi = cfg.output_range
        acc_width = cfg.acc_bits + int(not cfg.acc_signed)     # as a signed value
        value_width = max(acc_width, _NARROW)                  # int results and raw elements
        regs, settings = self.regs, self.settings

        # -- settings stage: effective parameters, registered; stable during a STORE -------------
        raw = Signal()
        zp = Signal(signed(16))
        clamp_lo = Signal(signed(17))      # the activation and the saturation as one clamp
        clamp_hi = Signal(signed(17))
        bias = [Signal(signed(32), name=f"bias{c}") for c in range(cols)]
        mult = [Signal(signed(32), name=f"mult{c}") for c in range(cols)]
        shift = [Signal(6, name=f"shift{c}") for c in range(cols)]
        half = [Signal(_WORD - 1, name=f"half{c}") for c in range(cols)]    # rounding terms
        mask = [Signal(_WORD - 1, name=f"mask{c}") for c in range(cols)]    # bits shifted out
        rounds = [Signal(name=f"rounds{c}") for c in range(cols)]           # shift > 0
        tie_out = Signal()
        is_raw = settings.out_type == OutType.RAW
        m.d.sync += [
            raw.eq(is_raw),
            zp.eq(Mux(is_raw, 0, regs.zp_out)),
            tie_out.eq(regs.tie_out),
        ]
        for c in range(cols):
            entry = self.params[c]
            m.d.sync += [
                bias[c].eq(Mux(is_raw, 0, entry.bias)),
                mult[c].eq(Mux(is_raw, 1, entry.mult)),
                shift[c].eq(Mux(is_raw, 0, entry.shift)),
                half[c].eq(Mux(is_raw, 0, _half(entry.shift))),
                mask[c].eq(_low_mask(entry.shift)),
                rounds[c].eq(~is_raw & (entry.shift != 0)),
            ]
        # clamp(sat(act(q))) = min(max(q, sat(L)), sat(U)) for the activation's bounds [L, U]
        act = settings.act
        lower: Value = Const(out_lo, signed(17))
        upper: Value = Const(out_hi, signed(17))
        if "relu" in cfg.sfu_activations:
            lower = Mux(act == Activation.RELU, regs.zp_out, lower)
        if "relu6" in cfg.sfu_activations:
            lower = Mux(act == Activation.RELU6, regs.zp_out, lower)
            upper = Mux(act == Activation.RELU6, regs.act_hi, upper)
        if "clip" in cfg.sfu_activations:
            lower = Mux(act == Activation.CLIP, regs.act_lo, lower)
            upper = Mux(act == Activation.CLIP, regs.act_hi, upper)
        lower_sat = Signal(signed(17))
        upper_sat = Signal(signed(17))
        clamp_empty = Signal()
        m.d.comb += [lower_sat.eq(_clamp(lower, out_lo, out_hi)), upper_sat.eq(_clamp(upper, out_lo, out_hi))]
        m.d.sync += [clamp_lo.eq(lower_sat), clamp_hi.eq(upper_sat), clamp_empty.eq(lower_sat > upper_sat)]
        if has_residual:
            residual_on = Signal()
            res_zp = Signal(signed(16))
            res_mult = Signal(signed(32))
            m.d.sync += [
                residual_on.eq(settings.residual & ~is_raw),
                res_zp.eq(regs.res_zp),
                res_mult.eq(regs.res_mult),
            ]
        if has_max or has_avg:
            pool_max = Signal()
            pool_avg = Signal()
            m.d.sync += [
                pool_max.eq(~is_raw & (settings.pool == PoolMode.MAX) if has_max else 0),
                pool_avg.eq(~is_raw & (settings.pool == PoolMode.AVG) if has_avg else 0),
            ]
        if has_avg:
            avg_mult = Signal(signed(32))
            avg_shift = Signal(6)
            avg_half = Signal(_WORD - 1)
            avg_mask = Signal(_WORD - 1)
            avg_rounds = Signal()
            avg_tie_out = Signal()
            count_zp = Signal(signed(33))
            m.d.sync += [
                avg_mult.eq(regs.avg_mult),
                avg_shift.eq(regs.avg_shift),
                avg_half.eq(_half(regs.avg_shift)),
                avg_mask.eq(_low_mask(regs.avg_shift)),
                avg_rounds.eq(regs.avg_shift != 0),
                avg_tie_out.eq(regs.avg_tie_out),
                count_zp.eq(settings.pool_count * regs.zp_out),
            ]

        # -- pipeline control: the stages move every cycle (no enable to fan out); the outputs
        # queue in a FIFO, and a beat is accepted only while its output is sure of a FIFO entry.
        valids: list[Signal] = []

        def stage_valid(name: str, valid_in: Value) -> Signal:
            valid = Signal(name=f"{name}_valid")
            m.d.sync += valid.eq(valid_in)
            valids.append(valid)
            return valid

        def register(name: str, value: Value, shape: Shape | None = None) -> Signal:
            reg = Signal(shape if shape is not None else value.shape(), name=name)
            m.d.sync += reg.eq(value)
            return reg

        m.submodules.output_fifo = fifo = SyncFIFOBuffered(width=Shape.cast(sfu_output_layout(cfg)).width,
                                                           depth=self._fifo_depth)
        pending = Signal(range(self._fifo_depth + 1))   # outputs owed: in the pipeline or the FIFO
        room = Signal(init=1)                            # pending < FIFO depth, registered
        accepted = self.i.valid & self.i.ready
        # a beat produces an output unless it is a pooling window's non-last beat
        produces = self.i.payload.last | ~(pool_max | pool_avg) if has_max or has_avg else Const(1)
        taken = self.o.valid & self.o.ready
        pending_next = pending + (accepted & produces) - taken
        m.d.sync += [pending.eq(pending_next), room.eq(pending_next < self._fifo_depth)]
        m.d.comb += self.i.ready.eq(room)

        # S0: the input beat is registered as it is, so that the producer's path (e.g. from a block
        # RAM) ends here
        valid = stage_valid("input", accepted)
        beat = register("beat", self.i.payload.as_value(), sfu_input_layout(cfg))
        flags = Cat(beat.first, beat.last, beat.pad)

        # S1: bias add, saturating to the accumulator range; residual minus its zero point
        valid = stage_valid("bias", valid)
        flags = register("bias_flags", flags)
        t = [register(f"t{c}", _saturate(beat.acc[c] + bias[c], cfg.acc_bits, cfg.acc_signed),
                      signed(acc_width)) for c in range(cols)]
        if has_residual:
            res_d = [register(f"res_d{c}", beat.residual[c] - res_zp) for c in range(cols)]

        # S2..S4: t * mult (wrapped to 64 bits), (r - res_zp) * res_mult (exact, < 2**50)
        for name in ("partial", "terms", "product"):
            valid = stage_valid(name, valid)
            flags = register(f"{name}_flags", flags)
        p = [_Multiplier(m, t[c], acc_width, mult[c], 32, name=f"p{c}", wrap=_WORD).product
             for c in range(cols)]
        if has_residual:
            res_p = [_Multiplier(m, res_d[c], len(res_d[c]), res_mult, 32, name=f"res_p{c}",
                                 wrap=None).product for c in range(cols)]
            # [S5r]: the residual term joins the product, so that one rounding covers both
            valid = stage_valid("residual", valid)
            flags = register("residual_flags", flags)
            p = [register(f"pr{c}", _wrap(p[c] + Mux(residual_on, res_p[c], 0))) for c in range(cols)]

        # S5: add the rounding term; S6, S7: arithmetic shift (by multiples of 8, then 0..7), the
        # tie recognized beside the first shift from the bits it drops
        valid = stage_valid("round", valid)
        flags = register("round_flags", flags)
        x = [register(f"x{c}", _wrap(p[c] + half[c])) for c in range(cols)]
        valid = stage_valid("shift_coarse", valid)
        flags = register("shift_coarse_flags", flags)
        tie = [register(f"tie_coarse{c}", _is_tie(x[c], mask[c], rounds[c])) for c in range(cols)]
        x = [register(f"x_coarse{c}", x[c] >> _coarse(shift[c])) for c in range(cols)]
        valid = stage_valid("shift", valid)
        flags = register("shift_flags", flags)
        tie = [register(f"tie{c}", tie[c]) for c in range(cols)]
        y = [register(f"y{c}", x[c] >> shift[c][:3]) for c in range(cols)]

        # S8: output zero point, after making a tie even (tie_out = 0)
        valid = stage_valid("zero_point", valid)
        flags = register("zero_point_flags", flags)
        q = [register(f"q{c}", _wrap(_clear_lsb(y[c], tie[c] & ~tie_out) + zp)) for c in range(cols)]
        tie = [register(f"tie_q{c}", tie[c] & tie_out) for c in range(cols)]

        # S9: make a tie's output even (tie_out = 1), narrow to 19 bits (the clamp bounds lie well
        # inside); raw elements pass whole
        valid = stage_valid("narrow", valid)
        flags = register("narrow_flags", flags)
        narrow = [register(f"narrow{c}", Mux(raw, q[c], _saturate(_clear_lsb(q[c], tie[c]), _NARROW, True)),
                           signed(value_width)) for c in range(cols)]

        # S11, S12: activation and saturation as one clamp: compare, then select
        valid = stage_valid("act_compare", valid)
        flags = register("act_compare_flags", flags)
        held, below, above = [], [], []
        for c in range(cols):
            lo_hi = _compare(narrow[c][:_NARROW].as_signed(), clamp_lo, clamp_hi)
            held.append(register(f"act_value{c}", narrow[c]))
            below.append(register(f"below{c}", lo_hi[0]))
            above.append(register(f"above{c}", lo_hi[1]))
        valid = stage_valid("act", valid)
        flags = register("act_flags", flags)
        v = [register(f"v{c}", Mux(raw, held[c], _select(held[c][:_NARROW].as_signed(), clamp_lo, clamp_hi,
                                                        clamp_empty, below[c], above[c])),
                      signed(value_width)) for c in range(cols)]
        out_valid, out = valid, v

        # P: pooling over the window's beats. One register per mode, so each is one carry chain
        # deep; the mode is selected after the registers.
        if has_max or has_avg:
            first, last, pad = flags[0], flags[1], flags[2]
            no_pool = ~pool_max & ~pool_avg
            update = valid
            passed = [register(f"passed{c}", v[c]) for c in range(cols)]
            out = passed
            if has_max:
                run_max = [Signal(output_elem_shape(cfg), name=f"run_max{c}") for c in range(cols)]
                # Max pooling only sees requantized outputs, which fit output_bits exactly; with
                # the sign bit flipped, their signed order is the unsigned one: a short comparator
                # for this one-cycle recurrence.
                flip = 1 << (cfg.output_bits - 1) if cfg.output_signed else 0
                for c in range(cols):
                    value = v[c][:cfg.output_bits]
                    bigger = (value ^ flip) > (run_max[c].as_unsigned() ^ flip)
                    with m.If(update & ~pad & (first | bigger)):
                        m.d.sync += run_max[c].eq(value)
                    with m.Elif(update & first):     # a pad pixel starts the window
                        m.d.sync += run_max[c].eq(out_lo)
                out = [Mux(pool_max, run_max[c], out[c]) for c in range(cols)]
            if has_avg:
                run_sum = [Signal(signed(_SUM_BITS), name=f"run_sum{c}") for c in range(cols)]
                for c in range(cols):
                    with m.If(update):
                        m.d.sync += run_sum[c].eq(Mux(first, 0, run_sum[c]) + Mux(pad, zp, v[c]))
            valid = stage_valid("pool", valid & (no_pool | last))
            out_valid = valid

        # F1..F11: average finish, the same requantize tail with (avg_mult, avg_shift)
        if has_avg:
            valid = stage_valid("centre", valid & pool_avg)
            centred = [register(f"centred{c}", run_sum[c] - count_zp, signed(_SUM_BITS + 1))
                       for c in range(cols)]
            for name in ("avg_partial", "avg_terms", "avg_product"):
                valid = stage_valid(name, valid)
            avg_p = [_Multiplier(m, centred[c], _SUM_BITS + 1, avg_mult, 32, name=f"avg_p{c}",
                                 wrap=_WORD).product for c in range(cols)]
            valid = stage_valid("avg_round", valid)
            avg_x = [register(f"avg_x{c}", _wrap(avg_p[c] + avg_half)) for c in range(cols)]
            valid = stage_valid("avg_shift_coarse", valid)
            avg_tie = [register(f"avg_tie_coarse{c}", _is_tie(avg_x[c], avg_mask, avg_rounds))
                       for c in range(cols)]
            avg_x = [register(f"avg_x_coarse{c}", avg_x[c] >> _coarse(avg_shift)) for c in range(cols)]
            valid = stage_valid("avg_shift", valid)
            avg_tie = [register(f"avg_tie{c}", avg_tie[c]) for c in range(cols)]
            avg_y = [register(f"avg_y{c}", avg_x[c] >> avg_shift[:3]) for c in range(cols)]
            valid = stage_valid("avg_zero_point", valid)
            avg_q = [register(f"avg_q{c}", _wrap(_clear_lsb(avg_y[c], avg_tie[c] & ~avg_tie_out) + zp))
                     for c in range(cols)]
            avg_tie = [register(f"avg_tie_q{c}", avg_tie[c] & avg_tie_out) for c in range(cols)]
            valid = stage_valid("avg_narrow", valid)
            avg_n = [register(f"avg_narrow{c}", _saturate(_clear_lsb(avg_q[c], avg_tie[c]), _NARROW, True),
                              signed(_NARROW)) for c in range(cols)]
            valid = stage_valid("avg_act_compare", valid)
            avg_lo_hi = [_compare(avg_n[c], clamp_lo, clamp_hi) for c in range(cols)]
            avg_held = [register(f"avg_act_value{c}", avg_n[c]) for c in range(cols)]
            avg_below = [register(f"avg_below{c}", avg_lo_hi[c][0]) for c in range(cols)]
            avg_above = [register(f"avg_above{c}", avg_lo_hi[c][1]) for c in range(cols)]
            valid = stage_valid("avg_act", valid)
            avg_v = [register(f"avg_v{c}", _select(avg_held[c], clamp_lo, clamp_hi, clamp_empty, avg_below[c],
                                                   avg_above[c]), signed(_NARROW)) for c in range(cols)]
            out_valid = Mux(pool_avg, valid, out_valid)
            out = [Mux(pool_avg, avg_v[c], out[c]) for c in range(cols)]

        result = Signal(sfu_output_layout(cfg))
        for c in range(cols):
            m.d.comb += result[c].eq(out[c])
        m.d.comb += [
            fifo.w_en.eq(out_valid),
            fifo.w_data.eq(result.as_value()),
            self.o.valid.eq(fifo.r_rdy),
            self.o.payload.eq(fifo.r_data),
            fifo.r_en.eq(self.o.ready),
            self.idle.eq(~Cat(*valids).any()),
        ]
        return m
