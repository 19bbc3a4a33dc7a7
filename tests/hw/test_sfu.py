"""SpecialFunctionUnit and SerialSpecialFunctionUnit (``sfu_engine``) against the reference
arithmetic (systolic.sim.arith), bit for bit: every job list of :func:`check` runs on both.

Each simulation streams several STOREs ("jobs") through one SFU with random input gaps and random
output backpressure, changing the static inputs between jobs once the SFU is idle, and compares every
output vector with sfu_pointwise / avg_pool_finish / max over non-pad pixels. Exact rounding ties
(half to even, on either side of the zero point: CONFIG tie_out / avg_tie_out) are driven on
purpose, in the pointwise requantize, the residual add (one rounding with the product) and the
average.
"""

from __future__ import annotations

import itertools
import os
import random
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pytest
from amaranth import Const
from systolic.hw.config import AcceleratorConfig, ConfigError
from systolic.hw.isa import Activation, OutType, PoolMode
from systolic.hw.sfu import SERIAL_LATENCY, SFU_REGS, SpecialFunctionUnit, sfu_input_layout, sfu_latency
from systolic.hw.sfu_serial import SerialSpecialFunctionUnit, serial_sfu_cycles
from systolic.sim.arith import ACT_NONE, MAX_SHIFT, avg_pool_finish, sfu_pointwise

from .streams import stream_get, stream_put
from .test_lint_synth_memories import synth
from .test_scratchpad import collect, construct_rejected, drive, simulate

SEED = int(os.environ.get("SYSTOLIC_TEST_SEED", "1"))
#: The two SFUs (``sfu_engine``).
ENGINES = {"pipelined": SpecialFunctionUnit, "serial": SerialSpecialFunctionUnit}
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1

SMALL = AcceleratorConfig(rows=4, cols=4)
UNSIGNED = AcceleratorConfig(rows=4, cols=4, input_signed=False, weight_signed=False, acc_signed=False)
WIDE = AcceleratorConfig(rows=2, cols=2, input_bits=16, weight_bits=16, acc_bits=32)
NARROW_ACC = AcceleratorConfig(rows=2, cols=2, acc_bits=16, scratchpad_bytes=1024, accumulator_bytes=256)
BARE = AcceleratorConfig(rows=2, cols=2, sfu_activations=(), sfu_pooling=(), sfu_residual=False)
# Lanes shared by lane groups (sfu_row_cycles): 2 lanes x 2 groups and 1 lane x 4 groups with
# every feature, and the iCEBreaker's SFU (1 lane x 2 groups, relu and max pooling only).
SHARED = AcceleratorConfig(rows=4, cols=4, sfu_row_cycles=2)
ONE_LANE = AcceleratorConfig(rows=4, cols=4, sfu_row_cycles=4)
ICEBREAKER = AcceleratorConfig(rows=2, cols=2, sfu_row_cycles=2, sfu_activations=("relu",),
                               sfu_pooling=("max",), sfu_residual=False, scratchpad_bytes=2048,
                               accumulator_bytes=2048, requant_table_rows=16)


@dataclass
class Job:
    """One STORE's worth of SFU input: static settings and the beats."""
    bias: list[int]
    mult: list[int]
    shift: list[int]
    regs: dict[str, int] = field(default_factory=dict)
    out_type: OutType = OutType.INT
    act: Activation = Activation.NONE
    pool: PoolMode = PoolMode.NONE
    residual: bool = False
    pool_count: int = 0
    beats: list[dict[str, Any]] = field(default_factory=list)


def _reg(job: Job, name: str) -> int:
    return job.regs.get(name, 0)


def reference(config: AcceleratorConfig, job: Job) -> list[list[int]]:
    """The expected output vectors of a job, from sim/arith.py."""
    acc = np.array([b["acc"] for b in job.beats], dtype=np.int64)
    if job.out_type == OutType.RAW:
        return acc.tolist()
    act = job.act.value if job.act.name.lower() in config.sfu_activations else ACT_NONE
    pool = job.pool if job.pool.name.lower() in config.sfu_pooling else PoolMode.NONE
    residual = None
    if config.sfu_residual and job.residual:
        residual = np.array([b["residual"] for b in job.beats], dtype=np.int64)
    common = dict(zp_out=_reg(job, "zp_out"), act=act, act_lo=_reg(job, "act_lo"), act_hi=_reg(job, "act_hi"))
    v = sfu_pointwise(acc, np.array(job.bias), np.array(job.mult), np.array(job.shift), **common,
                      acc_range=config.acc_range, out_range=config.output_range, residual=residual,
                      res_zp=_reg(job, "res_zp"), res_mult=_reg(job, "res_mult"),
                      tie_out=_reg(job, "tie_out"))
    if pool == PoolMode.NONE:
        return v.tolist()
    out, window = [], []
    for k, beat in enumerate(job.beats):
        if beat["first"]:
            window = []
        window.append((v[k], beat["pad"]))
        if beat["last"]:
            if pool == PoolMode.MAX:
                out.append(np.max([vk for vk, pad in window if not pad], axis=0).tolist())
            else:
                total = np.sum([np.full(config.cols, common["zp_out"]) if pad else vk
                                for vk, pad in window], axis=0)
                out.append(avg_pool_finish(total, job.pool_count, avg_mult=_reg(job, "avg_mult"),
                                           avg_shift=_reg(job, "avg_shift"), out_range=config.output_range,
                                           tie_out=_reg(job, "avg_tie_out"), **common).tolist())
    return out


