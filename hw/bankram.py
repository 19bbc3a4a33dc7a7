"""One bank of the scratchpad or the accumulator: a simple dual-port block RAM whose read data is
registered.

:class:`BankRAM` has a write port (``write_addr``, ``write_data``, ``write_en`` with one enable
bit per element of the row) and a read port (``read_addr``, ``read_en``) like those of an
:class:`amaranth.lib.memory.Memory` with a synchronous read port, and ``read_data``: the row read
from ``read_addr`` two cycles after it was presented (the block RAM reads at the first clock edge,
its data is registered at the second). The user drives the ports from registers of its own, so
that the block RAM's inputs and its read data are registers on both sides.

A read of a row in the cycle it is written has no defined result: the scratchpad and the
accumulator never use one (docs/arch-memory-sfu.md). In simulation the memory returns the new row
(``transparent``) or the old one.

* Generic platforms: a ``Memory`` carrying :data:`~systolic.hw.rtlil.UNDEFINED_COLLISION` (no
  collision logic after synthesis) and a register on its read data.
* Lattice ECP5 (``platform.family == "ecp5"``), elements of a multiple of 8 bits and
  :data:`DP16KD_ROWS` to :data:`DP16KD_MAX_ROWS` rows (:func:`uses_dp16kd`): DP16KD instances
  in their 1024 x 18 mode (two 9-bit bytes, 8 data bits used in each), port A writing with its
  byte enables, port B reading through the block RAM's own output register (REGMODE_B
  "OUTREG"), which yosys never uses. Its clock-to-output is
  far shorter than the block RAM's (5.8 ns at speed grade 6), so the route from a block RAM the
  placer put far away to the logic that uses the row has most of the cycle. A bank deeper than
  1024 rows stacks up to 8 DP16KD deep, chip-select decoded (CSDECODE), and picks the row from
  their output registers by the read address of two cycles before.
* ECP5, elements of a multiple of 8 bits and :data:`DP16KD_WIDE_MIN_ROWS` to
  :data:`DP16KD_WIDE_ROWS` rows: DP16KD instances in their 512 x 36 pseudo-dual-port mode (four
  9-bit bytes: port A's 36 data inputs, DIA17:0 and DIB17:0, write the word at ADA13:5 with the
  byte enables ADA3:0; port B reads the word at ADB13:5 onto DOA17:0 and DOB17:0), the mode
  yosys maps such a memory to, so the bank takes the same block RAMs, but read through the
  output register (REGMODE_A and REGMODE_B "OUTREG": which of the two governs the output
  register in this mode is not documented, so both are set). Shallower banks are left to yosys
  (distributed RAM for the smallest).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.hdl import ClockSignal, Instance, Shape, ShapeLike, Value, ValueLike
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from .dsp import fabric_copy, is_ecp5
from .rtlil import UNDEFINED_COLLISION

__all__ = ["BankRAM", "DP16KD_ROWS", "DP16KD_MAX_ROWS", "DP16KD_WIDE_ROWS", "DP16KD_WIDE_MIN_ROWS",
           "DP16KDPort", "dp16kd", "dp16kd_wide", "dp16kd_initval", "uses_dp16kd"]

#: Rows of one DP16KD in the 1024 x 18 mode.
DP16KD_ROWS = 1024
#: Deepest bank built from DP16KD: 8 deep, decoded by the three chip-select pins.
DP16KD_MAX_ROWS = 8 * DP16KD_ROWS
#: Rows of one DP16KD in the 512 x 36 mode, the deepest bank built from it.
DP16KD_WIDE_ROWS = 512
#: The shallowest bank built from DP16KD in the 512 x 36 mode.
DP16KD_WIDE_MIN_ROWS = 128


@dataclass(frozen=True)
class DP16KDPort:
    """One port (A or B) of a DP16KD in its 1024 x 18 mode, wired as yosys' brams_map_16kd.v wires
    a 1024 x 16 port with two byte enables: the word address ``addr`` (up to 10 bits) on AD13:4
    (AD3:2 zero), the byte enables ``byte_enables`` (2 bits) on AD1:0, the 16 bits of ``data`` as
    two 8-bit bytes in the 9-bit byte lanes DI7:0 and DI16:9 (DI8, DI17 zero), the read data from
    DO7:0 and DO16:9.

    ``enable`` is CE (the port does nothing while it is low), ``write`` WE (with ``enable``: a
    write of the enabled bytes, else a read), ``chip_select`` CS2:0 (compared with the
    instance's CSDECODE). WRITEMODE NORMAL: the data latch keeps its value during a write.
    ``output_register``: REGMODE "OUTREG", the read data is the data latch one cycle later while
    ``output_enable`` (OCE) is high, so a read's data comes two cycles after the read; else
    "NOREG". ``read``: the port's read data is used (DO connected)."""

    addr: ValueLike
    enable: ValueLike
    write: ValueLike = 0
    byte_enables: ValueLike = 0
    data: ValueLike = 0
    chip_select: ValueLike = 0
    output_register: bool = False
    output_enable: ValueLike = 0
    read: bool = True


def dp16kd_initval(words: Sequence[int]) -> dict[str, Const]:
    """The INITVAL_00 to INITVAL_3F parameters of a DP16KD in its 1024 x 18 mode that hold
    ``words`` (at most 1024 values of 18 bits, as they appear on DO17:0; the rest 0), as
    ``Instance`` keyword arguments (``p_INITVAL_00``, ...): INITVAL_k holds words 16k to 16k + 15,
    word j of them in bits 20j to 20j + 17 (as yosys writes them)."""
    assert len(words) <= DP16KD_ROWS and all(0 <= w < 1 << 18 for w in words)
    params = {}
    for k in range(DP16KD_ROWS // 16):
        value = 0
        for j, word in enumerate(words[16 * k:16 * k + 16]):
            value |= word << (20 * j)
        params[f"p_INITVAL_{k:02X}"] = Const(value, 320)
    return params


def dp16kd(m: Module, name: str, *, a: DP16KDPort | None = None, b: DP16KDPort | None = None,
           csdecode: int = 0, init: Sequence[int] = ()) -> tuple[Value | None, Value | None]:
    """Add to ``m`` (as submodule ``name``) one ECP5 DP16KD in its 1024 x 18 mode with ports ``a``
    and ``b`` (:class:`DP16KDPort`; None: the port is tied off, its clock included), both ports'
    CSDECODE ``csdecode`` (0 to 7) and the 16-bit words ``init`` (at most 1024) as its initial
    contents (0 past them). Returns the 16 bits of read data of port A and of port B (None for a
    port that is tied off or not ``read``)."""
    assert 0 <= csdecode < 8, csdecode
    assert all(0 <= word < 1 << 16 for word in init)
    zero = Const(0, 1)
    ports: dict[str, Any] = {
        "p_DATA_WIDTH_A": 18, "p_DATA_WIDTH_B": 18,
        "p_WRITEMODE_A": "NORMAL", "p_WRITEMODE_B": "NORMAL", "p_RESETMODE": "SYNC",
        "p_ASYNC_RESET_RELEASE": "SYNC",
        "p_CSDECODE_A": f"0b{csdecode:03b}", "p_CSDECODE_B": f"0b{csdecode:03b}",
        "p_CLKAMUX": "CLKA", "p_CLKBMUX": "CLKB", "p_GSR": "AUTO",
    }
    if init:
        # a word's two bytes sit in the 9-bit byte lanes, as the ports carry them
        ports.update(dp16kd_initval([(word & 0xFF) | (word >> 8) << 9 for word in init]))
    outputs: list[Value | None] = []
    for side, port in (("A", a), ("B", b)):
        if port is None:
            port = DP16KDPort(addr=0, enable=0, read=False)
            clock: Value = zero
        else:
            clock = ClockSignal("sync")
        addr, byte_enables, data = (Value.cast(port.addr), Value.cast(port.byte_enables),
                                    Value.cast(port.data))
        assert len(addr) <= 10 and len(byte_enables) <= 2 and len(data) <= 16, \
            (len(addr), len(byte_enables), len(data))
        address = Cat(byte_enables, Const(0, 2 - len(byte_enables)), Const(0, 2), addr,
                      Const(0, 10 - len(addr)))
        data = Cat(data, Const(0, 16 - len(data)))
        data_in = Cat(data[:8], zero, data[8:], zero)
        ports.update({
            f"p_REGMODE_{side}": "OUTREG" if port.output_register else "NOREG",
            f"i_CLK{side}": clock, f"i_CE{side}": port.enable, f"i_OCE{side}": port.output_enable,
            f"i_WE{side}": port.write, f"i_RST{side}": zero,
        })
        chip_select = Cat(Value.cast(port.chip_select), Const(0, 3))
        for i in range(3):
            ports[f"i_CS{side}{i}"] = chip_select[i]
        for i in range(14):
            ports[f"i_AD{side}{i}"] = address[i]
        for i in range(18):
            ports[f"i_DI{side}{i}"] = data_in[i]
        if port.read:
            data_out = Signal(18, name=f"{name}_do{side.lower()}")
            for i in range(18):
                ports[f"o_DO{side}{i}"] = data_out[i]
            outputs.append(Cat(data_out[:8], data_out[9:17]))
        else:
            outputs.append(None)
    m.submodules[name] = Instance("DP16KD", **ports)
    return outputs[0], outputs[1]


def uses_dp16kd(platform: Any, shape: ShapeLike, depth: int) -> bool:
    """Whether a :class:`BankRAM` of ``depth`` rows of ``shape`` is built from DP16KD instances
    on ``platform``: ECP5, elements (of an array layout; the whole row otherwise) a multiple of
    8 bits wide, and :data:`DP16KD_WIDE_MIN_ROWS` to :data:`DP16KD_WIDE_ROWS` rows (the 512 x 36
    mode) or :data:`DP16KD_ROWS` to :data:`DP16KD_MAX_ROWS` rows (the 1024 x 18 mode)."""
    layout = shape if isinstance(shape, data.ArrayLayout) else None
    elem_bits = Shape.cast(layout.elem_shape).width if layout is not None else Shape.cast(shape).width
    return (is_ecp5(platform) and elem_bits % 8 == 0
            and (DP16KD_WIDE_MIN_ROWS <= depth <= DP16KD_WIDE_ROWS
                 or DP16KD_ROWS <= depth <= DP16KD_MAX_ROWS))


def dp16kd_wide(m: Module, name: str, *, write_addr: ValueLike, byte_enables: ValueLike,
                data: ValueLike, read_addr: ValueLike) -> Value:
    """Add to ``m`` (as submodule ``name``) one ECP5 DP16KD in its 512 x 36 pseudo-dual-port
    mode: at each clock edge it writes the enabled bytes (``byte_enables``, 4 bits) of ``data``
    (32 bits, one byte to each 9-bit byte lane) to the word ``write_addr`` (up to 9 bits), and
    reads the word ``read_addr``, whose 32 data bits it returns two cycles after the read
    address, through the output register."""
    write_addr, read_addr = Value.cast(write_addr), Value.cast(read_addr)
    byte_enables, data = Value.cast(byte_enables), Value.cast(data)
    assert len(write_addr) <= 9 and len(read_addr) <= 9 and len(byte_enables) == 4 and len(data) == 32
    zero = Const(0, 1)
    clock = ClockSignal("sync")
    lanes = Cat(*(Cat(data[8 * i:8 * i + 8], zero) for i in range(4)))        # 36 bits
    ports: dict[str, Any] = {
        "p_DATA_WIDTH_A": 36, "p_DATA_WIDTH_B": 36, "p_REGMODE_A": "OUTREG", "p_REGMODE_B": "OUTREG",
        "p_WRITEMODE_A": "NORMAL", "p_WRITEMODE_B": "NORMAL", "p_RESETMODE": "SYNC",
        "p_ASYNC_RESET_RELEASE": "SYNC", "p_CSDECODE_A": "0b000", "p_CSDECODE_B": "0b000",
        "p_CLKAMUX": "CLKA", "p_CLKBMUX": "CLKB", "p_GSR": "AUTO",
        "i_CLKA": clock, "i_CEA": byte_enables.any(), "i_OCEA": 1, "i_WEA": 1, "i_RSTA": zero,
        "i_CLKB": clock, "i_CEB": 1, "i_OCEB": 1, "i_WEB": zero, "i_RSTB": zero,
    }
    write_address = Cat(byte_enables, zero, write_addr, Const(0, 9 - len(write_addr)))
    read_address = Cat(Const(0, 5), read_addr, Const(0, 9 - len(read_addr)))
    for i in range(14):
        ports[f"i_ADA{i}"] = write_address[i]
        ports[f"i_ADB{i}"] = read_address[i]
    for side in "AB":
        for i in range(3):
            ports[f"i_CS{side}{i}"] = zero
    data_out = Signal(36, name=f"{name}_do")
    for i in range(18):
        ports[f"i_DIA{i}"] = lanes[i]
        ports[f"i_DIB{i}"] = lanes[18 + i]
        ports[f"o_DOA{i}"] = data_out[i]
        ports[f"o_DOB{i}"] = data_out[18 + i]
    m.submodules[name] = Instance("DP16KD", **ports)
    return Cat(*(data_out[9 * i:9 * i + 8] for i in range(4)))


class BankRAM(wiring.Component):
    """``depth`` rows of ``shape`` (an :class:`~amaranth.lib.data.ArrayLayout`: one write enable
    per element; any other shape: one for the row), see the module docstring.

    ``transparent``: in simulation a read of a row written in the same cycle returns the new row
    (else the old one); on an FPGA the result is undefined either way.

    ``registered`` (default): ``read_data`` is registered (the block RAM's output register on
    ECP5), two cycles after the read was presented; else it is the generic memory's read data
    itself, one cycle after (``memory_registers = false``, for small, slow FPGAs; on ECP5 yosys
    then maps the memory to block RAM by itself).

    ``address_registers`` (with ``registered``): ``read_addr`` and ``write_addr`` pass a register
    inside the bank, so the user presents them a cycle before the other inputs (which it still
    drives from registers of its own), and a read's data come three cycles after its address.
    On ECP5 in the 512 x 36 mode each DP16KD has a copy of them (``TRELLIS_FF``, which yosys does
    not merge: :func:`~systolic.hw.dsp.fabric_copy`), so that no net reaches every block RAM of a
    wide row, which the placer spreads across the die (on the 16x16 ULX3S SoC at 854da92 the
    accumulator's read address register into 16 DP16KD, one net of 12.2 ns); elsewhere one
    register of each."""

    def __init__(self, shape: ShapeLike, depth: int, *, transparent: bool = False,
                 registered: bool = True, address_registers: bool = False) -> None:
        if not isinstance(depth, int) or depth < 1 or depth & (depth - 1):
            raise ValueError(f"depth must be a positive power of two, not {depth!r}")
        if not isinstance(address_registers, bool):
            raise ValueError(f"address_registers must be True or False, not {address_registers!r}")
        if address_registers and not registered:
            raise ValueError("address_registers needs registered=True (a bank with its read data "
                             "registered), not registered=False")
        self._shape = shape
        self._depth = depth
        self._transparent = transparent
        self._registered = registered
        self._address_registers = address_registers
        self._elems = shape.length if isinstance(shape, data.ArrayLayout) else 1
        addr_bits = max(1, exact_log2(depth))
        super().__init__({
            "write_addr": In(addr_bits),
            "write_data": In(shape),
            "write_en": In(self._elems),
            "read_addr": In(addr_bits),
            "read_en": In(1),
            "read_data": Out(shape),
        })

    @property
    def depth(self) -> int:
        return self._depth

    def elaborate(self, platform: Any) -> Module:
        if self._registered and uses_dp16kd(platform, self._shape, self._depth):
            if self._depth <= DP16KD_WIDE_ROWS:
                return self._elaborate_dp16kd_wide(platform)
            return self._elaborate_dp16kd()
        m = Module()
        write_addr, read_addr = self._addresses(m)
        m.submodules.memory = memory = Memory(shape=self._shape, depth=self._depth, init=[],
                                              attrs={UNDEFINED_COLLISION: 1})
        write = memory.write_port(granularity=1 if self._elems > 1 else None)
        read = memory.read_port(transparent_for=(write,) if self._transparent else ())
        m.d.comb += [
            write.addr.eq(write_addr), write.data.eq(self.write_data), write.en.eq(self.write_en),
            read.addr.eq(read_addr), read.en.eq(self.read_en),
        ]
        if self._registered:
            m.d.sync += self.read_data.eq(read.data)
        else:
            m.d.comb += self.read_data.eq(read.data)
        return m

    def _addresses(self, m: Module) -> tuple[Value, Value]:
        """The write and the read address the memory sees: the ports, or with
        ``address_registers`` one register of each."""
        if not self._address_registers:
            return self.write_addr, self.read_addr
        write_addr, read_addr = Signal.like(self.write_addr), Signal.like(self.read_addr)
        m.d.sync += [write_addr.eq(self.write_addr), read_addr.eq(self.read_addr)]
        return write_addr, read_addr

    def _byte_enables(self, nbytes: int, padded: int) -> Value:
        """One write enable per byte of the row (the enable of its element), zero up to ``padded``."""
        row_bits = Shape.cast(self._shape).width
        elem_bits = row_bits // self._elems
        return Cat(*(self.write_en[8 * b // elem_bits] for b in range(nbytes)), Const(0, padded - nbytes))

    def _elaborate_dp16kd_wide(self, platform: Any) -> Module:
        m = Module()
        row_bits = Shape.cast(self._shape).width
        nbytes = row_bits // 8
        tiles = (nbytes + 3) // 4                # DP16KD side by side: four bytes each
        write_data = Cat(Value.cast(self.write_data), Const(0, 32 * tiles - row_bits))
        byte_en = self._byte_enables(nbytes, 4 * tiles)

        def addresses(t: int) -> tuple[Value, Value]:
            if not self._address_registers:
                return self.write_addr, self.read_addr
            always = Const(1, 1)
            return (fabric_copy(m, f"tile{t}_write_addr", self.write_addr, enable=always, platform=platform),
                    fabric_copy(m, f"tile{t}_read_addr", self.read_addr, enable=always, platform=platform))

        pieces = []
        for t in range(tiles):
            write_addr, read_addr = addresses(t)
            pieces.append(dp16kd_wide(m, f"tile{t}", write_addr=write_addr, read_addr=read_addr,
                                      byte_enables=byte_en[4 * t:4 * t + 4],
                                      data=write_data[32 * t:32 * t + 32]))
        m.d.comb += self.read_data.eq(Cat(*pieces)[:row_bits])
        return m

    def _elaborate_dp16kd(self) -> Module:
        m = Module()
        row_bits = Shape.cast(self._shape).width
        nbytes = row_bits // 8
        wide = (nbytes + 1) // 2                 # DP16KD side by side: two bytes each
        deep = self._depth // DP16KD_ROWS
        write_data = Cat(Value.cast(self.write_data), Const(0, 16 * wide - row_bits))
        byte_en = self._byte_enables(nbytes, 2 * wide)
        write_addr, read_addr = self._addresses(m)
        word_w, word_r = write_addr[:10], read_addr[:10]
        select_w = write_addr[10:13] if deep > 1 else 0
        select_r = read_addr[10:13] if deep > 1 else 0
        outputs = []
        for d in range(deep):
            pieces = []
            for w in range(wide):
                enables = byte_en[2 * w:2 * w + 2]
                # port A writes the enabled bytes (does nothing with none); port B reads every
                # cycle, so its output register takes each read whatever CEB does to it
                _, row = dp16kd(
                    m, f"tile{d}_{w}", csdecode=d,
                    a=DP16KDPort(addr=word_w, enable=enables.any(), write=1, byte_enables=enables,
                                 data=write_data[16 * w:16 * w + 16], chip_select=select_w,
                                 read=False),
                    b=DP16KDPort(addr=word_r, enable=1, chip_select=select_r,
                                 output_register=True, output_enable=1))
                pieces.append(row)
            outputs.append(Cat(*pieces)[:row_bits])
        if deep == 1:
            m.d.comb += self.read_data.eq(outputs[0])
        else:
            # the tile read two cycles ago: its address through two registers
            first, second = Signal(3), Signal(3)
            m.d.sync += [first.eq(select_r), second.eq(first)]
            row = outputs[-1]
            for d in reversed(range(deep - 1)):
                row = Mux(second == d, outputs[d], row)
            m.d.comb += self.read_data.eq(row)
        return m
