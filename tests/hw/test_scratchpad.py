"""Scratchpad against a Python model of its rows, under random concurrent traffic.

Every stream is driven or watched by a testbench that counts clock edges from time 0, so each
write and read carries the edge at which it was accepted; the model replays them in that order
(a read sees the writes of earlier edges and of its own: the read ports are transparent) and the
responses must match.
"""

from __future__ import annotations

import gc
import os
import random
import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from amaranth import Module
from amaranth.hdl import UnusedElaboratable
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator
from systolic.hw.config import AcceleratorConfig
from systolic.hw.dsp import COPY_GROUP_BITS
from systolic.hw.scratchpad import LOAD_GROUP_BITS, Scratchpad, read_latency, select_bank_row
from systolic.sim.tools import to_verilog

from tests.boards.clocked_testbench import random_top, run_clocked_testbench
from tests.hw.ecp5_stand import Ecp5Stand

SEED = int(os.environ.get("SYSTOLIC_TEST_SEED", "1"))
#: A testbench gives up after this many clock edges, so a broken handshake fails instead of hanging.
EDGE_LIMIT = 20_000

# 4 banks of 16 rows of 4 int8 elements
SMALL = AcceleratorConfig(rows=4, cols=4, scratchpad_bytes=256, scratchpad_banks=4)
# 2 banks of 8 rows of 8 int16 elements (rows > cols: the row is R wide)
WIDE = AcceleratorConfig(rows=8, cols=4, input_bits=16, weight_bits=16, scratchpad_bytes=256,
                         scratchpad_banks=2)
#: SMALL without the memory registers (read latency 2)
DIRECT = SMALL.replace(memory_registers=False)
BOTH = pytest.mark.parametrize("config", [SMALL, DIRECT], ids=["registered", "direct"])


# -- cycle-stamped stream drivers (shared with test_accumulator and test_sfu) ----------------------

async def drive(ctx: Any, stream: Any, payloads: Sequence[Any], *, rng: random.Random,
                gap: float = 0.0, start: int = 0) -> list[int]:
    """Offer ``payloads`` on ``stream`` in order, idling a random number of cycles (probability
    ``gap`` each) before each; returns the clock edge (counted from time 0) at which each was
    accepted. ``start`` idles that many edges first."""
    edge = 0
    accepted = []
    for _ in range(start):
        await ctx.tick()
        edge += 1
    for payload in payloads:
        while rng.random() < gap:
            await ctx.tick()
            edge += 1
        ctx.set(stream.valid, 1)
        ctx.set(stream.payload, payload)
        while True:
            _, _, ready = await ctx.tick().sample(stream.ready)
            edge += 1
            if ready:
                accepted.append(edge)
                break
        ctx.set(stream.valid, 0)
    return accepted


async def collect(ctx: Any, stream: Any, count: int, *, rng: random.Random,
                  stall: float = 0.0) -> list[tuple[int, Any]]:
    """Take ``count`` payloads from ``stream``, holding ``ready`` low with probability ``stall``
    each cycle; returns (edge, payload) of each transfer."""
    edge = 0
    taken = []
    while len(taken) < count:
        ready = rng.random() >= stall
        ctx.set(stream.ready, ready)
        _, _, valid, payload = await ctx.tick().sample(stream.valid, stream.payload)
        edge += 1
        if valid and ready:
            taken.append((edge, payload))
    ctx.set(stream.ready, 0)
    return taken


def simulate(dut: Any, *testbenches: Callable[..., Any], limit: int = EDGE_LIMIT,
             background: tuple[Callable[..., Any], ...] = ()) -> None:
    """Run the testbenches to completion on a 1 MHz clock (``background`` ones beside them, not
    waited for); fails after ``limit`` edges."""
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    for testbench in testbenches:
        sim.add_testbench(testbench)
    for testbench in background:
        sim.add_testbench(testbench, background=True)

    async def watchdog(ctx):
        await ctx.delay(limit * 1e-6)
        raise AssertionError(f"the testbenches did not finish within {limit} clock edges")

    sim.add_testbench(watchdog, background=True)
    sim.run()


