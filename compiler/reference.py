"""The reference executor: runs a :class:`~systolic.compiler.ir.Graph` in numpy.

* Accelerator ops (:class:`~systolic.compiler.ir.AccelOp`) run with the exact integer semantics of
  docs/isa.md (see ``systolic.compiler.ir``), built from ``systolic.sim.arith`` -- these outputs
  are what the golden model must reproduce bit for bit after lowering.
* Host nodes (:class:`~systolic.compiler.ir.Node`) run the ONNX operator: one numpy handler per op
  type below, named after the op, inputs positional and attributes as keyword arguments with
  ONNX's defaults. An op without a handler (or with an attribute combination the handler does not
  cover) runs in a one-node onnxruntime session.

Graph inputs and outputs are what the model declares (float for a quantized model: the boundary
QuantizeLinear/DequantizeLinear nodes quantize and dequantize exactly as onnxruntime does).
"""

from __future__ import annotations

import hashlib
import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from systolic.sim.arith import (
    ACT_CLIP,
    ACT_NONE,
    ACT_RELU,
    ACT_RELU6,
    avg_pool_finish,
    sfu_pointwise,
    wrap,
)

from .errors import InputError, UnsupportedOpError, VerifyError
from .ir import AccelOp, Graph, Node, conv_output_size

__all__ = [
    "run_host_node",
    "execute", "run_node", "HOST_OPS", "EMULATION_DOMAIN", "EMULATED_OPS", "QLinearAveragePool",
    "QLinearGlobalAveragePool", "resolve_pads", "onnx_dtype_to_numpy",
    "quantize_linear", "dequantize_linear", "accel_accumulate", "run_accel", "store_ties",
]

_ACT_CODES = {"none": ACT_NONE, "relu": ACT_RELU, "relu6": ACT_RELU6, "clip": ACT_CLIP}


# -- executor -----------------------------------------------------------------------------------


def run_host_node(graph: Graph, node: Node, env: dict[str, np.ndarray]) -> None:
    """Run host ``node`` of ``graph`` on the tensors in ``env`` and store its outputs there,
    checked against the shapes and dtypes the graph declares (VerifyError otherwise)."""
    args = [env[name] if name else None for name in node.inputs]
    constant = [bool(name) and graph.tensors[name].is_constant for name in node.inputs]
    results = run_node(node, args, graph.opset, [graph.tensors[o].dtype if o else "float32"
                                                 for o in node.outputs], constant)
    for name, value in zip(node.outputs, results, strict=False):
        if not name:
            continue
        tensor = graph.tensors[name]
        value = np.asarray(value)
        if value.shape != tensor.shape or value.dtype != np.dtype(tensor.dtype):
            raise VerifyError(f"{node.label} produced {value.dtype}{list(value.shape)} for "
                              f"{name!r}, but the graph declares {tensor.dtype}{list(tensor.shape)}")
        env[name] = value


def execute(graph: Graph, inputs: Mapping[str, np.ndarray], *,
            intermediates: bool = False) -> dict[str, np.ndarray]:
    """Run ``graph`` on ``inputs`` (one array per graph input, exactly the declared shape and
    dtype) and return the graph outputs by name -- or, with ``intermediates``, every tensor
    computed (inputs, constants and node outputs)."""
    env: dict[str, np.ndarray] = {}
    for name in inputs:
        if name not in graph.inputs:
            raise InputError(f"unknown input {name!r}; the graph's inputs are "
                             f"{', '.join(repr(n) for n in graph.inputs)}")
    for name in graph.inputs:
        if name not in inputs:
            raise InputError(f"input {name!r} is missing")
        tensor = graph.tensors[name]
        value = inputs[name]
        if isinstance(value, np.generic):
            value = np.asarray(value)
        if not isinstance(value, np.ndarray):
            raise InputError(f"input {name!r} must be a numpy array, not {type(value).__name__}")
        if value.dtype != np.dtype(tensor.dtype):
            raise InputError(f"input {name!r} must have dtype {tensor.dtype}, not {value.dtype}")
        if value.shape != tensor.shape:
            raise InputError(f"input {name!r} must have shape {tensor.shape}, not {value.shape}")
        env[name] = value
    for name, tensor in graph.tensors.items():
        if tensor.data is not None:
            env[name] = tensor.data
    for node in graph.nodes:
        if isinstance(node, AccelOp):
            env[node.output] = run_accel(node, graph, env)
            continue
        run_host_node(graph, node, env)
    if intermediates:
        return env
    return {name: np.array(env[name]) for name in graph.outputs}


