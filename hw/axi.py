"""AXI4 and AXI4-Lite interface signatures.

Each AXI channel is an :mod:`amaranth.lib.stream` (``valid``/``ready``/``payload``), so that blocks
inside the accelerator connect channels with ``wiring.connect``. The top level flattens them to the
usual ``m_axi_arvalid``/``m_axi_araddr``... names (see ``hw/top.py``).

Only the features the accelerator uses are carried: INCR bursts, one ID, no locks, caches, QoS or
regions (the top level ties those off to their defaults).
"""

from __future__ import annotations

from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = [
    "BURST_INCR", "RESP_OKAY", "RESP_EXOKAY", "RESP_SLVERR", "RESP_DECERR",
    "AddressLayout", "ReadDataLayout", "WriteDataLayout", "ResponseLayout",
    "AXI4Signature", "AXI4LiteSignature",
]

BURST_INCR = 0b01
RESP_OKAY, RESP_EXOKAY, RESP_SLVERR, RESP_DECERR = 0b00, 0b01, 0b10, 0b11


class AddressLayout(data.StructLayout):
    """AR/AW payload: byte address, burst length - 1 (beats), log2 of bytes per beat."""

    def __init__(self, addr_width: int):
        super().__init__({"addr": addr_width, "len": 8, "size": 3})


class ReadDataLayout(data.StructLayout):
    def __init__(self, data_width: int):
        super().__init__({"data": data_width, "resp": 2, "last": 1})


class WriteDataLayout(data.StructLayout):
    def __init__(self, data_width: int):
        super().__init__({"data": data_width, "strb": data_width // 8, "last": 1})


class ResponseLayout(data.StructLayout):
    def __init__(self):
        super().__init__({"resp": 2})


def _check(addr_width: int, data_width: int) -> None:
    if not isinstance(addr_width, int) or not 2 <= addr_width <= 64:
        raise ValueError(f"AXI address width must be an integer between 2 and 64, not {addr_width!r}")
    if data_width not in (32, 64, 128, 256, 512, 1024):
        raise ValueError(f"AXI data width must be a power of two between 32 and 1024, not {data_width!r}")


class AXI4Signature(wiring.Signature):
    """An AXI4 manager (master) interface; ``.flip()`` for the subordinate side."""

    def __init__(self, *, addr_width: int = 32, data_width: int = 64):
        _check(addr_width, data_width)
        self.addr_width = addr_width
        self.data_width = data_width
        super().__init__({
            "ar": Out(stream.Signature(AddressLayout(addr_width))),
            "r": In(stream.Signature(ReadDataLayout(data_width))),
            "aw": Out(stream.Signature(AddressLayout(addr_width))),
            "w": Out(stream.Signature(WriteDataLayout(data_width))),
            "b": In(stream.Signature(ResponseLayout())),
        })

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, AXI4Signature) and self.addr_width == other.addr_width
                and self.data_width == other.data_width)

    def __repr__(self) -> str:
        return f"AXI4Signature(addr_width={self.addr_width}, data_width={self.data_width})"


class AXI4LiteSignature(wiring.Signature):
    """An AXI4-Lite manager interface (32-bit data); ``.flip()`` for the subordinate side."""

    def __init__(self, *, addr_width: int = 12):
        _check(addr_width, 32)
        self.addr_width = addr_width
        super().__init__({
            "ar": Out(stream.Signature(data.StructLayout({"addr": addr_width}))),
            "r": In(stream.Signature(data.StructLayout({"data": 32, "resp": 2}))),
            "aw": Out(stream.Signature(data.StructLayout({"addr": addr_width}))),
            "w": Out(stream.Signature(data.StructLayout({"data": 32, "strb": 4}))),
            "b": In(stream.Signature(ResponseLayout())),
        })

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AXI4LiteSignature) and self.addr_width == other.addr_width

    def __repr__(self) -> str:
        return f"AXI4LiteSignature(addr_width={self.addr_width})"
