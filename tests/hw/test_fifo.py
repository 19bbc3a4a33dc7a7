# amaranth: UnusedElaboratable=no
"""The accelerator's FIFOs (``hw/fifo.py``): a :class:`BlockRamFIFO` moves the same items in the
same cycles as Amaranth's ``SyncFIFOBuffered`` under random traffic, at full and extreme
occupancy; :func:`buffered_fifo` picks it by the bits it stores and ``fifo_block_ram_bits``; its
storage carries the attributes, its read port gets an undefined collision result, and yosys maps
it to block RAM (ECP5 DP16KD, iCE40 EBR) where the plain FIFO becomes distributed RAM; the
fetcher's FIFO never does."""

from __future__ import annotations

import os
import random
import re

import pytest
from amaranth import Cat, ClockDomain, Module, Signal
from amaranth.back import rtlil
from amaranth.lib import fifo, wiring
from amaranth.lib.wiring import In, Out
from systolic.hw.config import AcceleratorConfig
from systolic.hw.dma import GatherReader, read_run_fifo_depth
from systolic.hw.dsp import reset_synchronizer, reset_synchronizer_copies
from systolic.hw.fifo import (
    FETCH_AHEAD_BUFFER,
    RAM_STYLE,
    BlockRamAsyncFIFO,
    BlockRamFIFO,
    FetchAheadAsyncFIFO,
    buffered_fifo,
    fifo_storage_bits,
    wants_block_ram,
)
from systolic.hw.rtlil import UNDEFINED_COLLISION, undefined_read_collisions
from systolic.sim.tools import to_verilog, yosys_synth

from tests.boards.clocked_testbench import random_top, run_clocked_testbench

from .ecp5_stand import Ecp5Stand, async_set_flip_flops
from .test_cdc import _simulate
from .test_scratchpad import collect, drive, simulate

_STYLE = f'attribute \\{RAM_STYLE[0]} "{RAM_STYLE[1]}"'
SEED = int(os.environ.get("SYSTOLIC_TEST_SEED", "1"))


def _traffic(kind: type, depth: int, items: list[int], *, gap: float, stall: float, seed: int
             ) -> tuple[list[int], list[tuple[int, int]]]:
    dut = kind(width=16, depth=depth)
    result: dict[str, object] = {}

    async def producer(ctx):
        result["in"] = await drive(ctx, dut.w_stream, items, rng=random.Random(seed), gap=gap)

    async def consumer(ctx):
        result["out"] = await collect(ctx, dut.r_stream, len(items), rng=random.Random(seed + 1),
                                      stall=stall)

    simulate(dut, producer, consumer)
    return result["in"], result["out"]


@pytest.mark.parametrize("depth", [2, 3, 8, 33])
def test_block_ram_fifo_moves_the_same_items_in_the_same_cycles(depth: int) -> None:
    rng = random.Random(SEED + depth)
    items = [rng.choice([0, 0xFFFF, 0x8000, 1, rng.randrange(1 << 16)]) for _ in range(300)]
    # (gap, stall): empty most of the time, full most of the time, and mixed
    for gap, stall in ((0.0, 0.0), (0.7, 0.0), (0.0, 0.9), (0.4, 0.5)):
        plain = _traffic(fifo.SyncFIFOBuffered, depth, items, gap=gap, stall=stall, seed=SEED)
        block = _traffic(BlockRamFIFO, depth, items, gap=gap, stall=stall, seed=SEED)
        assert [value for _, value in block[1]] == items, (gap, stall)
        assert block == plain, (gap, stall)