def construct_rejected(factory: Callable[[], Any]) -> None:
    """Call a constructor expected to raise, silencing the unused-elaboratable warning of the
    half-built object."""
    error = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        try:
            factory()
        except Exception as exc:        # drop the traceback: its frames keep the object alive
            error = exc.with_traceback(None)
        gc.collect()
    if error is not None:
        raise error


def driver(result: dict[str, Any], key: str, stream: Any, payloads: Sequence[Any], **options: Any):
    """A testbench that drives ``payloads`` (:func:`drive` with ``options``) and stores their accept
    edges in ``result[key]``."""
    async def testbench(ctx):
        result[key] = await drive(ctx, stream, payloads, **options)
    return testbench


def row_sink(result: dict[str, Any], key: str, stream: Any, count: int, elems: int, **options: Any):
    """A testbench that takes ``count`` rows of ``elems`` elements (:func:`collect` with
    ``options``) and stores (edge, row) pairs in ``result[key]``."""
    async def testbench(ctx):
        taken = await collect(ctx, stream, count, **options)
        result[key] = [(edge, [row[i] for i in range(elems)]) for edge, row in taken]
    return testbench


# -- model -------------------------------------------------------------------------------------

class ScratchpadModel:
    """Rows of elements; replays stamped writes and reads (writes first within an edge)."""

    def __init__(self, config: AcceleratorConfig) -> None:
        self.rows = [[0] * config.spad_row_elems for _ in range(config.spad_rows)]

    def replay(self, writes: list[tuple[int, dict[str, Any]]],
               reads: dict[str, list[tuple[int, int]]]) -> dict[str, list[list[int]]]:
        events = [(edge, 0, "w", w) for edge, w in writes]
        for port, stamped in reads.items():
            events += [(edge, 1, port, addr) for edge, addr in stamped]
        out: dict[str, list[list[int]]] = {port: [] for port in reads}
        for _, _, kind, item in sorted(events, key=lambda e: (e[0], e[1])):
            if kind == "w":
                row = self.rows[item["addr"]]
                for e, value in enumerate(item["data"]):
                    if item["mask"] >> e & 1:
                        row[e] = value
            else:
                out[kind].append(list(self.rows[item]))
        return out


def _random_row(rng: random.Random, config: AcceleratorConfig) -> list[int]:
    top = (1 << config.spad_elem_bits) - 1
    return [rng.choice([0, top, 1 << (config.spad_elem_bits - 1), rng.randint(0, top)])
            for _ in range(config.spad_row_elems)]


def run_traffic(config: AcceleratorConfig, writes: list[dict[str, Any]], reads_a: list[int],
                reads_b: list[int], *, seed: int, gap: float, stall: float,
                write_start: int = 0) -> dict[str, Any]:
    """Run the three streams concurrently; returns accept edges and responses per port."""
    dut = Scratchpad(config)
    result: dict[str, Any] = {}

    async def writer(ctx):
        result["write"] = await drive(ctx, dut.write, writes, rng=random.Random(seed), gap=gap,
                                      start=write_start)

    def reader(name, port, addrs, salt):
        async def requester(ctx):
            result[f"{name}_req"] = await drive(ctx, port.req, [{"addr": a} for a in addrs],
                                                rng=random.Random(seed + salt), gap=gap)

        async def receiver(ctx):
            taken = await collect(ctx, port.resp, len(addrs), rng=random.Random(seed + salt + 1),
                                  stall=stall)
            result[f"{name}_resp"] = [(edge, [row[e] for e in range(config.spad_row_elems)])
                                      for edge, row in taken]
        return requester, receiver

    simulate(dut, writer, *reader("a", dut.read_a, reads_a, 10), *reader("b", dut.read_b, reads_b, 20))
    return result


def check_against_model(config: AcceleratorConfig, writes: list[dict[str, Any]], reads_a: list[int],
                        reads_b: list[int], result: dict[str, Any]) -> None:
    expected = ScratchpadModel(config).replay(
        list(zip(result["write"], writes, strict=True)),
        {"a": list(zip(result["a_req"], reads_a, strict=True)),
         "b": list(zip(result["b_req"], reads_b, strict=True))})
    for port in ("a", "b"):
        got = [row for _, row in result[f"{port}_resp"]]
        assert got == expected[port], f"read_{port} responses differ from the model"
        # responses come in order, never before read_latency(config)
        for (resp_edge, _), req_edge in zip(result[f"{port}_resp"], result[f"{port}_req"], strict=True):
            assert resp_edge >= req_edge + read_latency(config)


