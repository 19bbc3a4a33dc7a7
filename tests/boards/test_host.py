"""The board host driver (boards/host.py) against a fake device: a thread that speaks the host link
protocol (docs/board.md) on a TCP socket, with the memory and registers of an SoC and faults to
inject. Framing, splitting into frames, read-modify-write of partial words, registers by name,
program runs, and every error message."""

from __future__ import annotations

import re
import socket
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pytest
from systolic.boards import protocol
from systolic.boards.host import (
    AcceleratorError,
    Board,
    BoardLinkError,
    ConfigMismatchError,
    DeviceStatusError,
    LinkCorruptionError,
    LinkTimeoutError,
    RunTimeoutError,
)
from systolic.boards.protocol import Command, Status
from systolic.hw.config import AcceleratorConfig
from systolic.hw.csr import COUNTERS, ERROR_CODES, register_map

CONFIG = AcceleratorConfig(rows=4, cols=4, dma_data_bits=32)
REGISTERS = register_map()
OFFSET_NAMES = {int(v["offset"]): k for k, v in REGISTERS.items()}
URL = r"socket://127\.0\.0\.1:\d+"


@dataclass
class FakeDevice:
    """A device on 127.0.0.1 that answers its clients like the SoC's bridge.

    ``faults``: actions for the next requests, one per request, in order: ``"silent"`` (no
    answer), ``"partial"`` (sync and status only), ``"bad_crc"`` (a damaged response CRC),
    ``"garbage"`` (noise bytes before a correct answer), ``"noise"`` (only noise),
    ``("status", n)`` (answer status n and execute nothing), ``"close"`` (drop the connection).
    A program run started through ``ctrl`` finishes after ``run_polls`` reads of ``status``, or
    stops with ``run_error`` = (code, pc), or never finishes when ``run_polls`` is None.
    ``fw_data`` words are kept in ``fw_words``; CTRL bit 2 sets STATUS bit 2 (firmware ready)
    unless ``fw_broken``."""

    memory_bytes: int = 4096
    config_hash_lo: int = CONFIG.hash & 0xFFFF_FFFF
    bus_bytes: int = 4
    info_payload: bytes | None = None
    run_polls: int | None = 2
    run_error: tuple[int, int] | None = None
    faults: deque = field(default_factory=deque)
    executed: list[protocol.Request] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    fw_broken: bool = False

    def __post_init__(self) -> None:
        if not self.counters:
            self.counters = {name: (i + 1) << 33 | (i * 7 + 3) for i, (name, _) in enumerate(COUNTERS)}
        self._run_settings = (self.run_polls, self.run_error)
        self.reset()
        self._closed = False
        self._server = socket.socket()
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(1)
        self.port = self._server.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def reset(self) -> None:
        """Memory of random bytes, registers zero, no program running, no faults queued, the
        run settings given at construction."""
        rng = np.random.default_rng(5)
        self.memory = bytearray(rng.integers(0, 256, self.memory_bytes, np.uint8).tobytes())
        self.regs = {name: 0 for name, reg in REGISTERS.items() if reg["access"] == "rw"}
        self.status = self.error = self.error_pc = self.polls_left = 0
        self.fw_words: list[tuple[int, int]] = []
        self.fw_ready = 0
        self.run_polls, self.run_error = self._run_settings
        self.latched: dict[str, int] = {}
        self.ctrl_writes: list[int] = []
        self.faults.clear()
        self.executed.clear()

    @property
    def url(self) -> str:
        return f"socket://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._closed = True
        self._server.close()
        self._thread.join(timeout=5)

    # -- the link ----------------------------------------------------------------------------

    def _serve(self) -> None:
        self._server.settimeout(0.05)      # so that close() ends this loop soon
        while not self._closed:            # one thread per client; the tests use one at a time
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            threading.Thread(target=self._client, args=(conn,), daemon=True).start()

    def _client(self, conn: socket.socket) -> None:
        with conn:
            buf = bytearray()
            while True:
                try:
                    data = conn.recv(4096)
                except OSError:
                    return
                if not data:
                    return
                buf += data
                while True:
                    frame = self._take_frame(buf)
                    if frame is None:
                        break
                    answer = self._answer(frame)
                    if answer is None:
                        return
                    conn.sendall(answer)

    @staticmethod
    def _take_frame(buf: bytearray) -> bytes | None:
        while buf and buf[0] != protocol.REQUEST_SYNC:    # resync: skip bytes between frames
            del buf[0]
        if len(buf) < protocol.HEADER_BYTES:
            return None
        count = int.from_bytes(buf[6:8], "little")
        size = protocol.HEADER_BYTES + protocol.request_payload_bytes(buf[1], count) + 1
        if len(buf) < size:
            return None
        frame = bytes(buf[:size])
        del buf[:size]
        return frame

    def _answer(self, frame: bytes) -> bytes | None:
        fault = self.faults.popleft() if self.faults else None
        if fault == "close":
            return None
        if fault == "silent":
            return b""
        if fault == "noise":
            return bytes(range(1, 90))
        if isinstance(fault, tuple):
            return protocol.encode_response(fault[1])
        try:
            request = protocol.decode_request(frame)
        except protocol.ChecksumError:
            return protocol.encode_response(Status.BAD_CRC)
        status = protocol.check_request(request, memory_bytes=self.memory_bytes)
        payload = b""
        if status == Status.OK:
            status, payload = self._execute(request)
        if status == Status.OK:
            self.executed.append(request)
        answer = protocol.encode_response(status, payload)
        if fault == "partial":
            return answer[:2]
        if fault == "bad_crc":
            return answer[:-1] + bytes([answer[-1] ^ 0x10])
        if fault == "garbage":
            return b"\x00\xff\x13" + answer
        return answer

    # -- the SoC -----------------------------------------------------------------------------

    def _execute(self, r: protocol.Request) -> tuple[Status, bytes]:
        if r.cmd == Command.INFO:
            info = protocol.Info(protocol.PROTOCOL_VERSION, self.bus_bytes, self.memory_bytes,
                                 self.config_hash_lo)
            return Status.OK, self.info_payload or protocol.encode_info(info)
        if r.cmd == Command.MEM_WRITE:
            self.memory[r.addr:r.addr + 4 * r.count] = r.payload
            return Status.OK, b""
        if r.cmd == Command.MEM_READ:
            return Status.OK, bytes(self.memory[r.addr:r.addr + 4 * r.count])
        name = OFFSET_NAMES.get(r.addr)
        if name is None:
            return Status.BUS_ERROR, b""
        if r.cmd == Command.CSR_WRITE:
            return self._write_csr(name, int.from_bytes(r.payload, "little")), b""
        value = self._read_csr(name)
        return (Status.OK, value.to_bytes(4, "little")) if value is not None else (Status.BUS_ERROR, b"")

    def _write_csr(self, name: str, value: int) -> Status:
        if name == "ctrl":
            self.ctrl_writes.append(value)
            if value & 2:
                self.status, self.error = 0, 0
            if value & 1:
                self.status, self.error, self.error_pc = 1, 0, 0
                self.polls_left = self.run_polls
            if value & 4 and not self.fw_broken:
                self.fw_ready = 4
            return Status.OK
        if name == "fw_data":
            self.fw_words.append((self.regs["fw_addr"], value))
            self.regs["fw_addr"] += 1
            self.fw_ready = 0
            return Status.OK
        if name not in self.regs:
            return Status.BUS_ERROR          # a read-only register answers SLVERR
        self.regs[name] = value
        return Status.OK

    def _read_csr(self, name: str) -> int | None:
        if name == "status":
            if self.status & 1:
                if self.run_error is not None:
                    self.error, self.error_pc = self.run_error
                    self.status = 2
                elif self.polls_left is not None:
                    self.polls_left -= 1
                    if self.polls_left <= 0:
                        self.status = 2
            return self.status | self.fw_ready | self.error << 4
        if name == "error_pc":
            return self.error_pc
        if name == "pc":
            return 17
        if name == "ctrl":
            return 0
        if name in self.regs:
            return self.regs[name]
        if name == "config_hash_lo":
            return self.config_hash_lo
        if name == "config_hash_hi":
            return 0
        base, half = name.rsplit("_", 1)
        if half == "lo":
            self.latched[base] = self.counters[base] >> 32
            return self.counters[base] & 0xFFFF_FFFF
        return self.latched.get(base, 0)


