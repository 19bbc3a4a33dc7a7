"""A simulated board: the systolic SoC in Verilator behind a TCP socket that speaks its UART.

:func:`build_soc_sim` builds ``systolic_soc`` (the Verilog of
:func:`systolic.boards.soc.soc_verilog`) with the C++ harness ``hdl/soc_harness.cpp`` into a
plain Verilator executable (``verilator --cc --exe --build``, no cocotb): the harness toggles the
clock itself, listens on 127.0.0.1, and moves the bytes of one TCP client bit by bit onto
``uart_rx`` (8N1 at ``divisor`` cycles per bit) and the bits of ``uart_tx`` back into bytes. The
build is cached per configuration, Verilog text, divisor and tool version
(:func:`systolic.sim.tools.build_cache_dir`), like the cocotb builds.

:func:`simulated_board` starts the executable and yields its ``socket://127.0.0.1:PORT`` URL,
which :class:`systolic.boards.host.Board` opens like a serial port
(``serial.serial_for_url``); the process is stopped when the block ends. From a shell,
``python -m systolic.boards.simlink --config FILE`` prints the URL and serves one connection, e.g.
of ``systolic run --backend board --port URL``.

Waveforms: with ``waves`` (or ``SYSTOLIC_WAVES=1``) the build traces and the run writes
``soc.vcd`` into the run directory (kept, and named in the log).

Units: cycles, bytes, seconds.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from systolic.hw.config import AcceleratorConfig
from systolic.sim import tools

from .protocol import DEFAULT_TIMEOUT_BITS
from .uart import check_divisor

__all__ = ["SOC_TOP", "DEFAULT_DIVISOR", "HARNESS", "SimLinkError", "soc_sim_verilog", "build_soc_sim",
           "simulated_board", "main"]

#: Top module of the SoC (:func:`systolic.boards.soc.soc_verilog`).
SOC_TOP = "systolic_soc"
#: Clock cycles per UART bit in simulation: the SoC's smallest (``boards/uart.py`` MIN_DIVISOR), so
#: that a byte costs only 40 cycles.
DEFAULT_DIVISOR = 4
#: The C++ harness (main loop, clock, socket-to-UART bridge).
HARNESS = Path(__file__).resolve().parent / "hdl" / "soc_harness.cpp"

# Verilator arguments of the build besides the waivers: -O2 gives a fast model for a moderate
# C++ compile time; the SoC has no delays, so no --timing.
_BUILD_ARGS: tuple[str, ...] = ("-CFLAGS", "-O2", "-CFLAGS", "-std=gnu++17", "--no-timing")
# Seconds to wait for the started simulator to print its port.
_START_SECONDS = 30.0


class SimLinkError(RuntimeError):
    """The simulated board could not be built or started; the message quotes the tool's or the
    simulator's output."""


def soc_sim_verilog(config: AcceleratorConfig, *, memory_bytes: int, divisor: int,
                    firmware_ram: str | None = None) -> str:
    """Verilog of ``systolic_soc`` for ``config`` (:func:`systolic.boards.soc.soc_verilog`,
    ``firmware_ram`` as there), cached in ``build_cache_dir("verilog", ...)`` per config hash,
    ``memory_bytes``, ``divisor``, ``firmware_ram`` and a hash of the hw/ and boards/ sources
    (the packaged firmware included) and the Amaranth version: elaborating the accelerator takes
    seconds."""
    from systolic.boards import soc
    from systolic.hw import top as hw_top

    if not isinstance(config, AcceleratorConfig):
        raise TypeError(f"config must be an AcceleratorConfig, not {type(config).__name__}")
    digest = hashlib.sha256(f"{config.hash_hex}/{memory_bytes}/{divisor}/{firmware_ram}".encode())
    digest.update(_version("amaranth").encode())
    hw_dir = Path(hw_top.__file__).resolve().parent
    sources = [*hw_dir.glob("*.py"), *(hw_dir / "firmware_src").glob("*"),
               *Path(soc.__file__).resolve().parent.glob("*.py")]
    for source in sorted(sources):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    key = f"{SOC_TOP}-{config.hash_hex}-{digest.hexdigest()[:16]}"
    path = tools.build_cache_dir("verilog", key) / f"{SOC_TOP}.v"
    if path.is_file():
        return path.read_text()
    text = soc.soc_verilog(config, memory_bytes=memory_bytes, divisor=divisor, firmware_ram=firmware_ram)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(text)
    partial.replace(path)
    return text


