"""The golden model: a numpy interpreter of ISA v2 (docs/isa.md), bit-exact and with the
documented cycle estimate.

It is the executable definition of the instruction set: the RTL and the compiler are tested
against it. It executes a program against a DRAM image through the three decoupled queues (load,
compute, store) and their dependency tokens, checks that every pair of conflicting accesses from
different queues is ordered by tokens (vector clocks), and reports per-instruction timing.

Arithmetic is that of :mod:`systolic.sim.arith`; sizes come from
:class:`systolic.hw.config.AcceleratorConfig`.

Units: addresses and sizes in DRAM are bytes; scratchpad, accumulator and table addresses are rows;
timing is in cycles.

Where docs/isa.md leaves a detail open, this model decides as follows (to be written into the document):

* Tokens: an instruction takes all the tokens it pops at once, when every one is available; it
  pushes after completing, into each channel as soon as that channel has room, and its queue
  starts nothing else until all its pushes are done. Tokens left in channels at FINISH are
  not an error.
* Execution order: of the queues that can act, the one whose instruction comes first in program
  order acts first. Results of hazard-free programs do not depend on this order.
* Hazards are tracked per row (scratchpad, accumulator, table) and per DRAM byte. Only the store
  queue writes DRAM; its residual reads are ordered with its writes by program order. A STORE
  reads the accumulator rows its output windows cover, not the whole image.
* ``pad_value`` must fit a scratchpad element read as the input or the weight type (spad), the
  input type (acc with widen) or the accumulator type (acc); a dst=table LOAD cannot be bounded.
* Timing: instruction 0 is dispatched at INSTR_BYTES / dma_bytes. A LOAD or STORE occupies its
  unit for its whole estimate, CONFIG and SYNC for 1 cycle, and the next instruction of the queue
  may start when they are over. A COMPUTE follows the array of :mod:`systolic.hw.array`: a WS
  preload shifts its k weight rows in from the cycle after the previous preload's first input
  row (the array takes weight rows only while no completed preload waits), its m
  input rows follow the previous COMPUTE's rows; OS operand beats follow the previous COMPUTE's,
  with ``last`` beats at least R cycles apart. It ends when its last result row is readable in the
  accumulator (:func:`~systolic.hw.array.array_latency`, the OS drain and
  :func:`~systolic.hw.accumulator.write_latency`), and never before the previous instruction of its
  queue ends (completion is in order, so a SYNC's token follows the COMPUTEs before it). The j-th
  token pushed into a channel arrives at max(end, the start of the instruction that took token
  j - token_depth). FINISH starts at max(its dispatch, the latest end or token arrival) and takes
  1 cycle; its end is the program's cycle count. A STORE's DRAM beats count one row per output
  pixel, and a STORE adds the latency of :func:`~systolic.hw.sfu.sfu_latency` (``avg=True`` for
  average pooling).
* DRAM traffic (``dram_read_bytes``, ``dram_write_bytes``) is counted as the hardware counters
  count it: bus bytes, every beat the DMA transfers times the bus width, whole beats even when
  only some of their bytes are used (docs/isa.md, "Performance counters"); instruction fetch is
  not counted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from systolic.hw.accumulator import write_latency
from systolic.hw.array import array_latency
from systolic.hw.config import AcceleratorConfig
from systolic.hw.dma import residual_read_fields
from systolic.hw.dma_serial import serial_load_cycles, serial_store_write_cycles
from systolic.hw.isa import (
    INSTR_BYTES,
    Activation,
    Instruction,
    IsaError,
    Memory,
    Opcode,
    PoolMode,
    Program,
    decode,
)
from systolic.hw.sfu import sfu_latency
from systolic.hw.sfu_serial import serial_sfu_cycles
from systolic.sim.arith import (
    MAX_SHIFT,
    avg_pool_finish,
    sfu_pointwise,
    wrap,
)

__all__ = [
    "ExecutionError", "HazardError", "DeadlockError", "InstrTiming", "MachineState", "RunResult",
    "GoldenModel", "run_golden", "QUEUE_NAMES",
]

#: Queue names by queue number (``systolic.hw.isa.Queue`` values).
QUEUE_NAMES = ("load", "compute", "store")

_LOAD_Q, _COMPUTE_Q, _STORE_Q = 0, 1, 2
_SPAD, _ACC, _TABLE = Memory.SPAD.value, Memory.ACC.value, Memory.TABLE.value
_NQ = 3
_MEMORY_NAMES = {0: "scratchpad", 1: "accumulator", 2: "requantize table"}
_PAGE_BITS = 16
_PAGE = 1 << _PAGE_BITS


class ExecutionError(ValueError):
    """A program breaks a rule of docs/isa.md while executing. The message starts with
    ``instruction {i} ({OPNAME}): `` and names the field, the rule and the given value."""


class HazardError(ExecutionError):
    """Two accesses from different queues to the same row or DRAM byte, one of them a write,
    are not ordered by tokens. The message names both instructions and the memory location."""


class DeadlockError(ExecutionError):
    """No queue and not the dispatcher can make progress before FINISH. The message names each
    blocked queue's head instruction and what it waits for."""


@dataclass(frozen=True)
class InstrTiming:
    """Cycle estimate of one instruction (docs/isa.md, "Cycle estimate"); all values in cycles.

    ``start`` is when the instruction begins to use its unit (for a COMPUTE, its first weight
    row or input row / operand beat enters the array); ``end`` is when its results are complete
    and its tokens are pushed (for a COMPUTE, its last result row is readable in the
    accumulator); ``queue`` is ``load``/``compute``/``store``, or ``dispatcher`` for FINISH."""

    index: int
    op: str
    queue: str
    dispatch: int
    start: int
    end: int


@dataclass
class MachineState:
    """The on-chip state at FINISH (int64 arrays, owned by the result), for unit tests of the
    gateware blocks that implement one instruction (a LOAD's DMA path, a STORE's SFU path).

    ``spad`` holds raw element bits (``spad_elem_bits`` wide, unsigned: a scratchpad element has no
    type until a COMPUTE reads it); ``acc`` holds signed (or unsigned, per ``acc_signed``)
    accumulator values; ``table`` holds (bias, multiplier, shift) per row and channel."""

    spad: np.ndarray                 #: (spad_rows, spad_row_elems) raw element bits
    acc: np.ndarray                  #: (acc_rows, cols) accumulator values
    table: np.ndarray                #: (requant_table_rows, cols, 3) bias, multiplier, shift
    weights: np.ndarray              #: (rows, cols) stationary weights of the last WS preload
    sfu: dict[str, int]              #: CONFIG registers by field name


@dataclass
class RunResult:
    """What a program did: the final DRAM image and its cost under the cycle estimate."""

    dram: np.ndarray                 #: final DRAM image (uint8), a copy
    cycles: int                      #: total estimate: the end of FINISH, cycles
    timings: list[InstrTiming]       #: one per executed instruction, in program order
    macs: int                        #: sum of m*k*n over COMPUTEs (useful multiply-accumulates)
    busy: dict[str, int]             #: cycles each unit (load/compute/store) was occupied
    dram_read_bytes: int             #: bus bytes (beats x dma_bytes) read by LOADs and residual reads
    dram_write_bytes: int            #: bus bytes (beats x dma_bytes) written by STOREs
    instructions: int                #: instructions executed, FINISH included
    peak_macs_per_cycle: int = 1     #: rows * cols of the array
    state: MachineState | None = None   #: on-chip memories and registers at FINISH

    @property
    def utilization(self) -> float:
        """Fraction of the array's peak used: macs / (rows * cols * cycles)."""
        if self.cycles <= 0:
            return 0.0
        return self.macs / (self.peak_macs_per_cycle * self.cycles)

    def summary(self) -> dict[str, Any]:
        """The figures without the DRAM image and the timings (for JSON reports)."""
        return {
            "cycles": self.cycles, "macs": self.macs, "utilization": self.utilization,
            "busy": dict(self.busy), "dram_read_bytes": self.dram_read_bytes,
            "dram_write_bytes": self.dram_write_bytes, "instructions": self.instructions,
        }


