"""End to end on the simulated board: the systolic SoC in Verilator (boards/simlink.py) behind a TCP
socket, driven by the host driver (boards/host.py) and the runtime's board backend. A GEMM program
and an ONNX model with a host node between two programs run bit-exact with the golden model; a
corrupted frame is rejected by the real bridge and changes nothing; the command line and the
errors of the board backend.

The Verilator build of the small SoC takes a few minutes the first time and is cached
(``~/.cache/systolic/simlink``)."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import warnings
from contextlib import AbstractContextManager
from pathlib import Path

import numpy as np
import pytest
from systolic.boards.host import Board, DeviceStatusError
from systolic.boards.protocol import Command, Status
from systolic.boards.simlink import DEFAULT_DIVISOR, SimLinkError, simulated_board
from systolic.compiler import compile_model, run_model
from systolic.compiler.cli import main
from systolic.compiler.passes import HostFallbackWarning
from systolic.compiler.runtime import BackendError
from systolic.hw.config import AcceleratorConfig
from systolic.sim.golden import run_golden
from systolic.sim.programs import gemm_case

from tests.boards.test_host import FakeDevice
from tests.compiler import models

# A small accelerator, so that the build and the simulation are quick: 4x4 weight-stationary,
# a 32-bit bus, small memories and queues. The SoC memory is the config's DRAM.
CONFIG = AcceleratorConfig(rows=4, cols=4, dma_data_bits=32, scratchpad_bytes=2048,
                           accumulator_bytes=2048, requant_table_rows=16, dram_bytes=65536,
                           dma_outstanding=4, load_queue_depth=4, compute_queue_depth=4,
                           store_queue_depth=4, token_depth=4)
MEMORY = CONFIG.dram_bytes
URL = r"socket://127\.0\.0\.1:\d+"
ROOT = Path(__file__).resolve().parents[2]


def _board() -> AbstractContextManager[str]:
    return simulated_board(CONFIG, memory_bytes=MEMORY, divisor=DEFAULT_DIVISOR)


def _image(case) -> np.ndarray:
    image = case.dram.copy()
    words = np.frombuffer(case.program.words(), np.uint8)
    image[case.program_addr:case.program_addr + words.size] = words
    return image


def _run_gemm_cases(config: AcceleratorConfig, cases: list) -> list[dict[str, int]]:
    """Load each GEMM program and its operands through the bridge of a simulated board of
    ``config``, run them one after another, read the whole image back: equal to the golden
    model's DRAM; the counters report the program's MACs, instructions and the golden model's
    DRAM bus bytes. Returns each run's counters."""
    runs = []
    with simulated_board(config, memory_bytes=MEMORY, divisor=DEFAULT_DIVISOR) as url, \
            Board(url, timeout_s=10) as board:
        info = board.check_config(config)
        assert (info.version, info.bus_bytes, info.memory_bytes) == (1, config.dma_bytes, MEMORY)
        for case in cases:
            image = _image(case)
            board.write_mem(0, image)
            counters = board.run(case.program_addr, len(case.program.instructions), timeout_s=120)
            got = np.frombuffer(board.read_mem(0, image.size), np.uint8)
            case.check(got)
            golden = run_golden(config, case.program, image)
            assert np.array_equal(got, np.asarray(golden.dram, np.uint8)[:image.size]), case.name
            assert counters["macs"] == case.macs == golden.macs
            assert counters["instructions"] == len(case.program.instructions)
            # bus bytes (beats x bus width), as the golden model counts them
            assert counters["dram_write_bytes"] == golden.dram_write_bytes
            assert counters["dram_read_bytes"] == golden.dram_read_bytes
            assert counters["cycles"] > 0
            runs.append(counters)
    return runs


@pytest.mark.slow
def test_gemm_program_matches_golden() -> None:
    """GEMM programs (partial tiles, the extreme -128 * -128 sums, 1xN and Nx1) on the simulated
    board: the golden model's DRAM, MACs, instructions and bus bytes (:func:`_run_gemm_cases`)."""
    _run_gemm_cases(CONFIG, [
        gemm_case(CONFIG, 9, 7, 6, seed=1), gemm_case(CONFIG, 5, 11, 3, extremes=True),
        gemm_case(CONFIG, 1, 9, 5, seed=3, act="relu"), gemm_case(CONFIG, 6, 4, 1, seed=4)])


