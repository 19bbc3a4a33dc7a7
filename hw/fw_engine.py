"""The firmware controller (``control = "firmware"``): an RV32 core (:mod:`systolic.hw.cpu`)
runs ``firmware_src/engine.c``, which fetches the program from DRAM, checks and dispatches each
instruction into three software queues with their token channels, executes LOAD, STORE, CONFIG
and SYNC itself and hands each COMPUTE to the compute unit, which runs it on the array while the
firmware goes on. It replaces the fetcher, dispatcher, sequencers, load and store units and the
SFU: far less logic, for the smallest FPGAs.

The core's address space (all word accesses unless stated):

==================  ==========================================================================
``0x0000_0000``     the core's RAM (:data:`RAM_BYTES`): code, data, stack; the last
                    ``4 * len(PARAMS)`` bytes hold the instance's parameters (:data:`PARAMS`),
                    written at elaboration (or by the host with the image, see
                    :data:`RAM_KINDS` and :func:`firmware_load`)
``0x1000_0000``     control registers (:data:`CTRL`)
``0x2000_0000``     scratchpad elements, write only: word ``(row << spad_shift) | element``
``0x3000_0000``     accumulator elements: word ``(row << acc_shift) | element``
``0x8000_0000``     DRAM: byte address ``(page << 31) | (address & 0x7fff_ffff)``, one AXI4
                    beat per access (reads any width; writes use the byte strobes of
                    ``WSTRB``, anded with the store's)
==================  ==========================================================================

One firmware image serves every configuration: what it needs to know of the instance (sizes,
signedness, SFU features) it reads from the parameter words. The image is built from its source
with :func:`build_engine_firmware` (the ``ziglang`` wheel) and kept in the package as
``firmware_src/engine.bin``, so elaborating a design needs no compiler; a test checks that the
two agree.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from amaranth import Cat, ClockSignal, Const, Instance, Module, Mux, Shape, Signal
from amaranth.hdl import ResetInserter
from amaranth.lib import enum, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .accumulator import acc_dma_write_layout, acc_row_layout
from .axi import RESP_OKAY
from .config import ACTIVATIONS, POOLINGS, AcceleratorConfig
from .controller import (
    _LEGAL_FLAGS,
    ERR_DECERR,
    ERR_FLAGS,
    ERR_ILLEGAL,
    ERR_NO_FINISH,
    ERR_SLVERR,
    InstructionLayout,
    used_bits,
)
from .cpu import CPU
from .csr import CORE_FAULT, FW_ADDR_BITS, NO_FIRMWARE
from .firmware import build_firmware, image_words
from .isa import HEADER_LAYOUT, INSTR_BYTES, LAYOUTS, QUEUE_OF, Opcode, Queue
from .rtlil import UNDEFINED_COLLISION
from .scratchpad import spad_write_layout

__all__ = ["ESTIMATE_FACTOR", "RAM_BYTES", "CPU_PC_BITS", "RAM_KINDS", "CTRL", "FLAGS", "PARAMS",
           "TABLE_BYTES", "MAX_QUEUE_DEPTH", "params", "engine_header", "estimate_factor",
           "build_engine_firmware", "engine_image", "firmware_load", "FirmwareController",
           "check_firmware_config"]

#: Bytes of the core's RAM (code, data, stack and parameters) as the firmware is built for it.
RAM_BYTES = 10240
#: The core's program counter bits: code runs from the RAM, at most 64 KiB (two SPRAMs); a jump
#: or branch beyond faults (hw/cpu.py).
CPU_PC_BITS = 16
#: What holds the core's RAM: ``"init"`` block RAM initialized with the firmware (at elaboration),
#: ``"loaded"`` block RAM the host loads through the CSRs (fw_addr, fw_data, CTRL bit 2), or
#: ``"spram"`` two iCE40UP5K SB_SPRAM256KA, loaded the same way (a bitstream cannot initialize
#: them).
RAM_KINDS = ("init", "loaded", "spram")
#: Bytes the firmware sets aside for the requantize table (rows x cols x 12).
TABLE_BYTES = 1024
#: Deepest instruction queue the firmware keeps.
MAX_QUEUE_DEPTH = 4
#: The firmware takes up to this many times the golden model's cycle estimate (which models the
#: hardware control): about 1060 on the catalogue's programs, up to 3170 on a stride-1 3x3
#: average pool (bench/firmware_control.py); watchdogs multiply their budgets by it.
ESTIMATE_FACTOR = 5000

REGION_CTRL, REGION_SPAD, REGION_ACC = 0x1, 0x2, 0x3
#: Control registers: byte offset from 0x1000_0000.
CTRL = {
    "PROG_ADDR": 0x00,      # r: CSR prog_addr
    "PROG_LEN": 0x04,       # r: CSR prog_len
    "DRAM_BASE": 0x08,      # r: CSR dram_base
    "PC": 0x0C,             # w: CSR pc (index of the next instruction to dispatch)
    "ERROR": 0x10,          # w: error code (bits 3:0) and, with it, ERROR_PC's value
    "ERROR_PC": 0x14,       # w: the erring instruction's index (write before ERROR)
    "DONE": 0x18,           # w: the program is over (STATUS.done once the counters settle)
    "FLAGS": 0x1C,          # rw: counting flags (FLAGS)
    "INSTR": 0x20,          # w: one instruction dispatched (the instructions counter)
    "AXI_ERR": 0x24,        # r: the first error response of a DRAM access since the last read
    "PAGE": 0x28,           # w: DRAM address bit 31
    "WSTRB": 0x2C,          # w: byte strobes of DRAM writes
    "ISSUE": 0x30,          # w: issue the COMPUTE in CMD (value: its index); r: not yet accepted
    "COMPLETED": 0x34,      # r: COMPUTEs the compute unit completed since start, mod 2**8
    "CMD": 0x40,            # w: words of the COMPUTE instruction, 0x40 + 4 * i
}
#: Bits of FLAGS: each counter counts the cycles its flag is set; COUNT_READS makes DRAM reads
#: count as dram_read_bytes (LOADs and residual reads; instruction fetch clears it).
FLAGS = ("load_busy", "store_busy", "stall_load_token", "stall_compute_token", "stall_store_token",
         "stall_dispatch", "stall_fetch", "count_reads")


def _shift(elems: int) -> int:
    """Address bits of an element within a row of ``elems``."""
    return max(0, (elems - 1).bit_length())


def params(config: AcceleratorConfig) -> dict[str, int]:
    """The parameter words the firmware reads, in order (each a 32-bit word)."""
    c = config
    feature_bits = {**{f"act_{a}": a in c.sfu_activations for a in ACTIVATIONS},
                    **{f"pool_{p}": p in c.sfu_pooling for p in POOLINGS}, "residual": c.sfu_residual}
    acc_lo, acc_hi = c.acc_range
    out_lo, out_hi = c.output_range
    return {
        "rows": c.rows, "cols": c.cols, "dataflow_os": int(c.dataflow == "os"),
        "spad_rows": c.spad_rows, "acc_rows": c.acc_rows,
        "input_bits": c.input_bits, "input_signed": int(c.input_signed),
        "acc_bits": c.acc_bits, "acc_signed": int(c.acc_signed),
        "spad_elem_bits": c.spad_elem_bits, "spad_shift": _shift(c.spad_row_elems),
        "acc_shift": _shift(c.acc_row_elems),
        "acc_lo": acc_lo & 0xFFFF_FFFF, "acc_hi": acc_hi & 0xFFFF_FFFF,
        "out_lo": out_lo & 0xFFFF_FFFF, "out_hi": out_hi & 0xFFFF_FFFF,
        "table_rows": c.requant_table_rows,
        "queue_depth_load": c.load_queue_depth, "queue_depth_compute": c.compute_queue_depth,
        "queue_depth_store": c.store_queue_depth, "token_depth": c.token_depth,
        "features": sum(int(on) << i for i, on in enumerate(feature_bits.values())),
    }


#: Parameter names, in their order at the end of the RAM.
PARAMS = tuple(params(AcceleratorConfig()))
_FEATURES = (*(f"act_{a}" for a in ACTIVATIONS), *(f"pool_{p}" for p in POOLINGS), "residual")


def check_firmware_config(config: AcceleratorConfig) -> None:
    """Raise :class:`~systolic.hw.config.ConfigError` for what the firmware cannot hold."""
    from .config import ConfigError

    table = config.requant_table_rows * config.cols * config.requant_entry_bytes
    if table > TABLE_BYTES:
        raise ConfigError(f"control = 'firmware' keeps the requantize table in the core's RAM: "
                          f"requant_table_rows * cols * 12 must be at most {TABLE_BYTES} bytes, not "
                          f"{table} ({config.requant_table_rows} x {config.cols} x 12)")
    for name in ("load_queue_depth", "compute_queue_depth", "store_queue_depth"):
        if getattr(config, name) > MAX_QUEUE_DEPTH:
            raise ConfigError(f"control = 'firmware' keeps queues of at most {MAX_QUEUE_DEPTH} "
                              f"instructions, so {name} must be at most {MAX_QUEUE_DEPTH}, not "
                              f"{getattr(config, name)!r}")
    if config.acc_bits > 32 or (config.acc_bits == 32 and not config.acc_signed):
        raise ConfigError("control = 'firmware' computes in 32 bits: a 32-bit accumulator must be signed"
                          if config.acc_bits == 32 else
                          f"control = 'firmware' computes in 32 bits: acc_bits must be at most 32, "
                          f"not {config.acc_bits!r}")
    if config.token_depth > 255:
        raise ConfigError(f"control = 'firmware' needs token_depth below 256, not {config.token_depth!r}")


def _is_enum(shape) -> bool:
    return isinstance(shape, type) and issubclass(shape, enum.Enum)


def estimate_factor(config: AcceleratorConfig) -> int:
    """How many times the golden model's cycle estimate a program may take on ``config``'s
    control: :data:`ESTIMATE_FACTOR` under firmware control, 1 under hardware control."""
    return ESTIMATE_FACTOR if config.control == "firmware" else 1


def engine_header() -> str:
    """``engine.h``: the address map, parameter indices, error codes and every ISA field's bit
    position, from the Python definitions (there is no second copy in C)."""
    lines = ["/* generated by systolic.hw.fw_engine.engine_header: do not edit */", "#pragma once",
             f"#define RAM_BYTES {RAM_BYTES}u", f"#define TABLE_BYTES {TABLE_BYTES}",
             f"#define MAX_QUEUE_DEPTH {MAX_QUEUE_DEPTH}", f"#define INSTR_WORDS {INSTR_BYTES // 4}",
             f"#define NPARAMS {len(PARAMS)}",
             f"#define CTRL_ADDR 0x{REGION_CTRL << 28:08x}u", f"#define SPAD_ADDR 0x{REGION_SPAD << 28:08x}u",
             f"#define ACC_ADDR 0x{REGION_ACC << 28:08x}u", "#define DRAM_WINDOW 0x80000000u"]
    lines += [f"#define CTRL_{name} {offset}" for name, offset in CTRL.items()]
    lines += [f"#define FLAG_{name.upper()} (1u << {i})" for i, name in enumerate(FLAGS)]
    lines += [f"#define P_{name.upper()} {i}" for i, name in enumerate(PARAMS)]
    lines += [f"#define FEATURE_{name.upper()} (1u << {i})" for i, name in enumerate(_FEATURES)]
    lines += [f"#define ERR_{name} {value}" for name, value in (
        ("ILLEGAL", ERR_ILLEGAL), ("SLVERR", ERR_SLVERR), ("DECERR", ERR_DECERR), ("FLAGS", ERR_FLAGS),
        ("NO_FINISH", ERR_NO_FINISH))]
    # per opcode: its fields after the header as a table for decode() (offset, width, signed)
    # and each field's index in the decoded array
    for op in Opcode:
        lines.append(f"#define OP_{op.name} {op.value}")
        lines.append(f"#define USED_BITS_{op.name} {used_bits(op)}")
        fields = [(name, f) for name, f in LAYOUTS[op] if name != "_reserved" and f.offset >= 8]
        entries = []
        for index, (name, f) in enumerate(fields):
            signed = int(getattr(Shape.cast(f.shape), "signed", False)) if not _is_enum(f.shape) else 0
            entries.append(f"{{{f.offset}, {f.width}, {signed}}}")
            lines.append(f"#define {op.name}_{name.upper()} {index}")
        lines.append(f"#define NFIELDS_{op.name} {len(fields)}")
        lines.append(f"#define FIELDS_{op.name} {{{', '.join(entries)}}}" if entries else
                     f"#define FIELDS_{op.name} {{{{0, 0, 0}}}}")
    lines.append(f"#define COMPUTE_CMD_WORDS {(used_bits(Opcode.COMPUTE) + 31) // 32}")
    # the header: opcode, then the four dependency flags in this order (hw/isa.py HEADER_LAYOUT)
    header = dict(HEADER_LAYOUT)
    flags = ("pop_prev", "pop_next", "push_prev", "push_next")
    assert [header[f].offset for f in flags] == list(range(header["pop_prev"].offset,
                                                          header["pop_prev"].offset + 4))
    lines += [f"#define OPCODE_MASK {(1 << header['opcode'].width) - 1}",
              f"#define FLAGS_SHIFT {header['pop_prev'].offset}"]
    # each opcode's queue (3: given by SYNC's queue field) and the flags each queue allows
    # (bit 0 pop_prev ... bit 3 push_next), as the dispatcher checks them (hw/controller.py)
    queue_of = [3] + [QUEUE_OF[op].value if QUEUE_OF.get(op) is not None else 3 for op in Opcode]
    lines.append(f"#define QUEUE_OF_OPCODE {{{', '.join(map(str, queue_of))}}}")
    legal = [sum(int(ok) << i for i, ok in enumerate(_LEGAL_FLAGS[q])) for q in Queue]
    lines.append(f"#define LEGAL_FLAGS {{{', '.join(map(str, legal))}}}")
    sync_queue = dict(LAYOUTS[Opcode.SYNC])["queue"]
    lines += [f"#define SYNC_QUEUE_SHIFT {sync_queue.offset}",
              f"#define SYNC_QUEUE_MASK {(1 << sync_queue.width) - 1}"]
    return "\n".join(lines) + "\n"


_SOURCE = "engine.c"
_IMAGE = "engine.bin"


def _source_dir() -> Path:
    return Path(str(resources.files(__package__).joinpath("firmware_src")))


def build_engine_firmware(out: str | Path | None = None) -> bytes:
    """Build the engine firmware from ``firmware_src/engine.c`` and the generated header (needs
    the ``ziglang`` package); with ``out``, also write the image there."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="systolic-engine-") as tmp:
        Path(tmp, "engine.h").write_text(engine_header())
        image = build_firmware([_source_dir() / _SOURCE], ram_bytes=RAM_BYTES - 4 * len(PARAMS),
                               stack_bytes=512, include=[tmp], writable_data=False)
    if out is not None:
        Path(out).write_bytes(image)
    return image


