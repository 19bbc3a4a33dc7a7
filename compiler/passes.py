"""The optimization pipeline: named passes from graph to graph, checked by ``verify`` in between.

``optimize(graph, calibration=..., strict=..., relaxed=..., ort_exact_pooling=..., config=...)``
runs :data:`PIPELINE`:

==================== ==========================================================================
pass                 what it does
==================== ==========================================================================
fold_constants       evaluate nodes whose inputs are all constants (and Shape/Size of static
                     shapes); DequantizeLinear of constant weights is kept (int8 stays int8)
remove_identities    drop Identity, inference-mode Dropout and one-input Sum; two-input Sum is Add
emulate_ort_pooling  (ort_exact_pooling only) DequantizeLinear -> AveragePool/GlobalAveragePool ->
                     QuantizeLinear whose accelerator result could differ from onnxruntime's
                     becomes onnxruntime's QLinearAveragePool/QLinearGlobalAveragePool, run on
                     the host by a bit-exact numpy emulation of its float32 kernel
shift_uint8          uint8 tensors become int8: q - 128 with zero point - 128 (exact); uint8
                     graph inputs/outputs are converted at the boundary
fold_batchnorm       BatchNormalization after Conv/Gemm folded into the weights (int8 weights:
                     into their per-channel scale) and the bias
fuse_bias_add        Add/Sub/Mul of a per-channel constant after Conv/Gemm/MatMul folded into the
                     bias and weights; MatMul with constant weights becomes Gemm
quantize             float model + calibration: QuantizeLinear/DequantizeLinear pairs on the
                     activations (per-tensor int8 from calibration ranges)
sink_dequantize      views (Flatten, Reshape, Squeeze, Unsqueeze, Transpose) move to the int8
                     side of DequantizeLinear/QuantizeLinear
fold_qdq_pairs       QuantizeLinear(DequantizeLinear(q)) with equal parameters is q
lower_layers         DequantizeLinear -> op -> [Add residual] -> [Relu/Clip] -> QuantizeLinear
                     becomes one accelerator op (NHWC): Conv/Gemm/MatMul with bias, input zero
                     point, residual, activation and requantization fused; MaxPool/AveragePool/
                     GlobalAveragePool, Add of two tensors, Relu/Clip, requantization;
                     BatchNormalization and Add/Sub/Mul of per-channel constants on quantized
                     tensors as depthwise 1x1 convs; MatMulInteger/ConvInteger (raw int32 out)
choose_layout        Transpose pairs cancel; Flatten of an NHWC tensor into a Gemm becomes a
                     view with the Gemm's weight rows permuted to (h, w, c) order
fuse_activation      a standalone activation op merges into its producer (same parameters)
fuse_pooling         a pool op merges into the STORE of the conv producing its input
fuse_residual        (relaxed only) an add op merges into the STORE of the conv/gemm producing
                     one operand, dropping that operand's own requantization
resolve_views        Flatten/Squeeze/Unsqueeze/Reshape become one Reshape view; no-ops vanish
eliminate_dead_code  nodes whose outputs nothing reads are removed
report_host_nodes    warn about (or, with strict, reject) nodes left on the host
==================== ==========================================================================

Fidelity. Without ``relaxed``, no fusion drops a requantization step that an int8 model
specifies (a QuantizeLinear/DequantizeLinear pair between two ops): a fused op computes what the
model computes, up to the rounding of the SFU (fixed-point multipliers, ties rounded up, the two
terms of a residual Add rounded separately). BatchNormalization, bias Adds and residual Adds are
folded into the layer before them only when the model has no quantization in between -- float
models, whose quantization the compiler chooses -- or with ``relaxed``.

onnxruntime's average pools. The SFU rounds the exact window mean (fixed-point multiplier, ties
to even); onnxruntime's QLinearAveragePool computes in float32 (QLinearGlobalAveragePool scales
an exact sum by a float32 factor), which lands on the other side of a tie, or of a value very
close to one, now and then. With ``ort_exact_pooling`` such pools run on the host as numpy
emulations of onnxruntime's kernels (``reference.QLinearAveragePool``), bit for bit; a pool
whose accelerator result provably equals onnxruntime's for every input (:func:`ort_pool_may_differ`)
stays on the accelerator.

Layout: accelerator ops work on NHWC tensors (a pixel is a row of channels, as the STORE writes
and an im2col LOAD gathers). Transposes are inserted where NCHW host nodes meet them.
"""

from __future__ import annotations

import dataclasses
import math
import platform
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from systolic.hw.config import AcceleratorConfig
from systolic.sim.arith import choose_multiplier

from .errors import QuantizationError, UnsupportedOpError, VerifyError
from .frontend import QOPERATOR_POOL_NOTE
from .ir import (
    AccelOp,
    ConvGeometry,
    Graph,
    Node,
    Pool,
    QuantParams,
    Residual,
    Scales,
    Tensor,
    make_graph,
    verify,
)
from .quantize import Calibration, quantize_bias, quantize_graph, quantize_weights
from .reference import EMULATION_DOMAIN, dequantize_linear, quantize_linear, resolve_pads, run_node

__all__ = [
    "Pass", "PassOptions", "PIPELINE", "optimize", "HostFallbackWarning", "VIEW_OPS", "BOUNDARY_OPS",
    "ORT_POOL_OPS", "ORT_INT8_QDQ_AS_UINT8", "ort_pool_may_differ",
    "fold_constants", "remove_identities", "emulate_ort_pooling", "shift_uint8", "fold_batchnorm",
    "fuse_bias_add",
    "quantize", "sink_dequantize", "fold_qdq_pairs", "lower_layers", "choose_layout",
    "fuse_activation", "fuse_pooling", "fuse_residual", "resolve_views", "eliminate_dead_code",
    "report_host_nodes",
]

#: Ops that only reinterpret or move data (no arithmetic).
VIEW_OPS = frozenset({"Flatten", "Reshape", "Squeeze", "Unsqueeze", "Transpose", "Identity"})
#: Host ops that are data movement, not computation: allowed with ``strict``.
BOUNDARY_OPS = frozenset({"Reshape", "Transpose", "Concat", "Identity"})

_NCHW_TO_NHWC = (0, 2, 3, 1)
_NHWC_TO_NCHW = (0, 3, 1, 2)
_INT8 = (-128, 127)


class HostFallbackWarning(UserWarning):
    """Some nodes of the model run on the host CPU instead of the accelerator."""


@dataclass(frozen=True, eq=False)
class PassOptions:
    """Options every pass may read: the calibration set (float models), strictness, whether
    fusions may drop a requantization step the model itself specifies (``relaxed``), and whether
    average pools follow onnxruntime's float32 kernels bit for bit (``ort_exact_pooling``)."""
    calibration: Calibration | None = None
    strict: bool = False
    relaxed: bool = False
    ort_exact_pooling: bool = False


@dataclass(frozen=True)
class Pass:
    """One named step of the pipeline."""
    name: str
    run: Callable[[Graph, PassOptions], Graph]

    @property
    def doc(self) -> str:
        return (self.run.__doc__ or "").strip().splitlines()[0]


def optimize(graph: Graph, *, calibration: Any = None, strict: bool = False, relaxed: bool = False,
             ort_exact_pooling: bool = False, config: AcceleratorConfig | None = None,
             trace: Callable[[str, Graph], None] | None = None) -> Graph:
    """Run :data:`PIPELINE` on ``graph`` and return the optimized, quantized graph.

    ``calibration``: inputs for quantizing a float model -- a
    :class:`~systolic.compiler.quantize.Calibration`, a mapping from input name to an array of
    batches (concatenated on axis 0) or an ``.npz`` path. ``strict``: raise
    :class:`~systolic.compiler.errors.UnsupportedOpError` instead of warning when a node must run
    on the host. ``relaxed``: also fuse across a QuantizeLinear/DequantizeLinear pair that the
    model itself contains (BatchNormalization or a bias Add after a quantized Conv/Gemm, a residual
    Add after a quantized Conv/Gemm): one store less, but results may differ from the model's by
    up to about 2 LSB instead of 1. ``ort_exact_pooling``: the average pools of an int8 model
    whose accelerator result could differ from onnxruntime's run on the host, emulating
    onnxruntime's kernels bit for bit (:func:`emulate_ort_pooling`); ``strict`` still allows
    them. ``config`` replaces the graph's accelerator configuration (its input type must be
    int8). ``trace(name, graph)`` is called after every pass.
    """
    if config is not None:
        graph = graph.replace(config=config)
    cfg = graph.config
    if cfg.input_bits != 8 or not cfg.input_signed or cfg.weight_bits != 8 or not cfg.weight_signed:
        raise QuantizationError(f"the ONNX compiler targets int8 inputs and weights; the config has "
                                f"input {'int' if cfg.input_signed else 'uint'}{cfg.input_bits} and "
                                f"weight {'int' if cfg.weight_signed else 'uint'}{cfg.weight_bits}")
    options = PassOptions(Calibration.load(calibration) if calibration is not None else None, strict,
                          relaxed, ort_exact_pooling)
    graph = verify(graph)
    for step in PIPELINE:
        graph = step.run(graph, options)
        try:
            verify(graph)
        except VerifyError as exc:
            raise VerifyError(f"after pass {step.name}: {exc}") from None
        if trace is not None:
            trace(step.name, graph)
    return graph


# -- editing helper --------------------------------------------------------------------------------


class _Edit:
    """Mutable scratch space of one pass; ``graph()`` freezes the result."""

    def __init__(self, graph: Graph) -> None:
        self.g = graph
        self.tensors: dict[str, Tensor] = dict(graph.tensors)
        self.nodes: list[Any] = list(graph.nodes)
        self.removed: set[int] = set()
        self.aliases: dict[str, str] = {}
        self.notes: dict[str, str] = dict(graph.notes)
        self.taken = set(self.tensors) | {n.name for n in self.nodes}

    def fresh(self, base: str) -> str:
        name, i = base, 0
        while name in self.taken:
            i += 1
            name = f"{base}_{i}"
        self.taken.add(name)
        return name

    def tensor(self, tensor: Tensor) -> str:
        self.tensors[tensor.name] = tensor
        self.taken.add(tensor.name)
        return tensor.name

    def new_tensor(self, base: str, shape: tuple[int, ...], dtype: str, **kw: Any) -> str:
        return self.tensor(Tensor(self.fresh(base), shape, dtype, **kw))

    def const(self, base: str, value: np.ndarray) -> str:
        value = np.asarray(value)
        return self.tensor(Tensor(self.fresh(base), value.shape, value.dtype.name, data=value))

    def add(self, node: Any) -> Any:
        self.taken.add(node.name)
        self.nodes.append(node)
        return node

    def remove(self, *nodes: Any) -> None:
        for node in nodes:
            self.removed.add(id(node))

    def is_removed(self, node: Any) -> bool:
        return id(node) in self.removed

    def alias(self, old: str, new: str) -> None:
        """Every use of tensor ``old`` reads ``new`` (same values) from now on."""
        if old != new:
            self.aliases[old] = new

    def resolve(self, name: str) -> str:
        seen = set()
        while name in self.aliases and name not in seen:
            seen.add(name)
            name = self.aliases[name]
        return name

    def live_nodes(self) -> list[Any]:
        return [n for n in self.nodes if id(n) not in self.removed]

    def graph(self) -> Graph:
        nodes = self.live_nodes()
        produced = {o: n for n in nodes for o in n.outputs}
        renames: dict[str, str] = {}
        extra: list[Node] = []
        outputs = list(self.g.outputs)
        for out in outputs:
            target = self.resolve(out)
            if target == out:
                continue
            if target in produced and target not in outputs and target not in self.g.inputs \
                    and target not in renames:
                renames[target] = out       # the producer writes the output name directly
                t = self.tensors[target]
                self.tensors[out] = dataclasses.replace(t, name=out)
            else:
                extra.append(Node("Identity", self.fresh(f"{out}/identity"), (target,), (out,)))
                self.tensors[out] = dataclasses.replace(self.tensors[target], name=out)

        def final(name: str) -> str:
            if not name:
                return name
            name = self.resolve(name)
            return renames.get(name, name)

        out_nodes = []
        for node in nodes:
            if isinstance(node, AccelOp):
                res = node.residual
                node = dataclasses.replace(
                    node, input=final(node.input), output=renames.get(node.output, node.output),
                    residual=dataclasses.replace(res, tensor=final(res.tensor)) if res else None)
            else:
                node = Node(node.op, node.name, tuple(final(i) for i in node.inputs),
                            tuple(renames.get(o, o) for o in node.outputs), node.attrs, node.domain)
            out_nodes.append(node)
        tensors = {n: t for n, t in self.tensors.items() if n not in renames}
        return make_graph(self.g.name, out_nodes + extra, tensors, self.g.inputs, self.g.outputs,
                          self.g.opset, self.g.config, self.notes)