#: The table row each SFU under test streams its parameters from (SFUs with ``streams_params``).
_TABLE_ROWS: dict[int, list[dict[str, int]]] = {}


def _set_static(ctx: Any, dut: SpecialFunctionUnit, job: Job) -> None:
    row = [{"bias": b, "mult": mu, "shift": s}
           for b, mu, s in zip(job.bias, job.mult, job.shift, strict=True)]
    if dut.streams_params:
        _TABLE_ROWS[id(dut)] = row
    else:
        ctx.set(dut.params, row)
    ctx.set(dut.regs, {name: _reg(job, name) for name, _ in SFU_REGS})
    ctx.set(dut.settings, {"out_type": job.out_type, "act": job.act, "pool": job.pool,
                           "residual": int(job.residual), "pool_count": job.pool_count})


def _table(dut: SpecialFunctionUnit) -> tuple[Any, ...]:
    """For an SFU that streams its parameters: a background testbench acting as the table's
    ``lookup`` port, the entries of lane group ``param_group`` of the row ``_set_static`` gave,
    one cycle after the group is named (a synchronous read of a memory)."""
    if not dut.streams_params:
        return ()
    lanes, groups = dut.config.sfu_lanes, dut.config.sfu_row_cycles

    async def table(ctx):
        async for _, _, group in ctx.tick().sample(dut.param_group if groups > 1 else Const(0)):
            row = _TABLE_ROWS.get(id(dut))
            if row is not None:
                ctx.set(dut.params, row[group * lanes:(group + 1) * lanes])
    return (table,)


def _payload(config: AcceleratorConfig, beat: dict[str, Any]) -> dict[str, Any]:
    if config.sfu_residual:
        return beat
    return {k: v for k, v in beat.items() if k != "residual"}


def run_sfu(config: AcceleratorConfig, jobs: list[Job], *, seed: int, gap: float = 0.3,
            stall: float = 0.3, engine: str = "pipelined") -> list[list[list[int]]]:
    """Stream the jobs through an SFU (``ENGINES[engine]``); returns the output vectors of each
    job."""
    dut = ENGINES[engine](config)
    expected_counts = [len(reference(config, job)) for job in jobs]
    results: list[list[list[int]]] = [[] for _ in jobs]
    progress = {"consumed_jobs": 0}

    async def producer(ctx):
        rng = random.Random(seed)
        for k, job in enumerate(jobs):
            while progress["consumed_jobs"] < k or not ctx.get(dut.idle):
                await ctx.tick()
            _set_static(ctx, dut, job)
            await ctx.tick()
            for beat in job.beats:
                while rng.random() < gap:
                    await ctx.tick()
                await stream_put(ctx, dut.i, _payload(config, beat))

    async def consumer(ctx):
        rng = random.Random(seed + 1)
        for k in range(len(jobs)):
            for _ in range(expected_counts[k]):
                while rng.random() < stall:
                    await ctx.tick()
                payload = await stream_get(ctx, dut.o)
                results[k].append([payload[c] for c in range(config.cols)])
            progress["consumed_jobs"] = k + 1

    # the serial SFU takes tens of cycles per channel (hw/sfu_serial.py)
    simulate(dut, producer, consumer, limit=20_000 if engine == "pipelined" else 1_000_000,
             background=_table(dut))
    return results


def check(config: AcceleratorConfig, jobs: list[Job], *, seed: int = SEED, **kwargs: Any) -> None:
    """The jobs on both SFUs, each output equal to the reference's."""
    for engine in ENGINES:
        _check_engine(config, jobs, seed=seed, engine=engine, **kwargs)


