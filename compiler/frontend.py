"""ONNX front end: load a model into the compiler's IR.

:func:`load_model` reads an ONNX file (or takes a ``ModelProto``), checks the opset (11 to 21),
fixes the shapes of inputs with symbolic dimensions from ``shapes``, expands the QOperator ops of
onnxruntime's quantizer (QLinearConv, QLinearMatMul, QGemm, QLinearAdd, QLinearAveragePool,
QLinearGlobalAveragePool, QLinearConcat) into DequantizeLinear -> float op -> QuantizeLinear, runs
ONNX shape inference (strict) and builds a :class:`~systolic.compiler.ir.Graph` of host
:class:`~systolic.compiler.ir.Node`\\ s in ONNX's NCHW layout with every shape static.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper
from systolic.hw.config import AcceleratorConfig

from .errors import ModelLoadError, OpsetError, ShapeError, UnsupportedOpError
from .ir import Graph, Node, Tensor, frozen_array, make_graph, verify
from .reference import HOST_OPS

__all__ = ["load_model", "MIN_OPSET", "MAX_OPSET", "QOPERATOR_OPS"]

#: Supported range of the default-domain ONNX opset.
MIN_OPSET, MAX_OPSET = 11, 21

_DTYPE_NAMES = {
    onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.INT8: "int8", onnx.TensorProto.UINT8: "uint8",
    onnx.TensorProto.INT16: "int16", onnx.TensorProto.UINT16: "uint16", onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.UINT32: "uint32", onnx.TensorProto.INT64: "int64", onnx.TensorProto.UINT64: "uint64",
    onnx.TensorProto.BOOL: "bool",
}


def load_model(model: str | os.PathLike[str] | onnx.ModelProto,
               shapes: Mapping[str, Sequence[int]] | None = None, *,
               config: AcceleratorConfig | None = None) -> Graph:
    """Load an ONNX model (path or ``ModelProto``) into a verified IR graph.

    ``shapes`` gives the full shape (elements per axis) of inputs whose shape has symbolic or
    unknown dimensions, e.g. ``{"input": (1, 3, 224, 224)}``; it may also restate static shapes.
    ``config`` is the accelerator the graph will target (default: ``AcceleratorConfig()``).
    Raises :class:`~systolic.compiler.errors.CompileError` subclasses with one-line messages.
    """
    if isinstance(model, onnx.ModelProto):
        source = f"model {model.graph.name or '<unnamed>'!r}"
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
    else:
        source = str(model)
        proto = _read(Path(model))
    opset = _check_opset(proto, source)
    for index, node in enumerate(proto.graph.node):
        if node.op_type != "Constant":
            _check_known(node, node.name or f"{node.op_type}_{index}", source, opset)
    _check_valid(proto, source)
    _apply_input_shapes(proto, shapes or {}, source)
    qoperator_pools = _expand_qoperator(proto)
    proto = _infer_shapes(proto, source)
    if _fold_shape_computations(proto):
        proto = _infer_shapes(proto, source)
    graph = _to_graph(proto, opset, source, config or AcceleratorConfig())
    if qoperator_pools:
        notes = {name: f"{QOPERATOR_POOL_NOTE} {op}" for name, op in qoperator_pools.items()}
        graph = graph.replace(notes={**notes, **graph.notes})
    return verify(graph)


# -- reading and checking -------------------------------------------------------------------------


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__


def _read(path: Path) -> onnx.ModelProto:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelLoadError(f"{path}: cannot read the model file: {exc.strerror}") from None
    if not data:
        raise ModelLoadError(f"{path}: not an ONNX model (the file is empty)")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as exc:  # protobuf's DecodeError (and friends on other runtimes)
        raise ModelLoadError(f"{path}: not an ONNX model or truncated ({_first_line(exc)})") from None
    if proto.ir_version <= 0 or not proto.HasField("graph") or not proto.graph.output:
        raise ModelLoadError(f"{path}: not an ONNX model or truncated (no IR version, graph or "
                             f"graph outputs)")
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer):
        try:
            onnx.load_external_data_for_model(proto, str(path.parent))
        except Exception as exc:
            raise ModelLoadError(f"{path}: cannot load external tensor data ({_first_line(exc)})") from None
    return proto


def _check_opset(proto: onnx.ModelProto, source: str) -> int:
    opset = None
    for entry in proto.opset_import:
        if entry.domain in ("", "ai.onnx"):
            opset = entry.version
    if opset is None:
        raise OpsetError(f"{source}: the model imports no default-domain (ai.onnx) opset; "
                         f"the compiler accepts opsets {MIN_OPSET} to {MAX_OPSET}")
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise OpsetError(f"{source}: ONNX opset {opset} is not supported; the compiler accepts "
                         f"opsets {MIN_OPSET} to {MAX_OPSET}")
    return opset


def _check_valid(proto: onnx.ModelProto, source: str) -> None:
    try:
        onnx.checker.check_model(proto)
    except Exception as exc:
        raise ModelLoadError(f"{source}: not a valid ONNX model ({_first_line(exc)})") from None


def _dims(vi: onnx.ValueInfoProto) -> list[int | str | None] | None:
    """Dimensions (int, symbolic name, or None when unset); None for an unknown rank."""
    t = vi.type.tensor_type
    if not t.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]


def _apply_input_shapes(proto: onnx.ModelProto, shapes: Mapping[str, Sequence[int]], source: str) -> None:
    init_names = {t.name for t in proto.graph.initializer}
    graph_inputs = {vi.name: vi for vi in proto.graph.input if vi.name not in init_names}
    for name in shapes:
        if name not in graph_inputs:
            raise ShapeError(f"{source}: a shape was given for {name!r}, which is not an input of the "
                             f"model (inputs: {', '.join(repr(n) for n in graph_inputs)})")
    for name, vi in graph_inputs.items():
        if not vi.type.HasField("tensor_type"):
            raise UnsupportedOpError(f"{source}: input {name!r} is not a tensor (sequence, map and "
                                     f"optional inputs are not supported)")
        dims = _dims(vi)
        given = shapes.get(name)
        if given is not None:
            try:
                given = tuple(int(d) for d in given)
            except (TypeError, ValueError):
                raise ShapeError(f"{source}: the shape given for input {name!r} must be a sequence of "
                                 f"integers, not {given!r}") from None
            if any(d < 0 for d in given):
                raise ShapeError(f"{source}: the shape given for input {name!r} must have dimensions "
                                 f">= 0, not {given}")
            if dims is not None:
                if len(dims) != len(given) or any(isinstance(d, int) and d != g
                                                  for d, g in zip(dims, given, strict=False)):
                    shown = tuple(d if isinstance(d, int) else (d or "?") for d in dims)
                    raise ShapeError(f"{source}: the shape given for input {name!r}, {given}, does not "
                                     f"match the model's {shown}")
            shape = vi.type.tensor_type.shape
            del shape.dim[:]
            for d in given:
                shape.dim.add().dim_value = d
        elif dims is None or any(not isinstance(d, int) for d in dims):
            shown = "unknown rank" if dims is None else \
                str(tuple(d if isinstance(d, int) else (d or "?") for d in dims))
            example = (1, 3, 224, 224) if dims is None else \
                tuple(d if isinstance(d, int) else 1 for d in dims)
            raise ShapeError(f"{source}: input {name!r} has symbolic dimensions {shown}; give its "
                             f"shape, e.g. shapes={{{name!r}: {example}}} (CLI: --shape "
                             f"{name}={','.join(map(str, example))})")


def _infer_shapes(proto: onnx.ModelProto, source: str) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True, data_prop=True)
    except Exception as exc:
        message = " ".join(str(exc).split())
        message = message.replace("[ShapeInferenceError] Inference error(s): ", "")
        match = re.match(r"\(op_type:(\w+), node name: ([^)]*)\): (?:\[\w+\] )?(.*)", message)
        if match:
            op, node, reason = match.groups()
            raise ShapeError(f"{source}: node {node!r} ({op}): {reason}") from None
        raise ShapeError(f"{source}: shape inference failed: {message}") from None


_NOT_FOLDABLE = frozenset({"DequantizeLinear", "RandomNormal", "RandomUniform", "RandomNormalLike",
                           "RandomUniformLike", "Multinomial", "Bernoulli"})


def _fold_shape_computations(proto: onnx.ModelProto) -> bool:
    """Evaluate, in place, the nodes whose inputs are constants or whose value is a static shape
    (Shape/Size of a tensor shape inference has resolved), so that a Reshape fed by shape
    arithmetic (the PyTorch flatten idiom) gets a static output shape. Returns whether anything
    was folded; only needed when shape inference left some tensor without a static shape."""
    g = proto.graph
    infos = {vi.name: vi for vi in list(g.input) + list(g.value_info) + list(g.output)}
    known = {t.name for t in g.initializer}
    if all(o in infos and _dims(infos[o]) is not None and all(isinstance(d, int) for d in _dims(infos[o]))
           for node in g.node for o in node.output if o):
        return False
    values = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    kept, folded = [], False
    for node in g.node:
        result = None
        domain_ok = node.domain in ("", "ai.onnx")
        if domain_ok and node.op_type in ("Shape", "Size") and node.input[0] in infos:
            dims = _dims(infos[node.input[0]])
            if dims is not None and all(isinstance(d, int) for d in dims):
                attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
                shape = dims[attrs.get("start", 0):attrs.get("end")] if node.op_type == "Shape" else None
                result = [np.array(shape, np.int64) if node.op_type == "Shape"
                          else np.array(int(np.prod(dims)), np.int64)]
        elif domain_ok and node.op_type == "Constant":
            attr = node.attribute[0]
            result = [numpy_helper.to_array(attr.t)] if attr.name == "value" else None
        elif domain_ok and node.op_type in HOST_OPS and node.op_type not in _NOT_FOLDABLE and node.input \
                and all(not name or name in values for name in node.input):
            args = [values[name] if name else None for name in node.input]
            while args and args[-1] is None:
                args.pop()
            attrs = {a.name: _plain_attribute(a) for a in node.attribute}
            try:
                out = HOST_OPS[node.op_type](*args, **attrs)
            except Exception:  # leave it to the host at run time
                out = None
            result = None if out is None else list(out if isinstance(out, tuple) else (out,))
        if result is None:
            kept.append(node)
            continue
        folded = True
        for name, value in zip(node.output, result, strict=False):
            if name:
                values[name] = np.asarray(value)
                known.add(name)
                g.initializer.append(numpy_helper.from_array(np.asarray(value), name))
    if folded:
        del g.node[:]
        g.node.extend(kept)
        names = {t.name for t in g.initializer}
        kept_infos = [vi for vi in g.value_info if vi.name not in names]
        del g.value_info[:]
        g.value_info.extend(kept_infos)
    return folded


def _plain_attribute(attr: onnx.AttributeProto) -> Any:
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, list):
        return tuple(v.decode() if isinstance(v, bytes) else v for v in value)
    return value


# -- QOperator expansion --------------------------------------------------------------------------

#: onnxruntime QOperator ops rewritten into DequantizeLinear -> float op -> QuantizeLinear.
QOPERATOR_OPS = ("QLinearConv", "QLinearMatMul", "QGemm", "QLinearAdd", "QLinearAveragePool",
                 "QLinearGlobalAveragePool", "QLinearConcat")


#: The note (``Graph.notes``) on an AveragePool/GlobalAveragePool node expanded from a QOperator
#: pool: onnxruntime runs that pool on the model's own integer type (``emulate_ort_pooling``).
QOPERATOR_POOL_NOTE = "expanded from onnxruntime's"


def _expand_qoperator(proto: onnx.ModelProto) -> dict[str, str]:
    """Rewrite QOperator nodes in place (the int8 semantics are the QDQ semantics of the same
    scales and zero points; onnxruntime's own QDQ fusions produce these ops). Returns the
    names of the float pool nodes made from QLinearAveragePool/QLinearGlobalAveragePool, with
    the op each came from."""
    pools: dict[str, str] = {}
    inits = {t.name: t for t in proto.graph.initializer}
    taken = {n for node in proto.graph.node for n in list(node.input) + list(node.output)} | set(inits)
    new_inits: list[onnx.TensorProto] = []
    out: list[onnx.NodeProto] = []

    def fresh(base: str) -> str:
        name, i = base, 0
        while name in taken:
            i += 1
            name = f"{base}_{i}"
        taken.add(name)
        return name

    def dq(x: str, scale: str, zp: str, tag: str, axis: int | None = None) -> str:
        y = fresh(f"{x}/dq")
        attrs = {} if axis is None else {"axis": axis}
        out.append(helper.make_node("DequantizeLinear", [x, scale, zp] if zp else [x, scale], [y],
                                    name=fresh(f"{tag}/dq_{x}"), **attrs))
        return y

    def q(x: str, scale: str, zp: str, y: str, tag: str) -> None:
        out.append(helper.make_node("QuantizeLinear", [x, scale, zp] if zp else [x, scale], [y],
                                    name=fresh(f"{tag}/q")))

    for node in proto.graph.node:
        op = node.op_type if node.domain in ("", "ai.onnx", "com.microsoft") else None
        if op not in QOPERATOR_OPS or (op in ("QLinearConv", "QLinearMatMul") and node.domain
                                       not in ("", "ai.onnx")):
            out.append(node)
            continue
        ins = list(node.input) + [""] * 9
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        tag = node.name or fresh(op)
        y = node.output[0]
        if op in ("QLinearConv", "QLinearMatMul"):
            x, xs, xz, w, ws, wz, ys, yz = ins[:8]
            axis = 0 if op == "QLinearConv" else 1
            w_axis = axis if w in inits and _size(inits.get(ws)) > 1 else None
            xf = dq(x, xs, xz, tag)
            wf = dq(w, ws, wz, tag, w_axis)
            float_ins = [xf, wf]
            if op == "QLinearConv" and ins[8]:
                bias_scale = _product_scale(inits, xs, ws)
                if bias_scale is None:
                    out[-2:] = []
                    out.append(node)
                    continue
                name = fresh(f"{ins[8]}/scale")
                new_inits.append(numpy_helper.from_array(bias_scale, name))
                float_ins.append(dq(ins[8], name, "", tag, 0 if bias_scale.ndim == 1 else None))
            yf = fresh(f"{y}/float")
            float_op = "Conv" if op == "QLinearConv" else "MatMul"
            float_attrs = attrs if op == "QLinearConv" else {}
            out.append(helper.make_node(float_op, float_ins, [yf], name=tag, **float_attrs))
            q(yf, ys, yz, y, tag)
        elif op == "QGemm":
            a, as_, az, b, bs, bz, c, ys, yz = ins[:9]
            trans_b = attrs.get("transB", 0)
            af = dq(a, as_, az, tag)
            bf = dq(b, bs, bz, tag, (0 if trans_b else 1) if _size(inits.get(bs)) > 1 else None)
            float_ins = [af, bf]
            if c:
                bias_scale = _product_scale(inits, as_, bs)
                if bias_scale is None:
                    out[-2:] = []
                    out.append(node)
                    continue
                name = fresh(f"{c}/scale")
                new_inits.append(numpy_helper.from_array(bias_scale, name))
                float_ins.append(dq(c, name, "", tag, 0 if bias_scale.ndim == 1 else None))
            gemm_attrs = {k: v for k, v in attrs.items() if k in ("alpha", "transA", "transB")}
            if ys:
                yf = fresh(f"{y}/float")
                out.append(helper.make_node("Gemm", float_ins, [yf], name=tag, **gemm_attrs))
                q(yf, ys, yz, y, tag)
            else:
                out.append(helper.make_node("Gemm", float_ins, [y], name=tag, **gemm_attrs))
        elif op == "QLinearAdd":
            a, as_, az, b, bs, bz, ys, yz = ins[:8]
            af, bf = dq(a, as_, az, tag), dq(b, bs, bz, tag)
            yf = fresh(f"{y}/float")
            out.append(helper.make_node("Add", [af, bf], [yf], name=tag))
            q(yf, ys, yz, y, tag)
        elif op in ("QLinearAveragePool", "QLinearGlobalAveragePool"):
            if attrs.pop("channels_last", 0):
                out.append(node)
                continue
            x, xs, xz, ys, yz = ins[:5]
            xf = dq(x, xs, xz, tag)
            yf = fresh(f"{y}/float")
            float_op = "AveragePool" if op == "QLinearAveragePool" else "GlobalAveragePool"
            out.append(helper.make_node(float_op, [xf], [yf], name=tag, **attrs))
            pools[tag] = op
            q(yf, ys, yz, y, tag)
        else:  # QLinearConcat: y_scale, y_zp, then (x, scale, zp) triples
            ys, yz = node.input[0], node.input[1]
            rest = list(node.input[2:])
            floats = [dq(rest[i], rest[i + 1], rest[i + 2], tag) for i in range(0, len(rest), 3)]
            yf = fresh(f"{y}/float")
            out.append(helper.make_node("Concat", floats, [yf], name=tag, **attrs))
            q(yf, ys, yz, y, tag)
    del proto.graph.node[:]
    proto.graph.node.extend(out)
    proto.graph.initializer.extend(new_inits)
    return pools


def _size(tensor: onnx.TensorProto | None) -> int:
    return 0 if tensor is None else int(np.prod(tensor.dims, dtype=np.int64))


def _product_scale(inits: Mapping[str, onnx.TensorProto], a: str, b: str) -> np.ndarray | None:
    """The int32 bias scale ``a_scale * b_scale`` (per channel if b's is), when both are constants."""
    if a not in inits or b not in inits:
        return None
    return (numpy_helper.to_array(inits[a]).astype(np.float32)
            * numpy_helper.to_array(inits[b]).astype(np.float32)).astype(np.float32)


# -- building the IR -------------------------------------------------------------------------------


def _to_graph(proto: onnx.ModelProto, opset: int, source: str, config: AcceleratorConfig) -> Graph:
    g = proto.graph
    tensors: dict[str, Tensor] = {}
    for init in g.initializer:
        data = _array(init, source)
        tensors[init.name] = Tensor(init.name, data.shape, data.dtype.name, data=data)
    infos = {vi.name: vi for vi in list(g.input) + list(g.value_info) + list(g.output)}
    inputs = tuple(vi.name for vi in g.input if vi.name not in tensors)
    for name in inputs:
        tensors[name] = _value_tensor(infos[name], source, "input")
    nodes: list[Node] = []
    names: set[str] = set()
    for index, node in enumerate(g.node):
        label = node.name or f"{node.op_type}_{index}"
        while label in names:
            label = f"{label}_{index}"
        names.add(label)
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            data = _constant_value(node, label, source)
            tensors[node.output[0]] = Tensor(node.output[0], data.shape, data.dtype.name, data=data)
            continue
        _check_known(node, label, source, opset)
        attrs = {a.name: _attribute(a, label, node.op_type, source) for a in node.attribute}
        ir_node = Node(node.op_type, label, tuple(node.input), tuple(node.output), attrs,
                       "" if node.domain == "ai.onnx" else node.domain)
        for out in node.output:
            if not out:
                continue
            if out not in infos:
                raise ShapeError(f"{source}: the shape of tensor {out!r} (output of node {label!r}, "
                                 f"{node.op_type}) could not be inferred statically")
            tensors[out] = _value_tensor(infos[out], source, f"tensor (output of node {label!r}, "
                                         f"{node.op_type})")
        nodes.append(ir_node)
    for node in nodes:
        _check_node_shapes(node, tensors, source)
    outputs = tuple(vi.name for vi in g.output)
    return make_graph(g.name or "model", nodes, tensors, inputs, outputs, opset, config)


def _array(init: onnx.TensorProto, source: str) -> np.ndarray:
    try:
        data = numpy_helper.to_array(init)
    except Exception as exc:
        raise ModelLoadError(f"{source}: initializer {init.name!r} cannot be read "
                             f"({_first_line(exc)})") from None
    if data.dtype.name not in _DTYPE_NAMES.values():
        raise UnsupportedOpError(f"{source}: initializer {init.name!r} has element type "
                                 f"{data.dtype}, which the compiler does not support")
    return frozen_array(data)


def _value_tensor(vi: onnx.ValueInfoProto, source: str, what: str) -> Tensor:
    t = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        raise UnsupportedOpError(f"{source}: {what} {vi.name!r} is not a tensor (sequence, map and "
                                 f"optional values are not supported)")
    dtype = _DTYPE_NAMES.get(t.elem_type)
    if dtype is None:
        raise UnsupportedOpError(f"{source}: {what} {vi.name!r} has element type "
                                 f"{onnx.TensorProto.DataType.Name(t.elem_type)}, which the compiler "
                                 f"does not support")
    dims = _dims(vi)
    if dims is None or any(not isinstance(d, int) for d in dims):
        raise ShapeError(f"{source}: the shape of {what} {vi.name!r} could not be inferred "
                         f"statically (got "
                         f"{'unknown rank' if dims is None else tuple(d or '?' for d in dims)})")
    return Tensor(vi.name, tuple(dims), dtype)


def _constant_value(node: onnx.NodeProto, label: str, source: str) -> np.ndarray:
    attr = node.attribute[0]
    value = helper.get_attribute_value(attr)
    if attr.name == "value":
        return frozen_array(numpy_helper.to_array(value))
    if attr.name == "value_float":
        return frozen_array(np.float32(value))
    if attr.name == "value_floats":
        return frozen_array(np.array(value, np.float32))
    if attr.name == "value_int":
        return frozen_array(np.int64(value))
    if attr.name == "value_ints":
        return frozen_array(np.array(value, np.int64))
    raise UnsupportedOpError(f"{source}: node {label!r} (Constant): attribute {attr.name!r} is not "
                             f"supported (value, value_float(s), value_int(s) are)")


def _check_known(node: onnx.NodeProto, label: str, source: str, opset: int) -> None:
    domain = "" if node.domain == "ai.onnx" else node.domain
    if domain == "com.microsoft":
        return  # onnxruntime's contrib ops: expanded (QOperator) or run in onnxruntime
    if domain == "":
        if onnx.defs.has(node.op_type, opset, ""):
            return
        if onnx.defs.has(node.op_type, ""):
            raise UnsupportedOpError(f"{source}: node {label!r}: op type {node.op_type!r} is not defined "
                                     f"at the model's opset {opset}")
    where = f"domain {domain!r}" if domain else "the default domain"
    raise UnsupportedOpError(f"{source}: node {label!r}: unknown op type {node.op_type!r} in {where}")


def _attribute(attr: onnx.AttributeProto, label: str, op: str, source: str) -> Any:
    if attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        raise UnsupportedOpError(f"{source}: node {label!r} ({op}): attribute {attr.name!r} holds a "
                                 f"subgraph; control flow (If, Loop, Scan) is not supported")
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, onnx.TensorProto):
        return frozen_array(numpy_helper.to_array(value))
    if isinstance(value, list):
        return tuple(v.decode() if isinstance(v, bytes) else v for v in value)
    return value


def _check_node_shapes(node: Node, tensors: Mapping[str, Tensor], source: str) -> None:
    """Rules ONNX shape inference leaves unchecked: channel and reduction sizes of Conv, Gemm and
    MatMul must agree with their weights."""
    def shape(i: int) -> tuple[int, ...] | None:
        name = node.inputs[i] if i < len(node.inputs) else ""
        return tensors[name].shape if name else None

    if node.op in ("Conv", "ConvInteger"):
        x, w = shape(0), shape(1)
        group = node.attrs.get("group", 1)
        if len(x) < 3 or len(w) != len(x):
            raise ShapeError(f"{source}: node {node.name!r} ({node.op}): input {node.inputs[0]!r} "
                             f"{x} and weight {node.inputs[1]!r} {w} must both be N-D images of one "
                             f"rank >= 3")
        if x[1] != w[1] * group or w[0] % group:
            raise ShapeError(f"{source}: node {node.name!r} ({node.op}): input {node.inputs[0]!r} has "
                             f"{x[1]} channels but weight {node.inputs[1]!r} {w} with group {group} "
                             f"expects {w[1] * group}")
        b = shape(2) if node.op == "Conv" else None
        if b is not None and b != (w[0],):
            raise ShapeError(f"{source}: node {node.name!r} (Conv): bias {node.inputs[2]!r} must have "
                             f"shape ({w[0]},), not {b}")
    elif node.op == "Gemm":
        a, b = shape(0), shape(1)
        ka = a[0] if node.attrs.get("transA", 0) else a[-1]
        kb = b[-1] if node.attrs.get("transB", 0) else b[0]
        if ka != kb:
            raise ShapeError(f"{source}: node {node.name!r} (Gemm): inner dimensions differ: "
                             f"{node.inputs[0]!r} {a} gives K = {ka}, {node.inputs[1]!r} {b} gives K = {kb}")
