"""The compiler's one intermediate representation.

A :class:`Graph` is immutable: frozen dataclasses whose arrays are read-only numpy arrays. Passes
(``systolic.compiler.passes``) are functions from graph to graph; :func:`verify` checks the
invariants between every two passes.

Nodes come in two kinds:

* :class:`Node` -- an ONNX operator, run on the host by the reference executor
  (``systolic.compiler.reference``). Attributes are Python values (ints, floats, strings, tuples,
  read-only arrays). An optional input that is absent is the empty name ``""``.
* :class:`AccelOp` -- one accelerator layer: int8 in, int8 (or raw int32) out, executed with the
  integer semantics of docs/isa.md (COMPUTE then STORE through the SFU).

Layout. Four-dimensional activations of accelerator layers are NHWC (``Tensor.layout``); a
tensor's ``shape`` is always its physical shape in that layout. Host nodes see ONNX's NCHW; the
passes put ``Transpose`` nodes at the borders and cancel those that meet.

Accelerator layer semantics (what the lowering must reproduce and the golden model checks):

* ``kind="conv"``: input NHWC int8 [N, H, W, Ci]. Out-of-image (padding) elements read ``zp_in``
  (the LOAD ``pad_value``). Group 1: ``weights`` is [K, Co] with K ordered (kh, kw, ci) --
  ``k = (i * kw + j) * Ci + ci`` -- exactly an im2col row gathered from NHWC. Depthwise
  (``conv.group == Ci``, Co = Ci * multiplier): ``weights`` is [kh * kw, Co], K ordered (kh, kw),
  output channel ``co`` reading input channel ``co // multiplier``. (Other groupings are
  lowered as group 1 with block-diagonal zero weights.)
  ``acc = wrap_acc_bits(sum_k x[k] * w[k, co])``; the input zero point is folded into ``bias``
  (``bias = b - zp_in * sum_k w[k, co]``), so the accumulator sums raw int8 products.
  BatchNormalization and per-channel constant Add/Sub/Mul of a quantized tensor are depthwise
  1x1 convs with weights +-127 (2-D tensors [M, C] viewed as an NHWC image [1, M, 1, C]).
* ``kind="gemm"``: input int8 [..., K], ``weights`` [K, N], output [..., N]; otherwise as conv.
* ``kind="pool"``, ``"act"``, ``"add"``: no weights; the input tensor itself is the accumulator
  image (LOAD with ``widen``), ``bias = -zp_in`` per channel, so ``a + bias`` is the centred input.
  ``pool`` has a :class:`Pool`, ``act`` only an activation and/or a requantization (to new
  parameters), ``add`` a :class:`Residual` (the second operand). Channels are the last axis.
* STORE (all kinds, ``out_type="int"``): per channel c, ``sfu_pointwise`` of ``systolic.sim.arith``
  -- ``t = sat_acc(a + bias[c])``, ``q = rounding_shift_even(t * mult[c] + (r - res_zp) *
  res_mult, shift[c]) + zp_out`` (the residual term only with a residual; one rounding, ties to
  even, the tie judged before or after zp_out as ``reference.store_ties`` says), the activation in the
  output domain (relu: ``>= zp_out``; relu6: ``[zp_out, act_hi]``; clip: ``[act_lo, act_hi]``),
  saturation to int8. Then the optional pooling (max over in-image pixels; avg with
  count_include_pad: ``avg_pool_finish`` over ``window`` pixels, out-of-image pixels counted as
  ``zp_out``). A residual is never combined with pooling.
* ``out_type="raw"`` (MatMulInteger/ConvInteger): no SFU; ``bias`` is preloaded into the
  accumulator (LOAD acc) and the output is the wrapped int32 accumulator.

Units: shapes and window sizes in elements/pixels; ``shift`` in bits; scales are real numbers
per integer step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any

import numpy as np
from systolic.hw.config import AcceleratorConfig

from .errors import VerifyError

__all__ = [
    "DTYPES", "LAYOUTS", "KINDS", "ACTIVATIONS", "POOL_MODES", "OUT_TYPES",
    "QuantParams", "Tensor", "Node", "ConvGeometry", "Pool", "Residual", "Scales", "AccelOp",
    "Graph", "make_graph", "verify", "format_graph", "frozen_array", "conv_output_size",
]

#: Element types a tensor may have (numpy names).
DTYPES = ("float32", "float64", "float16", "int8", "uint8", "int16", "uint16", "int32", "uint32",
          "int64", "uint64", "bool")
#: Physical layouts of 4-D activation tensors.
LAYOUTS = ("NCHW", "NHWC")
#: Kinds of accelerator layers.
KINDS = ("conv", "gemm", "pool", "add", "act")
#: SFU activations (output domain), in the order of ``systolic.sim.arith`` codes.
ACTIVATIONS = ("none", "relu", "relu6", "clip")
POOL_MODES = ("max", "avg")
OUT_TYPES = ("int", "raw")


def frozen_array(value: Any, dtype: Any = None) -> np.ndarray:
    """A read-only copy of ``value`` as a numpy array (of ``dtype`` if given)."""
    arr = np.array(value, dtype=dtype, copy=True)
    arr.flags.writeable = False
    return arr


def conv_output_size(size: int, kernel: int, stride: int, pad_begin: int, pad_end: int,
                     dilation: int = 1, ceil_mode: bool = False) -> int:
    """Output length of a convolution or pooling window along one axis, elements."""
    span = (kernel - 1) * dilation + 1
    total = size + pad_begin + pad_end - span
    if ceil_mode:
        out = -(-total // stride) + 1
        # ONNX: the last window must start inside the image or the leading padding
        if (out - 1) * stride >= size + pad_begin:
            out -= 1
        return out
    return total // stride + 1


# -- tensors ------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class QuantParams:
    """Affine quantization ``real = (q - zero_point) * scale``: per tensor (0-d arrays) or per
    channel along ``axis`` (1-d arrays). ``dtype`` is the integer type of ``q``."""

    scale: np.ndarray
    zero_point: np.ndarray
    dtype: str = "int8"
    axis: int | None = None

    def __post_init__(self) -> None:
        scale = frozen_array(self.scale, np.float32)
        zero_point = frozen_array(self.zero_point, np.int64)
        if scale.ndim > 1 or scale.shape != zero_point.shape:
            raise VerifyError(f"quantization scale and zero point must be scalars or vectors of one "
                              f"length, not shapes {scale.shape} and {zero_point.shape}")
        if scale.ndim == 1 and self.axis is None:
            raise VerifyError("per-channel quantization parameters need an axis, not None")
        object.__setattr__(self, "scale", scale)
        object.__setattr__(self, "zero_point", zero_point)

    @property
    def per_channel(self) -> bool:
        return self.scale.ndim == 1

    def same_as(self, other: QuantParams | None) -> bool:
        """Equal scale, zero point, integer type and axis."""
        return (other is not None and self.dtype == other.dtype and self.axis == other.axis
                and self.scale.shape == other.scale.shape
                and bool(np.all(self.scale == other.scale))
                and bool(np.all(self.zero_point == other.zero_point)))

    def __repr__(self) -> str:
        if self.per_channel:
            return f"QuantParams({self.dtype}, per-channel axis={self.axis}, {self.scale.size} ch)"
        return f"QuantParams({self.dtype}, scale={float(self.scale):.6g}, zp={int(self.zero_point)})"


@dataclass(frozen=True, eq=False)
class Tensor:
    """A value of the graph. ``shape`` is in elements, physical order (see ``layout``); ``data``
    is set for constants (read-only); ``quant`` for integer tensors that stand for real values."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    data: np.ndarray | None = None
    quant: QuantParams | None = None
    layout: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if self.data is not None:
            object.__setattr__(self, "data", frozen_array(self.data))

    @property
    def is_constant(self) -> bool:
        return self.data is not None

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    def __repr__(self) -> str:
        parts = [f"{self.name}: {self.dtype}{list(self.shape)}"]
        if self.layout:
            parts.append(self.layout)
        if self.quant is not None:
            parts.append(repr(self.quant))
        if self.data is not None:
            parts.append("const")
        return "Tensor(" + " ".join(parts) + ")"


