"""The R x C systolic array with its input skew, output de-skew and stream interfaces.

:class:`SystolicArray` is a grid of :class:`~systolic.hw.pe.ProcessingElement` (R = ``rows``,
C = ``cols``) behind ``amaranth.lib.stream`` ports. Callers see aligned vectors: the skew
(element i of an input row enters PE row i, i cycles later) and the de-skew of the results are
inside the block. Every register of the array sits behind one global enable that is low while the
output cannot take a result, so back-pressure stalls the whole array and loses nothing; in large
arrays the enable comes through registers (``stall_stages``) and a small skid buffer at the output
takes the rows produced while the stall travels. For a consumer that takes every row (the
compute unit, ``backpressure=False``) there is no enable: every register advances every cycle.
Weight-stationary partial sums are only as wide as the exact column sum (:func:`column_sum_shape`).

The timing and the interface rules are in ``docs/arch-array.md``; in short, with T tiles streamed
back to back and the output always ready:

* weight-stationary: :func:`ws_cycles` — ``k + (T-1)*max(m, k+1) + m + R + C + 4`` cycles from
  the first weight row to the last result row, i.e. ``max(m, k+1)`` per tile in steady state (the
  next tile's weights shift into the shadow registers while the current tile streams, from the
  cycle after its first row);
* output-stationary: :func:`os_cycles` — ``K + (T-1)*max(K, R) + 2R + C + 2`` cycles from the
  first operand beat to the last result row (the result registers of one tile drain while the
  next accumulates).

Both give R * C multiply-accumulates every cycle in steady state (m > k, K >= R).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from amaranth import Cat, Const, Module, Mux, Shape, Signal, Value
from amaranth.hdl import EnableInserter
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .config import AcceleratorConfig
from .dsp import fabric_register, is_ecp5
from .pe import MAC_LATENCY, ProcessingElement, element_shapes

__all__ = [
    "LUTRAM_DELAY_DEPTH", "LUTRAM_DELAY_MIN", "SystolicArray", "weight_layout", "input_layout",
    "output_layout", "array_latency", "ws_cycles", "ws_tile_interval", "os_cycles", "column_sum_shape",
    "default_stall_stages",
    "Handshake", "ws_handshake", "os_handshake",
]


def _check_config(config: object) -> AcceleratorConfig:
    if not isinstance(config, AcceleratorConfig):
        raise TypeError(f"config must be an AcceleratorConfig, not {config!r}")
    return config


def weight_layout(config: AcceleratorConfig) -> data.StructLayout:
    """Payload of the weight-stationary preload stream: one row of C weights per beat.

    ``data``: C weight elements, row i of W (the caller zeroes columns >= n).
    ``last``: 1 on the last row of a preload (row k-1); rows k..R-1 become zero.
    """
    config = _check_config(config)
    if config.dataflow != "ws":
        raise ValueError(f"weight_layout needs dataflow 'ws' (the output-stationary array takes "
                         f"B with A on one stream), not {config.dataflow!r}")
    _, weight_shape, _ = element_shapes(config)
    return data.StructLayout({"data": data.ArrayLayout(weight_shape, config.cols), "last": 1})


def input_layout(config: AcceleratorConfig) -> data.StructLayout:
    """Payload of the input stream, one beat per cycle.

    Weight-stationary: ``data`` = one row of A (R input elements; elements >= k meet zero
    weights), ``new_weights`` = 1 on the first row of a tile that uses the most recently completed
    preload (the beat waits until that preload has arrived), ``last`` = 1 on the tile's last row.

    Output-stationary: ``a`` = one row of A transposed (R input elements: column k of A),
    ``b`` = one row of B (C weight elements; the caller zeroes columns >= n), ``last`` = 1 on the
    tile's last beat (beat K-1).
    """
    config = _check_config(config)
    input_shape, weight_shape, _ = element_shapes(config)
    if config.dataflow == "ws":
        return data.StructLayout({
            "data": data.ArrayLayout(input_shape, config.rows),
            "new_weights": 1,
            "last": 1,
        })
    return data.StructLayout({
        "a": data.ArrayLayout(input_shape, config.rows),
        "b": data.ArrayLayout(weight_shape, config.cols),
        "last": 1,
    })


def output_layout(config: AcceleratorConfig) -> data.StructLayout:
    """Payload of the result stream: ``data`` = one row of P (C accumulator elements, acc_bits
    each, wrapped modulo 2**acc_bits), ``last`` = 1 on the tile's last row (WS: row m-1 of the
    tile; OS: row R-1, every output-stationary tile drains all R rows)."""
    config = _check_config(config)
    _, _, acc_shape = element_shapes(config)
    return data.StructLayout({"data": data.ArrayLayout(acc_shape, config.cols), "last": 1})


def array_latency(config: AcceleratorConfig) -> int:
    """Cycles from the handshake of an input beat to its result row being valid on the output,
    without stalls. WS (every input row): R + C + 4; OS (the tile's last beat to result row 0):
    R + C + 3.

    OS: element r of the beat reaches PE row q = R-1-r after 1 + q cycles (skew) and column j
    after j more; the tile's sum lands in the PE's result register ``MAC_LATENCY`` (4) cycles
    later, and the bottom row's results are aligned by delaying column j by C-1-j:
    1 + (R-1) + MAC_LATENCY + (C-1) = R + C + 3. WS: one cycle more, because ``new_weights``
    runs one cycle ahead of the elements (which enter PE row i after 2 + i cycles)."""
    config = _check_config(config)
    if config.dataflow == "ws":
        return config.rows + config.cols + MAC_LATENCY
    return config.rows + config.cols - 1 + MAC_LATENCY


def _check_tile_counts(**counts: int) -> None:
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an integer, not {value!r}")
        if value < 1:
            raise ValueError(f"{name} must be at least 1, not {value!r}")


def ws_tile_interval(m: int, k: int) -> int:
    """Cycles between the first input rows of two back-to-back preloading WS tiles (the later
    one's k weight rows enter from the cycle after the earlier one's first input row, whose m
    rows stream meanwhile): ``max(m, k + 1)``. :func:`ws_cycles` and the compiler's estimate use
    it."""
    return max(m, k + 1)


def ws_cycles(config: AcceleratorConfig, *, m: int, k: int, tiles: int) -> int:
    """Cycles, counting from the handshake of the first weight row as cycle 0 to the handshake
    of the last result row inclusive, of ``tiles`` weight-stationary tiles that each preload k
    weight rows and stream m input rows, all streams back to back and the output always ready:
    ``k + (tiles-1)*max(m, k+1) + m + R + C + 4`` (a preload starts the cycle after the previous
    one's first input row takes it into the PEs)."""
    config = _check_config(config)
    _check_tile_counts(m=m, k=k, tiles=tiles)
    if k > config.rows:
        raise ValueError(f"k must be at most rows ({config.rows}), not {k!r}")
    return k + (tiles - 1) * ws_tile_interval(m, k) + m + array_latency(config)


def os_cycles(config: AcceleratorConfig, *, k: int, tiles: int) -> int:
    """Cycles, from the handshake of the first operand beat as cycle 0 to the handshake of the
    last result row inclusive, of ``tiles`` output-stationary tiles of K = ``k`` beats each,
    back to back with the output always ready: ``k + (tiles-1)*max(k, R) + 2R + C + 2``."""
    config = _check_config(config)
    _check_tile_counts(k=k, tiles=tiles)
    return k + (tiles - 1) * max(k, config.rows) + array_latency(config) + config.rows - 1


def column_sum_shape(config: AcceleratorConfig, products: int) -> Shape:
    """The narrowest shape that holds the exact sum of ``products`` products of an input element
    and a weight element, whatever their values (e.g. ``signed(20)`` for 16 int8 x int8
    products, -128 * -128 in every one included), or the accumulator's shape (``acc_bits``) when
    that is not wider: a weight-stationary column's partial sum after ``products`` PE rows
    (nothing else enters at the top), wrapped modulo 2**acc_bits where the exact sum would not
    fit, as docs/isa.md specifies."""
    config = _check_config(config)
    _check_tile_counts(products=products)
    corners = [x * y for x in config.input_range for y in config.weight_range]
    exact = Shape.cast(range(products * min(corners), products * max(corners) + 1))
    if exact.width >= config.acc_bits:
        return element_shapes(config)[2]
    return exact


def default_stall_stages(config: AcceleratorConfig) -> int:
    """Register stages between the array's output state and the enable of its registers (see
    :class:`SystolicArray`): 0 (one combinational enable) up to 16 PEs, 1 up to 64 PEs, 3
    beyond (a registered enable, one register per PE row and edge block, one per PE)."""
    config = _check_config(config)
    pes = config.rows * config.cols
    return 0 if pes <= 16 else 1 if pes <= 64 else 3


#: A delay of reset-less data this many cycles or more goes through distributed RAM when the
#: array has ``lutram_delays`` (by default on ECP5; ``_delay``'s ``lutram``): below it,
#: flip-flops cost less than the RAM's look-up tables and write-port slice.
LUTRAM_DELAY_MIN = 4
#: Words of one distributed-RAM delay line (an ECP5 TRELLIS_DPR16X4 holds 16 words of 4 bits): a
#: line delays by at most this many cycles, a longer delay chains lines.
LUTRAM_DELAY_DEPTH = 16


def _delay(m: Module, value: Value, cycles: int, name: str, *, reset_less: bool = False,
           lutram: bool = False) -> Value:
    """``value`` delayed by ``cycles`` registers in ``m``'s sync domain (``reset_less`` for data
    whose value does not matter while nothing valid travels with it).

    With ``lutram`` (and ``reset_less``), each stretch of :data:`LUTRAM_DELAY_MIN` to
    :data:`LUTRAM_DELAY_DEPTH` cycles is a :func:`_lutram_delay` instead, the rest registers:
    the same value in every cycle, fewer flip-flops. Under ``m``'s enable (``EnableInserter``)
    both kinds hold still while it is low."""
    if lutram and reset_less:
        line = 0
        while cycles >= LUTRAM_DELAY_MIN:
            step = min(cycles, LUTRAM_DELAY_DEPTH)
            value = _lutram_delay(m, value, step, f"{name}_ram{line}")
            cycles -= step
            line += 1
    for stage in range(cycles):
        reg = Signal(value.shape(), name=f"{name}_d{stage + 1}", reset_less=reset_less)
        m.d.sync += reg.eq(value)
        value = reg
    return value


def _lutram_delay(m: Module, value: Value, cycles: int, name: str) -> Signal:
    """``value`` delayed by ``cycles`` (2 to :data:`LUTRAM_DELAY_DEPTH`) through a memory of
    :data:`LUTRAM_DELAY_DEPTH` words (submodule ``name``; yosys maps it to ECP5 distributed RAM)
    and an output register: every cycle the memory takes ``value`` at ``head`` and its
    asynchronous read port gives the word written ``cycles - 1`` cycles before, at ``tail``,
    into the register. The two pointers advance together and never meet, so no read sees the
    write of its own cycle; neither has a reset (their distance is set by their initial values
    and never changes), nor does the data."""
    assert 2 <= cycles <= LUTRAM_DELAY_DEPTH, cycles
    depth = LUTRAM_DELAY_DEPTH
    m.submodules[name] = memory = Memory(shape=value.shape(), depth=depth, init=[])
    write = memory.write_port()
    read = memory.read_port(domain="comb")
    head = Signal(range(depth), name=f"{name}_head", reset_less=True)
    tail = Signal(range(depth), name=f"{name}_tail", init=-(cycles - 1) % depth, reset_less=True)
    out = Signal(value.shape(), name=f"{name}_out", reset_less=True)
    m.d.comb += [write.addr.eq(head), write.data.eq(value), write.en.eq(1), read.addr.eq(tail)]
    m.d.sync += [head.eq(head + 1), tail.eq(tail + 1), out.eq(read.data)]
    return out


def _stall_register(m: Module, platform: Any, value: Value, name: str) -> Signal:
    """A register of the stall tree, 1 at reset; on ECP5 one that yosys does not merge with the
    tree's identical registers (hw/dsp.py ``fabric_register``)."""
    return fabric_register(m, name, value, init=1, platform=platform)


class Handshake(NamedTuple):
    """The array's input handshake and the signals made with it (:func:`ws_handshake`,
    :func:`os_handshake`); the fields of the other dataflow are ``None``."""
    inputs_ready: Value
    in_fire: Value
    weights_ready: Value | None = None
    w_fire: Value | None = None
    swap: Value | None = None
    weight_row: Value | None = None
    fire_last: Value | None = None


def ws_handshake(m: Module, rows: int, *, enable: Value, inputs_valid: Value, new_weights: Value,
                 weights_valid: Value, weights_last: Value, name: str = "") -> Handshake:
    """The weight-stationary array's readiness rule and the registers behind it, added to ``m``
    (its sync domain; signal names start with ``name``): an input beat with ``new_weights`` is
    ready once a preload has completed (``pending``), a weight row while none waits (a register:
    the weights' readiness does not depend on the input stream, so a compute unit's take of a
    weight row is made of the weight side alone; on the 16x16 ULX3S SoC at 5832802 the rule that
    also took a weight row in the cycle the waiting preload is swapped in made a path from the
    input rows' side into the weights' metadata queue, 10.7 ns, docs/boards.md); a preload
    completes with ``last`` or its ``rows``-th row. ``enable`` gates both. The array builds its
    handshake with it, and the compute unit builds a copy that takes rows from the scratchpad's
    response rings (hw/units.py), so that the array's ``ready`` needs no route back."""
    pending = Signal(name=f"{name}pending")            # a completed preload waits in the shadows
    weight_row = Signal(range(rows), name=f"{name}weight_row")     # the next preload row's index
    hs = Handshake(inputs_ready=Signal(name=f"{name}inputs_ready"), in_fire=Signal(name=f"{name}in_fire"),
                   weights_ready=Signal(name=f"{name}weights_ready"), w_fire=Signal(name=f"{name}w_fire"),
                   swap=Signal(name=f"{name}swap"), weight_row=weight_row)
    w_done = Signal(name=f"{name}w_done")
    m.d.comb += [
        hs.inputs_ready.eq(enable & (~new_weights | pending)),
        hs.weights_ready.eq(enable & ~pending),
        hs.in_fire.eq(inputs_valid & hs.inputs_ready),
        hs.w_fire.eq(weights_valid & hs.weights_ready),
        w_done.eq(hs.w_fire & (weights_last | (weight_row == rows - 1))),
        hs.swap.eq(hs.in_fire & new_weights),
    ]
    with m.If(hs.w_fire):
        m.d.sync += weight_row.eq(Mux(w_done, 0, weight_row + 1))
    with m.If(hs.swap):
        m.d.sync += pending.eq(0)
    with m.If(w_done):
        m.d.sync += pending.eq(1)
    return hs


def os_handshake(m: Module, rows: int, *, enable: Value, inputs_valid: Value, last: Value,
                 name: str = "") -> Handshake:
    """The output-stationary array's readiness rule and its register, added to ``m`` as
    :func:`ws_handshake`: a ``last`` beat is ready ``rows`` cycles after the previous one at the
    earliest (the previous tile's results must have left the PEs); ``enable`` gates it."""
    cooldown = Signal(range(rows), name=f"{name}cooldown")
    hs = Handshake(inputs_ready=Signal(name=f"{name}inputs_ready"), in_fire=Signal(name=f"{name}in_fire"),
                   fire_last=Signal(name=f"{name}fire_last"))
    m.d.comb += [
        hs.inputs_ready.eq(enable & (~last | (cooldown == 0))),
        hs.in_fire.eq(inputs_valid & hs.inputs_ready),
        hs.fire_last.eq(hs.in_fire & last),
    ]
    with m.If(hs.fire_last):
        m.d.sync += cooldown.eq(rows - 1)
    with m.Elif(cooldown != 0):
        m.d.sync += cooldown.eq(cooldown - 1)
    return hs


class SystolicArray(wiring.Component):
    """R x C systolic array for the config's dataflow (R = ``rows``, C = ``cols``).

    Ports, weight-stationary (``dataflow = "ws"``), computing P = A . W:

    ``weights``: ``In(stream.Signature(weight_layout(config)))`` — preload rows 0..k-1 of W,
    in order, ``last`` on row k-1 (or the R-th row ends the preload). While a completed preload
    waits for its tile, the stream is not ready.
    ``inputs``: ``In(stream.Signature(input_layout(config)))`` — rows of A. A beat with
    ``new_weights`` is not ready until a preload has completed; it and the rows after it use
    those weights.
    ``outputs``: ``Out(stream.Signature(output_layout(config)))`` — one row of P per input row,
    in order, ``last`` copied from the input row.

    Ports, output-stationary (``dataflow = "os"``), computing P = A . B:

    ``inputs``: ``In(stream.Signature(input_layout(config)))`` — beat k carries column k of A
    (``a``) and row k of B (``b``); ``last`` on beat K-1. A ``last`` beat is not ready until R
    cycles after the previous one (the previous tile's results must have left the PEs).
    ``outputs``: ``Out(stream.Signature(output_layout(config)))`` — R rows of P per tile, row 0
    first, ``last`` on row R-1.

    Both dataflows follow the ``amaranth.lib.stream`` rules: a payload moves in a cycle with
    ``valid`` and ``ready`` high, no ``valid`` waits for a ``ready``, and the output takes any
    amount of back-pressure (nothing is lost or reordered).

    ``stall_stages`` (default :func:`default_stall_stages`): 0 — the registers advance in a
    cycle with ``~outputs.valid | outputs.ready`` (the input streams' ``ready`` then depends
    combinationally on ``outputs.ready``); s in 1..4 — the enable of a cycle is decided s cycles
    before, from the occupancy of a skid buffer of ``2 * s`` result rows at the output, and
    reaches the registers through s register stages (from 2 on, one register per PE row and per
    edge block; from 3 on, below those, one per PE); ``inputs.ready``, ``weights.ready`` and
    ``outputs.valid`` then come from registers. With a ready consumer the buffer stays empty:
    latency, cycle counts and throughput do not depend on ``stall_stages``.

    ``backpressure`` (default ``True``): ``False`` is for a consumer that takes every result row
    in the cycle it comes (the compute unit, which writes each row into the accumulator, always
    ready): ``outputs`` is then ``always_ready`` (its ``ready`` is ``Const(1)``), the array has
    no enables, no stall tree and no skid buffer, and every register (the DSP blocks' too)
    advances in every cycle; ``inputs.ready`` and ``weights.ready`` depend only on the preload
    state (and, OS, the ``last`` cooldown). Latency and cycle counts are those above. On the
    ULX3S-85F 16x16 SoC the stall tree's enables (one register per PE, one per DSP row, and the
    handshake's) were the compute clock's critical paths (docs/boards.md). ``stall_stages`` does
    not apply then (0).

    ``lutram_delays`` (default: whether the platform is ECP5): the input skew's, the weight
    skew's and the output de-skew's delays of :data:`LUTRAM_DELAY_MIN` cycles or more go
    through distributed-RAM delay lines of up to :data:`LUTRAM_DELAY_DEPTH` cycles each, with
    one output register, instead of a register per cycle (a 16x16 array: about 4k flip-flops
    fewer for 115 TRELLIS_DPR16X4). The array's behaviour is the same in every cycle.

    Raises :class:`TypeError` when ``config`` is not an :class:`AcceleratorConfig`,
    ``stall_stages`` not an integer or ``backpressure`` not a bool, :class:`ValueError` for
    ``stall_stages`` outside 0..4, or other than 0 without ``backpressure``.
    """

    def __init__(self, config: AcceleratorConfig, *, stall_stages: int | None = None,
                 lutram_delays: bool | None = None, backpressure: bool = True) -> None:
        self.config = _check_config(config)
        self.lutram_delays = lutram_delays
        if not isinstance(backpressure, bool):
            raise TypeError(f"backpressure must be a bool, not {backpressure!r}")
        if isinstance(stall_stages, bool) or not isinstance(stall_stages, (int, type(None))):
            raise TypeError(f"stall_stages must be an integer, not {stall_stages!r}")
        if not backpressure and stall_stages not in (None, 0):
            raise ValueError(f"stall_stages must be 0 (or left out) without backpressure: nothing "
                             f"stalls, not {stall_stages!r}")
        if stall_stages is None:
            stall_stages = default_stall_stages(config) if backpressure else 0
        if not 0 <= stall_stages <= 4:
            raise ValueError(f"stall_stages must be between 0 and 4, not {stall_stages!r}")
        self.stall_stages = stall_stages
        self.backpressure = backpressure
        members = {}
        if config.dataflow == "ws":
            members["weights"] = In(stream.Signature(weight_layout(config)))
        members["inputs"] = In(stream.Signature(input_layout(config)))
        members["outputs"] = Out(stream.Signature(output_layout(config), always_ready=not backpressure))
        super().__init__(members)

    @property
    def latency(self) -> int:
        """Cycles from an input handshake to its result row, without stalls (see
        :func:`array_latency`)."""
        return array_latency(self.config)

    @property
    def skid_depth(self) -> int:
        """Result rows the output buffer holds: 2 * ``stall_stages`` (0 without stall stages)."""
        return 2 * self.stall_stages

    def elaborate(self, platform) -> Module:
        config = self.config
        m = Module()

        # The registers advance only while the output can take what they produce: every group
        # below (the PE rows, the input side, the weight skew, the output de-skew) has its own
        # enable, all equal in every cycle (see _elaborate_stall).
        groups = {name: Module() for name in ("inputs", "weights", "outputs")}
        enables = {name: Signal(name=f"enable_{name}") for name in groups}
        pe_enables = [[Signal(name=f"enable_pe_{i}_{j}") for j in range(config.cols)]
                      for i in range(config.rows)]
        for name, group in groups.items():
            m.submodules[name] = EnableInserter(enables[name])(group) if self.backpressure else group

        # The last `array_lut_multipliers` PEs in row-major order multiply in logic, the
        # `array_bram_multipliers` before them in block RAM. A WS PE row's partial sums are only
        # as wide as the exact sum of the products above them.
        logic_from = config.rows * config.cols - config.array_lut_multipliers
        bram_from = logic_from - config.array_bram_multipliers

        def kind(index: int) -> str:
            return "dsp" if index < bram_from else "bram" if index < logic_from else "logic"

        ws = config.dataflow == "ws"
        # on ECP5 the skews' long delays of data go through distributed RAM (_delay)
        lutram = is_ecp5(platform) if self.lutram_delays is None else self.lutram_delays
        pes = [[ProcessingElement(config, multiplier=kind(i * config.cols + j),
                                  psum_shape=column_sum_shape(config, i + 1) if ws else None)
                for j in range(config.cols)] for i in range(config.rows)]
        # the DSP blocks' clock enables: one per PE row with DSP PEs (ProcessingElement's
        # dsp_enable), a leaf of that row's branch of the stall tree
        dsp_enables = [[Signal(name=f"enable_dsp_{i}")] if any(pe.multiplier == "dsp" for pe in row) else []
                       for i, row in enumerate(pes)]
        for i, row in enumerate(pes):
            for j, pe in enumerate(row):
                m.submodules[f"pe_{i}_{j}"] = pe
                m.d.comb += pe.enable.eq(pe_enables[i][j])
                if pe.multiplier == "dsp":
                    m.d.comb += pe.dsp_enable.eq(dsp_enables[i][0])

        if ws:
            valid, last, results = self._elaborate_ws(groups, enables["inputs"], pes, lutram)
        else:
            valid, last, results = self._elaborate_os(groups, enables["inputs"], pes, lutram)
        self._elaborate_stall(m, platform, [[leaf] for leaf in enables.values()]
                              + [row + dsp for row, dsp in zip(pe_enables, dsp_enables, strict=True)],
                              enables["outputs"], valid, last, results)
        return m

    def _elaborate_stall(self, m: Module, platform: Any, branches: list[list[Signal]],
                         out_enable: Signal, valid: Value, last: Value,
                         results: list[Value]) -> None:
        """Drive the enables (``branches``: the edge blocks' enables, each alone, and each PE
        row's enables) and the output stream from the de-skewed result row (``valid``,
        ``last``, ``results``: the bottom row's sums, each of its column's shape), which leaves
        the pipeline in every cycle ``out_enable`` is high."""
        leaves = [leaf for branch in branches for leaf in branch]
        outputs = self.outputs
        stages = self.stall_stages
        if not self.backpressure:
            # the consumer takes every row: every register advances in every cycle
            m.d.comb += [leaf.eq(1) for leaf in leaves]
            m.d.comb += [outputs.valid.eq(valid), outputs.payload.last.eq(last)]
            m.d.comb += [outputs.payload.data[j].eq(v) for j, v in enumerate(results)]
            return
        if stages == 0:
            # one combinational enable: the pipeline holds while its result row is not taken
            enable = Signal()
            m.d.comb += enable.eq(~outputs.valid | outputs.ready)
            m.d.comb += [leaf.eq(enable) for leaf in leaves]
            m.d.comb += [outputs.valid.eq(valid), outputs.payload.last.eq(last)]
            m.d.comb += [outputs.payload.data[j].eq(v) for j, v in enumerate(results)]
            return

        # Registered stall: the enable of cycle t is decided in cycle t - stages, from the
        # number of rows in the skid buffer. A row leaves the pipeline in every enabled cycle
        # whose result row is valid; it goes straight out when the buffer is empty and the
        # consumer is ready, else into the buffer. Enabling a cycle only when the buffer holds
        # at most depth - stages rows `stages` cycles before guarantees room for the rows of
        # the cycles in between, and with a ready consumer the buffer stays empty: no bubbles.
        depth = self.skid_depth
        entry = data.StructLayout({
            "data": data.StructLayout({f"c{j}": v.shape() for j, v in enumerate(results)}),
            "last": 1,
        })
        # One entry more than the buffer holds (a power of two: the pointers wrap by
        # themselves), so that the slot at `tail` is always free and the pipeline's row can be
        # written there in every cycle: no write enable to fan out, `tail` moves on a push.
        slots = 1 << depth.bit_length()
        m.submodules.skid = skid = Memory(shape=entry, depth=slots, init=[])
        write = skid.write_port()
        read = skid.read_port(domain="comb")
        count = Signal(range(depth + 1))
        head = Signal(range(slots))
        tail = Signal(range(slots))
        buffered = Signal()                     # count != 0, as a register
        push = Signal()
        pop = Signal()
        pipe = Signal(entry)
        # equal to out_enable in every cycle; from 3 stages on a register of its own, because
        # out_enable is the enable of the whole output de-skew (thousands of loads), and the
        # output handshake from it was the 16x16 compute core's critical path on the ULX3S-85F
        handshake = Signal(name="enable_output_handshake")
        m.d.comb += [
            pipe.data.as_value().eq(Cat(*results)),
            pipe.last.eq(last),
            outputs.valid.eq(buffered | (valid & handshake)),
            pop.eq(buffered & outputs.ready),
            push.eq(valid & handshake & (buffered | ~outputs.ready)),
            write.addr.eq(tail),
            write.data.eq(pipe),
            write.en.eq(1),
            read.addr.eq(head),
        ]
        shown = Signal(entry)
        m.d.comb += shown.eq(Mux(buffered, read.data.as_value(), pipe.as_value()))
        m.d.comb += outputs.payload.last.eq(shown.last)
        for j in range(len(results)):
            m.d.comb += outputs.payload.data[j].eq(shown.data[f"c{j}"])
        with m.If(push):
            m.d.sync += tail.eq(tail + 1)
        with m.If(pop):
            m.d.sync += head.eq(head + 1)
        occupancy = Signal(range(depth + 1))
        m.d.comb += occupancy.eq(count + push - pop)
        m.d.sync += [count.eq(occupancy), buffered.eq(occupancy != 0)]

        # The decision register; from 2 stages on one register per branch (an edge block or a
        # PE row); from 3 on also one per PE, below its row's register, and a chain above the
        # branches for the stages beyond 3. No register drives more than max(rows, cols) + 3.
        decision = _stall_register(m, platform, occupancy <= depth - stages, "stall_root")
        if stages == 1:
            m.d.comb += [leaf.eq(decision) for leaf in [*leaves, handshake]]
            return
        for stage in range(3, stages):
            decision = _stall_register(m, platform, decision, f"stall_chain_{stage}")
        for n, branch in enumerate(branches):
            trunk = _stall_register(m, platform, decision, f"stall_branch_{n}")
            outputs_branch = any(leaf is out_enable for leaf in branch)
            for k, leaf in enumerate(branch):
                if stages == 2:
                    m.d.comb += leaf.eq(trunk)
                else:
                    m.d.comb += leaf.eq(_stall_register(m, platform, trunk, f"stall_leaf_{n}_{k}"))
            if outputs_branch:
                m.d.comb += handshake.eq(trunk if stages == 2 else
                                         _stall_register(m, platform, trunk, "stall_leaf_handshake"))

    def _elaborate_ws(self, groups: dict[str, Module], enable: Signal,
                      pes: list[list[ProcessingElement]], lutram: bool) -> tuple[Value, Value, list[Value]]:
        rows, cols = self.config.rows, self.config.cols
        inputs, weights = self.inputs, self.weights
        m = groups["inputs"]

        # -- handshakes and preload bookkeeping ----------------------------------------------
        hs = ws_handshake(m, rows, enable=enable, inputs_valid=inputs.valid,
                          new_weights=inputs.payload.new_weights, weights_valid=weights.valid,
                          weights_last=weights.payload.last)
        m.d.comb += [inputs.ready.eq(hs.inputs_ready), weights.ready.eq(hs.weights_ready)]
        in_fire, w_fire, swap, weight_row = hs.in_fire, hs.w_fire, hs.swap, hs.weight_row

        # -- weight preload: data down the columns, row selection along the rows -------------
        # A preload row reaches PE (i, j) i + j + 1 cycles after its handshake. The row control
        # walks down the left edge one row per cycle; each PE row captures the row with its own
        # index, and rows the caller does not send are cleared by the first row of a preload.
        ctl_valid = _delay(m, w_fire, 1, "w_valid_0")
        ctl_first = _delay(m, w_fire & (weight_row == 0), 1, "w_first_0")
        ctl_index = _delay(m, weight_row, 1, "w_index_0")
        for i in range(rows):
            if i:
                ctl_valid = _delay(m, ctl_valid, 1, f"w_valid_{i}")
                ctl_first = _delay(m, ctl_first, 1, f"w_first_{i}")
                ctl_index = _delay(m, ctl_index, 1, f"w_index_{i}")
            m.d.comb += [
                pes[i][0].w_capture_in.eq(ctl_valid & (ctl_index == i)),
                pes[i][0].w_zero_in.eq(ctl_valid & ctl_first if i else Const(0)),
            ]
        for j in range(cols):
            m.d.comb += pes[0][j].w_in.eq(_delay(groups["weights"], weights.payload.data[j], 1 + j,
                                                 f"w_skew_{j}", reset_less=True, lutram=lutram))

        # -- input skew ----------------------------------------------------------------------
        # Element i of an input row reaches PE (i, 0) 2 + i cycles after its handshake; the
        # new_weights flag runs one cycle ahead of it (the PE swaps its weight registers then).
        for i in range(rows):
            m.d.comb += [
                pes[i][0].a_in.eq(_delay(m, inputs.payload.data[i], 2 + i, f"a_skew_{i}",
                                         reset_less=True, lutram=lutram)),
                pes[i][0].new_weights_in.eq(_delay(m, swap, 1 + i, f"swap_skew_{i}")),
            ]

        # -- the grid ------------------------------------------------------------------------
        for i in range(rows):
            for j in range(cols):
                pe = pes[i][j]
                if j:
                    left = pes[i][j - 1]
                    m.d.comb += [
                        pe.a_in.eq(left.a_out),
                        pe.new_weights_in.eq(left.new_weights_out),
                        pe.w_capture_in.eq(left.w_capture_out),
                        pe.w_zero_in.eq(left.w_zero_out),
                    ]
                if i:
                    above = pes[i - 1][j]
                    m.d.comb += [
                        pe.w_in.eq(above.w_out),
                        pe.psum_in.eq(above.psum_out),
                    ]

        # -- output de-skew ------------------------------------------------------------------
        # Column j's sum leaves the bottom row j cycles after column 0's; delaying it by
        # C-1-j aligns the row. The result of an input row is valid R+C+4 cycles after it.
        out = groups["outputs"]
        results = [_delay(out, pes[rows - 1][j].psum_out, cols - 1 - j, f"deskew_{j}", reset_less=True,
                          lutram=lutram)
                   for j in range(cols)]
        latency = array_latency(self.config)
        valid = _delay(out, _delay(m, in_fire, 1, "in_fire"), latency - 1, "out_valid")
        last = _delay(out, _delay(m, in_fire & inputs.payload.last, 1, "in_last"), latency - 1,
                      "out_last")
        return valid, last, results

    def _elaborate_os(self, groups: dict[str, Module], enable: Signal,
                      pes: list[list[ProcessingElement]], lutram: bool) -> tuple[Value, Value, list[Value]]:
        rows, cols = self.config.rows, self.config.cols
        inputs = self.inputs
        m = groups["inputs"]

        # -- handshake: a tile's results must have left the result registers (R cycles of
        # drain) before the next tile finishes in them, so `last` beats are >= R cycles apart.
        hs = os_handshake(m, rows, enable=enable, inputs_valid=inputs.valid, last=inputs.payload.last)
        m.d.comb += inputs.ready.eq(hs.inputs_ready)
        in_fire, fire_last = hs.in_fire, hs.fire_last

        # -- operand skew --------------------------------------------------------------------
        # Output row r lives in PE row R-1-r: tiles finish top row first, and the drain shifts
        # down, so the bottom row (output row 0) leaves first. Idle cycles feed zeros to A so
        # that they add nothing to the accumulators.
        for r in range(rows):
            q = rows - 1 - r
            a = Mux(in_fire, inputs.payload.a[r], 0)
            m.d.comb += [
                pes[q][0].a_in.eq(_delay(m, a, 1 + q, f"a_skew_{r}", reset_less=True, lutram=lutram)),
                pes[q][0].last_in.eq(_delay(m, fire_last, 1 + q, f"last_skew_{r}")),
            ]
        for j in range(cols):
            m.d.comb += pes[0][j].b_in.eq(_delay(groups["weights"], inputs.payload.b[j], 1 + j,
                                                 f"b_skew_{j}", reset_less=True, lutram=lutram))

        # -- drain control -------------------------------------------------------------------
        # PE row q's result register takes a tile's sum q + MAC_LATENCY cycles after the last
        # beat's handshake; the bottom row's is visible R + MAC_LATENCY cycles after it. From
        # then on, column 0 shifts for R-1 cycles; row q shifts only in the first q of them (it
        # has passed every row above it down by then), so that it is free when the next tile's
        # sum arrives, which a cooldown of R cycles between `last` beats guarantees.
        drain_start = _delay(m, fire_last, rows + MAC_LATENCY - 1, "drain_start")
        draining = Signal()
        drain_step = Signal(range(rows))
        with m.If(drain_start):
            m.d.sync += [draining.eq(1), drain_step.eq(0)]
        with m.Elif(draining):
            m.d.sync += drain_step.eq(drain_step + 1)
            with m.If(drain_step == rows - 1):
                m.d.sync += draining.eq(0)
        for q in range(rows):
            m.d.comb += pes[q][0].drain_in.eq(draining & (drain_step < q) if q else Const(0))

        # -- the grid ------------------------------------------------------------------------
        for i in range(rows):
            for j in range(cols):
                pe = pes[i][j]
                if j:
                    left = pes[i][j - 1]
                    m.d.comb += [
                        pe.a_in.eq(left.a_out),
                        pe.last_in.eq(left.last_out),
                        pe.drain_in.eq(left.drain_out),
                    ]
                if i:
                    above = pes[i - 1][j]
                    m.d.comb += [
                        pe.b_in.eq(above.b_out),
                        pe.result_in.eq(above.result_out),
                    ]

        # -- output de-skew ------------------------------------------------------------------
        out = groups["outputs"]
        results = [_delay(out, pes[rows - 1][j].result_out, cols - 1 - j, f"deskew_{j}",
                          reset_less=True, lutram=lutram) for j in range(cols)]
        valid = _delay(out, draining, cols - 1, "out_valid")
        last = _delay(out, draining & (drain_step == rows - 1), cols - 1, "out_last")
        return valid, last, results