@pytest.fixture(scope="module")
def _link() -> Iterator[tuple[FakeDevice, Board]]:
    # one device and one connection for the module (pyserial's socket close sleeps 0.3 s)
    dev = FakeDevice()
    board = Board(dev.url, timeout_s=0.5)
    yield dev, board
    board.close()
    dev.close()


@pytest.fixture
def device(_link: tuple[FakeDevice, Board]) -> FakeDevice:
    """The module's fake device, reset to its initial state."""
    dev = _link[0]
    dev.reset()
    return dev


@pytest.fixture
def board(_link: tuple[FakeDevice, Board], device: FakeDevice) -> Board:
    """The module's connection to the fake device, with its statistics reset."""
    b = _link[1]
    b.bytes_sent = b.bytes_received = b.requests = 0
    b._info = None
    return b


# -- INFO and the config check ---------------------------------------------------------------------

def test_info(board: Board, device: FakeDevice) -> None:
    info = board.info()
    assert (info.version, info.bus_bytes, info.memory_bytes, info.config_hash_lo) == \
        (1, 4, 4096, CONFIG.hash & 0xFFFF_FFFF)
    assert board.check_config(CONFIG) == info
    assert board.requests == 2 and board.bytes_sent == 2 * 9
    assert board.bytes_received == 2 * (3 + protocol.INFO_BYTES)


