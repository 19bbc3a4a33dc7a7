"""Speed of the golden model (sim/golden.py) on the example programs of sim/programs.py.

Each program runs with and without hazard checks (best of ``--repeat`` runs after one warm-up
run); the result is checked against the program's expected output. Seconds are CPU seconds of
this process (steadier than wall-clock time on a shared machine; the JSON has both). Writes
``bench/results/golden_speed.json`` and prints a table of instructions, seconds and
microseconds per instruction.

Run from the repository root: ``python bench/golden_speed.py [--repeat N]``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from systolic.hw.config import AcceleratorConfig
from systolic.sim.golden import run_golden
from systolic.sim.programs import Case, conv_case, gemm_case, pool_case, residual_case

__all__ = ["PROGRAMS", "time_case", "main"]

ROOT = Path(__file__).resolve().parent.parent
WS = AcceleratorConfig()                     # 8x8 int8, weight-stationary
OS = AcceleratorConfig(dataflow="os")

#: name -> builder of a Case (all on 8x8 arrays with the default memories)
PROGRAMS: dict[str, Callable[[], Case]] = {
    "gemm 256x256x256 ws": lambda: gemm_case(WS, 256, 256, 256, seed=1),
    "gemm 256x256x256 os": lambda: gemm_case(OS, 256, 256, 256, seed=1),
    "conv 28x28x32->32 k3 p1 nhwc": lambda: conv_case(WS, 28, 28, 32, 32, 3, 3, 1, 1, seed=1),
    "conv 28x28x16->32 k3 s2 p1 nchw": lambda: conv_case(WS, 28, 28, 16, 32, 3, 3, 2, 1, seed=1,
                                                         layout="nchw"),
    "residual gemm 64x64x64": lambda: residual_case(WS, 64, 64, 64, seed=1),
    "max pool 16x16x32 k3 s2 p1": lambda: pool_case(WS, 16, 16, 32, pool="max", kernel=3,
                                                    stride=2, pad=1, seed=1),
}


def time_case(case: Case, *, check_hazards: bool, repeat: int) -> tuple[float, float, int]:
    """Best CPU seconds and best wall-clock seconds of ``repeat`` golden runs (after a warm-up
    run that is checked against the expected output), and the estimated cycles."""
    result = run_golden(case.config, case.program, case.dram, check_hazards=check_hazards)
    case.check(result.dram)
    cpu = wall = float("inf")
    for _ in range(repeat):
        start_cpu, start_wall = time.process_time(), time.perf_counter()
        run_golden(case.config, case.program, case.dram, check_hazards=check_hazards)
        cpu = min(cpu, time.process_time() - start_cpu)
        wall = min(wall, time.perf_counter() - start_wall)
    return cpu, wall, result.cycles


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per program (best is kept)")
    args = parser.parse_args(argv)

    rows: list[dict[str, Any]] = []
    for name, build in PROGRAMS.items():
        case = build()
        count = len(case.program.instructions)
        row: dict[str, Any] = {"program": name, "instructions": count, "macs": case.macs}
        for label, hazards in (("hazards", True), ("no_hazards", False)):
            seconds, wall, cycles = time_case(case, check_hazards=hazards, repeat=args.repeat)
            row[f"seconds_{label}"] = seconds
            row[f"wall_seconds_{label}"] = wall
            row[f"us_per_instruction_{label}"] = seconds / count * 1e6
            row["estimated_cycles"] = cycles
        rows.append(row)

    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {"repeat": args.repeat, "programs": rows}
    (out_dir / "golden_speed.json").write_text(json.dumps(report, indent=2) + "\n")

    header = (f"{'program':<34}{'instr':>7}{'s (hazards)':>13}{'us/instr':>10}"
              f"{'s (none)':>10}{'us/instr':>10}{'cycles':>10}")
    print(f"golden model, CPU seconds, best of {args.repeat} runs")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['program']:<34}{r['instructions']:>7}{r['seconds_hazards']:>13.3f}"
              f"{r['us_per_instruction_hazards']:>10.1f}{r['seconds_no_hazards']:>10.3f}"
              f"{r['us_per_instruction_no_hazards']:>10.1f}{r['estimated_cycles']:>10}")


if __name__ == "__main__":
    main()
