"""RequantTable against a Python model: masked DMA writes, and reads through both ports: the
serial SFU's row reads with backpressure and the pipelined SFU's lane-group lookups."""

from __future__ import annotations

import os
import random
from typing import Any

import pytest
from amaranth import unsigned
from systolic.hw.config import AcceleratorConfig, ConfigError
from systolic.hw.requant_table import (
    REQUANT_ENTRY,
    TABLE_READ_LATENCY,
    RequantTable,
    requant_word_bits,
    requant_write_layout,
    table_group_shape,
)
from systolic.sim.arith import MAX_SHIFT

from .test_lint_synth_memories import synth
from .test_scratchpad import collect, construct_rejected, drive, simulate

SEED = int(os.environ.get("SYSTOLIC_TEST_SEED", "1"))
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1

# the serial SFU's table (the read port)
SMALL = AcceleratorConfig(rows=4, cols=4, requant_table_rows=8, sfu_engine="serial")
ONE_ROW = AcceleratorConfig(rows=2, cols=2, requant_table_rows=1, sfu_engine="serial")
# narrow words (requant_row_words): 9 words of 32 bits (280 + 8 pad), the iCEBreaker's 9 words
# of 16 bits (140 + 4 pad: one 256 x 16 block RAM), 64 words of 3 bits, a one-row table of 2
WORDS = SMALL.replace(requant_row_words=9)
ICEBREAKER = ONE_ROW.replace(requant_table_rows=16, requant_row_words=9)
TINY_WORDS = ONE_ROW.replace(requant_table_rows=4, requant_row_words=64)
ONE_ROW_WORDS = ONE_ROW.replace(requant_row_words=2)
# writes of a group of 2 entries (requant_load_entries)
PAIRS = WORDS.replace(requant_load_entries=2)
CONFIGS = [SMALL, ONE_ROW, WORDS, ICEBREAKER, TINY_WORDS, ONE_ROW_WORDS, PAIRS]
IDS = ["8-rows", "1-row", "9-words", "icebreaker", "64-words", "1-row-2-words", "9-words-pairs"]
# the pipelined SFU's table (the lookup port): a word per lane group
LOOKUP = [AcceleratorConfig(rows=4, cols=4, requant_table_rows=8),
          AcceleratorConfig(rows=4, cols=4, requant_table_rows=8, sfu_row_cycles=2),
          AcceleratorConfig(rows=4, cols=4, requant_table_rows=8, sfu_row_cycles=4),
          AcceleratorConfig(rows=2, cols=2, requant_table_rows=1, sfu_row_cycles=2),
          # writes of 2 entries: two words of one entry, half a word of two
          AcceleratorConfig(rows=4, cols=4, requant_table_rows=8, sfu_row_cycles=4, requant_load_entries=2),
          AcceleratorConfig(rows=4, cols=4, requant_table_rows=8, sfu_row_cycles=2, requant_load_entries=1)]
LOOKUP_IDS = ["4-lanes", "2-lanes-x-2", "1-lane-x-4", "1-row-1-lane-x-2", "1-lane-pairs", "2-lanes-singles"]
ENTRY_BITS = REQUANT_ENTRY.size


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


def _pack(entries: list[dict[str, int]]) -> int:
    """A row's bits: entry c at bit c * 70, each bias, mult (32 bits), shift (6 bits)."""
    row = 0
    for c, e in enumerate(entries):
        bits = (e["bias"] & 0xFFFFFFFF) | (e["mult"] & 0xFFFFFFFF) << 32 | e["shift"] << 64
        row |= bits << (c * ENTRY_BITS)
    return row


def _unpack(row: int, cols: int) -> list[dict[str, int]]:
    def signed32(value: int) -> int:
        return value - (1 << 32) if value >> 31 else value
    entries = []
    for c in range(cols):
        bits = row >> (c * ENTRY_BITS)
        entries.append({"bias": signed32(bits & 0xFFFFFFFF), "mult": signed32(bits >> 32 & 0xFFFFFFFF),
                        "shift": bits >> 64 & 0x3F})
    return entries