def _consumers(e: _Edit) -> dict[str, list[Any]]:
    users: dict[str, list[Any]] = {}
    for node in e.live_nodes():
        for name in dict.fromkeys(node.inputs):
            if name:
                users.setdefault(e.resolve(name), []).append(node)
    return users


def _producers(e: _Edit) -> dict[str, Any]:
    return {o: n for n in e.live_nodes() for o in n.outputs}


def _const(e: _Edit, name: str) -> np.ndarray | None:
    if not name:
        return None
    t = e.tensors.get(e.resolve(name))
    return None if t is None else t.data


def _is_graph_output(e: _Edit, name: str) -> bool:
    return any(e.resolve(o) == name for o in e.g.outputs) or name in e.g.outputs


# -- small passes ----------------------------------------------------------------------------------

_NEVER_FOLD = frozenset({"DequantizeLinear", "RandomNormal", "RandomUniform", "RandomNormalLike",
                         "RandomUniformLike", "Multinomial", "Bernoulli"})


def fold_constants(graph: Graph, options: PassOptions) -> Graph:
    """Evaluate nodes whose inputs are all constants, and Shape/Size of static shapes."""
    e = _Edit(graph)
    for node in graph.nodes:
        if not isinstance(node, Node) or node.op in _NEVER_FOLD or node.domain:
            continue
        if node.op in ("Shape", "Size") and node.inputs[0]:
            shape = e.tensors[node.inputs[0]].shape
            if node.op == "Shape":
                value = np.array(shape[node.attrs.get("start", 0):node.attrs.get("end")], np.int64)
            else:
                value = np.array(math.prod(shape), np.int64)
            values: tuple[np.ndarray, ...] = (value,)
        elif node.inputs and all(not name or e.tensors[name].is_constant for name in node.inputs):
            args = [e.tensors[name].data if name else None for name in node.inputs]
            values = run_node(node, args, graph.opset, [e.tensors[o].dtype if o else "float32"
                                                        for o in node.outputs], [True] * len(args))
        else:
            continue
        for name, value in zip(node.outputs, values, strict=False):
            if name:
                value = np.asarray(value).astype(e.tensors[name].dtype)
                e.tensor(Tensor(name, value.shape, value.dtype.name, data=value))
        e.remove(node)
    return e.graph()


def remove_identities(graph: Graph, options: PassOptions) -> Graph:
    """Drop Identity, inference-mode Dropout (its mask output becomes a constant of ones) and
    one-input Sum; a two-input Sum becomes Add."""
    e = _Edit(graph)
    for node in graph.nodes:
        if not isinstance(node, Node) or node.domain:
            continue
        if node.op == "Sum" and len(node.inputs) == 2:
            e.remove(node)
            e.add(Node("Add", node.name, node.inputs, node.outputs))
            continue
        if node.op == "Sum" and len(node.inputs) == 1:
            pass
        elif node.op == "Dropout":
            training = _const(e, node.inputs[2]) if len(node.inputs) > 2 else None
            if len(node.inputs) > 2 and node.inputs[2] and (training is None or bool(training)):
                continue
            if len(node.outputs) > 1 and node.outputs[1]:
                mask = e.tensors[node.outputs[1]]
                e.tensor(Tensor(mask.name, mask.shape, "bool", data=np.ones(mask.shape, bool)))
        elif node.op != "Identity":
            continue
        e.alias(node.outputs[0], node.inputs[0])
        e.remove(node)
    return e.graph()


# -- onnxruntime-exact average pools -----------------------------------------------------------

#: The ops emulate_ort_pooling creates (domain ``reference.EMULATION_DOMAIN``): host nodes that
#: strict allows.
ORT_POOL_OPS = frozenset({"QLinearAveragePool", "QLinearGlobalAveragePool"})
#: onnxruntime converts int8 QDQ activations to uint8 except on ARM (its ``QDQIsInt8Allowed``).
ORT_INT8_QDQ_AS_UINT8 = not platform.machine().lower().startswith(("arm", "aarch"))
_U = 2.0 ** -24          # float32 unit roundoff


def _power_of_two(value: float) -> bool:
    return 2.0 ** -100 <= value <= 2.0 ** 100 and math.frexp(value)[0] == 0.5


def ort_pool_may_differ(x_scale: float, y_scale: float, zero_point: int, count: int, whole_image: bool,
                        dtype_range: tuple[int, int] = _INT8) -> bool:
    """Whether onnxruntime's quantized average pool and the SFU's can give different outputs
    for some input. Every window has ``count`` elements; input and output share
    ``zero_point`` (in the integer type ``dtype_range`` onnxruntime computes in);
    ``whole_image``: onnxruntime's global kernel (the exact integer sum times the float32
    ``x_scale / (y_scale * count)``, rounded, plus the zero point) instead of the windowed one
    (float32 dequantize, sum, divide by the count and by ``y_scale``, add the zero point, round).

    False -- they agree for every input -- when either (a) every float32 step is exact (scales
    and count powers of two, sums within 24 bits) and so is the SFU's multiplier: both round
    the same exact value, ties by the same rule (``reference.store_ties``); or (b) for every
    possible window sum S the exact value ``S * x_scale / (y_scale * count)`` lies farther from
    a rounding boundary (a half integer) than the worst-case float32 error of onnxruntime's
    kernel plus the error of the SFU's fixed-point multiplier."""
    lo, hi = dtype_range
    ratio = float(x_scale) / (float(y_scale) * count)
    if not 0.0 < ratio < 2.0 ** 30:
        return True
    try:
        mult, shift = choose_multiplier(ratio)
    except ValueError:
        return True
    sfu_ratio = mult * 2.0 ** -shift
    k_max = max(abs(lo - zero_point), abs(hi - zero_point))
    if k_max * count >= 1 << 24:
        return True
    z_max = max(abs(lo), abs(hi))
    if sfu_ratio == ratio and all(_power_of_two(v) for v in (float(x_scale), float(y_scale), float(count))):
        # (a); the windowed kernel also adds the zero point in float32: exact within 24 bits
        if whole_image or (k_max * count * ratio + z_max) / min(ratio, 1.0) < 2.0 ** 24:
            return False
    sums = np.arange(count * (lo - zero_point), count * (hi - zero_point) + 1, dtype=np.float64)
    value = sums * ratio
    margin = np.abs(value - np.floor(value) - 0.5)
    v_max = k_max * count * ratio
    if whole_image:     # the scale: two roundings; the product: one
        float_error = 3 * _U * v_max
    else:               # products, a count-term sum, two divisions, the zero point's addition
        float_error = (count + 4) * _U * v_max + _U * (v_max + z_max)
    sfu_error = np.abs(sums) * abs(sfu_ratio - ratio)
    return bool(np.any(margin <= 1.01 * float_error + sfu_error + 2.0 ** -30))


def _sfu_pool_refusal(label: str, mode: str, image: tuple[int, ...], kernel: tuple[int, ...],
                      strides: tuple[int, ...], begin: tuple[int, ...], end: tuple[int, ...],
                      out: tuple[int, ...], count_include_pad: bool) -> str | None:
    """Why the SFU cannot pool a 2-D window of this geometry (``image`` the input's H, W; ``out``
    the output's), or None when it can: the STORE walks windows that each hold an image pixel
    and, averaging, divides by the window size with 8-bit window and stride fields."""
    if begin[0] >= kernel[0] or begin[1] >= kernel[1]:
        return f"{label}: padding {begin} must be smaller than the window {kernel}"
    if any((out[i] - 1) * strides[i] - begin[i] >= image[i] for i in range(2)):
        return f"{label}: a window lies entirely in the padding; the STORE needs an image pixel"
    if mode == "avg":
        if (any(begin) or any(end)) and not count_include_pad:
            return (f"{label}: average pooling with padding and count_include_pad=0 divides "
                    f"by a varying count; the SFU divides by the window size")
        if any((out[i] - 1) * strides[i] + kernel[i] > image[i] + begin[i] + end[i] for i in range(2)):
            return f"{label}: ceil_mode windows past the padding divide by a smaller count"
    if max(kernel) > 255 or max(strides) > 255:
        return f"{label}: pooling window {kernel} / stride {strides} exceed the STORE's 8-bit fields"
    return None


def _ort_pool_attrs(e: _Edit, node: Node, x_shape: tuple[int, ...]) -> tuple[dict[str, Any], int, bool,
                                                                                bool] | None:
    """(QLinearAveragePool attributes, window size, whether the window is the whole unpadded
    image, whether the SFU can pool it -- 2-D, the same count in every window) of an
    AveragePool node; None if onnxruntime's QLinearAveragePool cannot take it (dilations)."""
    if any(d != 1 for d in node.attrs.get("dilations") or ()):
        return None
    spatial = x_shape[2:]
    kernel = tuple(node.attrs["kernel_shape"])
    strides = tuple(node.attrs.get("strides") or (1,) * len(kernel))
    begin, end = resolve_pads(spatial, kernel, strides, (1,) * len(kernel),
                              node.attrs.get("auto_pad", "NOTSET"), node.attrs.get("pads"))
    attrs = {k: v for k, v in node.attrs.items() if k != "dilations"}
    whole = tuple(spatial) == kernel and not any(begin) and not any(end)
    out = tuple(e.tensors[node.outputs[0]].shape[2:])
    uniform = len(kernel) == 2 and _sfu_pool_refusal(
        node.label, "avg", tuple(spatial), kernel, strides, begin, end, out,
        bool(node.attrs.get("count_include_pad", 0))) is None
    return attrs, math.prod(kernel), whole, uniform


def _has_zero_point(node: Node) -> bool:
    return len(node.inputs) > 2 and bool(node.inputs[2])


def _qdq_pair_to_uint8(e: _Edit, q: Any, dq: Any, users: Mapping[str, list[Any]]) -> bool:
    """Whether onnxruntime (x86) turns the int8 QuantizeLinear ``q`` -> DequantizeLinear ``dq``
    pair into uint8: q's output read by dq alone (and dq by at most one node, else onnxruntime
    first duplicates it), not a graph output, equal constant scalar zero points."""
    pq, pdq = _dq_params(e, q), _dq_params(e, dq)
    if pq is None or pdq is None or q.op != "QuantizeLinear" or pq.dtype != "int8" or pq.per_channel \
            or pdq.per_channel or not _has_zero_point(q) or not _has_zero_point(dq):
        return False
    out = q.outputs[0]
    return users.get(out, []) == [dq] and not _is_graph_output(e, out) and \
        len(users.get(dq.outputs[0], [])) <= 1 and int(pq.zero_point) == int(pdq.zero_point)


