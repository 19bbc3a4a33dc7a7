"""Golden model: convolutions gathered by bounded LOADs (im2col without an im2col matrix) against a
direct numpy convolution, with padding, stride, dilation, NHWC and NCHW inputs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from systolic.hw.config import AcceleratorConfig
from systolic.hw.isa import Opcode
from systolic.sim.catalogue import (
    CONV_GATHER,
    CONV_NCHW,
    CONV_NHWC,
    CONV_PADDING,
    CONV_RAW,
)
from systolic.sim.golden import run_golden
from systolic.sim.programs import conv_case, conv_reference

CONFIGS = {
    "ws8": AcceleratorConfig(),
    "os8": AcceleratorConfig(dataflow="os"),
    "ws4x8": AcceleratorConfig(rows=4, cols=8, scratchpad_bytes=256, accumulator_bytes=512),
    "os4": AcceleratorConfig(rows=4, cols=4, scratchpad_bytes=64, accumulator_bytes=128,
                             dataflow="os"),
}

# The programs (shapes, seeds, options) come from sim/catalogue.py, which the RTL tests run too.


def _naive_conv(x, w, stride, pad, dilation, pad_value):
    """One output element at a time: the definition of a convolution."""
    h, wd, cin = x.shape
    kh, kw, _, cout = w.shape
    oh = (h + 2 * pad - dilation * (kh - 1) - 1) // stride + 1
    ow = (wd + 2 * pad - dilation * (kw - 1) - 1) // stride + 1
    out = np.zeros((oh, ow, cout), np.int64)
    for oy in range(oh):
        for ox in range(ow):
            for r in range(kh):
                for s in range(kw):
                    y = oy * stride - pad + r * dilation
                    xx = ox * stride - pad + s * dilation
                    pixel = (x[y, xx] if 0 <= y < h and 0 <= xx < wd
                             else np.full(cin, pad_value))
                    out[oy, ox] += pixel.astype(np.int64) @ w[r, s].astype(np.int64)
    return out


@pytest.mark.parametrize("args", [(5, 6, 2, 3, 3, 3, 2, 1, 2), (4, 4, 3, 2, 2, 2, 1, 1, 1),
                                  (1, 5, 1, 1, 1, 3, 1, 1, 1)], ids=str)
def test_reference_is_a_convolution(args):
    h, w, cin, cout, kh, kw, stride, pad, dilation = args
    rng = np.random.default_rng(1)
    x = rng.integers(-128, 128, (h, w, cin))
    weights = rng.integers(-128, 128, (kh, kw, cin, cout))
    np.testing.assert_array_equal(
        conv_reference(x, weights, stride=stride, pad=pad, dilation=dilation, pad_value=-7),
        _naive_conv(x, weights, stride, pad, dilation, -7))


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("spec", CONV_NHWC, ids=lambda s: "_".join(map(str, s.args)))
def test_conv_nhwc(name, spec):
    case = spec.build(CONFIGS[name])
    result = run_golden(case.config, case.program, case.dram)
    case.check(result.dram)
    assert result.macs == case.macs


@pytest.mark.parametrize("name", ["ws8", "os4"])
@pytest.mark.parametrize("spec", CONV_NCHW, ids=lambda s: "_".join(map(str, s.args)))
def test_conv_nchw(name, spec):
    case = spec.build(CONFIGS[name])
    case.check(run_golden(case.config, case.program, case.dram).dram)


@pytest.mark.parametrize("name", ["ws8", "os8"])
def test_raw_conv_output_is_the_direct_convolution(name):
    case = CONV_RAW.build(CONFIGS[name])
    case.check(run_golden(case.config, case.program, case.dram).dram)
    x_addr, _ = case.regions["x"]
    w_addr, _ = case.regions["weights"]
    x = case.dram[x_addr:x_addr + 6 * 6 * 3].view(np.int8).reshape(6, 6, 3)
    w = case.dram[w_addr:w_addr + 9 * 3 * 4].view(np.int8).reshape(3, 3, 3, 4)
    load = next(i for i in case.program.instructions if i.op is Opcode.LOAD and i.bounded)
    np.testing.assert_array_equal(case.expected["out"][1],
                                  _naive_conv(x, w, 1, 1, 1, load.pad_value))


def test_padding_reads_the_zero_point():
    """Padding elements are pad_value (the input zero point), not zero: a 1x1 image with a
    3x3 kernel sees eight padding pixels."""
    case = CONV_PADDING.build(CONFIGS["ws8"])
    loads = [i for i in case.program.instructions if i.op is Opcode.LOAD and i.bounded]
    assert loads and all(i.pad_value == loads[0].pad_value for i in loads)
    assert loads[0].pad_value != 0
    case.check(run_golden(case.config, case.program, case.dram).dram)


def test_no_im2col_matrix_in_dram():
    """The image is gathered in place: the DRAM image holds x, weights, table, output and the
    program, and no LOAD reads outside x, weights and table."""
    case = CONV_GATHER.build(CONFIGS["ws8"])
    assert set(case.regions) == {"x", "weights", "table", "out", "program"}
    assert sum(i.op is Opcode.LOAD and i.bounded for i in case.program.instructions) >= 9


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(CONFIGS)), h=st.integers(1, 9), w=st.integers(1, 9),
       cin=st.integers(1, 9), cout=st.integers(1, 10), kh=st.integers(1, 3), kw=st.integers(1, 3),
       stride=st.integers(1, 3), pad=st.integers(0, 2), dilation=st.integers(1, 2),
       seed=st.integers(0, 1000))
def test_random_convolutions(name, h, w, cin, cout, kh, kw, stride, pad, dilation, seed):
    if h + 2 * pad < dilation * (kh - 1) + 1 or w + 2 * pad < dilation * (kw - 1) + 1:
        return
    case = conv_case(CONFIGS[name], h, w, cin, cout, kh, kw, stride, pad, dilation, seed=seed)
    case.check(run_golden(case.config, case.program, case.dram).dram)
