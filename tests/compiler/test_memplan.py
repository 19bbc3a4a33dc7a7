"""Static DRAM planning (compiler/memplan.py) and its use by the compiler."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
from systolic.compiler.codegen import compile_graph, schedule
from systolic.compiler.frontend import load_model
from systolic.compiler.memplan import ALIGN, Buffer, MemoryPlanError, place, plan_memory
from systolic.compiler.passes import HostFallbackWarning, optimize
from systolic.hw.config import AcceleratorConfig

from tests.compiler import models


def _overlap(a: Buffer, b: Buffer) -> bool:
    size_a = -(-a.nbytes // ALIGN) * ALIGN
    size_b = -(-b.nbytes // ALIGN) * ALIGN
    return a.offset < b.offset + size_b and b.offset < a.offset + size_a


@pytest.mark.parametrize("seed", range(8))
def test_live_buffers_never_share_bytes(seed: int) -> None:
    rng = np.random.default_rng(seed)
    buffers = []
    for i in range(40):
        first = int(rng.integers(0, 30))
        buffers.append(Buffer(i, (f"t{i}",), int(rng.integers(1, 5000)), first,
                              first + int(rng.integers(0, 8))))
    placed, arena = place(buffers)
    for a in placed:
        assert a.offset % ALIGN == 0 and a.offset + a.nbytes <= arena
        for b in placed:
            if a.id < b.id and a.first <= b.last and b.first <= a.last:
                assert not _overlap(a, b), (a, b)
    # sharing: never more than the sum, never less than the largest simultaneous need
    total = sum(-(-b.nbytes // ALIGN) * ALIGN for b in buffers)
    peak = max(sum(-(-b.nbytes // ALIGN) * ALIGN for b in buffers if b.first <= t <= b.last)
               for t in range(40))
    assert peak <= arena <= total
    unshared, top = place(buffers, share=False)
    assert top == total
    assert not any(_overlap(a, b) for a in unshared for b in unshared if a.id < b.id)


def test_constants_first_then_arenas() -> None:
    config = AcceleratorConfig()
    buffers = [Buffer(0, ("a",), 100, 0, 1), Buffer(1, ("b", "b_view"), 300, 1, 2)]
    plan = plan_memory(config, buffers, {"w": np.zeros(70, np.int8), "t": b"x" * 5}, images=2)
    assert [(c.address, c.nbytes) for c in plan.constants.values()] == [(0, 70), (128, 5)]
    assert plan.arena_base == 192
    assert plan.address("b") == plan.address("b_view")
    assert plan.address("a", 1) == plan.address("a") + plan.arena_bytes
    assert plan.buffer_id("a", 1) == 2
    assert plan.programs_base == 192 + 2 * plan.arena_bytes
    assert plan.summary()["buffers"][1]["tensors"] == ["b", "b_view"]


def test_dram_too_small_names_the_sizes() -> None:
    config = AcceleratorConfig(dram_bytes=4096)
    buffers = [Buffer(0, ("a",), 5000, 0, 1)]
    with pytest.raises(MemoryPlanError, match=re.escape(
            "the model needs 5120 bytes of DRAM (constants 64, activations 1 x 5056, programs 0), "
            "but the config has dram_bytes=4096")):
        plan_memory(config, buffers, {"w": np.zeros(10, np.int8)})


def _residual_graph(config: AcceleratorConfig):
    fm = models.residual_add()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostFallbackWarning)
        return optimize(load_model(fm), calibration=models.calibration_set(fm, 3), config=config)


def test_compiled_model_shares_dead_activations() -> None:
    graph = _residual_graph(AcceleratorConfig())
    shared = compile_graph(graph)
    separate = compile_graph(graph, keep_intermediates=True)
    plan = shared.plan
    assert plan.arena_bytes < separate.plan.arena_bytes
    assert separate.plan.arena_bytes == sum(-(-b.nbytes // ALIGN) * ALIGN for b in plan.buffers)
    # an op never reads and writes the same bytes
    for op in graph.accel_ops:
        out = plan.buffers[plan.buffer_of[op.output]]
        for name in op.inputs:
            assert not _overlap(out, plan.buffers[plan.buffer_of[name]]), op.name
    data = plan_data = shared.plan_dict()
    assert data["dram"]["arena_bytes"] == plan.arena_bytes
    assert plan_data["dram"]["live_peak_bytes"] <= plan.arena_bytes
    assert data["dram"]["total_bytes"] == shared.image.size


def test_views_share_their_source_buffer() -> None:
    """The digits model's Flatten is a Reshape view of the second conv's output: one buffer,
    no host step between the convs and the gemms."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostFallbackWarning)
        graph = optimize(load_model(models.conv_relu_pool_gemm()),
                         calibration=models.calibration_set(models.conv_relu_pool_gemm(), 2))
    steps, dram, views = schedule(graph)
    assert [s.kind for s in steps].count("accel") == 1
    assert len(views) == 1
    view = next(iter(views))
    model = compile_graph(graph)
    assert model.plan.address(view.inputs[0]) == model.plan.address(view.outputs[0])


def test_model_larger_than_dram() -> None:
    graph = _residual_graph(AcceleratorConfig(dram_bytes=4096))
    with pytest.raises(MemoryPlanError, match=r"^the model needs \d+ bytes of DRAM \(constants \d+, "
                                              r"activations 1 x \d+, programs \d+\), but the config "
                                              r"has dram_bytes=4096; even with one program in DRAM at a "
                                              r"time, layer 'stem' alone needs a program of \d+ bytes and "
                                              r"\d+ are left after the constants and activations$"):
        compile_graph(graph)
