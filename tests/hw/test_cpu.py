"""The RV32I + Zmmul core (:mod:`systolic.hw.cpu`) against a reference of the instructions'
semantics, in the Amaranth simulator, running programs built with :func:`build_firmware`.

* every register-register and register-immediate operation (the M extension's multiplications
  included) on extreme and random operands, every branch condition, LUI/AUIPC/JAL/JALR, loads and
  stores of each width at each byte offset, x0 staying zero;
* a C program (calls, stack, 64-bit arithmetic, a lookup table, byte accesses) against the same
  computation in Python;
* each fault (ECALL, EBREAK, an illegal word, a division, a misaligned load, store and jump) stops
  the core with the faulting instruction's address;
* a bus that acks after random delays changes no result.
"""

from __future__ import annotations

import os
import random
import zlib
from pathlib import Path

import pytest
from amaranth import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.sim import Simulator
from systolic.hw.cpu import CPU
from systolic.hw.firmware import FirmwareError, build_firmware, image_words
from systolic.sim.tools import to_verilog, verilator_lint

from .test_lint_synth_memories import synth
from .test_scratchpad import construct_rejected

SEED = int(os.environ.get("SYSTOLIC_TEST_SEED", "1"))
RAM_BYTES = 32768
HALT = 0x8000_0000      # a store here stops the program (the harness' only MMIO address)
M32 = 0xFFFF_FFFF
EXTREMES = [0, 1, 2, 0x7FFF_FFFF, 0x8000_0000, 0xFFFF_FFFF, 0x8000_0001, 0xFFFF_FFFE]


