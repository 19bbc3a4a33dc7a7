"""A small RV32I core with the Zmmul extension (multiplications, no division), sized for the
iCE40UP5K: one instruction at a time, the register file in block RAM, a bit-serial multiplier
and a serial shifter.

It exists to run firmware that executes the accelerator's instructions on the smallest FPGAs
(docs/architecture.md, "Small FPGAs"), where the dedicated DMA engines and SFU do not fit.

Bus (:func:`bus_signature`): one request at a time, Wishbone-classic style. The core holds ``stb``
with ``addr`` (a word address), ``we``, ``sel`` (byte lanes) and ``wdata`` until the cycle the
subordinate raises ``ack``; on reads ``rdata`` is valid in that cycle. Instruction fetches and
loads and stores share it. A subordinate may ack in the cycle after ``stb`` rises at the soonest
or keep it waiting for any number of cycles.

Timing, in cycles: 4 for an ALU instruction with a bus that acks after one cycle (fetch 2,
register reads 1, execute 1), 5 for a jump or branch (its target is checked a cycle later), 6 for
a load or store (its address is registered before the access: the bus's outputs come from
registers and the register file, through no adder), 37 for a multiplication and 5 + q + r for a
shift by 4q + r.

What the core does not do: interrupts, CSRs, FENCE.I, division (Zmmul), compressed
instructions. ECALL, EBREAK, an illegal instruction word, a misaligned load, store or jump target
stop it with ``fault`` raised and ``fault_pc`` holding the instruction's address; only a reset
starts it again. So does an instruction after which the program counter would leave the first
``2**pc_bits`` bytes (a core built with ``pc_bits`` < 32 keeps only those bits of it). FENCE
executes as a no-op (one bus, in order).
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .rtlil import UNDEFINED_COLLISION

__all__ = ["bus_signature", "CPU", "OPCODES"]

# RV32 major opcodes (instruction bits [6:0])
OPCODES = {"LOAD": 0b0000011, "MISC_MEM": 0b0001111, "OP_IMM": 0b0010011, "AUIPC": 0b0010111,
           "STORE": 0b0100011, "OP": 0b0110011, "LUI": 0b0110111, "BRANCH": 0b1100011,
           "JALR": 0b1100111, "JAL": 0b1101111, "SYSTEM": 0b1110011}


def bus_signature() -> wiring.Signature:
    """The core's memory bus, seen from the core (see the module docstring)."""
    return wiring.Signature({
        "stb": Out(1), "we": Out(1), "addr": Out(30), "sel": Out(4), "wdata": Out(32),
        "ack": In(1), "rdata": In(32),
    })


