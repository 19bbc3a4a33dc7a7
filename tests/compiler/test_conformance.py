"""Conformance: the ONNX backend node test cases of every op the compiler claims, compiled
(float cases quantized with calibration on the case's own inputs) and run by the reference
executor, compared with the expected outputs.

Source: ``onnx.backend.test.case.node.collect_testcases()`` -- the generator of
``onnx/backend/test/data/node`` (the installed onnx wheel ships the generator, not the data).

Adaptations applied to every case:

* Opset. ONNX 1.23 writes these cases at the newest opset (22 to 24 for several of the ops) whose
  only changes to them add element types (bfloat16, float8, int4); they run at opset 21, the
  newest the compiler accepts. Cases older than 11 run at 11 when their op has the same
  definition there (ConvInteger and MatMulInteger are unchanged since opset 10).
* Weight-like inputs (every input after the first of Conv, ConvInteger, ConvTranspose, Gemm,
  MatMul, MatMulInteger, Clip, Reshape, Dropout) become initializers holding the case's values, as
  in a deployed model; that is what lets a layer run on the accelerator.

Tolerance. Integer outputs must be exact. A float output may differ from the expected one by
``bound + step_out``: ``step_out`` is the output's quantization step (rounding plus the SFU's
fixed-point requantization, two half steps), ``bound`` the largest change that quantizing the
inputs (half a step of each quantized input, half a step of the weights' largest per-channel
scale, and of the bias) can cause in the exact op -- for multilinear ops (Conv, Gemm, MatMul,
Add, pools) computed by running the op on ``|inputs| + half steps`` minus on ``|inputs|``, for
the 1-Lipschitz rest (Relu, Clip, views, Concat) the largest input half step.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from systolic.compiler.frontend import load_model
from systolic.compiler.ir import Node
from systolic.compiler.passes import HostFallbackWarning, optimize
from systolic.compiler.reference import HOST_OPS, execute

CLAIMED = ("Conv", "ConvInteger", "ConvTranspose", "Gemm", "MatMul", "MatMulInteger", "Relu", "Clip",
           "MaxPool", "AveragePool", "GlobalAveragePool", "Add", "Flatten", "Reshape", "Transpose",
           "Concat", "Identity", "Dropout")
WEIGHT_LIKE = {"Conv", "ConvInteger", "ConvTranspose", "Gemm", "MatMul", "MatMulInteger", "Clip",
               "Reshape", "Dropout"}
MULTILINEAR = {"Conv", "Gemm", "MatMul", "Add", "AveragePool", "GlobalAveragePool", "MaxPool"}

#: Cases not run, each with its reason.
EXCLUDED = {
    r"test_.*_expanded(_ver\d+)?": "function-expanded form: the op is replaced by its function body "
                                   "(Less, Where, ...); the op itself is tested by the plain case",
    r"test_identity_sequence": "sequence values are not tensors; the compiler handles tensors only",
    r"test_identity_opt": "optional values are not tensors; the compiler handles tensors only",
    r"test_training_dropout.*": "training-mode Dropout draws a random mask; inference is deterministic",
    r"test_averagepool_2d_ceil_last_window_starts_on_pad":
        "the expected shape follows opset 22's ceil_mode output rule; ONNX shape inference at "
        "opset 21 gives another shape",
    r"test_maxpool_2d_ceil_output_size_reduce_by_one":
        "the expected shape follows opset 22's ceil_mode output rule; ONNX shape inference at "
        "opset 21 gives another shape",
}


def _excluded(name: str) -> str | None:
    for pattern, reason in EXCLUDED.items():
        if re.fullmatch(pattern, name):
            return reason
    return None


def _collect() -> list:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    chosen = [c for c in cases if c.kind == "node" and len(c.model.graph.node) == 1
              and c.model.graph.node[0].op_type in CLAIMED
              and c.model.graph.node[0].domain in ("", "ai.onnx")]
    return sorted(chosen, key=lambda c: c.name)


CASES = _collect()


def _adapt(case) -> tuple[onnx.ModelProto, list[dict[str, np.ndarray]], list[list[np.ndarray]]]:
    """The case's model at an accepted opset with weight-like inputs as initializers, and its
    data sets as (feeds, expected outputs)."""
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    node = model.graph.node[0]
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            if entry.version > 21:
                entry.version = 21
            elif entry.version < 11:
                old = onnx.defs.get_schema(node.op_type, entry.version).since_version
                assert onnx.defs.get_schema(node.op_type, 11).since_version == old, case.name
                entry.version = 11
    model.ir_version = min(model.ir_version, 10)
    names = [vi.name for vi in model.graph.input]
    inputs0 = case.data_sets[0][0]
    constant = set()
    if node.op_type in WEIGHT_LIKE:
        constant = {n for n in list(node.input)[1:] if n}
        for name, value in zip(names, inputs0, strict=True):
            if name in constant:
                model.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
        kept = [vi for vi in model.graph.input if vi.name not in constant]
        del model.graph.input[:]
        model.graph.input.extend(kept)
    feeds, expected = [], []
    for inputs, outputs in case.data_sets:
        feeds.append({n: np.asarray(v) for n, v in zip(names, inputs, strict=True) if n not in constant})
        expected.append([np.asarray(o) for o in outputs])
    return model, feeds, expected


def _half_steps(graph, model: onnx.ModelProto) -> dict[str, float]:
    """Half the quantization step of each graph input that the compiled graph quantizes, and of
    the float initializers of the node (weights: the largest channel's scale; bias: input scale
    times that)."""
    steps: dict[str, float] = {}
    for node in graph.nodes:
        if isinstance(node, Node) and node.op == "QuantizeLinear" and node.inputs[0] in graph.inputs:
            steps[node.inputs[0]] = float(graph.tensors[node.inputs[1]].data) / 2
    onnx_node = model.graph.node[0]
    if onnx_node.op_type in ("Conv", "Gemm", "MatMul"):
        inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        x_step = steps.get(onnx_node.input[0], 0.0)
        w_name = onnx_node.input[1]
        if w_name in inits and x_step:
            w = inits[w_name].astype(np.float64)
            steps[w_name] = float(np.abs(w).max()) / 127 / 2
            if len(onnx_node.input) > 2 and onnx_node.input[2] in inits:
                steps[onnx_node.input[2]] = 2 * x_step * steps[w_name]
    return steps


def _bound(model: onnx.ModelProto, graph, feed: dict[str, np.ndarray]) -> float:
    """The largest change in the exact op that quantizing its inputs can cause."""
    steps = _half_steps(graph, model)
    if not steps:
        return 0.0
    node = model.graph.node[0]
    if node.op_type not in MULTILINEAR:
        return max(steps.values())
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    values = {**inits, **feed}
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    for key in ("alpha", "beta"):
        if key in attrs:
            attrs[key] = abs(attrs[key])
    attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in attrs.items()}
    plain = [np.abs(values[n]).astype(np.float64) if n else None for n in node.input]
    moved = [None if a is None else a + steps.get(n, 0.0) for a, n in zip(plain, node.input, strict=True)]
    op = HOST_OPS[node.op_type]
    return float(np.max(np.asarray(op(*moved, **attrs)) - np.asarray(op(*plain, **attrs)), initial=0.0))


def _output_step(graph, name: str) -> float:
    producer = graph.producers.get(name)
    if isinstance(producer, Node) and producer.op == "DequantizeLinear":
        return float(graph.tensors[producer.inputs[1]].data)
    return 0.0


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_node_case(case) -> None:
    reason = _excluded(case.name)
    if reason:
        pytest.skip(reason)
    model, feeds, expected = _adapt(case)
    graph = load_model(model)
    feed = feeds[0]
    floats = [v for v in feed.values() if v.dtype.kind == "f"]
    calibration = feed if floats and len(floats) == len(feed) else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostFallbackWarning)
        compiled = optimize(graph, calibration=calibration)
    for feed, outputs in zip(feeds, expected, strict=True):
        got = execute(compiled, feed)
        for vi, want in zip(model.graph.output, outputs, strict=True):
            value = got[vi.name]
            assert value.dtype == want.dtype and value.shape == want.shape, \
                f"{vi.name}: {value.dtype}{value.shape} != {want.dtype}{want.shape}"
            if want.dtype.kind != "f":
                np.testing.assert_array_equal(value, want, err_msg=vi.name)
                continue
            tol = _bound(model, compiled, feed) + _output_step(compiled, vi.name) \
                + 1e-5 * max(1.0, float(np.abs(want).max(initial=0)))
            err = float(np.abs(value.astype(np.float64) - want).max(initial=0))
            assert err <= tol, f"{vi.name}: error {err:.6g} exceeds the quantization bound {tol:.6g}"


def test_every_claimed_op_has_cases() -> None:
    ops = {c.model.graph.node[0].op_type for c in CASES if not _excluded(c.name)}
    assert ops == set(CLAIMED)


def test_accelerator_runs_the_layers() -> None:
    """The conformance cases of layer ops really exercise accelerator ops, not only the host.
    (The ConvInteger/MatMulInteger cases have uint8 weights with zero point 0, i.e. asymmetric
    int8 weights after the shift, so they rightly run on the host.)"""
    counted: dict[str, int] = {}
    for case in CASES:
        op = case.model.graph.node[0].op_type
        if _excluded(case.name) or op not in ("Conv", "Gemm", "MatMul", "MaxPool", "AveragePool",
                                               "GlobalAveragePool", "Relu", "Clip", "Add"):
            continue
        model, feeds, _ = _adapt(case)
        floats = [v for v in feeds[0].values() if v.dtype.kind == "f"]
        calibration = feeds[0] if floats and len(floats) == len(feeds[0]) else None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", HostFallbackWarning)
            compiled = optimize(load_model(model), calibration=calibration)
        counted[op] = counted.get(op, 0) + bool(compiled.accel_ops)
    assert all(counted[op] >= 1 for op in counted), counted
    assert counted["Conv"] >= 5 and counted["Gemm"] >= 8 and counted["MaxPool"] >= 8, counted
    assert counted["MatMul"] >= 1 and counted["AveragePool"] >= 4, counted  # batched weights: host
