"""Clock and reset of a board top: PLL parameters, the PLL primitives and a reset generator.

The accelerator runs in a clock domain (``sync``) made by the board's PLL from its oscillator
(and, with a compute clock of its own, its compute core on the ECP5 PLL's second output, CLKOS,
``ClockReset.clk2``):

* iCE40 (``SB_PLL40_PAD``, simple feedback): ``f_out = f_in / (DIVR + 1) * (DIVF + 1) / 2**DIVQ``
  with the phase detector at ``f_pfd = f_in / (DIVR + 1)`` in [10, 133] MHz and the VCO at
  ``f_pfd * (DIVF + 1)`` in [533, 1066] MHz; the loop filter setting follows from ``f_pfd``
  (iCE40 sysCLOCK PLL design guide; the same ranges as ``icepll``).
* ECP5 (``EHXPLLL``, feedback from CLKOP): ``f_out = f_in / CLKI_DIV * CLKFB_DIV`` and the VCO at
  ``f_out * CLKOP_DIV`` in [400, 800] MHz, the phase detector at ``f_in / CLKI_DIV`` in
  [3.125, 400] MHz (ECP5 sysCLOCK PLL guide; the same ranges as ``ecppll``).

:func:`ice40_pll` and :func:`ecp5_pll` search every divider setting and return the one whose
output is closest to the request (ties: the VCO nearest the middle of its range), or raise
:class:`PllError` when nothing within :data:`PLL_TOLERANCE` of the request exists.

:class:`ClockReset` is the gateware: the PLL (or the oscillator itself when it already runs at
the requested frequency) drives ``sync``; the domain's reset is held from configuration until
the PLL has been locked for :data:`POR_SECONDS` (iCE40 block RAMs read as zero for a few
microseconds after configuration) and is released synchronously to the clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from amaranth import ClockDomain, ClockSignal, Const, Elaboratable, Instance, Module, Signal
from amaranth.lib import io
from amaranth.lib.cdc import FFSynchronizer
from systolic.hw.dsp import global_buffer

__all__ = [
    "PllError", "PLL_TOLERANCE", "POR_SECONDS", "Ice40Pll", "Ecp5Pll", "ice40_pll", "ecp5_pll",
    "ClockReset",
]

#: Largest relative difference between the requested and the achieved PLL output frequency.
PLL_TOLERANCE = 0.01

#: Time the reset stays asserted after the PLL locks, seconds (iCE40 block RAMs read as zero
#: for about 3 us after configuration; five times that, as Amaranth's own iCE40 reset does).
POR_SECONDS = 15e-6


class PllError(ValueError):
    """No PLL setting makes the requested frequency; the message names the PLL, the input and
    the requested frequency, and the closest or the reachable range."""


def _mhz(hz: Fraction | float) -> str:
    return f"{float(hz) / 1e6:.6g} MHz"


def _check_hz(name: str, value: object) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, int | float | Fraction) or value <= 0:
        raise ValueError(f"{name} must be a positive frequency in Hz, not {value!r}")
    return Fraction(value)


@dataclass(frozen=True)
class Ice40Pll:
    """Parameters of an iCE40 ``SB_PLL40_*`` in simple feedback mode; frequencies in Hz."""

    divr: int
    divf: int
    divq: int
    filter_range: int
    f_in: Fraction
    f_pfd: Fraction
    f_vco: Fraction
    f_out: Fraction

    @property
    def out_hz(self) -> float:
        """Achieved output frequency, Hz."""
        return float(self.f_out)


@dataclass(frozen=True)
class Ecp5Pll:
    """Parameters of an ECP5 ``EHXPLLL`` with CLKOP feedback; frequencies in Hz. With
    ``clkos_div``, a second output CLKOS of ``f_vco / clkos_div`` (``f_secondary``)."""

    clki_div: int
    clkfb_div: int
    clkop_div: int
    f_in: Fraction
    f_pfd: Fraction
    f_vco: Fraction
    f_out: Fraction
    clkos_div: int | None = None
    f_secondary: Fraction | None = None

    @property
    def out_hz(self) -> float:
        """Achieved output frequency, Hz."""
        return float(self.f_out)

    @property
    def secondary_hz(self) -> float | None:
        """Achieved frequency of CLKOS, Hz (None without a second output)."""
        return None if self.f_secondary is None else float(self.f_secondary)

    @property
    def clkos_cphase(self) -> int | None:
        """Coarse phase of CLKOS, VCO cycles: ``CLKOS_DIV - 1`` is 0 degrees (as CLKOP's)."""
        return None if self.clkos_div is None else self.clkos_div - 1

    @property
    def clkop_cphase(self) -> int:
        """Coarse phase of CLKOP, VCO cycles: ``CLKOP_DIV - 1`` is 0 degrees."""
        return self.clkop_div - 1


_ICE40_PFD = (Fraction(10_000_000), Fraction(133_000_000))
_ICE40_VCO = (Fraction(533_000_000), Fraction(1_066_000_000))
_ICE40_IN = (Fraction(10_000_000), Fraction(133_000_000))
_ICE40_OUT = (Fraction(16_000_000), Fraction(275_000_000))
# FILTER_RANGE by phase detector frequency: the first row whose bound exceeds f_pfd (MHz).
_ICE40_FILTER = ((17, 1), (26, 2), (44, 3), (66, 4), (101, 5))

_ECP5_IN = (Fraction(8_000_000), Fraction(400_000_000))
_ECP5_PFD = (Fraction(3_125_000), Fraction(400_000_000))
_ECP5_VCO = (Fraction(400_000_000), Fraction(800_000_000))
_ECP5_OUT = (Fraction(3_125_000), Fraction(400_000_000))
_ECP5_VCO_MIDDLE = (_ECP5_VCO[0] + _ECP5_VCO[1]) / 2


def _check_range(pll: str, what: str, value: Fraction, bounds: tuple[Fraction, Fraction]) -> None:
    if not bounds[0] <= value <= bounds[1]:
        raise PllError(f"{pll}: {what} must be between {_mhz(bounds[0])} and {_mhz(bounds[1])}, "
                       f"not {_mhz(value)}")


def _check_close(pll: str, f_in: Fraction, target: Fraction, achieved: Fraction | None) -> None:
    if achieved is None or abs(achieved - target) > target * Fraction(PLL_TOLERANCE):
        closest = "no setting reaches it" if achieved is None else f"the closest is {_mhz(achieved)}"
        raise PllError(f"{pll}: cannot make {_mhz(target)} from {_mhz(f_in)} within "
                       f"{PLL_TOLERANCE:.0%}: {closest}")


def ice40_pll(f_in_hz: float, f_out_hz: float) -> Ice40Pll:
    """The ``SB_PLL40`` setting (simple feedback) whose output is closest to ``f_out_hz``
    from a ``f_in_hz`` reference (both Hz).

    Raises :class:`PllError` when the input or the request is outside the PLL's range
    (10-133 MHz in, 16-275 MHz out) or no setting is within :data:`PLL_TOLERANCE`."""
    f_in, target = _check_hz("f_in_hz", f_in_hz), _check_hz("f_out_hz", f_out_hz)
    _check_range("iCE40 PLL", "the reference", f_in, _ICE40_IN)
    _check_range("iCE40 PLL", "the output", target, _ICE40_OUT)
    best: Ice40Pll | None = None
    best_key: tuple[Fraction, Fraction] | None = None
    middle = (_ICE40_VCO[0] + _ICE40_VCO[1]) / 2
    for divr in range(16):
        f_pfd = f_in / (divr + 1)
        if not _ICE40_PFD[0] <= f_pfd <= _ICE40_PFD[1]:
            continue
        for divf in range(128):
            f_vco = f_pfd * (divf + 1)
            if not _ICE40_VCO[0] <= f_vco <= _ICE40_VCO[1]:
                continue
            for divq in range(1, 7):
                f_out = f_vco / (1 << divq)
                key = (abs(f_out - target), abs(f_vco - middle))
                if best_key is None or key < best_key:
                    filter_range = next((fr for bound, fr in _ICE40_FILTER
                                         if f_pfd < bound * 1_000_000), 6)
                    best = Ice40Pll(divr, divf, divq, filter_range, f_in, f_pfd, f_vco, f_out)
                    best_key = key
    _check_close("iCE40 PLL", f_in, target, None if best is None else best.f_out)
    assert best is not None
    return best


def ecp5_pll(f_in_hz: float, f_out_hz: float, secondary_hz: float | None = None) -> Ecp5Pll:
    """The ``EHXPLLL`` setting (feedback from CLKOP) whose output is closest to ``f_out_hz``
    from a ``f_in_hz`` reference (both Hz). With ``secondary_hz``, also a second output (CLKOS,
    an integer division of the same VCO): the setting whose worse relative error of the two
    outputs is the smallest (ties: the VCO nearest the middle of its range).

    Raises :class:`PllError` when the input or a request is outside the PLL's range
    (8-400 MHz in, 3.125-400 MHz out) or no setting is within :data:`PLL_TOLERANCE`."""
    f_in, target = _check_hz("f_in_hz", f_in_hz), _check_hz("f_out_hz", f_out_hz)
    _check_range("ECP5 PLL", "the reference", f_in, _ECP5_IN)
    _check_range("ECP5 PLL", "the output", target, _ECP5_OUT)
    if secondary_hz is not None:
        return _ecp5_pll_two(f_in, target, _check_hz("secondary_hz", secondary_hz))
    best: tuple[int, int, int] | None = None
    best_key: tuple[Fraction, Fraction] | None = None
    for clki_div, clkfb_div, f_out, low, high in _ecp5_settings(f_in):
        # the output divider only places the VCO: take the one nearest the middle
        clkop_div = min(max(round(_ECP5_VCO_MIDDLE / f_out), low), high)
        key = (abs(f_out - target), abs(f_out * clkop_div - _ECP5_VCO_MIDDLE))
        if best_key is None or key < best_key:
            best, best_key = (clki_div, clkfb_div, clkop_div), key
    if best is None:
        _check_close("ECP5 PLL", f_in, target, None)
    assert best is not None
    clki_div, clkfb_div, clkop_div = best
    f_out = f_in / clki_div * clkfb_div
    _check_close("ECP5 PLL", f_in, target, f_out)
    return Ecp5Pll(clki_div, clkfb_div, clkop_div, f_in, f_in / clki_div, f_out * clkop_div, f_out)


def _ecp5_settings(f_in: Fraction) -> Iterator[tuple[int, int, Fraction, int, int]]:
    """Every (CLKI_DIV, CLKFB_DIV) with the phase detector and the output in range, with its
    output frequency and the range of CLKOP_DIV that puts the VCO in range (low <= high)."""
    for clki_div in range(1, 129):
        f_pfd = f_in / clki_div
        if not _ECP5_PFD[0] <= f_pfd <= _ECP5_PFD[1]:
            continue
        # only the feedback dividers that land the output in range
        first = max(1, -(-_ECP5_OUT[0] // f_pfd))
        last = min(80, _ECP5_OUT[1] // f_pfd)
        for clkfb_div in range(int(first), int(last) + 1):
            f_out = f_pfd * clkfb_div
            low = max(1, -(-_ECP5_VCO[0] // f_out))
            high = min(128, _ECP5_VCO[1] // f_out)
            if low <= high:
                yield clki_div, clkfb_div, f_out, int(low), int(high)


def _ecp5_pll_two(f_in: Fraction, target: Fraction, second: Fraction) -> Ecp5Pll:
    """:func:`ecp5_pll` with a second output (CLKOS) of ``second`` Hz."""
    _check_range("ECP5 PLL", "the second output", second, _ECP5_OUT)
    best: tuple[int, int, int, int] | None = None
    best_key: tuple[Fraction, Fraction] | None = None
    for clki_div, clkfb_div, f_out, low, high in _ecp5_settings(f_in):
        for clkop_div in range(low, high + 1):
            f_vco = f_out * clkop_div
            clkos_div = min(max(round(f_vco / second), 1), 128)
            error = max(abs(f_out - target) / target, abs(f_vco / clkos_div - second) / second)
            key = (error, abs(f_vco - _ECP5_VCO_MIDDLE))
            if best_key is None or key < best_key:
                best, best_key = (clki_div, clkfb_div, clkop_div, clkos_div), key
    if best is None:
        _check_close("ECP5 PLL", f_in, target, None)
    assert best is not None and best_key is not None
    clki_div, clkfb_div, clkop_div, clkos_div = best
    f_out = f_in / clki_div * clkfb_div
    f_vco = f_out * clkop_div
    if best_key[0] > Fraction(PLL_TOLERANCE):
        raise PllError(f"ECP5 PLL: cannot make {_mhz(target)} and, on CLKOS, {_mhz(second)} from "
                       f"{_mhz(f_in)} within {PLL_TOLERANCE:.0%} each (both divide one VCO of 400 to "
                       f"800 MHz): the closest pair is {_mhz(f_out)} and {_mhz(f_vco / clkos_div)}")
    return Ecp5Pll(clki_div, clkfb_div, clkop_div, f_in, f_in / clki_div, f_vco, f_out,
                   clkos_div, f_vco / clkos_div)


class ClockReset(Elaboratable):
    """A clock from a board oscillator through a PLL, and a reset for it that is released
    :data:`POR_SECONDS` after the PLL locks, synchronously to the clock. The board top drives
    its ``sync`` domain with them.

    ``clock_port``: the oscillator's pin as requested with ``dir="-"``; ``family``: "ice40" or
    "ecp5"; ``clock_in_hz``: the oscillator's frequency, Hz; ``pll``: the setting, or None to run
    ``clk`` from the oscillator directly. ``clk`` is the clock; ``locked`` the PLL's lock output
    (1 without a PLL); ``rst`` the reset, synchronous to ``clk``. ``clk2``: an ECP5 PLL's second
    output (CLKOS) when the setting has one (:func:`ecp5_pll` with ``secondary_hz``), for a
    clock whose reset the design makes itself (an accelerator's compute clock).
    """

    def __init__(self, clock_port: Any, *, family: str, clock_in_hz: float,
                 pll: Ice40Pll | Ecp5Pll | None) -> None:
        if family not in ("ice40", "ecp5"):
            raise ValueError(f"family must be 'ice40' or 'ecp5', not {family!r}")
        self.clock_in_hz = float(_check_hz("clock_in_hz", clock_in_hz))
        expected = {"ice40": Ice40Pll, "ecp5": Ecp5Pll}[family]
        if pll is not None and not isinstance(pll, expected):
            raise TypeError(f"pll must be an {expected.__name__} or None for {family}, not {pll!r}")
        self.clock_port = clock_port
        self.family = family
        self.pll = pll
        self.clk = Signal()
        self.clk2 = Signal()
        self.locked = Signal()
        self.rst = Signal()

    @property
    def out_hz(self) -> float:
        """Frequency of ``clk``, Hz."""
        return self.pll.out_hz if self.pll is not None else self.clock_in_hz

    def _clkos(self, pll: Ecp5Pll) -> dict[str, Any]:
        """The EHXPLLL arguments of CLKOS, driving ``clk2``, when ``pll`` has a second output."""
        if pll.clkos_div is None:
            return {}
        return {"a_FREQUENCY_PIN_CLKOS": f"{pll.secondary_hz / 1e6:.6g}",
                "p_CLKOS_ENABLE": "ENABLED", "p_CLKOS_DIV": pll.clkos_div,
                "p_CLKOS_CPHASE": pll.clkos_cphase, "p_CLKOS_FPHASE": 0,
                "i_ENCLKOS": Const(0), "o_CLKOS": self.clk2}

    def elaborate(self, platform: Any) -> Module:
        m = Module()
        pll = self.pll
        if pll is None:
            m.submodules.clk_buf = clk_buf = io.Buffer("i", self.clock_port)
            m.d.comb += [self.clk.eq(clk_buf.i), self.locked.eq(1)]
        elif isinstance(pll, Ice40Pll):
            # The PLL's reference pad: the oscillator pin itself feeds the PLL, no SB_IO between.
            m.submodules.pll = Instance(
                "SB_PLL40_PAD",
                p_FEEDBACK_PATH="SIMPLE",
                p_PLLOUT_SELECT="GENCLK",
                p_DIVR=Const(pll.divr, 4),
                p_DIVF=Const(pll.divf, 7),
                p_DIVQ=Const(pll.divq, 3),
                p_FILTER_RANGE=Const(pll.filter_range, 3),
                i_PACKAGEPIN=self.clock_port.io,
                i_RESETB=Const(1),
                i_BYPASS=Const(0),
                o_PLLOUTGLOBAL=self.clk,
                o_LOCK=self.locked,
            )
        else:
            m.submodules.clk_buf = clk_buf = io.Buffer("i", self.clock_port)
            m.submodules.pll = Instance(
                "EHXPLLL",
                a_FREQUENCY_PIN_CLKI=f"{float(pll.f_in) / 1e6:.6g}",
                a_FREQUENCY_PIN_CLKOP=f"{float(pll.f_out) / 1e6:.6g}",
                a_ICP_CURRENT="12", a_LPF_RESISTOR="8",
                a_MFG_ENABLE_FILTEROPAMP="1", a_MFG_GMCREF_SEL="2",
                p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED", p_STDBY_ENABLE="DISABLED",
                p_DPHASE_SOURCE="DISABLED", p_OUTDIVIDER_MUXA="DIVA",
                p_CLKI_DIV=pll.clki_div,
                p_CLKOP_ENABLE="ENABLED",
                p_CLKOP_DIV=pll.clkop_div,
                p_CLKOP_CPHASE=pll.clkop_cphase,
                p_CLKOP_FPHASE=0,
                p_FEEDBK_PATH="CLKOP",
                p_CLKFB_DIV=pll.clkfb_div,
                i_RST=Const(0), i_STDBY=Const(0),
                i_CLKI=clk_buf.i,
                i_CLKFB=self.clk,
                i_PHASESEL0=Const(0), i_PHASESEL1=Const(0), i_PHASEDIR=Const(1),
                i_PHASESTEP=Const(1), i_PHASELOADREG=Const(1), i_PLLWAKESYNC=Const(0),
                i_ENCLKOP=Const(0),
                o_CLKOP=self.clk,
                o_LOCK=self.locked,
                **self._clkos(pll),
            )

        # Reset: a reset-less domain on the clock counts POR_SECONDS of lock, then releases
        # the reset on a clock edge. LOCK is asynchronous to the clock it makes.
        delay = max(1, int(POR_SECONDS * self.out_hz))
        m.domains.por = ClockDomain("por", reset_less=True, local=True)
        locked = Signal()
        timer = Signal(range(delay + 1))
        reset = Signal(init=1)
        m.submodules.lock_sync = FFSynchronizer(self.locked, locked, o_domain="por", init=0)
        m.d.comb += ClockSignal("por").eq(self.clk)
        with m.If(~locked):
            m.d.por += [timer.eq(0), reset.eq(1)]
        with m.Elif(timer == delay):
            m.d.por += reset.eq(0)
        with m.Else():
            m.d.por += timer.eq(timer + 1)
        # ECP5: the reset (a register) reaches its flip-flops over a global clock line
        # (hw/dsp.py global_buffer), not the general routing
        if self.family == "ecp5":
            m.d.comb += self.rst.eq(global_buffer(m, "reset_buffer", reset))
        else:
            m.d.comb += self.rst.eq(reset)
        return m

