"""Reusable example programs: complete, token-synchronized, double-buffered ISA v2 programs with
their DRAM image and the numpy result they must produce.

They show how a compiler uses the ISA (tiling over M, K and N with partial tiles, weight reuse in
the weight-stationary dataflow, transposing loads in the output-stationary one, im2col gathers
straight from an activation tensor, pooling and residual adds in the store path) and they drive
the golden model's tests here and the RTL's later. Every builder works for any valid
:class:`AcceleratorConfig` and both dataflows.

Token protocol (the same in every builder):

* Scratchpad *slots* 0 and 1 (the two halves of the scratchpad) alternate per COMPUTE step. The
  LOADs of step j write slot j % 2; the last one pushes a token to compute, the COMPUTE pops it.
  The COMPUTE pushes a token back to load when step j + 2 will reuse its slot, and the first LOAD
  of step j + 2 pops it.
* Accumulator *buffers* 0 and 1 (the two halves of the accumulator) alternate per output tile.
  The last COMPUTE of tile t pushes a token to store, the first STORE of the tile pops it; the last
  STORE pushes a token back when tile t + 2 will reuse the buffer, and the first COMPUTE of tile
  t + 2 pops it.
* Requantize table entries are loaded first; they reach the STOREs through the chain
  load -> compute -> store of the first tile.

Units: DRAM addresses and sizes in bytes, on-chip addresses in rows, sizes of tensors in elements.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import sqrt

import numpy as np
from systolic.hw.config import AcceleratorConfig
from systolic.hw.isa import Activation, Instruction, Program
from systolic.hw.requant_table import table_load_fields
from systolic.sim.arith import (
    avg_pool_finish,
    choose_multiplier,
    sfu_pointwise,
    wrap,
)

__all__ = ["Case", "gemm_case", "conv_case", "pool_case", "residual_case", "conv_reference",
           "tile_load", "ACTIVATION_NAMES"]

#: Activation names accepted by the builders, as in the assembly language.
ACTIVATION_NAMES = tuple(a.name.lower() for a in Activation)

_ALIGN = 64


@dataclass
class Case:
    """A program with its DRAM image and the results it must write.

    ``expected`` maps a name to (byte address, array): after a run, the DRAM bytes at the address
    must hold the array in its dtype (little-endian, C order). The instruction words are also in
    the image, at ``program_addr``, for an accelerator that fetches them from DRAM."""

    name: str
    config: AcceleratorConfig
    program: Program
    dram: np.ndarray
    expected: dict[str, tuple[int, np.ndarray]]
    program_addr: int = 0
    macs: int = 0
    regions: dict[str, tuple[int, int]] = field(default_factory=dict)   #: name -> (addr, bytes)

    def check(self, result_dram: np.ndarray) -> None:
        """Raise AssertionError naming the first mismatching element of each expected tensor."""
        for name, (addr, want) in self.expected.items():
            raw = np.asarray(result_dram[addr:addr + want.nbytes], np.uint8)
            if raw.size != want.nbytes:
                raise AssertionError(f"{self.name}: {name} at {addr:#x} needs {want.nbytes} bytes "
                                     f"but the DRAM image ends at {len(result_dram):#x}")
            got = np.frombuffer(raw.tobytes(), dtype=want.dtype).reshape(want.shape)
            differ = np.argwhere(got != want)
            if differ.size:
                index = tuple(int(i) for i in differ[0])
                raise AssertionError(
                    f"{self.name}: {name}{list(index)} is {got[index]}, expected {want[index]} "
                    f"({len(differ)} of {want.size} elements differ)")


# --------------------------------------------------------------------------------------------
# small helpers


def tile_load(dst: str, dst_addr: int, dram_addr: int, rows: int, elems: int, *, row_bytes: int,
              elem_bytes: int, dst_col: int = 0, **fields: int) -> Instruction:
    """A LOAD of a plain row-major tile: ``rows`` destination rows of ``elems`` elements, row r
    from byte ``dram_addr + r * row_bytes``, consecutive elements ``elem_bytes`` apart.
    ``fields`` adds other LOAD fields (token flags, ``widen``)."""
    return Instruction("LOAD", dst=dst, dst_addr=dst_addr, dst_col=dst_col, dram_addr=dram_addr,
                       pitch_y=row_bytes, pitch_c=elem_bytes, rows_outer=1, rows_inner=rows,
                       inner_dy=1, segs=1, seg_len=elems, elem_dc=1, **fields)


def _dtype(bits: int, signed: bool) -> np.dtype:
    return np.dtype(f"<{'i' if signed else 'u'}{bits // 8}")


class _Image:
    """A DRAM image built region by region, each aligned to 64 bytes."""

    def __init__(self) -> None:
        self.regions: dict[str, tuple[int, bytes]] = {}
        self.top = 0

    def add(self, name: str, data: bytes | np.ndarray) -> int:
        blob = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
        addr = self.top
        self.regions[name] = (addr, blob)
        self.top = addr + max(len(blob), 1)
        self.top = -(-self.top // _ALIGN) * _ALIGN
        return addr

    def reserve(self, name: str, nbytes: int) -> int:
        return self.add(name, bytes(nbytes))

    def build(self) -> np.ndarray:
        size = max(4096, -(-self.top // 4096) * 4096)
        dram = np.zeros(size, np.uint8)
        for addr, blob in self.regions.values():
            dram[addr:addr + len(blob)] = np.frombuffer(blob, np.uint8)
        return dram


def _check_act(act: str, config: AcceleratorConfig) -> int:
    if act not in ACTIVATION_NAMES:
        raise ValueError(f"act must be one of {', '.join(ACTIVATION_NAMES)}, not {act!r}")
    if act != "none" and act not in config.sfu_activations:
        raise ValueError(f"act {act!r} is not among this config's sfu_activations "
                         f"({', '.join(config.sfu_activations) or 'none'})")
    return Activation[act.upper()].value


def _positive(**values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            raise ValueError(f"{name} must be a positive integer, not {value!r}")


@dataclass
class _Sfu:
    """Per-channel requantize entries and the CONFIG registers of one case."""

    bias: np.ndarray
    mult: np.ndarray
    shift: np.ndarray
    zp_out: int
    act: int
    act_lo: int
    act_hi: int
    res_zp: int = 0
    res_mult: int = 0
    avg_mult: int = 0
    avg_shift: int = 0
    tie_out: int = 0
    avg_tie_out: int = 0

    def config_instruction(self) -> Instruction:
        return Instruction("CONFIG", zp_out=self.zp_out, act_lo=self.act_lo, act_hi=self.act_hi,
                           avg_mult=self.avg_mult, avg_shift=self.avg_shift, res_zp=self.res_zp,
                           res_mult=self.res_mult, tie_out=self.tie_out, avg_tie_out=self.avg_tie_out)

    def table_bytes(self, channels: int) -> np.ndarray:
        """12-byte entries (bias, mult, shift as int32) for ``channels`` channels, zero-padded."""
        entries = np.zeros((channels, 3), "<i4")
        n = self.bias.size
        entries[:n, 0], entries[:n, 1], entries[:n, 2] = self.bias, self.mult, self.shift
        return entries

    def pointwise(self, acc: np.ndarray, config: AcceleratorConfig, *, act: int | None = None,
                  residual: np.ndarray | None = None) -> np.ndarray:
        return sfu_pointwise(acc, self.bias, self.mult, self.shift, zp_out=self.zp_out,
                             act=self.act if act is None else act, act_lo=self.act_lo,
                             act_hi=self.act_hi, acc_range=config.acc_range,
                             out_range=config.output_range, residual=residual, res_zp=self.res_zp,
                             res_mult=self.res_mult, tie_out=self.tie_out)


def _make_sfu(rng: np.random.Generator, config: AcceleratorConfig, channels: int, terms: int, *,
              act: int, per_channel: bool, extremes: bool) -> _Sfu:
    """Requantize entries scaled so that a sum of ``terms`` products spreads over the output
    range; with ``extremes``, entries drawn from the edges (largest multipliers, shifts 0 and 62,
    biases at the accumulator limits)."""
    out_lo, out_hi = config.output_range
    acc_lo, acc_hi = config.acc_range
    s16 = (-(1 << 15), (1 << 15) - 1)
    if extremes:
        pick = rng.integers(0, 1 << 16, size=(3, channels))
        mult = np.array([(1 << 31) - 1, -(1 << 31), 1, 0, 1 << 30])[pick[0] % 5]
        shift = np.array([0, 62, 31, 1, 17])[pick[1] % 5]
        bias = np.array([acc_lo, acc_hi, 0, -1])[pick[2] % 4]
    else:
        in_lo, in_hi = config.input_range
        w_lo, w_hi = config.weight_range
        sigma = (in_hi - in_lo) * (w_hi - w_lo) / 12 * sqrt(terms)
        base = (out_hi - out_lo) / 8 / sigma
        factors = rng.uniform(0.5, 2.0, channels) if per_channel else np.full(channels, rng.uniform(0.5, 2))
        pairs = [choose_multiplier(float(base * f)) for f in factors]
        mult = np.array([p[0] for p in pairs], np.int64)
        shift = np.array([p[1] for p in pairs], np.int64)
        span = int(min(sigma, acc_hi))
        bias = rng.integers(-span, span + 1, channels)
    zp_out = int(np.clip(rng.integers(out_lo // 4, out_hi // 4 + 1), *s16))
    act_lo = int(np.clip(rng.integers(out_lo, zp_out + 1), *s16))
    act_hi = int(np.clip(rng.integers(zp_out, out_hi + 1), *s16))
    return _Sfu(bias.astype(np.int64), mult.astype(np.int64), shift.astype(np.int64), zp_out, act,
                act_lo, act_hi)


# --------------------------------------------------------------------------------------------
# token protocol


class _Pipeline:
    """Collects the steps (LOADs + one COMPUTE) and the STOREs of each output tile, then emits
    them with the token flags of the module's protocol."""

    def __init__(self, prologue: list[Instruction]) -> None:
        self.prologue = prologue
        self.steps: list[tuple[list[Instruction], Instruction, int]] = []
        self.stores: list[list[Instruction]] = []

    def begin_tile(self) -> int:
        """Start an output tile; returns its index (its accumulator buffer is index % 2)."""
        self.stores.append([])
        return len(self.stores) - 1

    def step(self, loads: list[Instruction], compute: Instruction) -> int:
        """Add a step; returns its index (its scratchpad slot is index % 2)."""
        self.steps.append((loads, compute, len(self.stores) - 1))
        return len(self.steps) - 1

    def store(self, instr: Instruction) -> None:
        self.stores[-1].append(instr)

    def build(self) -> list[Instruction]:
        out = list(self.prologue)
        n_steps, n_tiles = len(self.steps), len(self.stores)
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for j, (_, _, t) in enumerate(self.steps):
            first.setdefault(t, j)
            last[t] = j
        for j, (loads, compute, t) in enumerate(self.steps):
            loads = list(loads)
            if j >= 2:     # slot j % 2 is free once COMPUTE j - 2 is done
                loads[0] = loads[0].replace(pop_next=1)
            loads[-1] = loads[-1].replace(push_next=1)
            flags = {"pop_prev": 1}
            if j + 2 < n_steps:
                flags["push_prev"] = 1
            if j == first[t] and t >= 2:   # buffer t % 2 is free once tile t - 2 is stored
                flags["pop_next"] = 1
            if j == last[t]:
                flags["push_next"] = 1
            out += loads
            out.append(compute.replace(**flags))
            if j == last[t]:
                stores = list(self.stores[t])
                stores[0] = stores[0].replace(pop_prev=1)
                if t + 2 < n_tiles:
                    stores[-1] = stores[-1].replace(push_prev=1)
                out += stores
        out.append(Instruction("FINISH"))
        return out


