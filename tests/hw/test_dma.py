"""DMA engines (hw/dma.py) against the golden model (sim/golden.py).

``GatherReader``: seeded random LOADs covering every feature of docs/isa.md (plain and 3D tiles,
unaligned addresses and pitches, segments, negative and zero steps, bounded images padded on every
side with extreme pad values, im2col gathers, NCHW and transposing per-element walks, widening,
accumulator and 12-byte table elements, dst_col offsets) on three configurations (element sizes
1/2/4/12, buses of 32/64/128 bits), with random AXI stalls and latency and a stalling row consumer.
The finished rows (bytes + byte mask) are applied to numpy copies of the destination memories the
way the golden model defines them and compared with the golden model's state after the same LOADs.
Commands are given one at a time (each after ``busy`` fell) and also back to back, as fast as the
engine takes them (it sets the next one up while the previous one's rows drain); each command's
rows end with the one flagged ``last``. Every bus beat is read once for consecutive elements that
share it: the beats read are exactly the changes of beat along the LOAD's in-image bytes in order.

``ScatterWriter``: random STORE geometries (raw and requantized outputs, 1xN and Nx1 images,
NCHW-like and gapped pitches, unaligned addresses, bursts at 4 KiB boundaries and longer than
``dma_max_burst``) on the same configurations plus a 16-column one; it is given the pixel bytes the
golden model writes (with junk past each pixel's elements) and the whole DRAM image must then
equal the golden model's, byte for byte, including the bytes no STORE writes. Consecutive outputs
in one beat share it and consecutive beats share a burst: the beats and bursts written are exactly
those of the STORE's bytes in order (a new beat when the beat changes, a new burst when a beat does
not follow the previous one, the burst is full or a 4 KiB boundary is reached).

On the way, ``AXIMemory`` asserts the AXI rules (beat size, alignment, no burst across 4 KiB or
longer than ``dma_max_burst``, WLAST) and counts the bursts in flight; SLVERR responses must set
``error`` without hanging the engines (and, for the reader, flag the rows read from the refused
beat); ``busy`` must rise with a command and fall only after the
last row (GatherReader) or the last write response (ScatterWriter). No cycle counts are asserted:
bench/dma_throughput.py measures speed.
Set SYSTOLIC_TEST_SEED to vary the random cases.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from amaranth.sim import Simulator
from systolic.hw.axi import RESP_OKAY, RESP_SLVERR
from systolic.hw.config import AcceleratorConfig
from systolic.hw.dma import (
    GatherReader,
    LoadCommandLayout,
    ScatterWriter,
    StoreCommandLayout,
    write_burst_beats,
)
from systolic.hw.dma_serial import (
    SerialGatherReader,
    SerialScatterWriter,
    serial_load_cycles,
    serial_store_write_cycles,
)
from systolic.hw.isa import Instruction
from systolic.sim.golden import MachineState, run_golden
from systolic.sim.programs import tile_load

from .axi_model import AXIMemory
from .test_scratchpad import construct_rejected

SEED = int(os.environ.get("SYSTOLIC_TEST_SEED", "1"))
#: A simulation gives up after this many clock edges, so a hang fails instead of blocking.
EDGE_LIMIT = 60_000

CONFIGS = {
    # elements: spad 1, acc 4, widen 1, table 12 bytes; 4-byte beats
    "bus32_int8": AcceleratorConfig(rows=4, cols=4, scratchpad_bytes=256, accumulator_bytes=512,
                                    requant_table_rows=8, dma_data_bits=32, dma_max_burst=16,
                                    dma_outstanding=2),
    # elements: spad 2, acc 4, widen 2, table 12 (96-byte rows: longer than one 64-byte burst)
    "bus64_int16": AcceleratorConfig(rows=8, cols=8, input_bits=16, weight_bits=16,
                                     scratchpad_bytes=512, accumulator_bytes=1024,
                                     requant_table_rows=8, dma_data_bits=64, dma_max_burst=8,
                                     dma_outstanding=4),
    # elements: spad 1, acc 2, widen 1 (unsigned input, zero-extended), table 12; 16-byte beats
    "bus128_acc16": AcceleratorConfig(rows=4, cols=4, input_signed=False, acc_bits=16,
                                      scratchpad_bytes=256, accumulator_bytes=256,
                                      requant_table_rows=8, dma_data_bits=128, dma_max_burst=4,
                                      dma_outstanding=3),
}

#: The two LOAD engines (``gather_engine``): every GatherReader test runs on both.
ENGINES = {"pipelined": GatherReader, "serial": SerialGatherReader}
#: The two STORE engines (``scatter_engine``): every ScatterWriter test runs on both.
WRITERS = {"pipelined": ScatterWriter, "serial": SerialScatterWriter}

DRAM_BYTES = 16 * 1024
#: DRAM bytes from here on hold valid 12-byte requantize entries; the region starts 20 entries
#: before a 4 KiB boundary so that table rows cross it.
TABLE_BASE = 3 * 4096 - 20 * 12
TABLE_ENTRIES = (DRAM_BYTES - TABLE_BASE) // 12
DESTINATIONS = ("spad", "acc", "widen", "table")
FEATURES = ("tile", "3d", "segments", "negative", "padded", "im2col", "taps", "nchw",
            "transpose", "broadcast", "random")
#: Features that need ``bounded`` (a table LOAD cannot be bounded).
BOUNDED_FEATURES = ("padded", "im2col", "taps", "nchw")


# -- DRAM image and element formats --------------------------------------------------------------

def make_dram(rng: np.random.Generator) -> np.ndarray:
    """Random bytes (with runs of 0x00, 0x7f, 0x80 and 0xff for extreme element values), then the
    requantize entry region: int32 bias and multiplier drawn from random and extreme values, shift
    0..62."""
    dram = rng.integers(0, 256, DRAM_BYTES, dtype=np.uint8)
    for _ in range(64):
        start = int(rng.integers(0, TABLE_BASE - 16))
        dram[start:start + int(rng.integers(1, 16))] = rng.choice([0x00, 0x7F, 0x80, 0xFF])
    extremes = np.array([-(1 << 31), (1 << 31) - 1, 0, -1, 1], np.int64)
    entries = rng.integers(-(1 << 31), 1 << 31, (TABLE_ENTRIES, 3), dtype=np.int64)
    pick = rng.random((TABLE_ENTRIES, 2)) < 0.3
    entries[:, :2] = np.where(pick, extremes[rng.integers(0, 5, (TABLE_ENTRIES, 2))], entries[:, :2])
    entries[:, 2] = rng.choice([0, 62, 1, 31, int(rng.integers(0, 63))], TABLE_ENTRIES)
    dram[TABLE_BASE:TABLE_BASE + 12 * TABLE_ENTRIES] = np.frombuffer(
        entries.astype("<i4").tobytes(), np.uint8)
    return dram


@dataclass(frozen=True)
class Destination:
    """A LOAD destination as the engine and the golden model see it."""

    name: str                   #: spad, acc, widen (acc with widen) or table
    rows: int                   #: rows of the destination memory
    row_elems: int              #: elements per row
    elem_bytes: int             #: bytes per element in DRAM
    signed: bool                #: DRAM elements are sign-extended (spad: raw bits)
    pad_range: tuple[int, int]  #: valid pad_value (docs/isa.md), clipped to the s16 field


def destination(config: AcceleratorConfig, name: str) -> Destination:
    s16 = (-(1 << 15), (1 << 15) - 1)
    if name == "spad":
        lo = min(config.input_range[0], config.weight_range[0])
        hi = max(config.input_range[1], config.weight_range[1])
        return Destination(name, config.spad_rows, config.spad_row_elems, config.spad_elem_bytes,
                           False, (lo, hi))
    if name == "acc":
        lo, hi = config.acc_range
        return Destination(name, config.acc_rows, config.cols, config.acc_bytes, config.acc_signed,
                           (max(lo, s16[0]), min(hi, s16[1])))
    if name == "widen":
        return Destination(name, config.acc_rows, config.cols, config.input_bytes,
                           config.input_signed, config.input_range)
    return Destination(name, config.requant_table_rows, config.cols, config.requant_entry_bytes,
                       True, (0, 0))


def empty_state(config: AcceleratorConfig) -> MachineState:
    return MachineState(
        spad=np.zeros((config.spad_rows, config.spad_row_elems), np.int64),
        acc=np.zeros((config.acc_rows, config.cols), np.int64),
        table=np.zeros((config.requant_table_rows, config.cols, 3), np.int64),
        weights=np.zeros((config.rows, config.cols), np.int64), sfu={})


def apply_row(state: MachineState, dst: Destination, row: int, row_bytes: bytes, mask: int) -> None:
    """Write the elements a finished row names into ``state``, converting bytes the way
    docs/isa.md defines: spad raw little-endian bits, acc elements sign- (or zero-) extended from
    ``elem_bytes`` (input_bytes with widen), table entries as three int32. Raises AssertionError
    for a mask that covers part of an element or bytes past the row."""
    eb = dst.elem_bytes
    row_mask = (1 << (dst.row_elems * eb)) - 1
    assert mask & ~row_mask == 0, f"row {row}: mask {mask:#x} covers bytes past the row's " \
                                  f"{dst.row_elems} elements of {eb} bytes"
    for e in range(dst.row_elems):
        element_mask = ((1 << eb) - 1) << (e * eb)
        covered = mask & element_mask
        if not covered:
            continue
        assert covered == element_mask, f"row {row}: mask {mask:#x} covers part of element {e}"
        raw = row_bytes[e * eb:(e + 1) * eb]
        if dst.name == "table":
            state.table[row, e] = [int.from_bytes(raw[4 * j:4 * j + 4], "little", signed=True)
                                   for j in range(3)]
        elif dst.name == "spad":
            state.spad[row, e] = int.from_bytes(raw, "little")
        else:
            state.acc[row, e] = int.from_bytes(raw, "little", signed=dst.signed)


# -- random LOADs ----------------------------------------------------------------------------------

_STEP_NAMES = tuple(f"{level}_{axis}" for level in ("outer", "inner", "seg", "elem")
                    for axis in ("dy", "dx", "dc"))


def _coordinates(f: dict[str, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(y, x, c) of every element of a LOAD, shape (rows, elements per row), for placing it."""
    def axis(name: str, start: int) -> np.ndarray:
        o = np.arange(f["rows_outer"])[:, None] * f[f"outer_{name}"]
        i = np.arange(f["rows_inner"])[None, :] * f[f"inner_{name}"]
        s = np.arange(f["segs"])[:, None] * f[f"seg_{name}"]
        e = np.arange(f["seg_len"])[None, :] * f[f"elem_{name}"]
        return start + (o + i).reshape(-1, 1) + (s + e).reshape(1, -1)
    return axis("dy", f["y0"]), axis("dx", f["x0"]), axis("dc", 0)


