"""``ort_exact_pooling`` (``--ort-exact-pooling``): average pools bit-exact with onnxruntime.

The SFU rounds the exact window mean; onnxruntime's QLinearAveragePool computes in float32 (and,
on x86, on the uint8 version of an int8 QDQ model's tensors) and lands on the other side of a
tie now and then. With the option, pools whose accelerator result can differ run on the host as
numpy emulations of onnxruntime's kernels:

* the emulations equal onnxruntime's com.microsoft kernels on random and extreme int8/uint8
  inputs, zero points at the ends, many window/stride/padding combinations, count_include_pad 0
  and 1, ceil_mode, 1-D to 3-D, channels_last and the global kernels;
* ``ort_pool_may_differ`` keeps a pool on the accelerator only where both agree for every input;
* the ``avg_pool`` test model becomes bit-exact end to end and layer by layer; without the
  option nothing changes; strict, the run report and the command line.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from systolic.compiler import compile_model, run_model
from systolic.compiler.cli import main
from systolic.compiler.errors import UnsupportedOpError
from systolic.compiler.frontend import load_model
from systolic.compiler.ortsession import ort_session
from systolic.compiler.passes import (
    ORT_INT8_QDQ_AS_UINT8,
    HostFallbackWarning,
    PassOptions,
    emulate_ort_pooling,
    optimize,
    ort_pool_may_differ,
)
from systolic.compiler.reference import (
    EMULATED_OPS,
    EMULATION_DOMAIN,
    QLinearAveragePool,
    QLinearGlobalAveragePool,
    execute,
    run_node,
)
from systolic.sim.arith import avg_pool_finish, choose_multiplier

from tests.compiler import models
from tests.compiler.test_reference_ort import (
    _OUT_ZP,
    _TIE_INPUTS,
    SAMPLES,
    _inputs,
    _layer_by_layer,
    _real_output,
    _session,
    _tie_model,
)

RNG_SEED = 2024


def _ort_kernel(op: str, x: np.ndarray, xs: float, xz: int, ys: float, yz: int, **attrs) -> np.ndarray:
    """onnxruntime's own com.microsoft kernel on one node, no graph optimization."""
    dtype = TensorProto.INT8 if x.dtype == np.int8 else TensorProto.UINT8
    inits = [numpy_helper.from_array(np.array(xs, np.float32), "xs"),
             numpy_helper.from_array(np.array(xz, x.dtype), "xz"),
             numpy_helper.from_array(np.array(ys, np.float32), "ys"),
             numpy_helper.from_array(np.array(yz, x.dtype), "yz")]
    node = helper.make_node(op, ["x", "xs", "xz", "ys", "yz"], ["y"], domain="com.microsoft", **attrs)
    graph = helper.make_graph([node], "pool", [helper.make_tensor_value_info("x", dtype, list(x.shape))],
                              [helper.make_tensor_value_info("y", dtype, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    session = ort_session(model, optimize=False)
    return session.run(None, {"x": x})[0]


def _random_input(rng: np.random.Generator, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """Uniform values with whole rows at the type's two ends (saturating windows)."""
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max + 1, shape).astype(dtype)
    flat = x.reshape(-1, shape[-1])
    flat[::7] = info.min
    flat[3::7] = info.max
    return x


def _parameter_sets(dtype: type) -> list[tuple[float, int, float, int]]:
    """(x_scale, x_zp, y_scale, y_zp): equal and different scales, zero points at both ends."""
    info = np.iinfo(dtype)
    mid = (info.min + info.max) // 2
    return [(0.0371, mid + 3, 0.0371, mid + 3), (0.02, info.min, 0.0173, info.min),
            (0.11, info.max, 0.05, info.max), (0.0625, mid - 7, 0.013, mid + 40),
            (0.25, mid + 1, 0.125, mid + 1)]


# (shape, attributes): 1-D to 3-D windows, strides, padding, count_include_pad, ceil_mode, auto_pad
WINDOWS = [
    ((2, 3, 8, 8), dict(kernel_shape=[2, 2], strides=[2, 2])),
    ((1, 4, 7, 7), dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1)),
    ((1, 4, 7, 7), dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=0)),
    ((1, 3, 9, 7), dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1])),
    ((1, 2, 7, 7), dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1, count_include_pad=0)),
    ((1, 2, 7, 7), dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1, count_include_pad=1)),
    ((1, 2, 8, 8), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1,
                        count_include_pad=1)),
    ((1, 3, 7, 6), dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")),
    ((1, 3, 5, 5), dict(kernel_shape=[5, 5])),                    # onnxruntime's global fallback
    ((2, 3, 10), dict(kernel_shape=[3], strides=[2], pads=[1, 1], count_include_pad=1)),
    ((1, 2, 4, 5, 6), dict(kernel_shape=[2, 2, 3], strides=[2, 1, 3], pads=[1, 0, 0, 0, 1, 0])),
]


