"""ISA v2 of the systolic accelerator, defined once.

Every instruction is one 512-bit (64-byte) little-endian word. Its fields are described by
``amaranth.lib.data`` layouts (:data:`LAYOUTS`), which the RTL decoder views directly; the Python
encoder, decoder, assembler and disassembler derive their bit positions from the same layouts.
The meaning of each field is in ``docs/isa.md``; the golden model (``systolic.sim.golden``) is the
executable form of that meaning.
"""

from __future__ import annotations

import operator
import struct
from dataclasses import dataclass
from typing import Any

from amaranth import Shape, signed, unsigned
from amaranth.lib import data, enum

__all__ = [
    "ISA_VERSION", "INSTR_BITS", "INSTR_BYTES", "MAGIC", "HEADER_BYTES",
    "Opcode", "Memory", "Activation", "PoolMode", "OutType", "Queue",
    "HEADER_LAYOUT", "LAYOUTS", "INSTRUCTION_LAYOUT", "QUEUE_OF",
    "Field", "FIELDS", "Instruction", "IsaError", "ProgramError",
    "encode", "decode", "Program",
]

#: Version 2: one rounding for the residual term, SFU rounding half to even (docs/isa.md STORE).
ISA_VERSION = 2
INSTR_BITS = 512
INSTR_BYTES = INSTR_BITS // 8
MAGIC = b"SYST"
HEADER_BYTES = 32


class IsaError(ValueError):
    """An instruction cannot be encoded or decoded: the message names the instruction and field."""


class ProgramError(ValueError):
    """A program binary is malformed or was built for another configuration."""


class Opcode(enum.Enum, shape=4):
    """Operation code, bits [3:0] of every instruction. 0 is illegal so that zeroed memory halts."""
    CONFIG = 1
    LOAD = 2
    COMPUTE = 3
    STORE = 4
    SYNC = 5
    FINISH = 6


class Memory(enum.Enum, shape=2):
    """Destination of a LOAD."""
    SPAD = 0     #: scratchpad rows of input/weight elements
    ACC = 1      #: accumulator rows
    TABLE = 2    #: requantize table rows (bias, multiplier, shift per channel)


class Activation(enum.Enum, shape=2):
    NONE = 0
    RELU = 1
    RELU6 = 2
    CLIP = 3


class PoolMode(enum.Enum, shape=2):
    NONE = 0
    MAX = 1
    AVG = 2


class OutType(enum.Enum, shape=1):
    INT = 0      #: requantized to the output (input) element type
    RAW = 1      #: raw accumulator elements


class Queue(enum.Enum, shape=2):
    LOAD = 0
    COMPUTE = 1
    STORE = 2


# Bits [7:0] of every instruction. Dependency tokens flow between neighbouring queues,
# load <-> compute <-> store: "prev" of compute is load, "next" of compute is store.
HEADER_LAYOUT = data.StructLayout({
    "opcode": Opcode,
    "pop_prev": unsigned(1),   # wait for (and consume) a token from the previous queue
    "pop_next": unsigned(1),   # wait for (and consume) a token from the next queue
    "push_prev": unsigned(1),  # after completing, give a token to the previous queue
    "push_next": unsigned(1),  # after completing, give a token to the next queue
})

_HEADER_FIELDS = {name: f.shape for name, f in HEADER_LAYOUT}


def _layout(fields: dict[str, Any]) -> data.StructLayout:
    layout = {**_HEADER_FIELDS, **fields}
    used = sum(Shape.cast(s).width for s in layout.values())
    assert used <= INSTR_BITS, used
    layout["_reserved"] = unsigned(INSTR_BITS - used)
    return data.StructLayout(layout)