# -- nodes --------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Node:
    """An ONNX operator executed on the host."""

    op: str
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    domain: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        object.__setattr__(self, "attrs", MappingProxyType(dict(self.attrs)))

    @property
    def label(self) -> str:
        """How errors and reports name this node."""
        return f"node {self.name!r} ({self.op})"

    def __repr__(self) -> str:
        attrs = ", ".join(f"{k}={_short(v)}" for k, v in self.attrs.items())
        return (f"{self.name}: {self.op}({', '.join(self.inputs)}{'; ' + attrs if attrs else ''})"
                f" -> {', '.join(self.outputs)}")


@dataclass(frozen=True)
class ConvGeometry:
    """Convolution window, elements: (height, width) pairs and pads (top, left, bottom, right)."""

    kernel: tuple[int, int]
    stride: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    dilation: tuple[int, int] = (1, 1)
    group: int = 1

    def output_hw(self, height: int, width: int) -> tuple[int, int]:
        """Output pixels (rows, columns) for an input image of ``height`` x ``width``."""
        return (conv_output_size(height, self.kernel[0], self.stride[0], self.pads[0], self.pads[2],
                                 self.dilation[0]),
                conv_output_size(width, self.kernel[1], self.stride[1], self.pads[1], self.pads[3],
                                 self.dilation[1]))


