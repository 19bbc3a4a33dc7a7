"""Tests of the RTL runner (``sim/rtl.py``, ``sim/rtl_cocotb.py``, ``sim/hdl/sim_top.sv``).

The accelerator is not needed to test the runner's machinery: :class:`CopyEngine` is a stand-in
``systolic_top`` with the same ports and the real CSR block (``hw/csr.py``), whose behaviour is
trivial to predict. The runner builds ``sim_top`` around it, loads DRAM through the back door,
writes the CSRs, waits for irq or the watchdog, reads the counters and dumps DRAM, with each
memory model. Argument errors are checked before anything is built. Programs also run on the
accelerator itself and are compared with the golden model: with the fast memory and its random
backpressure mode always (one Verilator build, a few minutes the first time, cached after), with
cocotbext-axi's AxiRam (a second build) when ``SYSTOLIC_RTL_ACCELERATOR=1``.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from amaranth import Array, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from systolic.hw.config import AcceleratorConfig
from systolic.hw.csr import CSRBank
from systolic.hw.isa import INSTR_BYTES, Instruction, Opcode, Program, ProgramError
from systolic.hw.top import top_ports
from systolic.sim import tools
from systolic.sim.golden import run_golden
from systolic.sim.programs import conv_case, gemm_case
from systolic.sim.rtl import (
    RTLDeviceError,
    RTLError,
    RTLRunner,
    RTLTimeoutError,
    read_memh,
    write_memh,
)

CONFIG = AcceleratorConfig()
MACS_BASE = 1 << 32            # CopyEngine's macs counter starts here: a nonzero high word


class CopyEngine(wiring.Component):
    """A stand-in for ``systolic_top`` to test the runner with; NOT the accelerator.

    It has systolic_top's ports and its CSR block. On start it walks the program: it reads each
    64-byte word at ``prog_addr + 64 * pc`` in one AXI4 burst, then by opcode:

    * FINISH: done (irq high);
    * LOAD: stops with error 1 (illegal instruction) at this pc;
    * STORE: stops without ever finishing (for the watchdog);
    * any other: writes the word to ``dram_base + 64 * pc`` in one burst and goes on.

    A read or write response other than OKAY stops it with error 2 (SLVERR) or 3 (DECERR); the
    end of the program without FINISH stops it with error 5. Counters: ``cycles`` (cycles
    busy), ``instructions`` (words done, FINISH included), ``dram_read_bytes`` and
    ``dram_write_bytes`` (bus beats times their width), ``macs`` = 2**32 + 3 * instructions.
    """

    def __init__(self, config: AcceleratorConfig) -> None:
        self.config = config
        # systolic_top's ports, from the accelerator's own list
        ports = {name: (Out if direction == "out" else In)(width)
                 for name, (direction, width) in top_ports(config).items()}
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        beats = INSTR_BYTES // cfg.dma_bytes
        m.submodules.csr = csr = CSRBank(cfg.hash)
        bus = csr.bus
        m.d.comb += [
            bus.aw.valid.eq(self.s_axil_awvalid), self.s_axil_awready.eq(bus.aw.ready),
            bus.aw.payload.addr.eq(self.s_axil_awaddr),
            bus.w.valid.eq(self.s_axil_wvalid), self.s_axil_wready.eq(bus.w.ready),
            bus.w.payload.data.eq(self.s_axil_wdata), bus.w.payload.strb.eq(self.s_axil_wstrb),
            self.s_axil_bvalid.eq(bus.b.valid), bus.b.ready.eq(self.s_axil_bready),
            self.s_axil_bresp.eq(bus.b.payload.resp),
            bus.ar.valid.eq(self.s_axil_arvalid), self.s_axil_arready.eq(bus.ar.ready),
            bus.ar.payload.addr.eq(self.s_axil_araddr),
            self.s_axil_rvalid.eq(bus.r.valid), bus.r.ready.eq(self.s_axil_rready),
            self.s_axil_rdata.eq(bus.r.payload.data), self.s_axil_rresp.eq(bus.r.payload.resp),
        ]

        pc = Signal(32)
        busy = Signal()
        done = Signal()
        error = Signal(4)
        beat = Signal(range(beats))
        words = Array(Signal(cfg.dma_data_bits, name=f"word{i}") for i in range(beats))
        resp = Signal(2)            # worst response of the current burst
        counters = {name: Signal(64, name=f"count_{name}") for name in
                    ("cycles", "instructions", "dram_read_bytes", "dram_write_bytes")}
        m.d.comb += [csr.busy.eq(busy), csr.done.eq(done), csr.error.eq(error), csr.pc.eq(pc),
                     csr.error_pc.eq(pc), self.irq.eq(done)]
        for name, signal in counters.items():
            m.d.comb += getattr(csr, f"counter_{name}").eq(signal)
        m.d.comb += csr.counter_macs.eq(MACS_BASE + 3 * counters["instructions"])
        with m.If(busy):
            m.d.sync += counters["cycles"].eq(counters["cycles"] + 1)

        size = (cfg.dma_bytes - 1).bit_length()
        m.d.comb += [self.m_axi_araddr.eq(csr.prog_addr + pc * INSTR_BYTES), self.m_axi_arlen.eq(beats - 1),
                     self.m_axi_arsize.eq(size), self.m_axi_arburst.eq(1),
                     self.m_axi_awaddr.eq(csr.dram_base + pc * INSTR_BYTES), self.m_axi_awlen.eq(beats - 1),
                     self.m_axi_awsize.eq(size), self.m_axi_awburst.eq(1),
                     self.m_axi_wdata.eq(words[beat]), self.m_axi_wstrb.eq(-1),
                     self.m_axi_wlast.eq(beat == beats - 1)]
        opcode = words[0][:4]

        def stop(code):
            m.d.sync += [busy.eq(0), error.eq(code)]
            m.next = "IDLE"

        with m.FSM():
            with m.State("IDLE"):
                with m.If(csr.start):
                    m.d.sync += [pc.eq(0), busy.eq(1), done.eq(0), error.eq(0)]
                    for signal in counters.values():
                        m.d.sync += signal.eq(0)
                    m.next = "READ_ADDR"
            with m.State("READ_ADDR"):
                with m.If(pc == csr.prog_len):
                    stop(5)
                with m.Else():
                    m.d.comb += self.m_axi_arvalid.eq(1)
                    with m.If(self.m_axi_arready):
                        m.d.sync += [beat.eq(0), resp.eq(0)]
                        m.next = "READ_DATA"
            with m.State("READ_DATA"):
                m.d.comb += self.m_axi_rready.eq(1)
                with m.If(self.m_axi_rvalid):
                    read = counters["dram_read_bytes"]
                    m.d.sync += [words[beat].eq(self.m_axi_rdata), beat.eq(beat + 1),
                                 read.eq(read + cfg.dma_bytes)]
                    with m.If(self.m_axi_rresp > resp):
                        m.d.sync += resp.eq(self.m_axi_rresp)
                    with m.If(self.m_axi_rlast):
                        m.d.sync += beat.eq(0)
                        m.next = "DECODE"
            with m.State("DECODE"):
                with m.If(resp != 0):
                    stop(resp)          # SLVERR 2 -> error 2, DECERR 3 -> error 3
                with m.Elif(opcode == Opcode.FINISH.value):
                    m.d.sync += [busy.eq(0), done.eq(1),
                                 counters["instructions"].eq(counters["instructions"] + 1)]
                    m.next = "IDLE"
                with m.Elif(opcode == Opcode.LOAD.value):
                    stop(1)
                with m.Elif(opcode == Opcode.STORE.value):
                    m.next = "HANG"
                with m.Else():
                    m.next = "WRITE_ADDR"
            with m.State("WRITE_ADDR"):
                m.d.comb += self.m_axi_awvalid.eq(1)
                with m.If(self.m_axi_awready):
                    m.next = "WRITE_DATA"
            with m.State("WRITE_DATA"):
                m.d.comb += self.m_axi_wvalid.eq(1)
                with m.If(self.m_axi_wready):
                    written = counters["dram_write_bytes"]
                    m.d.sync += [beat.eq(beat + 1), written.eq(written + cfg.dma_bytes)]
                    with m.If(beat == beats - 1):
                        m.next = "WRITE_RESPONSE"
            with m.State("WRITE_RESPONSE"):
                m.d.comb += self.m_axi_bready.eq(1)
                with m.If(self.m_axi_bvalid):
                    with m.If(self.m_axi_bresp != 0):
                        stop(self.m_axi_bresp)
                    with m.Else():
                        m.d.sync += [pc.eq(pc + 1),
                                     counters["instructions"].eq(counters["instructions"] + 1)]
                        m.next = "READ_ADDR"
            with m.State("HANG"):
                pass
        return m


@pytest.fixture(scope="module")
def copy_engine() -> str:
    return tools.to_verilog(CopyEngine(CONFIG), "systolic_top")


def _program(ops: list[str], seed: int = 0) -> Program:
    """Instructions named by ``ops``; CONFIGs get random fields so that every word differs."""
    rng = random.Random(seed)
    instrs = []
    for op in ops:
        if op == "CONFIG":
            instrs.append(Instruction("CONFIG", zp_out=rng.randint(-32768, 32767),
                                      act_hi=rng.randint(-32768, 32767),
                                      avg_mult=rng.randint(-(1 << 31), (1 << 31) - 1),
                                      res_mult=rng.randint(-(1 << 31), (1 << 31) - 1)))
        else:
            instrs.append(Instruction(op))
    return Program(tuple(instrs), CONFIG.hash)


PROG_ADDR = 0x400
DRAM_BASE = 0x1000


def _image(nbytes: int = 0x2000, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


def _forget_run_files(error: pytest.ExceptionInfo) -> None:
    """Remove the files a failed run keeps for inspection (named at the end of its message)."""
    job_dir = Path(re.search(r"run files in (\S+)$", str(error.value)).group(1))
    shutil.rmtree(job_dir)


def _expected_copy(program: Program, image: np.ndarray, copied: int) -> np.ndarray:
    out = image.copy()
    words = np.frombuffer(program.words(), np.uint8)
    out[PROG_ADDR:PROG_ADDR + words.size] = words
    out[DRAM_BASE:DRAM_BASE + copied * INSTR_BYTES] = words[:copied * INSTR_BYTES]
    return out


# -- the runner on the stand-in ----------------------------------------------------------------

@pytest.mark.parametrize("memory", ["fast", "fast-random", "axi-random"])
def test_copy_program(copy_engine: str, memory: str) -> None:
    program = _program(["CONFIG"] * 9 + ["SYNC", "FINISH"], seed=1)
    image = _image(seed=2)
    result = RTLRunner(CONFIG, memory=memory, seed=5, verilog=copy_engine).run(
        program, image, prog_addr=PROG_ADDR, max_cycles=20_000, dram_base=DRAM_BASE)
    copied = len(program.instructions) - 1
    np.testing.assert_array_equal(result.dram, _expected_copy(program, image, copied))
    assert result.instructions == copied + 1
    assert result.dram_read_bytes == (copied + 1) * INSTR_BYTES
    assert result.dram_write_bytes == copied * INSTR_BYTES
    assert result.macs == MACS_BASE + 3 * (copied + 1)
    assert result.counters["macs"] == result.macs
    assert result.busy == {"load": 0, "compute": 0, "store": 0}
    assert result.timings == [] and result.memory == memory
    assert result.peak_macs_per_cycle == CONFIG.rows * CONFIG.cols
    # each word costs at least the read latency plus its read and write bursts
    beats = INSTR_BYTES // CONFIG.dma_bytes
    assert result.cycles > (copied + 1) * (CONFIG.dram_latency + beats) + copied * beats
    assert abs(result.sim_cycles - result.cycles) <= 64     # sim_top's count of the same run
    assert result.wall_seconds > 0


def test_random_memory_costs_cycles(copy_engine: str) -> None:
    program = _program(["CONFIG"] * 6 + ["FINISH"], seed=3)
    image = _image(seed=4)
    fast, slow = (RTLRunner(CONFIG, memory=memory, seed=9, verilog=copy_engine).run(
        program, image, prog_addr=PROG_ADDR, max_cycles=20_000, dram_base=DRAM_BASE)
        for memory in ("fast", "fast-random"))
    np.testing.assert_array_equal(fast.dram, slow.dram)
    assert slow.cycles > fast.cycles


def test_watchdog_names_the_pc(copy_engine: str) -> None:
    program = _program(["CONFIG", "CONFIG", "STORE", "FINISH"])
    runner = RTLRunner(CONFIG, verilog=copy_engine)
    with pytest.raises(RTLTimeoutError, match=r"^watchdog: the accelerator did not raise irq within "
                                              r"3000 cycles; the pc CSR reads 2 \(instruction 2: STORE\); "
                                              r"status 0x1; run files in \S+$") as error:
        runner.run(program, _image(), prog_addr=PROG_ADDR, max_cycles=3000, dram_base=DRAM_BASE)
    _forget_run_files(error)


def test_device_error_names_the_instruction(copy_engine: str) -> None:
    program = _program(["CONFIG", "LOAD", "FINISH"])
    runner = RTLRunner(CONFIG, verilog=copy_engine)
    with pytest.raises(RTLDeviceError, match=r"^the accelerator stopped with error 1 \(illegal "
                                             r"instruction \(bad opcode, reserved bits or a field out of "
                                             r"range\)\) at instruction 1 \(instruction 1: LOAD\); "
                                             r"run files in \S+$") as error:
        runner.run(program, _image(), prog_addr=PROG_ADDR, max_cycles=20_000, dram_base=DRAM_BASE)
    _forget_run_files(error)


def test_slverr_injection(copy_engine: str) -> None:
    program = _program(["CONFIG"] * 4 + ["FINISH"])
    runner = RTLRunner(CONFIG, verilog=copy_engine)
    # the third word's second bus word answers SLVERR
    lo = PROG_ADDR + 2 * INSTR_BYTES + CONFIG.dma_bytes
    with pytest.raises(RTLDeviceError, match=r"^the accelerator stopped with error 2 \(AXI SLVERR on a "
                                             r"DMA or fetch access\) at instruction 2 \(instruction 2: "
                                             r"CONFIG\); run files in \S+$") as error:
        runner.run(program, _image(), prog_addr=PROG_ADDR, max_cycles=20_000, dram_base=DRAM_BASE,
                   slverr=(lo, lo + 1))
    _forget_run_files(error)


def test_access_past_the_image_is_decerr(copy_engine: str) -> None:
    program = _program(["CONFIG", "FINISH"])
    runner = RTLRunner(CONFIG, verilog=copy_engine)
    image = _image(0x1000 + 8)          # the first copied word would start at 0x1000: past the end
    with pytest.raises(RTLDeviceError, match=r"^the accelerator stopped with error 3 \(AXI DECERR on a "
                                             r"DMA or fetch access\) at instruction 0 \(instruction 0: "
                                             r"CONFIG\); run files in \S+$") as error:
        runner.run(program, image, prog_addr=PROG_ADDR, max_cycles=20_000, dram_base=0x1010)
    _forget_run_files(error)


def test_program_without_finish(copy_engine: str) -> None:
    program = _program(["CONFIG", "SYNC"])
    runner = RTLRunner(CONFIG, verilog=copy_engine)
    with pytest.raises(RTLDeviceError, match=r"^the accelerator stopped with error 5 \(the program ended "
                                             r"\(prog_len instructions\) without FINISH\) at instruction 2 "
                                             r"\(past the program's 2 instructions\); run files in "
                                             r"\S+$") as error:
        runner.run(program, _image(), prog_addr=PROG_ADDR, max_cycles=20_000, dram_base=DRAM_BASE)
    _forget_run_files(error)


def test_build_is_cached(copy_engine: str) -> None:
    first = RTLRunner(CONFIG, verilog=copy_engine).build()
    stamp = (first / "build.ok").stat().st_mtime_ns
    second = RTLRunner(CONFIG, memory="fast-random", seed=3, verilog=copy_engine).build()
    assert second == first and (second / "build.ok").stat().st_mtime_ns == stamp
    # the external-memory variant is another build (made by test_copy_program)
    external = RTLRunner(CONFIG, memory="axi-random", verilog=copy_engine).build()
    assert external != first and external.parent == first.parent


# -- argument errors (nothing is built) ---------------------------------------------------------

def _runner() -> RTLRunner:
    return RTLRunner(CONFIG, verilog="module systolic_top; endmodule")


@pytest.mark.parametrize("kwargs, error, message", [
    ({"memory": "slow"}, ValueError, r"^memory must be one of 'fast', 'fast-random', 'axi-random', "
                                     r"not 'slow'$"),
    ({"seed": -1}, ValueError, r"^seed must be an integer between 0 and 2\*\*63 - 1, not -1$"),
    ({"seed": 1.5}, ValueError, r"^seed must be an integer between 0 and 2\*\*63 - 1, not 1\.5$"),
    ({"waves": 1}, TypeError, r"^waves must be a bool, not 1$"),
    ({"dram_bytes": 3 << 20}, ValueError, r"^dram_bytes must be a power of two between 65536 and "
                                          r"1073741824, not 3145728$"),
    ({"dram_bytes": 1 << 12}, ValueError, r"^dram_bytes must be a power of two between 65536 and "
                                          r"1073741824, not 4096$"),
    ({"verilog": b"module"}, TypeError, r"^verilog must be Verilog text or None, not bytes$"),
])
def test_runner_argument_errors(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        RTLRunner(CONFIG, **kwargs)


def test_runner_config_type() -> None:
    with pytest.raises(TypeError, match=r"^config must be an AcceleratorConfig, not dict$"):
        RTLRunner({"rows": 8})


def test_run_argument_errors() -> None:
    runner = _runner()
    program = _program(["CONFIG", "FINISH"])
    image = _image(0x1000)
    ok = {"prog_addr": PROG_ADDR, "max_cycles": 100}
    cases = [
        ((b"\0" * 64, image), ok, TypeError, r"^program must be a Program, not bytes$"),
        ((program, image.astype(np.int8)), ok, TypeError,
         r"^dram must be a 1-D numpy array of uint8, not ndarray of int8 with shape \(4096,\)$"),
        ((program, list(image)), ok, TypeError, r"^dram must be a 1-D numpy array of uint8, not list$"),
        ((program, np.zeros(0, np.uint8)), ok, ValueError,
         r"^dram must hold between 1 and 16777216 bytes \(the simulated DRAM, RTLRunner dram_bytes\), "
         r"not 0$"),
        ((program, np.zeros((1 << 24) + 1, np.uint8)), ok, ValueError,
         r"^dram must hold between 1 and 16777216 bytes \(the simulated DRAM, RTLRunner dram_bytes\), "
         r"not 16777217$"),
        ((program, image), {**ok, "prog_addr": 0x410}, ValueError,
         r"^prog_addr must be a multiple of 64 bytes \(instruction words are aligned\), not 0x410$"),
        ((program, image), {**ok, "prog_addr": -64}, ValueError,
         r"^prog_addr must be an integer between 0 and 4294967295, not -64$"),
        ((program, image), {**ok, "prog_addr": 0xFC0}, ValueError,
         r"^prog_addr: the program's 128 bytes at 0xfc0 must fit in the 4096-byte DRAM image, but end "
         r"at 0x1040$"),
        ((program, image), {**ok, "max_cycles": 0}, ValueError,
         r"^max_cycles must be an integer between 1 and 4611686018427387904, not 0$"),
        ((program, image), {**ok, "dram_base": 1 << 32}, ValueError,
         r"^dram_base must be an integer between 0 and 4294967295, not 4294967296$"),
        ((program, image), {**ok, "slverr": (10, 5)}, ValueError,
         r"^slverr must be a pair \(lo, hi\) of byte addresses with 0 <= lo <= hi <= 2\*\*32, "
         r"not \(10, 5\)$"),
    ]
    for args, kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            runner.run(*args, **kwargs)
    with pytest.raises(ValueError, match=r"^slverr needs a fast memory model \('fast' or "
                                         r"'fast-random'\), not 'axi-random'$"):
        RTLRunner(CONFIG, memory="axi-random", verilog="").run(program, image, slverr=(0, 64), **ok)
    other = Program(program.instructions, CONFIG.replace(rows=4).hash)
    with pytest.raises(ProgramError, match=r"^program was built for config [0-9a-f]{16}, but the "
                                           r"accelerator's config is [0-9a-f]{16}; recompile"):
        runner.run(other, image, **ok)
    assert runner._build_dir is None


def test_rtl_errors_are_value_errors() -> None:
    assert issubclass(RTLTimeoutError, RTLError) and issubclass(RTLDeviceError, RTLError)
    assert issubclass(RTLError, ValueError)


# -- memory files ------------------------------------------------------------------------------

@pytest.mark.parametrize("word_bytes", [4, 8, 16])
@pytest.mark.parametrize("nbytes", [1, 15, 16, 1000])
def test_memh_round_trip(tmp_path: Path, word_bytes: int, nbytes: int) -> None:
    data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    data[:1] = 0xFF
    path = tmp_path / "mem.hex"
    write_memh(path, data, word_bytes)
    lines = path.read_text().splitlines()
    assert len(lines) == -(-nbytes // word_bytes)
    assert all(re.fullmatch(f"[0-9a-f]{{{2 * word_bytes}}}", line) for line in lines)
    # byte 0 is the least significant byte of word 0: the last two digits of line 0
    assert lines[0][-2:] == "ff"
    np.testing.assert_array_equal(read_memh(path, word_bytes, nbytes), data)
    padded = read_memh(path, word_bytes, len(lines) * word_bytes)
    assert not padded[nbytes:].any()


def test_read_memh_accepts_comments_and_short_words(tmp_path: Path) -> None:
    path = tmp_path / "mem.hex"
    path.write_text("// written by a simulator\n0102030405060708\n\nA  // short: zero-extended\n")
    np.testing.assert_array_equal(read_memh(path, 8, 9), [8, 7, 6, 5, 4, 3, 2, 1, 0x0A])


@pytest.mark.parametrize("text, message", [
    ("@10\n00\n", r"^\S+mem\.hex:1: a memory line must be one word of at most 8 hex digits, not '@10'$"),
    ("00\n112233445\n", r"^\S+mem\.hex:2: a memory line must be one word of at most 8 hex digits, "
                        r"not '112233445'$"),
    ("0000000g\n", r"^\S+mem\.hex: memory words must be hex digits$"),
    ("00000000\n", r"^\S+mem\.hex: the file must hold at least 5 bytes, not 4$"),
])
def test_read_memh_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "mem.hex"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        read_memh(path, 4, 5)


def test_memh_word_size_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^word_bytes must be 4, 8 or 16, not 3$"):
        write_memh(tmp_path / "x.hex", b"abc", 3)
    with pytest.raises(ValueError, match=r"^word_bytes must be 4, 8 or 16, not 2$"):
        read_memh(tmp_path / "x.hex", 2, 1)


# -- the accelerator itself ------------------------------------------------------------------------

AXI_RANDOM = os.environ.get("SYSTOLIC_RTL_ACCELERATOR", "0") not in ("", "0")


@pytest.mark.parametrize("memory", [
    "fast", "fast-random",
    pytest.param("axi-random", marks=pytest.mark.skipif(
        not AXI_RANDOM, reason="set SYSTOLIC_RTL_ACCELERATOR=1 for the cocotbext-axi AxiRam build "
                               "(a second accelerator build of minutes)")),
])
def test_accelerator_matches_golden(memory: str) -> None:
    runner = RTLRunner(CONFIG, memory=memory, seed=11)
    cases = [gemm_case(CONFIG, 20, 12, 10, seed=1), gemm_case(CONFIG, 9, 17, 3, extremes=True)]
    if memory != "axi-random":          # Python per bus beat there: keep it short
        cases += [gemm_case(CONFIG, 40, 24, 20, seed=2, act="relu"),
                  conv_case(CONFIG, 6, 5, 3, 10, 3, 3, stride=2, pad=1, seed=3)]
    for case in cases:
        golden = run_golden(CONFIG, case.program, case.dram)
        result = runner.run(case.program, case.dram, prog_addr=case.program_addr, max_cycles=1_000_000)
        case.check(result.dram)
        np.testing.assert_array_equal(result.dram, golden.dram, err_msg=case.name)
        assert (result.macs, result.instructions) == (golden.macs, golden.instructions), case.name
