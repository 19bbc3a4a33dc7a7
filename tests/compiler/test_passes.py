"""The IR's invariants (verify) and each pass of the pipeline: what it rewrites, that the result
still computes the same values, and its error and warning paths."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper, version_converter
from systolic.compiler.errors import QuantizationError, UnsupportedOpError, VerifyError
from systolic.compiler.frontend import load_model
from systolic.compiler.ir import AccelOp, ConvGeometry, Graph, Node, Tensor, make_graph, verify
from systolic.compiler.ortsession import ort_session
from systolic.compiler.passes import (
    PIPELINE,
    HostFallbackWarning,
    PassOptions,
    _affine_weights,
    eliminate_dead_code,
    fold_batchnorm,
    fold_constants,
    fuse_bias_add,
    optimize,
    remove_identities,
    resolve_views,
)
from systolic.compiler.reference import execute
from systolic.hw.config import AcceleratorConfig

from tests.compiler import models

OPTIONS = PassOptions()


def _quiet_optimize(graph: Graph, **kw) -> Graph:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostFallbackWarning)
        return optimize(graph, **kw)


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort_session(model)
    return session.run(None, feeds)


def _x(graph: Graph, seed: int = 0) -> np.ndarray:
    shape = graph.tensors[graph.inputs[0]].shape
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


# -- pipeline ------------------------------------------------------------------------------------------


def test_pipeline_is_a_list_of_named_passes() -> None:
    names = [p.name for p in PIPELINE]
    assert names == ["fold_constants", "remove_identities", "emulate_ort_pooling", "shift_uint8",
                     "fold_batchnorm", "fuse_bias_add", "quantize", "sink_dequantize", "fold_qdq_pairs",
                     "lower_layers", "choose_layout", "fuse_activation", "fuse_pooling", "fuse_residual",
                     "resolve_views", "eliminate_dead_code", "report_host_nodes"]
    assert all(p.doc for p in PIPELINE)
    seen = []
    model = models.conv_relu_pool_gemm()
    optimize(load_model(model), calibration=models.calibration_set(model, 4),
             trace=lambda name, graph: seen.append((name, verify(graph))))
    assert [name for name, _ in seen] == names


def test_optimize_rejects_non_int8_configs() -> None:
    graph = load_model(models.conv_relu_pool_gemm())
    with pytest.raises(QuantizationError, match=r"^the ONNX compiler targets int8 inputs and weights; the "
                                                r"config "
                                                r"has input int16 and weight int8$"):
        optimize(graph, config=AcceleratorConfig(input_bits=16))


# -- verify ----------------------------------------------------------------------------------------------


def _tiny() -> tuple[list, dict]:
    tensors = {"x": Tensor("x", (2, 3), "float32"), "y": Tensor("y", (2, 3), "float32"),
               "z": Tensor("z", (2, 3), "float32")}
    nodes = [Node("Relu", "r1", ("x",), ("y",)), Node("Relu", "r2", ("y",), ("z",))]
    return nodes, tensors


def test_verify_accepts_a_good_graph() -> None:
    nodes, tensors = _tiny()
    graph = verify(Graph("g", nodes, tensors, ("x",), ("z",), 13))
    assert str(graph).splitlines()[0] == "graph 'g' (opset 13)"


@pytest.mark.parametrize("mutate, message", [
    (lambda n, t: (n, {k: v for k, v in t.items() if k != "y"}),
     r"^node 'r1' \(Relu\): output 'y' is not a tensor of the graph \(dangling name\)$"),
    (lambda n, t: ([n[1], n[0]], t), r"^node 'r2' \(Relu\): input 'y' is used before it is produced$"),
    (lambda n, t: (n + [Node("Relu", "r3", ("x",), ("y",))], t),
     r"^node 'r3' \(Relu\): output 'y' is already defined \(SSA: one producer per tensor, none for inputs "
     r"and "
     r"constants\)$"),
    (lambda n, t: ([n[0], Node("Relu", "r1", ("y",), ("z",))], t),
     r"^node 'r1' \(Relu\): node names must be unique, 'r1' repeats$"),
    (lambda n, t: (n, {**t, "y": Tensor("y", (2, -1), "float32")}),
     r"^tensor 'y': shape must be static and non-negative, not \(2, -1\)$"),
    (lambda n, t: (n, {**t, "y": Tensor("y", (2, 3), "complex64")}),
     r"^tensor 'y': dtype must be one of float32, .*, not 'complex64'$"),
    (lambda n, t: (n, {**t, "w": Tensor("w", (3,), "float32", data=np.zeros(2, np.float32))}),
     r"^tensor 'w': constant data float32\[2\] does not match the declared float32\[3\]$"),
    (lambda n, t: (n[:1], t), r"^graph output 'z' is never produced$"),
    (lambda n, t: ([n[0], Node("Transpose", "t", ("y",), ("z",), {"perm": (0, 1)})],
                   {**t, "z": Tensor("z", (3, 2), "float32")}),
     r"^node 't' \(Transpose\): perm \(0, 1\) maps input \(2, 3\) to \(2, 3\), not the output's \(3, 2\)$"),
])
def test_verify_rejects(mutate, message) -> None:
    nodes, tensors = mutate(*_tiny())
    with pytest.raises(VerifyError, match=message):
        verify(Graph("g", nodes, tensors, ("x",), ("z",), 13))


def _accel_graph(**changes) -> Graph:
    op = AccelOp("conv", "c", "x", "y", np.zeros(4), np.ones(4), np.zeros(4), 0, 0,
                 weights=np.zeros((27, 4), np.int8), conv=ConvGeometry((3, 3), pads=(1, 1, 1, 1)))
    op = dataclasses.replace(op, **changes)
    tensors = [Tensor("x", (1, 5, 5, 3), "int8", layout="NHWC"),
               Tensor("y", (1, 5, 5, 4), "int8", layout="NHWC")]
    return Graph("g", (op,), {t.name: t for t in tensors}, ("x",), ("y",), 13)


@pytest.mark.parametrize("changes, message", [
    ({"shift": np.full(4, 63)}, r"shift must be within 0\.\.62, not 63\.\.63$"),
    ({"weights": np.zeros((26, 4), np.int8)}, r"weights must have K = 27 rows for kernel \(3, 3\) and 3 "
                                              r"input "
                                              r"channels \(group 1\), not 26$"),
    ({"conv": ConvGeometry((3, 3))}, r"output 'y' must have shape \(1, 3, 3, 4\), not \(1, 5, 5, 4\)$"),
    ({"zp_out": 128}, r"zp_out must be within -128\.\.127, not 128$"),
    ({"act": "gelu"}, r"act must be one of none, relu, relu6, clip, not 'gelu'$"),
    ({"kind": "pool"}, r"a pool op has no weights$"),
    ({"mult": np.ones(3)}, r"bias, mult and shift must be vectors of one length N >= 1, not shapes \(4,\), "
                           r"\(3,\), \(4,\)$"),
])
def test_verify_rejects_bad_accelerator_ops(changes, message) -> None:
    with pytest.raises(VerifyError, match=r"^accelerator op 'c' \(\w+\): " + message):
        verify(_accel_graph(**changes))


# -- float passes preserve values ---------------------------------------------------------------------


def test_fold_constants() -> None:
    """Shape of a static tensor and arithmetic on constants fold; DequantizeLinear of constant
    int8 weights is kept (the weights stay int8)."""
    nodes = [
        helper.make_node("Shape", ["like"], ["s"], name="shape"),
        helper.make_node("Reshape", ["x", "s"], ["flat"], name="reshape"),
        helper.make_node("Add", ["ws", "eps"], ["ws2"], name="add_consts"),
        helper.make_node("DequantizeLinear", ["wq", "ws2"], ["w"], name="dq"),
        helper.make_node("MatMul", ["flat", "w"], ["y"], name="mm"),
    ]
    inits = [numpy_helper.from_array(np.zeros((2, 12), np.float32), "like"),
             numpy_helper.from_array(np.arange(24, dtype=np.int8).reshape(12, 2), "wq"),
             numpy_helper.from_array(np.float32(0.1), "ws"), numpy_helper.from_array(np.float32(0.01), "eps")]
    tensors = [Tensor("x", (2, 3, 4), "float32"), Tensor("s", (2,), "int64"),
               Tensor("flat", (2, 12), "float32"), Tensor("ws2", (), "float32"),
               Tensor("w", (12, 2), "float32"), Tensor("y", (2, 2), "float32")]
    for t in inits:
        data = numpy_helper.to_array(t)
        tensors.append(Tensor(t.name, data.shape, data.dtype.name, data=data))
    ir_nodes = [Node(n.op_type, n.name, tuple(n.input), tuple(n.output),
                     {a.name: helper.get_attribute_value(a) for a in n.attribute}) for n in nodes]
    graph = verify(make_graph("g", ir_nodes, tensors, ("x",), ("y",), 13))
    assert [n.op for n in graph.nodes] == ["Shape", "Reshape", "Add", "DequantizeLinear", "MatMul"]
    folded = fold_constants(graph, OPTIONS)
    assert [n.op for n in folded.nodes] == ["Reshape", "DequantizeLinear", "MatMul"]
    np.testing.assert_array_equal(folded.tensors["s"].data, [2, 12])
    assert folded.tensors["ws2"].data == np.float32(0.11)
    x = _x(graph)
    np.testing.assert_allclose(execute(folded, {"x": x})["y"], execute(graph, {"x": x})["y"], rtol=1e-6)


def test_shape_arithmetic_is_resolved_at_load() -> None:
    """The PyTorch flatten idiom Shape -> Gather -> Unsqueeze -> Concat -> Reshape, which ONNX
    shape inference leaves without a static shape, is evaluated by the front end."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "zero"], ["n"], name="gather", axis=0),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"], name="unsq"),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], name="cat", axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape"),
    ]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array([0], np.int64), "axes"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1")]
    model = models.make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])], inits)
    graph = load_model(model)
    assert [n.op for n in graph.nodes] == ["Reshape"] and graph.tensors["y"].shape == (2, 12)
    np.testing.assert_array_equal(graph.tensors["target"].data, [2, -1])