@dataclass(frozen=True)
class Pool:
    """Pooling on the STORE path (after the activation): window, stride, pads (top, left,
    bottom, right) in pixels; ``out_hw`` the output pixels; for ``avg`` the fixed-point
    ``avg_mult * 2**-avg_shift`` that replaces the division by the window size."""

    mode: str
    window: tuple[int, int]
    stride: tuple[int, int]
    pads: tuple[int, int, int, int]
    out_hw: tuple[int, int]
    avg_mult: int = 0
    avg_shift: int = 0


@dataclass(frozen=True)
class Residual:
    """A second int8 operand added on the STORE path, element by element (same shape as the
    output): ``(r - zero_point) * mult`` joins the requantize product before its one rounding
    by ``shift``, which therefore equals the shift of every output channel."""

    tensor: str
    zero_point: int
    mult: int
    shift: int


@dataclass(frozen=True, eq=False)
class Scales:
    """Real-valued scales kept for reporting: input, per-output-channel weight (or empty) and
    output, plus the residual's."""

    input: float
    output: float
    weight: np.ndarray = field(default_factory=lambda: frozen_array([], np.float32))
    residual: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "weight", frozen_array(self.weight, np.float32))


@dataclass(frozen=True, eq=False)
class AccelOp:
    """One accelerator layer (see the module docstring for its exact integer semantics).
    Per-channel arrays have one entry per output channel N: ``bias`` int32, ``mult`` int32,
    ``shift`` 0..62."""

    kind: str
    name: str
    input: str
    output: str
    bias: np.ndarray
    mult: np.ndarray
    shift: np.ndarray
    zp_in: int
    zp_out: int
    act: str = "none"
    act_lo: int = -128
    act_hi: int = 127
    weights: np.ndarray | None = None
    conv: ConvGeometry | None = None
    pool: Pool | None = None
    residual: Residual | None = None
    out_type: str = "int"
    scales: Scales | None = None
    fused: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "bias", frozen_array(self.bias, np.int32))
        object.__setattr__(self, "mult", frozen_array(self.mult, np.int32))
        object.__setattr__(self, "shift", frozen_array(self.shift, np.int32))
        if self.weights is not None:
            object.__setattr__(self, "weights", frozen_array(self.weights, np.int8))
        object.__setattr__(self, "zp_in", int(self.zp_in))
        object.__setattr__(self, "zp_out", int(self.zp_out))
        object.__setattr__(self, "act_lo", int(self.act_lo))
        object.__setattr__(self, "act_hi", int(self.act_hi))
        object.__setattr__(self, "fused", tuple(self.fused))

    @property
    def op(self) -> str:
        return f"accel.{self.kind}"

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.input,) + ((self.residual.tensor,) if self.residual is not None else ())

    @property
    def outputs(self) -> tuple[str, ...]:
        return (self.output,)

    @property
    def channels(self) -> int:
        """Output channels N (entries of the per-channel arrays)."""
        return int(self.bias.shape[0]) if self.bias.ndim == 1 else -1

    @property
    def label(self) -> str:
        return f"accelerator op {self.name!r} ({self.kind})"

    def __repr__(self) -> str:
        parts = [f"{self.name}: accel.{self.kind}({', '.join(self.inputs)}) -> {self.output}"]
        if self.weights is not None:
            parts.append(f"weights {self.weights.shape[0]}x{self.weights.shape[1]}")
        if self.conv is not None:
            c = self.conv
            parts.append(f"k{c.kernel[0]}x{c.kernel[1]} s{c.stride[0]},{c.stride[1]} p{list(c.pads)}"
                         f"{f' d{c.dilation}' if c.dilation != (1, 1) else ''}"
                         f"{f' g{c.group}' if c.group != 1 else ''}")
        parts.append(f"zp {self.zp_in}->{self.zp_out}")
        if self.act != "none":
            parts.append(f"{self.act}[{self.act_lo},{self.act_hi}]" if self.act != "relu" else "relu")
        if self.pool is not None:
            parts.append(f"{self.pool.mode}pool {self.pool.window[0]}x{self.pool.window[1]}"
                         f" s{self.pool.stride[0]}")
        if self.residual is not None:
            parts.append(f"+ {self.residual.tensor}")
        if self.out_type != "int":
            parts.append(self.out_type)
        if self.fused:
            parts.append(f"<- {'+'.join(self.fused)}")
        return "  ".join(parts)


