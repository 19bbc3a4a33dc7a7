"""Speed of the RTL runner (sim/rtl.py): accelerator cycles simulated per second in Verilator.

Runs example programs of sim/programs.py on the default configuration's RTL with each fast memory
model (and, with ``--axi-random``, cocotbext-axi's AxiRam), checks each result against the
program's expected output, and reports the accelerator's cycles (its ``cycles`` counter), the
golden model's cycle estimate, and cycles per second of the simulation, by wall clock and by the
simulator process's CPU time (steadier on a shared machine). The first run builds the RTL
(minutes; cached afterwards): the build time is reported when it happens. Writes
``bench/results/rtl_speed.json`` and prints a table.

Run from the repository root: ``python bench/rtl_speed.py [--axi-random]``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from systolic.hw.config import AcceleratorConfig
from systolic.sim.golden import run_golden
from systolic.sim.programs import Case, conv_case, gemm_case
from systolic.sim.rtl import RTLRunner

__all__ = ["PROGRAMS", "measure", "main"]

ROOT = Path(__file__).resolve().parent.parent

PROGRAMS = {
    "gemm 128x64x64": lambda c: gemm_case(c, 128, 64, 64, seed=1),
    "gemm 256x256x64": lambda c: gemm_case(c, 256, 256, 64, seed=2),
    "conv 16x16x8 -> 16, 3x3": lambda c: conv_case(c, 16, 16, 8, 16, 3, 3, pad=1, seed=3),
}


def measure(runner: RTLRunner, name: str, case: Case) -> dict[str, Any]:
    """One run of ``case`` (called ``name``); cycles in cycles, speeds in cycles per second."""
    golden = run_golden(runner.config, case.program, case.dram)
    start = time.perf_counter()
    result = runner.run(case.program, case.dram, prog_addr=case.program_addr, max_cycles=50_000_000)
    seconds = time.perf_counter() - start
    case.check(result.dram)
    return {
        "program": name, "memory": runner.memory, "cycles": result.cycles,
        "golden_cycles": golden.cycles, "instructions": result.instructions,
        "cycles_per_second_wall": result.cycles_per_second,
        "cycles_per_second_cpu": result.sim_cycles / result.run_cpu_seconds
        if result.run_cpu_seconds > 0 else 0.0,
        "run_seconds": result.run_seconds, "call_seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--axi-random", action="store_true",
                        help="also run the smallest program with cocotbext-axi's AxiRam (slow)")
    args = parser.parse_args()
    config = AcceleratorConfig()
    memories = ["fast", "fast-random"] + (["axi-random"] if args.axi_random else [])
    build_start = time.perf_counter()
    RTLRunner(config).build()
    build_seconds = time.perf_counter() - build_start
    rows = []
    for memory in memories:
        runner = RTLRunner(config, memory=memory, seed=1)
        for name, make in PROGRAMS.items():
            if memory == "axi-random" and name != "gemm 128x64x64":
                continue
            rows.append(measure(runner, name, make(config)))
    out = {"config": config.hash_hex, "rows_x_cols": f"{config.rows}x{config.cols}",
           "build_or_cache_seconds": build_seconds, "runs": rows}
    path = ROOT / "bench" / "results" / "rtl_speed.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")

    print(f"config {config.hash_hex} ({config.rows}x{config.cols}); build (or cache lookup) "
          f"{build_seconds:.1f} s")
    header = f"{'program':<26} {'memory':<12} {'cycles':>9} {'golden':>9} {'kc/s wall':>10} {'kc/s cpu':>9}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['program']:<26} {r['memory']:<12} {r['cycles']:>9} {r['golden_cycles']:>9} "
              f"{r['cycles_per_second_wall'] / 1000:>10.1f} {r['cycles_per_second_cpu'] / 1000:>9.1f}")
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
