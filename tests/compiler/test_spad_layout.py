"""The scratchpad layout of conv/gemm tilings (compiler/lower.py, ``spad_layout``): the A and B
operand areas lie in different scratchpad banks whenever both fit, because a bank serves one read
per cycle and the array reads an A row and a B row in the same cycle (hw/scratchpad.py gives each
half the rate when they meet: on the RTL the 64x64x64 GEMM of bench/gemm_utilization.py took 5190
cycles with A and B in one bank, 4702 with them apart). When the split does not fit, B follows A.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from systolic.compiler import compile_model, lower
from systolic.compiler.reference import execute
from systolic.compiler.runtime import run_model
from systolic.hw.config import AcceleratorConfig
from systolic.hw.isa import Opcode

from . import models

CONFIGS = {
    "ws8": AcceleratorConfig(),
    "os8": AcceleratorConfig(dataflow="os"),
    "ws8-4banks": AcceleratorConfig(scratchpad_banks=4, scratchpad_bytes=16 * 1024),
    # 128 rows in two banks of 64: most tilings cannot put A and B apart
    "ws4x8-tiny": AcceleratorConfig(rows=4, cols=8, scratchpad_bytes=1024, accumulator_bytes=2048,
                                    requant_table_rows=2, dma_data_bits=32),
}


def _matmul(config: AcceleratorConfig, m: int, k: int, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    weights = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    model = models.single_node("MatMul", [("input", [m, k])], [("out", [m, n])], {"w": weights})
    calibration = {"input": rng.uniform(-1, 1, (4 * m, k)).astype(np.float32)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = compile_model(model, config=config, calibration=calibration)
    x = {"input": rng.uniform(-1, 1, (m, k)).astype(np.float32)}
    return compiled, x


def _banks(config: AcceleratorConfig, first: int, count: int) -> set[int]:
    return set(range(first // config.spad_bank_rows, (first + count - 1) // config.spad_bank_rows + 1))


@pytest.mark.parametrize("name, shape", [("ws8", (64, 64, 64)), ("ws8", (37, 45, 29)),
                                         ("os8", (64, 64, 64)), ("os8", (20, 30, 12)),
                                         ("ws8-4banks", (96, 72, 40))])
def test_compiled_gemm_reads_a_and_b_from_different_banks(name: str, shape: tuple[int, int, int]
                                                          ) -> None:
    """Every COMPUTE of the compiled GEMM reads its A rows and its B rows in disjoint sets of
    banks, and the program computes what the reference executor does."""
    config = CONFIGS[name]
    compiled, x = _matmul(config, *shape)
    computes = [i for seg in compiled.segments for i in seg.program.instructions
                if i.op == Opcode.COMPUTE]
    assert computes
    for instr in computes:
        f = instr.fields
        a_rows = f["m"] if config.dataflow == "ws" else f["k"]
        a, b = _banks(config, f["a_addr"], a_rows), _banks(config, f["b_addr"], f["k"])
        assert not a & b, (f, a, b)
    result = run_model(compiled, x)
    expected = execute(compiled.graph, x)
    np.testing.assert_array_equal(result.outputs["out"], expected["out"])


def test_b_follows_a_when_the_split_does_not_fit() -> None:
    """On a 128-row scratchpad some candidate tilings need more rows than A and B in separate
    banks take: their B area follows the A area; the others start B at a bank boundary. Both
    kinds fit the scratchpad, and the chosen one runs bit-exact."""
    config = CONFIGS["ws4x8-tiny"]
    compiled, x = _matmul(config, 40, 36, 20)
    layer = compiled.segments[0].layers[0]
    graph = compiled.graph
    op = graph.accel_ops[0]
    geo = lower.geometry(op, graph)
    count = len(lower.ktiles(geo, config, lower.n_tiles(geo, config)[0]))
    bank = config.spad_bank_rows
    split = packed = 0
    for tiling in lower.candidate_tilings(op, geo, config):
        a_rows = lower.a_rows_per_ktile(config, lower.blocks(geo, tiling.budget))
        a_base, a_size, b_base, b_size = lower.spad_layout(geo, config, tiling, a_rows, count)
        assert a_base == 0 and b_base >= 2 * a_size
        assert b_base + 2 * b_size <= config.spad_rows
        assert lower.spad_rows_needed(geo, config, tiling, a_rows, count) == b_base + 2 * b_size
        boundary = -(-2 * a_size // bank) * bank
        if boundary + 2 * b_size <= config.spad_rows:
            assert b_base == boundary
            assert not _banks(config, 0, 2 * a_size) & _banks(config, b_base, 2 * b_size)
            split += 1
        else:
            assert b_base == 2 * a_size
            packed += 1
    assert split and packed
    assert layer.scratchpad_rows <= config.spad_rows
    result = run_model(compiled, x)
    np.testing.assert_array_equal(result.outputs["out"], execute(graph, x)["out"])
