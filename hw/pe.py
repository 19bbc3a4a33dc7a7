"""The processing element (PE): one multiply-accumulate cell of the systolic array.

A PE has no handshakes. Every port is a plain signal that moves one PE per clock cycle, so that
a row or column of PEs forms a pipeline; :class:`~systolic.hw.array.SystolicArray` wires them into
a grid, skews the operands on the way in and stalls every register with one global enable when
the output stalls (the PE's ``enable`` port). The multiplier is a :class:`PipelinedMultiplier`
(operand, product and routing registers: :data:`MULTIPLIER_LATENCY` = 3 cycles), so that a PE
maps onto one DSP block plus an adder and nothing slow shares a cycle with the DSP. A multiplier
in logic takes its operands a cycle late instead, from copies of the registers that pass them on
(``a_out``, and ``b_out`` or the active weight), in two stages: the same 3 cycles from ``a_in``.

Weight-stationary (``dataflow = "ws"``), PE at row i (reduction index k) and column j (output
channel n)::

             w_in  psum_in              cycle t:    new_weights_in: active <= shadow
               |     |                  cycle t+1:  a_in (the tile's first element) and active
    a_in ---> [ shadow | active ] ---> a_out         enter the multiplier
    new_weights_in  ...  new_weights_out cycle t+4: psum_out <= psum_in + product
    w_capture_in / w_zero_in --> ..._out any cycle:  shadow <= w_in if w_capture_in,
               |     |                                        0    if w_zero_in
             w_out psum_out

``a``, ``new_weights``, ``w_capture`` and ``w_zero`` travel to the right, ``w`` (the weight preload
data) and ``psum`` travel down. The shadow register takes the next tile's weights while the active
register computes the current tile: that is the "second weight register per PE" of docs/isa.md.
``new_weights`` runs one cycle ahead of the operand, so that the active register feeds the DSP
input with no select logic in between.

Output-stationary (``dataflow = "os"``)::

    cycle t:    a_in, b_in (and last_in) enter the multiplier
    cycle t+3:  acc + product -> result (and acc <= 0)  if the beat was the tile's last
                acc <= acc + product                     otherwise
    any cycle:  result <= result_in                      if drain_in (shift one row down)

``a``, ``last`` and ``drain`` travel to the right, ``b`` and ``result`` travel down. The result
register holds the finished tile while the next one accumulates; the array shifts the result
registers of a column down (``drain``) to read them out.

All widths come from the :class:`~systolic.hw.config.AcceleratorConfig`: input elements are
``input_bits`` wide, weights ``weight_bits``, partial sums and accumulators ``acc_bits``, each
signed as the config says. Sums wrap modulo 2**acc_bits, as docs/isa.md specifies; a WS PE's
partial sums may be narrower (``psum_shape``) where the array knows the exact sum fits.
"""

from __future__ import annotations

from typing import Any

from amaranth import Cat, Const, Module, Mux, Shape, Signal, unsigned
from amaranth.hdl import EnableInserter
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .bankram import DP16KDPort, dp16kd
from .config import BRAM_TABLE_ENTRIES, AcceleratorConfig, int_range, quarter_square_span
from .dsp import MULT18X18D_INPUT_BITS, and_pair_sum, fabric_copy, is_ecp5, mult18x18d

__all__ = ["ProcessingElement", "PipelinedMultiplier", "element_shapes", "logic_latency_fits",
           "MAC_LATENCY", "MULTIPLIER_KINDS", "MULTIPLIER_LATENCY"]

#: How a :class:`PipelinedMultiplier` makes its product: a DSP block, a quarter-square table in
#: block RAM, or logic.
MULTIPLIER_KINDS = ("dsp", "bram", "logic")

#: Cycles from operands at a :class:`PipelinedMultiplier`'s inputs to their product at its
#: output: operand registers, a product register and a register for the route to the adder.
MULTIPLIER_LATENCY = 3

#: Cycles from an operand at a PE's ``a_in`` to the sum that includes its product being visible
#: at ``psum_out`` (WS) or in ``result_out`` (OS): the multiplier, then the sum register.
MAC_LATENCY = MULTIPLIER_LATENCY + 1


