"""The whole accelerator's Verilog passes Verilator's lint with the project's allow-list, for
both dataflows and with a compute clock of its own (whole accumulator rows across the clocks, and
rows in pieces)."""

from __future__ import annotations

import pytest
from systolic.hw.config import AcceleratorConfig
from systolic.hw.generate import TOP_NAME, top_verilog
from systolic.sim.tools import verilator_lint


@pytest.mark.slow
@pytest.mark.parametrize("config", [
    AcceleratorConfig(rows=4, cols=4, scratchpad_bytes=4096, accumulator_bytes=2048, requant_table_rows=8),
    AcceleratorConfig(rows=4, cols=8, dataflow="os", scratchpad_bytes=4096, accumulator_bytes=4096,
                      dma_data_bits=128, dma_max_burst=8, sfu_pooling=("max",), sfu_residual=False),
    AcceleratorConfig(rows=4, cols=4, scratchpad_bytes=4096, accumulator_bytes=2048, requant_table_rows=8,
                      clock_mhz=75.0, compute_clock_mhz=100.0),
    # accumulator rows crossing in pieces, table LOADs in groups
    AcceleratorConfig(rows=4, cols=4, scratchpad_bytes=4096, accumulator_bytes=2048, requant_table_rows=8,
                      clock_mhz=75.0, compute_clock_mhz=100.0, acc_crossing_pieces=8, requant_load_entries=2),
], ids=["ws-4x4", "os-4x8", "ws-4x4-compute-clock", "ws-4x4-pieces-groups"])
def test_top_lint_is_clean(config):
    verilator_lint(top_verilog(config), TOP_NAME)