def _check_engine(config: AcceleratorConfig, jobs: list[Job], *, seed: int, engine: str,
                  **kwargs: Any) -> None:
    results = run_sfu(config, jobs, seed=seed, engine=engine, **kwargs)
    for k, job in enumerate(jobs):
        expected = reference(config, job)
        assert results[k] == expected, (
            f"{engine} SFU, job {k} ({job.out_type.name} act={job.act.name} pool={job.pool.name} "
            f"residual={job.residual}): first mismatch at output "
            f"{next(i for i, (a, b) in enumerate(zip(results[k], expected, strict=True)) if a != b)}")


# -- random jobs ---------------------------------------------------------------------------------

def _acc_value(rng: random.Random, config: AcceleratorConfig) -> int:
    lo, hi = config.acc_range
    r = rng.random()
    if r < 0.1:
        return rng.choice([lo, hi, lo + 1, hi - 1, 0])
    if r < 0.3:
        return rng.randint(lo, hi)
    span = min(hi, 1 << 20)
    return max(lo, min(hi, rng.randint(-span, span)))


def _params(rng: random.Random, config: AcceleratorConfig) -> tuple[list[int], list[int], list[int]]:
    """Per-channel (bias, mult, shift): mostly scales that land in the output range, some extremes."""
    bias, mult, shift = [], [], []
    for _ in range(config.cols):
        if rng.random() < 0.25:
            bias.append(rng.choice([INT32_MIN, INT32_MAX, rng.randint(INT32_MIN, INT32_MAX), 0]))
            mult.append(rng.choice([INT32_MIN, INT32_MAX, -INT32_MAX, 1, -1, 0,
                                    rng.randint(INT32_MIN, INT32_MAX)]))
            shift.append(rng.choice([0, 1, 31, 32, 61, MAX_SHIFT, rng.randint(0, MAX_SHIFT)]))
        else:
            bias.append(rng.randint(-5000, 5000))
            mult.append(rng.choice([-1, 1]) * rng.randint(1 << 29, INT32_MAX))
            shift.append(rng.randint(30, 48))
    return bias, mult, shift


def _regs(rng: random.Random, config: AcceleratorConfig) -> dict[str, int]:
    out_lo, out_hi = config.output_range
    lo = rng.randint(out_lo - 20, out_hi)
    return {
        "zp_out": rng.choice([0, rng.randint(out_lo, out_hi), rng.randint(-(1 << 15), (1 << 15) - 1)]),
        "act_lo": lo,
        "act_hi": rng.choice([rng.randint(lo, out_hi + 20), rng.randint(out_lo - 20, out_hi + 20)]),
        "avg_mult": rng.choice([rng.randint(1 << 28, INT32_MAX), INT32_MIN, INT32_MAX, 1]),
        "avg_shift": rng.choice([rng.randint(28, 34), 0, MAX_SHIFT]),
        "res_zp": rng.randint(-(1 << 15), (1 << 15) - 1),
        "res_mult": rng.choice([rng.randint(1 << 29, INT32_MAX), -rng.randint(1 << 29, INT32_MAX),
                                INT32_MIN, INT32_MAX, rng.randint(-(1 << 20), 1 << 20)]),
        "tie_out": rng.randint(0, 1),
        "avg_tie_out": rng.randint(0, 1),
    }


def _beat(rng: random.Random, config: AcceleratorConfig, *, first: int = 0, last: int = 0,
          pad: int = 0) -> dict[str, Any]:
    out_lo, out_hi = config.output_range
    return {"acc": [_acc_value(rng, config) for _ in range(config.cols)],
            "residual": [rng.choice([out_lo, out_hi, rng.randint(out_lo, out_hi)])
                         for _ in range(config.cols)],
            "first": first, "last": last, "pad": pad}


def _plain(acc: list[int], residual: list[int] | None = None) -> dict[str, Any]:
    """A beat outside any pooling window."""
    return {"acc": acc, "residual": residual or [0] * len(acc), "first": 0, "last": 0, "pad": 0}


def _pointwise_job(rng: random.Random, config: AcceleratorConfig, beats: int, **settings: Any) -> Job:
    bias, mult, shift = _params(rng, config)
    return Job(bias, mult, shift, regs=_regs(rng, config), **settings,
               beats=[_beat(rng, config) for _ in range(beats)])


def _pool_job(rng: random.Random, config: AcceleratorConfig, pool: PoolMode, windows: int,
              **settings: Any) -> Job:
    size = rng.randint(1, 9)
    beats = []
    for _ in range(windows):
        pads = [rng.random() < 0.3 for _ in range(size)]
        if pool == PoolMode.MAX and all(pads):
            pads[rng.randrange(size)] = False     # a window must reach into the image
        for k in range(size):
            beats.append(_beat(rng, config, first=int(k == 0), last=int(k == size - 1), pad=int(pads[k])))
    bias, mult, shift = _params(rng, config)
    return Job(bias, mult, shift, regs=_regs(rng, config), pool=pool, pool_count=size, **settings,
               beats=beats)