def run_node(node: Node, args: Sequence[np.ndarray | None], opset: int,
             out_dtypes: Sequence[str] | None = None,
             constant: Sequence[bool] | None = None) -> tuple[np.ndarray, ...]:
    """Run one host node on its input arrays (None for an absent optional input) and return its
    outputs in order. ``out_dtypes`` (numpy names) type the outputs of an onnxruntime fallback;
    ``constant`` says which inputs are constants of the graph: an onnxruntime fallback gets them
    as initializers, as in the model (onnxruntime's exact int8 kernels on CPUs without VNNI,
    :mod:`.ortsession`, need int8 weights that are initializers: fed as inputs, its products
    saturate)."""
    if node.domain in ("", "ai.onnx"):
        handler = HOST_OPS.get(node.op)
    else:
        handler = EMULATED_OPS.get(node.op) if node.domain == EMULATION_DOMAIN else None
    if handler is not None and opset >= _MIN_OPSET.get(node.op, 0) \
            and len(node.outputs) <= _MAX_OUTPUTS.get(node.op, len(node.outputs)):
        while args and args[-1] is None:
            args = args[:-1]
        try:
            result = handler(*args, **node.attrs)
        except NotImplementedError:
            pass
        else:
            return result if isinstance(result, tuple) else (result,)
    return _run_onnxruntime(node, args, opset, out_dtypes, constant)


# -- accelerator ops ----------------------------------------------------------------------------


def accel_accumulate(op: AccelOp, x: np.ndarray) -> np.ndarray:
    """The accumulator image of ``op`` before the STORE: the int64 sums of int8 products for
    conv/gemm (not yet wrapped), the widened input for pool/act/add. NHWC or [..., N]."""
    x = np.asarray(x, dtype=np.int64)
    if op.kind == "gemm":
        k, n = op.weights.shape
        flat = x.reshape(-1, k)
        return _exact_matmul(flat, op.weights).reshape(x.shape[:-1] + (n,))
    if op.kind == "conv":
        g = op.conv
        cols = _patches_nhwc(x, g.kernel, g.stride, g.pads, g.dilation, op.zp_in)  # N,OH,OW,kh,kw,C
        n_, oh, ow, kh, kw, ci = cols.shape
        co = op.weights.shape[1]
        if g.group == 1:
            acc = _exact_matmul(cols.reshape(-1, kh * kw * ci), op.weights)
        else:  # depthwise: output channel co reads input channel co // multiplier
            mult = co // ci
            taps = np.repeat(cols.reshape(-1, kh * kw, ci), mult, axis=2)          # P, K, Co
            acc = np.einsum("pkc,kc->pc", taps.astype(np.float64),
                            op.weights.astype(np.float64)).round().astype(np.int64)
        return acc.reshape(n_, oh, ow, co)
    return x


def store_ties(op: AccelOp, image_hw: tuple[int, int]) -> tuple[int, int]:
    """The CONFIG ``(tie_out, avg_tie_out)`` of ``op``'s STOREs: which of a rounding tie's two
    neighbours is even (docs/isa.md STORE, "Rounding"). ``image_hw`` is the STORE's input image
    (the accumulator pixels before pooling), in pixels.

    They follow the onnxruntime kernels the op replaces: QLinearAdd adds the output zero point
    before it rounds (``tie_out`` 1 with a residual), QLinearConv / QLinearMatMul / QuantizeLinear
    round first (0); QLinearAveragePool adds the zero point first (``avg_tie_out`` 1) unless its
    window is the whole unpadded image, which its global-average kernel rounds first (0)."""
    tie_out = int(op.residual is not None)
    p = op.pool
    avg_tie_out = int(p is not None and p.mode == "avg"
                      and not (tuple(p.window) == tuple(image_hw) and not any(p.pads)))
    return tie_out, avg_tie_out


def run_accel(op: AccelOp, graph: Graph, env: Mapping[str, np.ndarray]) -> np.ndarray:
    """Execute one accelerator op with the integer semantics of docs/isa.md."""
    cfg = graph.config
    acc = accel_accumulate(op, env[op.input])
    if op.out_type == "raw":
        # the bias is preloaded into the accumulator, the products accumulate on top of it
        return wrap(acc + op.bias.astype(np.int64), cfg.acc_bits).astype(np.int32)
    if op.kind in ("conv", "gemm"):
        acc = wrap(acc, cfg.acc_bits)
    act = _ACT_CODES[op.act]
    residual = None
    res = op.residual
    if res is not None:
        residual = env[res.tensor].astype(np.int64)
    tie_out, avg_tie_out = store_ties(op, tuple(acc.shape[1:3]) if op.pool is not None else (0, 0))
    # the residual term is shifted by each channel's own table shift (res.shift is not used)
    v = sfu_pointwise(acc, op.bias, op.mult, op.shift, zp_out=op.zp_out, act=act, act_lo=op.act_lo,
                      act_hi=op.act_hi, acc_range=cfg.acc_range, out_range=cfg.output_range,
                      residual=residual, res_zp=res.zero_point if res else 0,
                      res_mult=res.mult if res else 0, tie_out=tie_out)
    if op.pool is not None:
        v = _pool_store(v, op, cfg.output_range, avg_tie_out)
    return v.astype(np.int8)


