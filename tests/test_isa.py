"""ISA v1 codec: encode/decode round trips for every opcode, the layouts the RTL sees, illegal words,
Instruction construction errors and the program binary with its header."""

from __future__ import annotations

import re
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from systolic.hw.config import AcceleratorConfig
from systolic.hw.isa import (
    FIELDS,
    HEADER_BYTES,
    INSTR_BITS,
    INSTR_BYTES,
    ISA_VERSION,
    LAYOUTS,
    MAGIC,
    Activation,
    Field,
    Instruction,
    IsaError,
    Memory,
    Opcode,
    PoolMode,
    Program,
    ProgramError,
    Queue,
    decode,
    encode,
)

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _exact(message: str) -> str:
    return "^" + re.escape(message) + "$"


def _field_values(f: Field) -> st.SearchStrategy:
    if f.enum is not None:
        return st.sampled_from(list(f.enum))
    return st.integers(f.min, f.max)


def instructions(op: Opcode | None = None) -> st.SearchStrategy[Instruction]:
    """Random valid instructions (of opcode ``op``, or of every opcode), each field over its whole
    range (hypothesis favours the ends of integer ranges)."""
    ops = list(Opcode) if op is None else [op]
    return st.one_of([
        st.fixed_dictionaries({f.name: _field_values(f) for f in FIELDS[o]}).map(
            lambda values, o=o: Instruction(o, **values))
        for o in ops])


def _extremes(op: Opcode) -> list[Instruction]:
    """Every field at its minimum, at its maximum, and at -1 / its top bit alone."""
    out = []
    for pick in (lambda f: f.min, lambda f: f.max, lambda f: -1 if f.signed else 1 << (f.width - 1)):
        values = {}
        for f in FIELDS[op]:
            if f.enum is not None:
                members = list(f.enum)
                values[f.name] = members[0] if pick(f) == f.min else members[-1]
            else:
                values[f.name] = pick(f)
        out.append(Instruction(op, **values))
    return out


# -- layouts ---------------------------------------------------------------------------------------

def test_every_layout_fills_exactly_one_word() -> None:
    for op, layout in LAYOUTS.items():
        assert layout.size == INSTR_BITS, op
        assert list(layout)[0][0] == "opcode"
        assert [name for name, _ in layout][1:5] == ["pop_prev", "pop_next", "push_prev", "push_next"]


def test_fields_follow_layout_without_overlap() -> None:
    for op, fs in FIELDS.items():
        bit = 4
        for f in fs:
            assert f.offset == bit, (op, f.name)
            bit += f.width
        assert bit <= INSTR_BITS


def test_field_ranges() -> None:
    load = {f.name: f for f in FIELDS[Opcode.LOAD]}
    assert (load["y0"].min, load["y0"].max) == (-32768, 32767)
    assert (load["dram_addr"].min, load["dram_addr"].max) == (0, 2 ** 32 - 1)
    assert (load["elem_dc"].min, load["elem_dc"].max) == (-128, 127)
    assert load["dst"].enum is Memory and (load["dst"].min, load["dst"].max) == (0, 3)


# -- encode / decode -----------------------------------------------------------------------------

@SETTINGS
@given(instructions())
def test_encode_decode_encode(instr: Instruction) -> None:
    word = encode(instr)
    assert len(word) == INSTR_BYTES
    again = decode(word)
    assert again == instr
    assert encode(again) == word
    assert decode(int.from_bytes(word, "little")) == instr


@SETTINGS
@given(instructions())
def test_encode_matches_the_amaranth_layout(instr: Instruction) -> None:
    """The word the encoder writes is the word the RTL decoder's data.StructLayout view reads."""
    values = {"opcode": instr.op}
    for f in FIELDS[instr.op]:
        values[f.name] = instr.get(f.name)
    const = LAYOUTS[instr.op].const(values)
    assert const.as_value().value == int.from_bytes(encode(instr), "little")


