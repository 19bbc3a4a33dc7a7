"""ResNet-50 through the compiler and the golden model: compile time, cycles and utilization.

The model is onnx's ``onnx/backend/test/data/light/light_resnet50.onnx`` (installed with the
``onnx`` package): the ResNet-50 v1 graph with every weight a ConstantOfShape (all 0.02) and its
BatchNormalization statistics as initializers, at opset 9 -- converted to opset 13 here. The
compiler folds the constants, quantizes the float model with calibration on random inputs
(normal, seeded) and compiles it for each configuration below; one image then runs on the golden
model (hazard checks on), whose cycle estimate (docs/isa.md) gives the cycles, and whose output
is checked bit for bit against the compiler's reference executor.

Configurations (weight-stationary):

* ``8x8``: the default ``AcceleratorConfig()`` (64-bit DMA, 64 KiB scratchpad, 16 KiB
  accumulator);
* ``16x16``: rows = cols = 16 with a 128-bit DMA bus and a 64 KiB accumulator (an array twice as
  wide needs twice the operand bandwidth and accumulator rows to stay busy);
* ``16x16-small``: rows = cols = 16 with the default memories and bus, for comparison.

Writes ``bench/results/resnet50.json`` and prints a table. Run: ``python bench/resnet50.py``
(``--configs 16x16`` to run one; a few minutes per configuration on one core).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
from onnx import version_converter
from systolic.compiler.codegen import compile_graph
from systolic.compiler.frontend import load_model
from systolic.compiler.passes import HostFallbackWarning, optimize
from systolic.compiler.reference import execute
from systolic.compiler.runtime import run_model
from systolic.hw.config import AcceleratorConfig

MODEL = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_resnet50.onnx"
RESULTS = Path(__file__).parent / "results" / "resnet50.json"

CONFIGS = {
    "8x8": AcceleratorConfig(),
    "16x16": AcceleratorConfig(rows=16, cols=16, dma_data_bits=128, accumulator_bytes=64 * 1024),
    "16x16-small": AcceleratorConfig(rows=16, cols=16),
}


def load() -> onnx.ModelProto:
    """The light ResNet-50 at opset 13 (the compiler accepts opsets 11 to 21)."""
    if not MODEL.is_file():
        sys.exit(f"{MODEL}: not found; the installed onnx package has no light_resnet50 test model")
    model = version_converter.convert_version(onnx.load(MODEL), 13)
    model.ir_version = 8
    return model


def run(name: str, config: AcceleratorConfig, model: onnx.ModelProto, calibration: dict,
        image: dict) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostFallbackWarning)
        t0 = time.perf_counter()
        graph = optimize(load_model(model, config=config), calibration=calibration)
        t1 = time.perf_counter()
        compiled = compile_graph(graph)
        t2 = time.perf_counter()
    result = run_model(compiled, image)
    t3 = time.perf_counter()
    expected = execute(graph, image)
    exact = all(np.array_equal(result.outputs[k], expected[k]) for k in expected)
    report = result.report
    layers = [layer for layer in report["layers"] if not layer["host"]]
    worst = sorted(layers, key=lambda layer: layer["utilization"] if layer["macs"] else 2.0)[:5]
    return {
        "config": name,
        "rows": config.rows, "cols": config.cols, "dma_data_bits": config.dma_data_bits,
        "scratchpad_bytes": config.scratchpad_bytes, "accumulator_bytes": config.accumulator_bytes,
        "config_hash": config.hash_hex,
        "frontend_seconds": round(t1 - t0, 2),
        "compile_seconds": round(t2 - t1, 2),
        "golden_seconds": round(t3 - t2, 2),
        "instructions": sum(len(s.program.instructions) for s in compiled.segments),
        "syncs": sum(s.syncs for s in compiled.segments),
        "segments": len(compiled.segments),
        "accelerator_layers": len(layers),
        "host_nodes": [layer["op"] for layer in report["layers"] if layer["host"]],
        "dram_bytes": int(compiled.image.size),
        "cycles": report["cycles"],
        "estimated_cycles": sum(s.estimate for s in compiled.segments),
        "macs": report["macs"],
        "utilization": report["utilization"],
        "dram_read_bytes": report["dram_read_bytes"],
        "dram_write_bytes": report["dram_write_bytes"],
        "milliseconds_at_clock": report["cycles"] / config.clock_mhz / 1000,
        "bit_exact_vs_reference": exact,
        "lowest_utilization_layers": [{k: layer[k] for k in ("name", "cycles", "macs", "utilization")}
                                      for layer in worst],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--calibration-images", type=int, default=2)
    args = parser.parse_args(argv)
    model = load()
    rng = np.random.default_rng(0)
    name = model.graph.input[0].name
    calibration = {name: rng.standard_normal((args.calibration_images, 3, 224, 224)).astype(np.float32)}
    image = {name: rng.standard_normal((1, 3, 224, 224)).astype(np.float32)}
    rows = []
    for cname in args.configs:
        print(f"{cname}: compiling and running ...", file=sys.stderr, flush=True)
        rows.append(run(cname, CONFIGS[cname], model, calibration, image))
    previous = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    results = {r["config"]: r for r in previous.get("results", [])}
    results.update({r["config"]: r for r in rows})
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"model": str(MODEL.name), "cpu_count": os.cpu_count(),
                                   "results": list(results.values())}, indent=1) + "\n")
    head = (f"{'config':<12} {'compile s':>9} {'instr':>8} {'cycles':>11} {'estimate':>11} "
            f"{'util':>6} {'MB read':>8} {'exact':>5}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['config']:<12} {r['compile_seconds']:>9.1f} {r['instructions']:>8} "
              f"{r['cycles']:>11} {r['estimated_cycles']:>11} {r['utilization']:>6.1%} "
              f"{r['dram_read_bytes'] / 1e6:>8.1f} {str(r['bit_exact_vs_reference']):>5}")
    print(f"written {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