def _pool_store(v: np.ndarray, op: AccelOp, out_range: tuple[int, int], tie_out: int) -> np.ndarray:
    """STORE pooling of the pointwise outputs ``v`` (NHWC): max over in-image pixels, or the
    count_include_pad average with out-of-image pixels counted as zp_out."""
    p = op.pool
    n, h, w, c = v.shape
    (ph, pw), (sh, sw), (pt, pl) = p.window, p.stride, p.pads[:2]
    oh, ow = p.out_hw
    need_h, need_w = (oh - 1) * sh + ph, (ow - 1) * sw + pw
    pb, pr = max(0, need_h - pt - h), max(0, need_w - pl - w)
    fill = np.iinfo(np.int64).min if p.mode == "max" else op.zp_out
    padded = np.pad(v.astype(np.int64), ((0, 0), (pt, pb), (pl, pr), (0, 0)), constant_values=fill)
    win = sliding_window_view(padded, (ph, pw), axis=(1, 2))[:, ::sh, ::sw][:, :oh, :ow]
    if p.mode == "max":
        return win.max(axis=(-2, -1))
    total = win.sum(axis=(-2, -1))
    return avg_pool_finish(total, ph * pw, zp_out=op.zp_out, avg_mult=p.avg_mult,
                           avg_shift=p.avg_shift, act=_ACT_CODES[op.act], act_lo=op.act_lo,
                           act_hi=op.act_hi, out_range=out_range, tie_out=tie_out)


def _exact_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer matrix product, exact: float64 BLAS while every sum stays below 2**53."""
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    bound = float(np.abs(a).max(initial=0)) * float(np.abs(b).max(initial=0)) * max(a.shape[-1], 1)
    if bound < 2.0 ** 52:
        return (a.astype(np.float64) @ b.astype(np.float64)).round().astype(np.int64)
    return a @ b


def _patches_nhwc(x: np.ndarray, kernel: tuple[int, int], stride: tuple[int, int],
                  pads: tuple[int, int, int, int], dilation: tuple[int, int], pad_value: int) -> np.ndarray:
    """im2col of an NHWC image: [N, OH, OW, kh, kw, C], padding elements equal to ``pad_value``."""
    n, h, w, c = x.shape
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    pt, pl, pb, pr = pads
    oh = conv_output_size(h, kh, sh, pt, pb, dh)
    ow = conv_output_size(w, kw, sw, pl, pr, dw)
    padded = np.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)), constant_values=pad_value)
    span_h, span_w = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    win = sliding_window_view(padded, (span_h, span_w), axis=(1, 2))     # N, H', W', C, sh, sw
    win = win[:, ::sh, ::sw, :, ::dh, ::dw][:, :oh, :ow]
    return np.ascontiguousarray(win.transpose(0, 1, 2, 4, 5, 3))


# -- quantization helpers ------------------------------------------------------------------------


def _param(value: np.ndarray, ndim: int, axis: int) -> np.ndarray:
    """Broadcast a per-tensor (0-d or 1-element) or per-axis (1-d) parameter against ``ndim`` axes."""
    value = np.asarray(value)
    if value.ndim == 0 or (value.ndim == 1 and ndim == 0 and value.size == 1):
        return value.reshape(())
    if value.ndim == 1:
        shape = [1] * ndim
        shape[axis % ndim] = value.shape[0]
        return value.reshape(shape)
    raise NotImplementedError("blocked quantization")


def quantize_linear(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | int, dtype: Any,
                    axis: int = 1) -> np.ndarray:
    """ONNX QuantizeLinear as onnxruntime computes it: ``rint(x / scale) + zero_point`` in float32
    (ties to even), saturated to ``dtype``."""
    x = np.asarray(x)
    ftype = np.float32 if x.dtype != np.float64 else np.float64
    s = _param(np.asarray(scale, dtype=ftype), x.ndim, axis)
    z = _param(np.asarray(zero_point), x.ndim, axis).astype(ftype)
    info = np.iinfo(dtype)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        q = np.rint(x.astype(ftype) / s) + z
    return np.clip(np.nan_to_num(q, nan=0.0), info.min, info.max).astype(dtype)


def dequantize_linear(q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | int | None = None,
                      axis: int = 1) -> np.ndarray:
    """ONNX DequantizeLinear: ``(q - zero_point) * scale``, float32 (or the scale's float type)."""
    q = np.asarray(q)
    scale = np.asarray(scale)
    s = _param(scale, q.ndim, axis)
    z = 0 if zero_point is None else _param(np.asarray(zero_point), q.ndim, axis).astype(np.int64)
    return ((q.astype(np.int64) - z).astype(scale.dtype) * s).astype(scale.dtype)


# -- host op handlers: one per ONNX op, named after it ------------------------------------------

_ONNX_TO_NUMPY = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32,
                  7: np.int64, 9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32,
                  13: np.uint64}


def onnx_dtype_to_numpy(code: int) -> np.dtype:
    """numpy dtype of an ONNX TensorProto element type code."""
    if code not in _ONNX_TO_NUMPY:
        raise NotImplementedError(f"element type {code}")
    return np.dtype(_ONNX_TO_NUMPY[code])


