"""Post-training quantization of float models, and the quantization arithmetic of the front end.

* Weights: per-channel symmetric int8 (zero point 0), ``scale_c = max|w_c| / 127``.
* Activations: per-tensor asymmetric int8 from calibration ranges, ``min``/``max`` over the
  calibration set (the range always contains 0), or percentiles of the values.
* Bias: int32 in units of ``input_scale * weight_scale_c``.

:func:`quantize_graph` inserts QuantizeLinear/DequantizeLinear pairs around the tensors that
accelerator layers read and write, which puts a float graph into the same QDQ form as an int8
model made by onnxruntime's ``quantize_static``; the passes then lower both alike.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import CalibrationError, QuantizationError
from .ir import Graph, Node, QuantParams, Tensor
from .reference import execute, quantize_linear

__all__ = [
    "Calibration", "Range", "INT8", "calibrate", "activation_params", "quantize_weights",
    "quantize_bias", "quantize_graph", "QUANTIZED_OPS", "SAME_PARAMS_OPS", "FUSIBLE_PRODUCERS",
]

INT8 = (-128, 127)

#: Ops whose activation inputs and outputs are quantized (they can run on the accelerator, or are
#: pure data movement on int8 tensors).
QUANTIZED_OPS = frozenset({"Conv", "Gemm", "MatMul", "MaxPool", "AveragePool", "GlobalAveragePool",
                           "Add", "Relu", "Clip", "Concat", "Flatten", "Reshape", "Transpose",
                           "Squeeze", "Unsqueeze", "BatchNormalization", "Mul", "Sub"})
#: Ops whose output keeps the input's quantization parameters (its values are input values or
#: their averages, so the input's range covers them).
SAME_PARAMS_OPS = frozenset({"MaxPool", "AveragePool", "GlobalAveragePool", "Flatten", "Reshape",
                             "Transpose", "Squeeze", "Unsqueeze"})
#: Producers whose output is not quantized when a Relu/Clip is its only consumer (the activation
#: is fused into the layer, which requantizes once, after it).
FUSIBLE_PRODUCERS = frozenset({"Conv", "Gemm", "MatMul", "Add", "BatchNormalization", "Mul", "Sub"})


@dataclass(frozen=True)
class Range:
    """Observed real range of a tensor."""
    low: float
    high: float


@dataclass(frozen=True, eq=False)
class Calibration:
    """Calibration inputs for post-training quantization: for each graph input, an array of one
    or more batches concatenated on axis 0 (so its length is a multiple of the input's batch).
    ``method`` is ``"minmax"`` or ``"percentile"`` (then ``percentile`` of |values| clips
    outliers, e.g. 99.99)."""

    data: Mapping[str, np.ndarray]
    method: str = "minmax"
    percentile: float = 99.99
    samples: int = field(default=1 << 20)

    def __post_init__(self) -> None:
        if self.method not in ("minmax", "percentile"):
            raise CalibrationError(f"calibration method must be 'minmax' or 'percentile', "
                                   f"not {self.method!r}")
        if not 50.0 < self.percentile <= 100.0:
            raise CalibrationError(f"calibration percentile must be in (50, 100], not {self.percentile!r}")

    @classmethod
    def load(cls, source: Any, **options: Any) -> Calibration:
        """A Calibration from a Calibration, a mapping of arrays or an ``.npz`` file path."""
        if isinstance(source, Calibration):
            return source
        if isinstance(source, str | os.PathLike):
            path = Path(source)
            try:
                with np.load(path) as npz:
                    data = {k: npz[k] for k in npz.files}
            except (OSError, ValueError) as exc:
                raise CalibrationError(f"{path}: cannot read calibration data (an .npz of input "
                                       f"arrays): {exc}") from None
            return cls(data, **options)
        if isinstance(source, Mapping):
            return cls(dict(source), **options)
        raise CalibrationError(f"calibration must be a Calibration, a mapping of input arrays or an "
                               f".npz path, not {type(source).__name__}")

    def batches(self, graph: Graph) -> Iterator[dict[str, np.ndarray]]:
        """The calibration set cut into batches of the graph's input shapes."""
        counts = set()
        for name in graph.inputs:
            tensor = graph.tensors[name]
            if name not in self.data:
                raise CalibrationError(f"calibration data has no array for input {name!r} "
                                       f"(it has {', '.join(repr(k) for k in self.data) or 'none'})")
            arr = np.asarray(self.data[name])
            if not tensor.shape:
                if arr.shape != ():
                    raise CalibrationError(f"calibration array {name!r} must be a scalar like the input, "
                                           f"not shape {arr.shape}")
                counts.add(1)
                continue
            batch = tensor.shape[0]
            if arr.shape == tensor.shape:
                counts.add(1)
                continue
            if arr.ndim != len(tensor.shape) or arr.shape[1:] != tensor.shape[1:] or batch == 0 \
                    or arr.shape[0] % batch or not arr.shape[0]:
                raise CalibrationError(f"calibration array {name!r} must have shape (k * {batch}"
                                       f"{''.join(', ' + str(d) for d in tensor.shape[1:])}) for k >= 1 "
                                       f"batches of the input {tensor.shape}, not {arr.shape}")
            counts.add(arr.shape[0] // batch)
        for name in self.data:
            if name not in graph.inputs:
                raise CalibrationError(f"calibration data names {name!r}, which is not an input of the "
                                       f"graph (inputs: {', '.join(repr(n) for n in graph.inputs)})")
        if len(counts) > 1:
            raise CalibrationError(f"calibration arrays must hold the same number of batches, not "
                                   f"{sorted(counts)}")
        count = counts.pop() if counts else 0
        for i in range(count):
            out = {}
            for name in graph.inputs:
                tensor = graph.tensors[name]
                arr = np.asarray(self.data[name])
                if tensor.shape and arr.shape != tensor.shape:
                    arr = arr[i * tensor.shape[0]:(i + 1) * tensor.shape[0]]
                out[name] = np.ascontiguousarray(arr, dtype=np.dtype(tensor.dtype))
            yield out


def calibrate(graph: Graph, calibration: Calibration, names: set[str]) -> dict[str, Range]:
    """Run the graph (reference executor) over the calibration set and return the observed range
    of each tensor in ``names``."""
    lows: dict[str, float] = {}
    highs: dict[str, float] = {}
    values: dict[str, list[np.ndarray]] = {n: [] for n in names}
    rng = np.random.default_rng(0)
    for batch in calibration.batches(graph):
        env = execute(graph, batch, intermediates=True)
        for name in names:
            v = np.asarray(env[name], dtype=np.float64)
            if not v.size:
                continue
            lo, hi = float(v.min()), float(v.max())
            lows[name] = min(lo, lows.get(name, lo))
            highs[name] = max(hi, highs.get(name, hi))
            if calibration.method == "percentile":
                flat = v.reshape(-1)
                if flat.size > calibration.samples:
                    flat = rng.choice(flat, calibration.samples, replace=False)
                values[name].append(flat)
    ranges = {}
    for name in names:
        if name not in lows:
            continue
        if calibration.method == "percentile":
            flat = np.concatenate(values[name])
            bound = float(np.percentile(np.abs(flat), calibration.percentile))
            ranges[name] = Range(max(lows[name], -bound), min(highs[name], bound))
        else:
            ranges[name] = Range(lows[name], highs[name])
    return ranges


def activation_params(r: Range) -> QuantParams:
    """Per-tensor asymmetric int8 parameters covering ``r`` (and 0, so that zero is exact)."""
    lo, hi = min(r.low, 0.0), max(r.high, 0.0)
    qmin, qmax = INT8
    if not np.isfinite(lo) or not np.isfinite(hi):
        raise QuantizationError(f"calibration range must be finite, not [{r.low}, {r.high}]")
    if hi == lo:
        return QuantParams(np.float32(1.0), np.int64(0))
    scale = np.float32((hi - lo) / (qmax - qmin))
    zero_point = int(np.clip(np.rint(qmin - lo / float(scale)), qmin, qmax))
    return QuantParams(scale, np.int64(zero_point))


def quantize_weights(w: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel symmetric int8 quantization of float weights along ``axis``: returns the int8
    weights and the float32 scale per channel (``max|w_c| / 127``, 1.0 for an all-zero channel)."""
    w = np.asarray(w, dtype=np.float32)
    moved = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)
    peak = np.abs(moved).max(axis=1) if moved.size else np.zeros(w.shape[axis], np.float32)
    scale = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
    q = quantize_linear(w, scale, 0, np.int8, axis=axis)
    return np.clip(q, -127, 127).astype(np.int8), scale


def quantize_bias(b: np.ndarray, scale: np.ndarray, what: str) -> np.ndarray:
    """Float bias to int32 in units of ``scale`` (input scale x weight scale, per channel)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.rint(np.asarray(b, np.float64) / np.asarray(scale, np.float64))
    q = np.where(np.asarray(scale) == 0, 0, q)
    limit = 2 ** 31 - 1
    if np.any(np.abs(q) > limit):
        worst = float(np.abs(q).max())
        raise QuantizationError(f"{what}: bias does not fit int32 in units of input scale x weight "
                                f"scale (largest {worst:.3g}, limit {limit})")
    return q.astype(np.int32)


def quantize_graph(graph: Graph, calibration: Calibration) -> Graph:
    """Insert QuantizeLinear/DequantizeLinear pairs (int8, per tensor) on the float activations
    read or written by :data:`QUANTIZED_OPS`, with parameters from ``calibration``.

    A tensor that is already quantized (produced by DequantizeLinear or only read by
    QuantizeLinear) is left alone. Outputs of views and pools share their input's parameters.
    """
    producers, consumers = graph.producers, graph.consumers
    float_types = ("float32", "float64", "float16")

    def quantizable(node: Node) -> bool:
        """Mul and Sub only with one constant operand (a per-channel affine op)."""
        if node.op in ("Mul", "Sub"):
            return sum(graph.tensors[i].is_constant for i in node.inputs) == 1
        return node.op in QUANTIZED_OPS

    def is_activation_input(node: Node, index: int) -> bool:
        if not quantizable(node):
            return False
        if node.op in ("Mul", "Sub"):
            return not graph.tensors[node.inputs[index]].is_constant
        if node.op in ("Conv", "Gemm", "BatchNormalization"):
            return index == 0
        if node.op == "MatMul":
            return index == 0 and graph.constant(node.inputs[1]) is not None
        if node.op in ("Clip",):
            return index == 0
        if node.op in ("Reshape",):
            return index == 0
        if node.op in ("Squeeze", "Unsqueeze"):
            return index == 0
        return True

    # a Conv/Gemm/MatMul output read only by an Add of two activations of one shape is not
    # quantized: the layer adds the other operand on its STORE path (one operand per Add)
    into_residual: set[str] = set()
    for node in graph.nodes:
        if not isinstance(node, Node) or node.op != "Add" or node.inputs[0] == node.inputs[1]:
            continue
        shape = graph.tensors[node.outputs[0]].shape
        for i in (0, 1):
            name, other = node.inputs[i], node.inputs[1 - i]
            prod = producers.get(name)
            if isinstance(prod, Node) and prod.op in ("Conv", "Gemm", "MatMul") and \
                    len(consumers.get(name, ())) == 1 and name not in graph.outputs and \
                    not graph.tensors[other].is_constant and other not in into_residual and \
                    graph.tensors[name].shape == graph.tensors[other].shape == shape and \
                    not (isinstance(producers.get(other), Node) and producers[other].op == "DequantizeLinear"
                         and graph.tensors[producers[other].inputs[0]].is_constant):
                into_residual.add(name)
                break

    def fused_away(name: str) -> bool:
        users = consumers.get(name, ())
        prod = producers.get(name)
        return name in into_residual or (
            isinstance(prod, Node) and prod.op in FUSIBLE_PRODUCERS and len(users) == 1
            and isinstance(users[0], Node) and users[0].op in ("Relu", "Clip") and name not in graph.outputs)

    def already(name: str) -> bool:
        prod = producers.get(name)
        users = consumers.get(name, ())
        return (isinstance(prod, Node) and prod.op == "DequantizeLinear") or \
            (bool(users) and all(isinstance(u, Node) and u.op == "QuantizeLinear" for u in users))

    wanted: list[str] = []
    for name, tensor in graph.tensors.items():
        if tensor.is_constant or tensor.dtype not in float_types or already(name) or fused_away(name):
            continue
        prod = producers.get(name)
        read = any(isinstance(u, Node) and any(i == name and is_activation_input(u, k)
                                               for k, i in enumerate(u.inputs))
                   for u in consumers.get(name, ()))
        written = isinstance(prod, Node) and quantizable(prod)
        if read or written:
            wanted.append(name)
    if not wanted:
        return graph
    ranges = calibrate(graph, calibration, set(wanted))
    order = {n: i for i, node in enumerate(graph.nodes) for n in node.outputs}
    wanted.sort(key=lambda n: order.get(n, -1))
    params: dict[str, QuantParams] = {}
    for name in wanted:
        prod = producers.get(name)
        if isinstance(prod, Node) and prod.op in SAME_PARAMS_OPS and prod.inputs[0] in params:
            params[name] = params[prod.inputs[0]]
        elif name in ranges:
            params[name] = activation_params(ranges[name])

    # Concat inputs read by nothing else take the output's parameters: the concatenation is then
    # a pure copy (its range covers every input's)
    for node in graph.nodes:
        if isinstance(node, Node) and node.op == "Concat" and node.outputs[0] in params:
            for name in node.inputs:
                if name in params and len(consumers.get(name, ())) == 1 and name not in graph.outputs:
                    params[name] = params[node.outputs[0]]

    tensors = dict(graph.tensors)
    nodes = list(graph.nodes)
    renamed: dict[str, str] = {}
    taken = set(tensors) | {n.name for n in nodes}

    def fresh(base: str) -> str:
        name, i = base, 0
        while name in taken:
            i += 1
            name = f"{base}_{i}"
        taken.add(name)
        return name

    new_nodes: list[Node] = []
    input_rewire: dict[str, str] = {}
    for name, p in params.items():
        t = tensors[name]
        scale_name = fresh(f"{name}/scale")
        zp_name = fresh(f"{name}/zero_point")
        tensors[scale_name] = Tensor(scale_name, (), "float32", data=np.asarray(p.scale, np.float32))
        tensors[zp_name] = Tensor(zp_name, (), "int8", data=np.asarray(p.zero_point, np.int8))
        q_name = fresh(f"{name}/q")
        tensors[q_name] = Tensor(q_name, t.shape, "int8", quant=p)
        if name in graph.inputs:
            src, dst = name, fresh(f"{name}/dq")
            tensors[dst] = Tensor(dst, t.shape, t.dtype)
            input_rewire[name] = dst
        else:
            src, dst = fresh(f"{name}/float"), name
            tensors[src] = Tensor(src, t.shape, t.dtype)
            renamed[name] = src
        new_nodes.append(Node("QuantizeLinear", fresh(f"{name}/quantize"), (src, scale_name, zp_name),
                              (q_name,)))
        new_nodes.append(Node("DequantizeLinear", fresh(f"{name}/dequantize"), (q_name, scale_name, zp_name),
                              (dst,)))
    out_nodes = []
    for node in nodes:
        ins = tuple(input_rewire.get(i, i) for i in node.inputs)
        outs = tuple(renamed.get(o, o) for o in node.outputs)
        out_nodes.append(Node(node.op, node.name, ins, outs, node.attrs, node.domain)
                         if isinstance(node, Node) else node)
    return graph.replace(nodes=out_nodes + new_nodes, tensors=tensors)
