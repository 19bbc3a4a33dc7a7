"""Size and speed of the SoC on the FPGA boards: the board presets and a sweep of array sizes.

For each board preset (``boards/presets/<board>.toml``), then for each array size of the sweep
on the sweep board (default ULX3S-85F: the ulx3s-85f preset with ``rows``/``cols`` replaced),
this runs the whole ``systolic synth`` flow (:func:`systolic.boards.synth.synth`: yosys, the
fit check, nextpnr, the bitstream packer) and records used LUT4s, flip-flops, DSP blocks and
block RAMs, the Fmax nextpnr reports for the clock the array runs on (the accelerator clock, or
the compute clock of a config with ``compute_clock_mhz``, whose control clock's Fmax is then a
column of its own), whether timing is met at the targets, and the peak throughput
``2 * R * C * Fmax`` (GOPS: one multiply and one add per PE per cycle, at the array's clock as
the routed design reaches it).

A sweep size needs more multipliers than the device has DSP blocks (256 PEs against the 85F's
156 MULT18X18D, beside the SFU's): the fit check says how many DSP blocks are missing, and
the size is run again with that many more PEs multiplying in logic
(``array_lut_multipliers``), up to every PE.

Config files (``--configs FILE,...``, e.g. ``examples/ulx3s-85f-16x16-2clk.toml``) are built
on the sweep board as they are, one row each (kind ``config``, the file in ``config_file``).

Writes ``bench/results/board_sweep.json`` (the rows and every synth report) and prints a table.
Each run takes minutes (a 16x16 SoC tens of minutes on a loaded two-core machine): run it in the
background, e.g. ``nohup python bench/board_sweep.py > board_sweep.log 2>&1 &``.

Run from the repository root: ``python bench/board_sweep.py [--boards icebreaker,...]
[--sweep-board ulx3s-85f] [--sizes 4x4,8x8,16x16] [--sweep-mhz F] [--set FIELD=VALUE ...]
[--configs FILE,...]
[--seed 1] [--placer heap] [--router router1] [--time-limit MIN] [--stop-after yosys|place] [--work DIR]
[--merge] [--merge-from FILE]``
(``--stop-after``: each flow ends after yosys or after placement, as ``systolic synth
--stop-after``, the row then has the resources and nextpnr's Fmax estimate after placement, ``~F``
in the table; ``--time-limit``: nextpnr is stopped after MIN minutes and the row records how far it got, its
stage, the arcs left to route and its Fmax estimate after placement; ``--placer``:
nextpnr's placer, heap or static, ``--router`` its router, router1 or router2, see
``systolic synth``; ``--set`` changes a field of every
sweep config, after ``rows``/``cols`` and the logic multipliers, so that
``--set array_lut_multipliers=56`` starts there; ``--merge`` keeps the rows of an earlier
results file that this run does not redo, ``--merge-from`` those of another run's file).
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from systolic.boards.boards import BOARDS, BoardError, FitError, get_board, load_preset
from systolic.boards.synth import PLACERS, ROUTERS, STOP_AFTER, PlaceRouteTimeout, RouteStalled, synth
from systolic.hw.config import AcceleratorConfig, ConfigError, parse_assignment, parse_size

__all__ = ["run_one", "main"]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "board_sweep.json"


def _row(kind: str, board: str, config: AcceleratorConfig, mhz: float, report: dict[str, Any] | None,
         error: str | None, seconds: float) -> dict[str, Any]:
    row: dict[str, Any] = {
        "kind": kind, "board": board, "rows": config.rows, "cols": config.cols,
        "dataflow": config.dataflow, "lut_multipliers": config.array_lut_multipliers,
        "bram_multipliers": config.array_bram_multipliers,
        "target_mhz": mhz, "config_hash": config.hash_hex, "seconds": round(seconds),
        "config": config.to_dict(),
    }
    if report is None:
        row["error"] = error
        return row
    resources = report["resources"]
    two_clocks = report["compute_target_mhz"] is not None
    array_clock = "compute" if two_clocks else "sync"
    if report["stage"] != "route":      # --stop-after: the figures up to there, no Fmax
        row.update({
            "stopped_after": report["stage"],
            "luts": resources["lut"]["used"], "ffs": resources["ff"]["used"],
            "dsps": resources["dsp"]["used"], "brams": resources["bram"]["used"],
            "sprams": resources["spram"]["used"] if "spram" in resources else 0,
            "logic_cells": resources["lc"]["used"] if "lc" in resources else None,     # iCE40
            "lut_percent": resources["lut"]["percent"],
            "target_mhz": report["compute_target_mhz"] if two_clocks else report["target_mhz"],
            "two_clocks": two_clocks, "control_target_mhz": report["target_mhz"],
            "placed_mhz": report["placed_mhz"].get(array_clock),
            "control_placed_mhz": report["placed_mhz"].get("sync"),
            "report": report,
        })
        return row
    fmax = report["fmax_mhz"][array_clock]
    row.update({
        "luts": resources["lut"]["used"], "ffs": resources["ff"]["used"],
        "dsps": resources["dsp"]["used"], "brams": resources["bram"]["used"],
        "sprams": resources["spram"]["used"] if "spram" in resources else 0,
        "logic_cells": resources["lc"]["used"] if "lc" in resources else None,     # iCE40
        "lut_percent": resources["lut"]["percent"],
        "target_mhz": report["compute_target_mhz"] if array_clock == "compute" else report["target_mhz"],
        "fmax_mhz": fmax,
        "timing_met": report["timing_met"], "two_clocks": array_clock == "compute",
        # a compute clock of its own: the control clock's figures (else the same as the array's)
        "control_target_mhz": report["target_mhz"], "control_fmax_mhz": report["fmax_mhz"]["sync"],
        "peak_gops": round(2 * config.rows * config.cols * fmax / 1000, 2),
        "report": report,
    })
    return row


def _stopped(row: dict[str, Any], stage: str, placed_mhz: dict[str, float],
             router2: dict[str, int] | None) -> dict[str, Any]:
    """``row`` of a flow stopped in ``stage`` (nextpnr's time limit, or router2 no longer
    converging), with how far it got: the placer's estimates (the array's clock, then the
    control clock's) and router2's progress."""
    row.update(stopped_in=stage, placed_mhz=placed_mhz.get("compute", placed_mhz.get("sync")),
               control_placed_mhz=placed_mhz.get("sync"), router2=router2)
    return row


def run_one(kind: str, board: str, config: AcceleratorConfig, work: Path, seed: int,
            clock_mhz: float | None = None, placer: str = "heap", router: str = "router1",
            time_limit: float | None = None, stop_after: str | None = None) -> dict[str, Any]:
    """Synthesize ``config`` on ``board`` (into ``work``) at ``clock_mhz`` (default: the
    config's); when only DSP blocks are short, again with that many more PEs multiplying in
    logic. nextpnr is stopped after ``time_limit`` seconds, and router2 when it stops converging
    (:data:`~systolic.boards.synth.ROUTE_PATIENCE`); the row then says how far it got;
    ``stop_after`` ("yosys" or "place") ends each flow there (the row has the resources and,
    after placement, nextpnr's estimate in ``placed_mhz``). Returns one table row."""
    started = time.monotonic()
    while True:
        mhz = config.array_clock_mhz if clock_mhz is None else clock_mhz
        print(f"{board}: {config.rows}x{config.cols} {config.dataflow}, "
              f"{config.array_lut_multipliers} logic multipliers, {mhz:g} MHz ...",
              file=sys.stderr, flush=True)
        try:
            report = synth(board, config, work / f"{board}-{config.rows}x{config.cols}", seed=seed,
                           clock_mhz=clock_mhz, placer=placer, router=router,
                           time_limit=time_limit, stop_after=stop_after)
            return _row(kind, board, config, mhz, report, None, time.monotonic() - started)
        except PlaceRouteTimeout as exc:     # not an Fmax: how far nextpnr got, also in fields
            row = _stopped(_row(kind, board, config, mhz, None, str(exc), time.monotonic() - started),
                           exc.stage, exc.placed_mhz, exc.router2)
            row.update(arcs_total=exc.arcs_total, arcs_left=exc.arcs_left, heap_stalled=exc.heap_stalled)
            return row
        except RouteStalled as exc:         # router2 stopped converging (synth's route_patience)
            return _stopped(_row(kind, board, config, mhz, None, str(exc), time.monotonic() - started),
                            "routing", exc.placed_mhz, exc.router2)
        except FitError as exc:
            pes = config.rows * config.cols
            if set(exc.over) != {"dsp"} or config.array_lut_multipliers == pes:
                return _row(kind, board, config, mhz, None, str(exc), time.monotonic() - started)
            needed, available = exc.over["dsp"]
            more = min(pes, config.array_lut_multipliers + needed - available)
            config = config.replace(array_lut_multipliers=more)
        except BoardError as exc:
            return _row(kind, board, config, mhz, None, str(exc), time.monotonic() - started)
        except Exception as exc:            # a tool or the gateware failed: record it, go on
            message = " ".join(f"{type(exc).__name__}: {exc}".split())
            return _row(kind, board, config, mhz, None, message[:500], time.monotonic() - started)


def _order(row: dict[str, Any]) -> tuple[str, int, str, str]:
    return row["kind"], row["rows"] * row["cols"], row["board"], row.get("config_file", "")


def _key(row: dict[str, Any]) -> tuple[str, str, int, int, str]:
    """What a row measured: a later run of the same key replaces it (``--merge``)."""
    return row["kind"], row["board"], row["rows"], row["cols"], row.get("config_file", "")


def _control(row: dict[str, Any]) -> str:
    """A config with a compute clock of its own: its control clock's Fmax / target (MHz)."""
    if not row.get("two_clocks"):
        return "-"
    if "stopped_after" in row:
        placed = row.get("control_placed_mhz")
        return "-" if placed is None else f"~{placed:.1f}/{row['control_target_mhz']:.1f}"
    return f"{row['control_fmax_mhz']:.1f}/{row['control_target_mhz']:.1f}"


def _fmax(row: dict[str, Any]) -> str:
    """The Fmax column: routed, or ``~`` nextpnr's estimate after placement, or ``-``."""
    if "stopped_after" not in row:
        return f"{row['fmax_mhz']:.1f}"
    return "-" if row.get("placed_mhz") is None else f"~{row['placed_mhz']:.1f}"


def _verdict(row: dict[str, Any]) -> str:
    if "stopped_after" in row:
        return {"yosys": "yosys", "place": "placed"}[row["stopped_after"]]
    return "met" if row["timing_met"] else "MISS"


def _table(rows: list[dict[str, Any]]) -> str:
    header = (f"{'kind':<7}{'board':<16}{'array':>7}{'lutmul':>7}{'LUT4':>8}{'LUT%':>6}{'FF':>8}"
              f"{'DSP':>5}{'BRAM':>5}{'Fmax':>8}{'target':>8}{'timing':>8}{'GOPS':>7}{'min':>5}"
              f"{'control':>16}  file")
    lines = [header, "-" * len(header)]
    for r in rows:
        size = f"{r['rows']}x{r['cols']}"
        if "error" in r:
            lines.append(f"{r['kind']:<7}{r['board']:<16}{size:>7}{r['lut_multipliers']:>7}  {r['error']}"
                         + (f"  ({r['config_file']})" if r.get("config_file") else ""))
            continue
        lines.append(
            f"{r['kind']:<7}{r['board']:<16}{size:>7}{r['lut_multipliers']:>7}{r['luts']:>8}"
            f"{r['lut_percent']:>5.0f}%{r['ffs']:>8}{r['dsps']:>5}{r['brams']:>5}{_fmax(r):>8}"
            f"{r['target_mhz']:>8.1f}{_verdict(r):>8}"
            f"{'-' if 'stopped_after' in r else format(r['peak_gops'], '.2f'):>7}"
            f"{r['seconds'] / 60:>5.0f}{_control(r):>16}  {r.get('config_file', '')}".rstrip())
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boards", default=",".join(BOARDS), help="comma-separated board presets "
                        "to build ('' for none)")
    parser.add_argument("--sweep-board", default="ulx3s-85f", help="board of the array-size sweep")
    parser.add_argument("--sizes", default="4x4,8x8,16x16", help="comma-separated RxC sizes ('' for none)")
    parser.add_argument("--sweep-mhz", type=float, default=None,
                        help="clock the sweep sizes target, MHz (default: the sweep board preset's); "
                             "a high target makes nextpnr report the highest Fmax it reaches")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="change a field of the sweep's configs (TOML value, applied after "
                             "rows/cols; repeatable); the presets are built as they are")
    parser.add_argument("--configs", default="", help="comma-separated config files (TOML) to build "
                        "on the sweep board as they are, a row each")
    parser.add_argument("--seed", type=int, default=1, help="nextpnr placement seed")
    parser.add_argument("--placer", choices=PLACERS, default="heap", help="nextpnr placer")
    parser.add_argument("--router", choices=ROUTERS, default="router1", help="nextpnr router")
    parser.add_argument("--time-limit", type=float, default=None, metavar="MIN",
                        help="stop nextpnr after MIN minutes per run; the row then records the stage "
                             "reached and nextpnr's estimate after placement (default: no limit)")
    parser.add_argument("--stop-after", choices=STOP_AFTER, default=None,
                        help="end each flow early, as systolic synth --stop-after: yosys (resources) "
                             "or place (also nextpnr's Fmax estimate after placement, shown as ~F)")
    parser.add_argument("--work", type=Path, default=None, help="keep the build directories here")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    parser.add_argument("--merge", action="store_true",
                        help="keep the rows of an existing results file that this run does not redo")
    parser.add_argument("--merge-from", type=Path, action="append", default=[], metavar="FILE",
                        help="also keep the rows of this results file (of another run) that this run "
                             "does not redo; repeatable")
    args = parser.parse_args(argv)
    if args.time_limit is not None and not args.time_limit > 0:
        parser.error(f"--time-limit must be a positive number of minutes, not {args.time_limit:g}")
    time_limit = None if args.time_limit is None else args.time_limit * 60

    # the presets and the sweep sizes, smallest array first; a sweep size equal to the sweep
    # board's preset is built once and reported in both rows
    # (kind, board, config, config file or "")
    jobs = [("preset", board, load_preset(board), "") for board in filter(None, args.boards.split(","))]
    sweep = get_board(args.sweep_board)
    base = load_preset(sweep).to_dict()
    try:
        changes = dict(parse_assignment(item) for item in args.set)
    except ConfigError as exc:
        parser.error(str(exc))
    for size in filter(None, args.sizes.split(",")):
        try:
            r, c = parse_size(size, flag="--sizes")
            config = AcceleratorConfig.from_dict({**base, "rows": r, "cols": c,
                                                  "array_lut_multipliers": 0, **changes}, source="--set")
        except ConfigError as exc:
            parser.error(str(exc))
        jobs.append(("sweep", sweep.name, config, ""))
    for name in filter(None, args.configs.split(",")):
        try:
            config = AcceleratorConfig.from_toml(name)
        except ConfigError as exc:      # names the file when it cannot be read or is not TOML
            parser.error(f"--configs: {exc}" if name in str(exc) else f"--configs: {name}: {exc}")
        jobs.append(("config", sweep.name, config, name))
    jobs.sort(key=lambda job: job[2].rows * job[2].cols)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    kept: dict[tuple[str, str, int, int, str], dict[str, Any]] = {}
    redo = {(kind, board, config.rows, config.cols, file) for kind, board, config, file in jobs}
    for source in [*([args.out] if args.merge and args.out.is_file() else []), *args.merge_from]:
        for row in json.loads(source.read_text())["results"]:
            key = _key(row)
            if key not in redo:
                kept[key] = row
    with tempfile.TemporaryDirectory(prefix="board-sweep-") as tmp:
        work = args.work or Path(tmp)
        for kind, board, config, file in jobs:
            twin = next((row for row in rows if row["board"] == board and row["kind"] != kind
                         and {kind, row["kind"]} == {"preset", "sweep"}
                         and (row["rows"], row["cols"]) == (config.rows, config.cols)
                         and args.sweep_mhz is None), None)
            if twin is not None:
                rows.append({**twin, "kind": kind})
            elif kind == "config":
                rows.append({**run_one(kind, board, config, work / kind / Path(file).stem, args.seed,
                                       None, args.placer, args.router, time_limit, args.stop_after),
                             "config_file": file})
            else:
                rows.append(run_one(kind, board, config, work / kind, args.seed,
                                    args.sweep_mhz if kind == "sweep" else None, args.placer, args.router,
                                    time_limit, args.stop_after))
            # written after every run: a long sweep that is stopped keeps what it measured
            merged = sorted([*kept.values(), *rows], key=_order)
            results = {"seed": args.seed, "placer": args.placer, "router": args.router, "results": merged}
            args.out.write_text(json.dumps(results, indent=1) + "\n")
            print(_table(rows), file=sys.stderr, flush=True)

    rows = sorted([*kept.values(), *rows], key=_order)
    print(_table(rows))
    print(f"results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