def resolve_pads(spatial: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
                 dilations: Sequence[int], auto_pad: str,
                 pads: Sequence[int] | None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Explicit (begin, end) pads per spatial axis for ONNX ``auto_pad``/``pads``."""
    nd = len(spatial)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for i in range(nd):
            out = -(-spatial[i] // strides[i])
            total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - spatial[i])
            small = total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else total - small)
            end.append(total - begin[-1])
        return tuple(begin), tuple(end)
    if auto_pad == "VALID" or pads is None:
        return (0,) * nd, (0,) * nd
    if auto_pad != "NOTSET":
        raise NotImplementedError(f"auto_pad {auto_pad}")
    return tuple(pads[:nd]), tuple(pads[nd:])


def _window_attrs(x: np.ndarray, kernel_shape: Sequence[int] | None, strides: Sequence[int] | None,
                  dilations: Sequence[int] | None, auto_pad: str, pads: Sequence[int] | None):
    nd = x.ndim - 2
    kernel = tuple(kernel_shape)
    strides = tuple(strides) if strides else (1,) * nd
    dilations = tuple(dilations) if dilations else (1,) * nd
    begin, end = resolve_pads(x.shape[2:], kernel, strides, dilations, auto_pad, pads)
    return kernel, strides, dilations, begin, end


def _windows(x: np.ndarray, kernel, strides, dilations, begin, end, out, fill) -> np.ndarray:
    """[N, C, *out, *kernel] windows of an N-d (NC...) array padded with ``fill``."""
    nd = len(kernel)
    need = [(out[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 for i in range(nd)]
    extra = [max(0, need[i] - (x.shape[2 + i] + begin[i] + end[i])) for i in range(nd)]
    padded = np.pad(x, [(0, 0), (0, 0)] + [(begin[i], end[i] + extra[i]) for i in range(nd)],
                    constant_values=fill)
    spans = [(kernel[i] - 1) * dilations[i] + 1 for i in range(nd)]
    win = sliding_window_view(padded, spans, axis=tuple(range(2, 2 + nd)))
    index = (slice(None), slice(None)) + tuple(slice(0, out[i] * strides[i], strides[i]) for i in range(nd)) \
        + tuple(slice(None, None, dilations[i]) for i in range(nd))
    return win[index]


def Identity(x):
    return x


def Dropout(data, ratio=None, training_mode=None, *, seed=None):
    if training_mode is not None and bool(np.asarray(training_mode)):
        raise NotImplementedError("training mode")
    return data, np.ones(data.shape, dtype=bool)


def Flatten(x, *, axis=1):
    axis = axis % x.ndim if x.ndim else 0
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


def Reshape(data, shape, *, allowzero=0):
    shape = [int(d) for d in np.asarray(shape)]
    if not allowzero:
        shape = [data.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return data.reshape(shape)


def Squeeze(data, axes=None):
    if axes is None:
        return np.squeeze(data)
    return np.squeeze(data, axis=tuple(int(a) for a in np.asarray(axes).reshape(-1)))


def Unsqueeze(data, axes=None):
    axes = sorted(int(a) % (data.ndim + len(np.asarray(axes).reshape(-1)))
                  for a in np.asarray(axes).reshape(-1))
    out = data
    for a in axes:
        out = np.expand_dims(out, a)
    return out


def Transpose(data, *, perm=None):
    return np.transpose(data, perm)


def Concat(*inputs, axis):
    return np.concatenate(inputs, axis=axis)


def Shape(data, *, start=0, end=None):
    return np.array(data.shape[start:end], dtype=np.int64)


def Size(data):
    return np.array(data.size, dtype=np.int64)


def Gather(data, indices, *, axis=0):
    indices = np.where(indices < 0, indices + data.shape[axis], indices)
    return np.take(data, indices, axis=axis)


def Cast(x, *, to, saturate=1, round_mode="up"):
    dtype = onnx_dtype_to_numpy(to)
    if np.issubdtype(dtype, np.integer) and np.issubdtype(x.dtype, np.floating):
        return np.trunc(x).astype(dtype)
    return x.astype(dtype)


def Add(a, b):
    return (a + b).astype(np.result_type(a.dtype, b.dtype))


def Sub(a, b):
    return (a - b).astype(np.result_type(a.dtype, b.dtype))


def Mul(a, b):
    return (a * b).astype(np.result_type(a.dtype, b.dtype))


def Div(a, b):
    if np.issubdtype(a.dtype, np.integer):
        return np.trunc(a / b).astype(a.dtype)
    return (a / b).astype(a.dtype)


def Sum(*inputs):
    out = inputs[0]
    for x in inputs[1:]:
        out = out + x
    return np.asarray(out).astype(np.result_type(*[x.dtype for x in inputs]))


def Neg(x):
    return -x


def Sqrt(x):
    return np.sqrt(x)


def Exp(x):
    return np.exp(x)


def ConstantOfShape(shape, *, value=None):
    fill = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    return np.full([int(d) for d in np.asarray(shape).reshape(-1)], fill[0], dtype=fill.dtype)


def Expand(x, shape):
    target = np.broadcast_shapes(x.shape, tuple(int(d) for d in np.asarray(shape).reshape(-1)))
    return np.broadcast_to(x, target).copy()


def Relu(x):
    return np.maximum(x, np.zeros((), dtype=x.dtype))


def LeakyRelu(x, *, alpha=0.01):
    return np.where(x >= 0, x, x * np.asarray(alpha, dtype=x.dtype)).astype(x.dtype)


def Sigmoid(x):
    return (1.0 / (1.0 + np.exp(-x))).astype(x.dtype)


def Tanh(x):
    return np.tanh(x)


def Clip(x, min=None, max=None):
    out = x
    if min is not None:
        out = np.maximum(out, np.asarray(min, dtype=x.dtype))
    if max is not None:
        out = np.minimum(out, np.asarray(max, dtype=x.dtype))
    return out.astype(x.dtype)


def Softmax(x, *, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).astype(x.dtype)


def BatchNormalization(X, scale, B, input_mean, input_var, *, epsilon=1e-5, momentum=0.9,
                       training_mode=0):
    if training_mode:
        raise NotImplementedError("training mode")
    shape = (1, -1) + (1,) * (X.ndim - 2)
    inv = scale / np.sqrt(input_var + np.asarray(epsilon, dtype=X.dtype))
    return ((X - input_mean.reshape(shape)) * inv.reshape(shape) + B.reshape(shape)).astype(X.dtype)


def Conv(X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
         pads=None, strides=None):
    return _conv(X, W, B, auto_pad, dilations, group, kernel_shape, pads, strides)


def ConvInteger(x, w, x_zero_point=None, w_zero_point=None, *, auto_pad="NOTSET", dilations=None,
                group=1, kernel_shape=None, pads=None, strides=None):
    zx = 0 if x_zero_point is None else int(np.asarray(x_zero_point).reshape(-1)[0])
    if w_zero_point is not None and np.asarray(w_zero_point).size > 1:
        zw = np.asarray(w_zero_point).astype(np.int64).reshape((-1,) + (1,) * (w.ndim - 1))
    else:
        zw = 0 if w_zero_point is None else int(np.asarray(w_zero_point).reshape(-1)[0])
    xi = x.astype(np.int64) - zx
    wi = w.astype(np.int64) - zw
    # padding reads the zero point, i.e. zero once it is subtracted
    return _conv(xi, wi, None, auto_pad, dilations, group, kernel_shape, pads, strides,
                 integer=True).astype(np.int32)


def _conv(X, W, B, auto_pad, dilations, group, kernel_shape, pads, strides, integer=False):
    nd = X.ndim - 2
    kernel = tuple(kernel_shape) if kernel_shape else tuple(W.shape[2:])
    kernel, strides, dilations, begin, end = _window_attrs(X, kernel, strides, dilations, auto_pad, pads)
    out = [conv_output_size(X.shape[2 + i], kernel[i], strides[i], begin[i], end[i], dilations[i])
           for i in range(nd)]
    win = _windows(X, kernel, strides, dilations, begin, end, out, 0)   # N, C, *out, *k
    n, c = X.shape[:2]
    m = W.shape[0]
    g = group
    k = math.prod(kernel)
    p = math.prod(out)
    win = win.reshape((n, g, c // g) + tuple(out) + kernel)
    perm = (1, 0) + tuple(range(3, 3 + nd)) + (2,) + tuple(range(3 + nd, 3 + 2 * nd))
    cols = win.transpose(perm).reshape(g, n * p, (c // g) * k)
    w = W.reshape(g, m // g, (c // g) * k).transpose(0, 2, 1)
    if integer:
        acc = np.stack([_exact_matmul(cols[i], w[i]) for i in range(g)])
    else:
        acc = np.matmul(cols, w)
    y = acc.reshape((g, n) + tuple(out) + (m // g,))
    y = np.moveaxis(y, -1, 1)                         # g, M/g, n, *out
    y = np.moveaxis(y, 2, 0).reshape((n, m) + tuple(out))
    if B is not None:
        y = y + B.reshape((1, m) + (1,) * nd)
    return y.astype(X.dtype) if not integer else y


def MatMul(A, B):
    return np.matmul(A, B)


def MatMulInteger(A, B, a_zero_point=None, b_zero_point=None):
    za = 0 if a_zero_point is None else np.asarray(a_zero_point).astype(np.int64)
    zb = 0 if b_zero_point is None else np.asarray(b_zero_point).astype(np.int64)
    a = A.astype(np.int64) - (za if np.ndim(za) == 0 else za.reshape(-1, 1))
    b = B.astype(np.int64) - zb
    if a.ndim == 2 and b.ndim == 2:
        return _exact_matmul(a, b).astype(np.int32)
    return np.matmul(a, b).astype(np.int32)


def Gemm(A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    a = A.T if transA else A
    b = B.T if transB else B
    y = np.asarray(alpha, dtype=A.dtype) * (a @ b)
    if C is not None:
        y = y + np.asarray(beta, dtype=A.dtype) * C
    return y.astype(A.dtype)


def MaxPool(X, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape, pads=None,
            storage_order=0, strides=None):
    kernel, strides, dilations, begin, end = _window_attrs(X, kernel_shape, strides, dilations, auto_pad,
                                                           pads)
    out = [conv_output_size(X.shape[2 + i], kernel[i], strides[i], begin[i], end[i], dilations[i],
                            bool(ceil_mode)) for i in range(len(kernel))]
    if np.issubdtype(X.dtype, np.integer):
        fill = np.iinfo(X.dtype).min
    else:
        fill = -np.inf
    win = _windows(X, kernel, strides, dilations, begin, end, out, fill)
    return win.max(axis=tuple(range(-len(kernel), 0))).astype(X.dtype)


def AveragePool(X, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                kernel_shape, pads=None, strides=None):
    kernel, strides, dilations, begin, end = _window_attrs(X, kernel_shape, strides, dilations, auto_pad,
                                                           pads)
    nd = len(kernel)
    out = [conv_output_size(X.shape[2 + i], kernel[i], strides[i], begin[i], end[i], dilations[i],
                            bool(ceil_mode)) for i in range(nd)]
    axes = tuple(range(-nd, 0))
    total = _windows(X.astype(np.float64), kernel, strides, dilations, begin, end, out, 0.0).sum(axis=axes)
    ones = np.ones((1, 1) + X.shape[2:])
    if count_include_pad:
        # padding counts, the ceil-mode overhang past the padding does not
        ones = np.pad(ones, [(0, 0), (0, 0)] + [(begin[i], end[i]) for i in range(nd)], constant_values=1.0)
        count = _windows(ones, kernel, strides, dilations, (0,) * nd, (0,) * nd, out, 0.0).sum(axis=axes)
    else:
        count = _windows(ones, kernel, strides, dilations, begin, end, out, 0.0).sum(axis=axes)
    return (total / count).astype(X.dtype)


def GlobalAveragePool(X):
    return X.mean(axis=tuple(range(2, X.ndim)), keepdims=True, dtype=np.float64).astype(X.dtype)


def GlobalMaxPool(X):
    return X.max(axis=tuple(range(2, X.ndim)), keepdims=True)


def Pad(data, pads, constant_value=None, axes=None, *, mode="constant"):
    if mode != "constant" or axes is not None:
        raise NotImplementedError(mode)
    pads = [int(p) for p in np.asarray(pads)]
    nd = data.ndim
    value = 0 if constant_value is None else np.asarray(constant_value).item()
    return np.pad(data, [(pads[i], pads[i + nd]) for i in range(nd)], constant_values=value)


def ReduceMean(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    if axes is None or np.asarray(axes).size == 0:
        if noop_with_empty_axes:
            return data
        axes = tuple(range(data.ndim))
    axes = tuple(int(a) for a in np.asarray(axes).reshape(-1))
    return data.mean(axis=axes, keepdims=bool(keepdims)).astype(data.dtype)


def QuantizeLinear(x, y_scale, y_zero_point=None, *, axis=1, saturate=1, block_size=0,
                   output_dtype=0, precision=0):
    if block_size:
        raise NotImplementedError("blocked quantization")
    if y_zero_point is not None:
        dtype = y_zero_point.dtype
    else:
        dtype = onnx_dtype_to_numpy(output_dtype) if output_dtype else np.dtype(np.uint8)
    if not np.issubdtype(dtype, np.integer):
        raise NotImplementedError(f"quantization to {dtype}")
    zp = 0 if y_zero_point is None else y_zero_point
    return quantize_linear(x, y_scale, zp, dtype, axis)


def DequantizeLinear(x, x_scale, x_zero_point=None, *, axis=1, block_size=0, output_dtype=0):
    if block_size or not np.issubdtype(x.dtype, np.integer):
        raise NotImplementedError("blocked or non-integer dequantization")
    return dequantize_linear(x, x_scale, x_zero_point, axis)


# -- onnxruntime's quantized average pools (com.microsoft), emulated bit for bit -----------------


def _f32_to_int32(v: np.ndarray) -> np.ndarray:
    """``static_cast<int32_t>`` of already integral float32 values as x86 does it: out-of-range
    values become INT32_MIN."""
    inside = np.abs(v) < np.float32(2.0 ** 31)
    return np.where(inside, v, np.float32(-(2.0 ** 31))).astype(np.int64)


def _global_average_pool_ort(x: np.ndarray, x_scale: np.float32, x_zp: int, y_scale: np.float32, y_zp: int,
                             axes: tuple[int, ...]) -> np.ndarray:
    """onnxruntime's MLAS QLinearGlobalAveragePool over ``axes`` (kept, size 1): the integer sum
    minus count x input zero point, converted to float32, times the float32 scale
    ``x_scale / (y_scale * count)``, clamped to the output range minus the zero point, rounded
    half to even, plus the output zero point."""
    count = math.prod(x.shape[a] for a in axes)
    scale = np.float32(np.float32(x_scale) / np.float32(np.float32(y_scale) * np.float32(count)))
    if count >= 1 << 24 or not 2.0 ** -32 <= scale < 256.0:
        raise UnsupportedOpError(f"onnxruntime's QLinearGlobalAveragePool rejects scale {float(scale)!r} "
                                 f"and image size {count} (out of its computation range)")
    acc = x.astype(np.int64).sum(axis=axes, keepdims=True) - count * x_zp
    info = np.iinfo(x.dtype)
    v = acc.astype(np.int32).astype(np.float32) * scale
    v = np.clip(v, np.float32(info.min - y_zp), np.float32(info.max - y_zp))
    return (np.rint(v).astype(np.int64) + y_zp).astype(x.dtype)


def QLinearAveragePool(x, x_scale, x_zero_point=None, y_scale=None, y_zero_point=None, *, auto_pad="NOTSET",
                       ceil_mode=0, channels_last=0, count_include_pad=0, kernel_shape, pads=None,
                       strides=None):
    """com.microsoft QLinearAveragePool exactly as onnxruntime's CPU kernel computes it
    (qlinear_pool.cc): each element dequantized to float32 (``x_scale * (x - x_zp)``), the
    window's in-image elements summed in float32 row by row, divided by the count (the window
    size with count_include_pad -- also for ceil_mode windows past the padding -- else the
    in-image elements), then ``nearbyintf(y / y_scale + y_zp)`` saturated. A window covering
    the whole unpadded image takes onnxruntime's global-average kernel instead (integer sum,
    one float32 scale: ``QLinearGlobalAveragePool``)."""
    if channels_last:
        moved = np.moveaxis(x, -1, 1)
        y = QLinearAveragePool(moved, x_scale, x_zero_point, y_scale, y_zero_point, auto_pad=auto_pad,
                               ceil_mode=ceil_mode, count_include_pad=count_include_pad,
                               kernel_shape=kernel_shape, pads=pads, strides=strides)
        return np.moveaxis(y, 1, -1)
    if x.dtype not in (np.int8, np.uint8):
        raise NotImplementedError(f"QLinearAveragePool of {x.dtype}")
    sx, sy = np.float32(x_scale), np.float32(y_scale)
    zx = int(x_zero_point) if x_zero_point is not None else 0
    zy = int(y_zero_point) if y_zero_point is not None else 0
    kernel, strides, _, begin, end = _window_attrs(x, kernel_shape, strides, None, auto_pad, pads)
    nd = len(kernel)
    spatial = x.shape[2:]
    if tuple(spatial) == kernel and not any(begin) and not any(end):
        return _global_average_pool_ort(x, sx, zx, sy, zy, tuple(range(2, 2 + nd)))
    out = [conv_output_size(spatial[i], kernel[i], strides[i], begin[i], end[i], 1, bool(ceil_mode))
           for i in range(nd)]
    xf = sx * (x.astype(np.int32) - zx).astype(np.float32)           # float32 products
    # zeros around the image: adding 0.0 leaves a float32 sum unchanged, so the padded window
    # sums the in-image elements in onnxruntime's (row-major) order
    need = [(out[i] - 1) * strides[i] + kernel[i] for i in range(nd)]
    widths = [(begin[i], max(end[i], need[i] - begin[i] - spatial[i], 0)) for i in range(nd)]
    padded = np.pad(xf, [(0, 0), (0, 0)] + widths)
    total = np.zeros(x.shape[:2] + tuple(out), np.float32)
    for offset in np.ndindex(*kernel):
        index = tuple(slice(offset[i], offset[i] + (out[i] - 1) * strides[i] + 1, strides[i])
                      for i in range(nd))
        total = total + padded[(slice(None), slice(None)) + index]
    if count_include_pad:
        count = np.full(tuple(out), math.prod(kernel), np.int64)
    else:
        per_axis = []
        for i in range(nd):
            start = np.arange(out[i]) * strides[i] - begin[i]
            per_axis.append(np.minimum(start + kernel[i], spatial[i]) - np.maximum(start, 0))
        count = math.prod(np.ix_(*per_axis))
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = total / count.astype(np.float32)
        v = np.rint(mean / sy + np.float32(zy))
    info = np.iinfo(x.dtype)
    return np.clip(_f32_to_int32(v), info.min, info.max).astype(x.dtype)


def QLinearGlobalAveragePool(x, x_scale, x_zero_point, y_scale, y_zero_point, *, channels_last=0):
    """com.microsoft QLinearGlobalAveragePool as onnxruntime's MLAS kernel computes it (see
    ``_global_average_pool_ort``): exact integer sums, one float32 multiplication, rounded half
    to even before the output zero point is added."""
    if x.dtype not in (np.int8, np.uint8):
        raise NotImplementedError(f"QLinearGlobalAveragePool of {x.dtype}")
    axes = tuple(range(1, x.ndim - 1)) if channels_last else tuple(range(2, x.ndim))
    return _global_average_pool_ort(x, np.float32(x_scale), int(x_zero_point), np.float32(y_scale),
                                    int(y_zero_point), axes)


#: Domain of the host nodes that emulate onnxruntime's quantized average pools
#: (``passes.emulate_ort_pooling``): com.microsoft's QLinearAveragePool and
#: QLinearGlobalAveragePool, plus the attribute ``onnxruntime_uint8``.
EMULATION_DOMAIN = "systolic.onnxruntime"


def _emulation(kernel: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """A handler running ``kernel`` on int8 data as onnxruntime does: with ``onnxruntime_uint8``
    on the uint8 version of the int8 tensors (values and zero points + 128) -- onnxruntime's
    x86 builds convert int8 QDQ activations to uint8 before fusing, and the windowed kernel adds
    the output zero point in float32, so the representation changes its rounding."""
    def handler(x, x_scale, x_zero_point, y_scale, y_zero_point, *, onnxruntime_uint8=0, **attrs):
        if onnxruntime_uint8 and x.dtype == np.int8:
            def up(a: np.ndarray) -> np.ndarray:
                return (np.asarray(a).astype(np.int16) + 128).astype(np.uint8)
            y = kernel(up(x), x_scale, up(x_zero_point), y_scale, up(y_zero_point), **attrs)
            return (y.astype(np.int16) - 128).astype(np.int8)
        return kernel(x, x_scale, x_zero_point, y_scale, y_zero_point, **attrs)
    handler.__name__ = kernel.__name__
    handler.__doc__ = kernel.__doc__
    return handler


#: Handlers of the EMULATION_DOMAIN ops: onnxruntime's quantized average pools, bit for bit.
EMULATED_OPS: dict[str, Callable[..., Any]] = {
    f.__name__: _emulation(f) for f in (QLinearAveragePool, QLinearGlobalAveragePool)
}


#: The numpy handlers of host nodes, by ONNX op type.
HOST_OPS: dict[str, Callable[..., Any]] = {
    f.__name__: f for f in (
        Identity, Dropout, Flatten, Reshape, Squeeze, Unsqueeze, Transpose, Concat, Shape, Size,
        Gather, Cast, Add, Sub, Mul, Div, Sum, Neg, Sqrt, Exp, ConstantOfShape, Expand, Relu, LeakyRelu,
        Sigmoid, Tanh, Clip, Softmax,
        BatchNormalization, Conv, ConvInteger, MatMul, MatMulInteger, Gemm, MaxPool, AveragePool,
        GlobalAveragePool, GlobalMaxPool, Pad, ReduceMean, QuantizeLinear, DequantizeLinear,
    )
}
# Handlers follow the newest semantics; older opsets where the op meant something else run
# in onnxruntime (Softmax before 13 flattened its input to 2-D).
_MIN_OPSET = {"Softmax": 13, "ReduceMean": 18}
# Outputs the handler computes; nodes asking for more run in onnxruntime (MaxPool's Indices).
_MAX_OUTPUTS = {"MaxPool": 1}


# -- onnxruntime fallback ------------------------------------------------------------------------

_SESSIONS: weakref.WeakKeyDictionary[Node, Any] = weakref.WeakKeyDictionary()


def _run_onnxruntime(node: Node, args: Sequence[np.ndarray | None], opset: int,
                     out_dtypes: Sequence[str] | None,
                     constant: Sequence[bool] | None = None) -> tuple[np.ndarray, ...]:
    """Run one node in a one-node onnxruntime session (built once per node, input types and
    constant inputs' values); inputs flagged in ``constant`` are the model's initializers."""
    from onnx import helper, numpy_helper

    from .ortsession import ort_session

    fixed = [a is not None and constant is not None and bool(constant[i]) for i, a in enumerate(args)]
    key = tuple(None if a is None else
                (a.dtype.str, a.shape, hashlib.sha256(np.ascontiguousarray(a).tobytes()).digest()) if f
                else (a.dtype.str, a.shape) for a, f in zip(args, fixed, strict=True))
    cache = _SESSIONS.setdefault(node, {})
    session = cache.get(key)
    names = [f"in{i}" if a is not None else "" for i, a in enumerate(args)]
    if session is None:
        inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                  for n, a, f in zip(names, args, fixed, strict=True) if a is not None and not f]
        initializers = [numpy_helper.from_array(np.asarray(a), n)
                        for n, a, f in zip(names, args, fixed, strict=True) if f]
        types = list(out_dtypes) if out_dtypes is not None else ["float32"] * len(node.outputs)
        outputs = [helper.make_tensor_value_info(f"out{i}", helper.np_dtype_to_tensor_dtype(np.dtype(t)),
                                                 None) for i, t in enumerate(types)]
        attrs = {k: _onnx_attr(v) for k, v in node.attrs.items()}
        proto = helper.make_node(node.op, names, [o.name for o in outputs], domain=node.domain or None,
                                 **attrs)
        imports = [helper.make_opsetid("", opset)]
        if node.domain not in ("", "ai.onnx"):
            imports.append(helper.make_opsetid(node.domain, 1))
        model = helper.make_model(helper.make_graph([proto], node.name, inputs, outputs, initializers),
                                  opset_imports=imports)
        model.ir_version = 8
        try:
            session = ort_session(model)
        except Exception as exc:  # onnxruntime raises its own exception types
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UnsupportedOpError(f"{node.label}: no numpy handler and onnxruntime cannot run it: "
                                     f"{reason}") from None
        cache[key] = session
    feeds = {n: a for n, a, f in zip(names, args, fixed, strict=True) if a is not None and not f}
    return tuple(session.run(None, feeds))


def _onnx_attr(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        from onnx import numpy_helper
        return numpy_helper.from_array(value)
    return value