class _System(wiring.Component):
    """The core, a RAM holding the program, and the halt address. ``delays`` (ack delays in
    cycles, taken in turn) makes the bus slow."""

    def __init__(self, image: bytes, delays: list[int], pc_bits: int = 32):
        self.image = image
        self.delays = delays
        self.pc_bits = pc_bits
        super().__init__({"halted": wiring.Out(1), "exit_code": wiring.Out(32), "fault": wiring.Out(1),
                          "fault_pc": wiring.Out(32)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.cpu = cpu = CPU(pc_bits=self.pc_bits)
        depth = RAM_BYTES // 4
        m.submodules.ram = ram = self.ram = Memory(shape=32, depth=depth, init=image_words(self.image, depth))
        m.submodules.delays = delays = Memory(shape=8, depth=len(self.delays), init=self.delays)
        rd, wr, delay = ram.read_port(), ram.write_port(granularity=8), delays.read_port(domain="comb")
        bus = cpu.bus
        mmio = bus.addr[29]
        # the read port's data follow its address a cycle later: a RAM acks a cycle after stb at
        # the soonest, here ``delay`` cycles after that
        index, wait, busy, ack = Signal(range(len(self.delays))), Signal(8), Signal(), Signal()
        m.d.comb += [rd.addr.eq(bus.addr), bus.rdata.eq(rd.data), delay.addr.eq(index),
                     bus.ack.eq(ack), self.fault.eq(cpu.fault), self.fault_pc.eq(cpu.fault_pc)]
        with m.If(bus.stb & ~busy):
            m.d.sync += [busy.eq(1), wait.eq(delay.data)]
        with m.Elif(busy & (wait != 0)):
            m.d.sync += wait.eq(wait - 1)
        with m.Elif(busy):
            m.d.comb += ack.eq(1)
            m.d.sync += [busy.eq(0), index.eq(Mux(index == len(self.delays) - 1, 0, index + 1))]
        with m.If(ack & bus.we & ~mmio):
            m.d.comb += [wr.addr.eq(bus.addr), wr.data.eq(bus.wdata), wr.en.eq(bus.sel)]
        with m.If(ack & bus.we & mmio):
            m.d.sync += [self.halted.eq(1), self.exit_code.eq(bus.wdata)]
        return m


def run(image: bytes, *, max_cycles: int = 100_000, delays: list[int] | None = None,
        pc_bits: int = 32) -> dict:
    """Run ``image`` until it stores to HALT or the core faults (or ``max_cycles`` pass)."""
    dut = _System(image, delays or [0], pc_bits)
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    out: dict = {}

    async def bench(ctx):
        cycles = 0
        while not (ctx.get(dut.halted) or ctx.get(dut.fault)) and cycles < max_cycles:
            await ctx.tick()
            cycles += 1
        words = [ctx.get(dut.ram.data[i]) for i in range(RAM_BYTES // 4)]
        out.update(ram=b"".join(w.to_bytes(4, "little") for w in words), halted=ctx.get(dut.halted),
                   exit_code=ctx.get(dut.exit_code), fault=ctx.get(dut.fault),
                   fault_pc=ctx.get(dut.fault_pc), cycles=cycles)

    sim.add_testbench(bench)
    sim.run()
    return out


def assemble(tmp_path: Path, lines: list[str], *, results_words: int = 256, data: str = "") -> bytes:
    """An image running ``lines`` (assembly) after ``_start`` with ``s0`` and ``s1`` pointing at
    ``results`` (``results_words`` words of .bss), then storing ``s0`` to HALT. Each
    :func:`store` appends a word at ``s1``."""
    source = tmp_path / "prog.S"
    body = "\n".join(f"    {line}" for line in lines)
    source.write_text(f"""
    .section .text.start
    .globl _start
_start:
    la sp, __stack_top
    la s0, results
    mv s1, s0
{body}
    li t0, {HALT}
    sw s0, 0(t0)
1:  j 1b
    .section .data
{data}
    .section .bss
    .balign 4
results:
    .space {4 * results_words}
""")
    return build_firmware([source], ram_bytes=RAM_BYTES)


def store(reg: str) -> list[str]:
    """Lines appending ``reg`` to the results."""
    return [f"sw {reg}, 0(s1)", "addi s1, s1, 4"]


def results(out: dict, count: int) -> list[int]:
    """The first ``count`` result words (the program's HALT store gives their address)."""
    assert out["halted"] and not out["fault"], out
    base, ram = out["exit_code"], out["ram"]
    return [int.from_bytes(ram[base + 4 * i:base + 4 * i + 4], "little") for i in range(count)]


def _s(x: int) -> int:
    return x - (1 << 32) if x & 0x8000_0000 else x


REG_OPS = {
    "add": lambda x, y: x + y, "sub": lambda x, y: x - y, "sll": lambda x, y: x << (y & 31),
    "slt": lambda x, y: int(_s(x) < _s(y)), "sltu": lambda x, y: int(x < y), "xor": lambda x, y: x ^ y,
    "srl": lambda x, y: x >> (y & 31), "sra": lambda x, y: _s(x) >> (y & 31), "or": lambda x, y: x | y,
    "and": lambda x, y: x & y, "mul": lambda x, y: _s(x) * _s(y), "mulh": lambda x, y: (_s(x) * _s(y)) >> 32,
    "mulhsu": lambda x, y: (_s(x) * y) >> 32, "mulhu": lambda x, y: (x * y) >> 32,
}
IMM_OPS = {"addi": "add", "slti": "slt", "sltiu": "sltu", "xori": "xor", "ori": "or", "andi": "and",
           "slli": "sll", "srli": "srl", "srai": "sra"}
BRANCHES = {"beq": lambda x, y: x == y, "bne": lambda x, y: x != y, "blt": lambda x, y: _s(x) < _s(y),
            "bge": lambda x, y: _s(x) >= _s(y), "bltu": lambda x, y: x < y, "bgeu": lambda x, y: x >= y}


def _pairs(rng: random.Random, count: int) -> list[tuple[int, int]]:
    pairs = [(x, y) for x in EXTREMES for y in EXTREMES]
    pairs += [(rng.getrandbits(32), rng.getrandbits(32)) for _ in range(count)]
    pairs += [(rng.getrandbits(32), rng.getrandbits(5)) for _ in range(count // 2)]
    return pairs


def test_register_and_immediate_operations(tmp_path) -> None:
    rng = random.Random(SEED)
    lines, expected = [], []
    for op, ref in REG_OPS.items():
        for x, y in rng.sample(_pairs(rng, 12), 20):
            lines += [f"li t0, {x}", f"li t1, {y}", f"{op} t2, t0, t1", *store("t2")]
            expected.append(ref(x, y) & M32)
    for op, base in IMM_OPS.items():
        shift = op in ("slli", "srli", "srai")
        for x in [*rng.sample(EXTREMES, 4), *(rng.getrandbits(32) for _ in range(3))]:
            imms = [0, 1, 31, rng.randrange(32)] if shift else [0, 1, -1, 2047, -2048,
                                                                   rng.randrange(-2048, 2048)]
            for imm in imms:
                lines += [f"li t0, {x}", f"{op} t2, t0, {imm}", *store("t2")]
                expected.append(REG_OPS[base](x, imm & M32) & M32)
    # a write to x0 is dropped
    lines += ["li t0, 5", "add zero, t0, t0", "addi zero, zero, 7", *store("zero")]
    expected.append(0)
    out = run(assemble(tmp_path, lines, results_words=len(expected)), max_cycles=400_000)
    assert results(out, len(expected)) == expected


def test_branches_jumps_and_upper_immediates(tmp_path) -> None:
    rng = random.Random(SEED + 1)
    lines, expected = [], []
    for op, ref in BRANCHES.items():
        for x, y in rng.sample(_pairs(rng, 6), 14):
            n = len(expected)
            lines += [f"li t0, {x}", f"li t1, {y}", "li t2, 1", f"{op} t0, t1, taken{n}", "li t2, 0",
                      f"taken{n}:", *store("t2")]
            expected.append(int(ref(x, y)))
    # a backward branch: a loop of 5
    lines += ["li t0, 5", "li t2, 0", "loop:", "addi t2, t2, 3", "addi t0, t0, -1", "bnez t0, loop",
              *store("t2")]
    expected.append(15)
    for value in (0, 1, 0x80000, 0xFFFFF, rng.getrandbits(20)):
        n = len(expected)
        lines += [f"lui t2, {value}", *store("t2"),
                  f"auipc{n}: auipc t2, {value}", f"la t3, auipc{n}", "sub t2, t2, t3", *store("t2")]
        expected += [value << 12, value << 12]
    # JAL and JALR link the next instruction's address; JALR clears bit 0 of its target
    lines += ["jal t2, 1f", "0: j 2f", "1: la t3, 0b", "sub t2, t2, t3", *store("t2"), "2:",
              "la t0, 3f", "addi t0, t0, 1", "jalr t2, -1(t0)", "4: nop", "3: la t3, 4b", "sub t2, t2, t3",
              *store("t2"),
              "la t0, 5f", "jalr t2, 1(t0)", "6: nop", "5: la t3, 6b", "sub t2, t2, t3", *store("t2")]
    expected += [0, 0, 0]
    # a call and a return through the stack
    lines += ["li a0, 20", "call double", "j 8f", "double: addi sp, sp, -16", "sw ra, 12(sp)",
              "slli a0, a0, 1", "lw ra, 12(sp)", "addi sp, sp, 16", "ret", "8:", *store("a0")]
    expected.append(40)
    out = run(assemble(tmp_path, lines, results_words=len(expected)))
    assert results(out, len(expected)) == expected


def test_loads_and_stores_of_every_width_and_offset(tmp_path) -> None:
    rng = random.Random(SEED + 2)
    memory = bytearray(rng.getrandbits(8) for _ in range(16))
    data = "buffer: .byte " + ", ".join(map(str, memory))
    lines, expected = ["la a1, buffer"], []
    ops = []
    for _ in range(24):
        width = rng.choice((1, 2, 4))
        offset = rng.randrange(0, 16 - width + 1, width)
        value = rng.getrandbits(32)
        ops.append(("store", width, offset, value))
        ops.append(("load", rng.choice((1, 2, 4)), None, None))
    for kind, width, offset, value in ops:
        if kind == "store":
            lines += [f"li t0, {value}", f"{ {1: 'sb', 2: 'sh', 4: 'sw'}[width]} t0, {offset}(a1)"]
            memory[offset:offset + width] = (value & ((1 << 8 * width) - 1)).to_bytes(width, "little")
            continue
        for load in {1: ("lb", "lbu"), 2: ("lh", "lhu"), 4: ("lw",)}[width]:
            for offset in range(0, 16, width):
                raw = int.from_bytes(memory[offset:offset + width], "little")
                if load in ("lb", "lh") and raw >> (8 * width - 1):
                    raw -= 1 << (8 * width)
                lines += [f"{load} t2, {offset}(a1)", *store("t2")]
                expected.append(raw & M32)
    out = run(assemble(tmp_path, lines, results_words=len(expected), data=data), max_cycles=200_000)
    assert results(out, len(expected)) == expected


C_PROGRAM = r"""
#include <stdint.h>
#define HALT ((volatile uint32_t *)0x80000000u)

/* a round half to even shift of a 64-bit value (as the SFU's requantize) */
static int64_t shift_even(int64_t x, int s) {
    if (s == 0) return x;
    int64_t q = x >> s, r = x & (((int64_t)1 << s) - 1), half = (int64_t)1 << (s - 1);
    return (r > half || (r == half && (q & 1))) ? q + 1 : q;
}

static const uint8_t sbox[16] = {7, 3, 14, 0, 9, 12, 1, 15, 4, 10, 6, 13, 2, 8, 11, 5};
static const int32_t inputs[N] = {INPUTS};
static const int32_t mults[N] = {MULTS};
uint32_t out[3 * N + 1];

static uint32_t crc32(const uint8_t *p, int n) {
    uint32_t c = 0xFFFFFFFFu;
    for (int i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & -(c & 1));
    }
    return ~c;
}

__attribute__((section(".text.start"), naked)) void _start(void) {
    __asm__ volatile("la sp, __stack_top\n call main\n 1: j 1b");
}

int main(void) {
    for (int i = 0; i < N; i++) {
        int64_t product = (int64_t)inputs[i] * mults[i];
        out[3 * i] = (uint32_t)shift_even(product, (i * 7) % 40);
        out[3 * i + 1] = (uint32_t)(product >> 32);
        out[3 * i + 2] = sbox[(uint32_t)inputs[i] & 15] ^ ((uint8_t)inputs[i] >> 4);
    }
    out[3 * N] = crc32((const uint8_t *)inputs, 4 * N);
    *HALT = (uint32_t)out;
    return 0;
}
"""


def _shift_even(x: int, s: int) -> int:
    if s == 0:
        return x
    q, r, half = x >> s, x & ((1 << s) - 1), 1 << (s - 1)
    return q + 1 if r > half or (r == half and q & 1) else q


def test_a_c_program_against_python(tmp_path) -> None:
    """clang's code: calls, the stack, 64-bit products and shifts, a table, byte loads, a CRC."""
    rng = random.Random(SEED + 3)
    n = 12
    inputs = [-(1 << 31), (1 << 31) - 1, 0, -1] + [rng.randrange(-(1 << 31), 1 << 31) for _ in range(n - 4)]
    mults = [(1 << 31) - 1, -(1 << 31), 5, 1] + [rng.randrange(-(1 << 31), 1 << 31) for _ in range(n - 4)]
    source = tmp_path / "prog.c"
    source.write_text(C_PROGRAM.replace("INPUTS", ", ".join(f"{v}" if v != -(1 << 31) else "INT32_MIN"
                                                           for v in inputs))
                      .replace("MULTS", ", ".join(f"{v}" if v != -(1 << 31) else "INT32_MIN" for v in mults)))
    image = build_firmware([source], ram_bytes=RAM_BYTES, defines={"N": n})
    out = run(image, max_cycles=400_000)
    sbox = [7, 3, 14, 0, 9, 12, 1, 15, 4, 10, 6, 13, 2, 8, 11, 5]
    expected = []
    for i, (x, mult) in enumerate(zip(inputs, mults, strict=True)):
        product = x * mult
        expected += [_shift_even(product, (i * 7) % 40) & M32, (product >> 32) & M32,
                     sbox[x & 15] ^ ((x & 0xFF) >> 4)]
    expected.append(zlib.crc32(b"".join((v & M32).to_bytes(4, "little") for v in inputs)))
    assert results(out, len(expected)) == expected


# each faulting instruction, at byte address 8 (after two NOPs)
FAULTS = {
    "ecall": "ecall", "ebreak": "ebreak", "all ones": ".word 0xffffffff", "zero word": ".word 0",
    "div": ".word 0x027342b3",      # div t0, t1, t2 (M, not Zmmul)
    "remu": ".word 0x027372b3",     # remu t0, t1, t2
    "fence.i": ".word 0x0000100f", "csrr": ".word 0xb00022f3",     # csrr t0, mcycle
    "misaligned lw": "lw t0, 1(zero)", "misaligned lh": "lh t0, 3(zero)", "misaligned sw": "sw t0, 2(zero)",
    "misaligned jalr": "jalr zero, 2(zero)",
    "misaligned branch": ".word 0x00000163",     # beq zero, zero, +2
}


def _after_two_nops(tmp_path: Path, lines: str, tail: str = "") -> bytes:
    """An image running ``lines`` at byte address 8 (after two NOPs), then storing to HALT, with
    ``tail`` (assembly) after that."""
    source = tmp_path / "fault.S"
    source.write_text(f"""
    .option norvc
    .section .text.start
    .globl _start
_start:
    nop
    nop
    {lines}
    li t0, {HALT}
    sw zero, 0(t0)
{tail}""")
    return build_firmware([source], ram_bytes=RAM_BYTES)


@pytest.mark.parametrize("name", FAULTS)
def test_faults_stop_the_core_at_the_instruction(tmp_path, name) -> None:
    out = run(_after_two_nops(tmp_path, FAULTS[name]), max_cycles=1000)
    assert out["fault"] and not out["halted"]
    assert out["fault_pc"] == 8


def test_a_slow_bus_changes_no_result(tmp_path) -> None:
    rng = random.Random(SEED + 4)
    lines, expected = [], []
    for op in ("add", "sub", "mulh", "sra", "sll", "sltu"):
        for x, y in rng.sample(_pairs(rng, 4), 4):
            lines += [f"li t0, {x}", f"li t1, {y}", f"{op} t2, t0, t1", *store("t2"), "lw t3, -4(s1)",
                      *store("t3")]
            expected += [REG_OPS[op](x, y) & M32] * 2
    image = assemble(tmp_path, lines, results_words=len(expected))
    fast = run(image)
    slow = run(image, delays=[rng.randrange(6) for _ in range(37)])
    assert results(slow, len(expected)) == results(fast, len(expected)) == expected
    assert slow["cycles"] > fast["cycles"]


def test_firmware_errors_name_the_problem(tmp_path) -> None:
    source = tmp_path / "bad.c"
    source.write_text("int f(int a, int b) { return a / b; }\nvoid _start(void) { f(1, 2); }\n")
    with pytest.raises(FirmwareError, match=r"(?s)bad\.c failed.*__divsi3"):
        build_firmware([source], ram_bytes=RAM_BYTES)
    with pytest.raises(FirmwareError, match=r"firmware source .*missing\.c does not exist"):
        build_firmware([tmp_path / "missing.c"], ram_bytes=RAM_BYTES)
    big = tmp_path / "big.S"
    big.write_text(".section .text.start\n.globl _start\n_start: .space 2000\n")
    with pytest.raises(FirmwareError, match=r"less than 256 bytes left for the stack|will not fit"):
        build_firmware([big], ram_bytes=2048)
    with pytest.raises(ValueError, match="ram_bytes must be a positive multiple of 4, not 1000001"):
        build_firmware([big], ram_bytes=1000001)


def test_reset_pc_must_be_an_aligned_address() -> None:
    with pytest.raises(ValueError, match=r"^reset_pc must be a 4-aligned address below 2\*\*pc_bits "
                                         r"\(0x100000000\), not 2$"):
        construct_rejected(lambda: CPU(reset_pc=2))
    with pytest.raises(ValueError, match=r"^reset_pc must be a 4-aligned address below 2\*\*pc_bits "
                                         r"\(0x1000\), not 4096$"):
        construct_rejected(lambda: CPU(reset_pc=4096, pc_bits=12))


@pytest.mark.parametrize("pc_bits", [2, 33, True, "16"])
def test_pc_bits_must_be_3_to_32(pc_bits) -> None:
    with pytest.raises(ValueError, match=rf"^pc_bits must be an integer between 3 and 32, not {pc_bits!r}$"):
        construct_rejected(lambda: CPU(pc_bits=pc_bits))


# a core with a 12-bit program counter (4 KiB of code) in the 32 KiB RAM: the instruction at
# "target" runs or faults there
NARROW_PC = {
    # a jump beyond the 4 KiB faults at the jump
    "jal beyond": ("jal zero, beyond", 8),
    "jalr beyond": ("li t0, 0x1000\n    jalr zero, 0(t0)", 12),
    "branch beyond": ("beq zero, zero, beyond", 8),
    # a NOP in the last word: the next instruction's address is beyond
    "last word": ("jal zero, last", 0xFFC),
}


@pytest.mark.parametrize("name", NARROW_PC)
def test_a_narrow_program_counter_faults_where_the_code_would_leave_it(tmp_path, name) -> None:
    jump, fault_pc = NARROW_PC[name]
    image = _after_two_nops(tmp_path, jump, f"""    .org 0xffc
last:
    nop
beyond:
    li t0, {HALT}
    sw zero, 0(t0)
""")
    out = run(image, max_cycles=1000, pc_bits=12)
    assert out["fault"] and not out["halted"]
    assert out["fault_pc"] == fault_pc


def test_a_narrow_program_counter_keeps_auipc_and_data_at_32_bits(tmp_path) -> None:
    """AUIPC adds the (zero-extended) program counter to a full 32-bit immediate; loads and stores
    reach beyond the code's 4 KiB; the code runs as on a 32-bit program counter."""
    lines = ["auipc t0, 0xfffff", *store("t0"), "li t1, 0x5000", "li t2, 0x12345678", "sw t2, 0(t1)",
             "lw t3, 0(t1)", *store("t3"), "li t1, 5", "li t2, -7", "mul t4, t1, t2", *store("t4")]
    image = assemble(tmp_path, lines, results_words=3)
    wide, narrow = run(image), run(image, pc_bits=12)
    got = results(narrow, 3)
    assert got == results(wide, 3)
    assert got[0] >> 12 == 0xFFFFF and 0 < got[0] & 0xFFF < 0x40       # the AUIPC's own address
    assert got[1:] == [0x12345678, -35 & M32]


def test_verilator_lint_is_clean() -> None:
    verilator_lint(to_verilog(CPU(), "cpu"), "cpu")


def test_ice40_synthesis_keeps_registers_in_block_ram_and_multiplies_without_dsps() -> None:
    """The register file is two SB_RAM40_4K (not 1024 flip-flops); the serial multiplier and
    shifter leave the SB_MAC16 to the array. The LUT4 count is reported by bench/, not checked."""
    result = synth(CPU(), "cpu", "ice40")
    assert result["brams"] == 2
    assert result["dsps"] == 0
    assert result["ffs"] < 300
