"""Golden model and program builders: every error names the instruction, the field, the rule and
the value (docs/isa.md "Errors" paragraphs)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from systolic.hw.config import AcceleratorConfig
from systolic.hw.isa import Instruction, IsaError, Program, ProgramError, encode
from systolic.sim.golden import ExecutionError, GoldenModel, run_golden
from systolic.sim.programs import conv_case, gemm_case, pool_case, residual_case

CONFIG = AcceleratorConfig()          # 8 x 8: 8192 spad rows, 512 acc rows, 64 table rows
OS = AcceleratorConfig(dataflow="os")
DRAM = 4096


def _i(op, **fields):
    return Instruction(op, **fields)


def _fails(instrs, message, config=CONFIG, cls=ExecutionError):
    with pytest.raises(cls, match="^" + re.escape(message) + "$"):
        run_golden(config, [*instrs, _i("FINISH")], np.zeros(DRAM, np.uint8))


def _load(**fields):
    base = {"dst": "spad", "pitch_c": 1, "rows_outer": 1, "rows_inner": 1, "segs": 1, "seg_len": 8,
            "elem_dc": 1}
    return _i("LOAD", **{**base, **fields})


STORE1 = {"n": 1, "in_h": 1, "in_w": 1, "out_h": 1, "out_w": 1}
POOL = {"pool": "max", "pool_h": 2, "pool_w": 2, "stride_h": 2, "stride_w": 2}


def _store(**fields):
    return _i("STORE", **{**STORE1, **fields})


# -- LOAD -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["rows_outer", "rows_inner", "segs", "seg_len"])
def test_load_zero_size(name):
    _fails([_load(**{name: 0})], f"instruction 0 (LOAD): field {name}: zero-size transfer: "
                                 f"{name} must be at least 1, not 0")


@pytest.mark.parametrize("dst", ["spad", "table"])
def test_load_widen_only_into_acc(dst):
    _fails([_load(dst=dst, widen=1)],
           f"instruction 0 (LOAD): field widen: widen applies to dst=acc only, not dst={dst}")


def test_load_table_not_bounded():
    _fails([_load(dst="table", bounded=1, height=1, width=1)],
           "instruction 0 (LOAD): field bounded: a dst=table LOAD has no padding (a requantize "
           "entry has no pad value), so bounded must be 0, not 1")


@pytest.mark.parametrize("dst,rows,name", [("spad", 8192, "scratchpad"), ("acc", 512, "accumulator"),
                                           ("table", 64, "requantize table")])
def test_load_rows_past_destination(dst, rows, name):
    _fails([_load(dst=dst, dst_addr=rows - 2, rows_outer=3, seg_len=1)],
           f"instruction 0 (LOAD): field dst_addr: destination rows {rows - 2}..{rows} must lie in "
           f"the {name} (rows 0..{rows - 1}), but row {rows} is past its end")


@pytest.mark.parametrize("dst,name", [("spad", "scratchpad"), ("acc", "accumulator"),
                                      ("table", "requantize table")])
def test_load_elements_past_row(dst, name):
    _fails([_load(dst=dst, dst_col=5, segs=2, seg_len=2)],
           f"instruction 0 (LOAD): field dst_col: destination elements 5..8 must lie in a {name} "
           f"row (elements 0..7), but element 8 is past its end")


@pytest.mark.parametrize("entries,col,segs,seg_len,groups", [(4, 2, 1, 4, "0..1"), (2, 1, 2, 1, "0..1"),
                                                             (1, 0, 1, 2, "0..1"), (2, 0, 3, 2, "0..2")])
def test_load_table_entries_outside_one_group(entries, col, segs, seg_len, groups):
    last = col + segs * seg_len - 1
    _fails([_load(dst="table", pitch_c=12, dst_col=col, segs=segs, seg_len=seg_len)],
           f"instruction 0 (LOAD): field dst_col: the entries a dst=table LOAD writes in a row must "
           f"lie in one aligned group of requant_load_entries ({entries}), but entries {col}..{last} "
           f"span groups {groups}", CONFIG.replace(requant_load_entries=entries))


@pytest.mark.parametrize("entries,col,seg_len", [(4, 4, 4), (2, 3, 1), (1, 7, 1), (0, 0, 8)])
def test_load_table_entries_inside_one_group(entries, col, seg_len):
    """The rule's edge: a whole group, or any part of one, at any place in it, is accepted."""
    result = run_golden(CONFIG.replace(requant_load_entries=entries),
                        [_load(dst="table", pitch_c=12, dst_col=col, seg_len=seg_len), _i("FINISH")],
                        np.zeros(DRAM, np.uint8))
    assert result.instructions == 2


