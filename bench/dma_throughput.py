"""Throughput of the DMA engines (hw/dma.py): GatherReader on plain tile LOADs, ScatterWriter on
STORE outputs.

Simulates each engine against the AXI memory model of the tests (no stalls; a fixed, pipelined
read latency) and reports, per case, the cycles from accepting the command to ``busy`` falling
and the rows (pixels) per cycle, overall and in the steady state (first row out to last row out;
for the writer, first to last pixel accepted). Writes ``bench/results/dma_throughput.json`` and
prints two tables.

Run from the repository root: ``python bench/dma_throughput.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from amaranth.sim import Simulator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))      # the AXI memory model lives with the tests

from systolic.hw.config import AcceleratorConfig  # noqa: E402
from systolic.hw.dma import (  # noqa: E402
    GatherReader,
    LoadCommandLayout,
    ScatterWriter,
    StoreCommandLayout,
)

from tests.hw.axi_model import AXIMemory  # noqa: E402

__all__ = ["measure", "measure_store", "main"]

ROWS = 64


def measure(config: AcceleratorConfig, *, rows: int, pitch_y: int, dram_addr: int,
            latency: int) -> dict[str, Any]:
    """One plain tile LOAD of ``rows`` rows of ``spad_row_elems`` elements; returns cycle counts
    (cycles) and rows per cycle."""
    dut = GatherReader(config)
    memory = AXIMemory(bytearray(dram_addr + rows * pitch_y + 4096), config.dma_bytes,
                       latency=(latency, latency))
    fields = dict.fromkeys((name for name, _ in LoadCommandLayout()), 0)
    fields.update(elem_bytes=config.spad_elem_bytes, dram_addr=dram_addr, pitch_y=pitch_y,
                  pitch_c=config.spad_elem_bytes, rows_outer=1, rows_inner=rows, inner_dy=1,
                  segs=1, seg_len=config.spad_row_elems, elem_dc=1)
    out: dict[str, Any] = {}

    async def driver(ctx):
        ctx.set(dut.rows.ready, 1)
        ctx.set(dut.cmd.valid, 1)
        ctx.set(dut.cmd.payload, fields)
        await ctx.tick().until(dut.cmd.ready)
        ctx.set(dut.cmd.valid, 0)
        cycle, stamps = 0, []
        while True:
            _, _, valid, busy = await ctx.tick().sample(dut.rows.valid, dut.busy)
            cycle += 1
            if valid:
                stamps.append(cycle)
            if not busy:
                break
        out.update(total_cycles=cycle, first_row=stamps[0], rows_out=len(stamps),
                   steady_rows_per_cycle=(len(stamps) - 1) / (stamps[-1] - stamps[0])
                   if len(stamps) > 1 else 1.0,
                   rows_per_cycle=len(stamps) / cycle, read_bursts=memory.read_bursts,
                   longest_burst=memory.longest_burst)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    memory.add_to(sim, dut, read=True)
    sim.add_testbench(driver)
    sim.run()
    return out


def measure_store(config: AcceleratorConfig, *, out_h: int, out_w: int, layout: str,
                  dram_addr: int) -> dict[str, Any]:
    """One STORE of ``out_h`` x ``out_w`` pixels of ``cols`` int8 elements (NHWC: one run per
    pixel; NCHW: one single-beat burst per element), pixels offered every cycle; returns cycle
    counts (cycles) and pixels per cycle."""
    dut = ScatterWriter(config)
    n, eb = config.cols, config.input_bytes
    if layout == "nhwc":
        pitches = dict(pitch_c=eb, pitch_x=n * eb, pitch_y=out_w * n * eb)
    else:
        pitches = dict(pitch_x=eb, pitch_y=out_w * eb, pitch_c=out_h * out_w * eb)
    memory = AXIMemory(bytearray(dram_addr + out_h * out_w * n * eb + 4096), config.dma_bytes)
    fields = dict(elem_bytes=eb, n=n, out_h=out_h, out_w=out_w, dram_addr=dram_addr, **pitches)
    assert set(fields) == {name for name, _ in StoreCommandLayout()}
    out: dict[str, Any] = {}

    async def driver(ctx):
        ctx.set(dut.cmd.valid, 1)
        ctx.set(dut.cmd.payload, fields)
        await ctx.tick().until(dut.cmd.ready)
        ctx.set(dut.cmd.valid, 0)
        ctx.set(dut.pixels.valid, 1)
        ctx.set(dut.pixels.payload, [0x5A] * dut.row_bytes)
        cycle, stamps = 0, []
        while True:
            _, _, ready, busy = await ctx.tick().sample(dut.pixels.ready, dut.busy)
            cycle += 1
            if ready:
                stamps.append(cycle)
                if len(stamps) == out_h * out_w:
                    ctx.set(dut.pixels.valid, 0)
            if not busy:
                break
        out.update(total_cycles=cycle, pixels=len(stamps),
                   steady_pixels_per_cycle=(len(stamps) - 1) / (stamps[-1] - stamps[0])
                   if len(stamps) > 1 else 1.0,
                   pixels_per_cycle=len(stamps) / cycle, write_beats=memory.write_beats)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    memory.add_to(sim, dut, read=False, write=True)
    sim.add_testbench(driver)
    sim.run()
    return out


def main() -> None:
    config = AcceleratorConfig()        # 8 int8 elements per row (8 bytes), 64-bit bus
    row_bytes = config.spad_row_bytes
    cases = [
        ("contiguous, aligned", row_bytes, 0x1000, 0),
        ("strided, aligned", 3 * row_bytes, 0x1000, 0),
        ("contiguous, unaligned", row_bytes, 0x1003, 0),
        ("contiguous, aligned", row_bytes, 0x1000, 4),
        ("contiguous, aligned", row_bytes, 0x1000, config.dram_latency),
    ]
    results = []
    for name, pitch, addr, latency in cases:
        figures = measure(config, rows=ROWS, pitch_y=pitch, dram_addr=addr, latency=latency)
        results.append({"case": name, "row_bytes": row_bytes, "pitch_y": pitch, "dram_addr": addr,
                        "latency": latency, "dma_outstanding": config.dma_outstanding, "rows": ROWS,
                        **figures})
    # one burst per row: with latency, rows per cycle are bounded by bursts in flight / latency
    deep = config.replace(dma_outstanding=16)
    figures = measure(deep, rows=ROWS, pitch_y=3 * row_bytes, dram_addr=0x1000,
                      latency=config.dram_latency)
    results.append({"case": "strided, aligned", "row_bytes": row_bytes, "pitch_y": 3 * row_bytes,
                    "dram_addr": 0x1000, "latency": config.dram_latency, "dma_outstanding": 16,
                    "rows": ROWS, **figures})
    stores = []
    for layout, addr in (("nhwc", 0x1000), ("nhwc", 0x1003), ("nchw", 0x1000)):
        figures = measure_store(config, out_h=8, out_w=8, layout=layout, dram_addr=addr)
        stores.append({"layout": layout, "pixel_bytes": config.cols * config.input_bytes,
                       "dram_addr": addr, **figures})
    report = {"config": config.to_dict(), "bus_bytes": config.dma_bytes, "results": results,
              "stores": stores}
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "dma_throughput.json").write_text(json.dumps(report, indent=2) + "\n")

    print(f"GatherReader, plain tile of {ROWS} rows x {row_bytes} B, {config.dma_data_bits}-bit bus, "
          f"no stalls (latency: cycles from AR to first beat, pipelined)")
    header = (f"{'case':<24}{'latency':>8}{'in flight':>10}{'cycles':>8}{'1st row':>8}"
              f"{'rows/cyc':>10}{'steady':>8}{'bursts':>8}")
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"{r['case']:<24}{r['latency']:>8}{r['dma_outstanding']:>10}{r['total_cycles']:>8}"
              f"{r['first_row']:>8}"
              f"{r['rows_per_cycle']:>10.3f}{r['steady_rows_per_cycle']:>8.3f}{r['read_bursts']:>8}")

    print()
    print(f"ScatterWriter, 8x8 pixels of {config.cols} int8 elements, pixels offered every cycle, "
          f"no stalls")
    header = f"{'layout':<8}{'address':>9}{'cycles':>8}{'pixels/cyc':>12}{'steady':>8}{'beats':>7}"
    print(header)
    print("-" * len(header))
    for r in stores:
        print(f"{r['layout']:<8}{r['dram_addr']:>#9x}{r['total_cycles']:>8}{r['pixels_per_cycle']:>12.3f}"
              f"{r['steady_pixels_per_cycle']:>8.3f}{r['write_beats']:>7}")


if __name__ == "__main__":
    main()