@pytest.mark.slow
def test_a_compute_clock_of_its_own_matches_golden() -> None:
    """The SoC of a config whose compute core runs on a clock of its own (75 MHz control, 100 MHz
    compute: the harness toggles compute_clk between clk's edges): GEMM programs, extreme values
    among them, as :func:`_run_gemm_cases` checks them; the array's active cycles (compute clock
    cycles) are enough for the MACs, and within the compute core's busy cycles."""
    config = CONFIG.replace(clock_mhz=75.0, compute_clock_mhz=100.0)
    cases = [gemm_case(config, 9, 7, 6, seed=1), gemm_case(config, 5, 11, 3, extremes=True),
             gemm_case(config, 6, 4, 1, seed=4, act="relu")]
    for case, counters in zip(cases, _run_gemm_cases(config, cases), strict=True):
        assert counters["array_active"] * config.rows * config.cols >= case.macs
        assert counters["compute_busy"] >= counters["array_active"]


def test_back_to_back_programs_without_soft_reset() -> None:
    """Two programs of different lengths, the second started without a soft reset: start
    latches the new program's address and length and drops the words fetched before it."""
    cases = [gemm_case(CONFIG, 9, 7, 6, seed=1), gemm_case(CONFIG, 5, 11, 3, seed=2)]
    with _board() as url, Board(url, timeout_s=10) as board:
        for case in cases:
            board.write_mem(0, _image(case))
            board.run(case.program_addr, len(case.program.instructions), timeout_s=120, reset=False)
            case.check(np.frombuffer(board.read_mem(0, case.dram.size), np.uint8))


def test_corrupted_frame_is_rejected_by_the_device() -> None:
    """Line noise on a write (a payload bit) and on a register write: the bridge answers BAD_CRC,
    memory and register keep their values, and the next frames work."""
    rng = np.random.default_rng(3)
    before = rng.integers(0, 256, 512, np.uint8).tobytes()
    with _board() as url, Board(url, timeout_s=10) as board:
        board.write_mem(0x800, before)
        board.corrupt_next_request()
        with pytest.raises(DeviceStatusError, match=(
                rf"^the device rejected a corrupted frame: the CRC of the MEM_WRITE of 64 words at "
                rf"0x00000800 request did not check \(status BAD_CRC\), so nothing was executed; "
                rf"line noise or a wrong baud rate \(115200\) on {URL}$")) as info:
            board.write_mem(0x800, bytes(256))
        assert info.value.status == Status.BAD_CRC
        assert board.read_mem(0x800, 512) == before
        board.write_csr("prog_addr", 0x1240)
        board.corrupt_next_request(-1, 0x81)
        with pytest.raises(DeviceStatusError, match=r"^the device rejected a corrupted frame: the "
                                                    r"CRC of the CSR_WRITE of prog_addr \(0x0c\)"):
            board.write_csr("prog_addr", 0x4000)
        assert board.read_csr("prog_addr") == 0x1240
        board.write_mem(0x802, b"\x01\x02\x03")       # partial words still work afterwards
        assert board.read_mem(0x800, 8) == before[:2] + b"\x01\x02\x03" + before[5:8]


def _concat_model():
    fm = models.concat_branches()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostFallbackWarning)
        compiled = compile_model(fm, config=CONFIG, calibration=models.calibration_set(fm, 3))
    return fm, compiled