# -- tests ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("config", [SMALL, WIDE, DIRECT, WIDE.replace(memory_registers=False)],
                         ids=["int8-4banks", "int16-2banks", "int8-4banks-direct", "int16-2banks-direct"])
def test_random_concurrent_traffic_matches_model(config: AcceleratorConfig) -> None:
    rng = random.Random(SEED)
    hot = [rng.randrange(config.spad_rows) for _ in range(6)]      # rows hit again and again

    def addr() -> int:
        return rng.choice(hot) if rng.random() < 0.5 else rng.randrange(config.spad_rows)

    full = (1 << config.spad_row_elems) - 1
    writes = [{"addr": addr(), "data": _random_row(rng, config),
               "mask": rng.choice([full, 0, 1, rng.randrange(full + 1)])} for _ in range(250)]
    reads_a = [addr() for _ in range(250)]
    reads_b = [addr() for _ in range(250)]
    result = run_traffic(config, writes, reads_a, reads_b, seed=SEED, gap=0.3, stall=0.3)
    check_against_model(config, writes, reads_a, reads_b, result)


@BOTH
def test_masked_writes_keep_other_elements(config: AcceleratorConfig) -> None:
    writes = [{"addr": 5, "data": [0x11, 0x22, 0x33, 0x44], "mask": 0b1111},
              {"addr": 5, "data": [0xAA, 0xBB, 0xCC, 0xDD], "mask": 0b0101},
              {"addr": 5, "data": [0xEE] * 4, "mask": 0b0000},
              {"addr": 5, "data": [0x80, 0xFF, 0x00, 0x7F], "mask": 0b1000}]
    result = run_traffic(config, writes, [5] * 8, [], seed=SEED, gap=0.0, stall=0.0, write_start=0)
    check_against_model(config, writes, [5] * 8, [], result)
    assert result["a_resp"][-1][1] == [0xAA, 0x22, 0xCC, 0x7F]


@BOTH
def test_dma_and_both_operands_on_different_banks_run_at_full_rate(config: AcceleratorConfig) -> None:
    # write fills bank 1 while A reads bank 0 and B reads bank 2: one row per cycle each
    bank = config.spad_bank_rows
    rng = random.Random(SEED)
    writes = [{"addr": bank + k, "data": _random_row(rng, config), "mask": 0b1111} for k in range(bank)]
    reads_a = list(range(bank))
    reads_b = [2 * bank + k for k in range(bank)]
    result = run_traffic(config, writes, reads_a, reads_b, seed=SEED, gap=0.0, stall=0.0)
    check_against_model(config, writes, reads_a, reads_b, result)
    for port in ("write", "a_req", "b_req"):
        assert result[port] == list(range(1, bank + 1)), port
    for port in ("a", "b"):
        expected = [e + read_latency(config) for e in result[f"{port}_req"]]
        assert [e for e, _ in result[f"{port}_resp"]] == expected


@BOTH
def test_write_and_read_of_one_bank_proceed_together(config: AcceleratorConfig) -> None:
    # the write never waits, even for the bank the reader uses; a read of the row written at
    # the same edge returns the new row
    rows = [{"addr": k, "data": [k + 1] * 4, "mask": 0b1111} for k in range(8)]
    rewrite = [{"addr": k, "data": [0xF0 + k] * 4, "mask": 0b1111} for k in range(8)]
    reads_a = list(range(8)) * 2
    result = run_traffic(config, rows + rewrite, reads_a, [], seed=SEED, gap=0.0, stall=0.0,
                         write_start=0)
    check_against_model(config, rows + rewrite, reads_a, [], result)
    assert result["write"] == list(range(1, 17))
    # A reads row k at edge k+1, exactly when the first write of row k happens: its value
    assert [row for _, row in result["a_resp"][:8]] == [[k + 1] * 4 for k in range(8)]
    # ... and row k again at edge k+9, with the second write of row k
    assert [row for _, row in result["a_resp"][8:]] == [[0xF0 + k] * 4 for k in range(8)]


