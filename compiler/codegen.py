"""Code generation: from an optimized IR graph to programs, a DRAM image and a plan.

:func:`compile_graph` runs the back end of the compiler:

1. **schedule** (:func:`schedule`) -- the graph's nodes in an order that groups accelerator ops
   into as few *segments* as possible. Host nodes (``Node``) split the model: each segment is one
   program, run on the accelerator between host steps (the host writes the DRAM tensors a segment
   reads, starts its program, reads back the tensors host nodes need). Reshape/Identity views of
   accelerator tensors cost nothing: they share their source's DRAM buffer.
2. **constants** -- packed weights, requantize tables and raw biases of every layer
   (:mod:`systolic.compiler.lower`).
3. **memory plan** (:mod:`systolic.compiler.memplan`) -- an address for every activation,
   buffers shared between tensors whose lifetimes do not overlap.
4. **lowering** -- per segment, each layer's tiling is chosen by the cycle estimate and its
   instructions emitted with their dependency tokens (:class:`~systolic.compiler.lower.SegmentLowering`);
   with ``images_per_run`` > 1 a segment's program runs its layers for several images, each in
   its own arena.
5. **image** -- constants, zeroed arenas, then each segment's instruction words. When the
   programs do not fit the DRAM side by side (``dram_bytes``), they share one address instead
   (``CompiledModel.overlay``): a segment whose program alone is too big is cut at layer
   boundaries into programs that fit (the longest first), and the runtime writes each program
   there before it runs; the image holds the first.

The result, :class:`CompiledModel`, saves the program binaries (header with the config hash),
their assembly listings, the DRAM image and the plan JSON (:meth:`CompiledModel.save`).

Units: bytes and byte addresses; cycles.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from systolic.hw.config import AcceleratorConfig
from systolic.hw.isa import INSTR_BYTES, Program

from .asm import disassemble
from .errors import CompileError
from .ir import AccelOp, Graph, Node
from .lower import (
    LayerAddresses,
    LayerCode,
    SegmentLowering,
    Tiling,
    choose_tiling,
    geometry,
    layer_macs,
    pack_bias,
    pack_table,
    pack_weights,
)
from .memplan import ALIGN, Buffer, MemoryPlan, MemoryPlanError, check_fits, plan_memory

__all__ = ["Step", "Segment", "CompiledModel", "schedule", "compile_graph", "VIEW_OPS"]

#: Host ops that only rename bytes: on accelerator tensors they become shared buffers.
VIEW_OPS = frozenset({"Reshape", "Identity"})


@dataclass(frozen=True)
class Step:
    """One step of the schedule: a host node, or a segment of accelerator ops (one program)."""

    kind: str                        #: "host" or "accel"
    nodes: tuple[Any, ...]           #: the Node, or the AccelOps in program order
    segment: int = -1                #: index of the segment (accel steps)


@dataclass
class Segment:
    """One program: the accelerator ops it runs, where its words are, what it did per layer."""

    index: int
    ops: tuple[AccelOp, ...]
    program: Program
    address: int
    layers: list[LayerCode]          #: one per (op, image slot), in program order
    layer_op: list[int]              #: op index (into ``ops``) of each entry of ``layers``
    instr_layer: list[int]           #: layer index of each instruction (-1: FINISH)
    reads: tuple[str, ...]           #: tensors the host writes into DRAM before the program
    writes: tuple[str, ...]          #: tensors the host reads from DRAM after it
    syncs: int = 0                   #: SYNC instructions the synchronization inserted

    @property
    def estimate(self) -> int:
        """Sum of the layers' cycle estimates, cycles."""
        return sum(layer.tiling.estimate for layer in self.layers)

    @property
    def nbytes(self) -> int:
        return len(self.program.instructions) * INSTR_BYTES