def engine_image() -> bytes:
    """The packaged engine firmware image (``firmware_src/engine.bin``)."""
    return (_source_dir() / _IMAGE).read_bytes()


def firmware_load(config: AcceleratorConfig) -> list[tuple[int, list[int]]]:
    """What a host writes into a ``"loaded"`` or ``"spram"`` core RAM for ``config``, as
    (first word index, words) runs: the firmware image from word 0 and the parameter words at the
    end of the RAM (the zeroed data and the stack need nothing)."""
    image = engine_image()
    words = image_words(image, (len(image) + 3) // 4)
    return [(0, words), (RAM_BYTES // 4 - len(PARAMS), list(params(config).values()))]


class FirmwareController(wiring.Component):
    """The core, its RAM and its address space (see the module docstring), toward the CSR bank,
    the compute unit, the scratchpad's and the accumulator's DMA ports and the AXI4 bus.

    The core is held in reset until ``start`` and after ``reset``; ``start`` runs the firmware
    from its first instruction (it reads the CSR values then).
    """

    def __init__(self, config: AcceleratorConfig, image: bytes | None = None, *, ram: str = "init"):
        check_firmware_config(config)
        if ram not in RAM_KINDS:
            raise ValueError(f"ram must be one of {', '.join(map(repr, RAM_KINDS))}, not {ram!r}")
        self.config = config
        self.ram = ram
        self.image = engine_image() if image is None else image
        if len(self.image) > RAM_BYTES - 4 * len(PARAMS):
            raise ValueError(f"the firmware image ({len(self.image)} bytes) leaves no room for the "
                             f"parameters in {RAM_BYTES} bytes of RAM")
        c = config
        super().__init__({
            "start": In(1),
            "prog_addr": In(32), "prog_len": In(32), "dram_base": In(32),
            # the RAM image from the host (ram "loaded" or "spram"); ready: the core may run
            "fw_write": In(1), "fw_write_addr": In(FW_ADDR_BITS), "fw_write_data": In(32),
            "fw_loaded": In(1), "fw_ready": Out(1),
            "pc": Out(32), "error": Out(4), "error_pc": Out(32), "done": Out(1), "running": Out(1),
            "fault": Out(1), "fault_pc": Out(32),
            "instructions": Out(1), "dram_read_beat": Out(1), "dram_write_beat": Out(1),
            **{f"flag_{name}": Out(1) for name in FLAGS},
            "compute_cmd": Out(wiring.Signature({
                "valid": Out(1), "ready": In(1), "payload": Out(InstructionLayout())})),
            "compute_completed": In(1),
            "spad_write": Out(wiring.Signature({
                "valid": Out(1), "ready": In(1), "payload": Out(spad_write_layout(c))})),
            "acc_write": Out(wiring.Signature({
                "valid": Out(1), "ready": In(1), "payload": Out(acc_dma_write_layout(c))})),
            "acc_read_req": Out(wiring.Signature({
                "valid": Out(1), "ready": In(1), "payload": Out(c.acc_addr_bits)})),
            "acc_read_resp": In(wiring.Signature({
                "valid": Out(1), "ready": In(1), "payload": Out(acc_row_layout(c))})),
            # AXI4 manager, single beats
            "ar_valid": Out(1), "ar_ready": In(1), "ar_addr": Out(32),
            "r_valid": In(1), "r_ready": Out(1), "r_data": In(32), "r_resp": In(2),
            "aw_valid": Out(1), "aw_ready": In(1), "aw_addr": Out(32),
            "w_valid": Out(1), "w_ready": In(1), "w_data": Out(32), "w_strb": Out(4),
            "b_valid": In(1), "b_ready": Out(1), "b_resp": In(2),
        })

    def elaborate(self, platform):
        m = Module()
        c = self.config
        words = RAM_BYTES // 4
        init = image_words(self.image, words)
        for i, value in enumerate(params(c).values()):
            init[words - len(PARAMS) + i] = value
        # the RAM: one read (a cycle later) or one write per cycle, by word
        ram_addr, ram_wdata, ram_rdata, ram_wen = Signal(FW_ADDR_BITS), Signal(32), Signal(32), Signal(4)
        if self.ram == "spram":
            self._spram(m, ram_addr, ram_wdata, ram_rdata, ram_wen)
        else:
            # one access per cycle on one address: a read's data in a write's cycle is never used,
            # so synthesis needs no logic for a read of the row being written (hw/rtlil.py)
            m.submodules.ram = ram = Memory(shape=32, depth=words, init=init if self.ram == "init" else [],
                                            attrs={UNDEFINED_COLLISION: 1})
            rd, wr = ram.read_port(), ram.write_port(granularity=8)
            m.d.comb += [rd.addr.eq(ram_addr), wr.addr.eq(ram_addr), wr.data.eq(ram_wdata), wr.en.eq(ram_wen),
                         ram_rdata.eq(rd.data)]
        # firmware ready: from the start with an initialized RAM; else once the host has written
        # the image and set CTRL bit 2 (a new image's first word drops it). Like the RAM's
        # contents it outlives a soft reset (reset_less): it is the RAM's state, not the core's
        ready = Signal(init=int(self.ram == "init"), reset_less=True)
        if self.ram != "init":
            with m.If(self.fw_write):
                m.d.sync += ready.eq(0)
            with m.Elif(self.fw_loaded):
                m.d.sync += ready.eq(1)
        m.d.comb += self.fw_ready.eq(ready)
        running = Signal()
        m.d.sync += running.eq(running | (self.start & ready))
        m.d.comb += self.running.eq(running)
        cpu = CPU(pc_bits=CPU_PC_BITS)
        m.submodules.cpu = ResetInserter(self.start | ~running | ~ready)(cpu)
        bus = cpu.bus
        m.d.comb += [self.fault.eq(cpu.fault), self.fault_pc.eq(cpu.fault_pc)]

        region = bus.addr[26:30]
        is_dram = bus.addr[29]
        is_ram = ~is_dram & (region == 0)
        is_ctrl = ~is_dram & (region == REGION_CTRL)
        is_spad = ~is_dram & (region == REGION_SPAD)
        is_acc = ~is_dram & (region == REGION_ACC)
        offset = Cat(Const(0, 2), bus.addr[0:6])        # control register byte offset

        ack, rdata = Signal(), Signal(32)
        m.d.comb += [bus.ack.eq(ack), bus.rdata.eq(Mux(is_ram, ram_rdata, rdata))]
        m.d.sync += ack.eq(0)
        new = bus.stb & ~ack        # a request not yet answered (the core holds stb until ack)

        # -- RAM: one cycle ------------------------------------------------------------------
        with m.If(~ready):          # the core is held in reset: the host's image goes in
            m.d.comb += [ram_addr.eq(self.fw_write_addr), ram_wdata.eq(self.fw_write_data),
                         ram_wen.eq(Mux(self.fw_write, 0b1111, 0))]
        with m.Else():
            m.d.comb += [ram_addr.eq(bus.addr), ram_wdata.eq(bus.wdata)]
            with m.If(new & is_ram):
                m.d.sync += ack.eq(1)
                m.d.comb += ram_wen.eq(Mux(bus.we, bus.sel, 0))

        # -- control registers ------------------------------------------------------------------
        flags = Signal(len(FLAGS))
        page, wstrb = Signal(), Signal(4, init=0xF)
        axi_err = Signal(2)
        completed = Signal(8)
        cmd_words = [Signal(32, name=f"cmd_word{i}") for i in range(INSTR_BYTES // 4)]
        cmd_valid = Signal()
        m.d.comb += [
            self.compute_cmd.valid.eq(cmd_valid),
            self.compute_cmd.payload.word.eq(Cat(*cmd_words)),
        ]
        cmd_pc = Signal(32)
        m.d.comb += self.compute_cmd.payload.pc.eq(cmd_pc)
        with m.If(self.compute_cmd.valid & self.compute_cmd.ready):
            m.d.sync += cmd_valid.eq(0)
        with m.If(self.compute_completed):
            m.d.sync += completed.eq(completed + 1)
        for i, name in enumerate(FLAGS):
            m.d.comb += getattr(self, f"flag_{name}").eq(flags[i])
        axi_err_read = Signal()
        # PC and ERROR_PC as wide as what they hold: instruction indices (config.pc_bits) or, for
        # CORE_FAULT, the core's byte address (CPU_PC_BITS)
        pc = Signal(c.pc_bits)
        error_pc = Signal(max(c.pc_bits, CPU_PC_BITS))
        m.d.comb += [self.pc.eq(pc), self.error_pc.eq(error_pc)]
        with m.If(new & is_ctrl):
            m.d.sync += ack.eq(1)
            with m.If(bus.we):
                with m.Switch(offset):
                    with m.Case(CTRL["PC"]):
                        m.d.sync += pc.eq(bus.wdata)
                    with m.Case(CTRL["ERROR_PC"]):
                        m.d.sync += error_pc.eq(bus.wdata)
                    with m.Case(CTRL["ERROR"]):
                        m.d.sync += self.error.eq(bus.wdata[0:4])
                    with m.Case(CTRL["DONE"]):
                        m.d.sync += self.done.eq(1)
                    with m.Case(CTRL["FLAGS"]):
                        m.d.sync += flags.eq(bus.wdata)
                    with m.Case(CTRL["INSTR"]):
                        m.d.comb += self.instructions.eq(1)
                    with m.Case(CTRL["PAGE"]):
                        m.d.sync += page.eq(bus.wdata[0])
                    with m.Case(CTRL["WSTRB"]):
                        m.d.sync += wstrb.eq(bus.wdata[0:4])
                    with m.Case(CTRL["ISSUE"]):
                        m.d.sync += [cmd_valid.eq(1), cmd_pc.eq(bus.wdata)]
                    for i, word in enumerate(cmd_words):
                        with m.Case(CTRL["CMD"] + 4 * i):
                            m.d.sync += word.eq(bus.wdata)
            with m.Else():
                with m.Switch(offset):
                    with m.Case(CTRL["PROG_ADDR"]):
                        m.d.sync += rdata.eq(self.prog_addr)
                    with m.Case(CTRL["PROG_LEN"]):
                        m.d.sync += rdata.eq(self.prog_len)
                    with m.Case(CTRL["DRAM_BASE"]):
                        m.d.sync += rdata.eq(self.dram_base)
                    with m.Case(CTRL["FLAGS"]):
                        m.d.sync += rdata.eq(flags)
                    with m.Case(CTRL["AXI_ERR"]):
                        m.d.sync += rdata.eq(axi_err)
                        m.d.comb += axi_err_read.eq(1)
                    with m.Case(CTRL["ISSUE"]):
                        m.d.sync += rdata.eq(cmd_valid)
                    with m.Case(CTRL["COMPLETED"]):
                        m.d.sync += rdata.eq(completed)
                    with m.Default():
                        m.d.sync += rdata.eq(0)

        # -- scratchpad and accumulator elements ------------------------------------------------
        spad_shift, acc_shift = _shift(c.spad_row_elems), _shift(c.acc_row_elems)
        sp = self.spad_write.payload
        elem_bits = c.spad_elem_bits
        m.d.comb += [
            sp.addr.eq(bus.addr[spad_shift:26]),
            sp.data.eq(bus.wdata[0:elem_bits].replicate(c.spad_row_elems)),
            sp.mask.eq(Const(1, c.spad_row_elems) << bus.addr[0:spad_shift] if spad_shift else 1),
            self.spad_write.valid.eq(new & is_spad & bus.we),
        ]
        with m.If(new & is_spad & (~bus.we | self.spad_write.ready)):
            m.d.sync += ack.eq(1)
        aw = self.acc_write.payload
        acc_elem = bus.addr[0:acc_shift] if acc_shift else Const(0, 1)
        m.d.comb += [
            aw.addr.eq(bus.addr[acc_shift:26]),
            aw.data.eq(bus.wdata[0:c.acc_bits].replicate(c.acc_row_elems)),
            aw.mask.eq(Const(1, c.acc_row_elems) << acc_elem if acc_shift else 1),
            self.acc_write.valid.eq(new & is_acc & bus.we),
        ]
        with m.If(new & is_acc & bus.we & self.acc_write.ready):
            m.d.sync += ack.eq(1)
        requested = Signal()
        m.d.comb += [
            self.acc_read_req.payload.eq(bus.addr[acc_shift:26]),
            self.acc_read_req.valid.eq(new & is_acc & ~bus.we & ~requested),
            self.acc_read_resp.ready.eq(requested),
        ]
        with m.If(self.acc_read_req.valid & self.acc_read_req.ready):
            m.d.sync += requested.eq(1)
        with m.If(self.acc_read_resp.valid & requested):
            row = self.acc_read_resp.payload
            m.d.sync += [ack.eq(1), requested.eq(0),
                         rdata.eq(row.as_value().word_select(acc_elem, c.acc_bits))]

        # -- DRAM: one AXI4 beat per access -------------------------------------------------------
        address = Cat(Const(0, 2), bus.addr[0:29], page)
        sent_a, sent_w = Signal(), Signal()
        # the channels' valid signals come from a register set a cycle after the core's request
        # (timing: no path from the core's state into the memory's arbiter in one cycle)
        go, go_write = Signal(), Signal()
        m.d.sync += [go.eq(new & is_dram & ~(self.r_valid & self.r_ready) & ~(self.b_valid & self.b_ready)),
                     go_write.eq(bus.we)]
        m.d.comb += [
            self.ar_addr.eq(address), self.aw_addr.eq(address),
            self.ar_valid.eq(go & ~go_write & ~sent_a),
            self.aw_valid.eq(go & go_write & ~sent_a),
            self.w_valid.eq(go & go_write & ~sent_w),
            self.w_data.eq(bus.wdata), self.w_strb.eq(bus.sel & wstrb),
            self.r_ready.eq(sent_a & ~go_write), self.b_ready.eq(sent_a & sent_w & go_write),
        ]
        with m.If((self.ar_valid & self.ar_ready) | (self.aw_valid & self.aw_ready)):
            m.d.sync += sent_a.eq(1)
        with m.If(self.w_valid & self.w_ready):
            m.d.sync += sent_w.eq(1)
        resp = Signal(2)
        done_r = self.r_valid & self.r_ready
        done_b = self.b_valid & self.b_ready
        m.d.comb += resp.eq(Mux(done_r, self.r_resp, self.b_resp))
        with m.If(done_r | done_b):
            m.d.sync += [ack.eq(1), sent_a.eq(0), sent_w.eq(0), rdata.eq(self.r_data)]
        m.d.comb += [self.dram_read_beat.eq(done_r & flags[FLAGS.index("count_reads")]),
                     self.dram_write_beat.eq(done_b)]
        with m.If(axi_err_read):
            m.d.sync += axi_err.eq(0)
        with m.If((done_r | done_b) & (resp != RESP_OKAY) & (axi_err == 0)):
            m.d.sync += axi_err.eq(resp)

        # a fault of the core (a firmware bug) ends the program with its own error code
        with m.If(cpu.fault & ~self.done):
            m.d.sync += [self.error.eq(CORE_FAULT), error_pc.eq(cpu.fault_pc), self.done.eq(1)]

        # every program starts from a clear state
        with m.If(self.start):
            m.d.sync += [self.done.eq(0), self.error.eq(0), error_pc.eq(0), pc.eq(0),
                         flags.eq(0), completed.eq(0), axi_err.eq(0), cmd_valid.eq(0), page.eq(0),
                         wstrb.eq(0xF)]
        # a start before the firmware is there ends at once, with its own error
        with m.If(self.start & ~ready):
            m.d.sync += [self.error.eq(NO_FIRMWARE), self.done.eq(1)]
        return m

    @staticmethod
    def _spram(m: Module, addr: Signal, wdata: Signal, rdata: Signal, wen: Signal) -> None:
        """The RAM as two iCE40UP5K SB_SPRAM256KA side by side (16K words of 32 bits, 64 KiB);
        byte enables become nibble write masks."""
        halves = []
        for half in range(2):
            out = Signal(16, name=f"spram_out{half}")
            mask = wen[2 * half:2 * half + 2]
            m.submodules[f"spram{half}"] = Instance(
                "SB_SPRAM256KA",
                i_ADDRESS=addr[:14], i_DATAIN=wdata.word_select(half, 16),
                i_MASKWREN=Cat(mask[0], mask[0], mask[1], mask[1]), i_WREN=wen.any(),
                i_CHIPSELECT=1, i_CLOCK=ClockSignal("sync"), i_STANDBY=0, i_SLEEP=0, i_POWEROFF=1,
                o_DATAOUT=out)
            halves.append(out)
        m.d.comb += rdata.eq(Cat(*halves))