def test_config_hash_mismatch_names_both_hashes_and_the_preset(device: FakeDevice) -> None:
    other = CONFIG.replace(rows=8)
    with Board(device.url, board="icebreaker") as b:
        with pytest.raises(ConfigMismatchError, match=(
                rf"^the board at {URL} \(board preset 'icebreaker'\) runs an accelerator with config "
                rf"hash {CONFIG.hash & 0xFFFF_FFFF:08x} \(low 32 bits\), but the model was compiled "
                rf"for config {other.hash_hex} \(low 32 bits {other.hash & 0xFFFF_FFFF:08x}\): "
                rf"program the board with a bitstream of that config, or compile for the board's "
                rf"config$")):
            b.check_config(other)
    assert isinstance(ConfigMismatchError("x"), ValueError)


def test_config_mismatch_without_preset_and_bus_width() -> None:
    dev = FakeDevice(config_hash_lo=0x1234, bus_bytes=8)
    try:
        with Board(dev.url) as b:
            with pytest.raises(ConfigMismatchError, match=rf"^the board at {URL} \(no board preset "
                                                          rf"given\) runs an accelerator with config "
                                                          rf"hash 00001234 \(low 32 bits\)"):
                b.check_config(CONFIG)
            dev.config_hash_lo = CONFIG.hash & 0xFFFF_FFFF
            with pytest.raises(ConfigMismatchError, match=(
                    rf"^the board at {URL} \(no board preset given\) reports a 8-byte accelerator "
                    rf"bus, but config {CONFIG.hash_hex} has 4 bytes \(dma_data_bits 32\)$")):
                b.check_config(CONFIG)
            with pytest.raises(TypeError, match=r"^config must be an AcceleratorConfig, not dict$"):
                b.check_config({})
    finally:
        dev.close()


@pytest.mark.parametrize("payload,message", [
    (b"NOPE" + bytes(12), r"INFO payload must start with b'SYST', not b'NOPE'"),
    (b"SYST" + bytes([1, 4, 1, 0]) + bytes(8), r"INFO reserved field must be 0, not 1"),
])
def test_info_from_something_else(payload: bytes, message: str) -> None:
    dev = FakeDevice(info_payload=payload)
    try:
        with Board(dev.url) as b, pytest.raises(BoardLinkError, match=(
                rf"^the device at {URL} does not answer INFO like a systolic SoC: {message}$")):
            b.info()
    finally:
        dev.close()


def test_info_protocol_version() -> None:
    dev = FakeDevice(info_payload=b"SYST" + bytes([2, 4, 0, 0]) + bytes(8))
    try:
        with Board(dev.url) as b, pytest.raises(BoardLinkError, match=(
                rf"^the device at {URL} speaks host link protocol version 2, but this driver "
                rf"speaks version 1$")):
            b.info()
    finally:
        dev.close()


# -- memory: splitting and read-modify-write ---------------------------------------------------------