def emulate_ort_pooling(graph: Graph, options: PassOptions) -> Graph:
    """(ort_exact_pooling only) DequantizeLinear -> AveragePool/GlobalAveragePool ->
    QuantizeLinear, which onnxruntime runs as its QLinearAveragePool/QLinearGlobalAveragePool
    (per-tensor constant parameters, one integer type on both sides, the pool read only by the
    QuantizeLinear), becomes that op in ``reference.EMULATION_DOMAIN``: a host node whose numpy
    handler computes what onnxruntime's kernel computes, bit for bit -- unless the SFU provably
    gives the same result (:func:`ort_pool_may_differ`). On x86 onnxruntime runs an int8 QDQ
    pool on uint8 data when it converts the Q/DQ pairs on both sides (``onnxruntime_uint8``);
    a pool with only one side converted it runs in float, and this pass leaves it alone.
    QOperator pools keep the model's integer type: onnxruntime runs those nodes as they are."""
    if not options.ort_exact_pooling:
        return graph
    e = _Edit(graph)
    producers, users = _producers(e), _consumers(e)
    cfg = graph.config
    for node in graph.nodes:
        if not isinstance(node, Node) or node.domain or node.op not in ("AveragePool", "GlobalAveragePool"):
            continue
        dq = producers.get(e.resolve(node.inputs[0]))
        readers = users.get(node.outputs[0], [])
        if len(readers) != 1 or _is_graph_output(e, node.outputs[0]):
            continue
        q = readers[0]
        px, py = _dq_params(e, dq), _dq_params(e, q)
        if px is None or py is None or dq.op != "DequantizeLinear" or q.op != "QuantizeLinear" \
                or px.per_channel or py.per_channel or px.dtype != py.dtype \
                or px.dtype not in ("int8", "uint8") or not _has_zero_point(dq) or not _has_zero_point(q):
            continue
        x = e.resolve(dq.inputs[0])
        shape = e.tensors[x].shape
        if e.tensors[x].is_constant or len(shape) < 3 or (node.op == "AveragePool" and len(shape) > 5):
            continue
        as_uint8 = False
        if px.dtype == "int8" and ORT_INT8_QDQ_AS_UINT8 and \
                not graph.notes.get(node.name, "").startswith(QOPERATOR_POOL_NOTE):
            src = producers.get(x)
            to_u8_in = isinstance(src, Node) and _qdq_pair_to_uint8(e, src, dq, users)
            next_dq = users.get(q.outputs[0], [None])[0]
            to_u8_out = isinstance(next_dq, Node) and next_dq.op == "DequantizeLinear" and \
                _qdq_pair_to_uint8(e, q, next_dq, users)
            if to_u8_in != to_u8_out:
                continue            # onnxruntime runs this pool in float: not emulated
            as_uint8 = to_u8_in
        if node.op == "GlobalAveragePool":
            attrs, count, whole = {}, math.prod(shape[2:]), True
            hw = tuple(shape[2:])
            uniform = len(shape) == 4 and _sfu_pool_refusal(node.label, "avg", hw, hw, (1, 1), (0, 0),
                                                            (0, 0), (1, 1), False) is None
        else:
            found = _ort_pool_attrs(e, node, shape)
            if found is None:
                continue
            attrs, count, whole, uniform = found
        zx, zy = int(px.zero_point), int(py.zero_point)
        info = np.iinfo(px.dtype)
        ort_range, ort_zp = ((0, 255), zx + 128) if as_uint8 else ((info.min, info.max), zx)
        if "avg" in cfg.sfu_pooling and uniform and zx == zy and \
                not ort_pool_may_differ(float(px.scale), float(py.scale), ort_zp, count, whole, ort_range):
            continue        # the accelerator gives onnxruntime's result
        op = "QLinearGlobalAveragePool" if node.op == "GlobalAveragePool" else "QLinearAveragePool"
        e.remove(node, q)
        e.add(Node(op, node.name, (x, dq.inputs[1], dq.inputs[2], q.inputs[1], q.inputs[2]), q.outputs,
                   {**attrs, "onnxruntime_uint8": int(as_uint8)}, EMULATION_DOMAIN))
        e.notes[node.name] = f"{node.label}: onnxruntime's kernel emulated bit for bit (ort_exact_pooling)"
    return eliminate_dead_code(e.graph(), options)


# Input slots that read uint8 data correctly once values and zero point are both shifted by -128,
# as (data slot, zero-point slot) pairs, and ops that move values unchanged (data slots).
_SHIFT_PAIRS = {"QuantizeLinear": (), "DequantizeLinear": ((0, 2),), "MatMulInteger": ((0, 2), (1, 3)),
                "ConvInteger": ((0, 2), (1, 3))}
_SHIFT_TRANSPARENT = {"Reshape": (0,), "Flatten": (0,), "Transpose": (0,), "Squeeze": (0,),
                      "Unsqueeze": (0,), "Identity": (0,), "MaxPool": (0,), "Concat": None}


def _shift_slots(node: Node) -> set[int]:
    """Input slots of ``node`` that take the int8 version of a uint8 tensor."""
    if node.domain:
        return set()
    if node.op in _SHIFT_PAIRS:
        slots = {i for pair in _SHIFT_PAIRS[node.op] for i in pair}
        return slots | ({2} if node.op == "QuantizeLinear" else set())
    if node.op in _SHIFT_TRANSPARENT:
        data = _SHIFT_TRANSPARENT[node.op]
        return set(range(len(node.inputs))) if data is None else set(data)
    return set()


def shift_uint8(graph: Graph, options: PassOptions) -> Graph:
    """Make uint8 data int8 by subtracting 128 from values and zero points (exact): the outputs
    of QuantizeLinear and of value-moving ops (views, MaxPool, Concat) on shifted data; uint8
    constants read by QuantizeLinear/DequantizeLinear/MatMulInteger/ConvInteger. Other readers
    and the graph's uint8 inputs/outputs get exact host conversions."""
    if not any(t.dtype == "uint8" for t in graph.tensors.values()):
        return graph
    e = _Edit(graph)
    one = e.const("uint8_shift/scale", np.array(1.0, np.float32))
    minus128 = e.const("uint8_shift/int8_zero_point", np.array(-128, np.int8))
    zero_i8 = e.const("uint8_shift/int8_zero", np.array(0, np.int8))
    plus128 = e.const("uint8_shift/uint8_zero_point", np.array(128, np.uint8))
    zero_u8 = e.const("uint8_shift/uint8_zero", np.array(0, np.uint8))
    int8_of: dict[str, str] = {}     # uint8 tensor -> its int8 (shifted) version
    uint8_of: dict[str, str] = {}    # tensor shifted in place -> a uint8 copy

    def convert(name: str, to: str, out: str | None = None) -> str:
        """Exact host conversion uint8 <-> int8 through DequantizeLinear/QuantizeLinear."""
        t = e.tensors[name]
        mid = e.new_tensor(f"{name}/centred", t.shape, "float32")
        out = out or e.new_tensor(f"{name}/{to}", t.shape, to)
        dq_zp, q_zp = (plus128, zero_i8) if to == "int8" else (minus128, zero_u8)
        e.add(Node("DequantizeLinear", e.fresh(f"{name}/to_float"), (name, one, dq_zp), (mid,)))
        e.add(Node("QuantizeLinear", e.fresh(f"{name}/to_{to}"), (mid, one, q_zp), (out,)))
        return out

    def int8_version(name: str) -> str:
        if name not in int8_of:
            t = e.tensors[name]
            if t.is_constant:
                int8_of[name] = e.const(f"{name}/int8", (t.data.astype(np.int16) - 128).astype(np.int8))
            else:
                int8_of[name] = convert(name, "int8")
        return int8_of[name]

    for node in graph.nodes:
        if not isinstance(node, Node):
            continue
        slots = _shift_slots(node)
        ins = list(node.inputs)
        for i, name in enumerate(node.inputs):
            if not name or e.tensors[name].dtype not in ("uint8", "int8"):
                continue
            in_place = name in uint8_of or (e.tensors[name].dtype == "int8"
                                            and graph.tensors[name].dtype == "uint8")
            if i in slots and graph.tensors[name].dtype == "uint8" and not in_place:
                ins[i] = int8_version(name)
            elif i not in slots and in_place:
                if name not in uint8_of:
                    uint8_of[name] = convert(name, "uint8")
                ins[i] = uint8_of[name]
        for data, zp in _SHIFT_PAIRS.get(node.op, ()) if not node.domain else ():
            shifted = graph.tensors[node.inputs[data]].dtype == "uint8"
            if shifted and (len(ins) <= zp or not ins[zp]):
                ins += [""] * (zp + 1 - len(ins))
                ins[zp] = minus128
        out_u8 = [o for o in node.outputs if o and graph.tensors[o].dtype == "uint8"]
        if node.op == "QuantizeLinear" and not node.domain and out_u8 and (len(ins) < 3 or not ins[2]):
            ins += [""] * (3 - len(ins))
            ins[2] = minus128
        moves = node.op in _SHIFT_TRANSPARENT or node.op == "QuantizeLinear"
        if moves and not node.domain:
            for o in out_u8:       # shifted in place: same name, int8
                e.tensors[o] = dataclasses.replace(e.tensors[o], dtype="int8")
        if ins != list(node.inputs):
            e.remove(node)
            e.add(Node(node.op, node.name, tuple(ins), node.outputs, node.attrs, node.domain))
    for out in graph.outputs:
        if graph.tensors[out].dtype == "uint8" and e.tensors[out].dtype == "int8":
            inner = e.fresh(f"{out}/int8")
            e.tensors[inner] = dataclasses.replace(e.tensors[out], name=inner)
            e.tensors[out] = graph.tensors[out]
            for node in e.live_nodes():
                if out in node.outputs or out in node.inputs:
                    e.remove(node)
                    ins = tuple(inner if i == out else i for i in node.inputs)
                    outs = tuple(inner if o == out else o for o in node.outputs)
                    e.add(Node(node.op, node.name, ins, outs, node.attrs, node.domain))
            convert(inner, "uint8", out)
    return e.graph()


# -- quantization parameter helpers -------------------------------------------------------------


def _params(e: _Edit, scale: str, zero_point: str, axis: int | None, dtype: str) -> QuantParams | None:
    s = _const(e, scale)
    if s is None:
        return None
    z = _const(e, zero_point) if zero_point else np.zeros(s.shape, np.int64)
    if z is None:
        return None
    if s.size == 1 and z.size == 1:
        s, z = s.reshape(()), z.reshape(())
    if s.ndim > 1 or z.shape != s.shape:
        return None
    return QuantParams(s, z, dtype, axis if s.ndim == 1 else None)


def _dq_params(e: _Edit, node: Any) -> QuantParams | None:
    """Constant parameters of a DequantizeLinear/QuantizeLinear node."""
    if not isinstance(node, Node) or node.op not in ("DequantizeLinear", "QuantizeLinear"):
        return None
    if node.attrs.get("block_size", 0):
        return None
    ins = list(node.inputs) + [""] * 3
    if node.op == "DequantizeLinear":
        dtype = e.tensors[e.resolve(ins[0])].dtype
    else:
        dtype = e.tensors[node.outputs[0]].dtype
    return _params(e, ins[1], ins[2], node.attrs.get("axis", 1), dtype)


def _int_source(e: _Edit, name: str, producers: Mapping[str, Any]) -> tuple[str, QuantParams] | None:
    """(int8 tensor, per-tensor parameters) if ``name`` is DequantizeLinear of an int8 activation."""
    node = producers.get(name)
    p = _dq_params(e, node)
    if p is None or node.op != "DequantizeLinear" or p.per_channel or p.dtype != "int8":
        return None
    src = e.resolve(node.inputs[0])
    if e.tensors[src].is_constant:
        return None
    return src, p


def _q_sinks(e: _Edit, name: str, users: Mapping[str, list[Any]]) -> tuple[list[Node], QuantParams] | None:
    """The QuantizeLinear nodes reading ``name`` if they are its only readers and agree on
    per-tensor int8 parameters."""
    readers = users.get(name, [])
    if not readers or _is_graph_output(e, name):
        return None
    params = None
    for node in readers:
        p = _dq_params(e, node)
        if p is None or p.per_channel or p.dtype != "int8" or node.op != "QuantizeLinear":
            return None
        if params is not None and not params.same_as(p):
            return None
        params = p
    return readers, params


def _through_qdq(e: _Edit, name: str, producers: Mapping[str, Any],
                 users: Mapping[str, list[Any]]) -> tuple[str, list[Node]] | None:
    """If float tensor ``name`` is DequantizeLinear(QuantizeLinear(x)) with nothing else reading
    the pair, return (x, [Q, DQ]). The pair's zero point must lie strictly inside the int8
    range: a zero point at the bottom (or top) means the clamp acts as an activation that
    onnxruntime's quantizer removed, which folding would lose."""
    dq = producers.get(name)
    p = _dq_params(e, dq)
    if p is None or dq.op != "DequantizeLinear" or len(users.get(name, [])) != 1:
        return None
    qname = e.resolve(dq.inputs[0])
    q = producers.get(qname)
    if _dq_params(e, q) is None or q.op != "QuantizeLinear" or len(users.get(qname, [])) != 1 \
            or _is_graph_output(e, qname) or p.per_channel:
        return None
    if not _INT8[0] < int(p.zero_point) < _INT8[1] and p.dtype == "int8":
        return None
    return e.resolve(q.inputs[0]), [q, dq]


def _single_float_producer(e: _Edit, name: str, producers: Mapping[str, Any], users: Mapping[str, list[Any]],
                           ops: tuple[str, ...], across_qdq: bool) -> tuple[Node, list[Node]] | None:
    """The Conv/Gemm/... node producing ``name`` directly (or, ``across_qdq``, through one Q/DQ
    pair), read by nothing else; with the Q/DQ nodes in between."""
    between: list[Node] = []
    src = name
    via = _through_qdq(e, name, producers, users) if across_qdq else None
    if via is not None:
        src, between = via
    node = producers.get(src)
    if not isinstance(node, Node) or node.op not in ops or node.outputs[0] != src:
        return None
    if len(users.get(src, [])) != 1 or _is_graph_output(e, src):
        return None
    return node, between


