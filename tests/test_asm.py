"""Assembler and disassembler: exact round trips, the canonical form, every error, docs/isa.md examples."""

from __future__ import annotations

import ast
import operator
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from systolic.compiler.asm import AsmError, assemble, disassemble, format_instruction
from systolic.hw.isa import FIELDS, Activation, Instruction, Memory, Opcode, PoolMode, Program, decode, encode

from .test_isa import instructions

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ISA_MD = Path(__file__).resolve().parents[1] / "docs" / "isa.md"


def _exact(message: str) -> str:
    return "^" + re.escape(message) + "$"


# -- round trips -------------------------------------------------------------------------------

@SETTINGS
@given(st.lists(instructions(), min_size=1, max_size=8))
def test_words_disasm_asm_words(instrs: list[Instruction]) -> None:
    words = [encode(i) for i in instrs]
    text = disassemble(decode(w) for w in words)
    again = assemble(text)
    assert [encode(i) for i in again] == words
    assert disassemble(again) == text
    assert len(text.splitlines()) == len(instrs) and text.endswith("\n")


@SETTINGS
@given(instructions())
def test_canonical_form(instr: Instruction) -> None:
    """Opcode; operation fields in layout order (enums by name, set flags bare, nonzero values,
    DRAM addresses in hex); token flags last."""
    line = format_instruction(instr)
    opcode, *tokens = line.split(" ")
    assert opcode == instr.op.name
    token_flags = ["pop_prev", "pop_next", "push_prev", "push_next"]
    expected_body, expected_flags = [], []
    for f in FIELDS[instr.op]:
        value = getattr(instr, f.name)
        if f.enum is not None:
            text = f"{f.name}={f.enum(value).name.lower()}"
        elif value == 0:
            continue
        elif f.width == 1 and not f.signed:
            text = f.name
        elif f.name in ("dram_addr", "res_addr"):
            text = f"{f.name}=0x{value:x}"
        else:
            text = f"{f.name}={value}"
        (expected_flags if f.name in token_flags else expected_body).append(text)
    assert tokens == expected_body + expected_flags


@SETTINGS
@given(instructions(), st.randoms(use_true_random=False))
def test_any_field_order_and_case_and_base(instr: Instruction, rnd) -> None:
    """The same instruction written with shuffled fields, random case and random number bases."""
    tokens = []
    for f in FIELDS[instr.op]:
        value = getattr(instr, f.name)
        if f.enum is not None:
            name = f.enum(value).name
            text = "".join(c.upper() if rnd.random() < 0.5 else c.lower() for c in name)
        else:
            base = rnd.choice(["{}", "0x{:x}", "0X{:X}", "0b{:b}"])
            text = ("-" if value < 0 else "") + base.format(abs(value))
        if value == 0 and f.enum is None and rnd.random() < 0.5:
            continue   # left out means 0
        tokens.append(f"{f.name.upper() if rnd.random() < 0.2 else f.name}={text}")
    rnd.shuffle(tokens)
    opcode = instr.op.name.lower() if rnd.random() < 0.5 else instr.op.name.capitalize()
    (parsed,) = assemble(f"  {opcode}\t{'  '.join(tokens)}  ; trailing comment")
    assert parsed == instr


def test_syntax_features() -> None:
    text = """
    # a comment line
    ; another

    load dst=ACC widen dram_addr=0X1F y0=-0x10 x0=-0b11 pad_value=-128 bounded=0 push_next=1
    Compute m=0b1000 k=010 n=8 preload pop_prev   # decimal with a leading zero is decimal
    SYNC queue=Store push_prev;comment right after
    finish
    """
    assert assemble(text) == [
        Instruction(Opcode.LOAD, dst=Memory.ACC, widen=1, dram_addr=0x1F, y0=-16, x0=-3, pad_value=-128,
                    push_next=1),
        Instruction(Opcode.COMPUTE, m=8, k=10, n=8, preload=1, pop_prev=1),
        Instruction(Opcode.SYNC, queue="store", push_prev=1),
        Instruction(Opcode.FINISH),
    ]
    assert assemble("") == [] and assemble("# nothing\n\n   \n") == []


