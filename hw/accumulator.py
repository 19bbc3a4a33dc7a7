"""Accumulator memory: the array's results, read-modify-written at one row per cycle.

``config.acc_rows`` rows of ``config.cols`` elements of ``config.acc_bits`` bits (signed when
``config.acc_signed``), wrap-around arithmetic (docs/isa.md). The rows are split into
:data:`ACC_BANKS` banks (bank = row // (acc_rows / ACC_BANKS)) so that the store path can read one
half while the array updates the other: the two halves are the double buffer of output tiles that
``AcceleratorConfig`` guarantees room for. Each bank is one :class:`~systolic.hw.bankram.BankRAM`
with one write port and one read port (simple dual-port block RAM).

Ports (see docs/arch-memory-sfu.md):

* ``array_write`` — stream of (row, C values, accumulate) from the array controller, accepted every
  cycle: the stream is ``always_ready`` (its ``ready`` is ``Const(1)``), so the array never stalls
  for it and runs without back-pressure (``SystolicArray(backpressure=False)``). ``accumulate``
  adds the values to the stored row (wrapping), else they overwrite it. Pipelined read-modify-write: a beat is
  registered as it arrives (stage 0 is a register), and every bank's requests are registered
  beside it (as the scratchpad's are), so a beat accepted in cycle t has its row read by the block
  RAM in t+2, the row in the bank's data register in t+5 (after the BankRAM's registered read
  data: a block RAM's clock-to-out takes most of a cycle on ECP5, and the block RAM may be far
  away), the addition in t+5, the result in a register in t+6 while its write request is
  registered beside the bank, and the block RAM writes it in t+7. The read does not see the
  write of its own cycle (a block RAM read port with no collision logic): the results of the five
  beats ahead are forwarded, so back-to-back beats to one row add up exactly, and a row read in
  the cycle it is written is never used.
* ``dma_write`` — stream of (row, C values, element mask) from the DMA (LOAD dst=acc). Waits
  (``ready`` low) while an array beat for the same bank is in stages 0 to 5 (accepted one to six
  cycles before); ``ready`` is a function of registers only.
* ``read`` — store-path read port (:func:`~systolic.hw.scratchpad.read_port_signature`): the row
  arrives :data:`~systolic.hw.scratchpad.READ_LATENCY` cycles after the request is accepted (one
  more with a compute clock of its own, :func:`acc_response_register`; one row per cycle while
  the consumer takes them). A request waits only in a cycle where an accumulating array beat
  reads the same bank, or while that many responses are owed (``read_queue``).

All writes take effect in accept order. A ``read`` accepted in cycle n sees the DMA writes
accepted up to cycle n - 1 and the array beats accepted up to cycle n - 7 (:data:`WRITE_LATENCY`).
A read of a row that a DMA write accepted in cycle n or an array beat accepted in n - 6 writes
meets that write at the block RAM: simulation returns the old row, an FPGA built by ``systolic
synth`` an undefined one (hw/rtlil.py); the ISA's token rules forbid such unordered pairs.

The cycles above are those with ``memory_registers`` (the default). Without (small, slow FPGAs),
a bank's requests go straight to it and its read data straight to the adder and the read
response: the read latency is :data:`~systolic.hw.scratchpad.DIRECT_READ_LATENCY` (2), the beat
adds in stage 1 and :func:`write_latency` is 4. The structure is the same, with the stages and
the forwarded results counted from the read latency.
"""

from __future__ import annotations

import functools
import math
import operator

from amaranth import Cat, Module, Mux, Signal, signed, unsigned
from amaranth.hdl import Shape
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In
from amaranth.utils import exact_log2

from .bankram import BankRAM
from .config import AcceleratorConfig
from .dsp import fabric_register, select_add
from .scratchpad import (
    READ_LATENCY,
    bank_data_registers,
    drive_read_response,
    read_latency,
    read_port_signature,
    select_bank_row,
)

__all__ = [
    "ACC_BANKS", "WRITE_LATENCY", "write_latency", "array_write_spacing", "store_read_queue",
    "acc_response_register", "acc_read_latency", "Accumulator", "acc_elem_shape",
    "acc_row_layout", "acc_array_write_layout", "acc_dma_write_layout",
]