@BOTH
def test_same_bank_reads_alternate_round_robin(config: AcceleratorConfig) -> None:
    rng = random.Random(SEED)
    writes = [{"addr": k, "data": _random_row(rng, config), "mask": 0b1111} for k in range(16)]
    pre = run_traffic(config, writes, [], [], seed=SEED, gap=0.0, stall=0.0)
    assert pre["write"] == list(range(1, 17))
    # now both ports stream from bank 0 (after the writes: start reading at edge 17)
    reads_a = [k % 16 for k in range(20)]
    reads_b = [(7 * k) % 16 for k in range(20)]
    dut = Scratchpad(config)
    result: dict[str, Any] = {}
    simulate(dut, driver(result, "write", dut.write, writes, rng=rng),
             driver(result, "a_req", dut.read_a.req, [{"addr": a} for a in reads_a], rng=rng, start=17),
             driver(result, "b_req", dut.read_b.req, [{"addr": a} for a in reads_b], rng=rng, start=17),
             row_sink(result, "a_resp", dut.read_a.resp, len(reads_a), 4, rng=rng),
             row_sink(result, "b_resp", dut.read_b.resp, len(reads_b), 4, rng=rng))
    check_against_model(config, writes, reads_a, reads_b, result)
    both = sorted(result["a_req"] + result["b_req"])
    assert both == list(range(18, 18 + 40)), "the bank serves one read per cycle, every cycle"
    assert result["a_req"] == list(range(18, 58, 2))      # A wins the first conflict ...
    assert result["b_req"] == list(range(19, 59, 2))      # ... then they alternate


@BOTH
def test_pending_response_holds_while_other_port_reuses_the_bank(config: AcceleratorConfig) -> None:
    # A's consumer is slow; B reads other rows of the same bank meanwhile: A's row must not change
    rng = random.Random(SEED + 1)
    writes = [{"addr": k, "data": _random_row(rng, config), "mask": 0b1111} for k in range(16)]
    reads_a = [rng.randrange(16) for _ in range(60)]
    reads_b = [rng.randrange(16) for _ in range(60)]
    dut = Scratchpad(config)
    result: dict[str, Any] = {}
    simulate(dut, driver(result, "write", dut.write, writes, rng=rng),
             driver(result, "a_req", dut.read_a.req, [{"addr": a} for a in reads_a], rng=random.Random(1),
                    start=16),
             driver(result, "b_req", dut.read_b.req, [{"addr": a} for a in reads_b], rng=random.Random(2),
                    start=16),
             row_sink(result, "a_resp", dut.read_a.resp, 60, 4, rng=random.Random(3), stall=0.8),
             row_sink(result, "b_resp", dut.read_b.resp, 60, 4, rng=random.Random(4)))
    check_against_model(config, writes, reads_a, reads_b, result)
    assert result["b_req"][-1] < result["a_req"][-1], "B ran ahead while A's response waited"


@BOTH
def test_a_port_owes_read_latency_plus_one_responses_at_most_and_otherwise_runs_at_full_rate(
        config: AcceleratorConfig) -> None:
    """One port, requests offered every cycle, a consumer that stalls at random: exact cycles.
    A response is taken at the first edge with ``ready`` from the read latency after its request
    and after the previous one; a request is accepted at the first edge after the previous one
    where at most read-latency + 1 responses are owed with it, one taken at the same edge still
    counting (the port is decoupled: the consumer's ``ready`` does not reach the grant)."""
    rng = random.Random(SEED + 2)
    writes = [{"addr": k, "data": _random_row(rng, config), "mask": 0b1111} for k in range(16)]
    reads = [rng.randrange(16) for _ in range(80)]
    dut = Scratchpad(config)
    result: dict[str, Any] = {}

    async def receiver(ctx):
        pattern = random.Random(SEED + 3)
        edge, ready_at, taken = 0, set(), []
        while len(taken) < len(reads):
            ready = pattern.random() < 0.5 or edge > 150
            ctx.set(dut.read_a.resp.ready, ready)
            _, _, valid, row = await ctx.tick().sample(dut.read_a.resp.valid, dut.read_a.resp.payload)
            edge += 1
            if ready:
                ready_at.add(edge)
            if valid and ready:
                taken.append((edge, [row[e] for e in range(4)]))
        result["a_resp"], result["ready_at"] = taken, ready_at

    simulate(dut, driver(result, "write", dut.write, writes, rng=rng),
             driver(result, "a_req", dut.read_a.req, [{"addr": a} for a in reads], rng=rng, start=16),
             receiver)
    result["b_req"], result["b_resp"] = [], []
    check_against_model(config, writes, reads, [], result)
    requests, taken = result["a_req"], [e for e, _ in result["a_resp"]]
    previous_take = 0
    for k, request in enumerate(requests):
        due = max(request + read_latency(config), previous_take + 1)
        assert taken[k] == min(e for e in result["ready_at"] if e >= due), f"response {k}"
        previous_take = taken[k]
    for k in range(1, len(requests)):
        def owed(edge: int, k: int = k) -> int:
            return k + 1 - sum(t < edge for t in taken)
        expected = next(e for e in range(requests[k - 1] + 1, requests[k] + 1)
                        if owed(e) <= read_latency(config) + 1)
        assert requests[k] == expected, f"request {k}"
    assert max(k + 1 - sum(t < e for t in taken) for k, e in enumerate(requests)) == read_latency(config) + 1


