"""Quantization arithmetic (activation/weight/bias parameters, calibration data) and the exact
integer semantics of accelerator ops in the reference executor, checked against independent
computations with random and extreme values: -128 x -128 sums, accumulator wrap, saturation at
both ends, rounding ties, partial pooling windows, 1xN and Nx1 images."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
from systolic.compiler.errors import CalibrationError, QuantizationError
from systolic.compiler.frontend import load_model
from systolic.compiler.ir import AccelOp, ConvGeometry, Pool, Residual, Tensor, make_graph, verify
from systolic.compiler.quantize import (
    Calibration,
    Range,
    activation_params,
    calibrate,
    quantize_bias,
    quantize_weights,
)
from systolic.compiler.reference import ConvInteger, dequantize_linear, execute, quantize_linear, store_ties
from systolic.hw.config import AcceleratorConfig
from systolic.sim.arith import choose_multiplier, rounding_shift_even

from tests.compiler import models

RNG = np.random.default_rng(1234)


# -- parameters --------------------------------------------------------------------------------------


def test_activation_params_cover_the_range_and_zero() -> None:
    for low, high in [(0.0, 2.55), (-1.0, 1.0), (-3.0, -1.0), (0.5, 7.0), (-1e-3, 5e3)]:
        p = activation_params(Range(low, high))
        lo, hi = min(low, 0.0), max(high, 0.0)
        assert float(p.scale) == pytest.approx((hi - lo) / 255, rel=1e-6)
        assert -128 <= int(p.zero_point) <= 127
        # zero is exact, and the ends of the range quantize inside the int8 range
        assert dequantize_linear(np.int8(p.zero_point), p.scale, p.zero_point) == 0.0
        q = quantize_linear(np.array([lo, hi], np.float32), p.scale, p.zero_point, np.int8)
        assert abs(int(q[0]) + 128) <= 1 and abs(int(q[1]) - 127) <= 1
    relu = activation_params(Range(0.0, 2.55))
    assert int(relu.zero_point) == -128 and float(relu.scale) == pytest.approx(0.01)
    assert int(activation_params(Range(-3.0, -1.0)).zero_point) == 127
    flat = activation_params(Range(0.0, 0.0))
    assert float(flat.scale) == 1.0 and int(flat.zero_point) == 0


def test_activation_params_reject_infinite_ranges() -> None:
    with pytest.raises(QuantizationError, match=r"^calibration range must be finite, not \[-inf, 1\.0\]$"):
        activation_params(Range(-np.inf, 1.0))


def test_weights_per_channel_symmetric() -> None:
    w = RNG.standard_normal((6, 3, 3, 3)).astype(np.float32)
    w[2] = 0.0                                   # an all-zero channel
    w[4] *= 1000.0                               # a large channel does not affect the others
    q, scale = quantize_weights(w, 0)
    assert q.dtype == np.int8 and q.shape == w.shape and scale.shape == (6,)
    assert scale[2] == 1.0 and not q[2].any()
    for c in (0, 1, 3, 4, 5):
        assert np.abs(q[c]).max() == 127
        assert np.abs(q[c] * scale[c] - w[c]).max() <= scale[c] / 2 * (1 + 1e-6)
    assert q.min() >= -127                       # symmetric: -128 is never used
    q1, s1 = quantize_weights(w.reshape(6, 27).T, 1)
    np.testing.assert_array_equal(q1, q.reshape(6, 27).T)
    np.testing.assert_array_equal(s1, scale)


def test_bias_quantization() -> None:
    scale = np.array([0.5, 0.25, 1e-3], np.float32)
    np.testing.assert_array_equal(quantize_bias(np.array([1.25, -1.0, 0.0]), scale, "b"), [2, -4, 0])
    with pytest.raises(QuantizationError, match=r"^node 'c' \(Conv\): bias does not fit int32 in units of "
                                                r"input scale x weight scale \(largest 1e\+12, "
                                                r"limit 2147483647\)$"):
        quantize_bias(np.array([1.0]), np.array([1e-12]), "node 'c' (Conv)")


# -- calibration data ----------------------------------------------------------------------------------


def _relu_graph():
    return load_model(models.single_node("Relu", [("x", [2, 3])], [("y", [2, 3])]))


def test_calibration_batches_and_npz(tmp_path) -> None:
    data = RNG.standard_normal((6, 3)).astype(np.float32)
    path = tmp_path / "cal.npz"
    np.savez(path, x=data)
    graph = _relu_graph()
    for cal in (Calibration.load(path), Calibration.load({"x": data})):
        batches = list(cal.batches(graph))
        assert len(batches) == 3 and all(b["x"].shape == (2, 3) for b in batches)
        np.testing.assert_array_equal(np.concatenate([b["x"] for b in batches]), data)
    ranges = calibrate(graph, Calibration({"x": data}), {"x", "y"})
    assert ranges["x"] == Range(float(data.min()), float(data.max()))
    assert ranges["y"] == Range(0.0, float(data.max()))


def test_percentile_calibration_clips_outliers() -> None:
    data = RNG.standard_normal((1000, 3)).astype(np.float32)
    data[7, 1] = 1000.0
    graph = _relu_graph()
    wide = calibrate(graph, Calibration({"x": data}), {"x"})["x"]
    narrow = calibrate(graph, Calibration({"x": data}, method="percentile", percentile=99.9), {"x"})["x"]
    assert wide.high == 1000.0 and 2.0 < narrow.high < 5.0 and -5.0 < narrow.low < -2.0


def test_calibration_errors(tmp_path) -> None:
    graph = _relu_graph()
    with pytest.raises(CalibrationError,
                       match=r"^calibration data has no array for input 'x' \(it has 'z'\)$"):
        list(Calibration({"z": np.zeros((2, 3), np.float32)}).batches(graph))
    with pytest.raises(CalibrationError, match=r"^calibration array 'x' must have shape \(k \* 2, 3\) for "
                                               r"k >= 1 "
                                               r"batches of the input \(2, 3\), not \(3, 3\)$"):
        list(Calibration({"x": np.zeros((3, 3), np.float32)}).batches(graph))
    with pytest.raises(CalibrationError, match=r"^calibration data names 'w', which is not an input of the "
                                               r"graph \(inputs: 'x'\)$"):
        list(Calibration({"x": np.zeros((2, 3), np.float32), "w": np.zeros(1)}).batches(graph))
    with pytest.raises(CalibrationError, match=r"^calibration method must be 'minmax' or 'percentile', not "
                                               r"'mean'$"):
        Calibration({}, method="mean")
    with pytest.raises(CalibrationError, match=r"^calibration percentile must be in \(50, 100\], not 20$"):
        Calibration({}, method="percentile", percentile=20)
    with pytest.raises(CalibrationError, match=r"^calibration must be a Calibration, a mapping of input "
                                               r"arrays "
                                               r"or an \.npz path, not int$"):
        Calibration.load(3)
    bad = tmp_path / "bad.npz"
    bad.write_text("no")
    with pytest.raises(CalibrationError, match=rf"^{bad}: cannot read calibration data \(an \.npz of input "
                                               rf"arrays\): "):
        Calibration.load(bad)


# -- accelerator op semantics --------------------------------------------------------------------------


def _run(op: AccelOp, x: np.ndarray, out_shape: tuple[int, ...], *, residual: np.ndarray | None = None,
         config: AcceleratorConfig | None = None, out_dtype: str = "int8") -> np.ndarray:
    """Execute one accelerator op in a graph of its own."""
    layout = "NHWC" if op.kind in ("conv", "pool") else None
    tensors = [Tensor(op.input, x.shape, "int8", layout=layout),
               Tensor(op.output, out_shape, out_dtype, layout=layout)]
    inputs = [op.input]
    feeds = {op.input: x}
    if residual is not None:
        tensors.append(Tensor(op.residual.tensor, residual.shape, "int8", layout=layout))
        inputs.append(op.residual.tensor)
        feeds[op.residual.tensor] = residual
    graph = verify(make_graph("t", [op], tensors, inputs, [op.output], 13, config))
    return execute(graph, feeds)[op.output]


def _ints(shape: tuple[int, ...], extremes: bool = True) -> np.ndarray:
    x = RNG.integers(-128, 128, shape).astype(np.int8)
    if extremes:
        flat = x.reshape(-1)
        flat[: max(1, flat.size // 8)] = -128
        flat[-max(1, flat.size // 8):] = 127
    return x


def _onnx_weights(w_kn: np.ndarray, kh: int, kw: int, ci: int) -> np.ndarray:
    """[K, Co] in (kh, kw, ci) order back to ONNX [Co, Ci, kh, kw]."""
    return w_kn.reshape(kh, kw, ci, -1).transpose(3, 2, 0, 1)


@pytest.mark.parametrize("h, w, ci, co, k, stride, pads, dilation", [
    (5, 6, 3, 4, 3, (1, 1), (1, 1, 1, 1), (1, 1)),
    (7, 7, 2, 5, 3, (2, 2), (0, 1, 2, 0), (1, 1)),
    (1, 9, 4, 3, 1, (1, 1), (0, 0, 0, 0), (1, 1)),     # 1xN image
    (9, 1, 4, 3, 1, (1, 1), (0, 0, 0, 0), (1, 1)),     # Nx1 image
    (8, 8, 3, 2, 3, (1, 2), (2, 2, 2, 2), (2, 2)),     # dilated, padding beyond the kernel
])
def test_conv_accumulates_like_conv_integer(h, w, ci, co, k, stride, pads, dilation) -> None:
    x = _ints((2, h, w, ci))
    weights = _ints((k * k * ci, co))
    zp_in = int(RNG.integers(-128, 128))
    geometry = ConvGeometry((k, k), stride, pads, dilation)
    oh, ow = geometry.output_hw(h, w)
    # identity requantize of a sum scaled into range: mult/shift chosen to keep outputs in int8
    op = AccelOp("conv", "c", "x", "y", np.zeros(co), np.ones(co), np.full(co, 20), zp_in, 0,
                 weights=weights, conv=geometry)
    y = _run(op, x, (2, oh, ow, co))
    acc = ConvInteger(x.transpose(0, 3, 1, 2), _onnx_weights(weights, k, k, ci), np.int8(zp_in), None,
                      pads=(pads[0], pads[1], pads[2], pads[3]), strides=stride, dilations=dilation)
    acc = acc.astype(np.int64).transpose(0, 2, 3, 1) + zp_in * weights.astype(np.int64).sum(axis=0)
    np.testing.assert_array_equal(y, np.clip(rounding_shift_even(acc, 20), -128, 127))


def test_extreme_products_sum_and_wrap() -> None:
    """-128 x -128 everywhere: K * 16384 fits int32, and wraps in a 16-bit accumulator."""
    k = 3 * 3 * 8
    x = np.full((1, 3, 3, 8), -128, np.int8)
    weights = np.full((k, 2), -128, np.int8)
    op = AccelOp("conv", "c", "x", "y", np.zeros(2), np.ones(2), np.zeros(2), 0, 0,
                 weights=weights, conv=ConvGeometry((3, 3)), out_type="raw")
    raw32 = _run(op, x, (1, 1, 1, 2), out_dtype="int32")
    assert raw32.dtype == np.int32 and np.all(raw32 == k * 16384)
    small = AcceleratorConfig(acc_bits=16)
    raw16 = _run(op, x, (1, 1, 1, 2), out_dtype="int32", config=small)
    assert np.all(raw16 == (k * 16384 + 2 ** 15) % 2 ** 16 - 2 ** 15)
    # int path: the wrapped sum goes through the SFU (mult 1, shift 0): saturates at the top
    op_int = AccelOp("conv", "c", "x", "y", np.zeros(2), np.ones(2), np.zeros(2), 0, 0,
                     weights=weights, conv=ConvGeometry((3, 3)))
    assert np.all(_run(op_int, x, (1, 1, 1, 2)) == 127)


def test_saturation_at_both_ends_and_bias_saturation() -> None:
    x = np.array([[100, -100, 1]], np.int8)
    weights = np.array([[127], [0], [0]], np.int8)
    for bias, want in ((0, 127), (-30000, -128)):
        op = AccelOp("gemm", "g", "x", "y", [bias], [1], [0], 0, 0, weights=weights)
        assert _run(op, x, (1, 1))[0, 0] == want
    # the bias add saturates at the accumulator range before requantization
    op = AccelOp("gemm", "g", "x", "y", [2 ** 31 - 1], [1], [31], 0, 0, weights=weights)
    assert _run(op, x, (1, 1))[0, 0] == 1                # (2^31 - 1) >> 31 rounds to 1


def test_rounding_ties_go_to_even() -> None:
    """The SFU rounds half to even (before the zero point without a residual): 2.5 -> 2,
    -2.5 -> -2, -0.5 -> 0, 1.5 -> 2, -1.5 -> -2, 3.5 -> 4; then + zp_out 3."""
    acc = np.array([[5, -5, -1, 3, -3, 7]], np.int8)     # acc / 2 = 2.5, -2.5, -0.5, 1.5, -1.5, 3.5
    op = AccelOp("act", "a", "x", "y", np.zeros(6), np.ones(6), np.ones(6), 0, 3)
    np.testing.assert_array_equal(_run(op, acc, (1, 6)), [[5, 1, 3, 5, 1, 7]])


def test_activations_clamp_in_the_output_domain() -> None:
    x = np.arange(-128, 128, dtype=np.int8).reshape(1, 256)
    for act, lo, hi, want_lo, want_hi in (("none", -128, 127, -128, 127), ("relu", -128, 127, -5, 127),
                                          ("relu6", -128, 40, -5, 40), ("clip", -20, 60, -20, 60)):
        op = AccelOp("act", "a", "x", "y", np.full(256, 0), np.ones(256), np.zeros(256), 0, -5, act, lo, hi)
        y = _run(op, x, (1, 256)).astype(int)
        want = np.clip(x.astype(int) - 5, want_lo, want_hi)
        np.testing.assert_array_equal(y, want)


def test_depthwise_with_channel_multiplier() -> None:
    ci, mult, k = 3, 2, 3
    x = _ints((1, 5, 4, ci))
    weights = _ints((k * k, ci * mult))
    op = AccelOp("conv", "d", "x", "y", np.zeros(ci * mult), np.ones(ci * mult), np.full(ci * mult, 8), 7, 0,
                 weights=weights, conv=ConvGeometry((k, k), pads=(1, 1, 1, 1), group=ci))
    y = _run(op, x, (1, 5, 4, ci * mult))
    onnx_w = weights.reshape(k, k, 1, ci * mult).transpose(3, 2, 0, 1)
    acc = ConvInteger(x.transpose(0, 3, 1, 2), onnx_w, np.int8(7), None, pads=(1, 1, 1, 1), group=ci)
    acc = acc.astype(np.int64).transpose(0, 2, 3, 1) + 7 * weights.astype(np.int64).sum(axis=0)
    np.testing.assert_array_equal(y, np.clip(rounding_shift_even(acc, 8), -128, 127))


def _pool_reference(v: np.ndarray, pool: Pool, zp: int, mode: str, tie_out: int) -> np.ndarray:
    """Window-by-window loops, straight from docs/isa.md."""
    n, h, w, c = v.shape
    (ph, pw), (sh, sw), (pt, pl) = pool.window, pool.stride, pool.pads[:2]
    oh, ow = pool.out_hw
    out = np.zeros((n, oh, ow, c), np.int64)
    for b, oy, ox, ch in itertools.product(range(n), range(oh), range(ow), range(c)):
        inside, total = [], 0
        for i, j in itertools.product(range(ph), range(pw)):
            y, x = oy * sh - pt + i, ox * sw - pl + j
            if 0 <= y < h and 0 <= x < w:
                inside.append(int(v[b, y, x, ch]))
                total += int(v[b, y, x, ch])
            else:
                total += zp
        if mode == "max":
            out[b, oy, ox, ch] = max(inside)
        else:
            # half to even (Python's round of a Fraction), of the output with tie_out
            value = Fraction((total - ph * pw * zp) * pool.avg_mult, 1 << pool.avg_shift)
            rounded = round(value + zp) if tie_out else round(value) + zp
            out[b, oy, ox, ch] = min(127, max(-128, rounded))
    return out


@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("h, w, window, stride, pads", [
    (6, 6, (2, 2), (2, 2), (0, 0, 0, 0)),
    (5, 7, (3, 3), (2, 2), (1, 1, 1, 1)),      # partial windows at every border
    (1, 8, (1, 3), (1, 2), (0, 1, 0, 1)),      # 1xN
    (8, 1, (3, 1), (3, 1), (1, 0, 1, 0)),      # Nx1
    (4, 4, (4, 4), (1, 1), (0, 0, 0, 0)),      # global
])
def test_pooling_store(mode, h, w, window, stride, pads) -> None:
    x = _ints((2, h, w, 3))
    zp = -7
    out_hw = tuple((size + pads[i] + pads[i + 2] - window[i]) // stride[i] + 1
                   for i, size in enumerate((h, w)))
    avg_mult, avg_shift = choose_multiplier(1.0 / (window[0] * window[1])) if mode == "avg" else (0, 0)
    pool = Pool(mode, window, stride, pads, out_hw, avg_mult, avg_shift)
    op = AccelOp("pool", "p", "x", "y", np.full(3, -zp), np.ones(3), np.zeros(3), zp, zp, pool=pool)
    y = _run(op, x, (2, *out_hw, 3))
    np.testing.assert_array_equal(y, _pool_reference(x, pool, zp, mode, store_ties(op, (h, w))[1]))


def test_residual_add_path() -> None:
    a, r = _ints((1, 4, 4, 5)), _ints((1, 4, 4, 5))
    # the residual term shares the table entry's shift (docs/isa.md STORE): one rounding
    ma, sa = choose_multiplier(0.7)
    mr = round(0.45 * 2 ** sa)
    op = AccelOp("add", "add", "a", "y", np.full(5, 3), np.full(5, ma), np.full(5, sa), -3, 10,
                 residual=Residual("r", -20, mr, sa))
    y = _run(op, a, (1, 4, 4, 5), residual=r).astype(np.int64)
    # a tie goes to the even output (QLinearAdd adds the zero point before rounding)
    exact = [round(Fraction((int(av) + 3) * ma + (int(rv) + 20) * mr, 1 << sa) + 10)
             for av, rv in zip(a.ravel(), r.ravel(), strict=True)]
    np.testing.assert_array_equal(y, np.clip(np.array(exact).reshape(y.shape), -128, 127))
    # and it is the real-valued sum rounded once: within half a step (plus the multipliers' error)
    real = (a.astype(float) + 3) * 0.7 + (r.astype(float) + 20) * 0.45 + 10
    inside = (real > -127) & (real < 126)
    assert np.abs(y - real)[inside].max() <= 0.5 + 1e-6


def test_gemm_real_values_within_one_step() -> None:
    """A requantized gemm equals round(real result) to within one output step."""
    for m, k, n in ((1, 17, 5), (9, 1, 3), (4, 64, 1)):
        x, weights = _ints((m, k), extremes=False), _ints((k, n), extremes=False)
        sx, sw, sy, zx, zy = 0.02, RNG.uniform(0.001, 0.01, n), 0.5, 5, -3
        bias_real = RNG.uniform(-1, 1, n)
        b = quantize_bias(bias_real, sx * sw, "b")
        folded = b.astype(np.int64) - zx * weights.astype(np.int64).sum(axis=0)
        pairs = [choose_multiplier(s) for s in sx * sw / sy]
        op = AccelOp("gemm", "g", "x", "y", folded, [p[0] for p in pairs], [p[1] for p in pairs], zx, zy,
                     weights=weights)
        y = _run(op, x, (m, n)).astype(float)
        real = ((x.astype(float) - zx) @ (weights * sw) * sx + bias_real) / sy + zy
        inside = (real > -127) & (real < 126)
        assert np.abs(y - real)[inside].max() <= 1.0
