"""The compute core: the compute unit, the scratchpad, the accumulator and the systolic array,
joined as in the accelerator (scratchpad -> compute unit -> array -> compute unit ->
accumulator).

Its ports are the ones the rest of the accelerator uses: COMPUTE instructions in (``cmd``) and
their completion out, the scratchpad's DMA write port, the accumulator's DMA write and read
ports, and the compute unit's activity outputs for the performance counters. It is the block a
separate compute clock would drive, and the block ``bench/unit_fmax.py --unit compute_core``
measures as one (docs/boards.md).
"""

from amaranth import Module
from amaranth.hdl import unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .accumulator import Accumulator, acc_dma_write_layout, acc_row_layout
from .array import SystolicArray
from .config import AcceleratorConfig
from .controller import InstructionLayout
from .scratchpad import Scratchpad, read_port_signature, spad_write_layout
from .units import ComputeUnit, _row_macs_bits, accumulator_forwards

__all__ = ["ComputeCore", "connect_compute_datapath"]


def connect_compute_datapath(m: Module, config: AcceleratorConfig, compute: ComputeUnit,
                             spad: Scratchpad, acc: Accumulator, array: SystolicArray) -> None:
    """Scratchpad -> compute unit -> array -> compute unit -> accumulator, in ``m``."""
    wiring.connect(m, compute=compute.read_a, spad=spad.read_a)
    wiring.connect(m, compute=compute.read_b, spad=spad.read_b)
    if config.dataflow == "ws":
        wiring.connect(m, compute=compute.weights, array=array.weights)
    wiring.connect(m, compute=compute.inputs, array=array.inputs)
    wiring.connect(m, array=array.outputs, compute=compute.outputs)
    wiring.connect(m, compute=compute.acc_write, acc=acc.array_write)


class ComputeCore(wiring.Component):
    """The compute unit, scratchpad, accumulator and array of ``config`` (module docstring).
    ``depth``: COMPUTEs in flight in the compute unit; ``acc_read_queue``: the accumulator's
    read response queue (:class:`~systolic.hw.accumulator.Accumulator`)."""

    def __init__(self, config: AcceleratorConfig, *, depth: int = 4, acc_read_queue: int | None = None):
        if not isinstance(config, AcceleratorConfig):
            raise TypeError(f"config must be an AcceleratorConfig, not {config!r}")
        self.config = config
        self.depth = depth
        self.acc_read_queue = acc_read_queue
        acc_addr = data.StructLayout({"addr": unsigned(config.acc_addr_bits)})
        super().__init__({
            "cmd": In(stream.Signature(InstructionLayout())),
            "completed": Out(1),
            "busy": Out(1),
            "macs": Out(_row_macs_bits(config)),
            "array_active": Out(1),
            "spad_write": In(stream.Signature(spad_write_layout(config))),
            "acc_write": In(stream.Signature(acc_dma_write_layout(config))),
            "acc_read": In(read_port_signature(acc_addr, acc_row_layout(config))),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        m.submodules.compute = compute = ComputeUnit(cfg, depth=self.depth)
        m.submodules.spad = spad = Scratchpad(cfg)
        m.submodules.acc = acc = Accumulator(cfg, read_queue=self.acc_read_queue,
                                             forwarding=accumulator_forwards(cfg))
        m.submodules.array = array = SystolicArray(cfg, backpressure=False)
        connect_compute_datapath(m, cfg, compute, spad, acc, array)
        wiring.connect(m, wiring.flipped(self.cmd), compute.cmd)
        wiring.connect(m, wiring.flipped(self.spad_write), spad.write)
        wiring.connect(m, wiring.flipped(self.acc_write), acc.dma_write)
        wiring.connect(m, wiring.flipped(self.acc_read), acc.read)
        m.d.comb += [self.completed.eq(compute.completed), self.busy.eq(compute.busy),
                     self.macs.eq(compute.macs), self.array_active.eq(compute.array_active)]
        return m
