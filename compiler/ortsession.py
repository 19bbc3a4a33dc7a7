"""onnxruntime sessions for reference results: its int8 kernels with exact integer products.

On x86-64 CPUs without VNNI (AVX2 or AVX-512 without VNNI) onnxruntime's default uint8 x int8
matrix multiplication (QLinearConv, QLinearMatMul, MatMulInteger, ConvInteger, the fused QDQ
graphs) adds pairs of products in 16 bits with saturation, so its results depend on the CPU and
are wrong where a pair exceeds 32767. onnxruntime's session option ``session.x64quantprecision``
turns its int8 weights into uint8 ones (weights and zero point + 128: the same integers) and uses
its exact uint8 x uint8 kernels on those CPUs; elsewhere it changes nothing. Every session the
project runs for reference results (the host-run nodes of the runtime, the demo's onnxruntime
accuracy, the tests) is made here, so onnxruntime's results are the same on every x86 CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx

__all__ = ["EXACT_INT8", "ort_session"]

#: The session config entry and value that make onnxruntime's int8 products exact on every CPU.
EXACT_INT8 = ("session.x64quantprecision", "1")


def ort_session(model: onnx.ModelProto | str | Path | bytes, *, optimize: bool = True,
                optimized_model_path: str | Path | None = None) -> Any:
    """A CPU ``onnxruntime.InferenceSession`` of ``model`` (a ``ModelProto``, a path or the
    serialized bytes) with :data:`EXACT_INT8`; ``optimize=False`` turns onnxruntime's graph
    optimizations off, ``optimized_model_path`` saves its optimized graph there.

    onnxruntime refuses :data:`EXACT_INT8` for a QGemm of int8 activations (the int8 x int8
    kernel, exact on every CPU, has no uint8 weights): such a model gets a session without it."""
    import onnxruntime as ort

    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    elif isinstance(model, Path):
        model = str(model)

    def session(exact: bool) -> Any:
        options = ort.SessionOptions()
        if exact:
            options.add_session_config_entry(*EXACT_INT8)
        if not optimize:
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        if optimized_model_path is not None:
            options.optimized_model_filepath = str(optimized_model_path)
        return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])

    try:
        return session(exact=True)
    except Exception as exc:  # onnxruntime raises its own exception types
        if "QGemm" not in str(exc):
            raise
    return session(exact=False)
