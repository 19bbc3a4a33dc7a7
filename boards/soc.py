"""The systolic SoC: the accelerator, its on-chip memory and a UART host bridge, for FPGA boards
and for the Verilator board simulation.

::

                 +-----------------------------------------------------------+
     uart_rx --->| UARTReceiver --> Bridge --> UARTTransmitter               |---> uart_tx
                 |                  |  |  +--- run_busy, run_error ----------|---> busy, error
                 |   AXI4-Lite CSRs |  | memory port                         |
                 |                  v  v                                     |
                 |       Accelerator   SoCMemory (arbiter, BRAM or SPRAM)    |
                 |       m_axi_* ----> AXI4 read and write engines           |
                 |       irq --------> Bridge                                |
                 +-----------------------------------------------------------+

The accelerator's DRAM is the SoC memory at ``[0, memory_bytes)``; its AXI4 accesses above that
answer DECERR. The host sets the ``dram_base`` CSR to 0. The host link protocol is in
docs/board.md and ``boards/protocol.py``.

Units: ``memory_bytes`` in bytes, ``clk_hz`` in hertz, ``baud`` in bits per second,
``timeout_bits`` in UART bit times.
"""

from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from systolic.hw.config import AcceleratorConfig
from systolic.hw.top import Accelerator

from .bridge import Bridge
from .memory import SoCMemory, check_memory
from .protocol import DEFAULT_TIMEOUT_BITS, MIN_TIMEOUT_BITS
from .uart import MIN_DIVISOR, UARTReceiver, UARTTransmitter, check_divisor

__all__ = ["SoC", "soc_ports", "soc_verilog", "baud_divisor", "MAX_BAUD_ERROR"]

#: Largest relative difference between the requested baud rate and clk_hz / divisor.
MAX_BAUD_ERROR = 0.02


def _positive_number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, not {value!r}")
    if not value > 0:
        raise ValueError(f"{name} must be positive, not {value!r}")
    return float(value)


def baud_divisor(clk_hz: float, baud: float) -> int:
    """Clock cycles per UART bit: ``round(clk_hz / baud)``; raises if that is below
    :data:`~systolic.boards.uart.MIN_DIVISOR` or misses ``baud`` by more than
    :data:`MAX_BAUD_ERROR`."""
    clk = _positive_number("clk_hz", clk_hz)
    rate = _positive_number("baud", baud)
    divisor = round(clk / rate)
    if divisor < MIN_DIVISOR:
        raise ValueError(f"baud must be at most clk_hz / {MIN_DIVISOR} (the UART needs "
                         f"{MIN_DIVISOR} clock cycles per bit), not {baud!r} with clk_hz={clk_hz!r} "
                         f"(divisor {divisor})")
    error = abs(clk / divisor - rate) / rate
    if error > MAX_BAUD_ERROR:
        raise ValueError(f"baud must be within {MAX_BAUD_ERROR:.0%} of clk_hz / divisor, not "
                         f"{baud!r}: clk_hz={clk_hz!r} / divisor {divisor} gives "
                         f"{clk / divisor:.0f} ({error:.1%} off)")
    return divisor


def soc_ports(config: AcceleratorConfig) -> dict[str, wiring.Member]:
    """The SoC's ports (:class:`SoC`): ``uart_rx``, ``uart_tx``, ``busy``, ``error``, and
    ``compute_clk`` when ``config`` has a compute clock of its own."""
    ports = {"uart_rx": In(1, init=1), "uart_tx": Out(1, init=1), "busy": Out(1), "error": Out(1)}
    if config.compute_clock_mhz:
        ports["compute_clk"] = In(1)
    return ports


def _check_timeout_bits(timeout_bits: object) -> int:
    if isinstance(timeout_bits, bool) or not isinstance(timeout_bits, int):
        raise TypeError(f"timeout_bits must be an integer, not {timeout_bits!r}")
    if timeout_bits < MIN_TIMEOUT_BITS:
        raise ValueError(f"timeout_bits must be at least {MIN_TIMEOUT_BITS} bit times (two "
                         f"characters), not {timeout_bits}")
    return timeout_bits