LAYOUTS: dict[Opcode, data.StructLayout] = {
    Opcode.CONFIG: _layout({
        "zp_out": signed(16),      # zero point added after requantize
        "act_lo": signed(16),      # CLIP lower bound (output domain)
        "act_hi": signed(16),      # RELU6 / CLIP upper bound (output domain)
        "avg_mult": signed(32),    # average pooling: fixed-point multiplier
        "avg_shift": unsigned(6),  # average pooling: right shift
        "res_zp": signed(16),      # residual: zero point subtracted from the residual element
        "res_mult": signed(32),    # residual: multiplier (shares the table entry's shift)
        "tie_out": unsigned(1),    # requantize ties go to an even output (1) or pre-zero-point value (0)
        "avg_tie_out": unsigned(1),  # the same choice for the average pooling's rounding
    }),
    Opcode.LOAD: _layout({
        "dst": Memory,
        "widen": unsigned(1),      # ACC only: DRAM holds input-type elements, sign/zero-extended
        "dst_addr": unsigned(16),  # first destination row
        "dst_col": unsigned(8),    # first destination element within each row
        "dram_addr": unsigned(32), # byte address of coordinate (0, 0, 0)
        "pitch_y": unsigned(24),   # bytes per unit of y
        "pitch_x": unsigned(24),   # bytes per unit of x
        "pitch_c": unsigned(24),   # bytes per unit of c
        "bounded": unsigned(1),    # 1: coordinates outside [0,height) x [0,width) read pad_value
        "height": unsigned(16),
        "width": unsigned(16),
        "y0": signed(16),          # start coordinate
        "x0": signed(16),
        "pad_value": signed(16),
        "rows_outer": unsigned(16),  # destination rows = rows_outer * rows_inner
        "rows_inner": unsigned(16),
        "segs": unsigned(8),       # elements per row = segs * seg_len
        "seg_len": unsigned(8),
        "outer_dy": signed(8), "outer_dx": signed(8), "outer_dc": signed(8),
        "inner_dy": signed(8), "inner_dx": signed(8), "inner_dc": signed(8),
        "seg_dy": signed(8), "seg_dx": signed(8), "seg_dc": signed(8),
        "elem_dy": signed(8), "elem_dx": signed(8), "elem_dc": signed(8),
    }),
    Opcode.COMPUTE: _layout({
        "a_addr": unsigned(16),    # first scratchpad row of operand A (WS: A rows; OS: A^T rows)
        "b_addr": unsigned(16),    # first scratchpad row of operand B (K rows of N weights)
        "acc_addr": unsigned(16),  # first accumulator row written
        "m": unsigned(16),
        "k": unsigned(16),
        "n": unsigned(8),
        "accumulate": unsigned(1), # 1: add to the accumulator rows; 0: overwrite them
        "preload": unsigned(1),    # WS: 1 loads B as new stationary weights; 0 reuses them
    }),
    Opcode.STORE: _layout({
        "acc_addr": unsigned(16),  # accumulator row of input pixel (0, 0)
        "n": unsigned(8),          # channels (elements per row) stored
        "in_h": unsigned(16),      # accumulator rows form an in_h x in_w image
        "in_w": unsigned(16),
        "out_h": unsigned(16),     # output pixels written
        "out_w": unsigned(16),
        "dram_addr": unsigned(32),
        "pitch_y": unsigned(24),   # bytes per output row (oy)
        "pitch_x": unsigned(24),   # bytes per output column (ox)
        "pitch_c": unsigned(24),   # bytes per channel
        "out_type": OutType,
        "act": Activation,
        "pool": PoolMode,
        "pool_h": unsigned(8),
        "pool_w": unsigned(8),
        "stride_h": unsigned(8),
        "stride_w": unsigned(8),
        "pad_top": unsigned(8),
        "pad_left": unsigned(8),
        "qrow": unsigned(16),      # requantize table row holding channels 0..n-1
        "residual": unsigned(1),   # add a residual tensor read from res_addr
        "res_addr": unsigned(32),  # residual element of (oy, ox, c) is at res_addr + the same offset
    }),
    Opcode.SYNC: _layout({
        "queue": Queue,            # queue that executes this token-only instruction
    }),
    Opcode.FINISH: _layout({}),
}

#: The whole instruction word as the RTL decoder sees it: one view per opcode.
INSTRUCTION_LAYOUT = data.UnionLayout({
    "header": HEADER_LAYOUT,
    **{op.name.lower(): layout for op, layout in LAYOUTS.items()},
})

QUEUE_OF: dict[Opcode, Queue | None] = {
    Opcode.CONFIG: Queue.STORE,
    Opcode.LOAD: Queue.LOAD,
    Opcode.COMPUTE: Queue.COMPUTE,
    Opcode.STORE: Queue.STORE,
    Opcode.SYNC: None,        # given by its queue field
    Opcode.FINISH: None,      # executed by the dispatcher once every queue is idle
}


