"""The cocotb side of the RTL runner (:mod:`systolic.sim.rtl`): one test, run inside the simulator
on ``sim_top``, that runs a batch of jobs one after the other in the same simulator process.

It reads the batch from the JSON file named by the ``SYSTOLIC_RTL_JOB`` environment variable. For
each job it sets the DRAM model's controls (backpressure seed, error ranges), restarts the core
(``sim_top``'s ``restart``: the accelerator and the DRAM model's queues are reset, so that a
hung or failed job leaves nothing behind), loads the job's DRAM image, writes the CSRs and starts
the accelerator, then sleeps until ``irq`` or the job's watchdog (polling ``status`` every
``poll_cycles`` cycles, since an error may not raise ``irq``), reads the status and the
performance counters, dumps DRAM and writes the job's ``result.json`` and ``dram_out.bin``. The
outcome of each job (done, timeout, device error) is reported in its ``result.json``, not as a
test failure: the pytest side turns it into the right exception, and the batch goes on.

CSR accesses change the AXI-Lite signals on the falling edge of ``clk`` and sample them in the
read-only phase before the next rising edge, which is correct whether the clock comes from the
HDL (values read after a rising edge there are already updated) or from cocotb.

It imports no other systolic module (the register map comes in the batch file), so that the
simulator starts quickly; the memory-file helpers live here for the same reason.

Units: addresses and sizes in bytes, time in clock cycles unless named otherwise.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import time
from pathlib import Path
from typing import Any

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, First, ReadOnly, RisingEdge, Timer

__all__ = ["AXILiteDriver", "CSRBus", "DramModel", "run_batch", "JOB_ENV", "PROBE_CYCLES",
           "write_memh", "read_memh"]

#: Environment variable that gives this side the path of its ``job.json``.
JOB_ENV = "SYSTOLIC_RTL_JOB"

_RESP_OKAY = 0
_LOAD_FILE = "dram_load.hex"     # the names axi_ram opens when no plusarg names other files
_DUMP_FILE = "dram_dump.hex"


# -- memory files (also re-exported by systolic.sim.rtl) -----------------------------------------

def write_memh(path: str | Path, data: bytes | np.ndarray, word_bytes: int) -> None:
    """Write ``data`` (bytes, address 0 first) as a ``$readmemh`` file of ``word_bytes``-byte
    words: one word per line, most significant byte first (byte address a is byte a mod
    word_bytes of word a // word_bytes). The last word is padded with zero bytes."""
    if word_bytes not in (4, 8, 16):
        raise ValueError(f"word_bytes must be 4, 8 or 16, not {word_bytes!r}")
    buf = np.frombuffer(bytes(data), np.uint8) if not isinstance(data, np.ndarray) \
        else np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
    pad = (-buf.size) % word_bytes
    if pad:
        buf = np.concatenate([buf, np.zeros(pad, np.uint8)])
    words = np.ascontiguousarray(buf.reshape(-1, word_bytes)[:, ::-1])
    digits = np.frombuffer(words.tobytes().hex().encode(), np.uint8).reshape(-1, 2 * word_bytes)
    lines = np.concatenate([digits, np.full((digits.shape[0], 1), ord("\n"), np.uint8)], axis=1)
    Path(path).write_bytes(lines.tobytes())


def read_memh(path: str | Path, word_bytes: int, nbytes: int) -> np.ndarray:
    """Read the first ``nbytes`` bytes of a ``$writememh`` file of ``word_bytes``-byte words (the
    layout of :func:`write_memh`) as a uint8 array. ``//`` comments and blank lines are skipped;
    ``@address`` lines are refused."""
    if word_bytes not in (4, 8, 16):
        raise ValueError(f"word_bytes must be 4, 8 or 16, not {word_bytes!r}")
    path = Path(path)
    digits = 2 * word_bytes
    raw = path.read_bytes()
    lines = np.frombuffer(raw, np.uint8)
    if lines.size and lines.size % (digits + 1) == 0:
        # fast path, for large dumps: every line one full-width word (the simulator's format)
        lines = lines.reshape(-1, digits + 1)
        if (lines[:, -1] == ord("\n")).all():
            try:
                packed = bytes.fromhex(lines[:, :-1].tobytes().decode("ascii"))
            except (ValueError, UnicodeDecodeError):
                pass            # not hex: the line-by-line reader names the problem
            else:
                data = np.frombuffer(packed, np.uint8).reshape(-1, word_bytes)[:, ::-1].reshape(-1)
                if data.size >= nbytes:
                    return data[:nbytes].copy()
    tokens = []
    for number, line in enumerate(raw.decode("ascii", "replace").splitlines(), 1):
        text = line.split("//", 1)[0].strip()
        if not text:
            continue
        if text.startswith("@") or len(text) > digits:
            raise ValueError(f"{path}:{number}: a memory line must be one word of at most {digits} "
                             f"hex digits, not {text!r}")
        tokens.append(text.rjust(digits, "0"))
    try:
        raw = bytes.fromhex("".join(tokens))
    except ValueError:
        raise ValueError(f"{path}: memory words must be hex digits") from None
    data = np.frombuffer(raw, np.uint8).reshape(-1, word_bytes)[:, ::-1].reshape(-1)
    if data.size < nbytes:
        raise ValueError(f"{path}: the file must hold at least {nbytes} bytes, not {data.size}")
    return data[:nbytes].copy()


# -- drivers -------------------------------------------------------------------------------------

class AXILiteDriver:
    """Drives the ``s_axil_*`` subordinate port of ``dut``, one access at a time. Every method
    starts and returns just after a falling edge of ``clk``."""

    def __init__(self, dut: Any, prefix: str = "s_axil") -> None:
        self.dut = dut
        self.clk = dut.clk
        self._sig = {name: getattr(dut, f"{prefix}_{name}") for name in (
            "awvalid", "awready", "awaddr", "wvalid", "wready", "wdata", "wstrb", "bvalid", "bready",
            "bresp", "arvalid", "arready", "araddr", "rvalid", "rready", "rdata", "rresp")}
        for name in ("awvalid", "wvalid", "bready", "arvalid", "rready"):
            self._sig[name].value = 0

    async def _handshake(self, valid: str, ready: str) -> None:
        self._sig[valid].value = 1
        while True:
            await ReadOnly()
            if self._sig[ready].value:
                break
            await FallingEdge(self.clk)
        await FallingEdge(self.clk)          # the rising edge in between took the transfer
        self._sig[valid].value = 0

    async def _response(self, valid: str, ready: str, payload: tuple[str, ...]) -> list[int]:
        self._sig[ready].value = 1
        while True:
            await ReadOnly()
            if self._sig[valid].value:
                values = [int(self._sig[name].value) for name in payload]
                break
            await FallingEdge(self.clk)
        await FallingEdge(self.clk)
        self._sig[ready].value = 0
        return values

    async def write(self, addr: int, value: int) -> int:
        """Write the 32-bit ``value`` at byte address ``addr``; returns BRESP."""
        self._sig["awaddr"].value = addr
        self._sig["wdata"].value = value & 0xFFFF_FFFF
        self._sig["wstrb"].value = 0xF
        await self._handshake("awvalid", "awready")
        await self._handshake("wvalid", "wready")
        (resp,) = await self._response("bvalid", "bready", ("bresp",))
        return resp

    async def read(self, addr: int) -> tuple[int, int]:
        """Read the 32-bit word at byte address ``addr``; returns (data, RRESP)."""
        self._sig["araddr"].value = addr
        await self._handshake("arvalid", "arready")
        data, resp = await self._response("rvalid", "rready", ("rdata", "rresp"))
        return data, resp


class CSRBus:
    """The accelerator's registers by name (``systolic.hw.csr.register_map()`` as JSON)."""

    def __init__(self, driver: AXILiteDriver, registers: dict[str, dict[str, Any]]) -> None:
        self.driver = driver
        self.registers = registers

    def _offset(self, name: str) -> int:
        if name not in self.registers:
            raise ValueError(f"register must be one of {', '.join(self.registers)}, not {name!r}")
        return int(self.registers[name]["offset"])

    async def write(self, name: str, value: int) -> None:
        resp = await self.driver.write(self._offset(name), value)
        if resp != _RESP_OKAY:
            raise RuntimeError(f"CSR write of {name} answered response {resp}, not OKAY")

    async def read(self, name: str) -> int:
        value, resp = await self.driver.read(self._offset(name))
        if resp != _RESP_OKAY:
            raise RuntimeError(f"CSR read of {name} answered response {resp}, not OKAY")
        return value

    async def read_counter(self, name: str) -> int:
        """A 64-bit counter: the low word first (it latches the high word)."""
        low = await self.read(f"{name}_lo")
        high = await self.read(f"{name}_hi")
        return high << 32 | low


class DramModel:
    """The DRAM behind the accelerator for a batch: sim_top's ``axi_ram`` (back-door load and
    dump through files in the working directory) or cocotbext-axi's ``AxiRam`` on ``m_axi_*``."""

    def __init__(self, dut: Any, batch: dict[str, Any]) -> None:
        self.dut = dut
        self.batch = batch
        self.external = batch["memory"] == "axi-random"
        self.ram = None
        self._loaded = 0        # bytes of the last image put into AxiRam
        dut.restart.value = 0
        dut.dram_load.value = 0
        dut.dram_dump.value = 0
        dut.dump_bytes.value = 0
        if self.external:
            from cocotbext.axi import AxiBus, AxiRam

            # sim_top built with EXT_MEM: cocotb drives the clock, so that cocotbext-axi samples
            # the bus before each rising edge
            Clock(dut.clk_ext, batch["period_ns"], unit="ns").start()
            self.ram = AxiRam(AxiBus.from_prefix(dut, "m_axi"), dut.clk_ext, dut.rst,
                              size=batch["dram_bytes"])

    def configure(self, job: dict[str, Any]) -> None:
        """Set the controls of ``job``: backpressure and its seed, SLVERR range, image size.
        ``axi_ram`` samples the seed during reset: call before :meth:`restart`."""
        dut = self.dut
        dut.random_en.value = int(self.batch["memory"] == "fast-random")
        # xorshift must not start from zero
        dut.random_seed.value = (job["seed"] * 0x9E37_79B9_7F4A_7C15 + 1) & ((1 << 64) - 1) or 1
        lo, hi = job["slverr"] if job["slverr"] is not None else (0, 0)
        dut.err_lo.value = lo
        dut.err_hi.value = hi
        dut.limit_bytes.value = job["limit_bytes"]
        if self.external:
            rng = random.Random(job["seed"])
            for channel in (self.ram.write_if.aw_channel, self.ram.write_if.w_channel,
                            self.ram.write_if.b_channel, self.ram.read_if.ar_channel,
                            self.ram.read_if.r_channel):
                channel.set_pause_generator(_pauses(random.Random(rng.getrandbits(64))))

    async def restart(self) -> None:
        """Reset the core (accelerator and DRAM model) and wait until reset is released. Call
        after a falling edge of clk; returns after one, with rst low."""
        await self._pulse(self.dut.restart)
        while int(self.dut.rst.value):
            await FallingEdge(self.dut.clk)

    async def load(self, image: np.ndarray) -> None:
        """Put ``image`` at address 0. Call after a falling edge of clk; returns after one."""
        if self.external:
            if self._loaded > image.size:    # the previous job's bytes past this image
                self.ram.write(image.size, bytes(self._loaded - image.size))
            self.ram.write(0, image.tobytes())
            self._loaded = image.size
            return
        write_memh(_LOAD_FILE, image, self.batch["word_bytes"])
        await self._pulse(self.dut.dram_load)
        os.remove(_LOAD_FILE)

    async def dump(self, nbytes: int) -> np.ndarray:
        """The first ``nbytes`` bytes of DRAM."""
        if self.external:
            return np.frombuffer(self.ram.read(0, nbytes), np.uint8).copy()
        self.dut.dump_bytes.value = nbytes
        await self._pulse(self.dut.dram_dump)
        data = read_memh(_DUMP_FILE, self.batch["word_bytes"], nbytes)
        os.remove(_DUMP_FILE)
        return data

    async def _pulse(self, signal: Any) -> None:
        # sim_top registers the control: it acts at the second rising edge
        signal.value = 1
        await FallingEdge(self.dut.clk)
        signal.value = 0
        await FallingEdge(self.dut.clk)


def _pauses(rng: random.Random):
    """Pause pattern of one channel: runs of ready and of stalls, stalling about a third of the
    cycles, with occasional long stalls (a slow DRAM page)."""
    while True:
        yield from itertools.repeat(False, rng.randint(0, 8))
        yield from itertools.repeat(True, rng.choice((1, 1, 2, 3, 12)))


#: Counters that grow while a queue or the dispatcher waits, and what that wait is.
_STALLS = (
    ("stall_load_token", "the load queue waits for a token"),
    ("stall_compute_token", "the compute queue waits for a token"),
    ("stall_store_token", "the store queue waits for a token"),
    ("stall_dispatch", "the dispatcher waits for room in a queue"),
    ("stall_fetch", "the dispatcher waits for the next beat of an instruction word"),
)
#: Cycles between the two counter reads that find what a hung accelerator waits for.
PROBE_CYCLES = 64


@cocotb.test()
async def run_batch(dut: Any) -> None:
    """Run the jobs of the batch named by ``SYSTOLIC_RTL_JOB`` (see the module docstring)."""
    batch = json.loads(Path(os.environ[JOB_ENV]).read_text())
    dram = DramModel(dut, batch)
    csr = CSRBus(AXILiteDriver(dut), batch["registers"])
    await FallingEdge(dut.clk)
    while int(dut.rst.value):
        await FallingEdge(dut.clk)

    config_hash = await csr.read("config_hash_hi") << 32 | await csr.read("config_hash_lo")
    if config_hash != batch["config_hash"]:
        for job in batch["jobs"]:
            _write_result(job, {"outcome": "config", "hash": config_hash}, time.perf_counter())
        return
    for job in batch["jobs"]:
        await _run_job(dut, batch, job, dram, csr)


async def _run_job(dut: Any, batch: dict[str, Any], job: dict[str, Any], dram: DramModel,
                   csr: CSRBus) -> None:
    """One job: restart, load, start, wait for irq or the watchdog, read the results."""
    wall_start = time.perf_counter()
    image = np.fromfile(job["image"], np.uint8)
    assert image.size == job["image_bytes"], (image.size, job["image_bytes"])
    dram.configure(job)
    await dram.restart()
    await dram.load(image)

    await csr.write("prog_addr", job["prog_addr"])
    await csr.write("prog_len", job["prog_len"])
    await csr.write("dram_base", job["dram_base"])
    await csr.write("ctrl", 1)
    start = int(dut.cycle.value)
    run_start, run_cpu_start = time.perf_counter(), time.process_time()
    deadline = start + job["max_cycles"]

    status = 0
    while True:
        if int(dut.irq.value):
            break
        now = int(dut.cycle.value)
        if now >= deadline:
            break
        chunk = min(deadline - now, batch["poll_cycles"])
        await First(RisingEdge(dut.irq), Timer(chunk * batch["period_ns"], unit="ns"))
        await FallingEdge(dut.clk)
        status = await csr.read("status")
        if status & 0b10 or status >> 4 & 0xF:
            break
    end = int(dut.cycle.value)
    run_seconds = time.perf_counter() - run_start
    run_cpu_seconds = time.process_time() - run_cpu_start
    status = await csr.read("status")
    error = status >> 4 & 0xF
    result: dict[str, Any] = dict(
        status=status, error=error, error_pc=await csr.read("error_pc"), pc=await csr.read("pc"),
        sim_cycles=end - start, run_seconds=run_seconds, run_cpu_seconds=run_cpu_seconds)
    if error:
        result["outcome"] = "error"
    elif not status & 0b10:
        result["outcome"] = "timeout"
        result["waiting"] = await _waiting(csr)
        result["instructions"] = await csr.read_counter("instructions")
    else:
        result["outcome"] = "done"
        result["counters"] = {name: await csr.read_counter(name) for name in batch["counters"]}
        data = await dram.dump(job["image_bytes"])
        data.tofile(job["dram_out"])
    _write_result(job, result, wall_start)


async def _waiting(csr: CSRBus) -> list[str]:
    """What a hung accelerator waits for: the stall counters that grew over PROBE_CYCLES."""
    names = [name for name, _ in _STALLS if f"{name}_lo" in csr.registers]
    before = [await csr.read_counter(name) for name in names]
    for _ in range(PROBE_CYCLES):      # the CSR reads return just after a falling edge
        await FallingEdge(csr.driver.clk)
    after = [await csr.read_counter(name) for name in names]
    what = dict(_STALLS)
    return [what[name] for name, b, a in zip(names, before, after, strict=True) if a > b]


def _write_result(job: dict[str, Any], result: dict[str, Any], wall_start: float) -> None:
    result["wall_seconds"] = time.perf_counter() - wall_start
    partial = Path(job["result"] + ".partial")
    partial.write_text(json.dumps(result, indent=1))
    partial.replace(job["result"])