# -- tests ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("act", list(Activation))
def test_pointwise_every_activation_random_and_extreme(act: Activation) -> None:
    rng = random.Random(SEED * 100 + act.value)
    check(SMALL, [_pointwise_job(rng, SMALL, 60, act=act) for _ in range(3)])


def _tie_regs(rng: random.Random, tie_out: int, **regs: int) -> dict[str, int]:
    """An odd zero point: the two tie choices differ on every tie (even ones: random jobs)."""
    return {"zp_out": rng.choice([-7, -1, 3, 5]), "tie_out": tie_out, **regs}


def _tie_choice_matters(job: Job, name: str) -> bool:
    """The other tie choice (CONFIG ``name``) gives other outputs: the job has ties."""
    other = replace(job, regs=job.regs | {name: 1 - _reg(job, name)})
    return reference(SMALL, other) != reference(SMALL, job)


def test_rounding_ties_and_shift_extremes() -> None:
    # mult = 1: the product is the accumulator itself, so k * 2**s +- 2**(s-1) are exact ties.
    rng = random.Random(SEED)
    cols = SMALL.cols
    jobs = []
    for shift, tie_out in itertools.product((1, 2, 7, 30), (0, 1)):
        beats = []
        for _ in range(16):
            acc = []
            for _ in range(cols):
                k = rng.randint(-100, 100) >> max(0, shift - 23)     # inside int32
                tie = (k << shift) + rng.choice([-1, 1]) * (1 << (shift - 1)) + rng.choice([0, 0, 0, 1, -1])
                acc.append(max(INT32_MIN, min(INT32_MAX, tie)))
            beats.append(_plain(acc))
        jobs.append(Job([0] * cols, [1] * cols, [shift] * cols, regs=_tie_regs(rng, tie_out), beats=beats))
    # the largest products: (-2**31)**2 = 2**62 with shift 62 and 61; shift 0 passes the product;
    # -2**30 * -2**31 = 2**61 is the tie 0.5 at shift 62
    extreme = [[INT32_MIN] * cols, [INT32_MAX] * cols, [INT32_MIN + 1, INT32_MAX - 1, 0, -1],
               [-(1 << 30), 1 << 30, -(1 << 30) - 1, (1 << 30) + 1]]
    for shift, tie_out in itertools.product((0, 61, MAX_SHIFT), (0, 1)):
        jobs.append(Job([0] * cols, [INT32_MIN, INT32_MIN, INT32_MAX, 1], [shift] * cols,
                        regs={"zp_out": -1, "tie_out": tie_out}, beats=[_plain(a) for a in extreme]))
    # bias saturation at both ends of the accumulator range
    jobs.append(Job([INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN], [1 << 30] * cols, [60] * cols,
                    beats=[_plain(a) for a in extreme]))
    check(SMALL, jobs)
    assert sum(_tie_choice_matters(job, "tie_out") for job in jobs) >= 8


def test_residual_rounds_once_with_ties() -> None:
    # t * 2**(s-1) + (r - res_zp) * 2**(s-1): (t + r - res_zp) / 2, a tie whenever the sum is odd;
    # then random residual scales, and the residual term alone at both saturation limits
    rng = random.Random(SEED + 29)
    cols = SMALL.cols
    jobs = []
    for shift, tie_out in itertools.product((1, 12, 31), (0, 1)):
        half = 1 << (shift - 1)
        beats = [_plain([rng.randint(-300, 300) for _ in range(cols)],
                        [rng.choice([-128, 127, rng.randint(-128, 127)]) for _ in range(cols)])
                 for _ in range(12)]
        jobs.append(Job([rng.randint(-5, 5) for _ in range(cols)], [half, half, -half, half], [shift] * cols,
                        regs=_tie_regs(rng, tie_out, res_zp=rng.randint(-9, 9), res_mult=half, act_lo=-100,
                                       act_hi=100),
                        residual=True, act=rng.choice([Activation.NONE, Activation.CLIP]), beats=beats))
    for act in Activation:
        jobs.append(_pointwise_job(rng, SMALL, 30, residual=True, act=act))
    check(SMALL, jobs)
    assert all(_tie_choice_matters(job, "tie_out") for job in jobs[:6])