def test_buffered_fifo_picks_block_ram_by_stored_bits() -> None:
    assert not wants_block_ram(AcceleratorConfig(), 1 << 20)                  # 0: yosys chooses
    assert [wants_block_ram(AcceleratorConfig(fifo_block_ram_bits=512), b) for b in (511, 512)] == \
        [False, True]
    assert [fifo_storage_bits(48, d) for d in (0, 1, 2, 64)] == [0, 0, 48, 48 * 63]
    assert type(buffered_fifo(AcceleratorConfig(), width=64, depth=4096)) is fifo.SyncFIFOBuffered
    config = AcceleratorConfig(fifo_block_ram_bits=512)
    assert type(buffered_fifo(config, width=8, depth=64)) is fifo.SyncFIFOBuffered      # 504 bits
    chosen = buffered_fifo(config, width=8, depth=65)                                    # 512 bits
    assert type(chosen) is BlockRamFIFO and (chosen.width, chosen.depth) == (8, 65)
    assert type(buffered_fifo(config.replace(fifo_block_ram_bits=1), width=1, depth=2)) is BlockRamFIFO
    # a FIFO of one entry keeps it in its output register: nothing to put in block RAM
    assert type(buffered_fifo(config.replace(fifo_block_ram_bits=1), width=64, depth=1)) is \
        fifo.SyncFIFOBuffered


def _memories(text: str) -> list[tuple[list[str], str]]:
    """(attribute lines, memory line) of every memory in an RTLIL text."""
    found, attributes = [], []
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["attribute"]:
            if words[1:2] != ["\\src"]:
                attributes.append(line.strip())
        elif words[:1] == ["memory"]:
            found.append((attributes, line.strip()))
            attributes = []
        elif words:
            attributes = []
    return found


def _rtlil(dut: fifo.SyncFIFOBuffered) -> str:
    return rtlil.convert(dut, ports=[dut.w_data, dut.w_en, dut.w_rdy, dut.r_data, dut.r_en, dut.r_rdy],
                         name="top")


def test_block_ram_fifo_storage_carries_the_attributes() -> None:
    (attributes, memory), = _memories(_rtlil(BlockRamFIFO(width=48, depth=64)))
    assert memory.endswith("memory width 48 size 63 \\storage")
    assert _STYLE in attributes
    assert f"attribute \\{UNDEFINED_COLLISION} 1" in attributes
    assert undefined_read_collisions(_rtlil(BlockRamFIFO(width=48, depth=64)))[1] == 1
    (attributes, _), = _memories(_rtlil(fifo.SyncFIFOBuffered(width=48, depth=64)))
    assert attributes == []
    # a FIFO of one entry is a register: nothing to mark
    assert _memories(_rtlil(BlockRamFIFO(width=48, depth=1))) == []


def test_the_config_reaches_the_dma_engines_fifos() -> None:
    config = AcceleratorConfig(rows=4, cols=4, dma_data_bits=32)
    depth = read_run_fifo_depth(config)

    def marked(c: AcceleratorConfig) -> list[str]:
        text = rtlil.convert(GatherReader(c))
        return [memory for attributes, memory in _memories(text) if _STYLE in attributes]

    runs, = [m for _, m in _memories(rtlil.convert(GatherReader(config))) if f"size {depth - 1} " in m]
    run_bits = int(runs.split()[2]) * (depth - 1)
    assert marked(config) == []
    # the run FIFO only, then the range FIFO (8 entries) too
    assert [m.split()[-3:] for m in marked(config.replace(fifo_block_ram_bits=run_bits))] == \
        [["size", str(depth - 1), "\\storage"]]
    assert marked(config.replace(fifo_block_ram_bits=run_bits + 1)) == []
    assert len(marked(config.replace(fifo_block_ram_bits=1))) == 2


def test_the_fetchers_fifo_never_goes_to_block_ram() -> None:
    # its read data feed the instruction decoder: a block RAM's late output would make the path
    from systolic.hw.controller import Fetcher

    text = rtlil.convert(Fetcher(AcceleratorConfig(fifo_block_ram_bits=1)))
    assert _memories(text) and not any(_STYLE in attributes for attributes, _ in _memories(text))


def _synth(dut: fifo.SyncFIFOBuffered, family: str) -> dict:
    return yosys_synth(undefined_read_collisions(_rtlil(dut))[0], "top", family, rtlil=True)


@pytest.mark.parametrize(("width", "depth"), [(48, 64), (36, 32), (8, 8)])
def test_yosys_maps_the_block_ram_fifo_to_block_ram_on_ecp5(width: int, depth: int) -> None:
    marked = _synth(BlockRamFIFO(width=width, depth=depth), "ecp5")
    plain = _synth(fifo.SyncFIFOBuffered(width=width, depth=depth), "ecp5")
    assert marked["cells"].get("DP16KD", 0) >= 1 and marked["lutrams"] == 0
    assert plain["cells"].get("DP16KD", 0) == 0 and plain["lutrams"] > 0