# --------------------------------------------------------------------------------------------
# decoded instructions


class _Op:
    """One decoded instruction, with its fields as a plain dict for fast access."""

    __slots__ = ("index", "opcode", "name", "queue", "f", "pop_prev", "pop_next", "push_prev",
                 "push_next")

    def __init__(self, index: int, instr: Instruction) -> None:
        self.index = index
        self.opcode = instr.op
        self.name = instr.op.name
        q = instr.queue
        self.queue = None if q is None else q.value
        self.f = instr.fields
        self.pop_prev = self.f["pop_prev"]
        self.pop_next = self.f["pop_next"]
        self.push_prev = self.f["push_prev"]
        self.push_next = self.f["push_next"]


def _fail(op: _Op, field_name: str, rule: str, cls: type[ExecutionError] = ExecutionError
          ) -> ExecutionError:
    return cls(f"instruction {op.index} ({op.name}): field {field_name}: {rule}")


def _decode_program(program: Any, config: AcceleratorConfig) -> list[_Op]:
    """Instructions up to and including the first FINISH, checked for their token flags."""
    if isinstance(program, Program):
        program.check_config(config)
        items: Sequence[Any] = program.instructions
    elif isinstance(program, bytes | bytearray | memoryview):
        blob = bytes(program)
        if len(blob) % INSTR_BYTES:
            raise ExecutionError(f"instruction {len(blob) // INSTR_BYTES} (truncated): the program "
                                 f"words must be a multiple of {INSTR_BYTES} bytes, not {len(blob)}")
        items = [blob[i:i + INSTR_BYTES] for i in range(0, len(blob), INSTR_BYTES)]
    elif isinstance(program, Sequence) and not isinstance(program, str):
        items = program
    else:
        raise TypeError(f"program must be a Program, instruction words (bytes) or a sequence of "
                        f"Instructions, not {type(program).__name__}")

    ops: list[_Op] = []
    for index, item in enumerate(items):
        if isinstance(item, Instruction):
            instr = item
        elif isinstance(item, bytes | bytearray | int) and not isinstance(item, bool):
            instr = _decode_word(item, index)
        else:
            raise TypeError(f"instruction {index} must be an Instruction, a 64-byte word or an "
                            f"integer word, not {type(item).__name__}")
        op = _Op(index, instr)
        _check_flags(op)
        ops.append(op)
        if op.opcode is Opcode.FINISH:
            return ops
    if not ops:
        raise ExecutionError("the program is empty: a program must end with FINISH")
    last = ops[-1]
    raise ExecutionError(f"instruction {last.index} ({last.name}): the program ends here without "
                         f"FINISH; a program must end with FINISH")


def _decode_word(word: bytes | bytearray | int, index: int) -> Instruction:
    value = int.from_bytes(word, "little") if isinstance(word, bytes | bytearray) else word
    opcode = value & 0xF
    try:
        name = Opcode(opcode).name
    except ValueError:
        raise ExecutionError(
            f"instruction {index} (opcode {opcode}): field opcode: must be one of "
            f"{', '.join(f'{o.value} {o.name}' for o in Opcode)}, not {opcode}") from None
    try:
        return decode(bytes(word) if not isinstance(word, int) else word)
    except IsaError as exc:
        message = str(exc)
        prefix = f"{name} "
        if message.startswith(prefix):
            message = message[len(prefix):]
        raise ExecutionError(f"instruction {index} ({name}): {message}") from None


def _check_flags(op: _Op) -> None:
    if op.opcode is Opcode.FINISH:
        for flag in ("pop_prev", "pop_next", "push_prev", "push_next"):
            if op.f[flag]:
                raise _fail(op, flag, f"FINISH takes no token flags, so {flag} must be 0, not 1")
        return
    qname = QUEUE_NAMES[op.queue]
    where = f" (SYNC queue={qname})" if op.opcode is Opcode.SYNC else ""
    if op.queue == _LOAD_Q:
        for flag in ("pop_prev", "push_prev"):
            if op.f[flag]:
                raise _fail(op, flag, f"the load queue{where} has no previous queue, so {flag} "
                                      f"must be 0, not 1")
    if op.queue == _STORE_Q:
        for flag in ("pop_next", "push_next"):
            if op.f[flag]:
                raise _fail(op, flag, f"the store queue{where} has no next queue, so {flag} "
                                      f"must be 0, not 1")


# --------------------------------------------------------------------------------------------
# hazard bookkeeping


class _RowTracker:
    """Last write (queue, sequence number) and last read per queue of each row of one memory."""

    def __init__(self, rows: int, what: str) -> None:
        self.what = what
        self.write_queue = np.full(rows, -1, np.int8)
        self.write_seq = np.zeros(rows, np.int64)
        self.read_seq = np.zeros((_NQ, rows), np.int64)


class _PagedSeq:
    """A sequence number per DRAM byte, allocated in 64 KiB pages only where bytes are touched.

    Untouched pages map to page 0, which is all zero ("never accessed") and never written."""

    def __init__(self, size: int) -> None:
        self._table = np.zeros((size + _PAGE - 1) >> _PAGE_BITS, np.int64)
        self._pool = np.zeros((2, _PAGE), np.int32)
        self._used = 1

    def get(self, addr: np.ndarray) -> np.ndarray:
        return self._pool[self._table[addr >> _PAGE_BITS], addr & (_PAGE - 1)]

    def set(self, addr: np.ndarray, value: int) -> None:
        pages = addr >> _PAGE_BITS
        slots = self._table[pages]
        if not slots.all():
            missing = np.unique(pages[slots == 0])
            need = self._used + missing.size
            if need > self._pool.shape[0]:
                grown = np.zeros((max(need, 2 * self._pool.shape[0]), _PAGE), np.int32)
                grown[:self._used] = self._pool[:self._used]
                self._pool = grown
            self._table[missing] = np.arange(self._used, need)
            self._used = need
            slots = self._table[pages]
        self._pool[slots, addr & (_PAGE - 1)] = value


# --------------------------------------------------------------------------------------------
# DRAM helpers


def _read_le(dram: np.ndarray, addr: np.ndarray, nbytes: int, bits: int, signed: bool) -> np.ndarray:
    """Little-endian ``nbytes``-byte integers at byte addresses ``addr``, as ``bits``-bit values."""
    value = dram[addr].astype(np.int64)
    for b in range(1, nbytes):
        value |= dram[addr + b].astype(np.int64) << (8 * b)
    return wrap(value, bits, signed) if signed else value


def _byte_addresses(addr: np.ndarray, nbytes: int) -> np.ndarray:
    addr = addr.reshape(-1)
    if nbytes == 1:
        return addr
    return (addr[:, None] + np.arange(nbytes, dtype=np.int64)).reshape(-1)