def _weight_axis(node: Node) -> int:
    """Axis of the output channels in the weights of a Conv/Gemm/MatMul node."""
    if node.op == "Conv":
        return 0
    if node.op == "Gemm":
        return 0 if node.attrs.get("transB", 0) else 1
    return 1


def _float_value(e: _Edit, name: str, producers: Mapping[str, Any]) -> np.ndarray | None:
    """The real value of a constant float tensor or of DequantizeLinear(constant)."""
    if not name:
        return None
    value = _const(e, name)
    if value is not None:
        return value.astype(np.float32) if np.issubdtype(value.dtype, np.floating) else None
    node = producers.get(e.resolve(name))
    p = _dq_params(e, node)
    data = _const(e, node.inputs[0]) if p is not None and node.op == "DequantizeLinear" else None
    if data is None:
        return None
    return dequantize_linear(data, p.scale, p.zero_point, p.axis if p.axis is not None else 1)


# -- BatchNormalization and bias folding -----------------------------------------------------------


def fold_batchnorm(graph: Graph, options: PassOptions) -> Graph:
    """Fold BatchNormalization into the Conv/Gemm producing its input (float weights scaled;
    int8 weights keep their integers and take the factor into their per-channel scale)."""
    e = _Edit(graph)
    for node in graph.nodes:
        if not isinstance(node, Node) or node.op != "BatchNormalization" or e.is_removed(node):
            continue
        if node.attrs.get("training_mode", 0) or len([o for o in node.outputs if o]) != 1:
            continue
        producers, users = _producers(e), _consumers(e)
        consts = [_float_value(e, n, producers) for n in node.inputs[1:5]]
        if any(c is None for c in consts):
            continue
        found = _single_float_producer(e, e.resolve(node.inputs[0]), producers, users, ("Conv", "Gemm"),
                                       options.relaxed)
        if found is None:
            continue
        prod, between = found
        gamma, beta, mean, var = (c.astype(np.float64) for c in consts)
        a = gamma / np.sqrt(var + node.attrs.get("epsilon", 1e-5))
        shift = beta - mean * a
        new = _scale_layer(e, prod, a, shift, producers, node.name)
        if new is None:
            continue
        e.remove(prod, node, *between)
        e.add(dataclasses.replace(new, outputs=(node.outputs[0],)))
        e.notes.pop(node.name, None)
    return e.graph()


def _scale_layer(e: _Edit, node: Node, a: np.ndarray | None, shift: np.ndarray, producers: Mapping[str, Any],
                 tag: str) -> Node | None:
    """``node`` (Conv/Gemm) with its output multiplied by ``a`` per channel (None: 1) and
    ``shift`` added per channel; None if its weights are not constant."""
    axis = _weight_axis(node)
    w_name = node.inputs[1]
    n = e.tensors[e.resolve(w_name)].shape[axis]
    a_vec = np.ones(n) if a is None else np.broadcast_to(a, (n,))
    shift = np.broadcast_to(shift, (n,))
    w_float = _const(e, w_name)
    if w_float is not None:
        if not np.issubdtype(w_float.dtype, np.floating):
            return None
        shape = [1] * w_float.ndim
        shape[axis] = n
        new_w = e.const(f"{w_name}/folded", (w_float * a_vec.reshape(shape)).astype(np.float32))
    else:
        dq = producers.get(e.resolve(w_name))
        p = _dq_params(e, dq)
        data = _const(e, dq.inputs[0]) if p is not None and dq.op == "DequantizeLinear" else None
        if data is None or (p.per_channel and p.axis % data.ndim != axis):
            return None
        scale = np.broadcast_to(p.scale.astype(np.float64), (n,)) * a_vec
        zp = np.broadcast_to(p.zero_point, (n,))
        s_name = e.const(f"{w_name}/scale_folded", scale.astype(np.float32))
        z_name = e.const(f"{w_name}/zero_point_folded", zp.astype(data.dtype))
        new_w = e.new_tensor(f"{w_name}/folded", data.shape, "float32")
        e.add(Node("DequantizeLinear", e.fresh(f"{tag}/dequantize_weights"), (dq.inputs[0], s_name, z_name),
                   (new_w,), {"axis": axis}))
    bias_name = node.inputs[2] if len(node.inputs) > 2 else ""
    bias = _float_value(e, bias_name, producers)
    if bias_name and bias is None:
        return None
    if bias is None:
        bias = np.zeros(n)
    if node.op == "Gemm":
        beta = node.attrs.get("beta", 1.0)
        if np.asarray(bias).size not in (1, n) or (np.asarray(bias).ndim == 2 and bias.shape[0] != 1):
            return None
        bias = np.broadcast_to(np.asarray(bias, np.float64).reshape(-1), (n,)) * beta
    new_b = (np.asarray(bias, np.float64).reshape(-1) * a_vec + shift).astype(np.float32)
    b_name = e.const(f"{tag}/bias", new_b)
    attrs = dict(node.attrs)
    if node.op == "Gemm":
        attrs["beta"] = 1.0
    return Node(node.op, node.name, (node.inputs[0], new_w, b_name), node.outputs, attrs, node.domain)


def fuse_bias_add(graph: Graph, options: PassOptions) -> Graph:
    """Fold Add/Sub/Mul of a per-channel constant into the bias (and weights) of the Conv/Gemm
    before it; a MatMul with constant 2-D weights becomes a Gemm (inputs of rank > 2 through
    Reshape views)."""
    e = _Edit(graph)
    for node in graph.nodes:
        if not isinstance(node, Node) or node.op != "MatMul" or e.is_removed(node):
            continue
        w = e.tensors[e.resolve(node.inputs[1])]
        producers = _producers(e)
        weight_dq = producers.get(e.resolve(node.inputs[1]))
        const_w = w.is_constant or (_dq_params(e, weight_dq) is not None
                                    and weight_dq.op == "DequantizeLinear"
                                    and _const(e, weight_dq.inputs[0]) is not None)
        a = e.tensors[e.resolve(node.inputs[0])]
        if not const_w or len(w.shape) != 2 or len(a.shape) < 2:
            continue
        out = e.tensors[node.outputs[0]]
        e.remove(node)
        if len(a.shape) == 2:
            e.add(Node("Gemm", node.name, (node.inputs[0], node.inputs[1]), node.outputs))
            continue
        flat_a = e.new_tensor(f"{node.inputs[0]}/rows", (math.prod(a.shape[:-1]), a.shape[-1]), a.dtype)
        flat_y = e.new_tensor(f"{node.outputs[0]}/rows", (math.prod(a.shape[:-1]), w.shape[1]), out.dtype)
        rows_shape = e.const(f"{node.name}/rows_shape", np.array([-1, a.shape[-1]], np.int64))
        e.add(Node("Reshape", e.fresh(f"{node.name}/rows"), (node.inputs[0], rows_shape), (flat_a,)))
        e.add(Node("Gemm", node.name, (flat_a, node.inputs[1]), (flat_y,)))
        e.add(Node("Reshape", e.fresh(f"{node.name}/unrows"),
                   (flat_y, e.const(f"{node.name}/out_shape", np.array(out.shape, np.int64))), node.outputs))
    graph = e.graph()
    e = _Edit(graph)
    for node in graph.nodes:
        if not isinstance(node, Node) or node.op not in ("Add", "Sub", "Mul") or node.domain \
                or e.is_removed(node):
            continue
        producers, users = _producers(e), _consumers(e)
        for side in (0, 1):
            value = _float_value(e, node.inputs[1 - side], producers)
            if value is None:
                continue
            found = _single_float_producer(e, e.resolve(node.inputs[side]), producers, users,
                                           ("Conv", "Gemm"), options.relaxed)
            if found is None:
                continue
            prod, between = found
            out_shape = e.tensors[node.outputs[0]].shape
            if e.tensors[prod.outputs[0]].shape != out_shape:
                continue          # the constant broadcasts the output to a bigger shape
            vec = _channel_vector(value, out_shape)
            if vec is None:
                continue
            if node.op == "Add":
                scale, offset = None, vec
            elif node.op == "Sub":
                scale, offset = (None, -vec) if side == 0 else (-np.ones_like(vec), vec)
            else:
                scale, offset = vec, np.zeros_like(vec)
            new = _scale_layer(e, prod, scale, offset, producers, node.name)
            if new is None:
                continue
            e.remove(prod, node, *between)
            e.add(dataclasses.replace(new, outputs=(node.outputs[0],)))
            break
    return e.graph()


# -- calibration ----------------------------------------------------------------------------------


def quantize(graph: Graph, options: PassOptions) -> Graph:
    """With calibration data: quantize the float activations of accelerator-capable ops."""
    if options.calibration is None:
        return graph
    return quantize_graph(graph, options.calibration)


# -- int8 views ----------------------------------------------------------------------------------


def sink_dequantize(graph: Graph, options: PassOptions) -> Graph:
    """Views read the int8 tensor before DequantizeLinear, and write the int8 tensor after
    QuantizeLinear, so that they move int8 data (per-tensor quantization only)."""
    e = _Edit(graph)
    for node in graph.nodes:
        if not isinstance(node, Node) or node.op not in VIEW_OPS:
            continue
        producers, users = _producers(e), _consumers(e)
        src = _int_source_any(e, e.resolve(node.inputs[0]), producers)
        out = e.tensors[node.outputs[0]]
        if src is not None:
            q_name, p, dq = src
            int_out = e.new_tensor(f"{node.outputs[0]}/q", out.shape, e.tensors[q_name].dtype, quant=p)
            e.remove(node)
            e.add(Node(node.op, node.name, (q_name,) + node.inputs[1:], (int_out,), node.attrs, node.domain))
            e.add(Node("DequantizeLinear", e.fresh(f"{node.name}/dequantize"), (int_out,) + dq.inputs[1:],
                       (node.outputs[0],), dq.attrs))
            continue
        sinks = _q_sinks(e, node.outputs[0], users)
        src_t = e.tensors[e.resolve(node.inputs[0])]
        if sinks is None or src_t.is_constant:
            continue
        qs, p = sinks
        q_in = e.new_tensor(f"{node.inputs[0]}/q", src_t.shape, "int8", quant=p)
        e.remove(node, *qs)
        e.add(Node("QuantizeLinear", e.fresh(f"{node.name}/quantize"), (node.inputs[0],) + qs[0].inputs[1:],
                   (q_in,), qs[0].attrs))
        e.add(Node(node.op, node.name, (q_in,) + node.inputs[1:], (qs[0].outputs[0],), node.attrs,
                   node.domain))
        e.tensors[qs[0].outputs[0]] = dataclasses.replace(e.tensors[qs[0].outputs[0]], quant=p)
        for q in qs[1:]:
            e.alias(q.outputs[0], qs[0].outputs[0])
    return e.graph()


def _int_source_any(e: _Edit, name: str,
                    producers: Mapping[str, Any]) -> tuple[str, QuantParams, Node] | None:
    node = producers.get(name)
    p = _dq_params(e, node)
    if p is None or p.per_channel or node.op != "DequantizeLinear":
        return None
    src = e.resolve(node.inputs[0])
    if e.tensors[src].is_constant:
        return None
    return src, p, node


def fold_qdq_pairs(graph: Graph, options: PassOptions) -> Graph:
    """QuantizeLinear(DequantizeLinear(q)) with the same parameters and type is q itself."""
    e = _Edit(graph)
    producers = _producers(e)
    for node in graph.nodes:
        if not isinstance(node, Node) or node.op != "QuantizeLinear":
            continue
        src = _int_source_any(e, e.resolve(node.inputs[0]), producers)
        p = _dq_params(e, node)
        if src is None or p is None or not p.same_as(src[1]):
            continue
        e.alias(node.outputs[0], src[0])
        e.remove(node)
    return e.graph()


# -- lowering to accelerator ops ----------------------------------------------------------------


@dataclass
class _Chain:
    """The tail of a layer: optional residual Add, optional activation node, the QuantizeLinear
    sinks and the output parameters."""
    act_node: Node | None
    sinks: list[Node]
    params: QuantParams
    act: str = "none"
    act_lo: int = _INT8[0]
    act_hi: int = _INT8[1]
    add_node: Node | None = None
    residual: tuple[str, QuantParams] | None = None

    @property
    def output(self) -> str:
        return self.sinks[0].outputs[0]

    @property
    def nodes(self) -> list[Node]:
        return [n for n in (self.add_node, self.act_node) if n is not None] + self.sinks


