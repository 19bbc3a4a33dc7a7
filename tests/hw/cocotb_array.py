"""cocotb testbench of the generated SystolicArray Verilog (run by tests/hw/test_array_cocotb.py
through ``cocotb_tools.runner`` on Verilator).

Small parts, as in cocotb's matrix_multiplier example: :class:`StreamDriver` offers beats on a
valid/ready port with random idle cycles, :class:`StreamMonitor` takes result rows with a random
ready, :class:`ReferenceModel` computes the expected rows with numpy, :class:`Checker` compares.
The configuration arrives as JSON in SYSTOLIC_ARRAY_CONFIG; SYSTOLIC_COCOTB_SAMPLES sets the
number of random tiles (default 6, so that CI stays fast; raise it locally).
"""

from __future__ import annotations

import json
import os
import random
from typing import Any

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge
from systolic.hw.array import input_layout, os_cycles, output_layout, weight_layout, ws_cycles
from systolic.hw.config import AcceleratorConfig
from systolic.sim.arith import wrap

__all__ = ["StreamDriver", "StreamMonitor", "CycleCounter", "ReferenceModel", "Checker",
           "random_tiles_with_backpressure", "back_to_back_cycle_count"]

CONFIG_ENV = "SYSTOLIC_ARRAY_CONFIG"
SAMPLES_ENV = "SYSTOLIC_COCOTB_SAMPLES"


def _config() -> AcceleratorConfig:
    return AcceleratorConfig.from_dict(json.loads(os.environ[CONFIG_ENV]), source=CONFIG_ENV)


def _samples() -> int:
    text = os.environ.get(SAMPLES_ENV, "6")
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{SAMPLES_ENV} must be a positive integer, not {text!r}")
    return int(text)


def _unsigned(handle: Any) -> int:
    value = handle.value
    return value.to_unsigned() if hasattr(value, "to_unsigned") else int(value)


class StreamDriver:
    """Offers beats (dicts of a payload layout's fields) on ``<name>__valid/ready/payload``,
    idling before each beat with probability ``gap``; records the cycle of every handshake."""

    def __init__(self, dut: Any, name: str, layout: Any, rng: random.Random, gap: float) -> None:
        self.clk = dut.clk
        self.valid = getattr(dut, f"{name}__valid")
        self.ready = getattr(dut, f"{name}__ready")
        self.payload = getattr(dut, f"{name}__payload")
        self.layout = layout
        self.rng = rng
        self.gap = gap
        self.valid.value = 0

    async def send(self, beats: list[dict[str, Any]], clock: CycleCounter) -> list[int]:
        fired = []
        for beat in beats:
            while self.rng.random() < self.gap:
                await RisingEdge(self.clk)
            self.valid.value = 1
            self.payload.value = self.layout.const(beat).as_value().value
            while True:
                await ReadOnly()                # settled: the handshake at the coming edge
                accepted = bool(_unsigned(self.ready))
                cycle = clock.cycle
                await RisingEdge(self.clk)
                if accepted:
                    fired.append(cycle)
                    break
            self.valid.value = 0
        return fired


class StreamMonitor:
    """Takes ``count`` result rows from ``outputs__*``, ready with probability ``ready``."""

    def __init__(self, dut: Any, layout: Any, rng: random.Random, ready: float) -> None:
        self.clk = dut.clk
        self.valid = dut.outputs__valid
        self.ready = dut.outputs__ready
        self.payload = dut.outputs__payload
        self.layout = layout
        self.rng = rng
        self.ready_probability = ready
        self.ready.value = 0

    async def receive(self, count: int, clock: CycleCounter, limit: int) -> tuple[list, list, list]:
        rows, lasts, fired = [], [], []
        for _ in range(limit):
            if len(rows) == count:
                break
            take = self.rng.random() < self.ready_probability
            self.ready.value = int(take)
            await ReadOnly()
            if take and _unsigned(self.valid):
                beat = self.layout.from_bits(_unsigned(self.payload))
                rows.append(list(beat.data))
                lasts.append(beat.last)
                fired.append(clock.cycle)
            await RisingEdge(self.clk)
        self.ready.value = 0
        return rows, lasts, fired