# --------------------------------------------------------------------------------------------
# convolution (GEMM is a 1x1 convolution over an M x 1 image of K channels)


def conv_reference(x: np.ndarray, weights: np.ndarray, *, stride: int, pad: int, dilation: int,
                   pad_value: int) -> np.ndarray:
    """Direct convolution of an (H, W, Cin) image with (kh, kw, Cin, Cout) weights, int64,
    padding with ``pad_value``: a sum over kernel offsets (no im2col)."""
    h, w, _ = x.shape
    kh, kw, _, cout = weights.shape
    oh = (h + 2 * pad - dilation * (kh - 1) - 1) // stride + 1
    ow = (w + 2 * pad - dilation * (kw - 1) - 1) // stride + 1
    padded = np.pad(x.astype(np.int64), ((pad, pad), (pad, pad), (0, 0)), constant_values=pad_value)
    out = np.zeros((oh, ow, cout), np.int64)
    for r in range(kh):
        for s in range(kw):
            window = padded[r * dilation:r * dilation + stride * (oh - 1) + 1:stride,
                            s * dilation:s * dilation + stride * (ow - 1) + 1:stride]
            out += window @ weights[r, s].astype(np.int64)
    return out


def _split_region(region: tuple[int, int, int, int], limit: int) -> list[tuple[int, int, int, int]]:
    """Split (oh0, rows, ow0, cols) into pieces of at most ``limit`` pixels, contiguous in
    row-major order: groups of whole rows, or column chunks of one row. A region of several rows
    always spans the full width."""
    oh0, rows, ow0, cols = region
    if rows * cols <= limit:
        return [region]
    if cols <= limit:
        group = limit // cols
        return [(oh0 + i, min(group, rows - i), ow0, cols) for i in range(0, rows, group)]
    return [(oh0 + i, 1, ow0 + j, min(limit, cols - j)) for i in range(rows) for j in range(0, cols, limit)]


