"""Every program of the golden tests (sim/catalogue.py) on the RTL of the four configurations of
``RTL_CONFIGS`` (WS and OS, 8x8 and 4x4; the OS 4x4 one with the serial DMA engines and SFU and no command or
memory registers): the DRAM image the accelerator leaves must be the
golden model's, byte for byte, it must hold the builder's numpy result, and the ``macs`` and
``instructions`` counters must equal the golden model's.

Each configuration's programs run as one batch (``RTLRunner.run_many``: one simulator process,
each program from reset), the first time a test of that configuration asks for them. One
Verilator build per configuration (minutes the first time, cached after). The int32 wrap-around
GEMM (K = 131073) is 50,000 to 100,000 instructions and 0.7 to 1.2 million cycles on the
configurations whose K tiles are short (all but os8), where it runs only with
``SYSTOLIC_RTL_LONG=1``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pytest
from systolic.hw.config import AcceleratorConfig
from systolic.sim.catalogue import CATALOGUE, GEMM_INT32_WRAP, RTL_CONFIGS, CaseSpec
from systolic.sim.golden import RunResult, run_golden
from systolic.sim.programs import Case
from systolic.sim.rtl import RTLError, RTLJob, RTLRunner, RTLRunResult

LONG = os.environ.get("SYSTOLIC_RTL_LONG", "0") not in ("", "0")

#: (config name, entry) pairs left out unless SYSTOLIC_RTL_LONG=1.
SLOW = {(name, GEMM_INT32_WRAP) for name in ("ws8", "ws4", "os4")}


@dataclass
class _Run:
    case: Case | None
    golden: RunResult | None
    outcome: RTLRunResult | Exception


_RUNS: dict[str, dict[CaseSpec, _Run]] = {}


def _specs(name: str) -> list[CaseSpec]:
    return [spec for spec in CATALOGUE if LONG or (name, spec) not in SLOW]


def _runs(name: str) -> dict[CaseSpec, _Run]:
    """The catalogue on the golden model and, as one batch, on the RTL of config ``name``."""
    if name not in _RUNS:
        config = RTL_CONFIGS[name]
        runs: dict[CaseSpec, _Run] = {}
        jobs, batch = [], []
        for spec in _specs(name):
            try:
                case = spec.build(config)
                golden = run_golden(config, case.program, case.dram)
            except ValueError as exc:      # reported by the test of this entry
                runs[spec] = _Run(None, None, exc)
                continue
            runs[spec] = _Run(case, golden, ValueError('not run'))
            jobs.append(RTLJob(case.program, case.dram, case.program_addr,
                               max_cycles=8 * golden.cycles + 20_000))
            batch.append(spec)
        try:
            outcomes = RTLRunner(config, seed=1).run_many(jobs)
        except Exception as exc:     # the build or the simulator failed: every test says so
            outcomes = [exc] * len(jobs)
        for spec, outcome in zip(batch, outcomes, strict=True):
            runs[spec].outcome = outcome
        _RUNS[name] = runs
    return _RUNS[name]


def _first_difference(case: Case, rtl: np.ndarray, golden: np.ndarray) -> str:
    differ = np.flatnonzero(rtl != golden)
    addr = int(differ[0])
    region = next((f"{name}+{addr - start:#x}" for name, (start, size) in case.regions.items()
                   if start <= addr < start + size), "no region")
    return (f"{case.name}: DRAM byte {addr:#x} ({region}) is {int(rtl[addr]):#04x} on the RTL and "
            f"{int(golden[addr]):#04x} on the golden model ({differ.size} bytes differ)")


def _params() -> list:
    out = []
    for name in RTL_CONFIGS:
        for spec in CATALOGUE:
            # one config's programs are one batch (`_runs`): one xdist worker runs them (tests/conftest.py)
            marks = [pytest.mark.slow, pytest.mark.xdist_group(f"rtl_programs-{name}")]
            if (name, spec) in SLOW and not LONG:
                marks.append(pytest.mark.skip(reason="0.7 to 1.2 million cycles on this config: set "
                                                     "SYSTOLIC_RTL_LONG=1"))
            out.append(pytest.param(name, spec, id=f"{name}-{spec.id}", marks=marks))
    return out


@pytest.mark.parametrize("name, spec", _params())
def test_program_matches_golden(name: str, spec: CaseSpec) -> None:
    run = _runs(name)[spec]
    if run.case is None:
        raise run.outcome
    if isinstance(run.outcome, RTLError):
        pytest.fail(f"{run.case.name} on {name}: {run.outcome}")
    if not isinstance(run.outcome, RTLRunResult):
        raise run.outcome
    rtl, golden = run.outcome, run.golden
    assert rtl.dram.shape == golden.dram.shape
    if not np.array_equal(rtl.dram, golden.dram):
        pytest.fail(f"on {name}: {_first_difference(run.case, rtl.dram, golden.dram)}")
    run.case.check(rtl.dram)
    assert (rtl.macs, rtl.instructions) == (golden.macs, golden.instructions), run.case.name
    assert rtl.macs == run.case.macs
    assert rtl.cycles > 0


def test_the_configs_are_the_four_dataflow_and_size_pairs() -> None:
    shapes = {(c.dataflow, c.rows, c.cols) for c in RTL_CONFIGS.values()}
    assert shapes == {("ws", 8, 8), ("os", 8, 8), ("ws", 4, 4), ("os", 4, 4)}
    assert RTL_CONFIGS["ws8"] == AcceleratorConfig()    # the build the other RTL tests use
    engines = {(c.gather_engine, c.scatter_engine, c.sfu_engine, c.command_registers,
                c.memory_registers) for c in RTL_CONFIGS.values()}
    assert engines == {("pipelined", "pipelined", "pipelined", True, True),
                       ("serial", "serial", "serial", False, False)}


def test_the_4x4_configs_tile_every_dimension() -> None:
    """The catalogue's larger programs take several M, K and N tiles on the 4x4 configs."""
    spec = next(s for s in CATALOGUE if s.id == "gemm-17x33x9-seed=59-requant=False")
    for name in ("ws4", "os4"):
        case = spec.build(RTL_CONFIGS[name])
        computes = [i for i in case.program.instructions if i.op.name == "COMPUTE"]
        assert max(i.m for i in computes) < 17                  # M tiles
        assert any(i.accumulate for i in computes)              # K tiles
        assert {i.n for i in computes} == {4, 1}                # N tiles: 4 + 4 + 1
