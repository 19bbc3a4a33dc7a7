"""Seeded random valid programs (sim/fuzz.py) on the RTL of the four ``RTL_CONFIGS`` against the
golden model: the DRAM the accelerator leaves must be the golden model's, byte for byte.

``SYSTOLIC_FUZZ_SEED`` (default 1) and ``SYSTOLIC_FUZZ_COUNT`` (jobs per configuration, default
150) choose the jobs; a failure names the seed and the job, and ``fuzz_job(config, seed, index)``
rebuilds that job alone. Per configuration the jobs run as two batches (one simulator process
each): even jobs with the fixed-latency DRAM, odd ones with its seeded random backpressure.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from systolic.hw.config import AcceleratorConfig
from systolic.sim import fuzz
from systolic.sim.catalogue import RTL_CONFIGS
from systolic.sim.fuzz import COUNT_ENV, SEED_ENV, fuzz_job, fuzz_jobs
from systolic.sim.golden import run_golden
from systolic.sim.rtl import RTLError, RTLJob, RTLRunner


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name, "")
    if not text:
        return default
    if not re.fullmatch(r"\d+", text):
        raise ValueError(f"{name} must be a non-negative integer, not {text!r}")
    return int(text)


SEED = _env_int(SEED_ENV, 1)
COUNT = _env_int(COUNT_ENV, 150)


@pytest.mark.slow
@pytest.mark.parametrize("name", RTL_CONFIGS)
def test_fuzz_matches_golden(name: str) -> None:
    config = RTL_CONFIGS[name]
    reproduce = (f"{SEED_ENV}={SEED} {COUNT_ENV}={COUNT} on {name}; rebuild one job with "
                 f"fuzz_job(RTL_CONFIGS[{name!r}], {SEED}, index)")
    jobs = fuzz_jobs(config, SEED, COUNT)
    goldens = []
    for job in jobs:
        try:
            goldens.append(run_golden(config, job.case.program, job.case.dram))
        except ValueError as exc:
            pytest.fail(f"{job.name}: the golden model rejects the program ({exc}); {reproduce}")
    failures = []
    for memory, parity in (("fast", 0), ("fast-random", 1)):
        chosen = [i for i in range(len(jobs)) if i % 2 == parity]
        runner = RTLRunner(config, memory=memory, seed=SEED)
        outcomes = runner.run_many([
            RTLJob(jobs[i].case.program, jobs[i].image, jobs[i].prog_addr,
                   max_cycles=8 * goldens[i].cycles + 20_000, dram_base=jobs[i].dram_base)
            for i in chosen])
        for i, outcome in zip(chosen, outcomes, strict=True):
            job, golden = jobs[i], goldens[i]
            if isinstance(outcome, RTLError):
                failures.append(f"{job.name} ({memory}): {outcome}")
                continue
            try:
                job.compare(golden.dram, outcome.dram)
                if job.case.expected:
                    job.case.check(job.golden_view(outcome.dram))
                assert (outcome.macs, outcome.instructions) == (golden.macs, golden.instructions), \
                    (f"{job.name}: macs, instructions {outcome.macs}, {outcome.instructions} on "
                     f"the RTL, {golden.macs}, {golden.instructions} on the golden model")
            except AssertionError as exc:
                failures.append(f"{exc} ({memory})")
    if failures:
        pytest.fail(f"{len(failures)} of {len(jobs)} fuzz jobs differ ({reproduce}):\n"
                    + "\n".join(failures[:10]))


# -- the generator itself (no RTL) ------------------------------------------------------------

CONFIG = RTL_CONFIGS["ws4"]


def test_a_job_depends_only_on_seed_index_and_config() -> None:
    again = fuzz_job(CONFIG, 7, 3)
    first = fuzz_job(CONFIG, 7, 3)
    assert again.name == first.name and again.case.program == first.case.program
    np.testing.assert_array_equal(again.image, first.image)
    assert fuzz_jobs(CONFIG, 7, 2, start=2)[1].name == first.name
    assert fuzz_job(CONFIG, 7, 4).name != first.name
    assert fuzz_job(CONFIG, 8, 3).name != first.name
    assert first.name.startswith("fuzz job 3 of seed 7 (")


def test_jobs_are_valid_and_varied() -> None:
    """The golden model runs every job; the builders' numpy results hold where the SFU settings
    were kept; the kinds, layouts, SFU edges and DRAM bases all occur."""
    jobs = fuzz_jobs(CONFIG, 3, 120)
    for job in jobs:
        result = run_golden(CONFIG, job.case.program, job.case.dram)
        if job.case.expected:
            job.case.check(result.dram)
        assert job.image[job.dram_base:job.dram_base + job.case.dram.size].tobytes() == \
            job.case.dram.tobytes()
        assert job.image[job.prog_addr:].tobytes() == job.case.program.words()
        assert job.prog_addr % 64 == 0 and not job.image[:job.dram_base].any()
    names = " ".join(job.name for job in jobs)
    for word in ("gemm:", "conv:", "pool:", "residual:", "nchw", "nhwc", "SFU edges",
                 "extremes=True", "requant=False", "global_pool=True"):
        assert word in names, word
    bases = {job.dram_base for job in jobs}
    assert 0 in bases and any(b % 64 for b in bases) and any(b and b % 64 == 0 for b in bases)


def test_edge_settings_leave_the_valid_range_alone() -> None:
    """Overwritten CONFIG registers and table entries stay inside their fields and shifts in
    0..62; the numpy expectation is dropped with them."""
    edged = [job for job in fuzz_jobs(CONFIG, 5, 60) if job.edges]
    assert edged
    for job in edged:
        assert job.case.expected == {} and job.name.endswith(", SFU edges)")
        addr, size = job.case.regions["table"]
        entries = job.case.dram[addr:addr + size].view("<i4").reshape(-1, 3)
        assert entries[:, 2].min() >= 0 and entries[:, 2].max() <= 62
        run_golden(CONFIG, job.case.program, job.case.dram)


def test_compare_names_the_first_difference() -> None:
    job = fuzz_job(CONFIG, 2, 0)
    golden = run_golden(CONFIG, job.case.program, job.case.dram)
    rtl = job.image.copy()
    rtl[job.dram_base:job.dram_base + golden.dram.size] = golden.dram
    job.compare(golden.dram, rtl)
    addr, _ = job.case.regions["x"]
    rtl[job.dram_base + addr + 1] ^= 0x40
    with pytest.raises(AssertionError, match=rf"^fuzz job 0 of seed 2 \(.*\): DRAM byte "
                                             rf"{addr + 1:#x} \(x\+0x1\) is 0x[0-9a-f]{{2}} on the RTL "
                                             rf"and 0x[0-9a-f]{{2}} on the golden model \(1 bytes "
                                             rf"differ\)$"):
        job.compare(golden.dram, rtl)
    rtl[job.dram_base + addr + 1] ^= 0x40
    rtl[-1] ^= 1
    with pytest.raises(AssertionError, match=r"^fuzz job 0 of seed 2 \(.*\): the RTL changed 1 bytes "
                                             r"outside the case's image \(below dram_base, or after "
                                             r"it: the program words\)$"):
        job.compare(golden.dram, rtl)
    with pytest.raises(AssertionError, match=r"^fuzz job 0 of seed 2 \(.*\): the RTL returned 5 "
                                             r"bytes of DRAM, not \d+$"):
        job.compare(golden.dram, rtl[:5])


@pytest.mark.parametrize("args, error, message", [
    ((CONFIG, -1, 0), ValueError, r"^seed must be a non-negative integer, not -1$"),
    ((CONFIG, 0, 1.5), ValueError, r"^index must be a non-negative integer, not 1\.5$"),
    (({"rows": 4}, 0, 0), TypeError, r"^config must be an AcceleratorConfig, not dict$"),
])
def test_fuzz_job_argument_errors(args: tuple, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        fuzz_job(*args)


def test_fuzz_jobs_count_error() -> None:
    with pytest.raises(ValueError, match=r"^count must be a non-negative integer, not -2$"):
        fuzz_jobs(CONFIG, 0, -2)


def test_a_builder_that_refuses_every_draw(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(config: AcceleratorConfig, **params: object) -> None:
        raise ValueError("the image does not fit")

    for kind in fuzz._BUILD:
        monkeypatch.setitem(fuzz._BUILD, kind, refuse)
    with pytest.raises(ValueError, match=rf"^fuzz job 4 of seed 2: the (gemm|conv|pool|residual) "
                                         rf"builder must accept one of 32 draws of parameters for "
                                         rf"config {CONFIG.hash_hex}, but refused them all \(the "
                                         rf"last: the image does not fit\)$"):
        fuzz_job(CONFIG, 2, 4)


def test_environment_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SEED_ENV, "0x10")
    with pytest.raises(ValueError, match=r"^SYSTOLIC_FUZZ_SEED must be a non-negative integer, "
                                         r"not '0x10'$"):
        _env_int(SEED_ENV, 1)
    monkeypatch.setenv(SEED_ENV, "")
    assert _env_int(SEED_ENV, 1) == 1


def test_configs_without_pooling_or_residual_get_other_kinds() -> None:
    bare = AcceleratorConfig(rows=4, cols=4, sfu_pooling=(), sfu_residual=False)
    names = [fuzz_job(bare, 1, i).name for i in range(30)]
    assert not any("pool:" in n or "residual:" in n for n in names)
