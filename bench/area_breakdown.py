"""Area of the whole accelerator, broken down per submodule, for one configuration.

The top level (``systolic.hw.generate.top_verilog``) is synthesized with yowasp yosys twice:

1. without flattening (``synth_ice40 -dsp -noflatten``, ``synth_ecp5 -noflatten``; LUTs mapped
   by classic ABC, as yowasp's ABC9 exits silently on this netlist), so that
   every Amaranth submodule stays a module of its own (Amaranth names each module after its
   instance path, ``systolic_top.core.load.reader``, so a module is one instance). ``stat`` then
   counts each module's own cells; a module's *total* adds the cells of every module below it.
   Module boundaries stop constant propagation and the removal of unused outputs, so these counts
   are an upper bound of each block's share, good for ranking blocks;
2. flattened, exactly as :func:`systolic.sim.tools.yosys_synth` does for the real design: the
   whole accelerator's true counts (``--no-flat`` skips this run).

Counts: LUT4s, carry cells (iCE40 SB_CARRY, ECP5 CCU2C), flip-flops, DSP blocks (SB_MAC16,
MULT18X18D/ALU54B), block RAMs (SB_RAM40_4K/SB_SPRAM256KA, DP16KD/PDPW16KD), and on ECP5 the
distributed-RAM cells (TRELLIS_DPR16X4).

Writes ``bench/results/area_breakdown_<family>_<R>x<C>.json`` (or ``--out``) and prints the table
of every module down to ``--depth`` levels below the top, largest first within each parent.
The default configuration is the small one of the FPGA-fit study: 8 KiB scratchpad, 2 KiB
accumulator, 16 table rows, a 32-bit DMA with 2 bursts in flight, every queue 2 deep; change any
field with ``--set name=value`` (TOML values: ``--set sfu_pooling=[]``). The two syntheses take
about 4 minutes for 2x2 and 10 for 4x4 on one free core (much longer on a busy machine).

Run from the repository root:
``python bench/area_breakdown.py --size 2x2 --family ice40 [--set field=value ...] [--depth 3]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from systolic.hw.config import AcceleratorConfig, ConfigError, parse_assignment, parse_size
from systolic.hw.generate import TOP_NAME, top_verilog
from systolic.sim.tools import (
    CELL_KINDS,
    SYNTH_FAMILIES,
    ToolError,
    raise_yosys_failure,
    report_tool_error,
    tool_env,
    yosys_command,
    yosys_synth,
)

__all__ = ["SMALL", "small_config", "breakdown", "main"]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"

#: Fields of the small configuration every run starts from (rows and cols come from ``--size``).
SMALL: dict[str, Any] = {
    "scratchpad_bytes": 8192, "accumulator_bytes": 2048, "requant_table_rows": 16,
    "dma_data_bits": 32, "dma_outstanding": 2,
    "load_queue_depth": 2, "compute_queue_depth": 2, "store_queue_depth": 2, "token_depth": 2,
}

#: Cell types per category and family: the ones ``yosys_synth`` counts.
_KINDS = CELL_KINDS


def small_config(rows: int, cols: int, **changes: Any) -> AcceleratorConfig:
    """The small configuration (:data:`SMALL`) with ``rows`` x ``cols`` PEs and ``changes``."""
    return AcceleratorConfig(rows=rows, cols=cols, **{**SMALL, **changes})


def _hierarchical_stat(verilog: str, family: str) -> dict[str, dict[str, int]]:
    """Cell counts by type of every module, synthesized without flattening."""
    # classic ABC for the LUTs: yowasp's in-process ABC9 exits silently on the unflattened netlist
    synth = f"{SYNTH_FAMILIES[family]} -noflatten -top {TOP_NAME}"
    if family == "ecp5":
        commands = [f"{synth} -run :map_luts", "techmap -map +/lattice/latches_map.v", "abc -lut 4",
                    "clean", f"{synth} -run map_cells:"]
    else:
        commands = [f"{synth} -run :map_luts", "techmap -map +/ice40/latches_map.v",
                    "ice40_wrapcarry -unwrap", "abc -dress -lut 4", "techmap -map +/ice40/ff_map.v",
                    "clean", "opt_lut -tech ice40", f"{synth} -run map_cells:"]
    with tempfile.TemporaryDirectory(prefix="area-breakdown-") as tmp:
        # yowasp tools see the working directory only: relative file names
        Path(tmp, "design.v").write_text(verilog)
        Path(tmp, "synth.ys").write_text("\n".join([
            "read_verilog -sv design.v", *commands, "tee -q -o stat.json stat -json"]) + "\n")
        result = subprocess.run([*yosys_command(), "-q", "-s", "synth.ys"], capture_output=True, text=True,
                                cwd=tmp, env=tool_env(), check=False)
        stat_path = Path(tmp, "stat.json")
        if result.returncode != 0 or not stat_path.is_file():
            raise_yosys_failure(result, f"yosys {synth.split()[0]} -noflatten")
        stat = json.loads(stat_path.read_text())
    return {name.lstrip("\\"): {str(k): int(v) for k, v in info.get("num_cells_by_type", {}).items()}
            for name, info in stat["modules"].items()}


def _count(cells: dict[str, int], family: str) -> dict[str, int]:
    return {kind: sum(cells.get(name, 0) for name in names) for kind, names in _KINDS[family].items()}


def breakdown(config: AcceleratorConfig, family: str, *, flat: bool = True) -> dict[str, Any]:
    """Per-module counts (``own`` and ``total`` with the modules below) of the accelerator for
    ``config`` on ``family``, and the flattened design's counts under ``flat`` (None when
    ``flat`` is false). Module names are instance paths below ``systolic_top``."""
    if family not in _KINDS:
        raise ValueError(f"family must be one of {', '.join(repr(f) for f in _KINDS)}, not {family!r}")
    verilog = top_verilog(config)
    start = time.monotonic()
    modules = _hierarchical_stat(verilog, family)
    seconds = {"hierarchical": round(time.monotonic() - start, 1)}
    own = {name: _count(cells, family) for name, cells in modules.items()}
    total: dict[str, dict[str, int]] = {}
    for name in own:
        below = [other for other in own if other == name or other.startswith(name + ".")]
        total[name] = {kind: sum(own[other][kind] for other in below) for kind in own[name]}
    result: dict[str, Any] = {
        "family": family,
        "config": config.to_dict(),
        "config_hash": config.hash_hex,
        "modules": {name: {"own": own[name], "total": total[name]} for name in sorted(own)},
        "flat": None,
    }
    if flat:
        start = time.monotonic()
        summary = yosys_synth(verilog, TOP_NAME, family)
        summary.pop("cells", None)
        seconds["flat"] = round(time.monotonic() - start, 1)
        result["flat"] = summary
    result["seconds"] = seconds
    return result


def _table(result: dict[str, Any], depth: int) -> list[str]:
    modules = result["modules"]
    kinds = list(next(iter(modules.values()))["total"])
    header = f"{'module (total, own LUT4 in brackets)':<50}" + "".join(f"{k:>8}" for k in kinds)
    lines = [header, "-" * len(header)]

    def walk(name: str, level: int) -> None:
        entry = modules[name]
        label = ("  " * level + (name.rsplit(".", 1)[-1] if level else name))
        label = f"{label} [{entry['own']['luts']}]"
        lines.append(f"{label:<50}" + "".join(f"{entry['total'][k]:>8}" for k in kinds))
        if level >= depth:
            return
        children = [other for other in modules
                    if other.startswith(name + ".") and "." not in other[len(name) + 1:]]
        for child in sorted(children, key=lambda c: -modules[c]["total"]["luts"]):
            walk(child, level + 1)

    walk(TOP_NAME, 0)
    if result["flat"] is not None:
        flat = result["flat"]
        lines.append("-" * len(header))
        lines.append(f"{'flattened (the real design)':<50}" + "".join(f"{flat.get(k, 0):>8}" for k in kinds))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="2x2", help="RxC array size (default 2x2)")
    parser.add_argument("--family", default="ice40", choices=sorted(_KINDS), help="FPGA family")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="change a config field (TOML value), repeatable")
    parser.add_argument("--depth", type=int, default=3, help="levels of submodules printed")
    parser.add_argument("--no-flat", action="store_true", help="skip the flattened synthesis")
    parser.add_argument("--out", type=Path, default=None, help="JSON results file")
    args = parser.parse_args(argv)

    changes: dict[str, Any] = {}
    try:
        rows, cols = parse_size(args.size)
        changes.update(parse_assignment(item) for item in args.set)
    except ConfigError as exc:
        parser.error(str(exc))
    config = small_config(rows, cols, **changes)
    print(f"{rows}x{cols} on {args.family}: synthesis ...", file=sys.stderr, flush=True)
    try:
        result = breakdown(config, args.family, flat=not args.no_flat)
    except ToolError as exc:
        return report_tool_error(parser.prog, exc)

    out = args.out or RESULTS / f"area_breakdown_{args.family}_{rows}x{cols}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print("\n".join(_table(result, args.depth)))
    print(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
