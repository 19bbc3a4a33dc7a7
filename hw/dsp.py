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

from amaranth import Cat, ClockSignal, Const, Instance, Module, Mux, ResetSignal, Shape, Signal, signed
from amaranth.hdl import Value
from amaranth.lib.cdc import AsyncFFSynchronizer

from .config import int_range

__all__ = ["COPY_GROUP_BITS", "MULT18X18D_INPUT_BITS", "and_pair_sum", "and_pair_sum_shape", "fabric_copy",
           "fabric_register", "global_buffer", "group_enables", "is_ecp5", "mult18x18d", "reset_synchronizer",
           "reset_synchronizer_copies", "select_add"]

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
    a_lo, a_hi = int_range(a_shape.width, a_shape.signed)
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

    # the subtracted term (if any) on A and B: the table read at C = D = 0 is then it
    first = negative or "low"
    second = "high" if first == "low" else "low"
    invert = negative is not None
    table = _table(lambda a, b, c, d: ((a & b) ^ invert) ^ (c & d))
    bits = []
    for k in range(width):
        terms = {"low": (a_bit(k), low), "high": (a_bit(k - 1), high)}
        bits.append((table, (*terms[first], *terms[second])))
    result = Signal(result_shape, name=f"{name}_sum")
    m.d.comb += result.eq(Cat(*_ccu2c_chain(m, name, bits, 1 if negative else 0)))
    return result


