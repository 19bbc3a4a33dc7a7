"""compiler/ortsession.py: onnxruntime reference sessions with exact int8 products on every CPU."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from systolic.compiler.ortsession import ort_session


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
