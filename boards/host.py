"""Host driver of a board running the systolic SoC: memory, registers and program runs over the
UART link (the protocol of ``docs/board.md``, framed by :mod:`systolic.boards.protocol`).

>>> with Board("/dev/ttyUSB0", baud=115200) as board:        # doctest: +SKIP
...     board.check_config(config)
...     board.write_mem(0x1000, image)
...     counters = board.run(0x1000, prog_len=12, timeout_s=10)

The port is anything ``serial.serial_for_url`` opens: a serial device on a real board, or
``socket://127.0.0.1:PORT`` for the simulated board of :mod:`systolic.boards.simlink`.

Requests go one at a time: the driver sends a frame and waits for its response before the next.
Memory accesses of any byte range are split into frames of at most
:data:`~systolic.boards.protocol.MAX_WORDS` words; partial words at the ends are read, merged and
written back (read-modify-write). Every failure raises a :class:`BoardLinkError` (a ``ValueError``)
whose message names the port, the request and the cause.

Units: addresses and sizes in bytes, times in seconds, counters in cycles or their own unit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from systolic.hw.config import AcceleratorConfig
from systolic.hw.csr import CORE_FAULT, COUNTERS, ERROR_CODES, register_map

from . import protocol
from .protocol import Command, Status

__all__ = [
    "DEFAULT_BAUD", "DEFAULT_TIMEOUT_S", "BoardLinkError", "LinkTimeoutError", "LinkCorruptionError",
    "DeviceStatusError", "ConfigMismatchError", "AcceleratorError", "RunTimeoutError", "BoardInfo",
    "Board",
]

#: Baud rate of the SoC's UART unless told otherwise.
DEFAULT_BAUD = 115_200
#: Seconds the driver waits for a response.
DEFAULT_TIMEOUT_S = 2.0

# Bytes other than the response sync byte the driver skips before it gives up on a response.
_MAX_GARBAGE = 64
_STATUS_BUSY = 1 << 0
_STATUS_DONE = 1 << 1
_STATUS_FW_READY = 1 << 2
_CTRL_START = 1 << 0
_CTRL_SOFT_RESET = 1 << 1
_CTRL_FW_LOADED = 1 << 2
_REGISTER_AT = {int(reg["offset"]): name for name, reg in register_map().items()}   # type: ignore[call-overload]


class BoardLinkError(ValueError):
    """An operation on a board over its host link failed; the message names the port, the request
    and the cause."""


class LinkTimeoutError(BoardLinkError):
    """No (complete) response arrived in time."""


class LinkCorruptionError(BoardLinkError):
    """A response arrived damaged (bad CRC, unknown status, not a response frame)."""


class DeviceStatusError(BoardLinkError):
    """The device answered a request with a status other than OK (``status``)."""

    def __init__(self, message: str, status: Status) -> None:
        super().__init__(message)
        self.status = status


class ConfigMismatchError(BoardLinkError):
    """The board's accelerator was built for another configuration."""


class AcceleratorError(BoardLinkError):
    """The accelerator stopped a program with an error code (``code``, at instruction ``pc``)."""

    def __init__(self, message: str, code: int, pc: int) -> None:
        super().__init__(message)
        self.code = code
        self.pc = pc


class RunTimeoutError(BoardLinkError):
    """A program did not finish within its time limit."""


@dataclass(frozen=True)
class BoardInfo:
    """What INFO reports: protocol version, accelerator bus width (bytes), SoC memory (bytes),
    the low 32 bits of the accelerator's config hash."""

    version: int
    bus_bytes: int
    memory_bytes: int
    config_hash_lo: int


def _describe(cmd: int, addr: int, count: int) -> str:
    """``MEM_READ of 4 words at 0x00000100``-style name of a request, for messages."""
    if cmd == Command.INFO:
        return "INFO"
    if cmd in (Command.CSR_READ, Command.CSR_WRITE):
        return f"{Command(cmd).name} of {_REGISTER_AT.get(addr, 'register')} ({addr:#04x})"
    word = "word" if count == 1 else "words"
    return f"{Command(cmd).name} of {count} {word} at {addr:#010x}"