def test_remove_identities_keeps_output_names() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Dropout", ["r"], ["d"], name="drop"),
             helper.make_node("Identity", ["d"], ["y"], name="ident")]
    model = models.make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    graph = remove_identities(load_model(model), OPTIONS)
    assert [n.op for n in graph.nodes] == ["Relu"] and graph.nodes[0].outputs == ("y",)
    x = np.array([-1, 0, 2, -3], np.float32)
    np.testing.assert_array_equal(execute(graph, {"x": x})["y"], np.maximum(x, 0))


def test_fold_batchnorm_float() -> None:
    model = models.conv_bn_relu6()
    graph = load_model(model)
    folded = fold_batchnorm(graph, OPTIONS)
    assert "BatchNormalization" not in [n.op for n in folded.nodes]
    assert [n.op for n in folded.nodes] == ["Conv", "Clip", "Conv"]
    for seed in range(3):
        x = _x(graph, seed)
        np.testing.assert_allclose(execute(folded, {"input": x})["out"], _ort(model, {"input": x})[0],
                                   rtol=1e-4, atol=1e-5)


def test_fuse_bias_add_makes_gemm() -> None:
    model = models.matmul_bias()
    graph = load_model(model)
    fused = fuse_bias_add(graph, OPTIONS)
    assert [n.op for n in fused.nodes] == ["Gemm", "Relu", "Gemm"]
    assert len(fused.nodes[0].inputs) == 3
    x = _x(graph)
    np.testing.assert_allclose(execute(fused, {"input": x})["out"], _ort(model, {"input": x})[0],
                               rtol=1e-5, atol=1e-5)


