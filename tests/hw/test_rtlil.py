"""Undefined same-cycle read-write results for marked memories (hw/rtlil.py): the RTLIL patch
changes exactly the read ports of marked memories, the scratchpad's and the accumulator's banks
and the requantize table are marked, and yosys
then maps a marked memory to block RAM with no collision logic before the register after it."""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import pytest
from amaranth import Elaboratable, Module, Signal
from amaranth.back import rtlil
from amaranth.lib.memory import Memory
from systolic.boards.synth import tool_path
from systolic.hw.accumulator import ACC_BANKS, Accumulator
from systolic.hw.config import AcceleratorConfig
from systolic.hw.requant_table import RequantTable
from systolic.hw.rtlil import UNDEFINED_COLLISION, undefined_read_collisions
from systolic.hw.scratchpad import Scratchpad
from systolic.sim.tools import component_ports, tool_env


class _Memories(Elaboratable):
    """A memory (marked with ``marked``) with a transparent and a plain read port (none without
    ``marked_reads``), and an unmarked one with a transparent read port (with ``plain``); each
    read registered twice into an output of its own."""

    def __init__(self, *, marked: bool = True, marked_reads: bool = True, plain: bool = True) -> None:
        self.marked, self.marked_reads, self.plain = marked, marked_reads, plain
        self.addr = Signal(12)
        self.data = Signal(32)
        self.write = Signal()
        self.outs = [Signal(32, name=f"out{i}") for i in range(2 * marked_reads + plain)]
        self.read_addrs = [Signal(12, name=f"read_addr{i}") for i in range(len(self.outs))]

    def elaborate(self, platform: object) -> Module:
        m = Module()
        attrs = {UNDEFINED_COLLISION: 1} if self.marked else {}
        m.submodules.marked = marked = Memory(shape=32, depth=4096, init=[], attrs=attrs)
        memories = [(marked, (True, False) if self.marked_reads else ())]
        if self.plain:
            m.submodules.plain = plain = Memory(shape=32, depth=4096, init=[])
            memories.append((plain, (True,)))
        outs = zip(self.read_addrs, self.outs, strict=True)
        for memory, transparencies in memories:
            write = memory.write_port()
            m.d.sync += [write.addr.eq(self.addr), write.data.eq(self.data), write.en.eq(self.write)]
            for transparent in transparencies:
                addr, out = next(outs)
                read = memory.read_port(transparent_for=(write,) if transparent else ())
                first = Signal(32)
                m.d.sync += [read.addr.eq(addr), first.eq(read.data), out.eq(first)]
        return m


def _convert(design: _Memories) -> str:
    return rtlil.convert(design, ports=[design.addr, design.data, design.write, *design.read_addrs,
                                        *design.outs])


def _read_ports(text: str) -> list[tuple[str, str, str]]:
    """(MEMID, TRANSPARENCY_MASK, COLLISION_X_MASK) of every $memrd_v2 cell."""
    ports = []
    for cell in re.findall(r"cell \$memrd_v2 .*?\n\s*end", text, flags=re.S):
        params = dict(re.findall(r"parameter \\(\w+) (\S+)", cell))
        ports.append((params["MEMID"], params["TRANSPARENCY_MASK"], params["COLLISION_X_MASK"]))
    return sorted(ports)


def test_only_the_read_ports_of_marked_memories_change() -> None:
    text = _convert(_Memories())
    patched, changed = undefined_read_collisions(text)
    assert changed == 2
    marked, plain = '"\\\\marked"', '"\\\\plain"'
    assert _read_ports(text) == [(marked, "1'0", "1'0"), (marked, "1'1", "1'0"), (plain, "1'1", "1'0")]
    assert _read_ports(patched) == [(marked, "1'0", "1'1"), (marked, "1'0", "1'1"), (plain, "1'1", "1'0")]
    differing = [new for old, new in zip(text.split("\n"), patched.split("\n"), strict=True) if old != new]
    assert len(differing) == 3 and all("_MASK" in line for line in differing)


def test_a_design_without_marked_memories_is_unchanged() -> None:
    text = _convert(_Memories(marked=False))
    assert undefined_read_collisions(text) == (text, 0)


@pytest.mark.parametrize("banks, words", [(2, 1), (4, 3), (8, 1)])
def test_every_scratchpad_accumulator_and_table_memory_is_marked(banks: int, words: int) -> None:
    config = AcceleratorConfig(rows=4, cols=4, scratchpad_bytes=8192, scratchpad_banks=banks,
                               requant_row_words=words, sfu_engine="serial" if words > 1 else "pipelined")
    assert undefined_read_collisions(rtlil.convert(Scratchpad(config)))[1] == banks
    accumulator = Accumulator(config)
    text = rtlil.convert(accumulator, ports=component_ports(accumulator))   # always_ready array_write
    assert undefined_read_collisions(text)[1] == ACC_BANKS
    assert undefined_read_collisions(rtlil.convert(RequantTable(config)))[1] == 1


def test_a_marked_memory_without_a_read_port_is_an_error() -> None:
    text = _convert(_Memories(marked_reads=False))
    with pytest.raises(ValueError, match=r"memory \\marked in module \\top carries "
                                         r"systolic_undefined_collision but has no read port"):
        undefined_read_collisions(text)


def test_a_read_port_without_its_masks_is_an_error() -> None:
    text = _convert(_Memories()).replace("parameter \\COLLISION_X_MASK 1'0\n", "", 1)
    with pytest.raises(ValueError, match=r"read port of memory \\marked in module \\top: expected its "
                                         r"TRANSPARENCY_MASK and COLLISION_X_MASK parameters, found 1"):
        undefined_read_collisions(text)


def _ecp5_cells(text: str) -> dict[str, int]:
    env = tool_env()
    with tempfile.TemporaryDirectory(prefix="rtlil-") as tmp:
        Path(tmp, "top.il").write_text(text)
        result = subprocess.run([tool_path("yosys", env), "-q", "-p",
                                 "read_rtlil top.il; synth_ecp5 -top top; tee -q -o stat.txt stat"],
                                cwd=tmp, env=env, capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stdout + result.stderr
        stat = Path(tmp, "stat.txt").read_text()
    return {kind: int(count) for count, kind in re.findall(r"^\s+(\d+)\s+(\w+)\s*$", stat, flags=re.M)}


@pytest.mark.parametrize("transparent", [True, False])
def test_yosys_maps_a_marked_memory_to_block_ram_alone(transparent: bool) -> None:
    """With the patch a marked memory's read port is block RAM read data straight into a
    register: no LUT at all; without it yosys adds collision logic (a bypass multiplexer per bit
    for a transparent port, delayed writes for a plain one)."""
    text = _convert(_Memories(plain=False))
    if not transparent:     # keep the plain read port only
        text = text.replace("parameter \\TRANSPARENCY_MASK 1'1", "parameter \\TRANSPARENCY_MASK 1'0")
    patched = _ecp5_cells(undefined_read_collisions(text)[0])
    plain = _ecp5_cells(text)
    assert patched["DP16KD"] == plain["DP16KD"]
    assert patched.get("LUT4", 0) == 0
    assert plain.get("LUT4", 0) >= 32