def test_the_block_ram_fifo_needs_no_collision_logic_on_ice40() -> None:
    # iCE40 has no distributed RAM: both become EBR, the marked one without the logic that
    # gives a same-cycle read of the row being written its defined result
    marked = _synth(BlockRamFIFO(width=48, depth=64), "ice40")
    plain = _synth(fifo.SyncFIFOBuffered(width=48, depth=64), "ice40")
    assert marked["cells"].get("SB_RAM40_4K", 0) >= 1
    assert marked["luts"] < plain["luts"] and marked["ffs"] < plain["ffs"]


def _async_rtlil(dut: fifo.AsyncFIFO) -> str:
    return rtlil.convert(dut, ports=[dut.w_data, dut.w_en, dut.w_rdy, dut.r_data, dut.r_en, dut.r_rdy],
                         name="top")


def test_block_ram_async_fifo_is_block_ram_on_ecp5() -> None:
    """The asynchronous FIFO of the clock-domain crossings: its storage (every entry) carries
    ram_style = block and becomes a DP16KD with a clock per port, where the plain one is
    distributed RAM."""
    def make(kind: type) -> fifo.AsyncFIFO:
        return kind(width=64, depth=8, w_domain="write", r_domain="read")

    (attributes, memory), = _memories(_async_rtlil(make(BlockRamAsyncFIFO)))
    assert memory.endswith("memory width 64 size 8 \\storage") and _STYLE in attributes
    (attributes, _), = _memories(_async_rtlil(make(fifo.AsyncFIFO)))
    assert _STYLE not in attributes
    marked = yosys_synth(_async_rtlil(make(BlockRamAsyncFIFO)), "top", "ecp5", rtlil=True)
    plain = yosys_synth(_async_rtlil(make(fifo.AsyncFIFO)), "top", "ecp5", rtlil=True)
    assert marked["cells"].get("DP16KD", 0) >= 1 and marked["lutrams"] == 0
    assert plain["cells"].get("DP16KD", 0) == 0 and plain["lutrams"] > 0


@pytest.mark.parametrize("depth", [2, 4, 16])
@pytest.mark.parametrize("periods", [(10, 7), (7, 10), (10, 23), (10, 10)])
def test_fetch_ahead_async_fifo_moves_every_item_in_order(depth: int, periods: tuple[int, int]) -> None:
    """Random writes and reads on unrelated clocks, extreme values included: every item comes
    out once, in order; the writer never has more than depth + FETCH_AHEAD_BUFFER items (storage
    and buffer) in the FIFO that the reader has not taken (as far as it can know: the reader's
    takes are counted on its side), and a reader that never stalls finds an item readable within a few
    cycles of its write."""
    dut = FetchAheadAsyncFIFO(width=16, depth=depth, w_domain="sync", r_domain="fast")
    rng = random.Random(SEED * 100 + depth + periods[0])
    items = [0, 0xFFFF, 0x8000] + [rng.randrange(1 << 16) for _ in range(200)] + [0xFFFF, 0]
    received: list[int] = []
    written = [0]

    async def writer(ctx):
        ctx.set(dut.w_data, items[0])
        for item in items:
            while rng.random() < 0.3:
                ctx.set(dut.w_en, 0)
                await ctx.tick("sync")
            ctx.set(dut.w_en, 1)
            ctx.set(dut.w_data, item)
            for _ in range(1000):
                _, _, ready = await ctx.tick("sync").sample(dut.w_rdy)
                if ready:
                    break
            else:
                raise AssertionError("the FIFO took no item for 1000 cycles")
            written[0] += 1
            assert written[0] - len(received) <= depth + FETCH_AHEAD_BUFFER + 1
        ctx.set(dut.w_en, 0)

    async def reader(ctx):
        while len(received) < len(items):
            ctx.set(dut.r_en, int(rng.random() < 0.7))
            _, _, ready, enable, data = await ctx.tick("fast").sample(dut.r_rdy, dut.r_en, dut.r_data)
            if ready and enable:
                received.append(data)

    _simulate(dut, periods, (writer, True), (reader, False))
    assert received == items