def _rebase(start: int, extent: int, pitch: int) -> tuple[int, int, int]:
    """Move the in-image part of a start coordinate into the address: (start', extent',
    byte offset), so that 16-bit y0/x0 and height/width fields suffice for any tensor."""
    base = min(max(0, start), extent)
    # a tile spans far fewer than 65535 rows, so a clamped bound still covers it
    return start - base, min(extent - base, 0xFFFF), base * pitch


def _conv_program(config: AcceleratorConfig, name: str, rng: np.random.Generator, x: np.ndarray,
                  weights: np.ndarray, *, stride: int, pad: int, dilation: int, layout: str,
                  zp_in: int, requant: bool, act: int, per_channel: bool, extremes: bool,
                  residual: np.ndarray | None) -> Case:
    c = config
    R, C = c.rows, c.cols
    h, w, cin = x.shape
    kh, kw, _, cout = weights.shape
    oh = (h + 2 * pad - dilation * (kh - 1) - 1) // stride + 1
    ow = (w + 2 * pad - dilation * (kw - 1) - 1) // stride + 1
    if oh < 1 or ow < 1:
        raise ValueError(f"the kernel ({kh}x{kw}, dilation {dilation}) must fit the padded "
                         f"{h + 2 * pad}x{w + 2 * pad} image, but the output would be {oh}x{ow}")
    n_tiles = -(-cout // C)
    if requant and n_tiles > c.requant_table_rows:
        raise ValueError(f"{name}: {cout} output channels need {n_tiles} requantize table rows of "
                         f"{C}, but the config has requant_table_rows={c.requant_table_rows}")
    esz = c.spad_elem_bytes
    spad_dtype_x = _dtype(c.spad_elem_bits, c.input_signed)
    spad_dtype_w = _dtype(c.spad_elem_bits, c.weight_signed)

    image = _Image()
    # the program words go first; their size is known once built, so reserve after building
    x_dram = x if layout == "nhwc" else np.ascontiguousarray(x.transpose(2, 0, 1))
    x_addr = image.add("x", x_dram.astype(spad_dtype_x))
    b_matrix = weights.reshape(kh * kw * cin, cout)
    b_addr = image.add("weights", b_matrix.astype(spad_dtype_w))
    if layout == "nhwc":
        px_y, px_x, px_c = w * cin * esz, cin * esz, esz
    else:
        px_y, px_x, px_c = w * esz, esz, h * w * esz
    sfu = None
    table_addr = 0
    prologue: list[Instruction] = []
    if requant:
        sfu = _make_sfu(rng, c, cout, kh * kw * cin, act=act, per_channel=per_channel,
                        extremes=extremes)
        if residual is not None:
            _share_shift(sfu, float(rng.uniform(0.5, 1.5)))
            sfu.res_zp = int(rng.integers(c.input_range[0] // 4, c.input_range[1] // 4 + 1))
            sfu.tie_out = int(rng.integers(0, 2))
        table_addr = image.add("table", sfu.table_bytes(n_tiles * C))
        prologue = [
            sfu.config_instruction(),
            *(Instruction("LOAD", **f)
              for f in table_load_fields(c, dram_addr=table_addr, dst_addr=0, rows=n_tiles)),
        ]
    out_bits = c.output_bits if requant else c.acc_bits
    out_signed = c.output_signed if requant else c.acc_signed
    oesz = out_bits // 8
    out_addr = image.reserve("out", oh * ow * cout * oesz)
    res_addr = 0
    if residual is not None:
        res_addr = image.add("residual", residual.astype(_dtype(c.input_bits, c.input_signed)))

    half_spad = c.spad_rows // 2
    half_acc = c.acc_rows // 2
    ws = c.dataflow == "ws"
    if ws:
        tk_max = R if half_spad >= 2 * R else max(1, half_spad // 2)
        a_area = half_spad - tk_max
        pixel_limit = half_acc           # pixels per accumulator buffer (one tile)
        m_limit = min(a_area, half_acc)  # pixels per COMPUTE
    else:
        tk_max = max(1, half_spad // 2)
        pixel_limit = m_limit = R
    k_tiles = [(r, s, ci0, min(tk_max, cin - ci0))
               for r in range(kh) for s in range(kw) for ci0 in range(0, cin, tk_max)]
    n_ranges = [(n0, min(C, cout - n0)) for n0 in range(0, cout, C)]

    def load_b(dst_row: int, kt: tuple[int, int, int, int], n0: int, nn: int) -> Instruction:
        r, s, ci0, tk = kt
        row = (r * kw + s) * cin + ci0
        return Instruction("LOAD", dst="spad", dst_addr=dst_row,
                           dram_addr=b_addr + (row * cout + n0) * esz, pitch_y=cout * esz,
                           pitch_c=esz, rows_outer=1, rows_inner=tk, inner_dy=1, segs=1,
                           seg_len=nn, elem_dc=1)

    def gather(region: tuple[int, int, int, int], kt: tuple[int, int, int, int]
               ) -> dict[str, int]:
        """Bounded-image fields common to the im2col gathers of one tile and kernel tap."""
        oh0, _, ow0, _ = region
        r, s, ci0, _ = kt
        y0, height, dy = _rebase(oh0 * stride - pad + r * dilation, h, px_y)
        x0, width, dx = _rebase(ow0 * stride - pad + s * dilation, w, px_x)
        return {"dram_addr": x_addr + ci0 * px_c + dy + dx, "pitch_y": px_y, "pitch_x": px_x,
                "pitch_c": px_c, "bounded": 1, "height": height, "width": width,
                "y0": y0, "x0": x0, "pad_value": zp_in}

    def load_a_ws(slot: int, region: tuple[int, int, int, int], kt: tuple[int, int, int, int]
                  ) -> Instruction:
        # one destination row per output pixel, tk channels of tap (r, s) in it
        _, rows, _, cols = region
        return Instruction("LOAD", dst="spad", dst_addr=slot * half_spad + tk_max,
                           rows_outer=rows, outer_dy=stride, rows_inner=cols, inner_dx=stride,
                           segs=1, seg_len=kt[3], elem_dc=1, **gather(region, kt))

    def load_a_os(slot: int, region: tuple[int, int, int, int], kt: tuple[int, int, int, int]
                  ) -> Instruction:
        # A^T: one destination row per input channel, the tile's output pixels along it
        _, rows, _, cols = region
        if cols == 1:   # a column of pixels (a GEMM's M rows): walk y per element
            walk = {"segs": 1, "seg_len": rows, "elem_dy": stride}
        else:
            walk = {"segs": rows, "seg_dy": stride, "seg_len": cols, "elem_dx": stride}
        return Instruction("LOAD", dst="spad", dst_addr=slot * half_spad, rows_outer=1,
                           rows_inner=kt[3], inner_dc=1, **walk, **gather(region, kt))

    def store(region: tuple[int, int, int, int], buf: int, n0: int, nn: int, nt: int
              ) -> Instruction:
        oh0, rows, ow0, cols = region
        offset = ((oh0 * ow + ow0) * cout + n0) * oesz
        fields = {"acc_addr": buf * half_acc, "n": nn, "in_h": rows, "in_w": cols, "out_h": rows,
                  "out_w": cols, "dram_addr": out_addr + offset, "pitch_y": ow * cout * oesz,
                  "pitch_x": cout * oesz, "pitch_c": oesz}
        if not requant:
            return Instruction("STORE", out_type="raw", **fields)
        if residual is not None:
            fields.update(residual=1, res_addr=res_addr + offset)
        return Instruction("STORE", act=act, qrow=nt, **fields)

    pipe = _Pipeline(prologue)
    for block in _split_region((0, oh, 0, ow), pixel_limit):
        pieces = _split_region(block, m_limit)
        for nt, (n0, nn) in enumerate(n_ranges):
            t = pipe.begin_tile()
            buf = t % 2
            for ki, kt in enumerate(k_tiles):
                offset = 0
                for mi, piece in enumerate(pieces):
                    m = piece[1] * piece[3]
                    slot = len(pipe.steps) % 2
                    if ws:
                        loads = [load_b(slot * half_spad, kt, n0, nn)] if mi == 0 else []
                        loads.append(load_a_ws(slot, piece, kt))
                        compute = Instruction("COMPUTE", a_addr=slot * half_spad + tk_max,
                                              b_addr=slot * half_spad, acc_addr=buf * half_acc + offset,
                                              m=m, k=kt[3], n=nn, preload=int(mi == 0),
                                              accumulate=int(ki > 0))
                    else:
                        loads = [load_a_os(slot, piece, kt),
                                 load_b(slot * half_spad + tk_max, kt, n0, nn)]
                        compute = Instruction("COMPUTE", a_addr=slot * half_spad,
                                              b_addr=slot * half_spad + tk_max,
                                              acc_addr=buf * half_acc + offset, m=m, k=kt[3], n=nn,
                                              accumulate=int(ki > 0))
                    pipe.step(loads, compute)
                    offset += m
            pipe.store(store(block, buf, n0, nn, nt))

    instructions = pipe.build()
    program = Program(tuple(instructions), c.hash)
    words = program.words()
    # place the program after the data so that data addresses do not depend on its length
    program_addr = image.add("program", np.frombuffer(words, np.uint8))

    acc = conv_reference(x, weights, stride=stride, pad=pad, dilation=dilation, pad_value=zp_in)
    acc = wrap(acc, c.acc_bits, c.acc_signed)
    if requant:
        assert sfu is not None
        result = sfu.pointwise(acc, c, residual=residual)
    else:
        result = acc
    expected = {"out": (out_addr, result.astype(_dtype(out_bits, out_signed)))}
    macs = oh * ow * cout * kh * kw * cin
    regions = {k: (a, len(b)) for k, (a, b) in image.regions.items()}
    return Case(name, c, program, image.build(), expected, program_addr, macs, regions)


def _operands(rng: np.random.Generator, config: AcceleratorConfig, x_shape: tuple[int, ...],
              w_shape: tuple[int, ...], extremes: bool) -> tuple[np.ndarray, np.ndarray]:
    in_lo, in_hi = config.input_range
    w_lo, w_hi = config.weight_range
    if extremes:    # the largest positive sums: every product is lo * lo
        return np.full(x_shape, in_lo, np.int64), np.full(w_shape, w_lo, np.int64)
    return (rng.integers(in_lo, in_hi + 1, x_shape), rng.integers(w_lo, w_hi + 1, w_shape))


def gemm_case(config: AcceleratorConfig, M: int, K: int, N: int, *, seed: int = 0,
              requant: bool = True, per_channel: bool = True, act: str = "none",
              extremes: bool = False) -> Case:
    """C = A (M x K) . B (K x N), A and B row-major in DRAM, C row-major M x N: requantized to
    the input type (``requant``) or raw accumulator elements.

    Tiled over M, K and N with partial tiles; K tiles accumulate into the accumulator
    (``accumulate``). Weight-stationary: each (k, n) weight tile is preloaded once and all M
    tiles of an accumulator buffer stream through it. Output-stationary: A^T tiles come from
    transposing LOADs (``elem_dy``). ``extremes``: A and B all at the most negative value (the
    largest sums) and requantize entries at their limits."""
    _positive(M=M, K=K, N=N)
    act_code = _check_act(act, config)
    rng = np.random.default_rng(seed)
    a, b = _operands(rng, config, (M, 1, K), (1, 1, K, N), extremes)
    zp_in = 0
    case = _conv_program(config, f"gemm {M}x{K}x{N}", rng, a, b, stride=1, pad=0, dilation=1,
                         layout="nhwc", zp_in=zp_in, requant=requant, act=act_code,
                         per_channel=per_channel, extremes=extremes, residual=None)
    addr, out = case.expected["out"]
    case.expected["out"] = (addr, out.reshape(M, N))
    return case


def conv_case(config: AcceleratorConfig, H: int, W: int, Cin: int, Cout: int, kh: int, kw: int,
              stride: int = 1, pad: int = 0, dilation: int = 1, *, seed: int = 0,
              layout: str = "nhwc", act: str = "none", requant: bool = True,
              per_channel: bool = True) -> Case:
    """A 2D convolution of an H x W x Cin image (NHWC or NCHW in DRAM) with kh x kw x Cin x Cout
    weights, symmetric zero-point padding ``pad``, ``stride`` and ``dilation``; output NHWC.

    The im2col patches are gathered by bounded LOADs straight from the image (y0/x0 negative
    for padding, pad_value = the input zero point); no im2col matrix is written to DRAM. The
    expected result is a direct convolution (a sum over kernel offsets), then the SFU."""
    _positive(H=H, W=W, Cin=Cin, Cout=Cout, kh=kh, kw=kw, stride=stride, dilation=dilation)
    if isinstance(pad, bool) or not isinstance(pad, int) or pad < 0:
        raise ValueError(f"pad must be a non-negative integer, not {pad!r}")
    for label, value in (("stride", stride), ("dilation", dilation)):
        if value > 127:
            raise ValueError(f"{label} must be at most 127 (a LOAD coordinate step is s8), "
                             f"not {value}")
    if layout not in ("nhwc", "nchw"):
        raise ValueError(f"layout must be 'nhwc' or 'nchw', not {layout!r}")
    act_code = _check_act(act, config)
    rng = np.random.default_rng(seed)
    x, w = _operands(rng, config, (H, W, Cin), (kh, kw, Cin, Cout), False)
    lo, hi = config.input_range
    zp_in = int(rng.integers(max(lo, -16), min(hi, 16) + 1))
    return _conv_program(config, f"conv {H}x{W}x{Cin}->{Cout} k{kh}x{kw} s{stride} p{pad} "
                         f"d{dilation} {layout}", rng, x, w, stride=stride, pad=pad,
                         dilation=dilation, layout=layout, zp_in=zp_in, requant=requant,
                         act=act_code, per_channel=per_channel, extremes=False, residual=None)


def _share_shift(sfu: _Sfu, res_scale: float) -> None:
    """Give every channel and the residual ONE shift (the residual term is shifted by the table
    entry's shift, docs/isa.md STORE): the smallest of the channels' shifts and the one
    ``choose_multiplier`` picks for ``res_scale``, with the multipliers rescaled to it."""
    res_mult, res_shift = choose_multiplier(res_scale)
    common = min(int(sfu.shift.min()), res_shift)
    sfu.mult = np.array([(int(mu) + (1 << (sh - common - 1))) >> (sh - common) if sh > common else int(mu)
                         for mu, sh in zip(sfu.mult, sfu.shift, strict=True)], np.int64)
    sfu.shift = np.full(sfu.shift.shape, common, np.int64)
    sfu.res_mult = (res_mult + (1 << (res_shift - common - 1))) >> (res_shift - common) \
        if res_shift > common else res_mult


def residual_case(config: AcceleratorConfig, M: int, K: int, N: int, *, seed: int = 0,
                  act: str = "relu") -> Case:
    """A GEMM (a 1x1 convolution) whose STOREs add a residual M x N tensor of the input type
    (a ResNet shortcut): ``act(round(A.B * mult + (res - res_zp) * res_mult, shift))``, one
    rounding with one shift for all channels, as a compiler emits it."""
    _positive(M=M, K=K, N=N)
    if not config.sfu_residual:
        raise ValueError("residual_case needs a config with sfu_residual = true")
    act_code = _check_act(act, config)
    rng = np.random.default_rng(seed)
    a, b = _operands(rng, config, (M, 1, K), (1, 1, K, N), False)
    lo, hi = config.input_range
    res = rng.integers(lo, hi + 1, (M, 1, N))
    case = _conv_program(config, f"residual gemm {M}x{K}x{N}", rng, a, b, stride=1, pad=0,
                         dilation=1, layout="nhwc", zp_in=0, requant=True, act=act_code,
                         per_channel=True, extremes=False, residual=res)
    addr, out = case.expected["out"]
    case.expected["out"] = (addr, out.reshape(M, N))
    return case


# --------------------------------------------------------------------------------------------
# pooling


def pool_case(config: AcceleratorConfig, H: int, W: int, channels: int, *, pool: str = "max",
              kernel: int | tuple[int, int] = 2, stride: int | tuple[int, int] | None = None,
              pad: int | tuple[int, int] = 0, global_pool: bool = False, act: str = "none",
              seed: int = 0) -> Case:
    """Max or average pooling of an H x W x channels NHWC tensor of the input type.

    LOAD with ``widen`` puts the image into an accumulator buffer (one row per pixel), a STORE
    pools it through the SFU (requantize entries bias = -zero point, scale ~1). ``global_pool``
    averages or maxes the whole image into 1 x 1. Output windows follow ONNX floor mode with
    symmetric padding ``pad``, out-of-image pixels excluded from max and counted as the output
    zero point in avg (count_include_pad). Channel tiles alternate between two accumulator
    buffers, synchronized through SYNC on the compute queue (there is no load->store channel)."""
    c = config
    _positive(H=H, W=W, channels=channels)
    if pool not in ("max", "avg"):
        raise ValueError(f"pool must be 'max' or 'avg', not {pool!r}")
    if pool not in c.sfu_pooling:
        raise ValueError(f"pool {pool!r} is not among this config's sfu_pooling "
                         f"({', '.join(c.sfu_pooling) or 'none'})")
    act_code = _check_act(act, c)
    if global_pool:
        kh, kw, sh, sw, pt, pl = H, W, 1, 1, 0, 0
    else:
        kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
        stride = (kh, kw) if stride is None else stride
        sh, sw = (stride, stride) if isinstance(stride, int) else stride
        pt, pl = (pad, pad) if isinstance(pad, int) else pad
        _positive(kernel_h=kh, kernel_w=kw, stride_h=sh, stride_w=sw)
        if not (0 <= pt < kh and 0 <= pl < kw):
            raise ValueError(f"pad must be below the kernel size ({kh}x{kw}), not {(pt, pl)}")
    for label, value in (("kernel", max(kh, kw)), ("stride", max(sh, sw)), ("pad", max(pt, pl))):
        if value > 255:
            raise ValueError(f"{label} must be at most 255 (u8 STORE window fields), not {value}")
    if H * W > c.acc_rows // 2:
        raise ValueError(f"pool_case keeps the whole {H}x{W} image in one accumulator buffer, "
                         f"which holds {c.acc_rows // 2} pixels")
    oh = (H + 2 * pt - kh) // sh + 1     # symmetric padding, floor mode (ONNX)
    ow = (W + 2 * pl - kw) // sw + 1
    if oh < 1 or ow < 1:
        raise ValueError(f"a {kh}x{kw} window does not fit the {H}x{W} image with padding {pt, pl}")

    rng = np.random.default_rng(seed)
    lo, hi = c.input_range
    x = rng.integers(lo, hi + 1, (H, W, channels))
    zp_in = int(rng.integers(max(lo, -16), min(hi, 16) + 1))
    out_lo, out_hi = c.output_range
    n_tiles = -(-channels // c.cols)
    if n_tiles > c.requant_table_rows:
        raise ValueError(f"pool_case: {channels} channels need {n_tiles} requantize table rows, "
                         f"but the config has {c.requant_table_rows}")
    pairs = [choose_multiplier(float(s)) for s in rng.uniform(0.5, 1.5, channels)]
    zp_out = int(rng.integers(out_lo // 4, out_hi // 4 + 1))
    sfu = _Sfu(bias=np.full(channels, -zp_in, np.int64),
               mult=np.array([p[0] for p in pairs], np.int64),
               shift=np.array([p[1] for p in pairs], np.int64), zp_out=zp_out, act=act_code,
               act_lo=int(rng.integers(out_lo, zp_out + 1)),
               act_hi=int(rng.integers(zp_out, out_hi + 1)))
    if pool == "avg":
        sfu.avg_mult, sfu.avg_shift = choose_multiplier(1.0 / (kh * kw))
        # either tie choice: power-of-two windows make exact ties common
        sfu.avg_tie_out = int(rng.integers(0, 2))

    image = _Image()
    ib = c.input_bytes
    x_addr = image.add("x", x.astype(_dtype(c.input_bits, c.input_signed)))
    table_addr = image.add("table", sfu.table_bytes(n_tiles * c.cols))
    out_addr = image.reserve("out", oh * ow * channels * ib)
    half_acc = c.acc_rows // 2

    out: list[Instruction] = [
        sfu.config_instruction(),
        *(Instruction("LOAD", **f)
          for f in table_load_fields(c, dram_addr=table_addr, dst_addr=0, rows=n_tiles)),
    ]
    for t, n0 in enumerate(range(0, channels, c.cols)):
        nn = min(c.cols, channels - n0)
        buf = t % 2
        if t >= 2:   # buffer t % 2 is free once the STORE of tile t - 2 is done
            out.append(Instruction("SYNC", queue="compute", pop_next=1, push_prev=1))
        out.append(Instruction("LOAD", dst="acc", widen=1, dst_addr=buf * half_acc,
                               dram_addr=x_addr + n0 * ib, pitch_y=W * channels * ib,
                               pitch_x=channels * ib, pitch_c=ib, rows_outer=H, outer_dy=1,
                               rows_inner=W, inner_dx=1, segs=1, seg_len=nn, elem_dc=1,
                               pop_next=int(t >= 2), push_next=1))
        out.append(Instruction("SYNC", queue="compute", pop_prev=1, push_next=1))
        out.append(Instruction("STORE", acc_addr=buf * half_acc, n=nn, in_h=H, in_w=W, out_h=oh,
                               out_w=ow, dram_addr=out_addr + n0 * ib, pitch_y=ow * channels * ib,
                               pitch_x=channels * ib, pitch_c=ib, act=act_code, pool=pool,
                               pool_h=kh, pool_w=kw, stride_h=sh, stride_w=sw, pad_top=pt,
                               pad_left=pl, qrow=t, pop_prev=1, push_prev=int(t + 2 < n_tiles)))
    out.append(Instruction("FINISH"))
    program = Program(tuple(out), c.hash)
    program_addr = image.add("program", np.frombuffer(program.words(), np.uint8))

    # reference: pointwise SFU, then windows over a padded array (floor mode)
    v = sfu.pointwise(x, c, act=act_code)
    fill = np.iinfo(np.int64).min if pool == "max" else zp_out
    extra_h = max(0, (oh - 1) * sh + kh - pt - H)
    extra_w = max(0, (ow - 1) * sw + kw - pl - W)
    padded = np.pad(v, ((pt, extra_h), (pl, extra_w), (0, 0)), constant_values=fill)
    windows = [padded[i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw]
               for i in range(kh) for j in range(kw)]
    if pool == "max":
        result = np.max(windows, axis=0)
    else:
        result = avg_pool_finish(np.sum(windows, axis=0), kh * kw, zp_out=zp_out,
                                 avg_mult=sfu.avg_mult, avg_shift=sfu.avg_shift, act=act_code,
                                 act_lo=sfu.act_lo, act_hi=sfu.act_hi, out_range=c.output_range,
                                 tie_out=sfu.avg_tie_out)
    expected = {"out": (out_addr, result.astype(_dtype(c.input_bits, c.input_signed)))}
    regions = {k: (a, len(b)) for k, (a, b) in image.regions.items()}
    name = (f"{'global ' if global_pool else ''}{pool} pool {H}x{W}x{channels} k{kh}x{kw} "
            f"s{sh}x{sw} p{pt}x{pl}")
    return Case(name, c, program, image.build(), expected, program_addr, 0, regions)
