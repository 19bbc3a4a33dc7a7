"""Special-function unit: the store path's requantize / activation / pooling pipeline.

Bit-exact with ``systolic.sim.arith`` (docs/isa.md, STORE): every input beat is one pixel, a
vector of C accumulator values (plus C residual elements), and goes through
:func:`~systolic.sim.arith.sfu_pointwise`; with pooling, the pointwise values of a window are
combined (max over non-pad pixels, or sum with pad pixels counting as ``zp_out``) and an average
window ends with :func:`~systolic.sim.arith.avg_pool_finish`. The pipeline accepts one beat per
cycle (one per ``config.sfu_row_cycles`` cycles: its ``config.sfu_lanes`` lanes then take a row's
channels in that many lane groups) and emits one vector per output pixel. Its stages run freely
(no enable, for clock speed); outputs queue in a FIFO (with lane groups, a group per entry, the
row gathered at its read side) and ``i.ready`` (a register, and with lane groups also low while
the input stage holds groups of a beat) drops once every FIFO row is promised.

Ports (see docs/arch-memory-sfu.md for the stage diagram):

* ``i`` — input stream of :func:`sfu_input_layout`: ``acc`` (C accumulator elements),
  ``residual`` (C output-type elements, only with ``config.sfu_residual``), and the pooling
  flags ``first``/``last`` (first and last beat of a window) and ``pad`` (a window pixel outside
  the image). Without pooling the flags are ignored.
* ``o`` — output stream of :func:`sfu_output_layout`: C elements of the accumulator element shape.
  ``out_type=int``: requantized values inside ``config.output_range`` (the store unit writes their
  low ``output_bits`` bits); ``out_type=raw``: the accumulator elements unchanged.
* ``param_group`` (out) and ``params`` (in) — this SFU reads the STORE's requantize table row a
  lane group at a time (the table's ``lookup`` port): ``params`` must be the ``sfu_lanes``
  entries (bias, mult, shift) of lane group ``param_group`` (channels ``g * sfu_lanes`` on) of the
  row, one cycle after ``param_group`` names it; ``param_group`` names the group the input stage
  will hold two cycles later (no port with ``sfu_row_cycles`` = 1: ``params`` is then the row).
  The serial SFU (hw/sfu_serial.py) has no ``param_group``: its ``params`` is the whole row, e.g.
  the table's pending read response. ``regs`` — the CONFIG registers (:data:`SFU_REGS`, the CONFIG
  fields of the ISA). ``settings`` — the STORE's ``out_type``, ``act``, ``pool``, ``residual`` and
  ``pool_count`` (= pool_h * pool_w, window pixels including pad, for the average).
  ``regs`` and ``settings`` are sampled one cycle before use: they must be stable from the cycle
  before the first beat of a STORE is offered until ``idle`` is high again after its last beat;
  the table row read through ``param_group`` from two cycles before (the serial SFU's ``params``
  from the cycle before).
* ``idle`` — no beat in the pipeline stages (outputs may still wait in the output FIFO).

Modes the config leaves out cost no logic: an ``act`` or ``pool`` code missing from
``config.sfu_activations`` / ``config.sfu_pooling`` behaves as ``none``, and without
``config.sfu_residual`` there is no residual input or datapath. ``out_type=raw`` ignores ``act``,
``pool`` and ``residual`` (the ISA forbids combining them).

Every 32x32 multiply (:class:`SplitMultiplier`) is split into four partial products of 16-bit
halves (the low half unsigned: one 18x18 DSP each on ECP5, one 16x16 SB_MAC16 each on iCE40) with
registers before and after (on ECP5 the one after is the DSP block's output register), then summed
over the next two stages; all 64-bit arithmetic wraps modulo 2**64 exactly like the numpy int64
reference.

Rounding is half to even (:func:`~systolic.sim.arith.rounding_shift_even`): the shifter rounds
half up, a tie is recognized from the bits it shifts out (the low ``shift`` bits of ``x + half``
are all zero), and bit 0 of the result is cleared on a tie -- before the zero point is added
(``tie_out`` = 0) or after it (``tie_out`` = 1). The residual term joins the product before the
rounding, so that an Add is rounded once.
"""

from __future__ import annotations

from typing import Any