def test_fetch_ahead_async_fifo_holds_depth_plus_its_buffer_and_a_write_reset_empties_it() -> None:
    """With the reader stalled the writer puts in depth items into the storage and
    FETCH_AHEAD_BUFFER into the buffer, no more; the reader then sees them in order. A
    write-domain reset empties the FIFO (buffer too) and raises r_rst for a read cycle or more;
    items written afterwards come out alone."""
    depth = 4
    dut = FetchAheadAsyncFIFO(width=8, depth=depth, w_domain="sync", r_domain="fast")
    write = ClockDomain("sync")
    seen: dict[str, object] = {}

    async def bench(ctx):
        ctx.set(dut.w_en, 1)
        taken = 0
        for _ in range(40):
            ctx.set(dut.w_data, taken + 1)
            _, _, ready = await ctx.tick("sync").sample(dut.w_rdy)
            taken += ready
        ctx.set(dut.w_en, 0)
        seen["held"] = taken
        # the reader takes two; then the write side is reset with the others inside
        ctx.set(dut.r_en, 1)
        out = []
        while len(out) < 2:
            _, _, ready, data = await ctx.tick("fast").sample(dut.r_rdy, dut.r_data)
            if ready:
                out.append(data)
        ctx.set(dut.r_en, 0)
        seen["first"] = out
        ctx.set(write.rst, 1)
        await ctx.delay(25e-9)          # two and a half write cycles
        ctx.set(write.rst, 0)
        rst = False
        for _ in range(10):
            _, _, r_rst = await ctx.tick("fast").sample(dut.r_rst)
            rst |= bool(r_rst)
        seen["r_rst"] = rst
        seen["after_reset"] = ctx.get(dut.r_rdy)
        ctx.set(dut.w_en, 1)
        ctx.set(dut.w_data, 77)
        await ctx.tick("sync")
        ctx.set(dut.w_en, 0)
        ctx.set(dut.r_en, 1)
        late = []
        for _ in range(30):
            _, _, ready, data = await ctx.tick("fast").sample(dut.r_rdy, dut.r_data)
            if ready:
                late.append(data)
        seen["late"] = late

    _simulate(dut, (10, 7), (bench, False), sync=write)
    assert seen["held"] == depth + FETCH_AHEAD_BUFFER
    assert seen["first"] == [1, 2]
    assert seen["r_rst"] and not seen["after_reset"]
    assert seen["late"] == [77]


@pytest.mark.parametrize("depth", [2, 4, 16])
def test_fetch_ahead_async_fifo_gives_an_item_every_read_cycle(depth: int) -> None:
    """Filled while the reader stalls, the FIFO gives all its items (depth + FETCH_AHEAD_BUFFER)
    on consecutive read cycles to a reader that takes one in each: the buffer keeps up with the
    two cycles a fetched entry takes to reach it."""
    dut = FetchAheadAsyncFIFO(width=8, depth=depth, w_domain="sync", r_domain="fast")
    seen: dict[str, list[int]] = {"items": [], "cycles": []}

    async def bench(ctx):
        ctx.set(dut.w_en, 1)
        accepted = 0
        for _ in range(3 * (depth + FETCH_AHEAD_BUFFER)):
            ctx.set(dut.w_data, accepted + 1)
            _, _, ready = await ctx.tick("sync").sample(dut.w_rdy)
            accepted += ready
        ctx.set(dut.w_en, 0)
        for _ in range(10):
            await ctx.tick("sync")
        ctx.set(dut.r_en, 1)
        for cycle in range(3 * (depth + FETCH_AHEAD_BUFFER)):
            _, _, ready, data = await ctx.tick("fast").sample(dut.r_rdy, dut.r_data)
            if ready:
                seen["items"].append(data)
                seen["cycles"].append(cycle)

    _simulate(dut, (10, 7), (bench, False))
    held = depth + FETCH_AHEAD_BUFFER
    assert seen["items"] == list(range(1, held + 1))
    assert seen["cycles"] == list(range(held))


