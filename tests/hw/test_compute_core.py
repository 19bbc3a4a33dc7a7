# amaranth: UnusedElaboratable=no
"""hw/compute_core.py: the compute core's ports are those of the units inside it (its behaviour
with crossings around it is tests/hw/test_top.py's and tests/sim/test_rtl_compute_clock.py's),
and a wrong argument is named. The compute unit's registers (``memory_registers``) cut its
handshakes with the scratchpad and the array (its results are tests/hw/test_top.py's)."""

import random

import pytest
from amaranth import Const
from amaranth.sim import Simulator
from systolic.hw.accumulator import Accumulator, acc_dma_write_layout, acc_row_layout
from systolic.hw.array import SystolicArray
from systolic.hw.compute_core import ComputeCore
from systolic.hw.config import AcceleratorConfig
from systolic.hw.isa import Instruction, Opcode, encode
from systolic.hw.scratchpad import spad_write_layout
from systolic.hw.units import ComputeUnit


def test_ports_carry_the_units_payloads():
    config = AcceleratorConfig(rows=4, cols=4, scratchpad_bytes=4096, accumulator_bytes=2048)
    core = ComputeCore(config)
    assert core.spad_write.payload.shape() == spad_write_layout(config)
    assert core.acc_write.payload.shape() == acc_dma_write_layout(config)
    assert core.acc_read.resp.payload.shape() == acc_row_layout(config)
    assert len(core.acc_read.req.payload.addr) == config.acc_addr_bits
    assert len(core.macs) == (config.rows * config.cols).bit_length()


def test_config_type_error():
    with pytest.raises(TypeError, match=r"^config must be an AcceleratorConfig, not \{'rows': 4\}$"):
        ComputeCore({"rows": 4})


def _handshakes(dataflow: str, memory_registers: bool) -> tuple[dict[str, int], int]:
    """Run COMPUTEs through a lone ComputeUnit with random readiness and result rows for 200
    cycles. In each cycle flip one input at a time and count the cycles where an output changes
    with it: the array's readiness -> the ``ready`` to the scratchpad's responses ("spad"), the
    array's result ``valid`` -> the write to the accumulator ("acc"). Returns the counts and the cycle of
    the first request to the scratchpad (the command is offered from cycle 0)."""
    config = AcceleratorConfig(rows=4, cols=4, dataflow=dataflow, scratchpad_bytes=4096,
                               accumulator_bytes=2048, memory_registers=memory_registers)
    dut = ComputeUnit(config)
    ws = dataflow == "ws"
    compute = Instruction(Opcode.COMPUTE, m=6 if ws else 4, k=4, n=4, preload=int(ws), a_addr=3, b_addr=40)
    word = int.from_bytes(encode(compute), "little")
    rng = random.Random(5)
    dependent = {"spad": 0, "acc": 0}
    first_request = None
    array_ready = [dut.inputs.ready] + ([dut.weights.ready] if ws else [])
    ports = (dut.read_a, dut.read_b)
    flips = {
        "spad": (array_ready, lambda ctx: tuple(ctx.get(port.resp.ready) for port in ports)),
        "acc": ([dut.outputs.valid], lambda ctx: ctx.get(dut.acc_write.valid)),
    }

    async def bench(ctx):
        nonlocal first_request
        ctx.set(dut.cmd.payload.word, word)
        ctx.set(dut.cmd.valid, 1)
        for port in ports:
            ctx.set(port.resp.valid, 1)         # a row is always there: only the handshakes matter
        for cycle in range(200):
            if first_request is None and any(ctx.get(port.req.valid) for port in ports):
                first_request = cycle
            for name, (inputs, output) in flips.items():
                seen = set()
                for value in (0, 1):
                    for signal in inputs:
                        ctx.set(signal, value)
                    seen.add(output(ctx))
                dependent[name] += len(seen) > 1
            for signal in array_ready + [dut.outputs.valid]:
                ctx.set(signal, rng.random() < 0.7)
            for port in ports:
                ctx.set(port.req.ready, rng.random() < 0.7)
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return dependent, first_request


@pytest.mark.parametrize("memory_registers", [True, False])
def test_results_are_taken_without_a_handshake(memory_registers: bool) -> None:
    """The accumulator takes a row in every cycle, so the compute unit's result input and its
    accumulator write are ``always_ready`` streams (``ready`` is ``Const(1)``), and the array
    that feeds them runs without back-pressure."""
    config = AcceleratorConfig(rows=4, cols=4, scratchpad_bytes=4096, accumulator_bytes=2048,
                               memory_registers=memory_registers)
    unit = ComputeUnit(config)
    acc = Accumulator(config)
    for stream_ in (unit.outputs, unit.acc_write, acc.array_write):
        assert stream_.signature.always_ready and isinstance(stream_.ready, Const)
        assert stream_.ready.value == 1
    array = SystolicArray(config, backpressure=False)
    assert array.outputs.signature.always_ready and array.stall_stages == 0


@pytest.mark.parametrize("dataflow", ["ws", "os"])
def test_the_compute_units_registers_cut_its_handshakes(dataflow: str) -> None:
    """With ``memory_registers`` the array's readiness does not reach the scratchpad's response
    handshake in the same cycle, each request passes a register (a cycle later than without
    it) before the scratchpad's arbitration, and the array's results pass a register before the
    write to the accumulator (no path from the array's result valid to the accumulator's): the
    16x16 compute core's critical paths (docs/boards.md). Without them each of these paths is
    there, in some cycles."""
    dependent, first = _handshakes(dataflow, memory_registers=True)
    direct_dependent, direct_first = _handshakes(dataflow, memory_registers=False)
    assert dependent == {"spad": 0, "acc": 0}
    assert all(count > 0 for count in direct_dependent.values()), direct_dependent
    assert first is not None and direct_first is not None
    assert first == direct_first + 1, (first, direct_first)
