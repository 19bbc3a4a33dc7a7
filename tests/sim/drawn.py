"""Random programs for the RTL tests: instructions are drawn until the golden model accepts them."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from systolic.hw.config import AcceleratorConfig
from systolic.hw.isa import Instruction
from systolic.sim.golden import ExecutionError, run_golden


def append_accepted(config: AcceleratorConfig, program: list[Instruction], dram: np.ndarray,
                    draw: Callable[[], Instruction], count: int) -> None:
    """Append ``count`` instructions from ``draw`` to ``program``, each one the golden model runs
    after ``program`` without an error (one that breaks a rule is drawn again). ``dram`` is the
    data only: an address in the program's words is out of range (the RTL's image holds the words
    there, the golden model's not)."""
    added = 0
    while added < count:
        candidate = draw()
        try:
            run_golden(config, [*program, candidate, Instruction("FINISH")], dram)
        except ExecutionError:
            continue
        program.append(candidate)
        added += 1
