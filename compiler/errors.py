"""Errors of the ONNX compiler front end.

Every error is one line that names the thing at fault (file, input, tensor, node, field), the
rule it breaks and the value that was given. All are :class:`CompileError`, a ``ValueError``.
"""

from __future__ import annotations

__all__ = [
    "CompileError", "ModelLoadError", "OpsetError", "ShapeError", "UnsupportedOpError",
    "QuantizationError", "CalibrationError", "VerifyError", "InputError",
]


class CompileError(ValueError):
    """Base class of every compiler error."""


class ModelLoadError(CompileError):
    """The file cannot be read or is not a valid ONNX model."""


class OpsetError(CompileError):
    """The model's ONNX opset is outside the supported range."""


class ShapeError(CompileError):
    """A tensor's shape is unknown (symbolic and not given) or inconsistent with its node."""


class UnsupportedOpError(CompileError):
    """A node cannot be compiled: unknown op type, unsupported attribute, or (with ``strict``)
    an op that would have to run on the host."""


class QuantizationError(CompileError):
    """Quantization parameters are missing or cannot be represented by the accelerator."""


class CalibrationError(CompileError):
    """Calibration data does not match the model's inputs."""


class VerifyError(CompileError):
    """The IR breaks an invariant (SSA, dangling name, shape or dtype rule): a compiler bug or a
    malformed hand-built graph."""


class InputError(CompileError):
    """An array given to the reference executor has the wrong name, shape or dtype."""