@dataclass(frozen=True)
class Field:
    """One field's position, derived from :data:`LAYOUTS`."""
    name: str
    offset: int
    width: int
    signed: bool
    enum: type | None

    @property
    def min(self) -> int:
        return -(1 << (self.width - 1)) if self.signed else 0

    @property
    def max(self) -> int:
        return (1 << (self.width - 1)) - 1 if self.signed else (1 << self.width) - 1


def _fields_of(layout: data.StructLayout) -> tuple[Field, ...]:
    out = []
    for name, f in layout:
        if name in ("opcode", "_reserved"):
            continue
        if isinstance(f.shape, enum.EnumType):
            out.append(Field(name, f.offset, f.width, False, f.shape))
        else:
            shape = f.shape
            out.append(Field(name, f.offset, f.width, shape.signed, None))
    return tuple(out)


#: Field table per opcode, in layout order (the header flags first).
FIELDS: dict[Opcode, tuple[Field, ...]] = {op: _fields_of(layout) for op, layout in LAYOUTS.items()}
_FIELD_BY_NAME = {op: {f.name: f for f in fs} for op, fs in FIELDS.items()}
_USED_BITS = {op: max(f.offset + f.width for f in fs) if fs else 4 for op, fs in FIELDS.items()}


class Instruction:
    """An immutable instruction: an opcode and integer field values (enums by value or member).

    Fields left out are 0. ``Instruction(Opcode.COMPUTE, m=16, k=8, n=8, preload=1)``
    """

    __slots__ = ("op", "_values")

    def __init__(self, op: Opcode | str, **values: Any) -> None:
        if isinstance(op, str):
            try:
                op = Opcode[op.upper()]
            except KeyError:
                raise IsaError(f"unknown opcode {op!r}; opcodes are "
                               f"{', '.join(o.name for o in Opcode)}") from None
        table = _FIELD_BY_NAME[op]
        normalized = {}
        for name, value in values.items():
            f = table.get(name)
            if f is None:
                raise IsaError(f"{op.name} has no field {name!r}; its fields are "
                               f"{', '.join(table)}")
            if f.enum is not None:
                if isinstance(value, str):
                    try:
                        value = f.enum[value.upper()]
                    except KeyError:
                        raise IsaError(f"{op.name} field {name} must be one of "
                                       f"{', '.join(m.name.lower() for m in f.enum)}, "
                                       f"not {value!r}") from None
                if isinstance(value, f.enum):
                    value = value.value
            if isinstance(value, bool):
                value = int(value)
            if not isinstance(value, int):
                try:
                    value = operator.index(value)  # numpy integers; not floats or strings
                except TypeError:
                    raise IsaError(f"{op.name} field {name} must be an integer, not {value!r}") from None
            if not f.min <= value <= f.max:
                raise IsaError(f"{op.name} field {name} must be in [{f.min}, {f.max}] "
                               f"({f.width}-bit {'signed' if f.signed else 'unsigned'}), not {value}")
            if f.enum is not None:
                try:
                    f.enum(value)
                except ValueError:
                    raise IsaError(f"{op.name} field {name} has no meaning for value {value}") from None
            if value:
                normalized[name] = value
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "_values", normalized)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Instruction is immutable; use .replace()")

    def __getattr__(self, name: str) -> int:
        try:
            table = _FIELD_BY_NAME[object.__getattribute__(self, "op")]
        except AttributeError:
            raise AttributeError(name) from None
        if name not in table:
            raise AttributeError(f"{self.op.name} has no field {name!r}")
        return self._values.get(name, 0)

    def get(self, name: str) -> Any:
        """Field value; enum fields as their enum member."""
        f = _FIELD_BY_NAME[self.op][name]
        value = self._values.get(name, 0)
        return f.enum(value) if f.enum is not None else value

    @property
    def fields(self) -> dict[str, int]:
        """Every field of this opcode with its integer value, in layout order."""
        return {f.name: self._values.get(f.name, 0) for f in FIELDS[self.op]}

    @property
    def queue(self) -> Queue | None:
        if self.op is Opcode.SYNC:
            return Queue(self._values.get("queue", 0))
        return QUEUE_OF[self.op]

    def replace(self, **changes: Any) -> Instruction:
        return Instruction(self.op, **{**self._values, **changes})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Instruction) and self.op == other.op and self._values == other._values

    def __hash__(self) -> int:
        return hash((self.op, tuple(sorted(self._values.items()))))

    def __repr__(self) -> str:
        body = ", ".join(f"{k}={v}" for k, v in self._values.items())
        return f"Instruction({self.op.name}{', ' if body else ''}{body})"


