"""The catalogue of example programs that the golden-model tests and the RTL tests both run.

An entry is a :class:`CaseSpec`: a builder of :mod:`systolic.sim.programs` (``gemm``, ``conv``,
``pool``, ``residual``) with its arguments, for no particular configuration; ``spec.build(config)``
makes the :class:`~systolic.sim.programs.Case` for one. The golden tests
(``tests/sim/test_golden_*.py``) take their programs from the lists here and check them against
numpy on their configurations; ``tests/sim/test_rtl_programs.py`` runs every entry
(:data:`CATALOGUE`) on the RTL of four configurations and compares it with the golden model. A
program added here is therefore checked on both. Shapes are in elements (see each builder).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from systolic.hw.config import AcceleratorConfig
from systolic.sim.programs import Case, conv_case, gemm_case, pool_case, residual_case

__all__ = [
    "CaseSpec", "case_spec", "BUILDERS", "CATALOGUE", "RTL_CONFIGS",
    "GEMM_SHAPES", "GEMM_RAW", "GEMM_ACTIVATIONS", "GEMM_PER_TENSOR", "GEMM_EXTREMES",
    "GEMM_INT32_WRAP", "GEMM_WEIGHT_REUSE", "GEMM_TRANSPOSED", "GEMM_SMALL", "GEMM_CORRUPTED",
    "GEMM_HAZARD_CHECK", "GEMM_OVERLAP", "GEMM_MISSING_TOKEN", "GEMM_DEPTH_ONE",
    "CONV_SHAPES", "CONV_NHWC", "CONV_NCHW", "CONV_RAW", "CONV_PADDING", "CONV_GATHER",
    "POOLS", "POOL", "POOL_RECTANGULAR", "POOL_GLOBAL_ROW", "RESIDUAL",
]

#: The configurations the RTL tests run the catalogue and the fuzz jobs on, one Verilator build
#: each: weight- and output-stationary, 8x8 (the default config, which other RTL tests build too)
#: and 4x4 with a 128-byte scratchpad (32 rows: M and K tiles of a few rows, so that the
#: programs tile every dimension) and an accumulator with room for the pooled images. The OS 4x4
#: one has the small FPGAs' choices: the serial DMA engines and SFU, no command or memory
#: registers. The 4x4 ones load the requantize table in groups (``requant_load_entries`` 2 and 1,
#: so the LOAD engines' rows are one or two entries wide).
RTL_CONFIGS: dict[str, AcceleratorConfig] = {
    "ws8": AcceleratorConfig(),
    "os8": AcceleratorConfig(dataflow="os"),
    "ws4": AcceleratorConfig(rows=4, cols=4, scratchpad_bytes=128, accumulator_bytes=2048,
                             requant_load_entries=2),
    "os4": AcceleratorConfig(rows=4, cols=4, scratchpad_bytes=128, accumulator_bytes=2048,
                             dataflow="os", gather_engine="serial", scatter_engine="serial",
                             sfu_engine="serial", command_registers=False, memory_registers=False,
                             requant_load_entries=1),
}

#: The builders an entry may name.
BUILDERS: dict[str, Callable[..., Case]] = {
    "gemm": gemm_case, "conv": conv_case, "pool": pool_case, "residual": residual_case,
}


@dataclass(frozen=True)
class CaseSpec:
    """A builder of :mod:`systolic.sim.programs` and its arguments but the config (make one with
    :func:`case_spec`)."""

    builder: str
    args: tuple[Any, ...]
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments of the builder."""
        return dict(self.options)

    @property
    def id(self) -> str:
        """A short name for test ids: ``gemm-17x33x9-seed=59-requant=False``."""
        parts = [self.builder, "x".join(str(a) for a in self.args)]
        parts += [f"{key}={_short(value)}" for key, value in self.options]
        return "-".join(parts)

    def build(self, config: AcceleratorConfig) -> Case:
        """The case for ``config``: ``BUILDERS[builder](config, *args, **kwargs)``."""
        return BUILDERS[self.builder](config, *self.args, **self.kwargs)


