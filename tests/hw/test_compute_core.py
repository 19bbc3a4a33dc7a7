# amaranth: UnusedElaboratable=no
"""hw/compute_core.py: the compute core's ports are those of the units inside it (its behaviour
with crossings around it is tests/hw/test_top.py's and tests/sim/test_rtl_compute_clock.py's),
and a wrong argument is named."""

import pytest
from systolic.hw.accumulator import acc_dma_write_layout, acc_row_layout
from systolic.hw.compute_core import ComputeCore
from systolic.hw.config import AcceleratorConfig
from systolic.hw.scratchpad import spad_write_layout


def test_ports_carry_the_units_payloads():
    config = AcceleratorConfig(rows=4, cols=4, scratchpad_bytes=4096, accumulator_bytes=2048)
    core = ComputeCore(config)
    assert core.spad_write.payload.shape() == spad_write_layout(config)
    assert core.acc_write.payload.shape() == acc_dma_write_layout(config)
    assert core.acc_read.resp.payload.shape() == acc_row_layout(config)
    assert len(core.acc_read.req.payload.addr) == config.acc_addr_bits
    assert len(core.macs) == (config.rows * config.cols).bit_length()


def test_config_type_error():
    with pytest.raises(TypeError, match=r"^config must be an AcceleratorConfig, not \{'rows': 4\}$"):
        ComputeCore({"rows": 4})
