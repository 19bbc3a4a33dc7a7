"""Tests of the RTL runner (``sim/rtl.py``, ``sim/rtl_cocotb.py``, ``sim/hdl/sim_top.sv``).

The accelerator is not needed to test the runner's machinery: :class:`CopyEngine` is a stand-in
``systolic_top`` with the same ports and the real CSR block (``hw/csr.py``), whose behaviour is
trivial to predict. The runner builds ``sim_top`` around it, loads DRAM through the back door,
writes the CSRs, waits for irq or the watchdog, reads the counters and dumps DRAM, with each
memory model, one program per simulator process (``run``) or many (``run_many``, where a job that
hangs or fails is reported in its place and the next starts from reset). Argument errors are
checked before anything is built. Programs also run on the accelerator itself (the default 8x8
config): compared with the golden model with the fast memory and its random backpressure mode
always (one Verilator build, minutes the first time, cached after), with cocotbext-axi's AxiRam
(a second build) when ``SYSTOLIC_RTL_ACCELERATOR=1``; and programs that hang (the watchdog names
the pc, the last instruction dispatched and what the accelerator waits for), that are illegal,
or that meet bus errors stop with the error codes of ``hw/csr.py``. The catalogue of golden
programs and the random programs run on four configurations in test_rtl_programs.py and
test_rtl_fuzz.py.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from amaranth import Array, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from systolic.hw.config import AcceleratorConfig
from systolic.hw.csr import CSRBank
from systolic.hw.isa import INSTR_BYTES, Instruction, Opcode, Program, ProgramError
from systolic.hw.top import counter_increment_bits, top_ports
from systolic.sim import tools
from systolic.sim.golden import run_golden
from systolic.sim.programs import conv_case, gemm_case
from systolic.sim.rtl import (
    RTLDeviceError,
    RTLError,
    RTLJob,
    RTLRunner,
    RTLRunResult,
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
        m.submodules.csr = csr = CSRBank(cfg.hash, increment_bits={**counter_increment_bits(cfg), "macs": 32})
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
        # the counters count increments (CSRBank); done reaches the host once they settled
        finished = Signal()         # an instruction is done this cycle
        warm = Signal(2)            # the first two busy cycles add MACS_BASE to macs, 2**31 each
        m.d.comb += [csr.busy.eq(busy), csr.done.eq(done & csr.settled), csr.error.eq(error),
                     csr.pc.eq(pc), csr.error_pc.eq(pc), self.irq.eq(done & csr.settled),
                     csr.increment_cycles.eq(busy), csr.increment_instructions.eq(finished),
                     csr.increment_macs.eq(Mux(finished, 3, 0) + Mux(busy & (warm != 2), MACS_BASE >> 1, 0))]
        with m.If(busy & (warm != 2)):
            m.d.sync += warm.eq(warm + 1)

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

        start = Signal()            # like the accelerator, it takes start a cycle late (CSRBank)
        m.d.sync += start.eq(csr.start)
        with m.FSM():
            with m.State("IDLE"):
                with m.If(start):
                    m.d.sync += [pc.eq(0), busy.eq(1), done.eq(0), error.eq(0), warm.eq(0)]
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
                    m.d.comb += csr.increment_dram_read_bytes.eq(cfg.dma_bytes)
                    m.d.sync += [words[beat].eq(self.m_axi_rdata), beat.eq(beat + 1)]
                    with m.If(self.m_axi_rresp > resp):
                        m.d.sync += resp.eq(self.m_axi_rresp)
                    with m.If(self.m_axi_rlast):
                        m.d.sync += beat.eq(0)
                        m.next = "DECODE"
            with m.State("DECODE"):
                with m.If(resp != 0):
                    stop(resp)          # SLVERR 2 -> error 2, DECERR 3 -> error 3
                with m.Elif(opcode == Opcode.FINISH.value):
                    m.d.comb += finished.eq(1)
                    m.d.sync += [busy.eq(0), done.eq(1)]
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
                    m.d.comb += csr.increment_dram_write_bytes.eq(cfg.dma_bytes)
                    m.d.sync += beat.eq(beat + 1)
                    with m.If(beat == beats - 1):
                        m.next = "WRITE_RESPONSE"
            with m.State("WRITE_RESPONSE"):
                m.d.comb += self.m_axi_bready.eq(1)
                with m.If(self.m_axi_bvalid):
                    with m.If(self.m_axi_bresp != 0):
                        stop(self.m_axi_bresp)
                    with m.Else():
                        m.d.comb += finished.eq(1)
                        m.d.sync += pc.eq(pc + 1)
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


def _forget(error: BaseException) -> None:
    """Remove the files a failed run keeps for inspection (named at the end of its message)."""
    shutil.rmtree(Path(re.search(r"run files in (\S+)$", str(error)).group(1)))


def _forget_run_files(error: pytest.ExceptionInfo) -> None:
    _forget(error.value)


def _expected_copy(program: Program, image: np.ndarray, copied: int) -> np.ndarray:
    out = image.copy()
    words = np.frombuffer(program.words(), np.uint8)
    out[PROG_ADDR:PROG_ADDR + words.size] = words
    out[DRAM_BASE:DRAM_BASE + copied * INSTR_BYTES] = words[:copied * INSTR_BYTES]
    return out


# -- the runner on the stand-in ----------------------------------------------------------------

@pytest.mark.slow
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
                                              r"the last instruction dispatched is instruction 1: CONFIG; "
                                              r"no queue waits for a token or room; status 0x1; "
                                              r"run files in \S+$") as error:
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


# -- batches ------------------------------------------------------------------------------------

@pytest.mark.parametrize("memory", ["fast", "fast-random", "axi-random"])
def test_batch_reports_each_job_and_goes_on(copy_engine: str, memory: str) -> None:
    """Jobs that hang or fail are reported in their place; the jobs after them start from reset
    and give the results and cycle counts they give alone."""
    programs = [_program(["CONFIG"] * 3 + ["FINISH"], seed=10),
                _program(["CONFIG", "STORE", "FINISH"], seed=11),            # hangs
                _program(["CONFIG"] * 5 + ["SYNC", "FINISH"], seed=12),
                _program(["SYNC", "CONFIG", "LOAD", "FINISH"], seed=13),     # illegal at 2
                _program(["CONFIG"] * 2 + ["FINISH"], seed=14)]
    images = [_image(0x2000 - 0x200 * i, seed=20 + i) for i in range(len(programs))]
    jobs = [RTLJob(program, image, PROG_ADDR, 3000 if i == 1 else 20_000, DRAM_BASE + 64 * i)
            for i, (program, image) in enumerate(zip(programs, images, strict=True))]
    if memory != "axi-random":           # and one whose third word answers SLVERR
        lo = PROG_ADDR + 2 * INSTR_BYTES
        jobs.append(RTLJob(programs[2], images[2], PROG_ADDR, 20_000, DRAM_BASE, slverr=(lo, lo + 8)))
    runner = RTLRunner(CONFIG, memory=memory, seed=3, verilog=copy_engine)
    outcomes = runner.run_many(jobs)
    assert len(outcomes) == len(jobs)
    for i in (0, 2, 4):
        result = outcomes[i]
        assert isinstance(result, RTLRunResult), (i, result)
        copied = len(programs[i].instructions) - 1
        base = DRAM_BASE + 64 * i
        expected = images[i].copy()
        words = np.frombuffer(programs[i].words(), np.uint8)
        expected[PROG_ADDR:PROG_ADDR + words.size] = words
        expected[base:base + copied * INSTR_BYTES] = words[:copied * INSTR_BYTES]
        np.testing.assert_array_equal(result.dram, expected)
        assert result.instructions == copied + 1 and result.memory == memory
        assert result.dram_write_bytes == copied * INSTR_BYTES
    assert isinstance(outcomes[1], RTLTimeoutError)
    assert re.fullmatch(r"watchdog: the accelerator did not raise irq within 3000 cycles; the pc CSR "
                        r"reads 1 \(instruction 1: STORE\); the last instruction dispatched is "
                        r"instruction 0: CONFIG; no queue waits for a token or room; status 0x1; "
                        r"run files in \S+", str(outcomes[1]))
    assert isinstance(outcomes[3], RTLDeviceError)
    assert re.fullmatch(r"the accelerator stopped with error 1 \(illegal instruction \(bad opcode, "
                        r"reserved bits or a field out of range\)\) at instruction 2 \(instruction 2: "
                        r"LOAD\); run files in \S+", str(outcomes[3]))
    if memory != "axi-random":
        assert isinstance(outcomes[5], RTLDeviceError)
        assert str(outcomes[5]).startswith("the accelerator stopped with error 2 (AXI SLVERR on a DMA "
                                           "or fetch access) at instruction 2 (instruction 2: CONFIG)")
    for error in outcomes:
        if isinstance(error, RTLError):
            _forget(error)
    if memory == "fast":    # each job starts from reset: the same cycles as alone
        alone = runner.run(programs[2], images[2], prog_addr=PROG_ADDR, max_cycles=20_000,
                           dram_base=DRAM_BASE + 128)
        assert alone.cycles == outcomes[2].cycles and alone.counters == outcomes[2].counters


def test_run_many_of_nothing_builds_nothing() -> None:
    runner = _runner()
    assert runner.run_many([]) == []
    assert runner._build_dir is None


def test_run_many_argument_errors() -> None:
    runner = _runner()
    program = _program(["CONFIG", "FINISH"])
    good = RTLJob(program, _image(0x1000), PROG_ADDR, 100)
    with pytest.raises(TypeError, match=r"^jobs must be a sequence of RTLJob, not RTLJob$"):
        runner.run_many(good)
    with pytest.raises(TypeError, match=r"^jobs must be a sequence of RTLJob, not generator$"):
        runner.run_many(job for job in [good])
    with pytest.raises(TypeError, match=r"^jobs\[1\] must be an RTLJob, not dict$"):
        runner.run_many([good, {"program": program}])
    with pytest.raises(ValueError, match=r"^jobs\[2\]: prog_addr must be a multiple of 64 bytes "
                                         r"\(instruction words are aligned\), not 0x410$"):
        runner.run_many([good, good, RTLJob(program, _image(0x1000), 0x410, 100)])
    with pytest.raises(ValueError, match=r"^jobs\[0\]: max_cycles must be an integer between 1 and "
                                         r"4611686018427387904, not 0$"):
        runner.run_many([RTLJob(program, _image(0x1000), PROG_ADDR, 0)])
    with pytest.raises(TypeError, match=r"^jobs\[1\]: dram must be a 1-D numpy array of uint8, "
                                        r"not list$"):
        runner.run_many([good, RTLJob(program, [0] * 64, 0, 100)])
    assert runner._build_dir is None


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
        (("FINISH", image), ok, TypeError,
         r"^program must be a Program or instruction words \(bytes\), not str$"),
        ((b"\0" * 65, image), ok, ValueError,
         r"^program words must be a nonzero multiple of 64 bytes, not 65 bytes$"),
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


@pytest.mark.slow
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
    goldens = [run_golden(CONFIG, case.program, case.dram) for case in cases]
    # one case through run(), the rest as a batch
    first = runner.run(cases[0].program, cases[0].dram, prog_addr=cases[0].program_addr,
                       max_cycles=1_000_000)
    rest = runner.run_many([RTLJob(case.program, case.dram, case.program_addr, 1_000_000)
                            for case in cases[1:]])
    for case, golden, result in zip(cases, goldens, [first, *rest], strict=True):
        assert isinstance(result, RTLRunResult), result
        case.check(result.dram)
        np.testing.assert_array_equal(result.dram, golden.dram, err_msg=case.name)
        assert (result.macs, result.instructions) == (golden.macs, golden.instructions), case.name


# Programs that hang or fail on the accelerator (the default 8x8 config), run as one batch that
# ends with a good program: each job starts from reset, so the failures leave nothing behind.

def _words(instrs: list[Instruction]) -> bytes:
    return Program(tuple(instrs), CONFIG.hash).words()


def _sync(queue: str, **flags: int) -> Instruction:
    return Instruction("SYNC", queue=queue, **flags)


_SPAD_LOAD = dict(dst="spad", pitch_y=8, pitch_c=1, rows_outer=1, rows_inner=2, inner_dy=1, segs=1,
                  seg_len=8, elem_dc=1)
_ACC_LOAD = dict(dst="acc", pitch_y=32, pitch_c=4, rows_outer=1, rows_inner=2, inner_dy=1, segs=1,
                 seg_len=8, elem_dc=1)
_STORE = dict(n=8, in_h=2, in_w=1, out_h=2, out_w=1, pitch_y=8, pitch_c=1)
_IMAGE = 0x4000          # bytes of each failing job's DRAM image; its program words at PROG_ADDR


def _failing_image(nbytes: int = _IMAGE) -> np.ndarray:
    """Random bytes, but a zero requantize entry at 0xC00 (a table shift must be 0..62)."""
    image = _image(nbytes, seed=5)
    image[0xC00:0xC00 + 8 * CONFIG.requant_entry_bytes] = 0
    return image

FAILING = {
    # a SYNC waits for a token nobody sends; FINISH waits for it (the golden model: deadlock)
    "token": (_words([_sync("compute", pop_prev=1), Instruction("FINISH")]), {}),
    # the same, twenty times: the compute queue fills and the dispatcher waits for room
    "full queue": (_words([_sync("compute", pop_prev=1)] * 20 + [Instruction("FINISH")]), {}),
    # opcode 0
    "opcode": (_words([_sync("load")]) + bytes(INSTR_BYTES) + _words([Instruction("FINISH")]), {}),
    # a reserved bit of FINISH
    "reserved": (_words([_sync("load")])
                 + (1 << 500 | Opcode.FINISH.value).to_bytes(INSTR_BYTES, "little"), {}),
    # the load queue has no previous queue to pop from
    "flags": (_words([Instruction("LOAD", pop_prev=1, dram_addr=0x800, **_SPAD_LOAD),
                      Instruction("FINISH")]), {}),
    # no FINISH
    "no finish": (_words([_sync("compute")]), {}),
    # SLVERR on a LOAD's read (addresses are offsets from dram_base)
    "load slverr": (_words([_sync("load"), Instruction("LOAD", dram_addr=0x800, **_SPAD_LOAD),
                            Instruction("FINISH")]),
                    {"dram_base": 0x400, "slverr": (0xC08, 0xC10)}),
    # DECERR on a STORE's write past the image
    "store decerr": (_words([Instruction("LOAD", dram_addr=0x800, push_next=1, **_ACC_LOAD),
                             _sync("compute", pop_prev=1, push_next=1),
                             Instruction("STORE", out_type="raw", dram_addr=_IMAGE + 0x100,
                                         pop_prev=1, **{**_STORE, "pitch_y": 32, "pitch_c": 4}),
                             Instruction("FINISH")]), {}),
    # SLVERR on a STORE's residual read
    "residual slverr": (_words([Instruction("LOAD", dst="table", dram_addr=0xC00, pitch_c=12,
                                            rows_outer=1, rows_inner=1, segs=1, seg_len=8,
                                            elem_dc=1),
                                Instruction("LOAD", dram_addr=0x800, push_next=1, **_ACC_LOAD),
                                _sync("compute", pop_prev=1, push_next=1),
                                Instruction("STORE", dram_addr=0x1000, residual=1, res_addr=0x1800,
                                            pop_prev=1, **_STORE),
                                Instruction("FINISH")]),
                        {"slverr": (0x1808, 0x1810)}),
    # a COMPUTE whose accumulator rows run past the accumulator (the compute unit would hang)
    "compute rows": (_words([_sync("load"), Instruction("COMPUTE", m=4, k=2, n=2, preload=1,
                                                        acc_addr=CONFIG.acc_rows - 2),
                             Instruction("FINISH")]), {}),
    # a COMPUTE that reuses stationary weights no COMPUTE of the program preloaded
    "compute reuse": (_words([Instruction("COMPUTE", m=1, k=1, n=1), Instruction("FINISH")]), {}),
    # SLVERR on the fetch of instruction 2
    "fetch slverr": (_words([_sync("load")] * 4 + [Instruction("FINISH")]),
                     {"slverr": (PROG_ADDR + 2 * INSTR_BYTES + 8, PROG_ADDR + 2 * INSTR_BYTES + 16)}),
}


def failing_batch(config: AcceleratorConfig, watchdog: int, good_watchdog: int) -> dict[str, object]:
    """Outcome of each FAILING program on ``config`` (one batch, ``watchdog`` cycles each), and of
    a good GEMM after them ("good": outcome, its case, golden)."""
    image = _failing_image()
    jobs = [RTLJob(words, image, PROG_ADDR, watchdog, **options) for words, options in FAILING.values()]
    good = gemm_case(config, 9, 17, 3, seed=4)
    jobs.append(RTLJob(good.program, good.dram, good.program_addr, good_watchdog))
    outcomes = RTLRunner(config, seed=2).run_many(jobs)
    runs: dict[str, object] = dict(zip(FAILING, outcomes, strict=False))
    runs["good"] = (outcomes[-1], good, run_golden(config, good.program, good.dram))
    return runs


@pytest.fixture(scope="module")
def failing_runs() -> Iterator[dict[str, object]]:
    """Outcome of each FAILING program, and of a good GEMM after them ("good", its case, golden)."""
    runs = failing_batch(CONFIG, 5000, 200_000)
    yield runs
    for outcome in runs.values():
        if isinstance(outcome, RTLError):
            _forget(outcome)


def test_the_good_program_after_the_failures(failing_runs: dict[str, object]) -> None:
    result, case, golden = failing_runs["good"]
    assert isinstance(result, RTLRunResult), result
    case.check(result.dram)
    np.testing.assert_array_equal(result.dram, golden.dram)
    assert (result.macs, result.instructions) == (golden.macs, golden.instructions)


def test_watchdog_on_a_token_never_sent(failing_runs: dict[str, object]) -> None:
    words = FAILING["token"][0]
    with pytest.raises(ValueError, match=r"^instruction 0 \(SYNC\): deadlock, no queue can progress: "
                                         r".*compute queue: instruction 0 \(SYNC\) waits for a token "
                                         r"from the load queue"):
        run_golden(CONFIG, words, _failing_image())
    error = failing_runs["token"]
    assert isinstance(error, RTLTimeoutError), error
    assert re.fullmatch(r"watchdog: the accelerator did not raise irq within 5000 cycles; the pc CSR "
                        r"reads 2 \(past the program's 2 instructions\); the last instruction "
                        r"dispatched is instruction 1: FINISH; the compute queue waits for a token; "
                        r"status 0x1; run files in \S+", str(error)), str(error)


def test_watchdog_on_a_full_queue(failing_runs: dict[str, object]) -> None:
    words = FAILING["full queue"][0]
    with pytest.raises(ValueError, match=r"^instruction 0 \(SYNC\): deadlock, .*dispatcher: "
                                         r"instruction \d+ \(SYNC\) waits for room in the compute "
                                         r"queue"):
        run_golden(CONFIG, words, _failing_image())
    error = failing_runs["full queue"]
    assert isinstance(error, RTLTimeoutError), error
    match = re.fullmatch(r"watchdog: the accelerator did not raise irq within 5000 cycles; the pc CSR "
                         r"reads (\d+) \(instruction \1: SYNC\); the last instruction dispatched is "
                         r"instruction (\d+): SYNC; the compute queue waits for a token; the "
                         r"dispatcher waits for room in a queue; status 0x1; run files in \S+",
                         str(error))
    assert match, str(error)
    assert int(match.group(2)) == int(match.group(1)) - 1
    assert CONFIG.compute_queue_depth <= int(match.group(1)) < 20


ILLEGAL = r"1 \(illegal instruction \(bad opcode, reserved bits or a field out of range\)\)"


@pytest.mark.parametrize("name, golden, message", [
    ("opcode", r"^instruction 1 \(opcode 0\): field opcode: must be one of ",
     rf"error {ILLEGAL} at instruction 1 \(instruction 1: an illegal word, field opcode: illegal "
     rf"opcode 0\)"),
    ("reserved", r"^instruction 1 \(FINISH\): field _reserved: reserved bits must be zero$",
     rf"error {ILLEGAL} at instruction 1 \(instruction 1: an illegal word, FINISH field _reserved: "
     rf"reserved bits must be zero\)"),
    ("flags", r"^instruction 0 \(LOAD\): field pop_prev: ",
     r"error 4 \(illegal dependency flags for the instruction's queue\) at instruction 0 "
     r"\(instruction 0: LOAD\)"),
    ("no finish", r"^instruction 0 \(SYNC\): the program ends here without FINISH",
     r"error 5 \(the program ended \(prog_len instructions\) without FINISH\) at instruction 1 "
     r"\(past the program's 1 instructions\)"),
    ("compute rows", r"^instruction 1 \(COMPUTE\): field acc_addr: accumulator rows 510\.\.513 must lie ",
     rf"error {ILLEGAL} at instruction 1 \(instruction 1: COMPUTE\)"),
    ("compute reuse", r"^instruction 0 \(COMPUTE\): field preload: preload=0 reuses the stationary weights, "
                      r"but no COMPUTE with preload=1 has run yet$",
     rf"error {ILLEGAL} at instruction 0 \(instruction 0: COMPUTE\)"),
], ids=["opcode", "reserved", "flags", "no-finish", "compute-rows", "compute-reuse"])
def test_illegal_programs_stop_with_the_documented_error(failing_runs: dict[str, object], name: str,
                                                        golden: str, message: str) -> None:
    with pytest.raises(ValueError, match=golden):
        run_golden(CONFIG, FAILING[name][0], _failing_image())
    error = failing_runs[name]
    assert isinstance(error, RTLDeviceError), error
    assert re.fullmatch(rf"the accelerator stopped with {message}; run files in \S+", str(error)), \
        str(error)


@pytest.mark.parametrize("name, message", [
    ("load slverr", r"error 2 \(AXI SLVERR on a DMA or fetch access\) at instruction 1 \(instruction "
                    r"1: LOAD\)"),
    ("store decerr", r"error 3 \(AXI DECERR on a DMA or fetch access\) at instruction 2 "
                     r"\(instruction 2: STORE\)"),
    ("residual slverr", r"error 2 \(AXI SLVERR on a DMA or fetch access\) at instruction 3 "
                        r"\(instruction 3: STORE\)"),
    ("fetch slverr", r"error 2 \(AXI SLVERR on a DMA or fetch access\) at instruction 2 "
                     r"\(instruction 2: SYNC\)"),
], ids=["load-slverr", "store-decerr", "residual-slverr", "fetch-slverr"])
def test_bus_errors_stop_with_the_documented_error(failing_runs: dict[str, object], name: str,
                                                   message: str) -> None:
    words, options = FAILING[name]
    # valid programs: the golden model (which has no bus errors) runs them
    run_golden(CONFIG, words, _failing_image(_IMAGE if name != "store decerr" else 2 * _IMAGE))
    error = failing_runs[name]
    assert isinstance(error, RTLDeviceError), error
    assert re.fullmatch(rf"the accelerator stopped with {message}; run files in \S+", str(error)), \
        str(error)