def _bus_beats(addr: np.ndarray, inside: np.ndarray | None, esz: int, beat: int) -> tuple[int, int]:
    """Bus beats of a transfer whose rows are the rows of ``addr`` (element byte addresses, in
    element order) and the bytes it moves: per row, each maximal run of in-image elements at
    consecutive addresses spans ceil((start mod beat + bytes) / beat) beats; a row costs at least
    one cycle."""
    rows, width = addr.shape
    if inside is None:
        if width == 1 or (np.diff(addr, axis=1) == esz).all():   # one run per row
            nbytes = width * esz
            beats = (addr[:, 0] % beat + nbytes + beat - 1) // beat
            return int(beats.sum()), rows * nbytes
        inside = np.ones(addr.shape, bool)
    cont = np.zeros(addr.shape, bool)
    cont[:, 1:] = inside[:, 1:] & inside[:, :-1] & (addr[:, 1:] == addr[:, :-1] + esz)
    starts = inside & ~cont
    ends = inside.copy()
    ends[:, :-1] &= ~cont[:, 1:]
    start_rows, start_cols = np.nonzero(starts)
    first = addr[start_rows, start_cols]
    last = addr[ends]
    nbytes = last - first + esz
    beats = (first % beat + nbytes + beat - 1) // beat
    per_row = np.bincount(start_rows, weights=beats, minlength=rows)   # exact below 2**53
    return int(np.maximum(per_row, 1).sum()), int(nbytes.sum())


def _dma_bus_bytes(addr: np.ndarray, esz: int, beat: int) -> int:
    """Bus bytes (beats x ``beat`` bytes) the DMA transfers for the elements of one LOAD, STORE
    or residual read at byte addresses ``addr`` (in-image elements only, in element order): each
    element lies in beats ``addr // beat .. (addr + esz - 1) // beat``; an element whose first
    beat is the previous element's last beat shares it (the DMA keeps the last beat of a run and
    packs runs that meet in one beat into it, hw/dma.py), so the count is the concatenated beat
    sequence with consecutive repeats removed."""
    flat = np.asarray(addr, np.int64).reshape(-1)
    if flat.size == 0:
        return 0
    first = flat // beat
    last = (flat + esz - 1) // beat
    beats = int((last - first + 1).sum()) - int(np.count_nonzero(first[1:] == last[:-1]))
    return beats * beat


def _steps(n_a: int, step_a: int, n_b: int, step_b: int) -> np.ndarray:
    """a * step_a + b * step_b for a < n_a, b < n_b, flattened with b fastest."""
    return (np.arange(n_a, dtype=np.int64)[:, None] * step_a
            + np.arange(n_b, dtype=np.int64)[None, :] * step_b).reshape(-1)


# --------------------------------------------------------------------------------------------
# one run


