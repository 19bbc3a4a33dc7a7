"""The host link protocol in Python (boards/protocol.py): CRC-8/SMBUS against a bitwise reference
and its published check value, request and response frames round trip, every decoding error and
argument error with its message, the device's request rules, and docs/board.md's tables and example
byte sequences against the code."""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

import pytest
from systolic.boards import protocol
from systolic.boards.protocol import (
    ChecksumError,
    Command,
    FrameError,
    Info,
    ProtocolError,
    Request,
    Response,
    Status,
    check_request,
    crc8,
    decode_info,
    decode_request,
    decode_response,
    encode_info,
    encode_request,
    encode_response,
)
from systolic.hw.config import AcceleratorConfig
from systolic.hw.csr import CSR_ADDR_BITS

SEED = int(os.environ.get("SYSTOLIC_TEST_SEED", "1"))
BOARD_MD = (Path(__file__).resolve().parents[2] / "docs" / "board.md").read_text()


def _crc8_bitwise(data: bytes) -> int:
    """CRC-8/SMBUS one bit at a time, straight from its definition."""
    crc = 0
    for byte in data:
        for i in range(7, -1, -1):
            feedback = (crc >> 7 & 1) ^ (byte >> i & 1)
            crc = (crc << 1) & 0xFF
            if feedback:
                crc ^= 0x07
    return crc


# -- CRC ---------------------------------------------------------------------------------------------

