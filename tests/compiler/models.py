"""Small ONNX models for the compiler tests, built with onnx.helper (float, opset 13, IR version 8 so
that onnxruntime loads them), and their int8 versions made by onnxruntime's quantize_static."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "OPSET", "IR_VERSION", "make_model", "conv_relu_pool_gemm", "residual_add", "depthwise",
    "avg_pool", "global_avg_pool", "matmul_bias", "conv_bn_relu6", "concat_branches", "preact_scale",
    "qoperator_matmul_integer", "calibration_set", "quantize_qdq", "single_node",
]

OPSET = 13
IR_VERSION = 8


def make_model(nodes: Sequence[onnx.NodeProto], inputs: Sequence[onnx.ValueInfoProto],
               outputs: Sequence[onnx.ValueInfoProto], initializers: Sequence[onnx.TensorProto] = (),
               *, opset: int = OPSET, name: str = "test") -> onnx.ModelProto:
    """A checked model with the given graph, opset and IR version 8."""
    graph = helper.make_graph(list(nodes), name, list(inputs), list(outputs), list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def _init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def _f32(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _conv_weights(rng: np.random.Generator, co: int, ci: int, k: int) -> np.ndarray:
    return _f32(rng, co, ci, k, k, scale=1.0 / np.sqrt(ci * k * k))


def _vi(name: str, shape: Sequence[int | str], dtype: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, list(shape))


def conv_relu_pool_gemm(seed: int = 0, *, channels: int = 3, size: int = 8) -> onnx.ModelProto:
    """conv 3x3 pad 1 -> relu -> maxpool 2x2 -> conv 3x3 stride 1 no pad -> relu -> flatten ->
    gemm (transB) -> relu -> gemm."""
    rng = np.random.default_rng(seed)
    c1, c2, hidden, classes = 8, 12, 16, 10
    s2 = size // 2 - 2
    inits = [
        _init("w1", _conv_weights(rng, c1, channels, 3)), _init("b1", _f32(rng, c1, scale=0.1)),
        _init("w2", _conv_weights(rng, c2, c1, 3)), _init("b2", _f32(rng, c2, scale=0.1)),
        _init("w3", _f32(rng, hidden, c2 * s2 * s2, scale=1 / np.sqrt(c2 * s2 * s2))),
        _init("b3", _f32(rng, hidden, scale=0.1)),
        _init("w4", _f32(rng, hidden, classes, scale=1 / np.sqrt(hidden))),
        _init("b4", _f32(rng, classes, scale=0.1)),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1],
                         kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], name="conv2", kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Flatten", ["r2"], ["f"], name="flatten", axis=1),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["g1"], name="fc1", transB=1),
        helper.make_node("Relu", ["g1"], ["r3"], name="relu3"),
        helper.make_node("Gemm", ["r3", "w4", "b4"], ["logits"], name="fc2"),
    ]
    return make_model(nodes, [_vi("input", [1, channels, size, size])], [_vi("logits", [1, classes])],
                      inits, name="conv_relu_pool_gemm")


def residual_add(seed: int = 0, *, channels: int = 8, size: int = 6) -> onnx.ModelProto:
    """conv -> relu -> conv -> (+ skip) -> relu -> conv 1x1 -> (+ skip of the first add) ->
    global average pool -> flatten -> gemm: two residual adds, one followed by a relu."""
    rng = np.random.default_rng(seed)
    c = channels
    inits = [
        _init("w0", _conv_weights(rng, c, 3, 3)), _init("b0", _f32(rng, c, scale=0.1)),
        _init("w1", _conv_weights(rng, c, c, 3)), _init("b1", _f32(rng, c, scale=0.1)),
        _init("w2", _conv_weights(rng, c, c, 3)), _init("b2", _f32(rng, c, scale=0.1)),
        _init("w3", _conv_weights(rng, c, c, 1)), _init("b3", _f32(rng, c, scale=0.1)),
        _init("wf", _f32(rng, 5, c, scale=1 / np.sqrt(c))), _init("bf", _f32(rng, 5, scale=0.1)),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "w0", "b0"], ["c0"], name="stem", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["x0"], name="stem_relu"),
        helper.make_node("Conv", ["x0", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "x0"], ["s1"], name="add1"),
        helper.make_node("Relu", ["s1"], ["x1"], name="relu_add1"),
        helper.make_node("Conv", ["x1", "w3", "b3"], ["c3"], name="conv3"),
        helper.make_node("Add", ["x1", "c3"], ["s2"], name="add2"),
        helper.make_node("GlobalAveragePool", ["s2"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "wf", "bf"], ["logits"], name="fc", transB=1),
    ]
    return make_model(nodes, [_vi("input", [1, 3, size, size])], [_vi("logits", [1, 5])], inits,
                      name="residual_add")


def depthwise(seed: int = 0, *, channels: int = 6, size: int = 7) -> onnx.ModelProto:
    """conv 1x1 -> relu6 (Clip 0..6) -> depthwise 3x3 stride 2 pad 1 -> relu -> conv 1x1 (a
    MobileNet block) -> flatten -> gemm."""
    rng = np.random.default_rng(seed)
    c = channels
    out = (size + 2 - 3) // 2 + 1
    inits = [
        _init("w0", _conv_weights(rng, c, 3, 1)), _init("b0", _f32(rng, c, scale=0.1)),
        _init("wd", _f32(rng, c, 1, 3, 3, scale=0.4)), _init("bd", _f32(rng, c, scale=0.1)),
        _init("w1", _conv_weights(rng, 4, c, 1)), _init("b1", _f32(rng, 4, scale=0.1)),
        _init("lo", np.array(0.0, np.float32)), _init("hi", np.array(6.0, np.float32)),
        _init("wf", _f32(rng, 4 * out * out, 3, scale=0.2)), _init("bf", _f32(rng, 3, scale=0.1)),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "w0", "b0"], ["c0"], name="expand"),
        helper.make_node("Clip", ["c0", "lo", "hi"], ["x0"], name="relu6"),
        helper.make_node("Conv", ["x0", "wd", "bd"], ["cd"], name="dw", group=c, pads=[1, 1, 1, 1],
                         strides=[2, 2]),
        helper.make_node("Relu", ["cd"], ["xd"], name="dw_relu"),
        helper.make_node("Conv", ["xd", "w1", "b1"], ["c1"], name="project"),
        helper.make_node("Flatten", ["c1"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "wf", "bf"], ["logits"], name="fc"),
    ]
    return make_model(nodes, [_vi("input", [1, 3, size, size])], [_vi("logits", [1, 3])], inits,
                      name="depthwise")


def avg_pool(seed: int = 0, *, size: int = 8) -> onnx.ModelProto:
    """conv -> relu -> average pool 2x2 -> conv -> average pool 3x3 stride 1 pad 1
    (count_include_pad) -> flatten -> gemm."""
    rng = np.random.default_rng(seed)
    s = size // 2
    inits = [
        _init("w0", _conv_weights(rng, 8, 2, 3)), _init("b0", _f32(rng, 8, scale=0.1)),
        _init("w1", _conv_weights(rng, 6, 8, 1)), _init("b1", _f32(rng, 6, scale=0.1)),
        _init("wf", _f32(rng, 6 * s * s, 4, scale=1 / np.sqrt(6 * s * s))),
        _init("bf", _f32(rng, 4, scale=0.1)),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "w0", "b0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
        helper.make_node("AveragePool", ["r0"], ["p0"], name="avg0", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p0", "w1", "b1"], ["c1"], name="conv1"),
        helper.make_node("AveragePool", ["c1"], ["p1"], name="avg1", kernel_shape=[3, 3],
                         pads=[1, 1, 1, 1], count_include_pad=1),
        helper.make_node("Flatten", ["p1"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "wf", "bf"], ["logits"], name="fc"),
    ]
    return make_model(nodes, [_vi("input", [1, 2, size, size])], [_vi("logits", [1, 4])], inits,
                      name="avg_pool")


def global_avg_pool(seed: int = 0, *, size: int = 5) -> onnx.ModelProto:
    """conv -> relu -> conv -> relu -> global average pool -> flatten -> gemm."""
    rng = np.random.default_rng(seed)
    inits = [
        _init("w0", _conv_weights(rng, 8, 3, 3)), _init("b0", _f32(rng, 8, scale=0.1)),
        _init("w1", _conv_weights(rng, 16, 8, 3)), _init("b1", _f32(rng, 16, scale=0.1)),
        _init("wf", _f32(rng, 6, 16, scale=0.25)), _init("bf", _f32(rng, 6, scale=0.1)),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "w0", "b0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
        helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1],
                         strides=[2, 2]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("GlobalAveragePool", ["r1"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "wf", "bf"], ["logits"], name="fc", transB=1),
    ]
    return make_model(nodes, [_vi("input", [1, 3, size, size])], [_vi("logits", [1, 6])], inits,
                      name="global_avg_pool")


def matmul_bias(seed: int = 0, *, batch: int = 3, features: int = 12) -> onnx.ModelProto:
    """PyTorch-style linear layers: MatMul + Add(bias) -> Relu -> MatMul + Add(bias), batch of rows."""
    rng = np.random.default_rng(seed)
    inits = [
        _init("w0", _f32(rng, features, 20, scale=1 / np.sqrt(features))), _init("b0", _f32(rng, 20)),
        _init("w1", _f32(rng, 20, 7, scale=1 / np.sqrt(20))), _init("b1", _f32(rng, 7)),
    ]
    nodes = [
        helper.make_node("MatMul", ["input", "w0"], ["m0"], name="mm0"),
        helper.make_node("Add", ["m0", "b0"], ["a0"], name="bias0"),
        helper.make_node("Relu", ["a0"], ["r0"], name="relu0"),
        helper.make_node("MatMul", ["r0", "w1"], ["m1"], name="mm1"),
        helper.make_node("Add", ["m1", "b1"], ["out"], name="bias1"),
    ]
    return make_model(nodes, [_vi("input", [batch, features])], [_vi("out", [batch, 7])], inits,
                      name="matmul_bias")


def conv_bn_relu6(seed: int = 0, *, size: int = 6) -> onnx.ModelProto:
    """conv (no bias) -> BatchNormalization -> Clip(0, 6) -> conv -> BatchNormalization -> output."""
    rng = np.random.default_rng(seed)
    inits = [
        _init("w0", _conv_weights(rng, 8, 3, 3)),
        _init("g0", rng.uniform(0.5, 1.5, 8).astype(np.float32)), _init("be0", _f32(rng, 8, scale=0.2)),
        _init("m0", _f32(rng, 8, scale=0.2)), _init("v0", rng.uniform(0.5, 2.0, 8).astype(np.float32)),
        _init("w1", _conv_weights(rng, 4, 8, 3)), _init("b1", _f32(rng, 4, scale=0.1)),
        _init("g1", rng.uniform(0.5, 1.5, 4).astype(np.float32)), _init("be1", _f32(rng, 4, scale=0.2)),
        _init("m1", _f32(rng, 4, scale=0.2)), _init("v1", rng.uniform(0.5, 2.0, 4).astype(np.float32)),
        _init("lo", np.array(0.0, np.float32)), _init("hi", np.array(6.0, np.float32)),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "w0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c0", "g0", "be0", "m0", "v0"], ["n0"], name="bn0"),
        helper.make_node("Clip", ["n0", "lo", "hi"], ["x0"], name="relu6"),
        helper.make_node("Conv", ["x0", "w1", "b1"], ["c1"], name="conv1", pads=[0, 0, 1, 1],
                         strides=[2, 2]),
        helper.make_node("BatchNormalization", ["c1", "g1", "be1", "m1", "v1"], ["out"], name="bn1"),
    ]
    out = (size + 1 - 3) // 2 + 1
    return make_model(nodes, [_vi("input", [1, 3, size, size])], [_vi("out", [1, 4, out, out])], inits,
                      name="conv_bn_relu6")


def preact_scale(seed: int = 0, *, size: int = 6) -> onnx.ModelProto:
    """Pre-activation block: BatchNormalization (not after a conv) -> Relu -> conv -> Mul by a
    per-channel constant -> Sub of a per-channel constant -> Relu -> global average pool -> Gemm."""
    rng = np.random.default_rng(seed)
    inits = [
        _init("g", rng.uniform(0.5, 1.5, 3).astype(np.float32)), _init("b", _f32(rng, 3, scale=0.3)),
        _init("m", _f32(rng, 3, scale=0.3)), _init("v", rng.uniform(0.5, 2.0, 3).astype(np.float32)),
        _init("w0", _conv_weights(rng, 5, 3, 3)), _init("b0", _f32(rng, 5, scale=0.1)),
        _init("k", rng.uniform(-2.0, 2.0, (1, 5, 1, 1)).astype(np.float32)),
        _init("c", _f32(rng, 1, 5, 1, 1, scale=0.5)),
        _init("wf", _f32(rng, 4, 5, scale=0.5)), _init("bf", _f32(rng, 4, scale=0.1)),
    ]
    nodes = [
        helper.make_node("BatchNormalization", ["input", "g", "b", "m", "v"], ["n"], name="bn"),
        helper.make_node("Relu", ["n"], ["r"], name="relu_in"),
        helper.make_node("Conv", ["r", "w0", "b0"], ["c0"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["c0", "k"], ["scaled"], name="scale"),
        helper.make_node("Sub", ["scaled", "c"], ["shifted"], name="shift"),
        helper.make_node("Relu", ["shifted"], ["r1"], name="relu_out"),
        helper.make_node("GlobalAveragePool", ["r1"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "wf", "bf"], ["logits"], name="fc", transB=1),
    ]
    return make_model(nodes, [_vi("input", [1, 3, size, size])], [_vi("logits", [1, 4])], inits,
                      name="preact_scale")


def concat_branches(seed: int = 0, *, size: int = 6) -> onnx.ModelProto:
    """Two conv branches (1x1 and 3x3) concatenated on channels -> conv 1x1 -> output (an
    Inception-style block)."""
    rng = np.random.default_rng(seed)
    inits = [
        _init("wa", _conv_weights(rng, 4, 3, 1)), _init("ba", _f32(rng, 4, scale=0.1)),
        _init("wb", _conv_weights(rng, 5, 3, 3)), _init("bb", _f32(rng, 5, scale=0.1)),
        _init("wc", _conv_weights(rng, 6, 9, 1)), _init("bc", _f32(rng, 6, scale=0.1)),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "wa", "ba"], ["ca"], name="branch_a"),
        helper.make_node("Relu", ["ca"], ["ra"], name="relu_a"),
        helper.make_node("Conv", ["input", "wb", "bb"], ["cb"], name="branch_b", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["cb"], ["rb"], name="relu_b"),
        helper.make_node("Concat", ["ra", "rb"], ["cat"], name="concat", axis=1),
        helper.make_node("Conv", ["cat", "wc", "bc"], ["out"], name="mix"),
    ]
    return make_model(nodes, [_vi("input", [1, 3, size, size])], [_vi("out", [1, 6, size, size])],
                      inits, name="concat_branches")


def qoperator_matmul_integer(seed: int = 0) -> onnx.ModelProto:
    """A hand-written integer model: QuantizeLinear (uint8, zero point 131) -> MatMulInteger with
    int8 weights (zero point 0) -> Cast -> Mul(scale) -> output, plus a ConvInteger branch with
    padding."""
    rng = np.random.default_rng(seed)
    w = rng.integers(-128, 128, (6, 5)).astype(np.int8)
    wc = rng.integers(-128, 128, (3, 2, 3, 3)).astype(np.int8)
    inits = [
        _init("x_scale", np.array(0.05, np.float32)), _init("x_zp", np.array(131, np.uint8)),
        _init("w", w), _init("w_zp", np.array(0, np.int8)),
        _init("y_scale", np.array(0.05 * 0.01, np.float32)),
        _init("wc", wc), _init("shape", np.array([1, 2, 3, 1], np.int64)),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["input", "x_scale", "x_zp"], ["xq"], name="quant"),
        helper.make_node("MatMulInteger", ["xq", "w", "x_zp", "w_zp"], ["acc"], name="mmi"),
        helper.make_node("Cast", ["acc"], ["accf"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("Mul", ["accf", "y_scale"], ["out"], name="rescale"),
        helper.make_node("Reshape", ["xq", "shape"], ["xq4"], name="to_image"),
        helper.make_node("ConvInteger", ["xq4", "wc", "x_zp"], ["conv_acc"], name="convi",
                         pads=[1, 1, 1, 1]),
    ]
    return make_model(nodes, [_vi("input", [1, 6])],
                      [_vi("out", [1, 5]), _vi("conv_acc", [1, 3, 3, 1], TensorProto.INT32)], inits,
                      name="qoperator_matmul_integer")


def calibration_set(model: onnx.ModelProto, count: int, seed: int = 1, *,
                    low: float = -1.0, high: float = 1.0) -> dict[str, np.ndarray]:
    """Random calibration inputs: ``count`` batches of every float graph input, concatenated on
    the batch axis."""
    rng = np.random.default_rng(seed)
    out = {}
    for vi in model.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        out[vi.name] = rng.uniform(low, high, [shape[0] * count] + shape[1:]).astype(np.float32)
    return out


def quantize_qdq(model: onnx.ModelProto, calibration: dict[str, np.ndarray], *, per_channel: bool = True,
                 quant_format: str = "QDQ", activation_type: str = "QInt8",
                 extra_options: dict | None = None) -> onnx.ModelProto:
    """The int8 model onnxruntime.quantization.quantize_static makes from ``model``, calibrated on
    ``calibration`` (batches of the graph input's batch size)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    names = list(calibration)
    batch = {vi.name: vi.type.tensor_type.shape.dim[0].dim_value for vi in model.graph.input}

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            count = len(calibration[names[0]]) // batch[names[0]]
            self.items = iter([{n: calibration[n][i * batch[n]:(i + 1) * batch[n]] for n in names}
                               for i in range(count)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.items, None)

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp, "float.onnx"), Path(tmp, "int8.onnx")
        onnx.save(model, src)
        quantize_static(str(src), str(dst), Reader(), quant_format=getattr(QuantFormat, quant_format),
                        per_channel=per_channel, activation_type=getattr(QuantType, activation_type),
                        weight_type=QuantType.QInt8, extra_options=extra_options or {})
        out = onnx.load(dst)
    out.ir_version = min(out.ir_version, 10)
    return out


def single_node(op: str, inputs: Sequence[tuple[str, Sequence[int | str]]],
                outputs: Sequence[tuple[str, Sequence[int | str]]],
                initializers: dict[str, np.ndarray] | None = None, *, opset: int = OPSET,
                input_names: Sequence[str] | None = None, **attrs) -> onnx.ModelProto:
    """A one-node float model: ``inputs``/``outputs`` are (name, shape) pairs of graph values;
    ``initializers`` extra constant inputs (appended after the graph inputs unless
    ``input_names`` orders them)."""
    initializers = initializers or {}
    names = list(input_names) if input_names else [n for n, _ in inputs] + list(initializers)
    node = helper.make_node(op, names, [n for n, _ in outputs], name=f"{op.lower()}_node", **attrs)
    return make_model([node], [_vi(n, s) for n, s in inputs], [_vi(n, s) for n, s in outputs],
                      [_init(n, a) for n, a in initializers.items()], opset=opset, name=op)
