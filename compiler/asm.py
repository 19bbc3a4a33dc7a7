"""Assembler and disassembler for the textual form of ISA v2 (docs/isa.md, "Assembly").

One instruction per line: the opcode, then ``field=value`` pairs in any order::

    LOAD dst=spad dram_addr=0x1000 pitch_y=8 pitch_c=1 rows_outer=1 rows_inner=16 segs=1 seg_len=8
    COMPUTE b_addr=16 m=16 k=8 n=8 preload pop_prev push_next   # flags may be written bare

Opcodes, field names and enum names are case-insensitive on input. Values are decimal, ``0x``
hex or ``0b`` binary integers with an optional ``-``; enumerated fields take their names
(``dst=acc``). ``#`` or ``;`` starts a comment. Fields left out are 0.

The disassembler writes the canonical form, which assembles back to the same words: the opcode,
then the operation's fields in layout order — every enumerated field by its lowercase name,
one-bit flags bare when set, other fields as ``name=value`` when nonzero (DRAM byte addresses
``dram_addr`` and ``res_addr`` in hex) — and last the token flags (``pop_prev pop_next push_prev
push_next``), where the examples in docs/isa.md put them.

Field positions, widths and ranges all come from :data:`systolic.hw.isa.FIELDS`; range errors
reuse the :class:`~systolic.hw.isa.IsaError` text of :class:`~systolic.hw.isa.Instruction`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from systolic.hw.isa import FIELDS, HEADER_LAYOUT, Field, Instruction, IsaError, Opcode

__all__ = ["AsmError", "assemble", "disassemble", "format_instruction"]


class AsmError(ValueError):
    """A line of assembly is malformed. The message is ``"{source}:{line}: {reason}"``."""


#: Header flags (dependency tokens), written after the operation's fields.
_TOKEN_FLAGS = tuple(name for name, _ in HEADER_LAYOUT if name != "opcode")
#: Fields holding DRAM byte addresses: written in hex.
_HEX_FIELDS = frozenset({"dram_addr", "res_addr"})

_FIELD_BY_NAME: dict[Opcode, dict[str, Field]] = {op: {f.name: f for f in fs} for op, fs in FIELDS.items()}
_NUMBER = re.compile(r"-?(?:0x[0-9a-f]+|0b[01]+|[0-9]+)", re.IGNORECASE)


def _is_flag(f: Field) -> bool:
    return f.enum is None and not f.signed and f.width == 1


def _parse_number(text: str) -> int | None:
    """The integer written as ``text`` (decimal, 0x hex, 0b binary, optional '-'), else None."""
    if not _NUMBER.fullmatch(text):
        return None
    negative = text.startswith("-")
    digits = text[1:] if negative else text
    value = int(digits, 0) if digits[:2].lower() in ("0x", "0b") else int(digits, 10)
    return -value if negative else value


def _parse_value(op: Opcode, f: Field, text: str) -> int | str:
    """A field's value as written: an enum name (checked by Instruction) or an integer."""
    if f.enum is not None:
        if _parse_number(text) is not None:
            names = ", ".join(m.name.lower() for m in f.enum)
            raise IsaError(f"{op.name} field {f.name} takes a name ({names}), not the number {text}")
        return text
    value = _parse_number(text)
    if value is None:
        raise IsaError(f"{op.name} field {f.name}: {text!r} is not a number "
                       f"(write decimal, 0x hex or 0b binary, with '-' if negative)")
    return value


def _assemble_line(body: str) -> Instruction:
    """One instruction from a line with its comment removed. Raises IsaError with the reason."""
    opcode_text, *tokens = body.split()
    op = Instruction(opcode_text).op   # its IsaError names the unknown opcode and the known ones
    table = _FIELD_BY_NAME[op]
    values: dict[str, int | str] = {}
    for token in tokens:
        name, equals, text = token.partition("=")
        name = name.lower()
        if not name:
            raise IsaError(f"{op.name}: {token!r} has no field name before '=' "
                           f"(write field=value without spaces)")
        f = table.get(name)
        if f is None:
            raise IsaError(f"{op.name} has no field {name!r}; its fields are {', '.join(table)}")
        if name in values:
            raise IsaError(f"{op.name} field {name} is given twice")
        if not equals:
            if not _is_flag(f):
                raise IsaError(f"{op.name} field {name} needs a value: write {name}=VALUE "
                               f"(only one-bit flags may be written bare)")
            values[name] = 1
        elif not text:
            raise IsaError(f"{op.name} field {name} has no value after '=' "
                           f"(write {name}=VALUE without spaces)")
        else:
            values[name] = _parse_value(op, f, text)
    return Instruction(op, **values)


def assemble(text: str, *, source: str = "<string>") -> list[Instruction]:
    """Assemble ``text`` into instructions, one per non-empty line.

    ``source`` names the text in errors, which are :class:`AsmError` ``"{source}:{line}: {reason}"``
    with 1-based line numbers.
    """
    instructions = []
    for number, line in enumerate(text.splitlines(), start=1):
        body = re.split(r"[#;]", line, maxsplit=1)[0]
        if not body.strip():
            continue
        try:
            instructions.append(_assemble_line(body))
        except IsaError as exc:
            raise AsmError(f"{source}:{number}: {exc}") from None
    return instructions


def format_instruction(instr: Instruction) -> str:
    """The canonical assembly of one instruction (no newline)."""
    parts = [instr.op.name]
    tokens = []
    for f in FIELDS[instr.op]:
        value = getattr(instr, f.name)
        if f.enum is not None:
            text = f"{f.name}={f.enum(value).name.lower()}"
        elif not value:
            continue
        elif _is_flag(f):
            text = f.name
        elif f.name in _HEX_FIELDS:
            text = f"{f.name}={value:#x}"
        else:
            text = f"{f.name}={value}"
        (tokens if f.name in _TOKEN_FLAGS else parts).append(text)
    return " ".join(parts + tokens)


def disassemble(instrs: Iterable[Instruction]) -> str:
    """Canonical assembly of ``instrs``, one line each, each line ending in a newline."""
    return "".join(format_instruction(i) + "\n" for i in instrs)