class _Lowering:
    """State of the lower_layers pass."""

    def __init__(self, graph: Graph) -> None:
        self.e = _Edit(graph)
        self.cfg = graph.config
        self.nhwc: dict[str, str] = {}     # NCHW int tensor -> its NHWC twin

    def refresh(self) -> None:
        self.producers = _producers(self.e)
        self.users = _consumers(self.e)

    # output side

    def chain(self, node: Node, allow_act: bool = True, allow_residual: bool = False) -> _Chain | str:
        out = node.outputs[0]
        act_node = add_node = residual = None
        readers = self.users.get(out, [])
        if allow_residual and self.cfg.sfu_residual and len(readers) == 1 and isinstance(readers[0], Node) \
                and readers[0].op == "Add" and not readers[0].domain and not _is_graph_output(self.e, out):
            add = readers[0]
            ins = [self.e.resolve(i) for i in add.inputs]
            if ins.count(out) == 1:
                src = _int_source(self.e, ins[1 - ins.index(out)], self.producers)
                shape = self.e.tensors[out].shape
                if src is not None and self.e.tensors[src[0]].shape == shape == \
                        self.e.tensors[add.outputs[0]].shape:
                    add_node, residual = add, src
                    out = add.outputs[0]
                    readers = self.users.get(out, [])
        if allow_act and len(readers) == 1 and isinstance(readers[0], Node) and \
                readers[0].op in ("Relu", "Clip") and not _is_graph_output(self.e, out) and \
                self.e.resolve(readers[0].inputs[0]) == out:
            act_node = readers[0]
            out = act_node.outputs[0]
        sinks = _q_sinks(self.e, out, self.users)
        if sinks is None:
            return f"output {out!r} is not quantized to per-tensor int8 (no QuantizeLinear after it)"
        chain = _Chain(act_node, sinks[0], sinks[1], add_node=add_node, residual=residual)
        if act_node is not None:
            reason = self.activation(chain, act_node)
            if reason:
                return reason
        return chain

    def activation(self, chain: _Chain, node: Node) -> str | None:
        p = chain.params
        zp = int(p.zero_point)

        def q(value: float) -> int:
            return int(quantize_linear(np.float32(value), p.scale, zp, np.int8))

        if node.op == "Relu":
            act, lo, hi = "relu", zp, _INT8[1]
        else:
            bounds = []
            for i in (1, 2):
                name = node.inputs[i] if len(node.inputs) > i else ""
                value = _const(self.e, name) if name else None
                if name and value is None:
                    return f"{node.label}: Clip bounds must be constants"
                bounds.append(None if value is None else float(value))
            lo = _INT8[0] if bounds[0] is None else q(bounds[0])
            hi = _INT8[1] if bounds[1] is None else q(bounds[1])
            if bounds[0] == 0.0:
                act = "relu" if bounds[1] is None else "relu6"
            else:
                act = "clip"
        supported = self.cfg.sfu_activations
        if act != "clip" and act not in supported and "clip" in supported:
            act = "clip"
        if act not in supported:
            return f"{node.label}: the SFU has no {act} activation (config sfu_activations)"
        chain.act, chain.act_lo, chain.act_hi = act, lo, hi
        return None

    # layout helpers

    def to_nhwc(self, name: str) -> str:
        if name in self.nhwc:
            return self.nhwc[name]
        t = self.e.tensors[name]
        shape = tuple(t.shape[i] for i in _NCHW_TO_NHWC)
        out = self.e.new_tensor(f"{name}/nhwc", shape, t.dtype, quant=t.quant, layout="NHWC")
        self.e.add(Node("Transpose", self.e.fresh(f"{name}/to_nhwc"), (name,), (out,),
                        {"perm": _NCHW_TO_NHWC}))
        self.nhwc[name] = out
        return out

    def from_nhwc(self, y_nchw: str, dtype: str, quant: QuantParams | None, tag: str) -> str:
        """A fresh NHWC tensor whose NCHW transpose is the existing ``y_nchw``."""
        t = self.e.tensors[y_nchw]
        shape = tuple(t.shape[i] for i in _NCHW_TO_NHWC)
        y = self.e.new_tensor(f"{y_nchw}/nhwc", shape, dtype, quant=quant, layout="NHWC")
        self.e.tensors[y_nchw] = dataclasses.replace(t, dtype=dtype, quant=quant)
        self.e.add(Node("Transpose", self.e.fresh(f"{tag}/to_nchw"), (y,), (y_nchw,),
                        {"perm": _NHWC_TO_NCHW}))
        self.nhwc[y_nchw] = y
        return y

    def finish(self, removed: list[Node], chain: _Chain | None) -> None:
        self.e.remove(*removed)
        if chain is not None:
            self.e.remove(*chain.nodes)
            for q in chain.sinks[1:]:
                self.e.alias(q.outputs[0], chain.output)

    # weights

    def weights(self, node: Node, out_axis: int) -> tuple[np.ndarray, np.ndarray] | str:
        """(int8 weights in the node's own layout, float scale per output channel)."""
        name = node.inputs[1]
        data = _const(self.e, name)
        n = self.e.tensors[self.e.resolve(name)].shape[out_axis]
        if data is not None:
            if not np.issubdtype(data.dtype, np.floating):
                return f"{node.label}: weights {name!r} must be float or DequantizeLinear(int8)"
            w, scale = quantize_weights(data, out_axis)
            return w, scale
        dq = self.producers.get(self.e.resolve(name))
        p = _dq_params(self.e, dq)
        data = _const(self.e, dq.inputs[0]) if p is not None and dq.op == "DequantizeLinear" else None
        if data is None:
            return f"{node.label}: weights {name!r} are not constant"
        if data.dtype != np.int8:
            return f"{node.label}: weights {name!r} must be int8, not {data.dtype}"
        if p.per_channel and p.axis % data.ndim != out_axis:
            return (f"{node.label}: weights {name!r} are quantized per channel along axis {p.axis}, "
                    f"not the output-channel axis {out_axis}")
        if np.any(p.zero_point != 0):
            return (f"{node.label}: weights {name!r} have a nonzero zero point; the accelerator needs "
                    f"symmetric weights")
        return data, np.broadcast_to(p.scale.astype(np.float32), (n,)).copy()

    def bias(self, node: Node, index: int, sx: float, sw: np.ndarray, n: int,
             beta: float = 1.0) -> np.ndarray | str:
        """int32 bias [n] in units of ``sx * sw``."""
        name = node.inputs[index] if len(node.inputs) > index else ""
        if not name:
            return np.zeros(n, np.int32)
        unit = (np.float32(sx) * sw.astype(np.float32)).astype(np.float32)
        dq = self.producers.get(self.e.resolve(name))
        p = _dq_params(self.e, dq)
        data = _const(self.e, dq.inputs[0]) if p is not None and dq.op == "DequantizeLinear" else None
        if data is not None and data.dtype == np.int32 and beta == 1.0 and data.size == n \
                and np.all(p.zero_point == 0) and np.array_equal(np.broadcast_to(p.scale, (n,)), unit):
            return data.reshape(n).astype(np.int32)
        value = _float_value(self.e, name, self.producers)
        if value is None:
            return f"{node.label}: bias {name!r} is not constant"
        if value.size not in (1, n) or (value.ndim == 2 and value.shape[0] != 1):
            return f"{node.label}: bias {name!r} of shape {value.shape} is not one value per output channel"
        vec = np.broadcast_to(value.reshape(-1).astype(np.float64) * beta, (n,))
        try:
            return quantize_bias(vec, unit, node.label)
        except QuantizationError as exc:
            return str(exc)

    def requant(self, node: Any, scale: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
        return _requant(node, scale)


def _requant(node: Any, scale: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel (multiplier, shift) pairs of ``scale`` (``choose_multiplier``)."""
    scale = np.atleast_1d(np.asarray(scale, np.float64))
    mult, shift = np.zeros(scale.shape, np.int64), np.zeros(scale.shape, np.int64)
    for i, s in enumerate(scale):
        try:
            mult[i], shift[i] = choose_multiplier(float(s))
        except ValueError as exc:
            raise QuantizationError(f"{getattr(node, 'label', node)}: {exc}") from None
    return mult, shift


def _fused_names(node: Node, chain: _Chain) -> tuple[str, ...]:
    return (node.name,) + tuple(n.name for n in (chain.add_node, chain.act_node) if n is not None)


def _common_requant(node: Any, scale: np.ndarray | float, res_scale: float
                    ) -> tuple[np.ndarray, np.ndarray, int]:
    """(multiplier, shift) per channel of ``scale`` and the residual multiplier of ``res_scale``,
    all with ONE shift: a STORE with a residual adds ``(r - res_zp) * res_mult`` to
    ``t * mult[c]`` before shifting by the table entry's shift (docs/isa.md), so every channel's
    entry and the CONFIG's ``res_mult`` share it. The shift is the largest that keeps every
    multiplier within int32 (the smallest of the shifts ``choose_multiplier`` would pick)."""
    scale = np.atleast_1d(np.asarray(scale, np.float64))
    shifts = []
    for s in (*scale, res_scale):
        if s == 0.0:
            continue
        try:
            shifts.append(choose_multiplier(float(s))[1])
        except ValueError as exc:
            raise QuantizationError(f"{getattr(node, 'label', node)}: {exc}") from None
    common = min(shifts) if shifts else 0

    def mult(s: float) -> int:
        return int(np.sign(s)) * int(round(abs(s) * (1 << common)))

    mults = np.array([mult(s) for s in scale], np.int64)
    return mults, np.full(scale.shape, common, np.int64), mult(res_scale)


def _requant_residual(lw: _Lowering, chain: _Chain, node: Node, nhwc: bool, scale: np.ndarray | float
                      ) -> tuple[np.ndarray, np.ndarray, Residual | None]:
    """Per-channel (multiplier, shift) of ``scale`` and, when the chain ends in an Add with an int8
    operand, the STORE residual -- then with one shift for every channel (:func:`_common_requant`)."""
    if chain.residual is None:
        mult, shift = lw.requant(node, scale)
        return mult, shift, None
    r, pr = chain.residual
    mult, shift, res_mult = _common_requant(node, scale, float(pr.scale) / float(chain.params.scale))
    residual = Residual(lw.to_nhwc(r) if nhwc else r, int(pr.zero_point), res_mult, int(shift[0]))
    return mult, shift, residual


def _fold_input_zero_point(label: str, bias: np.ndarray, weights: np.ndarray, zp_in: int) -> np.ndarray:
    """``bias - zp_in * sum_k w[k, n]``: the accumulator then sums raw int8 products."""
    total = bias.astype(np.int64) - zp_in * weights.astype(np.int64).sum(axis=0)
    if np.any(np.abs(total) > 2 ** 31 - 1):
        raise QuantizationError(f"{label}: bias with the input zero point folded in does not fit int32")
    return total.astype(np.int32)


def _conv_weights_kn(w: np.ndarray, group: int, ci: int) -> tuple[np.ndarray, int]:
    """ONNX conv weights [Co, Ci/g, kh, kw] as [K, Co] in (kh, kw, ci) order; grouped (not
    depthwise) convolutions become dense with block-diagonal zeros. Returns (weights, group)."""
    co, cig, kh, kw = w.shape
    if group == 1:
        return w.transpose(2, 3, 1, 0).reshape(kh * kw * cig, co), 1
    if group == ci and cig == 1:
        return w.transpose(2, 3, 1, 0).reshape(kh * kw, co), group
    dense = np.zeros((co, ci, kh, kw), w.dtype)
    per = co // group
    for g in range(group):
        dense[g * per:(g + 1) * per, g * cig:(g + 1) * cig] = w[g * per:(g + 1) * per]
    return dense.transpose(2, 3, 1, 0).reshape(kh * kw * ci, co), 1


def _lower_conv(lw: _Lowering, node: Node) -> str | None:
    e = lw.e
    x = _int_source(e, e.resolve(node.inputs[0]), lw.producers)
    if x is None:
        return f"{node.label}: input is not a per-tensor int8 DequantizeLinear"
    xq, px = x
    xt = e.tensors[xq]
    if len(xt.shape) != 4:
        return f"{node.label}: only 2-D convolutions run on the accelerator (input {xt.shape})"
    w = lw.weights(node, 0)
    if isinstance(w, str):
        return w
    w_int, sw = w
    co, cig, kh, kw = w_int.shape
    group = node.attrs.get("group", 1)
    ci = xt.shape[1]
    strides = tuple(node.attrs.get("strides") or (1, 1))
    dilations = tuple(node.attrs.get("dilations") or (1, 1))
    begin, end = resolve_pads(xt.shape[2:], (kh, kw), strides, dilations,
                              node.attrs.get("auto_pad", "NOTSET"), node.attrs.get("pads"))
    chain = lw.chain(node, allow_residual=True)
    if isinstance(chain, str):
        return chain
    sx, sy = float(px.scale), float(chain.params.scale)
    bias = lw.bias(node, 2, sx, sw, co)
    if isinstance(bias, str):
        return bias
    weights, group = _conv_weights_kn(w_int, group, ci)
    zx = int(px.zero_point)
    bias = _fold_input_zero_point(node.label, bias, weights, zx)
    geometry = ConvGeometry((kh, kw), strides, (begin[0], begin[1], end[0], end[1]), dilations, group)
    x_nhwc = lw.to_nhwc(xq)
    mult, shift, residual = _requant_residual(lw, chain, node, True, sx * sw.astype(np.float64) / sy)
    y = lw.from_nhwc(chain.output, "int8", chain.params, node.name)
    e.add(AccelOp("conv", node.name, x_nhwc, y, bias, mult, shift, zx, int(chain.params.zero_point),
                  chain.act, chain.act_lo, chain.act_hi, weights=weights, conv=geometry, residual=residual,
                  scales=Scales(sx, sy, sw, _residual_scale(chain)), fused=_fused_names(node, chain)))
    lw.finish([node], chain)
    return None


def _lower_gemm(lw: _Lowering, node: Node) -> str | None:
    e = lw.e
    x = _int_source(e, e.resolve(node.inputs[0]), lw.producers)
    if x is None:
        return f"{node.label}: input is not a per-tensor int8 DequantizeLinear"
    xq, px = x
    if node.op == "Gemm" and node.attrs.get("transA", 0):
        return f"{node.label}: transA=1 runs on the host"
    w_shape = e.tensors[e.resolve(node.inputs[1])].shape
    if len(w_shape) != 2:
        return f"{node.label}: weights must be a matrix, not shape {w_shape}"
    out_axis = _weight_axis(node)
    w = lw.weights(node, out_axis)
    if isinstance(w, str):
        return w
    w_int, sw = w
    if w_int.ndim != 2:
        return f"{node.label}: weights must be 2-D, not {w_int.shape}"
    weights = w_int.T if out_axis == 0 else w_int
    alpha = float(node.attrs.get("alpha", 1.0)) if node.op == "Gemm" else 1.0
    sw = (sw.astype(np.float64) * alpha).astype(np.float32)
    n = weights.shape[1]
    chain = lw.chain(node, allow_residual=True)
    if isinstance(chain, str):
        return chain
    sx, sy = float(px.scale), float(chain.params.scale)
    bias = lw.bias(node, 2, sx, sw, n, float(node.attrs.get("beta", 1.0)) if node.op == "Gemm" else 1.0)
    if isinstance(bias, str):
        return bias
    zx = int(px.zero_point)
    bias = _fold_input_zero_point(node.label, bias, weights, zx)
    mult, shift, residual = _requant_residual(lw, chain, node, False, sx * sw.astype(np.float64) / sy)
    y = chain.output
    e.tensors[y] = dataclasses.replace(e.tensors[y], dtype="int8", quant=chain.params)
    e.add(AccelOp("gemm", node.name, xq, y, bias, mult, shift, zx, int(chain.params.zero_point),
                  chain.act, chain.act_lo, chain.act_hi, weights=weights, residual=residual,
                  scales=Scales(sx, sy, sw, _residual_scale(chain)), fused=_fused_names(node, chain)))
    lw.finish([node], chain)
    return None


def _residual_scale(chain: _Chain) -> float | None:
    return None if chain.residual is None else float(chain.residual[1].scale)


def _identity_requant(zp_in: int, p_in: QuantParams, p_out: QuantParams, n: int, lw: _Lowering,
                      node: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """bias, mult, shift of an SFU pass that maps input (scale, zp) to output (scale, zp)."""
    bias = np.full(n, -zp_in, np.int32)
    if float(p_in.scale) == float(p_out.scale):
        return bias, np.ones(n, np.int64), np.zeros(n, np.int64)
    mult, shift = lw.requant(node, float(p_in.scale) / float(p_out.scale))
    return bias, np.broadcast_to(mult, (n,)).copy(), np.broadcast_to(shift, (n,)).copy()


def _lower_pool(lw: _Lowering, node: Node) -> str | None:
    e = lw.e
    x = _int_source(e, e.resolve(node.inputs[0]), lw.producers)
    direct = None
    if x is None:
        src = e.tensors[e.resolve(node.inputs[0])]
        if node.op != "MaxPool" or src.dtype != "int8" or src.is_constant:
            return f"{node.label}: input is not a per-tensor int8 DequantizeLinear"
        # max pooling of int8 values (QOperator models): the same integers whatever the scale
        direct = src.quant or QuantParams(np.float32(1.0), np.int64(0))
        x = (src.name, QuantParams(direct.scale, np.int64(0)))
    xq, px = x
    xt = e.tensors[xq]
    if len(xt.shape) != 4:
        return f"{node.label}: only 2-D pooling runs on the accelerator (input {xt.shape})"
    n_, c, h, w = xt.shape
    mode = "max" if node.op == "MaxPool" else "avg"
    if mode not in lw.cfg.sfu_pooling:
        return f"{node.label}: the SFU has no {mode} pooling (config sfu_pooling)"
    if node.op == "GlobalAveragePool":
        kernel, strides, begin, end, out_hw = (h, w), (1, 1), (0, 0), (0, 0), (1, 1)
    else:
        kernel = tuple(node.attrs["kernel_shape"])
        strides = tuple(node.attrs.get("strides") or (1, 1))
        dilations = tuple(node.attrs.get("dilations") or (1, 1))
        if dilations != (1, 1):
            return f"{node.label}: dilated pooling runs on the host"
        if len([o for o in node.outputs if o]) > 1:
            return f"{node.label}: the Indices output runs on the host"
        begin, end = resolve_pads((h, w), kernel, strides, (1, 1), node.attrs.get("auto_pad", "NOTSET"),
                                  node.attrs.get("pads"))
        # the output size ONNX shape inference gave (its ceil_mode rule changed at opset 22)
        out_hw = tuple(e.tensors[node.outputs[0]].shape[2:])
    refusal = _sfu_pool_refusal(node.label, mode, (h, w), kernel, strides, begin, end, out_hw,
                                bool(node.attrs.get("count_include_pad", 0)))
    if refusal is not None:
        return refusal
    if direct is not None:
        chain = _Chain(None, [node], px)
    else:
        chain = lw.chain(node)
    if isinstance(chain, str):
        return chain
    p_out = chain.params
    zx, zy = int(px.zero_point), int(p_out.zero_point)
    avg_mult = avg_shift = 0
    if mode == "avg":
        if zx != zy:
            return (f"{node.label}: input zero point {zx} differs from the output's {zy}; the SFU "
                    f"averages in one zero point")
        avg_mult, avg_shift = lw.requant(node, float(px.scale) / (float(p_out.scale) * kernel[0] * kernel[1]))
        avg_mult, avg_shift = int(avg_mult[0]), int(avg_shift[0])
        bias, mult, shift = np.full(c, -zx, np.int32), np.ones(c, np.int64), np.zeros(c, np.int64)
    else:
        bias, mult, shift = _identity_requant(zx, px, p_out, c, lw, node)
    pool = Pool(mode, kernel, strides, (begin[0], begin[1], end[0], end[1]), out_hw, avg_mult, avg_shift)
    x_nhwc = lw.to_nhwc(xq)
    y = lw.from_nhwc(chain.output, "int8", p_out if direct is None else direct, node.name)
    e.add(AccelOp("pool", node.name, x_nhwc, y, bias, mult, shift, zx, zy, chain.act, chain.act_lo,
                  chain.act_hi, pool=pool, scales=Scales(float(px.scale), float(p_out.scale)),
                  fused=_fused_names(node, chain)))
    lw.finish([node], chain if direct is None else None)
    return None


def _elementwise_io(lw: _Lowering, names: list[str], out: str, params: QuantParams,
                    tag: str) -> tuple[list[str], str]:
    """Inputs and output of an elementwise op: NHWC twins for 4-D tensors."""
    e = lw.e
    if len(e.tensors[out].shape) == 4:
        return [lw.to_nhwc(n) for n in names], lw.from_nhwc(out, "int8", params, tag)
    e.tensors[out] = dataclasses.replace(e.tensors[out], dtype="int8", quant=params)
    return names, out


def _channel_vector(value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """``value`` as one entry per channel (axis 1 of a 4-D tensor, else the last axis), if it
    broadcasts against ``shape`` that way; None otherwise."""
    if value.size == 1:
        n = shape[1] if len(shape) == 4 else shape[-1]
        return np.full(n, float(value.reshape(-1)[0]))
    if len(shape) == 4:
        v = value.reshape(value.shape[-3:]) if value.ndim >= 3 and math.prod(value.shape[:-3]) == 1 else None
        if v is not None and v.shape == (shape[1], 1, 1):
            return v.reshape(-1).astype(np.float64)
        return None
    if value.shape[-1] == shape[-1] and math.prod(value.shape[:-1]) == 1 and value.ndim <= len(shape):
        return value.reshape(-1).astype(np.float64)
    return None


def _affine_weights(steps: np.ndarray) -> np.ndarray:
    """Per channel, the weight magnitude in 64..127 whose multiple of ``steps`` (the channel's
    offset in input steps) is closest to an integer relative to the weight: the int32 bias then
    carries the offset with an error of about 1/8000 of an input step instead of up to 1/254 with
    a fixed weight of 127 (ties go to the larger weight)."""
    candidates = np.arange(127, 63, -1, dtype=np.float64)
    product = np.outer(np.nan_to_num(steps), candidates)
    error = np.abs(np.rint(product) - product) / candidates
    return candidates[np.argmin(error, axis=1)]


def _affine_op(lw: _Lowering, node: Node, xq: str, px: QuantParams, scale: np.ndarray, offset: np.ndarray,
               chain: _Chain) -> str | None:
    """``scale_c * x + offset_c`` per channel on dequantized ``x``, requantized to the chain's
    output, as a depthwise 1x1 conv with weight w_c * sign(scale_c), w_c in 64..127 chosen per
    channel (:func:`_affine_weights`) so that the offset enters the int32 bias almost exactly:
    the only rounding that matters is the final one (2-D [M, C] tensors are viewed as an NHWC
    image [1, M, 1, C])."""
    e = lw.e
    sx, zx = float(px.scale), int(px.zero_point)
    shape = e.tensors[xq].shape
    if len(shape) not in (2, 4):
        return f"{node.label}: only 2-D and 4-D tensors run on the accelerator, not {shape}"
    if np.any(scale == 0):
        return f"{node.label}: a channel with factor 0 is constant; it runs on the host"
    steps = offset / (np.abs(scale) * sx)             # the offset in input steps, per channel
    magnitude = _affine_weights(steps)
    weights = (np.sign(scale) * magnitude).astype(np.int8).reshape(1, -1)
    extra = np.rint(magnitude * steps)
    bias = extra - zx * weights[0].astype(np.int64)
    if np.any(np.abs(bias) > 2 ** 31 - 1):
        return f"{node.label}: the per-channel offset does not fit int32 in accumulator units"
    mult, shift = lw.requant(node, np.abs(scale) * sx / (magnitude * float(chain.params.scale)))
    n = weights.shape[1]
    if len(shape) == 4:
        x_in = lw.to_nhwc(xq)
        y = lw.from_nhwc(chain.output, "int8", chain.params, node.name)
    else:
        image = (1, shape[0], 1, shape[1])
        x_in = e.new_tensor(f"{xq}/image", image, "int8", quant=px, layout="NHWC")
        image_shape = e.const(f"{node.name}/image", np.array(image))
        e.add(Node("Reshape", e.fresh(f"{node.name}/to_image"), (xq, image_shape), (x_in,)))
        out = chain.output
        e.tensors[out] = dataclasses.replace(e.tensors[out], dtype="int8", quant=chain.params)
        y = e.new_tensor(f"{out}/image", image, "int8", quant=chain.params, layout="NHWC")
        rows_shape = e.const(f"{node.name}/rows", np.array(shape))
        e.add(Node("Reshape", e.fresh(f"{node.name}/from_image"), (y, rows_shape), (out,)))
    e.add(AccelOp("conv", node.name, x_in, y, bias.astype(np.int32), mult, shift, zx,
                  int(chain.params.zero_point),
                  chain.act, chain.act_lo, chain.act_hi, weights=weights, conv=ConvGeometry((1, 1), group=n),
                  scales=Scales(sx, float(chain.params.scale), np.abs(scale) / magnitude),
                  fused=_fused_names(node, chain)))
    lw.finish([node], chain)
    return None


def _lower_batchnorm(lw: _Lowering, node: Node) -> str | None:
    """BatchNormalization of a quantized tensor (not folded into a layer): per-channel affine."""
    e = lw.e
    x = _int_source(e, e.resolve(node.inputs[0]), lw.producers)
    consts = [_float_value(e, n, lw.producers) for n in node.inputs[1:5]]
    if x is None or any(c is None for c in consts) or node.attrs.get("training_mode", 0):
        return f"{node.label}: needs a per-tensor int8 input and constant statistics"
    shape = e.tensors[x[0]].shape
    if len(shape) not in (2, 4):
        return f"{node.label}: only 2-D and 4-D inputs run on the accelerator"
    chain = lw.chain(node)
    if isinstance(chain, str):
        return chain
    gamma, beta, mean, var = (c.astype(np.float64) for c in consts)
    a = gamma / np.sqrt(var + node.attrs.get("epsilon", 1e-5))
    return _affine_op(lw, node, x[0], x[1], a, beta - mean * a, chain)


def _lower_scale(lw: _Lowering, node: Node) -> str | None:
    """Mul by a per-channel constant, Sub of one: per-channel affine ops."""
    e = lw.e
    for side in (0, 1):
        x = _int_source(e, e.resolve(node.inputs[side]), lw.producers)
        value = _float_value(e, node.inputs[1 - side], lw.producers) if x is not None else None
        if value is None:
            continue
        out_shape = e.tensors[node.outputs[0]].shape
        vec = _channel_vector(value, out_shape) if e.tensors[x[0]].shape == out_shape and out_shape else None
        if vec is None:
            return f"{node.label}: the constant operand {value.shape} is not one value per channel"
        chain = lw.chain(node)
        if isinstance(chain, str):
            return chain
        if node.op == "Mul":
            scale, offset = vec, np.zeros_like(vec)
        else:
            scale, offset = (np.ones_like(vec), -vec) if side == 0 else (-np.ones_like(vec), vec)
        return _affine_op(lw, node, x[0], x[1], scale, offset, chain)
    return f"{node.label}: needs a per-tensor int8 operand and a constant one"


def _lower_add(lw: _Lowering, node: Node) -> str | None:
    e = lw.e
    a = _int_source(e, e.resolve(node.inputs[0]), lw.producers)
    b = _int_source(e, e.resolve(node.inputs[1]), lw.producers)
    out_shape = e.tensors[node.outputs[0]].shape
    for x, other in ((a, node.inputs[1]), (b, node.inputs[0])):
        value = _float_value(e, other, lw.producers) if x is not None else None
        if value is not None and e.tensors[x[0]].shape == out_shape and out_shape:
            vec = _channel_vector(value, out_shape)
            if vec is None:
                return f"{node.label}: the constant operand {value.shape} is not one value per channel"
            chain = lw.chain(node)
            if isinstance(chain, str):
                return chain
            return _affine_op(lw, node, x[0], x[1], np.ones_like(vec), vec, chain)
    if a is None or b is None:
        return f"{node.label}: operands are not per-tensor int8 DequantizeLinear outputs"
    out_shape = e.tensors[node.outputs[0]].shape
    if e.tensors[a[0]].shape != out_shape or e.tensors[b[0]].shape != out_shape:
        return f"{node.label}: broadcasting Add runs on the host (the residual path adds equal shapes)"
    if not lw.cfg.sfu_residual:
        return f"{node.label}: the SFU has no residual path (config sfu_residual)"
    chain = lw.chain(node)
    if isinstance(chain, str):
        return chain
    (aq, pa), (bq, pb) = a, b
    n = out_shape[1] if len(out_shape) == 4 else out_shape[-1]
    bias = np.full(n, -int(pa.zero_point), np.int32)
    mult, shift, rm = _common_requant(node, np.full(n, float(pa.scale) / float(chain.params.scale)),
                                      float(pb.scale) / float(chain.params.scale))
    (a_in, b_in), y = _elementwise_io(lw, [aq, bq], chain.output, chain.params, node.name)
    residual = Residual(b_in, int(pb.zero_point), rm, int(shift[0]))
    e.add(AccelOp("add", node.name, a_in, y, bias, mult, shift, int(pa.zero_point),
                  int(chain.params.zero_point), chain.act, chain.act_lo, chain.act_hi, residual=residual,
                  scales=Scales(float(pa.scale), float(chain.params.scale), residual=float(pb.scale)),
                  fused=_fused_names(node, chain)))
    lw.finish([node], chain)
    return None


def _lower_activation(lw: _Lowering, node: Node) -> str | None:
    e = lw.e
    x = _int_source(e, e.resolve(node.inputs[0]), lw.producers)
    if x is None:
        return f"{node.label}: input is not a per-tensor int8 DequantizeLinear"
    xq, px = x
    sinks = _q_sinks(e, node.outputs[0], lw.users)
    if sinks is None:
        return f"{node.label}: output is not quantized to per-tensor int8"
    chain = _Chain(None, sinks[0], sinks[1])
    reason = lw.activation(chain, node)
    if reason:
        return reason
    shape = e.tensors[xq].shape
    n = shape[1] if len(shape) == 4 else (shape[-1] if shape else 1)
    if not shape:
        return f"{node.label}: scalar tensors run on the host"
    bias, mult, shift = _identity_requant(int(px.zero_point), px, chain.params, n, lw, node)
    (x_in,), y = _elementwise_io(lw, [xq], chain.output, chain.params, node.name)
    e.add(AccelOp("act", node.name, x_in, y, bias, mult, shift, int(px.zero_point),
                  int(chain.params.zero_point), chain.act, chain.act_lo, chain.act_hi,
                  scales=Scales(float(px.scale), float(chain.params.scale)), fused=(node.name,)))
    lw.finish([node], chain)
    return None


def _requantize_op(lw: _Lowering, xq: str, px: QuantParams, p_out: QuantParams, y: str, name: str) -> None:
    """An act op converting int8 ``xq`` (params ``px``) to ``y`` (params ``p_out``)."""
    shape = lw.e.tensors[xq].shape
    n = shape[1] if len(shape) == 4 else shape[-1]
    bias, mult, shift = _identity_requant(int(px.zero_point), px, p_out, n, lw, f"tensor {xq!r}")
    (x_in,), y_in = _elementwise_io(lw, [xq], y, p_out, name)
    lw.e.add(AccelOp("act", name, x_in, y_in, bias, mult, shift, int(px.zero_point), int(p_out.zero_point),
                     scales=Scales(float(px.scale), float(p_out.scale)), fused=(name,)))


def _lower_requantize(lw: _Lowering, node: Node) -> str | None:
    e = lw.e
    x = _int_source(e, e.resolve(node.inputs[0]), lw.producers)
    p = _dq_params(e, node)
    if x is None or p is None or p.per_channel or p.dtype != "int8" or not e.tensors[x[0]].shape:
        return None
    _requantize_op(lw, x[0], x[1], p, node.outputs[0], node.name)
    e.remove(node)
    return None


def _lower_concat(lw: _Lowering, node: Node) -> str | None:
    e = lw.e
    sources = [_int_source(e, e.resolve(n), lw.producers) for n in node.inputs]
    if any(s is None for s in sources):
        return f"{node.label}: inputs are not per-tensor int8 DequantizeLinear outputs"
    chain = lw.chain(node, allow_act=False)
    if isinstance(chain, str):
        return chain
    p_out = chain.params
    rank = len(e.tensors[node.outputs[0]].shape)
    axis = node.attrs["axis"] % rank
    parts = []
    for i, (q, p) in enumerate(sources):
        if not p.same_as(p_out):
            t = e.tensors[q]
            y = e.new_tensor(f"{q}/requant", t.shape, "int8", quant=p_out)
            _requantize_op(lw, q, p, p_out, y, e.fresh(f"{node.name}/requantize{i}"))
            q = y
        parts.append(q)
    if rank == 4:
        ins = [lw.to_nhwc(q) for q in parts]
        y = lw.from_nhwc(chain.output, "int8", p_out, node.name)
        e.add(Node("Concat", node.name, tuple(ins), (y,), {"axis": _NCHW_TO_NHWC.index(axis)}))
    else:
        y = chain.output
        e.tensors[y] = dataclasses.replace(e.tensors[y], dtype="int8", quant=p_out)
        e.add(Node("Concat", node.name, tuple(parts), (y,), {"axis": axis}))
    lw.finish([node], chain)
    return None


def _lower_integer(lw: _Lowering, node: Node) -> str | None:
    """MatMulInteger/ConvInteger with constant symmetric int8 weights: a raw int32 output."""
    e = lw.e
    ins = list(node.inputs) + [""] * 4
    a, w_name, a_zp, w_zp = ins[:4]
    at = e.tensors[e.resolve(a)]
    w = _const(e, w_name)
    zp_a = _const(e, a_zp) if a_zp else np.zeros((), np.int8)
    zp_w = _const(e, w_zp) if w_zp else np.zeros((), np.int8)
    if at.dtype != "int8" or w is None or w.dtype != np.int8 or zp_a is None or zp_w is None:
        return f"{node.label}: needs int8 input and constant int8 weights"
    if zp_a.size != 1:
        return f"{node.label}: per-row input zero points run on the host"
    if np.any(zp_w != 0):
        return f"{node.label}: weights have a nonzero zero point; the accelerator needs symmetric weights"
    zx = int(zp_a.reshape(-1)[0])
    if node.op == "MatMulInteger":
        if w.ndim != 2 or len(at.shape) < 1:
            return f"{node.label}: weights must be 2-D"
        weights = w
        bias = _fold_input_zero_point(node.label, np.zeros(w.shape[1], np.int32), weights, zx)
        y = node.outputs[0]
        n = w.shape[1]
        e.add(AccelOp("gemm", node.name, e.resolve(a), y, bias, np.ones(n), np.zeros(n), zx, 0,
                      weights=weights, out_type="raw", fused=(node.name,)))
    else:
        if len(at.shape) != 4:
            return f"{node.label}: only 2-D convolutions run on the accelerator"
        co, cig, kh, kw = w.shape
        strides = tuple(node.attrs.get("strides") or (1, 1))
        dilations = tuple(node.attrs.get("dilations") or (1, 1))
        begin, end = resolve_pads(at.shape[2:], (kh, kw), strides, dilations,
                                  node.attrs.get("auto_pad", "NOTSET"), node.attrs.get("pads"))
        weights, group = _conv_weights_kn(w, node.attrs.get("group", 1), at.shape[1])
        bias = _fold_input_zero_point(node.label, np.zeros(co, np.int32), weights, zx)
        geometry = ConvGeometry((kh, kw), strides, (begin[0], begin[1], end[0], end[1]), dilations, group)
        x_nhwc = lw.to_nhwc(e.resolve(a))
        y = lw.from_nhwc(node.outputs[0], "int32", None, node.name)
        e.add(AccelOp("conv", node.name, x_nhwc, y, bias, np.ones(co), np.zeros(co), zx, 0,
                      weights=weights, conv=geometry, out_type="raw", fused=(node.name,)))
    e.remove(node)
    return None


_LOWER: dict[str, Callable[[_Lowering, Node], str | None]] = {
    "Conv": _lower_conv, "Gemm": _lower_gemm, "MatMul": _lower_gemm,
    "MaxPool": _lower_pool, "AveragePool": _lower_pool, "GlobalAveragePool": _lower_pool,
    "Add": _lower_add, "Relu": _lower_activation, "Clip": _lower_activation,
    "BatchNormalization": _lower_batchnorm, "Mul": _lower_scale, "Sub": _lower_scale,
    "Concat": _lower_concat, "QuantizeLinear": _lower_requantize,
    "MatMulInteger": _lower_integer, "ConvInteger": _lower_integer,
}


def lower_layers(graph: Graph, options: PassOptions) -> Graph:
    """Turn DequantizeLinear -> op -> [Relu/Clip] -> QuantizeLinear patterns into accelerator ops
    (weights int8 [K, N], int32 bias with the input zero point folded in, per-channel
    requantization, activation in the output domain), NHWC for images."""
    lw = _Lowering(graph)
    for node in graph.nodes:
        if not isinstance(node, Node) or lw.e.is_removed(node) or node.domain:
            continue
        lower = _LOWER.get(node.op)
        if lower is None:
            continue
        if node.op == "MatMul" and _const(lw.e, node.inputs[1]) is None and \
                _dq_params(lw.e, _producers(lw.e).get(lw.e.resolve(node.inputs[1]))) is None:
            lw.e.notes[node.name] = f"{node.label}: both operands are activations"
            continue
        lw.refresh()
        reason = lower(lw, node)
        if reason:
            lw.e.notes[node.name] = reason
        else:
            lw.e.notes.pop(node.name, None)
    return eliminate_dead_code(lw.e.graph(), options)


# -- layout ------------------------------------------------------------------------------------------


def choose_layout(graph: Graph, options: PassOptions) -> Graph:
    """Compose and cancel Transposes; Flatten of an NHWC image read only by Gemm ops becomes a
    view of the NHWC tensor, with the Gemm weight rows permuted from (c, h, w) to (h, w, c)."""
    changed = True
    while changed:
        changed = False
        e = _Edit(eliminate_dead_code(graph, options))
        producers, users = _producers(e), _consumers(e)
        for node in e.live_nodes():
            if not isinstance(node, Node) or node.op != "Transpose":
                continue
            src = producers.get(e.resolve(node.inputs[0]))
            if isinstance(src, Node) and src.op == "Transpose":
                p1 = src.attrs.get("perm")
                p2 = node.attrs.get("perm")
                perm = tuple(p1[i] for i in p2)
                base = e.resolve(src.inputs[0])
                e.remove(node)
                if perm == tuple(range(len(perm))):
                    e.alias(node.outputs[0], base)
                else:
                    e.add(Node("Transpose", node.name, (base,), node.outputs, {"perm": perm}))
                changed = True
                break
            if tuple(node.attrs.get("perm", ())) != _NHWC_TO_NCHW:
                continue
            flat_users = users.get(node.outputs[0], [])
            for flat in flat_users:
                if not isinstance(flat, Node) or flat.op not in ("Flatten", "Reshape"):
                    continue
                out = e.tensors[flat.outputs[0]]
                src_t = e.tensors[e.resolve(node.inputs[0])]
                n_, h, w, c = src_t.shape
                if out.shape != (n_, h * w * c) or _is_graph_output(e, flat.outputs[0]):
                    continue
                gemms = users.get(flat.outputs[0], [])
                if not gemms or not all(isinstance(g, AccelOp) and g.kind == "gemm"
                                        and g.input == flat.outputs[0] and g.residual is None
                                        for g in gemms):
                    continue
                # k' = (h, w, c) row of the NHWC flattening reads row k = (c, h, w) of the old weights
                hh, ww, cc = np.meshgrid(np.arange(h), np.arange(w), np.arange(c), indexing="ij")
                old_rows = (cc * h * w + hh * w + ww).reshape(-1)
                view = e.new_tensor(f"{flat.outputs[0]}/nhwc", out.shape, out.dtype, quant=out.quant)
                view_shape = e.const(f"{flat.name}/shape", np.array(out.shape, np.int64))
                e.add(Node("Reshape", e.fresh(f"{flat.name}/nhwc"), (e.resolve(node.inputs[0]), view_shape),
                           (view,)))
                for g in gemms:
                    e.remove(g)
                    e.add(dataclasses.replace(g, input=view, weights=g.weights[old_rows]))
                changed = True
            if changed:
                break
        graph = e.graph()
    return eliminate_dead_code(graph, options)


# -- fusions of accelerator ops ------------------------------------------------------------------


def _single_accel_user(e: _Edit, name: str, users: Mapping[str, list[Any]]) -> AccelOp | None:
    readers = users.get(name, [])
    if len(readers) != 1 or not isinstance(readers[0], AccelOp) or _is_graph_output(e, name):
        return None
    return readers[0]


def _is_identity_requant(op: AccelOp) -> bool:
    return op.zp_in == op.zp_out and bool(np.all(op.bias == -op.zp_in)) and bool(np.all(op.mult == 1)) \
        and bool(np.all(op.shift == 0))


def fuse_activation(graph: Graph, options: PassOptions) -> Graph:
    """An act op whose input and output parameters are equal merges into its producer."""
    e = _Edit(graph)
    for _ in range(len(graph.nodes)):
        users, producers = _consumers(e), _producers(e)
        merged = False
        for op in e.live_nodes():
            if not isinstance(op, AccelOp) or op.kind != "act" or not _is_identity_requant(op):
                continue
            prod = producers.get(op.input)
            if not isinstance(prod, AccelOp) or prod.out_type != "int" or prod.pool is not None \
                    or _single_accel_user(e, op.input, users) is not op:
                continue
            if prod.act != "none" and prod.act != op.act:
                continue
            if prod.zp_out != op.zp_in:
                continue
            e.remove(prod, op)
            e.add(dataclasses.replace(prod, output=op.output, act=op.act, act_lo=op.act_lo, act_hi=op.act_hi,
                                      fused=prod.fused + op.fused))
            merged = True
            break
        if not merged:
            break
    return eliminate_dead_code(e.graph(), options)


def fuse_pooling(graph: Graph, options: PassOptions) -> Graph:
    """A pool op merges into the STORE of the conv producing its input when that changes no
    value: max pooling with equal parameters, average pooling (equal zero points by
    construction); the pool must be the conv output's only reader."""
    e = _Edit(graph)
    users, producers = _consumers(e), _producers(e)
    for op in graph.nodes:
        if not isinstance(op, AccelOp) or op.kind != "pool" or e.is_removed(op):
            continue
        prod = producers.get(op.input)
        if not isinstance(prod, AccelOp) or prod.kind != "conv" or prod.pool is not None \
                or prod.residual is not None or prod.out_type != "int" or e.is_removed(prod):
            continue
        if _single_accel_user(e, op.input, users) is not op or not _is_identity_requant(op):
            continue
        if op.act != "none" and prod.act != "none" and op.act != prod.act:
            continue
        act_op = op if op.act != "none" else prod
        e.remove(prod, op)
        e.add(dataclasses.replace(prod, output=op.output, pool=op.pool, act=act_op.act,
                                  act_lo=act_op.act_lo, act_hi=act_op.act_hi, fused=prod.fused + op.fused))
    return eliminate_dead_code(e.graph(), options)


def fuse_residual(graph: Graph, options: PassOptions) -> Graph:
    """An add op merges into the STORE of the conv/gemm producing one operand (read by nothing
    else, no activation, and a zero point strictly inside the int8 range -- at the bottom it
    would be a relu that onnxruntime's quantizer folded into the clamp). The producer then
    requantizes straight to the sum's scale; the other operand becomes the STORE's residual.
    Only with ``relaxed``: it drops the rounding of the producer's own output, which the model
    specifies (without a quantized intermediate, lower_layers fuses the Add directly)."""
    if not options.relaxed:
        return graph
    e = _Edit(graph)
    users, producers = _consumers(e), _producers(e)
    lo, hi = graph.config.output_range
    for op in graph.nodes:
        if not isinstance(op, AccelOp) or op.kind != "add" or e.is_removed(op):
            continue
        for operand in (op.input, op.residual.tensor):
            prod = producers.get(operand)
            if not isinstance(prod, AccelOp) or prod.kind not in ("conv", "gemm") or prod.pool is not None \
                    or prod.residual is not None or prod.act != "none" or prod.out_type != "int" \
                    or prod.scales is None or e.is_removed(prod):
                continue
            if op.input == op.residual.tensor or _single_accel_user(e, operand, users) is not op:
                continue
            if not lo < prod.zp_out < hi:
                continue
            if operand == op.input:
                res_tensor, res_zp, res_scale = op.residual.tensor, op.residual.zero_point, \
                    op.scales.residual
            else:
                res_tensor, res_zp, res_scale = op.input, op.zp_in, op.scales.input
            mult, shift, res_mult = _common_requant(
                prod, prod.scales.input * prod.scales.weight.astype(np.float64) / op.scales.output,
                res_scale / op.scales.output)
            residual = Residual(res_tensor, res_zp, res_mult, int(shift[0]))
            scales = dataclasses.replace(prod.scales, output=op.scales.output,
                                         residual=(op.scales.residual if operand == op.input
                                                   else op.scales.input))
            e.remove(prod, op)
            e.add(dataclasses.replace(prod, output=op.output, mult=mult, shift=shift, zp_out=op.zp_out,
                                      act=op.act, act_lo=op.act_lo, act_hi=op.act_hi, residual=residual,
                                      scales=scales, fused=prod.fused + op.fused))
            break
    return eliminate_dead_code(e.graph(), options)


# -- views, dead code, host report -----------------------------------------------------------------


def resolve_views(graph: Graph, options: PassOptions) -> Graph:
    """Flatten/Squeeze/Unsqueeze/Reshape become one Reshape (a view: same bytes, new shape)
    with a constant shape; chains of views collapse; reshapes and transposes that change
    nothing disappear."""
    e = _Edit(graph)
    for node in graph.nodes:
        if not isinstance(node, Node) or node.op not in ("Flatten", "Squeeze", "Unsqueeze", "Reshape",
                                                         "Transpose"):
            continue
        src = e.resolve(node.inputs[0])
        out = e.tensors[node.outputs[0]]
        if node.op == "Transpose":
            perm = tuple(node.attrs.get("perm", range(len(out.shape) - 1, -1, -1)))
            if perm == tuple(range(len(perm))):
                e.remove(node)
                e.alias(node.outputs[0], src)
            continue
        producer = _producers(e).get(src)
        if isinstance(producer, Node) and producer.op == "Reshape":
            src = e.resolve(producer.inputs[0])
        if e.tensors[src].shape == out.shape:
            e.remove(node)
            e.alias(node.outputs[0], src)
            continue
        e.remove(node)
        shape = e.const(f"{node.name}/shape", np.array(out.shape, np.int64))
        # allowzero: the shape is exact, a 0 is an empty axis (not "copy the input's")
        e.add(Node("Reshape", node.name, (src, shape), node.outputs,
                   {"allowzero": 1} if 0 in out.shape else {}))
    return e.graph()


def eliminate_dead_code(graph: Graph, options: PassOptions) -> Graph:
    """Remove nodes none of whose outputs is read or is a graph output."""
    live = set(graph.outputs)
    kept = []
    for node in reversed(graph.nodes):
        if any(o in live for o in node.outputs if o):
            kept.append(node)
            live.update(n for n in node.inputs if n)
    if len(kept) == len(graph.nodes):
        return graph
    return graph.replace(nodes=tuple(reversed(kept)))


def _is_boundary(graph: Graph, node: Node) -> bool:
    """Data movement and the int8 <-> float conversions where host and accelerator meet."""
    return node.op in BOUNDARY_OPS or node.op in ("QuantizeLinear", "DequantizeLinear")


def report_host_nodes(graph: Graph, options: PassOptions) -> Graph:
    """Warn once, listing each node that computes on the host (strict: raise instead, except for
    the pools that ``ort_exact_pooling`` moves to the host on purpose); data movement (Reshape,
    Transpose, Concat, Identity) and the int8/float conversions
    (QuantizeLinear, DequantizeLinear) where host and accelerator meet do not count."""
    host = [n for n in graph.host_nodes if not _is_boundary(graph, n)]
    if not host:
        return graph
    # the pools ort_exact_pooling moved to the host were asked for: strict allows them
    unrequested = [n for n in host if not (options.ort_exact_pooling and n.domain == EMULATION_DOMAIN
                                           and n.op in ORT_POOL_OPS)]
    if options.strict and unrequested:
        node = unrequested[0]
        why = graph.notes.get(node.name)
        raise UnsupportedOpError(f"{node.label} cannot run on the accelerator"
                                 f"{' (' + why.split(': ', 1)[-1] + ')' if why else ''}; strict=True "
                                 f"forbids running it on the host")
    def describe(n: Node) -> str:
        why = graph.notes.get(n.name)
        return f"{n.name!r} ({n.op}{': ' + why.split(': ', 1)[-1] if why else ''})"

    listing = ", ".join(describe(n) for n in host)
    warnings.warn(HostFallbackWarning(f"{len(host)} node(s) run on the host: {listing}"), stacklevel=3)
    return graph


#: The pipeline, in order.
PIPELINE: tuple[Pass, ...] = tuple(Pass(f.__name__, f) for f in (
    fold_constants, remove_identities, emulate_ort_pooling, shift_uint8, fold_batchnorm, fuse_bias_add,
    quantize, sink_dequantize, fold_qdq_pairs, lower_layers, choose_layout, fuse_activation, fuse_pooling,
    fuse_residual, resolve_views, eliminate_dead_code, report_host_nodes,
))
