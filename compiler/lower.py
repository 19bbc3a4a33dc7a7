"""Lowering: accelerator ops of the IR become ISA v2 instructions.

Each :class:`~systolic.compiler.ir.AccelOp` is cut into tiles that fit the array, the scratchpad
and the accumulator, and each tile into LOADs, COMPUTEs and STOREs:

* **conv and gemm** are GEMMs ``A [pixels x K] . B [K x N]``. A is never written to DRAM: its
  rows are gathered by LOADs straight from the NHWC input (im2col by address pattern: one LOAD per
  k-tile and output block, ``bounded`` with ``pad_value`` = the input zero point at the image
  edges; a 1x1 stride-1 convolution or a gemm reads plain rows of the input and fetches several
  k-tiles in one LOAD). K is cut into *k-tiles* of at most R rows, each one kernel tap and R input
  channels, or -- with fewer than R input channels -- several taps of one kernel row with all
  channels. B is packed at compile time, per n-tile of C output channels, in k-tile row order
  (:func:`pack_weights`), so that every B LOAD is one contiguous burst.
* **depthwise** convolutions (``group`` = input channels) run as block-diagonal GEMMs: an
  n-tile of output channels reads a span of at most R input channels, and each kernel tap is one
  k-tile whose packed weight block is diagonal. The array then does useful work in one of every C
  columns per row -- the price of running depthwise layers on a GEMM engine without a second
  datapath -- but the input is read once per tap and nothing is copied.
* **pool, act and add** ops have no GEMM: a LOAD with ``widen`` puts the input into the
  accumulator and a STORE does the rest in the SFU (pooling windows, requantization, the
  residual operand).

Tiling. The output is cut into *blocks* (rectangles of output pixels; for a conv with a fused
pooling, rectangles of pooled pixels whose conv windows -- with their halos -- fit the
accumulator), output channels into *groups* of ``nt`` n-tiles, and the k-tiles into *chunks* of
``kt`` k-tiles. A tile is one (block, group): its ``nt`` x block-pixels accumulator rows live in one
of two accumulator buffers while the other is being stored. Each chunk's A and B operands go to one
of two copies of their scratchpad areas (double buffering); an operand that fits whole stays
*resident* and is reused across the inner loop (A across groups in loop order ``mnk``, B across
blocks in ``nmk``). The B area starts at a scratchpad bank boundary after the A area when both
fit (:func:`spad_layout`): the array reads an A row and a B row in the same cycle, and two reads
in one bank share its one read per cycle. Per layer, :func:`choose_tiling` enumerates block
sizes, ``nt``, ``kt``, loop orders and residency and keeps the candidate with the smallest cycle
estimate (:func:`estimate_cycles`, a job-level copy of the cycle model of docs/isa.md, validated
against the golden model in the tests); of candidates within :data:`TIE` of the fastest, the one
with the fewest instructions.

Synchronization is derived, not hand-written: :class:`ProgramBuilder` records which scratchpad,
accumulator and table rows and which DRAM buffers every instruction reads and writes, and gives
each instruction the dependency tokens it needs so that every conflicting pair from different
queues is ordered -- exactly the rule the golden model's hazard checker enforces. A dependency
between the load and the store queue goes through the compute queue (through a COMPUTE that
already knows it, or a SYNC inserted on the compute queue). The k-th token pushed into a channel
is placed after the (k - token_depth)-th one taken in program order, so that a full channel never
deadlocks. Instructions are emitted one chunk ahead (the loads of chunk j + 1 before the computes
of chunk j), so that loading overlaps computing.

Units: DRAM addresses and sizes in bytes; scratchpad, accumulator and table addresses in rows;
tensor sizes in elements; times in cycles.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from systolic.hw.array import ws_tile_interval
from systolic.hw.config import AcceleratorConfig
from systolic.hw.dma import residual_read_fields
from systolic.hw.dma_serial import serial_load_cycles, serial_store_write_cycles
from systolic.hw.isa import INSTR_BYTES, Instruction
from systolic.hw.requant_table import table_load_fields
from systolic.hw.sfu_serial import serial_sfu_cycles

from .errors import CompileError
from .ir import AccelOp, Graph
from .reference import store_ties

__all__ = [
    "TilingError", "LayerGeometry", "KTile", "Block", "Tiling", "LayerAddresses", "LayerCode",
    "ProgramBuilder", "SegmentLowering", "geometry", "ktiles", "n_tiles", "blocks", "pack_weights",
    "pack_table", "pack_bias", "candidate_tilings", "choose_tiling", "estimate_cycles",
    "layer_jobs", "LoopShape", "TIE", "layer_macs", "a_rows_per_ktile", "spad_layout", "spad_rows_needed",
    "table_limit", "check_fields", "QUEUE_OF_OP",
]


class TilingError(CompileError):
    """A layer cannot be tiled into this accelerator's scratchpad, accumulator or instruction
    fields. The message names the layer, what does not fit and the sizes."""


#: Queue number (load 0, compute 1, store 2) of each opcode that has one.
QUEUE_OF_OP = {"LOAD": 0, "COMPUTE": 1, "STORE": 2, "CONFIG": 2}

_ACT_CODES = {"none": 0, "relu": 1, "relu6": 2, "clip": 3}
_S8 = 127   # largest coordinate step of a LOAD (s8 fields)
_U8 = 255


# -- geometry -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerGeometry:
    """Shapes of one accelerator op, in elements and pixels.

    The input is an image batch ``[images, in_h, in_w, in_c]`` (a gemm's ``[..., K]`` input is
    ``[1, M, 1, K]``, an elementwise op's ``[1, M, 1, N]``); the accumulator image (the conv
    output, or the input of a pool/act/add op) is ``acc_h x acc_w`` per image; the output tensor
    is ``[images, out_h, out_w, out_c]`` (pooled when ``pool`` is set)."""

    kind: str
    images: int
    in_h: int
    in_w: int
    in_c: int
    acc_h: int
    acc_w: int
    out_h: int
    out_w: int
    out_c: int
    kernel: tuple[int, int] = (1, 1)
    stride: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    dilation: tuple[int, int] = (1, 1)
    depthwise: bool = False
    multiplier: int = 1
    pool: Any = None            # ir.Pool or None

    @property
    def gemm_like(self) -> bool:
        """conv or gemm: the accumulator is filled by COMPUTEs."""
        return self.kind in ("conv", "gemm")

    @property
    def flat(self) -> bool:
        """The im2col matrix is the input itself viewed as [pixels, channels] (1x1 kernel,
        stride 1, no padding)."""
        return (self.kernel == (1, 1) and self.stride == (1, 1) and not any(self.pads)
                and not self.depthwise)


def geometry(op: AccelOp, graph: Graph) -> LayerGeometry:
    """The :class:`LayerGeometry` of ``op`` in ``graph``."""
    src = graph.tensors[op.input].shape
    dst = graph.tensors[op.output].shape
    n = op.channels
    if op.kind == "gemm":
        k = src[-1]
        m = math.prod(src[:-1])
        return LayerGeometry("gemm", 1, m, 1, k, m, 1, m, 1, n)
    if op.kind in ("act", "add"):
        m = math.prod(src[:-1])
        return LayerGeometry(op.kind, 1, m, 1, n, m, 1, m, 1, n)
    images, h, w, c = src
    if op.kind == "pool":
        p = op.pool
        return LayerGeometry("pool", images, h, w, c, h, w, dst[1], dst[2], n, pool=p)
    g = op.conv
    oh, ow = g.output_hw(h, w)
    depthwise = g.group != 1
    return LayerGeometry("conv", images, h, w, c, oh, ow, dst[1], dst[2], n, kernel=g.kernel,
                         stride=g.stride, pads=g.pads, dilation=g.dilation, depthwise=depthwise,
                         multiplier=n // c if depthwise else 1, pool=op.pool)


def layer_macs(op: AccelOp, graph: Graph) -> int:
    """Multiply-accumulates the layer's arithmetic needs (padding positions included, zero
    weights of a depthwise mapping excluded): 0 for pool, act and add."""
    if op.kind not in ("conv", "gemm"):
        return 0
    g = geometry(op, graph)
    return g.images * g.acc_h * g.acc_w * g.out_c * op.weights.shape[0]


# -- k-tiles, n-tiles and packed constants -----------------------------------------------------


@dataclass(frozen=True)
class KTile:
    """A slice of the reduction: kernel row ``i``, taps ``j0 .. j0+nj-1`` of it and input channels
    ``ci0 .. ci0+nci-1`` (``nj`` > 1 only when ``nci`` is all channels). ``offset`` is its first row
    in the packed weight block of an n-tile; ``rows = nj * nci``."""

    i: int
    j0: int
    nj: int
    ci0: int
    nci: int
    offset: int
    rows: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rows", self.nj * self.nci)


def n_tiles(geo: LayerGeometry, config: AcceleratorConfig) -> list[tuple[int, int]]:
    """Output channel tiles ``(first channel, channels)``: C channels each, fewer for a
    depthwise conv whose input span must fit R rows."""
    width = config.cols
    if geo.depthwise:
        width = min(config.cols, config.rows * geo.multiplier)
    return [(n0, min(width, geo.out_c - n0)) for n0 in range(0, geo.out_c, width)]


def ktiles(geo: LayerGeometry, config: AcceleratorConfig, tile: tuple[int, int]) -> list[KTile]:
    """The k-tiles of n-tile ``tile`` (the same for every n-tile unless depthwise)."""
    kmax = config.rows
    kh, kw = geo.kernel
    out: list[KTile] = []
    offset = 0
    if geo.depthwise:
        n0, nn = tile
        lo, hi = n0 // geo.multiplier, (n0 + nn - 1) // geo.multiplier
        for i in range(kh):
            for j in range(kw):
                out.append(KTile(i, j, 1, lo, hi - lo + 1, offset))
                offset += hi - lo + 1
        return out
    ci = geo.in_c
    if ci >= kmax or kw == 1:
        for i in range(kh):
            for j in range(kw):
                for c0 in range(0, ci, kmax):
                    t = KTile(i, j, 1, c0, min(kmax, ci - c0), offset)
                    out.append(t)
                    offset += t.rows
        return out
    per = kmax // ci
    for i in range(kh):
        for j0 in range(0, kw, per):
            t = KTile(i, j0, min(per, kw - j0), 0, ci, offset)
            out.append(t)
            offset += t.rows
    return out


def _krows(geo: LayerGeometry, config: AcceleratorConfig) -> int:
    """Rows of one n-tile's packed weight block."""
    tiles = n_tiles(geo, config)
    return max(sum(t.rows for t in ktiles(geo, config, nt)) for nt in tiles)