def test_average_ties_go_to_even() -> None:
    # windows of 2 or 4 identity-requantized pixels times avg_mult 2**30 >> 32 or 31: exact ties
    rng = random.Random(SEED + 31)
    cols = SMALL.cols
    jobs = []
    for size, tie_out in itertools.product((2, 4), (0, 1)):
        beats = []
        for _ in range(12):
            pads = [rng.random() < 0.2 for _ in range(size)]
            for k in range(size):
                acc = [rng.choice([-128, 127, rng.randint(-128, 127)]) for _ in range(cols)]
                beats.append({"acc": acc, "residual": [0] * cols, "first": int(k == 0),
                              "last": int(k == size - 1), "pad": int(pads[k])})
        regs = _tie_regs(rng, 0, avg_mult=1 << 30, avg_shift=30 + size.bit_length() - 1, avg_tie_out=tie_out,
                         act_lo=-100, act_hi=100)
        jobs.append(Job([0] * cols, [1] * cols, [0] * cols, regs=regs, pool=PoolMode.AVG, pool_count=size,
                        act=rng.choice(list(Activation)), beats=beats))
    check(SMALL, jobs)
    assert sum(_tie_choice_matters(job, "avg_tie_out") for job in jobs) >= 2


def test_output_saturates_at_both_ends() -> None:
    cols = SMALL.cols
    beats = [_plain([1 << 20, -(1 << 20), 200, -200])]
    job = Job([0] * cols, [1] * cols, [0] * cols, regs={"zp_out": 0}, beats=beats)
    results = run_sfu(SMALL, [job], seed=SEED)
    assert results == [[[127, -128, 127, -128]]]
    check(SMALL, [job])


def test_raw_passes_accumulator_elements() -> None:
    rng = random.Random(SEED + 7)
    jobs = [_pointwise_job(rng, SMALL, 40, out_type=OutType.RAW) for _ in range(2)]
    results = run_sfu(SMALL, jobs, seed=SEED)
    assert results == [[b["acc"] for b in job.beats] for job in jobs]


def test_residual_add_with_saturation() -> None:
    rng = random.Random(SEED + 11)
    jobs = [_pointwise_job(rng, SMALL, 60, residual=True, act=act) for act in Activation]
    # residual alone drives the output to both saturation limits
    cols = SMALL.cols
    jobs.append(Job([0] * cols, [0] * cols, [0] * cols,
                    regs={"res_zp": 0, "res_mult": INT32_MAX}, residual=True,
                    beats=[_plain([0] * cols, [127, -128, 1, -1])]))
    check(SMALL, jobs)
    assert reference(SMALL, jobs[-1]) == [[127, -128, 127, -128]]


@pytest.mark.parametrize("pool", [PoolMode.MAX, PoolMode.AVG])
def test_pooling_windows_with_pad_pixels(pool: PoolMode) -> None:
    rng = random.Random(SEED * 7 + pool.value)
    jobs = [_pool_job(rng, SMALL, pool, 12, act=rng.choice(list(Activation))) for _ in range(4)]
    check(SMALL, jobs)


def test_avg_pool_count_from_settings_and_global_window() -> None:
    # A 7x7 global average and a window of one (avg of one pixel is its requantized value).
    rng = random.Random(SEED + 3)
    jobs = [_pool_job(rng, SMALL, PoolMode.AVG, 2) for _ in range(2)]
    beats = [_beat(rng, SMALL, first=int(k == 0), last=int(k == 48), pad=int(rng.random() < 0.2))
             for k in range(49)]
    bias, mult, shift = _params(rng, SMALL)
    jobs.append(Job(bias, mult, shift, regs=_regs(rng, SMALL) | {"avg_mult": 1402438301, "avg_shift": 36},
                    pool=PoolMode.AVG, pool_count=49, beats=beats))
    jobs.append(Job(bias, mult, shift, regs={"zp_out": 3, "avg_mult": 1 << 30, "avg_shift": 30},
                    pool=PoolMode.AVG, pool_count=1,
                    beats=[_beat(rng, SMALL, first=1, last=1) for _ in range(10)]))
    check(SMALL, jobs)
    single = jobs[-1]
    pointwise = Job(single.bias, single.mult, single.shift, regs=single.regs, beats=single.beats)
    assert reference(SMALL, single) == reference(SMALL, pointwise)