def element_shapes(config: AcceleratorConfig) -> tuple[Shape, Shape, Shape]:
    """The Amaranth shapes of an input element, a weight element and an accumulator element
    (``input_bits``, ``weight_bits`` and ``acc_bits`` wide, signed as the config says)."""
    if not isinstance(config, AcceleratorConfig):
        raise TypeError(f"config must be an AcceleratorConfig, not {config!r}")
    return (Shape(config.input_bits, config.input_signed),
            Shape(config.weight_bits, config.weight_signed),
            Shape(config.acc_bits, config.acc_signed))


def _shape_range(shape: Shape) -> tuple[int, int]:
    return int_range(shape.width, shape.signed)


def logic_latency_fits(b_shape: Shape, latency: int) -> bool:
    """Whether a logic multiplier's adder tree over ``b_shape``'s partial products (one per bit
    of ``b``) fits ``latency`` register stages at two levels a stage."""
    return (Shape.cast(b_shape).width - 1).bit_length() <= 2 * latency


class PipelinedMultiplier(wiring.Component):
    """``product`` = ``a`` * ``b``, :data:`MULTIPLIER_LATENCY` (3) cycles after the operands
    (``latency``, below, for a logic multiplier):
    both operands are registered, then the product, then the product again (logic: three stages
    of an adder tree). Every register advances only while ``enable`` is high.

    Generic platforms get the registers as logic (yosys maps the multiply to a DSP block). On a
    Lattice ECP5 platform (``platform.family == "ecp5"``) the first two stages are the input and
    output registers of one MULT18X18D, so that no fabric routing sits in the multiplier's path
    (with the combinational MULT18X18D that yosys infers, a 4x4 array reached 112-138 MHz), and the
    third is a fabric register, because DSP blocks sit in fixed rows and the route from one to
    its PE's adder takes up to 4 ns on an 85F.

    ``kind`` (one of :data:`MULTIPLIER_KINDS`) picks how the product is made; the latency and
    every product are the same for all three:

    * ``"dsp"`` (default): a DSP block, as above.
    * ``"bram"``: a quarter-square table in block RAM, for devices with fewer DSP blocks than PEs
      and block RAM to spare (``AcceleratorConfig.array_bram_multipliers``): ``a * b =
      q(a + b) - q(a - b)`` with ``q(x) = floor(x**2 / 4)`` (exact: ``a + b`` and ``a - b`` have
      the same parity). One memory of ``q`` holds every value of ``a + b`` and ``a - b`` (at most
      :data:`~systolic.hw.config.BRAM_TABLE_ENTRIES`, indexed by the value modulo the memory's
      depth: 512 entries of 15 bits for int8 times int8, 1024 of 16 bits for uint8 times uint8),
      read on two ports: the sum and the difference of the operands (from the PE's registers) are
      its addresses, the memory reads at the first edge, its data is registered at the second,
      the difference of the two at the third. Generic platforms get an amaranth ``Memory`` and
      two registers. On ECP5 (tables of at most 16-bit entries: every 8-bit operand pair) it is
      one DP16KD instance (:func:`~systolic.hw.bankram.dp16kd`, the table in its INITVAL
      parameters) whose ports read through their output registers (REGMODE "OUTREG") for the
      second stage: a block RAM's clock-to-output (5.8 ns at speed grade 6) with a route to a
      fabric register limited a 16x16 array to 107 MHz. Two carry chains for the addresses and
      one for the difference: 18 CCU2C and 16 flip-flops for int8.
    * ``"logic"``: built from logic on every platform, so that a device with fewer DSP blocks
      than PEs can hold the array (``AcceleratorConfig.array_lut_multipliers``): the product is
      the sum of the partial products ``a * b[i] * 2**i`` (the top one negative for a
      signed ``b``), with no multiply operator for yosys to map to a DSP block, summed by a tree of
      two-input adders whose levels fill the 3 register stages at most two at a time (for 8-bit
      ``b``: two levels, one, then a plain register), so the latency is the same 3 cycles. The
      operands are not registered first (the PE's operands come from registers already): each
      stage is at most the AND of a partial product and two carry chains. On ECP5 each pair of
      partial products is added by one CCU2C chain that also makes their ANDs
      (:func:`~systolic.hw.dsp.and_pair_sum`): 36 CCU2C, no LUT4 and 57 flip-flops for int8 times
      int8, where yosys makes the ANDs in LUT4s of their own. A PE builds it with ``latency=2``
      (below).

    ``latency`` (``"logic"`` only; default :data:`MULTIPLIER_LATENCY`): 2 makes the tree two
    stages (for 8-bit ``b``: two levels, then one, into the product register), for a caller
    whose operands are a cycle late already (a PE's copies of ``a_out`` and ``b_out``): 16
    flip-flops fewer for int8 (41 instead of 57). It needs a tree of at most four
    levels (``b`` at most 16 bits wide, :func:`logic_latency_fits`).

    ``a``: ``In(a_shape)``; ``b``: ``In(b_shape)``; ``product``: ``Out`` of the exact product
    shape (a_bits + b_bits wide, one more when exactly one operand is signed);
    ``enable``: ``In(1, init=1)``.

    Raises :class:`ValueError` for an unknown ``kind``, for operands wider than the 18 bits of a
    DSP multiplier input (17 for an unsigned operand), for ``"bram"`` operands whose sums and
    differences take more values than a table holds, and for a ``latency`` other than 3, or 2
    for a ``"logic"`` multiplier whose tree fits two stages.
    """

    def __init__(self, a_shape: Shape, b_shape: Shape, *, kind: str = "dsp",
                 latency: int = MULTIPLIER_LATENCY) -> None:
        if kind not in MULTIPLIER_KINDS:
            raise ValueError(f"kind must be one of {', '.join(map(repr, MULTIPLIER_KINDS))}, not {kind!r}")
        self.kind = kind
        a_shape, b_shape = Shape.cast(a_shape), Shape.cast(b_shape)
        for name, shape in (("a_shape", a_shape), ("b_shape", b_shape)):
            if shape.width + (not shape.signed) > MULT18X18D_INPUT_BITS:
                raise ValueError(f"{name} must fit an 18-bit signed multiplier input "
                                 f"(at most 18 bits signed or 17 unsigned), not {shape!r}")
        if latency != MULTIPLIER_LATENCY:
            if isinstance(latency, bool) or latency != 2 or kind != "logic":
                raise ValueError(f"latency must be {MULTIPLIER_LATENCY}, or 2 for a 'logic' multiplier, "
                                 f"not {latency!r} for {kind!r}")
            if not logic_latency_fits(b_shape, 2):
                raise ValueError(f"a 'logic' multiplier of latency 2 adds at most 16 partial products "
                                 f"(two adder levels a stage); b_shape {b_shape!r} gives {b_shape.width}")
        self.latency = latency
        if kind == "bram":
            lo, hi = quarter_square_span(_shape_range(a_shape), _shape_range(b_shape))
            if hi - lo + 1 > BRAM_TABLE_ENTRIES:
                raise ValueError(f"a 'bram' multiplier's table holds at most {BRAM_TABLE_ENTRIES} "
                                 f"sums and differences of its operands; {a_shape!r} and {b_shape!r} "
                                 f"give {hi - lo + 1}")
        self._a_shape, self._b_shape = a_shape, b_shape
        product_shape = (Const(0, a_shape) * Const(0, b_shape)).shape()
        super().__init__({
            "a": In(a_shape),
            "b": In(b_shape),
            "product": Out(product_shape),
            "enable": In(1, init=1),
        })

    def elaborate(self, platform) -> Module:
        m = Module()
        if self.kind == "logic":
            return self._elaborate_logic(m, platform)
        if self.kind == "bram":
            return self._elaborate_bram(m, platform)
        if is_ecp5(platform):
            # operand and product registers: the block's own (hw/dsp.py), then a fabric register
            p = mult18x18d(m, "mult", self.a, self.b, input_registers=True, enable=self.enable)
            product = Signal.like(self.product, reset_less=True)
            m.d.comb += self.product.eq(product)
            with m.If(self.enable):
                m.d.sync += product.eq(p[:len(self.product)])
            return m

        a = Signal(self._a_shape, reset_less=True)
        b = Signal(self._b_shape, reset_less=True)
        product = Signal.like(self.product, reset_less=True)
        result = Signal.like(self.product, reset_less=True)
        m.d.comb += self.product.eq(result)
        with m.If(self.enable):
            m.d.sync += [
                a.eq(self.a),
                b.eq(self.b),
                product.eq(a * b),
                result.eq(product),
            ]
        return m

    def _elaborate_bram(self, m: Module, platform: Any) -> Module:
        lo, hi = quarter_square_span(_shape_range(self._a_shape), _shape_range(self._b_shape))
        index_bits = (hi - lo).bit_length()
        depth = 1 << index_bits
        # entry x mod depth holds q(x) for the one x in [lo, hi] of that residue
        table = [0] * depth
        for x in range(lo, hi + 1):
            table[x % depth] = x * x // 4
        width = max(table).bit_length()
        # (an assignment extends an address by its own sign, then keeps index_bits: x mod depth)
        addresses = [Signal(index_bits, name=f"address_{n}") for n in range(2)]
        m.d.comb += [addresses[0].eq(self.a + self.b), addresses[1].eq(self.a - self.b)]
        if is_ecp5(platform) and width <= 16:
            # one DP16KD, both ports read through their output registers (stage 2), whose
            # clock-to-output is far shorter than the block RAM's
            port = [DP16KDPort(addr=address, enable=self.enable, output_register=True,
                               output_enable=self.enable) for address in addresses]
            squares = dp16kd(m, "table", a=port[0], b=port[1], init=table)
        else:
            m.submodules.table = memory = Memory(shape=unsigned(width), depth=depth, init=table)
            ports = [memory.read_port(domain="sync"), memory.read_port(domain="sync")]
            # data registers have no reset (see _elaborate_logic)
            squares = [Signal(width, name=f"square_{n}", reset_less=True) for n in range(2)]
            for port, address, square in zip(ports, addresses, squares, strict=True):
                m.d.comb += [port.addr.eq(address), port.en.eq(self.enable)]
                with m.If(self.enable):
                    m.d.sync += square.eq(port.data)
        product = Signal.like(self.product, reset_less=True)
        m.d.comb += self.product.eq(product)
        with m.If(self.enable):
            # the exact product fits the product's shape: truncating the difference is harmless
            m.d.sync += product.eq(squares[0][:width] - squares[1][:width])
        return m

    def _elaborate_logic(self, m: Module, platform: Any) -> Module:
        # Partial products a * b[i] * 2**i (the top one subtracted for a signed b), summed by a
        # tree of two-input adders whose levels fill the register stages (`latency`) two at a
        # time (8-bit weights, three stages: two levels, one, then a register for the route to
        # the PE's adder; two stages: two levels, then one): two short carry chains (about 10
        # bits each for int8) per stage stay far below 10 ns, and each level folded into the one
        # before saves its register (81 -> 57 flip-flops for int8, against one level per stage;
        # 41 in two stages). The operands come straight from registers of the PE (``a_in`` and
        # the active weight; with two stages the PE's copies of ``a_out`` and of the active
        # weight, or of ``b_out``), so there is no operand register stage. Each node is (value, weight
        # shift, sign); sums are kept unshifted relative to their lowest term, so the pipeline
        # registers stay narrow. Data registers have no reset: a value matters only with a valid
        # operand, and the control that marks valid operands is reset (fewer reset and routing
        # nets in a large array).
        # On ECP5 the first level adds each pair of partial products in one CCU2C chain whose
        # look-up tables also make the ANDs (hw/dsp.py ``and_pair_sum``): one LUT4 position per
        # bit instead of about three.
        width = self._b_shape.width
        nodes: list[tuple[Any, int, int]] = []
        for i in range(width):
            negative = self._b_shape.signed and i == width - 1
            nodes.append((Mux(self.b[i], self.a, 0), i, -1 if negative else 1))

        def add_pair(n: int, first: bool) -> tuple[Any, int, int]:
            low, high = nodes[n], nodes[n + 1]
            if first and is_ecp5(platform):         # two partial products (shifts n and n + 1)
                negative = "low" if low[2] < 0 else "high" if high[2] < 0 else None
                return and_pair_sum(m, f"pp_{n}", self.a, self.b[n], self.b[n + 1], negative=negative), n, 1
            return _add_nodes(low, high)

        levels = (width - 1).bit_length()           # adder levels of the tree
        first = True
        for stage in range(self.latency):
            stage_levels = min(levels, 2)
            levels -= stage_levels
            for _ in range(stage_levels):
                nodes = [add_pair(n, first) if n + 1 < len(nodes) else nodes[n]
                         for n in range(0, len(nodes), 2)]
                first = False
            if stage == self.latency - 1:
                (value, shift, sign), = nodes
                total = value if sign > 0 else -value
                product = Signal.like(self.product, reset_less=True)
                m.d.comb += self.product.eq(product)
                with m.If(self.enable):
                    # the exact product fits the product's shape: truncating the sum is harmless
                    m.d.sync += product.eq(total << shift)
                break
            registered = []
            for n, (value, shift, sign) in enumerate(nodes):
                reg = Signal(value.shape(), name=f"sum_{stage + 1}_{n}", reset_less=True)
                with m.If(self.enable):
                    m.d.sync += reg.eq(value)
                registered.append((reg, shift, sign))
            nodes = registered
        return m


