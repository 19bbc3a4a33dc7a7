"""The FPGA boards ``systolic synth`` builds for: devices, their resources, clocks, pins, presets.

Each :class:`Board` names its amaranth-boards platform, the FPGA (:class:`Device`: the cell
types yosys maps to and how many of each the device has), the oscillator the PLL starts from,
the accelerator clock its preset targets, the pins of the host UART and the status LEDs, and the
on-chip memory the SoC gives the accelerator as its DRAM. :func:`get_board` looks a board up by
name; :func:`load_preset` reads its preset config (``boards/presets/<name>.toml``), a config
that fits beside the SoC and meets timing on that board.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from amaranth.build import Attrs
from amaranth_boards.icebreaker import ICEBreakerPlatform
from amaranth_boards.orangecrab_r0_2 import OrangeCrabR0_2_25FPlatform
from amaranth_boards.resources import UARTResource
from amaranth_boards.ulx3s import ULX3S_85F_Platform
from systolic.hw.config import AcceleratorConfig

__all__ = ["BoardError", "FitError", "DeviceResource", "Device", "Board", "BOARDS", "DEVICES", "get_board",
           "preset_path", "load_preset"]


class BoardError(ValueError):
    """A board is unknown, or a design does not fit or cannot be clocked on it. The message names
    the board, the device and the rule, with the needed and the available amount."""


class FitError(BoardError):
    """A design needs more of some resource than the device has. ``over`` maps each such
    resource kind (lut, ff, lc, dsp, alu, bram, spram) to (needed, available)."""

    def __init__(self, message: str, over: Mapping[str, tuple[int, int]]) -> None:
        super().__init__(message)
        self.over = dict(over)


@dataclass(frozen=True)
class DeviceResource:
    """One kind of resource of a device.

    ``label``: the name in messages and reports (the cell type, or LUT4 / FF);
    ``cells``: yosys cell types that use one unit each (a name ending in ``*`` matches a prefix),
    ``weight``: units per cell of the same position in ``cells`` (an ECP5 CCU2C carry cell holds
    two LUT4s); ``available``: units on the device; ``nextpnr``: the bel type nextpnr reports
    utilization for, None when nextpnr does not count this resource on its own (iCE40 LUT4s and
    flip-flops, which share logic cells).

    A resource with no ``cells`` is only known once nextpnr has packed the netlist (iCE40 logic
    cells: a LUT4 and a flip-flop share one only when the LUT drives nothing but that flip-flop);
    before that, the largest count of the kinds in ``at_least`` is a lower bound of it.
    """

    label: str
    cells: tuple[str, ...]
    available: int
    nextpnr: str | None
    weight: tuple[int, ...] = ()
    at_least: tuple[str, ...] = ()

    def count(self, cells: Mapping[str, int]) -> int:
        """Units of this resource that ``cells`` (yosys cell type -> count) use."""
        total = 0
        for index, name in enumerate(self.cells):
            weight = self.weight[index] if index < len(self.weight) else 1
            if name.endswith("*"):
                total += weight * sum(n for cell, n in cells.items() if cell.startswith(name[:-1]))
            else:
                total += weight * cells.get(name, 0)
        return total


@dataclass(frozen=True)
class Device:
    """An FPGA: ``name`` (e.g. iCE40UP5K), ``family`` ("ice40" or "ecp5") and its resources by
    kind: ``lut``, ``ff``, ``dsp``, ``bram`` and, where the family has them, ``alu`` (ECP5
    ALU54B), ``spram`` (iCE40UP SB_SPRAM256KA) and ``lc`` (iCE40 logic cells, each a LUT4 and a
    flip-flop)."""

    name: str
    family: str
    resources: Mapping[str, DeviceResource]
    nextpnr_args: tuple[str, ...]

    @property
    def packed_kinds(self) -> tuple[str, ...]:
        """The resource kinds only nextpnr's packing counts (no yosys cells of their own)."""
        return tuple(kind for kind, resource in self.resources.items() if not resource.cells)

    def available(self, kind: str) -> int:
        """Units of resource ``kind`` on the device (0 for a kind the family does not have)."""
        resource = self.resources.get(kind)
        return 0 if resource is None else resource.available