def test_matmul_with_batch_rows_goes_through_views() -> None:
    w = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    model = models.single_node("MatMul", [("x", [2, 5, 4])], [("y", [2, 5, 3])], {"w": w})
    graph = fuse_bias_add(load_model(model), OPTIONS)
    assert [n.op for n in graph.nodes] == ["Reshape", "Gemm", "Reshape"]
    x = _x(graph)
    np.testing.assert_allclose(execute(graph, {"x": x})["y"], x @ w, rtol=1e-5, atol=1e-6)
    compiled = _quiet_optimize(load_model(model), calibration={"x": x})
    assert [op.kind for op in compiled.accel_ops] == ["gemm"]


# -- lowering -------------------------------------------------------------------------------------------


def test_lowering_fuses_layers() -> None:
    model = models.conv_relu_pool_gemm()
    graph = optimize(load_model(model), calibration=models.calibration_set(model, 8))
    ops = graph.accel_ops
    assert [(op.kind, op.fused) for op in ops] == [
        ("conv", ("conv1", "relu1", "pool1")), ("conv", ("conv2", "relu2")), ("gemm", ("fc1", "relu3")),
        ("gemm", ("fc2",))]
    conv1 = ops[0]
    assert conv1.act == "relu" and conv1.pool.mode == "max" and conv1.pool.window == (2, 2)
    assert conv1.conv == ConvGeometry((3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    assert graph.tensors[conv1.input].layout == "NHWC" and graph.tensors[conv1.output].shape == (1, 4, 4, 8)
    # weights are [K, N] with K in (kh, kw, ci) order: row k = (i * kw + j) * Ci + ci
    w = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "w1"))
    scale = np.abs(w).reshape(8, -1).max(axis=1) / 127
    for i, j, ci in ((0, 0, 0), (1, 2, 1), (2, 1, 2)):
        row = conv1.weights[(i * 3 + j) * 3 + ci]
        np.testing.assert_array_equal(row, np.rint(w[:, ci, i, j] / scale).astype(np.int8))
    assert [n.op for n in graph.host_nodes] == ["QuantizeLinear", "Transpose", "Reshape", "DequantizeLinear"]


