"""Simulation: the reference arithmetic (:mod:`.arith`), the golden model of ISA v2
(:mod:`.golden`) and example programs with their expected results (:mod:`.programs`).

The names below are imported on first use, so that ``import systolic.sim.arith`` stays light
(the golden model pulls in Amaranth through the ISA layouts)."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "DeadlockError": "golden", "ExecutionError": "golden", "GoldenModel": "golden",
    "HazardError": "golden", "InstrTiming": "golden", "RunResult": "golden",
    "run_golden": "golden", "MachineState": "golden",
    "Case": "programs", "conv_case": "programs", "gemm_case": "programs", "pool_case": "programs",
    "residual_case": "programs",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'systolic.sim' has no attribute {name!r}")
    return getattr(importlib.import_module(f"systolic.sim.{module}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
