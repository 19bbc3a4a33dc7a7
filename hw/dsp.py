"""Lattice ECP5 primitives instantiated directly: DSP blocks with the block's own registers in
use, and the clock network's buffer for a signal with thousands of loads.

yosys maps a multiply to a combinational MULT18X18D and leaves the registers around it in the
fabric, so the path from a fabric register through the DSP block to the next fabric register
crosses two long routes (DSP blocks sit in fixed rows). :func:`mult18x18d` instantiates the
block with its output register (and optionally its input registers) on the ``sync`` clock, so
that at most one route sits in a register-to-register path through the multiplier.
"""

from typing import Any

from amaranth import ClockSignal, Const, Instance, Module, Signal, signed
from amaranth.hdl import Value

__all__ = ["MULT18X18D_INPUT_BITS", "global_buffer", "is_ecp5", "mult18x18d"]

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
