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
"""

from __future__ import annotations

from typing import Any

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.hdl import ClockSignal, Instance, Shape, ShapeLike, Value
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from .rtlil import UNDEFINED_COLLISION

__all__ = ["BankRAM", "DP16KD_ROWS", "DP16KD_MAX_ROWS", "uses_dp16kd"]

#: Rows of one DP16KD in the 1024 x 18 mode.
DP16KD_ROWS = 1024
#: Deepest bank built from DP16KD: 8 deep, decoded by the three chip-select pins.
DP16KD_MAX_ROWS = 8 * DP16KD_ROWS


def uses_dp16kd(platform: Any, shape: ShapeLike, depth: int) -> bool:
    """Whether a :class:`BankRAM` of ``depth`` rows of ``shape`` is built from DP16KD instances
    on ``platform``: ECP5, elements (of an array layout; the whole row otherwise) a multiple of
    8 bits wide, and :data:`DP16KD_ROWS` to :data:`DP16KD_MAX_ROWS` rows. A shallower bank would
    take up to twice the block RAMs of yosys's mapping (its 512 x 36 mode, which has no output
    register here), so it stays an amaranth memory."""
    layout = shape if isinstance(shape, data.ArrayLayout) else None
    elem_bits = Shape.cast(layout.elem_shape).width if layout is not None else Shape.cast(shape).width
    return (getattr(platform, "family", None) == "ecp5" and elem_bits % 8 == 0
            and DP16KD_ROWS <= depth <= DP16KD_MAX_ROWS)


class BankRAM(wiring.Component):
    """``depth`` rows of ``shape`` (an :class:`~amaranth.lib.data.ArrayLayout`: one write enable
    per element; any other shape: one for the row), see the module docstring.

    ``transparent``: in simulation a read of a row written in the same cycle returns the new row
    (else the old one); on an FPGA the result is undefined either way."""

    def __init__(self, shape: ShapeLike, depth: int, *, transparent: bool = False) -> None:
        if not isinstance(depth, int) or depth < 1 or depth & (depth - 1):
            raise ValueError(f"depth must be a positive power of two, not {depth!r}")
        self._shape = shape
        self._depth = depth
        self._transparent = transparent
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
        if uses_dp16kd(platform, self._shape, self._depth):
            return self._elaborate_dp16kd()
        m = Module()
        m.submodules.memory = memory = Memory(shape=self._shape, depth=self._depth, init=[],
                                              attrs={UNDEFINED_COLLISION: 1})
        write = memory.write_port(granularity=1 if self._elems > 1 else None)
        read = memory.read_port(transparent_for=(write,) if self._transparent else ())
        m.d.comb += [
            write.addr.eq(self.write_addr), write.data.eq(self.write_data), write.en.eq(self.write_en),
            read.addr.eq(self.read_addr), read.en.eq(self.read_en),
        ]
        m.d.sync += self.read_data.eq(read.data)
        return m

    def _elaborate_dp16kd(self) -> Module:
        m = Module()
        row_bits = Shape.cast(self._shape).width
        elem_bits = row_bits // self._elems
        nbytes = row_bits // 8
        wide = (nbytes + 1) // 2                 # DP16KD side by side: two bytes each
        deep = self._depth // DP16KD_ROWS
        write_data = Cat(Value.cast(self.write_data), Const(0, 16 * wide - row_bits))
        byte_en = Cat(*(self.write_en[8 * b // elem_bits] for b in range(nbytes)),
                      Const(0, 2 * wide - nbytes))
        word_w, word_r = self.write_addr[:10], self.read_addr[:10]
        select_w = Cat(self.write_addr[10:], Const(0, 3))[:3] if deep > 1 else Const(0, 3)
        select_r = Cat(self.read_addr[10:], Const(0, 3))[:3] if deep > 1 else Const(0, 3)
        outputs = []
        zero = Const(0, 1)
        for d in range(deep):
            pieces = []
            for w in range(wide):
                enables = byte_en[2 * w:2 * w + 2]
                dia = Cat(write_data[16 * w:16 * w + 8], zero, write_data[16 * w + 8:16 * w + 16], zero)
                dob = Signal(18, name=f"tile{d}_{w}_dob")
                ada = Cat(enables, Const(0, 2), word_w)
                adb = Cat(Const(0, 4), word_r)
                ports: dict[str, Any] = {
                    "p_DATA_WIDTH_A": 18, "p_DATA_WIDTH_B": 18,
                    "p_REGMODE_A": "NOREG", "p_REGMODE_B": "OUTREG",
                    "p_WRITEMODE_A": "NORMAL", "p_WRITEMODE_B": "NORMAL", "p_RESETMODE": "SYNC",
                    "p_ASYNC_RESET_RELEASE": "SYNC",
                    "p_CSDECODE_A": f"0b{d:03b}", "p_CSDECODE_B": f"0b{d:03b}",
                    "p_CLKAMUX": "CLKA", "p_CLKBMUX": "CLKB", "p_GSR": "AUTO",
                    # port A writes the enabled bytes (does nothing with none); port B reads every
                    # cycle, so its output register takes each read whatever CEB does to it
                    "i_CLKA": ClockSignal("sync"), "i_CEA": enables.any(), "i_OCEA": zero,
                    "i_WEA": Const(1, 1), "i_RSTA": zero,
                    "i_CLKB": ClockSignal("sync"), "i_CEB": Const(1, 1), "i_OCEB": Const(1, 1),
                    "i_WEB": zero, "i_RSTB": zero,
                }
                for i in range(3):
                    ports[f"i_CSA{i}"] = select_w[i]
                    ports[f"i_CSB{i}"] = select_r[i]
                for i in range(14):
                    ports[f"i_ADA{i}"] = ada[i]
                    ports[f"i_ADB{i}"] = adb[i]
                for i in range(18):
                    ports[f"i_DIA{i}"] = dia[i]
                    ports[f"i_DIB{i}"] = zero
                    ports[f"o_DOB{i}"] = dob[i]
                m.submodules[f"tile{d}_{w}"] = Instance("DP16KD", **ports)
                pieces.append(Cat(dob[:8], dob[9:17]))
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
