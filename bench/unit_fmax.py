"""Standalone Fmax and area of one gateware unit (out of context), in a minute instead of the
half hour a whole SoC takes.

The unit (an entry of :data:`UNITS`, built for one ``AcceleratorConfig``) is placed in a harness
that registers every port, so that only the unit's own register-to-register paths count:

* every input port bit is a flip-flop of one long shift register fed from the pin ``din``;
* every output port bit is captured in a flip-flop, and the captured bits are loaded (pin
  ``load``) into a second shift register that leaves on the pin ``dout`` (so synthesis keeps all
  of them, and the harness adds one LUT level after the capture registers).

The harness is synthesized with yowasp yosys (``synth_ecp5`` / ``synth_ice40 -dsp``) and placed
and routed with yowasp nextpnr (ECP5: ``--25k --package CSFBGA285`` or ``--85k --package
CABGA381``; iCE40: ``--up5k --package sg48``) at ``--mhz`` (default 100 on ECP5, 24 on iCE40).
The table shows nextpnr's achieved Fmax and its critical path (source and sink cells, logic
levels, logic and routing delay). ``--area`` also synthesizes the bare unit (no harness) and
reports its LUT4 / carry / FF / DSP / block-RAM counts, the figures of ``bench/area_breakdown.py``
for one unit.

``--baseline REV`` measures the units of git revision REV instead (its ``hw/`` package, taken with
``git archive``; the configuration class stays the working tree's), labelled REV unless
``--label`` is given: before/after figures from one command line each.

Results are merged into ``bench/results/unit_fmax.json`` (or ``--out``), one entry per unit,
family, device, configuration and ``--label`` (a later run replaces the entry with the same key).

Run from the repository root, e.g.
``python bench/unit_fmax.py --unit gather_reader --family ecp5 --size 4x4 --set dma_data_bits=64``
or, with a preset and the area of the bare unit,
``python bench/unit_fmax.py --unit scatter_writer --family ice40 --preset icebreaker --area``.
Several ``--unit`` options run one after another (never two nextpnr at a time).
"""

from __future__ import annotations

import argparse
import fcntl
import importlib
import inspect
import json
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from amaranth import (
    Cat,
    ClockDomain,
    ClockSignal,
    Const,
    DomainRenamer,
    Elaboratable,
    Module,
    Mux,
    ResetSignal,
    Signal,
    Value,
)
from amaranth.back import verilog as amaranth_verilog
from amaranth.lib import wiring
from amaranth.lib.wiring import Flow
from systolic.hw.config import AcceleratorConfig, ConfigError, parse_assignment, parse_size
from systolic.sim.tools import ToolError, report_tool_error, to_verilog, tool_env, yosys_synth

__all__ = ["UNITS", "DEVICES", "Harness", "FamilyPlatform", "measure", "main"]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PRESETS = ROOT / "boards" / "presets"


def _build(module: str, name: str, *args: Callable[[AcceleratorConfig], Any], takes_config: bool = True,
           **kwargs: Callable[[AcceleratorConfig], Any]) -> Callable[[AcceleratorConfig], wiring.Component]:
    """A factory of ``systolic.<module>.<name>``, imported when built: called with the config
    (``takes_config`` and no ``args`` / ``kwargs``), else with the values of ``args`` / ``kwargs``
    (functions of the config)."""
    def make(config: AcceleratorConfig) -> wiring.Component:
        cls = getattr(importlib.import_module(f"systolic.{module}"), name)
        if takes_config and not args and not kwargs:
            return cls(config)
        # (a --baseline revision's class may take fewer keywords: it is built as it was then, and
        # says so)
        accepted = inspect.signature(cls).parameters
        for k in kwargs.keys() - accepted.keys():
            print(f"unit_fmax: this revision's {name} takes no keyword {k!r}; built without it",
                  file=sys.stderr)
        return cls(*(f(config) for f in args), **{k: f(config) for k, f in kwargs.items() if k in accepted})
    return make


def _counter_increment_bits(config: AcceleratorConfig) -> int:
    from systolic.hw.top import counter_increment_bits
    return counter_increment_bits(config)