@pytest.mark.parametrize("cols,bits", [(16, 128), (4, 32)])
def test_response_entries_load_under_registers_of_their_own_on_ecp5(cols: int, bits: int) -> None:
    """On ECP5 each 64-bit group of each read response entry loads under a TRELLIS_FF of its own
    (no net from one register to every bit of a row, no logic between it and the enables): the
    ring's L + 1 entries (a decoupled port) of a 128-bit row have two each, of a 32-bit row one."""
    config = AcceleratorConfig(rows=cols, cols=cols, scratchpad_bytes=4096, scratchpad_banks=2)
    assert config.spad_row_elems * config.input_bits == bits
    groups = -(-bits // LOAD_GROUP_BITS)
    assert groups == (2 if bits == 128 else 1)
    verilog = to_verilog(Scratchpad(config), "scratchpad", platform=Ecp5Stand())
    depth = read_latency(config) + 1
    for port in ("read_a", "read_b"):
        loads = {f"{port}__resp__valid_load{k}_{g}_ff" for k in range(depth) for g in range(groups)}
        assert {name for name in loads if f" {name} (" in verilog} == loads
        assert f" {port}__resp__valid_load{depth}_0_ff (" not in verilog
        assert f" {port}__resp__valid_load0_{groups}_ff (" not in verilog


@pytest.mark.parametrize("unit", ["scratchpad", "accumulator"])
@pytest.mark.parametrize("registered", [True, False], ids=["registers", "direct"])
def test_response_valid_is_read_by_the_consumer_alone(unit: str, registered: bool) -> None:
    """A read port's ``resp.valid`` register reaches no logic inside its memory: the response
    ring takes ``entries.any()`` (the same value) for its own take, so that the consumer's
    ``ready``, commonly made from ``resp.valid``, is not a round trip from the ring and back in
    one cycle. In the Verilog the register appears in its declarations and its assignment only."""
    from systolic.hw.accumulator import Accumulator

    config = AcceleratorConfig(rows=4, cols=4, scratchpad_bytes=4096, scratchpad_banks=2,
                               memory_registers=registered)
    if unit == "scratchpad":
        dut, ports = Scratchpad(config), ("read_a", "read_b")
    else:
        dut, ports = Accumulator(config), ("read",)
    verilog = to_verilog(dut, unit)
    for port in ports:
        valid = f"{port}__resp__valid"
        uses = [line.strip() for line in verilog.splitlines()
                if re.search(rf"\b{valid}\b", line) and not line.startswith("module ")]
        assert len(uses) == 3, uses
        assert uses[0] == f"output {valid};"
        assert re.fullmatch(rf"reg {valid} = 1'h0;", uses[1]), uses[1]
        assert re.fullmatch(rf"{valid} <= \S+ ;", uses[2]), uses[2]


@pytest.mark.parametrize("cols,bits", [(16, 128), (4, 32)])
def test_row_bank_select_is_a_register_copy_per_group_on_ecp5(cols: int, bits: int) -> None:
    """On ECP5 each 64-bit group of a read port's row is chosen by a TRELLIS_FF copy of its own
    of the bank's last register (no register drives the multiplexer of every bit): two copies
    per bank bit for a 128-bit row, none for a 32-bit row (one group: the plain register)."""
    config = AcceleratorConfig(rows=cols, cols=cols, scratchpad_bytes=4096, scratchpad_banks=4)
    groups = -(-bits // COPY_GROUP_BITS)
    verilog = to_verilog(Scratchpad(config), "scratchpad", platform=Ecp5Stand())
    for row in ("row_a", "row_b"):
        copies = {f"{row}_bank_registered{g}_{b}_ff" for g in range(groups) for b in range(2)}
        if groups > 1:
            assert {name for name in copies if f" {name} (" in verilog} == copies
            assert f" {row}_bank_registered{groups}_0_ff (" not in verilog
        else:
            assert not any(f" {name} (" in verilog for name in copies)


class _BankSelect(wiring.Component):
    """select_bank_row of four 200-bit banks' data (inputs) by a 2-bit bank, for ECP5 or not."""

    def __init__(self, ecp5: bool) -> None:
        self._ecp5 = ecp5
        super().__init__({"data": In(800), "bank": In(2), "row": Out(200)})

    def elaborate(self, platform):
        m = Module()
        select_bank_row(m, [self.data[200 * k:200 * (k + 1)] for k in range(4)], self.bank, self.row,
                        platform=Ecp5Stand() if self._ecp5 else None)
        return m


@pytest.mark.slow
def test_row_bank_select_copies_choose_as_the_one_register_on_verilator() -> None:
    """select_bank_row elaborated for ECP5 (four copies of the bank's last register, in yosys's
    TRELLIS_FF model) beside its generic elaboration, random bank data and banks every cycle:
    the rows are equal in every cycle, and equal the data of the bank named READ_LATENCY - 1
    cycles earlier."""
    from .test_logic_multiplier_ecp5 import ecp5_cell_models

    body = """  logic [799:0] data;
  assign data = {x1[63:0], x2[63:0], x3[63:0], x1[63:0] ^ x2[63:0], x2[63:0] ^ x3[63:0],
                 x1[63:0] ^ x3[63:0], x1[63:0] + x2[63:0], x2[63:0] + x3[63:0], x1[63:0] - x3[63:0],
                 x1[63:0] ^ x2[62:0], x2[63:0] ^ x3[62:0], x3[63:0] ^ x1[62:0], x1[34:0]};
  logic [1:0] bank;
  assign bank = x3[9:8];
  logic [199:0] re, rg;
  se ue(.clk(clk), .rst(rst), .data(data), .bank(bank), .row(re));
  sg ug(.clk(clk), .rst(rst), .data(data), .bank(bank), .row(rg));
  logic [1:0] banks [0:3];
  logic [31:0] checked = 0, bad = 0, wrong = 0;
  always @(posedge clk) if (!rst) begin
    banks[0] <= bank; banks[1] <= banks[0]; banks[2] <= banks[1]; banks[3] <= banks[2];
    if (cycle > 8) begin
      checked <= checked + 1;
      if (re != rg) bad <= bad + 1;
      if (rg != data[200 * banks[3] +: 200]) wrong <= wrong + 1;
    end
  end
  final $display("checked %0d cycles: %0d differ, %0d wrong", checked, bad, wrong);
"""
    sources = [ecp5_cell_models("TRELLIS_FF"), to_verilog(_BankSelect(True), "se"),
               to_verilog(_BankSelect(False), "sg"), random_top("bank_select_check", 5, 5000, body)]
    output = run_clocked_testbench("bank_select_check", sources)
    checked, bad, wrong = map(int, re.search(r"checked (\d+) cycles: (\d+) differ, (\d+) wrong",
                                             output).groups())
    assert (bad, wrong) == (0, 0), output
    assert checked >= 4900, output


def test_config_must_be_an_accelerator_config() -> None:
    with pytest.raises(TypeError, match=r"^config must be an AcceleratorConfig, not None$"):
        construct_rejected(lambda: Scratchpad(None))  # type: ignore[arg-type]