#: Banks of the accumulator: the two halves of the output-tile double buffer.
ACC_BANKS = 2

#: The read-modify-write's stage that adds: the beat's row is in its bank's data register.
_ADD_STAGE = READ_LATENCY - 1
#: Beats ahead whose results a beat's add takes from registers: those accepted after the last one
#: whose write-back reached the block RAM before the beat's read (t+1; the read port does not see
#: a write of its own cycle); a write-back reaches it _ADD_STAGE + 2 cycles after its beat.
_FORWARD = _ADD_STAGE + 1

#: Cycles from accepting an ``array_write`` beat until a ``read`` request accepted then sees its
#: result: the beat waits a cycle in the input register, its write-back reaches the block RAM
#: _ADD_STAGE + 2 cycles after it leaves that register, a request the cycle after its grant, and a
#: read sees the writes of earlier cycles. (With ``memory_registers``; see :func:`write_latency`.)
WRITE_LATENCY = _ADD_STAGE + 3


def write_latency(config: AcceleratorConfig) -> int:
    """:data:`WRITE_LATENCY` for ``config``: the read latency (:func:`~systolic.hw.scratchpad.
    read_latency`) + 2, whether the requests reach the banks through registers or not (the write
    and the read meet the block RAM equally late): 7 with ``memory_registers``, 4 without."""
    return read_latency(config) + 2


def array_write_spacing(config: AcceleratorConfig) -> int:
    """Cycles an accumulating ``array_write`` beat must come after every earlier beat to its row
    when the accumulator does not forward (``Accumulator(forwarding=False)``): the read latency
    (:func:`~systolic.hw.scratchpad.read_latency`) + 1, 6 with ``memory_registers`` (a beat's
    write-back reaches the block RAM read latency + 1 cycles after it is accepted, and a read does
    not see a write of its own cycle), 3 without."""
    return read_latency(config) + 1


def acc_response_register(config: AcceleratorConfig) -> bool:
    """Whether a row read for the accumulator's ``read`` port passes one more register after
    its bank's row is chosen (the port's read latency a cycle longer): with the memory registers
    in a config with a compute clock of its own (``compute_clock_mhz``), where the port's
    responses cross to the control clock. That register lets the response queue sit by the
    crossing: on the 16x16 ULX3S SoC at badc2c0 the route from the banks' data registers through
    the choice of the bank into the queue took 11 ns, 50 of the compute clock's slowest endpoints
    (docs/boards.md). The store path reads a row every ``sfu_row_cycles`` control cycles or more
    (:func:`store_read_queue`), so the extra cycle costs it no rows."""
    return bool(config.compute_clock_mhz) and config.memory_registers


def acc_read_latency(config: AcceleratorConfig) -> int:
    """Cycles from an accepted request on the accumulator's ``read`` port to its response: the
    scratchpad's :func:`~systolic.hw.scratchpad.read_latency`, a cycle more with
    :func:`acc_response_register`."""
    return read_latency(config) + acc_response_register(config)


def store_read_queue(config: AcceleratorConfig) -> int:
    """The ``read_queue`` of the accumulator that the hardware control's store path reads: the
    fewest responses the ``read`` port may owe at once and still keep up with it. Every row the
    store unit reads is one beat of the SFU, which takes one every ``sfu_row_cycles`` or more cycles
    of the control clock (``clock_mhz``), so every ``sfu_row_cycles * compute_clock_mhz /
    clock_mhz`` cycles of the accumulator's with a compute clock of its own. A port that may owe q
    responses reads q rows per read latency (:func:`acc_read_latency`), so q
    is that latency over the SFU's interval, rounded up, between 1 and the latency (the default, a
    row per cycle, with ``sfu_row_cycles = 1`` on one clock). The lean 16x16 ULX3S config (16
    cycles a row, compute at twice the control clock): 1, four 512-bit rows of registers fewer."""
    interval = config.sfu_row_cycles
    if config.compute_clock_mhz:
        interval *= config.compute_clock_mhz / config.clock_mhz
    latency = acc_read_latency(config)
    return max(1, min(latency, math.ceil(latency / interval)))