def _compute_clock_defines(config: AcceleratorConfig) -> list[str]:
    """The harness's compute clock (C++ defines) for a config with ``compute_clock_mhz``: the
    two clocks' half periods and the compute clock's first edge as the RTL flow's
    (:func:`systolic.sim.rtl.compute_clock_wrapper`); none for one clock."""
    if not config.compute_clock_mhz:
        return []
    from systolic.sim import rtl

    return ["-CFLAGS", f"-DSYSTOLIC_CLOCK_HALF_PS={rtl.CLOCK_PERIOD_NS * 1000 // 2}",
            "-CFLAGS", f"-DSYSTOLIC_COMPUTE_HALF_PS={rtl.compute_half_period_ps(config)}",
            "-CFLAGS", f"-DSYSTOLIC_COMPUTE_FIRST_PS={rtl.COMPUTE_CLOCK_FIRST_EDGE_PS}"]


def build_soc_sim(config: AcceleratorConfig, *, memory_bytes: int, divisor: int = DEFAULT_DIVISOR,
                  waves: bool | None = None, firmware_ram: str | None = None) -> Path:
    """Build the simulated board (or find its cached build); returns the executable.

    ``memory_bytes``: the SoC's on-chip memory, bytes; ``divisor``: clock cycles per UART bit;
    ``waves``: compile in VCD tracing (default: ``SYSTOLIC_WAVES``); ``firmware_ram``: as
    :func:`soc_sim_verilog`'s. Raises :class:`SimLinkError`
    quoting the end of the build log when Verilator or the C++ compiler fails."""
    check_divisor(divisor)
    waves = tools.waves_enabled() if waves is None else waves
    verilog = soc_sim_verilog(config, memory_bytes=memory_bytes, divisor=divisor, firmware_ram=firmware_ram)
    harness = HARNESS.read_text()
    args = [*tools.VERILATOR_WAIVERS, "-Wno-fatal", *_BUILD_ARGS, *_compute_clock_defines(config)]
    if waves:
        args += ["--trace", "-CFLAGS", "-DSYSTOLIC_TRACE"]
    digest = tools.design_hash(verilog, harness, " ".join(args), f"divisor={divisor}",
                               f"waves={waves}", f"verilator={_version('verilator')}")
    build_dir = tools.build_cache_dir("simlink", f"{SOC_TOP}-{config.hash_hex}-{digest}")
    binary = build_dir / "obj" / f"V{SOC_TOP}"
    stamp = build_dir / "build.ok"
    with tools.build_lock(build_dir):
        if stamp.is_file() and binary.is_file():
            return binary
        (build_dir / f"{SOC_TOP}.v").write_text(verilog)
        (build_dir / HARNESS.name).write_text(harness)
        jobs = str(max(1, min(2, os.cpu_count() or 1)))
        command = [str(tools.verilator_bin()), "--cc", "--exe", "--build", "-j", jobs,
                   "--top-module", SOC_TOP, "--Mdir", "obj", "-o", f"V{SOC_TOP}", *args,
                   f"{SOC_TOP}.v", HARNESS.name]
        log = build_dir / "build.log"
        with open(log, "w") as out:
            result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=build_dir,
                                    env=tools.tool_env(), check=False)
        if result.returncode != 0 or not binary.is_file():
            tail = log.read_text(errors="replace").strip().splitlines()[-30:]
            raise SimLinkError(f"Verilator build of the simulated board {SOC_TOP!r} failed with "
                               f"status {result.returncode}; the log {log} ends:\n" + "\n".join(tail))
        # keep the executable only: the objects and generated C++ are a hundred megabytes
        for path in binary.parent.iterdir():
            if path != binary:
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
        stamp.write_text(digest + "\n")
    return binary


@contextlib.contextmanager
def simulated_board(config: AcceleratorConfig, *, memory_bytes: int, divisor: int = DEFAULT_DIVISOR,
                    max_cycles: int | None = None, idle_seconds: float = 120.0,
                    grace_cycles: int | None = None, waves: bool | None = None,
                    port: int = 0, firmware_ram: str | None = None) -> Iterator[str]:
    """Start a simulated board for ``config`` (see :func:`build_soc_sim`) and yield its
    ``socket://127.0.0.1:PORT`` URL; the simulator stops when the block ends.

    The simulator accepts one connection and exits when it closes, after ``max_cycles`` clock
    cycles (None: no limit), or after ``idle_seconds`` without traffic while the SoC is idle.
    ``grace_cycles``: idle cycles it keeps simulating before it sleeps until the next byte
    (default: a little longer than the bridge's inter-byte timeout, so that a partial frame is
    answered with TIMEOUT as on a board). ``port``: the TCP port (0: any free one).
    ``firmware_ram``: as :func:`soc_sim_verilog`'s (``"loaded"``: the host loads the firmware, as
    on an iCE40 whose core RAM is SPRAM). Raises
    :class:`SimLinkError` when the simulator cannot start."""
    with _running(config, memory_bytes=memory_bytes, divisor=divisor, max_cycles=max_cycles,
                  idle_seconds=idle_seconds, grace_cycles=grace_cycles, waves=waves,
                  port=port, firmware_ram=firmware_ram) as (_, url):
        yield url


