"""Front end: loading ONNX into the IR (shapes, constants, QOperator expansion), the host
execution of the loaded graph against onnxruntime, and every load/input error path."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from systolic.compiler.errors import (
    CompileError,
    InputError,
    ModelLoadError,
    OpsetError,
    ShapeError,
    UnsupportedOpError,
)
from systolic.compiler.frontend import MAX_OPSET, MIN_OPSET, load_model
from systolic.compiler.ir import Node
from systolic.compiler.ortsession import ort_session
from systolic.compiler.reference import execute

from tests.compiler import models

FLOAT_MODELS = [models.conv_relu_pool_gemm, models.residual_add, models.depthwise, models.avg_pool,
                models.global_avg_pool, models.matmul_bias, models.conv_bn_relu6, models.concat_branches,
                models.preact_scale]


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort_session(model)
    return session.run(None, feeds)


def test_load_builds_static_graph(tmp_path) -> None:
    model = models.conv_relu_pool_gemm()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    for source in (model, path, str(path)):
        graph = load_model(source)
        assert graph.inputs == ("input",) and graph.outputs == ("logits",)
        assert [n.op for n in graph.nodes] == ["Conv", "Relu", "MaxPool", "Conv", "Relu", "Flatten", "Gemm",
                                               "Relu", "Gemm"]
        assert graph.tensors["r1"].shape == (1, 8, 8, 8)
        assert graph.tensors["p1"].shape == (1, 8, 4, 4)
        assert graph.tensors["f"].shape == (1, 48)
        assert graph.tensors["w1"].is_constant and graph.tensors["w1"].dtype == "float32"
        assert graph.opset == 13
    assert all(isinstance(n, Node) for n in graph.nodes)
    assert graph.nodes[0].attrs["pads"] == (1, 1, 1, 1)


def test_graph_is_immutable() -> None:
    graph = load_model(models.conv_relu_pool_gemm())
    with pytest.raises(ValueError, match=r"read-only"):
        graph.tensors["w1"].data[0, 0, 0, 0] = 1.0
    with pytest.raises(TypeError):
        graph.tensors["x"] = graph.tensors["w1"]          # type: ignore[index]
    with pytest.raises(AttributeError):
        graph.nodes[0].op = "Relu"                         # type: ignore[misc]


@pytest.mark.parametrize("build", FLOAT_MODELS, ids=lambda b: b.__name__)
def test_host_execution_matches_onnxruntime(build) -> None:
    model = build()
    graph = load_model(model)
    rng = np.random.default_rng(4)
    shape = graph.tensors["input"].shape
    for x in (rng.standard_normal(shape).astype(np.float32), np.full(shape, 3.0, np.float32),
              np.full(shape, -3.0, np.float32), np.zeros(shape, np.float32)):
        ours = execute(graph, {"input": x})
        theirs = _ort(model, {"input": x})
        for name, want in zip(graph.outputs, theirs, strict=True):
            np.testing.assert_allclose(ours[name], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
def test_quantized_models_load_and_run_like_onnxruntime(fmt) -> None:
    """Loading expands QLinearConv/QGemm/QLinearAdd/... into DequantizeLinear -> op ->
    QuantizeLinear; run on the host, the loaded graph matches onnxruntime's int8 model."""
    model = models.residual_add()
    qmodel = models.quantize_qdq(model, models.calibration_set(model, 8), quant_format=fmt)
    graph = load_model(qmodel)
    ops = {n.op for n in graph.nodes}
    assert not ops & {"QLinearConv", "QLinearAdd", "QGemm", "QLinearGlobalAveragePool"}
    assert {"Conv", "Add", "Gemm", "QuantizeLinear", "DequantizeLinear"} <= ops
    x = models.calibration_set(model, 1, seed=9)["input"]
    ours = execute(graph, {"input": x})["logits"]
    theirs = _ort(qmodel, {"input": x})[0]
    scale_init = next(t for t in qmodel.graph.initializer if t.name == "logits_scale")
    scale = float(numpy_helper.to_array(scale_init))
    assert np.abs(ours - theirs).max() <= scale * 1.001