def case_spec(builder: str, *args: Any, **options: Any) -> CaseSpec:
    """``case_spec("gemm", 17, 33, 9, seed=59, requant=False)``: an entry calling
    ``gemm_case(config, 17, 33, 9, seed=59, requant=False)``."""
    if builder not in BUILDERS:
        raise ValueError(f"builder must be one of {', '.join(BUILDERS)}, not {builder!r}")
    return CaseSpec(builder, tuple(args), tuple(options.items()))


def _short(value: Any) -> str:
    if isinstance(value, tuple):
        return "x".join(str(v) for v in value)
    return str(value)


# -- GEMM (tests/sim/test_golden_gemm.py, test_golden_tokens.py) ----------------------------------

#: M, K, N: ones, vectors (1xN, Nx1), partial tiles in every dimension.
GEMM_SHAPES: tuple[tuple[int, int, int], ...] = (
    (1, 1, 1), (1, 9, 1), (9, 1, 1), (1, 1, 9), (17, 33, 9), (8, 8, 8), (21, 5, 13))
#: Raw accumulator output of each shape (compared with numpy's product).
GEMM_RAW = tuple(case_spec("gemm", *shape, seed=sum(shape), requant=False) for shape in GEMM_SHAPES)
#: Requantized output through each activation.
GEMM_ACTIVATIONS = tuple(case_spec("gemm", 19, 23, 11, seed=7, act=act)
                         for act in ("none", "relu", "relu6", "clip"))
