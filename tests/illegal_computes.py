"""COMPUTEs the golden model refuses (docs/isa.md, COMPUTE), for the tests of the hardware
control's ComputeCheck (tests/hw/test_top.py) and of the firmware control's check
(tests/sim/test_rtl_firmware.py): each one as instruction 1 of a program whose instruction 0 is a
legal COMPUTE of 160 MACs (40 rows) that is still running when it arrives."""

from __future__ import annotations

from systolic.hw.config import AcceleratorConfig
from systolic.hw.isa import Instruction

#: MACs of the legal first COMPUTE
FIRST_MACS = 40 * 2 * 2


def compute(**fields: int) -> Instruction:
    """A COMPUTE of m = k = n = 2 from row 0 of each memory, with ``fields`` changed."""
    base = dict(a_addr=0, b_addr=0, acc_addr=0, m=2, k=2, n=2, accumulate=0, preload=0)
    return Instruction("COMPUTE", **{**base, **fields})


def first_compute(config: AcceleratorConfig) -> Instruction:
    """The legal COMPUTE before the illegal one: 40 input rows (WS, preloading k = n = 2) or 40
    k rows (OS)."""
    return compute(preload=1, m=40) if config.dataflow == "ws" else compute(k=40)


def illegal_computes(config: AcceleratorConfig) -> list[tuple[str, Instruction, str]]:
    """(name, illegal COMPUTE, the field the golden model names) for ``config``'s dataflow."""
    spad, acc, rows, cols = config.spad_rows, config.acc_rows, config.rows, config.cols
    if config.dataflow == "ws":
        return [
            ("k_zero", compute(k=0, preload=1), "k"),
            ("k_above_rows", compute(k=rows + 1, preload=1), "k"),
            ("n_zero", compute(n=0, preload=1), "n"),
            ("n_above_cols", compute(n=cols + 1, preload=1), "n"),
            ("m_zero", compute(m=0), "m"),
            ("a_past_scratchpad", compute(a_addr=spad - 1, m=2), "a_addr"),
            ("m_past_scratchpad", compute(m=spad + 1), "a_addr"),
            ("b_past_scratchpad", compute(b_addr=spad - 1, preload=1), "b_addr"),
            ("acc_past_accumulator", compute(acc_addr=acc - 1), "acc_addr"),
            ("reuse_with_another_k", compute(k=3), "k"),
            ("reuse_with_another_n", compute(n=3), "n"),
        ]
    return [
        ("preload", compute(preload=1), "preload"),
        ("m_zero", compute(m=0), "m"),
        ("m_above_rows", compute(m=rows + 1), "m"),
        ("k_zero", compute(k=0), "k"),
        ("n_above_cols", compute(n=cols + 1), "n"),
        ("a_past_scratchpad", compute(a_addr=spad - 1), "a_addr"),
        ("k_past_scratchpad", compute(k=spad + 1), "a_addr"),
        ("b_past_scratchpad", compute(b_addr=spad - 1), "b_addr"),
        ("acc_past_accumulator", compute(acc_addr=acc - 1), "acc_addr"),
    ]


def illegal_program(config: AcceleratorConfig, bad: Instruction) -> list[Instruction]:
    """The legal first COMPUTE, ``bad``, a legal COMPUTE that must not run, FINISH."""
    return [first_compute(config), bad, compute(preload=int(config.dataflow == "ws")),
            Instruction("FINISH")]