def pack_weights(op: AccelOp, geo: LayerGeometry, config: AcceleratorConfig) -> np.ndarray:
    """The weights of a conv/gemm as int8 ``[n_tiles, krows, C]``: per n-tile, the rows of its
    k-tiles in order, C columns (zero past the last channel; block-diagonal for depthwise)."""
    tiles = n_tiles(geo, config)
    krows = _krows(geo, config)
    c = config.cols
    out = np.zeros((len(tiles), krows, c), np.int8)
    w = op.weights
    kh, kw = geo.kernel
    for t, (n0, nn) in enumerate(tiles):
        for kt in ktiles(geo, config, (n0, nn)):
            if geo.depthwise:
                tap = kt.i * kw + kt.j0
                cols = np.arange(nn)
                src = (n0 + cols) // geo.multiplier - kt.ci0
                out[t, kt.offset + src, cols] = w[tap, n0 + cols]
            else:
                rows = [(kt.i * kw + j) * geo.in_c + ci for j in range(kt.j0, kt.j0 + kt.nj)
                        for ci in range(kt.ci0, kt.ci0 + kt.nci)]
                out[t, kt.offset:kt.offset + kt.rows, :nn] = w[rows, n0:n0 + nn]
    return out


def pack_table(op: AccelOp, geo: LayerGeometry, config: AcceleratorConfig) -> np.ndarray:
    """Requantize entries ``[n_tiles, C, 3]`` int32 (bias, multiplier, shift), zero past the last
    channel: one table row per n-tile."""
    tiles = n_tiles(geo, config)
    out = np.zeros((len(tiles), config.cols, 3), np.int32)
    for t, (n0, nn) in enumerate(tiles):
        out[t, :nn, 0] = op.bias[n0:n0 + nn]
        out[t, :nn, 1] = op.mult[n0:n0 + nn]
        out[t, :nn, 2] = op.shift[n0:n0 + nn]
    return out


def pack_bias(op: AccelOp, geo: LayerGeometry, config: AcceleratorConfig) -> np.ndarray:
    """The int32 bias of a raw-output op as accumulator rows ``[n_tiles, C]`` (preloaded into the
    accumulator before the products are added)."""
    tiles = n_tiles(geo, config)
    out = np.zeros((len(tiles), config.cols), np.int32)
    for t, (n0, nn) in enumerate(tiles):
        out[t, :nn] = op.bias[n0:n0 + nn]
    return out