class Board:
    """A connection to a board running the systolic SoC.

    ``port``: a serial device or a pyserial URL (``socket://127.0.0.1:PORT``); ``baud``: the
    SoC's baud rate; ``timeout_s``: seconds to wait for each response; ``board``: the preset name
    the board was built from (named in error messages). Use as a context manager or call
    :meth:`close`. Raises :class:`BoardLinkError` when the port cannot be opened."""

    def __init__(self, port: str, *, baud: int = DEFAULT_BAUD, timeout_s: float = DEFAULT_TIMEOUT_S,
                 board: str | None = None) -> None:
        import serial

        if not isinstance(port, str) or not port:
            raise TypeError(f"port must be a device path or URL string, not {port!r}")
        if isinstance(baud, bool) or not isinstance(baud, int) or baud <= 0:
            raise ValueError(f"baud must be a positive integer, not {baud!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not timeout_s > 0:
            raise ValueError(f"timeout_s must be a positive number of seconds, not {timeout_s!r}")
        if board is not None and not isinstance(board, str):
            raise TypeError(f"board must be a preset name or None, not {type(board).__name__}")
        self.port = port
        self.baud = baud
        self.timeout_s = float(timeout_s)
        self.board = board
        self.bytes_sent = 0            #: bytes written to the link, frames included
        self.bytes_received = 0        #: bytes read from the link
        self.requests = 0              #: request frames sent
        self.mem_bytes_written = 0     #: memory bytes written (MEM_WRITE payloads)
        self.mem_bytes_read = 0        #: memory bytes read (MEM_READ payloads)
        self._info: BoardInfo | None = None
        self._corrupt: tuple[int, int] | None = None
        self._registers = register_map()
        try:
            self._serial = serial.serial_for_url(port, baudrate=baud, timeout=self.timeout_s)
        except (serial.SerialException, ValueError, OSError) as exc:
            raise BoardLinkError(f"cannot open {port}: {' '.join(str(exc).split())}") from None

    # -- connection ---------------------------------------------------------------------------

    def close(self) -> None:
        """Close the port (idempotent)."""
        self._serial.close()

    def __enter__(self) -> Board:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def corrupt_next_request(self, index: int = protocol.HEADER_BYTES, mask: int = 0x01) -> None:
        """Debug hook: flip the bits ``mask`` of byte ``index`` (negative: from the end) of the
        next request frame after its CRC has been computed, as line noise would. The default flips
        the lowest bit of the first payload byte (of a write) or of the CRC (of a read). The
        device must answer BAD_CRC and execute nothing."""
        if isinstance(index, bool) or not isinstance(index, int) or index == 0:
            raise ValueError(f"index must be a byte index other than 0 (the sync byte), not {index!r}")
        if isinstance(mask, bool) or not isinstance(mask, int) or not 1 <= mask <= 0xFF:
            raise ValueError(f"mask must be an integer between 1 and 255, not {mask!r}")
        self._corrupt = (index, mask)

    # -- one request ----------------------------------------------------------------------------

    def _transact(self, frame: bytes) -> bytes:
        """Send one request frame and return the payload of its OK response."""
        import serial

        cmd, addr, count = frame[1], int.from_bytes(frame[2:6], "little"), \
            int.from_bytes(frame[6:8], "little")
        what = _describe(cmd, addr, count)
        if self._corrupt is not None:
            index, mask = self._corrupt
            self._corrupt = None
            if not -len(frame) < index < len(frame):
                raise ValueError(f"corrupt_next_request index must lie inside the {len(frame)}-byte "
                                 f"frame of the {what} request, not {index}")
            damaged = bytearray(frame)
            damaged[index] ^= mask
            frame = bytes(damaged)
        try:
            self._serial.reset_input_buffer()     # stale bytes of an earlier, abandoned answer
            self._serial.write(frame)
            self._serial.flush()
            self.bytes_sent += len(frame)
            self.requests += 1
            response = self._receive(cmd, count, what)
        except serial.SerialException as exc:
            raise BoardLinkError(f"the link to {self.port} failed during the {what} request: "
                                 f"{' '.join(str(exc).split())}") from None
        if response.status == Status.OK:
            return response.payload
        raise DeviceStatusError(self._status_message(response.status, what), response.status)

    def _receive(self, cmd: int, count: int, what: str) -> protocol.Response:
        skipped = 0
        while True:                      # skip anything before the response's sync byte
            byte = self._read(1)
            if not byte:
                raise LinkTimeoutError(self._silence_message())
            if byte[0] == protocol.RESPONSE_SYNC:
                break
            skipped += 1
            if skipped > _MAX_GARBAGE:
                raise LinkCorruptionError(
                    f"corrupted answer from {self.port} to the {what} request: more than "
                    f"{_MAX_GARBAGE} bytes arrived without the response sync byte "
                    f"{protocol.RESPONSE_SYNC:#04x}; is the baud rate {self.baud}?")
        frame = bytearray(byte)
        status = self._read(1)
        if not status:
            raise LinkTimeoutError(self._partial_message(what, frame))
        frame += status
        rest = protocol.response_payload_bytes(cmd, count, status[0]) + 1
        frame += self._read(rest)
        if len(frame) < 2 + rest:
            raise LinkTimeoutError(self._partial_message(what, frame))
        try:
            return protocol.decode_response(bytes(frame), cmd=cmd, count=count)
        except protocol.ProtocolError as exc:
            raise LinkCorruptionError(f"corrupted answer from {self.port} to the {what} request: "
                                      f"{exc}") from None

    def _read(self, size: int) -> bytes:
        """Up to ``size`` bytes; fewer when the port's timeout (``timeout_s``) passes first."""
        data = self._serial.read(size)
        self.bytes_received += len(data)
        return data

    def _silence_message(self) -> str:
        return (f"no answer from {self.port} within {self.timeout_s:g} s: is the board programmed "
                f"with the systolic SoC and the baud rate {self.baud}?")

    def _partial_message(self, what: str, frame: bytearray) -> str:
        return (f"the answer from {self.port} to the {what} request stopped after {len(frame)} "
                f"bytes ({bytes(frame).hex(' ')}): nothing more came within {self.timeout_s:g} s")

    def _status_message(self, status: Status, what: str) -> str:
        if status == Status.BAD_CRC:
            return (f"the device rejected a corrupted frame: the CRC of the {what} request did not "
                    f"check (status BAD_CRC), so nothing was executed; line noise or a wrong baud "
                    f"rate ({self.baud}) on {self.port}")
        if status == Status.BAD_REQUEST:
            return (f"the device refused the {what} request as malformed (status BAD_REQUEST: an "
                    f"unknown command, a word count outside its range or an address that is not a "
                    f"multiple of 4)")
        if status == Status.BUS_ERROR:
            memory = f"{self._info.memory_bytes} bytes" if self._info else "its size"
            return (f"the device answered BUS_ERROR to the {what} request: the address range lies "
                    f"outside its memory ({memory}) or its CSR space, or the register refused "
                    f"the access")
        return (f"the device dropped the {what} request (status TIMEOUT): a gap between its bytes "
                f"was longer than the device's inter-byte timeout")

    # -- INFO -----------------------------------------------------------------------------------

    def info(self) -> BoardInfo:
        """Ask the device what it is (INFO). Raises :class:`BoardLinkError` when the answer is not a
        systolic SoC's of protocol version 1."""
        payload = self._transact(protocol.info_request())
        try:
            info = protocol.decode_info(payload)
        except protocol.ProtocolError as exc:
            raise BoardLinkError(f"the device at {self.port} does not answer INFO like a systolic SoC: "
                             f"{exc}") from None
        if info.version != protocol.PROTOCOL_VERSION:
            raise BoardLinkError(f"the device at {self.port} speaks host link protocol version "
                             f"{info.version}, but this driver speaks version "
                             f"{protocol.PROTOCOL_VERSION}")
        self._info = BoardInfo(info.version, info.bus_bytes, info.memory_bytes, info.config_hash_lo)
        return self._info

    def check_config(self, config: AcceleratorConfig) -> BoardInfo:
        """INFO, and check that the board's accelerator was built for ``config`` (the low 32
        bits of its hash and the bus width). Raises :class:`ConfigMismatchError` naming both
        hashes and the board preset."""
        if not isinstance(config, AcceleratorConfig):
            raise TypeError(f"config must be an AcceleratorConfig, not {type(config).__name__}")
        info = self.info()
        want = config.hash & 0xFFFF_FFFF
        preset = f"board preset {self.board!r}" if self.board else "no board preset given"
        if info.config_hash_lo != want:
            raise ConfigMismatchError(
                f"the board at {self.port} ({preset}) runs an accelerator with config hash "
                f"{info.config_hash_lo:08x} (low 32 bits), but the model was compiled for config "
                f"{config.hash_hex} (low 32 bits {want:08x}): program the board with a bitstream "
                f"of that config, or compile for the board's config")
        if info.bus_bytes != config.dma_bytes:
            raise ConfigMismatchError(
                f"the board at {self.port} ({preset}) reports a {info.bus_bytes}-byte accelerator "
                f"bus, but config {config.hash_hex} has {config.dma_bytes} bytes (dma_data_bits "
                f"{config.dma_data_bits})")
        return info

    def ensure_firmware(self, config: AcceleratorConfig) -> int:
        """Under firmware control (``config.control == "firmware"``), make sure the accelerator's
        core has its firmware: if STATUS bit 2 (firmware ready) is clear, as after configuring an
        iCE40 whose core RAM is SPRAM, write the image and the instance's parameters
        (:func:`systolic.hw.fw_engine.firmware_load`) through ``fw_addr`` and ``fw_data`` and set
        CTRL bit 2. Returns the words written (0 when nothing was needed). Raises
        :class:`BoardLinkError` if the bit stays clear."""
        if config.control != "firmware" or self.read_csr("status") & _STATUS_FW_READY:
            return 0
        from systolic.hw.fw_engine import firmware_load

        written = 0
        for first, words in firmware_load(config):
            self.write_csr("fw_addr", first)
            for word in words:
                self.write_csr("fw_data", word)
            written += len(words)
        self.write_csr("ctrl", _CTRL_FW_LOADED)
        if not self.read_csr("status") & _STATUS_FW_READY:
            raise BoardLinkError(f"the accelerator at {self.port} does not report its firmware ready "
                                 f"after {written} words were loaded")
        return written

    # -- memory ---------------------------------------------------------------------------------

    def read_mem(self, addr: int, nbytes: int) -> bytes:
        """``nbytes`` bytes of SoC memory from byte address ``addr`` (any alignment)."""
        _check_range(addr, nbytes)
        if nbytes == 0:
            return b""
        start, end = addr & ~3, -(-(addr + nbytes) // 4) * 4
        return self._read_words(start, end)[addr - start:addr - start + nbytes]

    def _read_words(self, start: int, end: int) -> bytes:
        out = bytearray()
        step = 4 * protocol.MAX_WORDS
        for a in range(start, end, step):
            count = min(step, end - a) // 4
            out += self._transact(protocol.mem_read_request(a, count))
            self.mem_bytes_read += 4 * count
        return bytes(out)

    def write_mem(self, addr: int, data: bytes | bytearray | memoryview | np.ndarray) -> None:
        """Write ``data`` (bytes, or a numpy array's raw bytes) into SoC memory at byte address
        ``addr`` (any alignment). The partial 32-bit words at the ends are read first and written
        back with only the given bytes changed."""
        blob = _as_bytes(data)
        _check_range(addr, len(blob))
        if not blob:
            return
        start, end = addr & ~3, -(-(addr + len(blob)) // 4) * 4
        buf = bytearray(end - start)
        if addr != start:
            buf[0:4] = self._read_words(start, start + 4)
        if addr + len(blob) != end and (end - 4 > start or addr == start):
            buf[-4:] = self._read_words(end - 4, end)
        buf[addr - start:addr - start + len(blob)] = blob
        step = 4 * protocol.MAX_WORDS
        for a in range(start, end, step):
            chunk = bytes(buf[a - start:min(a - start + step, end - start)])
            self._transact(protocol.mem_write_request(a, chunk))
            self.mem_bytes_written += len(chunk)

    # -- registers ------------------------------------------------------------------------------

    def _register(self, name: str, access: str) -> int:
        if not isinstance(name, str) or name not in self._registers:
            raise ValueError(f"register must be one of {', '.join(self._registers)}, not {name!r}")
        reg = self._registers[name]
        if access == "write" and reg["access"] == "ro":
            raise ValueError(f"register {name!r} is read-only; writable registers are "
                             f"{', '.join(k for k, v in self._registers.items() if v['access'] != 'ro')}")
        return int(reg["offset"])     # type: ignore[call-overload]

    def read_csr(self, name: str) -> int:
        """The 32-bit value of accelerator register ``name`` (hw/csr.py ``register_map()``)."""
        payload = self._transact(protocol.csr_read_request(self._register(name, "read")))
        return int.from_bytes(payload, "little")

    def write_csr(self, name: str, value: int) -> None:
        """Write the 32-bit ``value`` to accelerator register ``name``."""
        offset = self._register(name, "write")
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 32:
            raise ValueError(f"value of register {name!r} must be an integer between 0 and "
                             f"2**32 - 1, not {value!r}")
        self._transact(protocol.csr_write_request(offset, value))

    def read_counter(self, name: str) -> int:
        """Performance counter ``name`` (hw/csr.py ``COUNTERS``): the low word first, which
        latches the high word."""
        low = self.read_csr(f"{name}_lo")
        if f"{name}_hi" not in self._registers:
            return low
        return self.read_csr(f"{name}_hi") << 32 | low

    # -- running programs -----------------------------------------------------------------------

    def run(self, program_addr: int, prog_len: int, *, timeout_s: float, poll_s: float = 0.001,
            reset: bool = True) -> dict[str, int]:
        """Run the program of ``prog_len`` instructions at byte address ``program_addr`` (already
        in memory): soft-reset the accelerator (``reset``: nothing of an earlier program remains
        in its queues), set ``prog_addr``, ``prog_len``, ``dram_base`` = 0, start, and poll
        ``status`` every ``poll_s`` seconds until done. Returns every performance counter by name
        (hw/csr.py ``COUNTERS``).

        Raises :class:`AcceleratorError` when the accelerator reports an error (code and meaning
        from hw/csr.py ``ERROR_CODES``, instruction index from ``error_pc``) and
        :class:`RunTimeoutError` when it is not done within ``timeout_s``; in both cases the
        accelerator is soft-reset, ready for the next program."""
        for name, value, hi in (("program_addr", program_addr, (1 << 32) - 1),
                                ("prog_len", prog_len, (1 << 32) - 1)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= hi:
                raise ValueError(f"{name} must be an integer between 0 and {hi}, not {value!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not timeout_s > 0:
            raise ValueError(f"timeout_s must be a positive number of seconds, not {timeout_s!r}")
        if isinstance(poll_s, bool) or not isinstance(poll_s, int | float) or poll_s < 0:
            raise ValueError(f"poll_s must be a non-negative number of seconds, not {poll_s!r}")
        status = self.read_csr("status")
        if status & _STATUS_BUSY:
            raise BoardLinkError(f"the accelerator at {self.port} is busy with another program "
                                 f"(status {status:#x}); wait for it or soft-reset it")
        if reset:
            self.write_csr("ctrl", _CTRL_SOFT_RESET)
        self.write_csr("prog_addr", program_addr)
        self.write_csr("prog_len", prog_len)
        self.write_csr("dram_base", 0)
        self.write_csr("ctrl", _CTRL_START)
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.read_csr("status")
            error = status >> 4 & 0xF
            if error:
                pc = self.read_csr("error_pc")
                self.write_csr("ctrl", _CTRL_SOFT_RESET)
                where = (f"core address {pc:#x}" if error == CORE_FAULT else
                         f"instruction {pc} of the program at {program_addr:#x}")
                raise AcceleratorError(
                    f"the accelerator at {self.port} stopped with error {error} "
                    f"({ERROR_CODES.get(error, 'unknown error code')}) at {where}; it was soft-reset",
                    error, pc)
            if status & _STATUS_DONE:
                break
            if time.monotonic() > deadline:
                pc = self.read_csr("pc")
                self.write_csr("ctrl", _CTRL_SOFT_RESET)
                raise RunTimeoutError(
                    f"the accelerator at {self.port} did not finish the program at "
                    f"{program_addr:#x} within {timeout_s:g} s (status {status:#x}, the pc CSR "
                    f"reads {pc}); it was soft-reset")
            if poll_s:
                time.sleep(poll_s)
        return {name: self.read_counter(name) for name, _ in COUNTERS}


def _as_bytes(data: Any) -> bytes:
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).view(np.uint8).reshape(-1).tobytes()
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    raise TypeError(f"data must be bytes or a numpy array, not {type(data).__name__}")


def _check_range(addr: Any, nbytes: Any) -> None:
    if isinstance(addr, bool) or not isinstance(addr, int) or not 0 <= addr < 1 << 32:
        raise ValueError(f"addr must be a byte address between 0 and 2**32 - 1, not {addr!r}")
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"nbytes must be a non-negative integer, not {nbytes!r}")
    if addr + nbytes > 1 << 32:
        raise ValueError(f"the range of {nbytes} bytes at {addr:#x} ends past the 32-bit address "
                         f"space")