@pytest.mark.parametrize("op", list(Opcode), ids=lambda op: op.name)
def test_extreme_values_round_trip(op: Opcode) -> None:
    for instr in _extremes(op):
        assert decode(encode(instr)) == instr
        assert encode(decode(encode(instr))) == encode(instr)


def test_known_encodings() -> None:
    assert encode(Instruction(Opcode.FINISH)) == b"\x06" + bytes(63)
    word = int.from_bytes(encode(Instruction(Opcode.COMPUTE, m=16, k=8, n=8, preload=1, pop_prev=1,
                                             push_next=1)), "little")
    assert word & 0xFF == 0x3 | 1 << 4 | 1 << 7
    fields = {f.name: f for f in FIELDS[Opcode.COMPUTE]}
    assert word >> fields["m"].offset & 0xFFFF == 16
    assert word >> fields["preload"].offset & 1 == 1
    load = encode(Instruction(Opcode.LOAD, dst=Memory.TABLE, y0=-1))
    y0 = {f.name: f for f in FIELDS[Opcode.LOAD]}["y0"]
    assert int.from_bytes(load, "little") >> y0.offset & 0xFFFF == 0xFFFF


def test_default_fields_are_zero_and_enums_read_back() -> None:
    instr = Instruction(Opcode.STORE, act="relu6", pool=PoolMode.MAX, out_type=0)
    assert instr.acc_addr == 0 and instr.act == 2 and instr.pool == 1
    assert instr.get("act") is Activation.RELU6 and instr.get("out_type").name == "INT"
    assert instr.fields["act"] == 2 and list(instr.fields) == [f.name for f in FIELDS[Opcode.STORE]]
    assert Instruction(Opcode.SYNC, queue="store").queue is Queue.STORE
    assert Instruction(Opcode.LOAD).queue is Queue.LOAD and Instruction(Opcode.FINISH).queue is None


def test_instruction_value_semantics() -> None:
    a = Instruction("compute", m=np.int64(16), accumulate=True)
    b = Instruction(Opcode.COMPUTE, accumulate=1, m=16, k=0)
    assert a == b and hash(a) == hash(b) and repr(a) == "Instruction(COMPUTE, m=16, accumulate=1)"
    assert a.replace(k=4) == Instruction(Opcode.COMPUTE, m=16, k=4, accumulate=1)
    with pytest.raises(AttributeError, match=r"^Instruction is immutable; use \.replace\(\)$"):
        a.m = 3  # type: ignore[misc]
    with pytest.raises(AttributeError, match=r"^COMPUTE has no field 'dst'$"):
        _ = a.dst


# -- Instruction errors --------------------------------------------------------------------------

def test_unknown_opcode_name() -> None:
    with pytest.raises(IsaError, match=_exact("unknown opcode 'MOVE'; opcodes are CONFIG, LOAD, COMPUTE, "
                                              "STORE, SYNC, FINISH")):
        Instruction("MOVE")


def test_unknown_field() -> None:
    with pytest.raises(IsaError, match=r"^SYNC has no field 'm'; its fields are pop_prev, pop_next, "
                                       r"push_prev, push_next, queue$"):
        Instruction(Opcode.SYNC, m=1)