def test_extreme_values_in_text() -> None:
    (instr,) = assemble("LOAD dram_addr=0xffffffff y0=-32768 x0=32767 elem_dc=-128 seg_dc=127 "
                        "pitch_y=0xFFFFFF rows_outer=65535")
    assert (instr.dram_addr, instr.y0, instr.x0, instr.elem_dc, instr.seg_dc) == (2 ** 32 - 1, -32768, 32767,
                                                                                   -128, 127)
    assert (instr.pitch_y, instr.rows_outer) == (2 ** 24 - 1, 65535)
    (store,) = assemble("STORE res_addr=0x80000000 act=clip pool=avg out_type=raw residual")
    assert format_instruction(store) == ("STORE out_type=raw act=clip pool=avg residual res_addr=0x80000000")


def test_canonical_examples() -> None:
    assert format_instruction(Instruction(Opcode.FINISH)) == "FINISH"
    assert format_instruction(Instruction(Opcode.SYNC, queue=0)) == "SYNC queue=load"
    compute = Instruction(Opcode.COMPUTE, b_addr=16, m=16, k=8, n=8, preload=1, pop_prev=1, push_next=1)
    assert format_instruction(compute) == "COMPUTE b_addr=16 m=16 k=8 n=8 preload pop_prev push_next"
    assert format_instruction(Instruction(Opcode.LOAD, dst_addr=256, dram_addr=4096, y0=-1)) == \
        "LOAD dst=spad dst_addr=256 dram_addr=0x1000 y0=-1"
    assert format_instruction(Instruction(Opcode.STORE, act=Activation.RELU, pool=PoolMode.MAX, n=8)) == \
        "STORE n=8 out_type=int act=relu pool=max"
    assert format_instruction(Instruction(Opcode.CONFIG, zp_out=-3, avg_shift=62)) == \
        "CONFIG zp_out=-3 avg_shift=62"
    assert format_instruction(Instruction(Opcode.CONFIG, res_mult=-5, tie_out=1, avg_tie_out=1)) == \
        "CONFIG res_mult=-5 tie_out avg_tie_out"
    assert disassemble([]) == ""


# -- errors -------------------------------------------------------------------------------------

LOAD_FIELDS = ", ".join(f.name for f in FIELDS[Opcode.LOAD])
CONFIG_FIELDS = ", ".join(f.name for f in FIELDS[Opcode.CONFIG])