def acc_elem_shape(config: AcceleratorConfig) -> Shape:
    """One accumulator element: ``acc_bits`` wide, signed when ``acc_signed``."""
    return signed(config.acc_bits) if config.acc_signed else unsigned(config.acc_bits)


def acc_row_layout(config: AcceleratorConfig) -> data.ArrayLayout:
    """One accumulator row: ``cols`` elements."""
    return data.ArrayLayout(acc_elem_shape(config), config.acc_row_elems)


def acc_array_write_layout(config: AcceleratorConfig) -> data.StructLayout:
    """Payload of the array's write stream."""
    return data.StructLayout({
        "addr": unsigned(config.acc_addr_bits),
        "data": acc_row_layout(config),
        "accumulate": unsigned(1),      # 1: add to the row; 0: overwrite it
    })


def acc_dma_write_layout(config: AcceleratorConfig) -> data.StructLayout:
    """Payload of the DMA's write stream."""
    return data.StructLayout({
        "addr": unsigned(config.acc_addr_bits),
        "data": acc_row_layout(config),
        "mask": unsigned(config.acc_row_elems),   # bit c enables element c
    })


def _acc_bank_rows(config: AcceleratorConfig) -> int:
    # TODO(lead): an `acc_bank_rows` property in AcceleratorConfig would be the one source.
    return config.acc_rows // ACC_BANKS