@pytest.mark.parametrize("dtype", [np.int8, np.uint8], ids=["int8", "uint8"])
@pytest.mark.parametrize("shape, attrs", WINDOWS, ids=[str(i) for i in range(len(WINDOWS))])
def test_average_pool_emulation_equals_onnxruntime(shape, attrs, dtype) -> None:
    rng = np.random.default_rng(RNG_SEED)
    for xs, xz, ys, yz in _parameter_sets(dtype):
        x = _random_input(rng, shape, dtype)
        theirs = _ort_kernel("QLinearAveragePool", x, xs, xz, ys, yz, **attrs)
        ours = QLinearAveragePool(x, np.float32(xs), dtype(xz), np.float32(ys), dtype(yz), **attrs)
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        np.testing.assert_array_equal(ours, theirs, err_msg=f"{attrs} {(xs, xz, ys, yz)}")


def test_average_pool_emulation_channels_last() -> None:
    rng = np.random.default_rng(RNG_SEED)
    x = _random_input(rng, (2, 7, 7, 5), np.int8)        # NHWC
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], channels_last=1)
    theirs = _ort_kernel("QLinearAveragePool", x, 0.0371, -3, 0.029, 4, **attrs)
    ours = QLinearAveragePool(x, np.float32(0.0371), np.int8(-3), np.float32(0.029), np.int8(4), **attrs)
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8], ids=["int8", "uint8"])
@pytest.mark.parametrize("shape, channels_last", [((2, 5, 6, 6), 0), ((1, 9, 7, 7), 0), ((2, 6, 6, 11), 1),
                                                  ((1, 3, 1, 1), 0)])
def test_global_average_pool_emulation_equals_onnxruntime(shape, channels_last, dtype) -> None:
    rng = np.random.default_rng(RNG_SEED)
    for xs, xz, ys, yz in _parameter_sets(dtype):
        x = _random_input(rng, shape, dtype)
        theirs = _ort_kernel("QLinearGlobalAveragePool", x, xs, xz, ys, yz, channels_last=channels_last)
        ours = QLinearGlobalAveragePool(x, np.float32(xs), dtype(xz), np.float32(ys), dtype(yz),
                                        channels_last=channels_last)
        np.testing.assert_array_equal(ours, theirs, err_msg=str((xs, xz, ys, yz)))


def test_uint8_emulation_of_int8_nodes() -> None:
    """``onnxruntime_uint8``: the int8 node computes what onnxruntime's kernel gives on the uint8
    version of its tensors -- which differs from the int8 kernel now and then."""
    rng = np.random.default_rng(RNG_SEED)
    handler = EMULATED_OPS["QLinearAveragePool"]
    attrs = dict(kernel_shape=[2, 2], strides=[2, 2])
    differ = 0
    for _ in range(6):
        x = _random_input(rng, (4, 8, 8, 8), np.int8)
        scale = np.float32(rng.uniform(0.01, 0.1))
        u8 = _ort_kernel("QLinearAveragePool", (x.astype(np.int16) + 128).astype(np.uint8), scale, 131, scale,
                         131, **attrs)
        ours = handler(x, scale, np.int8(3), scale, np.int8(3), onnxruntime_uint8=1, **attrs)
        np.testing.assert_array_equal(ours.astype(np.int16) + 128, u8)
        int8 = handler(x, scale, np.int8(3), scale, np.int8(3), onnxruntime_uint8=0, **attrs)
        np.testing.assert_array_equal(int8, _ort_kernel("QLinearAveragePool", x, scale, 3, scale, 3, **attrs))
        differ += int((ours != int8).sum())
    assert differ > 0, "the representation never mattered: the test is too weak"


