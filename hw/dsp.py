"""Lattice ECP5 primitives instantiated directly: DSP blocks with the block's own registers in
use, carry chains whose look-up tables do more than yosys's adders, and the clock network's
buffer for a signal with thousands of loads.

yosys maps a multiply to a combinational MULT18X18D and leaves the registers around it in the
fabric, so the path from a fabric register through the DSP block to the next fabric register
crosses two long routes (DSP blocks sit in fixed rows). :func:`mult18x18d` instantiates the
block with its output register (and optionally its input registers) on the ``sync`` clock, so
that at most one route sits in a register-to-register path through the multiplier.
"""

from typing import Any

from amaranth import Cat, ClockSignal, Const, Instance, Module, Shape, Signal, signed
from amaranth.hdl import Value

__all__ = ["MULT18X18D_INPUT_BITS", "and_pair_sum", "and_pair_sum_shape", "global_buffer", "is_ecp5",
           "mult18x18d"]

#: Width of a MULT18X18D operand: 18 bits signed (so 17 bits unsigned).
MULT18X18D_INPUT_BITS = 18


def is_ecp5(platform: Any) -> bool:
    """Whether ``platform`` is a Lattice ECP5 platform (``platform.family == "ecp5"``): the
    gateware then instantiates that family's primitives."""
    return getattr(platform, "family", None) == "ecp5"


def global_buffer(m: Module, name: str, value: Value) -> Value:
    """``value`` through a DCCA (submodule ``name``), the buffer in front of an ECP5 global
    clock line, returned as the buffer's output.

    For a register's output with thousands of loads, such as a clock domain's reset: nextpnr
    routes a DCCA's output over the global network, into every tile the loads are in, to their
    pins (a flip-flop's LSR input reaches the first eight global lines). The general routing then
    carries no tree spanning the die for it, and the delay to every load is about the same."""
    out = Signal(name=f"{name}_o")
    m.submodules[name] = Instance("DCCA", i_CLKI=value, i_CE=Const(1), o_CLKO=out)
    return out


def mult18x18d(m: Module, name: str, a: Value, b: Value, *, input_registers: bool,
               enable: Value | int = 1) -> Value:
    """Add to ``m`` a MULT18X18D (submodule ``name``) whose output register holds ``a * b``, and
    return that product (signed; below).

    ``a`` and ``b`` become 18-bit signed operands, so each must fit one: at most 18 bits signed
    or 17 unsigned. An unsigned operand is zero-extended (its upper inputs are constants). A
    signed operand narrower than 18 bits goes into the upper inputs, shifted left by the
    difference, with zeros below, rather than sign-extended: nextpnr ties constant DSP inputs
    in the block's interconnect (CIB), so an int8 operand takes 8 routed inputs instead of 18
    (the sign bit's net would otherwise reach 11 of them), which matters where DSP blocks sit
    side by side in their rows. The product is then ``a * b`` shifted left by the sum of the
    shifts, and the returned value is the output register's bits above them: exactly ``a *
    b``, signed, ``36 - shifts`` bits wide (16 for int8 times int8). With ``input_registers`` the
    block also registers its operands (the product is then 2 cycles after them, otherwise 1).
    Every register advances while ``enable`` is high and has no reset (data registers need none).

    Raises :class:`ValueError` for an operand that does not fit.
    """
    inputs = []
    shift = 0
    for operand_name, value in (("a", a), ("b", b)):
        value = Value.cast(value)
        shape = value.shape()
        if shape.width + (not shape.signed) > MULT18X18D_INPUT_BITS:
            raise ValueError(f"operand {operand_name} must fit an 18-bit signed MULT18X18D input (at most 18 "
                             f"bits signed or 17 unsigned), not {shape!r}")
        operand = Signal(shape, name=f"{name}_{operand_name}")
        m.d.comb += operand.eq(value)
        if shape.signed:
            # in the upper inputs, constant zeros below (see the docstring)
            low = MULT18X18D_INPUT_BITS - shape.width
            shift += low
            bits = [Const(0)] * low + [operand[n] for n in range(shape.width)]
        else:
            bits = [operand[n] for n in range(shape.width)]
            bits += [Const(0)] * (MULT18X18D_INPUT_BITS - shape.width)
        inputs.append(bits)
    product = Signal(signed(2 * MULT18X18D_INPUT_BITS), name=f"{name}_p")
    ports: dict[str, Any] = {}
    for register, used in (("INPUTA", input_registers), ("INPUTB", input_registers), ("OUTPUT", True)):
        ports[f"p_REG_{register}_CLK"] = "CLK0" if used else "NONE"
        ports[f"p_REG_{register}_CE"] = "CE0"
        ports[f"p_REG_{register}_RST"] = "RST0"
    a18, b18 = inputs
    ports.update({f"i_A{n}": a18[n] for n in range(MULT18X18D_INPUT_BITS)})
    ports.update({f"i_B{n}": b18[n] for n in range(MULT18X18D_INPUT_BITS)})
    ports.update({f"i_C{n}": Const(0) for n in range(MULT18X18D_INPUT_BITS)})
    ports.update({f"o_P{n}": product[n] for n in range(2 * MULT18X18D_INPUT_BITS)})
    m.submodules[name] = Instance(
        "MULT18X18D",
        p_RESETMODE="SYNC",
        # both operands arrive as 18-bit signed values
        i_SIGNEDA=Const(1), i_SIGNEDB=Const(1),
        i_SOURCEA=Const(0), i_SOURCEB=Const(0),
        i_CLK0=ClockSignal("sync"), i_CE0=enable, i_RST0=Const(0),
        i_CLK1=Const(0), i_CE1=Const(0), i_RST1=Const(0),
        i_CLK2=Const(0), i_CE2=Const(0), i_RST2=Const(0),
        i_CLK3=Const(0), i_CE3=Const(0), i_RST3=Const(0),
        **ports,
    )
    return product[shift:].as_signed()


