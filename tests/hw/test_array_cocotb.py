"""The generated SystolicArray Verilog on Verilator, through cocotb_tools.runner: both dataflows at
4x4 and 8x8, plus the ECP5 elaboration (MULT18X18D multipliers, distributed-RAM delay lines in
the skews) against a behavioural model of that primitive. The cocotb side is
tests/hw/cocotb_array.py; builds are cached per config hash and design hash
(systolic.sim.tools.cocotb_build)."""

from __future__ import annotations

import json
import shutil

import pytest
from systolic.hw.array import SystolicArray
from systolic.hw.config import AcceleratorConfig
from systolic.sim.tools import cocotb_build, cocotb_test, to_verilog

from tests.hw.ecp5_stand import Ecp5Stand
from tests.hw.mult18x18d_model import mult18x18d_model, trellis_ff_model
from tests.hw.test_logic_multiplier_ecp5 import ecp5_cell_models

TOP = "systolic_array"
SEED = 20240601


#: Only the array's ports are visible to cocotb (it drives and reads nothing else), and the C++ is
#: compiled without optimization: the simulation takes seconds, the build less than half as long
#: (8x8: 17 s instead of 40 s here).
BUILD_ARGS = ("--no-public-flat-rw", "--public-depth", "1", "-CFLAGS", "-O0")

CASES = [
    pytest.param("ws", 4, 4, False, {}, None, id="ws-4x4"),
    pytest.param("ws", 8, 8, False, {}, None, id="ws-8x8"),
    pytest.param("os", 4, 4, False, {}, None, id="os-4x4"),
    pytest.param("os", 8, 8, False, {}, None, id="os-8x8"),
    pytest.param("ws", 4, 4, True, {}, None, id="ws-4x4-ecp5"),
    # the skews' delays of 4 to 9 cycles in distributed-RAM lines (ECP5's lutram_delays), the
    # output de-skew's included; the last 24 PEs multiply in logic (CCU2C chains, their operands
    # a cycle late)
    pytest.param("ws", 8, 8, True, {"array_lut_multipliers": 24}, None, id="ws-8x8-ecp5"),
    pytest.param("os", 8, 8, True, {"array_lut_multipliers": 24}, None, id="os-8x8-ecp5"),
    # 16-bit operands: products wider than 18 bits, so the sign pins of the DSP matter
    pytest.param("os", 4, 4, True, {"input_bits": 16, "weight_bits": 16}, None, id="os-4x4-int16-ecp5"),
    # the registered stall tree of large arrays (TRELLIS_FF instances), with the DSP blocks' clock
    # enables a register per PE row and the output handshake's a register of its own
    pytest.param("ws", 4, 4, True, {}, 3, id="ws-4x4-ecp5-stall3"),
    pytest.param("os", 4, 4, True, {}, 3, id="os-4x4-ecp5-stall3"),
]


@pytest.mark.slow
@pytest.mark.parametrize("dataflow, rows, cols, ecp5, kwargs, stall_stages", CASES)
def test_array_on_verilator(dataflow: str, rows: int, cols: int, ecp5: bool, kwargs: dict,
                            stall_stages: int | None) -> None:
    config = AcceleratorConfig(rows=rows, cols=cols, dataflow=dataflow, **kwargs)
    verilog = to_verilog(SystolicArray(config, stall_stages=stall_stages), TOP,
                         platform=Ecp5Stand() if ecp5 else None)
    if ecp5:
        assert verilog.count("MULT18X18D ") == rows * cols - config.array_lut_multipliers
        verilog += mult18x18d_model()
    if config.array_lut_multipliers and ecp5:
        assert verilog.count("CCU2C ") >= 4 * config.array_lut_multipliers
        verilog += ecp5_cell_models("LUT4", "LUT2", "CCU2C")
    if stall_stages and ecp5:
        assert verilog.count("TRELLIS_FF ") > rows * cols
    if "TRELLIS_FF " in verilog:            # the stall tree's registers on ECP5 (1 stage and more)
        verilog += trellis_ff_model()
    tag = ("-ecp5" if ecp5 else "") + (f"-stall{stall_stages}" if stall_stages is not None else "")
    build = cocotb_build(verilog, TOP, config.hash_hex + tag, build_args=BUILD_ARGS)
    results = cocotb_test(build, TOP, "tests.hw.cocotb_array", seed=SEED,
                          extra_env={"SYSTOLIC_ARRAY_CONFIG": json.dumps(config.to_dict())})
    shutil.rmtree(results.parent)       # a failed run keeps its directory for a look