def test_flatten_of_nhwc_permutes_gemm_weights() -> None:
    """The Flatten between conv2 (NHWC) and fc1 reads the NHWC tensor as is; fc1's rows are
    permuted from (c, h, w) to (h, w, c) -- the outputs equal onnxruntime's bit for bit."""
    model = models.conv_relu_pool_gemm()
    qmodel = models.quantize_qdq(model, models.calibration_set(model, 8))
    graph = optimize(load_model(qmodel))
    reshape = next(n for n in graph.host_nodes if n.op == "Reshape")
    fc1 = next(op for op in graph.accel_ops if op.name == "fc1")
    assert graph.tensors[reshape.inputs[0]].layout == "NHWC" and fc1.input == reshape.outputs[0]
    assert not any(n.op == "Transpose" and n.outputs[0] == reshape.inputs[0] for n in graph.nodes)
    for seed in range(4):
        x = _x(graph, seed)
        np.testing.assert_array_equal(execute(graph, {"input": x})["logits"], _ort(qmodel, {"input": x})[0])


def test_grouped_and_dilated_convolutions() -> None:
    """group 2 (neither 1 nor depthwise) becomes a dense conv with block-diagonal weights; with
    dilation 2 and asymmetric padding it still equals onnxruntime's int8 model bit for bit."""
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((6, 2, 3, 3)) * 0.3).astype(np.float32)
    model = models.single_node("Conv", [("x", [1, 4, 7, 6])], [("y", [1, 6, 4, 4])],
                               {"w": w, "b": rng.standard_normal(6).astype(np.float32)}, group=2,
                               dilations=[2, 2], pads=[1, 0, 0, 2])
    qmodel = models.quantize_qdq(model, {"x": rng.uniform(-1, 1, (8, 4, 7, 6)).astype(np.float32)})
    graph = optimize(load_model(qmodel), strict=True)
    (conv,) = graph.accel_ops
    assert conv.conv.group == 1 and conv.conv.dilation == (2, 2) and conv.weights.shape == (36, 6)
    rows = conv.weights.reshape(3, 3, 4, 6)
    assert not rows[:, :, 2:, :3].any() and not rows[:, :, :2, 3:].any()     # block-diagonal zeros
    for seed in range(4):
        x = np.random.default_rng(seed).uniform(-1.5, 1.5, (1, 4, 7, 6)).astype(np.float32)
        np.testing.assert_array_equal(execute(graph, {"x": x})["y"], _ort(qmodel, {"x": x})[0])


def test_residual_fused_into_conv_when_calibrating() -> None:
    model = models.residual_add()
    graph = optimize(load_model(model), calibration=models.calibration_set(model, 8))
    fused = {op.name: op for op in graph.accel_ops}
    assert fused["conv2"].fused == ("conv2", "add1", "relu_add1") and fused["conv2"].residual is not None
    assert fused["conv2"].act == "relu"
    assert fused["conv3"].fused == ("conv3", "add2")
    assert fused["conv3"].residual.tensor == fused["conv3"].input
    assert "add" not in [op.kind for op in graph.accel_ops]