@pytest.mark.parametrize(("op", "field", "value", "message"), [
    (Opcode.COMPUTE, "m", 65536, "COMPUTE field m must be in [0, 65535] (16-bit unsigned), not 65536"),
    (Opcode.COMPUTE, "m", -1, "COMPUTE field m must be in [0, 65535] (16-bit unsigned), not -1"),
    (Opcode.LOAD, "y0", -32769, "LOAD field y0 must be in [-32768, 32767] (16-bit signed), not -32769"),
    (Opcode.LOAD, "elem_dc", 128, "LOAD field elem_dc must be in [-128, 127] (8-bit signed), not 128"),
    (Opcode.LOAD, "dram_addr", 2 ** 32, "LOAD field dram_addr must be in [0, 4294967295] (32-bit unsigned), "
                                        "not 4294967296"),
    (Opcode.CONFIG, "avg_shift", 64, "CONFIG field avg_shift must be in [0, 63] (6-bit unsigned), not 64"),
    (Opcode.LOAD, "pop_next", 2, "LOAD field pop_next must be in [0, 1] (1-bit unsigned), not 2"),
    (Opcode.LOAD, "dst", 3, "LOAD field dst has no meaning for value 3"),
    (Opcode.STORE, "pool", 3, "STORE field pool has no meaning for value 3"),
    (Opcode.SYNC, "queue", 3, "SYNC field queue has no meaning for value 3"),
    (Opcode.LOAD, "dst", "dram", "LOAD field dst must be one of spad, acc, table, not 'dram'"),
    (Opcode.STORE, "act", "gelu", "STORE field act must be one of none, relu, relu6, clip, not 'gelu'"),
    (Opcode.COMPUTE, "m", 3.7, "COMPUTE field m must be an integer, not 3.7"),
    (Opcode.COMPUTE, "m", "12", "COMPUTE field m must be an integer, not '12'"),
    (Opcode.COMPUTE, "m", None, "COMPUTE field m must be an integer, not None"),
    (Opcode.LOAD, "dst", Activation.RELU, "LOAD field dst must be an integer, not <Activation.RELU: 1>"),
])
def test_field_value_errors(op: Opcode, field: str, value: object, message: str) -> None:
    with pytest.raises(IsaError, match=_exact(message)):
        Instruction(op, **{field: value})


# -- decode errors -----------------------------------------------------------------------------

@pytest.mark.parametrize("opcode", [0, 7, 8, 15])
def test_decode_illegal_opcode(opcode: int) -> None:
    word = (opcode | 0xF0).to_bytes(INSTR_BYTES, "little")
    with pytest.raises(IsaError, match=_exact(f"field opcode: illegal opcode {opcode}")):
        decode(word)
    with pytest.raises(IsaError, match=_exact(f"instruction 12: field opcode: illegal opcode {opcode}")):
        decode(word, index=12)


@pytest.mark.parametrize(("op", "field", "raw"), [
    (Opcode.LOAD, "dst", 3), (Opcode.STORE, "pool", 3), (Opcode.SYNC, "queue", 3),
])
def test_decode_illegal_enum_value(op: Opcode, field: str, raw: int) -> None:
    f = {f.name: f for f in FIELDS[op]}[field]
    word = (op.value | raw << f.offset).to_bytes(INSTR_BYTES, "little")
    message = f"instruction 3: {op.name} field {field}: illegal value {raw}"
    with pytest.raises(IsaError, match=_exact(message)):
        decode(word, index=3)


@SETTINGS
@given(instructions(), st.data())
def test_decode_rejects_any_reserved_bit(instr: Instruction, data: st.DataObject) -> None:
    used = max(f.offset + f.width for f in FIELDS[instr.op])
    bit = data.draw(st.integers(used, INSTR_BITS - 1), label="reserved bit")
    word = int.from_bytes(encode(instr), "little") | 1 << bit
    message = f"{instr.op.name} field _reserved: reserved bits must be zero"
    with pytest.raises(IsaError, match=_exact(message)):
        decode(word.to_bytes(INSTR_BYTES, "little"))


def test_decode_wrong_length_and_word_past_512_bits() -> None:
    with pytest.raises(IsaError, match=_exact("instruction 0: an instruction is 64 bytes, not 63")):
        decode(bytes(63), index=0)
    with pytest.raises(IsaError, match=_exact("FINISH field _reserved: reserved bits must be zero")):
        decode(6 | 1 << INSTR_BITS)


# -- program binary ----------------------------------------------------------------------------