def _ice40_up5k() -> Device:
    # iCE40 UltraPlus family data sheet: 5280 logic cells (a LUT4 and a flip-flop each),
    # 30 sysMEM blocks of 4 kbit, 8 sysDSP blocks, 4 SPRAM blocks of 256 kbit, 1 PLL.
    return Device("iCE40UP5K", "ice40", {
        "lut": DeviceResource("LUT4", ("SB_LUT4",), 5280, None),
        "ff": DeviceResource("FF", ("SB_DFF*",), 5280, None),
        "lc": DeviceResource("logic cells (LUT4 + FF)", (), 5280, "ICESTORM_LC", at_least=("lut", "ff")),
        "dsp": DeviceResource("SB_MAC16", ("SB_MAC16",), 8, "ICESTORM_DSP"),
        "bram": DeviceResource("SB_RAM40_4K", ("SB_RAM40_4K",), 30, "ICESTORM_RAM"),
        "spram": DeviceResource("SB_SPRAM256KA", ("SB_SPRAM256KA",), 4, "ICESTORM_SPRAM"),
    }, ("--up5k",))


def _ecp5(name: str, luts: int, dsps: int, alus: int, brams: int, args: tuple[str, ...]) -> Device:
    # ECP5 family data sheet: LUT4s (and as many flip-flops), 18x18 multipliers (MULT18X18D),
    # ALU54B accumulators (one per two multipliers), EBR blocks of 18 kbit (DP16KD).
    lut4 = DeviceResource("LUT4", ("LUT4", "CCU2C", "TRELLIS_DPR16X4"), luts, "TRELLIS_COMB",
                          weight=(1, 2, 2))
    return Device(name, "ecp5", {
        "lut": lut4,
        "ff": DeviceResource("FF", ("TRELLIS_FF",), luts, "TRELLIS_FF"),
        "dsp": DeviceResource("MULT18X18D", ("MULT18X18D",), dsps, "MULT18X18D"),
        "alu": DeviceResource("ALU54B", ("ALU54B",), alus, "ALU54B"),
        "bram": DeviceResource("DP16KD", ("DP16KD", "PDPW16KD"), brams, "DP16KD"),
    }, args)


DEVICES: dict[str, Device] = {
    "iCE40UP5K": _ice40_up5k(),
    "LFE5U-25F": _ecp5("LFE5U-25F", 24288, 28, 14, 56, ("--25k",)),
    "LFE5U-85F": _ecp5("LFE5U-85F", 83640, 156, 78, 208, ("--85k",)),
}


@dataclass(frozen=True)
class Board:
    """One board: what ``systolic synth --board NAME`` builds for.

    ``platform``: a callable returning a fresh amaranth-boards platform;
    ``package``: the device package (as amaranth-boards names it); ``nextpnr_package``:
    nextpnr's package (and speed grade) arguments; ``clock``: the oscillator resource,
    ``clock_hz`` its frequency (Hz); ``uart``: the resource (name, number) of the host serial port;
    ``busy_led``/``error_led``: (resource name, number, subsignal or None);
    ``memory``: the SoC memory kind ("spram" or "bram"), ``max_memory_bytes`` the most the board
    gives it (the config's ``dram_bytes`` is the memory size); ``baud``: the host link's default
    rate, bits/s; ``pack_args``: extra arguments of the bitstream packer.
    """

    name: str
    title: str
    device: Device
    package: str
    platform: Callable[[], Any]
    clock: str
    clock_hz: int
    uart: tuple[str, int]
    busy_led: tuple[str, int, str | None]
    error_led: tuple[str, int, str | None]
    memory: str
    max_memory_bytes: int
    baud: int
    nextpnr_package: tuple[str, ...]
    pack_args: tuple[str, ...] = ()
    notes: str = ""

    @property
    def family(self) -> str:
        return self.device.family

    @property
    def part(self) -> str:
        """The FPGA with its package, e.g. ``iCE40UP5K-SG48``."""
        return f"{self.device.name}-{self.package}"

    def nextpnr_args(self) -> tuple[str, ...]:
        """Device and package arguments of nextpnr."""
        return (*self.device.nextpnr_args, *self.nextpnr_package)


