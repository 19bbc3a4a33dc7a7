"""The derived synchronization (ProgramBuilder) against the golden model's hazard checker.

Random instruction streams -- LOADs into scratchpad, accumulator and table rows, COMPUTEs, raw
and requantizing STOREs, LOADs of what STOREs wrote -- over a few rows and DRAM buffers, so that
every kind of conflict (read-after-write, write-after-read, write-after-write, between every
pair of queues, through DRAM too) happens often. The builder gives each instruction its tokens;
the golden model must then find no unordered conflicting pair, no deadlock (also with a token
depth of 1 and 2), and the same result as running the stream one instruction at a time."""

from __future__ import annotations

import numpy as np
import pytest
from systolic.compiler.lower import ProgramBuilder, _Spec
from systolic.hw.config import AcceleratorConfig
from systolic.hw.isa import Instruction, Program
from systolic.sim.golden import GoldenModel

BUFFER_BYTES = 256      # each DRAM buffer: 8 accumulator rows of 8 int32


def _random_stream(rng: np.random.Generator, config: AcceleratorConfig, count: int) -> list[_Spec]:
    """A random stream over 32 scratchpad rows, 16 accumulator rows, 2 table rows and 3 DRAM
    buffers (buffer b at byte ``b * BUFFER_BYTES``; raw STOREs write them, LOADs read them)."""
    specs: list[_Spec] = []
    weights_loaded = False
    for _ in range(count):
        kind = rng.choice(["spad", "acc", "table", "compute", "store", "store_int"],
                          p=[0.25, 0.1, 0.05, 0.3, 0.2, 0.1])
        if kind == "compute" and not weights_loaded:
            kind = "spad"
        if kind == "spad":
            row, rows, buf = int(rng.integers(0, 24)), int(rng.integers(1, 9)), int(rng.integers(0, 3))
            f = {"dst": 0, "dst_addr": row, "dram_addr": buf * BUFFER_BYTES, "pitch_y": 8,
                 "pitch_c": 1, "rows_outer": 1, "rows_inner": rows, "inner_dy": 1, "segs": 1,
                 "seg_len": 8, "elem_dc": 1}
            specs.append(_Spec("LOAD", f, spad=((row, rows, True),), dram=((buf, False),)))
            weights_loaded = True
        elif kind == "acc":
            row, rows, buf = int(rng.integers(0, 8)), int(rng.integers(1, 9)), int(rng.integers(0, 3))
            f = {"dst": 1, "dst_addr": row, "dram_addr": buf * BUFFER_BYTES, "pitch_y": 32,
                 "pitch_c": 4, "rows_outer": 1, "rows_inner": rows, "inner_dy": 1, "segs": 1,
                 "seg_len": 8, "elem_dc": 1}
            specs.append(_Spec("LOAD", f, acc=((row, rows, True),), dram=((buf, False),)))
        elif kind == "table":
            row = int(rng.integers(0, 2))
            f = {"dst": 2, "dst_addr": row, "dram_addr": 3 * BUFFER_BYTES, "pitch_c": 12,
                 "rows_outer": 1, "rows_inner": 1, "segs": 1, "seg_len": 8, "elem_dc": 1}
            specs.append(_Spec("LOAD", f, table=((row, 1, True),)))
        elif kind == "compute":
            a, b = int(rng.integers(0, 24)), int(rng.integers(0, 24))
            m, acc = int(rng.integers(1, 9)), int(rng.integers(0, 8))
            accumulate = int(rng.integers(0, 2))
            f = {"a_addr": a, "b_addr": b, "acc_addr": acc, "m": m, "k": 8, "n": 8,
                 "accumulate": accumulate, "preload": 1}
            access = ((acc, m, True),) + (((acc, m, False),) if accumulate else ())
            specs.append(_Spec("COMPUTE", f, spad=((a, m, False), (b, 8, False)), acc=access))
        else:
            acc, rows, buf = int(rng.integers(0, 8)), int(rng.integers(1, 9)), int(rng.integers(0, 3))
            f = {"acc_addr": acc, "n": 8, "in_h": rows, "in_w": 1, "out_h": rows, "out_w": 1,
                 "dram_addr": buf * BUFFER_BYTES}
            if kind == "store":
                f.update(out_type=1, pitch_y=32, pitch_c=4)
                specs.append(_Spec("STORE", f, acc=((acc, rows, False),), dram=((buf, True),)))
            else:
                row = int(rng.integers(0, 2))
                f.update(pitch_y=8, pitch_c=1, qrow=row)
                specs.append(_Spec("STORE", f, acc=((acc, rows, False),), table=((row, 1, False),),
                                   dram=((buf, True),)))
    return specs