def random_load(rng: random.Random, config: AcceleratorConfig, dst: Destination, feature: str
                ) -> dict[str, int]:
    """Fields of a valid random LOAD showing ``feature``, placed in the DRAM image (table LOADs
    on the entry region, other LOADs anywhere, often across a 4 KiB boundary)."""
    while True:
        f = _random_geometry(rng, config, dst, feature)
        if _place(rng, f, dst):
            return f


def _random_geometry(rng: random.Random, config: AcceleratorConfig, dst: Destination, feature: str
                     ) -> dict[str, int]:
    eb = dst.elem_bytes
    f = dict.fromkeys(_STEP_NAMES, 0)
    f.update(dst=dst.name if dst.name != "widen" else "acc", widen=int(dst.name == "widen"),
             bounded=0, height=0, width=0, y0=0, x0=0, pad_value=0, rows_outer=1)
    width = rng.randint(1, dst.row_elems)
    segs = 1
    if feature in ("segments", "im2col", "taps", "nchw", "random"):
        divisors = [d for d in range(2, width + 1) if width % d == 0]
        segs = rng.choice(divisors) if divisors else 1
    f.update(segs=segs, seg_len=width // segs, dst_col=rng.randint(0, dst.row_elems - width))
    f["rows_inner"] = rng.randint(1, 6)
    if feature in ("3d", "im2col", "padded") or (feature == "random" and rng.random() < 0.5):
        f["rows_outer"] = rng.randint(2, 3)
    rows = f["rows_outer"] * f["rows_inner"]
    rows = min(rows, dst.rows)
    if f["rows_outer"] * f["rows_inner"] > dst.rows:
        f["rows_outer"], f["rows_inner"] = 1, rows
    f["dst_addr"] = rng.randint(0, dst.rows - f["rows_outer"] * f["rows_inner"])

    # an H x W x Cin image; NHWC unless the feature walks NCHW
    height, width_px, cin = rng.randint(1, 7), rng.randint(1, 7), rng.randint(1, 8)
    gap = rng.choice([0, 0, eb, 3 * eb]) if dst.name == "table" else rng.choice([0, 0, 1, 3, 7])
    f["pitch_c"] = eb
    f["pitch_x"] = cin * eb + gap
    f["pitch_y"] = width_px * f["pitch_x"] + gap
    if feature == "nchw":
        f["pitch_x"] = eb
        f["pitch_y"] = width_px * eb + gap
        f["pitch_c"] = height * f["pitch_y"] + gap
    f["elem_dc"] = 1

    if feature == "tile":
        f.update(pitch_y=rng.randint(1, 3 * dst.row_elems) * eb + gap, inner_dy=1)
    elif feature == "3d":
        f.update(outer_dy=rng.choice([1, 2]), outer_dc=rng.choice([0, f["seg_len"]]), inner_dx=1)
    elif feature == "segments":
        f.update(inner_dx=1, seg_dx=rng.choice([1, 2, -1]), seg_dy=rng.choice([0, 1]))
        if rng.random() < 0.5:      # segments back to back in DRAM
            f.update(seg_dx=1, seg_dy=0, pitch_x=f["seg_len"] * eb)
    elif feature == "negative":
        f.update(inner_dy=-1, inner_dx=rng.choice([0, -1]), seg_dx=-1, elem_dc=-1,
                 outer_dy=-rng.randint(0, 2))
    elif feature == "padded":
        # outer rows walk y, inner rows walk x: a window sliding over the image and its border
        f.update(outer_dy=1, inner_dx=rng.choice([1, 2]), seg_dx=1)
    elif feature == "im2col":
        stride, dilation = rng.choice([1, 2]), rng.choice([1, 2])
        f.update(outer_dy=stride, inner_dx=stride, seg_dx=dilation)
    elif feature == "taps":
        # a row gathers the taps of a kernel row, each all seg_len channels of a pixel (NHWC
        # without gaps, dilation 1): segments back to back in DRAM, the row cut by the image edge
        f.update(outer_dy=1, inner_dx=rng.choice([1, 2]), seg_dx=1, pitch_x=f["seg_len"] * eb)
        f["pitch_y"] = width_px * f["pitch_x"] + rng.choice([0, eb])
    elif feature == "nchw":
        # rows walk channels, elements walk pixels along x (then y per segment): per element
        f.update(inner_dc=1, elem_dc=0, elem_dx=1, seg_dy=1, outer_dc=f["rows_inner"])
    elif feature == "transpose":
        f.update(inner_dc=1, elem_dc=0, **{rng.choice(["elem_dy", "elem_dx"]): 1})
    elif feature == "broadcast":
        f.update(inner_dy=0, elem_dc=rng.choice([0, 1]))
    else:  # random
        for name in _STEP_NAMES:
            f[name] = rng.randint(-3, 3)
        f["pitch_c"] = rng.randint(0, 4) * eb if dst.name == "table" else rng.randint(0, 3 * eb)
        f["pitch_x"] = rng.randint(0, 12) * (eb if dst.name == "table" else 1)
        f["pitch_y"] = rng.randint(0, 40) * (eb if dst.name == "table" else 1)

    bounded = feature in BOUNDED_FEATURES or (feature == "random" and rng.random() < 0.5)
    if bounded and dst.name != "table":
        lo, hi = dst.pad_range
        f.update(bounded=1, height=height, width=width_px,
                 pad_value=rng.choice([lo, hi, lo, hi, 0, -1 if lo < 0 else 1, rng.randint(lo, hi)]))
        # start above/left of the image, inside it, or at its bottom/right edge (the walk then
        # leaves the image on the far side); now and then entirely outside it
        if rng.random() < 0.1:
            f["y0"], f["x0"] = rng.choice([(-4, 0), (height, 0), (0, -7), (0, width_px)])
        else:
            f["y0"] = rng.choice([-1, 0, rng.randint(-1, height - 1), height - 1])
            f["x0"] = rng.choice([-2, -1, 0, rng.randint(-1, width_px - 1), width_px - 1])
    elif feature in ("negative", "random"):
        f["y0"], f["x0"] = rng.randint(0, 6), rng.randint(0, 6)
    return f


def _place(rng: random.Random, f: dict[str, int], dst: Destination) -> bool:
    """Choose dram_addr so that every in-image element lies in DRAM (table: in the entry region,
    on an entry); False if the pattern cannot fit."""
    eb = dst.elem_bytes
    y, x, c = _coordinates(f)
    offset = y * f["pitch_y"] + x * f["pitch_x"] + c * f["pitch_c"]
    inside = np.ones(offset.shape, bool)
    if f["bounded"]:
        inside = (y >= 0) & (y < f["height"]) & (x >= 0) & (x < f["width"])
    if not inside.any():
        f["dram_addr"] = rng.randrange(DRAM_BYTES)
        return True
    lo, hi = int(offset[inside].min()), int(offset[inside].max()) + eb
    if dst.name == "table":
        first, last = TABLE_BASE - lo, TABLE_BASE + 12 * TABLE_ENTRIES - hi
        if first > last or first < 0 or lo % 12:
            return False
        f["dram_addr"] = first + 12 * rng.randint(0, (last - first) // 12)
        return True
    first, last = max(-lo, 0), DRAM_BYTES - hi      # dram_addr itself is unsigned
    if first > last:
        return False
    if rng.random() < 0.4:       # first in-image element just below a 4 KiB boundary
        target = rng.choice([4096, 8192]) - rng.randint(1, 40) - lo
        f["dram_addr"] = min(max(target, first), last)
    else:
        f["dram_addr"] = rng.randint(first, last)
    return True


def beats_read(f: dict[str, int], dst: Destination, beat_bytes: int) -> set[int]:
    """Addresses of the bus beats holding a byte of an in-image element of LOAD ``f``."""
    y, x, c = _coordinates(f)
    addr = f["dram_addr"] + y * f["pitch_y"] + x * f["pitch_x"] + c * f["pitch_c"]
    if f["bounded"]:
        addr = addr[(y >= 0) & (y < f["height"]) & (x >= 0) & (x < f["width"])]
    first, last = addr.reshape(-1) // beat_bytes, (addr.reshape(-1) + dst.elem_bytes - 1) // beat_bytes
    return {int(b) * beat_bytes for lo, hi in zip(first, last, strict=True) for b in range(lo, hi + 1)}


def _element_bytes(f: dict[str, int], dst: Destination) -> list[np.ndarray]:
    """Per destination row, the byte addresses of the LOAD's in-image elements, in element order."""
    y, x, c = _coordinates(f)
    addr = f["dram_addr"] + y * f["pitch_y"] + x * f["pitch_x"] + c * f["pitch_c"]
    inside = np.ones(addr.shape, bool)
    if f["bounded"]:
        inside = (y >= 0) & (y < f["height"]) & (x >= 0) & (x < f["width"])
    return [(a[keep][:, None] + np.arange(dst.elem_bytes)).reshape(-1)
            for a, keep in zip(addr, inside, strict=True)]


def beat_changes(byte_addresses: np.ndarray, beat_bytes: int) -> np.ndarray:
    """The bus beats (addresses) an engine moves for bytes handled in this order when consecutive
    bytes in one beat share it: the beat of each byte, consecutive repeats dropped."""
    beats = np.asarray(byte_addresses, np.int64) // beat_bytes * beat_bytes
    if beats.size == 0:
        return beats
    return beats[np.concatenate(([True], beats[1:] != beats[:-1]))]


def beats_fetched(f: dict[str, int], dst: Destination, beat_bytes: int) -> int:
    """Beats a LOAD reads: each beat once for consecutive in-image elements (and padding between
    them) that lie in it."""
    rows = _element_bytes(f, dst)
    return int(beat_changes(np.concatenate(rows), beat_bytes).size) if rows else 0


def expected_errors(touched: list[set[int]], bad: int, clear_between: bool) -> list[int]:
    """``error`` after each command when the beat at ``bad`` answers SLVERR: set by a command
    that touches it, kept until cleared."""
    out, error = [], RESP_OKAY
    for beats in touched:
        if clear_between:
            error = RESP_OKAY
        if bad in beats:
            error = RESP_SLVERR
        out.append(error)
    return out


def load_command(f: dict[str, int], dst: Destination) -> dict[str, int]:
    """The engine's command for LOAD fields ``f``: the fields plus elem_bytes."""
    names = [name for name, _ in LoadCommandLayout()]
    return {name: (dst.elem_bytes if name == "elem_bytes" else f[name]) for name in names}


# -- simulation ---------------------------------------------------------------------------------

@dataclass
class EngineRun:
    """What an engine did: per command, the rows it produced (GatherReader: row, bytes, mask)
    and its ``error`` output once ``busy`` had fallen; the AXI memory model afterwards."""

    memory: AXIMemory
    rows: list[list[tuple[int, bytes, int]]] = field(default_factory=list)
    errors: list[int] = field(default_factory=list)
    resps: list[list[int]] = field(default_factory=list)    #: GatherReader: ``resp`` of each row
    #: per command (overlapping runs only): whether it was accepted while the engine was busy
    #: with earlier ones
    accepted_busy: list[bool] = field(default_factory=list)
    #: GatherReader: (address, beats) of every read burst, in the order AR accepted them
    read_bursts: list[tuple[int, int]] = field(default_factory=list)


def simulate(dut: Any, driver: Callable[..., Any], *, memory: AXIMemory, read: bool = True,
             write: bool = False, background: tuple[Callable[..., Any], ...] = ()) -> None:
    """Run ``driver`` to completion with ``memory`` serving the engine's AXI port; fails after
    EDGE_LIMIT edges."""
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    memory.add_to(sim, dut, read=read, write=write)
    for testbench in background:
        sim.add_testbench(testbench, background=True)
    sim.add_testbench(driver)

    async def watchdog(ctx):
        await ctx.delay(EDGE_LIMIT * 1e-6)
        raise AssertionError(f"the engine did not finish within {EDGE_LIMIT} clock edges")

    sim.add_testbench(watchdog, background=True)
    sim.run()


async def _give(ctx: Any, dut: Any, payload: dict[str, int], clear_error: bool) -> None:
    """Pulse clear_error if asked, then hand a command to an idle engine and check that busy rose."""
    if clear_error:
        ctx.set(dut.clear_error, 1)
        await ctx.tick()
        ctx.set(dut.clear_error, 0)
    assert not ctx.get(dut.busy), "the engine must be idle before a command"
    ctx.set(dut.cmd.valid, 1)
    ctx.set(dut.cmd.payload, payload)
    await ctx.tick().until(dut.cmd.ready)
    ctx.set(dut.cmd.valid, 0)
    assert ctx.get(dut.busy), "busy must rise when a command is accepted"


def run_gather(config: AcceleratorConfig, dram: np.ndarray, commands: list[dict[str, int]], *,
               seed: int, stall: float, latency: tuple[int, int], row_stall: float,
               error_at: set[int] | None = None, clear_between: bool = False,
               overlap: bool = False, engine: str = "pipelined") -> EngineRun:
    """Run ``commands`` one after another, each once ``busy`` has fallen, or with ``overlap``
    back to back, each as soon as the engine takes it; the row consumer holds ``ready`` low with
    probability ``row_stall``. Each command's rows must end with the one flagged ``last`` (that
    is how they are told apart with ``overlap``). A row that arrives after busy fell is counted
    for the next command (and fails the row check); after the last one the engine must stay
    silent. With ``overlap``, ``errors`` holds ``error`` once, at the end. ``engine`` names the
    reader (``ENGINES``)."""
    dut = ENGINES[engine](config)
    memory = AXIMemory(bytearray(dram.tobytes()), config.dma_bytes, seed=seed, stall=stall,
                       latency=latency, error_at=error_at, max_burst=config.dma_max_burst)
    out = EngineRun(memory)
    taken: list[tuple[int, bytes, int, int, int]] = []
    rng = random.Random(seed)

    async def ar_monitor(ctx):
        async for _, _, valid, ready, addr, length in ctx.tick().sample(
                dut.ar.valid, dut.ar.ready, dut.ar.payload.addr, dut.ar.payload.len):
            if valid and ready:
                out.read_bursts.append((addr, length + 1))

    async def consumer(ctx):
        while True:
            ready = rng.random() >= row_stall
            ctx.set(dut.rows.ready, ready)
            _, _, valid, payload = await ctx.tick().sample(dut.rows.valid, dut.rows.payload)
            if valid and ready:
                data = payload.data.as_value().value.to_bytes(dut.row_bytes, "little")
                taken.append((payload.row, data, payload.mask, payload.last, payload.resp))

    def split(rows: list[tuple[int, bytes, int, int, int]]) -> None:
        """Append the rows of commands, each ending with its ``last`` row, to ``out``."""
        start = 0
        for k, row in enumerate(rows):
            if row[3]:
                out.rows.append([r[:3] for r in rows[start:k + 1]])
                out.resps.append([r[4] for r in rows[start:k + 1]])
                start = k + 1
        assert start == len(rows), f"{len(rows) - start} rows after the last one flagged last"

    async def driver(ctx):
        if overlap:
            for cmd in commands:
                ctx.set(dut.cmd.valid, 1)
                ctx.set(dut.cmd.payload, cmd)
                (busy,) = await ctx.tick().sample(dut.busy).until(dut.cmd.ready)
                out.accepted_busy.append(bool(busy))
            ctx.set(dut.cmd.valid, 0)
            await ctx.tick().until(~dut.busy)
            split(taken)
            out.errors.append(ctx.get(dut.error))
        else:
            for cmd in commands:
                await _give(ctx, dut, cmd, clear_between)
                before = len(taken)
                await ctx.tick().until(~dut.busy)
                rows = taken[before:]
                assert rows and rows[-1][3], "a command's rows must end with one flagged last"
                split(rows)
                out.errors.append(ctx.get(dut.error))
        done = len(taken)
        await ctx.tick().repeat(32)
        assert len(taken) == done, f"{len(taken) - done} rows came after busy fell"

    simulate(dut, driver, memory=memory, background=(consumer, ar_monitor))
    return out


def check_read_blocks(config: AcceleratorConfig, run: EngineRun) -> None:
    """Every read burst lies in one aligned block of ``min(dma_max_burst, 4096 / beat)`` beats
    (the GatherReader cuts its bursts there; it is what keeps them within the burst limit and
    4 KiB)."""
    block = min(config.dma_max_burst, 4096 // config.dma_bytes)
    for addr, beats in run.read_bursts:
        first = addr // config.dma_bytes
        assert first // block == (first + beats - 1) // block, \
            f"read burst at {addr:#x} of {beats} beats crosses a {block}-beat block"


def check_loads(config: AcceleratorConfig, dram: np.ndarray, loads: list[tuple[Destination, dict]],
                run: EngineRun) -> None:
    """Every command's rows are its destination rows in order, each naming exactly the LOAD's
    elements; applied to empty memories they give the golden model's state after the LOADs."""
    state = empty_state(config)
    last_writer: dict[tuple[str, int], int] = {}
    for k, ((dst, f), rows) in enumerate(zip(loads, run.rows, strict=True)):
        nrows = f["rows_outer"] * f["rows_inner"]
        width = f["segs"] * f["seg_len"]
        want_rows = list(range(f["dst_addr"], f["dst_addr"] + nrows))
        assert [r for r, _, _ in rows] == want_rows, \
            f"LOAD {k} {f}: rows {[r for r, _, _ in rows]}, expected {want_rows}"
        want_mask = ((1 << (width * dst.elem_bytes)) - 1) << (f["dst_col"] * dst.elem_bytes)
        memory = "acc" if dst.name == "widen" else dst.name
        for row, data, mask in rows:
            assert mask == want_mask, f"LOAD {k} {f}: row {row} mask {mask:#x}, expected {want_mask:#x}"
            apply_row(state, dst, row, data, mask)
            last_writer[(memory, row)] = k
    program = [Instruction("LOAD", **f) for _, f in loads] + [Instruction("FINISH")]
    golden = run_golden(config, program, dram).state
    assert golden is not None
    for memory in ("spad", "acc", "table"):
        got, want = getattr(state, memory), getattr(golden, memory)
        differ = np.argwhere(got != want)
        if differ.size:
            row, elem = (int(i) for i in differ[0][:2])
            k = last_writer.get((memory, row))
            raise AssertionError(
                f"{memory} row {row} element {elem}: engine {got[row, elem].tolist()}, golden "
                f"{want[row, elem].tolist()}; last written by LOAD {k} "
                f"{loads[k][1] if k is not None else ''}")


#: Every (destination, feature) pair a LOAD can have.
PAIRS = [(d, ft) for ft in FEATURES for d in DESTINATIONS
         if not (d == "table" and ft in BOUNDED_FEATURES)]


def _pairs(rng: random.Random, share: int, shares: int, extra: int) -> list[tuple[str, str]]:
    """Share ``share`` of ``shares`` of every (destination, feature) pair, so that the shares
    together cover each pair once, plus ``extra`` random pairs, in random order."""
    pairs = list(PAIRS)
    random.Random(SEED).shuffle(pairs)          # the same partition for every share
    chosen = pairs[share::shares] + [rng.choice(PAIRS) for _ in range(extra)]
    rng.shuffle(chosen)
    return chosen


# -- GatherReader ---------------------------------------------------------------------------------

#: Per configuration: AXI stall probability, read latency range (cycles), row consumer stall.
GATHER_TRAFFIC = {
    "bus32_int8": (0.3, (2, 12), 0.3),
    "bus64_int16": (0.1, (2, 8), 0.1),
    "bus128_acc16": (0.0, (2, 4), 0.0),
}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", CONFIGS)
def test_gather_loads_match_golden(name: str, engine: str) -> None:
    """A third of the (destination, feature) pairs on each configuration, so that the three
    together cover all of them, plus random pairs and two full-width table LOADs: one across the
    entry region's 4 KiB boundary and one longer than a dma_max_burst burst (96-byte rows on
    bus64_int16). The pipelined engine reaches the burst limits; the serial one reads single
    beats, one at a time."""
    config = CONFIGS[name]
    share = list(CONFIGS).index(name)
    rng = random.Random(f"{SEED}-{name}")
    dram = make_dram(np.random.default_rng(rng.randrange(1 << 30)))
    loads = []
    for dst_name, feature in _pairs(rng, share, len(CONFIGS), extra=8):
        dst = destination(config, dst_name)
        loads.append((dst, random_load(rng, config, dst, feature)))
    table = destination(config, "table")
    for first in (3 * 4096 - 12 * rng.randint(1, config.cols - 1), 3 * 4096 + 12 * rng.randint(3, 90)):
        f = random_load(rng, config, table, "tile")
        f.update(dram_addr=first, dst_addr=rng.randint(0, table.rows - 2), dst_col=0, segs=1,
                 seg_len=config.cols, rows_outer=1, rows_inner=2, inner_dy=1, pitch_y=12 * config.cols)
        loads.append((table, f))
    stall, latency, row_stall = GATHER_TRAFFIC[name]
    run = run_gather(config, dram, [load_command(f, dst) for dst, f in loads],
                     seed=rng.randrange(1 << 30), stall=stall, latency=latency, row_stall=row_stall,
                     engine=engine)
    check_loads(config, dram, loads, run)
    check_read_blocks(config, run)
    assert run.errors == [RESP_OKAY] * len(loads), f"error responses {run.errors}"
    want_beats = sum(beats_fetched(f, dst, config.dma_bytes) for dst, f in loads)
    assert run.memory.read_beats == want_beats, \
        f"{run.memory.read_beats} beats read, expected {want_beats} (each shared beat once)"
    if engine == "serial":
        assert (run.memory.max_outstanding, run.memory.longest_burst) == (1, 1), \
            f"serial reader: {run.memory.max_outstanding} bursts in flight, " \
            f"longest {run.memory.longest_burst}"
        return
    # the limits were reached, not only respected (AXIMemory asserts the upper bounds)
    assert run.memory.max_outstanding == config.dma_outstanding, \
        f"{run.memory.max_outstanding} bursts in flight at most, limit {config.dma_outstanding}"
    if 12 * config.cols + config.dma_bytes - 1 > config.dma_max_burst * config.dma_bytes:
        assert run.memory.longest_burst == config.dma_max_burst, \
            f"longest burst {run.memory.longest_burst} beats, limit {config.dma_max_burst}"


@pytest.mark.parametrize("engine", ENGINES)
def test_gather_back_to_back_rows_without_stalls(engine: str) -> None:
    """1xN and Nx1 tiles, a single element, and widest rows with a memory that never stalls and
    a consumer that is always ready (the engine's full-speed path)."""
    config = CONFIGS["bus64_int16"]
    rng = random.Random(f"{SEED}-fast")
    dram = make_dram(np.random.default_rng(rng.randrange(1 << 30)))
    spad, acc = destination(config, "spad"), destination(config, "acc")
    loads = []
    for dst, rows, elems in ((spad, 1, spad.row_elems), (spad, spad.rows, 1), (acc, 1, 1),
                             (acc, acc.rows, acc.row_elems), (spad, 16, spad.row_elems)):
        f = random_load(rng, config, dst, "tile")
        f.update(dst_addr=0, dst_col=0, rows_outer=1, rows_inner=rows, segs=1, seg_len=elems,
                 pitch_y=elems * dst.elem_bytes, dram_addr=rng.randrange(0, 4096))
        loads.append((dst, f))
    run = run_gather(config, dram, [load_command(f, dst) for dst, f in loads], seed=rng.randrange(1 << 30),
                     stall=0.0, latency=(0, 0), row_stall=0.0, engine=engine)
    check_loads(config, dram, loads, run)


def setup_cycles(f: dict) -> int:
    """Cycles the GatherReader's setup takes for LOAD fields ``f`` (docs in hw/dma.py): one to
    load, then per coordinate vector (element, segment, start, outer, inner) the most multiplier
    bits any of its three multipliers needs, at least one (the two cycles of sizes and flags that
    follow the segment vector overlap the last three vectors)."""
    def bits(d: int) -> int:           # shift-and-add steps until 0 or -1 is left, the -1 included
        return d.bit_length() if d >= 0 else (~d).bit_length() + 1
    vectors = [(f.get("y0", 0), f.get("x0", 0), 0)] + [
        tuple(f.get(f"{level}_{axis}", 0) for axis in ("dy", "dx", "dc"))
        for level in ("outer", "inner", "seg", "elem")]
    return 1 + sum(max(1, *(bits(d) for d in vector)) for vector in vectors)


def test_setup_cycles_of_small_and_extreme_steps() -> None:
    # a guard for the helper itself: every step 0 is one cycle per vector; -1 is one step; the
    # extremes of the 16- and 8-bit fields
    assert setup_cycles({}) == 6
    assert setup_cycles({"y0": -1, "elem_dc": 1}) == 6
    extremes = {"y0": -32768, "x0": 32767, "outer_dy": -128, "seg_dc": 127}
    assert setup_cycles(extremes) == 1 + 16 + 8 + 1 + 7 + 1


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", CONFIGS)
def test_gather_commands_back_to_back(name: str, engine: str) -> None:
    """Commands given as fast as the engine takes them: a command is set up while the one before
    it is generated, so it is accepted while earlier ones are still busy whenever the one before
    has at least as many rows as its setup takes cycles (the generator emits at most a run per
    cycle, a run per row at least); the rows are still every command's rows in order, ending with
    the one flagged last, with each shared beat read once."""
    config = CONFIGS[name]
    rng = random.Random(f"{SEED}-overlap-{name}")
    dram = make_dram(np.random.default_rng(rng.randrange(1 << 30)))
    loads = []
    for dst_name, feature in _pairs(rng, 0, 3, extra=4)[:12]:
        dst = destination(config, dst_name)
        loads.append((dst, random_load(rng, config, dst, feature)))
    spad = destination(config, "spad")
    for _ in range(3):        # short plain tiles, one or two rows (the LOADs of a weight tile)
        f = random_load(rng, config, spad, "tile")
        f.update(rows_outer=1, rows_inner=rng.randint(1, 2))
        loads.append((spad, f))
    rng.shuffle(loads)
    run = run_gather(config, dram, [load_command(f, dst) for dst, f in loads],
                     seed=rng.randrange(1 << 30), stall=0.1, latency=(1, 8), row_stall=0.1,
                     overlap=True, engine=engine)
    check_loads(config, dram, loads, run)
    if engine == "pipelined":
        rows = [f["rows_outer"] * f["rows_inner"] for _, f in loads]
        long_before = [k for k in range(1, len(loads)) if rows[k - 1] >= setup_cycles(loads[k][1])]
        assert long_before, "no command follows one long enough to cover its setup"
        late = [k for k in long_before if not run.accepted_busy[k]]
        assert not late, f"commands {late} were taken only after the engine had gone idle"
    else:       # the serial reader takes a command only when idle
        assert not any(run.accepted_busy), "the serial reader took a command while busy"
    assert run.errors == [RESP_OKAY]
    want_beats = sum(beats_fetched(f, dst, config.dma_bytes) for dst, f in loads)
    assert run.memory.read_beats == want_beats, f"{run.memory.read_beats} beats read, expected {want_beats}"


def _extreme_loads() -> list[dict[str, int]]:
    """LOADs whose coordinate steps multiply the extremes of the fields (16-bit y0/x0, 8-bit
    steps of -128 and 127, 24-bit pitches) into addresses that still land in DRAM: the setup's
    shift-and-add products, their signs and their sums modulo 2**32."""
    zero = {name: 0 for name, _ in LoadCommandLayout() if name != "elem_bytes"}
    plain = dict(zero, rows_outer=2, rows_inner=2, segs=2, seg_len=2, elem_dc=1)
    return [
        # y0 * pitch_y + x0 * pitch_x = -32768 + 32767: the extremes of both signs cancel
        dict(plain, dram_addr=100, y0=-32768, x0=32767, pitch_y=1, pitch_x=1, pitch_c=2,
             outer_dy=-128, outer_dx=127, inner_dy=127, inner_dx=-128,
             seg_dy=-128, seg_dx=-128, seg_dc=127),
        # 24-bit pitches: every product is large, every sum small
        dict(plain, dram_addr=400, y0=2, x0=-2, pitch_y=(1 << 24) - 1, pitch_x=(1 << 24) - 2,
             pitch_c=3, outer_dy=-100, outer_dx=100, inner_dy=127, inner_dx=-127, seg_dc=2),
        # a bounded walk whose start address lies below 0 (modulo 2**32) and whose last outer
        # row comes into the image: rows -300, -200, -100 are padding
        dict(plain, dram_addr=60, bounded=1, height=2, width=40, y0=-300, x0=0, pitch_y=40,
             pitch_x=1, pitch_c=1, pad_value=-128, rows_outer=4, rows_inner=1, outer_dy=100,
             segs=1, seg_len=4, elem_dc=0, elem_dx=1),
        # -1 in every multiplier (the sign bit alone) and odd pitches
        dict(plain, dram_addr=9000, y0=-1, x0=-1, pitch_y=999, pitch_x=37, pitch_c=5,
             outer_dy=-1, outer_dx=-1, outer_dc=-1, inner_dy=-1, inner_dx=-1, inner_dc=-1,
             seg_dy=-1, seg_dx=-1, seg_dc=-1, elem_dy=-1, elem_dx=-1, elem_dc=-1),
    ]


@pytest.mark.parametrize("engine", ENGINES)
def test_gather_extreme_coordinates_and_steps(engine: str) -> None:
    """Extreme coordinates, steps and pitches (the setup's multiplications) match the golden
    model, given one at a time and back to back."""
    config = CONFIGS["bus32_int8"]
    dram = make_dram(np.random.default_rng(SEED))
    spad = destination(config, "spad")
    loads = [(spad, dict(f, dst_addr=4 * k)) for k, f in enumerate(_extreme_loads())]
    for overlap in (False, True):
        run = run_gather(config, dram, [load_command(f, dst) for dst, f in loads], seed=SEED,
                         stall=0.1, latency=(0, 3), row_stall=0.1, overlap=overlap, engine=engine)
        check_loads(config, dram, loads, run)


@pytest.mark.parametrize("engine", ENGINES)
def test_gather_row_index_wraps_at_the_widest_memory(engine: str) -> None:
    """Rows past every destination memory are not checked in hardware (docs/arch-system.md): the
    reader keeps a row index as wide as the widest memory's row address, so a LOAD that runs past
    it wraps to row 0 (each memory then takes its own low bits), with the right bytes."""
    config = CONFIGS["bus32_int8"]
    bits = max(config.spad_addr_bits, config.acc_addr_bits, config.requant_addr_bits)
    spad = destination(config, "spad")
    dram = make_dram(np.random.default_rng(SEED))
    f = random_load(random.Random(SEED), config, spad, "tile")
    f.update(dst_addr=(1 << bits) - 1, dst_col=0, rows_outer=1, rows_inner=3, inner_dy=1,
             segs=1, seg_len=spad.row_elems, pitch_y=spad.row_elems, elem_dc=1, dram_addr=0x123)
    run = run_gather(config, dram, [load_command(f, spad)], seed=SEED, stall=0.0, latency=(1, 1),
                     row_stall=0.0, engine=engine)
    assert [row for row, _, _ in run.rows[0]] == [(1 << bits) - 1, 0, 1]
    for k, (_, data, mask) in enumerate(run.rows[0]):
        start = 0x123 + k * spad.row_elems
        assert data[:spad.row_elems] == dram[start:start + spad.row_elems].tobytes(), f"row {k}"
        assert mask == (1 << spad.row_elems) - 1, f"row {k}: mask {mask:#x}"


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("clear_between", [False, True])
def test_gather_slverr_sets_error_and_finishes(clear_between: bool, engine: str) -> None:
    """A read answered SLVERR sets ``error`` (sticky until ``clear_error``); the LOAD still
    delivers all its rows and busy falls."""
    config = CONFIGS["bus32_int8"]
    rng = random.Random(f"{SEED}-slverr")
    dram = make_dram(np.random.default_rng(rng.randrange(1 << 30)))
    spad = destination(config, "spad")
    loads = [(spad, random_load(rng, config, spad, feature)) for feature in ("tile", "transpose", "tile")]
    touched = [beats_read(f, dst, config.dma_bytes) for dst, f in loads]
    bad = min(touched[1])                       # a beat LOAD 1 reads
    run = run_gather(config, dram, [load_command(f, dst) for dst, f in loads],
                     seed=rng.randrange(1 << 30), stall=0.2, latency=(0, 4), row_stall=0.2,
                     error_at={bad}, clear_between=clear_between, engine=engine)
    check_loads(config, dram, loads, run)       # the model still returns the data with SLVERR
    want = expected_errors(touched, bad, clear_between)
    assert run.errors == want, f"error after each LOAD {run.errors}, expected {want}"
    # rows flagged SLVERR read the refused beat, and every LOAD that reads it flags one
    for k, ((dst, f), resps) in enumerate(zip(loads, run.resps, strict=True)):
        rows = [set((b // config.dma_bytes * config.dma_bytes).tolist())
                for b in _element_bytes(f, dst)]
        flagged = [i for i, resp in enumerate(resps) if resp != RESP_OKAY]
        assert all(resps[i] == RESP_SLVERR and bad in rows[i] for i in flagged), \
            f"LOAD {k}: rows {flagged} flagged {[resps[i] for i in flagged]}, beat {bad:#x} is in rows " \
            f"{[i for i, beats in enumerate(rows) if bad in beats]}"
        assert bool(flagged) == (bad in touched[k]), f"LOAD {k}: rows flagged {flagged}"


@pytest.mark.parametrize("engine", ENGINES)
def test_gather_config_must_be_an_accelerator_config(engine: str) -> None:
    with pytest.raises(TypeError, match=r"^config must be an AcceleratorConfig, not 'bus32'$"):
        construct_rejected(lambda: ENGINES[engine]("bus32"))


# -- ScatterWriter --------------------------------------------------------------------------------

SCATTER_CONFIGS = {
    **CONFIGS,
    # 64-byte raw pixels: with an unaligned start, longer than one 16-beat burst
    "bus32_cols16": AcceleratorConfig(rows=4, cols=16, scratchpad_bytes=512, accumulator_bytes=2048,
                                      dma_data_bits=32, dma_max_burst=16, dma_outstanding=2),
}
#: Output layouts: channels innermost (pitch_c = element size), channel planes (NCHW-like), and
#: channels with gaps between them.
STORE_LAYOUTS = ("nhwc", "nchw", "strided")


@dataclass
class Store:
    """One STORE with the program that feeds it and the pixel bytes the golden model wrote."""

    fields: dict[str, int]
    program: list[Instruction]
    elem_bytes: int
    pixels: list[bytes] = field(default_factory=list)

    def command(self) -> dict[str, int]:
        names = [name for name, _ in StoreCommandLayout()]
        return {name: self.elem_bytes if name == "elem_bytes" else self.fields[name] for name in names}

    def element_addresses(self) -> list[list[int]]:
        """Byte address of each output element, per pixel in (oy, ox) order."""
        f = self.fields
        return [[f["dram_addr"] + oy * f["pitch_y"] + ox * f["pitch_x"] + c * f["pitch_c"]
                 for c in range(f["n"])] for oy in range(f["out_h"]) for ox in range(f["out_w"])]


def random_store(rng: random.Random, config: AcceleratorConfig, raw: bool, layout: str, *,
                 full: bool = False) -> Store:
    """A STORE of random geometry below the table region (often across a 4 KiB boundary), fed
    by a LOAD of random accumulator values; int outputs get a random table row and CONFIG.
    ``full``: all channels, at an unaligned address away from 4 KiB boundaries."""
    esz = config.acc_bytes if raw else config.input_bytes
    n = config.cols if full else rng.choice([1, config.cols, rng.randint(1, config.cols)])
    out_h, out_w = rng.choice([(1, rng.randint(1, 4)), (rng.randint(1, 4), 1),
                               (rng.randint(1, 4), rng.randint(1, 4))])
    gap = rng.choice([0, 0, 1, 3, esz])
    if layout == "nhwc":
        pc = esz
        px = n * esz + gap
        py = out_w * px + rng.choice([0, 5])
    elif layout == "nchw":
        px = esz
        py = out_w * esz + gap
        pc = out_h * py + rng.choice([0, 2])
    else:
        pc = esz + rng.randint(1, 3)
        px = n * pc + gap
        py = out_w * px + gap
    span = (out_h - 1) * py + (out_w - 1) * px + (n - 1) * pc + esz
    if full:
        addr = 4096 + 64 * rng.randint(0, 16) + rng.randint(1, config.dma_bytes - 1)
    elif rng.random() < 0.5:
        addr = rng.choice([4096, 8192]) - rng.randint(1, min(span, 80))
    else:
        addr = rng.randrange(0, TABLE_BASE - span)
    f = dict(n=n, in_h=out_h, in_w=out_w, out_h=out_h, out_w=out_w, dram_addr=addr, pitch_y=py,
             pitch_x=px, pitch_c=pc, out_type=int(raw))

    pixels = out_h * out_w
    acc_addr = rng.randint(0, config.acc_rows - pixels)
    source = rng.randrange(0, TABLE_BASE - pixels * n * config.acc_bytes)
    program = []
    if not raw:
        f["qrow"] = rng.randrange(config.requant_table_rows)
        program.append(Instruction("LOAD", dst="table", dst_addr=f["qrow"], pitch_c=12,
                                   dram_addr=TABLE_BASE + 12 * rng.randrange(TABLE_ENTRIES - config.cols),
                                   rows_outer=1, rows_inner=1, segs=1, seg_len=config.cols, elem_dc=1))
        lo, hi = config.output_range
        act_lo, act_hi = sorted(rng.randint(lo, hi) for _ in range(2))
        program.append(Instruction("CONFIG", zp_out=rng.choice([lo, hi, 0, rng.randint(lo, hi)]),
                                   act_lo=act_lo, act_hi=act_hi))
        f["act"] = rng.randrange(4)
    program += [
        tile_load("acc", acc_addr, source, pixels, n, row_bytes=n * config.acc_bytes,
                  elem_bytes=config.acc_bytes, push_next=1),
        Instruction("SYNC", queue="compute", pop_prev=1, push_next=1),
        Instruction("STORE", acc_addr=acc_addr, pop_prev=1, **f),
        Instruction("FINISH"),
    ]
    return Store(f, program, esz)


def golden_stores(config: AcceleratorConfig, dram: np.ndarray, stores: list[Store]) -> np.ndarray:
    """Run each store's program in turn on the golden model, keep the bytes it wrote per pixel;
    return the final DRAM image."""
    for store in stores:
        dram = run_golden(config, store.program, dram).dram
        store.pixels = [b"".join(dram[a:a + store.elem_bytes].tobytes() for a in pixel)
                        for pixel in store.element_addresses()]
    return dram


def run_scatter(config: AcceleratorConfig, dram: np.ndarray, stores: list[Store], *, seed: int,
                stall: float, pixel_gap: float,
                error_at: set[int] | None = None, clear_between: bool = False,
                engine: str = "pipelined") -> EngineRun:
    """Give each store's command and pixels (the bytes past a pixel's elements are junk that must
    not be written), then wait until busy falls, when every write response must be in. ``engine``
    names the writer (``WRITERS``)."""
    dut = WRITERS[engine](config)
    memory = AXIMemory(bytearray(dram.tobytes()), config.dma_bytes, seed=seed, stall=stall,
                       error_at=error_at, max_burst=config.dma_max_burst)
    out = EngineRun(memory)
    rng = random.Random(seed)

    async def driver(ctx):
        for store in stores:
            await _give(ctx, dut, store.command(), clear_between)
            for pixel in store.pixels:
                while rng.random() < pixel_gap:
                    await ctx.tick()
                junk = rng.randbytes(dut.row_bytes - len(pixel))
                ctx.set(dut.pixels.valid, 1)
                ctx.set(dut.pixels.payload, list(pixel + junk))
                await ctx.tick().until(dut.pixels.ready)
                ctx.set(dut.pixels.valid, 0)
            await ctx.tick().until(~dut.busy)
            assert not memory.write_bursts and not memory.responses, \
                "busy fell before every write burst was answered"
            out.errors.append(ctx.get(dut.error))

    simulate(dut, driver, memory=memory, read=False, write=True)
    return out


def write_bursts(store: Store, beat_bytes: int, max_beats: int) -> list[tuple[int, int]]:
    """(address, beats) of the bursts that write ``store``: its bytes in order, a new beat when
    the beat changes, a new burst when a beat does not follow the previous one or the burst has
    ``max_beats`` beats or reaches a 4 KiB boundary."""
    order = np.array([a + b for pixel in store.element_addresses() for a in pixel
                      for b in range(store.elem_bytes)], np.int64)
    bursts: list[list[int]] = []
    for beat in beat_changes(order, beat_bytes).tolist():
        if bursts:
            start, length = bursts[-1]
            cap = min(max_beats, (4096 - start % 4096) // beat_bytes)
            if beat == start + length * beat_bytes and length < cap:
                bursts[-1][1] += 1
                continue
        bursts.append([beat, 1])
    return [(a, n) for a, n in bursts]


def check_dram(got: bytearray, want: np.ndarray, stores: list[Store]) -> None:
    differ = np.flatnonzero(np.frombuffer(bytes(got), np.uint8) != want)
    if differ.size:
        addr = int(differ[0])
        owners = [k for k, s in enumerate(stores)
                  if any(a <= addr < a + s.elem_bytes for p in s.element_addresses() for a in p)]
        raise AssertionError(f"DRAM byte {addr:#x}: engine {got[addr]:#04x}, golden {int(want[addr]):#04x} "
                             f"({differ.size} bytes differ); an output byte of STOREs {owners} "
                             f"{[stores[k].fields for k in owners]}" if owners else
                             f"DRAM byte {addr:#x}: engine {got[addr]:#04x}, golden "
                             f"{int(want[addr]):#04x}, a byte no STORE writes ({differ.size} differ)")


#: Per configuration: AXI stall probability (AW, W and B channels), pixel producer gap probability.
SCATTER_TRAFFIC = {name: (0.3 if i % 2 else 0.0, 0.3 if i % 2 == 0 else 0.0)
                   for i, name in enumerate(SCATTER_CONFIGS)}


@pytest.mark.parametrize("engine", WRITERS)
@pytest.mark.parametrize("name", SCATTER_CONFIGS)
def test_scatter_stores_match_golden(name: str, engine: str) -> None:
    """Raw and int outputs in every layout; the DRAM image must equal the golden model's. The
    beats are the same on both engines; the pipelined one merges them into bursts, the serial
    one sends each alone."""
    config = SCATTER_CONFIGS[name]
    rng = random.Random(f"{SEED}-scatter-{name}")
    dram = make_dram(np.random.default_rng(rng.randrange(1 << 30)))
    stores = [random_store(rng, config, raw, layout) for raw in (True, False) for layout in STORE_LAYOUTS]
    stores.append(random_store(rng, config, True, "nhwc", full=True))
    rng.shuffle(stores)
    want = golden_stores(config, dram, stores)
    stall, gap = SCATTER_TRAFFIC[name]
    run = run_scatter(config, dram, stores, seed=rng.randrange(1 << 30), stall=stall, pixel_gap=gap,
                      engine=engine)
    check_dram(run.memory.mem, want, stores)
    assert run.errors == [RESP_OKAY] * len(stores), f"error responses {run.errors}"
    longest = write_burst_beats(config) if engine == "pipelined" else 1
    bursts = [b for store in stores for b in write_bursts(store, config.dma_bytes, longest)]
    assert (run.memory.write_burst_count, run.memory.write_beats) == \
        (len(bursts), sum(n for _, n in bursts)), \
        f"{run.memory.write_burst_count} bursts of {run.memory.write_beats} beats written, " \
        f"expected {len(bursts)} of {sum(n for _, n in bursts)}"
    if engine == "pipelined" and \
            config.cols * config.acc_bytes + config.dma_bytes - 1 > config.dma_max_burst * config.dma_bytes:
        assert run.memory.longest_burst == config.dma_max_burst, \
            f"longest burst {run.memory.longest_burst} beats, limit {config.dma_max_burst}"


@pytest.mark.parametrize("engine", WRITERS)
@pytest.mark.parametrize("clear_between", [False, True])
def test_scatter_slverr_sets_error_and_finishes(clear_between: bool, engine: str) -> None:
    """A write answered SLVERR sets ``error`` (sticky until ``clear_error``); the STORE still
    sends all its bursts and busy falls once every response is in."""
    config = CONFIGS["bus64_int16"]
    rng = random.Random(f"{SEED}-scatter-slverr")
    dram = make_dram(np.random.default_rng(rng.randrange(1 << 30)))
    stores = [random_store(rng, config, True, "nhwc"), random_store(rng, config, False, "nchw")]
    want = golden_stores(config, dram, stores)
    beat = config.dma_bytes
    touched = [{a // beat * beat for pixel in store.element_addresses() for first in pixel
                for a in range(first, first + store.elem_bytes)} for store in stores]
    bad = min(touched[0])                       # a beat STORE 0 writes
    run = run_scatter(config, dram, stores, seed=rng.randrange(1 << 30), stall=0.2, pixel_gap=0.2,
                      error_at={bad}, clear_between=clear_between, engine=engine)
    want_errors = expected_errors(touched, bad, clear_between)
    assert run.errors == want_errors, f"error after each STORE {run.errors}, expected {want_errors}"
    # the refused beat was not written; every other byte is as the golden model has it
    got = np.frombuffer(bytes(run.memory.mem), np.uint8).copy()
    got[bad:bad + config.dma_bytes] = want[bad:bad + config.dma_bytes]
    check_dram(bytearray(got.tobytes()), want, stores)


@pytest.mark.parametrize("engine", WRITERS)
def test_scatter_config_must_be_an_accelerator_config(engine: str) -> None:
    with pytest.raises(TypeError, match=r"^config must be an AcceleratorConfig, not None$"):
        construct_rejected(lambda: WRITERS[engine](None))


# -- SerialGatherReader ---------------------------------------------------------------------------

@pytest.mark.parametrize("latency", [0, 3])
def test_serial_cycles_are_the_golden_estimate(latency: int) -> None:
    """With a memory answering every read ``latency`` cycles after its address and a consumer that
    is always ready, a LOAD on the serial reader takes exactly ``serial_load_cycles`` from the
    cycle its command is offered to the cycle its last row is taken (the golden model's
    estimate for ``gather_engine = "serial"``): padded, im2col and table LOADs, negative steps."""
    config = CONFIGS["bus32_int8"]
    rng = random.Random(f"{SEED}-serial-cycles")
    dram = make_dram(np.random.default_rng(rng.randrange(1 << 30)))
    for dst_name, feature in (("spad", "im2col"), ("spad", "padded"), ("acc", "negative"),
                              ("widen", "taps"), ("table", "tile"), ("spad", "transpose")):
        dst = destination(config, dst_name)
        f = random_load(rng, config, dst, feature)
        dut = SerialGatherReader(config)
        memory = AXIMemory(bytearray(dram.tobytes()), config.dma_bytes, seed=SEED,
                           latency=(latency, latency))
        took: list[int] = []

        async def driver(ctx, dut=dut, f=f, dst=dst, took=took):
            ctx.set(dut.rows.ready, 1)
            ctx.set(dut.cmd.payload, load_command(f, dst))
            ctx.set(dut.cmd.valid, 1)
            cycles = 0
            while True:
                _, _, ready, valid, last = await ctx.tick().sample(
                    dut.cmd.ready, dut.rows.valid, dut.rows.payload.last)
                cycles += 1
                if ready:
                    ctx.set(dut.cmd.valid, 0)
                if valid and last:
                    took.append(cycles)
                    return

        simulate(dut, driver, memory=memory)
        want = serial_load_cycles(f, dst.elem_bytes, beats_fetched(f, dst, config.dma_bytes), latency)
        assert took == [want], f"{dst_name} {feature} {f}: {took[0]} cycles, estimate {want}"


def test_serial_writer_cycles() -> None:
    """With pixels always offered and a memory that never stalls (it takes a burst's data the
    cycle after its address and answers the cycle after that), a STORE on the serial writer
    takes ``serial_store_write_cycles`` from its command to busy falling, in every layout."""
    config = CONFIGS["bus32_int8"]
    rng = random.Random(f"{SEED}-serial-writer-cycles")
    dram = make_dram(np.random.default_rng(rng.randrange(1 << 30)))
    for raw in (True, False):
        for layout in STORE_LAYOUTS:
            store = random_store(rng, config, raw, layout)
            golden_stores(config, dram, [store])
            dut = SerialScatterWriter(config)
            memory = AXIMemory(bytearray(dram.tobytes()), config.dma_bytes, seed=SEED)
            took: list[int] = []

            async def driver(ctx, dut=dut, store=store, took=took):
                ctx.set(dut.cmd.payload, store.command())
                ctx.set(dut.cmd.valid, 1)
                await ctx.tick().until(dut.cmd.ready)
                ctx.set(dut.cmd.valid, 0)
                cycles = 1
                for pixel in store.pixels:
                    ctx.set(dut.pixels.payload, list(pixel.ljust(dut.row_bytes, b"\0")))
                    ctx.set(dut.pixels.valid, 1)
                    while True:
                        _, _, ready = await ctx.tick().sample(dut.pixels.ready)
                        cycles += 1
                        if ready:
                            break
                ctx.set(dut.pixels.valid, 0)
                while ctx.get(dut.busy):
                    await ctx.tick()
                    cycles += 1
                took.append(cycles)

            simulate(dut, driver, memory=memory, read=False, write=True)
            nbytes = len(store.pixels) * store.fields["n"] * store.elem_bytes
            beats = memory.write_beats
            assert beats == len(write_bursts(store, config.dma_bytes, 1))
            assert took == [serial_store_write_cycles(nbytes, beats)], \
                f"{layout} raw={raw}: {took[0]} cycles for {nbytes} bytes in {beats} beats"