def test_constant_nodes_become_constants() -> None:
    node_c = helper.make_node("Constant", [], ["two"], value=numpy_helper.from_array(np.float32(2.0)))
    node_m = helper.make_node("Mul", ["x", "two"], ["y"], name="double")
    model = models.make_model([node_c, node_m], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    graph = load_model(model)
    assert [n.op for n in graph.nodes] == ["Mul"]
    assert float(graph.tensors["two"].data) == 2.0
    x = np.array([1, -2, 3], np.float32)
    np.testing.assert_array_equal(execute(graph, {"x": x})["y"], 2 * x)


def test_symbolic_dimensions_take_given_shapes() -> None:
    model = models.single_node("Relu", [("x", ["N", 4])], [("y", ["N", 4])])
    graph = load_model(model, shapes={"x": (3, 4)})
    assert graph.tensors["x"].shape == (3, 4) and graph.tensors["y"].shape == (3, 4)
    assert load_model(models.single_node("Relu", [("x", [2, 4])], [("y", [2, 4])]), shapes={"x": [2, 4]})


# -- error paths ---------------------------------------------------------------------------------


def test_truncated_file(tmp_path) -> None:
    path = tmp_path / "truncated.onnx"
    path.write_bytes(models.conv_relu_pool_gemm().SerializeToString()[:700])
    with pytest.raises(ModelLoadError, match=rf"^{path}: not an ONNX model or truncated \(.+\)$"):
        load_model(path)


def test_non_onnx_file(tmp_path) -> None:
    path = tmp_path / "notes.onnx"
    path.write_text("this is a text file, not a model\n")
    with pytest.raises(ModelLoadError, match=rf"^{path}: not an ONNX model or truncated \(.+\)$"):
        load_model(path)


def test_empty_and_missing_files(tmp_path) -> None:
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(ModelLoadError, match=rf"^{empty}: not an ONNX model \(the file is empty\)$"):
        load_model(empty)
    with pytest.raises(ModelLoadError, match=r"^.*nothere\.onnx: cannot read the model file: No such file"):
        load_model(tmp_path / "nothere.onnx")


def test_wellformed_protobuf_without_graph(tmp_path) -> None:
    path = tmp_path / "nograph.onnx"
    path.write_bytes(onnx.ModelProto(ir_version=8).SerializeToString())
    with pytest.raises(ModelLoadError, match=rf"^{path}: not an ONNX model or truncated \(no IR version, "
                                             r"graph or graph outputs\)$"):
        load_model(path)


@pytest.mark.parametrize("opset", [MIN_OPSET - 1, MAX_OPSET + 1])
def test_opset_outside_range(opset) -> None:
    model = models.single_node("Relu", [("x", [1, 4])], [("y", [1, 4])], opset=opset)
    with pytest.raises(OpsetError, match=rf"^model 'Relu': ONNX opset {opset} is not supported; the compiler "
                                         rf"accepts opsets 11 to 21$"):
        load_model(model)


def test_opsets_inside_range_load() -> None:
    for opset in (MIN_OPSET, 17, MAX_OPSET):
        model = models.single_node("Relu", [("x", [1, 4])], [("y", [1, 4])], opset=opset)
        assert load_model(model).opset == opset


def test_symbolic_dimensions_without_shapes() -> None:
    model = models.single_node("Relu", [("x", ["N", 4])], [("y", ["N", 4])])
    with pytest.raises(ShapeError, match=r"^model 'Relu': input 'x' has symbolic dimensions \('N', 4\); give "
                                         r"its shape, e.g. shapes=\{'x': \(1, 4\)\} \(CLI: --shape x=1,4\)$"):
        load_model(model)


def test_given_shapes_must_match() -> None:
    model = models.single_node("Relu", [("x", ["N", 4])], [("y", ["N", 4])])
    with pytest.raises(ShapeError, match=r"^model 'Relu': the shape given for input 'x', \(2, 5\), does not "
                                         r"match the model's \('N', 4\)$"):
        load_model(model, shapes={"x": (2, 5)})
    with pytest.raises(ShapeError, match=r"^model 'Relu': a shape was given for 'z', which is not an "
                                         r"input of "
                                         r"the model \(inputs: 'x'\)$"):
        load_model(model, shapes={"z": (2, 4)})
    with pytest.raises(ShapeError, match=r"^model 'Relu': the shape given for input 'x' must have dimensions "
                                         r">= 0, not \(-1, 4\)$"):
        load_model(model, shapes={"x": (-1, 4)})


def test_shape_mismatch_names_the_node() -> None:
    conv = models.single_node("Conv", [("x", [1, 3, 5, 5])], [("y", [1, 4, 3, 3])],
                              {"w": np.zeros((4, 2, 3, 3), np.float32)})
    with pytest.raises(ShapeError, match=r"^model 'Conv': node 'conv_node' \(Conv\): input 'x' has 3 "
                                         r"channels "
                                         r"but weight 'w' \(4, 2, 3, 3\) with group 1 expects 2$"):
        load_model(conv)
    add = models.single_node("Add", [("a", [1, 3]), ("b", [1, 4])], [("c", [1, 4])])
    with pytest.raises(ShapeError, match=r"^model 'Add': node 'add_node' \(Add\): Incompatible dimensions$"):
        load_model(add)
    gemm = models.single_node("Gemm", [("a", [2, 3])], [("c", [2, 4])], {"b": np.zeros((5, 4), np.float32)})
    with pytest.raises(ShapeError, match=r"^model 'Gemm': node 'gemm_node' \(Gemm\): Dimension mismatch in "
                                         r"unification between 5 and 3$"):
        load_model(gemm)


def test_unknown_op_type() -> None:
    def model(op: str, domain: str = "") -> onnx.ModelProto:
        graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], name="n1", domain=domain)], "g",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
        imports = [helper.make_opsetid("", 13)] + ([helper.make_opsetid(domain, 1)] if domain else [])
        out = helper.make_model(graph, opset_imports=imports)
        out.ir_version = 8
        return out

    with pytest.raises(UnsupportedOpError, match=r"^model 'g': node 'n1': unknown op type 'Frobnicate' in "
                                                 r"the "
                                                 r"default domain$"):
        load_model(model("Frobnicate"))
    with pytest.raises(UnsupportedOpError, match=r"^model 'g': node 'n1': unknown op type 'Foo' in domain "
                                                 r"'my\.ops'$"):
        load_model(model("Foo", "my.ops"))
    with pytest.raises(UnsupportedOpError, match=r"^model 'g': node 'n1': op type 'Gelu' is not defined "
                                                 r"at the "
                                                 r"model's opset 13$"):
        load_model(model("Gelu"))