def test_unsigned_types_and_int64_wrap() -> None:
    # uint8 x uint8 with an unsigned accumulator: t * mult + rounding exceeds int64 and wraps
    # in the reference; the SFU wraps the same way.
    rng = random.Random(SEED + 5)
    cols = UNSIGNED.cols
    hi = UNSIGNED.acc_range[1]
    wrap_job = Job([0] * cols, [INT32_MAX, INT32_MAX, INT32_MIN, 1], [MAX_SHIFT, 61, MAX_SHIFT, 0],
                   regs={"zp_out": 7}, beats=[_plain([hi, hi - 1, hi, hi])])
    # a + bias below zero saturates to 0, above 2**32 - 1 to that (then to the output's 255)
    bias_job = Job([INT32_MIN, -6, INT32_MAX, 3], [1] * cols, [0] * cols,
                   beats=[_plain([5, 5, hi, 0]), _plain([hi, 6, 0, 250])])
    assert reference(UNSIGNED, bias_job) == [[0, 0, 255, 3], [255, 0, 255, 253]]
    jobs = [wrap_job, bias_job, _pointwise_job(rng, UNSIGNED, 40, act=Activation.CLIP),
            _pointwise_job(rng, UNSIGNED, 40, residual=True),
            _pool_job(rng, UNSIGNED, PoolMode.AVG, 6), _pool_job(rng, UNSIGNED, PoolMode.MAX, 6),
            _pointwise_job(rng, UNSIGNED, 20, out_type=OutType.RAW)]
    check(UNSIGNED, jobs)


@pytest.mark.parametrize("config", [WIDE, NARROW_ACC], ids=["int16-out", "acc16"])
def test_other_element_widths(config: AcceleratorConfig) -> None:
    rng = random.Random(SEED + config.acc_bits + config.input_bits)
    jobs = [_pointwise_job(rng, config, 40, act=Activation.RELU6, residual=True),
            _pool_job(rng, config, PoolMode.AVG, 6, act=Activation.CLIP),
            _pool_job(rng, config, PoolMode.MAX, 6),
            _pointwise_job(rng, config, 20, out_type=OutType.RAW)]
    check(config, jobs)


def test_modes_left_out_of_the_config_behave_as_none() -> None:
    rng = random.Random(SEED + 13)
    jobs = [_pointwise_job(rng, BARE, 30, act=act) for act in Activation]
    jobs.append(_pool_job(rng, BARE, PoolMode.MAX, 3))       # every beat comes out, unpooled
    check(BARE, jobs)
    assert "residual" not in dict(iter(sfu_input_layout(BARE)))
    # relu really is absent: a negative value passes unchanged
    assert reference(BARE, jobs[Activation.RELU.value]) == reference(
        BARE, Job(jobs[1].bias, jobs[1].mult, jobs[1].shift, regs=jobs[1].regs, beats=jobs[1].beats))


def _accept_and_output_cycles(dut: SpecialFunctionUnit, job: Job) -> tuple[list[int], list[int]]:
    """With the input always offered and the output always taken: the cycles in which each beat
    was accepted and each output taken, counted on the same clock."""
    config = dut.config
    accepted: list[int] = []
    taken: list[int] = []
    expected = len(reference(config, job))

    async def producer(ctx):
        _set_static(ctx, dut, job)
        cycle = 0
        for beat in job.beats:
            ctx.set(dut.i.valid, 1)
            ctx.set(dut.i.payload, _payload(config, beat))
            while True:
                _, _, ready = await ctx.tick().sample(dut.i.ready)
                cycle += 1
                if ready:
                    accepted.append(cycle)
                    break
        ctx.set(dut.i.valid, 0)

    async def consumer(ctx):
        ctx.set(dut.o.ready, 1)
        cycle = 0
        while len(taken) < expected:
            _, _, valid = await ctx.tick().sample(dut.o.valid)
            cycle += 1
            if valid:
                taken.append(cycle)

    simulate(dut, producer, consumer, background=_table(dut))
    assert taken and accepted
    return accepted, taken


def test_full_throughput_and_latency() -> None:
    rng = random.Random(SEED + 17)
    for config in (SMALL, BARE):
        sfu = SpecialFunctionUnit(config)
        job = _pointwise_job(rng, config, 50)
        accepted, taken = _accept_and_output_cycles(sfu, job)
        assert accepted == list(range(accepted[0], accepted[0] + 50))     # one beat per cycle
        assert taken == [a + sfu.latency for a in accepted]
    # average pooling: windows of 4, output after the last beat plus avg_latency
    job = _pool_job(random.Random(SEED), SMALL, PoolMode.AVG, 5)
    size = job.pool_count
    sfu = SpecialFunctionUnit(SMALL)
    accepted, taken = _accept_and_output_cycles(sfu, job)
    assert sfu.avg_latency > sfu.latency
    assert taken == [accepted[k * size + size - 1] + sfu.avg_latency for k in range(5)]