class Accumulator(wiring.Component):
    """The accumulator memory with the array's read-modify-write path, a DMA write port and a
    store-path read port.

    Parameters
    ----------
    config : AcceleratorConfig
        Uses ``acc_rows``, ``cols``, ``acc_bits``, ``acc_signed`` and ``acc_addr_bits``.
    read_queue : int, optional
        Responses the ``read`` port may owe at once (its response queue's registers): by default
        its read latency (:attr:`read_latency`), for one row per cycle; 1 for a consumer that
        reads one row at a time (the firmware control's core), which saves a row of registers
        per entry.
    forwarding : bool
        Whether the read-modify-write forwards the results of the beats ahead (the default), so
        that beats to one row may come in any cycles. Without, an accumulating beat must come
        :func:`array_write_spacing` cycles or more after every earlier beat to its row (the
        weight-stationary compute unit spaces its rows so, hw/units.py): no forwarded rows, no
        address comparisons, and the add takes the stored row straight from the bank.
    """

    def __init__(self, config: AcceleratorConfig, *, read_queue: int | None = None,
                 forwarding: bool = True) -> None:
        if not isinstance(config, AcceleratorConfig):
            raise TypeError(f"config must be an AcceleratorConfig, not {config!r}")
        self._config = config
        latency = self.read_latency
        if read_queue is not None and (isinstance(read_queue, bool) or not isinstance(read_queue, int)
                                       or not 1 <= read_queue <= latency):
            raise ValueError(f"read_queue must be an integer between 1 and the read latency ({latency}), "
                             f"not {read_queue!r}")
        if not isinstance(forwarding, bool):
            raise TypeError(f"forwarding must be a bool, not {forwarding!r}")
        self.read_queue = latency if read_queue is None else read_queue
        self.forwarding = forwarding
        addr = data.StructLayout({"addr": unsigned(config.acc_addr_bits)})
        super().__init__({
            "array_write": In(stream.Signature(acc_array_write_layout(config), always_ready=True)),
            "dma_write": In(stream.Signature(acc_dma_write_layout(config))),
            "read": In(read_port_signature(addr, acc_row_layout(config))),
        })

    @property
    def config(self) -> AcceleratorConfig:
        return self._config

    @property
    def read_latency(self) -> int:
        """Cycles from an accepted ``read`` request to its response (:func:`acc_read_latency`)."""
        return acc_read_latency(self._config)

    @property
    def write_latency(self) -> int:
        """:func:`write_latency`, in cycles."""
        return write_latency(self._config)

    def elaborate(self, platform: object) -> Module:
        cfg = self._config
        m = Module()
        row_layout = acc_row_layout(cfg)
        cols = cfg.acc_row_elems

        index_bits = exact_log2(_acc_bank_rows(cfg))   # row within a bank; the bank is above
        registered = cfg.memory_registers
        latency = read_latency(cfg)
        add_stage = latency - 1           # _ADD_STAGE, _FORWARD for this config
        forward = add_stage + 1
        to_bank = m.d.sync if registered else m.d.comb    # requests beside the banks, or straight
        banks = []
        for k in range(ACC_BANKS):
            # A read in the cycle its row is written is never used (forwarding, the DMA's wait,
            # the token rules): undefined on an FPGA (hw/bankram.py); simulation reads the old row
            # (with the requests registered, the addresses' registers are the bank's own: a copy
            # by each block RAM of the row, hw/bankram.py)
            bank = BankRAM(row_layout, _acc_bank_rows(cfg), registered=registered,
                           address_registers=registered)
            m.submodules[f"bank{k}"] = bank
            banks.append(bank)
        bank_data = bank_data_registers(m, banks, registered)

        # -- input register: an array beat accepted in cycle t - 1 is in stage 0 in cycle t. So every
        # stage that the DMA's wait and the store read's check look at is a register (the beat's
        # row address is a sum in the compute unit), and a DMA write granted with a beat's arrival
        # reaches the block RAM before that beat's read does, as accept order wants.
        beat_valid = Signal()
        beat = Signal(self.array_write.payload.shape(), reset_less=True)
        m.d.sync += [beat_valid.eq(self.array_write.valid), beat.eq(self.array_write.payload)]

        # -- stage 0 (cycle t): an accumulating array beat reads its row; the store read uses idle
        # banks. Every bank's requests (reads here, writes below) are registered beside the bank:
        # its block RAM reads in cycle t+1, the data is out in t+2, in the BankRAM's registered
        # read data in t+3 and in the bank's data register in t+4 (bank_data_registers).
        beat_bank = beat.addr[index_bits:]
        beat_reads = beat_valid & beat.accumulate
        req = self.read.req.payload
        req_bank = req.addr[index_bits:]
        grant_read = Signal()
        resp_row = Signal(row_layout)
        queued_row = resp_row
        if acc_response_register(cfg):
            queued_row = Signal(row_layout, name="resp_row_chosen")
            m.d.sync += queued_row.eq(resp_row)
        free = drive_read_response(m, self.read.resp, grant_read, queued_row, self.read_latency,
                                   self.read_queue, platform=platform)
        m.d.comb += grant_read.eq(self.read.req.valid & free & ~(beat_reads & (beat_bank == req_bank)))
        m.d.comb += self.read.req.ready.eq(grant_read)
        for k, bank in enumerate(banks):
            beat_here = beat_reads & (beat_bank == k)
            to_bank += bank.read_en.eq(beat_here | (grant_read & (req_bank == k)))
            m.d.comb += bank.read_addr.eq(Mux(beat_here, beat.addr[:index_bits], req.addr[:index_bits]))
        select_bank_row(m, bank_data, req_bank, resp_row, latency, platform=platform)

        # -- stages 1 to ADD_STAGE: the beat's (valid, addr, data, accumulate), one register set per
        # stage; the beat adds in stage ADD_STAGE (t+4), when its row is in the bank's register ---
        stages = [(beat_valid, beat.addr, beat.data, beat.accumulate)]
        for n in range(1, add_stage + 1):
            stage = (Signal(name=f"s{n}_valid"), Signal.like(beat.addr, name=f"s{n}_addr"),
                     Signal(row_layout, name=f"s{n}_data"), Signal(name=f"s{n}_accumulate"))
            m.d.sync += [register.eq(value) for register, value in zip(stage, stages[-1], strict=True)]
            stages.append(stage)
        _, decide_addr, _, decide_accumulate = stages[add_stage - 1]
        add_valid, add_addr, add_data, _ = stages[add_stage]

        # the results of the beats ahead, newest first: results[j] holds, in a cycle, the result of
        # the beat that added j + 1 cycles before. results[0] is written back: its write request is
        # registered beside the bank in that cycle and the block RAM writes it in the next (t+6).
        # Without forwarding only results[0], the write-back register, is kept.
        kept = forward - 1 if self.forwarding else 1
        results = [(Signal(name=f"r{j}_valid"), Signal.like(beat.addr, name=f"r{j}_addr"),
                    Signal(row_layout, name=f"r{j}_row")) for j in range(kept)]
        result = Signal(row_layout)
        if self.forwarding:
            # -- stage ADD_STAGE - 1 (t+3): where the add takes the stored row from. The row was read in
            # t+1 and saw the writes of the cycles before: those of the beats accepted up to t-6. The
            # _FORWARD beats ahead write later (or in t+1), so their results are forwarded, the newest
            # match wins: the beat now adding (in results[0] next cycle), else the newest matching one
            # of the older results, chosen here into `older`. The accumulate flag is folded into the
            # selects (0 + data overwrites). --------------------------------------------------------
            older = Signal(row_layout)
            # The address comparisons are made a cycle earlier still (t+2), between the beat then a
            # stage before `decide` and what will be ahead of it in t+3 (every stage and result moves
            # on by one each cycle), into registers: `match` (newest first) and `pick`, the one-hot
            # choice among the older results (the newest match wins). So in t+3 only registers
            # select, on the 32 x cols bits of `older` and of the add's operand.
            stage_fields = [(self.array_write.valid, self.array_write.payload.addr,
                             self.array_write.payload.accumulate),
                            *((valid, addr, accumulate) for valid, addr, _, accumulate in stages)]
            _, early_addr, _ = stage_fields[add_stage - 1]      # decide's beat, a cycle before
            early_ahead = [stage_fields[add_stage][:2], stage_fields[add_stage + 1][:2],
                           *((valid, addr) for valid, addr, _ in results[:-1])]
            match = Signal(len(early_ahead))
            pick = Signal(len(results))
            early_match = [valid & (addr == early_addr) for valid, addr in early_ahead]
            m.d.sync += [
                match.eq(Cat(*early_match)),
                pick.eq(Cat(*(early_match[j + 1] & ~Cat(*early_match[1:j + 1]).any()
                              for j in range(len(results))))),
            ]
            # The selects of the add: `newest` (the result of the beat now adding), `use_older`
            # (`older`), `use_bank[k]` (the row in bank k's data register). One copy of each per
            # column, so that a select's loads (that column's 32 adder bits) sit near it rather than
            # 32 x cols bits spread over the core (on ECP5 registers yosys does not merge, hw/dsp.py).
            selects = {
                "newest": decide_accumulate & match[0],
                "use_older": decide_accumulate & ~match[0] & match[1:].any(),
                **{f"use_bank{k}": decide_accumulate & ~match.any() & (decide_addr[index_bits:] == k)
                   for k in range(ACC_BANKS)},
            }
            copies = [{name: fabric_register(m, f"{name}_{c}", value, init=0, platform=platform)
                       for name, value in selects.items()} for c in range(cols)]
            m.d.sync += older.eq(functools.reduce(operator.or_, (Mux(pick[j], results[j][2].as_value(), 0)
                                                                 for j in range(len(results)))))

            # -- stage ADD_STAGE (t+4): add; the old row is the newest result or an AND-OR of the other
            # one-hot selects (all 0: overwrite). On ECP5 the newest result's select is made inside
            # the adder's carry chain (hw/dsp.py ``select_add``): this stage was the critical path of
            # the 16x16 compute core (docs/arch-memory-sfu.md) ---------------------------------------
            for c in range(cols):
                select = copies[c]
                sources = [(select["use_older"], older[c]),
                           *((select[f"use_bank{k}"], bank_data[k][c]) for k in range(ACC_BANKS))]
                other = Signal(acc_elem_shape(cfg), name=f"other{c}")
                m.d.comb += other.eq(functools.reduce(operator.or_, (Mux(sel, v, 0) for sel, v in sources)))
                m.d.comb += result[c].eq(select_add(m, f"add{c}", select["newest"], results[0][2][c],
                                                    other, add_data[c], width=cfg.acc_bits,
                                                    platform=platform))  # wraps
        else:
            # every accumulating beat comes array_write_spacing cycles after the last beat to its
            # row, whose write-back the block RAM had before this beat's read: the old row is the
            # bank's, selected by a register per column (as with forwarding), or 0 (overwrite)
            selects = {f"use_bank{k}": decide_accumulate & (decide_addr[index_bits:] == k)
                       for k in range(ACC_BANKS)}
            for c in range(cols):
                select = {name: fabric_register(m, f"{name}_{c}", value, init=0, platform=platform)
                          for name, value in selects.items()}
                other = Signal(acc_elem_shape(cfg), name=f"other{c}")
                m.d.comb += other.eq(functools.reduce(operator.or_, (
                    Mux(select[f"use_bank{k}"], bank_data[k][c], 0) for k in range(ACC_BANKS))))
                m.d.comb += result[c].eq(other + add_data[c])       # wraps
        # the result into results[0] (t+5), then one register further each cycle
        previous = (add_valid, add_addr, result)
        for registers in results:
            m.d.sync += [register.eq(value) for register, value in zip(registers, previous, strict=True)]
            previous = registers
        back_valid, back_addr, back_row = results[0]
        back_bank = back_addr[index_bits:]

        # A DMA write waits while an array beat for its bank is in stages 0 to 5, so it never needs
        # forwarding, never meets a write-back, and never reaches the block RAM in the cycle a
        # beat's read does. (A beat arriving in the DMA write's cycle reads the block RAM two
        # cycles after the DMA write reaches it: it sees the DMA's row, as accept order wants.)
        # Which banks have such a beat is a register per bank, computed a cycle ahead from what
        # the stages will hold (stage 0: the arriving beat; stage n + 1: stage n; the write-back:
        # the add stage), so `ready` is that register selected by the write's bank: no address
        # comparison lies between the stages and the load unit.
        dma = self.dma_write.payload
        dma_bank = dma.addr[index_bits:]
        arriving = [(self.array_write.valid, self.array_write.payload.addr),
                    *((valid, addr) for valid, addr, _, _ in stages)]
        busy = Signal(ACC_BANKS)          # bank k has a beat in stages 0 to ADD_STAGE or written back
        for k in range(ACC_BANKS):
            m.d.sync += busy[k].eq(Cat(*(valid & (addr[index_bits:] == k) for valid, addr in arriving)).any())
        grant_dma = Signal()
        m.d.comb += [
            grant_dma.eq(self.dma_write.valid & ~busy.bit_select(dma_bank, 1)),
            self.dma_write.ready.eq(grant_dma),
        ]
        # A bank's write request: the write-back if it is for this bank (it never waits), else the
        # DMA's write if granted. Its enable bits are the only part that the DMA's grant reaches:
        # the address and the row are taken in every cycle (a bank ignores them without an enable),
        # selected by registers of the write-back's bank (one per row element, so that each
        # drives only its element's bits), made a cycle ahead from the add stage. So no logic of
        # the grant (the busy banks, the DMA's request) reaches the load enables of the write
        # data's registers beside the bank (on the 16x16 ULX3S SoC it did, across the die).
        for k, bank in enumerate(banks):
            back_here = back_valid & (back_bank == k)
            here_next = add_valid & (add_addr[index_bits:] == k)     # back_here a cycle ahead
            takes_back = [fabric_register(m, f"bank{k}_write_back_{c}", here_next, init=0, platform=platform)
                          for c in range(cols)]
            enable = Signal.like(bank.write_en, name=f"bank{k}_write_en")
            m.d.comb += bank.write_en.eq(enable)
            to_bank += [
                enable.eq(Mux(back_here, (1 << cols) - 1, Mux(grant_dma & (dma_bank == k), dma.mask, 0))),
                *(bank.write_data[c].eq(Mux(takes_back[c], back_row[c], dma.data[c])) for c in range(cols)),
            ]
            m.d.comb += bank.write_addr.eq(Mux(back_here, back_addr[:index_bits], dma.addr[:index_bits]))
        return m
