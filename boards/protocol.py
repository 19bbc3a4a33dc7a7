"""The host link protocol of the systolic SoC: framed, checksummed requests over a UART.

Defined in docs/board.md; this module is its executable form, shared by the host driver, the tests
and the gateware (``boards/bridge.py`` takes its constants from here).

* Request (host -> device): ``0xA5, cmd, addr[4] LE, count[2] LE, payload, crc8``; the payload is
  ``4 * count`` bytes for MEM_WRITE and CSR_WRITE and empty for every other command (so the frame
  length follows from ``cmd`` and ``count`` alone, even for a request the device will refuse).
* Response (device -> host): ``0x5A, status, payload, crc8``; the payload is present only when the
  status is OK and the command reads (MEM_READ ``4 * count`` bytes, CSR_READ 4, INFO 16).
* ``crc8`` is CRC-8/SMBUS (polynomial 0x07, initial value 0, not reflected, no final xor) over
  every byte after the sync byte up to the last payload byte.

Units: addresses in bytes, counts in 32-bit words, timeouts in UART bit times.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from systolic.hw.csr import CSR_ADDR_BITS

__all__ = [
    "REQUEST_SYNC", "RESPONSE_SYNC", "PROTOCOL_VERSION", "MAX_WORDS", "MAX_PAYLOAD_BYTES",
    "HEADER_BYTES", "INFO_MAGIC", "INFO_BYTES", "CSR_SPACE_BYTES", "DEFAULT_TIMEOUT_BITS",
    "MIN_TIMEOUT_BITS", "Command", "Status", "ProtocolError", "FrameError", "ChecksumError",
    "Request", "Response", "Info", "crc8", "crc8_table", "request_payload_bytes",
    "response_payload_bytes", "encode_request", "decode_request", "encode_response",
    "decode_response", "check_request", "encode_info", "decode_info", "mem_write_request",
    "mem_read_request", "csr_write_request", "csr_read_request", "info_request",
]

#: First byte of every request frame; other bytes received between frames are ignored.
REQUEST_SYNC = 0xA5
#: First byte of every response frame.
RESPONSE_SYNC = 0x5A
#: Protocol version reported by INFO.
PROTOCOL_VERSION = 1
#: Most 32-bit words one MEM_WRITE or MEM_READ moves.
MAX_WORDS = 64
#: Largest request payload the device buffers, bytes.
MAX_PAYLOAD_BYTES = 4 * MAX_WORDS
#: Bytes of a request before its payload: sync, cmd, addr[4], count[2].
HEADER_BYTES = 8
#: First four bytes of the INFO payload.
INFO_MAGIC = b"SYST"
#: Bytes of the INFO payload.
INFO_BYTES = 16
#: Size of the accelerator's CSR space (``hw/csr.py``), bytes.
CSR_SPACE_BYTES = 1 << CSR_ADDR_BITS
#: Default inter-byte timeout inside a request, UART bit times (87 ms at 115200 baud).
DEFAULT_TIMEOUT_BITS = 10_000
#: Shortest allowed timeout: two characters (a character is 10 bit times).
MIN_TIMEOUT_BITS = 20


class Command(enum.IntEnum):
    """Request commands (the ``cmd`` byte)."""

    MEM_WRITE = 0x01
    MEM_READ = 0x02
    CSR_WRITE = 0x03
    CSR_READ = 0x04
    INFO = 0x05


class Status(enum.IntEnum):
    """Response status codes (the ``status`` byte)."""

    OK = 0
    BAD_CRC = 1
    BAD_REQUEST = 2
    BUS_ERROR = 3
    TIMEOUT = 4


class ProtocolError(ValueError):
    """A frame or a request breaks a rule of the host link protocol; the message names the field,
    the rule and the value."""


class FrameError(ProtocolError):
    """Bytes that are not a well-formed frame (sync byte, length, status code)."""


class ChecksumError(ProtocolError):
    """A frame whose CRC byte does not match its contents."""


def crc8_table() -> tuple[int, ...]:
    """The 256-entry lookup table of CRC-8/SMBUS (polynomial 0x07)."""
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = ((crc << 1) ^ 0x07) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
        table.append(crc)
    return tuple(table)


_TABLE = crc8_table()


def crc8(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """CRC-8/SMBUS of ``data`` (poly 0x07, init 0, no reflection, no final xor), continuing from
    ``crc``. ``crc8(b"123456789") == 0xF4``; appending a message's CRC gives a CRC of 0."""
    for byte in bytes(data):
        crc = _TABLE[crc ^ byte]
    return crc