def _ccu2c_chain(m: Module, name: str, bits: list[tuple[int, tuple[Value, Value, Value, Value]]],
                 carry_in: int) -> list[Signal]:
    """A chain of CCU2C (submodules ``name_0``, ...) whose bit k has the LUT4 table ``bits[k][0]``
    on the inputs ``bits[k][1]`` (A, B, C, D), carry in ``carry_in``; returns the sum bits. A bit
    of the last cell beyond ``bits`` has an all-zero table on constant inputs."""
    sums = []
    carry: Value = Const(carry_in)
    padded = bits + [(0, (Const(0),) * 4)] * (len(bits) % 2)
    for cell in range(len(padded) // 2):
        ports: dict[str, Any] = {}
        for half in range(2):
            init, (pa, pb, pc, pd) = padded[2 * cell + half]
            out = Signal(name=f"{name}_s{2 * cell + half}")
            ports.update({f"p_INIT{half}": Const(init, 16), f"p_INJECT1_{half}": "NO",
                          f"i_A{half}": pa, f"i_B{half}": pb, f"i_C{half}": pc, f"i_D{half}": pd,
                          f"o_S{half}": out})
            sums.append(out)
        cout = Signal(name=f"{name}_c{cell}")
        m.submodules[f"{name}_{cell}"] = Instance("CCU2C", i_CIN=carry, o_COUT=cout, **ports)
        carry = cout
    return sums[:len(bits)]


def _table(function: Any) -> int:
    """The LUT4 INIT of ``function(a, b, c, d)`` (each 0 or 1, returning 0 or 1)."""
    return sum(1 << _lut4_index(a, b, c, d) for a in (0, 1) for b in (0, 1) for c in (0, 1) for d in (0, 1)
               if function(a, b, c, d))


def select_add(m: Module, name: str, select: Value, when_set: Value, when_clear: Value, addend: Value,
               *, width: int, platform: Any) -> Value:
    """``(when_set if select else when_clear) + addend``, wrapped to ``width`` bits (each operand
    extended by its own shape), for an accumulator whose newest result is forwarded into its
    adder.

    On ECP5 one CCU2C chain (submodules ``name_0``, ...) also makes the select: bit k's table,
    on ``addend[k]``, ``select``, ``when_set[k]``, ``when_clear[k]`` (A to D), is ``A ^ (B ? C :
    D)``, the bit's propagate, and read at C = D = 0 it is A, the addend's bit, which is the carry
    out whenever the two bits are equal (:func:`and_pair_sum` explains the generate). So
    ``select`` reaches the chain with no LUT before it, where yosys puts a LUT level (the select)
    between it and an adder whose tables only XOR. Elsewhere: ``Mux`` and ``+``.

    Returns an unsigned value of ``width`` bits. Raises :class:`ValueError` for a ``select``
    wider than one bit or a ``width`` below 1."""
    select, when_set, when_clear, addend = map(Value.cast, (select, when_set, when_clear, addend))
    if len(select) != 1:
        raise ValueError(f"select must be one bit wide, not {len(select)}")
    if not isinstance(width, int) or width < 1:
        raise ValueError(f"width must be a positive integer, not {width!r}")
    if not is_ecp5(platform):
        total = Signal(width, name=f"{name}_sum")
        m.d.comb += total.eq(Mux(select, when_set, when_clear) + addend)
        return total

    def bit(value: Value, k: int) -> Value:
        if k < len(value):
            return value[k]
        return value[-1] if value.shape().signed else Const(0)

    table = _table(lambda a, b, c, d: a ^ (c if b else d))
    bits = [(table, (bit(addend, k), select, bit(when_set, k), bit(when_clear, k))) for k in range(width)]
    total = Signal(width, name=f"{name}_sum")
    m.d.comb += total.eq(Cat(*_ccu2c_chain(m, name, bits, 0)))
    return total


def _trellis_ff(m: Module, name: str, value: Value, reg: Value, *, enable: Value | None,
                init: int | None, domain: str = "sync", async_set: Value | None = None) -> None:
    """Submodule ``name``: a TRELLIS_FF on ``domain``'s clock from ``value`` to ``reg`` (one bit),
    its clock enable ``enable`` (None: always enabled), its LSR the domain's reset, setting it to
    ``init`` with priority over the enable (None: no reset). ``async_set``: the LSR is that
    signal instead, which sets the flip-flop at once, whatever the clock (``init`` is then 1)."""
    if async_set is not None and init != 1:
        raise ValueError(f"an asynchronous set needs init=1, not {init!r}")
    lsr = Const(0, 1) if init is None else ResetSignal(domain) if async_set is None else async_set
    m.submodules[name] = Instance(
        "TRELLIS_FF", p_GSR="DISABLED", p_CEMUX="1" if enable is None else "CE", p_CLKMUX="CLK",
        p_LSRMUX="LSR", p_REGSET="SET" if init else "RESET",
        p_SRMODE="LSR_OVER_CE" if async_set is None else "ASYNC",
        i_CLK=ClockSignal(domain), i_LSR=lsr, **({} if enable is None else {"i_CE": enable}),
        i_DI=value, o_Q=reg)


def fabric_register(m: Module, name: str, value: Value, *, init: int, platform: Any) -> Signal:
    """A one-bit register of ``value`` on the ``sync`` clock, reset to ``init`` (0 or 1). On
    ECP5 a ``TRELLIS_FF`` instance (submodule ``name_ff``), so that yosys does not merge
    registers of the same value back into one: copies of a register with many loads (a stall
    tree's leaves, a select of every bit of a wide row) each keep their share of the loads.
    Elsewhere a plain register (yosys may merge copies).

    Raises :class:`ValueError` for a ``value`` wider than one bit or an ``init`` other than 0, 1."""
    value = Value.cast(value)
    if len(value) != 1:
        raise ValueError(f"value must be one bit wide, not {len(value)}")
    if init not in (0, 1):
        raise ValueError(f"init must be 0 or 1, not {init!r}")
    reg = Signal(name=name, init=init)
    if is_ecp5(platform):
        _trellis_ff(m, f"{name}_ff", value, reg, enable=None, init=init)
    else:
        m.d.sync += reg.eq(value)
    return reg


def reset_synchronizer(m: Module, name: str, value: Value, *, domain: str, platform: Any) -> Signal:
    """A reset for ``domain`` from ``value``, a reset of another clock (returned, one bit): high
    at once while ``value`` is, low from the second edge of ``domain``'s clock after ``value``
    falls (Amaranth's ``AsyncFFSynchronizer``, two stages). On ECP5 two ``TRELLIS_FF`` instances
    with an asynchronous set (submodules ``name_ff0``, ``name_ff1``), so that yosys does not merge
    the synchronizers of one reset into one domain: the one left would drive the reset logic of
    every crossing of that domain, across the die (on the 16x16 ULX3S SoC at b76e74e the route
    from the merged one to the accumulator-write crossing's fetch logic took 9.9 ns of the compute
    clock's critical path, docs/boards.md). Elsewhere an ``AsyncFFSynchronizer`` (submodule
    ``name``; yosys may merge it)."""
    return reset_synchronizer_copies(m, name, value, domain=domain, platform=platform, copies=1)[0]


def reset_synchronizer_copies(m: Module, name: str, value: Value, *, domain: str, platform: Any,
                              copies: int) -> list[Signal]:
    """:func:`reset_synchronizer` whose second stage is ``copies`` flip-flops (on ECP5), each of
    the same value at every edge (the same first stage, the same asynchronous set), for loads
    apart: the first is the returned ``name`` (submodule ``name_ff1``), copy ``k`` >= 1 is
    ``name_copy<k>`` (submodule ``name_copy<k>_ff``). Elsewhere the one synchronizer's output,
    ``copies`` times (yosys would merge the copies).

    Raises :class:`ValueError` for a ``value`` wider than one bit or fewer than one copy."""
    value = Value.cast(value)
    if len(value) != 1:
        raise ValueError(f"value must be one bit wide, not {len(value)}")
    if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1:
        raise ValueError(f"copies must be an integer of at least 1, not {copies!r}")
    reset = Signal(name=name, init=1)
    if not is_ecp5(platform):
        m.submodules[name] = AsyncFFSynchronizer(value, reset, o_domain=domain)
        return [reset] * copies
    first = Signal(name=f"{name}_stage0", init=1)
    _trellis_ff(m, f"{name}_ff0", Const(0, 1), first, enable=None, init=1, domain=domain, async_set=value)
    outputs = [reset] + [Signal(name=f"{name}_copy{k}", init=1) for k in range(1, copies)]
    for k, output in enumerate(outputs):
        _trellis_ff(m, f"{name}_copy{k}_ff" if k else f"{name}_ff1", first, output, enable=None, init=1,
                    domain=domain, async_set=value)
    return outputs


def fabric_copy(m: Module, name: str, value: Value, *, enable: Value, platform: Any,
                reset: bool = False) -> Signal:
    """A register of ``value`` (any width) on the ``sync`` clock, loaded while ``enable`` is high,
    reset to 0 with ``reset`` (else no reset): a register that yosys must not merge with another
    of the same value (a copy for loads far from the register it copies, or a register that
    equals others by construction, as a signal passed along a skewed grid does), since the one
    left would drive both sets of loads, and the placer would put it near one of them. On ECP5
    a ``TRELLIS_FF`` instance per bit (submodules ``name_ff<bit>``, their clock enable
    ``enable``). Elsewhere a plain register (yosys may merge it)."""
    value = Value.cast(value)
    reg = Signal(len(value), name=name, reset_less=not reset)
    if is_ecp5(platform):
        for bit in range(len(value)):
            _trellis_ff(m, f"{name}_ff{bit}", value[bit], reg[bit], enable=enable, init=0 if reset else None)
    else:
        with m.If(enable):
            m.d.sync += reg.eq(value)
    return reg


#: Bits of a wide register loaded under one copy of its load enable (:func:`group_enables`).
COPY_GROUP_BITS = 64


def group_enables(m: Module, name: str, value: Value, width: int, *,
                  platform: Any, init: int = 0) -> list[tuple[slice, Signal]]:
    """Load enables for a ``width``-bit register, one per :data:`COPY_GROUP_BITS` bits: each a
    :func:`fabric_register` of ``value`` (reset to ``init``, submodules ``name<n>_ff`` on ECP5),
    paired with the slice of bits it is to load. No net then reaches every bit of a wide
    register, and no logic lies between the copies and the register's enables unless the caller
    adds some."""
    return [(slice(low, min(low + COPY_GROUP_BITS, width)),
             fabric_register(m, f"{name}{n}", value, init=init, platform=platform))
            for n, low in enumerate(range(0, width, COPY_GROUP_BITS))]
