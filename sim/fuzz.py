"""Seeded random valid programs, to run on the RTL and on the golden model and compare.

:func:`fuzz_job` draws one program from the builders of :mod:`systolic.sim.programs` (GEMM,
convolution, pooling, residual) with random shapes that straddle the array's tile sizes, strides,
paddings, dilations, layouts, activations and requantize entries; then, for some of them, it
overwrites the SFU settings with values from the edges of their ranges (the CONFIG registers and
the requantize table entries: largest multipliers, shifts 0 and 62, saturating biases and zero
points), which the builders' own numpy reference no longer predicts but the golden model does.
Each job also moves the image to a random ``dram_base`` (any byte offset: the DMA sees unaligned
tensors) with the program words after it.

Job ``index`` of seed ``seed`` depends on nothing else, so one failing job reproduces alone:
``fuzz_job(config, seed, index)``. The test (tests/sim/test_rtl_fuzz.py) reads the seed and the
number of jobs from :data:`SEED_ENV` and :data:`COUNT_ENV`.

Units: addresses and sizes in bytes, shapes in elements.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from systolic.hw.config import AcceleratorConfig
from systolic.hw.isa import FIELDS, HEADER_LAYOUT, INSTR_BYTES, Opcode, Program
from systolic.sim.arith import MAX_SHIFT
from systolic.sim.programs import (
    ACTIVATION_NAMES,
    Case,
    conv_case,
    gemm_case,
    pool_case,
    residual_case,
)

__all__ = ["FuzzJob", "fuzz_job", "fuzz_jobs", "SEED_ENV", "COUNT_ENV", "KINDS"]

#: Environment variable with the fuzz seed (an integer).
SEED_ENV = "SYSTOLIC_FUZZ_SEED"
#: Environment variable with the number of jobs per configuration.
COUNT_ENV = "SYSTOLIC_FUZZ_COUNT"

#: Program kinds and their weights, where the configuration has the SFU feature.
KINDS = {"gemm": 3, "conv": 4, "pool": 2, "residual": 2}

_ATTEMPTS = 32            # draws of one job's parameters before giving up
_HEADER_FIELDS = {name for name, _ in HEADER_LAYOUT}


@dataclass
class FuzzJob:
    """One random program and how the RTL sees it.

    ``case`` is the program with its DRAM image as the golden model runs it (``dram_base`` 0).
    ``image`` is the RTL's DRAM: ``case.dram`` at ``dram_base`` (bytes below it zero), then the
    program's words again at ``prog_addr`` (64-byte aligned), where the accelerator fetches them.
    ``edges`` is true when the SFU settings were overwritten, so that ``case.expected`` (the
    builder's numpy reference) no longer applies and is empty."""

    name: str
    seed: int
    index: int
    config: AcceleratorConfig
    case: Case
    edges: bool
    dram_base: int
    image: np.ndarray
    prog_addr: int

    def golden_view(self, rtl_dram: np.ndarray) -> np.ndarray:
        """The part of an RTL DRAM dump that corresponds to the golden model's image."""
        return rtl_dram[self.dram_base:self.dram_base + self.case.dram.size]

    def compare(self, golden_dram: np.ndarray, rtl_dram: np.ndarray) -> None:
        """Raise AssertionError naming this job, the first differing byte (address and the
        region of the case it falls in) and the number of differing bytes."""
        if rtl_dram.shape != self.image.shape:
            raise AssertionError(f"{self.name}: the RTL returned {rtl_dram.size} bytes of DRAM, "
                                 f"not {self.image.size}")
        end = self.dram_base + self.case.dram.size
        outside = np.concatenate([rtl_dram[:self.dram_base] != self.image[:self.dram_base],
                                  rtl_dram[end:] != self.image[end:]])
        if outside.any():
            raise AssertionError(f"{self.name}: the RTL changed {int(outside.sum())} bytes outside "
                                 f"the case's image (below dram_base, or after it: the program words)")
        view = self.golden_view(rtl_dram)
        differ = np.flatnonzero(view != golden_dram)
        if differ.size:
            addr = int(differ[0])
            region = next((f"{name}+{addr - start:#x}" for name, (start, size)
                           in self.case.regions.items() if start <= addr < start + size),
                          "no region")
            raise AssertionError(
                f"{self.name}: DRAM byte {addr:#x} ({region}) is {int(view[addr]):#04x} on the RTL "
                f"and {int(golden_dram[addr]):#04x} on the golden model ({differ.size} bytes differ)")


def fuzz_jobs(config: AcceleratorConfig, seed: int, count: int, *, start: int = 0) -> list[FuzzJob]:
    """Jobs ``start .. start + count - 1`` of ``seed`` for ``config``."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"count must be a non-negative integer, not {count!r}")
    return [fuzz_job(config, seed, index) for index in range(start, start + count)]


def fuzz_job(config: AcceleratorConfig, seed: int, index: int) -> FuzzJob:
    """Job ``index`` of ``seed``: a valid program for ``config`` (see the module docstring)."""
    if not isinstance(config, AcceleratorConfig):
        raise TypeError(f"config must be an AcceleratorConfig, not {type(config).__name__}")
    for label, value in (("seed", seed), ("index", index)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{label} must be a non-negative integer, not {value!r}")
    rng = np.random.default_rng([seed, index, config.hash & 0xFFFF_FFFF])
    kinds = [k for k in KINDS if (k != "pool" or config.sfu_pooling)
             and (k != "residual" or config.sfu_residual)]
    weights = np.array([KINDS[k] for k in kinds], float)
    kind = str(rng.choice(kinds, p=weights / weights.sum()))
    for _ in range(_ATTEMPTS):
        params = _DRAW[kind](rng, config)
        try:
            case = _BUILD[kind](config, **params)
        except ValueError as exc:
            refusal = exc   # a combination the builder refuses for this config: draw again
            continue
        break
    else:
        raise ValueError(f"fuzz job {index} of seed {seed}: the {kind} builder must accept one of "
                         f"{_ATTEMPTS} draws of parameters for config {config.hash_hex}, but refused "
                         f"them all (the last: {refusal})")
    edges = "table" in case.regions and bool(rng.random() < 0.4)
    if edges:
        case = _with_edge_sfu(rng, config, case)
    detail = ", ".join(f"{k}={v}" for k, v in params.items())
    name = (f"fuzz job {index} of seed {seed} ({kind}: {detail}{', SFU edges' if edges else ''})")
    dram_base = int(rng.choice([0, 64 * int(rng.integers(1, 64)), int(rng.integers(1, 4096))]))
    prog_addr = -(-(dram_base + case.dram.size) // INSTR_BYTES) * INSTR_BYTES
    words = np.frombuffer(case.program.words(), np.uint8)
    image = np.zeros(prog_addr + words.size, np.uint8)
    image[dram_base:dram_base + case.dram.size] = case.dram
    image[prog_addr:] = words
    return FuzzJob(name, seed, index, config, case, edges, dram_base, image, prog_addr)


# -- parameters --------------------------------------------------------------------------------

def _dim(rng: np.random.Generator, hi: int, tile: int) -> int:
    """A size in 1..hi, often at a tile edge (1, tile - 1, tile, tile + 1, 2 tile + 1)."""
    if rng.random() < 0.4:
        edges = [v for v in (1, tile - 1, tile, tile + 1, 2 * tile + 1) if 1 <= v <= hi]
        return int(rng.choice(edges))
    return int(rng.integers(1, hi + 1))


def _act(rng: np.random.Generator, config: AcceleratorConfig) -> str:
    return str(rng.choice([a for a in ACTIVATION_NAMES if a == "none" or a in config.sfu_activations]))


def _draw_gemm(rng: np.random.Generator, config: AcceleratorConfig) -> dict[str, Any]:
    R, C = config.rows, config.cols
    requant = bool(rng.random() < 0.75)
    params: dict[str, Any] = {"M": _dim(rng, 3 * R + 3, R), "K": _dim(rng, 4 * R + 5, R),
                              "N": _dim(rng, 2 * C + 3, C), "seed": int(rng.integers(1 << 16)),
                              "requant": requant, "extremes": bool(rng.random() < 0.2)}
    if requant:
        params.update(act=_act(rng, config), per_channel=bool(rng.random() < 0.7))
    return params


def _draw_conv(rng: np.random.Generator, config: AcceleratorConfig) -> dict[str, Any]:
    kh, kw = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    dilation = int(rng.choice([1, 1, 2]))
    pad = int(rng.integers(0, 3))
    # the padded image must hold the dilated kernel
    H = int(rng.integers(max(1, dilation * (kh - 1) + 1 - 2 * pad), 10))
    W = int(rng.integers(max(1, dilation * (kw - 1) + 1 - 2 * pad), 10))
    requant = bool(rng.random() < 0.8)
    params: dict[str, Any] = {
        "H": H, "W": W, "Cin": _dim(rng, 2 * config.rows + 1, config.rows),
        "Cout": _dim(rng, 2 * config.cols + 1, config.cols), "kh": kh, "kw": kw,
        "stride": int(rng.integers(1, 4)), "pad": pad, "dilation": dilation,
        "seed": int(rng.integers(1 << 16)), "layout": str(rng.choice(["nhwc", "nchw"])),
        "requant": requant}
    if requant:
        params.update(act=_act(rng, config), per_channel=bool(rng.random() < 0.7))
    return params


def _draw_pool(rng: np.random.Generator, config: AcceleratorConfig) -> dict[str, Any]:
    H, W = int(rng.integers(1, 9)), int(rng.integers(1, 9))
    params: dict[str, Any] = {"H": H, "W": W, "channels": _dim(rng, 2 * config.cols + 3, config.cols),
                              "pool": str(rng.choice(config.sfu_pooling)), "act": _act(rng, config),
                              "seed": int(rng.integers(1 << 16))}
    if rng.random() < 0.2:
        params["global_pool"] = True
        return params
    kh, kw = int(rng.integers(1, min(H, 3) + 1)), int(rng.integers(1, min(W, 3) + 1))
    params.update(kernel=(kh, kw), stride=(int(rng.integers(1, 4)), int(rng.integers(1, 4))),
                  pad=(int(rng.integers(0, kh)), int(rng.integers(0, kw))))
    return params


def _draw_residual(rng: np.random.Generator, config: AcceleratorConfig) -> dict[str, Any]:
    R, C = config.rows, config.cols
    return {"M": _dim(rng, 3 * R + 3, R), "K": _dim(rng, 3 * R + 3, R), "N": _dim(rng, 2 * C + 3, C),
            "seed": int(rng.integers(1 << 16)), "act": _act(rng, config)}


_DRAW = {"gemm": _draw_gemm, "conv": _draw_conv, "pool": _draw_pool, "residual": _draw_residual}
_BUILD = {"gemm": gemm_case, "conv": conv_case, "pool": pool_case, "residual": residual_case}


# -- SFU settings at their edges ---------------------------------------------------------------

def _edge(rng: np.random.Generator, lo: int, hi: int, extra: tuple[int, ...] = ()) -> int:
    """A value of [lo, hi]: an end, near zero, one of ``extra``, or uniform."""
    choices = [lo, hi, lo + 1, hi - 1, 0, 1, -1, *extra]
    choices = [v for v in choices if lo <= v <= hi]
    if rng.random() < 0.3:
        return int(rng.integers(lo, hi + 1))
    return int(rng.choice(choices))


def _with_edge_sfu(rng: np.random.Generator, config: AcceleratorConfig, case: Case) -> Case:
    """``case`` with some requantize table entries and CONFIG registers at the edges of their
    ranges; ``expected`` emptied (the builder's reference assumed the old settings)."""
    dram = case.dram.copy()
    table_addr, table_bytes = case.regions["table"]
    entries = dram[table_addr:table_addr + table_bytes].view("<i4").reshape(-1, 3).copy()
    acc_lo, acc_hi = config.acc_range
    i32 = (-(1 << 31), (1 << 31) - 1)
    for entry in entries:
        if rng.random() < 0.5:
            entry[0] = _edge(rng, max(acc_lo, i32[0]), min(acc_hi, i32[1]))
            entry[1] = _edge(rng, *i32, extra=(1 << 30, 1 << 16))
            entry[2] = _edge(rng, 0, MAX_SHIFT, extra=(16, 31, 32, 40))
    dram[table_addr:table_addr + table_bytes] = entries.reshape(-1).view(np.uint8)

    out_lo, out_hi = config.output_range
    instrs = []
    for instr in case.program.instructions:
        if instr.op is Opcode.CONFIG:
            changes = {}
            for f in FIELDS[Opcode.CONFIG]:
                if f.name in _HEADER_FIELDS or rng.random() < 0.5:
                    continue
                if f.name.endswith("_shift"):
                    changes[f.name] = _edge(rng, 0, min(f.max, MAX_SHIFT), extra=(16, 31))
                elif f.name in ("zp_out", "act_lo", "act_hi") and rng.random() < 0.7:
                    changes[f.name] = _edge(rng, out_lo, out_hi)   # the output domain, mostly
                else:
                    changes[f.name] = _edge(rng, f.min, f.max)
            instr = instr.replace(**changes)
        instrs.append(instr)
    program = Program(tuple(instrs), case.program.config_hash)
    words = np.frombuffer(program.words(), np.uint8)
    dram[case.program_addr:case.program_addr + words.size] = words
    return Case(case.name + " (SFU edges)", case.config, program, dram, {}, case.program_addr,
                case.macs, dict(case.regions))