AnyNode = Node | AccelOp


# -- graph --------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Graph:
    """A whole model: nodes in topological order, every tensor by name, the graph's inputs and
    outputs (names), the ONNX opset and the accelerator configuration it targets. ``notes`` keeps,
    by node name, why a pass left a node on the host (and, from the front end, which pools were
    onnxruntime QOperator nodes: ``frontend.QOPERATOR_POOL_NOTE``)."""

    name: str
    nodes: tuple[AnyNode, ...]
    tensors: Mapping[str, Tensor]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    opset: int
    config: AcceleratorConfig = field(default_factory=AcceleratorConfig)
    notes: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "tensors", MappingProxyType(dict(self.tensors)))
        object.__setattr__(self, "notes", MappingProxyType(dict(self.notes)))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))

    @cached_property
    def producers(self) -> Mapping[str, AnyNode]:
        """The node producing each tensor (graph inputs and constants have none)."""
        return MappingProxyType({out: node for node in self.nodes for out in node.outputs})

    @cached_property
    def consumers(self) -> Mapping[str, tuple[AnyNode, ...]]:
        """The nodes reading each tensor, in graph order (a node reading twice appears once)."""
        users: dict[str, list[AnyNode]] = {}
        for node in self.nodes:
            for name in dict.fromkeys(node.inputs):
                if name:
                    users.setdefault(name, []).append(node)
        return MappingProxyType({k: tuple(v) for k, v in users.items()})

    def users(self, name: str) -> tuple[AnyNode, ...]:
        return self.consumers.get(name, ())

    def constant(self, name: str) -> np.ndarray | None:
        """The data of a constant tensor, or None (also for the absent name "")."""
        if not name:
            return None
        tensor = self.tensors.get(name)
        return None if tensor is None else tensor.data

    @property
    def accel_ops(self) -> tuple[AccelOp, ...]:
        return tuple(n for n in self.nodes if isinstance(n, AccelOp))

    @property
    def host_nodes(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if isinstance(n, Node))

    def replace(self, **changes: Any) -> Graph:
        """A copy with some fields changed, rebuilt (and topologically sorted) by make_graph."""
        values = {"name": self.name, "nodes": self.nodes, "tensors": self.tensors,
                  "inputs": self.inputs, "outputs": self.outputs, "opset": self.opset,
                  "config": self.config, "notes": self.notes}
        values.update(changes)
        return make_graph(**values)

    def __str__(self) -> str:
        return format_graph(self)


