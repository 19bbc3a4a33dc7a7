"""The ``systolic`` command line.

Each subcommand is one ``_add_<name>`` function that declares its arguments and one
``_cmd_<name>`` function that runs it, both listed in :data:`_COMMANDS`: config, asm, disasm, generate,
synth, compile, run and demo. Later subcommands are added the same way.

Every user error — a bad config, a malformed program, a missing file, a bad flag — prints one
line ``systolic: error: <message>`` on stderr and returns 1 (2 for command-line usage), never a
traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, NoReturn

from systolic.compiler.asm import AsmError, assemble, disassemble
from systolic.hw.config import AcceleratorConfig, ConfigError, field_docs, parse_assignment
from systolic.hw.isa import ISA_VERSION, IsaError, Program, ProgramError

__all__ = ["main", "build_parser", "config_fields_markdown", "derived_quantities", "UsageError"]

PROG = "systolic"


class UsageError(ValueError):
    """The command line itself is wrong (unknown flag, missing argument, malformed --set)."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one-line :class:`UsageError` exceptions, so that
    :func:`main` reports them like every other error instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


# -- helpers shared by subcommands -----------------------------------------------------------------

def _read_bytes(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise OSError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None


def _read_text(path: Path, what: str) -> str:
    blob = _read_bytes(path, what)
    try:
        return blob.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: {what} must be UTF-8 text (byte {exc.start} is not)") from None


def _write_bytes(path: Path, blob: bytes, what: str) -> None:
    try:
        path.write_bytes(blob)
    except OSError as exc:
        raise OSError(f"{path}: cannot write {what}: {exc.strerror or exc}") from None


def _load_config(path: str | None) -> AcceleratorConfig:
    """The config in TOML file ``path``, or the default config when ``path`` is None."""
    return AcceleratorConfig() if path is None else AcceleratorConfig.from_toml(path)


def _parse_override(text: str) -> tuple[str, Any]:
    """``field=value`` from ``--set`` (:func:`~systolic.hw.config.parse_assignment`)."""
    try:
        return parse_assignment(text)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def derived_quantities(config: AcceleratorConfig) -> dict[str, Any]:
    """Every derived property of ``config`` (as :class:`AcceleratorConfig` defines them), by name."""
    out: dict[str, Any] = {}
    for name in dir(type(config)):
        is_property = isinstance(getattr(type(config), name), property)
        if not is_property or name.startswith("_") or name in ("hash", "hash_hex"):
            continue
        value = getattr(config, name)
        out[name] = list(value) if isinstance(value, tuple) else value
    return out


def config_fields_markdown() -> str:
    """The Markdown table of every config field with its type, default and meaning, as the
    README shows it (``systolic config --help-fields`` prints it)."""
    docs = field_docs()
    defaults = {}
    for line in AcceleratorConfig().to_toml().splitlines():
        if not line.startswith("#"):
            name, _, value = line.partition(" = ")
            defaults[name] = value
    lines = ["| field | type | default | meaning |", "|---|---|---|---|"]
    for f in fields(AcceleratorConfig):
        kind = {"tuple[str, ...]": "list of str"}.get(str(f.type), str(f.type))
        lines.append(f"| `{f.name}` | {kind} | `{defaults[f.name]}` | {docs[f.name]} |")
    return "\n".join(lines) + "\n"


# -- systolic config -------------------------------------------------------------------------------

def _add_config(sub: Any) -> None:
    p = sub.add_parser("config", help="check and show an accelerator configuration",
                       description="Load a config (the default one without FILE), apply --set "
                                   "overrides, validate it and print it with its derived quantities.")
    p.add_argument("file", nargs="?", metavar="FILE", help="TOML config file (default: built-in defaults)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override one field; VALUE is a TOML value (16, true, \"os\", [\"relu\"]) "
                        "or a bare word; repeatable")
    p.add_argument("--json", action="store_true", help="print JSON (fields, hash, derived) instead of text")
    p.add_argument("--out", metavar="FILE.toml", help="also save the resolved config as TOML")
    p.add_argument("--help-fields", action="store_true",
                   help="print the table of config fields with defaults and meanings, then exit")


def _cmd_config(args: argparse.Namespace) -> int:
    if args.help_fields:
        print(config_fields_markdown(), end="")
        return 0
    config = _load_config(args.file)
    if args.overrides:
        values = config.to_dict()
        values.update(_parse_override(text) for text in args.overrides)
        config = AcceleratorConfig.from_dict(values, source="--set")
    if args.out is not None:
        _write_bytes(Path(args.out), config.to_toml().encode(), "config")
    if args.json:
        print(json.dumps({"fields": config.to_dict(), "hash": config.hash_hex,
                          "derived": derived_quantities(config)}, indent=2))
    else:
        print(config.describe())
    return 0


# -- systolic asm / disasm -------------------------------------------------------------------------

def _add_asm(sub: Any) -> None:
    p = sub.add_parser("asm", help="assemble a program into a binary",
                       description="Assemble PROG.s (docs/isa.md, Assembly) into a program binary whose "
                                   "header carries the config hash.")
    p.add_argument("source", metavar="PROG.s", help="assembly source file")
    p.add_argument("-o", "--output", required=True, metavar="PROG.bin", help="program binary to write")
    p.add_argument("--config", metavar="FILE", help="TOML config the program is for (default: built-in)")


def _cmd_asm(args: argparse.Namespace) -> int:
    config = _load_config(args.config)
    path = Path(args.source)
    instructions = assemble(_read_text(path, "assembly source"), source=str(path))
    program = Program(tuple(instructions), config.hash)
    _write_bytes(Path(args.output), program.to_bytes(), "program")
    print(f"{args.output}: {len(instructions)} instructions for config {config.hash_hex}")
    return 0


def _add_disasm(sub: Any) -> None:
    p = sub.add_parser("disasm", help="print a program binary as assembly",
                       description="Print the canonical assembly of a program binary, header as a comment.")
    p.add_argument("binary", metavar="PROG.bin", help="program binary")
    p.add_argument("--config", metavar="FILE",
                   help="TOML config; the program's config hash must match it")


def _cmd_disasm(args: argparse.Namespace) -> int:
    path = Path(args.binary)
    program = Program.from_bytes(_read_bytes(path, "program"), source=str(path))
    if args.config is not None:
        try:
            program.check_config(_load_config(args.config))
        except ProgramError as exc:
            raise ProgramError(f"{path}: {exc}") from None
    print(f"# systolic program: ISA version {ISA_VERSION}, config {program.config_hash:016x}, "
          f"{len(program.instructions)} instructions")
    print(disassemble(program.instructions), end="")
    return 0


# -- systolic compile / run -----------------------------------------------------------------------

def _parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``name=d0,d1,...`` from ``--shape``."""
    name, equals, dims = text.partition("=")
    try:
        if not equals or not name:
            raise ValueError
        shape = tuple(int(d) for d in dims.split(","))
    except ValueError:
        raise UsageError(f"--shape expects name=d0,d1,... (e.g. input=1,3,224,224), not {text!r}") from None
    return name.strip(), shape


def _add_model_arguments(p: Any) -> None:
    p.add_argument("model", metavar="MODEL.onnx", help="ONNX model (float, or int8 QDQ/QOperator)")
    p.add_argument("--config", metavar="FILE", help="TOML accelerator config (default: built-in)")
    p.add_argument("--calibrate", metavar="DATA.npz",
                   help="calibration inputs (one array per model input) to quantize a float model")
    p.add_argument("--strict", action="store_true",
                   help="fail if a node would run on the host instead of the accelerator")
    p.add_argument("--relaxed", action="store_true",
                   help="also fuse across requantizations the model specifies (fewer stores, "
                        "results within about 2 LSB)")
    p.add_argument("--ort-exact-pooling", action="store_true",
                   help="run the average pools of an int8 model whose result could differ from "
                        "onnxruntime's on the host, emulating onnxruntime's float32 kernels bit "
                        "for bit (allowed with --strict)")
    p.add_argument("--shape", dest="shapes", action="append", default=[], metavar="NAME=DIMS",
                   help="shape of an input with symbolic dimensions, e.g. input=1,3,224,224; "
                        "repeatable")
    p.add_argument("--images-per-run", type=int, default=None, metavar="N",
                   help="images each program run computes (compile: 1; run: up to 32 of the "
                        "images given)")


def _optimize_args(args: argparse.Namespace) -> Any:
    """Load and optimize ``args.model``, printing host-fallback warnings as one line each."""
    import warnings

    from systolic.compiler.frontend import load_model
    from systolic.compiler.passes import optimize

    config = _load_config(args.config)
    shapes = dict(_parse_shape(text) for text in args.shapes)
    if args.images_per_run is not None and args.images_per_run < 1:
        raise UsageError(f"--images-per-run must be at least 1, not {args.images_per_run}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph = optimize(load_model(args.model, shapes or None, config=config),
                         calibration=args.calibrate, strict=args.strict, relaxed=args.relaxed,
                         ort_exact_pooling=args.ort_exact_pooling)
    for warning in caught:
        print(f"{PROG}: warning: {' '.join(str(warning.message).split())}", file=sys.stderr)
    return graph


def _add_compile(sub: Any) -> None:
    p = sub.add_parser("compile", help="compile an ONNX model into accelerator programs",
                       description="Compile an ONNX model for an accelerator config: program "
                                   "binaries, assembly listings, the DRAM image and the plan.")
    _add_model_arguments(p)
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (created)")


def _cmd_compile(args: argparse.Namespace) -> int:
    from systolic.compiler.codegen import compile_graph

    compiled = compile_graph(_optimize_args(args), images_per_run=args.images_per_run or 1)
    paths = compiled.save(args.out)
    instrs = sum(len(s.program.instructions) for s in compiled.segments)
    hosts = len(compiled.host_nodes)
    print(f"{args.model}: {len(compiled.graph.accel_ops)} accelerator layers in "
          f"{len(compiled.segments)} program(s) of {instrs} instructions, {hosts} host node(s); "
          f"DRAM image {compiled.image.size} bytes; estimated "
          f"{sum(s.estimate for s in compiled.segments)} cycles per run "
          f"(config {compiled.config.hash_hex}, compiled in {compiled.compile_seconds:.1f} s)")
    for path in paths:
        print(f"  {path}")
    return 0


def _add_run(sub: Any) -> None:
    p = sub.add_parser("run", help="compile an ONNX model and run it on the golden model, the RTL "
                                   "or a board",
                       description="Compile MODEL.onnx, run it on the inputs and report the outputs, "
                                   "cycles and utilization.")
    _add_model_arguments(p)
    p.add_argument("--input", dest="inputs", action="append", required=True, metavar="[NAME=]X.npy",
                   help="input array (.npy); NAME= names the model input (default: the first); "
                        "the first axis may hold several images; repeatable")
    p.add_argument("--backend", choices=("golden", "rtl", "board"), default="golden",
                   help="golden model (default), the generated Verilog in Verilator, or a board "
                        "running the systolic SoC (--port)")
    p.add_argument("--port", metavar="URL",
                   help="--backend board: the board's serial port (/dev/ttyUSB0) or a pyserial URL "
                        "(socket://127.0.0.1:PORT for a simulated board)")
    p.add_argument("--board", metavar="NAME",
                   help="the board preset the board was built from; without --config the model is "
                        "compiled for the preset's config")
    p.add_argument("--baud", type=int, metavar="N",
                   help="--backend board: baud rate (default: the preset's, else 115200)")
    p.add_argument("--output", metavar="OUT.npz", help="save the outputs (one array per model output)")
    p.add_argument("--report", metavar="REPORT.json", help="save the report (cycles, MACs, "
                                                           "utilization, DRAM traffic, per layer)")


def _load_inputs(texts: Sequence[str], names: Sequence[str]) -> dict[str, Any]:
    import numpy as np

    out: dict[str, Any] = {}
    for text in texts:
        name, equals, path = text.partition("=")
        if not equals or name not in names:
            name, path = names[0], text
        if name in out:
            raise UsageError(f"--input: input {name!r} is given twice")
        try:
            out[name] = np.load(path, allow_pickle=False)
        except OSError as exc:
            raise OSError(f"{path}: cannot read input {name!r}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise ValueError(f"{path}: input {name!r} is not a .npy array file ({exc})") from None
        if not isinstance(out[name], np.ndarray):
            raise ValueError(f"{path}: input {name!r} must be a .npy array file, not an .npz archive")
    return out


def _cmd_run(args: argparse.Namespace) -> int:
    import numpy as np
    from systolic.compiler.codegen import compile_graph
    from systolic.compiler.runtime import check_inputs, run_model

    if args.backend == "board" and args.port is None:
        raise UsageError("--backend board needs --port: the board's serial port (e.g. /dev/ttyUSB0) "
                         "or socket://127.0.0.1:PORT for a simulated board")
    if args.backend != "board" and (args.port is not None or args.baud is not None):
        raise UsageError(f"--port and --baud are for --backend board, not --backend {args.backend}")
    if args.board is not None and args.config is None:     # the preset's config
        from systolic.boards.boards import preset_path
        args.config = str(preset_path(args.board))
    graph = _optimize_args(args)
    inputs = _load_inputs(args.inputs, graph.inputs)
    per_run = args.images_per_run
    if per_run is None:      # up to 32 of the given images per program run (one RTL start each)
        per_run = min(32, check_inputs(graph, inputs))
    result = run_model(compile_graph(graph, images_per_run=per_run), inputs, backend=args.backend,
                       port=args.port, baud=args.baud, board=args.board)
    report = result.report
    for name, value in result.outputs.items():
        print(f"output {name}: {value.dtype}{list(value.shape)}")
    print(f"{report['images']} image(s) on the {args.backend} backend: {report['cycles']} cycles "
          f"({report['cycles_per_image']:.0f} per image), {report['macs']} MACs, utilization "
          f"{report['utilization']:.1%}, DRAM read {report['dram_read_bytes']} / written "
          f"{report['dram_write_bytes']} bytes")
    if args.backend in ("rtl", "board"):
        counter = "RTL" if args.backend == "rtl" else "board"
        print(f"per-layer cycles below are the compile-time estimates (the {counter} counts the total)")
    if "link" in report:
        link = report["link"]
        print(f"host link {link['port']}: {link['requests']} requests, {link['bytes_sent']} bytes "
              f"sent, {link['bytes_received']} received in {link['seconds']:.1f} s")
    width = max((len(layer["name"]) for layer in report["layers"]), default=4)
    for layer in report["layers"]:
        if layer["host"]:
            print(f"  {layer['name']:<{width}}  {layer['op']:<12} host")
        else:
            print(f"  {layer['name']:<{width}}  {layer['op']:<12} {layer['cycles']:>10} cycles "
                  f"{layer['utilization']:>6.1%}")
    if args.output is not None:
        try:
            np.savez(args.output, **result.outputs)
        except OSError as exc:
            raise OSError(f"{args.output}: cannot write the outputs: {exc.strerror or exc}") from None
    if args.report is not None:
        _write_bytes(Path(args.report), (json.dumps(report, indent=1) + "\n").encode(), "report")
    return 0


# -- systolic demo ---------------------------------------------------------------------------------

def _add_demo(sub: Any) -> None:
    p = sub.add_parser("demo", help="compile the digits CNN and run the held-out images",
                       description="Compile examples/digits_cnn_int8.onnx for the default "
                                   "accelerator, run the 360 held-out digits on the RTL (Verilator) "
                                   "when it can be built, else on the golden model, and compare "
                                   "accuracies with the float and int8 models in onnxruntime.")
    p.add_argument("--backend", choices=("auto", "golden", "rtl"), default="auto",
                   help="auto (default): the RTL if Verilator builds it, else the golden model")
    p.add_argument("--images", type=int, default=0, metavar="N",
                   help="run only the first N held-out images (default: all 360)")
    p.add_argument("--out", default="systolic-demo", metavar="DIR",
                   help="where the Verilog, program and plan go (default: systolic-demo)")


def _cmd_demo(args: argparse.Namespace) -> int:
    from systolic.compiler.demo import run_demo

    return run_demo(backend=args.backend, images=args.images, out=Path(args.out))


# -- systolic generate ------------------------------------------------------------------------------

def _add_generate(sub: Any) -> None:
    p = sub.add_parser("generate", help="write the accelerator's Verilog, config and interface description",
                       description="Write systolic_top.v, the resolved config (config.toml, config.json) and "
                                   "interface.json (ports, AXI parameters, CSR map) into DIR.")
    p.add_argument("--config", metavar="FILE", help="TOML config (default: built-in defaults)")
    p.add_argument("--rows", type=int, metavar="R", help="override rows")
    p.add_argument("--cols", type=int, metavar="C", help="override cols")
    p.add_argument("--dataflow", metavar="ws|os", help="override dataflow")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override any field, as for systolic config; repeatable")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (created if needed)")


def _cmd_generate(args: argparse.Namespace) -> int:
    from systolic.hw.generate import generate

    values = _load_config(args.config).to_dict()
    for name in ("rows", "cols", "dataflow"):
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    values.update(_parse_override(text) for text in args.overrides)
    config = AcceleratorConfig.from_dict(values, source="command line")
    paths = generate(config, args.out)
    print(f"config {config.hash_hex}: {config.rows}x{config.cols} {config.dataflow}")
    for path in paths.values():
        print(f"wrote {path}")
    return 0


# -- systolic synth ---------------------------------------------------------------------------------

def _add_synth(sub: Any) -> None:
    from systolic.boards.synth import CORES, PLACERS, ROUTE_PATIENCE, ROUTERS, STOP_AFTER

    p = sub.add_parser("synth", help="synthesize, place and route the SoC for an FPGA board",
                       description="Build the SoC (accelerator, on-chip memory, UART host bridge) for "
                                   "BOARD with yosys and nextpnr: bitstream, logs and report.json "
                                   "(clocks, Fmax, timing, used/available resources) in DIR.")
    p.add_argument("--board", required=True, metavar="BOARD",
                   help="icebreaker, ulx3s-85f or orangecrab-25f")
    p.add_argument("--config", metavar="FILE", help="TOML config (default: the board's preset)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override any config field, as for systolic config; repeatable")
    p.add_argument("--clock-mhz", type=float, metavar="F",
                   help="accelerator clock, MHz (default: the config's clock_mhz; with --core array, "
                        "the array's clock: compute_clock_mhz when set); a config's compute clock "
                        "(compute_clock_mhz) comes from the PLL's second output (ECP5)")
    p.add_argument("--seed", type=int, default=1, metavar="N", help="nextpnr placement seed (default 1)")
    p.add_argument("--placer", choices=PLACERS, default=PLACERS[0],
                   help="nextpnr's placer: heap (default), static (faster on large designs, "
                        "usually a lower Fmax) or sa")
    p.add_argument("--router", choices=ROUTERS, default=ROUTERS[0],
                   help="nextpnr's router: router1 (default) or router2")
    p.add_argument("--time-limit", type=float, metavar="MIN",
                   help="stop nextpnr after MIN minutes and say how far it got (stage, arcs left, "
                        "its Fmax estimate after placement); default: no limit")
    p.add_argument("--route-patience", type=int, metavar="N",
                   help=f"with --router router2: stop it, and say so, when its overused wires have not "
                        f"gone below their fewest in N iterations (default {ROUTE_PATIENCE})")
    p.add_argument("--stop-after", choices=STOP_AFTER,
                   help="end the flow early, with no bitstream: yosys (the netlist, its cells by unit, "
                        "the fit check) or place (nextpnr places without routing: its Fmax estimate); "
                        "report.json's stage says where it stopped")
    p.add_argument("--slowest", type=int, default=0, metavar="N",
                   help="list in report.json (slowest_endpoints) and the summary, per clock, the N "
                        "endpoints its paths reach latest and how many miss its period (nextpnr's "
                        "detailed timing report, tens of MB on a large design); default 0: none")
    p.add_argument("--baud", type=int, metavar="N", help="host link baud rate (default: the board's)")
    p.add_argument("--core", choices=CORES, default=CORES[0],
                   help="soc (default) or array: the MAC array alone with registered ports")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (created if needed)")


def _cmd_synth(args: argparse.Namespace) -> int:
    from systolic.boards.boards import get_board
    from systolic.boards.synth import ROUTE_PATIENCE, resolve_config, summary_table, synth
    from systolic.sim.tools import ToolError

    if args.time_limit is not None and not args.time_limit > 0:
        raise UsageError(f"--time-limit must be a positive number of minutes, not {args.time_limit:g}")
    if args.route_patience is not None and args.router != "router2":
        raise UsageError(f"--route-patience counts router2's iterations; the router is {args.router} "
                         f"(add --router router2)")
    if args.route_patience is not None and args.route_patience < 1:
        raise UsageError(f"--route-patience must be a positive number of iterations, "
                         f"not {args.route_patience}")
    if args.slowest < 0:
        raise UsageError(f"--slowest must be a non-negative number of endpoints, not {args.slowest}")
    board = get_board(args.board)
    config = resolve_config(board, args.config)
    if args.overrides:
        values = config.to_dict()
        values.update(_parse_override(text) for text in args.overrides)
        config = AcceleratorConfig.from_dict(values, source="--set")
    try:
        report = synth(board, config, args.out, clock_mhz=args.clock_mhz, seed=args.seed,
                       core=args.core, baud=args.baud, placer=args.placer, router=args.router,
                       time_limit=None if args.time_limit is None else args.time_limit * 60,
                       route_patience=ROUTE_PATIENCE if args.route_patience is None else args.route_patience,
                       stop_after=args.stop_after, slowest=args.slowest)
    except ToolError as exc:
        _report(exc)
        return 1
    print(summary_table(report))
    print(f"report: {Path(args.out) / 'report.json'}")
    if report["stage"] == "route" and not report["timing_met"]:
        missed = [f"clock {name} reaches {clock['fmax_mhz']:.1f} MHz, the target is "
                  f"{clock['target_mhz']:.1f} MHz" for name, clock in report["clocks"].items()
                  if not clock["met"]]
        _report(ValueError(f"timing not met on {board.name}: {'; '.join(missed)}"))
        return 1
    return 0


_COMMANDS: tuple[tuple[str, Callable[[Any], None], Callable[[argparse.Namespace], int]], ...] = (
    ("config", _add_config, _cmd_config),
    ("asm", _add_asm, _cmd_asm),
    ("disasm", _add_disasm, _cmd_disasm),
    ("generate", _add_generate, _cmd_generate),
    ("synth", _add_synth, _cmd_synth),
    ("compile", _add_compile, _cmd_compile),
    ("run", _add_run, _cmd_run),
    ("demo", _add_demo, _cmd_demo),
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = _Parser(prog=PROG, description="Generator of systolic-array ML accelerators.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)
    for name, add, run in _COMMANDS:
        add(sub)
        sub.choices[name].set_defaults(run=run)
    return parser


def _report(exc: BaseException) -> None:
    """Print ``exc`` as the one line ``systolic: error: <message>`` on stderr."""
    message = " ".join(str(exc).splitlines()) or type(exc).__name__
    print(f"{PROG}: error: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    try:
        args = build_parser().parse_args(argv)
        return args.run(args)
    except UsageError as exc:
        _report(exc)
        return 2
    except SystemExit as exc:   # --help
        return exc.code if isinstance(exc.code, int) else 0
    except (ConfigError, IsaError, ProgramError, AsmError, OSError, ValueError) as exc:
        _report(exc)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