class _Run:
    """State of one program execution: memories, queues, tokens, hazard clocks and timing."""

    def __init__(self, config: AcceleratorConfig, ops: list[_Op], dram: np.ndarray,
                 check_hazards: bool) -> None:
        c = config
        self.c = c
        self.ops = ops
        self.dram = dram
        self.spad = np.zeros((c.spad_rows, c.spad_row_elems), np.int64)
        self.acc = np.zeros((c.acc_rows, c.cols), np.int64)
        self.table = np.zeros((c.requant_table_rows, c.cols, 3), np.int64)
        self.weights = np.zeros((c.rows, c.cols), np.int64)
        self.weights_kn: tuple[int, int] | None = None
        self.sfu = {"zp_out": 0, "act_lo": 0, "act_hi": 0, "avg_mult": 0, "avg_shift": 0,
                    "res_zp": 0, "res_mult": 0, "tie_out": 0, "avg_tie_out": 0}
        # token channels (from queue, to queue): FIFO of (vector clock, arrival cycle)
        self.channels: dict[tuple[int, int], deque[tuple[np.ndarray | None, int]]] = {
            (0, 1): deque(), (1, 0): deque(), (1, 2): deque(), (2, 1): deque()}
        self.pushes = dict.fromkeys(self.channels, 0)
        self.pop_cycles: dict[tuple[int, int], list[int]] = {ch: [] for ch in self.channels}
        # hazards
        self.check = check_hazards
        self.seq = [0] * _NQ
        self.vc = [np.zeros(_NQ, np.int64) for _ in range(_NQ)]
        self.instr_of_seq: list[list[int]] = [[0] for _ in range(_NQ)]
        if check_hazards:
            self.spad_track = _RowTracker(c.spad_rows, "scratchpad row")
            self.acc_track = _RowTracker(c.acc_rows, "accumulator row")
            self.table_track = _RowTracker(c.requant_table_rows, "requantize table row")
            self.dram_written = _PagedSeq(dram.size)   # store-queue sequence number
            self.dram_read = _PagedSeq(dram.size)      # load-queue sequence number
        # timing
        self.fetch = INSTR_BYTES // c.dma_bytes
        # per (dst, widen): rows, elements per row, DRAM element bytes, bits, signed, pad range
        spad_lo = min(c.input_range[0], c.weight_range[0])
        spad_hi = max(c.input_range[1], c.weight_range[1])
        self.load_spec = {
            (_SPAD, 0): (c.spad_rows, c.spad_row_elems, c.spad_elem_bytes,
                                     c.spad_elem_bits, False, spad_lo, spad_hi,
                                     "a scratchpad element (input or weight type)"),
            (_ACC, 0): (c.acc_rows, c.cols, c.acc_bytes, c.acc_bits, c.acc_signed,
                                    *c.acc_range, "an accumulator element"),
            (_ACC, 1): (c.acc_rows, c.cols, c.input_bytes, c.input_bits,
                                    c.input_signed, *c.input_range, "the input type (widen)"),
            (_TABLE, 0): (c.requant_table_rows, c.cols, c.requant_entry_bytes, 32, True,
                                      0, 0, ""),
        }
        self.spad_rows, self.acc_rows = c.spad_rows, c.acc_rows
        self.table_group = c.table_load_entries
        self.dma_bytes, self.dram_latency = c.dma_bytes, c.dram_latency
        self.serial_reader = c.gather_engine == "serial"
        self.write_latency = write_latency(c)
        self.serial_writer = c.scatter_engine == "serial"
        self.serial_sfu = c.sfu_engine == "serial"
        self.input_type = (c.input_bits, c.input_signed)
        self.weight_type = (c.weight_bits, c.weight_signed)
        self.acc_type = (c.acc_bits, c.acc_signed)
        self.last_dispatch = 0
        self.queue_starts: list[list[int]] = [[] for _ in range(_NQ)]
        self.queue_free = [0] * _NQ     # earliest start of the queue's next instruction
        self.queue_end = [0] * _NQ      # end of the queue's last instruction (in-order completion)
        self.timings: list[InstrTiming] = []
        self.busy = [0] * _NQ
        # the array (docs/isa.md, "Cycle estimate"), all in cycles
        self.array_latency = array_latency(c)   # input row / last OS beat to (first) result row
        self.shadow_free = 0    # WS: first cycle a preload's weight rows may enter
        self.stream_end = 0     # the cycle after the last input row / operand beat so far
        self.os_last_beat = 0   # OS: earliest cycle of the next tile's last beat
        self.sfu_latency, self.sfu_avg_latency = sfu_latency(c), sfu_latency(c, avg=True)
        self.macs = 0
        self.read_bytes = 0
        self.write_bytes = 0
        self.latest = 0

    # -- scheduling -------------------------------------------------------------------------

    def execute(self) -> RunResult:
        c = self.c
        ops = self.ops
        depth = (c.load_queue_depth, c.compute_queue_depth, c.store_queue_depth)
        pending: list[deque[tuple[_Op, int]]] = [deque(), deque(), deque()]
        blocked: list[tuple[_Op, list[tuple[int, int]], int, int] | None] = [None] * _NQ
        finish = ops[-1]
        nxt = 0
        while True:
            while nxt < len(ops) - 1:   # dispatch; the last op is FINISH
                op = ops[nxt]
                q = op.queue
                if len(pending[q]) >= depth[q]:
                    break
                dispatch = self.last_dispatch + self.fetch
                starts = self.queue_starts[q]
                count = len(starts) + len(pending[q])   # position of op in queue q
                if count >= depth[q]:
                    dispatch = max(dispatch, starts[count - depth[q]])
                self.last_dispatch = dispatch
                pending[q].append((op, dispatch))
                nxt += 1
            if nxt == len(ops) - 1 and not any(pending) and not any(b is not None for b in blocked):
                break
            best_q = -1
            best_index = -1
            for q in range(_NQ):
                b = blocked[q]
                if b is not None:
                    if any(len(self.channels[ch]) < c.token_depth for ch in b[1]):
                        if best_q < 0 or b[0].index < best_index:
                            best_q, best_index = q, b[0].index
                elif pending[q]:
                    head = pending[q][0][0]
                    if self._can_pop(head, q) and (best_q < 0 or head.index < best_index):
                        best_q, best_index = q, head.index
            if best_q < 0:
                raise self._deadlock(pending, blocked, ops[nxt], depth)
            b = blocked[best_q]
            if b is not None:
                blocked[best_q] = self._push(b[0], best_q, b[1], b[2], b[3])
            else:
                op, dispatch = pending[best_q].popleft()
                blocked[best_q] = self._run_one(op, best_q, dispatch)

        dispatch = self.last_dispatch + self.fetch
        start = max(dispatch, self.latest)
        end = start + 1
        self.timings.sort(key=lambda t: t.index)
        self.timings.append(InstrTiming(finish.index, finish.name, "dispatcher", dispatch, start, end))
        return RunResult(
            dram=self.dram, cycles=end, timings=self.timings, macs=self.macs,
            busy={name: self.busy[q] for q, name in enumerate(QUEUE_NAMES)},
            dram_read_bytes=self.read_bytes, dram_write_bytes=self.write_bytes,
            instructions=len(self.timings), peak_macs_per_cycle=c.rows * c.cols,
            state=MachineState(spad=self.spad, acc=self.acc, table=self.table,
                               weights=self.weights, sfu=dict(self.sfu)))

    def _can_pop(self, op: _Op, q: int) -> bool:
        if op.pop_prev and not self.channels[(q - 1, q)]:
            return False
        if op.pop_next and not self.channels[(q + 1, q)]:
            return False
        return True

    def _run_one(self, op: _Op, q: int, dispatch: int
                 ) -> tuple[_Op, list[tuple[int, int]], int, int] | None:
        """Pop the tokens, execute, push (or block on a full channel)."""
        start = max(dispatch, self.queue_free[q])
        vc = self.vc[q]
        for flag, src in ((op.pop_prev, q - 1), (op.pop_next, q + 1)):
            if flag:
                ch = (src, q)
                token_vc, arrival = self.channels[ch].popleft()
                start = max(start, arrival)
                if token_vc is not None:
                    np.maximum(vc, token_vc, out=vc)
        ready = start   # a COMPUTE may wait for the array beyond this
        opcode = op.opcode
        if opcode is Opcode.COMPUTE:
            start = self._array_start(op, ready)
        for flag, src in ((op.pop_prev, q - 1), (op.pop_next, q + 1)):
            if flag:
                self.pop_cycles[(src, q)].append(start)
        self.queue_starts[q].append(start)
        self.seq[q] += 1
        vc[q] = self.seq[q]
        self.instr_of_seq[q].append(op.index)

        if opcode is Opcode.COMPUTE:
            # the array, not the queue, keeps COMPUTEs apart: the next may be issued a cycle later
            self._compute(op)
            busy, done = self._compute_timing(op, ready, start)
            self.queue_free[q] = start + 1
        else:
            if opcode is Opcode.LOAD:
                busy = self._load(op)
            elif opcode is Opcode.STORE:
                busy = self._store(op)
            elif opcode is Opcode.CONFIG:
                busy = self._config(op)
            else:  # SYNC
                busy = 1
            done = start + busy
            self.queue_free[q] = start + busy
        end = max(done, self.queue_end[q])
        self.queue_end[q] = end
        self.busy[q] += busy
        self.latest = max(self.latest, end)
        self.timings.append(InstrTiming(op.index, op.name, QUEUE_NAMES[q], dispatch, start, end))

        channels = []
        if op.push_prev:
            channels.append((q, q - 1))
        if op.push_next:
            channels.append((q, q + 1))
        if not channels:
            return None
        return self._push(op, q, channels, end, 0)

    def _push(self, op: _Op, q: int, channels: list[tuple[int, int]], end: int, stall: int
              ) -> tuple[_Op, list[tuple[int, int]], int, int] | None:
        """Push into every channel with room; return what is still blocked, if anything.

        The j-th token into a channel needs the (j - token_depth)-th to have been taken: it
        arrives at max(end, the cycle that token was taken)."""
        depth = self.c.token_depth
        waiting = []
        for ch in channels:
            tokens = self.channels[ch]
            if len(tokens) >= depth:
                waiting.append(ch)
                continue
            j = self.pushes[ch]
            arrival = end
            if j >= depth:
                freed = self.pop_cycles[ch][j - depth]
                if freed > end:
                    arrival = freed
                    stall = max(stall, freed)
            self.pushes[ch] = j + 1
            tokens.append((self.vc[q].copy() if self.check else None, arrival))
            self.latest = max(self.latest, arrival)
        if waiting:
            return (op, waiting, end, stall)
        # a push that had to wait for room holds the queue until it is done
        self.queue_free[q] = max(self.queue_free[q], stall)
        return None

    def _deadlock(self, pending: list[deque[tuple[_Op, int]]],
                  blocked: list[tuple[_Op, list[tuple[int, int]], int, int] | None],
                  next_op: _Op, depth: tuple[int, int, int]) -> DeadlockError:
        parts = []
        first: _Op | None = None
        for q, name in enumerate(QUEUE_NAMES):
            b = blocked[q]
            if b is not None:
                op = b[0]
                chans = ", ".join(f"{QUEUE_NAMES[s]}->{QUEUE_NAMES[d]} holds "
                                  f"{len(self.channels[(s, d)])} of {self.c.token_depth}"
                                  for s, d in b[1])
                parts.append(f"{name} queue: instruction {op.index} ({op.name}) waits to push a "
                             f"token into a full channel ({chans})")
            elif pending[q]:
                op = pending[q][0][0]
                waits = []
                if op.pop_prev and not self.channels[(q - 1, q)]:
                    waits.append(f"a token from the {QUEUE_NAMES[q - 1]} queue")
                if op.pop_next and not self.channels[(q + 1, q)]:
                    waits.append(f"a token from the {QUEUE_NAMES[q + 1]} queue")
                parts.append(f"{name} queue: instruction {op.index} ({op.name}) waits for "
                             f"{' and '.join(waits)}")
            else:
                parts.append(f"{name} queue: empty")
                continue
            if first is None or op.index < first.index:
                first = op
        if next_op.opcode is Opcode.FINISH:
            parts.append(f"dispatcher: instruction {next_op.index} (FINISH) waits for every "
                         f"queue to be idle")
        else:
            q = next_op.queue
            parts.append(f"dispatcher: instruction {next_op.index} ({next_op.name}) waits for room "
                         f"in the {QUEUE_NAMES[q]} queue ({depth[q]} of {depth[q]} entries used)")
        assert first is not None
        return DeadlockError(f"instruction {first.index} ({first.name}): deadlock, no queue can "
                             f"progress: " + "; ".join(parts))

    # -- hazards ----------------------------------------------------------------------------

    def _owner(self, q: int, seq: int) -> str:
        index = self.instr_of_seq[q][seq]
        return f"instruction {index} ({self.ops[index].name})"

    def _check_rows(self, op: _Op, q: int, track: _RowTracker, rows: np.ndarray, write: bool) -> None:
        vc = self.vc[q]
        wq = track.write_queue[rows]
        other = (wq >= 0) & (wq != q)
        if other.any():
            bad = other & (track.write_seq[rows] > vc[wq])
            if bad.any():
                j = int(np.argmax(bad))
                raise HazardError(
                    f"instruction {op.index} ({op.name}): {'writes' if write else 'reads'} "
                    f"{track.what} {int(rows[j])} written by "
                    f"{self._owner(int(wq[j]), int(track.write_seq[rows[j]]))} without a token "
                    f"ordering them")
        if write:
            for p in range(_NQ):
                if p == q:
                    continue
                rs = track.read_seq[p, rows]
                bad = rs > vc[p]
                if bad.any():
                    j = int(np.argmax(bad))
                    raise HazardError(
                        f"instruction {op.index} ({op.name}): writes {track.what} {int(rows[j])} "
                        f"read by {self._owner(p, int(rs[j]))} without a token ordering them")

    def _mark_rows(self, q: int, track: _RowTracker, rows: np.ndarray, write: bool) -> None:
        if write:
            track.write_queue[rows] = q
            track.write_seq[rows] = self.seq[q]
        else:
            track.read_seq[q, rows] = self.seq[q]

    def _check_dram(self, op: _Op, q: int, byte_addr: np.ndarray, write: bool) -> None:
        """DRAM is written only by the store queue and read by the load queue (the store
        queue's residual reads are ordered with its writes by program order)."""
        vc = self.vc[q]
        if write:
            seen = self.dram_read.get(byte_addr)
            bad = seen > vc[_LOAD_Q]
            what, other_q, verb = "read", _LOAD_Q, "writes"
        else:
            seen = self.dram_written.get(byte_addr)
            bad = seen > vc[_STORE_Q]
            what, other_q, verb = "written", _STORE_Q, "reads"
        if bad.any():
            j = int(np.argmax(bad))
            raise HazardError(
                f"instruction {op.index} ({op.name}): {verb} DRAM byte {int(byte_addr[j]):#x} {what} "
                f"by {self._owner(other_q, int(seen[j]))} without a token ordering them")

    # -- LOAD -------------------------------------------------------------------------------

    def _load(self, op: _Op) -> int:
        f = op.f
        dst = f["dst"]
        mem_name = _MEMORY_NAMES[dst]
        for name in ("rows_outer", "rows_inner", "segs", "seg_len"):
            if f[name] == 0:
                raise _fail(op, name, f"zero-size transfer: {name} must be at least 1, not 0")
        if f["widen"] and dst != _ACC:
            raise _fail(op, "widen", f"widen applies to dst=acc only, not dst={Memory(dst).name.lower()}")
        bounded = f["bounded"]
        if bounded and dst == _TABLE:
            raise _fail(op, "bounded", "a dst=table LOAD has no padding (a requantize entry has no "
                                       "pad value), so bounded must be 0, not 1")
        n_outer, n_inner, n_segs, seg_len = f["rows_outer"], f["rows_inner"], f["segs"], f["seg_len"]
        nrows = n_outer * n_inner
        width = n_segs * seg_len
        mem_rows, row_elems, esz, bits, signed, lo, hi, pad_rule = self.load_spec[(dst, f["widen"])]
        row0 = f["dst_addr"]
        if row0 + nrows > mem_rows:
            raise _fail(op, "dst_addr", f"destination rows {row0}..{row0 + nrows - 1} must lie in "
                                        f"the {mem_name} (rows 0..{mem_rows - 1}), but row "
                                        f"{row0 + nrows - 1} is past its end")
        col0 = f["dst_col"]
        if col0 + width > row_elems:
            raise _fail(op, "dst_col", f"destination elements {col0}..{col0 + width - 1} must lie "
                                       f"in a {mem_name} row (elements 0..{row_elems - 1}), but "
                                       f"element {col0 + width - 1} is past its end")
        group = self.table_group
        if dst == _TABLE and col0 // group != (col0 + width - 1) // group:
            raise _fail(op, "dst_col", f"the entries a dst=table LOAD writes in a row must lie in one "
                                       f"aligned group of requant_load_entries ({group}), but "
                                       f"entries {col0}..{col0 + width - 1} span groups "
                                       f"{col0 // group}..{(col0 + width - 1) // group}")
        pad = f["pad_value"]
        if bounded and not lo <= pad <= hi:
            raise _fail(op, "pad_value", f"pad_value must fit {pad_rule}, {lo}..{hi}, not {pad}")

        # coordinates as (destination row, element) = ((o, i), (s, e)) outer sums
        py, px, pc = f["pitch_y"], f["pitch_x"], f["pitch_c"]
        row_addr = _steps(n_outer, f["outer_dy"] * py + f["outer_dx"] * px + f["outer_dc"] * pc,
                          n_inner, f["inner_dy"] * py + f["inner_dx"] * px + f["inner_dc"] * pc)
        elem_addr = _steps(n_segs, f["seg_dy"] * py + f["seg_dx"] * px + f["seg_dc"] * pc,
                           seg_len, f["elem_dy"] * py + f["elem_dx"] * px + f["elem_dc"] * pc)
        base = f["dram_addr"] + f["y0"] * py + f["x0"] * px
        addr = (base + row_addr)[:, None] + elem_addr[None, :]
        inside = None
        if bounded:
            y = ((f["y0"] + _steps(n_outer, f["outer_dy"], n_inner, f["inner_dy"]))[:, None]
                 + _steps(n_segs, f["seg_dy"], seg_len, f["elem_dy"])[None, :])
            x = ((f["x0"] + _steps(n_outer, f["outer_dx"], n_inner, f["inner_dx"]))[:, None]
                 + _steps(n_segs, f["seg_dx"], seg_len, f["elem_dx"])[None, :])
            inside = (y >= 0) & (y < f["height"]) & (x >= 0) & (x < f["width"])
            if inside.all():
                inside = None
        taken = addr.reshape(-1) if inside is None else addr[inside]
        if taken.size and (taken.min() < 0 or taken.max() + esz > self.dram.size):
            outside_dram = (addr < 0) | (addr + esz > self.dram.size)
            if inside is not None:
                outside_dram &= inside
            r, el = np.unravel_index(int(np.argmax(outside_dram)), outside_dram.shape)
            raise _fail(op, "dram_addr", f"element {el} of destination row {r} is at byte address "
                                         f"{int(addr[r, el])}, but its {esz} bytes must lie in DRAM "
                                         f"(bytes 0..{self.dram.size - 1})")

        if self.check:
            byte_addr = _byte_addresses(taken, esz)
            self._check_dram(op, _LOAD_Q, byte_addr, write=False)
            track = {_SPAD: self.spad_track, _ACC: self.acc_track,
                     _TABLE: self.table_track}[dst]
            rows = np.arange(row0, row0 + nrows)
            self._check_rows(op, _LOAD_Q, track, rows, write=True)
            self.dram_read.set(byte_addr, self.seq[_LOAD_Q])
            self._mark_rows(_LOAD_Q, track, rows, write=True)

        if dst == _TABLE:
            entries = np.stack([_read_le(self.dram, addr + 4 * j, 4, 32, True) for j in range(3)],
                               axis=-1)
            shifts = entries[..., 2]
            bad = (shifts < 0) | (shifts > MAX_SHIFT)
            if bad.any():
                r, el = np.unravel_index(int(np.argmax(bad)), bad.shape)
                raise _fail(op, "dram_addr", f"the entry for table row {row0 + r} channel "
                                             f"{col0 + el} at byte address {int(addr[r, el])} has "
                                             f"shift {int(shifts[r, el])}, but a shift must be "
                                             f"0..{MAX_SHIFT}")
            self.table[row0:row0 + nrows, col0:col0 + width] = entries
        else:
            values = _read_le(self.dram, taken, esz, bits, signed)
            if inside is not None:
                pad_stored = pad & ((1 << bits) - 1) if dst == _SPAD else pad
                full = np.full((nrows, width), pad_stored, np.int64)
                full[inside] = values
                values = full
            target = self.spad if dst == _SPAD else self.acc
            target[row0:row0 + nrows, col0:col0 + width] = values.reshape(nrows, width)

        bus_bytes = _dma_bus_bytes(taken, esz, self.dma_bytes)
        self.read_bytes += bus_bytes
        if self.serial_reader:
            return serial_load_cycles(f, esz, bus_bytes // self.dma_bytes, self.dram_latency)
        beats, _ = _bus_beats(addr, inside, esz, self.dma_bytes)
        return self.dram_latency + beats

    # -- COMPUTE ----------------------------------------------------------------------------

    def _array_start(self, op: _Op, ready: int) -> int:
        """First cycle, not before ``ready``, at which a COMPUTE may use the array: a WS
        preload's first weight row (the weight shadow registers are free from the previous
        preload's first input row on), else its first input row or operand beat (after the
        previous COMPUTE's; in OS, its ``last`` beat at least R cycles after the previous one)."""
        f = op.f
        if self.c.dataflow == "ws":
            return max(ready, self.shadow_free if f["preload"] else self.stream_end)
        return max(ready, self.stream_end, self.os_last_beat - (max(f["k"], 1) - 1))

    def _compute(self, op: _Op) -> None:
        """Check and execute a COMPUTE (its timing is :meth:`_compute_timing`)."""
        c = self.c
        f = op.f
        R, C = c.rows, c.cols
        m, k, n = f["m"], f["k"], f["n"]
        a_addr, b_addr, acc_addr = f["a_addr"], f["b_addr"], f["acc_addr"]
        preload = f["preload"]
        ws = c.dataflow == "ws"
        if ws:
            if not 1 <= k <= R:
                raise _fail(op, "k", f"weight-stationary k must be 1..rows ({R}), not {k}")
            if not 1 <= n <= C:
                raise _fail(op, "n", f"n must be 1..cols ({C}), not {n}")
            if m < 1:
                raise _fail(op, "m", f"m must be at least 1, not {m}")
            if not preload:
                if self.weights_kn is None:
                    raise _fail(op, "preload", "preload=0 reuses the stationary weights, but no "
                                               "COMPUTE with preload=1 has run yet")
                pk, pn = self.weights_kn
                if k != pk:
                    raise _fail(op, "k", f"preload=0 reuses the stationary weights, so k must equal "
                                         f"the last preload's k={pk}, not {k}")
                if n != pn:
                    raise _fail(op, "n", f"preload=0 reuses the stationary weights, so n must equal "
                                         f"the last preload's n={pn}, not {n}")
            a_rows = m
        else:
            if preload:
                raise _fail(op, "preload", "the output-stationary dataflow has no stationary "
                                           "weights, so preload must be 0, not 1")
            if not 1 <= m <= R:
                raise _fail(op, "m", f"output-stationary m must be 1..rows ({R}), not {m}")
            if not 1 <= n <= C:
                raise _fail(op, "n", f"n must be 1..cols ({C}), not {n}")
            if k < 1:
                raise _fail(op, "k", f"k must be at least 1, not {k}")
            a_rows = k
        reads_b = preload or not ws
        if a_addr + a_rows > self.spad_rows:
            raise _fail(op, "a_addr", f"A rows {a_addr}..{a_addr + a_rows - 1} must lie in the "
                                      f"scratchpad (rows 0..{self.spad_rows - 1})")
        if reads_b and b_addr + k > self.spad_rows:
            raise _fail(op, "b_addr", f"B rows {b_addr}..{b_addr + k - 1} must lie in the "
                                      f"scratchpad (rows 0..{self.spad_rows - 1})")
        if acc_addr + m > self.acc_rows:
            raise _fail(op, "acc_addr", f"accumulator rows {acc_addr}..{acc_addr + m - 1} must lie "
                                        f"in the accumulator (rows 0..{self.acc_rows - 1})")

        if self.check:
            q = _COMPUTE_Q
            a_idx = np.arange(a_addr, a_addr + a_rows)
            acc_idx = np.arange(acc_addr, acc_addr + m)
            self._check_rows(op, q, self.spad_track, a_idx, write=False)
            if reads_b:
                b_idx = np.arange(b_addr, b_addr + k)
                self._check_rows(op, q, self.spad_track, b_idx, write=False)
            if f["accumulate"]:
                self._check_rows(op, q, self.acc_track, acc_idx, write=False)
            self._check_rows(op, q, self.acc_track, acc_idx, write=True)
            self._mark_rows(q, self.spad_track, a_idx, write=False)
            if reads_b:
                self._mark_rows(q, self.spad_track, b_idx, write=False)
            if f["accumulate"]:
                self._mark_rows(q, self.acc_track, acc_idx, write=False)
            self._mark_rows(q, self.acc_track, acc_idx, write=True)

        if ws:
            if preload:
                weights = np.zeros((R, C), np.int64)
                weights[:k, :n] = wrap(self.spad[b_addr:b_addr + k, :n], *self.weight_type)
                self.weights = weights
                self.weights_kn = (k, n)
            a = wrap(self.spad[a_addr:a_addr + m, :k], *self.input_type)
            product = a @ self.weights[:k]
        else:
            a_t = wrap(self.spad[a_addr:a_addr + k, :m], *self.input_type)
            b = wrap(self.spad[b_addr:b_addr + k, :n], *self.weight_type)
            product = np.zeros((m, C), np.int64)
            product[:, :n] = a_t.T @ b
        if f["accumulate"]:
            product = product + self.acc[acc_addr:acc_addr + m]
        self.acc[acc_addr:acc_addr + m] = wrap(product, *self.acc_type)
        self.macs += m * k * n

    def _compute_timing(self, op: _Op, ready: int, start: int) -> tuple[int, int]:
        """Timing of an executed COMPUTE whose tokens and queue allow it at ``ready`` and whose
        array use begins at ``start`` (:meth:`_array_start`): its busy cycles (array input
        occupied, counted from ``ready`` or the end of the previous COMPUTE's input) and the cycle
        its last result row is readable in the accumulator."""
        R = self.c.rows
        f = op.f
        m, k = f["m"], f["k"]
        if self.c.dataflow == "ws":
            preload = f["preload"]
            # the preload's k weight rows enter from start on; the input rows follow them and the
            # previous COMPUTE's input rows
            first_row = max(start + k, self.stream_end) if preload else start
            if preload:
                # the array takes the next preload's weight rows from the cycle after this one's
                # first input row swaps the shadows in (hw/array.py ws_handshake)
                self.shadow_free = first_row + 1
            stream_end = first_row + m
            last_result = stream_end - 1 + self.array_latency
        else:
            stream_end = start + k
            self.os_last_beat = stream_end - 1 + R
            last_result = stream_end - 1 + self.array_latency + R - 1   # R rows drain
        busy = stream_end - max(ready, self.stream_end)
        self.stream_end = stream_end
        return busy, last_result + self.write_latency

    # -- STORE ------------------------------------------------------------------------------

    def _store(self, op: _Op) -> int:
        c = self.c
        f = op.f
        n = f["n"]
        if not 1 <= n <= c.cols:
            raise _fail(op, "n", f"n must be 1..cols ({c.cols}), not {n}")
        for name in ("in_h", "in_w", "out_h", "out_w"):
            if f[name] == 0:
                raise _fail(op, name, f"zero-size transfer: {name} must be at least 1, not 0")
        raw = f["out_type"] == 1
        act, pool, residual = f["act"], f["pool"], f["residual"]
        act_name = Activation(act).name.lower()
        pool_name = PoolMode(pool).name.lower()
        if raw:
            if act:
                raise _fail(op, "act", f"out_type=raw stores accumulator elements unchanged, so "
                                       f"act must be none, not {act_name}")
            if pool:
                raise _fail(op, "pool", f"out_type=raw stores accumulator elements unchanged, so "
                                        f"pool must be none, not {pool_name}")
            if residual:
                raise _fail(op, "residual", "out_type=raw stores accumulator elements unchanged, "
                                            "so residual must be 0, not 1")
        if act and act_name not in c.sfu_activations:
            raise _fail(op, "act", f"this accelerator's SFU has activations "
                                   f"[{', '.join(c.sfu_activations)}] (sfu_activations), not "
                                   f"{act_name}")
        if pool and pool_name not in c.sfu_pooling:
            raise _fail(op, "pool", f"this accelerator's SFU has pooling "
                                    f"[{', '.join(c.sfu_pooling)}] (sfu_pooling), not {pool_name}")
        if residual and not c.sfu_residual:
            raise _fail(op, "residual", "this accelerator's SFU has no residual add "
                                        "(sfu_residual is false), so residual must be 0, not 1")
        if residual and pool:
            raise _fail(op, "residual", f"residual add cannot be combined with pooling, so "
                                        f"residual must be 0 with pool={pool_name}, not 1")
        in_h, in_w, out_h, out_w = f["in_h"], f["in_w"], f["out_h"], f["out_w"]
        window = ("pool_h", "pool_w", "stride_h", "stride_w", "pad_top", "pad_left")
        if not pool:
            for name in window:
                if f[name]:
                    raise _fail(op, name, f"without pooling the window fields must be 0, so "
                                          f"{name} must be 0, not {f[name]}")
            if out_h != in_h:
                raise _fail(op, "out_h", f"without pooling the output is the input image, so "
                                         f"out_h must equal in_h ({in_h}), not {out_h}")
            if out_w != in_w:
                raise _fail(op, "out_w", f"without pooling the output is the input image, so "
                                         f"out_w must equal in_w ({in_w}), not {out_w}")
        else:
            for name in ("pool_h", "pool_w", "stride_h", "stride_w"):
                if f[name] == 0:
                    raise _fail(op, name, f"a pooling window needs {name} of at least 1, not 0")
            if f["pad_top"] >= f["pool_h"]:
                raise _fail(op, "pad_top", f"pad_top must be below pool_h ({f['pool_h']}), "
                                           f"not {f['pad_top']}")
            if f["pad_left"] >= f["pool_w"]:
                raise _fail(op, "pad_left", f"pad_left must be below pool_w ({f['pool_w']}), "
                                            f"not {f['pad_left']}")
            first_y = (out_h - 1) * f["stride_h"] - f["pad_top"]
            if first_y >= in_h:
                raise _fail(op, "out_h", f"the window of output row {out_h - 1} starts at image row "
                                         f"{first_y}, entirely outside the {in_h}-row image, so "
                                         f"out_h must be at most "
                                         f"{(in_h - 1 + f['pad_top']) // f['stride_h'] + 1}, "
                                         f"not {out_h}")
            first_x = (out_w - 1) * f["stride_w"] - f["pad_left"]
            if first_x >= in_w:
                raise _fail(op, "out_w", f"the window of output column {out_w - 1} starts at image "
                                         f"column {first_x}, entirely outside the {in_w}-column "
                                         f"image, so out_w must be at most "
                                         f"{(in_w - 1 + f['pad_left']) // f['stride_w'] + 1}, "
                                         f"not {out_w}")
            if pool == PoolMode.AVG.value:
                lo, hi = c.output_range
                bound = f["pool_h"] * f["pool_w"] * (hi - lo) * abs(self.sfu["avg_mult"])
                if bound >= 1 << 62:
                    raise _fail(op, "pool_h", f"average pooling needs pool_h*pool_w*{hi - lo} (the output "
                                              f"range) * |avg_mult| below 2**62 so that the window sum "
                                              f"times avg_mult fits 64 bits, not {bound}")
        acc_addr = f["acc_addr"]
        pixels = in_h * in_w
        if acc_addr + pixels > c.acc_rows:
            raise _fail(op, "acc_addr", f"the {in_h}x{in_w} image in accumulator rows "
                                        f"{acc_addr}..{acc_addr + pixels - 1} must lie in the "
                                        f"accumulator (rows 0..{c.acc_rows - 1})")
        qrow = f["qrow"]
        if not raw and qrow >= c.requant_table_rows:
            raise _fail(op, "qrow", f"qrow must be a requantize table row "
                                    f"(0..{c.requant_table_rows - 1}), not {qrow}")
        esz = c.acc_bytes if raw else c.input_bytes
        oy = np.arange(out_h, dtype=np.int64)
        ox = np.arange(out_w, dtype=np.int64)
        cc = np.arange(n, dtype=np.int64)
        offsets = (oy[:, None, None] * f["pitch_y"] + ox[None, :, None] * f["pitch_x"]
                   + cc[None, None, :] * f["pitch_c"]).reshape(out_h * out_w, n)
        last = int(offsets[-1, -1])   # pitches are unsigned: the last element is the highest
        for name in ("dram_addr", "res_addr") if residual else ("dram_addr",):
            base = f[name]
            if base + last + esz > self.dram.size:
                raise _fail(op, name, f"output element ({out_h - 1}, {out_w - 1}, {n - 1}) is at "
                                      f"byte address {base + last}, but its {esz} bytes must lie in "
                                      f"DRAM (bytes 0..{self.dram.size - 1})")
        out_addr = f["dram_addr"] + offsets
        res_addr = f["res_addr"] + offsets if residual else None

        # accumulator rows the output needs
        if pool:
            ys = _window_coords(out_h, f["stride_h"], f["pad_top"], f["pool_h"], in_h)
            xs = _window_coords(out_w, f["stride_w"], f["pad_left"], f["pool_w"], in_w)
            acc_idx = (acc_addr + ys[:, None] * in_w + xs[None, :]).reshape(-1)
        else:
            acc_idx = np.arange(acc_addr, acc_addr + pixels)
        if self.check:
            q = _STORE_Q
            out_bytes = _byte_addresses(out_addr, esz)
            self._check_rows(op, q, self.acc_track, acc_idx, write=False)
            if not raw:
                self._check_rows(op, q, self.table_track, np.array([qrow]), write=False)
            self._check_dram(op, q, out_bytes, write=True)
            self._mark_rows(q, self.acc_track, acc_idx, write=False)
            if not raw:
                self._mark_rows(q, self.table_track, np.array([qrow]), write=False)
            self.dram_written.set(out_bytes, self.seq[q])

        image = self.acc[acc_addr:acc_addr + pixels, :n].reshape(in_h, in_w, n)
        if raw:
            out = image
        else:
            s = self.sfu
            entry = self.table[qrow, :n]
            res = None
            if residual:
                res = _read_le(self.dram, res_addr.reshape(-1), c.input_bytes, c.input_bits,
                               c.input_signed).reshape(out_h, out_w, n)
            v = sfu_pointwise(image, entry[:, 0], entry[:, 1], entry[:, 2], zp_out=s["zp_out"],
                              act=act, act_lo=s["act_lo"], act_hi=s["act_hi"],
                              acc_range=c.acc_range, out_range=c.output_range, residual=res,
                              res_zp=s["res_zp"], res_mult=s["res_mult"], tie_out=s["tie_out"])
            if pool == PoolMode.MAX.value:
                out = _max_pool(v, f, out_h, out_w)
            elif pool == PoolMode.AVG.value:
                total = _window_sum(v, f, out_h, out_w, s["zp_out"])
                out = avg_pool_finish(total, f["pool_h"] * f["pool_w"], zp_out=s["zp_out"],
                                      avg_mult=s["avg_mult"], avg_shift=s["avg_shift"], act=act,
                                      act_lo=s["act_lo"], act_hi=s["act_hi"],
                                      out_range=c.output_range, tie_out=s["avg_tie_out"])
            else:
                out = v
        self.dram[_byte_addresses(out_addr, esz)] = _spread_bytes(out.reshape(-1), esz)

        write_bytes = _dma_bus_bytes(out_addr, esz, c.dma_bytes)
        self.write_bytes += write_bytes
        if self.serial_writer:
            beats = serial_store_write_cycles(out_addr.size * esz, write_bytes // c.dma_bytes)
        else:
            beats, _ = _bus_beats(out_addr, None, esz, c.dma_bytes)
        if residual:
            res_bytes = _dma_bus_bytes(res_addr, c.input_bytes, c.dma_bytes)
            self.read_bytes += res_bytes
            if self.serial_reader:      # the residual command the store unit gives the reader
                beats += serial_load_cycles(residual_read_fields(out_h, out_w, n), c.input_bytes,
                                            res_bytes // c.dma_bytes, c.dram_latency)
            else:
                res_beats, _ = _bus_beats(res_addr, None, c.input_bytes, c.dma_bytes)
                beats += res_beats + c.dram_latency
        sfu_cycles = out_h * out_w * (f["pool_h"] * f["pool_w"] if pool else 1) * c.sfu_row_cycles
        if self.serial_sfu:
            # a beat per window pixel; those outside the image (pad) take a cycle per channel
            window_beats = out_h * out_w * (f["pool_h"] * f["pool_w"] if pool else 1)
            inside = window_beats
            if pool:
                inside = (_inside_count(out_h, f["stride_h"], f["pad_top"], f["pool_h"], in_h)
                          * _inside_count(out_w, f["stride_w"], f["pad_left"], f["pool_w"], in_w))
            sfu_cycles = serial_sfu_cycles(
                [int(v) for v in self.table[qrow, :, 2]] if not raw else [], raw=raw,
                residual=bool(residual), pixels=inside, pad_pixels=window_beats - inside,
                avg_windows=out_h * out_w if pool == PoolMode.AVG.value else 0,
                avg_shift=self.sfu["avg_shift"])
        latency = self.sfu_avg_latency if pool == PoolMode.AVG.value else self.sfu_latency
        return max(sfu_cycles, beats) + latency

    # -- CONFIG -----------------------------------------------------------------------------

    def _config(self, op: _Op) -> int:
        f = op.f
        if f["avg_shift"] > MAX_SHIFT:
            raise _fail(op, "avg_shift", f"avg_shift must be 0..{MAX_SHIFT}, not {f['avg_shift']}")
        for name in self.sfu:
            self.sfu[name] = f[name]
        return 1


def _spread_bytes(values: np.ndarray, nbytes: int) -> np.ndarray:
    """Little-endian bytes of each value (two's complement), flattened in value order."""
    raw = np.asarray(values, np.int64)
    shifts = 8 * np.arange(nbytes, dtype=np.int64)
    return ((raw[:, None] >> shifts) & 0xFF).reshape(-1)


def _inside_count(out: int, stride: int, pad: int, size: int, extent: int) -> int:
    """Window positions inside the image along one axis, summed over the ``out`` windows."""
    coords = (np.arange(out, dtype=np.int64)[:, None] * stride - pad
              + np.arange(size, dtype=np.int64)[None, :])
    return int(((coords >= 0) & (coords < extent)).sum())


def _window_coords(out: int, stride: int, pad: int, size: int, extent: int) -> np.ndarray:
    """Image coordinates (sorted, unique) covered by any pooling window along one axis."""
    coords = (np.arange(out, dtype=np.int64)[:, None] * stride - pad
              + np.arange(size, dtype=np.int64)[None, :]).reshape(-1)
    coords = coords[(coords >= 0) & (coords < extent)]
    return np.unique(coords)


def _max_pool(v: np.ndarray, f: dict[str, int], out_h: int, out_w: int) -> np.ndarray:
    in_h, in_w = v.shape[:2]
    oy = np.arange(out_h, dtype=np.int64) * f["stride_h"] - f["pad_top"]
    ox = np.arange(out_w, dtype=np.int64) * f["stride_w"] - f["pad_left"]
    best = np.full((out_h, out_w, v.shape[2]), np.iinfo(np.int64).min, np.int64)
    for i in range(f["pool_h"]):
        yy = oy + i
        y_ok = (yy >= 0) & (yy < in_h)
        if not y_ok.any():
            continue
        yc = np.clip(yy, 0, in_h - 1)
        for j in range(f["pool_w"]):
            xx = ox + j
            x_ok = (xx >= 0) & (xx < in_w)
            if not x_ok.any():
                continue
            xc = np.clip(xx, 0, in_w - 1)
            ok = (y_ok[:, None] & x_ok[None, :])[:, :, None]
            np.maximum(best, np.where(ok, v[yc][:, xc], best), out=best)
    return best


def _window_sum(v: np.ndarray, f: dict[str, int], out_h: int, out_w: int, pad_value: int
                ) -> np.ndarray:
    """Sum of each pooling window (out_h, out_w, channels), out-of-image pixels counting
    ``pad_value``: an integral image, so the cost does not grow with the window."""
    in_h, in_w, n = v.shape
    integral = np.zeros((in_h + 1, in_w + 1, n), np.int64)
    integral[1:, 1:] = v.cumsum(axis=0).cumsum(axis=1)
    y0 = np.arange(out_h, dtype=np.int64) * f["stride_h"] - f["pad_top"]
    x0 = np.arange(out_w, dtype=np.int64) * f["stride_w"] - f["pad_left"]
    ya, yb = np.clip(y0, 0, in_h), np.clip(y0 + f["pool_h"], 0, in_h)
    xa, xb = np.clip(x0, 0, in_w), np.clip(x0 + f["pool_w"], 0, in_w)
    inside = (integral[yb][:, xb] - integral[ya][:, xb] - integral[yb][:, xa]
              + integral[ya][:, xa])
    count = ((yb - ya)[:, None] * (xb - xa)[None, :])[:, :, None]
    return inside + (f["pool_h"] * f["pool_w"] - count) * pad_value


# --------------------------------------------------------------------------------------------
# public entry points


class GoldenModel:
    """The reference interpreter of ISA v2 for one accelerator configuration."""

    def __init__(self, config: AcceleratorConfig) -> None:
        if not isinstance(config, AcceleratorConfig):
            raise TypeError(f"config must be an AcceleratorConfig, not {type(config).__name__}")
        self.config = config

    def run(self, program: Program | Sequence[Instruction] | bytes, dram: np.ndarray, *,
            check_hazards: bool = True) -> RunResult:
        """Execute ``program`` against a copy of ``dram`` (a 1-D uint8 array, byte 0 = address 0).

        ``program`` is a :class:`Program` (its config hash is checked first), a sequence of
        :class:`Instruction` or raw instruction words, or the words as ``bytes``. With
        ``check_hazards``, accesses from different queues not ordered by tokens raise
        :class:`HazardError`."""
        ops = _decode_program(program, self.config)
        if isinstance(dram, bytes | bytearray):
            dram = np.frombuffer(dram, np.uint8)
        if not isinstance(dram, np.ndarray) or dram.dtype != np.uint8 or dram.ndim != 1:
            raise TypeError(f"dram must be a 1-D numpy array of uint8, not "
                            f"{type(dram).__name__}"
                            + (f" of {dram.dtype} with shape {dram.shape}"
                               if isinstance(dram, np.ndarray) else ""))
        return _Run(self.config, ops, dram.copy(), check_hazards).execute()


def run_golden(config: AcceleratorConfig, program: Program | Sequence[Instruction] | bytes,
               dram: np.ndarray, **kw: Any) -> RunResult:
    """``GoldenModel(config).run(program, dram, **kw)``."""
    return GoldenModel(config).run(program, dram, **kw)
