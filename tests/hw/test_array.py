# amaranth: UnusedElaboratable=no
"""SystolicArray in the Amaranth simulator against numpy: both dataflows, random tile sequences
with extremes, partial tiles, back-pressure, and the documented cycle formulas."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest
from amaranth import Const, Module, Signal, signed, unsigned
from amaranth.back import rtlil
from amaranth.hdl import EnableInserter
from amaranth.sim import Simulator
from systolic.hw.array import (
    LUTRAM_DELAY_DEPTH,
    LUTRAM_DELAY_MIN,
    SystolicArray,
    _delay,
    array_latency,
    column_sum_shape,
    default_stall_stages,
    input_layout,
    os_cycles,
    output_layout,
    weight_layout,
    ws_cycles,
)
from systolic.hw.config import AcceleratorConfig
from systolic.sim.arith import wrap

from tests.hw.streams import stream_put

SIZES = [(2, 2), (4, 4), (4, 8), (8, 4)]


def _values(rng: np.random.Generator, value_range: tuple[int, int], shape) -> np.ndarray:
    """Random integers in the inclusive range, with both extremes and zero mixed in."""
    lo, hi = value_range
    values = rng.integers(lo, hi + 1, shape, dtype=np.int64)
    pick = rng.random(shape)
    values[pick < 0.15] = lo
    values[(pick >= 0.15) & (pick < 0.25)] = hi
    values[(pick >= 0.25) & (pick < 0.3)] = 0
    return values


# -- tiles and their numpy reference ---------------------------------------------------------------

@dataclass
class WsTile:
    """One weight-stationary tile as the caller streams it: ``a`` is m x R (elements k.. are
    whatever the scratchpad row holds), ``w`` is k x C with columns n.. zero, or None to reuse
    the previous preload."""
    a: np.ndarray
    w: np.ndarray | None


@dataclass
class OsTile:
    """One output-stationary tile: ``a`` is R x K (rows m.. are whatever the scratchpad holds),
    ``b`` is K x C with columns n.. zero."""
    a: np.ndarray
    b: np.ndarray


def ws_reference(config: AcceleratorConfig, tiles: list[WsTile]) -> tuple[np.ndarray, list[int]]:
    """P = A . W per tile (W zero past the preloaded rows), wrapped to acc_bits; and the
    ``last`` flag of every result row."""
    stationary = np.zeros((config.rows, config.cols), dtype=np.int64)
    rows, lasts = [], []
    for tile in tiles:
        if tile.w is not None:
            stationary = np.zeros((config.rows, config.cols), dtype=np.int64)
            stationary[:len(tile.w)] = tile.w
        rows.append(wrap(tile.a @ stationary, config.acc_bits, config.acc_signed))
        lasts += [0] * (len(tile.a) - 1) + [1]
    return np.vstack(rows), lasts


def os_reference(config: AcceleratorConfig, tiles: list[OsTile]) -> tuple[np.ndarray, list[int]]:
    rows = [wrap(tile.a @ tile.b, config.acc_bits, config.acc_signed) for tile in tiles]
    lasts = ([0] * (config.rows - 1) + [1]) * len(tiles)
    return np.vstack(rows), lasts


def random_ws_tiles(config: AcceleratorConfig, rng: np.random.Generator, count: int,
                    *, max_m: int | None = None) -> list[WsTile]:
    tiles = []
    max_m = max_m or 2 * config.rows
    for index in range(count):
        m = int(rng.integers(1, max_m + 1))
        a = _values(rng, config.input_range, (m, config.rows))
        if index and rng.random() < 0.3:
            tiles.append(WsTile(a, None))
            continue
        k = int(rng.integers(1, config.rows + 1))
        n = int(rng.integers(1, config.cols + 1))
        w = _values(rng, config.weight_range, (k, config.cols))
        w[:, n:] = 0
        tiles.append(WsTile(a, w))
    return tiles


def random_os_tiles(config: AcceleratorConfig, rng: np.random.Generator, count: int,
                    *, max_k: int | None = None) -> list[OsTile]:
    tiles = []
    max_k = max_k or 2 * config.rows
    for _ in range(count):
        k = int(rng.integers(1, max_k + 1))
        n = int(rng.integers(1, config.cols + 1))
        b = _values(rng, config.weight_range, (k, config.cols))
        b[:, n:] = 0
        tiles.append(OsTile(_values(rng, config.input_range, (config.rows, k)), b))
    return tiles


# -- simulation harness ----------------------------------------------------------------------------

@dataclass
class Run:
    """What one simulation saw: result rows and flags, and the cycle of every handshake."""
    rows: list[list[int]] = field(default_factory=list)
    lasts: list[int] = field(default_factory=list)
    fires: dict[str, list[int]] = field(default_factory=dict)


def simulate(config: AcceleratorConfig, tiles: list, *, seed: int = 0, gap: float = 0.0,
             ready: float = 1.0, weight_delay: int = 0, stall_stages: int | None = None,
             lutram_delays: bool | None = None, backpressure: bool = True) -> Run:
    """Stream ``tiles`` through a SystolicArray: producers idle before a beat with probability
    ``gap``, the consumer is ready with probability ``ready`` each cycle (without
    ``backpressure`` it takes every row: ``ready`` must be 1)."""
    assert backpressure or ready == 1.0
    dut = SystolicArray(config, stall_stages=stall_stages, lutram_delays=lutram_delays,
                        backpressure=backpressure)
    rng = np.random.default_rng(seed)
    run = Run(fires={"weights": [], "inputs": [], "outputs": []})
    ws = config.dataflow == "ws"
    expected_rows = sum(len(t.a) for t in tiles) if ws else config.rows * len(tiles)

    if ws:
        weight_beats = [{"data": tile.w[i].tolist(), "last": int(i == len(tile.w) - 1)}
                        for tile in tiles if tile.w is not None for i in range(len(tile.w))]
        input_beats = [{"data": tile.a[r].tolist(), "new_weights": int(r == 0 and tile.w is not None),
                        "last": int(r == len(tile.a) - 1)}
                       for tile in tiles for r in range(len(tile.a))]
    else:
        weight_beats = []
        input_beats = [{"a": tile.a[:, k].tolist(), "b": tile.b[k].tolist(),
                        "last": int(k == tile.b.shape[0] - 1)}
                       for tile in tiles for k in range(tile.b.shape[0])]

    async def idle(ctx):
        while gap and rng.random() < gap:
            await ctx.tick()

    async def weight_driver(ctx):
        for _ in range(weight_delay):
            await ctx.tick()
        for beat in weight_beats:
            await idle(ctx)
            await stream_put(ctx, dut.weights, beat)

    async def input_driver(ctx):
        for beat in input_beats:
            await idle(ctx)
            await stream_put(ctx, dut.inputs, beat)

    budget = int((4 * len(input_beats) + 8 * len(weight_beats) + 20 * (config.rows + config.cols)
                  + weight_delay + 100) / max(ready, 0.05))

    async def consumer(ctx):
        for _ in range(budget):
            if len(run.rows) == expected_rows:
                break
            take = bool(rng.random() < ready)
            if backpressure:
                ctx.set(dut.outputs.ready, take)
            _, _, valid, payload = await ctx.tick().sample(dut.outputs.valid, dut.outputs.payload)
            if take and valid:
                run.rows.append(list(payload.data))
                run.lasts.append(payload.last)

    async def monitor(ctx):
        streams = {"inputs": dut.inputs, "outputs": dut.outputs}
        if ws:
            streams["weights"] = dut.weights
        names = list(streams)
        signals = [s for name in names for s in (streams[name].valid, streams[name].ready)]
        cycle = 0
        async for _, _, *values in ctx.tick().sample(*signals):
            for index, name in enumerate(names):
                if values[2 * index] and values[2 * index + 1]:
                    run.fires[name].append(cycle)
            cycle += 1

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    if ws:
        sim.add_testbench(weight_driver, background=True)
    sim.add_testbench(input_driver, background=True)
    sim.add_testbench(monitor, background=True)
    sim.add_testbench(consumer)
    sim.run()
    assert len(run.rows) == expected_rows, \
        f"only {len(run.rows)} of {expected_rows} result rows arrived in {budget} cycles"
    return run


def check(config: AcceleratorConfig, tiles: list, run: Run) -> None:
    reference = ws_reference if config.dataflow == "ws" else os_reference
    expected, lasts = reference(config, tiles)
    got = np.array(run.rows, dtype=np.int64)
    mismatch = np.argwhere(got != expected)
    assert not len(mismatch), (f"{len(mismatch)} wrong elements, first at row/col "
                               f"{mismatch[0].tolist()}: got {got[tuple(mismatch[0])]}, "
                               f"expected {expected[tuple(mismatch[0])]}")
    assert run.lasts == lasts


def config_for(dataflow: str, rows: int, cols: int, **kwargs) -> AcceleratorConfig:
    return AcceleratorConfig(rows=rows, cols=cols, dataflow=dataflow, **kwargs)


# -- weight-stationary -----------------------------------------------------------------------------

@pytest.mark.parametrize("rows, cols", SIZES)
def test_ws_random_tiles_with_backpressure(rows: int, cols: int) -> None:
    config = config_for("ws", rows, cols)
    rng = np.random.default_rng(rows * 100 + cols)
    tiles = random_ws_tiles(config, rng, 7)
    check(config, tiles, simulate(config, tiles, seed=rows + cols, gap=0.25, ready=0.6))


@pytest.mark.parametrize("kwargs", [
    {"acc_bits": 16},                                            # wraps
    {"input_bits": 16, "weight_bits": 16},                       # (-32768)^2 * 4 wraps to 0
    {"input_signed": False, "weight_signed": False, "acc_signed": False},
    {"input_signed": False},                                     # mixed signedness
    {"weight_bits": 16, "input_bits": 8},
    {"array_lut_multipliers": 10},                               # PEs 6..15 multiply in logic
    {"array_lut_multipliers": 16, "input_signed": False},
    {"array_bram_multipliers": 6, "array_lut_multipliers": 4},  # PEs 6..11 in block RAM, 12..15 logic
    {"array_bram_multipliers": 16, "input_signed": False, "weight_signed": False, "acc_signed": False},
])
def test_ws_element_types(kwargs: dict) -> None:
    config = config_for("ws", 4, 4, **kwargs)
    rng = np.random.default_rng(len(kwargs) + 3)
    tiles = random_ws_tiles(config, rng, 4)
    lo_in, _ = config.input_range
    lo_w, hi_w = config.weight_range
    # all-extreme tiles: min x min (and max x min) over the full reduction depth
    tiles.append(WsTile(np.full((3, 4), lo_in), np.full((4, 4), lo_w)))
    tiles.append(WsTile(np.full((2, 4), config.input_range[1]), np.full((4, 4), hi_w)))
    check(config, tiles, simulate(config, tiles, seed=7, gap=0.1, ready=0.7))


def test_ws_extreme_products_sum_exactly() -> None:
    config = config_for("ws", 4, 4)
    a = np.full((5, 4), -128)
    w = np.full((4, 4), -128)
    run = simulate(config, [WsTile(a, w)])
    assert run.rows == [[4 * 16384] * 4] * 5
    check(config, [WsTile(a, w)], run)


@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (1, 4, 8), (9, 4, 1), (1, 1, 8), (6, 1, 1), (3, 2, 5)])
def test_ws_degenerate_and_partial_tiles(m: int, k: int, n: int) -> None:
    """1xN and Nx1 results, a single reduction row, partial K and N; the elements of A past k
    hold garbage that must meet zero weights."""
    config = config_for("ws", 4, 8)
    rng = np.random.default_rng(m * 31 + k * 7 + n)
    w = _values(rng, config.weight_range, (k, 8))
    w[:, n:] = 0
    a = _values(rng, config.input_range, (m, 4))
    tiles = [WsTile(a, w), WsTile(_values(rng, config.input_range, (m, 4)), None)]
    run = simulate(config, tiles, seed=m + k + n, ready=0.8)
    check(config, tiles, run)
    got = np.array(run.rows)
    assert not got[:, n:].any(), "columns past n must be zero"


def test_ws_short_preload_clears_stale_rows() -> None:
    """A full preload, then a 1-row preload: rows 1..R-1 of the second must read as zero."""
    config = config_for("ws", 4, 4)
    rng = np.random.default_rng(9)
    full = _values(rng, config.weight_range, (4, 4))
    one = _values(rng, config.weight_range, (1, 4))
    a = np.full((3, 4), 77)
    tiles = [WsTile(a, full), WsTile(a, one), WsTile(a, None)]
    run = simulate(config, tiles, gap=0.3)
    check(config, tiles, run)
    assert run.rows[3] == (77 * one[0]).tolist()


def test_ws_inputs_wait_for_their_preload() -> None:
    """The input stream is offered long before the weights arrive: the first row must wait."""
    config = config_for("ws", 2, 4)
    rng = np.random.default_rng(4)
    tiles = random_ws_tiles(config, rng, 3)
    run = simulate(config, tiles, weight_delay=25)
    check(config, tiles, run)
    assert run.fires["inputs"][0] > run.fires["weights"][len(tiles[0].w) - 1]


def test_ws_heavy_backpressure_loses_nothing() -> None:
    config = config_for("ws", 4, 4)
    rng = np.random.default_rng(12)
    tiles = random_ws_tiles(config, rng, 5)
    check(config, tiles, simulate(config, tiles, seed=3, ready=0.15))


@pytest.mark.parametrize("rows, cols, m, k, tiles", [
    (2, 2, 2, 2, 6), (4, 4, 4, 4, 5), (4, 4, 7, 3, 4), (4, 8, 2, 4, 4), (8, 4, 8, 8, 3),
    (4, 4, 1, 1, 6),
])
def test_ws_back_to_back_cycle_count(rows: int, cols: int, m: int, k: int, tiles: int) -> None:
    """T preloaded tiles streamed back to back take exactly ws_cycles() cycles; with m > k the
    input stream moves every cycle from its first row to its last (R*C MACs every cycle)."""
    config = config_for("ws", rows, cols)
    rng = np.random.default_rng(m * k + tiles)
    sequence = [WsTile(_values(rng, config.input_range, (m, rows)),
                       _values(rng, config.weight_range, (k, cols))) for _ in range(tiles)]
    run = simulate(config, sequence)
    check(config, sequence, run)
    measured = run.fires["outputs"][-1] - run.fires["weights"][0] + 1
    assert measured == ws_cycles(config, m=m, k=k, tiles=tiles)
    assert measured == k + (tiles - 1) * max(m, k + 1) + m + rows + cols + 4
    fires = run.fires["inputs"]
    if m > k:
        assert fires == list(range(fires[0], fires[0] + m * tiles)), "bubble in the input stream"
    assert run.fires["outputs"][0] - fires[0] == array_latency(config)


# -- narrow partial sums ---------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, products, shape", [
    ({}, 16, signed(20)),                # 16 * (-128 * -128) = 2**18 needs 20 bits
    ({}, 1, signed(16)),                 # -128 * -128 = 2**14
    ({}, 2, signed(17)),
    ({"input_signed": False, "weight_signed": False, "acc_signed": False}, 16, unsigned(20)),
    ({"input_signed": False}, 16, signed(20)),          # 16 * 255 * -128 = -522240 > -2**19
    ({"input_signed": False}, 17, signed(21)),
    ({"acc_bits": 16}, 4, signed(16)),   # the exact bound (18 bits) is wider: acc_bits, wraps
    ({"input_bits": 16, "weight_bits": 16}, 2, signed(32)),
])
def test_column_sum_shape(kwargs: dict, products: int, shape) -> None:
    assert column_sum_shape(config_for("ws", 16, 4, **kwargs), products) == shape


def test_column_sum_shape_rejects_no_products() -> None:
    with pytest.raises(ValueError, match=r"^products must be at least 1, not 0$"):
        column_sum_shape(config_for("ws", 4, 4), 0)


def _extreme_ws_tiles(config: AcceleratorConfig) -> list[WsTile]:
    """Every PE row multiplies the same extreme pair: min x min, min x max, max x min,
    max x max over the full depth (the bound of the column's partial sums), then a mixed tile."""
    rows, cols = config.rows, config.cols
    (lo_a, hi_a), (lo_w, hi_w) = config.input_range, config.weight_range
    tiles = [WsTile(np.full((2, rows), x), np.full((rows, cols), y))
             for x in (lo_a, hi_a) for y in (lo_w, hi_w)]
    mixed_w = np.where(np.arange(cols) % 2, hi_w, lo_w)[None, :].repeat(rows, 0)
    tiles.append(WsTile(np.array([[lo_a] * rows, [hi_a] * rows, [lo_a, hi_a] * (rows // 2)]), mixed_w))
    return tiles


@pytest.mark.parametrize("kwargs", [
    {},                                                          # 20-bit column sums
    {"input_signed": False, "weight_signed": False, "acc_signed": False},
    {"input_signed": False},
    {"acc_bits": 16},                                            # wraps past row 1
    {"array_lut_multipliers": 20},
    {"array_bram_multipliers": 24, "array_lut_multipliers": 4},
])
def test_ws_16_rows_extreme_sums_exact(kwargs: dict) -> None:
    """16 rows of extreme products: the narrowed partial sums hold every column sum exactly
    (-128 * -128 * 16 = 2**18 included) and the bottom extends them to acc_bits."""
    config = config_for("ws", 16, 2, **kwargs)
    tiles = _extreme_ws_tiles(config)
    run = simulate(config, tiles, seed=1, ready=0.7)
    check(config, tiles, run)
    if not kwargs:
        assert run.rows[0] == [16 * 16384] * 2 and run.rows[2] == [16 * -128 * 127] * 2


# -- registered stall ------------------------------------------------------------------------------

def test_default_stall_stages() -> None:
    assert [default_stall_stages(config_for("ws", r, c)) for r, c in
            [(2, 2), (4, 4), (4, 8), (8, 8), (8, 16), (16, 16)]] == [0, 0, 1, 1, 3, 3]
    assert SystolicArray(config_for("ws", 16, 16)).skid_depth == 6


@pytest.mark.parametrize("dataflow", ["ws", "os"])
@pytest.mark.parametrize("stall_stages", [0, 1, 2, 3])
def test_stall_stages_lose_nothing(dataflow: str, stall_stages: int) -> None:
    """Random tiles and a consumer that is ready 15% / 60% of the cycles: every result row
    arrives once, in order, with any number of stall stages (the skid buffer takes the rows
    the pipeline produces while the stall travels)."""
    config = config_for(dataflow, 4, 4)
    rng = np.random.default_rng(40 + stall_stages)
    make = random_ws_tiles if dataflow == "ws" else random_os_tiles
    for ready, gap in ((0.15, 0.0), (0.6, 0.2)):
        tiles = make(config, rng, 4)
        check(config, tiles, simulate(config, tiles, seed=stall_stages, ready=ready, gap=gap,
                                      stall_stages=stall_stages))


@pytest.mark.parametrize("dataflow", ["ws", "os"])
@pytest.mark.parametrize("stall_stages", [1, 2, 3, 4])
def test_stall_stages_keep_the_cycle_formulas(dataflow: str, stall_stages: int) -> None:
    """With a ready consumer the skid buffer stays empty: the same cycle counts and latency as
    a combinational stall, and no bubble in the input stream."""
    config = config_for(dataflow, 4, 4)
    rng = np.random.default_rng(stall_stages)
    if dataflow == "ws":
        sequence = [WsTile(_values(rng, config.input_range, (6, 4)),
                           _values(rng, config.weight_range, (4, 4))) for _ in range(3)]
    else:
        sequence = [OsTile(_values(rng, config.input_range, (4, 5)),
                           _values(rng, config.weight_range, (5, 4))) for _ in range(3)]
    run = simulate(config, sequence, stall_stages=stall_stages)
    check(config, sequence, run)
    first = run.fires["weights"][0] if dataflow == "ws" else run.fires["inputs"][0]
    measured = run.fires["outputs"][-1] - first + 1
    expected = (ws_cycles(config, m=6, k=4, tiles=3) if dataflow == "ws" else os_cycles(config, k=5, tiles=3))
    assert measured == expected
    fires = run.fires["inputs"]
    assert fires == list(range(fires[0], fires[0] + len(fires))), "bubble in the input stream"


@pytest.mark.parametrize("dataflow", ["ws", "os"])
@pytest.mark.parametrize("rows, cols", [(4, 4), (4, 8), (8, 4)])
def test_without_backpressure_results_and_cycles(dataflow: str, rows: int, cols: int) -> None:
    """``backpressure=False`` (the compute unit's array, whose consumer takes every row): no
    enables, every register advancing in every cycle. Random tiles with idle input cycles give
    the numpy results (the idle cycles' rows in the pipeline are not valid and never come out);
    back to back, the cycle formulas hold with no bubble in the input stream."""
    config = config_for(dataflow, rows, cols)
    rng = np.random.default_rng(rows * 10 + cols)
    make = random_ws_tiles if dataflow == "ws" else random_os_tiles
    for gap in (0.3, 0.6):
        tiles = make(config, rng, 5)
        check(config, tiles, simulate(config, tiles, seed=rows, gap=gap, backpressure=False))
    if dataflow == "ws":
        # m > k and K >= R: no wait for a preload or a drain between the tiles
        sequence = [WsTile(_values(rng, config.input_range, (rows + 3, rows)),
                           _values(rng, config.weight_range, (rows, cols))) for _ in range(3)]
    else:
        sequence = [OsTile(_values(rng, config.input_range, (rows, rows + 2)),
                           _values(rng, config.weight_range, (rows + 2, cols))) for _ in range(3)]
    run = simulate(config, sequence, backpressure=False)
    check(config, sequence, run)
    first = run.fires["weights"][0] if dataflow == "ws" else run.fires["inputs"][0]
    expected = (ws_cycles(config, m=rows + 3, k=rows, tiles=3) if dataflow == "ws"
                else os_cycles(config, k=rows + 2, tiles=3))
    assert run.fires["outputs"][-1] - first + 1 == expected
    fires = run.fires["inputs"]
    assert fires == list(range(fires[0], fires[0] + len(fires))), "bubble in the input stream"


def test_without_backpressure_extreme_sums() -> None:
    """The 16-row extreme tiles (every product -128 * -128 or its opposite corner) without
    back-pressure, idle input cycles between the rows."""
    config = config_for("ws", 16, 4)
    tiles = _extreme_ws_tiles(config)
    check(config, tiles, simulate(config, tiles, gap=0.4, backpressure=False))


def test_without_backpressure_outputs_are_always_ready() -> None:
    array = SystolicArray(config_for("ws", 4, 4), backpressure=False)
    assert array.outputs.signature.always_ready
    assert isinstance(array.outputs.ready, Const) and array.outputs.ready.value == 1
    assert (array.stall_stages, array.skid_depth) == (0, 0)
    assert not SystolicArray(config_for("ws", 4, 4)).outputs.signature.always_ready


@pytest.mark.parametrize("stall_stages", [1, 2])
def test_registered_stall_ready_does_not_depend_on_output_ready(stall_stages: int) -> None:
    """With stall stages, the input and weight streams' ready comes from registers: changing
    outputs.ready changes neither in the same cycle, while a full skid buffer still stops them
    (after the stall stages) and a ready consumer restarts them."""
    config = config_for("ws", 2, 2)
    dut = SystolicArray(config, stall_stages=stall_stages)
    readies = []

    async def testbench(ctx):
        # a one-row preload and a stream of rows; the consumer never takes anything
        ctx.set(dut.weights.payload, {"data": [1, 2], "last": 1})
        ctx.set(dut.weights.valid, 1)
        await ctx.tick().until(dut.weights.ready)
        ctx.set(dut.weights.valid, 0)
        ctx.set(dut.inputs.payload, {"data": [3, 4], "new_weights": 1, "last": 0})
        ctx.set(dut.inputs.valid, 1)
        for _ in range(40):
            before = (ctx.get(dut.inputs.ready), ctx.get(dut.weights.ready))
            ctx.set(dut.outputs.ready, 1)
            after = (ctx.get(dut.inputs.ready), ctx.get(dut.weights.ready))
            ctx.set(dut.outputs.ready, 0)
            assert before == after
            readies.append(before[0])
            await ctx.tick()
            ctx.set(dut.inputs.payload.new_weights, 0)
        assert not readies[-1], "a full skid buffer must stop the input stream"
        ctx.set(dut.outputs.ready, 1)
        for _ in range(stall_stages + 1):
            await ctx.tick()
        assert ctx.get(dut.inputs.ready)

    _run_simple(dut, testbench)
    assert readies.count(1) >= array_latency(config)


def _run_simple(dut, testbench) -> None:
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.run()


# -- delays through distributed RAM ----------------------------------------------------------------

def _lutram_lines(cycles: int) -> int:
    """Delay lines of the distributed-RAM kind in a delay of ``cycles``."""
    lines = 0
    while cycles >= LUTRAM_DELAY_MIN:
        cycles -= min(cycles, LUTRAM_DELAY_DEPTH)
        lines += 1
    return lines


@pytest.mark.parametrize("cycles", [1, 3, 4, 5, 15, 16, 17, 19, 20, 33])
def test_lutram_delay_is_the_register_chain(cycles: int) -> None:
    """A delay with ``lutram`` (memory lines of at most 16 cycles, then registers) gives in
    every cycle what the chain of registers gives and what a list model gives, under an enable
    that is low in random cycles (both hold still then), from the first cycle on."""
    top = Module()
    group = Module()
    enable = Signal()
    value = Signal(signed(7))
    plain = _delay(group, value, cycles, "plain", reset_less=True)
    lutram = _delay(group, value, cycles, "lines", reset_less=True, lutram=True)
    top.submodules.group = EnableInserter(enable)(group)
    memories = rtlil.convert(top, ports=[enable, value, plain, lutram]).count("cell $memrd_v2 ")
    assert memories == _lutram_lines(cycles)
    rng = np.random.default_rng(cycles)
    steps = 4 * cycles + 60

    async def testbench(ctx):
        model = [0] * cycles
        for _ in range(steps):
            on = int(rng.random() < 0.7)
            new = int(rng.choice([-64, 63, 0, *rng.integers(-64, 64, 3)]))
            ctx.set(enable, on)
            ctx.set(value, new)
            assert ctx.get(plain) == ctx.get(lutram) == model[-1]
            await ctx.tick()
            if on:
                model = [new, *model[:-1]]

    sim = Simulator(top)
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.run()


@pytest.mark.parametrize("dataflow", ["ws", "os"])
@pytest.mark.parametrize("stall_stages", [0, 3])
def test_lutram_delays_keep_the_results(dataflow: str, stall_stages: int) -> None:
    """An 8x8 array whose skews go through distributed-RAM lines (``lutram_delays``, the ECP5
    default) against numpy, under back-pressure, with the registered stall and without."""
    config = config_for(dataflow, 8, 8)
    rng = np.random.default_rng(70 + stall_stages)
    make = random_ws_tiles if dataflow == "ws" else random_os_tiles
    tiles = make(config, rng, 4)
    check(config, tiles, simulate(config, tiles, seed=stall_stages, ready=0.5, gap=0.2,
                                  stall_stages=stall_stages, lutram_delays=True))


# -- output-stationary -----------------------------------------------------------------------------

@pytest.mark.parametrize("rows, cols", SIZES)
def test_os_random_tiles_with_backpressure(rows: int, cols: int) -> None:
    config = config_for("os", rows, cols)
    rng = np.random.default_rng(rows * 10 + cols)
    tiles = random_os_tiles(config, rng, 6)
    check(config, tiles, simulate(config, tiles, seed=rows * cols, gap=0.25, ready=0.6))


@pytest.mark.parametrize("kwargs", [
    {"acc_bits": 16},
    {"input_bits": 16, "weight_bits": 16},
    {"input_signed": False, "weight_signed": False, "acc_signed": False},
    {"weight_signed": False},
    {"array_lut_multipliers": 7},
    {"array_lut_multipliers": 16, "weight_signed": False},
    {"array_bram_multipliers": 9, "array_lut_multipliers": 3},
    {"array_bram_multipliers": 16, "input_signed": False},
])
def test_os_element_types(kwargs: dict) -> None:
    config = config_for("os", 4, 4, **kwargs)
    rng = np.random.default_rng(len(kwargs) + 30)
    tiles = random_os_tiles(config, rng, 3)
    lo_in, hi_in = config.input_range
    lo_w, hi_w = config.weight_range
    tiles.append(OsTile(np.full((4, 6), lo_in), np.full((6, 4), lo_w)))
    tiles.append(OsTile(np.full((4, 3), hi_in), np.full((3, 4), lo_w)))
    check(config, tiles, simulate(config, tiles, seed=2, gap=0.1, ready=0.7))


def test_os_long_extreme_reduction() -> None:
    """-128 x -128 over K = 300 in one tile: 4915200, which a 16-bit accumulator wraps."""
    for acc_bits in (32, 16):
        config = config_for("os", 2, 2, acc_bits=acc_bits)
        tile = OsTile(np.full((2, 300), -128), np.full((300, 2), -128))
        run = simulate(config, [tile])
        assert run.rows == [[int(wrap(300 * 16384, acc_bits, True))] * 2] * 2
        check(config, [tile], run)


@pytest.mark.parametrize("k, n", [(1, 1), (1, 8), (9, 1), (3, 5)])
def test_os_degenerate_and_partial_tiles(k: int, n: int) -> None:
    config = config_for("os", 4, 8)
    rng = np.random.default_rng(k * 10 + n)
    tiles = []
    for _ in range(3):
        b = _values(rng, config.weight_range, (k, 8))
        b[:, n:] = 0
        tiles.append(OsTile(_values(rng, config.input_range, (4, k)), b))
    run = simulate(config, tiles, seed=k, ready=0.8)
    check(config, tiles, run)
    assert not np.array(run.rows)[:, n:].any(), "columns past n must be zero"


def test_os_heavy_backpressure_loses_nothing() -> None:
    config = config_for("os", 4, 4)
    rng = np.random.default_rng(21)
    tiles = random_os_tiles(config, rng, 5, max_k=3)      # short tiles: the drain throttles
    check(config, tiles, simulate(config, tiles, seed=5, ready=0.15, gap=0.2))


@pytest.mark.parametrize("rows, cols, k, tiles", [
    (2, 2, 2, 6), (4, 4, 4, 5), (4, 4, 9, 3), (4, 8, 2, 4), (8, 4, 8, 3), (4, 4, 1, 5),
])
def test_os_back_to_back_cycle_count(rows: int, cols: int, k: int, tiles: int) -> None:
    """T tiles of K beats back to back take exactly os_cycles() cycles; with K >= R the input
    stream moves every cycle (R*C MACs every cycle)."""
    config = config_for("os", rows, cols)
    rng = np.random.default_rng(k + tiles)
    sequence = [OsTile(_values(rng, config.input_range, (rows, k)),
                       _values(rng, config.weight_range, (k, cols))) for _ in range(tiles)]
    run = simulate(config, sequence)
    check(config, sequence, run)
    measured = run.fires["outputs"][-1] - run.fires["inputs"][0] + 1
    assert measured == os_cycles(config, k=k, tiles=tiles)
    assert measured == k + (tiles - 1) * max(k, rows) + 2 * rows + cols + 2
    fires = run.fires["inputs"]
    if k >= rows:
        assert fires == list(range(fires[0], fires[0] + k * tiles)), "bubble in the input stream"
    assert run.fires["outputs"][0] - fires[k - 1] == array_latency(config)


# -- interface and errors --------------------------------------------------------------------------

def test_ports_follow_the_config() -> None:
    ws = SystolicArray(config_for("ws", 4, 8, input_bits=16))
    assert ws.inputs.payload.shape() == input_layout(ws.config)
    assert input_layout(ws.config).size == 4 * 16 + 2
    assert weight_layout(ws.config).size == 8 * 8 + 1
    assert output_layout(ws.config).size == 8 * 32 + 1
    os_ = SystolicArray(config_for("os", 4, 8))
    assert not hasattr(os_, "weights")
    assert input_layout(os_.config).size == 4 * 8 + 8 * 8 + 1


@pytest.mark.parametrize("value, error, message", [
    (1.0, TypeError, r"^stall_stages must be an integer, not 1\.0$"),
    (True, TypeError, r"^stall_stages must be an integer, not True$"),
    (5, ValueError, r"^stall_stages must be between 0 and 4, not 5$"),
    (-1, ValueError, r"^stall_stages must be between 0 and 4, not -1$"),
])
def test_array_rejects_bad_stall_stages(value: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        SystolicArray(config_for("ws", 2, 2), stall_stages=value)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"backpressure": 0}, TypeError, r"^backpressure must be a bool, not 0$"),
    ({"backpressure": False, "stall_stages": 3}, ValueError,
     r"^stall_stages must be 0 \(or left out\) without backpressure: nothing stalls, not 3$"),
])
def test_array_rejects_bad_backpressure(kwargs: dict, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        SystolicArray(config_for("ws", 2, 2), **kwargs)


def test_array_rejects_a_non_config() -> None:
    with pytest.raises(TypeError, match=r"^config must be an AcceleratorConfig, not 'ws'$"):
        SystolicArray("ws")


def test_weight_layout_needs_ws() -> None:
    with pytest.raises(ValueError, match=r"^weight_layout needs dataflow 'ws' \(the output-stationary "
                                         r"array takes B with A on one stream\), not 'os'$"):
        weight_layout(config_for("os", 2, 2))


@pytest.mark.parametrize("call, error, message", [
    (lambda c: ws_cycles(c, m=0, k=1, tiles=1), ValueError, r"^m must be at least 1, not 0$"),
    (lambda c: ws_cycles(c, m=1, k=5, tiles=1), ValueError, r"^k must be at most rows \(4\), not 5$"),
    (lambda c: ws_cycles(c, m=1, k=1, tiles=1.5), TypeError, r"^tiles must be an integer, not 1\.5$"),
    (lambda c: os_cycles(c, k=True, tiles=1), TypeError, r"^k must be an integer, not True$"),
    (lambda c: os_cycles(c, k=2, tiles=-1), ValueError, r"^tiles must be at least 1, not -1$"),
])
def test_cycle_formulas_reject_bad_counts(call: Callable[[AcceleratorConfig], object],
                                          error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        call(config_for("ws", 4, 4))