# -- blocks of output pixels -------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """A rectangle of output pixels of one image and the accumulator image it needs.

    ``out_*``: output rows/columns (pooled pixels with pooling); ``acc_*``: the rectangle of
    accumulator pixels (conv output, or pool input) in image coordinates; ``pad_top``,
    ``pad_left``: the pooling window offsets relative to that rectangle."""

    image: int
    out_y: int
    out_rows: int
    out_x: int
    out_cols: int
    acc_y: int
    acc_rows: int
    acc_x: int
    acc_cols: int
    pad_top: int = 0
    pad_left: int = 0

    @property
    def pixels(self) -> int:
        """Accumulator rows per n-tile."""
        return self.acc_rows * self.acc_cols

    @property
    def out_pixels(self) -> int:
        return self.out_rows * self.out_cols


def _axis(start: int, count: int, pool: Any, axis: int, extent: int) -> tuple[int, int, int]:
    """Accumulator start, count and local window pad of output range [start, start+count)."""
    if pool is None:
        return start, count, 0
    stride, window, pad = pool.stride[axis], pool.window[axis], pool.pads[axis]
    lo = start * stride - pad
    hi = (start + count - 1) * stride - pad + window
    a, b = max(0, lo), min(extent, hi)
    return a, b - a, a - lo


def _block(geo: LayerGeometry, image: int, y: int, rows: int, x: int, cols: int) -> Block:
    ay, ar, pt = _axis(y, rows, geo.pool, 0, geo.acc_h)
    ax, ac, pl = _axis(x, cols, geo.pool, 1, geo.acc_w)
    return Block(image, y, rows, x, cols, ay, ar, ax, ac, pt, pl)


def _largest(limit: int, fits: Callable[[int], bool]) -> int:
    """The largest v in 1..limit with fits(v) (fits is monotone: true up to some v), or 0."""
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def blocks(geo: LayerGeometry, budget: int) -> list[Block] | None:
    """Output blocks whose accumulator images hold at most ``budget`` pixels: bands of whole
    output rows when a row fits, else pieces of one row; None if one output pixel does not fit.
    Bands and pieces are balanced (equal sizes but the last)."""
    fh, fw = geo.out_h, geo.out_w

    def worst(rows: int, cols: int) -> int:
        # the tallest and widest accumulator rectangles are those of interior blocks
        ys = range(0, fh, rows) if geo.pool is not None else (0,)
        xs = range(0, fw, cols) if geo.pool is not None else (0,)
        h = max(_axis(y, min(rows, fh - y), geo.pool, 0, geo.acc_h)[1] for y in ys)
        w = max(_axis(x, min(cols, fw - x), geo.pool, 1, geo.acc_w)[1] for x in xs)
        return h * w

    def balanced(total: int, most: int, fits: Callable[[int], bool]) -> int:
        size = -(-total // -(-total // most))
        while size > 1 and not fits(size):
            size -= 1
        return size

    def rows_fit(r: int) -> bool:
        return worst(r, fw) <= budget

    rows = _largest(fh, rows_fit)
    if rows >= 1:
        rows = balanced(fh, rows, rows_fit)
        return [_block(geo, i, y, min(rows, fh - y), 0, fw)
                for i in range(geo.images) for y in range(0, fh, rows)]

    def cols_fit(w: int) -> bool:
        return worst(1, w) <= budget

    cols = _largest(fw, cols_fit)
    if cols < 1:
        return None
    cols = balanced(fw, cols, cols_fit)
    return [_block(geo, i, y, 1, x, min(cols, fw - x))
            for i in range(geo.images) for y in range(fh) for x in range(0, fw, cols)]


def _pieces(block: Block, limit: int) -> list[tuple[int, int, int, int, int]]:
    """Split a block's accumulator rectangle into pieces of at most ``limit`` pixels, contiguous
    in row-major order: (y, rows, x, cols, first accumulator row offset)."""
    y, rows, x, cols = block.acc_y, block.acc_rows, block.acc_x, block.acc_cols
    if rows * cols <= limit:
        return [(y, rows, x, cols, 0)]
    out = []
    if cols <= limit:
        group = limit // cols
        for i in range(0, rows, group):
            out.append((y + i, min(group, rows - i), x, cols, i * cols))
        return out
    for i in range(rows):
        for j in range(0, cols, limit):
            out.append((y + i, 1, x + j, min(limit, cols - j), i * cols + j))
    return out


# -- tiling ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tiling:
    """The tiling of one layer: accumulator pixels per n-tile and block (``budget``), n-tiles per
    group (``nt``), k-tiles per chunk (``kt``), loop order (``"mnk"``: blocks outer, groups inner;
    ``"nmk"``: groups outer) and which operand stays resident (``"a"``, ``"b"`` or ``"none"``)."""

    budget: int
    nt: int
    kt: int
    order: str = "mnk"
    resident: str = "none"
    estimate: int = 0

    def describe(self) -> dict[str, Any]:
        return {"block_pixels": self.budget, "n_tiles_per_group": self.nt,
                "k_tiles_per_chunk": self.kt, "order": self.order, "resident": self.resident,
                "estimated_cycles": self.estimate}


@dataclass
class _Spec:
    """One instruction before synchronization: opcode, fields, resource accesses (row ranges
    ``(first, count, write)`` per memory, DRAM buffers ``(id, write)``) and its busy cycles."""

    op: str
    fields: dict[str, int]
    busy: int = 1
    count: int = 1       # instructions it stands for (a light spec sums a chunk's COMPUTEs)
    spad: tuple[tuple[int, int, bool], ...] = ()
    acc: tuple[tuple[int, int, bool], ...] = ()
    table: tuple[tuple[int, int, bool], ...] = ()
    dram: tuple[tuple[int, bool], ...] = ()


@dataclass
class _Job:
    """One step of a layer: the operand LOADs of a chunk (``loads``, emitted one job ahead), the
    LOADs that must follow the previous job in program order (``late``: requantize entries),
    its COMPUTEs, and at a tile's end the tile's STOREs. ``writes``/``reads`` name the operand
    copies and accumulator buffers it fills and uses (for the estimate)."""

    loads: list[_Spec] = field(default_factory=list)
    late: list[_Spec] = field(default_factory=list)
    computes: list[_Spec] = field(default_factory=list)
    stores: list[_Spec] = field(default_factory=list)
    writes: tuple[Any, ...] = ()
    reads: tuple[Any, ...] = ()
    buf: int = 0
    first: bool = False
    last: bool = False
    outer: int = 0


@dataclass(frozen=True)
class LayerAddresses:
    """Where a layer's tensors and constants are: byte addresses, and the DRAM buffer ids of
    the activations (for the hazard bookkeeping; constants are only read and have none)."""

    input: int
    output: int
    residual: int = 0
    weights: int = 0
    table: int = 0
    bias: int = 0
    input_buffer: int = -1
    output_buffer: int = -1
    residual_buffer: int = -1


class _State:
    """Rotating on-chip resources shared by the layers of one program: the accumulator buffer
    and operand copies alternate; requantize entries alternate between the table's two halves
    (one row per half when the table has a single row)."""

    def __init__(self, config: AcceleratorConfig) -> None:
        self.config = config
        self.buffer = 0
        self.copies: dict[str, int] = {"a": 0, "b": 0}
        self.half = 0

    def table_rows(self, count: int) -> int:
        """First row of ``count`` consecutive table rows, in the half not used last time."""
        rows = self.config.requant_table_rows
        half = rows // 2
        if half == 0:
            return 0
        assert count <= half, (count, half)
        start = self.half * half
        self.half ^= 1
        return start


def table_limit(config: AcceleratorConfig) -> int:
    """Most n-tiles whose requantize entries one tile may use (half the table)."""
    return max(1, config.requant_table_rows // 2)


def _beats(starts: np.ndarray, nbytes: int, beat: int) -> int:
    """Bus beats of rows of ``nbytes`` contiguous bytes starting at ``starts``."""
    return int(((starts % beat + nbytes + beat - 1) // beat).sum())


def _load_busy(c: AcceleratorConfig, fields: dict[str, int], elem_bytes: int, beats: int) -> int:
    """The golden model's LOAD estimate (docs/isa.md) for ``c``'s read engine: ``dram_latency +
    beats`` (``beats``: the rows' beat costs), or the serial reader's
    :func:`~systolic.hw.dma_serial.serial_load_cycles` with ``beats`` as the beats read."""
    if c.gather_engine == "serial":
        return serial_load_cycles(fields, elem_bytes, beats, c.dram_latency)
    return c.dram_latency + beats


def _row_cost(first: int, step: int, count: int, nbytes: int, beat: int) -> int:
    """Beats of ``count`` rows of ``nbytes`` bytes at ``first + r * step`` (exact: the pattern of
    alignments repeats with a period of at most ``beat`` rows)."""
    if count <= 0:
        return 0
    return _row_cost_mod(first % beat, step % beat, count, nbytes, beat)


@functools.lru_cache(maxsize=1 << 16)
def _row_cost_mod(first: int, step: int, count: int, nbytes: int, beat: int) -> int:
    period = beat // math.gcd(step or beat, beat)
    sample = min(count, period)
    starts = first + step * np.arange(sample, dtype=np.int64)
    per_period = _beats(starts, nbytes, beat)
    if sample == count:
        return per_period
    full, rest = divmod(count, period)
    return per_period * full + _beats(starts[:rest], nbytes, beat)


class _LayerJobs:
    """Generates the jobs of one layer for one tiling (see the module docstring)."""

    def __init__(self, op: AccelOp, geo: LayerGeometry, config: AcceleratorConfig, tiling: Tiling,
                 addr: LayerAddresses, state: _State, *, light: bool = False) -> None:
        self.op, self.geo, self.c, self.t, self.addr, self.state = op, geo, config, tiling, addr, state
        self.light = light     # for the estimate: a chunk's COMPUTEs as one spec, no fields
        c = config
        self.ws = c.dataflow == "ws"
        self.ntiles = n_tiles(geo, c)
        self.raw = op.out_type == "raw"
        self.esz = c.spad_elem_bytes
        self.oesz = c.acc_bytes if self.raw else c.input_bytes
        self.blocks = blocks(geo, tiling.budget) or []
        nt = 1 if geo.depthwise else tiling.nt
        self.groups = [list(range(g0, min(g0 + nt, len(self.ntiles))))
                       for g0 in range(0, len(self.ntiles), nt)]
        self.half_acc = c.acc_rows // 2
        self.table_all = (not self.raw and len(self.ntiles) <= table_limit(c)
                          and c.requant_table_rows >= 2)
        self.table_base: int | None = None
        self.table_last: tuple[tuple[int, ...], int] | None = None
        # each n-tile's table-row shifts (the serial SFU's time depends on them)
        self.shifts = (pack_table(op, geo, c)[:, :, 2] if c.sfu_engine == "serial" and not self.raw
                       else np.zeros((len(self.ntiles), c.cols), np.int32))
        self.m_max = max((b.pixels for b in self.blocks), default=0)
        self.chunks: list[list[int]] = [[0]]
        if geo.gemm_like:
            if geo.depthwise:
                self.kts = [ktiles(geo, c, tile) for tile in self.ntiles]
                self.krows = max(sum(k.rows for k in kts) for kts in self.kts)
            else:
                self.kts = [ktiles(geo, c, self.ntiles[0])] * len(self.ntiles)
                self.krows = sum(k.rows for k in self.kts[0])
            count = len(self.kts[0])
            self.chunks = [list(range(i, min(i + tiling.kt, count))) for i in range(0, count, tiling.kt)]
            self.a_rows = a_rows_per_ktile(c, self.blocks)
            self.a_base, self.a_size, self.b_base, self.b_size = spad_layout(
                geo, c, tiling, self.a_rows, count)
            self.a_chunk = tiling.kt * self.a_rows

    def shape(self) -> LoopShape:
        outer, inner = len(self.blocks), len(self.groups)
        blocks = sum(b.pixels for b in self.blocks) / max(1, self.blocks[0].pixels) \
            if self.blocks else 0.0
        groups = sum(len(g) for g in self.groups) / len(self.groups[0])
        first = groups
        if self.t.order == "nmk":
            outer, inner, first = inner, outer, blocks
        return LoopShape(outer, inner, len(self.chunks), blocks * groups, first)

    def tiles(self) -> Iterator[tuple[int, int, int]]:
        """(outer index, block index, group index) in loop order."""
        nb, ng = len(self.blocks), len(self.groups)
        if self.t.order == "nmk":
            for g in range(ng):
                for b in range(nb):
                    yield g, b, g
        else:
            for b in range(nb):
                for g in range(ng):
                    yield b, b, g

    def jobs(self) -> Iterator[_Job]:
        if self.geo.gemm_like:
            yield from self._gemm_jobs()
        else:
            yield from self._eltwise_jobs()

    # -- shared pieces ----------------------------------------------------------------------

    def _config(self) -> _Spec:
        op = self.op
        tie_out, avg_tie_out = store_ties(op, (self.geo.acc_h, self.geo.acc_w))
        f = {"zp_out": op.zp_out, "act_lo": op.act_lo, "act_hi": op.act_hi, "tie_out": tie_out,
             "avg_tie_out": avg_tie_out}
        if op.pool is not None and op.pool.mode == "avg":
            f.update(avg_mult=op.pool.avg_mult, avg_shift=op.pool.avg_shift)
        if op.residual is not None:
            # the residual term shares each channel's table shift (the passes give them one)
            f.update(res_zp=op.residual.zero_point, res_mult=op.residual.mult)
        return _Spec("CONFIG", f)

    def _table_load(self, group: list[int]) -> tuple[list[_Spec], dict[int, int]]:
        """LOAD of the requantize entries of the group's n-tiles (all of the layer's at once when
        they fit half the table); returns the loads and the table row of each n-tile."""
        c = self.c
        if self.raw:
            return [], {}
        if self.table_all:
            if self.table_base is None:
                self.table_base = self.state.table_rows(len(self.ntiles))
                tiles = list(range(len(self.ntiles)))
                start = self.table_base
            else:
                return [], {t: self.table_base + t for t in group}
        else:
            key = tuple(group)
            if self.table_last is not None and self.table_last[0] == key:
                return [], {t: self.table_last[1] + i for i, t in enumerate(group)}
            tiles = group
            start = self.state.table_rows(len(tiles))
            self.table_last = (key, start)
        row_bytes = c.cols * c.requant_entry_bytes
        specs = []
        # one LOAD per group of entries a table LOAD may write (config.requant_load_entries)
        for f in table_load_fields(c, dram_addr=self.addr.table + tiles[0] * row_bytes,
                                   dst_addr=start, rows=len(tiles)):
            beats = _row_cost(f["dram_addr"], row_bytes, len(tiles), f["seg_len"] * f["pitch_c"],
                              c.dma_bytes)
            specs.append(_Spec("LOAD", f, busy=_load_busy(c, f, c.requant_entry_bytes, beats),
                               table=((start, len(tiles), True),)))
        return specs, {t: start + (t - tiles[0]) for t in group}

    def _store(self, block: Block, t: int, acc_addr: int, qrow: int) -> _Spec:
        c, geo, op = self.c, self.geo, self.op
        n0, nn = self.ntiles[t]
        oe = self.oesz
        offset = ((block.image * geo.out_h + block.out_y) * geo.out_w + block.out_x) * geo.out_c + n0
        f = {"acc_addr": acc_addr, "n": nn, "in_h": block.acc_rows, "in_w": block.acc_cols,
             "out_h": block.out_rows, "out_w": block.out_cols,
             "dram_addr": self.addr.output + offset * oe, "pitch_y": geo.out_w * geo.out_c * oe,
             "pitch_x": geo.out_c * oe, "pitch_c": oe}
        sfu = block.out_pixels
        if self.raw:
            f["out_type"] = 1
        else:
            f["act"] = _ACT_CODES[op.act]
            f["qrow"] = qrow
            p = op.pool
            if p is not None:
                f.update(pool=1 if p.mode == "max" else 2, pool_h=p.window[0], pool_w=p.window[1],
                         stride_h=p.stride[0], stride_w=p.stride[1], pad_top=block.pad_top,
                         pad_left=block.pad_left)
                sfu *= p.window[0] * p.window[1]
        beats = _row_cost(f["dram_addr"], geo.out_c * oe, block.out_cols, nn * oe,
                          c.dma_bytes) * block.out_rows
        writes = beats
        if c.scatter_engine == "serial":
            writes = serial_store_write_cycles(block.out_pixels * nn * oe, beats)
        if op.residual is not None:
            f["residual"] = 1
            f["res_addr"] = self.addr.residual + offset * oe
            writes += _load_busy(c, residual_read_fields(block.out_rows, block.out_cols, nn), oe,
                                 beats)
        beats = writes
        if c.sfu_engine == "serial":
            # every channel of the row (C, whatever nn) with the shift of the table row it loads;
            # window pixels outside the image are counted as inside
            avg = f.get("pool") == 2
            sfu = serial_sfu_cycles([int(s) for s in self.shifts[t]], raw=self.raw,
                                    residual=op.residual is not None, pixels=sfu, pad_pixels=0,
                                    avg_windows=block.out_pixels if avg else 0,
                                    avg_shift=op.pool.avg_shift if avg else 0)
        table = () if self.raw else ((qrow, 1, False),)
        timing = _timing(c)
        latency = timing.sfu_avg if f.get("pool") == 2 else timing.sfu
        return _Spec("STORE", f, max(sfu, beats) + latency,
                     acc=((acc_addr, block.pixels, False),), table=table,
                     dram=((self.addr.output_buffer, True),))

    def _bounded(self, y_start: int, x_start: int, image: int, ci0: int) -> dict[str, int]:
        """Bounded-image fields of a gather from input coordinate (y_start, x_start) (negative:
        padding), the in-image part of the start moved into the address so that the 16-bit
        coordinate fields suffice for any tensor."""
        geo, esz = self.geo, self.esz
        py, px = geo.in_w * geo.in_c * esz, geo.in_c * esz
        yb = min(max(0, y_start), geo.in_h)
        xb = min(max(0, x_start), geo.in_w)
        base = self.addr.input + image * geo.in_h * geo.in_w * geo.in_c * esz
        return {"dram_addr": base + yb * py + xb * px + ci0 * esz, "pitch_y": py, "pitch_x": px,
                "pitch_c": esz, "bounded": 1, "height": min(geo.in_h - yb, 0xFFFF),
                "width": min(geo.in_w - xb, 0xFFFF), "y0": y_start - yb, "x0": x_start - xb,
                "pad_value": self.op.zp_in}

    # -- conv / gemm ------------------------------------------------------------------------

    def _gemm_jobs(self) -> Iterator[_Job]:
        state, t = self.state, self.t
        resident_a, resident_b = t.resident == "a", t.resident == "b"
        a_copy: dict[int, int] = {}     # block -> A copy (resident A)
        b_copy: dict[int, int] = {}     # group -> B copy (resident B)
        a_loaded: set[tuple[int, int, int]] = set()
        b_loaded: set[tuple[int, int, int]] = set()
        config_done = False
        for outer, bi, gi in self.tiles():
            block, group = self.blocks[bi], self.groups[gi]
            kts = self.kts[group[0]]
            buf = state.buffer
            state.buffer ^= 1
            acc_base = buf * self.half_acc
            m = block.pixels
            qrows: dict[int, int] = {}
            for ci, chunk in enumerate(self.chunks):
                job = _Job(buf=buf, first=ci == 0, last=ci == len(self.chunks) - 1, outer=outer)
                if not config_done:
                    job.stores.append(self._config())
                    config_done = True
                if ci == 0:
                    job.late, qrows = self._table_load(group)
                    if self.raw:
                        job.loads += [self._bias_load(acc_base + k * m, tt, m)
                                      for k, tt in enumerate(group)]
                        job.writes += (("acc", buf),)
                job.reads += (("acc", buf),)
                rows_chunk = sum(kts[k].rows for k in chunk)
                # A operand: one copy per chunk, or per block when resident
                if resident_a:
                    if bi not in a_copy:
                        if len(a_copy) >= 2:        # two copies: forget the oldest block's
                            del a_copy[next(iter(a_copy))]
                        a_copy[bi] = state.copies["a"]
                        state.copies["a"] ^= 1
                    copy = a_copy[bi]
                    a_row = self.a_base + copy * self.a_size + ci * self.a_chunk
                    key = (bi, ci, copy)
                    if key not in a_loaded:
                        a_loaded = {k for k in a_loaded if k[2] != copy or k[0] == bi}
                        a_loaded.add(key)
                        job.loads += self._a_loads(block, kts, chunk, a_row, rows_chunk)
                        job.writes += (("a", copy, ci),)
                    job.reads += (("a", copy, ci),)
                else:
                    copy = state.copies["a"]
                    state.copies["a"] ^= 1
                    a_row = self.a_base + copy * self.a_size
                    job.loads += self._a_loads(block, kts, chunk, a_row, rows_chunk)
                    job.writes += (("a", copy),)
                    job.reads += (("a", copy),)
                # B operand: one copy per chunk, or per group when resident
                if resident_b:
                    if gi not in b_copy:
                        if len(b_copy) >= 2:
                            del b_copy[next(iter(b_copy))]
                        b_copy[gi] = state.copies["b"]
                        state.copies["b"] ^= 1
                    copy = b_copy[gi]
                    b_row = self.b_base + copy * self.b_size + len(group) * kts[chunk[0]].offset
                    key = (gi, ci, copy)
                    if key not in b_loaded:
                        b_loaded = {k for k in b_loaded if k[2] != copy or k[0] == gi}
                        b_loaded.add(key)
                        job.loads.append(self._b_load(group, kts, chunk, b_row))
                        job.writes += (("b", copy, ci),)
                    job.reads += (("b", copy, ci),)
                else:
                    copy = state.copies["b"]
                    state.copies["b"] ^= 1
                    b_row = self.b_base + copy * self.b_size
                    job.loads.append(self._b_load(group, kts, chunk, b_row))
                    job.writes += (("b", copy),)
                    job.reads += (("b", copy),)
                job.computes = self._computes(block, group, kts, chunk, a_row, b_row, rows_chunk,
                                              acc_base, first_chunk=ci == 0)
                if job.last:
                    job.stores += [self._store(block, tt, acc_base + k * m, qrows.get(tt, 0))
                                   for k, tt in enumerate(group)]
                yield job

    def _bias_load(self, acc_row: int, tt: int, m: int) -> _Spec:
        """Broadcast LOAD of a raw op's int32 bias row over the tile's ``m`` accumulator rows."""
        c = self.c
        nn = self.ntiles[tt][1]
        f = {"dst": 1, "dst_addr": acc_row, "dram_addr": self.addr.bias + tt * c.cols * c.acc_bytes,
             "pitch_c": c.acc_bytes, "rows_outer": 1, "rows_inner": m, "segs": 1, "seg_len": nn,
             "elem_dc": 1}
        beats = m * -(-nn * c.acc_bytes // c.dma_bytes)
        return _Spec("LOAD", f, busy=_load_busy(c, f, c.acc_bytes, beats), acc=((acc_row, m, True),))

    def _b_load(self, group: list[int], kts: list[KTile], chunk: list[int], row: int) -> _Spec:
        """One LOAD of the packed weight rows of a chunk for every n-tile of the group."""
        c, esz = self.c, self.esz
        r0 = kts[chunk[0]].offset
        rows = sum(kts[k].rows for k in chunk)
        block_bytes = self.krows * c.cols * esz
        f = {"dst": 0, "dst_addr": row,
             "dram_addr": self.addr.weights + group[0] * block_bytes + r0 * c.cols * esz,
             "pitch_y": c.cols * esz, "pitch_x": block_bytes, "pitch_c": esz,
             "rows_outer": len(group), "outer_dx": 1, "rows_inner": rows, "inner_dy": 1,
             "segs": 1, "seg_len": c.cols, "elem_dc": 1}
        beats = len(group) * _row_cost(f["dram_addr"], c.cols * esz, rows, c.cols * esz, c.dma_bytes)
        return _Spec("LOAD", f, busy=_load_busy(c, f, esz, beats), spad=((row, len(group) * rows, True),))

    def _a_loads(self, block: Block, kts: list[KTile], chunk: list[int], row: int,
                 rows_chunk: int) -> list[_Spec]:
        """The LOADs of a chunk's A operand: WS, the block's pixels as rows, one LOAD per k-tile
        (or per run of full k-tiles of a flat input); OS, A^T rows per piece of at most R
        pixels."""
        c, geo, esz = self.c, self.geo, self.esz
        beat = c.dma_bytes
        sh, sw = geo.stride
        dh, dw = geo.dilation
        pt, pl = geo.pads[0], geo.pads[1]
        m = block.pixels
        src = ((self.addr.input_buffer, False),)
        out = []
        if self.ws and geo.flat and (block.acc_cols == geo.acc_w or block.acc_rows == 1):
            # the im2col rows are plain rows of the input: one LOAD per run of k-tiles of the
            # same width, k-tile o at channel o * R (outer_dc)
            pixel0 = (block.image * geo.acc_h + block.acc_y) * geo.acc_w + block.acc_x
            base = self.addr.input + pixel0 * geo.in_c * esz
            runs: list[list[int]] = []
            for k in chunk:
                if runs and kts[k].nci == kts[runs[-1][0]].nci == c.rows:
                    runs[-1].append(k)
                else:
                    runs.append([k])
            for run in runs:
                first = kts[run[0]]
                dst = row + (run[0] - chunk[0]) * m
                f = {"dst": 0, "dst_addr": dst, "dram_addr": base + first.ci0 * esz,
                     "pitch_y": geo.in_c * esz, "pitch_c": esz, "rows_outer": len(run),
                     "outer_dc": c.rows if len(run) > 1 else 0, "rows_inner": m, "inner_dy": 1,
                     "segs": 1, "seg_len": first.nci, "elem_dc": 1}
                beats = len(run) * _row_cost(f["dram_addr"], geo.in_c * esz, m, first.nci * esz, beat)
                out.append(_Spec("LOAD", f, busy=_load_busy(c, f, esz, beats),
                                 spad=((dst, len(run) * m, True),), dram=src))
            return out
        if self.ws:
            for idx, k in enumerate(chunk):
                kt = kts[k]
                dst = row + idx * m
                f = self._bounded(block.acc_y * sh - pt + kt.i * dh, block.acc_x * sw - pl + kt.j0 * dw,
                                  block.image, kt.ci0)
                f.update(dst=0, dst_addr=dst, rows_outer=block.acc_rows, outer_dy=sh,
                         rows_inner=block.acc_cols, inner_dx=sw, segs=kt.nj, seg_dx=dw,
                         seg_len=kt.nci, elem_dc=1)
                runs_per_row = 1 if dw == 1 else kt.nj
                nbytes = (kt.rows if dw == 1 else kt.nci) * esz
                beats = runs_per_row * block.acc_rows * _row_cost(
                    f["dram_addr"], sw * geo.in_c * esz, block.acc_cols, nbytes, beat)
                out.append(_Spec("LOAD", f, busy=_load_busy(c, f, esz, beats), spad=((dst, m, True),),
                                 dram=src))
            return out
        for p, (y, rows, x, cols, _) in enumerate(_pieces(block, c.rows)):
            off = 0
            for k in chunk:
                kt = kts[k]
                dst = row + p * rows_chunk + off
                off += kt.rows
                f = self._bounded(y * sh - pt + kt.i * dh, x * sw - pl + kt.j0 * dw, block.image,
                                  kt.ci0)
                f.update(dst=0, dst_addr=dst, rows_outer=kt.nj, outer_dx=dw, rows_inner=kt.nci,
                         inner_dc=1)
                if cols == 1:
                    f.update(segs=1, seg_len=rows, elem_dy=sh)
                else:
                    f.update(segs=rows, seg_dy=sh, seg_len=cols, elem_dx=sw)
                out.append(_Spec("LOAD", f, busy=_load_busy(c, f, esz, kt.rows * rows * cols),
                                 spad=((dst, kt.rows, True),), dram=src))
        return out

    def _computes(self, block: Block, group: list[int], kts: list[KTile], chunk: list[int],
                  a_row: int, b_row: int, rows_chunk: int, acc_base: int, first_chunk: bool
                  ) -> list[_Spec]:
        c = self.c
        m = block.pixels
        if self.light:
            if self.ws:
                busy = len(group) * sum(max(m, kts[k].rows) for k in chunk)
                count = len(group) * len(chunk)
            else:
                count = len(group) * len(_pieces(block, c.rows))
                busy = count * max(rows_chunk, c.rows)
            return [_Spec("COMPUTE", {}, busy, count=count)]
        out = []
        if self.ws:
            off = 0
            for idx, k in enumerate(chunk):
                kt = kts[k]
                accumulate = int(self.raw or not (first_chunk and idx == 0))
                a = a_row + idx * m
                for gi, tt in enumerate(group):
                    acc = acc_base + gi * m
                    b = b_row + gi * rows_chunk + off
                    f = {"a_addr": a, "b_addr": b, "acc_addr": acc, "m": m, "k": kt.rows,
                         "n": self.ntiles[tt][1], "accumulate": accumulate, "preload": 1}
                    out.append(_Spec("COMPUTE", f, busy=ws_tile_interval(m, kt.rows),
                                     spad=((a, m, False), (b, kt.rows, False)),
                                     acc=_acc_access(acc, m, accumulate)))
                off += kt.rows
            return out
        accumulate = int(self.raw or not first_chunk)
        for p, (_, rows, _, cols, acc_off) in enumerate(_pieces(block, c.rows)):
            a = a_row + p * rows_chunk
            for gi, tt in enumerate(group):
                acc = acc_base + gi * m + acc_off
                b = b_row + gi * rows_chunk
                f = {"a_addr": a, "b_addr": b, "acc_addr": acc, "m": rows * cols, "k": rows_chunk,
                     "n": self.ntiles[tt][1], "accumulate": accumulate}
                out.append(_Spec("COMPUTE", f, busy=max(rows_chunk, c.rows),
                                 spad=((a, rows_chunk, False), (b, rows_chunk, False)),
                                 acc=_acc_access(acc, rows * cols, accumulate)))
        return out

    # -- pool / act / add -------------------------------------------------------------------

    def _eltwise_jobs(self) -> Iterator[_Job]:
        c, geo, state = self.c, self.geo, self.state
        esz = c.input_bytes
        config_done = False
        for outer, bi, gi in self.tiles():
            block, group = self.blocks[bi], self.groups[gi]
            buf = state.buffer
            state.buffer ^= 1
            acc_base = buf * self.half_acc
            m = block.pixels
            job = _Job(buf=buf, first=True, last=True, outer=outer, writes=(("acc", buf),),
                       reads=(("acc", buf),))
            if not config_done:
                job.stores.append(self._config())
                config_done = True
            job.late, qrows = self._table_load(group)
            base = self.addr.input + ((block.image * geo.in_h + block.acc_y) * geo.in_w
                                      + block.acc_x) * geo.in_c * esz
            for k, tt in enumerate(group):
                n0, nn = self.ntiles[tt]
                dst = acc_base + k * m
                f = {"dst": 1, "widen": 1, "dst_addr": dst, "dram_addr": base + n0 * esz,
                     "pitch_y": geo.in_w * geo.in_c * esz, "pitch_x": geo.in_c * esz, "pitch_c": esz,
                     "rows_outer": block.acc_rows, "outer_dy": 1, "rows_inner": block.acc_cols,
                     "inner_dx": 1, "segs": 1, "seg_len": nn, "elem_dc": 1}
                beats = block.acc_rows * _row_cost(f["dram_addr"], geo.in_c * esz, block.acc_cols,
                                                   nn * esz, c.dma_bytes)
                job.loads.append(_Spec("LOAD", f, busy=_load_busy(c, f, esz, beats), acc=((dst, m, True),),
                                       dram=((self.addr.input_buffer, False),)))
            job.stores += [self._store(block, tt, acc_base + k * m, qrows.get(tt, 0))
                           for k, tt in enumerate(group)]
            yield job


@dataclass(frozen=True)
class _Timing:
    """Constants of the cycle model of docs/isa.md for one configuration, cycles: a COMPUTE's
    last input row (WS) or operand beat (OS) to its last result row readable in the accumulator
    (``drain``), and the SFU's latency (``sfu``; ``sfu_avg`` for an average pooling's last
    window)."""

    drain: int
    sfu: int
    sfu_avg: int


@functools.lru_cache(maxsize=64)
def _timing(config: AcceleratorConfig) -> _Timing:
    from systolic.hw.accumulator import write_latency
    from systolic.hw.array import array_latency
    from systolic.hw.sfu import sfu_latency

    drain = array_latency(config) + write_latency(config) - 1
    if config.dataflow == "os":
        drain += config.rows - 1           # the tile's R result rows drain one per cycle
    return _Timing(drain, sfu_latency(config), sfu_latency(config, avg=True))


def _acc_access(row: int, count: int, accumulate: int) -> tuple[tuple[int, int, bool], ...]:
    """A COMPUTE writes its accumulator rows (and reads them first when it accumulates: a read
    needs no ordering the write of the same rows does not already need)."""
    del accumulate
    return ((row, count, True),)


def a_rows_per_ktile(c: AcceleratorConfig, bl: Sequence[Block]) -> int:
    """Scratchpad rows of the A operand of one k-tile for the largest of ``bl``: WS, a row per
    pixel; OS, R rows (reduction indices) for each piece of at most R pixels."""
    if c.dataflow == "ws":
        return max((b.pixels for b in bl), default=0)
    return max((len(_pieces(b, c.rows)) for b in bl), default=0) * c.rows


def spad_layout(geo: LayerGeometry, config: AcceleratorConfig, tiling: Tiling, a_rows: int,
                kts_count: int) -> tuple[int, int, int, int]:
    """Scratchpad areas of a conv/gemm tiling: (A base row, rows per A copy, B base row, rows per
    B copy). Each area holds two copies; a resident operand's copy holds all its chunks.

    The B area starts at the first bank boundary after the A area when it still fits: a bank
    serves one read per cycle, and the array reads an A row and a B row in the same cycle (WS:
    the next preload's weights while the inputs stream; OS: every operand beat), so A and B in
    one bank would halve the rate (hw/scratchpad.py). Otherwise it follows the A area."""
    c = config
    nt = 1 if geo.depthwise else tiling.nt
    chunks = -(-kts_count // tiling.kt)
    a_chunk = tiling.kt * a_rows
    b_chunk = nt * tiling.kt * c.rows
    a_size = a_chunk * chunks if tiling.resident == "a" else a_chunk
    b_size = b_chunk * chunks if tiling.resident == "b" else b_chunk
    b_base = -(-2 * a_size // c.spad_bank_rows) * c.spad_bank_rows
    if b_base + 2 * b_size > c.spad_rows:
        b_base = 2 * a_size
    return 0, a_size, b_base, b_size


def spad_rows_needed(geo: LayerGeometry, config: AcceleratorConfig, tiling: Tiling, a_rows: int,
                     kts_count: int) -> int:
    """Scratchpad rows a conv/gemm tiling uses (``a_rows``: A rows per k-tile)."""
    _, _, b_base, b_size = spad_layout(geo, config, tiling, a_rows, kts_count)
    return b_base + 2 * b_size


# -- candidates, estimate and choice -----------------------------------------------------------


def _powers(limit: int) -> list[int]:
    """1, 2, 4, ... below ``limit``, and ``limit``."""
    out, v = [], 1
    while v < limit:
        out.append(v)
        v *= 2
    out.append(limit)
    return out


def candidate_tilings(op: AccelOp, geo: LayerGeometry, config: AcceleratorConfig) -> list[Tiling]:
    """Every tiling of the layer that fits the accumulator, the scratchpad and the requantize
    table. Raises :class:`TilingError` naming the sizes when none does."""
    c = config
    half_acc = c.acc_rows // 2
    tiles = n_tiles(geo, c)
    max_nt = 1 if geo.depthwise else min(len(tiles), table_limit(c))
    out: list[Tiling] = []
    smallest: int | None = None
    for nt in _powers(max_nt):
        budget = half_acc // nt
        if budget < 1:
            continue
        bl = blocks(geo, budget)
        if bl is None:
            continue
        a_rows = a_rows_per_ktile(c, bl)
        if not geo.gemm_like:
            if nt == 1 or nt + 1 <= c.load_queue_depth:     # one LOAD per n-tile (see below)
                out.append(Tiling(budget, nt, 1))
            continue
        count = len(ktiles(geo, c, tiles[0]))
        need = spad_rows_needed(geo, c, Tiling(budget, nt, 1), a_rows, count)
        smallest = need if smallest is None else min(smallest, need)
        pieces = max(len(_pieces(b, c.rows)) for b in bl) if c.dataflow == "os" else 1
        for kt in _powers(count)[:6]:
            # a chunk's loads are dispatched before the previous chunk's COMPUTEs: more than the
            # load queue holds would keep those COMPUTEs from being dispatched until the chunk
            # before them has been computed
            loads = 2 if c.dataflow == "ws" and geo.flat else kt * pieces
            if kt > 1 and loads + 1 > c.load_queue_depth:
                continue
            for order, resident in (("mnk", "none"), ("mnk", "a"), ("nmk", "none"), ("nmk", "b")):
                if resident == "a" and (len(tiles) <= nt or count <= kt or geo.depthwise):
                    continue          # nothing to reuse across groups (depthwise: each n-tile
                                      # reads other input channels), or nothing to keep
                if resident == "b" and (len(bl) <= 1 or count <= kt):
                    continue
                if order == "nmk" and resident == "none" and (len(bl) <= 1 or len(tiles) <= nt):
                    continue          # the same as mnk
                t = Tiling(budget, nt, kt, order, resident)
                if spad_rows_needed(geo, c, t, a_rows, count) <= c.spad_rows:
                    out.append(t)
    if not out:
        raise TilingError(f"{op.label}: {_describe_need(geo, c, smallest)}")
    return out


def _describe_need(geo: LayerGeometry, c: AcceleratorConfig, smallest: int | None) -> str:
    half_acc = c.acc_rows // 2
    if smallest is None:
        h = max(_axis(y, 1, geo.pool, 0, geo.acc_h)[1] for y in range(geo.out_h))
        w = max(_axis(x, 1, geo.pool, 1, geo.acc_w)[1] for x in range(geo.out_w))
        return (f"one output pixel needs an accumulator image of {h}x{w} = {h * w} rows, but an "
                f"accumulator buffer holds {half_acc} rows "
                f"(accumulator_bytes={c.accumulator_bytes}: {c.acc_rows} rows of "
                f"{c.acc_row_bytes} bytes in two buffers)")
    return (f"the smallest tile needs {smallest} scratchpad rows (two copies of the A and B "
            f"operands), but the scratchpad has {c.spad_rows} rows "
            f"(scratchpad_bytes={c.scratchpad_bytes}: rows of {c.spad_row_bytes} bytes)")


@dataclass(frozen=True)
class LoopShape:
    """Trip counts of a layer's loops: outer iterations, tiles per outer iteration, chunks (jobs)
    per tile; and the work of the layer and of its first outer iteration in units of the first
    tile (the last block and group may be smaller)."""

    outer: int
    tiles: int
    chunks: int
    work: float = 0.0
    outer_work: float = 0.0

    @property
    def jobs(self) -> int:
        return self.outer * self.tiles * self.chunks


def estimate_cycles(jobs: Iterator[_Job], config: AcceleratorConfig, shape: LoopShape | None = None,
                    *, budget: int = 160, instructions: list[int] | None = None) -> int:
    """Cycle estimate of a layer from its jobs: a job-level copy of the cycle model of
    docs/isa.md -- each queue busy for the sum of its instructions' busy cycles (COMPUTEs: their
    input rows or operand beats on the array, max(m, k + 1) or max(k, R) apart), a chunk's loads
    waiting for the operand copies they overwrite to be released by the COMPUTEs that read them
    (after the array's latency and the accumulator write), a tile's first COMPUTE waiting for its
    accumulator buffer to be stored, STOREs with the SFU's latency, and instruction dispatch
    (fetch cycles, the compute queue's depth).

    With the loop ``shape``, at most ``budget`` jobs are simulated and the rest extrapolated level
    by level, each level's first iteration apart (it loads what the others reuse): per outer
    iteration when two completed; else the first outer iteration from its first tile and the
    later tiles' pace (from one complete outer iteration: that times the outer iterations);
    else a tile from its first chunk and the later chunks' pace.
    ``instructions``, if given, receives the number of instructions (extrapolated per job)."""
    c = config
    fetch = INSTR_BYTES // c.dma_bytes
    fill = _timing(c).drain + 1
    depth = c.compute_queue_depth
    t_load = t_comp = t_store = t_disp = comp_end = 0
    free: dict[Any, int] = {}     # operand copy or accumulator buffer -> free from
    ready: dict[Any, int] = {}    # operand copy or accumulator buffer -> filled at
    outer_ends: list[int] = []
    tile_ends: list[int] = []     # ends of the tiles of the first outer iteration
    chunk_ends: list[int] = []    # ends of the chunks of the first tile
    outer_seen = None
    instr_total = 0
    # start, instructions and busy cycles of the COMPUTEs of the two jobs before this one: the
    # loads of a job follow the COMPUTEs of the job before the previous one in program order
    comps = [(0, 0, 0), (0, 0, 0)]
    done = 0
    for job in jobs:
        if job.outer != outer_seen:
            if outer_seen is not None:
                outer_ends.append(max(t_store, comp_end, t_load))
            outer_seen = job.outer
        if shape is not None and done >= budget:
            break
        done += 1
        start, count, busy = comps[0]
        disp = t_disp
        if count > depth:      # the dispatcher waits for room in the compute queue
            disp = max(disp, start + (count - depth) * busy // count)
        n_instr = sum(s.count for s in job.loads + job.late + job.computes + job.stores)
        instr_total += n_instr
        t_disp = disp + fetch * n_instr
        loads = job.loads + job.late
        if loads:
            start = max(t_load, disp, *(free.get(w, 0) for w in job.writes))
            t_load = start + sum(s.busy for s in loads)
            for w in job.writes:
                ready[w] = t_load
        data = max((ready.get(r, 0) for r in job.reads), default=0)
        if job.computes:
            start = max(t_comp, data)
            if job.first:
                start = max(start, free.get(("acc", job.buf), 0))
            busy = sum(s.busy for s in job.computes)
            comps = [comps[1], (start, sum(s.count for s in job.computes), busy)]
            t_comp = start + busy
            comp_end = t_comp + fill
            for r in job.reads:
                free[r] = comp_end
            data = comp_end
        else:
            data += 2       # a SYNC on the compute queue passes the load's token to the store
        if job.stores:
            t_store = max(t_store, data if job.last else 0) + sum(s.busy for s in job.stores)
            if job.last:
                free[("acc", job.buf)] = t_store
        now = max(t_store, comp_end, t_load)
        if not outer_ends:
            if job.last:
                tile_ends.append(now)
            if not tile_ends:
                chunk_ends.append(now)
    total = max(t_store, comp_end, t_load)
    if shape is not None and done >= budget:
        # the last block and group of a layer may be partial: extrapolate from the first ones
        if len(outer_ends) >= 2:
            per_outer = outer_ends[-1] - outer_ends[-2]
            rest = max(0.0, shape.work / shape.outer_work - len(outer_ends))
            total = outer_ends[-1] + rest * per_outer
        elif outer_ends:
            total = outer_ends[0] * shape.work / shape.outer_work
        elif len(tile_ends) >= 2:
            pace = (tile_ends[-1] - tile_ends[0]) / (len(tile_ends) - 1)
            total = tile_ends[0] + (shape.work - 1) * pace
        elif len(chunk_ends) >= 2:
            pace = (chunk_ends[-1] - chunk_ends[0]) / (len(chunk_ends) - 1)
            total = shape.work * (chunk_ends[0] + (shape.chunks - 1) * pace)
    if instructions is not None:
        scale = shape.jobs / done if shape is not None and done else 1.0
        instructions.append(int(instr_total * max(1.0, scale)))
    return int(total) + fetch + 1


def layer_jobs(op: AccelOp, geo: LayerGeometry, config: AcceleratorConfig, tiling: Tiling,
               addr: LayerAddresses, *, light: bool = True) -> tuple[Iterator[_Job], LoopShape]:
    """The jobs of one layer on its own (fresh on-chip state) and its loop shape: the input of
    :func:`estimate_cycles`."""
    jobs = _LayerJobs(op, geo, config, tiling, addr, _State(config), light=light)
    return jobs.jobs(), jobs.shape()


def choose_tiling(op: AccelOp, geo: LayerGeometry, config: AcceleratorConfig, addr: LayerAddresses,
                  *, candidates: Sequence[Tiling] | None = None) -> Tiling:
    """The candidate tiling with the smallest :func:`estimate_cycles` (within :data:`TIE`, the
    one with the fewest instructions); its ``estimate`` is set. Layers of the same shape, kind
    and address alignment share the search (ResNets repeat their blocks)."""
    key = None
    if candidates is None:
        beat = config.dma_bytes
        key = (geo, op.kind, op.out_type, op.residual is not None, config,
               tuple(getattr(addr, f) % beat for f in ("input", "output", "residual", "weights")))
        if key in _CHOICES:
            return _CHOICES[key]
    choice = _choose(op, geo, config, addr, candidates)
    if key is not None:
        if len(_CHOICES) > 4096:
            _CHOICES.clear()
        _CHOICES[key] = choice
    return choice


_CHOICES: dict[Any, Tiling] = {}


#: Candidates within this fraction of the fastest estimate count as equally fast; of those the
#: one with the fewest instructions wins (a smaller program, a faster compile).
TIE = 0.01


def _choose(op: AccelOp, geo: LayerGeometry, config: AcceleratorConfig, addr: LayerAddresses,
            candidates: Sequence[Tiling] | None) -> Tiling:
    scored = []
    for t in candidates if candidates is not None else candidate_tilings(op, geo, config):
        jobs, shape = layer_jobs(op, geo, config, t, addr)
        instructions: list[int] = []
        est = estimate_cycles(jobs, config, shape, instructions=instructions)
        scored.append((est, instructions[0], t))
    fastest = min(est for est, _, _ in scored)
    est, _, t = min((s for s in scored if s[0] <= fastest * (1 + TIE)), key=lambda s: (s[1], s[0]))
    return Tiling(t.budget, t.nt, t.kt, t.order, t.resident, est)


# -- synchronization ----------------------------------------------------------------------------


class _Rows:
    """The access record of one on-chip memory, piecewise constant over its rows: segment ``i``
    covers rows ``starts[i] .. starts[i+1]-1`` and holds (writer queue, writer sequence number,
    last reader of queue 0, 1, 2). A write clears the reads: a later access ordered after the
    write is ordered after them too (the writer was)."""

    def __init__(self, rows: int) -> None:
        self.starts = [0, rows]
        self.state: list[tuple[int, int, int, int, int]] = [(-1, 0, 0, 0, 0)]

    def need(self, start: int, count: int, write: bool, q: int, need: list[int]) -> None:
        starts, state = self.starts, self.state
        i = bisect.bisect_right(starts, start) - 1
        end = start + count
        while starts[i] < end:
            wq, ws, *reads = state[i]
            if wq >= 0 and wq != q and ws > need[wq]:
                need[wq] = ws
            if write:
                for p in range(3):
                    if p != q and reads[p] > need[p]:
                        need[p] = reads[p]
            i += 1

    def _split(self, x: int) -> int:
        i = bisect.bisect_right(self.starts, x) - 1
        if self.starts[i] != x:
            i += 1
            self.starts.insert(i, x)
            self.state.insert(i, self.state[i - 1])
        return i

    def update(self, start: int, count: int, write: bool, q: int, seq: int) -> None:
        i = self._split(start)
        j = self._split(start + count)
        state = self.state
        if write:
            del self.starts[i + 1:j]
            del state[i + 1:j]
            state[i] = (q, seq, 0, 0, 0)
            j = i + 1
        else:
            for k in range(i, j):
                st = list(state[k])
                st[2 + q] = seq
                state[k] = tuple(st)
        # merge equal neighbours around the updated range
        k = max(1, i)
        while k < len(state) and k <= j:
            if state[k] == state[k - 1]:
                del self.starts[k]
                del state[k]
                j -= 1
            else:
                k += 1


class ProgramBuilder:
    """Builds one program: instructions in program order, each given the dependency tokens that
    order it after every earlier conflicting access from another queue (see the module
    docstring).

    Sequence numbers count each queue's instructions from 1, as the golden model does; the
    knowledge of a queue is a vector clock (the last instruction of each queue known to have
    completed), a token carries its pusher's clock. ``overlaps`` maps a DRAM buffer id to the
    ids of the buffers sharing bytes with it (itself included)."""

    def __init__(self, config: AcceleratorConfig, overlaps: Mapping[int, Sequence[int]] | None = None
                 ) -> None:
        self.config = config
        self.overlaps = overlaps or {}
        self.ops: list[list[Any]] = []     # [opcode, fields, queue, layer, flags]
        self.seq = [0, 0, 0]
        self.vc = [[0, 0, 0], [0, 0, 0], [0, 0, 0]]
        self.snap: list[list[list[int]]] = [[[], [], []] for _ in range(3)]
        self.by_seq: list[list[int]] = [[], [], []]
        self.last_push = {(0, 1): 0, (1, 0): 0, (1, 2): 0, (2, 1): 0}
        self.pops: dict[tuple[int, int], list[list[Any]]] = {ch: [] for ch in self.last_push}
        self.index_of: dict[int, int] = {}
        self.mem = {"spad": _Rows(config.spad_rows), "acc": _Rows(config.acc_rows),
                    "table": _Rows(config.requant_table_rows)}
        self.dram_written: dict[int, int] = {}   # buffer -> last store-queue writer
        self.dram_read: dict[int, int] = {}      # buffer -> last load-queue reader
        self.syncs = 0

    def __len__(self) -> int:
        return len(self.ops)

    def emit(self, spec: _Spec, layer: int) -> None:
        """Append one instruction, with the tokens its accesses need (SYNCs inserted before it
        when a token has to pass the compute queue)."""
        q = QUEUE_OF_OP[spec.op]
        need = [0, 0, 0]
        mem = self.mem
        accesses = [(mem["spad"], a) for a in spec.spad] + [(mem["acc"], a) for a in spec.acc] \
            + [(mem["table"], a) for a in spec.table]
        for rows, (start, count, write) in accesses:
            rows.need(start, count, write, q, need)
        for buffer, write in spec.dram:
            if buffer < 0:
                continue
            for other in self.overlaps.get(buffer, (buffer,)):
                if write:
                    need[0] = max(need[0], self.dram_read.get(other, 0))
                else:
                    need[2] = max(need[2], self.dram_written.get(other, 0))
        record = [spec.op, spec.fields, q, layer, {}]
        self._sync(q, need, record, layer)
        self._append(record)
        seq = self.seq[q]
        for rows, (start, count, write) in accesses:
            rows.update(start, count, write, q, seq)
        for buffer, write in spec.dram:
            if buffer >= 0:
                (self.dram_written if write else self.dram_read)[buffer] = seq

    def _append(self, record: list[Any]) -> None:
        q = record[2]
        self.seq[q] += 1
        vc = self.vc[q]
        vc[q] = self.seq[q]
        for p in range(3):
            self.snap[q][p].append(vc[p])
        self.by_seq[q].append(len(self.ops))
        self.index_of[id(record)] = len(self.ops)
        self.ops.append(record)

    def _pair(self, p: int, seq: int, q: int, consumer: list[Any], layer: int) -> None:
        """A token from queue ``p``'s instruction ``seq`` (or a later one) to ``consumer`` (queue
        ``q``). Tokens of a channel are taken in the order they are given, so producers increase.

        No deadlock: the k-th push of a channel comes after the (k - token_depth)-th pop in
        program order (a push waits while the channel is full, so an earlier producer could wait
        for a consumer that waits for it). Every instruction then waits only for instructions
        before it in program order, and the first waiting one can always proceed. An earlier
        producer is replaced by a later instruction of its queue (in-order completion: it knows
        as much), or a SYNC on that queue."""
        channel = (p, q)
        pops = self.pops[channel]
        depth = self.config.token_depth
        if len(pops) >= depth:
            bound = self.index_of[id(pops[len(pops) - depth])]
            indices = self.by_seq[p]
            if indices[seq - 1] < bound:
                later = bisect.bisect_right(indices, bound)
                if later < len(indices):
                    seq = max(seq, later + 1)
                else:
                    sync = ["SYNC", {"queue": p}, p, layer, {}]
                    self._append(sync)
                    self.syncs += 1
                    seq = self.seq[p]
        producer = self.ops[self.by_seq[p][seq - 1]]
        push = "push_next" if q > p else "push_prev"
        pop = "pop_prev" if p < q else "pop_next"
        assert seq > self.last_push[channel], (channel, seq, self.last_push[channel])
        assert not producer[4].get(push) and not consumer[4].get(pop)
        producer[4][push] = 1
        consumer[4][pop] = 1
        self.last_push[channel] = seq
        pops.append(consumer)
        vc = self.vc[q]
        for r in range(3):
            vc[r] = max(vc[r], self.snap[p][r][seq - 1])

    def _sync(self, q: int, need: list[int], record: list[Any], layer: int) -> None:
        vc = self.vc[q]
        if q == 1:
            for p in (0, 2):
                if need[p] > vc[p]:
                    self._pair(p, need[p], 1, record, layer)
            return
        far = 2 - q
        near = need[1] if need[1] > vc[1] else 0
        far_need = need[far] if need[far] > vc[far] else 0
        if not near and not far_need:
            return
        x = near
        if far_need:
            known = self.snap[1][far]         # monotone: what each COMPUTE knows of queue far
            k = bisect.bisect_left(known, far_need)
            if k == len(known):              # no compute-queue instruction knows it: a SYNC
                sync = ["SYNC", {"queue": 1}, 1, layer, {}]
                self._pair(far, far_need, 1, sync, layer)
                self._append(sync)
                self.syncs += 1
                k = len(known) - 1
            x = max(x, k + 1)
        self._pair(1, x, q, record, layer)

    def finish(self) -> tuple[list[Instruction], list[int]]:
        """The instructions (FINISH appended) and the layer index of each (-1 for FINISH)."""
        instrs = [Instruction(op, **fields, **flags) for op, fields, _, _, flags in self.ops]
        layers = [rec[3] for rec in self.ops]
        instrs.append(Instruction("FINISH"))
        layers.append(-1)
        return instrs, layers


# -- segment lowering ---------------------------------------------------------------------------


@dataclass
class LayerCode:
    """What the lowering did with one layer (for the plan and the reports)."""

    name: str
    kind: str
    tiling: Tiling
    blocks: int
    groups: int
    chunks: int
    macs: int
    first_instruction: int = 0
    last_instruction: int = 0
    addresses: dict[str, int] = field(default_factory=dict)
    scratchpad_rows: int = 0
    accumulator_rows: int = 0


class SegmentLowering:
    """Lowers the accelerator ops of one program into one :class:`ProgramBuilder`, layer after
    layer. Within a layer the loads of each chunk are emitted before the computes of the chunk
    before it; a new layer starts after the previous one's last instructions (its operand areas
    may differ, and program order is what the synchronization follows)."""

    def __init__(self, graph: Graph, config: AcceleratorConfig,
                 overlaps: Mapping[int, Sequence[int]] | None = None) -> None:
        self.graph = graph
        self.config = config
        self.builder = ProgramBuilder(config, overlaps)
        self.state = _State(config)
        self.layers: list[LayerCode] = []
        self._pending: _Job | None = None
        self._pending_layer = -1

    def add(self, op: AccelOp, addr: LayerAddresses, tiling: Tiling | None = None) -> LayerCode:
        """Lower ``op`` with ``tiling`` (the best of :func:`choose_tiling` when None)."""
        geo = geometry(op, self.graph)
        check_fields(op, geo, self.config)
        if tiling is None:
            tiling = choose_tiling(op, geo, self.config, addr)
        self._flush()
        jobs = _LayerJobs(op, geo, self.config, tiling, addr, self.state)
        index = len(self.layers)
        code = LayerCode(op.name, op.kind, tiling, len(jobs.blocks), len(jobs.groups),
                         len(jobs.chunks), layer_macs(op, self.graph))
        code.addresses = {"input": addr.input, "output": addr.output}
        if op.residual is not None:
            code.addresses["residual"] = addr.residual
        if geo.gemm_like:
            code.addresses["weights"] = addr.weights
            code.scratchpad_rows = spad_rows_needed(geo, self.config, tiling, jobs.a_rows,
                                                    len(jobs.kts[0]))
        code.addresses["bias" if op.out_type == "raw" else "table"] = \
            addr.bias if op.out_type == "raw" else addr.table
        code.accumulator_rows = 2 * min(jobs.half_acc, jobs.m_max * max(map(len, jobs.groups)))
        code.first_instruction = len(self.builder)
        self.layers.append(code)
        for job in jobs.jobs():
            for spec in job.loads:
                self.builder.emit(spec, index)
            self._flush()
            for spec in job.late:
                self.builder.emit(spec, index)
            self._pending, self._pending_layer = job, index
        return code

    def _flush(self) -> None:
        job, layer = self._pending, self._pending_layer
        if job is None:
            return
        for spec in job.computes:
            self.builder.emit(spec, layer)
        for spec in job.stores:
            self.builder.emit(spec, layer)
        self._pending = None
        self.layers[layer].last_instruction = len(self.builder) - 1

    def finish(self) -> tuple[list[Instruction], list[int]]:
        """Flush the last job; the instructions (FINISH last) and the layer of each."""
        self._flush()
        return self.builder.finish()


def check_fields(op: AccelOp, geo: LayerGeometry, c: AcceleratorConfig) -> None:
    """Limits of the instruction fields that no tiling can change; raises :class:`TilingError`."""
    def fail(what: str) -> None:
        raise TilingError(f"{op.label}: {what}")

    if geo.kind == "conv":
        for label, value in (("stride", max(geo.stride)), ("dilation", max(geo.dilation))):
            if value > _S8:
                fail(f"{label} {value} exceeds the LOAD's 8-bit coordinate step (at most {_S8})")
    if geo.pool is not None:
        p = geo.pool
        if max(p.window) > _U8 or max(p.stride) > _U8 or max(p.pads[:2]) > _U8:
            fail(f"pooling window {p.window} / stride {p.stride} exceed the STORE's 8-bit fields "
                 f"(at most {_U8})")
    out_bytes = c.acc_bytes if op.out_type == "raw" else c.input_bytes
    row = max(geo.out_w * geo.out_c * out_bytes, geo.in_w * geo.in_c * c.spad_elem_bytes,
              geo.out_c * out_bytes * max(1, geo.out_w))
    limit = (1 << 24) - 1
    if row > limit:
        fail(f"an image row of {row} bytes exceeds the 24-bit pitch fields (at most {limit} bytes)")
