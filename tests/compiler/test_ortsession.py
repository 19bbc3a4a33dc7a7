"""compiler/ortsession.py: onnxruntime reference sessions with exact int8 products on every CPU."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from systolic.compiler.ir import Graph, Node, Tensor
from systolic.compiler.ortsession import ort_session
from systolic.compiler.reference import execute, run_node


def _matmul_integer(b: np.ndarray, b_zp: int, a_zp: int) -> onnx.ModelProto:
    """uint8 activations (a graph input) times constant int8 weights, as in a quantized model."""
    node = helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])
    graph = helper.make_graph(
        [node], "mm", [helper.make_tensor_value_info("a", TensorProto.UINT8, [None, b.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
        [numpy_helper.from_array(b, "b"), numpy_helper.from_array(np.array(b_zp, np.int8), "bz"),
         numpy_helper.from_array(np.array(a_zp, np.uint8), "az")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_uint8_times_int8_products_are_exact() -> None:
    """Pairs of products past 16 bits (255 * 127 * 2): x86 CPUs without VNNI saturate them in
    onnxruntime's default uint8 x int8 kernel, and the session's option avoids that kernel."""
    rng = np.random.default_rng(1)
    b = rng.integers(-128, 128, (32, 8)).astype(np.int8)
    b[:, 0] = 127
    a = rng.integers(0, 256, (4, 32)).astype(np.uint8)
    a[0] = 255
    expected = (a.astype(np.int64) - 3) @ (b.astype(np.int64) + 5)
    got = ort_session(_matmul_integer(b, -5, 3)).run(None, {"a": a})[0]
    np.testing.assert_array_equal(got, expected)


def test_a_model_onnxruntime_cannot_load_is_its_error() -> None:
    with pytest.raises(Exception, match="INVALID_PROTOBUF|Failed to load model|protobuf"):
        ort_session(b"not a model")


def _qlinear_matmul_graph(b: np.ndarray) -> Graph:
    """A QLinearMatMul host node (no numpy handler: it runs in a one-node onnxruntime session)
    of uint8 activations (the graph input) and constant int8 weights."""
    scalars = {"as": np.array(1.0, np.float32), "az": np.array(0, np.uint8),
               "bs": np.array(1.0, np.float32), "bz": np.array(0, np.int8),
               "ys": np.array(1024.0, np.float32), "yz": np.array(0, np.uint8)}
    tensors = {name: Tensor(name, v.shape, v.dtype.name, data=v) for name, v in scalars.items()}
    tensors["b"] = Tensor("b", b.shape, "int8", data=b)
    tensors["a"] = Tensor("a", (4, b.shape[0]), "uint8")
    tensors["y"] = Tensor("y", (4, b.shape[1]), "uint8")
    node = Node("QLinearMatMul", "qmm", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    return Graph("g", [node], tensors, ["a"], ["y"], 13)


def test_a_host_fallback_gets_the_graphs_constants_as_initializers() -> None:
    """A host node that runs in onnxruntime gets its constant inputs as initializers, as the
    model has them: onnxruntime's exact int8 kernels need constant weights (fed as inputs, its
    products saturate on CPUs without VNNI: 4 * 255 * 127 comes out as 65534)."""
    b = np.full((32, 8), 127, np.int8)
    b[:, 1:] = np.random.default_rng(2).integers(-128, 128, (32, 7))
    a = np.full((4, 32), 255, np.uint8)
    a[1:] = np.random.default_rng(3).integers(0, 256, (3, 32))
    exact = a.astype(np.int64) @ b.astype(np.int64)
    expected = np.clip(np.rint(exact / 1024), 0, 255).astype(np.uint8)
    graph = _qlinear_matmul_graph(b)
    np.testing.assert_array_equal(execute(graph, {"a": a})["y"], expected)
    # run_node: the flags decide
    node, args = graph.nodes[0], [a, *(graph.tensors[n].data for n in graph.nodes[0].inputs[1:])]
    (y,) = run_node(node, args, 13, ["uint8"], [False] + [True] * 7)
    np.testing.assert_array_equal(y, expected)
    # the session is built per constant value: other weights give their own results
    other = np.clip(-b.astype(np.int16), -128, 127).astype(np.int8)
    (y,) = run_node(node, [a, *args[1:3], other, *args[4:]], 13, ["uint8"], [False] + [True] * 7)
    exact = a.astype(np.int64) @ other.astype(np.int64)
    np.testing.assert_array_equal(y, np.clip(np.rint(exact / 1024), 0, 255).astype(np.uint8))
