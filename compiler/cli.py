"""The ``systolic`` command line.

Each subcommand is one ``_add_<name>`` function that declares its arguments and one
``_cmd_<name>`` function that runs it, both listed in :data:`_COMMANDS`; later subcommands
(generate, compile, run, synth) are added the same way when the parts they drive exist.

Every user error — a bad config, a malformed program, a missing file, a bad flag — prints one
line ``systolic: error: <message>`` on stderr and returns 1 (2 for command-line usage), never a
traceback.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, NoReturn

from systolic.compiler.asm import AsmError, assemble, disassemble
from systolic.hw.config import AcceleratorConfig, ConfigError, field_docs
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


_BARE_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def _parse_override(text: str) -> tuple[str, Any]:
    """``field=value`` from ``--set``; the value is a TOML value, or a bare word as a string."""
    name, equals, value = text.partition("=")
    name, value = name.strip(), value.strip()
    if not equals or not name:
        raise UsageError(f"--set expects field=value, not {text!r}")
    try:
        return name, tomllib.loads(f"value = {value}")["value"]
    except tomllib.TOMLDecodeError:
        if _BARE_WORD.fullmatch(value):   # dataflow=os: a plain word means the string
            return name, value
        raise UsageError(f"--set {name}: {value!r} is not a TOML value "
                         f"(write e.g. 16, true, \"os\" or [\"relu\"])") from None


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


# -- systolic demo ---------------------------------------------------------------------------------

def _add_demo(sub: Any) -> None:
    sub.add_parser("demo", help="compile and run a small model end to end",
                   description="Compile a small ONNX model for the default accelerator and run it on "
                               "the golden model (once the compiler exists).")


def _cmd_demo(args: argparse.Namespace) -> int:
    # The demo drives the ONNX compiler and the runtime; until they exist it says so and succeeds,
    # so that the README's quick start works at every stage. Replace this body with the real demo.
    print(f"{PROG} demo: the ONNX compiler is not built yet (issue: compiler and runtime); nothing to run")
    return 0


_COMMANDS: tuple[tuple[str, Callable[[Any], None], Callable[[argparse.Namespace], int]], ...] = (
    ("config", _add_config, _cmd_config),
    ("asm", _add_asm, _cmd_asm),
    ("disasm", _add_disasm, _cmd_disasm),
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