# -- when the accelerator already agrees ----------------------------------------------------------


def _sfu_pool(windows: np.ndarray, xs: float, ys: float, zp: int, whole: bool) -> np.ndarray:
    """The SFU's average of int8 ``windows`` [..., count] (one zero point in and out)."""
    count = windows.shape[-1]
    mult, shift = choose_multiplier(xs / (ys * count))
    return avg_pool_finish(windows.astype(np.int64).sum(-1), count, zp_out=zp, avg_mult=mult,
                           avg_shift=shift, act=0, act_lo=-128, act_hi=127, out_range=(-128, 127),
                           tie_out=0 if whole else 1)


def _ort_pool_of_windows(windows: np.ndarray, xs: float, ys: float, zp: int, whole: bool) -> np.ndarray:
    """onnxruntime's kernel on int8 windows laid out as [..., kh, kw] images."""
    n, kh, kw = windows.shape
    x = windows.reshape(1, n, kh, kw)
    if whole:
        y = QLinearGlobalAveragePool(x, np.float32(xs), np.int8(zp), np.float32(ys), np.int8(zp))
        return y.reshape(n)
    # a kh x 2kw image with two windows side by side: the windowed (not the global) kernel
    wide = np.concatenate([x, x], axis=3)
    y = QLinearAveragePool(wide, np.float32(xs), np.int8(zp), np.float32(ys), np.int8(zp),
                           kernel_shape=[kh, kw], strides=[kh, kw])
    return y[0, :, 0, 0]


@pytest.mark.parametrize("xs, ys, zp, window, whole, differs", [
    (0.0371, 0.0371, 3, (3, 3), False, False),     # no ties (odd count), error margins hold
    (0.0371, 0.0371, -5, (7, 7), True, False),     # global 7x7: the same
    (0.25, 0.125, 5, (2, 2), False, False),        # every float32 step exact
    (0.125, 0.125, -7, (2, 4), True, False),
    (0.0371, 0.0371, 3, (2, 2), False, True),      # ties, float32 rounding
    (0.0371, 0.0371, 3, (6, 6), True, True),       # global kernel: ties at an even count
    (0.0371, 0.0290, 3, (3, 3), False, False),     # another ratio whose margins hold
    (0.03, 0.02, 3, (3, 3), False, True),          # a ratio near 1/6: S = 3 is a near-tie
])
def test_ort_pool_may_differ(xs, ys, zp, window, whole, differs) -> None:
    count = window[0] * window[1]
    assert ort_pool_may_differ(xs, ys, zp, count, whole) == differs
    rng = np.random.default_rng(RNG_SEED)
    # random windows (a tie every count-th one at an even count) and saturating ones
    windows = rng.integers(-128, 128, (20000, *window)).astype(np.int8)
    windows[:100] = -128
    windows[100:200] = 127
    ours = _sfu_pool(windows.reshape(len(windows), -1), xs, ys, zp, whole)
    theirs = _ort_pool_of_windows(windows, xs, ys, zp, whole)
    if not differs:
        np.testing.assert_array_equal(ours, theirs)
    elif ys == xs:      # ties (another ratio only comes close to them: not checked by sampling)
        assert np.any(ours != theirs), "no difference found where one was expected"


def _qdq_pool(pool: str = "AveragePool", shape: tuple[int, ...] = (1, 4, 6, 6), scale: float = 0.0371,
              zp: int = 3, tail: str | None = None) -> onnx.ModelProto:
    """input -> Q -> DQ -> ``pool`` (2x2 stride 2, or global) -> Q -> DQ [-> ``tail``], one scale
    and zero point throughout (0.0371: float32 roundings that the SFU does not make)."""
    inits = [numpy_helper.from_array(np.array(scale, np.float32), "s"),
             numpy_helper.from_array(np.array(zp, np.int8), "z")]
    attrs = dict(kernel_shape=[2, 2], strides=[2, 2]) if pool == "AveragePool" else {}
    n, c, h, w = shape
    out = [n, c, h // 2, w // 2] if pool == "AveragePool" else [n, c, 1, 1]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xf"]),
             helper.make_node(pool, ["xf"], ["pf"], name="pool", **attrs),
             helper.make_node("QuantizeLinear", ["pf", "s", "z"], ["pq"]),
             helper.make_node("DequantizeLinear", ["pq", "s", "z"], ["y" if tail is None else "yf"])]
    if tail is not None:
        nodes.append(helper.make_node(tail, ["yf"], ["y"], name="squash"))
    return models.make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)], inits,
                             name="qdq_pool")