def test_subgraphs_are_rejected() -> None:
    branch = helper.make_graph([helper.make_node("Identity", ["x"], ["z"])], "b", [],
                               [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1])])
    node = helper.make_node("If", ["c"], ["y"], name="choose", then_branch=branch, else_branch=branch)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    with pytest.raises(UnsupportedOpError, match=r"^model 'g': node 'choose' \(If\): attribute '\w+_branch' "
                                                 r"holds a subgraph; control flow \(If, Loop, Scan\) is not "
                                                 r"supported$"):
        load_model(model)


def test_input_arrays_are_checked() -> None:
    graph = load_model(models.single_node("Relu", [("x", [1, 4])], [("y", [1, 4])]))
    with pytest.raises(InputError, match=r"^input 'x' must have shape \(1, 4\), not \(1, 5\)$"):
        execute(graph, {"x": np.zeros((1, 5), np.float32)})
    with pytest.raises(InputError, match=r"^input 'x' must have dtype float32, not float64$"):
        execute(graph, {"x": np.zeros((1, 4))})
    with pytest.raises(InputError, match=r"^input 'x' is missing$"):
        execute(graph, {})
    with pytest.raises(InputError, match=r"^unknown input 'q'; the graph's inputs are 'x'$"):
        execute(graph, {"x": np.zeros((1, 4), np.float32), "q": np.zeros(1)})
    with pytest.raises(InputError, match=r"^input 'x' must be a numpy array, not list$"):
        execute(graph, {"x": [[1.0, 2.0, 3.0, 4.0]]})


def test_errors_are_value_errors() -> None:
    for cls in (ModelLoadError, OpsetError, ShapeError, UnsupportedOpError, InputError):
        assert issubclass(cls, CompileError) and issubclass(cls, ValueError)