def _check_uint(name: str, value: object, bits: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, not {value!r}")
    if not 0 <= value < 1 << bits:
        raise ProtocolError(f"{name} must be an unsigned {bits}-bit integer "
                            f"(0..{(1 << bits) - 1}), not {value!r}")
    return value


def request_payload_bytes(cmd: int, count: int) -> int:
    """Payload bytes that follow the header of a request with this ``cmd`` and ``count``:
    ``4 * count`` for MEM_WRITE and CSR_WRITE, 0 for every other command (unknown ones too)."""
    return 4 * count if cmd in (Command.MEM_WRITE, Command.CSR_WRITE) else 0


def response_payload_bytes(cmd: int, count: int, status: int) -> int:
    """Payload bytes of the response to a request: none unless the status is OK; then
    ``4 * count`` for MEM_READ, 4 for CSR_READ, :data:`INFO_BYTES` for INFO, none otherwise."""
    if status != Status.OK:
        return 0
    if cmd == Command.MEM_READ:
        return 4 * count
    if cmd == Command.CSR_READ:
        return 4
    if cmd == Command.INFO:
        return INFO_BYTES
    return 0


@dataclass(frozen=True)
class Request:
    """A decoded request: ``cmd`` (a :class:`Command` value, or any byte for a request the device
    refuses), byte address ``addr``, word ``count`` and the write ``payload``."""

    cmd: int
    addr: int
    count: int
    payload: bytes = b""


@dataclass(frozen=True)
class Response:
    """A decoded response: its :class:`Status` and payload."""

    status: Status
    payload: bytes = b""


def encode_request(cmd: int, addr: int, count: int, payload: bytes = b"") -> bytes:
    """The bytes of a request frame, sync byte and CRC included.

    Only the framing is checked (field widths; the payload length must be
    :func:`request_payload_bytes`), not the protocol rules, so that tests can build requests the
    device must refuse; :func:`check_request` applies the rules."""
    _check_uint("cmd", cmd, 8)
    _check_uint("addr", addr, 32)
    _check_uint("count", count, 16)
    if not isinstance(payload, bytes | bytearray):
        raise TypeError(f"payload must be bytes, not {type(payload).__name__}")
    want = request_payload_bytes(cmd, count)
    if len(payload) != want:
        raise FrameError(f"payload of a request with cmd {cmd:#04x} and count {count} must be "
                         f"{want} bytes, not {len(payload)}")
    body = bytes([cmd]) + addr.to_bytes(4, "little") + count.to_bytes(2, "little") + bytes(payload)
    return bytes([REQUEST_SYNC]) + body + bytes([crc8(body)])


def decode_request(frame: bytes) -> Request:
    """Parse one whole request frame (what a device receives after the sync byte, sync byte
    included). Raises :class:`FrameError` for a wrong sync byte or length and
    :class:`ChecksumError` for a CRC mismatch."""
    frame = bytes(frame)
    if len(frame) < HEADER_BYTES + 1:
        raise FrameError(f"request frame must be at least {HEADER_BYTES + 1} bytes, "
                         f"not {len(frame)}")
    if frame[0] != REQUEST_SYNC:
        raise FrameError(f"request frame must start with the sync byte {REQUEST_SYNC:#04x}, "
                         f"not {frame[0]:#04x}")
    cmd = frame[1]
    addr = int.from_bytes(frame[2:6], "little")
    count = int.from_bytes(frame[6:8], "little")
    want = HEADER_BYTES + request_payload_bytes(cmd, count) + 1
    if len(frame) != want:
        raise FrameError(f"request frame with cmd {cmd:#04x} and count {count} must be {want} "
                         f"bytes, not {len(frame)}")
    expected = crc8(frame[1:-1])
    if frame[-1] != expected:
        raise ChecksumError(f"request CRC is {frame[-1]:#04x}, but its bytes give {expected:#04x}")
    return Request(cmd, addr, count, frame[HEADER_BYTES:-1])


def check_request(request: Request, *, memory_bytes: int) -> Status:
    """The status the device answers to a request whose CRC checked, before it accesses anything
    (the reference for the bridge gateware). OK means: execute it (a CSR access may still answer
    BUS_ERROR when the register refuses it).

    In order: an unknown command, a count out of range or a misaligned address is BAD_REQUEST
    (INFO needs addr = 0 and count = 0; CSR accesses count = 1; memory accesses 1..MAX_WORDS);
    an address range outside the memory ``[0, memory_bytes)`` or the CSR space is BUS_ERROR."""
    cmd, addr, count = request.cmd, request.addr, request.count
    if cmd == Command.INFO:
        return Status.OK if addr == 0 and count == 0 else Status.BAD_REQUEST
    if cmd in (Command.MEM_WRITE, Command.MEM_READ):
        if not 1 <= count <= MAX_WORDS or addr % 4:
            return Status.BAD_REQUEST
        return Status.OK if addr + 4 * count <= memory_bytes else Status.BUS_ERROR
    if cmd in (Command.CSR_WRITE, Command.CSR_READ):
        if count != 1 or addr % 4:
            return Status.BAD_REQUEST
        return Status.OK if addr < CSR_SPACE_BYTES else Status.BUS_ERROR
    return Status.BAD_REQUEST


def encode_response(status: int, payload: bytes = b"") -> bytes:
    """The bytes of a response frame (what the device sends)."""
    _check_uint("status", status, 8)
    body = bytes([status]) + bytes(payload)
    return bytes([RESPONSE_SYNC]) + body + bytes([crc8(body)])


def decode_response(frame: bytes, *, cmd: int, count: int) -> Response:
    """Parse the whole response to a request with this ``cmd`` and ``count``.

    Raises :class:`FrameError` for a wrong sync byte, an unknown status or a length that does not
    match the status, and :class:`ChecksumError` for a CRC mismatch."""
    frame = bytes(frame)
    if len(frame) < 3:
        raise FrameError(f"response frame must be at least 3 bytes, not {len(frame)}")
    if frame[0] != RESPONSE_SYNC:
        raise FrameError(f"response frame must start with the sync byte {RESPONSE_SYNC:#04x}, "
                         f"not {frame[0]:#04x}")
    try:
        status = Status(frame[1])
    except ValueError:
        raise FrameError(f"response status must be one of "
                         f"{', '.join(f'{s.value} {s.name}' for s in Status)}, not {frame[1]}") from None
    want = 3 + response_payload_bytes(cmd, count, status)
    if len(frame) != want:
        raise FrameError(f"response with status {status.name} to cmd {cmd:#04x} (count {count}) "
                         f"must be {want} bytes, not {len(frame)}")
    expected = crc8(frame[1:-1])
    if frame[-1] != expected:
        raise ChecksumError(f"response CRC is {frame[-1]:#04x}, but its bytes give {expected:#04x}")
    return Response(status, frame[2:-1])


@dataclass(frozen=True)
class Info:
    """The INFO payload: protocol version, accelerator bus width (bytes), SoC memory size (bytes)
    and the low 32 bits of the accelerator's ``AcceleratorConfig.hash``."""

    version: int
    bus_bytes: int
    memory_bytes: int
    config_hash_lo: int


def encode_info(info: Info) -> bytes:
    """The 16-byte INFO payload: ``b"SYST"``, version u8, bus bytes u8, reserved u16 = 0, memory
    bytes u32, config hash low 32 bits u32 (little-endian)."""
    _check_uint("version", info.version, 8)
    _check_uint("bus_bytes", info.bus_bytes, 8)
    _check_uint("memory_bytes", info.memory_bytes, 32)
    _check_uint("config_hash_lo", info.config_hash_lo, 32)
    return (INFO_MAGIC + bytes([info.version, info.bus_bytes]) + bytes(2)
            + info.memory_bytes.to_bytes(4, "little") + info.config_hash_lo.to_bytes(4, "little"))


def decode_info(payload: bytes) -> Info:
    """Parse an INFO payload; raises :class:`FrameError` for a wrong length, magic or reserved
    field."""
    payload = bytes(payload)
    if len(payload) != INFO_BYTES:
        raise FrameError(f"INFO payload must be {INFO_BYTES} bytes, not {len(payload)}")
    if payload[:4] != INFO_MAGIC:
        raise FrameError(f"INFO payload must start with {INFO_MAGIC!r}, not {payload[:4]!r}")
    if payload[6:8] != bytes(2):
        raise FrameError(f"INFO reserved field must be 0, not {int.from_bytes(payload[6:8], 'little')}")
    return Info(version=payload[4], bus_bytes=payload[5],
                memory_bytes=int.from_bytes(payload[8:12], "little"),
                config_hash_lo=int.from_bytes(payload[12:16], "little"))


# -- requests that follow the rules ---------------------------------------------------------------

def _check_words_request(addr: int, count: int) -> None:
    _check_uint("addr", addr, 32)
    if addr % 4:
        raise ProtocolError(f"addr must be 4-byte aligned, not {addr:#x}")
    if isinstance(count, bool) or not isinstance(count, int):
        raise TypeError(f"count must be an integer, not {count!r}")
    if not 1 <= count <= MAX_WORDS:
        raise ProtocolError(f"count must be between 1 and {MAX_WORDS} words, not {count}")


def mem_write_request(addr: int, data: bytes) -> bytes:
    """A MEM_WRITE frame writing ``data`` (a multiple of 4 bytes, 4..256) at aligned ``addr``."""
    if not isinstance(data, bytes | bytearray):
        raise TypeError(f"data must be bytes, not {type(data).__name__}")
    if len(data) % 4:
        raise ProtocolError(f"data must be whole 32-bit words, not {len(data)} bytes")
    _check_words_request(addr, len(data) // 4)
    return encode_request(Command.MEM_WRITE, addr, len(data) // 4, bytes(data))


def mem_read_request(addr: int, count: int) -> bytes:
    """A MEM_READ frame reading ``count`` words (1..64) from aligned ``addr``."""
    _check_words_request(addr, count)
    return encode_request(Command.MEM_READ, addr, count)


def _check_csr_addr(addr: int) -> None:
    _check_uint("addr", addr, 32)
    if addr % 4 or addr >= CSR_SPACE_BYTES:
        raise ProtocolError(f"CSR addr must be 4-byte aligned and below {CSR_SPACE_BYTES:#x}, "
                            f"not {addr:#x}")


def csr_write_request(addr: int, value: int) -> bytes:
    """A CSR_WRITE frame writing the 32-bit ``value`` to CSR byte address ``addr``."""
    _check_csr_addr(addr)
    _check_uint("value", value, 32)
    return encode_request(Command.CSR_WRITE, addr, 1, value.to_bytes(4, "little"))


def csr_read_request(addr: int) -> bytes:
    """A CSR_READ frame reading CSR byte address ``addr``."""
    _check_csr_addr(addr)
    return encode_request(Command.CSR_READ, addr, 1)


def info_request() -> bytes:
    """The INFO frame."""
    return encode_request(Command.INFO, 0, 0)