def _add_nodes(low: tuple[Any, int, int], high: tuple[Any, int, int]) -> tuple[Any, int, int]:
    """Sum of two nodes (value, weight shift, sign) of the logic multiplier's adder tree, as one
    addition or subtraction (at most one of them is negative: the top partial product)."""
    (x, x_shift, x_sign), (y, y_shift, y_sign) = low, high
    y = y << (y_shift - x_shift)
    if x_sign == y_sign:
        return x + y, x_shift, x_sign
    return (x - y, x_shift, 1) if x_sign > 0 else (y - x, x_shift, 1)


class ProcessingElement(wiring.Component):
    """One MAC cell of the systolic array, for the config's dataflow.

    Ports of every PE: ``enable`` (``In(1, init=1)``): the PE's registers advance only while it
    is high (the array's global stall). A PE whose multiplier is a DSP block also has
    ``dsp_enable`` (``In(1, init=1)``), which must equal ``enable`` in every cycle: on ECP5 it is
    the MULT18X18D's clock enable. The array drives it from a register shared by a PE row,
    because the four multipliers of an ECP5 DSP block share four clock-enable lines: with a
    register per PE (``enable``), nextpnr's analytic placer could not legalise a 16x16 SoC whose
    other DSP blocks (the SFU's) have enables of their own.

    Ports of a weight-stationary PE (``config.dataflow == "ws"``):

    ``a_in``, ``a_out``: input element (activation), ``input_bits``; ``a_out`` is ``a_in`` one
    cycle later, for the PE to the right.
    ``new_weights_in``, ``new_weights_out``: 1 one cycle before the first input element of a tile
    that uses the weights in the shadow register (they become active); passed right like ``a``.
    ``w_in``, ``w_out``: weight preload data, ``weight_bits``; passed down one cycle later.
    ``w_capture_in``, ``w_capture_out``: the shadow register takes ``w_in``; passed right.
    ``w_zero_in``, ``w_zero_out``: the shadow register becomes 0 (a preload row the caller did
    not send); passed right.
    ``psum_in``, ``psum_out``: partial sum from the PE above and to the PE below, of shape
    ``psum_shape`` (default: ``acc_bits``, signed as ``acc_signed``); ``psum_out`` = ``psum_in`` +
    a * w, wrapped to that shape, :data:`MAC_LATENCY` cycles after ``a_in``. The array gives each
    row the narrowest shape that holds the exact sum of the products above it (see
    :func:`~systolic.hw.array.column_sum_shape`), so that nothing wraps before the bottom.

    Ports of an output-stationary PE (``config.dataflow == "os"``):

    ``a_in``, ``a_out``: element of A, ``input_bits``, passed right.
    ``b_in``, ``b_out``: element of B, ``weight_bits``, passed down.
    ``last_in``, ``last_out``: 1 with the last pair of elements of a tile; passed right.
    ``drain_in``, ``drain_out``: shift the result register one row down this cycle; passed right.
    ``result_in``, ``result_out``: result register of the PE above / of this PE, ``acc_bits``;
    the tile's sum lands in ``result_out`` :data:`MAC_LATENCY` cycles after its last operands.

    ``multiplier``: the multiplier's kind, one of :data:`MULTIPLIER_KINDS` (a DSP block, a
    quarter-square table in block RAM, or logic; see :class:`PipelinedMultiplier`); the timing is
    the same.

    Raises :class:`TypeError` when ``config`` is not an :class:`AcceleratorConfig`, and
    :class:`ValueError` for an unknown ``multiplier``, or a ``psum_shape`` wider than
    ``acc_bits`` or given to an output-stationary PE.
    """

    def __init__(self, config: AcceleratorConfig, *, multiplier: str = "dsp",
                 psum_shape: Shape | None = None) -> None:
        input_shape, weight_shape, acc_shape = element_shapes(config)
        if multiplier not in MULTIPLIER_KINDS:
            raise ValueError(f"multiplier must be one of {', '.join(map(repr, MULTIPLIER_KINDS))}, "
                             f"not {multiplier!r}")
        if psum_shape is None:
            psum_shape = acc_shape
        else:
            if config.dataflow != "ws":
                raise ValueError(f"psum_shape needs dataflow 'ws' (an output-stationary PE keeps "
                                 f"its sums in acc_bits), not {config.dataflow!r}")
            psum_shape = Shape.cast(psum_shape)
            if not 1 <= psum_shape.width <= config.acc_bits:
                raise ValueError(f"psum_shape must be 1 to acc_bits ({config.acc_bits}) bits wide, "
                                 f"not {psum_shape!r}")
        self.config = config
        self.multiplier = multiplier
        self.psum_shape = psum_shape
        members = {"enable": In(1, init=1)}
        if multiplier == "dsp":
            members["dsp_enable"] = In(1, init=1)
        if config.dataflow == "ws":
            members.update({
                "a_in": In(input_shape), "a_out": Out(input_shape),
                "new_weights_in": In(1), "new_weights_out": Out(1),
                "w_in": In(weight_shape), "w_out": Out(weight_shape),
                "w_capture_in": In(1), "w_capture_out": Out(1),
                "w_zero_in": In(1), "w_zero_out": Out(1),
                "psum_in": In(psum_shape), "psum_out": Out(psum_shape),
            })
        else:
            members.update({
                "a_in": In(input_shape), "a_out": Out(input_shape),
                "b_in": In(weight_shape), "b_out": Out(weight_shape),
                "last_in": In(1), "last_out": Out(1),
                "drain_in": In(1), "drain_out": Out(1),
                "result_in": In(acc_shape), "result_out": Out(acc_shape),
            })
        super().__init__(members)

    def elaborate(self, platform) -> Any:
        input_shape, weight_shape, _ = element_shapes(self.config)
        m = Module()
        # A logic multiplier takes its operands a cycle late, from copies of the registers that
        # pass them on (a_out, and b_out or the active weight), in a tree of one stage fewer.
        late = self.multiplier == "logic" and logic_latency_fits(weight_shape, MULTIPLIER_LATENCY - 1)
        m.submodules.multiplier = multiplier = PipelinedMultiplier(
            input_shape, weight_shape, kind=self.multiplier,
            latency=MULTIPLIER_LATENCY - 1 if late else MULTIPLIER_LATENCY)
        # the DSP block's clock enable (docstring); the multiplier's fabric register, if any,
        # is under the cell's enable below as well
        m.d.comb += multiplier.enable.eq(self.dsp_enable if self.multiplier == "dsp" else self.enable)
        if self.config.dataflow == "ws":
            self._elaborate_ws(m, multiplier, late, platform)
        else:
            self._elaborate_os(m, multiplier, late, platform)
        # One enable for every register of the cell (the multiplier takes it as a port, since
        # a vendor primitive's clock enable is not rewritten by EnableInserter).
        return EnableInserter(self.enable)(m)

    def _elaborate_ws(self, m: Module, multiplier: PipelinedMultiplier, late: bool, platform: Any) -> None:
        _, weight_shape, _ = element_shapes(self.config)
        shadow = Signal(weight_shape)
        active = Signal(weight_shape)

        # new_weights arrives one cycle ahead of the tile's first element, so that the active
        # register feeds the multiplier with no select logic on the way (a DSP input).
        with m.If(self.new_weights_in):
            m.d.sync += active.eq(shadow)
        # data registers without reset (the weights keep theirs: they read as 0 after a reset)
        a_out = Signal.like(self.a_out, reset_less=True)
        w_out = Signal.like(self.w_out, reset_less=True)
        # A DSP PE's sum register keeps its wire (yosys `keep`) where yosys infers the DSP block
        # (not ECP5, whose MULT18X18D is instantiated): synth_ice40's ice40_dsp pass otherwise
        # may take the register both as the output register of this PE's SB_MAC16 and as the
        # C/D input register of the one below, whose accumulator input is then left undriven
        # (constant 0: the PE's product lost; seen on the iCEBreaker preset, docs/arch-array.md).
        # With `keep` on the register's output the pass does not take it as an input register.
        keep = {"keep": 1} if self.multiplier == "dsp" and not is_ecp5(platform) else {}
        psum_out = Signal.like(self.psum_out, reset_less=True, attrs=keep)
        if late:
            # the operand pair a cycle late: a_out, and the active weight's copy (its own
            # register: the active one may change in the very next cycle, a one-row tile). No
            # reset: it equals `active` from the first cycle after a reset, and an element
            # reaches the PE two cycles after its handshake at the earliest.
            # The element is a copy of a_out of its own (a_out's loads are the next PE, which may
            # be a DSP PE across the die from this one's carry chains).
            active_late = Signal(weight_shape, reset_less=True)
            m.d.sync += active_late.eq(active)
            a_late = fabric_copy(m, "a_late", self.a_in, enable=self.enable, platform=platform)
            m.d.comb += [multiplier.a.eq(a_late), multiplier.b.eq(active_late)]
        else:
            m.d.comb += [multiplier.a.eq(self.a_in), multiplier.b.eq(active)]
        m.d.comb += [self.a_out.eq(a_out), self.w_out.eq(w_out), self.psum_out.eq(psum_out)]
        # wraps to the partial sum's width (acc_bits, or a width that holds the column's exact sum)
        m.d.sync += psum_out.eq(self.psum_in + multiplier.product)

        with m.If(self.w_capture_in):
            m.d.sync += shadow.eq(self.w_in)
        with m.Elif(self.w_zero_in):
            m.d.sync += shadow.eq(0)

        m.d.sync += [a_out.eq(self.a_in), w_out.eq(self.w_in)]
        self._pass_on(m, platform, "new_weights", "w_capture", "w_zero")

    def _elaborate_os(self, m: Module, multiplier: PipelinedMultiplier, late: bool, platform: Any) -> None:
        _, _, acc_shape = element_shapes(self.config)
        last = Signal(MULTIPLIER_LATENCY)       # `last` beside the multiplier's stages
        acc = Signal(acc_shape)
        total = Signal(acc_shape)

        # the operand pair a cycle late is a copy of the pair passed on, a_out and b_out, of its
        # own (those go to the next PEs, which may be DSP PEs across the die from this one)
        if late:
            m.d.comb += [
                multiplier.a.eq(fabric_copy(m, "a_late", self.a_in, enable=self.enable, platform=platform)),
                multiplier.b.eq(fabric_copy(m, "b_late", self.b_in, enable=self.enable, platform=platform)),
            ]
        else:
            m.d.comb += [multiplier.a.eq(self.a_in), multiplier.b.eq(self.b_in)]
        m.d.comb += total.eq(acc + multiplier.product)                 # wraps to acc_bits
        m.d.sync += last.eq(Cat(self.last_in, last[:-1]))
        with m.If(last[-1]):
            m.d.sync += acc.eq(0)
        with m.Else():
            m.d.sync += acc.eq(total)

        # The array never asks for a capture and a drain shift of the same PE in one cycle.
        with m.If(last[-1]):
            m.d.sync += self.result_out.eq(total)
        with m.Elif(self.drain_in):
            m.d.sync += self.result_out.eq(self.result_in)

        m.d.sync += [self.a_out.eq(self.a_in), self.b_out.eq(self.b_in)]
        self._pass_on(m, platform, "last", "drain")

    def _pass_on(self, m: Module, platform: Any, *names: str) -> None:
        """The control bits ``<name>_in`` passed on to ``<name>_out`` through a register each
        (reset, under the PE's enable) that yosys does not merge (:func:`~systolic.hw.dsp.
        fabric_copy`): the array skews one signal along the grid, so the registers of all the PEs
        on one anti-diagonal hold the same value, and merged into one they would drive PEs far
        apart (on the lean 16x16 SoC one register drove the weight swaps of PEs across the die:
        14.8 ns of routing, docs/boards.md)."""
        for name in names:
            passed = fabric_copy(m, f"{name}_passed", getattr(self, f"{name}_in"), enable=self.enable,
                                 platform=platform, reset=True)
            m.d.comb += getattr(self, f"{name}_out").eq(passed)