def test_load_pad_value_outside_type():
    _fails([_load(bounded=1, pad_value=128)],
           "instruction 0 (LOAD): field pad_value: pad_value must fit a scratchpad element (input "
           "or weight type), -128..127, not 128")
    _fails([_load(dst="acc", widen=1, bounded=1, pad_value=-129)],
           "instruction 0 (LOAD): field pad_value: pad_value must fit the input type (widen), "
           "-128..127, not -129")
    unsigned = AcceleratorConfig(input_signed=False, weight_signed=False, acc_signed=False)
    _fails([_load(dst="acc", bounded=1, pad_value=-1)],
           "instruction 0 (LOAD): field pad_value: pad_value must fit an accumulator element, "
           "0..4294967295, not -1", unsigned)
    _fails([_load(bounded=1, pad_value=-1)],
           "instruction 0 (LOAD): field pad_value: pad_value must fit a scratchpad element (input "
           "or weight type), 0..255, not -1", unsigned)


def test_load_outside_dram():
    _fails([_load(dram_addr=DRAM - 4)],
           f"instruction 0 (LOAD): field dram_addr: element 4 of destination row 0 is at byte "
           f"address {DRAM}, but its 1 bytes must lie in DRAM (bytes 0..{DRAM - 1})")
    _fails([_load(dst="acc", dram_addr=DRAM - 6, pitch_c=4, seg_len=2)],
           f"instruction 0 (LOAD): field dram_addr: element 1 of destination row 0 is at byte "
           f"address {DRAM - 2}, but its 4 bytes must lie in DRAM (bytes 0..{DRAM - 1})")
    _fails([_load(dram_addr=8, pitch_y=16, y0=-1)],
           f"instruction 0 (LOAD): field dram_addr: element 0 of destination row 0 is at byte "
           f"address -8, but its 1 bytes must lie in DRAM (bytes 0..{DRAM - 1})")


def test_load_padding_is_not_read_from_dram():
    """Out-of-image elements are never read, so their addresses may lie outside DRAM."""
    run_golden(CONFIG, [_load(dram_addr=0, pitch_y=1 << 20, bounded=1, height=1, width=1, y0=-1),
                        _i("FINISH")], np.zeros(DRAM, np.uint8))


@pytest.mark.parametrize("shift", [63, -1])
def test_load_table_shift_out_of_range(shift):
    dram = np.zeros(DRAM, np.uint8)
    dram[24 + 8:24 + 12] = np.frombuffer(np.array([shift], "<i4").tobytes(), np.uint8)
    with pytest.raises(ExecutionError, match=re.escape(
            f"instruction 0 (LOAD): field dram_addr: the entry for table row 3 channel 2 at byte "
            f"address 24 has shift {shift}, but a shift must be 0..62") + "$"):
        run_golden(CONFIG, [_load(dst="table", dst_addr=3, dst_col=2, dram_addr=24, seg_len=1),
                            _i("FINISH")], dram)


# -- COMPUTE ----------------------------------------------------------------------------------

