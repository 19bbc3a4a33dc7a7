"""The RTL runner: runs a program on the accelerator's generated Verilog in Verilator, through cocotb.

:class:`RTLRunner` builds ``sim_top`` (``sim/hdl/sim_top.sv``: the accelerator ``systolic_top``,
the DRAM model ``sim/hdl/axi_ram.sv``, a clock and reset generated inside the HDL) once per
configuration and design. :meth:`RTLRunner.run_many` runs a batch of jobs (:class:`RTLJob`) in
one simulator process; for each job it restarts the core from reset, loads the DRAM image through
the RAM's back door, writes the CSRs (``prog_addr``, ``prog_len``, ``dram_base``, then
``ctrl.start``), sleeps until ``irq`` or the job's cycle watchdog, reads ``status`` and the
performance counters and dumps DRAM. Each job gives a :class:`RTLRunResult` (a
:class:`systolic.sim.golden.RunResult` plus every counter) or, when the accelerator hung or
reported an error, an :class:`RTLError` in its place: one failed job does not stop the batch.
:meth:`RTLRunner.run` is a batch of one that raises the error. Starting the simulator costs a
second or more, so many short programs are much cheaper as one batch.

Memory models (``memory=``):

* ``"fast"``: ``axi_ram`` with a fixed read latency of ``config.dram_latency`` cycles; Verilator
  runs the cycles itself and no Python runs per bus beat.
* ``"fast-random"``: the same RAM with pseudo-random backpressure and extra read latency (seeded).
* ``"axi-random"``: cocotbext-axi's ``AxiRam`` on the accelerator's AXI4 port with random pauses
  on every channel (seeded): slow (Python per beat), for protocol robustness.

The pytest side and the cocotb side (:mod:`systolic.sim.rtl_cocotb`) exchange files under the
build directory: a batch file listing the jobs, and per job a directory with ``job.json`` and
``dram.bin`` in, ``result.json`` and ``dram_out.bin`` out (kept when the job fails). Builds are
cached by :func:`systolic.sim.tools.cocotb_build` per config hash and design hash; the Verilog of
``systolic_top`` is cached per config and hw/ source hash.

Units: addresses and sizes in bytes, time in clock cycles unless named otherwise.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from systolic.hw.config import AcceleratorConfig
from systolic.hw.isa import INSTR_BYTES, IsaError, Opcode, Program, decode
from systolic.sim import tools
from systolic.sim.golden import QUEUE_NAMES, RunResult
from systolic.sim.rtl_cocotb import JOB_ENV, read_memh, write_memh

__all__ = [
    "RTLRunner", "RTLJob", "RTLRunResult", "RTLError", "RTLTimeoutError", "RTLDeviceError",
    "MEMORY_MODELS", "DEFAULT_DRAM_BYTES", "MAX_DRAM_BYTES", "HDL_DIR", "SIM_TOP", "ACCELERATOR_TOP",
    "JOB_ENV", "CLOCK_PERIOD_NS", "SIM_BUILD_ARGS",
    "hdl_source", "write_memh", "read_memh", "accelerator_verilog", "compute_clock_wrapper",
    "compute_half_period_ps", "COMPUTE_CLOCK_FIRST_EDGE_PS",
    "sim_top_verilog", "build_sim_top",
]

#: DRAM models of :class:`RTLRunner` (see the module docstring).
MEMORY_MODELS = ("fast", "fast-random", "axi-random")

#: Capacity of the simulated DRAM unless given, bytes. Only the image's bytes are loaded and dumped.
DEFAULT_DRAM_BYTES = 1 << 24
#: Largest simulated DRAM, bytes (the model holds it in the simulator's memory).
MAX_DRAM_BYTES = 1 << 30

#: Folder of the SystemVerilog sources of the simulation top and the DRAM model.
HDL_DIR = Path(__file__).resolve().parent / "hdl"
SIM_TOP = "sim_top"
ACCELERATOR_TOP = "systolic_top"

#: Clock period of sim_top (2 x HALF_PERIOD_NS), ns.
CLOCK_PERIOD_NS = 10

#: Verilator arguments of the sim_top build:
#:
#: * ``--timing``: Verilator schedules sim_top's ``#`` delays (the clock) itself; its coroutines
#:   need C++20 (the PyPI wheel's verilated.mk leaves the coroutine and language flags empty, and
#:   the compiler's default C++17 fails).
#: * ``--no-public-flat-rw --public-depth 1``: undo the cocotb runner's ``--public-flat-rw``, which
#:   keeps every signal of the design visible and unoptimized, and make only sim_top's signals
#:   visible: its ports, all cocotb touches (sim_top wraps sim_core, because Verilator
#:   re-evaluates the logic fed by any visible signal at every time step). Measured on the 8x8
#:   default config: 2.5x the cycles per second and half the build time.
#: * ``-CFLAGS -O2``: the C++ compiler's -O2 instead of verilated.mk's -Os: 1.45x the cycles per
#:   second on the 8x8 default config, for about the same build time.
SIM_BUILD_ARGS: tuple[str, ...] = ("--timing", "-CFLAGS", "-std=gnu++20",
                                   "--no-public-flat-rw", "--public-depth", "1", "-CFLAGS", "-O2")

# Read bursts and write bursts the simulated DRAM queues: at least what the accelerator can
# have in flight (dma_outstanding <= 16), so that the model never limits it.
_DRAM_QUEUE = 16
# Cycles between two status polls while waiting for irq (the error path may not raise irq).
_POLL_CYCLES = 1 << 14


class RTLError(ValueError):
    """An RTL run did not complete: the message names the cause and the instruction."""


class RTLTimeoutError(RTLError):
    """The watchdog expired before the accelerator raised irq; the message names the program
    counter read from the ``pc`` CSR (the next instruction to dispatch), the last instruction
    dispatched and what the accelerator waits for (the stall counters that still grow)."""


class RTLDeviceError(RTLError):
    """The accelerator stopped with an error code in ``status``; the message names the code and
    the instruction (``error_pc``)."""


@dataclass(frozen=True, eq=False)
class RTLJob:
    """One program run of a batch (:meth:`RTLRunner.run_many`); the fields are the arguments of
    :meth:`RTLRunner.run`.

    ``program`` is a :class:`Program` (its config hash is checked) or raw instruction words as
    ``bytes`` (a multiple of 64 bytes, not checked: to test how the accelerator treats illegal
    words). ``dram`` is the 1-D uint8 image, byte 0 = address 0; ``prog_addr`` the byte address
    the words are written to and fetched from; ``max_cycles`` the watchdog, in cycles;
    ``dram_base`` the CSR of that name; ``slverr`` a byte range [lo, hi) answering SLVERR."""

    program: Program | bytes
    dram: np.ndarray
    prog_addr: int
    max_cycles: int
    dram_base: int = 0
    slverr: tuple[int, int] | None = None


@dataclass
class RTLRunResult(RunResult):
    """A :class:`RunResult` measured on the RTL: ``cycles``, ``macs``, ``busy``, DRAM traffic and
    ``instructions`` come from the accelerator's performance counters; ``timings`` is empty (the
    RTL does not report per-instruction times)."""

    counters: dict[str, int] = field(default_factory=dict)  #: every counter of csr.COUNTERS
    sim_cycles: int = 0          #: cycles from the start write to irq, counted by sim_top
    run_seconds: float = 0.0     #: wall time of those cycles in the simulator, seconds
    run_cpu_seconds: float = 0.0  #: CPU time of the simulator process for those cycles, seconds
    wall_seconds: float = 0.0    #: wall time of the job in the simulator (restart, load, run,
    #: counters, dump), seconds
    memory: str = "fast"         #: the DRAM model used
    waveform: str | None = None  #: the VCD file of a run with ``waves``

    @property
    def cycles_per_second(self) -> float:
        """Simulated accelerator cycles per wall-clock second while the program ran."""
        return self.sim_cycles / self.run_seconds if self.run_seconds > 0 else 0.0


# -- sources and memory files ------------------------------------------------------------------

def hdl_source(name: str) -> str:
    """Text of ``sim/hdl/<name>`` (e.g. ``"axi_ram.sv"``)."""
    path = HDL_DIR / name
    if not path.is_file():
        raise ValueError(f"name must be a file in {HDL_DIR}, not {name!r}")
    return path.read_text()


# -- Verilog and builds --------------------------------------------------------------------------

def accelerator_verilog(config: AcceleratorConfig) -> str:
    """Verilog of the accelerator (``systolic.hw.top.Accelerator``) as module ``systolic_top``.
    With ``config.compute_clock_mhz`` the accelerator is ``systolic_core`` and ``systolic_top``
    wraps it with its compute clock (:func:`compute_clock_wrapper`, whose text is part of the
    cache key).

    Cached in ``build_cache_dir("verilog", ...)`` per config hash and a hash of the hw/ sources
    (the packaged firmware of ``control = "firmware"`` included) and the Amaranth version,
    because elaborating a large array takes a while."""
    from importlib.metadata import version

    from systolic.hw import top  # the accelerator's top level (hw/top.py)

    digest = hashlib.sha256(config.hash_hex.encode())
    digest.update(version("amaranth").encode())
    hw_dir = Path(top.__file__).resolve().parent
    for source in sorted([*hw_dir.glob("*.py"), *(hw_dir / "firmware_src").glob("*")]):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    wrapper = compute_clock_wrapper(config) if config.compute_clock_mhz else ""
    digest.update(wrapper.encode())      # made here, not in hw/: part of the key as well
    key = f"{ACCELERATOR_TOP}-{config.hash_hex}-{digest.hexdigest()[:16]}"
    path = tools.build_cache_dir("verilog", key) / f"{ACCELERATOR_TOP}.v"
    if path.is_file():
        return path.read_text()
    if config.compute_clock_mhz:
        text = tools.to_verilog(top.Accelerator(config), _COMPUTE_CLOCK_CORE) + wrapper
    else:
        text = tools.to_verilog(top.Accelerator(config), ACCELERATOR_TOP)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(text)
    partial.replace(path)
    return text


_COMPUTE_CLOCK_CORE = "systolic_core"
#: Time of the compute clock's first rising edge in simulation, ps: not a multiple of the
#: control clock's half period, so that the two clocks' edges do not coincide for most ratios.
COMPUTE_CLOCK_FIRST_EDGE_PS = 1370


def compute_half_period_ps(config: AcceleratorConfig) -> int:
    """Half period of the simulated compute clock of a ``config.compute_clock_mhz`` config, ps
    (at least 1): the control clock's period is :data:`CLOCK_PERIOD_NS`, so the compute clock's
    is ``CLOCK_PERIOD_NS * clock_mhz / compute_clock_mhz``, to the picosecond."""
    if not config.compute_clock_mhz:
        raise ValueError(f"config {config.hash_hex} has one clock (compute_clock_mhz = 0): "
                         f"it has no compute clock")
    return max(1, round(CLOCK_PERIOD_NS * 1000 * config.clock_mhz / config.compute_clock_mhz / 2))


def compute_clock_wrapper(config: AcceleratorConfig) -> str:
    """Verilog of a ``systolic_top`` for simulation that makes the compute clock of a
    ``config.compute_clock_mhz`` accelerator (module ``systolic_core``) itself: a period of
    ``CLOCK_PERIOD_NS * clock_mhz / compute_clock_mhz`` (:func:`compute_half_period_ps`), its
    first rising edge :data:`COMPUTE_CLOCK_FIRST_EDGE_PS` in, so that its edges fall between
    those of ``clk`` for most ratios. Its other
    ports are ``systolic_core``'s, so ``sim_top.sv`` instantiates either alike."""
    from systolic.hw.top import top_ports

    if not config.compute_clock_mhz:
        raise ValueError(f"config {config.hash_hex} has one clock (compute_clock_mhz = 0): "
                         f"its systolic_top needs no wrapper")
    half_ps = compute_half_period_ps(config)
    ports = {name: spec for name, spec in top_ports(config).items() if name != "compute_clk"}
    lines = [f"module {ACCELERATOR_TOP} (", "    input wire clk,", "    input wire rst,"]
    for n, (name, (direction, width)) in enumerate(ports.items()):
        kind = "input wire" if direction == "in" else "output wire"
        vector = f" [{width - 1}:0]" if width > 1 else ""
        lines.append(f"    {kind}{vector} {name}{',' if n < len(ports) - 1 else ''}")
    lines += [
        ");",
        f"    // the compute clock: half period {half_ps} ps",
        "    reg compute_clk = 1'b0;",
        "    initial begin",
        f"        #({COMPUTE_CLOCK_FIRST_EDGE_PS / 1000:.3f});",
        f"        forever begin compute_clk = 1'b1; #({half_ps / 1000:.3f}); compute_clk = 1'b0; "
        f"#({half_ps / 1000:.3f}); end",
        "    end",
        f"    {_COMPUTE_CLOCK_CORE} core (",
        "        .clk(clk), .rst(rst), .compute_clk(compute_clk),",
    ]
    names = list(ports)
    for n, name in enumerate(names):
        lines.append(f"        .{name}({name}){',' if n < len(names) - 1 else ''}")
    lines += ["    );", "endmodule", ""]
    return "\n".join(lines)


