"""The top-level accelerator: one AXI4 manager port to DRAM, one AXI4-Lite subordinate port for
the host's control and status registers, and an interrupt that rises when a program is done.

Ports of the generated Verilog module (``systolic_top``):

* ``clk``, ``rst`` — clock and synchronous active-high reset;
* ``m_axi_*`` — AXI4 manager: ``arvalid arready araddr arlen arsize arburst``,
  ``rvalid rready rdata rresp rlast``, ``awvalid awready awaddr awlen awsize awburst``,
  ``wvalid wready wdata wstrb wlast``, ``bvalid bready bresp``; one ID, INCR bursts only;
* ``s_axil_*`` — AXI4-Lite subordinate: ``awvalid awready awaddr wvalid wready wdata wstrb
  bvalid bready bresp arvalid arready araddr rvalid rready rdata rresp``; registers in
  :mod:`systolic.hw.csr`;
* ``irq`` — high while STATUS.done is set;
* ``compute_clk`` — only with ``config.compute_clock_mhz``: the compute core's clock (the compute
  unit, scratchpad, accumulator and array run on it, behind the crossings of :mod:`systolic.hw.cdc`;
  docs/arch-system.md, "Two clocks"). Its reset is made inside from ``rst`` and the soft reset.

Inside (docs/architecture.md has the block diagram): CSRs, the instruction fetcher and dispatcher,
three queue sequencers joined by four token channels, the load, compute and store units, the
scratchpad, accumulator, requantize table and systolic array, and a read arbiter that shares the
AXI read channels between instruction fetch, LOADs and residual reads.
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth import ClockDomain, ClockSignal, DomainRenamer, Module, ResetSignal, Shape, Signal, Value
from amaranth.hdl import ResetInserter
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .accumulator import Accumulator, store_read_queue
from .array import SystolicArray
from .axi import BURST_INCR
from .cdc import CountCrossing, DrainedGate, EventCrossing, ResetCrossing, StreamCrossing
from .compute_core import ComputeCore, connect_compute_datapath
from .config import AcceleratorConfig
from .controller import Dispatcher, Fetcher, InstructionLayout, Sequencer, TokenChannel
from .csr import COUNTERS, CSR_ADDR_BITS, CSRBank
from .dsp import global_buffer, is_ecp5
from .fifo import wants_block_ram
from .fw_engine import RAM_KINDS, FirmwareController
from .interconnect import HalfRateRegister, ReadArbiter, StreamRegister
from .isa import Queue
from .requant_table import RequantTable
from .scratchpad import Scratchpad
from .units import ComputeCheck, ComputeUnit, LoadUnit, StoreUnit, accumulator_forwards

__all__ = ["Accelerator", "top_ports", "counter_increment_bits", "COMPUTE_COUNTERS", "COMPUTE_COUNT_BITS"]


def top_ports(config: AcceleratorConfig) -> dict[str, tuple[str, int]]:
    """Every port of ``systolic_top`` but the clock and reset: name -> (direction, width).
    ``compute_clk`` (the compute core's clock) only with ``config.compute_clock_mhz``."""
    w = config.dma_data_bits
    ports = {}
    for name, direction, width in (
        ("arvalid", "out", 1), ("arready", "in", 1), ("araddr", "out", 32), ("arlen", "out", 8),
        ("arsize", "out", 3), ("arburst", "out", 2),
        ("rvalid", "in", 1), ("rready", "out", 1), ("rdata", "in", w), ("rresp", "in", 2), ("rlast", "in", 1),
        ("awvalid", "out", 1), ("awready", "in", 1), ("awaddr", "out", 32), ("awlen", "out", 8),
        ("awsize", "out", 3), ("awburst", "out", 2),
        ("wvalid", "out", 1), ("wready", "in", 1), ("wdata", "out", w), ("wstrb", "out", w // 8),
        ("wlast", "out", 1),
        ("bvalid", "in", 1), ("bready", "out", 1), ("bresp", "in", 2),
    ):
        ports[f"m_axi_{name}"] = (direction, width)
    for name, direction, width in (
        ("awvalid", "in", 1), ("awready", "out", 1), ("awaddr", "in", CSR_ADDR_BITS),
        ("wvalid", "in", 1), ("wready", "out", 1), ("wdata", "in", 32), ("wstrb", "in", 4),
        ("bvalid", "out", 1), ("bready", "in", 1), ("bresp", "out", 2),
        ("arvalid", "in", 1), ("arready", "out", 1), ("araddr", "in", CSR_ADDR_BITS),
        ("rvalid", "out", 1), ("rready", "in", 1), ("rdata", "out", 32), ("rresp", "out", 2),
    ):
        ports[f"s_axil_{name}"] = (direction, width)
    ports["irq"] = ("out", 1)
    if config.compute_clock_mhz:
        ports["compute_clk"] = ("in", 1)
    return ports


def counter_increment_bits(config: AcceleratorConfig) -> dict[str, int]:
    """Width of each performance counter's increment per cycle (bits), for the CSR bank: the
    MACs of one input row of the array, the bus bytes of one beat, 1 for the others. With a
    compute clock of its own, the compute core's three counters grow by what it counted since
    its last snapshot (:class:`~systolic.hw.cdc.CountCrossing`, :data:`COMPUTE_COUNT_BITS`)."""
    bits = {"macs": (config.rows * config.cols).bit_length(),
            "dram_read_bytes": config.dma_bytes.bit_length(),
            "dram_write_bytes": config.dma_bytes.bit_length()}
    if config.compute_clock_mhz:
        bits.update({name: COMPUTE_COUNT_BITS for name in COMPUTE_COUNTERS})
    return bits


#: The performance counters the compute core counts (in its own clock's cycles when it has one).
COMPUTE_COUNTERS = ("compute_busy", "array_active", "macs")
#: Width of what the compute core's counters carry across per snapshot, bits: a snapshot every
#: few cycles of either clock, at most a row's MACs a compute cycle.
COMPUTE_COUNT_BITS = 24
#: Entries of the crossings into the compute core: instructions, scratchpad rows (several per
#: LOAD, one every cycle or two), accumulator rows and read requests; and of the accumulator's
#: read responses back.
_CROSSING_DEPTH = {"cmd": 4, "spad_write": 8, "acc_write": 4, "acc_read_req": 4, "acc_read_resp": 8}
#: The accelerator's own clock domains with a compute clock: the compute core's, and the crossings'
#: clk side (clk, with the soft reset in its reset). Named so that a design around the
#: accelerator may have domains called compute or crossing (Amaranth 0.5 rejects a design
#: whose domain has the name of a submodule's local one).
_COMPUTE, _CROSSING = "systolic_compute", "systolic_crossing"
#: Cycles of its own clock the compute core stays in reset after a (soft) reset request.
_COMPUTE_RESET_CYCLES = 4


class Accelerator(wiring.Component):
    """The whole accelerator for one :class:`AcceleratorConfig` (flat AXI port names, see the
    module docstring). ``firmware_ram``: what holds the firmware control's core RAM
    (:data:`~systolic.hw.fw_engine.RAM_KINDS`; only with ``control = "firmware"``)."""

    def __init__(self, config: AcceleratorConfig, *, firmware_ram: str = "init"):
        if not isinstance(config, AcceleratorConfig):
            raise TypeError(f"config must be an AcceleratorConfig, not {config!r}")
        if firmware_ram not in RAM_KINDS:
            raise ValueError(f"firmware_ram must be one of {', '.join(map(repr, RAM_KINDS))}, "
                             f"not {firmware_ram!r}")
        self.config = config
        self.firmware_ram = firmware_ram
        members = {}
        for name, (direction, width) in top_ports(config).items():
            members[name] = (Out if direction == "out" else In)(width)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        cfg = self.config

        m.submodules.csr = csr = CSRBank(cfg.hash, counter_bits=cfg.counter_bits,
                                         firmware=cfg.control == "firmware",
                                         increment_bits=counter_increment_bits(cfg))
        # -- reset distribution: the core takes the CSR's start and soft-reset pulses a cycle
        # later, through registers (the CSR's STATUS reads as after the pulse meanwhile), so that
        # no pulse crosses the die through logic in the cycle it clears what it resets. Start
        # also resets the load and store units: every program starts from the ISA's initial
        # state (start clears the units' errors and the SFU registers; they are idle then, the
        # last program done or none run yet); soft reset resets everything.
        core_reset, start, unit_reset = Signal(), Signal(), Signal()
        m.d.sync += [core_reset.eq(csr.soft_reset), start.eq(csr.start & ~csr.soft_reset),
                     unit_reset.eq(csr.start | csr.soft_reset)]
        core = Module()
        m.submodules.core = ResetInserter(core_reset)(core)

        # -- host port ------------------------------------------------------------------------
        lite = csr.bus
        m.d.comb += [
            lite.aw.valid.eq(self.s_axil_awvalid), self.s_axil_awready.eq(lite.aw.ready),
            lite.aw.payload.addr.eq(self.s_axil_awaddr),
            lite.w.valid.eq(self.s_axil_wvalid), self.s_axil_wready.eq(lite.w.ready),
            lite.w.payload.data.eq(self.s_axil_wdata), lite.w.payload.strb.eq(self.s_axil_wstrb),
            self.s_axil_bvalid.eq(lite.b.valid), lite.b.ready.eq(self.s_axil_bready),
            self.s_axil_bresp.eq(lite.b.payload.resp),
            lite.ar.valid.eq(self.s_axil_arvalid), self.s_axil_arready.eq(lite.ar.ready),
            lite.ar.payload.addr.eq(self.s_axil_araddr),
            self.s_axil_rvalid.eq(lite.r.valid), lite.r.ready.eq(self.s_axil_rready),
            self.s_axil_rdata.eq(lite.r.payload.data), self.s_axil_rresp.eq(lite.r.payload.resp),
        ]

        if cfg.control == "firmware":
            self._elaborate_firmware(m, core, csr, start)
        else:
            self._elaborate_hardware(m, core, csr, start, unit_reset, core_reset, platform)
        return m

    def _elaborate_hardware(self, m: Module, core: Module, csr: CSRBank, start: Signal,
                            unit_reset: Signal, core_reset: Signal, platform) -> None:
        cfg = self.config
        dual = bool(cfg.compute_clock_mhz)
        # -- blocks -----------------------------------------------------------------------------
        core.submodules.fetcher = fetcher = Fetcher(cfg)
        core.submodules.dispatcher = dispatcher = Dispatcher(cfg)
        sequencers = [Sequencer() for _ in Queue]
        for q, seq in zip(Queue, sequencers, strict=True):
            core.submodules[f"seq_{q.name.lower()}"] = seq
        # the load unit keeps up to 4 LOADs in flight (the serial reader takes one at a time: 1)
        load = LoadUnit(cfg, depth=1 if cfg.gather_engine == "serial" else 4)
        if dual:
            # the compute core on its own clock, behind clock-domain crossings; `compute`,
            # `spad` and `acc` stand for its sync-side ports
            compute, spad, acc, start = self._compute_core_crossings(m, load, start, core_reset,
                                                                     platform)
        else:
            compute = self._compute_unit()
        store = StoreUnit(cfg)
        # outside the core's reset: theirs includes the soft reset, so no logic lies between
        # its register and the units' flip-flops
        m.submodules.load = ResetInserter(unit_reset)(load)
        if not dual:
            core.submodules.compute = compute
        m.submodules.store = ResetInserter(unit_reset)(store)
        # a LOAD or STORE reaches its unit through a register (reset with the unit: start drops
        # one a halted program left), so that the unit's readiness for it does not run back
        # through the sequencer's token checks into the dispatcher's queue in the same cycle
        # (config.command_registers; without, the sequencer's offer goes straight to the unit)
        commands = {}
        if cfg.command_registers:
            commands = {Queue.LOAD: HalfRateRegister(InstructionLayout()),
                        Queue.STORE: HalfRateRegister(InstructionLayout())}
        for q, register in commands.items():
            m.submodules[f"cmd_{q.name.lower()}"] = ResetInserter(unit_reset)(register)
        if not dual:
            core.submodules.spad = spad = Scratchpad(cfg)
            core.submodules.acc = acc = Accumulator(cfg, read_queue=store_read_queue(cfg),
                                                    forwarding=accumulator_forwards(cfg))
        core.submodules.table = table = RequantTable(cfg)
        if not dual:
            core.submodules.array = array = SystolicArray(cfg, backpressure=False)
        # fetch and the GatherReader (LOADs and residual reads), with every burst both may have
        # in flight
        core.submodules.reads = reads = ReadArbiter(
            2, data_width=cfg.dma_data_bits, max_in_flight=cfg.dma_outstanding + fetcher.max_bursts)

        # -- control --------------------------------------------------------------------------
        core.d.comb += [
            fetcher.start.eq(start), fetcher.prog_addr.eq(csr.prog_addr), fetcher.prog_len.eq(csr.prog_len),
            fetcher.abort.eq(dispatcher.halt),
            dispatcher.start.eq(start), dispatcher.exhausted.eq(fetcher.exhausted),
            dispatcher.fetch_error.eq(fetcher.error),
        ]
        wiring.connect(core, fetcher=fetcher.beats, dispatcher=dispatcher.beats)
        # COMPUTEs reach the compute unit through their check (reset with the units: start
        # clears its error and the program's stationary weights)
        check = ComputeCheck(cfg)
        m.submodules.compute_check = ResetInserter(unit_reset)(check)
        units = (load, compute, store)
        for q, seq, unit in zip(Queue, sequencers, units, strict=True):
            wiring.connect(core, dispatcher=dispatcher.queues[q.value], sequencer=seq.queue)
            if q in commands:
                wiring.connect(core, sequencer=seq.unit_cmd, register=commands[q].i)
                wiring.connect(core, register=commands[q].o, unit=unit.cmd)
            elif q is Queue.COMPUTE:
                wiring.connect(core, sequencer=seq.unit_cmd, check=check.i)
                wiring.connect(core, check=check.o, unit=unit.cmd)
            else:
                wiring.connect(core, sequencer=seq.unit_cmd, unit=unit.cmd)
            completed = unit.completed | check.completed if q is Queue.COMPUTE else unit.completed
            if dual and q is Queue.LOAD:
                completed = compute.load_completed     # once its rows are in the compute core
            core.d.comb += [seq.unit_completed.eq(completed), seq.halt.eq(dispatcher.halt)]
        core.d.comb += check.unit_completed.eq(compute.completed)

        # token channels: (from, to)
        channels = {}
        for src, dst in ((Queue.LOAD, Queue.COMPUTE), (Queue.COMPUTE, Queue.LOAD),
                         (Queue.COMPUTE, Queue.STORE), (Queue.STORE, Queue.COMPUTE)):
            channel = TokenChannel(cfg.token_depth)
            core.submodules[f"tokens_{src.name.lower()}_{dst.name.lower()}"] = channel
            core.d.comb += channel.clear.eq(start)
            channels[src, dst] = channel
        for q, seq in zip(Queue, sequencers, strict=True):
            prev = Queue(q.value - 1) if q.value > 0 else None
            nxt = Queue(q.value + 1) if q.value < 2 else None
            if prev is not None:
                incoming, outgoing = channels[prev, q], channels[q, prev]
                core.d.comb += [
                    seq.prev_available.eq(incoming.available), incoming.pop.eq(seq.prev_pop),
                    seq.prev_full.eq(outgoing.full), outgoing.push.eq(seq.prev_push),
                ]
            if nxt is not None:
                incoming, outgoing = channels[nxt, q], channels[q, nxt]
                core.d.comb += [
                    seq.next_available.eq(incoming.available), incoming.pop.eq(seq.next_pop),
                    seq.next_full.eq(outgoing.full), outgoing.push.eq(seq.next_push),
                ]

        idle = Signal()
        load_busy = load.busy | compute.load_draining if dual else load.busy
        core.d.comb += idle.eq(sequencers[0].idle & sequencers[1].idle & sequencers[2].idle &
                               ~load_busy & ~compute.busy & ~store.busy)
        core.d.comb += dispatcher.idle.eq(idle)
        # the load unit's error wins when several report one, then the store unit's
        for unit in (check, store, load):
            with core.If(unit.error != 0):
                core.d.comb += [dispatcher.unit_error.eq(unit.error),
                                dispatcher.unit_error_pc.eq(unit.error_pc)]

        running = self._status(core, csr, start, dispatcher.done, dispatcher.error, dispatcher.error_pc,
                               fetcher.beats.payload.pc, settled=compute.settled if dual else None)
        core.d.comb += [load.dram_base.eq(csr.dram_base), store.dram_base.eq(csr.dram_base)]

        # -- datapath ---------------------------------------------------------------------------
        wiring.connect(core, load=load.spad_write, spad=spad.write)
        wiring.connect(core, load=load.acc_write, acc=acc.dma_write)
        wiring.connect(core, load=load.table_write, table=table.write)
        if dual:
            wiring.connect(core, store=store.read_acc.req, acc=acc.read_req)
            wiring.connect(core, acc=acc.read_resp, store=store.read_acc.resp)
        else:
            self._compute_datapath(core, compute, spad, acc, array)
            wiring.connect(core, store=store.read_acc, acc=acc.read)
        if cfg.sfu_engine == "pipelined":
            wiring.connect(core, store=store.table_lookup, table=table.lookup)
        else:
            wiring.connect(core, store=store.read_table, table=table.read)
        if cfg.sfu_residual:
            wiring.connect(core, store=store.residual, load=load.residual)

        # -- DRAM port ----------------------------------------------------------------------------
        wiring.connect(core, fetcher=fetcher.ar, arbiter=reads.managers[0].ar)
        wiring.connect(core, arbiter=reads.managers[0].r, fetcher=fetcher.r)
        wiring.connect(core, load=load.axi, arbiter=reads.managers[1])
        bus, writes = reads.bus, store.axi_w
        # read data enter through a register slice: no combinational path from the DRAM's read
        # engine through the arbiter into the reader's handshakes and back (one cycle per burst)
        core.submodules.r_slice = r_slice = StreamRegister(bus.r.payload.shape())
        wiring.connect(core, slice=r_slice.o, arbiter=bus.r)
        # write data leave through one: no combinational path from the scatter writer's beat
        # queue through the DRAM's write acceptance (the SoC memory's arbiter) and back into it
        core.submodules.w_slice = w_slice = StreamRegister(writes.w.payload.shape())
        wiring.connect(core, writer=writes.w, slice=w_slice.i)
        core.d.comb += [
            self.m_axi_arvalid.eq(bus.ar.valid), bus.ar.ready.eq(self.m_axi_arready),
            self.m_axi_araddr.eq(bus.ar.payload.addr), self.m_axi_arlen.eq(bus.ar.payload.len),
            self.m_axi_arsize.eq(bus.ar.payload.size), self.m_axi_arburst.eq(BURST_INCR),
            r_slice.i.valid.eq(self.m_axi_rvalid), self.m_axi_rready.eq(r_slice.i.ready),
            r_slice.i.payload.data.eq(self.m_axi_rdata), r_slice.i.payload.resp.eq(self.m_axi_rresp),
            r_slice.i.payload.last.eq(self.m_axi_rlast),
            self.m_axi_awvalid.eq(writes.aw.valid), writes.aw.ready.eq(self.m_axi_awready),
            self.m_axi_awaddr.eq(writes.aw.payload.addr), self.m_axi_awlen.eq(writes.aw.payload.len),
            self.m_axi_awsize.eq(writes.aw.payload.size), self.m_axi_awburst.eq(BURST_INCR),
            self.m_axi_wvalid.eq(w_slice.o.valid), w_slice.o.ready.eq(self.m_axi_wready),
            self.m_axi_wdata.eq(w_slice.o.payload.data), self.m_axi_wstrb.eq(w_slice.o.payload.strb),
            self.m_axi_wlast.eq(w_slice.o.payload.last),
            writes.b.valid.eq(self.m_axi_bvalid), self.m_axi_bready.eq(writes.b.ready),
            writes.b.payload.resp.eq(self.m_axi_bresp),
        ]

        # -- performance counters ------------------------------------------------------------------
        BB = cfg.dma_bytes
        dma_reads = reads.managers[1].r.valid & reads.managers[1].r.ready   # LOADs and residuals
        w_fire = w_slice.o.valid & w_slice.o.ready
        increments = {
            "cycles": running & ~dispatcher.done,
            "load_busy": load_busy,
            "compute_busy": compute.busy_count if dual else compute.busy,
            "store_busy": store.busy,
            "array_active": compute.array_active,
            "macs": compute.macs,
            "stall_load_token": sequencers[0].stall_token,
            "stall_compute_token": sequencers[1].stall_token,
            "stall_store_token": sequencers[2].stall_token,
            "stall_dispatch": dispatcher.stall_dispatch,
            "stall_fetch": dispatcher.stall_fetch & running,
            "dram_read_bytes": dma_reads * BB,
            "dram_write_bytes": w_fire * BB,
            "instructions": dispatcher.dispatched,
        }
        self._count(core, csr, increments)

    def _elaborate_firmware(self, m: Module, core: Module, csr: CSRBank, start: Signal) -> None:
        """``control = "firmware"``: the core and its firmware (hw/fw_engine.py) in place of the
        fetcher, dispatcher, sequencers, load and store units; the compute unit, array,
        scratchpad and accumulator as in hardware control."""
        cfg = self.config
        core.submodules.firmware = fw = FirmwareController(cfg, ram=self.firmware_ram)
        compute = self._compute_unit()
        core.submodules.compute = compute
        core.submodules.spad = spad = Scratchpad(cfg)
        # the core reads one accumulator element at a time: one response queue entry
        core.submodules.acc = acc = Accumulator(cfg, read_queue=1, forwarding=accumulator_forwards(cfg))
        core.submodules.array = array = SystolicArray(cfg, backpressure=False)
        core.d.comb += [
            fw.start.eq(start), fw.prog_addr.eq(csr.prog_addr), fw.prog_len.eq(csr.prog_len),
            fw.dram_base.eq(csr.dram_base),
            fw.fw_write.eq(csr.fw_write), fw.fw_write_addr.eq(csr.fw_write_addr),
            fw.fw_write_data.eq(csr.fw_write_data), fw.fw_loaded.eq(csr.fw_loaded),
            csr.fw_ready.eq(fw.fw_ready),
            compute.cmd.valid.eq(fw.compute_cmd.valid), fw.compute_cmd.ready.eq(compute.cmd.ready),
            compute.cmd.payload.eq(fw.compute_cmd.payload), fw.compute_completed.eq(compute.completed),
            spad.write.valid.eq(fw.spad_write.valid), fw.spad_write.ready.eq(spad.write.ready),
            spad.write.payload.eq(fw.spad_write.payload),
            acc.dma_write.valid.eq(fw.acc_write.valid), fw.acc_write.ready.eq(acc.dma_write.ready),
            acc.dma_write.payload.eq(fw.acc_write.payload),
            acc.read.req.valid.eq(fw.acc_read_req.valid), fw.acc_read_req.ready.eq(acc.read.req.ready),
            acc.read.req.payload.addr.eq(fw.acc_read_req.payload),
            fw.acc_read_resp.valid.eq(acc.read.resp.valid), acc.read.resp.ready.eq(fw.acc_read_resp.ready),
            fw.acc_read_resp.payload.eq(acc.read.resp.payload),
        ]
        self._compute_datapath(core, compute, spad, acc, array)

        # -- DRAM port: single beats -----------------------------------------------------------
        core.d.comb += [
            self.m_axi_arvalid.eq(fw.ar_valid), fw.ar_ready.eq(self.m_axi_arready),
            self.m_axi_araddr.eq(fw.ar_addr), self.m_axi_arlen.eq(0), self.m_axi_arsize.eq(2),
            self.m_axi_arburst.eq(BURST_INCR),
            fw.r_valid.eq(self.m_axi_rvalid), self.m_axi_rready.eq(fw.r_ready),
            fw.r_data.eq(self.m_axi_rdata), fw.r_resp.eq(self.m_axi_rresp),
            self.m_axi_awvalid.eq(fw.aw_valid), fw.aw_ready.eq(self.m_axi_awready),
            self.m_axi_awaddr.eq(fw.aw_addr), self.m_axi_awlen.eq(0), self.m_axi_awsize.eq(2),
            self.m_axi_awburst.eq(BURST_INCR),
            self.m_axi_wvalid.eq(fw.w_valid), fw.w_ready.eq(self.m_axi_wready),
            self.m_axi_wdata.eq(fw.w_data), self.m_axi_wstrb.eq(fw.w_strb), self.m_axi_wlast.eq(1),
            fw.b_valid.eq(self.m_axi_bvalid), self.m_axi_bready.eq(fw.b_ready),
            fw.b_resp.eq(self.m_axi_bresp),
        ]

        # -- status and counters ---------------------------------------------------------------
        running = self._status(core, csr, start, fw.done, fw.error, fw.error_pc, fw.pc)
        increments = {
            "cycles": running & ~fw.done,
            "load_busy": fw.flag_load_busy,
            "compute_busy": compute.busy,
            "store_busy": fw.flag_store_busy,
            "array_active": compute.array_active,
            "macs": compute.macs,
            "stall_load_token": fw.flag_stall_load_token,
            "stall_compute_token": fw.flag_stall_compute_token,
            "stall_store_token": fw.flag_stall_store_token,
            "stall_dispatch": fw.flag_stall_dispatch,
            "stall_fetch": fw.flag_stall_fetch,
            "dram_read_bytes": fw.dram_read_beat * cfg.dma_bytes,
            "dram_write_bytes": fw.dram_write_beat * cfg.dma_bytes,
            "instructions": fw.instructions,
        }
        self._count(core, csr, increments)

    def _status(self, core: Module, csr: CSRBank, start: Signal, program_done: Value, error: Value,
                error_pc: Value, pc: Value, *, settled: Value | None = None) -> Signal:
        """STATUS, ERROR_PC, PC and irq from the control's ``program_done`` and error; returns
        ``running`` (from start until the program is done). ``settled``: high once counts
        arriving from another clock domain are all in (with the CSR bank's own ``settled``)."""
        running = Signal()
        with core.If(start):
            core.d.sync += running.eq(1)
        with core.Elif(program_done):
            core.d.sync += running.eq(0)
        # the host sees done once the counters hold every count (a few cycles after the program)
        done = Signal()
        core.d.comb += [
            done.eq(program_done & csr.settled & (1 if settled is None else settled)),
            csr.busy.eq((running | program_done) & ~done),
            csr.done.eq(done),
            csr.error.eq(error),
            csr.error_pc.eq(error_pc),
            csr.pc.eq(pc),
            self.irq.eq(done),
        ]
        return running

    def _compute_core_crossings(self, m: Module, load: LoadUnit, start: Signal, core_reset: Signal,
                                platform) -> tuple[SimpleNamespace, SimpleNamespace, SimpleNamespace,
                                                   Signal]:
        """``config.compute_clock_mhz``: the compute core (:class:`ComputeCore`) in a clock domain
        of its own (``_COMPUTE``; clock: the port ``compute_clk``) and the crossings between it
        and the rest
        (docs/arch-system.md, "Two clocks"). Returns the sync-side stand-ins for the compute
        unit, the scratchpad and the accumulator, and the start pulse the rest must use (held
        while the compute core is being reset)."""
        cfg = self.config
        # -- the domain and its reset: a (soft) reset, and the first cycle after the top's reset,
        # hold the compute core in reset for a few of its cycles; the sync side of every
        # crossing is held in reset until that is over (`resetting`)
        m.domains += ClockDomain(_COMPUTE, local=True)
        m.submodules.compute_reset = reset = ResetCrossing(i_domain="sync", o_domain=_COMPUTE,
                                                           cycles=_COMPUTE_RESET_CYCLES)
        boot = Signal(init=1)
        m.d.sync += boot.eq(0)
        # on ECP5 the reset (a register) reaches the core's ~18k flip-flops of a 16x16 array
        # over a global clock line rather than the general routing (hw/dsp.py)
        core_rst = global_buffer(m, "compute_reset_buffer", reset.reset) if is_ecp5(platform) else reset.reset
        m.d.comb += [reset.request.eq(core_reset | boot),
                     ClockSignal(_COMPUTE).eq(self.compute_clk), ResetSignal(_COMPUTE).eq(core_rst)]
        # boot covers the cycle between the top's reset and busy: no cycle out of reset in which
        # a crossing's sync side could take a count the compute side has not reset yet
        resetting = Signal()
        m.d.comb += resetting.eq(reset.busy | boot)
        # a start while the compute core is being reset waits for it
        start_held = Signal()
        go = Signal()
        m.d.comb += go.eq((start | start_held) & ~resetting)
        m.d.sync += start_held.eq((start | start_held) & resetting)

        m.submodules.compute_core = core = DomainRenamer(_COMPUTE)(
            ComputeCore(cfg, depth=self._compute_unit_depth(), acc_read_queue=store_read_queue(cfg)))
        # the crossings' clk side runs in the domain _CROSSING: clk, its reset the top's reset,
        # the soft reset and `resetting` together, a domain reset of its own so that the
        # asynchronous FIFOs see it (they reset their other side from their write side's reset
        # signal, which a ResetInserter would not reach)
        m.domains += ClockDomain(_CROSSING, local=True)
        m.d.comb += [ClockSignal(_CROSSING).eq(ClockSignal("sync")),
                     ResetSignal(_CROSSING).eq(ResetSignal("sync") | core_reset | resetting)]
        x = Module()
        m.submodules.crossings = x

        def crossing(name: str, shape, *, into_core: bool = True, half_rate: bool = False, pieces: int = 1,
                     read_registers: int = 2, block_ram_allowed: bool = True) -> StreamCrossing:
            w, r = (_CROSSING, _COMPUTE) if into_core else (_COMPUTE, _CROSSING)
            depth = _CROSSING_DEPTH[name]
            block_ram = block_ram_allowed and wants_block_ram(cfg, Shape.cast(shape).width * depth)
            # registers on the compute core's side: its logic meets neither the FIFO's block
            # RAM nor its pointers in a cycle of the fast clock (hw/cdc.py); a half-rate one for
            # a stream out of the core that never has an item in two cycles running. Into the
            # core, whole items leave through two registers in series: the first sits by the
            # FIFO (its block RAM's read data: into the scratchpad-write crossing's register,
            # 10.7 ns on the 16x16 SoC at bd14ae3), the second by the consumer, whose `ready`
            # reaches only that one (the compute unit's accept, its descriptor queues' levels,
            # into the COMPUTE crossing's register 30 columns away: the compute clock's critical
            # path at badc2c0; the accumulator's grant into the read-request crossing's at
            # bd14ae3, docs/boards.md)
            # Into the core each crossing's FIFO has a write reset of its own (own_write_reset),
            # so that its reset synchronizer is its own: merged, the one left reached every
            # crossing's read logic, 9.9 ns of the compute clock's critical path at b76e74e
            # A block RAM FIFO into the core is read at a register (fetch_ahead): its address is
            # not made from the read side's handshake in the cycle (the route to the block RAM,
            # placed between the two clocks' logic, ended the compute clock's critical path at
            # 78f3c41, 11.8 ns)
            # The accumulator read requests pass three: the accumulator's grant (an array beat to
            # the same bank holds a request up) reached the second's spare entry across 40
            # columns, 11.7 to 12.3 ns, on two of the 16x16 SoC's routings (78f3c41 seed 1,
            # 854da92 seed 2; docs/boards.md), for a compute cycle more of a request's latency
            # (the requests keep their rate: a StreamRegister takes an item every cycle)
            read_register = (read_registers if pieces == 1 else True) if into_core else False
            x.submodules[name] = block = StreamCrossing(
                shape, depth=depth, w_domain=w, r_domain=r, block_ram=block_ram, read_register=read_register,
                write_register=False if into_core else "half" if half_rate else True, pieces=pieces,
                fetch_ahead=into_core and block_ram, own_write_reset=into_core)
            return block

        # The COMPUTE instructions cross in flip-flops or distributed RAM, whatever
        # fifo_block_ram_bits says: the compute unit reads few of an instruction's 544 bits
        # (yosys keeps 49 on the 16x16 SoC), so the FIFO is small, while in block RAM (3 DP16KD for 4
        # instructions) its fixed place in a block-RAM row drew the FIFO, its two read registers
        # and the compute unit's accept apart: on the 16x16 ULX3S SoC at cb80062 (93.0 MHz) the
        # routes between them ended three of the compute clock's ten paths above 10 ns (the
        # buffer's head and count after the first register's take, 10.5 and 10.3 ns; the
        # second register's take into the first's spare valid, 10.0 ns; docs/boards.md)
        cmd = crossing("cmd", InstructionLayout(), block_ram_allowed=False)
        # the scratchpad rows pass three read registers: with two, the hop between them (the first
        # by the FIFO's block RAM, the second by the scratchpad's write ports) ended five of the
        # compute clock's slowest endpoints on the 16x16 SoC at 0778eab, 10.0 to 10.7 ns
        # (docs/boards.md); a LOAD's rows reach the scratchpad a compute cycle later for it, at
        # the same rate
        spad_write = crossing("spad_write", core.spad_write.payload.shape(), read_registers=3)
        # accumulator rows, whole or in `acc_crossing_pieces` pieces (narrower FIFOs)
        acc_write = crossing("acc_write", core.acc_write.payload.shape(), pieces=cfg.acc_crossing_pieces)
        acc_read_req = crossing("acc_read_req", core.acc_read.req.payload.shape(), read_registers=3)
        # an accumulator read port that owes one response at a time gives a row at most every
        # read latency (2 or more) cycles
        acc_read_resp = crossing("acc_read_resp", core.acc_read.resp.payload.shape(), into_core=False,
                                 half_rate=store_read_queue(cfg) == 1, pieces=cfg.acc_crossing_pieces)
        wiring.connect(m, cmd=cmd.o, core=core.cmd)
        wiring.connect(m, acc_read_req=acc_read_req.o, core=core.acc_read.req)
        wiring.connect(m, spad_write=spad_write.o, core=core.spad_write)
        wiring.connect(m, acc_write=acc_write.o, core=core.acc_write)
        wiring.connect(m, core=core.acc_read.resp, acc_read_resp=acc_read_resp.i)

        # -- completions out of the core, and the COMPUTEs in flight as the sync side sees them
        x.submodules.completions = completions = EventCrossing(i_domain=_COMPUTE, o_domain=_CROSSING)
        m.d.comb += completions.i.eq(core.completed)
        in_flight = Signal(range(16))
        sent = cmd.i.valid & cmd.i.ready
        x.d[_CROSSING] += in_flight.eq(in_flight + sent - completions.o)

        # -- the core's performance counts; they are all in once two snapshots have arrived
        # after the last completion (a snapshot taken after it: hw/cdc.py CountCrossing)
        x.submodules.counts = counts = CountCrossing(
            {"compute_busy": 1, "array_active": 1, "macs": len(core.macs)},
            total_bits=COMPUTE_COUNT_BITS, i_domain=_COMPUTE, o_domain=_CROSSING)
        m.d.comb += [counts.i_compute_busy.eq(core.busy), counts.i_array_active.eq(core.array_active),
                     counts.i_macs.eq(core.macs)]
        rounds = Signal(2, init=2)
        with x.If(completions.o):
            x.d[_CROSSING] += rounds.eq(0)
        with x.Elif(counts.round & (rounds != 2)):
            x.d[_CROSSING] += rounds.eq(rounds + 1)

        # -- a LOAD completes once the core has taken its last row (the load unit's completion
        # waits until both row crossings have drained as far as they had been sent); 8 waiting:
        # the load sequencer keeps at most 8 LOADs issued and not retired
        x.submodules.load_gate = gate = DomainRenamer(_CROSSING)(DrainedGate(2, depth=8))
        m.d.comb += [gate.i.eq(load.completed),
                     gate.sent_0.eq(spad_write.sent), gate.drained_0.eq(spad_write.drained),
                     gate.sent_1.eq(acc_write.sent), gate.drained_1.eq(acc_write.drained)]

        compute = SimpleNamespace(
            cmd=cmd.i, completed=completions.o, busy=(in_flight != 0) | completions.pending,
            busy_count=counts.o_compute_busy, array_active=counts.o_array_active, macs=counts.o_macs,
            settled=(rounds == 2), load_completed=gate.o, load_draining=gate.pending)
        spad = SimpleNamespace(write=spad_write.i)
        acc = SimpleNamespace(dma_write=acc_write.i, read_req=acc_read_req.i, read_resp=acc_read_resp.o)
        return compute, spad, acc, go

    def _compute_unit_depth(self) -> int:
        return 4 if self.config.compute_queue_depth > 1 else 3

    def _compute_unit(self) -> ComputeUnit:
        """The compute unit, up to 4 COMPUTEs in flight (3 with a compute queue of one
        instruction: smaller descriptor FIFOs; a SyncFIFOBuffered of 2 would have zero-width
        pointers)."""
        return ComputeUnit(self.config, depth=self._compute_unit_depth())

    @staticmethod
    def _count(core: Module, csr: CSRBank, increments: dict[str, Value]) -> None:
        """Each counter's increment this cycle into the CSR bank (which clears them at start)."""
        assert set(increments) == {name for name, _ in COUNTERS}
        for name, increment in increments.items():
            core.d.comb += getattr(csr, f"increment_{name}").eq(increment)

    def _compute_datapath(self, core: Module, compute: ComputeUnit, spad: Scratchpad, acc: Accumulator,
                          array: SystolicArray) -> None:
        """Scratchpad -> compute unit -> array -> compute unit -> accumulator."""
        connect_compute_datapath(core, self.config, compute, spad, acc, array)