@pytest.mark.parametrize("config", [SMALL, SHARED], ids=["lane-per-column", "lane-groups"])
@pytest.mark.parametrize("pool", [PoolMode.NONE, PoolMode.AVG])
def test_long_output_stall_fills_the_fifo_without_losing_outputs(pool: PoolMode,
                                                                 config: AcceleratorConfig) -> None:
    # The consumer takes nothing for 300 cycles while beats keep coming: the SFU stops accepting
    # once every FIFO entry is promised, then delivers every output in order.
    rng = random.Random(SEED + 23)
    if pool == PoolMode.NONE:
        job = _pointwise_job(rng, config, 120, act=Activation.RELU)
    else:
        job = _pool_job(rng, config, PoolMode.AVG, 60)
    expected = reference(config, job)
    dut = SpecialFunctionUnit(config)
    got: list[list[int]] = []
    accepted: list[int] = []

    async def producer(ctx):
        _set_static(ctx, dut, job)
        await ctx.tick()
        accepted.extend(await drive(ctx, dut.i, [_payload(config, b) for b in job.beats], rng=rng))

    async def consumer(ctx):
        await ctx.tick().repeat(300)
        taken = await collect(ctx, dut.o, len(expected), rng=rng, stall=0.2)
        got.extend([row[c] for c in range(config.cols)] for _, row in taken)

    simulate(dut, producer, consumer, background=_table(dut))
    assert got == expected
    outputs_per_beat = 1 if pool == PoolMode.NONE else 1 / job.pool_count
    stalled = [a for a in accepted if a < 300]
    assert len(stalled) * outputs_per_beat <= dut._fifo_rows + 1, "accepted more than the FIFO can hold"
    assert len(stalled) < len(job.beats), "input backpressure never happened"


def test_config_must_be_an_accelerator_config() -> None:
    with pytest.raises(TypeError, match=r"^config must be an AcceleratorConfig, not 'small'$"):
        construct_rejected(lambda: SpecialFunctionUnit("small"))  # type: ignore[arg-type]


# -- lane groups (sfu_row_cycles) ----------------------------------------------------------------

def _extreme_job(config: AcceleratorConfig, shift: int, tie_out: int) -> Job:
    """The largest products ((-2**31)**2 = 2**62), a tie at shift 62 (-2**30 * -2**31), bias
    saturation at both ends, a different multiplier and bias in each channel."""
    cols = config.cols
    lo, hi = config.acc_range
    values = [lo, hi, lo + 1, hi - 1, 0, -1, -(1 << 30), 1 << 30]
    beats = [_plain([max(lo, min(hi, values[(k + c) % len(values)])) for c in range(cols)]) for k in range(8)]
    mults = [INT32_MIN, INT32_MAX, 1, -INT32_MAX]
    biases = [0, INT32_MAX, INT32_MIN, 0]
    return Job([biases[c % 4] for c in range(cols)], [mults[c % 4] for c in range(cols)],
               [shift] * cols, regs={"zp_out": -1, "tie_out": tie_out}, beats=beats)


@pytest.mark.parametrize("config", [SHARED, ONE_LANE, ICEBREAKER], ids=["2-lanes", "1-lane", "icebreaker"])
def test_lane_groups_match_the_reference(config: AcceleratorConfig) -> None:
    # every channel has its own bias / multiplier / shift, so a lane that took another channel's
    # entry, or a pooling ring out of turn, shows
    rng = random.Random(SEED + 37 + config.sfu_row_cycles)
    jobs = [_pointwise_job(rng, config, 25, act=act, residual=bool(k % 2))
            for k, act in enumerate(Activation)]
    jobs += [_pool_job(rng, config, pool, 8, act=rng.choice(list(Activation)))
             for pool in (PoolMode.MAX, PoolMode.AVG, PoolMode.MAX)]
    jobs.append(_pointwise_job(rng, config, 20, out_type=OutType.RAW))
    jobs += [_extreme_job(config, shift, tie_out) for shift, tie_out in ((0, 0), (61, 1), (MAX_SHIFT, 0))]
    # exact ties: mult = 1, acc = k * 2**s + 2**(s-1)
    shifts = [1 + (c % 3) for c in range(config.cols)]
    tie_beats = [_plain([(rng.randint(-50, 50) << s) + (1 << (s - 1)) for s in shifts]) for _ in range(12)]
    jobs += [Job([0] * config.cols, [1] * config.cols, shifts, regs=_tie_regs(rng, tie_out), beats=tie_beats)
             for tie_out in (0, 1)]
    check(config, jobs)
    assert reference(config, jobs[-1]) != reference(config, jobs[-2])      # the ties were there


