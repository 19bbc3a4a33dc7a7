"""The three execution units behind the queues: load, compute and store.

Each unit takes instructions on ``cmd`` (from its :class:`~systolic.hw.controller.Sequencer`, tokens
already popped) and raises ``completed`` for one cycle per instruction, in order, once the
instruction's writes are visible to the other units. Every unit's ``completed`` is a register, so
no unit's handshakes reach the sequencers' retire logic in the cycle they happen.

* :class:`LoadUnit` — LOAD: a :class:`~systolic.hw.dma.GatherReader` plus converters from its byte
  rows to scratchpad, accumulator and requantize-table rows; the same reader serves the store
  unit's residual reads (the accelerator has one read engine).
* :class:`ComputeUnit` — COMPUTE: feeds the systolic array from the scratchpad (weights and inputs in
  WS, A-transposed and B rows in OS) and writes its results into the accumulator. Instructions are
  pipelined: the next COMPUTE's weights are read and preloaded while the current one streams.
* :class:`ComputeCheck` — before the compute unit (hardware control): an illegal COMPUTE (sizes,
  rows past a memory, reuse of weights never preloaded) stops the program with error 1 instead of
  reaching the unit.
* :class:`StoreUnit` — CONFIG and STORE: walks the output pixels and pooling windows, reads the
  accumulator rows and the requantize-table row, runs them through the SFU (with residual rows read
  by the load unit's GatherReader) and writes the pixels with a :class:`~systolic.hw.dma.ScatterWriter`.

What the hardware does not check (the golden model does, and the compiler never emits such code):
addresses past a memory wrap around, a table shift above 62 is taken modulo 64, illegal STORE field
combinations give unspecified output.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .accumulator import (
    acc_array_write_layout,
    acc_dma_write_layout,
    acc_row_layout,
    array_write_spacing,
    write_latency,
)
from .array import input_layout, os_handshake, output_layout, weight_layout, ws_handshake
from .axi import AddressLayout, ReadDataLayout, ResponseLayout, WriteDataLayout
from .config import AcceleratorConfig
from .controller import ERR_ILLEGAL, InstructionLayout, used_bits
from .dma import (
    GatherReader,
    LoadCommandLayout,
    ScatterWriter,
    residual_read_fields,
)
from .dma_serial import SerialGatherReader, SerialScatterWriter
from .fifo import buffered_fifo
from .interconnect import HalfRateRegister, SpacedStreamRegister, StreamRegister, recent_keys
from .isa import LAYOUTS, Memory, Opcode, OutType, PoolMode
from .requant_table import lookup_signature, requant_row_layout, requant_write_layout, table_group_shape
from .scratchpad import read_latency, read_port_signature, spad_row_layout, spad_write_layout
from .sfu import SFU_REGS, SpecialFunctionUnit
from .sfu_serial import SerialSpecialFunctionUnit

__all__ = ["LoadUnit", "ComputeUnit", "ComputeCheck", "StoreUnit", "residual_read_signature",
           "CROSSING_READ_SLACK"]

_ADDR = 32
#: Registers (no load enable) between the compute unit's copy of the array's handshake and the
#: array, with ``memory_registers``: each beat the copy takes reaches the array this many cycles
#: later (ComputeUnit).
LAUNCH_STAGES = 2
#: StreamRegisters (skid buffers) in a row between the compute unit's readers and a scratchpad
#: read port's request, with ``memory_registers`` (ComputeUnit: the reader's side and the
#: arbitration's side of the grant each have their own).
REQUEST_STAGES = 2


def _axi_read_port(config: AcceleratorConfig) -> wiring.Signature:
    return wiring.Signature({
        "ar": Out(stream.Signature(AddressLayout(_ADDR))),
        "r": In(stream.Signature(ReadDataLayout(config.dma_data_bits))),
    })


def _axi_write_port(config: AcceleratorConfig) -> wiring.Signature:
    return wiring.Signature({
        "aw": Out(stream.Signature(AddressLayout(_ADDR))),
        "w": Out(stream.Signature(WriteDataLayout(config.dma_data_bits))),
        "b": In(stream.Signature(ResponseLayout())),
    })


def _row_macs_bits(config: AcceleratorConfig) -> int:
    """Width of the MAC count of one input row of the array: at most rows * cols."""
    return (config.rows * config.cols).bit_length()


def accumulator_forwards(config: AcceleratorConfig) -> bool:
    """Whether the accelerator's accumulator forwards the results of the beats ahead
    (``Accumulator(forwarding=...)``): for the output-stationary dataflow. The weight-stationary
    compute unit spaces its rows instead: no accumulating row enters the array within
    :func:`~systolic.hw.accumulator.array_write_spacing` cycles of a row to the same accumulator
    row, which leaves the accumulator without its forwarded rows and their comparisons."""
    return config.dataflow != "ws"


def _small_product(a, b, width: int | None = None):
    """``a * b`` (unsigned) for short operands as shifted additions, summed as a balanced tree:
    logic, never a DSP block. With ``width``, modulo ``2**width`` (each term cut to it)."""
    terms = [Mux(a[i], b << i, 0) for i in range(len(a))]
    if width is not None:
        terms = [term[:width] for term in terms]
    while len(terms) > 1:
        pairs = [terms[i] + terms[i + 1] for i in range(0, len(terms) - 1, 2)]
        terms = pairs + terms[len(pairs) * 2:]
        if width is not None:
            terms = [term[:width] for term in terms]
    return terms[0] if terms else Const(0, 1)


def residual_row_layout(config: AcceleratorConfig) -> data.StructLayout:
    """A residual row as the store unit takes it: the bytes of one output pixel's ``cols``
    elements (``input_bytes`` each; the read's row, cut to them) and the first AXI error response
    of the beats it was read from. The reader's rows are as wide as the widest destination row
    (a requantize-table row: ``cols`` x 12 bytes); a residual row needs only these."""
    return data.StructLayout({"data": data.ArrayLayout(8, config.cols * config.input_bytes),
                              "resp": unsigned(2)})


def residual_read_signature(config: AcceleratorConfig) -> wiring.Signature:
    """The store unit's residual reads, which run on the load unit's GatherReader, seen from the
    store unit: one ``cmd`` (a ``LoadCommandLayout`` read pattern) goes out per STORE, its rows
    (:func:`residual_row_layout`) come back in order, one per output pixel."""
    return wiring.Signature({
        "cmd": Out(stream.Signature(LoadCommandLayout())),
        "rows": In(stream.Signature(residual_row_layout(config))),
    })


def _view(op: Opcode, word) -> data.View:
    return data.View(LAYOUTS[op], word)


def _bytes_le(row: data.View, first: int, count: int):
    """``count`` bytes of a byte-array view starting at ``first``, as one little-endian value."""
    return Cat(*(row[first + i] for i in range(count)))


# -- load -------------------------------------------------------------------------------------

class LoadUnit(wiring.Component):
    """Executes LOAD instructions, several in flight (``depth``; the serial reader,
    ``gather_engine = "serial"``, takes one at a time): the next LOAD is accepted (and its address
    pattern set up) while the rows of earlier ones are still being read, and each completes, in
    order, in the cycle after its last row is written (``completed`` is a register).

    With ``config.sfu_residual`` its GatherReader also serves the store unit's residual reads
    (``residual``, :func:`residual_read_signature`): one accelerator needs one read engine. A
    residual command is taken before a waiting LOAD (a STORE is waiting for it) and its rows go
    back on ``residual.rows`` in command order with the LOADs' rows; it neither counts as a LOAD
    (``busy``, ``completed``) nor sets ``error`` (the store unit reads the rows' ``resp``). No
    deadlock: LOAD rows always drain into their memories, whatever the store unit does.
    """

    def __init__(self, config: AcceleratorConfig, *, depth: int = 4):
        self.config = config
        self.depth = depth
        members = {
            "cmd": In(stream.Signature(InstructionLayout())),
            "completed": Out(1),
            "busy": Out(1),
            "dram_base": In(32),
            "axi": Out(_axi_read_port(config)),
            "spad_write": Out(stream.Signature(spad_write_layout(config))),
            "acc_write": Out(stream.Signature(acc_dma_write_layout(config))),
            "table_write": Out(stream.Signature(requant_write_layout(config))),
            "error": Out(2),
            "error_pc": Out(32),
        }
        if config.sfu_residual:
            members["residual"] = In(residual_read_signature(config))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        serial = cfg.gather_engine == "serial"
        m.submodules.reader = reader = SerialGatherReader(cfg) if serial else GatherReader(cfg)
        wiring.connect(m, reader=reader.ar, axi=wiring.flipped(self.axi.ar))
        wiring.connect(m, axi=wiring.flipped(self.axi.r), reader=reader.r)

        # A table LOAD writes entries of one aligned group of G = table_load_entries in each row
        # (docs/isa.md): the reader places them in a row of G entries (its dst_col is the first
        # entry's place in the group), and the group's index travels with the command, so that
        # the reader's rows are G entries wide, not cols, and so are the table's writes (the
        # group's index beside them).
        group = cfg.table_load_entries
        group_bits = (group - 1).bit_length()
        groups = cfg.cols // group
        # per command in flight, in order: where its rows go, the table group, the LOAD's program
        # counter
        info_layout = data.StructLayout({"dst": Memory, "widen": 1, "residual": 1, "pc": 32,
                                         **({"group": table_group_shape(cfg)} if groups > 1 else {})})
        m.submodules.inflight = inflight = buffered_fifo(cfg, width=info_layout.size, depth=self.depth)

        load = _view(Opcode.LOAD, self.cmd.payload.word)
        command = Signal(LoadCommandLayout())
        for name, _ in LoadCommandLayout():
            if name in ("elem_bytes", "dram_addr", "dst_col"):
                continue
            m.d.comb += getattr(command, name).eq(getattr(load, name))
        m.d.comb += command.dram_addr.eq(load.dram_addr + self.dram_base)
        if groups == 1:
            m.d.comb += command.dst_col.eq(load.dst_col)
        else:
            m.d.comb += command.dst_col.eq(Mux(load.dst == Memory.TABLE, load.dst_col[:group_bits],
                                               load.dst_col))
        with m.Switch(load.dst):
            with m.Case(Memory.SPAD):
                m.d.comb += command.elem_bytes.eq(cfg.spad_elem_bytes)
            with m.Case(Memory.ACC):
                m.d.comb += command.elem_bytes.eq(Mux(load.widen, cfg.input_bytes, cfg.acc_bytes))
            with m.Case(Memory.TABLE):
                m.d.comb += command.elem_bytes.eq(cfg.requant_entry_bytes)
        incoming = Signal(info_layout)
        m.d.comb += [incoming.dst.eq(load.dst), incoming.widen.eq(load.widen),
                     incoming.pc.eq(self.cmd.payload.pc)]
        if groups > 1:
            m.d.comb += incoming.group.eq(load.dst_col[group_bits:])

        # the reader's command: a residual read first; once offered, a command stays offered
        # (unchanged) until it is taken. It reaches the pipelined reader through a register: the
        # store unit's residual command (its state machine, an address sum) and the LOAD's (an
        # address sum) do not run into the reader's set-up handshake and the enables of its
        # coordinate registers in one cycle, and the reader's readiness reaches neither unit.
        # The serial reader (for small, slow FPGAs) takes it directly: it sets a command up
        # while it is offered, so it keeps only what its walk needs
        if serial:
            to_reader = reader.cmd
        else:
            m.submodules.command = command_register = HalfRateRegister(LoadCommandLayout())
            wiring.connect(m, register=command_register.o, reader=reader.cmd)
            to_reader = command_register.i
        residual = self.residual if cfg.sfu_residual else None
        residual_info = Signal(info_layout)
        m.d.comb += residual_info.residual.eq(1)
        pick_residual = Signal()
        if residual is not None:
            offering = Signal()           # a command was offered and not taken last cycle
            offered_residual = Signal()
            m.d.comb += pick_residual.eq(Mux(offering, offered_residual, residual.cmd.valid))
            m.d.sync += [offering.eq(to_reader.valid & ~to_reader.ready),
                         offered_residual.eq(pick_residual)]
            with m.If(pick_residual):
                m.d.comb += [
                    to_reader.payload.eq(residual.cmd.payload),
                    to_reader.valid.eq(inflight.w_rdy),
                    residual.cmd.ready.eq(to_reader.ready & inflight.w_rdy),
                    inflight.w_data.eq(residual_info),
                ]
        with m.If(~pick_residual):
            m.d.comb += [
                to_reader.payload.eq(command),
                to_reader.valid.eq(self.cmd.valid & inflight.w_rdy),
                self.cmd.ready.eq(to_reader.ready & inflight.w_rdy),
                inflight.w_data.eq(incoming),
            ]
        m.d.comb += inflight.w_en.eq(to_reader.valid & to_reader.ready)

        # byte rows -> destination rows of the oldest command in flight. The pipelined reader's
        # rows pass a StreamRegister first, together with their command's entry (which leaves the
        # in-flight FIFO as the last row goes in): a memory's ready (the accumulator's waits on the
        # array's beats) reaches neither the gather reader and the SoC memory behind it nor the
        # in-flight FIFO in the same cycle, only the register's output and `completed`. (The
        # serial reader's rows come from registers and its ready goes into its state alone.) A row
        # counts as written when its memory accepts it.
        info = Signal(info_layout)
        if serial:
            produced = reader.rows
            m.d.comb += [info.eq(inflight.r_data),
                         inflight.r_en.eq(produced.valid & produced.ready & produced.payload.last)]
        else:
            tagged = data.StructLayout({"rows": reader.rows.payload.shape(), "info": info_layout})
            m.submodules.rows = rows_register = StreamRegister(tagged)
            m.d.comb += [
                rows_register.i.payload.rows.eq(reader.rows.payload),
                rows_register.i.payload.info.eq(inflight.r_data),
                # a row is tagged with the FIFO's head, so it waits until the head is there (it
                # is, long before the command's first row: it is written when the reader takes it)
                rows_register.i.valid.eq(reader.rows.valid & inflight.r_rdy),
                reader.rows.ready.eq(rows_register.i.ready & inflight.r_rdy),
                inflight.r_en.eq(reader.rows.valid & rows_register.i.ready & inflight.r_rdy &
                                 reader.rows.payload.last),
                info.eq(rows_register.o.payload.info),
            ]
            produced = stream.Signature(reader.rows.payload.shape()).create(path=("produced",))
            m.d.comb += [produced.payload.eq(rows_register.o.payload.rows),
                         produced.valid.eq(rows_register.o.valid),
                         rows_register.o.ready.eq(produced.ready)]
        rows = produced.payload
        spad = self.spad_write.payload
        eb = cfg.spad_elem_bytes
        for e in range(cfg.spad_row_elems):
            m.d.comb += [spad.data[e].eq(_bytes_le(rows.data, e * eb, eb)),
                         spad.mask[e].eq(rows.mask[e * eb])]
        m.d.comb += spad.addr.eq(rows.row)

        acc = self.acc_write.payload
        ab, ib = cfg.acc_bytes, cfg.input_bytes
        for c in range(cfg.cols):
            narrow = _bytes_le(rows.data, c * ib, ib)
            narrow = narrow.as_signed() if cfg.input_signed else narrow
            m.d.comb += [
                acc.data[c].eq(Mux(info.widen, narrow, _bytes_le(rows.data, c * ab, ab))),
                acc.mask[c].eq(Mux(info.widen, rows.mask[c * ib], rows.mask[c * ab])),
            ]
        m.d.comb += acc.addr.eq(rows.row)

        table = self.table_write.payload
        tb = cfg.requant_entry_bytes
        for j in range(group):
            place = j * tb                    # entry j's first byte in its group's row
            m.d.comb += [
                table.data[j].bias.eq(_bytes_le(rows.data, place, 4)),
                table.data[j].mult.eq(_bytes_le(rows.data, place + 4, 4)),
                table.data[j].shift.eq(_bytes_le(rows.data, place + 8, 1)),
                table.mask[j].eq(rows.mask[place]),
            ]
        m.d.comb += table.addr.eq(rows.row)
        if groups > 1:
            m.d.comb += table.group.eq(info.group)
        if residual is not None:
            res = residual.rows.payload
            m.d.comb += [res.data.eq(rows.data.as_value()[:len(res.data.as_value())]), res.resp.eq(rows.resp)]

        # a row leaving the serial reader has its command at the in-flight FIFO's head; a
        # registered row carries its command's entry
        with m.If(inflight.r_rdy if serial else 1):
            if residual is not None:
                with m.If(info.residual):
                    m.d.comb += [residual.rows.valid.eq(produced.valid),
                                 produced.ready.eq(residual.rows.ready)]
            with m.If(~info.residual):
                with m.Switch(info.dst):
                    for kind, port in ((Memory.SPAD, self.spad_write), (Memory.ACC, self.acc_write),
                                       (Memory.TABLE, self.table_write)):
                        with m.Case(kind):
                            m.d.comb += [port.valid.eq(produced.valid),
                                         produced.ready.eq(port.ready)]
        written = produced.valid & produced.ready
        is_load = ~info.residual
        # a read accepted from the next cycle on sees the row (the memories keep the order of
        # accepted writes and reads): the LOAD is complete with its last row. `completed` is a
        # register, a cycle later, so that a memory's readiness (the accumulator's depends on its
        # pipeline) does not run through the sequencer's retire logic in the same cycle
        m.d.sync += self.completed.eq(written & rows.last & is_load)
        with m.If(written & is_load & (rows.resp != 0) & (self.error == 0)):
            m.d.sync += [self.error.eq(rows.resp), self.error_pc.eq(info.pc)]

        # LOADs in flight (residual reads excluded)
        loads = Signal(range(self.depth + 1))
        m.d.sync += loads.eq(loads + (self.cmd.valid & self.cmd.ready) - self.completed)
        m.d.comb += self.busy.eq(loads != 0)
        return m


#: Accumulator reads a STORE may have in flight beyond the accumulator's own read latency when the
#: compute core runs on a clock of its own (``config.compute_clock_mhz``): the request and the
#: response each cross an asynchronous FIFO, a few cycles of each clock.
CROSSING_READ_SLACK = 8


# -- compute ----------------------------------------------------------------------------------

class ComputeUnit(wiring.Component):
    """Executes COMPUTE instructions, several in flight (see the module docstring)."""

    def __init__(self, config: AcceleratorConfig, *, depth: int = 4):
        self.config = config
        self.depth = depth
        spad_addr = data.StructLayout({"addr": unsigned(config.spad_addr_bits)})
        members = {
            "cmd": In(stream.Signature(InstructionLayout())),
            "completed": Out(1),
            "busy": Out(1),
            "macs": Out(_row_macs_bits(config)),   # MACs of the input row that entered the array
            "array_active": Out(1),      # an input row entered the array (both a cycle late)
            "read_a": Out(read_port_signature(spad_addr, spad_row_layout(config))),
            "read_b": Out(read_port_signature(spad_addr, spad_row_layout(config))),
            "inputs": Out(stream.Signature(input_layout(config))),
            # the accumulator takes a row in every cycle, so the unit takes every result row as it
            # comes and the array runs without back-pressure (SystolicArray(backpressure=False))
            "outputs": In(stream.Signature(output_layout(config), always_ready=True)),
            "acc_write": Out(stream.Signature(acc_array_write_layout(config), always_ready=True)),
        }
        if config.dataflow == "ws":
            members["weights"] = Out(stream.Signature(weight_layout(config)))
        super().__init__(members)
        # the readiness of the array's streams as the unit's copy of its handshake makes it, and
        # whether it took a beat offered (elaborate), for the RTL tests to compare with the
        # array's handshake (WS only: weights)
        self.array_inputs_ready = Signal()
        self.array_weights_ready = Signal()
        self.array_inputs_taken = Signal()
        self.array_weights_taken = Signal()
        # a descriptor queue written while it had no room (a COMPUTE accepted without room for
        # its descriptors; never, elaborate), for the tests
        self.descriptor_overflow = Signal()

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        R, C = cfg.rows, cfg.cols
        ws = cfg.dataflow == "ws"
        op = _view(Opcode.COMPUTE, self.cmd.payload.word)

        # descriptors hold what each consumer reads, as wide as the ISA allows: k <= R (WS) or
        # m <= R (OS), n <= C; the other size counts rows that lie in the scratchpad (and, WS m,
        # in the accumulator): a COMPUTE past them is an error before it gets here. mac_rows,
        # mac_cols: an input row's MACs are their product (WS k*n, OS m*n), made only where the
        # MACs are counted, as a row enters the array (made on accept, the product's three adder
        # levels lay between the COMPUTE crossing's register and the descriptor queues' write
        # data: on the 16x16 ULX3S SoC at 0778eab five of the compute clock's 13 paths above
        # 10 ns, up to 11.2 ns, docs/boards.md). WS: the input rows' (feed) and the weights'
        # (preload) descriptors; OS: one feed descriptor for both operands.
        addr_bits = cfg.spad_addr_bits
        small_r, small_c = R.bit_length(), C.bit_length()
        rows_bits = min(cfg.spad_rows, cfg.acc_rows).bit_length() if ws else cfg.spad_rows.bit_length()
        # WS counts rows up to m_last = m - 1 and k_last = k - 1, made as the COMPUTE is accepted, so
        # that a row counter's last row is an equality of two registers (with row + 1 == m, the
        # adder's carry chain and the comparison were the 16x16 compute core's critical path on
        # the ULX3S-85F, into the descriptor queue's read)
        if ws:
            # m_single, k_single: one row (m_last, k_last zero), the reader's first row's `last`
            feed_layout = data.StructLayout({"a_addr": addr_bits, "m_last": rows_bits, "m_single": 1,
                                             "preload": 1, "mac_rows": small_r, "mac_cols": small_c,
                                             "acc_addr": cfg.acc_addr_bits, "accumulate": 1})
            preload_layout = data.StructLayout({"b_addr": addr_bits, "k_last": small_r, "k_single": 1,
                                                "n": small_c})
            write_layout = data.StructLayout({"acc_addr": cfg.acc_addr_bits, "m_last": rows_bits,
                                              "m_single": 1, "accumulate": 1})
        else:
            feed_layout = data.StructLayout({"a_addr": addr_bits, "b_addr": addr_bits, "k": rows_bits,
                                             "n": small_c, "mac_rows": small_r})     # (MACs: mac_rows * n)
            write_layout = data.StructLayout({"acc_addr": cfg.acc_addr_bits, "m": small_r, "accumulate": 1})
        m.submodules.feeds = feeds = buffered_fifo(cfg, width=feed_layout.size, depth=self.depth)
        m.submodules.writes = writes = buffered_fifo(cfg, width=write_layout.size, depth=self.depth)
        if ws:
            m.submodules.preloads = preloads = buffered_fifo(cfg, width=preload_layout.size, depth=self.depth)

        # -- accept: one descriptor per consumer ----------------------------------------------
        feed = Signal(feed_layout)
        write = Signal(write_layout)
        m.d.comb += [
            feed.a_addr.eq(op.a_addr),
            feed.mac_rows.eq(op.k[:small_r] if ws else op.m[:small_r]),
            write.acc_addr.eq(op.acc_addr), write.accumulate.eq(op.accumulate),
        ]
        if ws:
            preload = Signal(preload_layout)
            m_last = op.m[:rows_bits] - 1       # m >= 1, k >= 1 (ComputeCheck, the firmware)
            # (m_single compares m itself: m_last == 0 after the subtraction's carry chain ended the
            # write descriptor queue's write data at 10.4 ns on the 16x16 ULX3S SoC at b9a0bbe)
            m_single = op.m[:rows_bits] == 1
            m.d.comb += [feed.m_last.eq(m_last), feed.m_single.eq(m_single), feed.preload.eq(op.preload),
                         write.m_last.eq(m_last), write.m_single.eq(m_single),
                         feed.acc_addr.eq(op.acc_addr),
                         feed.accumulate.eq(op.accumulate), feed.mac_cols.eq(op.n[:small_c]),
                         preload.b_addr.eq(op.b_addr),
                         preload.k_last.eq(op.k[:small_r] - 1), preload.k_single.eq(op.k[:small_r] == 1),
                         preload.n.eq(op.n)]
        else:
            m.d.comb += [feed.b_addr.eq(op.b_addr), feed.k.eq(op.k), feed.n.eq(op.n), write.m.eq(op.m)]
        accept = Signal()
        queues = [(feeds, accept), (writes, accept)] + ([(preloads, accept & op.preload)] if ws else [])
        if cfg.memory_registers:
            # `room`, a register: every queue will have a free entry in the next cycle, counted
            # here from the writes and from registers of the reads (a cycle late, by the reader:
            # a count at least the queue's level), so a COMPUTE is accepted when its descriptors
            # certainly fit, and the accept is the AND of two registers: no queue level lies
            # between the COMPUTE crossing's register and the three queues' write logic, spread
            # over the core (on the 16x16 ULX3S SoC at 78f3c41 that path into the preload queue's
            # level took 12.2 ns, docs/boards.md). A read frees its entry for the accept a cycle
            # later than the queue's own `w_rdy` would. Each count is a thermometer code (bit k:
            # more than k entries), its next values shifts of it: no adder or comparison after
            # the accept, which only picks among values made from registers (on the 16x16 ULX3S
            # SoC at 941a5dc the accept through a count's adder and comparison into `room` took
            # 13.2 ns, docs/boards.md).
            room = Signal(init=1)
            fits = []
            depth = self.depth
            for n, (queue, queue_write) in enumerate(queues):
                queue_read = Signal(name=f"queue{n}_read")
                count = Signal(depth, name=f"queue{n}_count")
                more, fewer = Cat(1, count[:-1]), Cat(count[1:], 0)
                if_written = Mux(queue_read, count, more)
                if_not = Mux(queue_read, fewer, count)
                m.d.sync += [queue_read.eq(queue.r_en & queue.r_rdy),
                             count.eq(Mux(queue_write, if_written, if_not))]
                # room next cycle: fewer than `depth` entries then
                fits.append(Mux(queue_write, ~if_written[depth - 1], ~if_not[depth - 1]))
            m.d.sync += room.eq(Cat(*fits).all())
        else:
            room = Cat(*(queue.w_rdy for queue, _ in queues)).all()
        m.d.comb += self.descriptor_overflow.eq(Cat(*(queue_write & ~queue.w_rdy
                                                      for queue, queue_write in queues)).any())
        m.d.comb += [
            self.cmd.ready.eq(room),
            accept.eq(self.cmd.valid & room),
            feeds.w_data.eq(feed), feeds.w_en.eq(accept),
            writes.w_data.eq(write), writes.w_en.eq(accept),
        ]
        if ws:
            m.d.comb += [preloads.w_data.eq(preload), preloads.w_en.eq(accept & op.preload)]

        # With the memory registers, a read request reaches the scratchpad through two
        # StreamRegisters in a row (REQUEST_STAGES): the first takes the reader's request (the row
        # counter and its address sum are a cycle apart from the bank arbitration), the second
        # offers it to the scratchpad's arbitration, whose grant is that register's `ready`. The
        # grant's round trip (a request register's valid and bank -> the arbitration -> that
        # register's own state) is then between the second register and the arbitration alone,
        # which the placer can keep together, while the reader and the first register see only
        # registers of the other side (on the 16x16 ULX3S SoC at 0aae96b, with one register,
        # its valid -> the arbitration -> its spare's valid took 12.1 ns, docs/boards.md). Each
        # holds two requests at most, so the metadata queues have two more entries per register.
        registered = cfg.memory_registers
        meta_depth = read_latency(cfg) + 1 + (2 * REQUEST_STAGES if registered else 0)

        def request(name, port):
            """The stream the reader drives for ``port.req``: the request itself, or (with the
            memory registers) the input of REQUEST_STAGES StreamRegisters in a row before it."""
            local = stream.Signature(port.req.payload.shape()).create(path=(f"{name}_req",))
            source = local
            for k in range(REQUEST_STAGES if registered else 0):
                stage = StreamRegister(port.req.payload.shape())
                m.submodules[f"{name}_req_register" + (f"{k}" if k else "")] = stage
                wiring.connect(m, source, stage.i)
                source = stage.o
            m.d.comb += [port.req.valid.eq(source.valid), port.req.payload.eq(source.payload),
                         source.ready.eq(port.req.ready)]
            return local

        # The array's readiness, made here from a copy of its handshake registers (hw/array.py
        # ws_handshake, os_handshake): the consumer is a SystolicArray without back-pressure, whose
        # `ready` is that rule of its own registers and of the beats offered. The array's own
        # `ready` is left unread: no route to the array and back. The copy decides on the beats
        # `offered`: the rows at the heads of the scratchpad's response rings (hw/scratchpad.py
        # drive_read_response) with their metadata. Without the memory registers those are the
        # array's ports, and the RTL tests check that the copy equals the array's `ready` in
        # every cycle. With them, every beat the copy takes passes LAUNCH_STAGES registers with
        # no enable on its way to the array (the launch registers), so the array sees exactly the
        # beats the copy took, that many cycles later, and its handshake, the same rule of the
        # same beats, is then ready for each (the tests check that too). A take moves only the
        # ring's head and the metadata queue: no register that holds a row is loaded under the
        # copy's readiness (the compute unit's output registers to the array were: at 438ee4a
        # every path of the 16x16 SoC's compute clock above 10 ns ended at their 128 load
        # enables, made from the copy, docs/boards.md).
        offered = {"inputs": (Signal(name="array_inputs_offered"),
                              Signal(input_layout(cfg), name="array_inputs_offered_beat"))}
        if ws:
            offered["weights"] = (Signal(name="array_weights_offered"),
                                  Signal(weight_layout(cfg), name="array_weights_offered_beat"))
            inputs_valid, inputs_beat = offered["inputs"]
            weights_valid, weights_beat = offered["weights"]
            copy = ws_handshake(m, R, enable=Const(1), inputs_valid=inputs_valid,
                                new_weights=inputs_beat.new_weights, weights_valid=weights_valid,
                                weights_last=weights_beat.last, name="array_")
            m.d.comb += self.array_weights_ready.eq(copy.weights_ready)
        else:
            inputs_valid, inputs_beat = offered["inputs"]
            copy = os_handshake(m, R, enable=Const(1), inputs_valid=inputs_valid, last=inputs_beat.last,
                                name="array_")
        m.d.comb += self.array_inputs_ready.eq(copy.inputs_ready)
        array_ready = {"inputs": self.array_inputs_ready, "weights": self.array_weights_ready}

        def launch(name, port, valid):
            """Offer the array's ``port`` the beat in ``offered[name]`` while ``valid``; returns
            whether the copy takes it. The port shows the offer itself, or (with the memory
            registers) the beats taken, LAUNCH_STAGES cycles later, from registers that take
            their input in every cycle (the first can sit by the response rings, the last along
            the array's edge)."""
            offered_valid, offered_beat = offered[name]
            taken = self.array_inputs_taken if name == "inputs" else self.array_weights_taken
            m.d.comb += [offered_valid.eq(valid), taken.eq(offered_valid & array_ready[name])]
            if not registered:
                m.d.comb += [port.valid.eq(offered_valid), port.payload.eq(offered_beat)]
                return taken
            shown, beat = taken, offered_beat
            for stage in range(LAUNCH_STAGES):
                later = Signal(name=f"{name}_launch{stage}_valid")
                later_beat = Signal.like(offered_beat, name=f"{name}_launch{stage}", reset_less=True)
                m.d.sync += [later.eq(shown), later_beat.eq(beat)]
                shown, beat = later, later_beat
            m.d.comb += [port.valid.eq(shown), port.payload.eq(beat)]
            return taken
        def reader(name, port, fifo_, layout, last_of, single_of, addr_of, meta_layout, meta_of):
            """Issue one scratchpad read per row of the head descriptor; queue per-row metadata
            for the response side."""
            head = Signal(layout, name=f"{name}_head")
            m.d.comb += head.eq(fifo_.r_data)
            # the rows read lie in the scratchpad (the ISA), so the counter is no wider; its last
            # row is the descriptor's (count - 1, made on accept). Whether a row is the last is
            # made of registers: the descriptor's `single` bit for its first row (`fresh`), else a
            # register `last_after` set as the row before it is read (the next row's index, a
            # register too, equal to the last row's), so no comparison lies between the row
            # counter and the descriptor queue's read (on the 16x16 ULX3S SoC at 941a5dc the
            # comparison into the queue's level and read data enables took 11.3 ns,
            # docs/boards.md)
            row = Signal(range(max(2, cfg.spad_rows)), name=f"{name}_row")
            next_row = Signal(len(row), init=1, name=f"{name}_next_row")      # row + 1
            fresh = Signal(init=1, name=f"{name}_fresh")                      # row == 0
            last_after = Signal(name=f"{name}_last_after")                    # row == last, row > 0
            last = Signal(name=f"{name}_last")
            m.d.comb += last.eq(Mux(fresh, single_of(head), last_after))
            # buffered (its output is a register, not a distributed RAM's read: the array's
            # input handshake starts at a register): an entry is readable two cycles after it is
            # written, no later than the memory's response (read_latency >= 2); as many entries
            # as the read_latency + 1 responses a decoupled scratchpad port owes at most (and the
            # two in the request register), so a full queue never holds up a request
            meta = buffered_fifo(cfg, width=meta_layout.size, depth=meta_depth)
            m.submodules[f"{name}_meta"] = meta
            req = request(name, port)
            m.d.comb += [
                req.valid.eq(fifo_.r_rdy & meta.w_rdy),
                req.payload.addr.eq(addr_of(head) + row),
                meta.w_data.eq(meta_of(head, row, last)),
                meta.w_en.eq(req.valid & req.ready),
            ]
            with m.If(req.valid & req.ready):
                with m.If(last):
                    m.d.sync += [row.eq(0), next_row.eq(1), fresh.eq(1)]
                    m.d.comb += fifo_.r_en.eq(1)
                with m.Else():
                    m.d.sync += [row.eq(next_row), next_row.eq(next_row + 1), fresh.eq(0),
                                 last_after.eq(next_row == last_of(head))]
            return meta

        def column_mask(n):
            """Bit j set for the columns j < ``n`` of a row of C elements."""
            return Cat(*(n > j for j in range(C)))

        def element(row_view, index, shape):
            raw = row_view[index]
            value = raw[:shape.width]
            return value.as_signed() if shape.signed else value

        input_shape = input_layout(cfg)["data" if ws else "a"].shape.elem_shape
        weight_shape = (weight_layout(cfg)["data"] if ws else input_layout(cfg)["b"]).shape.elem_shape

        if ws:
            # weights: k rows of B, columns >= n zeroed (the column mask is made with the request,
            # not on the response path: timing), last on row k-1
            wmeta_layout = data.StructLayout({"columns": C, "last": 1})
            wmeta = reader("weights", self.read_b, preloads, preload_layout, lambda h: h.k_last,
                           lambda h: h.k_single, lambda h: h.b_addr, wmeta_layout,
                           lambda h, r, last: Cat(column_mask(h.n), last))
            wm = Signal(wmeta_layout)
            m.d.comb += wm.eq(wmeta.r_data)
            resp = self.read_b.resp.payload
            for j in range(C):
                m.d.comb += weights_beat.data[j].eq(Mux(wm.columns[j], element(resp, j, weight_shape), 0))
            m.d.comb += weights_beat.last.eq(wm.last)
            weights_taken = launch("weights", self.weights, self.read_b.resp.valid & wmeta.r_rdy)
            m.d.comb += [self.read_b.resp.ready.eq(weights_taken), wmeta.r_en.eq(weights_taken)]
            # inputs: m rows of A, new_weights on the first row of a preloading COMPUTE; each
            # with the accumulator row its result goes to (acc_addr + row: a legal COMPUTE's rows
            # lie in the accumulator) and whether it accumulates
            imeta_layout = data.StructLayout({"new_weights": 1, "last": 1, "mac_rows": small_r,
                                              "mac_cols": small_c, "acc_row": cfg.acc_addr_bits,
                                              "accumulate": 1})
            imeta = reader("inputs", self.read_a, feeds, feed_layout, lambda h: h.m_last,
                           lambda h: h.m_single, lambda h: h.a_addr, imeta_layout,
                           lambda h, r, last: Cat(h.preload & (r == 0), last, h.mac_rows, h.mac_cols,
                                                  (h.acc_addr + r)[:cfg.acc_addr_bits], h.accumulate))
            # The accumulator does not forward (accumulator_forwards): a row that accumulates
            # waits at the array's input while one of the rows that entered the array in the
            # last array_write_spacing - 1 cycles goes to its accumulator row. Its result then
            # reaches the accumulator that many cycles after theirs: the array returns its rows
            # with the spacing they entered with (the accumulator is always ready, so the array
            # never stalls). Rows of one COMPUTE go to different accumulator rows, so only the
            # first rows of a COMPUTE can wait, behind a COMPUTE of fewer rows into the same ones.
            # The wait is made on the rows' metadata: with the memory registers it passes a
            # SpacedStreamRegister (the wait a register of its own, decided a cycle ahead),
            # without them the same wait is compared in the cycle (small arrays).
            spacing = None if accumulator_forwards(cfg) else array_write_spacing(cfg)
            im = Signal(imeta_layout)
            im_valid = Signal()
            took = Signal()     # the row at the head of the ring was taken (the copy's in_fire)
            if spacing is not None and registered:
                spaced = SpacedStreamRegister(imeta_layout, key="acc_row", flag="accumulate", spacing=spacing)
                m.submodules.inputs_meta_register = spaced
                m.d.comb += [
                    spaced.i.valid.eq(imeta.r_rdy), spaced.i.payload.eq(imeta.r_data),
                    imeta.r_en.eq(spaced.i.valid & spaced.i.ready),
                    im.eq(spaced.o.payload), im_valid.eq(spaced.o.valid),
                    spaced.o.ready.eq(self.read_a.resp.valid & array_ready["inputs"]),
                ]
            else:
                m.d.comb += [im.eq(imeta.r_data), imeta.r_en.eq(took)]
                hold = Const(0)
                if spacing is not None:
                    entered = recent_keys(m, copy.in_fire, im.acc_row, spacing - 1, "inputs_entered")
                    same = [valid & (row == im.acc_row) for valid, row in entered]
                    hold = im.accumulate & (Cat(*same).any() if same else Const(0))
                m.d.comb += im_valid.eq(imeta.r_rdy & ~hold)
            resp = self.read_a.resp.payload
            for i in range(R):
                m.d.comb += inputs_beat.data[i].eq(element(resp, i, input_shape))
            m.d.comb += [inputs_beat.new_weights.eq(im.new_weights), inputs_beat.last.eq(im.last)]
            m.d.comb += [took.eq(launch("inputs", self.inputs, self.read_a.resp.valid & im_valid)),
                         self.read_a.resp.ready.eq(took)]
            mac_factors = (im.mac_rows, im.mac_cols)
        else:
            # k beats, each a row of A-transposed and a row of B (columns >= n zeroed)
            ameta_layout = data.StructLayout({"columns": C, "last": 1, "mac_rows": small_r,
                                              "mac_cols": small_c})
            a_head = Signal(feed_layout)
            m.d.comb += a_head.eq(feeds.r_data)
            a_row = Signal(16)
            b_row = Signal(16)
            # buffered, as in reader()
            ameta = buffered_fifo(cfg, width=ameta_layout.size, depth=meta_depth)
            m.submodules.ameta = ameta
            a_req = request("a", self.read_a)
            b_req = request("b", self.read_b)
            # A and B are requested row by row, neither running ahead of the other
            both = Signal()
            m.d.comb += [
                both.eq(feeds.r_rdy & ameta.w_rdy),
                a_req.payload.addr.eq(a_head.a_addr + a_row),
                b_req.payload.addr.eq(a_head.b_addr + b_row),
            ]
            a_fire = a_req.valid & a_req.ready
            b_fire = b_req.valid & b_req.ready
            # the two requests may be granted in different cycles (bank conflicts): a row
            # counter each, and the descriptor retires when both have issued row k-1
            a_done = Signal()
            b_done = Signal()
            with m.If(a_fire):
                m.d.sync += a_row.eq(a_row + 1)
            with m.If(b_fire):
                m.d.sync += b_row.eq(b_row + 1)
            m.d.comb += [
                a_req.valid.eq(both & (a_row <= b_row) & (a_row < a_head.k)),
                b_req.valid.eq(both & (b_row <= a_row) & (b_row < a_head.k)),
                a_done.eq((a_row + a_fire) == a_head.k),
                b_done.eq((b_row + b_fire) == a_head.k),
                ameta.w_data.eq(Cat(column_mask(a_head.n), a_row == a_head.k - 1, a_head.mac_rows,
                                    a_head.n)),
                ameta.w_en.eq(a_fire),
            ]
            with m.If(feeds.r_rdy & a_done & b_done):
                m.d.sync += [a_row.eq(0), b_row.eq(0)]
                m.d.comb += feeds.r_en.eq(1)
            am = Signal(ameta_layout)
            m.d.comb += am.eq(ameta.r_data)
            a_resp = self.read_a.resp.payload
            b_resp = self.read_b.resp.payload
            for i in range(R):
                m.d.comb += inputs_beat.a[i].eq(element(a_resp, i, input_shape))
            for j in range(C):
                m.d.comb += inputs_beat.b[j].eq(Mux(am.columns[j], element(b_resp, j, weight_shape), 0))
            m.d.comb += inputs_beat.last.eq(am.last)
            both_rows = self.read_a.resp.valid & self.read_b.resp.valid
            took = launch("inputs", self.inputs, both_rows & ameta.r_rdy)
            m.d.comb += [self.read_a.resp.ready.eq(took), self.read_b.resp.ready.eq(took),
                         ameta.r_en.eq(took)]
            mac_factors = (am.mac_rows, am.mac_cols)
        # MACs counted as a row enters the array, in registers here: the counters' registers may
        # sit far away (a CountCrossing's by the other clock's side), and the route to them then
        # starts at a register, not at the handshake (the 16x16 SoC's critical path at 9120dd7:
        # the input register's fire -> a CountCrossing increment's reset, 9.9 ns of routing); the
        # row's MACs are the product of its metadata's two factors (registers: a metadata FIFO's
        # read data or the spaced register's output), made here in parallel with the handshake:
        # the product's register takes it in every cycle, and `active` (the handshake's register)
        # picks it after them, so that the handshake does not reach the product's adders (on the
        # 16x16 ULX3S SoC at b9a0bbe, with the choice before the register, those paths ended at
        # 9.97 ns, docs/boards.md)
        active = Signal()
        macs = Signal.like(self.macs)
        m.d.sync += [active.eq(copy.in_fire), macs.eq(_small_product(*mac_factors))]
        m.d.comb += [self.array_active.eq(active), self.macs.eq(Mux(active, macs, 0))]

        # -- results -> accumulator -------------------------------------------------------------
        head = Signal(write_layout)
        m.d.comb += head.eq(writes.r_data)
        # a WS COMPUTE's m rows lie in the accumulator (acc_addr + m <= acc_rows, the ISA), an OS
        # tile's R rows; the counter is only as wide as that, and its last row is the descriptor's
        # m_last (WS; m - 1 made on accept from the bits a legal m has: a comparison with a 16-bit
        # m - 1 here came out of yosys as a chain of 16 LUTs on iCE40, the UP5K's critical path)
        out_row = Signal(range(max(2, cfg.acc_rows, R)))
        out = self.acc_write.payload
        # with the memory registers, the array's result rows pass a register: the array's
        # output and this writer's row counter and descriptor queue are then a cycle apart (the
        # 16x16 compute core's critical path on the ULX3S-85F at 934e02c, mostly routing across
        # the core). Nothing here waits (the accumulator is always ready), so the register is a
        # valid flag and the row, no handshake.
        results = self.outputs
        if registered:
            results = stream.Signature(output_layout(cfg), always_ready=True).create(path=("results",))
            m.d.sync += results.valid.eq(self.outputs.valid)
            row = Signal(output_layout(cfg), name="results_row", reset_less=True)
            m.d.sync += row.eq(self.outputs.payload)
            m.d.comb += results.payload.eq(row)
        next_row = Signal(len(out_row) + 1)
        m.d.comb += [
            out.addr.eq(head.acc_addr + out_row),
            out.data.eq(results.payload.data),
            out.accumulate.eq(head.accumulate),
            next_row.eq(out_row + 1),
        ]
        # A result row's descriptor is always at the head of `writes` when the row arrives: it
        # was written with the feeder's descriptor, whose first row enters the array at least
        # array_latency cycles before its first result; the rows come back in order; and the
        # buffered FIFO shows the next descriptor in the cycle after a read (no bubble). So the
        # writer waits for the accumulator only, not for `writes`: its readiness is then the
        # accumulator's (constant, hw/accumulator.py), and neither the result register's output
        # enable nor the array's output handshake depends on the descriptor queue (that
        # dependence was the 16x16 compute core's critical path at a1e361d). A row that came
        # without its descriptor would be written with a wrong one, which the RTL tests' golden
        # comparisons would show.
        if ws:
            # the array returns exactly the m rows (m >= 1): no comparison with m but the last.
            # Whether a row is the last is made of registers, as the readers' (`reader` above):
            # the descriptor's `m_single` for its first row (`out_fresh`), else `out_last_after`,
            # set as the row before it is written, so no comparison lies between the row counter
            # and the descriptor queue's read (on the 16x16 ULX3S SoC at b76e74e that comparison
            # into the queue's read port and read data enables took 11.2 ns, docs/boards.md)
            m.d.comb += self.acc_write.valid.eq(results.valid)
            fresh = Signal(init=1, name="out_fresh")                 # out_row == 0
            last_after = Signal(name="out_last_after")               # out_row == m_last, out_row > 0
            last_row = Mux(fresh, head.m_single, last_after)
        else:
            # OS tiles drain all R rows; rows >= m are dropped
            m.d.comb += self.acc_write.valid.eq(results.valid & (out_row < head.m))
            last_row = out_row == R - 1
        completing = Signal()
        with m.If(results.valid):
            with m.If(last_row):
                m.d.sync += out_row.eq(0)
                m.d.comb += [writes.r_en.eq(1), completing.eq(1)]
                if ws:
                    m.d.sync += fresh.eq(1)
            with m.Else():
                m.d.sync += out_row.eq(next_row)
                if ws:
                    m.d.sync += [fresh.eq(0), last_after.eq(next_row == head.m_last)]
        # A read accepted by the accumulator sees a beat write_latency cycles after the beat: the
        # COMPUTE completes write_latency - 1 cycles after its last beat, and whatever reads on its
        # completion asks a cycle later at the earliest (as the golden model's estimate has it)
        pending = Signal(write_latency(cfg) - 1)
        m.d.sync += pending.eq(Cat(completing, pending[:-1]))
        m.d.comb += [self.completed.eq(pending[-1]), self.busy.eq(writes.r_rdy | pending.any())]
        return m


class ComputeCheck(wiring.Component):
    """Checks each COMPUTE against the rules of docs/isa.md (the golden model's) on its way from
    the compute sequencer to the :class:`ComputeUnit`: k, m and n in their ranges, the rows of A,
    B and the accumulator inside their memories, ``preload = 0`` only after a preload of the same
    k and n in this program (WS), ``preload = 0`` always (OS). The unit keeps only the bits a
    legal COMPUTE needs, so an illegal one could otherwise hang it.

    The verdict is computed as the COMPUTE enters a :class:`StreamRegister` (one cycle, a COMPUTE
    per cycle, no path from the unit's ``ready`` to the sequencer). A legal COMPUTE goes on to
    ``o``; an illegal one does not: ``error`` becomes ``ERR_ILLEGAL`` with its ``error_pc`` at
    once (the first one's, until reset), and once every COMPUTE sent before it has completed
    (``unit_completed``) it raises ``completed`` itself, so its sequencer retires it in order and
    the halted program ends. The COMPUTEs after it (issued before the halt reached the
    sequencer) are dropped the same way. Reset by start: each program starts with no stationary
    weights."""

    def __init__(self, config: AcceleratorConfig):
        self.config = config
        super().__init__({
            "i": In(stream.Signature(InstructionLayout())),
            "o": Out(stream.Signature(InstructionLayout())),
            "unit_completed": In(1),
            "completed": Out(1),
            "error": Out(2),
            "error_pc": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        R, C = cfg.rows, cfg.cols
        ws = cfg.dataflow == "ws"
        op = _view(Opcode.COMPUTE, self.i.payload.word)
        used = used_bits(Opcode.COMPUTE)

        def inside(first, count, rows):
            """Rows first .. first + count - 1 lie in a memory of ``rows`` rows."""
            return (first + count) <= rows

        legal = Signal()
        sizes = [(op.n != 0) & (op.n <= C)]
        if ws:
            # the stationary weights' k and n, from the last preload this program
            have = Signal()
            weights_k = Signal(R.bit_length())
            weights_n = Signal(C.bit_length())
            sizes += [(op.k != 0) & (op.k <= R), op.m != 0,
                      op.preload | (have & (op.k == weights_k) & (op.n == weights_n)),
                      inside(op.a_addr, op.m, cfg.spad_rows),
                      ~op.preload | inside(op.b_addr, op.k, cfg.spad_rows)]
            with m.If(self.i.valid & self.i.ready & op.preload):
                m.d.sync += [have.eq(1), weights_k.eq(op.k), weights_n.eq(op.n)]
        else:
            sizes += [~op.preload, (op.m != 0) & (op.m <= R), op.k != 0,
                      inside(op.a_addr, op.k, cfg.spad_rows), inside(op.b_addr, op.k, cfg.spad_rows)]
        sizes.append(inside(op.acc_addr, op.m, cfg.acc_rows))
        m.d.comb += legal.eq(Cat(*sizes).all())

        layout = data.StructLayout({"word": used, "pc": 32, "illegal": 1})
        m.submodules.register = register = StreamRegister(layout)
        m.d.comb += [
            register.i.valid.eq(self.i.valid), self.i.ready.eq(register.i.ready),
            register.i.payload.word.eq(self.i.payload.word[:used]),
            register.i.payload.pc.eq(self.i.payload.pc), register.i.payload.illegal.eq(~legal),
        ]
        head = register.o.payload
        # an illegal COMPUTE, and every one after it (issued before the halt reached the
        # sequencer), is dropped: it completes itself once those sent before it have
        drop = Signal()
        m.d.comb += drop.eq(head.illegal | (self.error != 0))
        # COMPUTEs sent to the unit and not completed yet (the sequencer keeps at most 8 issued)
        sent = Signal(range(9))
        send = Signal()
        retire_dropped = Signal()
        m.d.comb += [
            self.o.valid.eq(register.o.valid & ~drop),
            self.o.payload.word.eq(head.word), self.o.payload.pc.eq(head.pc),
            send.eq(self.o.valid & self.o.ready),
            retire_dropped.eq(register.o.valid & drop & (sent == 0)),
            register.o.ready.eq(Mux(drop, retire_dropped, self.o.ready)),
        ]
        m.d.sync += [sent.eq(sent + send - self.unit_completed), self.completed.eq(retire_dropped)]
        with m.If(register.o.valid & head.illegal & (self.error == 0)):
            m.d.sync += [self.error.eq(ERR_ILLEGAL), self.error_pc.eq(head.pc)]
        return m


# -- store ------------------------------------------------------------------------------------

class StoreUnit(wiring.Component):
    """Executes CONFIG and STORE instructions, one at a time. With ``config.sfu_residual``, a
    STORE's residual rows are read by the load unit's GatherReader through ``residual``
    (:func:`residual_read_signature`)."""

    def __init__(self, config: AcceleratorConfig):
        self.config = config
        acc_addr = data.StructLayout({"addr": unsigned(config.acc_addr_bits)})
        table_addr = data.StructLayout({"addr": unsigned(config.requant_addr_bits)})
        members = {
            "cmd": In(stream.Signature(InstructionLayout())),
            "completed": Out(1),
            "busy": Out(1),
            "dram_base": In(32),
            "read_acc": Out(read_port_signature(acc_addr, acc_row_layout(config))),
            "axi_w": Out(_axi_write_port(config)),
            "error": Out(2),
            "error_pc": Out(32),
        }
        if config.sfu_engine == "pipelined":
            members["table_lookup"] = Out(lookup_signature(config))
        else:
            members["read_table"] = Out(read_port_signature(table_addr, requant_row_layout(config)))
        if config.sfu_residual:
            members["residual"] = Out(residual_read_signature(config))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        C = cfg.cols
        sfu_class = SerialSpecialFunctionUnit if cfg.sfu_engine == "serial" else SpecialFunctionUnit
        m.submodules.sfu = sfu = sfu_class(cfg)
        writer_class = SerialScatterWriter if cfg.scatter_engine == "serial" else ScatterWriter
        m.submodules.writer = writer = writer_class(cfg)
        wiring.connect(m, writer=writer.aw, axi=wiring.flipped(self.axi_w.aw))
        wiring.connect(m, writer=writer.w, axi=wiring.flipped(self.axi_w.w))
        wiring.connect(m, axi=wiring.flipped(self.axi_w.b), writer=writer.b)
        residual = self.residual if cfg.sfu_residual else None

        word = self.cmd.payload.word
        config_op = _view(Opcode.CONFIG, word)
        store_op = _view(Opcode.STORE, word)
        is_config = self.cmd.payload.word[:4] == Opcode.CONFIG.value

        regs = Signal(SFU_REGS)
        m.d.comb += sfu.regs.eq(regs)

        # Without pooling in the config there are no windows: a STORE walks its pixels only.
        has_pooling = bool(cfg.sfu_pooling)
        s = Signal(LAYOUTS[Opcode.STORE])       # the STORE being executed
        pc = Signal(32)
        window_pixels = Signal(16, init=1)      # win_h * win_w
        win_h = Signal(8)                        # window (1 x 1 without pooling)
        win_w = Signal(8)
        str_h = Signal(8)
        str_w = Signal(8)
        m.d.comb += [
            sfu.settings.out_type.eq(s.out_type),
            sfu.settings.act.eq(s.act),
            sfu.settings.pool.eq(s.pool),
            sfu.settings.residual.eq(s.residual),
            sfu.settings.pool_count.eq(window_pixels),
        ]
        # the pipelined SFU reads the STORE's table row a lane group a cycle (qrow from the
        # STORE's register, set in IDLE: stable long before the first beat); the serial one takes
        # the row read at the STORE's start (TABLE, PARAMS)
        streamed = cfg.sfu_engine == "pipelined"
        if streamed:
            m.d.comb += [self.table_lookup.row.eq(s.qrow), sfu.params.eq(self.table_lookup.entries)]
            if cfg.sfu_row_cycles > 1:
                m.d.comb += self.table_lookup.group.eq(sfu.param_group)
        else:
            m.d.comb += sfu.params.eq(self.read_table.resp.payload)

        # pixel / window walk state
        oy = Signal(16)
        ox = Signal(16)
        # Accumulator rows are kept modulo 2**acc_addr_bits: a row is only read for a window
        # pixel inside the image, whose row lies in the accumulator, and every update is an
        # addition, so the low bits are exact where they are used.
        row_bits = cfg.acc_addr_bits
        wrow = Signal(row_bits)                 # accumulator row of the current window pixel

        # acc reads: the walk queues one request (row, metadata) per window pixel; a request leaves
        # the queue for the accumulator, its metadata for the response side. The walk waits only
        # for room in the queue, so the accumulator's ready (which depends on the array's beats)
        # reaches no walk register, and the request comes from a register. The metadata queue holds
        # one entry more than the read_latency responses a port may owe, for one row per cycle;
        # buffered (a register, not a distributed RAM's read, starts the response handshake),
        # an entry readable two cycles after it is written, no later than the response.
        meta_layout = data.StructLayout({"first": 1, "last": 1, "pad": 1})
        # With a compute clock of its own the accumulator sits behind two clock-domain crossings,
        # whose latency the queue covers as well.
        slack = CROSSING_READ_SLACK if cfg.compute_clock_mhz else 0
        m.submodules.meta = meta = buffered_fifo(cfg, width=meta_layout.size,
                                                 depth=read_latency(cfg) + 1 + slack)
        m.submodules.requests = requests = buffered_fifo(cfg, width=row_bits + meta_layout.size, depth=4)
        walking = Signal()
        last_pixel = Signal()
        step = Signal()
        request_addr = Signal(row_bits)
        request_meta = Signal(meta_layout)
        m.d.comb += [
            step.eq(walking & requests.w_rdy),
            requests.w_en.eq(step),
            requests.w_data.eq(Cat(request_addr, request_meta)),
            self.read_acc.req.valid.eq(requests.r_rdy & meta.w_rdy),
            self.read_acc.req.payload.addr.eq(requests.r_data[:row_bits]),
            meta.w_data.eq(requests.r_data[row_bits:]),
            meta.w_en.eq(self.read_acc.req.valid & self.read_acc.req.ready),
            requests.r_en.eq(meta.w_en),
        ]
        # the walk's bounds, registered at SETUP: no subtraction before a comparison in the walk
        last_ox = Signal(16)                    # out_w - 1
        last_oy = Signal(16)                    # out_h - 1
        if has_pooling:
            wy = Signal(8)
            wx = Signal(8)
            iy = Signal(signed(20))             # image coordinate of the current window pixel
            ix = Signal(signed(20))
            oy_row = Signal(row_bits)           # ... row of window pixel (0, 0) of output (oy, 0)
            ox_row = Signal(row_bits)           # ... of window pixel (0, 0) of output (oy, ox)
            oy_iy = Signal(signed(20))
            ox_ix = Signal(signed(20))
            row_step = Signal(row_bits)         # stride_h * in_w
            row_skip = Signal(row_bits)         # in_w - (win_w - 1): to the next window row
            top_rows = Signal(row_bits)         # pad_top * in_w
            last_wx = Signal(8)                 # win_w - 1
            last_wy = Signal(8)                 # win_h - 1
            inside = Signal()
            m.d.comb += [
                inside.eq((iy >= 0) & (iy < s.in_h) & (ix >= 0) & (ix < s.in_w)),
                request_addr.eq(Mux(inside, wrow, s.acc_addr)),
                request_meta.eq(Cat((wy == 0) & (wx == 0), (wy == last_wy) & (wx == last_wx), ~inside)),
            ]
            with m.If(step):
                with m.If(wx != last_wx):
                    m.d.sync += [wx.eq(wx + 1), ix.eq(ix + 1), wrow.eq(wrow + 1)]
                with m.Elif(wy != last_wy):
                    m.d.sync += [wx.eq(0), wy.eq(wy + 1), ix.eq(ox_ix), iy.eq(iy + 1),
                                 wrow.eq(wrow + row_skip)]
                with m.Elif(ox != last_ox):
                    nrow = ox_row + str_w
                    m.d.sync += [wx.eq(0), wy.eq(0), ox.eq(ox + 1), ox_row.eq(nrow), wrow.eq(nrow),
                                 ox_ix.eq(ox_ix + str_w), ix.eq(ox_ix + str_w), iy.eq(oy_iy)]
                with m.Elif(oy != last_oy):
                    nrow = oy_row + row_step
                    m.d.sync += [wx.eq(0), wy.eq(0), ox.eq(0), oy.eq(oy + 1),
                                 oy_row.eq(nrow), ox_row.eq(nrow), wrow.eq(nrow),
                                 oy_iy.eq(oy_iy + str_h), iy.eq(oy_iy + str_h),
                                 ox_ix.eq(-s.pad_left), ix.eq(-s.pad_left)]
                with m.Else():
                    m.d.comb += last_pixel.eq(1)
        else:
            # Without pooling an output pixel is its input pixel and in = out (docs/isa.md): the
            # rows are acc_addr, acc_addr + 1, ... in order, each a window of its own.
            m.d.comb += [
                request_addr.eq(wrow),
                request_meta.eq(Cat(1, 1, 0)),
            ]
            with m.If(step):
                m.d.sync += wrow.eq(wrow + 1)
                with m.If(ox != last_ox):
                    m.d.sync += ox.eq(ox + 1)
                with m.Elif(oy != last_oy):
                    m.d.sync += [ox.eq(0), oy.eq(oy + 1)]
                with m.Else():
                    m.d.comb += last_pixel.eq(1)

        # acc response (+ residual row) -> SFU
        mt = Signal(meta_layout)
        m.d.comb += mt.eq(meta.r_data)
        sfu_in = sfu.i.payload
        m.d.comb += [
            sfu_in.acc.eq(self.read_acc.resp.payload),
            sfu_in.first.eq(mt.first), sfu_in.last.eq(mt.last), sfu_in.pad.eq(mt.pad),
        ]
        res_ok = Signal()
        m.d.comb += res_ok.eq(1)
        if residual is not None:
            # the residual rows through a stream register: the SFU's ready does not reach the
            # shared GatherReader (and through it the AXI read channel) in the same cycle
            m.submodules.residual_rows = rows_in = StreamRegister(residual.rows.payload.shape())
            wiring.connect(m, wiring.flipped(residual.rows), rows_in.i)
            residual_rows = rows_in.o
            res_row = residual_rows.payload
            ib = cfg.input_bytes
            for c in range(C):
                m.d.comb += sfu_in.residual[c].eq(_bytes_le(res_row.data, c * ib, ib))
            m.d.comb += res_ok.eq(~s.residual | residual_rows.valid)
            m.d.comb += residual_rows.ready.eq(s.residual & sfu.i.valid & sfu.i.ready)
            # the first error response of the STORE's residual rows
            with m.If(residual_rows.valid & residual_rows.ready & (res_row.resp != 0) &
                      (self.error == 0)):
                m.d.sync += [self.error.eq(res_row.resp), self.error_pc.eq(pc)]
        m.d.comb += [
            sfu.i.valid.eq(self.read_acc.resp.valid & res_ok & meta.r_rdy),
            self.read_acc.resp.ready.eq(sfu.i.ready & res_ok & meta.r_rdy),
            meta.r_en.eq(sfu.i.valid & sfu.i.ready),
        ]

        # SFU -> pixel bytes -> writer. The pipelined writer takes them through a StreamRegister:
        # its pixel handshake (the output position's counters) and the SFU's output FIFO do not
        # meet in one cycle (the ULX3S 4x4 critical path ran from one to the other and back)
        pixels = writer.pixels
        if cfg.scatter_engine == "pipelined":
            m.submodules.pixels = pixel_register = StreamRegister(writer.pixels.payload.shape())
            wiring.connect(m, register=pixel_register.o, writer=writer.pixels)
            pixels = pixel_register.i
        raw = Signal()
        m.d.comb += raw.eq(s.out_type == OutType.RAW)
        pix = pixels.payload
        ob, ab = cfg.input_bytes, cfg.acc_bytes
        with m.If(raw):
            for c in range(C):
                for b in range(ab):
                    m.d.comb += pix[c * ab + b].eq(sfu.o.payload[c][8 * b:8 * b + 8])
        with m.Else():
            for c in range(C):
                for b in range(ob):
                    m.d.comb += pix[c * ob + b].eq(sfu.o.payload[c][8 * b:8 * b + 8])
        m.d.comb += [pixels.valid.eq(sfu.o.valid), sfu.o.ready.eq(pixels.ready)]

        wcmd = writer.cmd.payload
        m.d.comb += [
            wcmd.elem_bytes.eq(Mux(raw, ab, ob)), wcmd.n.eq(s.n), wcmd.out_h.eq(s.out_h),
            wcmd.out_w.eq(s.out_w), wcmd.dram_addr.eq(s.dram_addr + self.dram_base),
            wcmd.pitch_y.eq(s.pitch_y), wcmd.pitch_x.eq(s.pitch_x), wcmd.pitch_c.eq(s.pitch_c),
        ]
        if residual is not None:
            rcmd = residual.cmd.payload
            m.d.comb += [
                rcmd.elem_bytes.eq(ob), rcmd.dram_addr.eq(s.res_addr + self.dram_base),
                rcmd.pitch_y.eq(s.pitch_y), rcmd.pitch_x.eq(s.pitch_x), rcmd.pitch_c.eq(s.pitch_c),
                *(getattr(rcmd, name).eq(value) for name, value in
                  residual_read_fields(s.out_h, s.out_w, s.n).items()),
            ]

        # `completed` is a register, a cycle after the state machine finishes an instruction, so
        # that the writer's and the SFU's idleness do not run through the store sequencer's retire
        # logic and token pushes in the same cycle; busy until then
        completing = Signal()
        m.d.sync += self.completed.eq(completing)
        busy = Signal()
        m.d.comb += self.busy.eq(busy | self.completed)

        def after_table() -> None:
            """To the residual read if the STORE has one, else to the writer's command."""
            if residual is not None:
                with m.If(s.residual):
                    m.next = "RESIDUAL"
                with m.Else():
                    m.next = "START"
            else:
                m.next = "START"

        def after_setup() -> None:
            """After SETUP (and ORIGIN): the serial SFU's table row first."""
            if streamed:
                after_table()
            else:
                m.next = "TABLE"

        with m.FSM(name="store"):
            with m.State("IDLE"):
                m.d.comb += self.cmd.ready.eq(1)
                with m.If(self.cmd.valid):
                    m.d.sync += pc.eq(self.cmd.payload.pc)
                    with m.If(is_config):
                        for name, _ in SFU_REGS:
                            m.d.sync += getattr(regs, name).eq(getattr(config_op, name))
                        m.next = "CONFIG_DONE"
                    with m.Else():
                        m.d.sync += s.eq(store_op)
                        if has_pooling:
                            pooling = store_op.pool != PoolMode.NONE
                            m.d.sync += [
                                win_h.eq(Mux(pooling, store_op.pool_h, 1)),
                                win_w.eq(Mux(pooling, store_op.pool_w, 1)),
                                str_h.eq(Mux(pooling, store_op.stride_h, 1)),
                                str_w.eq(Mux(pooling, store_op.stride_w, 1)),
                            ]
                        m.next = "SETUP"
            with m.State("CONFIG_DONE"):
                m.d.comb += completing.eq(1)
                m.next = "IDLE"
            with m.State("SETUP"):
                m.d.comb += busy.eq(1)
                m.d.sync += [last_ox.eq(s.out_w - 1), last_oy.eq(s.out_h - 1), oy.eq(0), ox.eq(0)]
                if has_pooling:
                    # the window products by shifted additions (no DSP blocks), rows modulo
                    # 2**row_bits; the walk's origin from them in the next cycle
                    m.d.sync += [
                        top_rows.eq(_small_product(s.pad_top, s.in_w[:row_bits], row_bits)),
                        row_step.eq(_small_product(str_h, s.in_w[:row_bits], row_bits)),
                        last_wx.eq(win_w - 1), last_wy.eq(win_h - 1),
                    ]
                    if "avg" in cfg.sfu_pooling:     # the SFU uses it for the average only
                        m.d.sync += window_pixels.eq(_small_product(win_h, win_w))
                    m.next = "ORIGIN"
                else:
                    m.d.sync += wrow.eq(s.acc_addr)
                    after_setup()
            if has_pooling:
                with m.State("ORIGIN"):
                    m.d.comb += busy.eq(1)
                    top = -s.pad_top
                    first_row = s.acc_addr - top_rows - s.pad_left
                    m.d.sync += [
                        wy.eq(0), wx.eq(0),
                        oy_iy.eq(top), iy.eq(top), ox_ix.eq(-s.pad_left), ix.eq(-s.pad_left),
                        oy_row.eq(first_row), ox_row.eq(first_row), wrow.eq(first_row),
                        row_skip.eq(s.in_w[:row_bits] - last_wx),
                    ]
                    after_setup()
            if not streamed:
                with m.State("TABLE"):
                    m.d.comb += [busy.eq(1), self.read_table.req.valid.eq(1),
                                 self.read_table.req.payload.addr.eq(s.qrow)]
                    with m.If(self.read_table.req.ready):
                        m.next = "PARAMS"
                with m.State("PARAMS"):
                    # wait for the table row (TABLE_READ_LATENCY): it is on resp.payload from then on,
                    # and the SFU samples params a cycle before the first beat
                    m.d.comb += busy.eq(1)
                    with m.If(self.read_table.resp.valid):
                        after_table()
            if residual is not None:
                with m.State("RESIDUAL"):
                    # the residual read waits for the shared GatherReader
                    m.d.comb += [busy.eq(1), residual.cmd.valid.eq(1)]
                    with m.If(residual.cmd.ready):
                        m.next = "START"
            with m.State("START"):
                m.d.comb += [busy.eq(1), writer.cmd.valid.eq(1)]
                with m.If(writer.cmd.ready):
                    m.next = "WALK"
            with m.State("WALK"):
                m.d.comb += [busy.eq(1), walking.eq(1)]
                with m.If(last_pixel):
                    m.next = "DRAIN"
            with m.State("DRAIN"):
                m.d.comb += busy.eq(1)
                # every residual row went into the SFU with its accumulator beat
                drained = ~writer.busy & ~requests.r_rdy & sfu.idle & ~self.read_acc.resp.valid
                with m.If(drained):
                    m.d.comb += completing.eq(1)
                    if not streamed:
                        m.d.comb += self.read_table.resp.ready.eq(1)
                    m.next = "IDLE"

        with m.If(writer.error != 0):
            m.d.sync += [self.error.eq(writer.error), self.error_pc.eq(pc)]
        m.d.comb += writer.clear_error.eq(self.cmd.valid & self.cmd.ready)
        return m
