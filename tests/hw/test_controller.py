"""systolic.hw.controller: the instruction queues, alone (the rest of the control is checked
through the whole accelerator in tests/hw/test_top.py and the RTL program tests)."""

import random
from typing import Any

import pytest
from amaranth.hdl import Fragment
from systolic.hw.config import AcceleratorConfig
from systolic.hw.controller import InstructionQueue, queue_kept_ranges
from systolic.hw.isa import INSTR_BITS, Queue

from .test_scratchpad import construct_rejected, simulate


@pytest.mark.parametrize("depth", [0, 257, 2.0, "4"])
def test_instruction_queue_depth_must_be_1_to_256(depth: Any) -> None:
    with pytest.raises(ValueError, match=rf"^depth must be an integer between 1 and 256, "
                                         rf"not {depth!r}$"):
        construct_rejected(lambda: InstructionQueue(AcceleratorConfig(), Queue.LOAD, depth))


@pytest.mark.parametrize("depth", [1, 2, 256])
def test_instruction_queue_accepts_its_depths(depth: int) -> None:
    queue = InstructionQueue(AcceleratorConfig(), Queue.STORE, depth)
    assert queue.depth == depth
    Fragment.get(queue, None)       # elaborates at that depth


def _kept_mask(config: AcceleratorConfig, queue: Queue) -> int:
    return sum(((1 << (b - a)) - 1) << a for a, b in queue_kept_ranges(config, queue))


async def _write_word(ctx, queue: InstructionQueue, word: int, pc: int, commit: bool,
                      rng: random.Random | None = None) -> None:
    """Write one instruction word beat by beat (with random gaps if ``rng``)."""
    beats = INSTR_BITS // 64
    for index in range(beats):
        while rng is not None and rng.random() < 0.2:
            ctx.set(queue.w.valid, 0)
            await ctx.tick()
        ctx.set(queue.w.valid, 1)
        ctx.set(queue.w.payload, {"data": (word >> (64 * index)) & ((1 << 64) - 1), "index": index, "pc": pc})
        ctx.set(queue.commit, commit and index == beats - 1)
        await ctx.tick().until(queue.w.ready)
    ctx.set(queue.w.valid, 0)


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_instruction_queue_keeps_order_and_drops_uncommitted_words(depth: int) -> None:
    """Random words written beat by beat (with random gaps; some without ``commit``, which are
    dropped), read with a random ``ready``: the committed words leave in order, with their pc and
    only the kept bits, none lost or repeated, and ``r.payload`` holds while ``r.valid`` waits."""
    config = AcceleratorConfig(dma_data_bits=64)
    queue = InstructionQueue(config, Queue.STORE, depth)
    mask = _kept_mask(config, Queue.STORE)
    rng = random.Random(depth)
    words = [(rng.getrandbits(INSTR_BITS), rng.randrange(1 << config.pc_bits), rng.random() < 0.8)
             for _ in range(40)]
    expected = [(word & mask, pc) for word, pc, commit in words if commit]
    received: list[tuple[int, int]] = []

    async def writer(ctx):
        for word, pc, commit in words:
            await _write_word(ctx, queue, word, pc, commit, rng)

    async def reader(ctx):
        held = None
        while len(received) < len(expected):
            ready = rng.random() < 0.4
            ctx.set(queue.r.ready, ready)
            _, _, valid, payload = await ctx.tick().sample(queue.r.valid, queue.r.payload)
            if valid:
                value = (payload.word, payload.pc)
                assert held is None or held == value, "the payload changed while it waited"
                held = None if ready else value
                if ready:
                    received.append(value)

    simulate(queue, writer, reader)
    assert received == expected


@pytest.mark.parametrize("depth", [2, 3, 4])
def test_a_full_instruction_queue_empties_every_other_cycle(depth: int) -> None:
    """A full queue of depth > 1 read with ``ready`` high lets a word out every other cycle: its
    output entry loads only while empty, so no ``ready`` reaches its enables."""
    config = AcceleratorConfig(dma_data_bits=64)
    queue = InstructionQueue(config, Queue.LOAD, depth)
    pops: list[int] = []

    async def bench(ctx):
        for k in range(depth):
            await _write_word(ctx, queue, k << 8, k, True)
        assert not ctx.get(queue.w.ready)
        ctx.set(queue.r.ready, 1)
        for edge in range(4 * depth):
            _, _, valid, payload = await ctx.tick().sample(queue.r.valid, queue.r.payload)
            if valid:
                pops.append(edge)
                assert payload.pc == len(pops) - 1

    simulate(queue, bench)
    assert len(pops) == depth
    assert [b - a for a, b in zip(pops, pops[1:], strict=False)] == [2] * (depth - 1)