class SoC(wiring.Component):
    """Accelerator + on-chip memory + UART host bridge (see the module docstring).

    ``memory`` is ``"bram"`` (block RAM; simulation) or ``"spram"`` (iCE40UP5K SB_SPRAM256KA).
    ``firmware_ram`` (firmware control only, :data:`~systolic.hw.fw_engine.RAM_KINDS`): what holds
    the accelerator's core RAM; by default ``"spram"`` with an SPRAM memory (two of the four
    blocks: the SoC memory gets the other two), else ``"init"``.
    The UART runs at ``clk_hz / round(clk_hz / baud)`` baud, 8N1. ``timeout_bits`` is the longest
    silence inside a request frame, in bit times. The parts are attributes: ``accelerator``,
    ``memory`` (its ``ram.data[word]`` reaches a ``"bram"`` memory's contents in simulation),
    ``bridge``, ``receiver``, ``transmitter``.

    Ports: ``uart_rx`` (in; UART input from the host, asynchronous, synchronized inside),
    ``uart_tx`` (out; UART output to the host), ``busy`` (out; a program started through the
    bridge has not finished yet, for an LED), ``error`` (out; the last STATUS read through the
    bridge showed an error, for an LED) and, only when ``config.compute_clock_mhz`` is set,
    ``compute_clk`` (in): the clock of the accelerator's compute core (docs/arch-system.md, "Two
    clocks"), unrelated to the SoC's ``sync`` clock; it needs no reset of its own.
    """

    def __init__(self, config: AcceleratorConfig, *, memory_bytes: int, memory: str = "bram",
                 clk_hz: float, baud: float, timeout_bits: int = DEFAULT_TIMEOUT_BITS,
                 firmware_ram: str | None = None):
        if not isinstance(config, AcceleratorConfig):
            raise TypeError(f"config must be an AcceleratorConfig, not {config!r}")
        check_memory(memory, memory_bytes, config.dma_data_bits)
        self.config = config
        self.divisor = check_divisor(baud_divisor(clk_hz, baud))
        self.clk_hz = clk_hz
        self.baud = baud
        self.timeout_bits = _check_timeout_bits(timeout_bits)
        self.memory_bytes = memory_bytes
        self.memory_kind = memory
        # the firmware control reads one beat at a time: a read buffer of one beat
        self.memory = SoCMemory(memory_bytes=memory_bytes, data_width=config.dma_data_bits, kind=memory,
                                read_buffer=1 if config.control == "firmware" else None)
        if firmware_ram is None:
            firmware_ram = "spram" if memory == "spram" and config.control == "firmware" else "init"
        self.accelerator = Accelerator(config, firmware_ram=firmware_ram)
        self.bridge = Bridge(port=self.memory.port_signature, memory_bytes=memory_bytes,
                             bus_bytes=config.dma_bytes, config_hash=config.hash,
                             timeout_cycles=self.timeout_bits * self.divisor)
        self.receiver = UARTReceiver(self.divisor)
        self.transmitter = UARTTransmitter(self.divisor)
        super().__init__(soc_ports(config))

    def elaborate(self, platform):
        m = Module()
        m.submodules.accelerator = accel = self.accelerator
        m.submodules.memory = memory = self.memory
        m.submodules.bridge = bridge = self.bridge
        m.submodules.receiver = receiver = self.receiver
        m.submodules.transmitter = transmitter = self.transmitter

        m.d.comb += [receiver.rx.eq(self.uart_rx), self.uart_tx.eq(transmitter.tx)]
        if self.config.compute_clock_mhz:
            m.d.comb += accel.compute_clk.eq(self.compute_clk)
        wiring.connect(m, receiver=receiver.data, bridge=bridge.rx)
        wiring.connect(m, bridge=bridge.tx, transmitter=transmitter.data)
        wiring.connect(m, bridge=bridge.mem, memory=memory.bridge)
        m.d.comb += [bridge.irq.eq(accel.irq), self.busy.eq(bridge.run_busy),
                     self.error.eq(bridge.run_error)]

        # the bridge's CSR master onto the accelerator's flat AXI4-Lite port
        lite = bridge.csr
        m.d.comb += [
            accel.s_axil_awvalid.eq(lite.aw.valid), lite.aw.ready.eq(accel.s_axil_awready),
            accel.s_axil_awaddr.eq(lite.aw.payload.addr),
            accel.s_axil_wvalid.eq(lite.w.valid), lite.w.ready.eq(accel.s_axil_wready),
            accel.s_axil_wdata.eq(lite.w.payload.data), accel.s_axil_wstrb.eq(lite.w.payload.strb),
            lite.b.valid.eq(accel.s_axil_bvalid), accel.s_axil_bready.eq(lite.b.ready),
            lite.b.payload.resp.eq(accel.s_axil_bresp),
            accel.s_axil_arvalid.eq(lite.ar.valid), lite.ar.ready.eq(accel.s_axil_arready),
            accel.s_axil_araddr.eq(lite.ar.payload.addr),
            lite.r.valid.eq(accel.s_axil_rvalid), accel.s_axil_rready.eq(lite.r.ready),
            lite.r.payload.data.eq(accel.s_axil_rdata), lite.r.payload.resp.eq(accel.s_axil_rresp),
        ]

        # the accelerator's flat AXI4 manager port onto the memory
        axi = memory.axi
        m.d.comb += [
            axi.ar.valid.eq(accel.m_axi_arvalid), accel.m_axi_arready.eq(axi.ar.ready),
            axi.ar.payload.addr.eq(accel.m_axi_araddr), axi.ar.payload.len.eq(accel.m_axi_arlen),
            axi.ar.payload.size.eq(accel.m_axi_arsize),
            accel.m_axi_rvalid.eq(axi.r.valid), axi.r.ready.eq(accel.m_axi_rready),
            accel.m_axi_rdata.eq(axi.r.payload.data), accel.m_axi_rresp.eq(axi.r.payload.resp),
            accel.m_axi_rlast.eq(axi.r.payload.last),
            axi.aw.valid.eq(accel.m_axi_awvalid), accel.m_axi_awready.eq(axi.aw.ready),
            axi.aw.payload.addr.eq(accel.m_axi_awaddr), axi.aw.payload.len.eq(accel.m_axi_awlen),
            axi.aw.payload.size.eq(accel.m_axi_awsize),
            axi.w.valid.eq(accel.m_axi_wvalid), accel.m_axi_wready.eq(axi.w.ready),
            axi.w.payload.data.eq(accel.m_axi_wdata), axi.w.payload.strb.eq(accel.m_axi_wstrb),
            axi.w.payload.last.eq(accel.m_axi_wlast),
            accel.m_axi_bvalid.eq(axi.b.valid), axi.b.ready.eq(accel.m_axi_bready),
            accel.m_axi_bresp.eq(axi.b.payload.resp),
        ]
        return m


def soc_verilog(config: AcceleratorConfig, *, memory_bytes: int, divisor: int,
                timeout_bits: int = DEFAULT_TIMEOUT_BITS, firmware_ram: str | None = None) -> str:
    """Verilog of the SoC with a ``"bram"`` memory as module ``systolic_soc``, ports ``clk``,
    ``rst`` (synchronous, active high), ``uart_rx``, ``uart_tx``, ``busy``, ``error`` and, with
    ``config.compute_clock_mhz``, ``compute_clk``; the UART runs at ``divisor`` clock cycles per
    bit."""
    from systolic.sim.tools import to_verilog

    check_divisor(divisor)
    # any clock works: only the ratio (the divisor) reaches the gateware
    baud = 1_000_000
    soc = SoC(config, memory_bytes=memory_bytes, memory="bram", clk_hz=divisor * baud, baud=baud,
              timeout_bits=timeout_bits, firmware_ram=firmware_ram)
    return to_verilog(soc, "systolic_soc")