@pytest.mark.parametrize("fields,message", [
    ({"m": 1, "k": 0, "n": 1}, "field k: weight-stationary k must be 1..rows (8), not 0"),
    ({"m": 1, "k": 9, "n": 1}, "field k: weight-stationary k must be 1..rows (8), not 9"),
    ({"m": 1, "k": 1, "n": 0}, "field n: n must be 1..cols (8), not 0"),
    ({"m": 1, "k": 1, "n": 9}, "field n: n must be 1..cols (8), not 9"),
    ({"m": 0, "k": 1, "n": 1}, "field m: m must be at least 1, not 0"),
    ({"m": 2, "k": 1, "n": 1, "a_addr": 8191}, "field a_addr: A rows 8191..8192 must lie in the "
                                                "scratchpad (rows 0..8191)"),
    ({"m": 1, "k": 3, "n": 1, "b_addr": 8190}, "field b_addr: B rows 8190..8192 must lie in the "
                                                "scratchpad (rows 0..8191)"),
    ({"m": 4, "k": 1, "n": 1, "acc_addr": 510}, "field acc_addr: accumulator rows 510..513 must "
                                                 "lie in the accumulator (rows 0..511)"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_compute_weight_stationary_rules(fields, message):
    _fails([_i("COMPUTE", preload=1, **fields)], f"instruction 0 (COMPUTE): {message}")


def test_compute_reuse_needs_a_preload():
    _fails([_i("COMPUTE", m=1, k=1, n=1)],
           "instruction 0 (COMPUTE): field preload: preload=0 reuses the stationary weights, but no "
           "COMPUTE with preload=1 has run yet")
    first = _i("COMPUTE", m=1, k=4, n=5, preload=1)
    _fails([first, _i("COMPUTE", m=1, k=3, n=5)],
           "instruction 1 (COMPUTE): field k: preload=0 reuses the stationary weights, so k must "
           "equal the last preload's k=4, not 3")
    _fails([first, _i("COMPUTE", m=1, k=4, n=6)],
           "instruction 1 (COMPUTE): field n: preload=0 reuses the stationary weights, so n must "
           "equal the last preload's n=5, not 6")


def test_compute_reuse_ignores_b_rows():
    """Without preload, B is not read: b_addr may point anywhere."""
    run_golden(CONFIG, [_i("COMPUTE", m=1, k=4, n=5, preload=1),
                        _i("COMPUTE", m=1, k=4, n=5, b_addr=65535), _i("FINISH")],
               np.zeros(DRAM, np.uint8))


@pytest.mark.parametrize("fields,message", [
    ({"m": 1, "k": 1, "n": 1, "preload": 1}, "field preload: the output-stationary dataflow has no "
                                             "stationary weights, so preload must be 0, not 1"),
    ({"m": 0, "k": 1, "n": 1}, "field m: output-stationary m must be 1..rows (8), not 0"),
    ({"m": 9, "k": 1, "n": 1}, "field m: output-stationary m must be 1..rows (8), not 9"),
    ({"m": 1, "k": 1, "n": 9}, "field n: n must be 1..cols (8), not 9"),
    ({"m": 1, "k": 0, "n": 1}, "field k: k must be at least 1, not 0"),
    ({"m": 1, "k": 3, "n": 1, "a_addr": 8190}, "field a_addr: A rows 8190..8192 must lie in the "
                                                "scratchpad (rows 0..8191)"),
    ({"m": 1, "k": 3, "n": 1, "b_addr": 8190}, "field b_addr: B rows 8190..8192 must lie in the "
                                                "scratchpad (rows 0..8191)"),
    ({"m": 8, "k": 1, "n": 1, "acc_addr": 505}, "field acc_addr: accumulator rows 505..512 must "
                                                 "lie in the accumulator (rows 0..511)"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_compute_output_stationary_rules(fields, message):
    _fails([_i("COMPUTE", **fields)], f"instruction 0 (COMPUTE): {message}", OS)


# -- STORE ------------------------------------------------------------------------------------

@pytest.mark.parametrize("fields,message", [
    ({"n": 0}, "field n: n must be 1..cols (8), not 0"),
    ({"n": 9}, "field n: n must be 1..cols (8), not 9"),
    ({"in_h": 0}, "field in_h: zero-size transfer: in_h must be at least 1, not 0"),
    ({"in_w": 0}, "field in_w: zero-size transfer: in_w must be at least 1, not 0"),
    ({"out_h": 0}, "field out_h: zero-size transfer: out_h must be at least 1, not 0"),
    ({"out_w": 0}, "field out_w: zero-size transfer: out_w must be at least 1, not 0"),
    ({"out_type": "raw", "act": "relu"}, "field act: out_type=raw stores accumulator elements "
                                         "unchanged, so act must be none, not relu"),
    ({"out_type": "raw", **POOL}, "field pool: out_type=raw stores accumulator elements "
                                  "unchanged, so pool must be none, not max"),
    ({"out_type": "raw", "residual": 1}, "field residual: out_type=raw stores accumulator "
                                         "elements unchanged, so residual must be 0, not 1"),
    ({"residual": 1, **POOL}, "field residual: residual add cannot be combined with pooling, so "
                              "residual must be 0 with pool=max, not 1"),
    ({"pool_w": 2}, "field pool_w: without pooling the window fields must be 0, so pool_w must "
                    "be 0, not 2"),
    ({"pad_top": 1}, "field pad_top: without pooling the window fields must be 0, so pad_top "
                     "must be 0, not 1"),
    ({"in_h": 2}, "field out_h: without pooling the output is the input image, so out_h must "
                  "equal in_h (2), not 1"),
    ({"in_w": 3}, "field out_w: without pooling the output is the input image, so out_w must "
                  "equal in_w (3), not 1"),
    ({**POOL, "pool_h": 0}, "field pool_h: a pooling window needs pool_h of at least 1, not 0"),
    ({**POOL, "stride_w": 0}, "field stride_w: a pooling window needs stride_w of at least 1, "
                              "not 0"),
    ({**POOL, "pad_top": 2}, "field pad_top: pad_top must be below pool_h (2), not 2"),
    ({**POOL, "pad_left": 3}, "field pad_left: pad_left must be below pool_w (2), not 3"),
    ({**POOL, "in_h": 4, "out_h": 3}, "field out_h: the window of output row 2 starts at image row "
                                      "4, entirely outside the 4-row image, so out_h must be at "
                                      "most 2, not 3"),
    ({**POOL, "in_w": 5, "out_w": 4, "pad_left": 1}, "field out_w: the window of output column 3 "
                                                     "starts at image column 5, entirely outside "
                                                     "the 5-column image, so out_w must be at "
                                                     "most 3, not 4"),
    ({"acc_addr": 500, "in_h": 4, "in_w": 4, "out_h": 4, "out_w": 4},
     "field acc_addr: the 4x4 image in accumulator rows 500..515 must lie in the accumulator "
     "(rows 0..511)"),
    ({"qrow": 64}, "field qrow: qrow must be a requantize table row (0..63), not 64"),
    ({"dram_addr": DRAM - 2, "n": 3, "pitch_c": 1}, f"field dram_addr: output element (0, 0, 2) "
                                                    f"is at byte address {DRAM}, but its 1 bytes "
                                                    f"must lie in DRAM (bytes 0..{DRAM - 1})"),
    ({"out_type": "raw", "dram_addr": DRAM - 4, "in_h": 2, "out_h": 2, "pitch_y": 2},
     f"field dram_addr: output element (1, 0, 0) is at byte address {DRAM - 2}, but its 4 bytes "
     f"must lie in DRAM (bytes 0..{DRAM - 1})"),
    ({"residual": 1, "res_addr": DRAM}, f"field res_addr: output element (0, 0, 0) is at byte "
                                        f"address {DRAM}, but its 1 bytes must lie in DRAM "
                                        f"(bytes 0..{DRAM - 1})"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_store_rules(fields, message):
    _fails([_store(**fields)], f"instruction 0 (STORE): {message}")


def test_store_rows_past_accumulator_with_a_window_inside():
    """The whole in_h x in_w image must lie in the accumulator, even rows no window reads."""
    _fails([_store(acc_addr=508, in_h=4, in_w=2, out_h=1, out_w=1, **POOL)],
           "instruction 0 (STORE): field acc_addr: the 4x2 image in accumulator rows 508..515 must "
           "lie in the accumulator (rows 0..511)")


@pytest.mark.parametrize("fields,config,message", [
    ({"act": "clip"}, CONFIG.replace(sfu_activations=("relu", "relu6")),
     "field act: this accelerator's SFU has activations [relu, relu6] (sfu_activations), not clip"),
    ({"act": "relu"}, CONFIG.replace(sfu_activations=()),
     "field act: this accelerator's SFU has activations [] (sfu_activations), not relu"),
    ({**POOL, "pool": "avg"}, CONFIG.replace(sfu_pooling=("max",)),
     "field pool: this accelerator's SFU has pooling [max] (sfu_pooling), not avg"),
    ({"residual": 1}, CONFIG.replace(sfu_residual=False),
     "field residual: this accelerator's SFU has no residual add (sfu_residual is false), so "
     "residual must be 0, not 1"),
], ids=["clip", "relu", "avg", "residual"])
def test_store_needs_the_sfu_feature(fields, config, message):
    _fails([_store(**fields)], f"instruction 0 (STORE): {message}", config)


def test_store_avg_product_must_fit_64_bits():
    cfg16 = AcceleratorConfig(input_bits=16, weight_bits=16)
    big = [_i("CONFIG", avg_mult=2**31 - 1),
           _store(pool="avg", pool_h=255, pool_w=255, stride_h=1, stride_w=1, in_h=255, in_w=255)]
    bound = 255 * 255 * 65535 * (2**31 - 1)
    _fails(big, f"instruction 1 (STORE): field pool_h: average pooling needs pool_h*pool_w*65535 "
                f"(the output range) * |avg_mult| below 2**62 so that the window sum times avg_mult "
                f"fits 64 bits, not {bound}", cfg16.replace(accumulator_bytes=1 << 21))


def test_store_raw_ignores_qrow():
    run_golden(CONFIG, [_store(out_type="raw", qrow=65535), _i("FINISH")], np.zeros(DRAM, np.uint8))


# -- CONFIG -----------------------------------------------------------------------------------

def test_config_shift_above_62():
    _fails([_i("CONFIG", avg_shift=63)],
           "instruction 0 (CONFIG): field avg_shift: avg_shift must be 0..62, not 63")
    run_golden(CONFIG, [_i("CONFIG", avg_shift=62), _i("FINISH")], np.zeros(DRAM, np.uint8))


def test_config_has_no_residual_shift():
    """ISA v2: the residual term shares the table entry's shift; CONFIG has no res_shift."""
    with pytest.raises(IsaError, match=r"^CONFIG has no field 'res_shift'; its fields are "
                                       r"[a-z_, ]*res_mult, tie_out, avg_tie_out$"):
        _i("CONFIG", res_shift=3)


# -- program level ----------------------------------------------------------------------------

def test_program_without_finish():
    with pytest.raises(ExecutionError, match=r"^instruction 1 \(SYNC\): the program ends here "
                                             r"without FINISH; a program must end with FINISH$"):
        run_golden(CONFIG, [_load(), _i("SYNC")], np.zeros(DRAM, np.uint8))
    with pytest.raises(ExecutionError, match=r"^the program is empty: a program must end with "
                                             r"FINISH$"):
        run_golden(CONFIG, [], np.zeros(DRAM, np.uint8))


@pytest.mark.parametrize("opcode", [0, 7, 15])
def test_illegal_opcode_in_raw_words(opcode):
    words = encode(_i("SYNC")) + bytes([opcode]) + bytes(63)
    with pytest.raises(ExecutionError, match=rf"^instruction 1 \(opcode {opcode}\): field opcode: "
                                             rf"must be one of 1 CONFIG, 2 LOAD, 3 COMPUTE, "
                                             rf"4 STORE, 5 SYNC, 6 FINISH, not {opcode}$"):
        GoldenModel(CONFIG).run(words, np.zeros(DRAM, np.uint8))


def test_illegal_field_value_in_raw_words():
    word = int.from_bytes(encode(_load()), "little") | (3 << 8)    # dst = 3
    with pytest.raises(ExecutionError, match=r"^instruction 0 \(LOAD\): field dst: illegal "
                                             r"value 3$"):
        GoldenModel(CONFIG).run([word, encode(_i("FINISH"))], np.zeros(DRAM, np.uint8))
    word = int.from_bytes(encode(_i("FINISH")), "little") | (1 << 500)
    with pytest.raises(ExecutionError, match=r"^instruction 0 \(FINISH\): field _reserved: "
                                             r"reserved bits must be zero$"):
        GoldenModel(CONFIG).run([word], np.zeros(DRAM, np.uint8))


def test_truncated_words():
    with pytest.raises(ExecutionError, match=r"^instruction 1 \(truncated\): the program words "
                                             r"must be a multiple of 64 bytes, not 100$"):
        GoldenModel(CONFIG).run(bytes(100), np.zeros(DRAM, np.uint8))


def test_program_for_another_config():
    program = Program((_i("FINISH"),), OS.hash)
    with pytest.raises(ProgramError, match=rf"^program was built for config {OS.hash_hex}, but "
                                           rf"the accelerator's config is {CONFIG.hash_hex}; "
                                           rf"recompile for this config$"):
        run_golden(CONFIG, program, np.zeros(DRAM, np.uint8))


def test_argument_types():
    with pytest.raises(TypeError, match=r"^config must be an AcceleratorConfig, not dict$"):
        GoldenModel({})
    with pytest.raises(TypeError, match=r"^program must be a Program, instruction words \(bytes\) "
                                        r"or a sequence of Instructions, not str$"):
        run_golden(CONFIG, "FINISH", np.zeros(DRAM, np.uint8))
    with pytest.raises(TypeError, match=r"^instruction 0 must be an Instruction, a 64-byte word "
                                        r"or an integer word, not float$"):
        run_golden(CONFIG, [1.0], np.zeros(DRAM, np.uint8))
    with pytest.raises(TypeError, match=r"^dram must be a 1-D numpy array of uint8, not ndarray "
                                        r"of int8 with shape \(16,\)$"):
        run_golden(CONFIG, [_i("FINISH")], np.zeros(16, np.int8))
    with pytest.raises(TypeError, match=r"^dram must be a 1-D numpy array of uint8, not list$"):
        run_golden(CONFIG, [_i("FINISH")], [0] * 16)
    assert run_golden(CONFIG, [_i("FINISH")], bytes(16)).dram.dtype == np.uint8


# -- program builders -------------------------------------------------------------------------

@pytest.mark.parametrize("call,message", [
    (lambda: gemm_case(CONFIG, 0, 1, 1), "M must be a positive integer, not 0"),
    (lambda: gemm_case(CONFIG, 1, 1.5, 1), "K must be a positive integer, not 1.5"),
    (lambda: gemm_case(CONFIG, 1, 1, 1, act="gelu"),
     "act must be one of none, relu, relu6, clip, not 'gelu'"),
    (lambda: gemm_case(CONFIG.replace(sfu_activations=("relu",)), 1, 1, 1, act="clip"),
     "act 'clip' is not among this config's sfu_activations (relu)"),
    (lambda: gemm_case(CONFIG.replace(requant_table_rows=1), 1, 1, 9),
     "gemm 1x1x9: 9 output channels need 2 requantize table rows of 8, but the config has "
     "requant_table_rows=1"),
    (lambda: conv_case(CONFIG, 4, 4, 1, 1, 3, 3, pad=-1), "pad must be a non-negative integer, "
                                                          "not -1"),
    (lambda: conv_case(CONFIG, 4, 4, 1, 1, 3, 3, stride=128),
     "stride must be at most 127 (a LOAD coordinate step is s8), not 128"),
    (lambda: conv_case(CONFIG, 4, 4, 1, 1, 3, 3, layout="chwn"),
     "layout must be 'nhwc' or 'nchw', not 'chwn'"),
    (lambda: conv_case(CONFIG, 2, 2, 1, 1, 3, 3),
     "the kernel (3x3, dilation 1) must fit the padded 2x2 image, but the output would be 0x0"),
    (lambda: pool_case(CONFIG, 4, 4, 1, pool="min"), "pool must be 'max' or 'avg', not 'min'"),
    (lambda: pool_case(CONFIG.replace(sfu_pooling=("max",)), 4, 4, 1, pool="avg"),
     "pool 'avg' is not among this config's sfu_pooling (max)"),
    (lambda: pool_case(CONFIG, 4, 4, 1, kernel=2, pad=2),
     "pad must be below the kernel size (2x2), not (2, 2)"),
    (lambda: pool_case(CONFIG, 4, 4, 1, kernel=(2, 0)), "kernel_w must be a positive integer, not 0"),
    (lambda: pool_case(CONFIG, 17, 17, 1), "pool_case keeps the whole 17x17 image in one "
                                           "accumulator buffer, which holds 256 pixels"),
    (lambda: pool_case(CONFIG.replace(requant_table_rows=1), 2, 2, 9),
     "pool_case: 9 channels need 2 requantize table rows, but the config has 1"),
    (lambda: pool_case(AcceleratorConfig(accumulator_bytes=1 << 18), 1, 300, 1, kernel=(1, 256)),
     "kernel must be at most 255 (u8 STORE window fields), not 256"),
    (lambda: residual_case(CONFIG.replace(sfu_residual=False), 1, 1, 1),
     "residual_case needs a config with sfu_residual = true"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_builder_errors(call, message):
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        call()


def test_case_check_reports_short_dram():
    case = gemm_case(CONFIG, 2, 2, 2)
    addr = case.expected["out"][0]
    with pytest.raises(AssertionError, match=rf"^gemm 2x2x2: out at {addr:#x} needs 4 bytes but "
                                             rf"the DRAM image ends at {addr + 1:#x}$"):
        case.check(case.dram[:addr + 1])
