"""UART receiver and transmitter, 8N1 (one start bit, 8 data bits LSB first, no parity, one stop
bit; the line idles high), at ``clk / divisor`` baud.

Units: ``divisor`` in clock cycles per bit.
"""

from amaranth import Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

__all__ = ["MIN_DIVISOR", "check_divisor", "UARTReceiver", "UARTTransmitter"]

#: Fewest clock cycles per bit: the receiver samples each bit in its middle, two cycles after the
#: line changed (its input synchronizer), so a bit must last at least four cycles.
MIN_DIVISOR = 4


def check_divisor(divisor: object) -> int:
    """Return ``divisor`` if it is a valid number of clock cycles per bit, else raise."""
    if isinstance(divisor, bool) or not isinstance(divisor, int):
        raise TypeError(f"divisor must be an integer number of clock cycles per bit, not {divisor!r}")
    if divisor < MIN_DIVISOR:
        raise ValueError(f"divisor must be at least {MIN_DIVISOR} clock cycles per bit, not {divisor}")
    return divisor


class UARTReceiver(wiring.Component):
    """Deserializes ``rx`` into bytes.

    A falling edge starts a character; the start bit is checked in its middle (a shorter low pulse
    is ignored as a glitch), then the 8 data bits and the stop bit are sampled in their middles. A
    character whose stop bit is low (a framing error, or a break) is dropped, and the receiver
    waits for the line to go high again. A UART cannot hold the sender off, so ``data`` has no
    ``ready``: each byte is valid for one cycle.
    """

    rx: In(1, init=1)
    """Serial input (asynchronous to the clock; synchronized inside)."""
    data: Out(stream.Signature(8, always_ready=True))
    """Received bytes, one cycle each."""

    def __init__(self, divisor: int):
        self.divisor = check_divisor(divisor)
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        rx = Signal(init=1)
        m.submodules.sync_rx = FFSynchronizer(self.rx, rx, init=1)

        timer = Signal(range(self.divisor))
        bit = Signal(range(8))
        shift = Signal(8)
        # the byte's valid is a register (a cycle after the stop bit's sample), so that the
        # consumer's logic does not start from the bit timer's comparison
        valid = Signal()
        m.d.sync += valid.eq(0)
        m.d.comb += [self.data.payload.eq(shift), self.data.valid.eq(valid)]

        with m.FSM(name="rx"):
            with m.State("IDLE"):
                with m.If(~rx):
                    m.d.sync += timer.eq(self.divisor // 2 - 1)
                    m.next = "START"
            with m.State("START"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Elif(rx):                # high again in the middle of the start bit: a glitch
                    m.next = "IDLE"
                with m.Else():
                    m.d.sync += [timer.eq(self.divisor - 1), bit.eq(0)]
                    m.next = "DATA"
            with m.State("DATA"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Else():
                    m.d.sync += [shift.eq(Cat(shift[1:], rx)), timer.eq(self.divisor - 1),
                                 bit.eq(bit + 1)]
                    with m.If(bit == 7):
                        m.next = "STOP"
            with m.State("STOP"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Elif(rx):
                    m.d.sync += valid.eq(1)
                    m.next = "IDLE"
                with m.Else():
                    m.next = "BREAK"
            with m.State("BREAK"):
                with m.If(rx):
                    m.next = "IDLE"
        return m


class UARTTransmitter(wiring.Component):
    """Serializes bytes onto ``tx``: takes a byte when idle, then sends start bit, data bits (LSB
    first) and stop bit, ``divisor`` cycles each."""

    data: In(stream.Signature(8))
    """Bytes to send."""
    tx: Out(1, init=1)
    """Serial output (registered)."""

    def __init__(self, divisor: int):
        self.divisor = check_divisor(divisor)
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        timer = Signal(range(self.divisor))
        # data bits, stop bit and the line's idle level, shifted out after the start bit; the last
        # shift (to idle) marks the end of the stop bit
        bits_left = Signal(range(11))
        shift = Signal(10)

        m.d.comb += self.data.ready.eq(bits_left == 0)
        with m.If(self.data.valid & self.data.ready):
            m.d.sync += [self.tx.eq(0), shift.eq(Cat(self.data.payload, 1, 1)),
                         timer.eq(self.divisor - 1), bits_left.eq(10)]
        with m.Elif(bits_left != 0):
            with m.If(timer != 0):
                m.d.sync += timer.eq(timer - 1)
            with m.Else():
                m.d.sync += [self.tx.eq(shift[0]), shift.eq(shift >> 1), timer.eq(self.divisor - 1),
                             bits_left.eq(bits_left - 1)]
        return m
