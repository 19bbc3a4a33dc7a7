"""Static DRAM planning: every tensor the accelerator reads or writes gets a byte address.

The DRAM image of a compiled model is laid out as::

    0 ............ constants (packed weights, requantize tables, raw biases), read-only
    arena ........ activations: one arena per image slot (``images`` copies), shared by tensors
                   whose lifetimes do not overlap
    programs ..... the instruction words of each segment's program

Activations live in *buffers*. Tensors that are views of each other (Reshape/Identity of an
accelerator tensor: same bytes, another shape) share one buffer. A buffer is live from the step
that writes it to the last step that reads it (positions in the compiled schedule); buffers
whose lifetimes do not overlap may share bytes. Placement is greedy by size (largest first, at
the lowest offset that conflicts with no live placed buffer), a standard interval-packing
heuristic; the plan reports the arena's size and the lower bound (the largest total of
simultaneously live bytes).

A model whose image does not fit ``config.dram_bytes`` raises :class:`MemoryPlanError` with the
sizes of each part.

Units: bytes and byte addresses; lifetimes in schedule positions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from systolic.hw.config import AcceleratorConfig

from .errors import CompileError

__all__ = ["MemoryPlanError", "Buffer", "Constant", "MemoryPlan", "place", "plan_memory", "ALIGN"]

#: Alignment of every buffer, constant and program, bytes (a multiple of every bus width).
ALIGN = 64


class MemoryPlanError(CompileError):
    """The model does not fit the accelerator's DRAM. The message gives the sizes."""


def _align(value: int) -> int:
    return -(-value // ALIGN) * ALIGN


@dataclass(frozen=True)
class Buffer:
    """One activation buffer: the tensors that share it (views of one another), its size, its
    offset in an arena and its lifetime [first, last] in schedule positions."""

    id: int
    tensors: tuple[str, ...]
    nbytes: int
    first: int
    last: int
    offset: int = 0


@dataclass(frozen=True)
class Constant:
    """A read-only blob of the DRAM image (packed weights, a requantize table, a bias)."""

    name: str
    address: int
    nbytes: int


@dataclass
class MemoryPlan:
    """Addresses of everything in the DRAM image (see the module docstring)."""

    buffers: list[Buffer]
    constants: dict[str, Constant]
    constants_bytes: int
    arena_base: int
    arena_bytes: int
    images: int
    live_peak_bytes: int
    buffer_of: dict[str, int] = field(default_factory=dict)
    overlaps: dict[int, tuple[int, ...]] = field(default_factory=dict)

    @property
    def programs_base(self) -> int:
        """First byte after the arenas, where the programs go."""
        return self.arena_base + self.images * self.arena_bytes

    def address(self, tensor: str, image: int = 0) -> int:
        """Byte address of ``tensor`` in the arena of image slot ``image``."""
        return self.arena_base + image * self.arena_bytes + self.buffers[self.buffer_of[tensor]].offset

    def buffer_id(self, tensor: str, image: int = 0) -> int:
        """Hazard-tracking id of the buffer of ``tensor`` in image slot ``image``."""
        return self.buffer_of[tensor] + image * len(self.buffers)

    def overlaps_for_slots(self) -> dict[int, tuple[int, ...]]:
        """``overlaps`` extended to the buffer ids of every image slot."""
        n = len(self.buffers)
        return {b + i * n: tuple(o + i * n for o in others)
                for i in range(self.images) for b, others in self.overlaps.items()}

    def summary(self) -> dict[str, Any]:
        """The plan as JSON-ready data."""
        return {
            "constants_bytes": self.constants_bytes,
            "arena_base": self.arena_base,
            "arena_bytes": self.arena_bytes,
            "images_per_run": self.images,
            "live_peak_bytes": self.live_peak_bytes,
            "buffers": [{"id": b.id, "tensors": list(b.tensors), "bytes": b.nbytes,
                         "offset": b.offset, "address": self.arena_base + b.offset,
                         "live": [b.first, b.last]} for b in self.buffers],
            "constants": [{"name": c.name, "address": c.address, "bytes": c.nbytes}
                          for c in self.constants.values()],
        }


def place(buffers: Sequence[Buffer], *, share: bool = True) -> tuple[list[Buffer], int]:
    """Offsets for ``buffers`` (largest first, lowest conflict-free offset); with ``share``
    false every buffer gets its own bytes. Returns the placed buffers (in the given order) and
    the arena size in bytes."""
    order = sorted(range(len(buffers)), key=lambda i: (-buffers[i].nbytes, buffers[i].first, i))
    placed: list[tuple[int, int, int, int]] = []    # offset, end, first, last
    offsets = [0] * len(buffers)
    top = 0
    for i in order:
        b = buffers[i]
        size = _align(max(b.nbytes, 1))
        if not share:
            offsets[i] = top
            top += size
            continue
        busy = sorted((o, e) for o, e, f, last in placed if f <= b.last and b.first <= last)
        offset = 0
        for o, e in busy:
            if offset + size <= o:
                break
            offset = max(offset, e)
        offsets[i] = offset
        placed.append((offset, offset + size, b.first, b.last))
        top = max(top, offset + size)
    out = [Buffer(b.id, b.tensors, b.nbytes, b.first, b.last, offsets[i])
           for i, b in enumerate(buffers)]
    return out, top


def _live_peak(buffers: Sequence[Buffer]) -> int:
    if not buffers:
        return 0
    points = sorted({b.first for b in buffers})
    return max(sum(_align(b.nbytes) for b in buffers if b.first <= p <= b.last) for p in points)


def plan_memory(config: AcceleratorConfig, buffers: Sequence[Buffer],
                constants: Mapping[str, np.ndarray | bytes], *, images: int = 1,
                share: bool = True, program_bytes: int = 0) -> MemoryPlan:
    """Place ``constants`` from address 0 and the activation ``buffers`` in ``images`` arenas
    after them. ``program_bytes`` (the programs, placed after the arenas) only enters the size
    check. Raises :class:`MemoryPlanError` when the image exceeds ``config.dram_bytes``."""
    consts: dict[str, Constant] = {}
    top = 0
    for name, blob in constants.items():
        nbytes = blob.nbytes if isinstance(blob, np.ndarray) else len(blob)
        consts[name] = Constant(name, top, nbytes)
        top += _align(max(nbytes, 1))
    placed, arena = place(buffers, share=share)
    plan = MemoryPlan(placed, consts, top, top, arena, images, _live_peak(placed))
    for b in placed:
        for t in b.tensors:
            plan.buffer_of[t] = b.id
    for b in placed:
        size = _align(max(b.nbytes, 1))
        plan.overlaps[b.id] = tuple(o.id for o in placed
                                    if o.offset < b.offset + size
                                    and b.offset < o.offset + _align(max(o.nbytes, 1)))
    check_fits(config, plan, program_bytes)
    return plan


def check_fits(config: AcceleratorConfig, plan: MemoryPlan, program_bytes: int) -> int:
    """Total bytes of the DRAM image; raises :class:`MemoryPlanError` past ``dram_bytes``."""
    total = plan.programs_base + _align(program_bytes)
    if total > config.dram_bytes:
        raise MemoryPlanError(
            f"the model needs {total} bytes of DRAM (constants {plan.constants_bytes}, "
            f"activations {plan.images} x {plan.arena_bytes}, programs {program_bytes}), but the "
            f"config has dram_bytes={config.dram_bytes}")
    return total