class CycleCounter:
    """Counts rising edges since reset was released."""

    def __init__(self, clk: Any) -> None:
        self.cycle = 0
        self.clk = clk
        cocotb.start_soon(self._count())

    async def _count(self) -> None:
        while True:
            await RisingEdge(self.clk)
            self.cycle += 1


class ReferenceModel:
    """Random tiles as the array's caller streams them, and numpy's results for them."""

    def __init__(self, config: AcceleratorConfig, rng: np.random.Generator) -> None:
        self.config = config
        self.rng = rng

    def values(self, value_range: tuple[int, int], shape: tuple[int, ...]) -> np.ndarray:
        lo, hi = value_range
        out = self.rng.integers(lo, hi + 1, shape, dtype=np.int64)
        pick = self.rng.random(shape)
        out[pick < 0.15] = lo
        out[(pick >= 0.15) & (pick < 0.25)] = hi
        return out

    def ws_tiles(self, count: int, *, m: int | None = None, k: int | None = None) -> list[dict]:
        """Tiles {a: m x R, w: k x C or None}; with m and k given, fixed-size preloaded tiles."""
        rows, cols = self.config.rows, self.config.cols
        tiles = []
        for index in range(count):
            tile_m = m or int(self.rng.integers(1, 2 * rows + 1))
            a = self.values(self.config.input_range, (tile_m, rows))
            if m is None and index and self.rng.random() < 0.25:
                tiles.append({"a": a, "w": None})
                continue
            tile_k = k or int(self.rng.integers(1, rows + 1))
            n = cols if k else int(self.rng.integers(1, cols + 1))
            w = self.values(self.config.weight_range, (tile_k, cols))
            w[:, n:] = 0
            tiles.append({"a": a, "w": w})
        return tiles

    def os_tiles(self, count: int, *, k: int | None = None) -> list[dict]:
        rows, cols = self.config.rows, self.config.cols
        tiles = []
        for _ in range(count):
            tile_k = k or int(self.rng.integers(1, 2 * rows + 2))
            n = cols if k else int(self.rng.integers(1, cols + 1))
            b = self.values(self.config.weight_range, (tile_k, cols))
            b[:, n:] = 0
            tiles.append({"a": self.values(self.config.input_range, (rows, tile_k)), "b": b})
        return tiles

    def expected(self, tiles: list[dict]) -> tuple[np.ndarray, list[int]]:
        config = self.config
        out, lasts = [], []
        if config.dataflow == "ws":
            stationary = np.zeros((config.rows, config.cols), dtype=np.int64)
            for tile in tiles:
                if tile["w"] is not None:
                    stationary = np.zeros_like(stationary)
                    stationary[:len(tile["w"])] = tile["w"]
                out.append(tile["a"] @ stationary)
                lasts += [0] * (len(tile["a"]) - 1) + [1]
        else:
            for tile in tiles:
                out.append(tile["a"] @ tile["b"])
                lasts += [0] * (config.rows - 1) + [1]
        return wrap(np.vstack(out), config.acc_bits, config.acc_signed), lasts

    def beats(self, tiles: list[dict]) -> tuple[list[dict], list[dict]]:
        """(weight beats, input beats) for the tiles."""
        if self.config.dataflow == "ws":
            weights = [{"data": t["w"][i].tolist(), "last": int(i == len(t["w"]) - 1)}
                       for t in tiles if t["w"] is not None for i in range(len(t["w"]))]
            inputs = [{"data": t["a"][r].tolist(), "new_weights": int(r == 0 and t["w"] is not None),
                       "last": int(r == len(t["a"]) - 1)} for t in tiles for r in range(len(t["a"]))]
            return weights, inputs
        inputs = [{"a": t["a"][:, k].tolist(), "b": t["b"][k].tolist(), "last": int(k == len(t["b"]) - 1)}
                  for t in tiles for k in range(len(t["b"]))]
        return [], inputs