def _store_read_queue(config: AcceleratorConfig) -> int:
    from systolic.hw.accumulator import store_read_queue
    return store_read_queue(config)


def _accumulator_forwards(config: AcceleratorConfig) -> bool:
    from systolic.hw.units import accumulator_forwards
    return accumulator_forwards(config)


#: Units by name: a function from the configuration to the component (the accumulator and the
#: compute core as the accelerator builds them: its read queue for the store path, forwarding
#: only for the output-stationary dataflow).
UNITS: dict[str, Callable[[AcceleratorConfig], wiring.Component]] = {
    "gather_reader": _build("hw.dma", "GatherReader"),          # LOAD and residual reads
    "scatter_writer": _build("hw.dma", "ScatterWriter"),        # STORE writes
    "load_unit": _build("hw.units", "LoadUnit"),                # GatherReader + row converters
    "sfu": _build("hw.sfu", "SpecialFunctionUnit"),
    "store_unit": _build("hw.units", "StoreUnit"),              # SFU + ScatterWriter + walk
    "requant_table": _build("hw.requant_table", "RequantTable"),
    "accumulator": _build("hw.accumulator", "Accumulator", lambda c: c, read_queue=_store_read_queue,
                          forwarding=_accumulator_forwards),
    "compute_unit": _build("hw.units", "ComputeUnit"),
    # the compute unit, scratchpad, accumulator and array together (hw/compute_core.py)
    "compute_core": _build("hw.compute_core", "ComputeCore", lambda c: c, acc_read_queue=_store_read_queue),
    "fetcher": _build("hw.controller", "Fetcher"),
    "dispatcher": _build("hw.controller", "Dispatcher"),       # + its three instruction queues
    "sequencer": _build("hw.controller", "Sequencer", takes_config=False),
    "csr": _build("hw.csr", "CSRBank", lambda c: c.hash, counter_bits=lambda c: c.counter_bits,
                  increment_bits=_counter_increment_bits),     # with the counters
    "soc_memory": _build("boards.memory", "SoCMemory", memory_bytes=lambda c: c.dram_bytes,
                         data_width=lambda c: c.dma_data_bits),   # block RAM, with its arbiter
    # generic elaboration (yosys infers the DSP blocks): the ECP5 array is bench/array_synth.py's
    "array": _build("hw.array", "SystolicArray"),
    "pe_logic": _build("hw.pe", "ProcessingElement", lambda c: c, multiplier=lambda c: "logic"),
}

#: nextpnr device arguments per (family, device name).
DEVICES: dict[tuple[str, str], tuple[str, ...]] = {
    ("ecp5", "25k"): ("--25k", "--package", "CSFBGA285"),
    ("ecp5", "85k"): ("--85k", "--package", "CABGA381"),
    ("ice40", "up5k"): ("--up5k", "--package", "sg48"),
}
_DEFAULT_DEVICE = {"ecp5": "25k", "ice40": "up5k"}
_DEFAULT_MHZ = {"ecp5": 100.0, "ice40": 24.0}
_NEXTPNR = {"ecp5": "NEXTPNR_ECP5", "ice40": "NEXTPNR_ICE40"}