class CPU(wiring.Component):
    """RV32I + Zmmul, starting at byte address ``reset_pc`` after reset, executing from the first
    ``2**pc_bits`` bytes of the address space (loads and stores reach all of it).

    Ports: ``bus`` (:func:`bus_signature`), ``fault`` (stopped, see the module docstring),
    ``fault_pc``, ``retired`` (a pulse per completed instruction).
    """

    def __init__(self, reset_pc: int = 0, *, pc_bits: int = 32):
        if isinstance(pc_bits, bool) or not isinstance(pc_bits, int) or not 3 <= pc_bits <= 32:
            raise ValueError(f"pc_bits must be an integer between 3 and 32, not {pc_bits!r}")
        if isinstance(reset_pc, bool) or not isinstance(reset_pc, int) or reset_pc % 4 \
                or not 0 <= reset_pc < 2**pc_bits:
            raise ValueError(f"reset_pc must be a 4-aligned address below 2**pc_bits ({2**pc_bits:#x}), "
                             f"not {reset_pc!r}")
        self.reset_pc = reset_pc
        self.pc_bits = pc_bits
        super().__init__({"bus": Out(bus_signature()), "fault": Out(1), "fault_pc": Out(32),
                          "retired": Out(1)})

    def elaborate(self, platform):
        m = Module()
        # no register is read in the cycle it is written (the write is an instruction's last
        # cycle; the next reads are in its fetch's ack and decode), so synthesis needs no logic
        # for that case (hw/rtlil.py)
        m.submodules.regs = regs = Memory(shape=32, depth=32, init=[], attrs={UNDEFINED_COLLISION: 1})
        rd_port = regs.read_port()
        wr_port = regs.write_port()

        pc = Signal(self.pc_bits, init=self.reset_pc)
        ir = Signal(32)
        a = Signal(32)            # rs1, latched; rs2 is the read port's output from EXEC on
        b = rd_port.data

        opcode, rd, funct3 = ir[0:7], ir[7:12], ir[12:15]
        rs2, funct7 = ir[20:25], ir[25:32]
        # the opcode's decode is registered in DECODE (the instruction word is there since the
        # fetch), so that EXEC's adder starts from registers (timing)
        raw = {name: opcode == code for name, code in OPCODES.items()}
        is_ = {name: Signal(name=f"is_{name.lower()}") for name in OPCODES}
        decoded = [is_[name].eq(raw[name]) for name in OPCODES]

        # immediates, sign-extended
        sign = ir[31]
        imm_i = Cat(ir[20:31], sign.replicate(21))
        imm_s = Cat(ir[7:12], ir[25:31], sign.replicate(21))
        imm_b = Cat(Const(0, 1), ir[8:12], ir[25:31], ir[7], sign.replicate(20))
        imm_u = Cat(Const(0, 12), ir[12:32])
        imm_j = Cat(Const(0, 1), ir[21:31], ir[20], ir[12:20], sign.replicate(12))

        # -- ALU: one adder-subtractor (33 bits: bit 32 gives the comparisons); shifts are serial.
        # Its controls and the immediate operand are registered in DECODE too.
        imm = Signal(32)        # the I or S immediate
        use_b = Signal()        # the second operand is rs2
        sub = Signal()
        unsigned = Signal()     # BLTU/BGEU, SLTU(I)
        compare = (raw["OP"] | raw["OP_IMM"]) & (funct3[1:3] == 0b01)          # SLT, SLTU
        decoded += [
            imm.eq(Mux(raw["STORE"], imm_s, imm_i)),
            use_b.eq(raw["OP"] | raw["BRANCH"]),
            sub.eq(raw["BRANCH"] | compare | (raw["OP"] & (funct3 == 0) & funct7[5])),
            unsigned.eq(Mux(raw["BRANCH"], funct3[1], funct3[0])),
        ]
        op2 = Signal(32)
        m.d.comb += op2.eq(Mux(use_b, b, imm))
        ext_a = a[31] & ~unsigned
        ext_b = op2[31] & ~unsigned
        addsub = Signal(33)
        m.d.comb += addsub.eq(Cat(a, ext_a) + (Cat(op2, ext_b) ^ sub.replicate(33)) + sub)
        less = addsub[32]

        alu = Signal(32)
        with m.Switch(funct3):
            with m.Case(0b000):
                m.d.comb += alu.eq(addsub[0:32])
            with m.Case(0b010, 0b011):
                m.d.comb += alu.eq(less)
            with m.Case(0b100):
                m.d.comb += alu.eq(a ^ op2)
            with m.Case(0b110):
                m.d.comb += alu.eq(a | op2)
            with m.Case(0b111):
                m.d.comb += alu.eq(a & op2)

        # -- branches and jumps -----------------------------------------------------------------
        taken = Signal()
        with m.Switch(funct3):
            with m.Case(0b000):
                m.d.comb += taken.eq(a == b)
            with m.Case(0b001):
                m.d.comb += taken.eq(a != b)
            with m.Case(0b100, 0b110):
                m.d.comb += taken.eq(less)
            with m.Case(0b101, 0b111):
                m.d.comb += taken.eq(~less)
        pc_plus_4 = Signal(32)
        pc_rel = Signal(32)
        m.d.comb += [
            pc_plus_4.eq(pc + 4),
            pc_rel.eq(pc + Mux(is_["BRANCH"], imm_b, Mux(is_["JAL"], imm_j, imm_u))),
        ]
        next_pc = Signal(32)
        with m.If(is_["JAL"] | (is_["BRANCH"] & taken)):
            m.d.comb += next_pc.eq(pc_rel)
        with m.Elif(is_["JALR"]):
            m.d.comb += next_pc.eq(Cat(Const(0, 1), addsub[1:32]))
        with m.Else():
            m.d.comb += next_pc.eq(pc_plus_4)

        # -- legality: everything RV32I + Zmmul defines but ECALL/EBREAK/FENCE.I ------------------
        f7_zero = funct7 == 0
        legal = Signal()
        with m.Switch(opcode):
            with m.Case(OPCODES["LUI"], OPCODES["AUIPC"], OPCODES["JAL"]):
                m.d.comb += legal.eq(1)
            with m.Case(OPCODES["JALR"]):
                m.d.comb += legal.eq(funct3 == 0)
            with m.Case(OPCODES["BRANCH"]):
                m.d.comb += legal.eq(funct3[1:3] != 0b01)
            with m.Case(OPCODES["LOAD"]):
                m.d.comb += legal.eq((funct3 != 0b011) & (funct3[1:3] != 0b11))
            with m.Case(OPCODES["STORE"]):
                m.d.comb += legal.eq((funct3[2] == 0) & (funct3[0:2] != 0b11))
            with m.Case(OPCODES["OP_IMM"]):
                m.d.comb += legal.eq(Mux(funct3 == 0b001, f7_zero,
                                         Mux(funct3 == 0b101, (funct7 & 0b1011111) == 0, 1)))
            with m.Case(OPCODES["OP"]):
                m.d.comb += legal.eq(f7_zero | ((funct7 == 0b0100000) & ((funct3 == 0) | (funct3 == 0b101)))
                                     | ((funct7 == 1) & ~funct3[2]))
            with m.Case(OPCODES["MISC_MEM"]):
                m.d.comb += legal.eq(funct3 == 0)
        jump = is_["JAL"] | is_["JALR"] | is_["BRANCH"]
        # the next instruction's address would leave the first 2**pc_bits bytes: checked on the
        # program counter alone for pc + 4, on the held target for a jump or branch (JUMP)
        last_word = pc[2:].all() if self.pc_bits < 32 else Const(0)
        mul = is_["OP"] & (funct7 == 1)
        shift = (is_["OP"] | is_["OP_IMM"]) & ~mul & (funct3[0:2] == 0b01)

        # what an ALU, LUI, AUIPC or jump instruction writes
        result = Signal(32)
        with m.If(is_["OP"] | is_["OP_IMM"]):
            m.d.comb += result.eq(alu)
        with m.Elif(is_["LUI"]):
            m.d.comb += result.eq(imm_u)
        with m.Elif(is_["AUIPC"]):
            m.d.comb += result.eq(pc_rel)
        with m.Else():
            m.d.comb += result.eq(pc_plus_4)

        # -- loads and stores: the address is computed in EXEC and held in the multiplier's low
        # register for the access (MEM), so that no adder lies on the bus's paths -----------------
        addr = addsub[0:32]
        size = funct3[0:2]
        misaligned = Mux(size == 0, 0, Mux(size == 1, addr[0], addr[0:2] != 0))
        held = Signal(32)           # the address in MEM (the multiplier's low register)
        lane = held[0:2]
        sel = Signal(4)
        with m.Switch(size):
            with m.Case(0):
                m.d.comb += sel.eq(Const(1, 4) << lane)
            with m.Case(1):
                m.d.comb += sel.eq(Mux(held[1], 0b1100, 0b0011))
            with m.Default():
                m.d.comb += sel.eq(0b1111)
        wdata = Mux(size == 0, b[0:8].replicate(4), Mux(size == 1, b[0:16].replicate(2), b))
        loaded_word = self.bus.rdata >> Cat(Const(0, 3), lane)
        loaded = Signal(32)
        with m.Switch(funct3):
            with m.Case(0b000):
                m.d.comb += loaded.eq(loaded_word[0:8].as_signed())
            with m.Case(0b001):
                m.d.comb += loaded.eq(loaded_word[0:16].as_signed())
            with m.Case(0b100):
                m.d.comb += loaded.eq(loaded_word[0:8])
            with m.Case(0b101):
                m.d.comb += loaded.eq(loaded_word[0:16])
            with m.Default():
                m.d.comb += loaded.eq(self.bus.rdata)

        # -- bit-serial multiplier: 32 add-or-subtract-and-shift steps (the last subtracts for a
        # signed multiplier), then MUL takes the low word and MULH/MULHSU/MULHU the high one -----
        hi = Signal(33)
        lo = Signal(32)
        step = Signal(5)
        m.d.comb += held.eq(lo)
        a_signed = (funct3 == 0b001) | (funct3 == 0b010)
        b_signed = funct3 == 0b001
        mcand = Cat(a, a[31] & a_signed)
        partial = Mux(lo[0], mcand, 0)
        last_sub = b_signed & (step == 31)
        psum = Signal(34)
        m.d.comb += psum.eq(Cat(hi, hi[32]) + (Cat(partial, partial[32]) ^ last_sub.replicate(34)) + last_sub)

        # -- register file -----------------------------------------------------------------------
        m.d.comb += rd_port.addr.eq(rs2)
        write = Signal()
        m.d.comb += [wr_port.addr.eq(rd), wr_port.en.eq(write & (rd != 0))]

        m.d.comb += [self.bus.sel.eq(0b1111), self.bus.addr.eq(pc[2:])]
        with m.FSM():
            with m.State("FETCH"):
                m.d.comb += [self.bus.stb.eq(1), rd_port.addr.eq(self.bus.rdata[15:20])]
                with m.If(self.bus.ack):
                    m.d.sync += ir.eq(self.bus.rdata)
                    m.next = "DECODE"
            with m.State("DECODE"):
                m.d.sync += [a.eq(rd_port.data), *decoded]
                m.next = "EXEC"
            with m.State("EXEC"):
                # the result and its write enable depend on the instruction word alone, not on the
                # fault checks (their adder would lie on the register file's paths): a jump that
                # faults still writes its link register, unseen, as the core stops
                m.d.comb += [wr_port.data.eq(result),
                             write.eq(legal & ~is_["LOAD"] & ~is_["STORE"] & ~mul & ~shift
                                      & ~is_["BRANCH"] & ~is_["MISC_MEM"])]
                with m.If(~legal | ((is_["LOAD"] | is_["STORE"]) & misaligned) | (~jump & last_word)):
                    m.next = "FAULT"
                with m.Elif(jump):
                    # the target goes into a register and is checked in the next cycle: no fault
                    # check after the adder in this one
                    m.d.sync += lo.eq(next_pc)
                    m.next = "JUMP"
                with m.Elif(is_["LOAD"] | is_["STORE"]):
                    m.d.sync += lo.eq(addr)
                    m.next = "MEM"
                with m.Elif(mul):
                    m.d.sync += [hi.eq(0), lo.eq(b), step.eq(0)]
                    m.next = "MUL"
                with m.Elif(shift):
                    m.d.sync += [lo.eq(a), step.eq(op2[0:5])]
                    m.next = "SHIFT"
                with m.Else():
                    m.d.comb += self.retired.eq(1)
                    m.d.sync += pc.eq(pc_plus_4)
                    m.next = "FETCH"
            with m.State("JUMP"):
                # jump and branch targets are 4-aligned in RV32I, and within the program counter
                beyond = lo[self.pc_bits:].any() if self.pc_bits < 32 else Const(0)
                with m.If(lo[1] | beyond):
                    m.next = "FAULT"
                with m.Else():
                    m.d.comb += self.retired.eq(1)
                    m.d.sync += pc.eq(lo)
                    m.next = "FETCH"
            with m.State("MEM"):
                m.d.comb += [
                    self.bus.stb.eq(1), self.bus.addr.eq(held[2:32]), self.bus.we.eq(is_["STORE"]),
                    self.bus.sel.eq(sel), self.bus.wdata.eq(wdata),
                    wr_port.data.eq(loaded),
                ]
                with m.If(self.bus.ack):
                    m.d.comb += [write.eq(is_["LOAD"]), self.retired.eq(1)]
                    m.d.sync += pc.eq(pc_plus_4)
                    m.next = "FETCH"
            with m.State("MUL"):
                m.d.sync += [hi.eq(psum[1:34]), lo.eq(Cat(lo[1:32], psum[0])), step.eq(step + 1)]
                with m.If(step == 31):
                    m.next = "MUL_DONE"
            with m.State("MUL_DONE"):
                m.d.comb += [wr_port.data.eq(Mux(funct3 == 0, lo, hi[0:32])), write.eq(1),
                             self.retired.eq(1)]
                m.d.sync += pc.eq(pc_plus_4)
                m.next = "FETCH"
            with m.State("SHIFT"):
                # by 4 while at least 4 remain, then by 1; the multiplier's low register holds
                # the value, its step counter the remaining amount
                left, fill = funct3 == 0b001, funct7[5] & lo[31]
                with m.If(step == 0):
                    m.d.comb += [wr_port.data.eq(lo), write.eq(1), self.retired.eq(1)]
                    m.d.sync += pc.eq(pc_plus_4)
                    m.next = "FETCH"
                with m.Elif(step[2:5] != 0):
                    m.d.sync += [lo.eq(Mux(left, lo << 4, Cat(lo[4:32], fill.replicate(4)))),
                                 step.eq(step - 4)]
                with m.Else():
                    m.d.sync += [lo.eq(Mux(left, lo << 1, Cat(lo[1:32], fill))), step.eq(step - 1)]
            with m.State("FAULT"):
                m.d.comb += [self.fault.eq(1), self.fault_pc.eq(pc)]
        return m