def make_graph(name: str, nodes: Iterable[AnyNode], tensors: Mapping[str, Tensor] | Iterable[Tensor],
               inputs: Iterable[str], outputs: Iterable[str], opset: int,
               config: AcceleratorConfig | None = None, notes: Mapping[str, str] | None = None) -> Graph:
    """Build a :class:`Graph`: nodes are sorted topologically (stable: the given order wherever
    the data flow allows it) and tensors that nothing references are dropped."""
    nodes = list(nodes)
    if not isinstance(tensors, Mapping):
        tensors = {t.name: t for t in tensors}
    inputs, outputs = tuple(inputs), tuple(outputs)
    ordered = _toposort(nodes)
    used = set(inputs) | set(outputs)
    for node in ordered:
        used.update(n for n in node.inputs if n)
        used.update(node.outputs)
    kept = {n: t for n, t in tensors.items() if n in used}
    names = {node.name for node in ordered}
    kept_notes = {k: v for k, v in (notes or {}).items() if k in names}
    return Graph(name, tuple(ordered), kept, inputs, outputs, opset,
                 config if config is not None else AcceleratorConfig(), kept_notes)


def _toposort(nodes: list[AnyNode]) -> list[AnyNode]:
    produced_by = {out: i for i, node in enumerate(nodes) for out in node.outputs}
    done: list[bool] = [False] * len(nodes)
    order: list[AnyNode] = []
    visiting: set[int] = set()

    def visit(i: int) -> None:
        stack = [(i, iter(nodes[i].inputs))]
        visiting.add(i)
        while stack:
            j, it = stack[-1]
            for name in it:
                k = produced_by.get(name)
                if k is None or done[k]:
                    continue
                if k in visiting:
                    raise VerifyError(f"the graph has a cycle through tensor {name!r}")
                visiting.add(k)
                stack.append((k, iter(nodes[k].inputs)))
                break
            else:
                stack.pop()
                visiting.discard(j)
                done[j] = True
                order.append(nodes[j])

    for i in range(len(nodes)):
        if not done[i]:
            visit(i)
    return order


# -- verification -------------------------------------------------------------------------------


def verify(graph: Graph) -> Graph:
    """Check the invariants of the IR and return the graph unchanged; raise :class:`VerifyError`
    naming the node or tensor and the rule otherwise.

    Invariants: unique node names; SSA (one producer per tensor, none for inputs and constants);
    every name a node reads is a graph input, a constant or the output of an earlier node; every
    named tensor exists, with a static non-negative shape, a known dtype and (for constants) data
    of that shape and dtype; graph outputs are defined; host nodes with simple shape rules and
    every accelerator op have consistent input/output shapes, dtypes and parameters.
    """
    tensors = graph.tensors
    for name, tensor in tensors.items():
        if name != tensor.name:
            raise VerifyError(f"tensor {tensor.name!r} is registered under the name {name!r}")
        if tensor.dtype not in DTYPES:
            raise VerifyError(f"tensor {name!r}: dtype must be one of {', '.join(DTYPES)}, "
                              f"not {tensor.dtype!r}")
        if any(d < 0 for d in tensor.shape):
            raise VerifyError(f"tensor {name!r}: shape must be static and non-negative, "
                              f"not {tensor.shape}")
        if tensor.data is not None and (tensor.data.shape != tensor.shape
                                        or tensor.data.dtype != np.dtype(tensor.dtype)):
            raise VerifyError(f"tensor {name!r}: constant data {tensor.data.dtype}{list(tensor.data.shape)} "
                              f"does not match the declared {tensor.dtype}{list(tensor.shape)}")
        if tensor.layout is not None and (tensor.layout not in LAYOUTS or len(tensor.shape) != 4):
            raise VerifyError(f"tensor {name!r}: layout must be NCHW or NHWC on a 4-D tensor, "
                              f"not {tensor.layout!r} on shape {tensor.shape}")
    for name in graph.inputs:
        if name not in tensors:
            raise VerifyError(f"graph input {name!r} has no tensor")
        if tensors[name].is_constant:
            raise VerifyError(f"graph input {name!r} must not be a constant")
    defined = set(graph.inputs) | {n for n, t in tensors.items() if t.is_constant}
    names: set[str] = set()
    for node in graph.nodes:
        if node.name in names:
            raise VerifyError(f"{node.label}: node names must be unique, {node.name!r} repeats")
        names.add(node.name)
        for name in node.inputs:
            if not name:
                continue
            if name not in tensors:
                raise VerifyError(f"{node.label}: input {name!r} is not a tensor of the graph "
                                  f"(dangling name)")
            if name not in defined:
                raise VerifyError(f"{node.label}: input {name!r} is used before it is produced")
        for name in node.outputs:
            if not name:
                continue
            if name not in tensors:
                raise VerifyError(f"{node.label}: output {name!r} is not a tensor of the graph "
                                  f"(dangling name)")
            if name in defined:
                raise VerifyError(f"{node.label}: output {name!r} is already defined (SSA: one "
                                  f"producer per tensor, none for inputs and constants)")
            defined.add(name)
        if isinstance(node, AccelOp):
            _verify_accel(graph, node)
        else:
            _verify_node(graph, node)
    for name in graph.outputs:
        if name not in defined:
            raise VerifyError(f"graph output {name!r} is never produced")
    return graph


