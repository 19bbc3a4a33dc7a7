# amaranth: UnusedElaboratable=no
"""The scratchpad's and the accumulator's banks on ECP5 (hw/bankram.py): DP16KD instances read
through their output register (REGMODE "OUTREG"), in the 1024 x 18 mode (chip-select decoded
when deeper than 1024 rows) or, for 128 to 512 rows, in the 512 x 36 mode; elsewhere (and for
elements that are not whole bytes) an amaranth Memory and a register.

* The ECP5 variant's Verilog: how many DP16KD instances with which parameters, for the banks of
  the board presets and the default config; which banks stay amaranth memories.
* In Verilator, with the behavioural DP16KD model (tests/boards/dp16kd_model.v): the ECP5 and the
  generic variant of the same bank under the same random traffic (a write and a read in most
  cycles, random, full and empty element masks, a few hot rows so that reads follow writes to
  the same row closely), every read's data checked against a reference memory two cycles after
  its address: identical results; and both variants with ``address_registers`` (the addresses a
  cycle early, through a copy per DP16KD on ECP5), whose reads must give the same data. Reads of
  the row written in the same cycle are not checked (undefined on the device; no user of a bank
  makes one). Twice: with port B's output register
  enabled by OCEB alone, and by OCEB and CEB.

Set SYSTOLIC_TEST_SEED to vary the random cases.
"""

from __future__ import annotations

import os
import re

import pytest
from amaranth.lib import data
from systolic.hw.accumulator import ACC_BANKS, Accumulator, acc_row_layout
from systolic.hw.bankram import DP16KD_MAX_ROWS, DP16KD_WIDE_MIN_ROWS, BankRAM, uses_dp16kd
from systolic.hw.config import AcceleratorConfig
from systolic.hw.scratchpad import Scratchpad, spad_row_layout
from systolic.sim.tools import to_verilog

from tests.boards.clocked_testbench import check_variant_summaries, random_top, run_clocked_testbench
from tests.boards.test_memory_ecp5 import MODEL, _instances, _instantiate
from tests.hw.mult18x18d_model import trellis_ff_model

SEED = int(os.environ.get("SYSTOLIC_TEST_SEED", "1"))
_RANDOM_CYCLES = 30_000


class _ECP5:
    family = "ecp5"


def _layout(elems: int, bits: int) -> data.ArrayLayout:
    return data.ArrayLayout(bits, elems)


#: (name, elements, bits per element, rows): the 4x4 ULX3S sweep's scratchpad bank (4 DP16KD
#: deep), the 16x16 preset's, a row of 32-bit elements, one 2 deep with an odd byte count, and
#: the deepest (8 deep); in the 512 x 36 mode: the 16x16 accumulator's bank (16 DP16KD wide), a
#: 16-byte scratchpad bank of 512 rows, and one of 3 bytes (a byte lane unused)
_CASES = (("spad4", 4, 8, 4096), ("spad16", 16, 8, 1024), ("acc", 4, 32, 1024), ("deep2", 3, 8, 2048),
          ("deep8", 2, 16, 8192), ("acc16", 16, 32, 128), ("spad512", 16, 8, 512), ("odd36", 3, 8, 256))
