"""The DRAM traffic counters: the golden model's ``dram_read_bytes`` / ``dram_write_bytes`` equal
the accelerator's hardware counters (docs/isa.md, "Performance counters": bus bytes, every data
beat the DMA moves times the bus width).

The golden side is checked by hand on small transfers (aligned and unaligned rows, column gathers,
broadcasts, padding, 12-byte table entries, strided and residual STOREs). The RTL side runs on the
default configuration (one cached Verilator build) with the fast memory model: the example
programs of :mod:`systolic.sim.programs` (GEMMs with rows that are not whole beats, im2col
gathers from NHWC and NCHW images with padding, residual adds, pooling) and seeded random
programs of LOADs and STOREs whose address patterns take every path of the DMA engines (plain
rows, per-element gathers, backward and zero steps, bounded walks cut by the image edges, table
entries straddling beats, strided STOREs whose elements share beats, residual reads).
"""

from __future__ import annotations

import numpy as np
import pytest
from systolic.hw.config import AcceleratorConfig
from systolic.hw.isa import INSTR_BYTES, Instruction, Program
from systolic.sim.golden import run_golden
from systolic.sim.programs import Case, conv_case, gemm_case, pool_case, residual_case
from systolic.sim.rtl import RTLRunner

from .drawn import append_accepted

CONFIG = AcceleratorConfig()          # 8 x 8 WS, 8-byte bus
BEAT = CONFIG.dma_bytes
PROGRAM_ADDR = 0x1_0000               # where the random programs' words go
IMAGE_BYTES = 0x2_0000
DATA = 0x4000                         # random source data, bytes DATA .. DATA + 0x4000
TABLE = 0x8005                        # requantize entries (12 bytes each), not beat-aligned
TABLE_ENTRIES = 64
OUT = 0x9000                          # STORE outputs, bytes OUT .. OUT + 0x6000


def _golden(program: list[Instruction], dram: np.ndarray | None = None):
    return run_golden(CONFIG, program, np.zeros(1 << 16, np.uint8) if dram is None else dram)


def _load(**fields: int) -> Instruction:
    base = {"rows_outer": 1, "rows_inner": 1, "segs": 1, "seg_len": 1}
    return Instruction("LOAD", **{**base, **fields})


# -- the golden model's count, by hand ---------------------------------------------------------

def test_rows_back_to_back_cost_their_bytes_in_whole_beats() -> None:
    """8 rows of 5 bytes, 5 apart from byte 3: 40 bytes in bytes 3..42, beats 0..5. Rows that
    share a beat share it: 6 beats, not one or two per row."""
    load = _load(dst="spad", dram_addr=3, pitch_y=5, pitch_c=1, rows_inner=8, inner_dy=1,
                 seg_len=5, elem_dc=1)
    result = _golden([load, Instruction("FINISH")])
    assert result.dram_read_bytes == 6 * BEAT


def test_rows_far_apart_cost_their_beats_each() -> None:
    """4 rows of 6 bytes, 128 apart, from byte 5: each row spans bytes 5..10 of its own beats,
    2 beats each."""
    load = _load(dst="spad", dram_addr=5, pitch_y=128, pitch_c=1, rows_inner=4, inner_dy=1,
                 seg_len=6, elem_dc=1)
    assert _golden([load, Instruction("FINISH")]).dram_read_bytes == 4 * 2 * BEAT


def test_column_gather_costs_a_beat_per_element() -> None:
    """A transposing gather (one element per row of a 64-byte-pitch matrix): 8 beats for 8 bytes;
    a broadcast (step 0) of one element reads its beat once."""
    column = _load(dst="spad", dram_addr=0x107, pitch_y=64, seg_len=8, elem_dy=1)
    assert _golden([column, Instruction("FINISH")]).dram_read_bytes == 8 * BEAT
    broadcast = _load(dst="spad", dram_addr=0x107, pitch_c=1, rows_inner=16, seg_len=8)
    assert _golden([broadcast, Instruction("FINISH")]).dram_read_bytes == BEAT