#: One requantize scale for every channel.
GEMM_PER_TENSOR = case_spec("gemm", 6, 10, 7, seed=3, per_channel=False)
#: All operands -128 over a long K with edge requantize entries: saturation at both ends.
GEMM_EXTREMES = case_spec("gemm", 3, 600, 20, seed=5, extremes=True)
#: K = 131073 products of -128 * -128 sum past 2**31: the int32 accumulator wraps.
GEMM_INT32_WRAP = case_spec("gemm", 1, (1 << 31) // (128 * 128) + 1, 2, requant=False, extremes=True)
#: Many M tiles through one set of stationary weights (WS reuse).
GEMM_WEIGHT_REUSE = case_spec("gemm", 30, 4, 4, requant=False)
#: Full tiles whose A^T comes from transposing LOADs (OS).
GEMM_TRANSPOSED = case_spec("gemm", 8, 16, 8, requant=False)
#: A small GEMM whose program the golden model takes in every form (words, lists).
GEMM_SMALL = case_spec("gemm", 4, 4, 4, seed=9)
#: The GEMM whose operand byte the golden tests corrupt (the check must notice).
GEMM_CORRUPTED = case_spec("gemm", 5, 7, 3, seed=11, requant=False)
#: The GEMM run with and without the hazard check.
GEMM_HAZARD_CHECK = case_spec("gemm", 13, 9, 10, seed=4)
#: Double buffering: the queues overlap.
GEMM_OVERLAP = case_spec("gemm", 24, 24, 8, seed=1)
#: The GEMM whose token the golden tests remove (the hazard check must notice).
GEMM_MISSING_TOKEN = case_spec("gemm", 24, 8, 4, seed=2)
#: The GEMM run with queues and channels of depth one.
GEMM_DEPTH_ONE = case_spec("gemm", 13, 9, 10, seed=1)


# -- convolution (tests/sim/test_golden_conv.py) ----------------------------------------------------

#: H, W, Cin, Cout, kh, kw, stride, pad, dilation.
CONV_SHAPES: tuple[tuple[int, ...], ...] = (
    (5, 7, 3, 5, 3, 3, 1, 1, 1),     # 'same' 3x3
    (9, 8, 4, 9, 3, 3, 2, 1, 1),     # stride 2, partial channel tiles
    (9, 9, 2, 3, 3, 3, 1, 2, 2),     # dilation 2
    (6, 5, 17, 3, 1, 1, 1, 0, 1),    # pointwise, Cin over several K tiles
    (3, 3, 1, 1, 3, 3, 1, 1, 1),     # one channel in, one out
    (1, 12, 3, 2, 1, 3, 1, 0, 1),    # 1 x N image
    (12, 1, 3, 2, 3, 1, 1, 1, 1),    # N x 1 image
    (7, 7, 2, 2, 7, 7, 1, 3, 1),     # kernel as large as the image
    (8, 10, 3, 4, 2, 3, 3, 1, 1),    # stride larger than the kernel height
)
#: NHWC input, ReLU.
CONV_NHWC = tuple(case_spec("conv", *shape, seed=sum(shape), act="relu") for shape in CONV_SHAPES)
#: NCHW input, clip, on the first four shapes.
CONV_NCHW = tuple(case_spec("conv", *shape, seed=3, layout="nchw", act="clip")
                  for shape in CONV_SHAPES[:4])
#: Raw output, compared with a naive convolution.
CONV_RAW = case_spec("conv", 6, 6, 3, 4, 3, 3, 1, 1, 1, seed=5, requant=False)
#: A 1x1 image under a 3x3 kernel: eight padding pixels read the zero point.
CONV_PADDING = case_spec("conv", 1, 1, 1, 1, 3, 3, 1, 1, 1, seed=0, requant=False)
#: im2col gathers straight from the image (no im2col matrix in DRAM).
CONV_GATHER = case_spec("conv", 8, 8, 4, 8, 3, 3, 1, 1, 1, seed=2)


# -- pooling and residual (tests/sim/test_golden_sfu.py) -------------------------------------------

#: pool, kernel, stride, pad, global_pool.
POOLS: tuple[tuple[str, int, int, int, bool], ...] = (
    ("max", 2, 2, 0, False), ("max", 3, 2, 1, False), ("avg", 3, 2, 1, False),
    ("avg", 3, 1, 2, False), ("avg", 2, 3, 1, False), ("max", 1, 1, 0, True),
    ("avg", 1, 1, 0, True))
#: Each pooling of a 7x6x19 image, with and without ReLU.
POOL = tuple(case_spec("pool", 7, 6, 19, pool=pool, kernel=kernel, stride=stride, pad=pad,
                       global_pool=global_pool, act=act, seed=kernel * 10 + stride)
             for pool, kernel, stride, pad, global_pool in POOLS for act in ("none", "relu"))
#: A 3x2 window, stride 2x1, padding 1x0.
POOL_RECTANGULAR = case_spec("pool", 9, 5, 8, pool="avg", kernel=(3, 2), stride=(2, 1), pad=(1, 0),
                             seed=4)
#: Global average of a 1 x 13 image.
POOL_GLOBAL_ROW = case_spec("pool", 1, 13, 6, pool="avg", global_pool=True, seed=8)
#: A GEMM plus a residual tensor, through each activation.
RESIDUAL = tuple(case_spec("residual", 13, 9, 10, seed=len(act), act=act)
                 for act in ("none", "relu", "clip"))


#: Every entry above, once.
CATALOGUE: tuple[CaseSpec, ...] = tuple(dict.fromkeys((
    *GEMM_RAW, *GEMM_ACTIVATIONS, GEMM_PER_TENSOR, GEMM_EXTREMES, GEMM_INT32_WRAP,
    GEMM_WEIGHT_REUSE, GEMM_TRANSPOSED, GEMM_SMALL, GEMM_CORRUPTED, GEMM_HAZARD_CHECK, GEMM_OVERLAP,
    GEMM_MISSING_TOKEN, GEMM_DEPTH_ONE,
    *CONV_NHWC, *CONV_NCHW, CONV_RAW, CONV_PADDING, CONV_GATHER,
    *POOL, POOL_RECTANGULAR, POOL_GLOBAL_ROW, *RESIDUAL)))
