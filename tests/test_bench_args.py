"""The command-line errors of the bench scripts (``bench/board_sweep.py``, and the array size of
``array_synth.py``, ``area_breakdown.py``, ``unit_fmax.py`` and ``compute_clock.py``): each is
one usage line naming the flag and the rule, given before anything is built."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

_BENCH = Path(__file__).resolve().parent.parent / "bench"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, _BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _board_sweep():
    return _script("board_sweep")


@pytest.mark.parametrize("argv, message", [
    (["--sizes", "4"], "--sizes takes an array size RxC (rows x cols, e.g. 8x8), not '4'"),
    (["--sizes", "4x4,8by8"], "--sizes takes an array size RxC (rows x cols, e.g. 8x8), not '8by8'"),
    (["--time-limit", "0"], "--time-limit must be a positive number of minutes, not 0"),
    (["--time-limit", "-3"], "--time-limit must be a positive number of minutes, not -3"),
    (["--set", "rows"], "--set expects field=value, not 'rows'"),
    (["--set", "colums=8"], "--set: unknown field 'colums'; known fields are "),
    (["--set", "dram_bytes=3"], "dram_bytes must be "),
])
def test_board_sweep_argument_errors(argv: list[str], message: str, tmp_path: Path,
                                     capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "sweep.json"
    with pytest.raises(SystemExit) as exit_info:
        _board_sweep().main(["--boards", "", "--sizes", "4x4", *argv, "--out", str(out)])
    assert exit_info.value.code == 2
    assert re.search(rf"^\S+: error: {re.escape(message)}", capsys.readouterr().err, re.M)
    assert not out.exists()                     # nothing was run


def test_board_sweep_set_changes_the_sweep_configs_after_their_size(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    sweep = _board_sweep()
    built = []

    def fake_run_one(kind, board, config, *args):
        built.append(config)
        return {"kind": kind, "board": board, "rows": config.rows, "cols": config.cols,
                "lut_multipliers": config.array_lut_multipliers, "error": "not run"}

    monkeypatch.setattr(sweep, "run_one", fake_run_one)
    assert sweep.main(["--boards", "", "--sizes", "4x4,16x16", "--set", "array_lut_multipliers=7",
                       "--set", "dram_bytes=65536", "--out", str(tmp_path / "sweep.json")]) == 0
    assert [(c.rows, c.cols, c.array_lut_multipliers, c.dram_bytes) for c in built] == [
        (4, 4, 7, 65536), (16, 16, 7, 65536)]


def test_board_sweep_config_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad, broken = tmp_path / "bad.toml", tmp_path / "broken.toml"
    bad.write_text("rows = 5\n")
    broken.write_text("rows = [\n")
    out = tmp_path / "sweep.json"
    for name, message in ((tmp_path / "none.toml", "{}: cannot read config file: No such file or directory$"),
                          (bad, "{}: rows must be a power of two between 2 and 64, not 5$"),
                          (broken, "{}: not valid TOML: ")):
        with pytest.raises(SystemExit) as exit_info:
            _board_sweep().main(["--boards", "", "--sizes", "", "--configs", str(name), "--out", str(out)])
        assert exit_info.value.code == 2
        pattern = re.escape(message.format(name)).replace(r"\$", "$")
        assert re.search(rf"^\S+: error: --configs: {pattern}", capsys.readouterr().err, re.M)
    assert not out.exists()


def test_board_sweep_builds_config_files_as_they_are(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    """A config file's row is built on the sweep board without --set, names its file, and is
    kept apart from a sweep row of the same size when results are merged."""
    import json

    sweep = _board_sweep()
    built = []

    def fake_run_one(kind, board, config, work, *args):
        built.append((kind, board, config, work))
        return {"kind": kind, "board": board, "rows": config.rows, "cols": config.cols,
                "lut_multipliers": config.array_lut_multipliers, "error": "not run"}

    monkeypatch.setattr(sweep, "run_one", fake_run_one)
    example = Path(__file__).resolve().parent.parent / "examples" / "ulx3s-85f-16x16-2clk.toml"
    out = tmp_path / "sweep.json"
    assert sweep.main(["--boards", "", "--sizes", "16x16", "--set", "dram_bytes=65536",
                       "--configs", str(example), "--out", str(out)]) == 0
    from systolic.hw.config import AcceleratorConfig

    (kind, board, config, work), = [b for b in built if b[0] == "config"]
    assert (board, config) == ("ulx3s-85f", AcceleratorConfig.from_toml(example))
    assert work.name == "ulx3s-85f-16x16-2clk"
    rows = json.loads(out.read_text())["results"]
    assert [(r["kind"], r.get("config_file")) for r in rows] == [("config", str(example)), ("sweep", None)]
    # a later run of the sweep size alone keeps the config file's row
    assert sweep.main(["--boards", "", "--sizes", "16x16", "--merge", "--out", str(out)]) == 0
    assert [r["kind"] for r in json.loads(out.read_text())["results"]] == ["config", "sweep"]


def test_board_sweep_row_of_a_two_clock_config_is_at_the_compute_clock() -> None:
    """A config with a compute clock of its own: the row's Fmax, target and peak GOPS are the
    array's (the compute clock's), the control clock's are columns of their own; one clock: the
    accelerator clock's, no control column."""
    from systolic.hw.config import AcceleratorConfig

    sweep = _board_sweep()
    resources = {kind: {"used": 1, "percent": 1.0} for kind in ("lut", "ff", "dsp", "bram")}

    def report(clocks):
        return {"resources": resources, "target_mhz": 75.0, "timing_met": False, "stage": "route",
                "compute_target_mhz": 100.0 if "compute" in clocks else None, "clocks": clocks,
                "fmax_mhz": {name: fmax for name, (fmax, _) in clocks.items()}}

    two = AcceleratorConfig(rows=16, cols=16, clock_mhz=75, compute_clock_mhz=100)
    row = sweep._row("sweep", "ulx3s-85f", two, 100.0,
                     report({"sync": (81.5, 75.0), "compute": (97.0, 100.0)}), None, 60)
    assert (row["fmax_mhz"], row["target_mhz"], row["control_fmax_mhz"], row["control_target_mhz"]) == \
        (97.0, 100.0, 81.5, 75.0)
    assert row["peak_gops"] == round(2 * 256 * 97.0 / 1000, 2) and row["two_clocks"]
    one = sweep._row("sweep", "ulx3s-85f", two.replace(compute_clock_mhz=0.0), 75.0,
                     report({"sync": (81.5, 75.0)}), None, 60)
    assert (one["fmax_mhz"], one["target_mhz"], one["two_clocks"]) == (81.5, 75.0, False)
    table = sweep._table([row, one]).splitlines()
    assert table[2].endswith("81.5/75.0") and table[3].endswith(" -")