def test_crc8_check_value_and_reference():
    assert crc8(b"123456789") == 0xF4          # the catalogued check value of CRC-8/SMBUS
    assert crc8(b"") == 0
    rng = random.Random(SEED)
    for length in (1, 2, 7, 64, 300):
        data = bytes(rng.randrange(256) for _ in range(length))
        assert crc8(data) == _crc8_bitwise(data)
        assert crc8(data[length // 2:], crc8(data[:length // 2])) == crc8(data)
        assert crc8(data + bytes([crc8(data)])) == 0      # the residue the bridge checks
    for data in (b"\x00" * 5, b"\xff" * 5, b"\x80", b"\x01"):
        assert crc8(data) == _crc8_bitwise(data)
    assert protocol.crc8_table()[1] == 0x07


def test_crc8_detects_every_single_bit_error():
    rng = random.Random(SEED + 1)
    frame = protocol.mem_write_request(0x40, bytes(rng.randrange(256) for _ in range(32)))
    for bit in range(8, 8 * len(frame)):      # every bit after the sync byte, the CRC included
        bad = bytearray(frame)
        bad[bit // 8] ^= 1 << (bit % 8)
        assert crc8(bad[1:]) != 0
        # a flip in cmd or count changes the frame's length: a FrameError before the CRC
        with pytest.raises(ChecksumError if 2 <= bit // 8 <= 5 or bit // 8 >= 8 else ProtocolError):
            decode_request(bytes(bad))


# -- frames ------------------------------------------------------------------------------------------

def test_request_frames_round_trip():
    rng = random.Random(SEED + 2)
    for _ in range(50):
        cmd = rng.choice([*Command, 0x00, 0x7F, 0xFF])
        count = rng.choice([0, 1, 2, 64, 65, rng.randrange(1 << 16)])
        if cmd in (Command.MEM_WRITE, Command.CSR_WRITE):
            count = min(count, 80)
        addr = rng.choice([0, 0xFFFF_FFFF, rng.randrange(1 << 32)])
        payload = bytes(rng.randrange(256) for _ in range(protocol.request_payload_bytes(cmd, count)))
        frame = encode_request(cmd, addr, count, payload)
        assert frame[0] == protocol.REQUEST_SYNC
        assert len(frame) == protocol.HEADER_BYTES + len(payload) + 1
        assert frame[1] == cmd and frame[2:6] == addr.to_bytes(4, "little")
        assert frame[6:8] == count.to_bytes(2, "little")
        assert decode_request(frame) == Request(cmd, addr, count, payload)


def test_request_helpers_follow_the_rules():
    data = bytes(range(256))
    frame = protocol.mem_write_request(0xFC, data)
    assert decode_request(frame) == Request(Command.MEM_WRITE, 0xFC, 64, data)
    assert decode_request(protocol.mem_read_request(4, 1)) == Request(Command.MEM_READ, 4, 1)
    assert decode_request(protocol.csr_write_request(0x0C, 0xFFFF_FFFF)) == \
        Request(Command.CSR_WRITE, 0x0C, 1, b"\xff" * 4)
    assert decode_request(protocol.csr_read_request(0xFC)) == Request(Command.CSR_READ, 0xFC, 1)
    assert decode_request(protocol.info_request()) == Request(Command.INFO, 0, 0)
    assert protocol.CSR_SPACE_BYTES == 1 << CSR_ADDR_BITS
    assert protocol.MAX_PAYLOAD_BYTES == 4 * protocol.MAX_WORDS == 256


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: protocol.mem_write_request(2, b"abcd"), ProtocolError,
     r"^addr must be 4-byte aligned, not 0x2$"),
    (lambda: protocol.mem_write_request(0, b"abc"), ProtocolError,
     r"^data must be whole 32-bit words, not 3 bytes$"),
    (lambda: protocol.mem_write_request(0, b""), ProtocolError,
     r"^count must be between 1 and 64 words, not 0$"),
    (lambda: protocol.mem_write_request(0, bytes(260)), ProtocolError,
     r"^count must be between 1 and 64 words, not 65$"),
    (lambda: protocol.mem_write_request(0, "abcd"), TypeError, r"^data must be bytes, not str$"),
    (lambda: protocol.mem_read_request(0, 65), ProtocolError,
     r"^count must be between 1 and 64 words, not 65$"),
    (lambda: protocol.mem_read_request(1 << 32, 1), ProtocolError,
     r"^addr must be an unsigned 32-bit integer \(0\.\.4294967295\), not 4294967296$"),
    (lambda: protocol.mem_read_request(0, 1.0), TypeError, r"^count must be an integer, not 1\.0$"),
    (lambda: protocol.csr_read_request(0x100), ProtocolError,
     r"^CSR addr must be 4-byte aligned and below 0x100, not 0x100$"),
    (lambda: protocol.csr_write_request(0x0E, 1), ProtocolError,
     r"^CSR addr must be 4-byte aligned and below 0x100, not 0xe$"),
    (lambda: protocol.csr_write_request(0x0C, -1), ProtocolError,
     r"^value must be an unsigned 32-bit integer \(0\.\.4294967295\), not -1$"),
    (lambda: encode_request(0x100, 0, 0), ProtocolError,
     r"^cmd must be an unsigned 8-bit integer \(0\.\.255\), not 256$"),
    (lambda: encode_request(Command.MEM_READ, 0, 1 << 16), ProtocolError,
     r"^count must be an unsigned 16-bit integer \(0\.\.65535\), not 65536$"),
    (lambda: encode_request(Command.MEM_WRITE, 0, 2, b"1234"), FrameError,
     r"^payload of a request with cmd 0x01 and count 2 must be 8 bytes, not 4$"),
    (lambda: encode_request(Command.MEM_READ, 0, 1, b"1234"), FrameError,
     r"^payload of a request with cmd 0x02 and count 1 must be 0 bytes, not 4$"),
    (lambda: encode_request(True, 0, 0), TypeError, r"^cmd must be an integer, not True$"),
    (lambda: encode_response(256), ProtocolError,
     r"^status must be an unsigned 8-bit integer \(0\.\.255\), not 256$"),
])
def test_encoding_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize(("frame", "error", "message"), [
    (b"\xa5\x05", FrameError, r"^request frame must be at least 9 bytes, not 2$"),
    (b"\x5a" + protocol.info_request()[1:], FrameError,
     r"^request frame must start with the sync byte 0xa5, not 0x5a$"),
    (protocol.mem_write_request(0, bytes(8))[:-2], FrameError,
     r"^request frame with cmd 0x01 and count 2 must be 17 bytes, not 15$"),
    (protocol.info_request()[:-1] + b"\x00", ChecksumError,
     r"^request CRC is 0x00, but its bytes give 0xaa$"),
])
def test_request_decoding_errors(frame, error, message):
    with pytest.raises(error, match=message):
        decode_request(frame)
    assert issubclass(error, ProtocolError) and issubclass(ProtocolError, ValueError)


def test_response_frames_round_trip():
    rng = random.Random(SEED + 3)
    for cmd, count in ((Command.MEM_READ, 1), (Command.MEM_READ, 64), (Command.CSR_READ, 1),
                       (Command.INFO, 0), (Command.MEM_WRITE, 3), (Command.CSR_WRITE, 1)):
        for status in Status:
            length = protocol.response_payload_bytes(cmd, count, status)
            payload = bytes(rng.randrange(256) for _ in range(length))
            frame = encode_response(status, payload)
            assert frame[:2] == bytes([protocol.RESPONSE_SYNC, status])
            assert decode_response(frame, cmd=cmd, count=count) == Response(status, payload)
    assert protocol.response_payload_bytes(Command.MEM_READ, 5, Status.OK) == 20
    assert protocol.response_payload_bytes(Command.MEM_READ, 5, Status.BUS_ERROR) == 0
    assert protocol.response_payload_bytes(Command.INFO, 0, Status.OK) == protocol.INFO_BYTES
    assert protocol.response_payload_bytes(Command.MEM_WRITE, 5, Status.OK) == 0


@pytest.mark.parametrize(("frame", "cmd", "count", "error", "message"), [
    (b"\x5a\x00", Command.MEM_WRITE, 1, FrameError, r"^response frame must be at least 3 bytes, not 2$"),
    (b"\xa5\x00\x00", Command.MEM_WRITE, 1, FrameError,
     r"^response frame must start with the sync byte 0x5a, not 0xa5$"),
    (b"\x5a\x07\x15", Command.MEM_WRITE, 1, FrameError,
     r"^response status must be one of 0 OK, 1 BAD_CRC, 2 BAD_REQUEST, 3 BUS_ERROR, 4 TIMEOUT, not 7$"),
    (encode_response(Status.OK), Command.MEM_READ, 2, FrameError,
     r"^response with status OK to cmd 0x02 \(count 2\) must be 11 bytes, not 3$"),
    (encode_response(Status.BAD_CRC, b"\x00"), Command.MEM_READ, 1, FrameError,
     r"^response with status BAD_CRC to cmd 0x02 \(count 1\) must be 3 bytes, not 4$"),
    (b"\x5a\x00\x01", Command.MEM_WRITE, 1, ChecksumError,
     r"^response CRC is 0x01, but its bytes give 0x00$"),
])
def test_response_decoding_errors(frame, cmd, count, error, message):
    with pytest.raises(error, match=message):
        decode_response(frame, cmd=cmd, count=count)


def test_info_payload():
    config = AcceleratorConfig(rows=4, cols=4, dma_data_bits=32)
    info = Info(protocol.PROTOCOL_VERSION, config.dma_bytes, 128 * 1024, config.hash & 0xFFFF_FFFF)
    payload = encode_info(info)
    assert len(payload) == protocol.INFO_BYTES and payload[:4] == b"SYST" and payload[6:8] == bytes(2)
    assert decode_info(payload) == info
    assert decode_info(encode_info(Info(255, 255, 0xFFFF_FFFF, 0xFFFF_FFFF))).memory_bytes == 0xFFFF_FFFF
    with pytest.raises(FrameError, match=r"^INFO payload must be 16 bytes, not 15$"):
        decode_info(payload[:-1])
    with pytest.raises(FrameError, match=r"^INFO payload must start with b'SYST', not b'SYSX'$"):
        decode_info(b"SYSX" + payload[4:])
    with pytest.raises(FrameError, match=r"^INFO reserved field must be 0, not 256$"):
        decode_info(payload[:6] + b"\x00\x01" + payload[8:])
    with pytest.raises(ProtocolError, match=r"^memory_bytes must be an unsigned 32-bit integer "
                                            r"\(0\.\.4294967295\), not 4294967296$"):
        encode_info(Info(1, 4, 1 << 32, 0))


# -- the device's rules ------------------------------------------------------------------------------

@pytest.mark.parametrize(("cmd", "addr", "count", "status"), [
    (Command.INFO, 0, 0, Status.OK), (Command.INFO, 0, 1, Status.BAD_REQUEST),
    (Command.INFO, 4, 0, Status.BAD_REQUEST),
    (Command.MEM_READ, 0, 1, Status.OK), (Command.MEM_READ, 4096 - 256, 64, Status.OK),
    (Command.MEM_READ, 4096 - 252, 64, Status.BUS_ERROR), (Command.MEM_READ, 4096, 1, Status.BUS_ERROR),
    (Command.MEM_READ, 0xFFFF_FFFC, 1, Status.BUS_ERROR), (Command.MEM_READ, 0, 0, Status.BAD_REQUEST),
    (Command.MEM_READ, 0, 65, Status.BAD_REQUEST), (Command.MEM_WRITE, 2, 1, Status.BAD_REQUEST),
    (Command.MEM_WRITE, 4098, 1, Status.BAD_REQUEST),       # misaligned beats out of range
    (Command.CSR_READ, 0xFC, 1, Status.OK), (Command.CSR_READ, 0x100, 1, Status.BUS_ERROR),
    (Command.CSR_WRITE, 0x0C, 2, Status.BAD_REQUEST), (Command.CSR_WRITE, 0x0D, 1, Status.BAD_REQUEST),
    (0x00, 0, 0, Status.BAD_REQUEST), (0x06, 0, 0, Status.BAD_REQUEST), (0xFF, 0, 1, Status.BAD_REQUEST),
])
def test_check_request(cmd, addr, count, status):
    assert check_request(Request(cmd, addr, count), memory_bytes=4096) == status


# -- docs/board.md -----------------------------------------------------------------------------------

def _hex(text: str) -> bytes:
    return bytes.fromhex(text)


def test_board_doc_tables_match_the_code():
    for status in Status:
        assert re.search(rf"^\| {status.value} \| {status.name} \|", BOARD_MD, re.MULTILINE), status
    for command in Command:
        assert re.search(rf"^\| `0x{command.value:02X}` \| {command.name} \|", BOARD_MD, re.MULTILINE), \
            command
    assert "`0xA5`" in BOARD_MD and "`0x5A`" in BOARD_MD and "`0xF4`" in BOARD_MD
    assert f"version {protocol.PROTOCOL_VERSION}" in BOARD_MD
    assert f"timeout_bits={protocol.DEFAULT_TIMEOUT_BITS}" in BOARD_MD


def test_board_doc_examples_are_the_encoder_output():
    info = encode_info(Info(1, 4, 128 * 1024, 0x89AB_CDEF))
    examples = {
        "A5 05 00 00 00 00 00 00 AA": protocol.info_request(),
        "5A 00 53 59 53 54 01 04 00 00 00 00 02 00 EF CD AB 89 C5": encode_response(Status.OK, info),
        "A5 01 00 01 00 00 02 00 00 11 22 33 44 55 66 77 8A":
            protocol.mem_write_request(0x100, _hex("0011223344556677")),
        "5A 00 00": encode_response(Status.OK),
        "A5 02 00 01 00 00 02 00 F1": protocol.mem_read_request(0x100, 2),
        "5A 00 00 11 22 33 44 55 66 77 7B": encode_response(Status.OK, _hex("0011223344556677")),
        "A5 03 0C 00 00 00 01 00 00 10 00 00 44": protocol.csr_write_request(0x0C, 0x1000),
        "A5 04 04 00 00 00 01 00 C4": protocol.csr_read_request(0x04),
        "5A 00 02 00 00 00 2C": encode_response(Status.OK, (2).to_bytes(4, "little")),
        "5A 01 07": encode_response(Status.BAD_CRC),
        "5A 02 0E": encode_response(Status.BAD_REQUEST),
        "5A 03 09": encode_response(Status.BUS_ERROR),
        "5A 04 1C": encode_response(Status.TIMEOUT),
    }
    for text, frame in examples.items():
        assert text in BOARD_MD, text
        assert _hex(text) == frame, text