@contextlib.contextmanager
def _running(config: AcceleratorConfig, *, memory_bytes: int, divisor: int, max_cycles: int | None,
             idle_seconds: float, grace_cycles: int | None, waves: bool | None,
             port: int, firmware_ram: str | None = None) -> Iterator[tuple[subprocess.Popen, str]]:
    if max_cycles is not None and (isinstance(max_cycles, bool) or not isinstance(max_cycles, int)
                                   or max_cycles < 1):
        raise ValueError(f"max_cycles must be a positive integer or None, not {max_cycles!r}")
    if isinstance(idle_seconds, bool) or not isinstance(idle_seconds, int | float) or idle_seconds <= 0:
        raise ValueError(f"idle_seconds must be a positive number of seconds, not {idle_seconds!r}")
    if grace_cycles is not None and (isinstance(grace_cycles, bool) or not isinstance(grace_cycles, int)
                                     or grace_cycles < 1):
        raise ValueError(f"grace_cycles must be a positive integer or None, not {grace_cycles!r}")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be a TCP port number between 0 and 65535, not {port!r}")
    waves = tools.waves_enabled() if waves is None else waves
    binary = build_soc_sim(config, memory_bytes=memory_bytes, divisor=divisor, waves=waves,
                           firmware_ram=firmware_ram)
    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=binary.parent.parent))
    port_file = run_dir / "port"
    command = [str(binary), "--divisor", str(divisor), "--port", str(port), "--port-file", str(port_file),
               "--idle-seconds", str(float(idle_seconds))]
    if max_cycles is not None:
        command += ["--max-cycles", str(max_cycles)]
    if grace_cycles is None:
        grace_cycles = (DEFAULT_TIMEOUT_BITS + 100) * divisor
    command += ["--grace-cycles", str(grace_cycles)]
    if waves:
        command += ["--vcd", str(run_dir / "soc.vcd")]
    log_path = run_dir / "sim.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=run_dir,
                                   stdin=subprocess.DEVNULL)
    try:
        chosen = _wait_for_port(process, port_file, log_path)
        yield process, f"socket://127.0.0.1:{chosen}"
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if waves:
            print(f"waveform: {run_dir / 'soc.vcd'}")
        else:
            shutil.rmtree(run_dir, ignore_errors=True)


def _wait_for_port(process: subprocess.Popen, port_file: Path, log_path: Path) -> int:
    deadline = time.monotonic() + _START_SECONDS
    while time.monotonic() < deadline:
        if port_file.is_file():
            return int(port_file.read_text().strip())
        if process.poll() is not None:
            tail = "\n".join(log_path.read_text(errors="replace").strip().splitlines()[-20:])
            raise SimLinkError(f"the simulated board exited with status {process.returncode} "
                               f"before listening; its log {log_path} ends:\n{tail}")
        time.sleep(0.02)
    raise SimLinkError(f"the simulated board did not write its port within {_START_SECONDS:.0f} s; "
                       f"see its log {log_path}")


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "none"


def main(argv: list[str] | None = None) -> int:
    """``python -m systolic.boards.simlink``: start a simulated board, print its URL, and serve one
    connection (e.g. ``systolic run --backend board --port URL``); returns the simulator's exit
    status (0 when the client disconnected)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m systolic.boards.simlink",
                                     description="Run the systolic SoC in Verilator behind a TCP "
                                                 "socket: a simulated board for one connection.")
    parser.add_argument("--config", metavar="FILE", help="TOML accelerator config (default: built-in)")
    parser.add_argument("--memory-bytes", type=int, metavar="N",
                        help="SoC memory, bytes (default: the config's dram_bytes)")
    parser.add_argument("--divisor", type=int, default=DEFAULT_DIVISOR, metavar="N",
                        help=f"clock cycles per UART bit (default {DEFAULT_DIVISOR})")
    parser.add_argument("--port", type=int, default=0, metavar="N",
                        help="TCP port on 127.0.0.1 (default: any free one)")
    parser.add_argument("--idle-seconds", type=float, default=600.0, metavar="S",
                        help="exit after this long without traffic (default 600)")
    args = parser.parse_args(argv)
    config = AcceleratorConfig() if args.config is None else AcceleratorConfig.from_toml(args.config)
    memory = config.dram_bytes if args.memory_bytes is None else args.memory_bytes
    with _running(config, memory_bytes=memory, divisor=args.divisor, max_cycles=None,
                  idle_seconds=args.idle_seconds, grace_cycles=None, waves=None,
                  port=args.port) as (process, url):
        print(f"simulated board (config {config.hash_hex}, {memory} bytes of memory) at {url}",
              flush=True)
        try:
            return process.wait()
        except KeyboardInterrupt:
            return 130


if __name__ == "__main__":
    raise SystemExit(main())