def _identical(model: onnx.ModelProto, graph, feeds: list[dict[str, np.ndarray]]) -> float:
    session = _session(model)
    same = [execute(graph, f)["y"] == session.run(None, f)[0] for f in feeds]
    return float(np.mean(np.concatenate([s.ravel() for s in same])))


def test_global_average_pool_differs_from_the_accelerator() -> None:
    """Why ort_exact_pooling covers GlobalAveragePool too. onnxruntime's global kernel multiplies
    the exact sum by a float32 scale, which snaps an exact tie back onto the tie (rounded half to
    even), while the SFU's fixed-point 1/36 is a little off and rounds ties one way: a 6x6 image
    differs. At the test models' 3x3 (odd count: no ties, wide margins) they cannot differ and
    the pool stays on the accelerator."""
    model = _qdq_pool("GlobalAveragePool", (1, 16, 6, 6))
    rng = np.random.default_rng(RNG_SEED)
    feeds = [{"x": rng.uniform(-4.8, 4.8, (1, 16, 6, 6)).astype(np.float32)} for _ in range(40)]
    default, _ = _optimize(model, strict=True)
    assert [op.kind for op in default.accel_ops] == ["pool"]
    assert _identical(model, default, feeds) < 1.0
    exact, warned = _optimize(model, ort_exact_pooling=True)
    assert not exact.accel_ops and [(n.name, n.op) for n in exact.host_nodes if n.domain] == \
        [("pool", "QLinearGlobalAveragePool")]
    assert _identical(model, exact, feeds) == 1.0
    float_model = models.global_avg_pool()
    qmodel = models.quantize_qdq(float_model, models.calibration_set(float_model, 16))
    graph, warned = _optimize(qmodel, ort_exact_pooling=True)
    assert warned == [] and not [n for n in graph.host_nodes if n.domain]
    assert any(op.pool is not None for op in graph.accel_ops)


@pytest.mark.parametrize("op, shape", [("AveragePool", (2, 8, 8, 8)), ("WholeAveragePool", (2, 8, 2, 2)),
                                       ("GlobalAveragePool", (2, 8, 2, 2))])
def test_exact_float32_pools_stay_on_the_accelerator(op, shape) -> None:
    """Power-of-two scales and counts: onnxruntime's float32 steps are all exact, so the SFU's
    tie rule gives its results (many outputs are exact ties) and the option leaves the pool on
    the accelerator."""
    model = _tie_model(op, shape)
    graph, warned = _optimize(model, strict=True, ort_exact_pooling=True)
    assert warned == [] and [o.kind for o in graph.accel_ops] == ["pool"]
    session = _session(model)
    rng = np.random.default_rng(11)
    ties = total = 0
    for _ in range(4):
        feeds = {name: ((rng.integers(-127, 128, shape) - zp) * scale).astype(np.float32)
                 for name, (scale, zp) in _TIE_INPUTS[op].items()}
        real = _real_output(model, feeds) + _OUT_ZP
        ties += int((real - np.floor(real) == 0.5).sum())
        total += real.size
        np.testing.assert_array_equal(execute(graph, feeds)["y"], session.run(None, feeds)[0])
    assert ties >= 0.1 * total


def test_average_pool_with_the_option_on_a_small_model() -> None:
    model = _qdq_pool()
    rng = np.random.default_rng(RNG_SEED)
    feeds = [{"x": rng.uniform(-4.8, 4.8, (1, 4, 6, 6)).astype(np.float32)} for _ in range(40)]
    default, _ = _optimize(model)
    assert _identical(model, default, feeds) < 1.0
    exact, _ = _optimize(model, ort_exact_pooling=True)
    assert _identical(model, exact, feeds) == 1.0