def sim_top_verilog(accelerator: str) -> str:
    """One source text for Verilator: ``accelerator`` (defines ``systolic_top``), then
    ``axi_ram.sv`` and ``sim_top.sv``."""
    if not isinstance(accelerator, str):
        raise TypeError(f"accelerator must be Verilog text, not {type(accelerator).__name__}")
    return "\n".join(["`timescale 1ns / 1ps", accelerator, hdl_source("axi_ram.sv"),
                      hdl_source("sim_top.sv")])


def build_sim_top(accelerator: str, config: AcceleratorConfig, *,
                  dram_bytes: int = DEFAULT_DRAM_BYTES, external_memory: bool = False,
                  waves: bool | None = None) -> Path:
    """Build ``sim_top`` around ``accelerator`` (Verilog of ``systolic_top``) for cocotb on
    Verilator, or reuse the cached build; returns the build directory. The bus width and the
    DRAM read latency come from ``config``; ``dram_bytes`` is the DRAM capacity of ``axi_ram``;
    ``external_memory`` builds the variant whose DRAM and clock come from cocotb (``EXT_MEM``)."""
    _check_dram_bytes(dram_bytes)
    args = [*SIM_BUILD_ARGS,
            f"-GEXT_MEM={int(bool(external_memory))}",
            f"-GDATA_WIDTH={config.dma_data_bits}",
            f"-GMEM_BYTES={dram_bytes}",
            f"-GREAD_LATENCY={max(2, config.dram_latency)}",
            f"-GMAX_READS={_DRAM_QUEUE}",
            f"-GMAX_WRITES={_DRAM_QUEUE}",
            f"-GHALF_PERIOD_NS={CLOCK_PERIOD_NS // 2}"]
    return tools.cocotb_build(sim_top_verilog(accelerator), SIM_TOP, config.hash_hex,
                              build_args=args, waves=waves)