class Harness(Elaboratable):
    """``unit`` with every port registered: inputs from a shift register fed by ``din``, outputs
    captured and shifted out on ``dout`` (parallel load two cycles after ``load``; the unit's reset
    is a register of the harness's; the harness's registers are reset-less). Sizes: ``in_bits``
    and ``out_bits``, the unit's input and output port bits."""

    def __init__(self, unit: wiring.Component):
        if not isinstance(unit, wiring.Component):
            raise TypeError(f"unit must be an amaranth wiring.Component, not {unit!r}")
        self.unit = unit
        self.din = Signal()
        self.load = Signal()
        self.dout = Signal()
        # constant members (an always_ready stream's ready) are neither driven nor captured
        ports = [(member, Value.cast(value)) for _, member, value in unit.signature.flatten(unit)
                 if not isinstance(Value.cast(value), Const)]
        self._inputs = [value for member, value in ports if member.flow == Flow.In]
        self._outputs = [value for member, value in ports if member.flow != Flow.In]
        self.in_bits = sum(len(v) for v in self._inputs)
        self.out_bits = sum(len(v) for v in self._outputs)

    def elaborate(self, platform: Any) -> Module:
        m = Module()
        # The unit runs in the domain ``unit``: the same clock, its reset a register of sync's
        # (as behind a reset synchronizer), so that no path from the reset pin is timed.
        m.domains.unit = ClockDomain("unit")
        m.d.comb += ClockSignal("unit").eq(ClockSignal("sync"))
        m.d.sync += ResetSignal("unit").eq(ResetSignal("sync"))
        m.submodules.unit = DomainRenamer("unit")(self.unit)
        # ``load`` fans out to every capture bit: two registers between the pin and that net. The
        # harness's own registers have no reset (only the unit's reset register sees the reset
        # pin), so that nextpnr never reports a path from the pin as the critical one.
        load = Signal(2, reset_less=True)
        m.d.sync += load.eq(Cat(self.load, load[0]))
        chain = Signal(max(1, self.in_bits), reset_less=True)
        m.d.sync += chain.eq(Cat(self.din, chain[:-1]))
        offset = 0
        for value in self._inputs:
            m.d.comb += value.eq(chain[offset:offset + len(value)])
            offset += len(value)
        captured = Signal(max(1, self.out_bits), reset_less=True)
        shifter = Signal(max(1, self.out_bits), reset_less=True)
        m.d.sync += [captured.eq(Cat(*self._outputs)),
                     shifter.eq(Mux(load[1], captured, shifter >> 1))]
        m.d.comb += self.dout.eq(shifter[0])
        return m


def _nextpnr(family: str) -> list[str]:
    name = tool_env()[_NEXTPNR[family]]
    found = shutil.which(name)
    if found is None:
        raise ToolError(f"nextpnr not found: {_NEXTPNR[family]} is {name!r}, which is not on PATH "
                        f"(pip install yowasp-nextpnr-{family})")
    return [found]


def _critical_path(report: dict[str, Any]) -> dict[str, Any]:
    """The worst register-to-register path of nextpnr's JSON report: its end points, delay (ns),
    logic levels and the logic/routing split."""
    paths = [p for p in report.get("critical_paths", []) if p.get("path")]
    if not paths:
        return {}
    worst = max(paths, key=lambda p: sum(step.get("delay", 0.0) for step in p["path"]))
    steps = worst["path"]
    logic = sum(s["delay"] for s in steps if s.get("type") != "routing")
    routing = sum(s["delay"] for s in steps if s.get("type") == "routing")
    return {
        "from": steps[0].get("from", {}).get("cell", "?"),
        "to": steps[-1].get("to", {}).get("cell", "?"),
        "delay_ns": round(logic + routing, 3),
        "logic_ns": round(logic, 3),
        "routing_ns": round(routing, 3),
        "levels": sum(1 for s in steps if s.get("type") == "logic"),
        "nets": [s.get("net", "") for s in steps if s.get("type") == "routing"],
    }


class FamilyPlatform:
    """Stands in for an Amaranth platform of ``family`` (``"ecp5"``, ``"ice40"``): the units read
    only ``platform.family``, to instantiate that family's primitives where inference would be
    slower (ECP5: the array's stall-tree TRELLIS_FFs, the SoC memory's DP16KD output registers),
    so a unit is measured as it is built for a board."""

    def __init__(self, family: str) -> None:
        self.family = family


