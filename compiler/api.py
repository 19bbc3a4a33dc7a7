"""The Python API of the compiler: compile an ONNX model, run it.

>>> from systolic.compiler import compile_model, run_model          # doctest: +SKIP
>>> compiled = compile_model("examples/digits_cnn_int8.onnx")        # doctest: +SKIP
>>> result = run_model(compiled, {"input": images})                  # doctest: +SKIP
>>> result.outputs["logits"], result.report["cycles"]                # doctest: +SKIP

:func:`compile_model` runs the whole compiler: :func:`~systolic.compiler.frontend.load_model`,
:func:`~systolic.compiler.passes.optimize` and :func:`~systolic.compiler.codegen.compile_graph`.
:func:`run_model` runs a compiled model (or compiles one first) on the golden model, the RTL or a
board running the systolic SoC (``backend="board", port="/dev/ttyUSB0"``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from systolic.hw.config import AcceleratorConfig

from .codegen import CompiledModel, compile_graph
from .frontend import load_model
from .ir import Graph
from .passes import optimize
from .runtime import ModelRun
from .runtime import run_model as _run

__all__ = ["compile_model", "run_model", "CompiledModel", "ModelRun"]

ModelSource = str | os.PathLike[str] | onnx.ModelProto | Graph


def compile_model(model: ModelSource, *, config: AcceleratorConfig | None = None,
                  calibration: Any = None, strict: bool = False, relaxed: bool = False,
                  ort_exact_pooling: bool = False,
                  shapes: Mapping[str, Sequence[int]] | None = None, images_per_run: int = 1,
                  keep_intermediates: bool = False) -> CompiledModel:
    """Compile an ONNX model (a path or a ``ModelProto``; or an already optimized
    :class:`~systolic.compiler.ir.Graph`) for ``config`` (default: ``AcceleratorConfig()``).

    ``calibration``: inputs to quantize a float model with (a mapping of arrays, batches on axis
    0, or an ``.npz`` path). ``strict``: nodes that would run on the host are an error instead of
    a :class:`~systolic.compiler.passes.HostFallbackWarning`. ``relaxed``: fuse across
    requantizations the model specifies (see ``optimize``). ``ort_exact_pooling``: the average
    pools of an int8 model whose accelerator result could differ from onnxruntime's (which
    computes them in float32) run on the host, emulating onnxruntime's kernels bit for bit;
    ``strict`` allows these host nodes. ``shapes``: the shapes of inputs with symbolic
    dimensions. ``images_per_run``: images each program run computes. ``keep_intermediates``:
    every layer's output stays readable after a run.

    Errors are :class:`~systolic.compiler.errors.CompileError` subclasses (``ValueError``) with a
    one-line message naming the file, node or tensor."""
    config = config if config is not None else AcceleratorConfig()
    if isinstance(model, Graph):
        graph = model.replace(config=config) if model.config != config else model
    else:
        graph = optimize(load_model(model, shapes, config=config), calibration=calibration,
                         strict=strict, relaxed=relaxed, ort_exact_pooling=ort_exact_pooling)
    return compile_graph(graph, images_per_run=images_per_run,
                         keep_intermediates=keep_intermediates)


def run_model(model: CompiledModel | ModelSource, inputs: Mapping[str, np.ndarray], *,
              backend: str = "golden", config: AcceleratorConfig | None = None,
              calibration: Any = None, strict: bool = False, ort_exact_pooling: bool = False,
              shapes: Mapping[str, Sequence[int]] | None = None, images_per_run: int = 1,
              check_hazards: bool = True, capture: bool = False,
              progress: bool | None = None, port: str | None = None, baud: int | None = None,
              board: str | None = None) -> ModelRun:
    """Run a compiled model -- or compile ``model`` first (with ``config``, ``calibration``,
    ``strict``, ``ort_exact_pooling``, ``shapes``, ``images_per_run``) -- on ``inputs`` (input
    name -> array; the first axis may hold k times the model's batch, for k images) on
    ``backend`` (``"golden"``, ``"rtl"`` or ``"board"``). Returns a
    :class:`~systolic.compiler.runtime.ModelRun`: ``outputs``, ``report`` (cycles, MACs,
    utilization, DRAM traffic, per layer) and, with ``capture``, every tensor.

    ``board``: a board preset (``systolic.boards.boards``); without ``config`` a model is compiled
    for the preset's config. The board backend talks to the board on ``port`` (a serial device
    such as ``/dev/ttyUSB0``, or ``socket://127.0.0.1:PORT`` for a simulated board) at ``baud``
    (default: the preset's, else 115200) and checks that its accelerator has the model's config."""
    if not isinstance(model, CompiledModel):
        if config is None and board is not None:
            from systolic.boards.boards import load_preset
            config = load_preset(board)
        model = compile_model(model, config=config, calibration=calibration, strict=strict,
                              ort_exact_pooling=ort_exact_pooling, shapes=shapes,
                              images_per_run=images_per_run, keep_intermediates=capture)
    elif config is not None and config != model.config:
        raise ValueError(f"the model was compiled for config {model.config.hash_hex}, not "
                         f"{config.hash_hex}; compile it again for this config")
    return _run(model, inputs, backend=backend, check_hazards=check_hazards, capture=capture,
                progress=progress, port=port, baud=baud, board=board)
