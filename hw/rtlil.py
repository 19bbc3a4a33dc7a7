"""Synthesis-only facts about the gateware that Amaranth cannot express, applied to its RTLIL.

Amaranth gives every memory read port a defined result for a read of a row written in the same
cycle (the new data with ``transparent_for``, else the old data), and yosys spends logic on that:
a bypass register and a multiplexer between the block RAM's read data and the first register
after it, or delayed writes for the old data. A memory whose users never make such a read (the
scratchpad: the ISA's token rules forbid it) carries the attribute :data:`UNDEFINED_COLLISION`;
:func:`undefined_read_collisions` marks its read ports' collision result as undefined in the
RTLIL, so that yosys maps them to the block RAM alone and its read data goes straight into the
register after it. Simulation (Amaranth, Verilator) keeps the ports' defined result.
"""

from __future__ import annotations

import re

__all__ = ["UNDEFINED_COLLISION", "undefined_read_collisions"]

#: Attribute (value 1) of an :class:`amaranth.lib.memory.Memory` that no user reads in the cycle
#: a row is written.
UNDEFINED_COLLISION = "systolic_undefined_collision"

_MASK = re.compile(r"^(\s*parameter \\(TRANSPARENCY_MASK|COLLISION_X_MASK) )(\d+)'([01]+)\s*$")


def undefined_read_collisions(rtlil: str) -> tuple[str, int]:
    """``rtlil`` with the read ports (``$memrd_v2`` cells) of every memory carrying
    :data:`UNDEFINED_COLLISION` made non-transparent with an undefined collision result
    (``TRANSPARENCY_MASK`` all zeros, ``COLLISION_X_MASK`` all ones), and the number of read
    ports changed. Raises :class:`ValueError` when such a memory has no read port in the text,
    or a port's masks are missing (a format this function does not know)."""
    lines = rtlil.split("\n")
    marker = ["attribute", f"\\{UNDEFINED_COLLISION}", "1"]
    marked: set[tuple[str, str]] = set()
    module = ""
    attributes: list[str] = []
    for line in lines:
        words = line.split()
        if not words:
            continue
        if words[0] == "module":
            module = words[1]
        if words[0] == "attribute":
            attributes.append(line)
            continue
        if words[0] == "memory" and any(a.split() == marker for a in attributes):
            marked.add((module, words[-1]))
        attributes = []
    if not marked:
        return rtlil, 0

    out: list[str] = []
    found: set[tuple[str, str]] = set()
    changed = 0
    cell: list[str] | None = None
    for line in lines:
        words = line.split()
        if words[:1] == ["module"]:
            module = words[1]
        if cell is None:
            if words[:2] == ["cell", "$memrd_v2"]:
                cell = [line]
            else:
                out.append(line)
            continue
        cell.append(line)
        if words != ["end"]:
            continue
        memid = next((w[-1] for w in (c.split() for c in cell) if w[:2] == ["parameter", "\\MEMID"]), None)
        key = (module, memid.strip('"').replace("\\\\", "\\")) if memid else None
        if key in marked:
            masks = 0
            for i, text in enumerate(cell):
                match = _MASK.match(text)
                if match:
                    width = int(match[3])
                    bit = "0" if match[2] == "TRANSPARENCY_MASK" else "1"
                    cell[i] = f"{match[1]}{width}'{bit * width}"
                    masks += 1
            if masks != 2:
                raise ValueError(f"read port of memory {key[1]} in module {key[0]}: expected its "
                                 f"TRANSPARENCY_MASK and COLLISION_X_MASK parameters, found {masks}")
            found.add(key)
            changed += 1
        out.extend(cell)
        cell = None
    missing = sorted(marked - found)
    if missing:
        raise ValueError(f"memory {missing[0][1]} in module {missing[0][0]} carries "
                         f"{UNDEFINED_COLLISION} but has no read port in the RTLIL")
    return "\n".join(out), changed
