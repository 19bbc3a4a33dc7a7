"""Reference integer arithmetic of the accelerator, shared by the golden model, the compiler and
the gateware tests. Every function works elementwise on numpy int64 arrays (or Python ints) and is
exactly what docs/isa.md specifies; the SFU gateware must match it bit for bit.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "rounding_shift", "rounding_shift_even", "saturate", "wrap", "requantize", "choose_multiplier",
    "MULT_BITS", "MAX_SHIFT", "ACT_NONE", "ACT_RELU", "ACT_RELU6", "ACT_CLIP",
    "activation", "sfu_pointwise", "avg_pool_finish",
]

# Activation codes, equal to systolic.hw.isa.Activation values.
ACT_NONE, ACT_RELU, ACT_RELU6, ACT_CLIP = 0, 1, 2, 3

#: Requantize multipliers are signed 32-bit; shifts are 0..MAX_SHIFT.
MULT_BITS = 32
MAX_SHIFT = 62


def rounding_shift(x: np.ndarray | int, shift: np.ndarray | int) -> np.ndarray:
    """Arithmetic right shift by ``shift`` rounding to nearest, ties toward +infinity:
    ``(x + 2**(shift-1)) >> shift`` for shift > 0, and ``x`` for shift == 0.

    ``x`` must fit in 64 bits after adding the rounding term; callers keep |x| < 2**62.
    """
    x = np.asarray(x, dtype=np.int64)
    shift = np.asarray(shift, dtype=np.int64)
    half = np.where(shift > 0, np.left_shift(np.int64(1), np.maximum(shift - 1, 0)), 0)
    return np.right_shift(x + half, shift)


def rounding_shift_even(x: np.ndarray | int, shift: np.ndarray | int,
                        offset: np.ndarray | int = 0) -> np.ndarray:
    """``x * 2**-shift + offset`` rounded to the nearest integer, ties to the even one (the SFU's
    rounding, docs/isa.md STORE). ``offset`` is an integer (a zero point), so it only decides
    which of the two nearest integers of a tie is even: offset 0 rounds ``x * 2**-shift`` half
    to even and then adds nothing; ``offset = zp_out`` makes the *output* even.

    Computed as :func:`rounding_shift` (ties up) plus ``offset``, with bit 0 cleared when ``x`` is
    a tie (shift > 0 and the low ``shift`` bits of ``x`` are exactly ``2**(shift-1)``): a tie
    rounded up gives the larger of its two neighbours, and clearing bit 0 picks the even one.
    The same 64-bit wrap-around as :func:`rounding_shift`; callers keep |x| < 2**62.
    """
    x = np.asarray(x, dtype=np.int64)
    shift = np.asarray(shift, dtype=np.int64)
    rounded = rounding_shift(x, shift) + np.asarray(offset, dtype=np.int64)
    low = np.bitwise_and(x, np.left_shift(np.int64(1), shift) - 1)
    half = np.left_shift(np.int64(1), np.maximum(shift - 1, 0))
    tie = (shift > 0) & (low == half)
    return np.where(tie, np.bitwise_and(rounded, ~np.int64(1)), rounded)


def saturate(x: np.ndarray | int, lo: int, hi: int) -> np.ndarray:
    """Clamp to the inclusive range [lo, hi]."""
    return np.clip(np.asarray(x, dtype=np.int64), lo, hi)


def wrap(x: np.ndarray | int, bits: int, signed: bool = True) -> np.ndarray:
    """Two's complement wrap-around to ``bits`` bits (what a ``bits``-wide adder keeps)."""
    x = np.asarray(x, dtype=np.int64)
    if bits >= 64:
        return x
    mask = (1 << bits) - 1
    u = np.bitwise_and(x, mask)
    if signed:
        u = np.where(u >= (1 << (bits - 1)), u - (1 << bits), u)
    return u


def requantize(acc: np.ndarray | int, mult: np.ndarray | int, shift: np.ndarray | int) -> np.ndarray:
    """``rounding_shift_even(acc * mult, shift)``: the fixed-point scale of an int32 accumulator
    by ``mult * 2**-shift``, ties to even. ``acc`` and ``mult`` are 32-bit signed, so the product
    fits 63 bits."""
    return rounding_shift_even(np.asarray(acc, dtype=np.int64) * np.asarray(mult, dtype=np.int64), shift)


