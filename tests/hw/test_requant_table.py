"""RequantTable against a Python model: masked DMA writes and row reads with backpressure."""

from __future__ import annotations

import os
import random
from typing import Any

import pytest
from systolic.hw.config import AcceleratorConfig
from systolic.hw.requant_table import RequantTable
from systolic.sim.arith import MAX_SHIFT

from .test_scratchpad import collect, construct_rejected, drive, simulate

SEED = int(os.environ.get("SYSTOLIC_TEST_SEED", "1"))
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1

SMALL = AcceleratorConfig(rows=4, cols=4, requant_table_rows=8)
ONE_ROW = AcceleratorConfig(rows=2, cols=2, requant_table_rows=1)


def _entry(rng: random.Random) -> dict[str, int]:
    return {"bias": rng.choice([INT32_MIN, INT32_MAX, 0, rng.randint(INT32_MIN, INT32_MAX)]),
            "mult": rng.choice([INT32_MIN, INT32_MAX, 1, rng.randint(INT32_MIN, INT32_MAX)]),
            "shift": rng.choice([0, MAX_SHIFT, rng.randint(0, MAX_SHIFT)])}


def run_traffic(config: AcceleratorConfig, writes: list[dict[str, Any]], reads: list[int], *,
                seed: int, gap: float, stall: float) -> dict[str, Any]:
    dut = RequantTable(config)
    result: dict[str, Any] = {}

    async def writer(ctx):
        result["write"] = await drive(ctx, dut.write, writes, rng=random.Random(seed), gap=gap)

    async def requester(ctx):
        result["req"] = await drive(ctx, dut.read.req, [{"addr": a} for a in reads],
                                    rng=random.Random(seed + 1), gap=gap)

    async def receiver(ctx):
        taken = await collect(ctx, dut.read.resp, len(reads), rng=random.Random(seed + 2), stall=stall)
        result["resp"] = [(e, [{"bias": row[c].bias, "mult": row[c].mult, "shift": row[c].shift}
                               for c in range(config.cols)]) for e, row in taken]

    simulate(dut, writer, requester, receiver)
    return result


def model(config: AcceleratorConfig, writes: list[dict[str, Any]], result: dict[str, Any],
          reads: list[int]) -> list[list[dict[str, int]]]:
    """A read at edge n sees the writes of edges up to n (transparent)."""
    table = [[{"bias": 0, "mult": 0, "shift": 0} for _ in range(config.cols)]
             for _ in range(config.requant_table_rows)]
    events = [(e, 0, "w", w) for e, w in zip(result["write"], writes, strict=True)]
    events += [(e, 1, "r", a) for e, a in zip(result["req"], reads, strict=True)]
    out = []
    for _, _, kind, item in sorted(events, key=lambda x: (x[0], x[1])):
        if kind == "r":
            out.append([dict(entry) for entry in table[item]])
        else:
            for c in range(config.cols):
                if item["mask"] >> c & 1:
                    table[item["addr"]][c] = dict(item["data"][c])
    return out


@pytest.mark.parametrize("config", [SMALL, ONE_ROW], ids=["8-rows", "1-row"])
def test_random_masked_writes_and_reads_match_model(config: AcceleratorConfig) -> None:
    rng = random.Random(SEED)
    full = (1 << config.cols) - 1
    writes = [{"addr": rng.randrange(config.requant_table_rows),
               "data": [_entry(rng) for _ in range(config.cols)],
               "mask": rng.choice([full, 1, rng.randrange(full + 1)])} for _ in range(120)]
    reads = [rng.randrange(config.requant_table_rows) for _ in range(120)]
    result = run_traffic(config, writes, reads, seed=SEED, gap=0.3, stall=0.5)
    assert [row for _, row in result["resp"]] == model(config, writes, result, reads)
    for (resp_edge, _), req_edge in zip(result["resp"], result["req"], strict=True):
        assert resp_edge >= req_edge + 1


def test_pending_row_stays_while_the_table_is_written() -> None:
    # the store unit keeps a response pending for a whole STORE: later writes to that row do not
    # change it, and the next request sees them
    config = SMALL
    rng = random.Random(SEED)
    first = [_entry(rng) for _ in range(4)]
    second = [_entry(rng) for _ in range(4)]
    writes = [{"addr": 3, "data": first, "mask": 0b1111}] + \
             [{"addr": 3, "data": second, "mask": 0b1111}] * 10
    dut = RequantTable(config)
    seen: list[Any] = []

    async def writer(ctx):
        await drive(ctx, dut.write, writes[:1], rng=rng)                     # edge 1
        await drive(ctx, dut.write, writes[1:], rng=rng, start=2)            # edges 4..13

    async def reader(ctx):
        await drive(ctx, dut.read.req, [{"addr": 3}], rng=rng, start=2)      # accepted at edge 3
        for _ in range(12):                                  # pending, not taken: edges 4..15
            _, _, valid, row = await ctx.tick().sample(dut.read.resp.valid, dut.read.resp.payload)
            seen.append((valid, [(row[c].bias, row[c].mult, row[c].shift) for c in range(4)]))
        ctx.set(dut.read.resp.ready, 1)
        await ctx.tick()
        ctx.set(dut.read.resp.ready, 0)
        await drive(ctx, dut.read.req, [{"addr": 3}], rng=rng)
        _, _, valid, row = await ctx.tick().sample(dut.read.resp.valid, dut.read.resp.payload)
        seen.append((valid, [(row[c].bias, row[c].mult, row[c].shift) for c in range(4)]))

    simulate(dut, writer, reader)
    as_tuples = [[(e["bias"], e["mult"], e["shift"]) for e in entries] for entries in (first, second)]
    assert seen[:12] == [(1, as_tuples[0])] * 12
    assert seen[12] == (1, as_tuples[1])


def test_config_must_be_an_accelerator_config() -> None:
    with pytest.raises(TypeError, match=r"^config must be an AcceleratorConfig, not \{\}$"):
        construct_rejected(lambda: RequantTable({}))  # type: ignore[arg-type]
