"""MAC utilization of int8 GEMMs on the RTL: the compiler's program for an ONNX MatMul, run on the
generated Verilog in Verilator, against the golden model's estimate and an analytical model.

Each case is a float ONNX ``MatMul`` (A [M x K] . W [K x N], W a constant), quantized and compiled
by ``systolic.compiler.compile_model`` for the configuration -- the program a user gets, with the
compiler's tiling search (``compiler/lower.py``, ``choose_tiling``). Its accelerator segment runs
on a random int8 A (written into the segment's input buffer) on

* the RTL (``systolic.sim.rtl.RTLRunner``, memory model ``fast``: fixed read latency
  ``dram_latency``, no backpressure): cycles, MACs, DRAM bytes and stall counts come from the
  accelerator's hardware counters (``hw/csr.py``);
* the golden model (``systolic.sim.golden``): its cycle estimate (docs/isa.md, "Cycle estimate")
  and DRAM bytes; the outputs of the two runs must be equal byte for byte.

Utilization is MACs / (R * C * cycles): R x C MACs per cycle is the array's peak.

Analytical model (cycles; R = rows, C = cols). The array computes the GEMM in *folds*: one
stationary operand tile at a time, with the other operand streamed through it.

* WS: a fold is one R x C weight tile: ``folds = ceil(K / R) * ceil(N / C)``; M input rows stream
  through each. OS: a fold is one R x C output tile: ``folds = ceil(M / R) * ceil(N / C)``; K
  operand beats stream into each.
* Each fold costs its ``stream`` cycles (M in WS, K in OS) plus the skew fill and drain of the
  array, ``R + C - 1`` cycles (the first row reaches the last column, the last row leaves it);
  folds do not overlap. The weight preload of a WS fold (R cycles) is hidden behind the previous
  fold's stream (the PEs' shadow weight registers) except the first one's; in OS the last fold's
  R result rows drain out after it. So ``analytical = folds * (stream + R + C - 1) + R``.
* ``ideal`` is the same with perfect overlap of the folds: ``folds * stream + R + C - 1 + R``,
  the fewest cycles any schedule of these folds takes.
* ``read channel`` is a second lower bound: the beats the program moves on the single AXI read
  channel (one per cycle), which carries the LOADs' data *and* the instruction fetch:
  ``(rtl dram_read_bytes + 64 * instructions) / dma_bytes``. (The golden model's estimate does
  not charge the fetch against the LOADs' bandwidth; a program of many small instructions can be
  bound by it.)

The hardware overlaps consecutive folds (their streams follow back to back, docs/isa.md:
``ws_cycles``), so a good program beats the analytical model; ``rtl <= analytical`` says whether
it does. For reference, the 256^3 WS case also runs ``sim/programs.py``'s ``gemm_case`` (a
simpler tiling that re-reads A for every weight tile).

Target: at least 90 % utilization for 256 x 256 x 256 on the default 8 x 8 WS configuration
(64-bit bus). Writes ``bench/results/gemm_utilization.json`` and prints a table.
Run: ``python bench/gemm_utilization.py`` (the first run builds the 8x8 OS accelerator in
Verilator: minutes; ``--cases 256x256x256-ws`` runs one case).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from onnx import TensorProto, helper, numpy_helper
from systolic.compiler import compile_model
from systolic.compiler.runtime import quiet_output
from systolic.hw.config import AcceleratorConfig
from systolic.hw.isa import INSTR_BYTES
from systolic.sim.golden import RunResult, run_golden
from systolic.sim.programs import gemm_case
from systolic.sim.rtl import RTLRunner, RTLRunResult

__all__ = ["GemmCase", "CASES", "TARGET", "analytical_cycles", "ideal_cycles", "matmul_model",
           "measure", "main"]

RESULTS = Path(__file__).parent / "results" / "gemm_utilization.json"
WS = AcceleratorConfig()
OS = AcceleratorConfig(dataflow="os")
#: Utilization the 256^3 WS case must reach.
TARGET = 0.90
#: The counters reported besides cycles and MACs (hw/csr.py).
STALLS = ("array_active", "compute_busy", "load_busy", "store_busy", "stall_compute_token",
          "stall_load_token", "stall_store_token", "stall_dispatch", "stall_fetch")


@dataclass(frozen=True)
class GemmCase:
    """One GEMM (M x K) . (K x N), in elements, on one configuration."""

    name: str
    config: AcceleratorConfig
    M: int
    K: int
    N: int
    target: float | None = None       #: utilization the RTL must reach, if any
    reference: bool = False           #: also run sim/programs.py's gemm_case


CASES = [
    GemmCase("256x256x256-ws", WS, 256, 256, 256, target=TARGET, reference=True),
    GemmCase("64x64x64-ws", WS, 64, 64, 64),
    GemmCase("128x256x64-ws", WS, 128, 256, 64),
    GemmCase("256x256x256-os", OS, 256, 256, 256),
    GemmCase("64x64x64-os", OS, 64, 64, 64),
]


def _folds(case: GemmCase) -> tuple[int, int]:
    """(folds, stream cycles per fold) of the analytical model (module docstring)."""
    c = case.config
    R, C = c.rows, c.cols
    if c.dataflow == "ws":
        return -(-case.K // R) * -(-case.N // C), case.M
    return -(-case.M // R) * -(-case.N // C), case.K


def analytical_cycles(case: GemmCase) -> int:
    """Folds without overlap: ``folds * (stream + R + C - 1) + R`` cycles."""
    R, C = case.config.rows, case.config.cols
    folds, stream = _folds(case)
    return folds * (stream + R + C - 1) + R


def ideal_cycles(case: GemmCase) -> int:
    """Folds back to back: ``folds * stream + R + C - 1 + R`` cycles."""
    R, C = case.config.rows, case.config.cols
    folds, stream = _folds(case)
    return folds * stream + R + C - 1 + R


def matmul_model(M: int, K: int, N: int, seed: int = 0) -> tuple[Any, dict[str, np.ndarray]]:
    """A float ONNX MatMul (input [M, K] . constant [K, N]) and calibration inputs for it."""
    rng = np.random.default_rng(seed)
    weights = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
    node = helper.make_node("MatMul", ["input", "w"], ["out"], name="matmul")
    graph = helper.make_graph(
        [node], f"matmul_{M}x{K}x{N}",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [M, K])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [M, N])],
        [numpy_helper.from_array(weights, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8         # onnxruntime reads IR versions up to 10
    calibration = {"input": rng.uniform(-1, 1, (4 * M, K)).astype(np.float32)}
    return model, calibration


def _run_both(config: AcceleratorConfig, program: Any, dram: np.ndarray, prog_addr: int,
              out: tuple[int, int]) -> tuple[RunResult, RTLRunResult, bool]:
    """Golden and RTL runs of one program; whether the output bytes [addr, addr + n) agree."""
    golden = run_golden(config, program, dram)
    size = 1 << max(24, (int(dram.size) - 1).bit_length())
    with quiet_output():      # the simulator's own messages
        rtl = RTLRunner(config, dram_bytes=size).run(program, dram, prog_addr=prog_addr,
                                                     max_cycles=max(1_000_000, 10 * golden.cycles))
    lo, hi = out[0], out[0] + out[1]
    return golden, rtl, bool(np.array_equal(golden.dram[lo:hi], rtl.dram[lo:hi]))


def _figures(case: GemmCase, golden: RunResult, rtl: RTLRunResult, exact: bool) -> dict[str, Any]:
    c = case.config
    peak = c.rows * c.cols
    analytical = analytical_cycles(case)
    return {
        "rtl_cycles": rtl.cycles, "rtl_macs": rtl.macs,
        "rtl_utilization": rtl.macs / (peak * rtl.cycles),
        "golden_cycles": golden.cycles, "golden_utilization": golden.utilization,
        "rtl_vs_golden": rtl.cycles / golden.cycles - 1,
        "analytical_cycles": analytical,
        "analytical_utilization": case.M * case.K * case.N / (peak * analytical),
        "rtl_le_analytical": rtl.cycles <= analytical,
        "ideal_cycles": ideal_cycles(case),
        "read_channel_cycles": (rtl.dram_read_bytes + INSTR_BYTES * rtl.instructions) // c.dma_bytes,
        "rtl_dram_read_bytes": rtl.dram_read_bytes, "rtl_dram_write_bytes": rtl.dram_write_bytes,
        "golden_dram_read_bytes": golden.dram_read_bytes,
        "golden_dram_write_bytes": golden.dram_write_bytes,
        "dram_bytes_equal": (rtl.dram_read_bytes, rtl.dram_write_bytes)
                            == (golden.dram_read_bytes, golden.dram_write_bytes),
        "instructions": rtl.instructions,
        "counters": {name: rtl.counters[name] for name in STALLS},
        "bit_exact_rtl_vs_golden": exact,
    }


def measure(case: GemmCase, seed: int = 0) -> list[dict[str, Any]]:
    """Compile and run ``case`` (and its gemm_case reference); one result row per program."""
    config = case.config
    model, calibration = matmul_model(case.M, case.K, case.N, seed)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = compile_model(model, config=config, calibration=calibration)
    compile_seconds = time.perf_counter() - t0
    if len(compiled.segments) != 1 or len(compiled.segments[0].layers) != 1:
        raise RuntimeError(f"{case.name}: expected one accelerator segment of one layer, got "
                           f"{[len(seg.layers) for seg in compiled.segments]}")
    seg = compiled.segments[0]
    layer = seg.layers[0]
    dram = compiled.image.copy()
    lo, hi = config.input_range
    a = np.random.default_rng(seed + 1).integers(lo, hi + 1, (case.M, case.K), dtype=np.int8)
    dram[layer.addresses["input"]:layer.addresses["input"] + a.size] = a.view(np.uint8).reshape(-1)
    out = (layer.addresses["output"], case.M * case.N * config.output_bits // 8)
    t0 = time.perf_counter()
    golden, rtl, exact = _run_both(config, seg.program, dram, seg.address, out)
    rows = [{
        "case": case.name, "program": "compiler", "config": config.hash_hex,
        "dataflow": config.dataflow, "rows": config.rows, "cols": config.cols,
        "dma_data_bits": config.dma_data_bits, "M": case.M, "K": case.K, "N": case.N,
        "tiling": layer.tiling.describe(), "compiler_estimate": layer.tiling.estimate,
        "compile_seconds": compile_seconds, "run_seconds": time.perf_counter() - t0,
        "target": case.target, **_figures(case, golden, rtl, exact),
    }]
    if case.reference:
        ref = gemm_case(config, case.M, case.K, case.N, seed=seed)
        out_addr, want = ref.expected["out"]
        t0 = time.perf_counter()
        golden, rtl, exact = _run_both(config, ref.program, ref.dram, ref.program_addr,
                                       (out_addr, want.nbytes))
        rows.append({
            "case": case.name, "program": "gemm_case", "config": config.hash_hex,
            "dataflow": config.dataflow, "rows": config.rows, "cols": config.cols,
            "dma_data_bits": config.dma_data_bits, "M": case.M, "K": case.K, "N": case.N,
            "tiling": None, "compiler_estimate": None, "compile_seconds": 0.0,
            "run_seconds": time.perf_counter() - t0, "target": None,
            **_figures(case, golden, rtl, exact),
        })
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'case':<16} {'program':<9} {'rtl cyc':>9} {'util':>6} {'golden':>9} {'util':>6} "
            f"{'rtl/gold':>8} {'analyt.':>9} {'util':>6} {'<=':>3} {'ideal':>9} {'read ch.':>9} "
            f"{'bytes=':>6} {'exact':>5}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['case']:<16} {r['program']:<9} {r['rtl_cycles']:>9} {r['rtl_utilization']:>6.1%} "
            f"{r['golden_cycles']:>9} {r['golden_utilization']:>6.1%} {r['rtl_vs_golden']:>+8.1%} "
            f"{r['analytical_cycles']:>9} {r['analytical_utilization']:>6.1%} "
            f"{'yes' if r['rtl_le_analytical'] else 'no':>3} {r['ideal_cycles']:>9} "
            f"{r['read_channel_cycles']:>9} "
            f"{'yes' if r['dram_bytes_equal'] else 'no':>6} "
            f"{'yes' if r['bit_exact_rtl_vs_golden'] else 'NO':>5}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="*", choices=[c.name for c in CASES],
                        help="cases to run (default: all)")
    args = parser.parse_args(argv)
    chosen = [c for c in CASES if not args.cases or c.name in args.cases]
    rows = []
    for case in chosen:
        for row in measure(case):
            print(f"{case.name} ({row['program']}): {row['rtl_cycles']} cycles on the RTL, "
                  f"{row['rtl_utilization']:.1%}", file=sys.stderr)
            rows.append(row)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"target": TARGET, "results": rows}, indent=1) + "\n")
    print(_table(rows))
    failed = [r for r in rows if not r["bit_exact_rtl_vs_golden"]
              or (r["target"] is not None and r["rtl_utilization"] < r["target"])]
    for r in failed:
        print(f"{r['case']} ({r['program']}): "
              + ("RTL and golden outputs differ" if not r["bit_exact_rtl_vs_golden"] else
                 f"utilization {r['rtl_utilization']:.1%} below the target {r['target']:.0%}"),
              file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