def measure(unit_name: str, config: AcceleratorConfig, family: str, *, device: str | None = None,
            mhz: float | None = None, area: bool = False, fmax: bool = True, seed: int = 1
            ) -> dict[str, Any]:
    """Fmax (nextpnr, in the registered harness) and, with ``area``, the bare unit's cell
    counts for ``unit_name`` (a key of :data:`UNITS`) built for ``config`` on ``family``."""
    if unit_name not in UNITS:
        raise ValueError(f"unit must be one of {', '.join(sorted(UNITS))}, not {unit_name!r}")
    device = device or _DEFAULT_DEVICE[family]
    if (family, device) not in DEVICES:
        known = ", ".join(d for f, d in DEVICES if f == family)
        raise ValueError(f"device for {family} must be one of {known}, not {device!r}")
    mhz = mhz or _DEFAULT_MHZ[family]
    result: dict[str, Any] = {"unit": unit_name, "family": family, "device": device,
                              "target_mhz": mhz, "config_hash": config.hash_hex,
                              "config": config.to_dict()}
    seconds: dict[str, float] = {}
    if area:
        start = time.monotonic()
        bare = to_verilog(UNITS[unit_name](config), "unit", platform=FamilyPlatform(family))
        summary = yosys_synth(bare, "unit", family)
        summary.pop("cells", None)
        result["area"] = summary
        seconds["area"] = round(time.monotonic() - start, 1)
    if fmax:
        harness = Harness(UNITS[unit_name](config))
        text = amaranth_verilog.convert(harness, name="harness", emit_src=False,
                                        ports=[harness.din, harness.load, harness.dout],
                                        platform=FamilyPlatform(family))
        result["harness_bits"] = {"in": harness.in_bits, "out": harness.out_bits}
        with tempfile.TemporaryDirectory(prefix="unit-fmax-") as tmp:
            start = time.monotonic()
            netlist = Path(tmp, "netlist.json")
            synth = yosys_synth(text, "harness", family, netlist=netlist)
            synth.pop("cells", None)
            result["harness_synth"] = synth
            seconds["synth"] = round(time.monotonic() - start, 1)
            start = time.monotonic()
            # yowasp tools see the working directory only: relative file names
            command = [*_nextpnr(family), *DEVICES[(family, device)], "--json", "netlist.json",
                       "--report", "report.json", "--freq", f"{mhz:g}", "--seed", str(seed)]
            command.append("--lpf-allow-unconstrained" if family == "ecp5"
                           else "--pcf-allow-unconstrained")
            run = subprocess.run(command, capture_output=True, text=True, cwd=tmp, env=tool_env(),
                                 check=False)
            report_path = Path(tmp, "report.json")
            if not report_path.is_file():
                tail = "\n".join((run.stdout + run.stderr).strip().splitlines()[-20:])
                raise ToolError(f"nextpnr for {unit_name!r} failed with status {run.returncode}:\n{tail}")
            report = json.loads(report_path.read_text())
            seconds["pnr"] = round(time.monotonic() - start, 1)
        clocks = report.get("fmax", {})
        achieved = min((c["achieved"] for c in clocks.values()), default=None)
        result["fmax_mhz"] = None if achieved is None else round(achieved, 2)
        result["critical_path"] = _critical_path(report)
        result["utilization"] = {k: v for k, v in report.get("utilization", {}).items()
                                 if v.get("used")}
    result["seconds"] = seconds
    return result