class _OrangeCrab25F(OrangeCrabR0_2_25FPlatform):
    """OrangeCrab r0.2 (25F) with the host UART on the Feather header: RX on pin 0 (N17),
    TX on pin 1 (M18), the Feather convention; connect a 3.3 V USB-serial adapter there."""

    resources = [
        *OrangeCrabR0_2_25FPlatform.resources,
        UARTResource(0, rx="0", tx="1", conn=("io", 0), attrs=Attrs(IO_TYPE="LVCMOS33", PULLMODE="UP")),
    ]


BOARDS: dict[str, Board] = {
    "icebreaker": Board(
        name="icebreaker", title="1BitSquared iCEBreaker", device=DEVICES["iCE40UP5K"],
        package="SG48", platform=ICEBreakerPlatform, clock="clk12", clock_hz=12_000_000,
        uart=("uart", 0), busy_led=("led_g", 0, None), error_led=("led_r", 0, None),
        memory="spram", max_memory_bytes=128 * 1024, baud=1_000_000,
        nextpnr_package=("--package", "sg48"),
        notes="host link on the FT2232H's second channel (the iCEBreaker's USB port)"),
    "ulx3s-85f": Board(
        name="ulx3s-85f", title="Radiona ULX3S (LFE5U-85F)", device=DEVICES["LFE5U-85F"],
        package="BG381", platform=ULX3S_85F_Platform, clock="clk25", clock_hz=25_000_000,
        uart=("uart", 0), busy_led=("led", 0, None), error_led=("led", 1, None),
        memory="bram", max_memory_bytes=256 * 1024, baud=1_000_000, pack_args=("--compress",),
        nextpnr_package=("--package", "CABGA381", "--speed", "6"),
        notes="host link on the FT231X (the ULX3S's US1 port)"),
    "orangecrab-25f": Board(
        name="orangecrab-25f", title="Good Stuff Department OrangeCrab r0.2 (LFE5U-25F)",
        device=DEVICES["LFE5U-25F"], package="MG285", platform=_OrangeCrab25F,
        clock="clk", clock_hz=48_000_000,
        uart=("uart", 0), busy_led=("rgb_led", 0, "g"), error_led=("rgb_led", 0, "r"),
        memory="bram", max_memory_bytes=64 * 1024, baud=115_200,
        pack_args=("--compress", "--freq", "38.8"),
        nextpnr_package=("--package", "CSFBGA285", "--speed", "8"),
        notes="host link on Feather pins 0 (RX) and 1 (TX) through a 3.3 V USB-serial adapter; "
              "run `dfu-suffix -v 1209 -p 5af0 -a top.bit` before loading it with dfu-util"),
}


def get_board(name: str) -> Board:
    """The board called ``name``; raises :class:`BoardError` listing the boards otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"board must be a board name (str), not {name!r}")
    try:
        return BOARDS[name]
    except KeyError:
        raise BoardError(f"unknown board {name!r}; the boards are {', '.join(BOARDS)}") from None


def preset_path(board: str | Board) -> Path:
    """Path of the preset config of ``board`` (``boards/presets/<name>.toml``)."""
    name = board.name if isinstance(board, Board) else get_board(board).name
    return Path(str(resources.files("systolic.boards") / "presets" / f"{name}.toml"))


def load_preset(board: str | Board) -> AcceleratorConfig:
    """The preset config of ``board``: one that fits beside the SoC and meets timing there."""
    return AcceleratorConfig.from_toml(preset_path(board))