def test_fetch_ahead_async_fifo_reads_its_storage_at_a_register() -> None:
    """The storage's read address is the fetch pointer's flip-flop (no adder or handshake
    before it), where AsyncFIFO's is an adder's output (its pointer plus this cycle's read);
    block_ram marks the storage."""
    def address_driver(text: str) -> str:
        """The type of the cell whose output is the read port's address wire."""
        memrd = text[text.index("cell $memrd_v2"):]
        wire = next(line.split()[2] for line in memrd.splitlines()
                    if line.strip().startswith("connect \\ADDR"))
        cells = text.split("  cell ")[1:]
        return next(cell.split()[0] for cell in cells
                    if any(line.split()[:3] in (["connect", "\\Q", wire], ["connect", "\\Y", wire])
                           for line in cell.splitlines()))

    def convert(dut) -> str:
        return rtlil.convert(dut, ports=[dut.w_data, dut.w_en, dut.w_rdy, dut.r_data, dut.r_en, dut.r_rdy],
                             name="top")

    ahead = convert(FetchAheadAsyncFIFO(width=8, depth=8, w_domain="write", r_domain="read",
                                        block_ram=True))
    assert address_driver(ahead) == "$dff"
    assert address_driver(convert(fifo.AsyncFIFO(width=8, depth=8, w_domain="write", r_domain="read"))) == \
        "$add"
    (attributes, _), = _memories(ahead)
    assert _STYLE in attributes
    (attributes, _), = _memories(convert(FetchAheadAsyncFIFO(width=8, depth=8, w_domain="write",
                                                             r_domain="read")))
    assert _STYLE not in attributes
    with pytest.raises(ValueError, match=r"^depth must be a power of two of at least 2, not 6$"):
        FetchAheadAsyncFIFO(width=8, depth=6)


