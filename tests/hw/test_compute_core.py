# amaranth: UnusedElaboratable=no
"""hw/compute_core.py: the compute core's ports are those of the units inside it (its behaviour
with crossings around it is tests/hw/test_top.py's and tests/sim/test_rtl_compute_clock.py's),
and a wrong argument is named. The compute unit's registers (``memory_registers``) cut its
handshakes with the scratchpad and the array (its results are tests/hw/test_top.py's)."""

import random

import pytest
from amaranth import Const, Module
from amaranth.sim import Simulator
from systolic.hw.accumulator import Accumulator, acc_dma_write_layout, acc_row_layout
from systolic.hw.array import SystolicArray
from systolic.hw.compute_core import ComputeCore, connect_compute_datapath
from systolic.hw.config import AcceleratorConfig
from systolic.hw.isa import Instruction, Opcode, encode
from systolic.hw.scratchpad import Scratchpad, spad_write_layout
from systolic.hw.units import LAUNCH_STAGES, REQUEST_STAGES, ComputeUnit


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
    with it: the array's ``ready`` -> anything the unit drives ("array": the unit reads its own
    copy of the array's handshake instead); an input row offered by the scratchpad -> the
    ``ready`` to the weight rows' responses ("spad", WS: the array's rule would take a weight row
    in the cycle an input row with ``new_weights`` swaps a waiting preload in; the unit offers
    weight rows only while none waits); the array's result ``valid`` ->
    the write to the accumulator ("acc"). Returns the counts and the cycle of the first request
    to the scratchpad (the command is offered from cycle 0)."""
    config = AcceleratorConfig(rows=4, cols=4, dataflow=dataflow, scratchpad_bytes=4096,
                               accumulator_bytes=2048, memory_registers=memory_registers)
    dut = ComputeUnit(config)
    ws = dataflow == "ws"
    compute = Instruction(Opcode.COMPUTE, m=6 if ws else 4, k=4, n=4, preload=int(ws), a_addr=3, b_addr=40)
    word = int.from_bytes(encode(compute), "little")
    rng = random.Random(5)
    first_request = None
    array_ready = [dut.inputs.ready] + ([dut.weights.ready] if ws else [])
    ports = (dut.read_a, dut.read_b)
    streams = [dut.inputs] + ([dut.weights] if ws else [])

    def driven(ctx):
        return (tuple(ctx.get(s.valid) for s in streams) + tuple(ctx.get(p.resp.ready) for p in ports)
                + tuple(ctx.get(p.req.valid) for p in ports) + (ctx.get(dut.acc_write.valid),))

    flips = {
        "array": (array_ready, driven),
        "acc": ([dut.outputs.valid], lambda ctx: ctx.get(dut.acc_write.valid)),
    }
    if ws:
        flips["spad"] = ([dut.read_a.resp.valid], lambda ctx: ctx.get(dut.read_b.resp.ready))
    dependent = dict.fromkeys(flips, 0)

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
            ctx.set(dut.read_a.resp.valid, 1)
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
    """With ``memory_registers`` each request passes REQUEST_STAGES registers (that many cycles later
    than without them) before the scratchpad's arbitration, and the array's results pass a register
    before the write to the accumulator (no path from the array's result valid to the
    accumulator's): the 16x16 compute core's critical paths (docs/boards.md). Without them the
    result path is there, in some cycles. With or without them, nothing the unit drives depends on
    the array's ``ready``: the unit makes the array's readiness from its own copy of the array's
    handshake (test_the_units_copy_of_the_arrays_handshake_is_the_arrays, below), and takes the rows
    at the heads of the scratchpad's response rings by it. WS: an input row offered on port A never
    changes whether port B's weight row is taken, in both: the unit offers weight rows only while no
    completed preload waits (the copy's `pending`), not in the swap cycle the array's rule also
    allows (on the 16x16 ULX3S SoC at 5832802 port A's side into the weights' metadata queue took
    10.7 ns, docs/boards.md)."""
    dependent, first = _handshakes(dataflow, memory_registers=True)
    direct_dependent, direct_first = _handshakes(dataflow, memory_registers=False)
    assert dependent.pop("array") == 0 and direct_dependent.pop("array") == 0
    assert dependent.pop("acc") == 0 and direct_dependent.pop("acc") > 0
    if dataflow == "ws":
        assert dependent.pop("spad") == 0 and direct_dependent.pop("spad") == 0
    assert not dependent and not direct_dependent
    assert first is not None and direct_first is not None
    assert REQUEST_STAGES == 2
    assert first == direct_first + REQUEST_STAGES, (first, direct_first)


@pytest.mark.parametrize("dataflow,memory_registers", [("ws", True), ("ws", False), ("os", True)])
def test_the_units_copy_of_the_arrays_handshake_is_the_arrays(dataflow: str, memory_registers: bool) -> None:
    """The compute unit drives the array's streams by its own copy of the array's handshake
    (hw/array.py ``ws_handshake``/``os_handshake``), not by the array's ``ready``: in every
    cycle of random COMPUTEs (preloading or not, of random sizes) with the scratchpad's write
    port taking random rows (bank conflicts stall the unit's reads), the array takes exactly the
    beats the copy takes, and rows do enter the array (and, WS, weights). Without the memory
    registers the array is offered the beats the copy decides on, and the copy's readiness is
    the array's in every cycle; with them it is shown each beat the copy took LAUNCH_STAGES
    cycles later, from the launch registers, and is ready for each (none is lost)."""
    config = AcceleratorConfig(rows=4, cols=4, dataflow=dataflow, scratchpad_bytes=4096,
                               accumulator_bytes=2048, memory_registers=memory_registers)
    ws = dataflow == "ws"
    m = Module()
    m.submodules.compute = unit = ComputeUnit(config)
    m.submodules.spad = spad = Scratchpad(config)
    m.submodules.acc = acc = Accumulator(config)
    m.submodules.array = array = SystolicArray(config, backpressure=False)
    connect_compute_datapath(m, config, unit, spad, acc, array)
    rng = random.Random(11)
    compared = {"inputs": [], "weights": []}
    # with the memory registers: whether the copy took a beat in each of the last LAUNCH_STAGES
    # cycles, oldest first
    taken = {"inputs": [0] * LAUNCH_STAGES, "weights": [0] * LAUNCH_STAGES}

    def command() -> int:
        k, n = rng.randint(1, 4), rng.randint(1, 4)
        fields = dict(k=k, n=n, m=rng.randint(1, 6) if ws else rng.randint(1, 4), a_addr=rng.randrange(200),
                      b_addr=rng.randrange(200), acc_addr=rng.randrange(32), accumulate=rng.randint(0, 1))
        if ws:
            fields["preload"] = int(rng.random() < 0.6)
        return int.from_bytes(encode(Instruction(Opcode.COMPUTE, **fields)), "little")

    async def bench(ctx):
        ctx.set(unit.cmd.payload.word, command())
        for _ in range(1500):
            ctx.set(unit.cmd.valid, rng.random() < 0.5)
            ctx.set(spad.write.valid, rng.random() < 0.3)
            ctx.set(spad.write.payload.addr, rng.randrange(256))
            ports = [("inputs", unit.array_inputs_ready, unit.array_inputs_taken, array.inputs)]
            if ws:
                ports.append(("weights", unit.array_weights_ready, unit.array_weights_taken, array.weights))
            for name, copy, took, port in ports:
                fire = ctx.get(port.valid) and ctx.get(port.ready)
                if memory_registers:
                    # shown only the beats the copy took LAUNCH_STAGES cycles ago, and ready for each
                    assert ctx.get(port.valid) == taken[name][0], name
                    assert fire == taken[name][0], name
                    taken[name] = taken[name][1:] + [ctx.get(took)]
                else:
                    assert ctx.get(copy) == ctx.get(port.ready), name
                    assert fire == ctx.get(took), name
                compared[name].append(fire)
            fired = ctx.get(unit.cmd.valid) and ctx.get(unit.cmd.ready)
            await ctx.tick()
            if fired:
                ctx.set(unit.cmd.payload.word, command())

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    # the traffic did move: rows entered the array (and weights) in many cycles, and not always
    assert 100 < sum(compared["inputs"]) < 1500
    if ws:
        assert 100 < sum(compared["weights"]) < 1500


def _row_lag(memory_registers: bool, name: str) -> int:
    """Cycles from the compute unit's take of its first scratchpad response for ``name`` (the
    input rows, port A, of a WS COMPUTE without a preload; the weight rows, port B, of one with)
    to the first row it offers the array on that stream, the scratchpad always ready and a
    response always there."""
    config = AcceleratorConfig(rows=4, cols=4, scratchpad_bytes=4096, accumulator_bytes=2048,
                               memory_registers=memory_registers)
    dut = ComputeUnit(config)
    compute = Instruction(Opcode.COMPUTE, m=6, k=4, n=4, preload=int(name == "weights"), a_addr=3,
                          b_addr=40)
    pairs = {"inputs": (dut.read_a, dut.inputs), "weights": (dut.read_b, dut.weights)}
    taken, offered = {}, {}

    async def bench(ctx):
        ctx.set(dut.cmd.payload.word, int.from_bytes(encode(compute), "little"))
        ctx.set(dut.cmd.valid, 1)
        for port, _ in pairs.values():
            ctx.set(port.req.ready, 1)
            ctx.set(port.resp.valid, 1)
        for cycle in range(60):
            for name, (port, to_array) in pairs.items():
                if name not in taken and ctx.get(port.resp.ready):
                    taken[name] = cycle
                if name not in offered and ctx.get(to_array.valid):
                    offered[name] = cycle
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return offered[name] - taken[name]


def test_rows_pass_the_launch_registers_with_the_memory_registers() -> None:
    """With ``memory_registers`` an input row and a weight row reach the array LAUNCH_STAGES (2)
    cycles after the unit takes them from the scratchpad (the first launch register takes the
    response ring's entry select and the weights' column mask, the last sits by the array,
    docs/arch-system.md); without them both go straight through."""
    assert LAUNCH_STAGES == 2
    assert [_row_lag(True, "inputs"), _row_lag(True, "weights")] == [2, 2]
    assert [_row_lag(False, "inputs"), _row_lag(False, "weights")] == [0, 0]


@pytest.mark.parametrize("dataflow,memory_registers", [("ws", True), ("ws", False), ("os", True)])
def test_a_compute_is_accepted_only_with_room_for_its_descriptors(dataflow: str,
                                                                  memory_registers: bool) -> None:
    """Short COMPUTEs offered back to back while the array and the scratchpad stall at random:
    no descriptor queue is ever written without room (with ``memory_registers`` the accept is a
    register of the room counted a cycle ahead), and COMPUTEs keep being accepted."""
    config = AcceleratorConfig(rows=4, cols=4, dataflow=dataflow, scratchpad_bytes=4096,
                               accumulator_bytes=2048, memory_registers=memory_registers)
    dut = ComputeUnit(config)
    ws = dataflow == "ws"
    rng = random.Random(11)
    ports = (dut.read_a, dut.read_b)
    array_ready = [dut.inputs.ready] + ([dut.weights.ready] if ws else [])
    seen = {"accepted": 0, "overflow": 0}

    def word() -> int:
        compute = Instruction(Opcode.COMPUTE, m=rng.randint(1, 3), k=rng.randint(1, 4), n=rng.randint(1, 4),
                              preload=int(ws and rng.random() < 0.5) or int(ws and seen["accepted"] == 0),
                              a_addr=rng.randrange(64), b_addr=rng.randrange(64))
        return int.from_bytes(encode(compute), "little")

    async def bench(ctx):
        ctx.set(dut.cmd.payload.word, word())
        ctx.set(dut.cmd.valid, 1)
        for port in ports:
            ctx.set(port.resp.valid, 1)
        for _ in range(600):
            stalled = rng.random() < 0.5
            for signal in array_ready:
                ctx.set(signal, not stalled and rng.random() < 0.8)
            for port in ports:
                ctx.set(port.req.ready, rng.random() < 0.7)
            ctx.set(dut.outputs.valid, rng.random() < 0.3)
            _, _, ready, overflow = await ctx.tick().sample(dut.cmd.ready, dut.descriptor_overflow)
            seen["overflow"] += overflow
            if ready:
                seen["accepted"] += 1
                ctx.set(dut.cmd.payload.word, word())

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert seen["overflow"] == 0
    assert seen["accepted"] >= 20, seen