def _random_writes(config: AcceleratorConfig, rng: random.Random, count: int) -> list[dict[str, Any]]:
    """Masked writes of random rows (random groups of ``table_load_entries`` entries), the full,
    first, last and random masks."""
    entries = config.table_load_entries
    full = (1 << entries) - 1
    writes = []
    for _ in range(count):
        w = {"addr": rng.randrange(config.requant_table_rows), "data": [_entry(rng) for _ in range(entries)],
             "mask": rng.choice([full, 1, 1 << (entries - 1), rng.randrange(full + 1)])}
        if entries < config.cols:
            w["group"] = rng.randrange(config.cols // entries)
        writes.append(w)
    return writes


def _row_write(config: AcceleratorConfig, w: dict[str, Any]) -> tuple[list[dict[str, int]], int]:
    """A write's entries and mask in row form: its group's entries in place, the others 0."""
    entries, group = config.table_load_entries, w.get("group", 0)
    zero = {"bias": 0, "mult": 0, "shift": 0}
    row = [zero] * (group * entries) + w["data"] + [zero] * (config.cols - (group + 1) * entries)
    return row, w["mask"] << (group * entries)


def _enables(config: AcceleratorConfig, mask: int) -> int:
    return sum(((1 << ENTRY_BITS) - 1) << (c * ENTRY_BITS) for c in range(config.cols) if mask >> c & 1)


def _used_words(config: AcceleratorConfig, mask: int) -> list[int]:
    """The words a write with ``mask`` writes: from the first holding an enabled entry to the
    last (word 0 alone for an empty mask)."""
    width = requant_word_bits(config)
    enables = _enables(config, mask)
    used = [k for k in range(config.requant_table_words) if enables >> (k * width) & ((1 << width) - 1)]
    return list(range(used[0], used[-1] + 1)) if used else [0]


def _write_events(config: AcceleratorConfig, writes: list[dict[str, Any]],
                  edges: list[int]) -> list[tuple[int, int, str, int, Any]]:
    """A row accepted at edge n writes its words ``_used_words`` one per edge, the last at n."""
    events = []
    for edge, w in zip(edges, writes, strict=True):
        row, mask = _row_write(config, w)
        words = _used_words(config, mask)
        item = (w["addr"], _pack(row), _enables(config, mask))
        events += [(edge - (words[-1] - k), 0, "w", k, item) for k in words]
    return events


def _replay(config: AcceleratorConfig, events: list[tuple[int, int, str, int, Any]], reads: int) -> list[int]:
    """Apply the events in edge order, writes of an edge before its reads (transparent): the
    bits of each read's words, by read."""
    width = requant_word_bits(config)
    table = [0] * config.requant_table_rows
    out = [0] * reads
    for _, _, kind, k, item in sorted(events, key=lambda x: (x[0], x[1])):
        word = ((1 << width) - 1) << (k * width)
        if kind == "r":
            addr, n = item
            out[n] |= table[addr] & word
        else:
            addr, bits, enables = item
            table[addr] = table[addr] & ~(word & enables) | bits & word & enables
    return out


def model(config: AcceleratorConfig, writes: list[dict[str, Any]], result: dict[str, Any],
          reads: list[int]) -> list[list[dict[str, int]]]:
    """Read port: word k of W of a row accepted at edge n is read at edge n - (W - 1 - k), and a
    read of a word at edge t sees the writes of that word at edges up to t (transparent)."""
    words = config.requant_table_words
    events = _write_events(config, writes, result["write"])
    for n, (edge, addr) in enumerate(zip(result["req"], reads, strict=True)):
        events += [(edge - (words - 1 - k), 1, "r", k, (addr, n)) for k in range(words)]
    return [_unpack(row, config.cols) for row in _replay(config, events, len(reads))]


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_random_masked_writes_and_reads_match_model(config: AcceleratorConfig) -> None:
    rng = random.Random(SEED)
    writes = _random_writes(config, rng, 120)
    reads = [rng.randrange(config.requant_table_rows) for _ in range(120)]
    result = run_traffic(config, writes, reads, seed=SEED, gap=0.3, stall=0.5)
    assert [row for _, row in result["resp"]] == model(config, writes, result, reads)
    for (resp_edge, _), req_edge in zip(result["resp"], result["req"], strict=True):
        assert resp_edge >= req_edge + TABLE_READ_LATENCY


@pytest.mark.parametrize("config", [SMALL, WORDS], ids=["1-word", "9-words"])
def test_pending_row_stays_while_the_table_is_written(config: AcceleratorConfig) -> None:
    # the store unit keeps a response pending for a whole STORE: later writes to that row do not
    # change it, and the next request sees them
    rng = random.Random(SEED)
    first = [_entry(rng) for _ in range(4)]
    second = [_entry(rng) for _ in range(4)]
    dut = RequantTable(config)
    seen: list[Any] = []
    progress = {"written": False, "requested": False}

    def entries(row: Any) -> list[tuple[int, int, int]]:
        return [(row[c].bias, row[c].mult, row[c].shift) for c in range(4)]

    async def writer(ctx):
        await drive(ctx, dut.write, [{"addr": 3, "data": first, "mask": 0b1111}], rng=rng)
        progress["written"] = True
        while not progress["requested"]:
            await ctx.tick()
        await drive(ctx, dut.write, [{"addr": 3, "data": second, "mask": 0b1111}] * 10, rng=rng)

    async def reader(ctx):
        while not progress["written"]:
            await ctx.tick()
        await drive(ctx, dut.read.req, [{"addr": 3}], rng=rng)
        progress["requested"] = True
        await ctx.tick().repeat(TABLE_READ_LATENCY - 1)
        for _ in range(12 * config.requant_table_words):    # pending, not taken, while written
            _, _, valid, row = await ctx.tick().sample(dut.read.resp.valid, dut.read.resp.payload)
            seen.append((valid, entries(row)))
        ctx.set(dut.read.resp.ready, 1)
        await ctx.tick()
        ctx.set(dut.read.resp.ready, 0)
        await drive(ctx, dut.read.req, [{"addr": 3}], rng=rng)
        await ctx.tick().repeat(TABLE_READ_LATENCY - 1)
        _, _, valid, row = await ctx.tick().sample(dut.read.resp.valid, dut.read.resp.payload)
        seen.append((valid, entries(row)))

    simulate(dut, writer, reader)
    as_tuples = [[(e["bias"], e["mult"], e["shift"]) for e in rows] for rows in (first, second)]
    assert seen[:-1] == [(1, as_tuples[0])] * (12 * config.requant_table_words)
    assert seen[-1] == (1, as_tuples[1])


@pytest.mark.parametrize("config", [SMALL, WORDS], ids=["1-word", "9-words"])
def test_narrow_words_take_a_cycle_each(config: AcceleratorConfig) -> None:
    # with W words per row, back-to-back rows are written every W cycles, and read every W + 1
    # (the words, then the cycle the last one goes into its register: one response at a time)
    rng = random.Random(SEED + 1)
    writes = [{"addr": k, "data": [_entry(rng) for _ in range(4)], "mask": 0b1111} for k in range(5)]
    result = run_traffic(config, writes, [0, 1, 2], seed=SEED, gap=0.0, stall=0.0)
    words = config.requant_table_words
    assert [result["write"][k + 1] - result["write"][k] for k in range(4)] == [words] * 4
    assert [result["req"][k + 1] - result["req"][k] for k in range(2)] == [words + 1] * 2
    assert [e for e, _ in result["resp"]] == [e + TABLE_READ_LATENCY for e in result["req"]]


@pytest.mark.parametrize("value", [0, 65, -1])
def test_row_words_must_be_between_1_and_64(value: int) -> None:
    with pytest.raises(ConfigError, match=rf"^requant_row_words must be between 1 and 64, not {value}$"):
        AcceleratorConfig(requant_row_words=value, sfu_engine="serial")


def test_row_words_are_the_serial_sfus_only() -> None:
    with pytest.raises(ConfigError, match=r"^requant_row_words must be 1 with sfu_engine = 'pipelined' "
                                          r"\(its SFU reads the requantize table a lane group per memory "
                                          r"word: sfu_row_cycles words a row\); it sets the words of the "
                                          r"serial SFU's table, not 4$"):
        AcceleratorConfig(requant_row_words=4)
    assert AcceleratorConfig(cols=8, rows=8, sfu_row_cycles=4).requant_table_words == 4
    assert AcceleratorConfig(sfu_engine="serial", requant_row_words=4).requant_table_words == 4


def run_lookups(config: AcceleratorConfig, writes: list[dict[str, Any]], cycles: int, *,
                seed: int) -> tuple[list[int], list[tuple[int, int, int, list[dict[str, int]]]]]:
    """Random masked writes (random gaps) beside a lookup of a random row and lane group every
    cycle: the writes' accepting edges and (edge, row, group, entries read at that edge)."""
    dut = RequantTable(config)
    groups, lanes = config.sfu_row_cycles, config.sfu_lanes
    result: dict[str, Any] = {"lookups": []}
    done = {"writes": False}

    async def writer(ctx):
        result["write"] = await drive(ctx, dut.write, writes, rng=random.Random(seed), gap=0.3)
        done["writes"] = True

    async def looker(ctx):
        rng = random.Random(seed + 1)
        edge = 0
        while edge < cycles or not done["writes"]:
            row, group = rng.randrange(config.requant_table_rows), rng.randrange(groups)
            ctx.set(dut.lookup.row, row)
            if groups > 1:
                ctx.set(dut.lookup.group, group)
            await ctx.tick()
            edge += 1
            entries = ctx.get(dut.lookup.entries)
            result["lookups"].append((edge, row, group, [{"bias": entries[k].bias, "mult": entries[k].mult,
                                                          "shift": entries[k].shift} for k in range(lanes)]))

    simulate(dut, writer, looker)
    return result["write"], result["lookups"]


@pytest.mark.parametrize("config", LOOKUP, ids=LOOKUP_IDS)
def test_lookups_of_lane_groups_match_model(config: AcceleratorConfig) -> None:
    # every cycle's lookup returns, the next cycle, its lane group's entries as written up to the
    # edge it was made at (writes of that edge included: transparent in simulation)
    rng = random.Random(SEED + 2)
    writes = _random_writes(config, rng, 150)
    edges, lookups = run_lookups(config, writes, 400, seed=SEED)
    events = _write_events(config, writes, edges)
    events += [(edge, 1, "r", group, (row, n)) for n, (edge, row, group, _) in enumerate(lookups)]
    rows = _replay(config, events, len(lookups))
    width = requant_word_bits(config)
    expected = [_unpack(bits >> (group * width), config.sfu_lanes)
                for bits, (_, _, group, _) in zip(rows, lookups, strict=True)]
    assert [entries for *_, entries in lookups] == expected
    assert sum(any(e["bias"] for e in entries) for *_, entries in lookups) > len(lookups) // 2


def test_a_write_takes_the_words_of_its_enabled_entries() -> None:
    # one lane x 4 groups: a word per entry, a row accepted after its first to last enabled word
    config = LOOKUP[2]
    rng = random.Random(SEED + 3)
    masks = [0b0100, 0b0110, 0b1111, 0b1001, 0b0001, 0b1000]
    writes = [{"addr": k, "data": [_entry(rng) for _ in range(4)], "mask": mask}
              for k, mask in enumerate(masks)]
    dut = RequantTable(config)
    result = {}

    async def writer(ctx):
        result["write"] = await drive(ctx, dut.write, writes, rng=rng)

    simulate(dut, writer)
    assert [b - a for a, b in zip(result["write"], result["write"][1:], strict=False)] == [2, 4, 4, 1, 1]
    assert result["write"][0] == 1


def test_config_must_be_an_accelerator_config() -> None:
    with pytest.raises(TypeError, match=r"^config must be an AcceleratorConfig, not \{\}$"):
        construct_rejected(lambda: RequantTable({}))  # type: ignore[arg-type]


def test_narrow_words_fit_one_ice40_block_ram() -> None:
    # the iCEBreaker's 16 rows of 140 bits: nine 256 x 16 block RAMs side by side with one word
    # per row, one block RAM with nine 16-bit words per row
    result = synth(RequantTable(ICEBREAKER), "RequantTable", "ice40", flags=("-noabc",))
    assert (result["brams"], result["dsps"]) == (1, 0), result
    result = synth(RequantTable(ICEBREAKER.replace(requant_row_words=1)), "RequantTable", "ice40",
                   flags=("-noabc",))
    assert result["brams"] == 9, result


@pytest.mark.parametrize("cols,load_entries,bits", [(16, 4, 2), (16, 2, 3), (16, 1, 4), (8, 4, 1)])
def test_a_table_write_names_every_group_of_a_row(cols: int, load_entries: int, bits: int) -> None:
    """A table LOAD's group index (the write's ``group``, the LOAD unit's in flight) is as wide
    as the last group of a row needs: cols // table_load_entries groups."""
    config = AcceleratorConfig(rows=4, cols=cols, requant_table_rows=8, requant_load_entries=load_entries)
    assert config.table_load_entries == load_entries
    assert table_group_shape(config) == unsigned(bits)
    assert requant_write_layout(config)["group"].shape == unsigned(bits)
