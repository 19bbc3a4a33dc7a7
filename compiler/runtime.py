"""Running a compiled model: host nodes in numpy, segments on a backend, and a report.

:func:`run_model` executes a :class:`~systolic.compiler.codegen.CompiledModel` step by step
(heterogeneous execution): a host step runs one ONNX node with the reference executor's
handlers (:func:`systolic.compiler.reference.run_node`); an accelerator step writes the DRAM
tensors its program reads (the host's results, in their DRAM buffers), runs the program on the
backend and reads back the tensors that host nodes or the graph outputs need. One DRAM image
carries the activations from segment to segment.

Backends:

* ``"golden"`` -- :class:`systolic.sim.golden.GoldenModel`: bit-exact, with the hazard checker
  and the cycle estimate of docs/isa.md; per-layer cycles come from its per-instruction timings.
* ``"rtl"`` -- :class:`systolic.sim.rtl.RTLRunner` on the Verilog of the accelerator in Verilator
  (fast memory model): cycles, MACs and DRAM traffic come from the hardware counters; per-layer
  cycles are the compile-time estimates.
* ``"board"`` -- a board running the systolic SoC (:class:`systolic.boards.host.Board` on
  ``port``: a serial device, or ``socket://127.0.0.1:PORT`` for the simulated board of
  :mod:`systolic.boards.simlink`), after checking that its accelerator was built for the model's
  config. A UART is slow, so only what is needed crosses it: the DRAM image (constants, programs)
  once per compiled model, then before each program the tensors the host computed, after it the
  tensors host nodes or the outputs need (and, with ``capture``, every layer's output). Cycles
  and traffic come from the board's counters, like the rtl backend's.

A batch of N images (every input's first axis N times the model's batch) runs in groups of
``images_per_run`` images per program run; on a terminal a progress line is printed on stderr.

Units: cycles; bytes.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np
from systolic.hw.fw_engine import estimate_factor

from .codegen import CompiledModel, Segment
from .errors import CompileError, InputError
from .ir import Graph, Node
from .reference import run_host_node

__all__ = ["BACKENDS", "BackendError", "ModelRun", "SegmentRun", "run_model", "check_inputs", "quiet_output"]

#: Names of the backends :func:`run_model` accepts.
BACKENDS = ("golden", "rtl", "board")

# The board backend's time limit per program run: this many seconds, plus the compile-time
# estimate at _BOARD_SLOWEST_HZ cycles per second (a simulated board under load), doubled (and
# times estimate_factor under firmware control). The rtl backend's watchdog: 50 times the
# estimate (times estimate_factor), at least a million cycles.
_BOARD_RUN_SECONDS = 30.0
_BOARD_SLOWEST_HZ = 50_000
# Byte ranges of the board backend closer than this are moved in one transfer.
_BOARD_MERGE_GAP = 64


class BackendError(CompileError):
    """A backend is not available or failed; the message says which and why."""


@dataclass
class SegmentRun:
    """What one program run did: cycles (total and per layer), MACs the array did, DRAM bytes."""

    segment: int
    cycles: int
    array_macs: int
    dram_read_bytes: int
    dram_write_bytes: int
    instructions: int
    layer_cycles: list[int]


@dataclass
class ModelRun:
    """Outputs of a run (graph output name -> array, images concatenated on axis 0), the report
    (JSON-ready) and, with ``capture``, every tensor each image computed."""

    outputs: dict[str, np.ndarray]
    report: dict[str, Any]
    intermediates: list[dict[str, np.ndarray]] | None = None
    runs: list[SegmentRun] = field(default_factory=list)


def check_inputs(graph: Graph, inputs: Mapping[str, Any]) -> int:
    """Validate ``inputs`` for ``graph`` (one array per graph input, shape ``(k * batch, ...)`` for
    k images of the model's ``(batch, ...)``, the declared dtype); returns k. Raises
    :class:`~systolic.compiler.errors.InputError` naming the tensor."""
    if not isinstance(inputs, Mapping):
        raise InputError(f"inputs must be a mapping from input name to array, not "
                         f"{type(inputs).__name__}")
    for name in inputs:
        if name not in graph.inputs:
            raise InputError(f"unknown input {name!r}; the model's inputs are "
                             f"{', '.join(repr(n) for n in graph.inputs)}")
    counts = set()
    for name in graph.inputs:
        tensor = graph.tensors[name]
        if name not in inputs:
            raise InputError(f"input {name!r} is missing (the model's inputs are "
                             f"{', '.join(repr(n) for n in graph.inputs)})")
        value = inputs[name]
        if not isinstance(value, np.ndarray):
            raise InputError(f"input {name!r} must be a numpy array, not {type(value).__name__}")
        if value.dtype != np.dtype(tensor.dtype):
            raise InputError(f"input {name!r} must have dtype {tensor.dtype}, not {value.dtype}")
        shape = tensor.shape
        if not shape or shape[0] == 0:
            if value.shape != shape:
                raise InputError(f"input {name!r} must have shape {shape}, not {value.shape}")
            counts.add(1)
            continue
        batch = shape[0]
        if value.ndim != len(shape) or value.shape[1:] != shape[1:] or not value.shape[0] \
                or value.shape[0] % batch:
            rest = "".join(f", {d}" for d in shape[1:])
            raise InputError(f"input {name!r} must have shape {shape} (or (k * {batch}{rest}) for "
                             f"k images), not {value.shape}")
        counts.add(value.shape[0] // batch)
    if len(counts) > 1:
        raise InputError(f"inputs must hold the same number of images, not {sorted(counts)}")
    return counts.pop() if counts else 1


Span = tuple[int, int]   #: (byte address, bytes) of a tensor in DRAM


class _Backend:
    def __init__(self, model: CompiledModel, name: str, check_hazards: bool, *,
                 port: str | None = None, baud: int | None = None, board: str | None = None) -> None:
        self.model = model
        self.name = name
        self.check_hazards = check_hazards
        self._rtl = None
        self._board: _BoardLink | None = None
        if name != "board" and (port is not None or baud is not None):
            raise BackendError(f"port and baud are for the board backend, not the {name!r} backend")
        if name == "golden":
            from systolic.sim.golden import GoldenModel
            self.golden = GoldenModel(model.config)
        elif name == "rtl":
            try:
                from systolic.sim.rtl import RTLRunner
            except Exception as exc:   # the RTL runner or its tools cannot be imported
                raise BackendError(f"the rtl backend is not available: {exc}") from None
            size = 1 << max(16, (int(model.image.size) - 1).bit_length())
            try:
                self._rtl = RTLRunner(model.config, memory="fast", dram_bytes=size)
            except Exception as exc:
                raise BackendError(f"the rtl backend is not available: {exc}") from None
        elif name == "board":
            self._board = _BoardLink(model, port, baud, board)
        else:
            raise BackendError(f"backend must be one of {', '.join(BACKENDS)}, not {name!r}")

    def close(self) -> None:
        if self._board is not None:
            self._board.close()

    def run(self, seg: Segment, dram: np.ndarray, model: CompiledModel, written: list[Span],
            needed: list[Span]) -> tuple[np.ndarray, SegmentRun]:
        """Run ``seg`` of ``model`` on ``dram``; returns the DRAM after it (for the board: the
        ``needed`` spans read back, the rest as given) and what the run did. ``written``: the
        spans the host changed since the previous run of the same model."""
        if self._board is not None:
            return self._board.run(seg, dram, model, written, needed)
        if self.name == "golden":
            result = self.golden.run(seg.program, dram, check_hazards=self.check_hazards)
            layers = _layer_cycles(seg, result.timings)
        else:
            assert self._rtl is not None
            budget = max(1_000_000, 50 * seg.estimate * estimate_factor(model.config))
            try:
                with quiet_output():
                    result = self._rtl.run(seg.program, dram, prog_addr=seg.address,
                                           max_cycles=budget)
            except Exception as exc:   # build, simulator or device errors
                message = " ".join(str(exc).split()) or type(exc).__name__
                raise BackendError(f"the rtl backend failed on segment {seg.index}: "
                                   f"{message}") from None
            layers = [lay.tiling.estimate for lay in seg.layers]
        out = np.asarray(result.dram, np.uint8)[:dram.size]
        return out, SegmentRun(seg.index, int(result.cycles), int(result.macs),
                               int(result.dram_read_bytes), int(result.dram_write_bytes),
                               int(result.instructions), layers)


class _BoardLink:
    """The board backend: one :class:`systolic.boards.host.Board` connection for a run_model."""

    def __init__(self, model: CompiledModel, port: str | None, baud: int | None,
                 board: str | None) -> None:
        from systolic.boards.host import DEFAULT_BAUD, Board, BoardLinkError

        if port is None:
            raise BackendError("the board backend needs a port: a serial device such as "
                               "/dev/ttyUSB0, or socket://127.0.0.1:PORT for a simulated board")
        if baud is None:
            baud = DEFAULT_BAUD
            if board is not None:
                from systolic.boards.boards import get_board
                baud = get_board(board).baud
        try:
            self.board = Board(port, baud=baud, board=board)
        except BoardLinkError as exc:
            raise BackendError(f"the board backend cannot use {port}: {exc}") from None
        try:
            info = self.board.check_config(model.config)
            self.board.ensure_firmware(model.config)
        except BoardLinkError as exc:
            self.board.close()
            raise BackendError(f"the board backend cannot use {port}: {exc}") from None
        self.memory_bytes = info.memory_bytes
        self.loaded: np.ndarray | None = None      # the image on the board (of which model)
        self.start = time.perf_counter()

    def close(self) -> None:
        self.board.close()

    def stats(self) -> dict[str, Any]:
        b = self.board
        return {"port": b.port, "baud": b.baud, "board": b.board, "memory_bytes": self.memory_bytes,
                "requests": b.requests, "bytes_sent": b.bytes_sent, "bytes_received": b.bytes_received,
                "memory_bytes_written": b.mem_bytes_written, "memory_bytes_read": b.mem_bytes_read,
                "seconds": round(time.perf_counter() - self.start, 3)}

    def run(self, seg: Segment, dram: np.ndarray, model: CompiledModel, written: list[Span],
            needed: list[Span]) -> tuple[np.ndarray, SegmentRun]:
        from systolic.boards.host import BoardLinkError

        try:
            if self.loaded is not model.image:
                # a model's first program: its whole image (constants, zeroed arenas, programs)
                if dram.size > self.memory_bytes:
                    raise BackendError(
                        f"the board backend cannot run model {model.graph.name!r}: its DRAM image "
                        f"needs {dram.size} bytes, but the board at {self.board.port} has "
                        f"{self.memory_bytes} bytes of memory")
                self.board.write_mem(0, dram)
                self.loaded = model.image
            else:
                for addr, size in _merge_spans(written):
                    self.board.write_mem(addr, dram[addr:addr + size])
            budget = (_BOARD_RUN_SECONDS
                      + 2 * seg.estimate * estimate_factor(model.config) / _BOARD_SLOWEST_HZ)
            counters = self.board.run(seg.address, len(seg.program.instructions), timeout_s=budget)
            out = dram.copy()
            for addr, size in _merge_spans(needed):
                out[addr:addr + size] = np.frombuffer(self.board.read_mem(addr, size), np.uint8)
        except BoardLinkError as exc:
            raise BackendError(f"the board backend failed on segment {seg.index}: {exc}") from None
        layers = [lay.tiling.estimate for lay in seg.layers]
        return out, SegmentRun(seg.index, counters["cycles"], counters["macs"],
                               counters["dram_read_bytes"], counters["dram_write_bytes"],
                               counters["instructions"], layers)


def _merge_spans(spans: list[Span]) -> list[Span]:
    """``spans`` sorted, with overlapping ones and ones less than ``_BOARD_MERGE_GAP`` bytes apart
    merged (one transfer costs a frame header and a round trip)."""
    out: list[list[int]] = []
    for addr, size in sorted(s for s in spans if s[1] > 0):
        if out and addr <= out[-1][0] + out[-1][1] + _BOARD_MERGE_GAP:
            out[-1][1] = max(out[-1][1], addr + size - out[-1][0])
        else:
            out.append([addr, size])
    return [(a, n) for a, n in out]


@contextlib.contextmanager
def quiet_output() -> Iterator[None]:
    """Send what the simulator process prints (cocotb's log, on the inherited file descriptors
    1 and 2) to a discarded temporary file: the report says what happened."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def _layer_cycles(seg: Segment, timings: list[Any]) -> list[int]:
    """Cycles per layer of a golden run: the time from the previous layer's completion to this
    layer's (program order), so that the layers add up to the program's cycles."""
    ends = [0] * len(seg.layers)
    for t in timings:
        if t.index < len(seg.instr_layer):
            layer = seg.instr_layer[t.index]
            if layer >= 0:
                ends[layer] = max(ends[layer], t.end)
    out, done = [], 0
    for end in ends:
        new = max(done, end)
        out.append(new - done)
        done = new
    return out


def _read(model: CompiledModel, dram: np.ndarray, name: str, slot: int) -> np.ndarray:
    t = model.graph.tensors[name]
    addr = model.plan.address(name, slot)
    nbytes = t.size * np.dtype(t.dtype).itemsize
    return np.frombuffer(dram[addr:addr + nbytes].tobytes(), np.dtype(t.dtype).newbyteorder("<")) \
        .astype(t.dtype).reshape(t.shape)


def _write(model: CompiledModel, dram: np.ndarray, name: str, slot: int, value: np.ndarray) -> Span:
    t = model.graph.tensors[name]
    addr = model.plan.address(name, slot)
    blob = np.ascontiguousarray(value, np.dtype(t.dtype).newbyteorder("<")).view(np.uint8).reshape(-1)
    dram[addr:addr + blob.size] = blob
    return addr, int(blob.size)


def _span(model: CompiledModel, name: str, slot: int) -> Span:
    """Where tensor ``name`` of image slot ``slot`` lies in DRAM."""
    t = model.graph.tensors[name]
    return model.plan.address(name, slot), t.size * np.dtype(t.dtype).itemsize


def run_model(model: CompiledModel, inputs: Mapping[str, np.ndarray], *, backend: str = "golden",
              check_hazards: bool = True, capture: bool = False, progress: bool | None = None,
              stream: TextIO | None = None, port: str | None = None, baud: int | None = None,
              board: str | None = None) -> ModelRun:
    """Run ``model`` on ``inputs`` (see :func:`check_inputs`) on ``backend`` and return the
    outputs and the report: backend, config, cycles, macs, utilization (macs / (rows * cols *
    cycles); on the rtl and board backends with a compute clock of its own, cycles x
    compute_clock_mhz / clock_mhz, the array's own cycles), DRAM bytes read and written, and
    per layer (accelerator layers and host nodes, in schedule order) its cycles, MACs and
    utilization.

    ``capture``: also return every tensor of every image (accelerator tensors as read back from
    DRAM after their segment -- compile with ``keep_intermediates`` so that none is overwritten
    before). ``progress``: print a progress line on ``stream`` (stderr) while images run; by
    default when it is a terminal and there is more than one program run per segment.

    The board backend: ``port`` (required) is the board's serial device or pyserial URL,
    ``baud`` its baud rate (default: board preset ``board``'s, else 115200), ``board`` the preset
    it was built from (named in errors); the report gets a ``link`` entry (requests, bytes each
    way, seconds)."""
    images = check_inputs(model.graph, inputs)
    backend_impl = _Backend(model, backend, check_hazards, port=port, baud=baud, board=board)
    try:
        return _run(model, inputs, images, backend, backend_impl, capture, progress, stream)
    finally:
        backend_impl.close()


def _run(model: CompiledModel, inputs: Mapping[str, np.ndarray], images: int, backend: str,
         backend_impl: _Backend, capture: bool, progress: bool | None,
         stream: TextIO | None) -> ModelRun:
    graph = model.graph
    per_run = model.images_per_run
    runs_needed = -(-images // per_run)
    stream = stream if stream is not None else sys.stderr
    if progress is None:
        progress = runs_needed > 1 and hasattr(stream, "isatty") and stream.isatty()
    constants = {n: t.data for n, t in graph.tensors.items() if t.data is not None}
    results: dict[str, list[np.ndarray]] = {name: [] for name in graph.outputs}
    captured: list[dict[str, np.ndarray]] | None = [] if capture else None
    seg_runs: list[SegmentRun] = []
    host_seconds: dict[str, float] = {}
    start = time.perf_counter()
    remainder: CompiledModel | None = None
    for run in range(runs_needed):
        count = min(per_run, images - run * per_run)
        if count < per_run:
            # the last images: a program for exactly that many (the same tiles), so that no
            # cycles are spent on empty image slots
            from .codegen import compile_graph
            tilings = {seg.ops[k].name: layer.tiling for seg in model.segments
                       for layer, k in zip(seg.layers, seg.layer_op, strict=True)}
            remainder = compile_graph(graph, images_per_run=count, tilings=tilings,
                                      keep_intermediates=model.keep_intermediates)
        m = model if remainder is None else remainder
        envs = []
        for k in range(count):
            env = dict(constants)
            image = run * per_run + k
            for name in graph.inputs:
                value = inputs[name]
                batch = graph.tensors[name].shape[0] if graph.tensors[name].shape else 0
                env[name] = value[image * batch:(image + 1) * batch] if batch else value
            _views(m, env)
            envs.append(env)
        dram = m.image.copy()
        for step in m.steps:
            if step.kind == "host":
                node = step.nodes[0]
                t0 = time.perf_counter()
                for env in envs:
                    _run_host(m, node, env)
                    _views(m, env)
                host_seconds[node.name] = host_seconds.get(node.name, 0.0) + time.perf_counter() - t0
                continue
            seg = m.segments[step.segment]
            written = [_write(m, dram, name, slot, env[name])
                       for slot, env in enumerate(envs) for name in seg.reads]
            if m.overlay:
                # the programs share one address: this one goes there first
                words = np.frombuffer(seg.program.words(), np.uint8)
                dram[seg.address:seg.address + words.size] = words
                written.append((seg.address, words.size))
            needed = [_span(m, name, slot) for slot in range(len(envs)) for name in seg.writes]
            if capture:
                needed += [_span(m, op.output, slot) for slot in range(len(envs)) for op in seg.ops]
            dram, seg_run = backend_impl.run(seg, dram, m, written, needed)
            seg_runs.append(seg_run)
            for slot, env in enumerate(envs):
                for name in seg.writes:
                    env[name] = _read(m, dram, name, slot)
                if capture:
                    for op in seg.ops:
                        env.setdefault(op.output, _read(m, dram, op.output, slot))
                _views(m, env)
        for env in envs:
            for name in graph.outputs:
                results[name].append(np.asarray(env[name]))
            if captured is not None:
                captured.append({k: v for k, v in env.items() if k not in constants})
        if progress:
            done = min(images, (run + 1) * per_run)
            bar = "#" * (30 * done // images)
            print(f"\r{'systolic':s}: {done}/{images} images [{bar:<30s}]", end="", file=stream,
                  flush=True)
    if progress:
        print(file=stream, flush=True)
    seconds = time.perf_counter() - start
    outputs = {name: np.concatenate(parts, axis=0) if parts[0].ndim else parts[0]
               for name, parts in results.items()}
    report = _report(model, backend, images, seg_runs, host_seconds, seconds, remainder)
    if backend_impl._board is not None:
        report["link"] = backend_impl._board.stats()
    return ModelRun(outputs, report, captured, seg_runs)


def _views(model: CompiledModel, env: dict[str, np.ndarray]) -> None:
    """Views (which share their source's DRAM buffer) of tensors the host holds, for host
    nodes that read them."""
    for node in model.views:
        if node.inputs[0] in env and node.outputs[0] not in env:
            _run_host(model, node, env)


def _run_host(model: CompiledModel, node: Node, env: dict[str, np.ndarray]) -> None:
    run_host_node(model.graph, node, env)


_CYCLES_SOURCE = {
    "golden": "golden model cycle estimate (docs/isa.md)",
    "rtl": "RTL performance counters; per-layer cycles are compile-time estimates",
    "board": "the board's performance counters; per-layer cycles are compile-time estimates",
}


def _report(model: CompiledModel, backend: str, images: int, runs: list[SegmentRun],
            host_seconds: Mapping[str, float], seconds: float,
            remainder: CompiledModel | None = None) -> dict[str, Any]:
    c = model.config
    cycles = sum(r.cycles for r in runs)
    macs = model.macs * images
    # the array's peak MACs per counted cycle: with a compute clock of its own the RTL and the
    # board count control-clock cycles, in each of which the array runs compute_clock_mhz /
    # clock_mhz cycles of its own; the golden model's estimate assumes one clock
    peak = c.rows * c.cols * (c.array_clock_mhz / c.clock_mhz if backend != "golden" else 1.0)

    def util(m: int, cyc: int) -> float:
        return m / (peak * cyc) if cyc > 0 else 0.0

    per_op_cycles: dict[str, int] = {}
    for i, r in enumerate(runs):
        last_run = remainder is not None and i >= len(runs) - len(model.segments)
        seg = (remainder if last_run else model).segments[r.segment]
        for op_index, cyc in zip(seg.layer_op, r.layer_cycles, strict=True):
            name = seg.ops[op_index].name
            per_op_cycles[name] = per_op_cycles.get(name, 0) + cyc
    layers: list[dict[str, Any]] = []
    for step in model.steps:
        if step.kind == "host":
            node = step.nodes[0]
            layers.append({"name": node.name, "op": node.op, "host": True,
                           "seconds": round(host_seconds.get(node.name, 0.0), 6)})
            continue
        seg = model.segments[step.segment]
        estimates: dict[str, int] = {}
        for lay, op_index in zip(seg.layers, seg.layer_op, strict=True):
            estimates[seg.ops[op_index].name] = lay.tiling.estimate
        for op in step.nodes:
            m = next(lay.macs for lay, k in zip(seg.layers, seg.layer_op, strict=True)
                     if seg.ops[k] is op) * images
            cyc = per_op_cycles.get(op.name, 0)
            layers.append({"name": op.name, "op": op.op, "segment": seg.index, "host": False,
                           "cycles": cyc, "macs": m, "utilization": util(m, cyc),
                           "estimated_cycles": estimates.get(op.name, 0) * images,
                           "fused": list(op.fused)})
    return {
        "backend": backend,
        "model": model.graph.name,
        "config_hash": c.hash_hex,
        "config": c.to_dict(),
        "images": images,
        "images_per_run": model.images_per_run,
        "program_runs": len(runs),
        "cycles": cycles,
        "cycles_per_image": cycles / images if images else 0.0,
        "macs": macs,
        "array_macs": sum(r.array_macs for r in runs),
        "utilization": util(macs, cycles),
        "dram_read_bytes": sum(r.dram_read_bytes for r in runs),
        "dram_write_bytes": sum(r.dram_write_bytes for r in runs),
        "instructions": sum(r.instructions for r in runs),
        "microseconds_per_image": (cycles / images / c.clock_mhz) if images else 0.0,
        "cycles_source": _CYCLES_SOURCE.get(backend, ""),
        "wall_seconds": round(seconds, 3),
        "layers": layers,
    }