ERRORS = [
    ("MOVE m=1", "<string>:1: unknown opcode 'MOVE'; opcodes are CONFIG, LOAD, COMPUTE, STORE, SYNC, FINISH"),
    ("LOAD foo=1", f"<string>:1: LOAD has no field 'foo'; its fields are {LOAD_FIELDS}"),
    ("LOAD m=1", f"<string>:1: LOAD has no field 'm'; its fields are {LOAD_FIELDS}"),
    ("COMPUTE m=1 k=2 m=3", "<string>:1: COMPUTE field m is given twice"),
    ("COMPUTE preload PRELOAD=1", "<string>:1: COMPUTE field preload is given twice"),
    ("COMPUTE m=65536", "<string>:1: COMPUTE field m must be in [0, 65535] (16-bit unsigned), not 65536"),
    ("COMPUTE m=-1", "<string>:1: COMPUTE field m must be in [0, 65535] (16-bit unsigned), not -1"),
    ("LOAD y0=-0x8001", "<string>:1: LOAD field y0 must be in [-32768, 32767] (16-bit signed), not -32769"),
    ("LOAD elem_dx=128", "<string>:1: LOAD field elem_dx must be in [-128, 127] (8-bit signed), not 128"),
    ("LOAD dram_addr=0x100000000",
     "<string>:1: LOAD field dram_addr must be in [0, 4294967295] (32-bit unsigned), not 4294967296"),
    ("STORE residual=2", "<string>:1: STORE field residual must be in [0, 1] (1-bit unsigned), not 2"),
    ("CONFIG avg_shift=0b1000000",
     "<string>:1: CONFIG field avg_shift must be in [0, 63] (6-bit unsigned), not 64"),
    ("CONFIG tie_out=2", "<string>:1: CONFIG field tie_out must be in [0, 1] (1-bit unsigned), not 2"),
    # ISA v2 rounds the residual term with the table entry's shift: there is no res_shift
    ("CONFIG res_shift=31", f"<string>:1: CONFIG has no field 'res_shift'; its fields are {CONFIG_FIELDS}"),
    ("COMPUTE m=12a", "<string>:1: COMPUTE field m: '12a' is not a number "
                      "(write decimal, 0x hex or 0b binary, with '-' if negative)"),
    ("COMPUTE m=1.5", "<string>:1: COMPUTE field m: '1.5' is not a number "
                      "(write decimal, 0x hex or 0b binary, with '-' if negative)"),
    ("COMPUTE m=+3", "<string>:1: COMPUTE field m: '+3' is not a number "
                     "(write decimal, 0x hex or 0b binary, with '-' if negative)"),
    ("COMPUTE m=0x", "<string>:1: COMPUTE field m: '0x' is not a number "
                     "(write decimal, 0x hex or 0b binary, with '-' if negative)"),
    ("COMPUTE m=0b12", "<string>:1: COMPUTE field m: '0b12' is not a number "
                       "(write decimal, 0x hex or 0b binary, with '-' if negative)"),
    ("COMPUTE m=--1", "<string>:1: COMPUTE field m: '--1' is not a number "
                      "(write decimal, 0x hex or 0b binary, with '-' if negative)"),
    ("COMPUTE m=1_000", "<string>:1: COMPUTE field m: '1_000' is not a number "
                        "(write decimal, 0x hex or 0b binary, with '-' if negative)"),
    ("LOAD dst=dram", "<string>:1: LOAD field dst must be one of spad, acc, table, not 'dram'"),
    ("STORE act=gelu", "<string>:1: STORE field act must be one of none, relu, relu6, clip, not 'gelu'"),
    ("SYNC queue=dispatch",
     "<string>:1: SYNC field queue must be one of load, compute, store, not 'dispatch'"),
    ("LOAD dst=1", "<string>:1: LOAD field dst takes a name (spad, acc, table), not the number 1"),
    ("STORE out_type=0", "<string>:1: STORE field out_type takes a name (int, raw), not the number 0"),
    ("COMPUTE m", "<string>:1: COMPUTE field m needs a value: write m=VALUE "
                  "(only one-bit flags may be written bare)"),
    ("LOAD dst", "<string>:1: LOAD field dst needs a value: write dst=VALUE "
                 "(only one-bit flags may be written bare)"),
    ("STORE out_type", "<string>:1: STORE field out_type needs a value: write out_type=VALUE "
                       "(only one-bit flags may be written bare)"),
    ("COMPUTE m= 16", "<string>:1: COMPUTE field m has no value after '=' (write m=VALUE without spaces)"),
    ("COMPUTE m =16", "<string>:1: COMPUTE field m needs a value: write m=VALUE "
                      "(only one-bit flags may be written bare)"),
    ("COMPUTE preload =1", "<string>:1: COMPUTE: '=1' has no field name before '=' "
                           "(write field=value without spaces)"),
]


@pytest.mark.parametrize(("text", "message"), ERRORS, ids=[t for t, _ in ERRORS])
def test_error(text: str, message: str) -> None:
    with pytest.raises(AsmError, match=_exact(message)):
        assemble(text)


def test_error_names_source_and_line() -> None:
    text = "# header\n\nLOAD dst=spad\n; comment\nCOMPUTE m=16 n=300\nFINISH\n"
    message = "prog.s:5: COMPUTE field n must be in [0, 255] (8-bit unsigned), not 300"
    with pytest.raises(AsmError, match=_exact(message)):
        assemble(text, source="prog.s")


def test_asm_error_is_value_error() -> None:
    assert issubclass(AsmError, ValueError)


# -- docs/isa.md examples ------------------------------------------------------------------------

def _code_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", markdown, re.M | re.S)