def _dram(rng: np.random.Generator) -> np.ndarray:
    dram = np.zeros(4096, np.uint8)
    dram[:3 * BUFFER_BYTES] = rng.integers(0, 256, 3 * BUFFER_BYTES, dtype=np.uint8)
    entries = np.zeros((8, 3), "<i4")
    entries[:, 1] = rng.integers(1, 1 << 20, 8)
    entries[:, 2] = rng.integers(10, 30, 8)
    dram[3 * BUFFER_BYTES:3 * BUFFER_BYTES + 96] = entries.view(np.uint8).reshape(-1)
    return dram


@pytest.mark.parametrize("token_depth", [1, 2, 8])
@pytest.mark.parametrize("seed", range(6))
def test_random_streams_are_hazard_free(seed: int, token_depth: int) -> None:
    config = AcceleratorConfig(token_depth=token_depth, requant_table_rows=2,
                               load_queue_depth=2 if seed % 2 else 8)
    rng = np.random.default_rng(seed)
    specs = _random_stream(rng, config, 120)
    builder = ProgramBuilder(config)
    for spec in specs:
        builder.emit(spec, 0)
    instrs, layers = builder.finish()
    assert len(instrs) == len(layers) and layers[-1] == -1
    dram = _dram(rng)
    program = Program(tuple(instrs), config.hash)
    result = GoldenModel(config).run(program, dram)       # hazard checks and deadlock detection
    assert np.array_equal(result.dram, _serial(config, specs, dram))


def _serial(config: AcceleratorConfig, specs: list[_Spec], dram: np.ndarray) -> np.ndarray:
    """Run the stream with every instruction ordered after the previous one: each instruction is
    its own program (the on-chip state carries over through the machine state)."""
    from systolic.sim import golden

    run = golden._Run(config, [], dram.copy(), False)
    for i, spec in enumerate(specs):
        op = golden._Op(i, Instruction(spec.op, **spec.fields))
        {"LOAD": run._load, "COMPUTE": run._compute, "STORE": run._store}[spec.op](op)
    return run.dram


def test_load_to_store_goes_through_the_compute_queue() -> None:
    """A STORE that reads table rows a LOAD wrote, with no COMPUTE in between: the token
    passes the compute queue in a SYNC."""
    config = AcceleratorConfig()
    builder = ProgramBuilder(config)
    builder.emit(_Spec("LOAD", {"dst": 2, "dram_addr": 0, "pitch_c": 12, "rows_outer": 1,
                                "rows_inner": 1, "segs": 1, "seg_len": 8, "elem_dc": 1},
                       table=((0, 1, True),)), 0)
    builder.emit(_Spec("STORE", {"n": 8, "in_h": 1, "in_w": 1, "out_h": 1, "out_w": 1,
                                 "dram_addr": 512, "pitch_c": 1}, table=((0, 1, False),),
                       acc=((0, 1, False),)), 0)
    instrs, _ = builder.finish()
    assert [i.op.name for i in instrs] == ["LOAD", "SYNC", "STORE", "FINISH"]
    assert (instrs[0].push_next, instrs[1].pop_prev, instrs[1].push_next, instrs[2].pop_prev) == (1,) * 4
    assert builder.syncs == 1
    GoldenModel(config).run(Program(tuple(instrs), config.hash), np.zeros(4096, np.uint8))


def test_tokens_only_where_needed() -> None:
    """Independent instructions get no tokens; a dependence known through another token gets
    none either (transitivity)."""
    config = AcceleratorConfig()
    builder = ProgramBuilder(config)
    load = {"dst": 0, "dram_addr": 0, "pitch_y": 8, "pitch_c": 1, "rows_outer": 1, "rows_inner": 8,
            "inner_dy": 1, "segs": 1, "seg_len": 8, "elem_dc": 1}
    builder.emit(_Spec("LOAD", dict(load), spad=((0, 8, True),)), 0)
    builder.emit(_Spec("LOAD", dict(load, dst_addr=8), spad=((8, 8, True),)), 0)
    compute = {"a_addr": 8, "b_addr": 0, "m": 8, "k": 8, "n": 8, "preload": 1}
    builder.emit(_Spec("COMPUTE", compute, spad=((8, 8, False), (0, 8, False)),
                       acc=((0, 8, True),)), 0)
    builder.emit(_Spec("LOAD", dict(load, dst_addr=16), spad=((16, 8, True),)), 0)   # independent
    instrs, _ = builder.finish()
    flags = [{k: v for k, v in i.fields.items() if k.startswith(("pop", "push")) and v}
             for i in instrs]
    assert flags == [{}, {"push_next": 1}, {"pop_prev": 1}, {}, {}]
