"""What a compute clock of its own (``compute_clock_mhz``) buys: programs of sim/programs.py on
the RTL (Verilator, memory model ``fast``) of one config run with one clock and with the
compute core on a faster clock than the rest, at the same control clock.

For each program and clock setting the table gives the control-clock cycles (the ``cycles``
counter), the time at the configured clocks (cycles / clock_mhz), the array's busy fraction in
its own clock (``array_active`` / compute-clock cycles of the run, the cycles counter scaled by
compute_clock_mhz / clock_mhz) and the speed-up over one clock at ``clock_mhz``; every run's
DRAM image must equal the golden model's.

Writes ``bench/results/compute_clock.json`` (or ``--out``) and prints the table. Run from the
repository root: ``python bench/compute_clock.py [--size 8x8] [--clock-mhz 75]
[--compute-mhz 100 150]``. Each clock setting is one Verilator build (a minute or two).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from systolic.hw.config import AcceleratorConfig, ConfigError, parse_size
from systolic.sim.golden import run_golden
from systolic.sim.programs import Case, conv_case, gemm_case
from systolic.sim.rtl import RTLJob, RTLRunner

__all__ = ["PROGRAMS", "measure", "main"]

RESULTS = Path(__file__).resolve().parent / "results" / "compute_clock.json"

#: name -> builder of a Case for a config
PROGRAMS: dict[str, Callable[[AcceleratorConfig], Case]] = {
    "gemm 128x128x128": lambda c: gemm_case(c, 128, 128, 128, seed=1),
    "gemm 256x64x64": lambda c: gemm_case(c, 256, 64, 64, seed=2),
    "conv 16x16x16->16 k3 p1": lambda c: conv_case(c, 16, 16, 16, 16, 3, 3, 1, 1, seed=3),
}


def measure(config: AcceleratorConfig) -> list[dict[str, Any]]:
    """Every program of :data:`PROGRAMS` on the RTL of ``config`` (one batch), checked against
    the golden model; one row per program."""
    cases = {name: build(config) for name, build in PROGRAMS.items()}
    goldens = {name: run_golden(config, case.program, case.dram) for name, case in cases.items()}
    jobs = [RTLJob(case.program, case.dram, case.program_addr, max_cycles=20 * goldens[name].cycles + 50_000)
            for name, case in cases.items()]
    outcomes = RTLRunner(config, memory="fast").run_many(jobs)
    rows = []
    ratio = (config.compute_clock_mhz or config.clock_mhz) / config.clock_mhz
    for name, outcome in zip(cases, outcomes, strict=True):
        if isinstance(outcome, Exception):
            raise outcome
        if not np.array_equal(outcome.dram, goldens[name].dram):
            raise AssertionError(f"{name}: the RTL's DRAM image differs from the golden model's")
        cycles = outcome.cycles
        rows.append({
            "program": name, "clock_mhz": config.clock_mhz, "compute_clock_mhz": config.compute_clock_mhz,
            "cycles": cycles, "microseconds": cycles / config.clock_mhz,
            "array_active": outcome.counters["array_active"], "macs": outcome.macs,
            "array_busy": outcome.counters["array_active"] / (cycles * ratio),
            "utilization": outcome.macs / (config.rows * config.cols * cycles * ratio),
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="8x8", help="array size RxC (default 8x8)")
    parser.add_argument("--clock-mhz", type=float, default=75.0, help="the control clock, MHz")
    parser.add_argument("--compute-mhz", type=float, nargs="+", default=[100.0],
                        help="compute clocks to compare with one clock, MHz")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    args = parser.parse_args(argv)
    try:
        rows_, cols = parse_size(args.size, flag="--size")
        configs = [AcceleratorConfig(rows=rows_, cols=cols, clock_mhz=args.clock_mhz)]
        configs += [configs[0].replace(compute_clock_mhz=mhz) for mhz in args.compute_mhz]
    except ConfigError as exc:
        parser.error(str(exc))
    rows = [row for config in configs for row in measure(config)]
    base = {row["program"]: row["microseconds"] for row in rows if not row["compute_clock_mhz"]}
    for row in rows:
        row["speedup"] = base[row["program"]] / row["microseconds"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"size": args.size, "rows": rows}, indent=2) + "\n")
    print(f"{'program':<26} {'clk':>5} {'compute':>7} {'cycles':>8} {'us':>8} {'busy':>6} {'util':>6} "
          f"{'speed-up':>8}")
    for r in rows:
        compute = f"{r['compute_clock_mhz']:g}" if r["compute_clock_mhz"] else "-"
        print(f"{r['program']:<26} {r['clock_mhz']:>5g} {compute:>7} {r['cycles']:>8} "
              f"{r['microseconds']:>8.1f} {r['array_busy']:>6.1%} {r['utilization']:>6.1%} "
              f"{r['speedup']:>8.2f}")
    print(f"results in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