def _is_assembly(block: str) -> bool:
    lines = [re.split(r"[#;]", line)[0] for line in block.splitlines()]
    heads = [line.split()[0] for line in lines if line.strip() and not line[0].isspace()]
    return bool(heads) and all(head.upper() in Opcode.__members__ for head in heads)


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _evaluate(expr: str, symbols: dict[str, int]) -> int:
    """An integer expression of the examples (``X+ci0``, ``oh0*2-1+kh``) over ``symbols``."""
    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return symbols[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        raise AssertionError(f"unexpected expression {expr!r} in a docs/isa.md example")
    return walk(ast.parse(expr, mode="eval").body)


def _concrete(block: str, symbols: dict[str, int]) -> str:
    """``block`` with symbolic values evaluated, and indented continuation lines (the doc wraps
    long instructions for display) joined to the instruction they continue."""
    lines: list[str] = []
    for line in block.splitlines():
        body, _, comment = line.partition("#")
        tokens = []
        for token in body.split():
            name, equals, value = token.partition("=")
            if equals and not re.fullmatch(r"-?(0x[0-9a-f]+|0b[01]+|\d+)|[a-z]+", value):
                value = hex(_evaluate(value, symbols)) if "addr" in name else str(_evaluate(value, symbols))
            tokens.append(f"{name}{equals}{value}")
        text = " ".join(tokens)
        if line[:1].isspace() and lines:
            lines[-1] += " " + text
        elif text:
            lines.append(text)
    return "\n".join(lines)


def test_docs_assembly_program() -> None:
    section = ISA_MD.read_text().split("\n## Assembly\n", 1)[1]
    program = assemble(_code_blocks(section)[0], source="docs/isa.md")
    assert program == [
        Instruction(Opcode.LOAD, dst="table", dram_addr=0x3000, pitch_c=12, rows_outer=1, rows_inner=1,
                    segs=1, seg_len=8, elem_dc=1),
        Instruction(Opcode.LOAD, dst="spad", dram_addr=0x1000, pitch_y=8, pitch_c=1, rows_outer=1,
                    rows_inner=16, inner_dy=1, segs=1, seg_len=8, elem_dc=1),
        Instruction(Opcode.LOAD, dst="spad", dst_addr=16, dram_addr=0x2000, pitch_y=8, pitch_c=1,
                    rows_outer=1, rows_inner=8, inner_dy=1, segs=1, seg_len=8, elem_dc=1, push_next=1),
        Instruction(Opcode.COMPUTE, b_addr=16, m=16, k=8, n=8, preload=1, pop_prev=1, push_next=1),
        Instruction(Opcode.CONFIG, zp_out=-3),
        Instruction(Opcode.STORE, n=8, in_h=16, in_w=1, out_h=16, out_w=1, dram_addr=0x4000, pitch_y=8,
                    pitch_c=1, pop_prev=1),
        Instruction(Opcode.FINISH),
    ]
    binary = Program(tuple(program), 0).to_bytes()
    assert assemble(disassemble(Program.from_bytes(binary).instructions)) == program


def test_docs_every_example_assembles() -> None:
    """Every assembly block of docs/isa.md assembles once its symbols have values (blocks with
    elided fields, ``...``, are sketches and are skipped)."""
    symbols = {"K": 64, "BIAS": 0x800, "X": 0x10000, "W": 14, "H": 14, "Cin": 8, "ci0": 0, "oh0": 4,
               "kh": 2, "kw": 0, "OW": 7}
    blocks = [b for b in _code_blocks(ISA_MD.read_text()) if _is_assembly(b) and "..." not in b]
    assert len(blocks) >= 2
    assembled = [assemble(_concrete(block, symbols), source="docs/isa.md") for block in blocks]
    im2col = next(instr for program in assembled for instr in program if instr.bounded)
    assert im2col == Instruction(
        Opcode.LOAD, dst="spad", dram_addr=0x10000, pitch_y=14 * 8, pitch_x=8, pitch_c=1, bounded=1,
        height=14, width=14, y0=4 * 2 - 1 + 2, x0=-1, rows_outer=4, outer_dy=2, rows_inner=7, inner_dx=2,
        segs=1, seg_len=8, elem_dc=1)