# -- the avg_pool model ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def avg_pool_qdq() -> onnx.ModelProto:
    model = models.avg_pool()
    return models.quantize_qdq(model, models.calibration_set(model, 16))


def _optimize(qmodel: onnx.ModelProto, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph = optimize(load_model(qmodel), **kw)
    return graph, [str(w.message) for w in caught if issubclass(w.category, HostFallbackWarning)]


def test_avg_pool_model_is_bit_exact_with_the_option(avg_pool_qdq) -> None:
    graph, warned = _optimize(avg_pool_qdq, ort_exact_pooling=True)
    emulated = [n for n in graph.host_nodes if n.domain == EMULATION_DOMAIN]
    assert [(n.name, n.op, n.attrs["onnxruntime_uint8"]) for n in emulated] == \
        [("avg0", "QLinearAveragePool", int(ORT_INT8_QDQ_AS_UINT8))]
    assert warned == ["1 node(s) run on the host: 'avg0' (QLinearAveragePool: onnxruntime's kernel "
                      "emulated bit for bit (ort_exact_pooling))"]
    # the 3x3 pool (count 9, equal scales: no ties, wide margins) stays fused on the accelerator
    assert [(op.name, op.pool is not None) for op in graph.accel_ops] == \
        [("conv0", False), ("conv1", True), ("fc", False)]
    session = _session(avg_pool_qdq)
    out = avg_pool_qdq.graph.output[0].name
    for feeds in _inputs(avg_pool_qdq, SAMPLES):
        np.testing.assert_array_equal(execute(graph, feeds)[out], session.run(None, feeds)[0])


def _ort_pool_io(qmodel: onnx.ModelProto, feeds: dict[str, np.ndarray],
                 path: Path) -> list[tuple[onnx.NodeProto, list]]:
    """onnxruntime's own QLinearAveragePool nodes of the session it builds for ``qmodel`` and their
    input and output values: its optimized graph (saved to ``path``) with every pool's input and
    output exposed, run without further optimization."""
    ort_session(qmodel, optimized_model_path=path)
    optimized = onnx.load(path)
    pools = [n for n in optimized.graph.node if n.op_type == "QLinearAveragePool"]
    types = {t.name: t.data_type for t in optimized.graph.initializer}
    for node in pools:
        for name in (node.input[0], node.output[0]):      # typed as the node's zero point
            optimized.graph.output.append(helper.make_tensor_value_info(name, types[node.input[2]], None))
    session = ort_session(optimized, optimize=False)
    values = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
    inits = {t.name: numpy_helper.to_array(t) for t in optimized.graph.initializer}
    return [(n, [values[n.input[0]], *(inits[i] for i in n.input[1:]), values[n.output[0]]]) for n in pools]


def test_avg_pool_model_layer_by_layer(avg_pool_qdq, tmp_path: Path) -> None:
    """Every accelerator layer fed onnxruntime's int8 inputs gives its outputs exactly; the host
    pool fed the input of onnxruntime's own QLinearAveragePool (in the session onnxruntime builds
    for the model: uint8 and NHWC on x86) gives that kernel's output exactly."""
    graph, _ = _optimize(avg_pool_qdq, ort_exact_pooling=True)
    stats = _layer_by_layer(avg_pool_qdq, graph)
    assert set(stats) == {"conv0", "conv1", "fc"}
    for name, st in stats.items():
        assert st["same"] == st["total"], (name, st)
    node = next(n for n in graph.host_nodes if n.domain == EMULATION_DOMAIN)
    compared = 0
    for feeds in _inputs(avg_pool_qdq, SAMPLES):
        ort_node, (x, xs, xz, ys, yz, y) = _ort_pool_io(avg_pool_qdq, feeds, tmp_path / "o.onnx")[0]
        last = any(a.name == "channels_last" and a.i for a in ort_node.attribute)
        if last:
            x, y = x.transpose(0, 3, 1, 2), y.transpose(0, 3, 1, 2)
        uint8 = x.dtype == np.uint8
        assert uint8 == ORT_INT8_QDQ_AS_UINT8
        if uint8:   # our node holds the int8 version
            x, y = (x.astype(np.int16) - 128).astype(np.int8), (y.astype(np.int16) - 128).astype(np.int8)
            xz, yz = np.int8(int(xz) - 128), np.int8(int(yz) - 128)
        (ours,) = run_node(node, [x, xs, xz, ys, yz], graph.opset)
        np.testing.assert_array_equal(ours, y)
        compared += y.size
    assert compared > 0


def test_avg_pool_model_without_the_option_is_unchanged(avg_pool_qdq) -> None:
    default, warned = _optimize(avg_pool_qdq)
    off, _ = _optimize(avg_pool_qdq, ort_exact_pooling=False)
    assert warned == [] and not [n for n in default.host_nodes if n.domain]
    assert [repr(n) for n in default.nodes] == [repr(n) for n in off.nodes]
    assert [(op.name, op.pool is not None) for op in default.accel_ops] == \
        [("conv0", True), ("conv1", True), ("fc", False)]
    loaded = load_model(avg_pool_qdq)
    assert emulate_ort_pooling(loaded, PassOptions()) is loaded         # a no-op without the option
    on = compile_model(avg_pool_qdq, ort_exact_pooling=False)
    plain = compile_model(avg_pool_qdq)
    assert [s.estimate for s in on.segments] == [s.estimate for s in plain.segments]
    assert len(plain.segments) == 1


@pytest.mark.parametrize("fmt, act", [("QDQ", "QUInt8"), ("QOperator", "QInt8"), ("QOperator", "QUInt8")])
def test_other_quantization_formats_are_bit_exact(fmt, act) -> None:
    model = models.avg_pool()
    qmodel = models.quantize_qdq(model, models.calibration_set(model, 16), quant_format=fmt,
                                 activation_type=act)
    graph, _ = _optimize(qmodel, ort_exact_pooling=True)
    emulated = [n for n in graph.host_nodes if n.domain == EMULATION_DOMAIN]
    assert emulated and all(n.attrs["onnxruntime_uint8"] == 0 for n in emulated)   # as the model stores it
    session = _session(qmodel)
    out = qmodel.graph.output[0].name
    for feeds in _inputs(qmodel, SAMPLES):
        np.testing.assert_array_equal(execute(graph, feeds)[out], session.run(None, feeds)[0])


def test_run_report_lists_the_host_pool(avg_pool_qdq) -> None:
    with pytest.warns(HostFallbackWarning, match="'avg0' \\(QLinearAveragePool"):
        compiled = compile_model(avg_pool_qdq, ort_exact_pooling=True)
    assert len(compiled.segments) == 2              # the host pool splits the program
    feeds = _inputs(avg_pool_qdq, 3)
    x = np.concatenate([f["input"] for f in feeds])
    result = run_model(compiled, {"input": x})
    layers = result.report["layers"]
    pools = [(la["name"], la["op"]) for la in layers if la["host"] and la["op"] == "QLinearAveragePool"]
    assert pools == [("avg0", "QLinearAveragePool")]
    assert [layer["name"] for layer in layers if not layer["host"]] == ["conv0", "conv1", "fc"]
    session = _session(avg_pool_qdq)
    expected = np.concatenate([session.run(None, f)[0] for f in feeds])
    np.testing.assert_array_equal(result.outputs["logits"], expected)
    # the keyword of run_model compiles with the option too
    with pytest.warns(HostFallbackWarning):
        again = run_model(avg_pool_qdq, {"input": x}, ort_exact_pooling=True)
    np.testing.assert_array_equal(again.outputs["logits"], expected)


# -- strict ------------------------------------------------------------------------------------------


def test_strict_allows_the_emulated_pools_only() -> None:
    graph, warned = _optimize(_qdq_pool(), strict=True, ort_exact_pooling=True)
    assert [(n.name, n.op) for n in graph.host_nodes if n.domain] == [("pool", "QLinearAveragePool")]
    assert len(warned) == 1 and "'pool' (QLinearAveragePool" in warned[0]
    with pytest.raises(UnsupportedOpError, match=re.escape(
            "node 'squash' (Sigmoid) cannot run on the accelerator; strict=True forbids running it on "
            "the host")):
        _optimize(_qdq_pool(tail="Sigmoid"), strict=True, ort_exact_pooling=True)
    # without the option the pool is an accelerator op, and strict is satisfied
    graph, warned = _optimize(_qdq_pool(), strict=True)
    assert warned == [] and [op.kind for op in graph.accel_ops] == ["pool"]


# -- command line ------------------------------------------------------------------------------------


def test_command_line_flag(capsys, avg_pool_qdq, tmp_path: Path) -> None:
    onnx.save(avg_pool_qdq, tmp_path / "m.onnx")
    feeds = _inputs(avg_pool_qdq, 2)
    x = np.concatenate([f["input"] for f in feeds])
    np.save(tmp_path / "x.npy", x)
    code = main(["run", str(tmp_path / "m.onnx"), "--input", str(tmp_path / "x.npy"), "--ort-exact-pooling",
                 "--strict", "--output", str(tmp_path / "y.npz"), "--report", str(tmp_path / "r.json")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert err == ("systolic: warning: 1 node(s) run on the host: 'avg0' (QLinearAveragePool: onnxruntime's "
                   "kernel emulated bit for bit (ort_exact_pooling))\n")
    session = _session(avg_pool_qdq)
    with np.load(tmp_path / "y.npz") as saved:
        expected = np.concatenate([session.run(None, f)[0] for f in feeds])
        np.testing.assert_array_equal(saved["logits"], expected)
    report = json.loads((tmp_path / "r.json").read_text())
    layers = [(la["name"], la["op"], la["host"]) for la in report["layers"]]
    assert ("avg0", "QLinearAveragePool", True) in layers
    code = main(["compile", str(tmp_path / "m.onnx"), "--ort-exact-pooling", "--out", str(tmp_path / "c")])
    out, err = capsys.readouterr()
    assert code == 0 and "3 accelerator layers in 2 program(s)" in out
    plan = json.loads((tmp_path / "c" / "plan.json").read_text())
    assert "QLinearAveragePool" in json.dumps(plan)
    # without the flag: one program, no warning
    code = main(["compile", str(tmp_path / "m.onnx"), "--out", str(tmp_path / "d")])
    out, err = capsys.readouterr()
    assert code == 0 and err == "" and "in 1 program(s)" in out


@pytest.mark.skipif(not ORT_INT8_QDQ_AS_UINT8, reason="onnxruntime keeps int8 QDQ on ARM")
def test_pool_onnxruntime_runs_in_float_is_left_alone(tmp_path: Path) -> None:
    """A pool whose output Q/DQ pair feeds two nodes: onnxruntime converts the input pair to
    uint8 but not the output pair (it duplicates the DequantizeLinear), so it cannot fuse the
    pool and runs it in float; the pass does not pretend to emulate that."""
    model = _qdq_pool(tail="Sigmoid")
    extra = helper.make_node("Relu", ["yf"], ["y2"], name="relu")
    model.graph.node.append(extra)
    model.graph.output.append(helper.make_tensor_value_info("y2", TensorProto.FLOAT, [1, 4, 3, 3]))
    ort_session(model, optimized_model_path=tmp_path / "o.onnx")
    assert "AveragePool" in [n.op_type for n in onnx.load(tmp_path / "o.onnx").graph.node]
    graph, _ = _optimize(model, ort_exact_pooling=True)
    assert not [n for n in graph.host_nodes if n.domain] and [o.kind for o in graph.accel_ops] == ["pool"]


def test_global_pool_outside_onnxruntime_range_is_refused() -> None:
    """onnxruntime's global-average kernel takes scales x_scale / (y_scale * count) in
    [2**-32, 256) only; the emulation refuses the rest rather than compute what it would not."""
    x = np.zeros((1, 1, 2, 2), np.int8)
    scale = np.float32(np.float32(1.0) / np.float32(np.float32(1e-4) * np.float32(4)))
    with pytest.raises(UnsupportedOpError, match=re.escape(
            f"onnxruntime's QLinearGlobalAveragePool rejects scale {float(scale)!r} and image size 4 "
            f"(out of its computation range)")):
        QLinearGlobalAveragePool(x, np.float32(1.0), 0, np.float32(1e-4), 0)
    # inside the range: computed
    assert QLinearGlobalAveragePool(x + 3, np.float32(1.0), 0, np.float32(1.0), 0).tolist() == [[[[3]]]]