@pytest.mark.parametrize("name, elems, bits, rows", _CASES, ids=[c[0] for c in _CASES])
def test_ecp5_banks_are_dp16kd_through_the_output_register(name, elems, bits, rows):
    layout = _layout(elems, bits)
    assert uses_dp16kd(_ECP5(), layout, rows)
    verilog = to_verilog(BankRAM(layout, rows), name, platform=_ECP5())
    instances = _instances(verilog)
    if rows <= 512:                 # the 512 x 36 mode: four bytes a DP16KD
        assert len(instances) == (elems * bits // 8 + 3) // 4
        expected = (("DATA_WIDTH_A", r"32'(?:s)?d36"), ("DATA_WIDTH_B", r"32'(?:s)?d36"),
                    ("REGMODE_B", '"OUTREG"'), ("REGMODE_A", '"OUTREG"'), ("CSDECODE_B", '"0b000"'))
    else:
        deep = rows // 1024
        wide = (elems * bits // 8 + 1) // 2
        assert len(instances) == deep * wide
        decodes = sorted(re.search(r'\.CSDECODE_B\("(0b\d{3})"\)', text)[1] for text in instances)
        assert decodes == sorted(f"0b{d:03b}" for d in range(deep) for _ in range(wide))
        expected = (("DATA_WIDTH_A", r"32'(?:s)?d18"), ("DATA_WIDTH_B", r"32'(?:s)?d18"),
                    ("REGMODE_B", '"OUTREG"'), ("REGMODE_A", '"NOREG"'))
    for text in instances:
        for parameter, value in (*expected, ("WRITEMODE_A", '"NORMAL"')):
            assert re.search(rf"\.{parameter}\({value}\)", text), (parameter, text[:400])
    assert not re.search(r"^\s*reg\s*\[\d+:0\]\s*\w+\s*\[", verilog, re.MULTILINE)   # no memory array
    assert "DP16KD" not in to_verilog(BankRAM(layout, rows), name)


def test_address_registers_are_a_copy_per_dp16kd_in_the_wide_mode():
    """With ``address_registers`` each DP16KD of a bank in the 512 x 36 mode has its own
    TRELLIS_FF copy of both addresses (the 16x16 accumulator's bank: 16 DP16KD, 7 bits each);
    in the 1024 x 18 mode, and elsewhere, one register of each."""
    layout = _layout(16, 32)
    verilog = to_verilog(BankRAM(layout, 128, address_registers=True), "bank", platform=_ECP5())
    copies = {f"tile{t}_{port}_ff{bit}" for t in range(16) for port in ("write_addr", "read_addr")
              for bit in range(7)}
    assert verilog.count("TRELLIS_FF ") == len(copies) == 16 * 2 * 7
    assert {name for name in copies if f" {name} (" in verilog} == copies
    assert "TRELLIS_FF " not in to_verilog(BankRAM(layout, 128), "bank", platform=_ECP5())
    assert "TRELLIS_FF " not in to_verilog(BankRAM(_layout(16, 8), 1024, address_registers=True), "bank",
                                           platform=_ECP5())


def test_address_registers_rules():
    with pytest.raises(ValueError, match=r"^address_registers must be True or False, not 1$"):
        BankRAM(_layout(4, 8), 1024, address_registers=1)
    with pytest.raises(ValueError, match=r"^address_registers needs registered=True \(a bank with its read "
                                         r"data registered\), not registered=False$"):
        BankRAM(_layout(4, 8), 1024, registered=False, address_registers=True)


def test_unregistered_banks_stay_amaranth_memories_on_ecp5():
    """memory_registers = false: a bank without its output register is a generic memory (yosys
    maps it to block RAM itself), read one cycle after the read is presented."""
    layout = _layout(4, 8)
    assert uses_dp16kd(_ECP5(), layout, 1024)
    verilog = to_verilog(BankRAM(layout, 1024, registered=False), "bank", platform=_ECP5())
    assert "DP16KD" not in verilog
    assert re.search(r"^\s*reg\s*\[\d+:0\]\s*\w+\s*\[", verilog, re.MULTILINE)   # a memory array


@pytest.mark.parametrize("layout, rows", [(_layout(4, 4), 1024), (_layout(2, 8), 2 * DP16KD_MAX_ROWS),
                                          (_layout(4, 4), 256), (_layout(16, 32), DP16KD_WIDE_MIN_ROWS // 2)],
                         ids=["nibbles", "too-deep", "nibbles-wide", "too-shallow"])
def test_other_banks_stay_amaranth_memories_on_ecp5(layout, rows):
    assert not uses_dp16kd(_ECP5(), layout, rows)
    verilog = to_verilog(BankRAM(layout, rows), "bank", platform=_ECP5())
    assert "DP16KD" not in verilog


@pytest.mark.parametrize("preset", ["ulx3s-85f", "orangecrab-25f", "default"])
def test_the_presets_banks_take_no_more_block_rams(preset):
    """A bank of the ECP5 presets (and of the default config) of at least 1024 rows takes one
    DP16KD in the 1024 x 18 mode per two bytes of row per 1024 rows (every row used); one of 128
    to 512 rows one DP16KD in the 512 x 36 mode per four bytes of row, as yosys's mapping."""
    from systolic.boards.boards import load_preset

    config = AcceleratorConfig() if preset == "default" else load_preset(preset)
    for component, layout, rows, banks in (
            (Scratchpad(config), spad_row_layout(config), config.spad_bank_rows, config.scratchpad_banks),
            (Accumulator(config), acc_row_layout(config), config.acc_rows // ACC_BANKS, ACC_BANKS)):
        assert uses_dp16kd(_ECP5(), layout, rows) == (rows >= DP16KD_WIDE_MIN_ROWS)
        instances = _instances(to_verilog(component, "block", platform=_ECP5()))
        expected = (banks * (layout.size // 16) * (rows // 1024) if rows >= 1024 else
                    banks * -(-layout.size // 32) if rows >= DP16KD_WIDE_MIN_ROWS else 0)
        assert len(instances) == expected, (preset, rows)


#: (variant, platform, address_registers): each case's bank built so; a bank with address
#: registers (one copy per DP16KD in the 512 x 36 mode on ECP5) gets its addresses a cycle early
_VARIANTS = (("generic", None, False), ("ecp5", _ECP5(), False), ("generic_early", None, True),
             ("ecp5_early", _ECP5(), True))


def _testbench(seed: int) -> list[str]:
    sources = [MODEL.read_text(), trellis_ff_model()]
    body = []
    for name, elems, bits, rows in _CASES:
        layout = _layout(elems, bits)
        width = elems * bits
        addr_bits = max(1, (rows - 1).bit_length())
        for variant, platform, address_registers in _VARIANTS:
            module = f"bank_{variant}_{name}"
            verilog = to_verilog(BankRAM(layout, rows, address_registers=address_registers), module,
                                 platform=platform)
            sources.append(verilog)
            # a bank with address registers gets the addresses a cycle early: before their registers
            early = "_next" if address_registers else ""
            body.append(f"  wire [{width - 1}:0] rdata_{variant}_{name};\n")
            body.append(_instantiate(verilog, module, {
                "clk": "clk", "rst": "rst", "write_addr": f"waddr{early}_{name}",
                "write_data": f"wdata_{name}", "write_en": f"wen_{name}",
                "read_addr": f"raddr{early}_{name}", "read_en": f"ren_{name}",
                "read_data": f"rdata_{variant}_{name}"}))
        # hot rows: the first and the last two of each DP16KD's 1024
        hot = (f"{{x1[{addr_bits - 1}:{min(10, addr_bits)}], {{{min(10, addr_bits) - 1}{{x1[20]}}}}, x1[0]}}"
               if addr_bits > 10 else f"{{{{{addr_bits - 1}{{x1[20]}}}}, x1[0]}}")
        hot_r = hot.replace("x1[", "x3[")
        body.append(f"""
  logic [{addr_bits - 1}:0] waddr_{name} = 0, raddr_{name} = 0;
  logic [{width - 1}:0] wdata_{name} = 0;
  logic [{elems - 1}:0] wen_{name} = 0;
  logic ren_{name} = 0;
  logic [{width - 1}:0] ref_{name} [0:{rows - 1}];
  logic [{width - 1}:0] expected1_{name}, expected2_{name};
  logic check1_{name} = 0, check2_{name} = 0;
  logic [31:0] reads_{name} = 0, generic_bad_{name} = 0, ecp5_bad_{name} = 0;
  wire filling_{name} = cycle < {rows};
  wire [{addr_bits - 1}:0] waddr_next_{name} = rst ? waddr_{name} :
      filling_{name} ? {addr_bits}'(cycle) : x1[40] ? x1[{addr_bits + 20}:21] : {hot};
  wire [{addr_bits - 1}:0] raddr_next_{name} = rst ? raddr_{name} :
      x3[40] ? x3[{addr_bits + 20}:21] : {hot_r};
  always @(posedge clk) if (!rst) begin
    // the bank's inputs, registered as their users do
    waddr_{name} <= waddr_next_{name};
    wdata_{name} <= {{{(width + 63) // 64}{{x2}}}};
    wen_{name} <= filling_{name} || x1[59:58] == 0 ? '1 : x1[59:58] == 1 ? '0 : x1[{elems + 43}:44];
    raddr_{name} <= raddr_next_{name};
    ren_{name} <= !filling_{name} && x3[61:60] != 0;
    for (int e = 0; e < {elems}; e++)
      if (wen_{name}[e]) ref_{name}[waddr_{name}][{bits} * e +: {bits}] <= wdata_{name}[{bits} * e +: {bits}];
    expected1_{name} <= ref_{name}[raddr_{name}];
    check1_{name} <= ren_{name} && !(wen_{name} != 0 && waddr_{name} == raddr_{name});
    expected2_{name} <= expected1_{name};
    check2_{name} <= check1_{name};
    if (check2_{name}) begin
      reads_{name} <= reads_{name} + 1;
      if (rdata_generic_{name} != expected2_{name} || rdata_generic_early_{name} != expected2_{name}) begin
        generic_bad_{name} <= generic_bad_{name} + 1;
        if (generic_bad_{name} < 5)
          $display("generic {name} cycle %0d: %h, %h (address registers), expected %h", cycle,
                   rdata_generic_{name}, rdata_generic_early_{name}, expected2_{name});
      end
      if (rdata_ecp5_{name} != expected2_{name} || rdata_ecp5_early_{name} != expected2_{name}) begin
        ecp5_bad_{name} <= ecp5_bad_{name} + 1;
        if (ecp5_bad_{name} < 5)
          $display("ecp5 {name} cycle %0d: %h, %h (address copies), expected %h", cycle,
                   rdata_ecp5_{name}, rdata_ecp5_early_{name}, expected2_{name});
      end
    end
  end
  final $display("case {name}: compared %0d reads, %0d generic mismatches, %0d ecp5 mismatches",
                 reads_{name}, generic_bad_{name}, ecp5_bad_{name});
""")
    fill = max(rows for *_, rows in _CASES)
    sources.append(random_top("bankram_check", seed, fill + _RANDOM_CYCLES, "".join(body)))
    return sources


@pytest.mark.slow
@pytest.mark.parametrize("ce_gates_outreg", [False, True])
def test_ecp5_bank_behaves_like_the_generic_bank(ce_gates_outreg):
    defines = ("DP16KD_CE_GATES_OUTREG",) if ce_gates_outreg else ()
    output = run_clocked_testbench("bankram_check", _testbench(SEED), defines=defines)
    check_variant_summaries(output, len(_CASES), _RANDOM_CYCLES // 2)