from amaranth import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.hdl import Shape, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .accumulator import acc_elem_shape
from .config import AcceleratorConfig
from .dsp import MULT18X18D_INPUT_BITS, is_ecp5, mult18x18d
from .fifo import buffered_fifo
from .isa import HEADER_LAYOUT, LAYOUTS, Activation, Opcode, OutType, PoolMode
from .requant_table import lane_group_shape, requant_group_layout, requant_row_layout

__all__ = [
    "SFU_REGS", "SFU_SETTINGS", "SFUPorts", "SpecialFunctionUnit", "SplitMultiplier", "SERIAL_LATENCY",
    "SPLIT_MULTIPLIER_LATENCY", "sfu_latency",
    "sfu_input_layout",
    "sfu_output_layout", "output_elem_shape",
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
_LOW_CHUNK = 16     # narrowest low chunk of a split operand (unsigned; up to 17 bits fit 18 signed)
_DSP_WIDTH = MULT18X18D_INPUT_BITS   # operands up to this many bits (signed) are not split
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


def _clamp(value: Value, lo: int, hi: int) -> Value:
    """``min(max(value, lo), hi)`` for constant bounds ``lo <= hi``: both comparisons side by
    side (one comparator deep), then a choice."""
    assert lo <= hi, (lo, hi)
    return Mux(value < lo, lo, Mux(value > hi, hi, value))


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
    signed multiplier input (ECP5): value = sum(chunk << weight). The low chunk is unsigned and
    at least 16 bits wide, so that a 32-bit operand splits into two 16-bit halves, each of which
    also fits one 16 x 16 iCE40 SB_MAC16."""
    if width <= _DSP_WIDTH:
        return [(value, 0)]
    low = max(_LOW_CHUNK, width - _DSP_WIDTH)
    assert low <= _DSP_WIDTH - 1, width
    return [(value[:low], 0), (value[low:width].as_signed(), low)]


class SplitMultiplier(wiring.Component):
    """``product`` = ``a`` * ``b`` (signed operands, ``a_width`` and ``b_width`` bits), wrapped to
    ``wrap`` bits if given (else exact: ``a_width + b_width`` bits), :data:`SPLIT_MULTIPLIER_LATENCY`
    (3) cycles after the operands, over three stages that move every cycle: partial products of
    operand chunks that fit one DSP multiplier each (:func:`_chunks`: a 32-bit operand splits into
    an unsigned low half and a signed high half), then two terms, then their sum. Each stage is at
    most one adder deep.

    On a Lattice ECP5 platform (``platform.family == "ecp5"``) each partial product is the
    output register of one MULT18X18D (:func:`~systolic.hw.dsp.mult18x18d`, operands not
    registered in the block: they come from registers already), so no route back from the DSP
    row sits in the multiplier's stage; elsewhere it is a fabric register after a multiply that
    yosys maps to a DSP block.

    Raises :class:`ValueError` for an operand wider than two DSP multiplier inputs.
    """

    def __init__(self, a_width: int, b_width: int, *, wrap: int | None = None) -> None:
        for name, width in (("a_width", a_width), ("b_width", b_width)):
            if not 1 <= width <= 2 * _DSP_WIDTH - 1:
                raise ValueError(f"{name} must be 1 to {2 * _DSP_WIDTH - 1} bits (two DSP multiplier "
                                 f"inputs), not {width!r}")
        self._a_width, self._b_width, self._wrap = a_width, b_width, wrap
        super().__init__({
            "a": In(signed(a_width)),
            "b": In(signed(b_width)),
            "product": Out(signed(wrap if wrap is not None else a_width + b_width)),
        })

    def elaborate(self, platform: object) -> Module:
        m = Module()
        ecp5 = is_ecp5(platform)

        def register(suffix: str, value: Value) -> Signal:
            reg = Signal(value.shape(), name=suffix)
            m.d.sync += reg.eq(value)
            return reg

        partials = []
        for i, (a_chunk, a_weight) in enumerate(_chunks(self.a, self._a_width)):
            for j, (b_chunk, b_weight) in enumerate(_chunks(self.b, self._b_width)):
                shape = (a_chunk * b_chunk).shape()
                if ecp5:
                    product = mult18x18d(m, f"mult{i}{j}", a_chunk, b_chunk, input_registers=False)
                    partial = Signal(shape, name=f"pp{i}{j}")
                    m.d.comb += partial.eq(product[:shape.width])     # the exact product fits
                else:
                    partial = register(f"pp{i}{j}", a_chunk * b_chunk)
                partials.append((partial, a_weight + b_weight))
        if len(partials) == 4:
            # lo*lo is unsigned and below 2**(weight of hi*hi): hi*hi concatenates onto it.
            (ll, _), (lh, lh_weight), (hl, hl_weight), (hh, hh_weight) = partials
            assert hh_weight == len(ll), (hh_weight, len(ll))
            step = min(lh_weight, hl_weight)
            base = Cat(ll, hh).as_signed()
            middle = (lh << (lh_weight - step)) + (hl << (hl_weight - step))
        elif len(partials) == 2:
            (base, _), (middle, step) = partials
        else:
            (base, _), middle, step = partials[0], Const(0), 0
        base, middle = register("base", base), register("middle", middle)
        total = base + (middle << step)
        m.d.sync += self.product.eq(_wrap(total, self._wrap) if self._wrap is not None else total)
        return m


def _multiply(m: Module, name: str, a: Value, a_width: int, b: Value, b_width: int, *,
              wrap: int | None) -> Value:
    """``a * b`` from a :class:`SplitMultiplier` added to ``m`` as ``name``."""
    m.submodules[name] = multiplier = SplitMultiplier(a_width, b_width, wrap=wrap)
    m.d.comb += [multiplier.a.eq(a), multiplier.b.eq(b)]
    return multiplier.product


#: Cycles from a :class:`SplitMultiplier`'s operands to their product.
SPLIT_MULTIPLIER_LATENCY = 3


#: ``sfu_latency`` of the serial SFU (``sfu_engine = "serial"``, hw/sfu_serial.py), whose work
#: per beat the golden model counts on its own (``serial_sfu_cycles``): its output register is
#: valid the cycle after a row's last channel.
SERIAL_LATENCY = 1


def sfu_latency(config: AcceleratorConfig, *, avg: bool = False) -> int:
    """Cycles from the SFU accepting a beat to its output being valid, without stalls, when the
    beat ends its window (or without pooling): input, bias, 3 multiply, [residual], round,
    2 shift, zero point, narrow, 2 activation, [pooling], plus ``sfu_row_cycles - 1`` for the
    row's later lane groups. ``avg``: for the last beat of an average-pooling window, which adds
    centre, 3 multiply, round, 2 shift, zero point, narrow and 2 activation stages. With
    ``sfu_engine = "serial"``: :data:`SERIAL_LATENCY`."""
    if config.sfu_engine == "serial":
        return SERIAL_LATENCY
    return _pipelined_latency(config, avg=avg)


def _pipelined_latency(config: AcceleratorConfig, *, avg: bool = False) -> int:
    """:func:`sfu_latency` of :class:`SpecialFunctionUnit`, whatever ``config.sfu_engine`` says."""
    latency = (12 + int(config.sfu_residual) + int(bool(config.sfu_pooling)) + _FIFO_LATENCY
               + config.sfu_row_cycles - 1)
    return latency + 11 if avg else latency


def activation_clamp(m: Module, config: AcceleratorConfig, settings: Value, regs: Value,
                     clamp_lo: Signal, clamp_hi: Signal, clamp_empty: Signal) -> None:
    """Drive the registers ``clamp_lo``, ``clamp_hi`` (signed 17 bits) and ``clamp_empty`` with the
    activation and the output saturation of ``settings.act`` as one clamp:
    ``clamp(sat(act(q))) = min(max(q, sat(L)), sat(U))`` for the activation's bounds [L, U], and
    ``clamp_empty`` = sat(L) > sat(U) (then every result is sat(U)). The bounds, their saturation
    and their comparison are one register stage each, three cycles from the settings."""
    out_lo, out_hi = config.output_range
    act = settings.act
    lower: Value = Const(out_lo, signed(17))
    upper: Value = Const(out_hi, signed(17))
    if "relu" in config.sfu_activations:
        lower = Mux(act == Activation.RELU, regs.zp_out, lower)
    if "relu6" in config.sfu_activations:
        lower = Mux(act == Activation.RELU6, regs.zp_out, lower)
        upper = Mux(act == Activation.RELU6, regs.act_hi, upper)
    if "clip" in config.sfu_activations:
        lower = Mux(act == Activation.CLIP, regs.act_lo, lower)
        upper = Mux(act == Activation.CLIP, regs.act_hi, upper)
    act_lower = Signal(signed(17))
    act_upper = Signal(signed(17))
    m.d.sync += [
        act_lower.eq(lower), act_upper.eq(upper),
        clamp_lo.eq(_clamp(act_lower, out_lo, out_hi)), clamp_hi.eq(_clamp(act_upper, out_lo, out_hi)),
        clamp_empty.eq(clamp_lo > clamp_hi),
    ]


def _pick(options: list[Value], index: Value) -> Value:
    """``options[index]`` as a tree of 2-to-1 multiplexers (``len(options)`` is
    ``2 ** len(index)``)."""
    level = list(options)
    for bit in range(len(index)):
        level = [Mux(index[bit], level[2 * k + 1], level[2 * k]) for k in range(len(level) // 2)]
    assert len(level) == 1, (len(options), len(index))
    return level[0]


class SFUPorts(wiring.Component):
    """The ports of a special-function unit (:class:`SpecialFunctionUnit`, or the serial one in
    ``hw/sfu_serial.py``), for ``config``: see :class:`SpecialFunctionUnit` and the module
    docstring."""

    #: True: ``params`` is one lane group of the table row, the group ``param_group`` named the
    #: cycle before (the table's ``lookup`` port); False: ``params`` is the whole row.
    streams_params: bool = False

    def __init__(self, config: AcceleratorConfig) -> None:
        if not isinstance(config, AcceleratorConfig):
            raise TypeError(f"config must be an AcceleratorConfig, not {config!r}")
        self._config = config
        members = {
            "i": In(stream.Signature(sfu_input_layout(config))),
            "o": Out(stream.Signature(sfu_output_layout(config))),
        }
        if self.streams_params:
            if config.sfu_row_cycles > 1:
                members["param_group"] = Out(lane_group_shape(config))
            members["params"] = In(requant_group_layout(config))
        else:
            members["params"] = In(requant_row_layout(config))
        super().__init__(members | {
            "regs": In(SFU_REGS),
            "settings": In(SFU_SETTINGS),
            "idle": Out(1),
        })

    @property
    def config(self) -> AcceleratorConfig:
        return self._config


class SpecialFunctionUnit(SFUPorts):
    """The SFU: ``config.sfu_lanes`` lanes of bias add, requantize, residual add, activation and
    saturation, then max or average pooling over windows of beats, then an output FIFO. With
    ``config.sfu_row_cycles`` = 1 there is a lane per column; with more, each lane takes the
    channels ``k * sfu_lanes + lane`` in turn (k = 0, 1, ...: the row's *lane groups*, one per
    cycle), so a beat is accepted every ``sfu_row_cycles`` cycles.

    Parameters
    ----------
    config : AcceleratorConfig
        Uses ``cols``, ``sfu_row_cycles``, the accumulator and output element types,
        ``sfu_activations``, ``sfu_pooling`` and ``sfu_residual``.
    """

    streams_params = True

    @property
    def _fifo_rows(self) -> int:
        # Enough rows for every output the pipeline can hold when the consumer stops, so that
        # full throughput never waits for the registered credit (a row enters every
        # sfu_row_cycles cycles).
        longest = self.avg_latency if "avg" in self._config.sfu_pooling else self.latency
        per_row = self._config.sfu_row_cycles
        return 1 << ((longest + per_row - 1) // per_row + 3 - 1).bit_length()

    @property
    def latency(self) -> int:
        """Cycles from accepting a beat to its output being valid (see :func:`sfu_latency`)."""
        return _pipelined_latency(self._config)

    @property
    def avg_latency(self) -> int:
        """:func:`sfu_latency` for the last beat of an average-pooling window; 0 without ``avg``."""
        return _pipelined_latency(self._config, avg=True) if "avg" in self._config.sfu_pooling else 0

    def elaborate(self, platform: object) -> Module:
        cfg = self._config
        m = Module()
        lanes = cfg.sfu_lanes
        each_lane = range(lanes)
        groups = cfg.sfu_row_cycles             # lane groups per row, one per cycle
        group_bits = lane_group_shape(cfg).width
        has_residual = cfg.sfu_residual
        has_max = "max" in cfg.sfu_pooling
        has_avg = "avg" in cfg.sfu_pooling
        out_lo, out_hi = cfg.output_range
        acc_width = cfg.acc_bits + int(not cfg.acc_signed)     # as a signed value
        value_width = max(acc_width, _NARROW)                  # int results and raw elements
        regs, settings = self.regs, self.settings

        def channels(lane: int) -> list[int]:
            """The channels a lane takes, one per lane group."""
            return [k * lanes + lane for k in range(groups)]

        # -- settings stage: effective parameters, registered; stable during a STORE -------------
        raw = Signal()
        zp = Signal(signed(16))
        clamp_lo = Signal(signed(17))      # the activation and the saturation as one clamp
        clamp_hi = Signal(signed(17))
        tie_out = Signal()
        is_raw = settings.out_type == OutType.RAW
        m.d.sync += [
            raw.eq(is_raw),
            zp.eq(Mux(is_raw, 0, regs.zp_out)),
            tie_out.eq(regs.tie_out),
        ]
        clamp_empty = Signal()
        activation_clamp(m, cfg, settings, regs, clamp_lo, clamp_hi, clamp_empty)
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
            count_zp = Signal(signed(33))      # used from the centre stage on: two cycles
            pool_count = Signal(16)
            count_zp_out = Signal(signed(16))
            m.d.sync += [
                avg_mult.eq(regs.avg_mult),
                avg_shift.eq(regs.avg_shift),
                avg_half.eq(_half(regs.avg_shift)),
                avg_mask.eq(_low_mask(regs.avg_shift)),
                avg_rounds.eq(regs.avg_shift != 0),
                avg_tie_out.eq(regs.avg_tie_out),
                pool_count.eq(settings.pool_count),
                count_zp_out.eq(regs.zp_out),
            ]
            if is_ecp5(platform):
                # the output register of a DSP block (see SplitMultiplier)
                product = mult18x18d(m, "count_zp_mult", pool_count, count_zp_out, input_registers=False)
                m.d.comb += count_zp.eq(product)
            else:
                m.d.sync += count_zp.eq(pool_count * count_zp_out)

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

        rows = self._fifo_rows
        elem_width = Shape.cast(acc_elem_shape(cfg)).width
        # the FIFO holds lane groups, a row's groups in order: ``rows`` rows of ``groups`` entries
        m.submodules.output_fifo = fifo = buffered_fifo(cfg, width=lanes * elem_width, depth=rows * groups)
        pending = Signal(range(rows + 1))   # output rows owed: in the pipeline or the FIFO
        room = Signal(init=1)               # pending < rows, registered
        accepted = self.i.valid & self.i.ready
        # a beat produces an output unless it is a pooling window's non-last beat
        produces = self.i.payload.last | ~(pool_max | pool_avg) if has_max or has_avg else Const(1)
        taken = self.o.valid & self.o.ready
        pending_next = pending + (accepted & produces) - taken
        m.d.sync += [pending.eq(pending_next), room.eq(pending_next < rows)]

        # S0: the input beat is registered as it is, so that the producer's path (e.g. from a block
        # RAM) ends here; with several lane groups it stays for as many cycles, one group each.
        beat = Signal(sfu_input_layout(cfg), name="beat")
        if groups == 1:
            valid = stage_valid("input", accepted)
            m.d.sync += beat.eq(self.i.payload)
            group = Const(0, 0)
            m.d.comb += self.i.ready.eq(room)
        else:
            valid = Signal(name="input_valid")
            valids.append(valid)
            group = Signal(group_bits, name="input_group")
            # the beat has lane groups left: valid & (group != groups - 1), a register made a cycle
            # ahead. The beat register takes the input in every cycle it has none left, taken or
            # not (valid says whether it holds a beat), so its load enable is that register, not
            # the producer's handshake (on the 16x16 SoC the handshake's logic into the 530 load
            # enables, 8.5 ns of routing, was the control clock's critical path at 9120dd7)
            more = Signal(name="input_more")
            m.d.sync += more.eq(accepted | (more & (group != groups - 2)))
            with m.If(~more):
                m.d.sync += beat.eq(self.i.payload)
            with m.If(accepted):
                m.d.sync += [valid.eq(1), group.eq(0)]
            with m.Elif(more):
                m.d.sync += group.eq(group + 1)
            with m.Else():
                m.d.sync += valid.eq(0)
            m.d.comb += self.i.ready.eq(room & ~more)
        flags = Cat(beat.first, beat.last, beat.pad)

        # The table entries of the group in S0 (raw: the identity), registered from the table's
        # read of the cycle before: param_group names the group S0 holds two cycles later, one
        # cycle for the table's synchronous read and one for these registers.
        if groups > 1:
            m.d.comb += self.param_group.eq(Mux(more, Mux(group == groups - 2, 0, group + 2),
                                                accepted))
        entry = {
            "bias": [register(f"bias{lane}", Mux(is_raw, 0, self.params[lane].bias)) for lane in each_lane],
            "mult": [register(f"entry_mult{lane}", Mux(is_raw, 1, self.params[lane].mult))
                     for lane in each_lane],
            "shift": [register(f"entry_shift{lane}", Mux(is_raw, 0, self.params[lane].shift))
                      for lane in each_lane],
        }
        # A lane's entry follows its group down the stages (they move every cycle): carried[field,
        # s] holds the field of the group in stage s (0 = S0), made on first use.
        carried: dict[tuple[str, int], list[Value]] = {(name, 0): values for name, values in entry.items()}
        stage = 0                               # the newest stage built

        def carried_field(name: str, index: int) -> list[Value]:
            if (name, index) not in carried:
                carried[name, index] = [register(f"{name}{lane}_s{index}", value)
                                        for lane, value in enumerate(carried_field(name, index - 1))]
            return carried[name, index]

        def lane_param(name: str, field: str, decode: Any = None) -> list[Value]:
            """Per lane: the entry's ``field`` of the group in the newest stage, ``decode``-d, in a
            register beside that stage's (the stage after it computes with the parameter)."""
            if stage == 0:
                assert decode is None, name
                return carried_field(field, 0)
            return [register(f"{name}{lane}", decode(value) if decode is not None else value)
                    for lane, value in enumerate(carried_field(field, stage - 1))]

        def next_stage(name: str, valid_in: Value) -> tuple[Signal, Signal]:
            nonlocal flags, stage
            valid_out = stage_valid(name, valid_in)
            flags = register(f"{name}_flags", flags)
            stage += 1
            return valid_out, flags

        # S1: bias add, saturating to the accumulator range; residual minus its zero point
        bias = lane_param("bias", "bias")
        valid, flags = next_stage("bias", valid)
        t = [register(f"t{lane}", _saturate(_pick([beat.acc[c] for c in channels(lane)], group) + bias[lane],
                                            cfg.acc_bits, cfg.acc_signed), signed(acc_width))
             for lane in each_lane]
        if has_residual:
            res_d = [register(f"res_d{lane}",
                              _pick([beat.residual[c] for c in channels(lane)], group) - res_zp)
                     for lane in each_lane]

        # S2..S4: t * mult (wrapped to 64 bits), (r - res_zp) * res_mult (exact, < 2**50)
        mult = lane_param("mult", "mult")
        for name in ("partial", "terms", "product"):
            valid, flags = next_stage(name, valid)
        p = [_multiply(m, f"p{lane}", t[lane], acc_width, mult[lane], 32, wrap=_WORD) for lane in each_lane]
        if has_residual:
            res_p = [_multiply(m, f"res_p{lane}", res_d[lane], len(res_d[lane]), res_mult, 32, wrap=None)
                     for lane in each_lane]
            # [S5r]: the residual term joins the product, so that one rounding covers both
            valid, flags = next_stage("residual", valid)
            p = [register(f"pr{lane}", _wrap(p[lane] + Mux(residual_on, res_p[lane], 0)))
                 for lane in each_lane]

        # S5: add the rounding term; S6, S7: arithmetic shift (by multiples of 8, then 0..7), the
        # tie recognized beside the first shift from the bits it drops
        half = lane_param("half", "shift", _half)                # rounding terms
        valid, flags = next_stage("round", valid)
        x = [register(f"x{lane}", _wrap(p[lane] + half[lane])) for lane in each_lane]
        shift = lane_param("shift", "shift")
        mask = lane_param("mask", "shift", _low_mask)                # bits shifted out
        rounds = lane_param("rounds", "shift", lambda value: value != 0)
        valid, flags = next_stage("shift_coarse", valid)
        tie = [register(f"tie_coarse{lane}", _is_tie(x[lane], mask[lane], rounds[lane]))
               for lane in each_lane]
        x = [register(f"x_coarse{lane}", x[lane] >> _coarse(shift[lane])) for lane in each_lane]
        fine = [register(f"fine{lane}", shift[lane][:3]) for lane in each_lane]
        valid, flags = next_stage("shift", valid)
        tie = [register(f"tie{lane}", tie[lane]) for lane in each_lane]
        y = [register(f"y{lane}", x[lane] >> fine[lane]) for lane in each_lane]

        # S8: output zero point, after making a tie even (tie_out = 0)
        valid, flags = next_stage("zero_point", valid)
        q = [register(f"q{lane}", _wrap(_clear_lsb(y[lane], tie[lane] & ~tie_out) + zp))
             for lane in each_lane]
        tie = [register(f"tie_q{lane}", tie[lane] & tie_out) for lane in each_lane]

        # S9: make a tie's output even (tie_out = 1), narrow to 19 bits (the clamp bounds lie well
        # inside); raw elements pass whole
        valid, flags = next_stage("narrow", valid)
        narrow = [register(f"narrow{lane}",
                           Mux(raw, q[lane], _saturate(_clear_lsb(q[lane], tie[lane]), _NARROW, True)),
                           signed(value_width)) for lane in each_lane]

        # S11, S12: activation and saturation as one clamp: compare, then select
        valid, flags = next_stage("act_compare", valid)
        held, below, above = [], [], []
        for lane in each_lane:
            lo_hi = _compare(narrow[lane][:_NARROW].as_signed(), clamp_lo, clamp_hi)
            held.append(register(f"act_value{lane}", narrow[lane]))
            below.append(register(f"below{lane}", lo_hi[0]))
            above.append(register(f"above{lane}", lo_hi[1]))
        valid, flags = next_stage("act", valid)
        v = [register(f"v{lane}",
                      Mux(raw, held[lane], _select(held[lane][:_NARROW].as_signed(), clamp_lo, clamp_hi,
                                                   clamp_empty, below[lane], above[lane])),
                      signed(value_width)) for lane in each_lane]
        out_valid, out = valid, v

        # P: pooling over the window's beats. One register per mode, so each is one carry chain
        # deep; the mode is selected after the registers. A channel's running value waits in a
        # ring of one entry per lane group: every beat turns it once, a group per cycle, so the
        # head always belongs to the group arriving.
        def ring(name: str, shape: Shape, update: Value, new: Any) -> list[Signal]:
            """Per lane: the tail of a ring of ``groups`` entries that turns on ``update`` with
            ``new(lane, head)`` written at the tail (the value of the group just processed)."""
            tails = []
            for lane in each_lane:
                entries = [Signal(shape, name=f"{name}{lane}_{k}") for k in range(groups)]
                with m.If(update):
                    m.d.sync += [entries[k].eq(entries[k + 1]) for k in range(groups - 1)]
                    m.d.sync += entries[-1].eq(new(lane, entries[0]))
                tails.append(entries[-1])
            return tails

        if has_max or has_avg:
            first, last, pad = flags[0], flags[1], flags[2]
            no_pool = ~pool_max & ~pool_avg
            update = valid
            passed = [register(f"passed{lane}", v[lane]) for lane in each_lane]
            out = passed
            if has_max:
                # Max pooling only sees requantized outputs, which fit output_bits exactly; with
                # the sign bit flipped, their signed order is the unsigned one: a short comparator
                # for this one-cycle recurrence.
                flip = 1 << (cfg.output_bits - 1) if cfg.output_signed else 0

                def new_max(lane: int, head: Value) -> Value:
                    value = v[lane][:cfg.output_bits]
                    bigger = (value ^ flip) > (head.as_unsigned() ^ flip)
                    # a pad pixel that starts the window starts it at the lowest value
                    return Mux(~pad & (first | bigger), value, Mux(first, out_lo, head))
                run_max = ring("run_max", output_elem_shape(cfg), update, new_max)
                out = [Mux(pool_max, run_max[lane], out[lane]) for lane in each_lane]
            if has_avg:
                run_sum = ring("run_sum", signed(_SUM_BITS), update,
                               lambda lane, head: Mux(first, 0, head) + Mux(pad, zp, v[lane]))
            valid = stage_valid("pool", valid & (no_pool | last))
            out_valid = valid

        # F1..F11: average finish, the same requantize tail with (avg_mult, avg_shift)
        if has_avg:
            valid = stage_valid("centre", valid & pool_avg)
            centred = [register(f"centred{lane}", run_sum[lane] - count_zp, signed(_SUM_BITS + 1))
                       for lane in each_lane]
            for name in ("avg_partial", "avg_terms", "avg_product"):
                valid = stage_valid(name, valid)
            avg_p = [_multiply(m, f"avg_p{lane}", centred[lane], _SUM_BITS + 1, avg_mult, 32, wrap=_WORD)
                     for lane in each_lane]
            valid = stage_valid("avg_round", valid)
            avg_x = [register(f"avg_x{lane}", _wrap(avg_p[lane] + avg_half)) for lane in each_lane]
            valid = stage_valid("avg_shift_coarse", valid)
            avg_tie = [register(f"avg_tie_coarse{lane}", _is_tie(avg_x[lane], avg_mask, avg_rounds))
                       for lane in each_lane]
            avg_x = [register(f"avg_x_coarse{lane}", avg_x[lane] >> _coarse(avg_shift)) for lane in each_lane]
            valid = stage_valid("avg_shift", valid)
            avg_tie = [register(f"avg_tie{lane}", avg_tie[lane]) for lane in each_lane]
            avg_y = [register(f"avg_y{lane}", avg_x[lane] >> avg_shift[:3]) for lane in each_lane]
            valid = stage_valid("avg_zero_point", valid)
            avg_q = [register(f"avg_q{lane}",
                              _wrap(_clear_lsb(avg_y[lane], avg_tie[lane] & ~avg_tie_out) + zp))
                     for lane in each_lane]
            avg_tie = [register(f"avg_tie_q{lane}", avg_tie[lane] & avg_tie_out) for lane in each_lane]
            valid = stage_valid("avg_narrow", valid)
            avg_n = [register(f"avg_narrow{lane}",
                              _saturate(_clear_lsb(avg_q[lane], avg_tie[lane]), _NARROW, True),
                              signed(_NARROW)) for lane in each_lane]
            valid = stage_valid("avg_act_compare", valid)
            avg_lo_hi = [_compare(avg_n[lane], clamp_lo, clamp_hi) for lane in each_lane]
            avg_held = [register(f"avg_act_value{lane}", avg_n[lane]) for lane in each_lane]
            avg_below = [register(f"avg_below{lane}", avg_lo_hi[lane][0]) for lane in each_lane]
            avg_above = [register(f"avg_above{lane}", avg_lo_hi[lane][1]) for lane in each_lane]
            valid = stage_valid("avg_act", valid)
            avg_v = [register(f"avg_v{lane}", _select(avg_held[lane], clamp_lo, clamp_hi, clamp_empty,
                                                      avg_below[lane], avg_above[lane]), signed(_NARROW))
                     for lane in each_lane]
            out_valid = Mux(pool_avg, valid, out_valid)
            out = [Mux(pool_avg, avg_v[lane], out[lane]) for lane in each_lane]

        # -- output: each lane group enters the FIFO as it comes (a row's groups in order, one per
        # cycle), so that the FIFO is a lane group wide, not a row. Its read side gathers a row's
        # earlier groups into registers as they arrive and offers the row with its last group.
        result = Signal(data.ArrayLayout(acc_elem_shape(cfg), lanes))
        for lane in each_lane:
            m.d.comb += result[lane].eq(out[lane])
        m.d.comb += [fifo.w_en.eq(out_valid), fifo.w_data.eq(result)]
        if groups == 1:
            m.d.comb += [self.o.valid.eq(fifo.r_rdy), self.o.payload.eq(fifo.r_data),
                         fifo.r_en.eq(self.o.ready)]
        else:
            read_group = Signal(group_bits)
            earlier = [Signal(lanes * elem_width, name=f"out_group{k}") for k in range(groups - 1)]
            at_last = read_group == groups - 1
            with m.If(fifo.r_rdy & fifo.r_en):
                m.d.sync += read_group.eq(read_group + 1)        # wraps after the last group
            for k in range(groups - 1):
                with m.If(fifo.r_rdy & (read_group == k)):
                    m.d.sync += earlier[k].eq(fifo.r_data)
            m.d.comb += [self.o.valid.eq(fifo.r_rdy & at_last), self.o.payload.eq(Cat(*earlier, fifo.r_data)),
                         fifo.r_en.eq(~at_last | self.o.ready)]
        m.d.comb += self.idle.eq(~Cat(*valids).any())
        return m