def test_memory_random_ranges(board: Board, device: FakeDevice) -> None:
    """Random byte ranges of every alignment, within one word and across many frames, the first
    and the last byte of memory: what is read equals a reference copy; writes change exactly
    their bytes."""
    rng = np.random.default_rng(1)
    reference = bytearray(device.memory)
    ranges = [(0, 1), (4095, 1), (4092, 4), (0, 4096), (1, 2), (5, 2), (6, 300), (3, 257),
              (1000, 1024), (2047, 0)]
    ranges += [(int(a), int(rng.integers(0, min(700, 4096 - a) + 1)))
               for a in rng.integers(0, 4096, 25)]
    for addr, size in ranges:
        data = rng.integers(0, 256, size, np.uint8).tobytes()
        board.write_mem(addr, data)
        reference[addr:addr + size] = data
        assert device.memory == reference, (addr, size)
        lo = int(rng.integers(0, 4096))
        n = int(rng.integers(0, 4096 - lo + 1))
        assert board.read_mem(lo, n) == bytes(reference[lo:lo + n]), (lo, n)
        assert board.read_mem(addr, size) == data


def test_frames_are_split_at_64_words(board: Board, device: FakeDevice) -> None:
    board.write_mem(256, bytes(range(256)) * 4)                     # 256 aligned words
    writes = [r for r in device.executed if r.cmd == Command.MEM_WRITE]
    assert [(r.addr, r.count) for r in writes] == [(256, 64), (512, 64), (768, 64), (1024, 64)]
    device.executed.clear()
    got = board.read_mem(8, 4 * 130)
    assert got == bytes(device.memory[8:528]) and got[248:] == (bytes(range(256)) * 4)[:272]
    reads = [(r.addr, r.count) for r in device.executed]
    assert reads == [(8, 64), (264, 64), (520, 2)]


def test_partial_words_are_read_modify_written(board: Board, device: FakeDevice) -> None:
    before = bytes(device.memory)
    board.write_mem(101, b"\x11\x22")                  # inside one word: one read, one write
    assert [(Command(r.cmd).name, r.addr, r.count) for r in device.executed] == \
        [("MEM_READ", 100, 1), ("MEM_WRITE", 100, 1)]
    assert device.memory[100:104] == before[100:101] + b"\x11\x22" + before[103:104]
    device.executed.clear()
    board.write_mem(203, bytes(7))                     # both ends partial: two reads, one write
    assert [(Command(r.cmd).name, r.addr, r.count) for r in device.executed] == \
        [("MEM_READ", 200, 1), ("MEM_READ", 208, 1), ("MEM_WRITE", 200, 3)]
    assert device.memory[200:212] == before[200:203] + bytes(7) + before[210:212]
    device.executed.clear()
    board.write_mem(300, np.arange(3, dtype=np.int32))  # aligned: no read
    assert [(Command(r.cmd).name, r.addr, r.count) for r in device.executed] == [("MEM_WRITE", 300, 3)]
    assert device.memory[300:312] == np.arange(3, dtype="<i4").tobytes()
    device.executed.clear()
    board.write_mem(400, b"")                          # nothing to do
    assert board.read_mem(400, 0) == b""
    assert device.executed == []