class Checker:
    """Compares received rows and ``last`` flags with the reference, naming the first difference."""

    def __init__(self, expected: np.ndarray, lasts: list[int]) -> None:
        self.expected = expected
        self.lasts = lasts

    def check(self, rows: list[list[int]], lasts: list[int]) -> None:
        assert len(rows) == len(self.expected), f"got {len(rows)} result rows, expected {len(self.expected)}"
        got = np.array(rows, dtype=np.int64)
        wrong = np.argwhere(got != self.expected)
        assert not len(wrong), (f"{len(wrong)} wrong elements; row {wrong[0][0]}, column {wrong[0][1]}: "
                                f"got {got[tuple(wrong[0])]}, expected {self.expected[tuple(wrong[0])]}")
        assert lasts == self.lasts, "last flags differ"


async def _start(dut: Any) -> CycleCounter:
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    dut.rst.value = 1
    for _ in range(3):
        await RisingEdge(dut.clk)
    dut.rst.value = 0
    return CycleCounter(dut.clk)


async def _stream(dut: Any, config: AcceleratorConfig, model: ReferenceModel, tiles: list[dict],
                  seed: int, gap: float, ready: float) -> tuple[list, list, dict[str, list[int]]]:
    rng = random.Random(seed)
    clock = await _start(dut)
    weight_beats, input_beats = model.beats(tiles)
    expected, _ = model.expected(tiles)
    tasks = {}
    if config.dataflow == "ws":
        weights = StreamDriver(dut, "weights", weight_layout(config), rng, gap)
        tasks["weights"] = cocotb.start_soon(weights.send(weight_beats, clock))
    inputs = StreamDriver(dut, "inputs", input_layout(config), rng, gap)
    tasks["inputs"] = cocotb.start_soon(inputs.send(input_beats, clock))
    monitor = StreamMonitor(dut, output_layout(config), rng, ready)
    limit = int((4 * len(input_beats) + 8 * len(weight_beats) + 20 * (config.rows + config.cols) + 100)
                / max(ready, 0.05))
    rows, lasts, fired = await monitor.receive(len(expected), clock, limit)
    fires = {name: await task for name, task in tasks.items()}
    fires["outputs"] = fired
    return rows, lasts, fires


@cocotb.test()
async def random_tiles_with_backpressure(dut: Any) -> None:
    """SYSTOLIC_COCOTB_SAMPLES random tiles (partial K/N, reused weights, extremes), random gaps
    on the inputs and a random ready on the output."""
    config = _config()
    model = ReferenceModel(config, np.random.default_rng(cocotb.RANDOM_SEED))
    count = _samples()
    tiles = model.ws_tiles(count) if config.dataflow == "ws" else model.os_tiles(count)
    rows, lasts, _ = await _stream(dut, config, model, tiles, cocotb.RANDOM_SEED, gap=0.2, ready=0.6)
    Checker(*model.expected(tiles)).check(rows, lasts)


@cocotb.test()
async def back_to_back_cycle_count(dut: Any) -> None:
    """Full tiles streamed back to back finish exactly when the documented formula says."""
    config = _config()
    model = ReferenceModel(config, np.random.default_rng(cocotb.RANDOM_SEED + 1))
    count = max(3, min(_samples(), 8))
    rows_ = config.rows
    if config.dataflow == "ws":
        tiles = model.ws_tiles(count, m=rows_ + 1, k=rows_)
        first = "weights"
        formula = ws_cycles(config, m=rows_ + 1, k=rows_, tiles=count)
    else:
        tiles = model.os_tiles(count, k=rows_)
        first = "inputs"
        formula = os_cycles(config, k=rows_, tiles=count)
    rows, lasts, fires = await _stream(dut, config, model, tiles, 1, gap=0.0, ready=1.0)
    Checker(*model.expected(tiles)).check(rows, lasts)
    measured = fires["outputs"][-1] - fires[first][0] + 1
    assert measured == formula, f"{count} tiles took {measured} cycles, the formula says {formula}"
    inputs = fires["inputs"]
    assert inputs == list(range(inputs[0], inputs[0] + len(inputs))), "bubble in the input stream"