def test_board_sweep_row_of_a_flow_stopped_after_placement() -> None:
    """--stop-after place: the row has the resources and nextpnr's estimates after placement
    (``~F`` in the table, the compute clock's as the array's), no Fmax, no verdict on timing,
    no peak GOPS; after yosys, no estimate at all."""
    from systolic.hw.config import AcceleratorConfig

    sweep = _board_sweep()
    resources = {kind: {"used": 7, "percent": 12.0} for kind in ("lut", "ff", "dsp", "bram")}
    config = AcceleratorConfig(rows=16, cols=16, clock_mhz=50, compute_clock_mhz=100)
    report = {"resources": resources, "target_mhz": 50.0, "compute_target_mhz": 100.0, "timing_met": None,
              "stage": "place", "clocks": {}, "fmax_mhz": {}, "placed_mhz": {"sync": 50.2, "compute": 69.6}}
    row = sweep._row("config", "ulx3s-85f", config, 100.0, report, None, 60)
    assert (row["stopped_after"], row["placed_mhz"], row["control_placed_mhz"], row["target_mhz"]) == \
        ("place", 69.6, 50.2, 100.0)
    assert "fmax_mhz" not in row and "peak_gops" not in row and "timing_met" not in row
    yosys = sweep._row("config", "ulx3s-85f", config, 100.0,
                       {**report, "stage": "yosys", "placed_mhz": {}}, None, 60)
    assert yosys["placed_mhz"] is None and yosys["luts"] == 7
    assert (row["sprams"], row["logic_cells"]) == (0, None)      # ECP5: no SPRAM, no logic cells
    ice40 = {**resources, "spram": {"used": 4, "percent": 100.0}, "lc": {"used": 4756, "percent": 90.0}}
    ice40_row = sweep._row("preset", "icebreaker", config.replace(compute_clock_mhz=0.0), 24.0,
                           {**report, "stage": "yosys", "resources": ice40, "compute_target_mhz": None,
                            "target_mhz": 24.0, "placed_mhz": {}}, None, 60)
    assert (ice40_row["sprams"], ice40_row["logic_cells"], ice40_row["two_clocks"]) == (4, 4756, False)
    placed_line, yosys_line = sweep._table([row, yosys]).splitlines()[2:]
    assert re.search(r"\s~69\.6\s+100\.0\s+placed\s+-\s+1\s+~50\.2/50\.0$", placed_line), placed_line
    assert re.search(r"\s-\s+100\.0\s+yosys\s+-\s+1\s+-$", yosys_line), yosys_line