def _use_revision(rev: str) -> None:
    """Import the ``hw`` modules of git revision ``rev`` from now on (the already imported
    ``systolic.hw.config`` stays)."""
    import systolic.hw
    target = Path(tempfile.mkdtemp(prefix="unit-fmax-rev-"))
    archive = subprocess.run(["git", "archive", rev, "hw"], cwd=ROOT, capture_output=True, check=False)
    if archive.returncode != 0:
        raise ToolError(f"git archive {rev} hw failed: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    systolic.hw.__path__ = [str(target / "hw")]


def _config(args: argparse.Namespace, parser: argparse.ArgumentParser) -> AcceleratorConfig:
    values: dict[str, Any] = {}
    if args.preset:
        path = Path(args.preset)
        if not path.is_file():
            path = PRESETS / f"{args.preset}.toml"
        if not path.is_file():
            known = ", ".join(sorted(p.stem for p in PRESETS.glob("*.toml")))
            parser.error(f"--preset must be a TOML file or one of {known}, not {args.preset!r}")
        values.update(tomllib.loads(path.read_text()))
    if args.size:
        try:
            rows, cols = parse_size(args.size)
        except ConfigError as exc:
            parser.error(str(exc))
        values.update(rows=rows, cols=cols)
    try:
        values.update(parse_assignment(item) for item in args.set)
    except ConfigError as exc:
        parser.error(str(exc))
    return AcceleratorConfig.from_dict(values, source="--set")


def _merge(out: Path, entries: list[dict[str, Any]]) -> None:
    """Add ``entries`` to the JSON list in ``out``, replacing those with the same key."""
    out.parent.mkdir(parents=True, exist_ok=True)
    lock_path = Path(tempfile.gettempdir()) / f"{out.name}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        old = json.loads(out.read_text()) if out.is_file() else []

        def key(e: dict[str, Any]) -> tuple[Any, ...]:
            return (e["unit"], e["family"], e["device"], e["config_hash"], e.get("label", ""))

        new_keys = {key(e) for e in entries}
        merged = [e for e in old if key(e) not in new_keys] + entries
        out.write_text(json.dumps(merged, indent=1) + "\n")


def _row(entry: dict[str, Any]) -> str:
    cfg = entry["config"]
    area = entry.get("area", {})
    path = entry.get("critical_path", {})
    fmax = entry.get("fmax_mhz")
    where = f"{path.get('from', '')} -> {path.get('to', '')}" if path else ""
    return (f"{entry['unit']:<16}{entry.get('label', ''):<10}{cfg['rows']}x{cfg['cols']:<5}"
            f"{cfg['dma_data_bits']:>4} {entry['family']:<6}{entry['device']:<6}"
            f"{'' if fmax is None else f'{fmax:.1f}':>7}"
            f"{path.get('delay_ns', ''):>8}{path.get('levels', ''):>4}"
            f"{area.get('luts', ''):>7}{area.get('ffs', ''):>7}{area.get('dsps', ''):>5}"
            f"{area.get('brams', ''):>5}  {where}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unit", action="append", required=True, choices=sorted(UNITS),
                        help="unit to measure (repeatable)")
    parser.add_argument("--family", default="ecp5", choices=("ecp5", "ice40"))
    parser.add_argument("--device", default=None, help="25k or 85k (ECP5), up5k (iCE40)")
    parser.add_argument("--mhz", type=float, default=None, help="nextpnr target clock, MHz")
    parser.add_argument("--preset", default=None, help="boards/presets name or TOML file to start from")
    parser.add_argument("--size", default=None, help="RxC array size")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="change a config field (TOML value), repeatable")
    parser.add_argument("--area", action="store_true", help="also synthesize the bare unit for its area")
    parser.add_argument("--no-fmax", action="store_true", help="area only (no harness, no nextpnr)")
    parser.add_argument("--seed", type=int, default=1, help="nextpnr placement seed")
    parser.add_argument("--label", default="", help="tag of this run in the results (e.g. before)")
    parser.add_argument("--baseline", default=None, metavar="REV",
                        help="measure the hw/ of git revision REV (labelled REV)")
    parser.add_argument("--out", type=Path, default=RESULTS / "unit_fmax.json", help="JSON results file")
    args = parser.parse_args(argv)
    if args.no_fmax and not args.area:
        parser.error("--no-fmax needs --area (nothing to measure otherwise)")
    config = _config(args, parser)
    entries = []
    try:
        if args.baseline:
            _use_revision(args.baseline)
            args.label = args.label or args.baseline
        for unit in args.unit:
            entry = measure(unit, config, args.family, device=args.device, mhz=args.mhz,
                            area=args.area, fmax=not args.no_fmax, seed=args.seed)
            entry["label"] = args.label
            entries.append(entry)
            print(f"{unit}: done in {sum(entry['seconds'].values()):.0f} s", file=sys.stderr)
    except ToolError as exc:                    # the units measured so far are kept
        if entries:
            _merge(args.out, entries)
        return report_tool_error(parser.prog, exc)
    _merge(args.out, entries)
    print(f"{'unit':<16}{'label':<10}{'size':<6}{'bus':>4} {'family':<6}{'dev':<6}{'Fmax':>7}"
          f"{'ns':>8}{'lvl':>4}{'LUT4':>7}{'FF':>7}{'DSP':>5}{'BRAM':>5}  critical path")
    for entry in entries:
        print(_row(entry))
    return 0


if __name__ == "__main__":
    sys.exit(main())