@pytest.mark.parametrize("config", [SHARED, ONE_LANE, ICEBREAKER], ids=["2-lanes", "1-lane", "icebreaker"])
def test_lane_groups_take_a_beat_every_row_cycles(config: AcceleratorConfig) -> None:
    groups = config.sfu_row_cycles
    rng = random.Random(SEED + 41)
    sfu = SpecialFunctionUnit(config)
    assert sfu.latency == sfu_latency(config.replace(sfu_row_cycles=1)) + groups - 1
    accepted, taken = _accept_and_output_cycles(sfu, _pointwise_job(rng, config, 30))
    assert accepted == list(range(accepted[0], accepted[0] + groups * 30, groups))
    assert taken == [a + sfu.latency for a in accepted]
    if "avg" in config.sfu_pooling:
        job = _pool_job(rng, config, PoolMode.AVG, 5)
        accepted, taken = _accept_and_output_cycles(sfu, job)
        size = job.pool_count
        assert taken == [accepted[k * size + size - 1] + sfu.avg_latency for k in range(5)]


@pytest.mark.parametrize("value", [0, 3, 8, -2])
def test_row_cycles_must_be_a_power_of_two_up_to_cols(value: int) -> None:
    message = rf"^sfu_row_cycles must be a power of two between 1 and cols \(4\), not {value}$"
    with pytest.raises(ConfigError, match=message):
        AcceleratorConfig(rows=4, cols=4, sfu_row_cycles=value)
    assert AcceleratorConfig(rows=4, cols=4, sfu_row_cycles=4).sfu_lanes == 1


@pytest.mark.slow
def test_icebreaker_sfu_takes_four_ice40_dsps() -> None:
    # one lane for the iCEBreaker's two channels: its 32 x 32 requantize product is four 16 x 16
    # partial products, one SB_MAC16 each; one lane per column takes twice as many
    result = synth(SpecialFunctionUnit(ICEBREAKER), "SpecialFunctionUnit", "ice40", flags=("-noabc",))
    assert result["dsps"] == 4, result
    lane_per_column = ICEBREAKER.replace(sfu_row_cycles=1)
    result = synth(SpecialFunctionUnit(lane_per_column), "SpecialFunctionUnit", "ice40", flags=("-noabc",))
    assert result["dsps"] == 8, result


# -- the serial SFU's cycles ------------------------------------------------------------------

def _serial_cycles(config: AcceleratorConfig, job: Job) -> int:
    """Cycles from offering a job's first beat (beats back to back, outputs taken at once) until
    its last output is valid, on the serial SFU."""
    dut = SerialSpecialFunctionUnit(config)
    outputs = len(reference(config, job))
    took: list[int] = []

    async def bench(ctx):
        _set_static(ctx, dut, job)
        await ctx.tick().repeat(4)            # the settings' registers (the clamp takes three)
        ctx.set(dut.o.ready, 1)
        ctx.set(dut.i.payload, _payload(config, job.beats[0]))
        ctx.set(dut.i.valid, 1)
        cycles, seen, k = 0, 0, 0
        while seen < outputs:
            _, _, taken, valid = await ctx.tick().sample(dut.i.ready, dut.o.valid)
            cycles += 1
            if taken and k < len(job.beats):
                k += 1
                if k < len(job.beats):
                    ctx.set(dut.i.payload, _payload(config, job.beats[k]))
                else:
                    ctx.set(dut.i.valid, 0)
            seen += valid
        took.append(cycles)

    simulate(dut, bench, limit=1_000_000)
    return took[0]


def test_serial_cycles_are_the_golden_estimate() -> None:
    """Pointwise (with and without residual, shifts from 0 to 62), max and average windows with
    pad pixels, raw: the serial SFU takes exactly ``serial_sfu_cycles`` + SERIAL_LATENCY, which
    the golden model's STORE estimate uses."""
    rng = random.Random(SEED + 11)
    jobs = [_pointwise_job(rng, SMALL, 4), _pointwise_job(rng, SMALL, 3, residual=True),
            _pool_job(rng, SMALL, PoolMode.MAX, 3), _pool_job(rng, SMALL, PoolMode.AVG, 3),
            _pointwise_job(rng, SMALL, 4, out_type=OutType.RAW)]
    jobs[0].shift[:] = [0, 1, 8, MAX_SHIFT]
    for job in jobs:
        pads = sum(beat["pad"] for beat in job.beats)
        windows = len(reference(SMALL, job)) if job.pool == PoolMode.AVG else 0
        want = serial_sfu_cycles(job.shift, raw=job.out_type == OutType.RAW, residual=job.residual,
                                 pixels=len(job.beats) - pads, pad_pixels=pads, avg_windows=windows,
                                 avg_shift=_reg(job, "avg_shift")) + SERIAL_LATENCY
        assert _serial_cycles(SMALL, job) == want, f"{job.pool.name} {job.out_type.name} {job.shift}"