def test_quantized_models_keep_their_requantization_unless_relaxed() -> None:
    model = models.residual_add()
    qmodel = models.quantize_qdq(model, models.calibration_set(model, 8))
    strict_graph = _quiet_optimize(load_model(qmodel))
    assert [op.kind for op in strict_graph.accel_ops].count("add") == 2
    relaxed = _quiet_optimize(load_model(qmodel), relaxed=True)
    assert [op.kind for op in relaxed.accel_ops].count("add") == 0
    assert {op.name: op.fused for op in relaxed.accel_ops}["conv3"] == ("conv3", "add2")


def test_batchnorm_of_quantized_tensor() -> None:
    """onnxruntime keeps BatchNormalization between Q/DQ pairs: by default it becomes a
    depthwise 1x1 conv (per-channel scale and offset); relaxed folds it into the conv's weight
    scales, keeping the int8 weights."""
    model = models.conv_bn_relu6()
    qmodel = models.quantize_qdq(model, models.calibration_set(model, 8))
    graph = optimize(load_model(qmodel), strict=True)
    bn = {op.name: op for op in graph.accel_ops}["bn0"]
    assert bn.kind == "conv" and bn.conv.group == 8 and bn.weights.shape == (1, 8)
    magnitude = np.abs(bn.weights.reshape(-1).astype(np.int64))
    assert magnitude.min() >= 64 and magnitude.max() <= 127
    relaxed = optimize(load_model(qmodel), relaxed=True, strict=True)
    assert [op.name for op in relaxed.accel_ops] == ["conv0", "conv1"]
    np.testing.assert_array_equal(relaxed.accel_ops[0].weights, graph.accel_ops[0].weights)


def test_affine_weights_carry_the_offset_almost_exactly() -> None:
    """The per-channel weight of an affine op (64..127) is the one whose multiple of the offset
    (in input steps) is closest to an integer: never worse than the fixed weight 127, and on
    average an order of magnitude better."""
    steps = np.random.default_rng(3).uniform(-300.0, 300.0, 4000)
    w = _affine_weights(steps)
    error = np.abs(np.rint(w * steps) - w * steps) / w
    error_127 = np.abs(np.rint(127 * steps) - 127 * steps) / 127
    assert set(np.unique(w)) <= set(range(64, 128))
    assert np.all(error <= error_127)
    assert error.mean() < error_127.mean() / 10
    assert _affine_weights(np.array([0.0, 2.0])).tolist() == [127, 127]      # exact: the largest


def test_concat_of_branches() -> None:
    model = models.concat_branches()
    graph = optimize(load_model(model), calibration=models.calibration_set(model, 8))
    concat = next(n for n in graph.host_nodes if n.op == "Concat")
    assert concat.attrs["axis"] == 3 and all(graph.tensors[i].layout == "NHWC" for i in concat.inputs)
    assert [op.kind for op in graph.accel_ops] == ["conv", "conv", "conv"]   # no requantize: shared params
    qmodel = models.quantize_qdq(model, models.calibration_set(model, 8))
    qgraph = optimize(load_model(qmodel))
    assert [op.kind for op in qgraph.accel_ops] == ["conv", "conv", "act", "conv"]


def test_uint8_models_become_int8() -> None:
    model = models.conv_relu_pool_gemm()
    for fmt in ("QDQ", "QOperator"):
        qmodel = models.quantize_qdq(model, models.calibration_set(model, 8), quant_format=fmt,
                                     activation_type="QUInt8")
        graph = optimize(load_model(qmodel), strict=True)
        assert not any(t.dtype == "uint8" for t in graph.tensors.values())
        assert len(graph.accel_ops) == 4
        for seed in range(3):
            x = _x(graph, seed)
            ours = execute(graph, {"input": x})["logits"]
            np.testing.assert_array_equal(ours, _ort(qmodel, {"input": x})[0])


