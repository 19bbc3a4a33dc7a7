"""A compute core on a clock of its own (``compute_clock_mhz``), in Verilator: every program of
the golden tests (sim/catalogue.py, but the million-cycle int32 GEMM) leaves the golden model's
DRAM image and MAC count, with the compute clock faster than the rest (75 and 100 MHz, the
ULX3S's pair) on the WS 4x4 configuration, its accumulator rows crossing in 4 pieces
(``acc_crossing_pieces``) and every FIFO in block RAM (``fifo_block_ram_bits = 1``: the
crossings into the core read theirs ahead, hw/fifo.py FetchAheadAsyncFIFO; the COMPUTE
instructions' crossing is never in block RAM), and slower (75 and
56 MHz) on the OS 4x4 one with the small FPGAs' choices, whole rows. Each configuration's
programs run as one batch, each from reset, so the restart of both clock domains between
programs is covered too."""

from __future__ import annotations

import numpy as np
import pytest
from systolic.sim.catalogue import CATALOGUE, GEMM_INT32_WRAP, RTL_CONFIGS
from systolic.sim.golden import run_golden
from systolic.sim.rtl import RTLJob, RTLRunner, RTLRunResult, compute_clock_wrapper, compute_half_period_ps

CONFIGS = {
    # (every FIFO in block RAM but the COMPUTE instructions' crossing: the crossings into the core
    # read theirs ahead, FetchAheadAsyncFIFO)
    "ws4-faster": RTL_CONFIGS["ws4"].replace(clock_mhz=75.0, compute_clock_mhz=100.0, acc_crossing_pieces=4,
                                             fifo_block_ram_bits=1),
    "os4-slower": RTL_CONFIGS["os4"].replace(clock_mhz=75.0, compute_clock_mhz=56.0),
}
SPECS = [spec for spec in CATALOGUE if spec != GEMM_INT32_WRAP]
_RUNS: dict[str, list] = {}


def _runs(name: str) -> list:
    if name not in _RUNS:
        config = CONFIGS[name]
        cases = [spec.build(config) for spec in SPECS]
        goldens = [run_golden(config, case.program, case.dram) for case in cases]
        jobs = [RTLJob(case.program, case.dram, case.program_addr, max_cycles=8 * g.cycles + 20_000)
                for case, g in zip(cases, goldens, strict=True)]
        outcomes = RTLRunner(config, seed=1).run_many(jobs)
        _RUNS[name] = list(zip(cases, goldens, outcomes, strict=True))
    return _RUNS[name]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGS))
def test_catalogue_matches_golden(name: str) -> None:
    failures = []
    for case, golden, outcome in _runs(name):
        if not isinstance(outcome, RTLRunResult):
            failures.append(f"{case.name}: {outcome}")
        elif not np.array_equal(outcome.dram, golden.dram):
            first = int(np.flatnonzero(outcome.dram != golden.dram)[0])
            failures.append(f"{case.name}: DRAM byte {first:#x} differs")
        elif (outcome.macs, outcome.instructions) != (golden.macs, golden.instructions):
            failures.append(f"{case.name}: macs {outcome.macs} instructions {outcome.instructions}, "
                            f"golden {golden.macs} {golden.instructions}")
    assert not failures, "\n".join(failures)
    assert len(_runs(name)) == len(SPECS) > 50


def test_wrapper_makes_the_compute_clock() -> None:
    text = compute_clock_wrapper(CONFIGS["ws4-faster"])
    # 10 ns x 75 / 100 = 7.5 ns: half periods of 3.75 ns
    assert "#(3.750)" in text and ".compute_clk(compute_clk)" in text
    assert "#(1.370);" in text                   # the first rising edge, off clk's edges
    # the simulated board's harness takes the same period (boards/simlink.py)
    assert compute_half_period_ps(CONFIGS["ws4-faster"]) == 3750
    assert compute_half_period_ps(CONFIGS["os4-slower"]) == round(10_000 * 75 / 56 / 2)
    with pytest.raises(ValueError, match=r"^config [0-9a-f]{16} has one clock \(compute_clock_mhz = 0\): "
                                         r"it has no compute clock$"):
        compute_half_period_ps(RTL_CONFIGS["ws4"])
    assert "module systolic_top (" in text and "systolic_core core (" in text
    with pytest.raises(ValueError, match=r"^config [0-9a-f]{16} has one clock \(compute_clock_mhz = 0\): "
                                         r"its systolic_top needs no wrapper$"):
        compute_clock_wrapper(RTL_CONFIGS["ws4"])
