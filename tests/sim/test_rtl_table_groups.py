"""Requantize-table LOADs in groups (``requant_load_entries``, docs/isa.md LOAD) on the RTL: the
LOAD engines' rows are one group of entries wide, and the load unit places them in the table
row by the group the LOAD's ``dst_col`` names. Random table LOADs, each inside one aligned group
(any place in it, several segments, row loops, unaligned DRAM addresses), overwrite parts of a
table loaded whole, group by group; then int STOREs use every table row. The DRAM the
accelerator leaves must be the golden model's, byte for byte.

The configs are ``RTL_CONFIGS``' 4x4 ones (``ws4``: groups of 2, the pipelined LOAD engine;
``os4``: groups of 1, the serial one), whose Verilator builds the catalogue tests share.
"""

from __future__ import annotations

import numpy as np
import pytest
from systolic.hw.config import AcceleratorConfig
from systolic.hw.isa import Instruction, Program
from systolic.hw.requant_table import table_load_fields
from systolic.sim.catalogue import RTL_CONFIGS
from systolic.sim.golden import run_golden
from systolic.sim.rtl import RTLRunner

from .drawn import append_accepted

IMAGE_BYTES = 0x1_0000
PROGRAM_ADDR = 0xC000                 # the program's words go here
ACC_DATA = 0x1000                     # accumulator rows
TABLE = 0x2003                        # whole table rows (not beat-aligned)
PATCH = 0x3005                        # entries the random LOADs copy from
PATCH_ENTRIES = 64
OUT = 0x4000                          # STORE outputs
TABLE_ROWS = 8


def _entries(rng: np.random.Generator, count: int) -> np.ndarray:
    entries = np.zeros((count, 3), "<i4")
    entries[:, 0] = rng.integers(-3000, 3000, count)
    entries[:, 1] = rng.integers(1 << 20, 1 << 30, count)
    entries[:, 2] = rng.integers(24, 40, count)
    return entries


def _random_program(config: AcceleratorConfig, seed: int) -> tuple[Program, np.ndarray]:
    rng = np.random.default_rng(seed)
    c = config
    group = c.table_load_entries
    dram = np.zeros(IMAGE_BYTES, np.uint8)
    acc = rng.integers(-40000, 40000, (4 * TABLE_ROWS, c.cols)).astype("<i4")
    dram[ACC_DATA:ACC_DATA + acc.nbytes] = acc.view(np.uint8).reshape(-1)
    for addr, count in ((TABLE, TABLE_ROWS * c.cols), (PATCH, PATCH_ENTRIES)):
        entries = _entries(rng, count)
        dram[addr:addr + entries.nbytes] = entries.view(np.uint8).reshape(-1)

    program: list[Instruction] = [
        Instruction("CONFIG", zp_out=int(rng.integers(-8, 8)), act_lo=-128, act_hi=127),
        *(Instruction("LOAD", **f)
          for f in table_load_fields(c, dram_addr=TABLE, dst_addr=0, rows=TABLE_ROWS)),
        Instruction("LOAD", dst="acc", dram_addr=ACC_DATA, pitch_c=c.acc_bytes, rows_outer=1,
                    rows_inner=4 * TABLE_ROWS, inner_dc=c.cols, segs=1, seg_len=c.cols, elem_dc=1),
    ]

    def draw_load() -> Instruction:
        start = int(rng.integers(0, group))                 # place in the group
        segs = int(rng.integers(1, group - start + 1))
        seg_len = int(rng.integers(1, (group - start) // segs + 1))
        first = int(rng.integers(0, c.cols // group)) * group + start
        fields = {
            "dst": "table", "dst_addr": int(rng.integers(0, TABLE_ROWS)), "dst_col": first,
            "dram_addr": PATCH + 12 * int(rng.integers(0, 16)), "pitch_c": 12,
            "rows_outer": int(rng.integers(1, 3)), "rows_inner": int(rng.integers(1, 4)),
            "segs": segs, "seg_len": seg_len,
            "outer_dc": int(rng.integers(0, 9)), "inner_dc": int(rng.integers(0, 5)),
            "seg_dc": int(rng.integers(0, 4)), "elem_dc": int(rng.choice([0, 1, 1, 2])),
        }
        return Instruction("LOAD", **fields)

    append_accepted(c, program, dram[:PROGRAM_ADDR], draw_load, 16)
    program[-1] = program[-1].replace(push_next=1)
    program.append(Instruction("SYNC", queue="compute", pop_prev=1, push_next=1))
    for row in range(TABLE_ROWS):
        program.append(Instruction(
            "STORE", n=c.cols, in_h=2, in_w=2, out_h=2, out_w=2, acc_addr=4 * row, qrow=row,
            dram_addr=OUT + 0x40 * row, pitch_y=2 * c.cols, pitch_x=c.cols, pitch_c=1,
            pop_prev=int(row == 0)))
    program.append(Instruction("FINISH"))
    return Program(tuple(program), c.hash), dram


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ws4", "os4"])
def test_table_groups_match_golden(name: str) -> None:
    config = RTL_CONFIGS[name]
    assert config.table_load_entries < config.cols       # the case this file is about
    jobs = [_random_program(config, seed) for seed in range(3)]
    runner = RTLRunner(config, seed=1)
    for seed, (program, dram) in enumerate(jobs):
        golden = run_golden(config, program, dram)
        rtl = runner.run(program, dram, prog_addr=PROGRAM_ADDR, max_cycles=200_000)
        span = slice(0, PROGRAM_ADDR)
        differ = np.flatnonzero(rtl.dram[span] != golden.dram[span])
        assert not differ.size, (f"seed {seed}: DRAM byte {int(differ[0]):#x} is "
                                 f"{int(rtl.dram[differ[0]]):#04x} on the RTL, "
                                 f"{int(golden.dram[differ[0]]):#04x} on the golden model")
        # the random LOADs matter: without them the STOREs' outputs differ
        whole = [i for i in program.instructions if not (i.op.name == "LOAD" and i.dst == 2
                                                          and i.dram_addr >= PATCH)]
        whole[len(whole) - TABLE_ROWS - 3] = whole[len(whole) - TABLE_ROWS - 3].replace(push_next=1)
        unpatched = run_golden(config, whole, dram)
        out = slice(OUT, OUT + 0x40 * TABLE_ROWS)
        assert (unpatched.dram[out] != golden.dram[out]).any()