def choose_multiplier(scale: float, *, mult_bits: int = MULT_BITS) -> tuple[int, int]:
    """The (multiplier, shift) pair with ``multiplier * 2**-shift`` closest to ``scale`` that keeps
    the multiplier within ``mult_bits``-bit signed range and the shift within 0..MAX_SHIFT.

    Raises ValueError for scales that cannot be represented (not finite, or too large).
    """
    if not np.isfinite(scale):
        raise ValueError(f"requantize scale must be finite, not {scale!r}")
    if scale == 0.0:
        return 0, 0
    limit = (1 << (mult_bits - 1)) - 1
    mantissa, exponent = np.frexp(abs(scale))     # scale = mantissa * 2**exponent, 0.5 <= m < 1
    shift = (mult_bits - 1) - int(exponent)          # mult = mantissa * 2**(mult_bits-1)
    if shift > MAX_SHIFT:
        # Too small to keep full precision: use the largest shift, fewer multiplier bits.
        shift = MAX_SHIFT
    if shift < 0:
        raise ValueError(f"requantize scale must be below 2**{mult_bits - 1}, not {scale!r}")
    mult = int(round(abs(scale) * (1 << shift)))
    if mult > limit:       # mantissa rounded up to 1.0
        mult >>= 1
        shift -= 1
        if shift < 0:
            raise ValueError(f"requantize scale must be below 2**{mult_bits - 1}, not {scale!r}")
    if scale < 0:
        mult = -mult
    return mult, shift


def activation(q: np.ndarray | int, act: int, zp_out: int, act_lo: int, act_hi: int) -> np.ndarray:
    """The SFU activation in the output (quantized) domain: none, relu (>= zp_out), relu6
    (zp_out..act_hi) or clip (act_lo..act_hi)."""
    q = np.asarray(q, dtype=np.int64)
    if act == ACT_NONE:
        return q
    if act == ACT_RELU:
        return np.maximum(q, zp_out)
    if act == ACT_RELU6:
        return np.minimum(np.maximum(q, zp_out), act_hi)
    if act == ACT_CLIP:
        return np.minimum(np.maximum(q, act_lo), act_hi)
    raise ValueError(f"activation code must be 0..3, not {act!r}")


def _round_to_output(x: np.ndarray, shift: np.ndarray | int, zp_out: int, tie_out: int | bool) -> np.ndarray:
    """``x * 2**-shift + zp_out`` rounded half to even: with ``tie_out`` a tie goes to the even
    output value, without it to the even value before zp_out is added."""
    if tie_out:
        return rounding_shift_even(x, shift, zp_out)
    return rounding_shift_even(x, shift) + zp_out


def sfu_pointwise(acc: np.ndarray, bias: np.ndarray, mult: np.ndarray, shift: np.ndarray, *,
                  zp_out: int, act: int, act_lo: int, act_hi: int,
                  acc_range: tuple[int, int], out_range: tuple[int, int],
                  residual: np.ndarray | None = None, res_zp: int = 0, res_mult: int = 0,
                  tie_out: int | bool = 0) -> np.ndarray:
    """One SFU element, as docs/isa.md (STORE, int) defines it, before pooling: bias add
    (saturating), requantize with the optional residual term in ONE rounding (half to even, the
    tie toward an even output with ``tie_out``), zero point, activation, saturation.
    ``bias``/``mult``/``shift`` broadcast per channel (last axis); ``residual`` holds elements of
    the output type, scaled by ``res_mult * 2**-shift`` (the channel's own shift)."""
    t = saturate(np.asarray(acc, dtype=np.int64) + np.asarray(bias, dtype=np.int64), *acc_range)
    x = t * np.asarray(mult, dtype=np.int64)
    if residual is not None:
        x = x + (np.asarray(residual, dtype=np.int64) - res_zp) * np.int64(res_mult)
    q = _round_to_output(x, shift, zp_out, tie_out)
    return saturate(activation(q, act, zp_out, act_lo, act_hi), *out_range)


def avg_pool_finish(window_sum: np.ndarray, count: int, *, zp_out: int, avg_mult: int, avg_shift: int,
                    act: int, act_lo: int, act_hi: int, out_range: tuple[int, int],
                    tie_out: int | bool = 0) -> np.ndarray:
    """Average pooling's last step: ``window_sum`` is the sum of ``count`` = pool_h * pool_w
    pointwise outputs (out-of-image pixels counted as zp_out); rounded half to even (the tie
    toward an even output with ``tie_out``, the CONFIG's ``avg_tie_out``)."""
    centred = np.asarray(window_sum, dtype=np.int64) - count * zp_out
    out = _round_to_output(centred * np.int64(avg_mult), avg_shift, zp_out, tie_out)
    return saturate(activation(out, act, zp_out, act_lo, act_hi), *out_range)