def _check_dram_bytes(dram_bytes: Any) -> None:
    if isinstance(dram_bytes, bool) or not isinstance(dram_bytes, int) or dram_bytes < 1 << 16 \
            or dram_bytes > MAX_DRAM_BYTES or dram_bytes & (dram_bytes - 1):
        raise ValueError(f"dram_bytes must be a power of two between 65536 and {MAX_DRAM_BYTES}, "
                         f"not {dram_bytes!r}")


# -- the runner --------------------------------------------------------------------------------

class RTLRunner:
    """Runs programs on the RTL of one accelerator configuration.

    ``memory`` is one of :data:`MEMORY_MODELS`; ``seed`` seeds the random memory models and
    cocotb; ``waves`` records a VCD (also turned on by ``SYSTOLIC_WAVES=1``); ``dram_bytes`` is
    the largest DRAM image :meth:`run` accepts (the model is built with at least
    :data:`DEFAULT_DRAM_BYTES`, so that smaller sizes share one build). ``verilog`` replaces the
    generated ``systolic_top`` with the given Verilog text of a module of that name and ports
    (e.g. a post-synthesis netlist). The build happens at the first :meth:`run` or
    :meth:`run_many` (or :meth:`build`)."""

    def __init__(self, config: AcceleratorConfig, *, memory: str = "fast", seed: int = 0,
                 waves: bool = False, dram_bytes: int = DEFAULT_DRAM_BYTES,
                 verilog: str | None = None) -> None:
        if not isinstance(config, AcceleratorConfig):
            raise TypeError(f"config must be an AcceleratorConfig, not {type(config).__name__}")
        if memory not in MEMORY_MODELS:
            raise ValueError(f"memory must be one of {', '.join(repr(m) for m in MEMORY_MODELS)}, "
                             f"not {memory!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 1 << 63:
            raise ValueError(f"seed must be an integer between 0 and 2**63 - 1, not {seed!r}")
        if not isinstance(waves, bool):
            raise TypeError(f"waves must be a bool, not {waves!r}")
        _check_dram_bytes(dram_bytes)
        if verilog is not None and not isinstance(verilog, str):
            raise TypeError(f"verilog must be Verilog text or None, not {type(verilog).__name__}")
        self.config = config
        self.memory = memory
        self.seed = seed
        self.waves = waves or tools.waves_enabled()
        self.dram_bytes = dram_bytes
        self._verilog = verilog
        self._build_dir: Path | None = None

    def build(self) -> Path:
        """Build (or find the cached build of) ``sim_top`` for this configuration; returns the
        build directory. ``"fast"`` and ``"fast-random"`` share a build; ``"axi-random"`` has
        its own (sim_top's ``EXT_MEM``)."""
        if self._build_dir is None:
            verilog = self._verilog if self._verilog is not None else accelerator_verilog(self.config)
            # smaller DRAMs share the default build: accesses past the image answer DECERR anyway
            self._build_dir = build_sim_top(verilog, self.config,
                                            dram_bytes=max(self.dram_bytes, DEFAULT_DRAM_BYTES),
                                            external_memory=self.memory == "axi-random",
                                            waves=self.waves)
        return self._build_dir

    def run(self, program: Program | bytes, dram: np.ndarray, *, prog_addr: int, max_cycles: int,
            dram_base: int = 0, slverr: tuple[int, int] | None = None) -> RTLRunResult:
        """Run ``program`` against a copy of ``dram`` (1-D uint8, byte 0 = address 0).

        The program's words are written into the image at ``prog_addr`` (a multiple of 64 bytes;
        they must fit in the image), which the returned DRAM therefore contains. With the fast
        memory models, addresses at or past the end of the image (rounded up to the bus width)
        answer DECERR; AxiRam ("axi-random") serves all of ``dram_bytes``. ``max_cycles`` is
        the watchdog, in cycles from the start write. ``dram_base`` is written to the CSR of that
        name. ``slverr=(lo, hi)`` makes bus words at addresses in [lo, hi) answer SLVERR (fast
        memory models only). ``program`` may also be raw instruction words (see :class:`RTLJob`).

        Raises :class:`RTLTimeoutError` when the watchdog expires, :class:`RTLDeviceError` when
        the accelerator reports an error, :class:`systolic.sim.tools.ToolError` when the build
        or the simulator fails."""
        job = RTLJob(program, dram, prog_addr, max_cycles, dram_base, slverr)
        (outcome,) = self._execute([self._prepare(job)])
        if isinstance(outcome, RTLError):
            raise outcome
        return outcome

    def run_many(self, jobs: Sequence[RTLJob]) -> list[RTLRunResult | RTLError]:
        """Run ``jobs`` one after the other in one simulator process, each from reset, and return
        one outcome per job, in order: its :class:`RTLRunResult`, or the
        :class:`RTLTimeoutError` or :class:`RTLDeviceError` that :meth:`run` would raise for it
        (returned, not raised: the other jobs still run).

        Every job is checked before the simulator starts (errors name the job: ``jobs[3]: ...``).
        With ``"fast-random"`` and ``"axi-random"``, job i's backpressure is seeded with
        ``seed + i``. Raises :class:`RTLError` when the simulated accelerator is built for another
        config and :class:`systolic.sim.tools.ToolError` when the build or the simulator fails."""
        if isinstance(jobs, RTLJob) or not isinstance(jobs, Sequence):
            raise TypeError(f"jobs must be a sequence of RTLJob, not {type(jobs).__name__}")
        prepared = []
        for index, job in enumerate(jobs):
            if not isinstance(job, RTLJob):
                raise TypeError(f"jobs[{index}] must be an RTLJob, not {type(job).__name__}")
            try:
                prepared.append(self._prepare(job))
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"jobs[{index}]: {exc}") from None
        if not prepared:
            return []
        return self._execute(prepared)

    def _prepare(self, job: RTLJob) -> tuple[RTLJob, np.ndarray, bytes]:
        """Check ``job`` against this runner; returns (job, DRAM image with the program, words)."""
        program, dram = job.program, job.dram
        if isinstance(program, Program):
            program.check_config(self.config)
            words = program.words()
        elif isinstance(program, bytes | bytearray):
            if not program or len(program) % INSTR_BYTES:
                raise ValueError(f"program words must be a nonzero multiple of {INSTR_BYTES} bytes, "
                                 f"not {len(program)} bytes")
            words = bytes(program)
        else:
            raise TypeError(f"program must be a Program or instruction words (bytes), not "
                            f"{type(program).__name__}")
        if not isinstance(dram, np.ndarray) or dram.dtype != np.uint8 or dram.ndim != 1:
            raise TypeError(f"dram must be a 1-D numpy array of uint8, not {type(dram).__name__}"
                            + (f" of {dram.dtype} with shape {dram.shape}"
                               if isinstance(dram, np.ndarray) else ""))
        if dram.size == 0 or dram.size > self.dram_bytes:
            raise ValueError(f"dram must hold between 1 and {self.dram_bytes} bytes (the simulated "
                             f"DRAM, RTLRunner dram_bytes), not {dram.size}")
        prog_addr = job.prog_addr
        _check_int("prog_addr", prog_addr, 0, (1 << 32) - 1)
        if prog_addr % INSTR_BYTES:
            raise ValueError(f"prog_addr must be a multiple of {INSTR_BYTES} bytes (instruction "
                             f"words are aligned), not {prog_addr:#x}")
        if prog_addr + len(words) > dram.size:
            raise ValueError(f"prog_addr: the program's {len(words)} bytes at {prog_addr:#x} must fit "
                             f"in the {dram.size}-byte DRAM image, but end at {prog_addr + len(words):#x}")
        _check_int("max_cycles", job.max_cycles, 1, 1 << 62)
        _check_int("dram_base", job.dram_base, 0, (1 << 32) - 1)
        slverr = job.slverr
        if slverr is not None:
            if self.memory == "axi-random":
                raise ValueError("slverr needs a fast memory model ('fast' or 'fast-random'), "
                                 "not 'axi-random'")
            if not (isinstance(slverr, tuple) and len(slverr) == 2
                    and all(isinstance(v, int) and not isinstance(v, bool) for v in slverr)
                    and 0 <= slverr[0] <= slverr[1] <= 1 << 32):
                raise ValueError(f"slverr must be a pair (lo, hi) of byte addresses with "
                                 f"0 <= lo <= hi <= 2**32, not {slverr!r}")
        image = dram.copy()
        image[prog_addr:prog_addr + len(words)] = np.frombuffer(words, np.uint8)
        return job, image, words

    # -- one simulator process ---------------------------------------------------------------

    def _execute(self, prepared: list[tuple[RTLJob, np.ndarray, bytes]]
                 ) -> list[RTLRunResult | RTLError]:
        from systolic.hw.csr import COUNTERS, register_map

        build_dir = self.build()
        jobs_dir = build_dir / "jobs"
        jobs_dir.mkdir(exist_ok=True)
        word_bytes = self.config.dma_bytes
        entries = []
        for index, (job, image, words) in enumerate(prepared):
            job_dir = Path(tempfile.mkdtemp(prefix="job-", dir=jobs_dir))
            entry = {
                "dir": str(job_dir),
                "seed": self.seed + index,
                "image": str(job_dir / "dram.bin"),
                "image_bytes": int(image.size),
                "limit_bytes": -(-image.size // word_bytes) * word_bytes,
                "prog_addr": job.prog_addr,
                "prog_len": len(words) // INSTR_BYTES,
                "dram_base": job.dram_base,
                "max_cycles": job.max_cycles,
                "slverr": list(job.slverr) if job.slverr is not None else None,
                "result": str(job_dir / "result.json"),
                "dram_out": str(job_dir / "dram_out.bin"),
            }
            image.tofile(entry["image"])
            (job_dir / "job.json").write_text(json.dumps(entry, indent=1))
            entries.append(entry)
        batch = {
            "memory": self.memory,
            "dram_bytes": self.dram_bytes,
            "word_bytes": word_bytes,
            "poll_cycles": _POLL_CYCLES,
            "period_ns": CLOCK_PERIOD_NS,
            "config_hash": self.config.hash,
            "registers": register_map(),
            "counters": [name for name, _ in COUNTERS],
            "jobs": entries,
        }
        handle, batch_path = tempfile.mkstemp(prefix="batch-", suffix=".json", dir=jobs_dir)
        with os.fdopen(handle, "w") as out:
            json.dump(batch, out)
        # cocotb logs warnings and errors only, unless the environment asks for more
        env = {JOB_ENV: batch_path,
               "COCOTB_LOG_LEVEL": os.environ.get("COCOTB_LOG_LEVEL", "WARNING"),
               "GPI_LOG_LEVEL": os.environ.get("GPI_LOG_LEVEL", "WARNING")}
        try:
            results_xml = tools.cocotb_test(build_dir, SIM_TOP, "systolic.sim.rtl_cocotb",
                                            extra_env=env, seed=self.seed, waves=self.waves)
        finally:
            os.remove(batch_path)
        outcomes = []
        for (job, _, words), entry in zip(prepared, entries, strict=True):
            result_path = Path(entry["result"])
            if not result_path.is_file():
                raise tools.ToolError(f"the cocotb side of the RTL runner wrote no {result_path}; "
                                      f"see {results_xml}")
            result = json.loads(result_path.read_text())
            outcomes.append(self._outcome(job, words, entry, result, results_xml))
        if not self.waves:      # the simulator's folder holds the waveform, else only results.xml
            shutil.rmtree(Path(results_xml).parent, ignore_errors=True)
        return outcomes

    def _outcome(self, job: RTLJob, words: bytes, entry: dict[str, Any], result: dict[str, Any],
                 results_xml: Path) -> RTLRunResult | RTLError:
        """The result of one job, or the error it ended with (its files are then kept)."""
        job_dir = entry["dir"]
        outcome = result["outcome"]
        if outcome == "timeout":
            pc = result["pc"]
            last = ""
            if result["instructions"] > 0:
                index = result["instructions"] - 1
                last = f"; the last instruction dispatched is {_describe(words, index)[2:-1]}"
            waits = "; ".join(result["waiting"]) or "no queue waits for a token or room"
            return RTLTimeoutError(
                f"watchdog: the accelerator did not raise irq within {job.max_cycles} cycles; the pc "
                f"CSR reads {pc}{_describe(words, pc)}{last}; {waits}; status {result['status']:#x}; "
                f"run files in {job_dir}")
        if outcome == "error":
            from systolic.hw.csr import CORE_FAULT

            code = result["error"]
            where = (f"core address {result['error_pc']:#x}" if code == CORE_FAULT else
                     f"instruction {result['error_pc']}{_describe(words, result['error_pc'])}")
            return RTLDeviceError(f"the accelerator stopped with error {code} ({_error_text(code)}) at "
                                  f"{where}; run files in {job_dir}")
        if outcome == "config":
            raise RTLError(f"the simulated accelerator reports config hash {result['hash']:016x}, "
                           f"but the runner's config is {self.config.hash_hex}; run files in {job_dir}")
        if outcome != "done":
            raise tools.ToolError(f"the cocotb side of the RTL runner reported {outcome!r}; "
                                  f"run files in {job_dir}")

        dram_out = np.fromfile(entry["dram_out"], np.uint8)
        counters = {name: int(value) for name, value in result["counters"].items()}
        out = RTLRunResult(
            dram=dram_out,
            cycles=counters["cycles"],
            timings=[],
            macs=counters["macs"],
            busy={name: counters[f"{name}_busy"] for name in QUEUE_NAMES},
            dram_read_bytes=counters["dram_read_bytes"],
            dram_write_bytes=counters["dram_write_bytes"],
            instructions=counters["instructions"],
            peak_macs_per_cycle=self.config.peak_macs_per_cycle,
            counters=counters,
            sim_cycles=int(result["sim_cycles"]),
            run_seconds=float(result["run_seconds"]),
            run_cpu_seconds=float(result["run_cpu_seconds"]),
            wall_seconds=float(result["wall_seconds"]),
            memory=self.memory,
            waveform=str(Path(results_xml).parent / "dump.vcd") if self.waves else None,
        )
        if not self.waves:       # a failed run or one asked to trace keeps its files
            shutil.rmtree(job_dir, ignore_errors=True)
        return out


def _check_int(name: str, value: Any, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer between {lo} and {hi}, not {value!r}")


def _describe(words: bytes, pc: int) -> str:
    """`` (instruction 3: LOAD)``-style note on the instruction at ``pc`` of the program
    ``words``; an illegal word is named by what is wrong with it."""
    count = len(words) // INSTR_BYTES
    if not 0 <= pc < count:
        return f" (past the program's {count} instructions)"
    try:
        op = decode(words[pc * INSTR_BYTES:(pc + 1) * INSTR_BYTES]).op
    except IsaError as exc:
        return f" (instruction {pc}: an illegal word, {exc})"
    return f" (instruction {pc}: {op.name if isinstance(op, Opcode) else op})"


def _error_text(code: int) -> str:
    from systolic.hw.csr import ERROR_CODES

    return ERROR_CODES.get(code, "unknown error code")