@pytest.mark.slow
def test_onnx_model_matches_golden() -> None:
    """A model of two programs with a host node (concat) between them, two images one per run:
    bit-exact with the golden backend; the image crosses the link once, later runs move only the
    host's tensors and the ones it reads; cycles come from the board's counters."""
    fm, compiled = _concat_model()
    assert len(compiled.segments) == 2 and compiled.images_per_run == 1
    inputs = models.calibration_set(fm, 2, seed=7)
    golden = run_model(compiled, inputs)
    with _board() as url:
        board = run_model(compiled, inputs, backend="board", port=url)
    for name, value in golden.outputs.items():
        assert np.array_equal(board.outputs[name], value), name
    report = board.report
    assert report["backend"] == "board" and report["program_runs"] == 4
    assert report["macs"] == golden.report["macs"] == report["array_macs"]
    assert report["instructions"] == golden.report["instructions"]
    assert report["cycles"] > 0 and report["cycles_source"].startswith("the board's performance counters")
    link = report["link"]
    assert re.fullmatch(URL, link["port"]) and link["memory_bytes"] == MEMORY

    def tensor_bytes(names: tuple[str, ...]) -> int:    # whole words: tensors are 64-byte aligned
        return sum(-(-compiled.graph.tensors[n].size // 4) * 4 for n in names)

    first, second = compiled.segments
    # the image once (with image 1's input); then image 1's concat, image 2's input and concat
    assert link["memory_bytes_written"] == \
        compiled.image.size + 2 * tensor_bytes(second.reads) + tensor_bytes(first.reads)
    # per image the branch outputs (the concat's inputs) and the model output; close spans are
    # read in one go, with the gap between them
    needed = 2 * (tensor_bytes(first.writes) + tensor_bytes(second.writes))
    assert needed <= link["memory_bytes_read"] <= needed + 2 * 64


def test_capture_and_a_partial_last_run() -> None:
    """Three images at two per run, with capture: every layer's output of every image is read back
    from the board and equals the golden backend's; the last run's program (one image slot) is
    another compiled model, whose image is loaded when it starts."""
    fm = models.concat_branches()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostFallbackWarning)
        compiled = compile_model(fm, config=CONFIG, calibration=models.calibration_set(fm, 3),
                                 keep_intermediates=True, images_per_run=2)
    inputs = models.calibration_set(fm, 3, seed=9)
    golden = run_model(compiled, inputs, capture=True)
    with _board() as url:
        board = run_model(compiled, inputs, backend="board", port=url, capture=True)
    assert board.report["program_runs"] == 4
    for image in range(3):
        for op in compiled.graph.accel_ops:
            assert np.array_equal(board.intermediates[image][op.output],
                                  golden.intermediates[image][op.output]), (image, op.name)
    for name, value in golden.outputs.items():
        assert np.array_equal(board.outputs[name], value), name
    # both images (every image is a multiple of 4096 bytes); the host's tensors are much smaller
    assert board.report["link"]["memory_bytes_written"] >= compiled.image.size + 4096


def test_board_with_another_config_is_refused() -> None:
    fm = models.matmul_bias()
    other = CONFIG.replace(requant_table_rows=32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostFallbackWarning)
        compiled = compile_model(fm, config=other, calibration=models.calibration_set(fm, 2))
    with _board() as url, pytest.raises(BackendError, match=(
            rf"^the board backend cannot use {URL}: the board at {URL} \(board preset "
            rf"'icebreaker'\) runs an accelerator with config hash {CONFIG.hash & 0xFFFF_FFFF:08x} "
            rf"\(low 32 bits\), but the model was compiled for config {other.hash_hex} ")):
        run_model(compiled, models.calibration_set(fm, 1), backend="board", port=url,
                  board="icebreaker")


def test_cli_run_on_the_board(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fm = models.matmul_bias()
    model = tmp_path / "model.onnx"
    model.write_bytes(fm.SerializeToString())
    config = tmp_path / "config.toml"
    CONFIG.save(config)
    x = models.calibration_set(fm, 1, seed=4)["input"]
    np.save(tmp_path / "x.npy", x)
    np.savez(tmp_path / "cal.npz", **models.calibration_set(fm, 3))
    common = [str(model), "--config", str(config), "--calibrate", str(tmp_path / "cal.npz"),
              "--input", str(tmp_path / "x.npy")]
    assert main(["run", *common, "--output", str(tmp_path / "golden.npz")]) == 0
    # the simulated board from a shell: it prints its URL and serves one connection
    server = subprocess.Popen([sys.executable, "-m", "systolic.boards.simlink", "--config", str(config)],
                              stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        match = re.fullmatch(rf"simulated board \(config {CONFIG.hash_hex}, {MEMORY} bytes of "
                             rf"memory\) at ({URL})\n", line)
        assert match, line
        status = main(["run", *common, "--backend", "board", "--port", match.group(1),
                       "--output", str(tmp_path / "board.npz"), "--report", str(tmp_path / "r.json")])
        assert server.wait(timeout=30) == 0           # the client disconnected
    finally:
        server.kill()
        server.wait()
        server.stdout.close()
    out = capsys.readouterr().out
    assert status == 0, out
    assert "per-layer cycles below are the compile-time estimates (the board counts the total)" in out
    assert re.search(rf"host link {URL}: \d+ requests, \d+ bytes sent, \d+ received in", out)
    golden, board = np.load(tmp_path / "golden.npz"), np.load(tmp_path / "board.npz")
    assert np.array_equal(golden["out"], board["out"])
    assert json.loads((tmp_path / "r.json").read_text())["backend"] == "board"


# -- errors that need no simulator -----------------------------------------------------------------

@pytest.mark.parametrize("args,message", [
    (["--backend", "board"], r"--backend board needs --port: the board's serial port \(e\.g\. "
                             r"/dev/ttyUSB0\) or socket://127\.0\.0\.1:PORT for a simulated board"),
    (["--port", "/dev/null"], r"--port and --baud are for --backend board, not --backend golden"),
    (["--backend", "rtl", "--baud", "9600"], r"--port and --baud are for --backend board, not "
                                             r"--backend rtl"),
])
def test_cli_board_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                message: str) -> None:
    np.save(tmp_path / "x.npy", np.zeros((1, 1, 8, 8), np.float32))
    model = ROOT / "examples" / "digits_cnn_int8.onnx"
    status = main(["run", str(model), "--input", str(tmp_path / "x.npy"), *args])
    assert status == 2
    assert re.fullmatch(rf"systolic: error: {message}\n", capsys.readouterr().err)


def test_cli_unknown_board(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    np.save(tmp_path / "x.npy", np.zeros((1, 1, 8, 8), np.float32))
    model = ROOT / "examples" / "digits_cnn_int8.onnx"
    status = main(["run", str(model), "--input", str(tmp_path / "x.npy"), "--board", "nope",
                   "--backend", "board", "--port", "socket://127.0.0.1:1"])
    assert status == 1
    assert re.fullmatch(r"systolic: error: unknown board 'nope'; the boards are .*\n",
                        capsys.readouterr().err)


def test_board_backend_errors() -> None:
    fm = models.matmul_bias()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostFallbackWarning)
        compiled = compile_model(fm, config=CONFIG, calibration=models.calibration_set(fm, 2))
    inputs = models.calibration_set(fm, 1)
    with pytest.raises(BackendError, match=r"^the board backend needs a port: a serial device such "
                                           r"as /dev/ttyUSB0, or socket://127\.0\.0\.1:PORT for a "
                                           r"simulated board$"):
        run_model(compiled, inputs, backend="board")
    with pytest.raises(BackendError, match=r"^port and baud are for the board backend, not the "
                                           r"'golden' backend$"):
        run_model(compiled, inputs, port="/dev/ttyUSB0")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]          # closed again: nobody listens there
    with pytest.raises(BackendError, match=rf"^the board backend cannot use socket://127\.0\.0\.1:"
                                           rf"{port}: cannot open socket://127\.0\.0\.1:{port}: "):
        run_model(compiled, inputs, backend="board", port=f"socket://127.0.0.1:{port}")


def test_board_backend_errors_from_the_device() -> None:
    """Against the fake device of test_host.py: a model larger than the board's memory, and an
    accelerator error, named with the segment."""
    fm, compiled = _concat_model()
    inputs = models.calibration_set(fm, 1)
    small = FakeDevice(memory_bytes=4096, config_hash_lo=CONFIG.hash & 0xFFFF_FFFF)
    try:
        with pytest.raises(BackendError, match=(
                rf"^the board backend cannot run model 'concat_branches': its DRAM image needs "
                rf"{compiled.image.size} bytes, but the board at {URL} has 4096 bytes of memory$")):
            run_model(compiled, inputs, backend="board", port=small.url)
    finally:
        small.close()
    failing = FakeDevice(memory_bytes=MEMORY, config_hash_lo=CONFIG.hash & 0xFFFF_FFFF,
                         run_error=(2, 5))
    try:
        with pytest.raises(BackendError, match=(
                rf"^the board backend failed on segment 0: the accelerator at {URL} stopped with "
                rf"error 2 \(AXI SLVERR on a DMA or fetch access\) at instruction 5 of the program "
                rf"at {compiled.segments[0].address:#x}; it was soft-reset$")):
            run_model(compiled, inputs, backend="board", port=failing.url)
    finally:
        failing.close()


def test_overlaid_programs_are_written_before_each_run() -> None:
    """The digits CNN on the iCEBreaker preset (its programs share one address, the DRAM being
    too small for them side by side), against the fake device: before each start the device's
    memory holds that run's program at the address the run starts at, in schedule order."""
    from systolic.boards.boards import load_preset
    from systolic.hw.csr import REGISTERS

    config = load_preset("icebreaker")
    compiled = compile_model(ROOT / "examples" / "digits_cnn_int8.onnx", config=config)
    assert compiled.overlay and len(compiled.segments) >= 2
    device = FakeDevice(memory_bytes=config.dram_bytes, config_hash_lo=config.hash & 0xFFFF_FFFF)
    image = np.random.default_rng(2).uniform(0, 1, (1, 1, 8, 8)).astype(np.float32)
    try:
        run_model(compiled, {"input": image}, backend="board", port=device.url)
    finally:
        device.close()
    offset = {r.name: r.offset for r in REGISTERS}
    memory = bytearray(config.dram_bytes)
    prog_addr, started = 0, []
    for r in device.executed:
        if r.cmd == Command.MEM_WRITE:
            memory[r.addr:r.addr + len(r.payload)] = r.payload
        elif r.cmd == Command.CSR_WRITE and r.addr == offset["prog_addr"]:
            prog_addr = int.from_bytes(r.payload, "little")
        elif r.cmd == Command.CSR_WRITE and r.addr == offset["ctrl"] and r.payload[0] & 1:
            size = len(compiled.segments[len(started)].program.words())
            started.append((prog_addr, bytes(memory[prog_addr:prog_addr + size])))
    assert started == [(seg.address, seg.program.words()) for seg in compiled.segments]


def test_simulated_board_argument_errors() -> None:
    with pytest.raises(ValueError, match=r"^max_cycles must be a positive integer or None, not 0$"):
        with simulated_board(CONFIG, memory_bytes=MEMORY, max_cycles=0):
            pass
    with pytest.raises(ValueError, match=r"^idle_seconds must be a positive number of seconds, "
                                         r"not -1$"):
        with simulated_board(CONFIG, memory_bytes=MEMORY, idle_seconds=-1):
            pass
    with pytest.raises(ValueError, match=r"^port must be a TCP port number between 0 and 65535, "
                                         r"not 65536$"):
        with simulated_board(CONFIG, memory_bytes=MEMORY, port=65536):
            pass
    with pytest.raises(ValueError, match=r"^divisor must be at least 4 clock cycles per bit, not 2$"):
        with simulated_board(CONFIG, memory_bytes=MEMORY, divisor=2):
            pass
    assert issubclass(SimLinkError, RuntimeError)


@pytest.mark.slow
def test_firmware_control_with_a_loaded_core_ram() -> None:
    """Firmware control whose core RAM the host loads (``firmware_ram="loaded"``, as the iCE40's
    SPRAM): before the load STATUS bit 2 is clear and a start ends with error 7; the runtime's
    board backend loads the firmware over the link (once), and an ONNX model then runs bit-exact
    with the golden backend."""
    from systolic.boards.host import AcceleratorError
    from systolic.hw.csr import NO_FIRMWARE
    from systolic.hw.fw_engine import firmware_load

    config = CONFIG.replace(control="firmware")
    fm = models.matmul_bias()
    compiled = compile_model(fm, config=config, calibration=models.calibration_set(fm, 8))
    inputs = models.calibration_set(fm, 2, seed=3)
    golden = run_model(compiled, inputs)
    # one connection per simulated board: the first, fresh from "configuration", is not loaded
    with simulated_board(config, memory_bytes=MEMORY, firmware_ram="loaded") as url, \
            Board(url, timeout_s=10) as board:
        assert board.read_csr("status") & 4 == 0
        with pytest.raises(AcceleratorError, match=rf"stopped with error {NO_FIRMWARE} \(start without "
                                                   r"firmware"):
            board.run(0, 1, timeout_s=60)
    with simulated_board(config, memory_bytes=MEMORY, firmware_ram="loaded") as url:
        result = run_model(compiled, inputs, backend="board", port=url)
    for name, value in golden.outputs.items():
        assert np.array_equal(result.outputs[name], value), name
    words = sum(len(run) for _, run in firmware_load(config))
    # the firmware crossed the link once: a CSR write per word, and a few more
    assert result.report["link"]["requests"] > words
    assert result.report["macs"] == golden.report["macs"]