_SIZE = "takes an array size RxC (rows x cols, e.g. 8x8), not "


@pytest.mark.parametrize("script, argv, message", [
    # the first size is valid: nothing is built before every size has been checked
    ("array_synth", ["--sizes", "4x4,x8"], f"--sizes {_SIZE}'x8'"),
    ("array_synth", ["--sizes", "4x4,5x4"], "rows must be a power of two between 2 and 64, not 5"),
    ("area_breakdown", ["--size", "8by8"], f"--size {_SIZE}'8by8'"),
    ("unit_fmax", ["--unit", "sfu", "--size", "16"], f"--size {_SIZE}'16'"),
    ("compute_clock", ["--size", "8"], f"--size {_SIZE}'8'"),
    ("compute_clock", ["--compute-mhz", "500"], "compute_clock_mhz must be 0 (one clock) or between "
                                                "clock_mhz / 4 and 4 x clock_mhz (18.75 to 300), not 500.0"),
])
def test_array_size_errors(script: str, argv: list[str], message: str, tmp_path: Path,
                           capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "results.json"
    with pytest.raises(SystemExit) as exit_info:
        _script(script).main([*argv, "--out", str(out)])
    assert exit_info.value.code == 2
    assert re.search(rf"^\S+: error: {re.escape(message)}", capsys.readouterr().err, re.M)
    assert not out.exists()


def test_unit_fmax_builds_units_as_the_accelerator_does(capsys: pytest.CaptureFixture) -> None:
    """The accumulator and the compute core get the accelerator's store read queue; a keyword a
    (baseline revision's) class does not take is left out, and the run says so."""
    from systolic.hw.accumulator import store_read_queue
    from systolic.hw.config import AcceleratorConfig

    unit_fmax = _script("unit_fmax")
    config = AcceleratorConfig(sfu_row_cycles=4)
    assert unit_fmax.UNITS["accumulator"](config).read_queue == store_read_queue(config) == 2
    assert unit_fmax.UNITS["compute_core"](config).acc_read_queue == 2
    assert capsys.readouterr().err == ""
    make = unit_fmax._build("hw.accumulator", "Accumulator", lambda c: c, fanciness=lambda c: 3)
    assert make(config).read_queue == 5
    assert capsys.readouterr().err == ("unit_fmax: this revision's Accumulator takes no keyword "
                                       "'fanciness'; built without it\n")


def test_board_sweep_row_of_a_router2_that_stopped_converging(monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    """A run whose router2 was stopped (RouteStalled) is a row with the whole message and where
    router2 was, not an Fmax, and the sweep goes on."""
    from systolic.boards.synth import RouteStalled
    from systolic.hw.config import AcceleratorConfig

    sweep = _board_sweep()
    router2 = {"iteration": 290, "overused": 12, "fewest": 1, "fewest_iteration": 190}
    message = "nextpnr-ecp5's router2 does not converge and was stopped at iteration 290: " + "x" * 600

    def stalled(*args, **kwargs):
        raise RouteStalled(message, router2=router2, placed_mhz={"compute": 59.17, "sync": 51.83},
                           patience=100)

    monkeypatch.setattr(sweep, "synth", stalled)
    config = AcceleratorConfig.from_dict({"rows": 4, "cols": 4})
    row = sweep.run_one("sweep", "ulx3s-85f", config, tmp_path, 1, router="router2")
    assert row["error"] == message                      # the whole message, not cut
    assert (row["stopped_in"], row["router2"], row["placed_mhz"], row["control_placed_mhz"]) == (
        "routing", router2, 59.17, 51.83)


@pytest.mark.parametrize("placed_mhz, expected", [({"compute": 61.5, "sync": 52.25}, (61.5, 52.25)),
                                                   ({"sync": 48.0}, (48.0, 48.0)), ({}, (None, None))])
def test_board_sweep_row_of_a_flow_stopped_at_its_time_limit(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                           placed_mhz: dict, expected: tuple) -> None:
    """A run that nextpnr's time limit stopped (PlaceRouteTimeout) is a row with the message, the
    stage, the placer's estimates (the compute clock's, else the one clock's; none before
    placement ended) and the router's progress, not an Fmax."""
    from systolic.boards.synth import PlaceRouteTimeout
    from systolic.hw.config import AcceleratorConfig

    sweep = _board_sweep()
    router2 = {"iteration": 40, "overused": 300, "fewest": 250, "fewest_iteration": 35}

    def stopped(*args, **kwargs):
        raise PlaceRouteTimeout("nextpnr-ecp5 was stopped after 60 minutes", stage="routing",
                                placed_mhz=placed_mhz, arcs_total=1000, arcs_left=12, seconds=3600.0,
                                router2=router2)

    monkeypatch.setattr(sweep, "synth", stopped)
    config = AcceleratorConfig.from_dict({"rows": 4, "cols": 4})
    row = sweep.run_one("sweep", "ulx3s-85f", config, tmp_path, 1, router="router2", time_limit=3600)
    assert row["error"] == "nextpnr-ecp5 was stopped after 60 minutes"
    assert "fmax_mhz" not in row
    assert (row["stopped_in"], row["placed_mhz"], row["control_placed_mhz"], row["router2"]) == (
        "routing", *expected, router2)
    assert (row["arcs_total"], row["arcs_left"], row["heap_stalled"]) == (1000, 12, False)


@pytest.mark.parametrize("script, function, argv", [
    ("area_breakdown", "breakdown", ["--size", "2x2"]),
    ("array_synth", "measure", ["--sizes", "4x4", "--dataflows", "ws"]),
    ("unit_fmax", "measure", ["--unit", "sfu"]),
])
def test_tool_failure_is_an_error_line_not_a_traceback(script: str, function: str, argv: list[str],
                                                       monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    """A tool that fails (yosys, nextpnr, git) ends the script with status 1 and its message,
    the tool's quoted output kept, after ``<script>: error:``."""
    from systolic.sim.tools import ToolError

    module = _script(script)

    def failing(*args, **kwargs):
        raise ToolError("nextpnr-ecp5 failed:\nERROR: Max frequency for clock 'clk': 12.00 MHz")

    monkeypatch.setattr(module, function, failing)
    out = tmp_path / "results.json"
    assert module.main([*argv, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert re.search(r"^\S+: error: nextpnr-ecp5 failed:\nERROR: Max frequency for clock 'clk': 12.00 MHz$",
                     err, re.M), err
    assert "Traceback" not in err
    assert not out.exists()                     # nothing was measured


def test_unit_fmax_keeps_the_units_measured_before_a_tool_failure(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    import json

    from systolic.sim.tools import ToolError

    unit_fmax = _script("unit_fmax")

    def measure(unit, config, family, **kwargs):
        if unit == "sfu":
            raise ToolError("yosys failed with status 1")
        return {"unit": unit, "family": family, "device": "85k", "config_hash": "h",
                "seconds": {"nextpnr": 1.0}}

    monkeypatch.setattr(unit_fmax, "measure", measure)
    out = tmp_path / "results.json"
    assert unit_fmax.main(["--unit", "accumulator", "--unit", "sfu", "--out", str(out)]) == 1
    assert re.search(r"^\S+: error: yosys failed with status 1$", capsys.readouterr().err, re.M)
    assert [e["unit"] for e in json.loads(out.read_text())] == ["accumulator"]
