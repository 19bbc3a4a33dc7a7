"""Firmware control (``control = "firmware"``, hw/fw_engine.py, the iCEBreaker preset's): cycles
against the golden model's estimate, and the iCEBreaker preset's fit with it and without.

1. **Catalogue.** Every program of ``sim/catalogue.py`` (but the 131073-deep GEMM) on the
   catalogue's 4x4 configuration ("ws4": a 128-byte scratchpad, so every dimension is tiled)
   under firmware control, in Verilator: RTL cycles (the accelerator's counter) against the
   golden model's estimate, which models the hardware control. Outputs and DRAM bytes must equal
   the golden model's.
2. **Digits CNN.** ``examples/digits_cnn_int8.onnx`` compiled for the iCEBreaker preset with
   128 KiB of DRAM (the board's 64 KiB of SoC memory is too small for it), one image through the
   runtime's rtl backend: cycles per image against the estimate, and the time at the preset's
   clock. Outputs must equal the golden model's.
3. **Fit.** ``systolic synth --board icebreaker`` for the preset (the core's RAM takes two of
   the four SPRAMs, the SoC memory the other two): logic cells, block RAMs, Fmax after place and
   route; beside it the preset with ``control = "hardware"`` and the four SPRAMs as SoC memory,
   which stops at the fit check.

Writes ``bench/results/firmware_control.json`` and prints a table. Run:
``python bench/firmware_control.py`` (Verilator builds of two configurations the first time:
minutes; ``--skip-fit`` leaves out part 3, one and a half minutes).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import systolic.compiler
from systolic.boards.boards import load_preset
from systolic.boards.synth import FitError, synth
from systolic.compiler import compile_model, run_model
from systolic.hw.config import AcceleratorConfig
from systolic.sim.catalogue import CATALOGUE, GEMM_INT32_WRAP
from systolic.sim.golden import run_golden
from systolic.sim.rtl import RTLJob, RTLRunner

RESULTS = Path(__file__).parent / "results" / "firmware_control.json"
#: The catalogue's "ws4" configuration under firmware control (tests/sim/test_rtl_firmware.py).
CATALOGUE_CONFIG = AcceleratorConfig(rows=4, cols=4, scratchpad_bytes=128, accumulator_bytes=2048,
                                     dma_data_bits=32, control="firmware", load_queue_depth=2,
                                     compute_queue_depth=4, store_queue_depth=2, token_depth=4,
                                     requant_table_rows=16)


def catalogue() -> dict[str, Any]:
    specs = [spec for spec in CATALOGUE if spec != GEMM_INT32_WRAP]
    cases = [spec.build(CATALOGUE_CONFIG) for spec in specs]
    goldens = [run_golden(CATALOGUE_CONFIG, case.program, case.dram) for case in cases]
    jobs = [RTLJob(case.program, case.dram, case.program_addr, 5000 * golden.cycles + 100_000)
            for case, golden in zip(cases, goldens, strict=True)]
    start = time.monotonic()
    outcomes = RTLRunner(CATALOGUE_CONFIG, seed=1).run_many(jobs)
    seconds = time.monotonic() - start
    rows = []
    for spec, golden, outcome in zip(specs, goldens, outcomes, strict=True):
        if isinstance(outcome, Exception):
            raise SystemExit(f"{spec.id}: {outcome}")
        if not np.array_equal(outcome.dram, golden.dram) or (
                outcome.dram_read_bytes, outcome.dram_write_bytes) != (golden.dram_read_bytes,
                                                                      golden.dram_write_bytes):
            raise SystemExit(f"{spec.id}: the RTL differs from the golden model")
        rows.append({"program": spec.id, "rtl_cycles": outcome.cycles, "estimate": golden.cycles,
                     "ratio": round(outcome.cycles / golden.cycles, 1)})
    total_rtl = sum(r["rtl_cycles"] for r in rows)
    total_est = sum(r["estimate"] for r in rows)
    return {"config": CATALOGUE_CONFIG.to_dict(), "programs": rows, "rtl_cycles": total_rtl,
            "estimate": total_est, "ratio": round(total_rtl / total_est, 1),
            "max_ratio": max(r["ratio"] for r in rows), "simulator_seconds": round(seconds, 1)}


def digits(config: AcceleratorConfig) -> dict[str, Any]:
    model = Path(systolic.compiler.__file__).parents[1] / "examples" / "digits_cnn_int8.onnx"
    compiled = compile_model(model, config=config)
    image = np.random.default_rng(0).uniform(0, 1, (1, 1, 8, 8)).astype(np.float32)
    golden = run_model(compiled, {"input": image}, progress=False)
    rtl = run_model(compiled, {"input": image}, backend="rtl", progress=False)
    if not np.array_equal(rtl.outputs["logits"], golden.outputs["logits"]):
        raise SystemExit("digits: the RTL's logits differ from the golden model's")
    cycles = rtl.report["cycles"]
    return {"rtl_cycles": cycles, "estimate": golden.report["cycles"],
            "ratio": round(cycles / golden.report["cycles"], 1), "macs": rtl.report["macs"],
            "seconds_per_image_at_clock": round(cycles / (config.clock_mhz * 1e6), 3),
            "clock_mhz": config.clock_mhz}


def fit(config: AcceleratorConfig) -> dict[str, Any]:
    """The fit check's figures (nextpnr's packed logic cells and yosys' block RAMs), and for a
    design that fits, the placed and routed one's resources and Fmax."""
    with tempfile.TemporaryDirectory(prefix="fw-fit-") as tmp:
        try:
            report = synth("icebreaker", config, tmp)
        except FitError as exc:
            needs = {kind: (int(n), int(has)) for n, kind, has in
                     re.findall(r"needs (\d+) ([\w ()+]+?), the device has (\d+)", str(exc))}
            return {"fits": False, "message": str(exc), "needs": needs}
    return {"fits": True, "resources": {kind: r["used"] for kind, r in report["resources"].items()},
            "fmax_mhz": report["fmax_mhz"]["sync"], "timing_met": report["timing_met"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--skip-fit", action="store_true", help="leave out the synthesis (part 3)")
    args = parser.parse_args(argv)
    preset = load_preset("icebreaker")
    result: dict[str, Any] = {"catalogue": catalogue(),
                              "digits": digits(preset.replace(dram_bytes=128 * 1024))}
    if not args.skip_fit:
        result["fit"] = {"firmware control (the preset)": fit(preset),
                         "hardware control, 128 KiB SoC memory": fit(preset.replace(control="hardware",
                                                                                   dram_bytes=128 * 1024))}
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")

    cat, dig = result["catalogue"], result["digits"]
    print("| workload | RTL cycles | golden estimate | ratio |")
    print("|---|---|---|---|")
    print(f"| catalogue, {len(cat['programs'])} programs, 4x4 | {cat['rtl_cycles']} | {cat['estimate']} | "
          f"{cat['ratio']} (max {cat['max_ratio']}) |")
    print(f"| digits CNN, 1 image, iCEBreaker preset | {dig['rtl_cycles']} | {dig['estimate']} | "
          f"{dig['ratio']} ({dig['seconds_per_image_at_clock']} s at {dig['clock_mhz']} MHz) |")
    for name, outcome in result.get("fit", {}).items():
        if outcome["fits"]:
            print(f"iCEBreaker preset, {name}: fits, {outcome['resources']}, Fmax "
                  f"{outcome['fmax_mhz']} MHz (timing {'met' if outcome['timing_met'] else 'NOT met'})")
        else:
            needs = "; ".join(f"{kind} {n} of {has}" for kind, (n, has) in outcome["needs"].items())
            print(f"iCEBreaker preset, {name}: does not fit: {needs}")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