def test_uint8_graph_inputs_and_outputs_are_converted() -> None:
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], name="pool", kernel_shape=[2, 2]),
             helper.make_node("DequantizeLinear", ["p", "s", "z"], ["y"], name="dq"),
             helper.make_node("Identity", ["p"], ["p_out"], name="copy")]
    inits = [numpy_helper.from_array(np.float32(0.5), "s"), numpy_helper.from_array(np.uint8(100), "z")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 2, 2]),
               helper.make_tensor_value_info("p_out", TensorProto.UINT8, [1, 2, 2, 2])]
    model = models.make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 2, 3, 3])],
                              outputs, inits)
    graph = _quiet_optimize(load_model(model))
    assert graph.tensors["x"].dtype == "uint8" and graph.tensors["p_out"].dtype == "uint8"
    assert [op.kind for op in graph.accel_ops] == ["pool"]
    x = np.random.default_rng(0).integers(0, 256, (1, 2, 3, 3)).astype(np.uint8)
    x[0, 0, 0, 0], x[0, 1, 2, 2] = 0, 255
    ours = execute(graph, {"x": x})
    theirs = _ort(model, {"x": x})
    np.testing.assert_array_equal(ours["y"], theirs[0])
    np.testing.assert_array_equal(ours["p_out"], theirs[1])


def test_config_without_features_keeps_ops_on_host() -> None:
    model = models.avg_pool()
    cal = models.calibration_set(model, 4)
    no_avg = AcceleratorConfig(sfu_pooling=("max",))
    with pytest.warns(HostFallbackWarning, match=r"'avg0' \(AveragePool: the SFU has no avg pooling \(config "
                                                 r"sfu_pooling\)\)"):
        graph = optimize(load_model(model), calibration=cal, config=no_avg)
    assert graph.config == no_avg and all(op.pool is None for op in graph.accel_ops)
    residual = models.residual_add()
    no_res = AcceleratorConfig(sfu_residual=False)
    graph = _quiet_optimize(load_model(residual), calibration=models.calibration_set(residual, 4),
                            config=no_res)
    assert all(op.residual is None for op in graph.accel_ops)
    assert [n.op for n in graph.host_nodes].count("Add") == 2


# -- views, dead code, host report --------------------------------------------------------------


def test_resolve_views_collapses_chains() -> None:
    nodes = [helper.make_node("Unsqueeze", ["x", "a0"], ["u"], name="unsq"),
             helper.make_node("Flatten", ["u"], ["f"], name="flat", axis=1),
             helper.make_node("Squeeze", ["f", "a0"], ["s"], name="sq"),
             helper.make_node("Reshape", ["s", "shape"], ["r"], name="back"),
             helper.make_node("Transpose", ["r"], ["y"], name="noop", perm=[0, 1])]
    inits = [numpy_helper.from_array(np.array([0], np.int64), "a0"),
             numpy_helper.from_array(np.array([3, 4], np.int64), "shape")]
    model = models.make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])], inits)
    graph = load_model(model)
    resolved = eliminate_dead_code(resolve_views(graph, OPTIONS), OPTIONS)
    assert [n.op for n in resolved.nodes] == ["Identity"]        # y is x
    x = _x(graph)
    np.testing.assert_array_equal(execute(resolved, {"x": x})["y"], x)


def test_dead_code_is_removed() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="used"),
             helper.make_node("Neg", ["x"], ["z"], name="dead")]
    model = models.make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    graph = eliminate_dead_code(load_model(model), OPTIONS)
    assert [n.name for n in graph.nodes] == ["used"] and "z" not in graph.tensors


def _softmax_model() -> onnx.ModelProto:
    nodes = [helper.make_node("Gemm", ["x", "w"], ["g"], name="fc"),
             helper.make_node("Softmax", ["g"], ["y"], name="probabilities", axis=-1)]
    w = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    return models.make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                             [numpy_helper.from_array(w, "w")])


def test_host_nodes_warn_and_strict_rejects() -> None:
    model = _softmax_model()
    cal = {"x": np.random.default_rng(1).standard_normal((8, 4)).astype(np.float32)}
    with pytest.warns(HostFallbackWarning,
                      match=r"^1 node\(s\) run on the host: 'probabilities' \(Softmax\)$"):
        graph = optimize(load_model(model), calibration=cal)
    assert [op.kind for op in graph.accel_ops] == ["gemm"]
    x = cal["x"][:2]
    np.testing.assert_allclose(execute(graph, {"x": x})["y"], _ort(model, {"x": x})[0], atol=0.02)
    with pytest.raises(UnsupportedOpError, match=r"^node 'probabilities' \(Softmax\) cannot run on the "
                                                 r"accelerator; strict=True forbids running it on the host$"):
        optimize(load_model(model), calibration=cal, strict=True)