def _verify_node(graph: Graph, node: Node) -> None:
    t = graph.tensors
    if node.op in ("Identity",) and t[node.inputs[0]].shape != t[node.outputs[0]].shape:
        raise VerifyError(f"{node.label}: output shape {t[node.outputs[0]].shape} must equal the "
                          f"input shape {t[node.inputs[0]].shape}")
    if node.op == "Reshape":
        src, dst = t[node.inputs[0]], t[node.outputs[0]]
        if src.size != dst.size:
            raise VerifyError(f"{node.label}: a reshape keeps the element count; input "
                              f"{src.shape} has {src.size}, output {dst.shape} has {dst.size}")
        if src.dtype != dst.dtype:
            raise VerifyError(f"{node.label}: output dtype {dst.dtype} must equal the input's {src.dtype}")
    if node.op == "Transpose":
        src, dst = t[node.inputs[0]], t[node.outputs[0]]
        perm = tuple(node.attrs.get("perm", range(len(src.shape) - 1, -1, -1)))
        if sorted(perm) != list(range(len(src.shape))):
            raise VerifyError(f"{node.label}: perm must be a permutation of the {len(src.shape)} "
                              f"input axes, not {perm}")
        if tuple(src.shape[p] for p in perm) != dst.shape:
            raise VerifyError(f"{node.label}: perm {perm} maps input {src.shape} to "
                              f"{tuple(src.shape[p] for p in perm)}, not the output's {dst.shape}")
    if node.op in ("QuantizeLinear", "DequantizeLinear"):
        src, dst = t[node.inputs[0]], t[node.outputs[0]]
        if src.shape != dst.shape:
            raise VerifyError(f"{node.label}: output shape {dst.shape} must equal the input shape "
                              f"{src.shape}")
        if node.op == "QuantizeLinear" and dst.dtype not in ("int8", "uint8", "int16", "uint16", "int32"):
            raise VerifyError(f"{node.label}: output dtype must be an integer type, not {dst.dtype}")