def _lut4_index(a: int, b: int, c: int, d: int) -> int:
    """Bit of a LUT4's INIT read for inputs A, B, C, D (each 0 or 1): D selects the upper byte."""
    return a | b << 1 | c << 2 | d << 3


def and_pair_sum_shape(a_shape: Shape, negative: str | None = None) -> Shape:
    """The shape of :func:`and_pair_sum`'s result for a multiplicand of ``a_shape``: the
    narrowest that holds every sum (signed when one can be negative).

    Raises :class:`ValueError` for a ``negative`` other than None, ``"low"`` or ``"high"``."""
    if negative not in (None, "low", "high"):
        raise ValueError(f"negative must be None, 'low' or 'high', not {negative!r}")
    a_shape = Shape.cast(a_shape)
    if a_shape.signed:
        a_lo, a_hi = -(1 << (a_shape.width - 1)), (1 << (a_shape.width - 1)) - 1
    else:
        a_lo, a_hi = 0, (1 << a_shape.width) - 1
    term = (min(0, a_lo), max(0, a_hi))                 # a partial product's range
    ranges = {"low": term, "high": (2 * term[0], 2 * term[1])}
    if negative is not None:
        lo, hi = ranges[negative]
        ranges[negative] = (-hi, -lo)
    return Shape.cast(range(ranges["low"][0] + ranges["high"][0], ranges["low"][1] + ranges["high"][1] + 1))


def and_pair_sum(m: Module, name: str, a: Value, low: Value, high: Value, *,
                 negative: str | None = None) -> Value:
    """Add to ``m`` a CCU2C carry chain (submodules ``name_0``, ``name_1``, ...) that computes
    ``(a if low else 0) + 2 * (a if high else 0)``, with the term ``negative`` names (``"low"``,
    ``"high"`` or None) subtracted instead, and return the sum: two partial products of a
    shift-and-add multiplier, added by one chain with the ANDs inside it.

    yosys maps such a sum to AND gates in LUT4s and an adder whose CCU2C look-up tables only
    XOR their two inputs: about three LUT4 positions per bit. Each half of a CCU2C has a LUT4 of
    its own four inputs (A, B, C, D) whose output is the bit's propagate, while its generate is
    the same table read with C = D = 0. So the propagate of bit k is ``(A & B) ^ (C & D)`` with
    the two partial-product bits' operands on the four inputs (the subtracted term's AND
    inverted, on A and B, and a carry of 1 into the chain), and the generate, the table at C = D
    = 0, is then the A-B term, which is the carry out whenever the two terms are equal: one LUT4
    position per bit.

    ``a``: the multiplicand (signed or unsigned); ``low``, ``high``: one bit each. The result is
    exact, of :func:`and_pair_sum_shape`.

    Raises :class:`ValueError` for a ``negative`` other than those three, or ``low``/``high``
    wider than one bit.
    """
    a = Value.cast(a)
    low, high = Value.cast(low), Value.cast(high)
    for bit_name, bit in (("low", low), ("high", high)):
        if len(bit) != 1:
            raise ValueError(f"{bit_name} must be one bit wide, not {len(bit)}")
    shape = a.shape()
    result_shape = and_pair_sum_shape(shape, negative)
    width = result_shape.width

    def a_bit(k: int) -> Value:
        if k < 0:
            return Const(0)
        if k >= shape.width:
            return a[-1] if shape.signed else Const(0)
        return a[k]

    result = Signal(result_shape, name=f"{name}_sum")
    carry: Value = Const(1 if negative else 0)
    sums = []
    for cell in range(-(-width // 2)):
        ports: dict[str, Any] = {}
        for half in range(2):
            k = 2 * cell + half
            terms = {"low": (a_bit(k), low), "high": (a_bit(k - 1), high)}
            # the subtracted term (if any) on A and B: the table read at C = D = 0 is then it
            first = negative or "low"
            second = "high" if first == "low" else "low"
            (pa, pb), (pc, pd) = terms[first], terms[second]
            invert = negative is not None
            init = 0
            for index in range(16):
                va, vb, vc, vd = (index >> 0) & 1, (index >> 1) & 1, (index >> 2) & 1, (index >> 3) & 1
                if ((va & vb) ^ invert) ^ (vc & vd):
                    init |= 1 << _lut4_index(va, vb, vc, vd)
            ports[f"p_INIT{half}"] = Const(init, 16)
            ports[f"p_INJECT1_{half}"] = "NO"
            ports.update({f"i_A{half}": pa, f"i_B{half}": pb, f"i_C{half}": pc, f"i_D{half}": pd})
            out = Signal(name=f"{name}_s{k}")
            ports[f"o_S{half}"] = out
            sums.append(out)
        cout = Signal(name=f"{name}_c{cell}")
        m.submodules[f"{name}_{cell}"] = Instance("CCU2C", i_CIN=carry, o_COUT=cout, **ports)
        carry = cout
    m.d.comb += result.eq(Cat(*sums[:width]))
    return result