def test_padding_moves_nothing() -> None:
    """x from -3 in a 4-wide image: elements 3..6 are inside (bytes 0x100..0x103, one beat),
    element 7 (x = 4) is past the right edge; a second row, below the image, is all padding."""
    load = _load(dst="spad", dram_addr=0x100, pitch_y=4, pitch_x=1, bounded=1, height=1, width=4,
                 x0=-3, rows_inner=2, inner_dy=1, seg_len=8, elem_dx=1)
    assert _golden([load, Instruction("FINISH")]).dram_read_bytes == BEAT


def test_table_entries_straddle_beats() -> None:
    """3 entries of 12 bytes from byte 0x205: bytes 0x205..0x228, beats 0x200..0x228 (6 beats)."""
    load = _load(dst="table", dram_addr=0x205, pitch_c=12, seg_len=3, elem_dc=1)
    assert _golden([load, Instruction("FINISH")]).dram_read_bytes == 6 * BEAT


def test_store_and_residual_count_whole_beats() -> None:
    """A raw STORE of 3 pixels x 2 channels (4 bytes each), channel pitch 5 (each element a run
    of its own), pixel pitch 0x30, from byte 0x1002: a pixel's elements are bytes 2..5 and 7..10
    of its beats, so the second starts in the beat the first ended in and shares it: 2 beats a
    pixel, 6 written. An int STORE with a residual of 3 pixels x 5 channels, pixel pitch 5, from
    byte 0x2003 (residual from 0x3003): output and residual are 15 bytes back to back, bytes
    3..17 of their beats: 3 beats each. The reads add the table (96 bytes) and the accumulator
    rows (3 x 32 bytes), aligned."""
    acc = _load(dst="acc", dram_addr=0x400, pitch_c=4, rows_inner=3, inner_dc=8, seg_len=8,
                elem_dc=1, push_next=1)
    table = _load(dst="table", dram_addr=0x800, pitch_c=12, seg_len=8, elem_dc=1)
    program = [
        table, acc,
        Instruction("SYNC", queue="compute", pop_prev=1, push_next=1),
        Instruction("STORE", out_type="raw", n=2, in_h=1, in_w=3, out_h=1, out_w=3,
                    dram_addr=0x1002, pitch_x=0x30, pitch_c=5, pop_prev=1),
        Instruction("STORE", n=5, in_h=1, in_w=3, out_h=1, out_w=3, dram_addr=0x2003,
                    pitch_x=5, pitch_c=1, residual=1, res_addr=0x3003),
        Instruction("FINISH"),
    ]
    result = _golden(program)
    assert result.dram_write_bytes == (6 + 3) * BEAT
    table_beats = 96 // BEAT
    assert result.dram_read_bytes == (table_beats + 3 * 32 // BEAT + 3) * BEAT


# -- golden against the RTL --------------------------------------------------------------------

def _random_program(seed: int) -> tuple[Program, np.ndarray]:
    """LOADs of random address patterns into the scratchpad, the accumulator and the table, then
    STOREs of random geometry (raw and int, strided, with and without residual) of the loaded
    accumulator rows. Every instruction is checked on the golden model as it is drawn; one that
    breaks a rule (an address outside the data, a row past its memory) is drawn again."""
    rng = np.random.default_rng(seed)
    c = CONFIG
    dram = np.zeros(IMAGE_BYTES, np.uint8)
    dram[DATA:DATA + 0x4000] = rng.integers(0, 256, 0x4000, dtype=np.uint8)
    entries = np.zeros((TABLE_ENTRIES, 3), "<i4")
    entries[:, 0] = rng.integers(-1000, 1000, TABLE_ENTRIES)
    entries[:, 1] = rng.integers(1 << 20, 1 << 30, TABLE_ENTRIES)
    entries[:, 2] = rng.integers(20, 40, TABLE_ENTRIES)
    dram[TABLE:TABLE + entries.nbytes] = np.frombuffer(entries.tobytes(), np.uint8)

    program: list[Instruction] = [
        Instruction("CONFIG", zp_out=int(rng.integers(-8, 8)), act_lo=-100, act_hi=100,
                    res_zp=int(rng.integers(-8, 8)), res_mult=int(rng.integers(1 << 29, 1 << 30))),
        # every accumulator row a STORE may read holds data, every table row an entry
        _load(dst="table", dram_addr=TABLE, pitch_c=12, rows_inner=TABLE_ENTRIES // c.cols,
              inner_dc=c.cols, seg_len=c.cols, elem_dc=1),
        _load(dst="acc", dram_addr=DATA + 1, pitch_c=c.acc_bytes, rows_inner=64,
              inner_dc=c.cols, seg_len=c.cols, elem_dc=1),
    ]

    def draw_load() -> Instruction:
        kind = rng.choice(["spad", "spad", "spad", "acc", "widen", "table"])
        dst = "acc" if kind == "widen" else str(kind)
        esz = {"spad": 1, "acc": c.acc_bytes, "widen": c.input_bytes, "table": 12}[str(kind)]
        row_elems = c.spad_row_elems if dst == "spad" else c.cols
        segs = int(rng.integers(1, 4))
        seg_len = int(rng.integers(1, row_elems // segs + 1))
        col = int(rng.integers(0, row_elems - segs * seg_len + 1))
        step = lambda: int(rng.choice([-1, 0, 1, 1, 2, 3]))  # noqa: E731
        pitch = lambda: int(rng.choice([0, esz, esz, int(rng.integers(1, 40)),  # noqa: E731
                                        int(rng.integers(40, 300))]))
        fields = {
            "dst": dst, "widen": int(kind == "widen"), "dst_col": col,
            "dram_addr": (TABLE + 12 * int(rng.integers(0, 8)) if dst == "table"
                          else DATA + 0x1000 + int(rng.integers(0, 64))),
            "pitch_y": pitch(), "pitch_x": pitch(),
            "pitch_c": 12 if dst == "table" else int(rng.choice([esz, esz, pitch()])),
            "rows_outer": int(rng.integers(1, 4)), "rows_inner": int(rng.integers(1, 7)),
            "segs": segs, "seg_len": seg_len,
            "dst_addr": int(rng.integers(0, 200)) if dst != "table" else int(rng.integers(0, 40)),
        }
        for level in ("outer", "inner", "seg", "elem"):
            for axis in ("dy", "dx", "dc"):
                fields[f"{level}_{axis}"] = step()
        if dst == "table":      # table entries must be whole entries of the table region
            fields.update(pitch_y=0, pitch_x=0, outer_dy=0, outer_dx=0, inner_dy=0, inner_dx=0,
                          seg_dy=0, seg_dx=0, elem_dy=0, elem_dx=0, outer_dc=abs(fields["outer_dc"]),
                          inner_dc=abs(fields["inner_dc"]), seg_dc=abs(fields["seg_dc"]),
                          elem_dc=abs(fields["elem_dc"]))
        elif rng.random() < 0.5:
            lo, hi = c.input_range if kind != "acc" else (-1000, 1000)
            fields.update(bounded=1, height=int(rng.integers(1, 9)), width=int(rng.integers(1, 9)),
                          y0=int(rng.integers(-3, 4)), x0=int(rng.integers(-3, 4)),
                          pad_value=int(rng.integers(lo, hi + 1)))
        return _load(**fields)

    def draw_store(first: bool) -> Instruction:
        raw = rng.random() < 0.3
        esz = c.acc_bytes if raw else c.input_bytes
        n = int(rng.integers(1, c.cols + 1))
        out_h, out_w = int(rng.integers(1, 4)), int(rng.integers(1, 5))
        pitch_c = int(rng.choice([esz, esz, esz + int(rng.integers(1, 9))]))
        pitch_x = (n - 1) * pitch_c + esz + int(rng.choice([0, 0, int(rng.integers(1, 20))]))
        pitch_y = out_w * pitch_x + int(rng.choice([0, int(rng.integers(1, 50))]))
        fields = {"n": n, "in_h": out_h, "in_w": out_w, "out_h": out_h, "out_w": out_w,
                  "acc_addr": int(rng.integers(0, 64 - out_h * out_w + 1)),
                  "dram_addr": OUT + 0x100 * len(program) + int(rng.integers(0, 16)),
                  "pitch_y": pitch_y, "pitch_x": pitch_x, "pitch_c": pitch_c,
                  "pop_prev": int(first)}
        if raw:
            fields["out_type"] = "raw"
        else:
            fields.update(qrow=int(rng.integers(0, TABLE_ENTRIES // c.cols)),
                          act=str(rng.choice(["none", "relu", "clip"])))
            if rng.random() < 0.5:
                fields.update(residual=1, res_addr=DATA + 0x2000 + int(rng.integers(0, 64)))
        return Instruction("STORE", **fields)

    append_accepted(c, program, dram[:PROGRAM_ADDR], draw_load, 3 + 24 - len(program))
    program[-1] = program[-1].replace(push_next=1)
    program.append(Instruction("SYNC", queue="compute", pop_prev=1, push_next=1))
    first_store = len(program)
    append_accepted(c, program, dram[:PROGRAM_ADDR], lambda: draw_store(len(program) == first_store), 10)
    program.append(Instruction("FINISH"))
    assert len(program) * INSTR_BYTES <= IMAGE_BYTES - PROGRAM_ADDR
    return Program(tuple(program), c.hash), dram


def _example(case: Case) -> tuple[Program, np.ndarray, int]:
    return case.program, case.dram, case.program_addr


#: name -> builder of (program, DRAM image, program address)
CASES = {
    # rows of 24 and 20 bytes: partial beats shared by neighbouring rows
    "gemm 40x24x20": lambda: _example(gemm_case(CONFIG, 40, 24, 20, seed=2, act="relu")),
    "gemm 9x17x3 raw": lambda: _example(gemm_case(CONFIG, 9, 17, 3, seed=4, requant=False)),
    # im2col gathers from NHWC with padding, and per-element gathers from NCHW
    "conv nhwc": lambda: _example(conv_case(CONFIG, 6, 5, 3, 10, 3, 3, stride=2, pad=1, seed=3)),
    "conv nchw": lambda: _example(conv_case(CONFIG, 5, 7, 4, 6, 3, 2, pad=1, seed=5,
                                            layout="nchw")),
    "residual": lambda: _example(residual_case(CONFIG, 13, 11, 7, seed=6)),
    "avg pool": lambda: _example(pool_case(CONFIG, 7, 5, 11, pool="avg", kernel=3, stride=2,
                                           pad=1, seed=7)),
    **{f"random DMA patterns {seed}": (lambda seed=seed: (*_random_program(seed), PROGRAM_ADDR))
       for seed in range(3)},
}


@pytest.fixture(scope="module")
def runner() -> RTLRunner:
    return RTLRunner(CONFIG)


@pytest.mark.parametrize("name", list(CASES))
def test_dram_counters_equal_on_golden_and_rtl(runner: RTLRunner, name: str) -> None:
    program, dram, program_addr = CASES[name]()
    golden = run_golden(CONFIG, program, dram)
    rtl = runner.run(program, dram, prog_addr=program_addr, max_cycles=2_000_000)
    span = slice(0, program_addr)        # the data; the program words follow
    np.testing.assert_array_equal(rtl.dram[span], golden.dram[span])
    assert (rtl.dram_read_bytes, rtl.dram_write_bytes) == \
        (golden.dram_read_bytes, golden.dram_write_bytes)
    assert golden.dram_read_bytes % BEAT == 0 and golden.dram_write_bytes % BEAT == 0