@pytest.mark.parametrize("call,error,message", [
    (lambda b: b.read_mem(-1, 4), ValueError,
     r"^addr must be a byte address between 0 and 2\*\*32 - 1, not -1$"),
    (lambda b: b.read_mem(0, 1.5), ValueError, r"^nbytes must be a non-negative integer, not 1\.5$"),
    (lambda b: b.read_mem(2**32 - 2, 4), ValueError,
     r"^the range of 4 bytes at 0xfffffffe ends past the 32-bit address space$"),
    (lambda b: b.write_mem(0, [1, 2]), TypeError, r"^data must be bytes or a numpy array, not list$"),
    (lambda b: b.write_mem(True, b"1"), ValueError, r"^addr must be a byte address"),
])
def test_memory_argument_errors(board: Board, call, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        call(board)


# -- registers -------------------------------------------------------------------------------------

def test_registers_by_name(board: Board, device: FakeDevice) -> None:
    board.write_csr("prog_addr", 0xDEAD_BEE0)
    assert device.regs["prog_addr"] == 0xDEAD_BEE0
    assert board.read_csr("prog_addr") == 0xDEAD_BEE0
    assert board.read_csr("config_hash_lo") == CONFIG.hash & 0xFFFF_FFFF
    name = COUNTERS[3][0]
    assert board.read_counter(name) == device.counters[name]
    offsets = [r.addr for r in device.executed if r.cmd == Command.CSR_READ][-2:]
    assert offsets == [REGISTERS[f"{name}_lo"]["offset"], REGISTERS[f"{name}_hi"]["offset"]]


def test_register_errors(board: Board) -> None:
    with pytest.raises(ValueError, match=r"^register must be one of ctrl, status, .*, not 'nope'$"):
        board.read_csr("nope")
    with pytest.raises(ValueError, match=r"^register 'status' is read-only; writable registers are "
                                         r"ctrl, prog_addr, dram_base, prog_len, fw_addr, fw_data$"):
        board.write_csr("status", 1)
    with pytest.raises(ValueError, match=r"^value of register 'prog_len' must be an integer between "
                                         r"0 and 2\*\*32 - 1, not 4294967296$"):
        board.write_csr("prog_len", 1 << 32)


def test_firmware_is_loaded_once_and_only_under_firmware_control(device: FakeDevice) -> None:
    """ensure_firmware writes firmware_load(config)'s runs through fw_addr and fw_data and sets
    CTRL bit 2 when STATUS bit 2 is clear; nothing when it is set or under hardware control."""
    from systolic.hw.fw_engine import firmware_load

    config = CONFIG.replace(control="firmware", dma_data_bits=32, load_queue_depth=4,
                            compute_queue_depth=4, store_queue_depth=4, requant_table_rows=8)
    expected = [(first + i, word) for first, words in firmware_load(config) for i, word in enumerate(words)]
    with Board(device.url) as b:
        assert b.ensure_firmware(CONFIG) == 0 and device.fw_words == []
        assert b.ensure_firmware(config) == len(expected)
        assert device.fw_words == expected and device.ctrl_writes == [4]
        assert b.ensure_firmware(config) == 0 and len(device.fw_words) == len(expected)


def test_firmware_that_does_not_become_ready_is_an_error() -> None:
    device = FakeDevice(fw_broken=True)
    config = CONFIG.replace(control="firmware", dma_data_bits=32, load_queue_depth=4,
                            compute_queue_depth=4, store_queue_depth=4, requant_table_rows=8)
    try:
        with Board(device.url) as b, pytest.raises(
                BoardLinkError, match=rf"^the accelerator at {URL} does not report its firmware ready after "
                                      r"\d+ words were loaded$"):
            b.ensure_firmware(config)
    finally:
        device.close()


# -- running a program ------------------------------------------------------------------------------

def test_run_returns_the_counters(board: Board, device: FakeDevice) -> None:
    device.run_polls = 5
    counters = board.run(0x400, 12, timeout_s=5, poll_s=0)
    assert counters == device.counters
    assert (device.regs["prog_addr"], device.regs["prog_len"], device.regs["dram_base"]) == (0x400, 12, 0)
    assert device.ctrl_writes == [2, 1]                 # soft reset, start
    assert device.polls_left == 0
    board.run(0x800, 3, timeout_s=5, poll_s=0, reset=False)
    assert device.ctrl_writes == [2, 1, 1]


def test_run_error_names_the_code_and_instruction_and_resets(board: Board, device: FakeDevice) -> None:
    device.run_error = (3, 7)
    with pytest.raises(AcceleratorError, match=(
            rf"^the accelerator at {URL} stopped with error 3 \({re.escape(ERROR_CODES[3])}\) at "
            rf"instruction 7 of the program at 0x400; it was soft-reset$")) as info:
        board.run(0x400, 12, timeout_s=5, poll_s=0)
    assert (info.value.code, info.value.pc) == (3, 7)
    assert device.ctrl_writes == [2, 1, 2]
    assert device.status == 0 and device.error == 0


def test_run_timeout_resets(board: Board, device: FakeDevice) -> None:
    device.run_polls = None
    with pytest.raises(RunTimeoutError, match=(
            rf"^the accelerator at {URL} did not finish the program at 0x0 within 0\.05 s \(status "
            rf"0x1, the pc CSR reads 17\); it was soft-reset$")):
        board.run(0, 3, timeout_s=0.05)
    assert device.ctrl_writes == [2, 1, 2]


def test_run_refuses_a_busy_accelerator(board: Board, device: FakeDevice) -> None:
    device.status = 1
    device.polls_left = None
    with pytest.raises(BoardLinkError, match=rf"^the accelerator at {URL} is busy with another program "
                                             rf"\(status 0x1\); wait for it or soft-reset it$"):
        board.run(0, 3, timeout_s=1)
    assert device.ctrl_writes == []


@pytest.mark.parametrize("kwargs,message", [
    ({"program_addr": -64}, r"^program_addr must be an integer between 0 and 4294967295, not -64$"),
    ({"prog_len": 2**32}, r"^prog_len must be an integer between 0 and 4294967295, not 4294967296$"),
    ({"timeout_s": 0}, r"^timeout_s must be a positive number of seconds, not 0$"),
    ({"poll_s": -1}, r"^poll_s must be a non-negative number of seconds, not -1$"),
])
def test_run_argument_errors(board: Board, kwargs: dict, message: str) -> None:
    args = {"program_addr": 0, "prog_len": 1, "timeout_s": 1, **kwargs}
    with pytest.raises(ValueError, match=message):
        board.run(args.pop("program_addr"), args.pop("prog_len"), **args)


# -- device statuses and link faults ----------------------------------------------------------------

def test_corrupted_frame_is_rejected_and_not_executed(board: Board, device: FakeDevice) -> None:
    before = bytes(device.memory)
    board.corrupt_next_request()
    with pytest.raises(DeviceStatusError, match=(
            rf"^the device rejected a corrupted frame: the CRC of the MEM_WRITE of 2 words at "
            rf"0x00000040 request did not check \(status BAD_CRC\), so nothing was executed; line "
            rf"noise or a wrong baud rate \(115200\) on {URL}$")) as info:
        board.write_mem(64, bytes(range(8)))
    assert info.value.status == Status.BAD_CRC
    assert device.memory == before and device.executed == []
    board.write_mem(64, bytes(range(8)))               # the hook fires once
    assert device.memory[64:72] == bytes(range(8))
    board.corrupt_next_request(-1, 0x80)               # a damaged CRC byte of a read
    with pytest.raises(DeviceStatusError, match=r"^the device rejected a corrupted frame: the CRC of "
                                                r"the CSR_READ of status \(0x04\) request"):
        board.read_csr("status")


@pytest.mark.parametrize("status,message", [
    (Status.BAD_REQUEST, r"the device refused the MEM_READ of 1 word at 0x00000000 request as "
                         r"malformed \(status BAD_REQUEST: an unknown command, a word count outside "
                         r"its range or an address that is not a multiple of 4\)"),
    (Status.BUS_ERROR, r"the device answered BUS_ERROR to the MEM_READ of 1 word at 0x00000000 "
                       r"request: the address range lies outside its memory \(its size\) or its "
                       r"CSR space, or the register refused the access"),
    (Status.TIMEOUT, r"the device dropped the MEM_READ of 1 word at 0x00000000 request \(status "
                     r"TIMEOUT\): a gap between its bytes was longer than the device's inter-byte "
                     r"timeout"),
])
def test_device_statuses(board: Board, device: FakeDevice, status: Status, message: str) -> None:
    device.faults.append(("status", status))
    with pytest.raises(DeviceStatusError, match=f"^{message}$") as info:
        board.read_mem(0, 4)
    assert info.value.status == status


def test_bus_error_from_the_real_rules_names_the_memory_size(board: Board) -> None:
    board.info()
    with pytest.raises(DeviceStatusError, match=r"^the device answered BUS_ERROR to the MEM_WRITE of "
                                                r"1 word at 0x00001000 request: the address range "
                                                r"lies outside its memory \(4096 bytes\)"):
        board.write_mem(4096, b"abcd")
    with pytest.raises(DeviceStatusError, match=r"^the device answered BUS_ERROR to the CSR_WRITE of "
                                                r"register \(0xfc\) request"):
        board._transact(protocol.csr_write_request(0xFC, 1))


def test_no_answer(device: FakeDevice) -> None:
    device.faults.append("silent")
    with Board(device.url, timeout_s=0.2) as b:
        with pytest.raises(LinkTimeoutError, match=(
                rf"^no answer from {URL} within 0\.2 s: is the board programmed with the systolic "
                rf"SoC and the baud rate 115200\?$")):
            b.info()
        assert b.info().version == 1                  # the next request works


def test_partial_answer(device: FakeDevice) -> None:
    device.faults.append("partial")
    with Board(device.url, timeout_s=0.2, baud=9600) as b:
        with pytest.raises(LinkTimeoutError, match=(
                rf"^the answer from {URL} to the CSR_READ of pc \(0x1c\) request stopped after 2 "
                rf"bytes \(5a 00\): nothing more came within 0\.2 s$")):
            b.read_csr("pc")


def test_corrupted_answer(board: Board, device: FakeDevice) -> None:
    device.faults.append("bad_crc")
    with pytest.raises(LinkCorruptionError, match=(
            rf"^corrupted answer from {URL} to the INFO request: response CRC is 0x[0-9a-f]{{2}}, "
            rf"but its bytes give 0x[0-9a-f]{{2}}$")):
        board.info()
    device.faults.append(("status", 9))
    with pytest.raises(LinkCorruptionError, match=(
            rf"^corrupted answer from {URL} to the INFO request: response status must be one of "
            rf"0 OK, 1 BAD_CRC, 2 BAD_REQUEST, 3 BUS_ERROR, 4 TIMEOUT, not 9$")):
        board.info()


def test_noise_before_an_answer_is_skipped(board: Board, device: FakeDevice) -> None:
    device.faults.append("garbage")
    assert board.read_csr("prog_len") == 0
    device.faults.append("noise")
    with pytest.raises(LinkCorruptionError, match=(
            rf"^corrupted answer from {URL} to the INFO request: more than 64 bytes arrived "
            rf"without the response sync byte 0x5a; is the baud rate 115200\?$")):
        board.info()


def test_link_failure() -> None:
    dev = FakeDevice()
    dev.faults.append("close")
    try:
        with Board(dev.url) as b, pytest.raises(BoardLinkError, match=(
                rf"^the link to {URL} failed during the INFO request: read failed: socket "
                rf"disconnected$")):
            b.info()
    finally:
        dev.close()


def test_cannot_open() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]          # closed again: nobody listens there
    with pytest.raises(BoardLinkError, match=rf"^cannot open socket://127\.0\.0\.1:{port}: "):
        Board(f"socket://127.0.0.1:{port}")