def _verify_accel(graph: Graph, op: AccelOp) -> None:
    t = graph.tensors
    cfg = graph.config
    lo, hi = cfg.output_range

    def fail(rule: str) -> None:
        raise VerifyError(f"{op.label}: {rule}")

    if op.kind not in KINDS:
        fail(f"kind must be one of {', '.join(KINDS)}, not {op.kind!r}")
    if op.act not in ACTIVATIONS:
        fail(f"act must be one of {', '.join(ACTIVATIONS)}, not {op.act!r}")
    if op.out_type not in OUT_TYPES:
        fail(f"out_type must be int or raw, not {op.out_type!r}")
    src, dst = t[op.input], t[op.output]
    if src.dtype != "int8":
        fail(f"input {op.input!r} must be int8, not {src.dtype}")
    want_out = "int8" if op.out_type == "int" else "int32"
    if dst.dtype != want_out:
        fail(f"output {op.output!r} must be {want_out}, not {dst.dtype}")
    n = op.channels
    if n < 1 or op.mult.shape != (n,) or op.shift.shape != (n,):
        fail(f"bias, mult and shift must be vectors of one length N >= 1, not shapes "
             f"{op.bias.shape}, {op.mult.shape}, {op.shift.shape}")
    if op.shift.min() < 0 or op.shift.max() > 62:
        fail(f"shift must be within 0..62, not {int(op.shift.min())}..{int(op.shift.max())}")
    for name, value in (("zp_in", op.zp_in), ("zp_out", op.zp_out), ("act_lo", op.act_lo),
                        ("act_hi", op.act_hi)):
        if not lo <= value <= hi:
            fail(f"{name} must be within {lo}..{hi}, not {value}")
    if op.out_type == "raw" and (op.act != "none" or op.pool is not None or op.residual is not None):
        fail("a raw output has no activation, pooling or residual")
    if op.residual is not None:
        r = t.get(op.residual.tensor)
        if r is None or r.dtype != "int8" or r.shape != dst.shape:
            fail(f"residual {op.residual.tensor!r} must be an int8 tensor of the output shape "
                 f"{dst.shape}, not {None if r is None else (r.dtype, r.shape)}")
        if op.pool is not None:
            fail("a residual cannot be combined with pooling")
        if not 0 <= op.residual.shift <= 62:
            fail(f"residual shift must be within 0..62, not {op.residual.shift}")
    shape = src.shape
    if op.kind in ("conv", "gemm"):
        w = op.weights
        if w is None or w.ndim != 2 or w.shape[1] != n:
            fail(f"weights must be int8 [K, N={n}], not {None if w is None else w.shape}")
    elif op.weights is not None:
        fail(f"a {op.kind} op has no weights")
    if op.kind in ("conv", "pool"):
        if len(shape) != 4 or src.layout != "NHWC" or dst.layout != "NHWC":
            fail(f"input and output must be 4-D NHWC, not {src.layout} {shape} -> {dst.layout} {dst.shape}")
    if op.kind == "conv":
        g = op.conv
        if g is None:
            fail("a conv op needs its geometry")
        ci = shape[3]
        if g.group == 1:
            k = g.kernel[0] * g.kernel[1] * ci
        elif g.group == ci and n % ci == 0:
            k = g.kernel[0] * g.kernel[1]
        else:
            fail(f"group must be 1 or the input channels {ci} (depthwise) with N a multiple of "
                 f"them, not group {g.group} with N {n}")
        if op.weights.shape[0] != k:
            fail(f"weights must have K = {k} rows for kernel {g.kernel} and {ci} input channels "
                 f"(group {g.group}), not {op.weights.shape[0]}")
        oh, ow = g.output_hw(shape[1], shape[2])
        expect = (shape[0], oh, ow, n)
        if op.pool is not None:
            expect = (shape[0], *op.pool.out_hw, n)
    elif op.kind == "gemm":
        if op.conv is not None or not shape or shape[-1] != op.weights.shape[0]:
            fail(f"input {shape} must end in K = {op.weights.shape[0]}")
        expect = shape[:-1] + (n,)
    else:
        if not shape or shape[-1] != n:
            fail(f"per-channel arrays must have one entry per channel of the input {shape}, not {n}")
        expect = shape if op.pool is None else (shape[0], *op.pool.out_hw, n)
        if op.kind == "pool" and op.pool is None:
            fail("a pool op needs its pooling window")
        if op.kind == "add" and op.residual is None:
            fail("an add op needs its residual operand")
    if op.pool is not None:
        p = op.pool
        if p.mode not in POOL_MODES or min(p.window) < 1 or min(p.stride) < 1 or \
                p.pads[0] >= p.window[0] or p.pads[1] >= p.window[1]:
            fail(f"pooling must be max/avg with window and stride >= 1 and pads below the window, "
                 f"not {p}")
        if p.mode == "avg" and not 0 <= p.avg_shift <= 62:
            fail(f"avg_shift must be within 0..62, not {p.avg_shift}")
    if dst.shape != expect:
        fail(f"output {op.output!r} must have shape {expect}, not {dst.shape}")


def _short(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"array{list(value.shape)}" if value.size > 4 else repr(value.tolist())
    if isinstance(value, float):
        return f"{value:.6g}"
    return repr(value)


def format_graph(graph: Graph) -> str:
    """Human-readable listing: inputs, outputs, then one line per node."""
    lines = [f"graph {graph.name!r} (opset {graph.opset})"]
    for name in graph.inputs:
        lines.append(f"  input  {graph.tensors[name]!r}")
    for name in graph.outputs:
        lines.append(f"  output {graph.tensors[name]!r}")
    for node in graph.nodes:
        lines.append(f"  {node!r}")
    return "\n".join(lines)