@SETTINGS
@given(st.lists(instructions(), max_size=12), st.integers(0, 2 ** 64 - 1))
def test_program_round_trip(instrs: list[Instruction], config_hash: int) -> None:
    program = Program(tuple(instrs), config_hash)
    blob = program.to_bytes()
    assert len(blob) == HEADER_BYTES + INSTR_BYTES * len(instrs)
    assert blob[HEADER_BYTES:] == program.words() == b"".join(encode(i) for i in instrs)
    assert Program.from_bytes(blob) == program


def test_program_header_layout() -> None:
    config = AcceleratorConfig()
    blob = Program((Instruction(Opcode.FINISH),) * 3, config.hash).to_bytes()
    assert blob[0:4] == MAGIC == b"SYST"
    assert struct.unpack_from("<HH", blob, 4) == (ISA_VERSION, INSTR_BYTES)
    assert int.from_bytes(blob[8:16], "little") == config.hash
    assert struct.unpack_from("<I", blob, 16) == (3,)
    assert blob[20:32] == bytes(12)


def _blob(count: int = 2, *, magic: bytes = MAGIC, **header: int) -> bytearray:
    blob = bytearray(Program((Instruction(Opcode.SYNC, queue="compute"),) * count, 0x1234).to_bytes())
    blob[0:4] = magic
    if "version" in header:
        blob[4:6] = header["version"].to_bytes(2, "little")
    if "size" in header:
        blob[6:8] = header["size"].to_bytes(2, "little")
    return blob


def test_program_header_errors() -> None:
    with pytest.raises(ProgramError, match=_exact("p.bin: a program starts with a 32-byte header, "
                                                  "but the file has 31 bytes")):
        Program.from_bytes(bytes(_blob())[:31], source="p.bin")
    with pytest.raises(ProgramError, match=_exact("p.bin: not a systolic program (magic must be b'SYST', "
                                                  "not b'\\x7fELF')")):
        Program.from_bytes(bytes(_blob(magic=b"\x7fELF")), source="p.bin")
    # a binary of ISA v1 (separately rounded residual, ties up) is rejected, and so is a newer one
    assert ISA_VERSION == 2
    with pytest.raises(ProgramError, match=_exact("program: ISA version must be 2, not 1")):
        Program.from_bytes(bytes(_blob(version=1)))
    with pytest.raises(ProgramError, match=_exact("program: ISA version must be 2, not 3")):
        Program.from_bytes(bytes(_blob(version=3)))
    with pytest.raises(ProgramError, match=_exact("program: instruction size must be 64 bytes, not 32")):
        Program.from_bytes(bytes(_blob(size=32)))


def test_program_truncated_or_padded() -> None:
    blob = bytes(_blob(count=2))
    with pytest.raises(ProgramError, match=_exact("p.bin: header says 2 instructions (160 bytes) "
                                                  "but the file has 159 bytes")):
        Program.from_bytes(blob[:-1], source="p.bin")
    with pytest.raises(ProgramError, match=_exact("p.bin: header says 2 instructions (160 bytes) "
                                                  "but the file has 224 bytes")):
        Program.from_bytes(blob + bytes(INSTR_BYTES), source="p.bin")


def test_program_bad_instruction_names_its_index() -> None:
    blob = _blob(count=3)
    blob[HEADER_BYTES + 2 * INSTR_BYTES] = 0   # third instruction's opcode
    with pytest.raises(ProgramError, match=_exact("p.bin: instruction 2: field opcode: illegal opcode 0")):
        Program.from_bytes(bytes(blob), source="p.bin")


def test_program_config_hash_mismatch() -> None:
    built_for = AcceleratorConfig(rows=16)
    program = Program((Instruction(Opcode.FINISH),), built_for.hash)
    program.check_config(built_for)
    other = AcceleratorConfig()
    with pytest.raises(ProgramError, match=_exact(
            f"program was built for config {built_for.hash_hex}, but the accelerator's config is "
            f"{other.hash_hex}; recompile for this config")):
        program.check_config(other)


def test_errors_are_value_errors() -> None:
    assert issubclass(IsaError, ValueError) and issubclass(ProgramError, ValueError)