@dataclass
class CompiledModel:
    """A model compiled for one accelerator configuration (see the module docstring)."""

    graph: Graph
    config: AcceleratorConfig
    steps: list[Step]
    segments: list[Segment]
    plan: MemoryPlan
    image: np.ndarray                #: the initial DRAM image (uint8)
    images_per_run: int = 1
    compile_seconds: float = 0.0
    view_of: dict[str, str] = field(default_factory=dict)   #: tensor -> canonical DRAM tensor
    views: list[Node] = field(default_factory=list)          #: view nodes (no host step)
    keep_intermediates: bool = False                         #: no two activations share DRAM
    #: the programs do not fit the DRAM side by side: they share one address, where the runtime
    #: writes each before it runs (the image holds the first)
    overlay: bool = False

    @property
    def macs(self) -> int:
        """Multiply-accumulates of the accelerator layers for one image."""
        return sum(layer_macs(op, self.graph) for op in self.graph.accel_ops)

    @property
    def host_nodes(self) -> list[Node]:
        return [step.nodes[0] for step in self.steps if step.kind == "host"]

    def listing(self, segment: int = 0) -> str:
        """The canonical assembly of a segment's program, with a header comment."""
        seg = self.segments[segment]
        head = (f"# systolic program: segment {segment} of model {self.graph.name!r}, config "
                f"{self.config.hash_hex}, {len(seg.program.instructions)} instructions at "
                f"{seg.address:#x}\n# layers: {', '.join(op.name for op in seg.ops)}\n")
        return head + disassemble(seg.program.instructions)

    def plan_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready data: memory layout, schedule, and per layer its tiles,
        addresses and estimated cycles."""
        c = self.config
        spad_peak = max((lay.scratchpad_rows for s in self.segments for lay in s.layers), default=0)
        acc_peak = max((lay.accumulator_rows for s in self.segments for lay in s.layers), default=0)
        return {
            "model": self.graph.name,
            "config_hash": c.hash_hex,
            "config": c.to_dict(),
            "images_per_run": self.images_per_run,
            "macs_per_image": self.macs,
            "compile_seconds": round(self.compile_seconds, 3),
            "dram": {
                "total_bytes": int(self.image.size),
                "dram_bytes": c.dram_bytes,
                "constants_bytes": self.plan.constants_bytes,
                "arena_base": self.plan.arena_base,
                "arena_bytes": self.plan.arena_bytes,
                "live_peak_bytes": self.plan.live_peak_bytes,
                "programs_overlaid": self.overlay,
                "programs": [{"segment": s.index, "address": s.address, "bytes": s.nbytes,
                              "instructions": len(s.program.instructions)} for s in self.segments],
            },
            "scratchpad": {"rows": c.spad_rows, "peak_rows": spad_peak,
                           "peak_bytes": spad_peak * c.spad_row_bytes},
            "accumulator": {"rows": c.acc_rows, "peak_rows": acc_peak,
                            "peak_bytes": acc_peak * c.acc_row_bytes},
            "schedule": [_step_dict(step) for step in self.steps],
            "segments": [_segment_dict(self, s) for s in self.segments],
            "memory": self.plan.summary(),
        }

    def save(self, out: str | Path) -> list[Path]:
        """Write ``segment<i>.bin`` (program binary), ``segment<i>.s`` (assembly),
        ``dram.bin`` (the initial DRAM image: constants, zeroed arenas, programs) and
        ``plan.json`` into directory ``out``; returns the paths."""
        out = Path(out)
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OSError(f"{out}: cannot create the output directory: {exc.strerror or exc}") from None
        written = []
        for seg in self.segments:
            for suffix, blob in ((".bin", seg.program.to_bytes()),
                                 (".s", self.listing(seg.index).encode())):
                path = out / f"segment{seg.index}{suffix}"
                _write(path, blob)
                written.append(path)
        path = out / "dram.bin"
        _write(path, self.image.tobytes())
        written.append(path)
        plan = self.plan_dict()
        for seg in plan["segments"]:
            seg["program"] = f"segment{seg['index']}.bin"
        path = out / "plan.json"
        _write(path, (json.dumps(plan, indent=1) + "\n").encode())
        written.append(path)
        return written


def _write(path: Path, blob: bytes) -> None:
    try:
        path.write_bytes(blob)
    except OSError as exc:
        raise OSError(f"{path}: cannot write: {exc.strerror or exc}") from None


def _step_dict(step: Step) -> dict[str, Any]:
    if step.kind == "host":
        node = step.nodes[0]
        return {"step": "host", "node": node.name, "op": node.op}
    return {"step": "accel", "segment": step.segment, "layers": [op.name for op in step.nodes]}


def _segment_dict(model: CompiledModel, seg: Segment) -> dict[str, Any]:
    layers = []
    for lay, op_index in zip(seg.layers, seg.layer_op, strict=True):
        op = seg.ops[op_index]
        layers.append({
            "name": lay.name, "kind": lay.kind, "op": op.op, "fused": list(op.fused),
            "macs": lay.macs, "tiling": lay.tiling.describe(), "blocks": lay.blocks,
            "groups": lay.groups, "chunks": lay.chunks,
            "instructions": [lay.first_instruction, lay.last_instruction],
            "addresses": lay.addresses, "estimated_cycles": lay.tiling.estimate,
            "scratchpad_rows": lay.scratchpad_rows, "accumulator_rows": lay.accumulator_rows,
        })
    return {"index": seg.index, "address": seg.address, "instructions": len(seg.program.instructions),
            "syncs": seg.syncs, "estimated_cycles": seg.estimate, "reads": list(seg.reads),
            "writes": list(seg.writes), "layers": layers}


# -- schedule -----------------------------------------------------------------------------------


def _dram_tensors(graph: Graph) -> tuple[set[str], dict[str, str]]:
    """Tensors in DRAM (read or written by accelerator ops, and their views) and the canonical
    tensor of each view group (union-find over view nodes)."""
    dram: set[str] = set()
    for op in graph.accel_ops:
        dram.update(op.inputs)
        dram.add(op.output)
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.get(x, x) != x:
            x = parent[x]
        return x

    changed = True
    while changed:
        changed = False
        for node in graph.host_nodes:
            if not _is_view(graph, node):
                continue
            src, dst = node.inputs[0], node.outputs[0]
            if src in dram or dst in dram:
                if not (src in dram and dst in dram):
                    dram.update((src, dst))
                    changed = True
                a, b = find(src), find(dst)
                if a != b:
                    parent[b] = a
                    changed = True
    return dram, {t: find(t) for t in dram}


def _is_view(graph: Graph, node: Node) -> bool:
    if node.op not in VIEW_OPS or node.domain or not node.inputs or not node.outputs:
        return False
    src, dst = graph.tensors[node.inputs[0]], graph.tensors[node.outputs[0]]
    if src.dtype != dst.dtype or src.size != dst.size or graph.tensors[src.name].is_constant:
        return False
    return node.op == "Identity" or all(graph.tensors[n].is_constant for n in node.inputs[1:] if n)


def schedule(graph: Graph) -> tuple[list[Step], set[str], set[Node]]:
    """Steps in execution order (list scheduling: all ready accelerator ops form one segment,
    then all ready host nodes run, and so on), the DRAM tensors and the view nodes."""
    dram, _ = _dram_tensors(graph)
    views = {id(n) for n in graph.host_nodes if _is_view(graph, n)
             and (n.inputs[0] in dram or n.outputs[0] in dram)}
    view_nodes = {n for n in graph.host_nodes if id(n) in views}
    avail = set(graph.inputs) | {n for n, t in graph.tensors.items() if t.is_constant} | {""}
    remaining = list(graph.nodes)
    steps: list[Step] = []
    segments = 0

    def ready(node: Any) -> bool:
        return all(i in avail for i in node.inputs)

    while remaining:
        segment: list[AccelOp] = []
        progress = True
        while progress:
            progress = False
            for node in list(remaining):
                if (isinstance(node, AccelOp) or id(node) in views) and ready(node):
                    remaining.remove(node)
                    avail.update(node.outputs)
                    if isinstance(node, AccelOp):
                        segment.append(node)
                    progress = True
        if segment:
            steps.append(Step("accel", tuple(segment), segments))
            segments += 1
        ran = False
        for node in list(remaining):
            if isinstance(node, Node) and id(node) not in views and ready(node):
                remaining.remove(node)
                avail.update(node.outputs)
                steps.append(Step("host", (node,)))
                ran = True
                break          # one host node, then accelerator ops again if any became ready
        if not segment and not ran and remaining:
            raise CompileError(f"the graph cannot be scheduled: {remaining[0].label} waits for an "
                               f"input that is never produced")
    return steps, dram, view_nodes


# -- compile ------------------------------------------------------------------------------------


def compile_graph(graph: Graph, config: AcceleratorConfig | None = None, *, images_per_run: int = 1,
                  keep_intermediates: bool = False,
                  tilings: Mapping[str, Tiling] | None = None) -> CompiledModel:
    """Compile an optimized graph (:func:`systolic.compiler.passes.optimize`) into programs, a
    DRAM image and a plan.

    ``config`` replaces the graph's configuration. ``images_per_run``: images each program run
    computes (several arenas; fewer program runs for a batch). ``keep_intermediates``: no two
    activations share DRAM, so that every layer's output can be read back after a run (for
    tests and debugging). ``tilings`` forces the tiling of layers by name.

    Raises :class:`~systolic.compiler.lower.TilingError` when a layer does not fit the on-chip
    memories and :class:`~systolic.compiler.memplan.MemoryPlanError` when the model does not fit
    the DRAM."""
    start = time.perf_counter()
    if config is not None and config != graph.config:
        graph = graph.replace(config=config)
    c = graph.config
    if isinstance(images_per_run, bool) or not isinstance(images_per_run, int) or images_per_run < 1:
        raise ValueError(f"images_per_run must be a positive integer, not {images_per_run!r}")
    steps, dram, view_nodes = schedule(graph)
    _, canon = _dram_tensors(graph)

    # constants
    constants: dict[str, np.ndarray] = {}
    geos = {}
    for op in graph.accel_ops:
        geo = geometry(op, graph)
        geos[op.name] = geo
        if op.kind in ("conv", "gemm"):
            constants[f"{op.name}/weights"] = pack_weights(op, geo, c)
        if op.out_type == "raw":
            constants[f"{op.name}/bias"] = pack_bias(op, geo, c).astype("<i4")
        else:
            constants[f"{op.name}/table"] = pack_table(op, geo, c).astype("<i4")

    # lifetimes of the DRAM buffers
    position = 0
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    producer_segment_end: dict[str, int] = {}
    host_used: set[str] = set(graph.outputs)
    for node in graph.host_nodes:
        host_used.update(node.inputs)
    pos_of_step = []
    for step in steps:
        pos_of_step.append(position)
        if step.kind == "host":
            position += 1
            continue
        seg_start = position
        for op in step.nodes:
            for name in op.inputs:
                group = canon[name]
                first.setdefault(group, seg_start)
                last[group] = max(last.get(group, 0), position)
            group = canon[op.output]
            first.setdefault(group, position)
            last[group] = max(last.get(group, 0), position)
            position += 1
        for op in step.nodes:
            producer_segment_end[canon[op.output]] = position - 1
    for name in dram:
        if name in host_used and canon[name] in producer_segment_end:
            group = canon[name]
            last[group] = max(last[group], producer_segment_end[group])
    if keep_intermediates:
        last = dict.fromkeys(last, position)
    groups: dict[str, list[str]] = {}
    for name in sorted(dram):
        groups.setdefault(canon[name], []).append(name)
    buffers = []
    for i, (root, members) in enumerate(sorted(groups.items())):
        nbytes = max(graph.tensors[t].size * np.dtype(graph.tensors[t].dtype).itemsize for t in members)
        buffers.append(Buffer(i, tuple(members), nbytes, first.get(root, 0), last.get(root, position)))
    plan = plan_memory(c, buffers, constants, images=images_per_run, share=not keep_intermediates)

    # lowering
    overlaps = plan.overlaps_for_slots()
    chosen: dict[str, Tiling] = dict(tilings or {})

    def lower(step: Step) -> Segment:
        lowering = SegmentLowering(graph, c, overlaps)
        layer_op = []
        for slot in range(images_per_run):
            for k, op in enumerate(step.nodes):
                addr = _addresses(op, plan, slot)
                if op.name not in chosen:
                    chosen[op.name] = choose_tiling(op, geos[op.name], c, addr)
                lowering.add(op, addr, chosen[op.name])
                layer_op.append(k)
        instrs, instr_layer = lowering.finish()
        reads, writes = _segment_io(graph, step, steps, canon)
        return Segment(step.segment, step.nodes, Program(tuple(instrs), c.hash), 0, lowering.layers,
                       layer_op, instr_layer, reads, writes, lowering.builder.syncs)

    segments = [lower(step) for step in steps if step.kind == "accel"]
    side_by_side = sum(_aligned(seg.nbytes) for seg in segments)
    overlay = plan.programs_base + side_by_side > c.dram_bytes
    if overlay:
        whole = f"the programs need {side_by_side} bytes side by side"
        try:
            check_fits(c, plan, side_by_side)
        except MemoryPlanError as exc:
            whole = str(exc)
        try:
            steps, segments = _split_for_overlay(steps, lower, c.dram_bytes, plan.programs_base)
        except MemoryPlanError as exc:
            raise MemoryPlanError(f"{whole}; even with one program in DRAM at a time, {exc}") from None

    # image: constants, arenas, programs (with ``overlay``, every program at one address, where
    # the runtime writes each before it runs; the image holds the first)
    address = plan.programs_base
    for seg in segments:
        seg.address = address
        if not overlay:
            address += _aligned(seg.nbytes)
    program_bytes = max((_aligned(seg.nbytes) for seg in segments), default=0) if overlay \
        else address - plan.programs_base
    total = check_fits(c, plan, program_bytes)
    image = np.zeros(max(4096, -(-total // 4096) * 4096), np.uint8)
    for name, const in plan.constants.items():
        blob = np.ascontiguousarray(constants[name]).view(np.uint8).reshape(-1)
        image[const.address:const.address + blob.size] = blob
    for seg in reversed(segments):
        words = np.frombuffer(seg.program.words(), np.uint8)
        image[seg.address:seg.address + words.size] = words
    views = [n for n in graph.nodes if n in view_nodes]
    return CompiledModel(graph, c, steps, segments, plan, image, images_per_run,
                         time.perf_counter() - start, canon, views, keep_intermediates, overlay)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def _split_for_overlay(steps: list[Step], lower: Callable[[Step], Segment], dram_bytes: int,
                       programs_base: int) -> tuple[list[Step], list[Segment]]:
    """The schedule with every accelerator step whose program exceeds the room for programs
    (``dram_bytes`` - ``programs_base``) cut into runs of consecutive layers whose programs fit
    (the longest first), and their segments. Raises :class:`MemoryPlanError` when a single
    layer's program does not fit."""
    room = dram_bytes - programs_base
    out: list[Step] = []
    segments: list[Segment] = []
    for step in steps:
        if step.kind != "accel":
            out.append(step)
            continue
        nodes = list(step.nodes)
        while nodes:
            for count in range(len(nodes), 0, -1):
                part = Step("accel", tuple(nodes[:count]), len(segments))
                seg = lower(part)
                if _aligned(seg.nbytes) <= room:
                    break
            else:
                raise MemoryPlanError(
                    f"layer {nodes[0].name!r} alone needs a program of {seg.nbytes} bytes and "
                    f"{max(room, 0)} are left after the constants and activations")
            out.append(part)
            segments.append(seg)
            nodes = nodes[count:]
    return out, segments