def test_strict_names_the_reason() -> None:
    model = models.avg_pool()
    qmodel = models.quantize_qdq(model, models.calibration_set(model, 4), quant_format="QOperator")
    with pytest.raises(UnsupportedOpError, match=r"^node 'avg1_quant' \(AveragePool\) cannot run on the "
                                                 r"accelerator \(input zero point -?\d+ differs from the "
                                                 r"output's "
                                                 r"-?\d+; the SFU averages in one zero point\); "
                                                 r"strict=True forbids "
                                                 r"running it on the host$"):
        optimize(load_model(qmodel), strict=True)


def test_float_model_without_calibration_runs_on_host() -> None:
    model = models.conv_relu_pool_gemm()
    with pytest.warns(HostFallbackWarning, match=r"^8 node\(s\) run on the host: 'conv1' \(Conv: input is "
                                                 r"not a "
                                                 r"per-tensor int8 DequantizeLinear\), "):
        graph = optimize(load_model(model))
    assert not graph.accel_ops
    x = _x(graph)
    ours = execute(graph, {"input": x})["logits"]
    np.testing.assert_allclose(ours, _ort(model, {"input": x})[0], atol=1e-5)


def test_standalone_batchnorm_mul_sub_run_on_the_accelerator() -> None:
    """BatchNormalization that follows no conv, and Mul/Sub by per-channel constants: depthwise
    1x1 convs when quantized as they are, folded into the conv when calibrating."""
    model = models.preact_scale()
    qmodel = models.quantize_qdq(model, models.calibration_set(model, 8))
    graph = optimize(load_model(qmodel), strict=True)
    kinds = {op.name: (op.kind, op.conv.group if op.conv else None) for op in graph.accel_ops}
    assert kinds["bn"] == ("conv", 3) and kinds["scale"] == ("conv", 5) and kinds["shift"] == ("conv", 5)
    calibrated = optimize(load_model(model), calibration=models.calibration_set(model, 8), strict=True)
    assert [op.name for op in calibrated.accel_ops] == ["bn", "conv", "fc"]
    assert calibrated.accel_ops[1].act == "relu" and calibrated.accel_ops[1].pool.mode == "avg"


def test_a_real_architecture_compiles() -> None:
    """SqueezeNet (ONNX's light test model, opset 9 converted to 13): fire modules with Concat,
    every Conv, Relu and pool on the accelerator; only the final Softmax on the host."""
    path = Path(onnx.__file__).parent / "backend/test/data/light/light_squeezenet.onnx"
    model = version_converter.convert_version(onnx.load(path), 13)
    model.ir_version = 8
    graph = load_model(model)
    x = np.random.default_rng(0).uniform(0, 1, graph.tensors[graph.inputs[0]].shape).astype(np.float32)
    with pytest.warns(HostFallbackWarning, match=r"^1 node\(s\) run on the host: '\w+' \(Softmax\)$"):
        compiled = optimize(graph, calibration={graph.inputs[0]: x})
    assert len(compiled.accel_ops) == 28
    movement = {"QuantizeLinear", "DequantizeLinear", "Transpose", "Concat", "Reshape"}
    assert {n.op for n in compiled.host_nodes} <= movement | {"Softmax"}
    ours = execute(compiled, {graph.inputs[0]: x})[graph.outputs[0]]
    np.testing.assert_allclose(ours, _ort(model, {graph.inputs[0]: x})[0], atol=1e-4)


def test_accel_ops_are_frozen() -> None:
    graph = _accel_graph()
    op = graph.nodes[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        op.zp_in = 3                                           # type: ignore[misc]
    with pytest.raises(ValueError, match=r"read-only"):
        op.weights[0, 0] = 1
    rebuilt = make_graph("g", [op], graph.tensors, graph.inputs, graph.outputs, 13)
    assert rebuilt.nodes[0] is op