@pytest.mark.parametrize("kwargs,error,message", [
    ({"port": ""}, TypeError, r"^port must be a device path or URL string, not ''$"),
    ({"baud": 0}, ValueError, r"^baud must be a positive integer, not 0$"),
    ({"timeout_s": -1}, ValueError, r"^timeout_s must be a positive number of seconds, not -1$"),
    ({"board": 3}, TypeError, r"^board must be a preset name or None, not int$"),
])
def test_board_argument_errors(kwargs: dict, error: type, message: str) -> None:
    args = {"port": "socket://127.0.0.1:1", **kwargs}
    with pytest.raises(error, match=message):
        Board(args.pop("port"), **args)


def test_corrupt_hook_errors(board: Board) -> None:
    with pytest.raises(ValueError, match=r"^index must be a byte index other than 0 \(the sync byte\), "
                                         r"not 0$"):
        board.corrupt_next_request(0)
    with pytest.raises(ValueError, match=r"^mask must be an integer between 1 and 255, not 256$"):
        board.corrupt_next_request(3, 256)
    board.corrupt_next_request(20)
    with pytest.raises(ValueError, match=r"^corrupt_next_request index must lie inside the 9-byte "
                                         r"frame of the INFO request, not 20$"):
        board.info()
    assert board.info().version == 1


def test_errors_are_value_errors() -> None:
    for cls in (LinkTimeoutError, LinkCorruptionError, ConfigMismatchError, RunTimeoutError):
        assert issubclass(cls, BoardLinkError) and issubclass(cls, ValueError)
    assert issubclass(DeviceStatusError, ValueError) and issubclass(AcceleratorError, ValueError)