def _addresses(op: AccelOp, plan: MemoryPlan, slot: int) -> LayerAddresses:
    def const(suffix: str) -> int:
        entry = plan.constants.get(f"{op.name}/{suffix}")
        return 0 if entry is None else entry.address

    res = op.residual.tensor if op.residual is not None else None
    return LayerAddresses(
        input=plan.address(op.input, slot), output=plan.address(op.output, slot),
        residual=plan.address(res, slot) if res else 0,
        weights=const("weights"), table=const("table"), bias=const("bias"),
        input_buffer=plan.buffer_id(op.input, slot), output_buffer=plan.buffer_id(op.output, slot),
        residual_buffer=plan.buffer_id(res, slot) if res else -1)


def _segment_io(graph: Graph, step: Step, steps: list[Step], canon: Mapping[str, str]
                ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Tensors the host writes before the segment (read by its ops, produced by no accelerator
    op) and tensors it reads after (produced here, needed by host nodes or as outputs)."""
    accel_out = {canon[op.output] for op in graph.accel_ops}
    reads: list[str] = []
    for op in step.nodes:
        for name in op.inputs:
            if canon[name] not in accel_out:
                # the host writes the member of the view group it computes
                source = _host_member(graph, name, canon)
                if source not in reads:
                    reads.append(source)
    produced = {canon[op.output] for op in step.nodes}
    needed = set(graph.outputs)
    for node in graph.host_nodes:
        needed.update(node.inputs)
    writes = sorted(name for name in canon if canon[name] in produced and name in needed
                    and not _view_only(graph, name, canon))
    return tuple(reads), tuple(writes)


def _host_member(graph: Graph, name: str, canon: Mapping[str, str]) -> str:
    """The tensor of ``name``'s view group that the host computes or knows (a graph input, a
    constant, or the output of a host node that is not a view)."""
    root = canon[name]
    producers = graph.producers
    for member, r in canon.items():
        if r != root:
            continue
        node = producers.get(member)
        if member in graph.inputs or graph.tensors[member].is_constant or \
                (isinstance(node, Node) and not _is_view(graph, node)):
            return member
    raise CompileError(f"tensor {name!r}: no host node or graph input produces it")


def _view_only(graph: Graph, name: str, canon: Mapping[str, str]) -> bool:
    """True if only view nodes read ``name`` and it is no graph output (nothing to read back)."""
    if name in graph.outputs:
        return False
    users = graph.users(name)
    return bool(users) and all(isinstance(u, Node) and _is_view(graph, u) for u in users)