@pytest.mark.parametrize("width", [8, 64, 200])
def test_fetch_ahead_buffer_loads_and_reads_under_register_copies(width) -> None:
    """On ECP5 the fetch-ahead buffer's entries load under TRELLIS_FF copies of registers made
    from the fetch (one per COPY_GROUP_BITS bits of each entry) and the head is chosen by one-hot
    copies of the read pointer, so that neither the consumer's take nor a single net reaches all
    their bits; elsewhere plain registers."""
    from amaranth.back import verilog
    from systolic.hw.dsp import COPY_GROUP_BITS

    def convert(platform) -> str:
        dut = FetchAheadAsyncFIFO(width=width, depth=4, w_domain="write", r_domain="read", block_ram=True)
        return verilog.convert(dut, ports=[dut.w_data, dut.w_en, dut.w_rdy, dut.r_data, dut.r_en, dut.r_rdy],
                               name="top", platform=platform, emit_src=False)

    groups = -(-width // COPY_GROUP_BITS)
    text = convert(Ecp5Stand())
    names = [f"{kind}{k}_" for kind in ("load", "head") for k in range(FETCH_AHEAD_BUFFER)]
    # and the reset synchronizer's three: its first stage, its second and the second's copy for r_rdy
    assert text.count("TRELLIS_FF ") == len(names) * groups + 3
    assert "rst_cdc_copy1_ff" in text
    for name in names:
        assert sum(f"{name}{n}_ff" in text for n in range(groups)) == groups
    assert "TRELLIS_FF " not in convert(None)


class _Synchronizer(wiring.Component):
    """``reset_synchronizer_copies`` (two copies) from the ``value`` input, its resets out."""

    def __init__(self, ecp5: bool) -> None:
        self._ecp5 = ecp5
        super().__init__({"value": In(1), "reset": Out(1), "copy": Out(1)})

    def elaborate(self, platform):
        m = Module()
        reset, copy = reset_synchronizer_copies(m, "rst_cdc", self.value, domain="sync",
                                                platform=Ecp5Stand() if self._ecp5 else None, copies=2)
        m.d.comb += [self.reset.eq(reset), self.copy.eq(copy)]
        return m


@pytest.mark.slow
def test_ecp5_reset_synchronizer_behaves_as_amaranths_on_verilator() -> None:
    """The ECP5 reset synchronizer (two TRELLIS_FF with an asynchronous set, in yosys's own
    simulation model), its second stage with a copy, beside Amaranth's AsyncFFSynchronizer, its
    input changed between clock edges at random (pulses of one cycle and longer): at every edge
    the outputs and the copies are equal, and high whenever the input has been high since the
    last falling edge (set at once, not at the next clock edge)."""
    from .test_logic_multiplier_ecp5 import ecp5_cell_models

    body = """  logic v = 1;
  logic re, rg;
  always @(negedge clk) if (x2[1:0] == 0) v <= ~v;
  logic ce, cg;
  se ue(.clk(clk), .rst(rst), .value(v), .reset(re), .copy(ce));
  sg ug(.clk(clk), .rst(rst), .value(v), .reset(rg), .copy(cg));
  logic [31:0] checked = 0, bad = 0, late = 0, rises = 0, releases = 0;
  logic was = 1;
  always @(posedge clk) if (!rst) begin
    checked <= checked + 1;
    was <= re;
    rises <= rises + 32'(re && !was);
    releases <= releases + 32'(!re && was);
    if (re != rg || ce != re || cg != rg) begin
      bad <= bad + 1;
      if (bad < 3) $display("cycle %0d: ecp5 %0d (copy %0d), amaranth %0d (copy %0d)", cycle, re, ce, rg, cg);
    end
    if (v && !re) late <= late + 1;
  end
  final $display("checked %0d edges: %0d differ, %0d late, %0d rises, %0d releases", checked, bad, late,
                 rises, releases);
"""
    sources = [ecp5_cell_models("TRELLIS_FF"), to_verilog(_Synchronizer(True), "se"),
               to_verilog(_Synchronizer(False), "sg"), random_top("reset_sync_check", 3, 20000, body)]
    output = run_clocked_testbench("reset_sync_check", sources)
    checked, bad, late, rises, releases = map(int, re.search(
        r"checked (\d+) edges: (\d+) differ, (\d+) late, (\d+) rises, (\d+) releases", output).groups())
    assert (bad, late) == (0, 0), output
    assert checked >= 20000 and rises >= 500 and releases >= 500, output


class _TwoCrossings(wiring.Component):
    """Two fetch-ahead FIFOs between the same two domains (one write reset)."""

    def __init__(self) -> None:
        super().__init__({"data": In(16), "out": Out(16)})

    def elaborate(self, platform):
        m = Module()
        a = m.submodules.a = FetchAheadAsyncFIFO(width=8, depth=4, w_domain="write", r_domain="read")
        b = m.submodules.b = FetchAheadAsyncFIFO(width=8, depth=4, w_domain="write", r_domain="read")
        m.d.comb += [a.w_data.eq(self.data[:8]), b.w_data.eq(self.data[8:]), a.w_en.eq(1), b.w_en.eq(1),
                     a.r_en.eq(1), b.r_en.eq(1), self.out.eq(Cat(a.r_data, b.r_data))]
        return m


def test_ecp5_fifos_keep_a_reset_synchronizer_each(tmp_path) -> None:
    """Through synth_ecp5, two crossings between the same domains keep two reset synchronizers
    (six flip-flops with an asynchronous set: each second stage with its copy for ``r_rdy``) on
    ECP5, so that each can sit by its FIFO's reset logic; elaborated generically yosys merges
    them into one (two)."""
    def async_flip_flops(platform) -> int:
        return async_set_flip_flops(_TwoCrossings(), platform, tmp_path / f"{platform is None}.json")

    assert async_flip_flops(Ecp5Stand()) == 6        # each: a first stage and two of the second
    assert async_flip_flops(None) == 2
    with pytest.raises(ValueError, match=r"^value must be one bit wide, not 2$"):
        reset_synchronizer(Module(), "x", Signal(2), domain="sync", platform=None)
    for wrong in (0, True, 1.0):
        with pytest.raises(ValueError, match=rf"^copies must be an integer of at least 1, not {wrong!r}$"):
            reset_synchronizer_copies(Module(), "x", Signal(), domain="sync", platform=None, copies=wrong)
    from systolic.hw.dsp import _trellis_ff
    with pytest.raises(ValueError, match=r"^an asynchronous set needs init=1, not 0$"):
        _trellis_ff(Module(), "x", Signal(), Signal(), enable=None, init=0, async_set=Signal())
