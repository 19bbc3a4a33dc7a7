"""The systolic compiler: ONNX in, accelerator programs out.

``compile_model`` and ``run_model`` (:mod:`systolic.compiler.api`) are the entry points; they
are imported on first use so that ``import systolic.compiler.asm`` (the command line) stays
light.
"""

from __future__ import annotations

from typing import Any

__all__ = ["compile_model", "run_model", "CompiledModel", "ModelRun"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import api
        return getattr(api, name)
    raise AttributeError(f"module 'systolic.compiler' has no attribute {name!r}")