def encode(instr: Instruction) -> bytes:
    """The 64-byte little-endian word of an instruction."""
    word = instr.op.value
    for f in FIELDS[instr.op]:
        value = instr._values.get(f.name, 0)
        word |= (value & ((1 << f.width) - 1)) << f.offset
    return word.to_bytes(INSTR_BYTES, "little")


def decode(word: bytes | int, *, index: int | None = None) -> Instruction:
    """Decode one instruction word; ``index`` names the instruction in errors."""
    where = f"instruction {index}: " if index is not None else ""
    if isinstance(word, bytes | bytearray | memoryview):
        if len(word) != INSTR_BYTES:
            raise IsaError(f"{where}an instruction is {INSTR_BYTES} bytes, not {len(word)}")
        word = int.from_bytes(word, "little")
    opcode = word & 0xF
    try:
        op = Opcode(opcode)
    except ValueError:
        raise IsaError(f"{where}field opcode: illegal opcode {opcode}") from None
    values = {}
    for f in FIELDS[op]:
        raw = (word >> f.offset) & ((1 << f.width) - 1)
        if f.signed and raw >> (f.width - 1):
            raw -= 1 << f.width
        if f.enum is not None:
            try:
                f.enum(raw)
            except ValueError:
                raise IsaError(f"{where}{op.name} field {f.name}: illegal value {raw}") from None
        if raw:
            values[f.name] = raw
    if word >> _USED_BITS[op]:
        raise IsaError(f"{where}{op.name} field _reserved: reserved bits must be zero")
    return Instruction(op, **values)


@dataclass(frozen=True)
class Program:
    """A list of instructions built for one configuration (identified by its hash).

    Binary form: a 32-byte header — magic ``SYST``, u16 ISA version, u16 instruction size,
    u64 config hash, u32 instruction count, 12 reserved zero bytes — then the instruction words.
    """

    instructions: tuple[Instruction, ...]
    config_hash: int

    def to_bytes(self) -> bytes:
        header = struct.pack("<4sHHQI12x", MAGIC, ISA_VERSION, INSTR_BYTES, self.config_hash,
                             len(self.instructions))
        return header + b"".join(encode(i) for i in self.instructions)

    def words(self) -> bytes:
        """The instruction words alone, as the accelerator fetches them from DRAM."""
        return b"".join(encode(i) for i in self.instructions)

    @classmethod
    def from_bytes(cls, blob: bytes, *, source: str = "program") -> Program:
        if len(blob) < HEADER_BYTES:
            raise ProgramError(f"{source}: a program starts with a {HEADER_BYTES}-byte header, "
                               f"but the file has {len(blob)} bytes")
        magic, version, size, config_hash, count = struct.unpack_from("<4sHHQI", blob)
        if magic != MAGIC:
            raise ProgramError(f"{source}: not a systolic program (magic must be {MAGIC!r}, "
                               f"not {magic!r})")
        if version != ISA_VERSION:
            raise ProgramError(f"{source}: ISA version must be {ISA_VERSION}, not {version}")
        if size != INSTR_BYTES:
            raise ProgramError(f"{source}: instruction size must be {INSTR_BYTES} bytes, not {size}")
        expected = HEADER_BYTES + count * INSTR_BYTES
        if len(blob) != expected:
            raise ProgramError(f"{source}: header says {count} instructions ({expected} bytes) "
                               f"but the file has {len(blob)} bytes")
        instrs = []
        for i in range(count):
            start = HEADER_BYTES + i * INSTR_BYTES
            try:
                instrs.append(decode(blob[start:start + INSTR_BYTES], index=i))
            except IsaError as exc:
                raise ProgramError(f"{source}: {exc}") from None
        return cls(tuple(instrs), config_hash)

    def check_config(self, config: Any) -> None:
        """Raise unless this program was built for ``config``."""
        if self.config_hash != config.hash:
            raise ProgramError(
                f"program was built for config {self.config_hash:016x}, "
                f"but the accelerator's config is {config.hash:016x}; recompile for this config")
