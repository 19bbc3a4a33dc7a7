"""Throughput of the DMA engines (hw/dma.py): GatherReader on LOAD patterns, ScatterWriter on STORE
outputs.

Simulates each engine against the AXI memory model of the tests (no stalls; a fixed, pipelined
read latency) on the default configuration and reports, per case, the cycles from offering the
first command to ``busy`` falling after the last, rows (pixels) per cycle overall and in the
steady state (first row out to last row out; for the writer, first to last pixel accepted), the
bursts and the longest burst. Commands are offered back to back: an engine that accepts the next
command while the previous one drains overlaps them. ``golden`` is the golden model's LOAD/STORE
estimate for the same commands (docs/isa.md, "Cycle estimate"; LOADs one after another).

``--baseline REV`` measures ``hw/dma.py`` of git revision REV the same way (before/after), with
that revision's default ``dma_outstanding``. ``--gemm`` also runs GEMMs on the whole accelerator's
RTL (Verilator, sim/rtl.py, memory model "fast": fixed latency ``dram_latency``; the first run
builds it, minutes) and reports the MAC utilization against the golden estimate; with
``--baseline``, also on an accelerator built with that revision's ``hw/dma.py`` and ``hw/units.py``.

Writes ``bench/results/dma_throughput.json`` and prints tables.
Run from the repository root: ``python bench/dma_throughput.py [--baseline HEAD] [--gemm]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from amaranth.sim import Simulator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))      # the AXI memory model lives with the tests

from systolic.hw import dma as current_dma  # noqa: E402
from systolic.hw.config import AcceleratorConfig  # noqa: E402
from systolic.hw.isa import Instruction  # noqa: E402
from systolic.sim.golden import run_golden  # noqa: E402

from tests.hw.axi_model import AXIMemory  # noqa: E402

__all__ = ["GATHER_CASES", "STORE_CASES", "measure_gather", "measure_store", "measure_gemm", "main"]

CONFIG = AcceleratorConfig()        # 8 int8 elements per spad row (8 bytes), 64-bit bus
LATENCY = CONFIG.dram_latency
X = 0x1000                          # DRAM address of the first operand


def _load(**fields: int) -> dict[str, int]:
    """LOAD fields, the ones not given zero."""
    names = [name for name, _ in current_dma.LoadCommandLayout() if name != "elem_bytes"]
    out = dict.fromkeys(names, 0)
    out.update(dst="spad", widen=0)
    out.update(fields)
    return out


def _tile(rows: int, pitch: int, addr: int = X, elems: int = 8, elem_bytes: int = 1,
          **extra: int) -> dict[str, int]:
    """A plain tile: ``rows`` rows of ``elems`` elements of ``elem_bytes``, ``pitch`` bytes apart."""
    return _load(dram_addr=addr, pitch_y=pitch, pitch_c=elem_bytes, rows_outer=1, rows_inner=rows,
                 inner_dy=1, segs=1, seg_len=elems, elem_dc=1, **extra)


def _im2col(cin: int, taps: int, out_hw: int) -> dict[str, int]:
    """Tap row (kh=0) of a 3x3 stride-1 pad-1 convolution over an out_hw x out_hw NHWC int8
    image: one row per output pixel; ``taps`` kernel columns of ``cin`` channels per row."""
    return _load(dram_addr=X, pitch_y=out_hw * cin, pitch_x=cin, pitch_c=1, bounded=1,
                 height=out_hw, width=out_hw, y0=-1, x0=-1, rows_outer=out_hw, outer_dy=1,
                 rows_inner=out_hw, inner_dx=1, segs=taps, seg_len=cin, seg_dx=1, elem_dc=1)


#: name -> (LOAD field dicts, offered back to back; memory latency, cycles)
GATHER_CASES: dict[str, tuple[list[dict[str, int]], int]] = {
    "tile 64x8B contiguous, latency 0": ([_tile(64, 8)], 0),
    "tile 64x8B contiguous": ([_tile(64, 8)], LATENCY),
    "tile 64x8B contiguous, unaligned": ([_tile(64, 8, X + 3)], LATENCY),
    "tile 64x8B strided, latency 0": ([_tile(64, 24)], 0),
    "tile 64x8B strided": ([_tile(64, 24)], LATENCY),
    "tile 64x8B strided, unaligned": ([_tile(64, 24, X + 3)], LATENCY),
    "GEMM A tile 256x8B, pitch 256": ([_tile(256, 256)], LATENCY),
    "8 LOADs of 8x8B strided": ([_tile(8, 256, X + 8 * k) for k in range(8)], LATENCY),
    "GEMM step: B 8x8B + A 256x8B": ([_tile(8, 256, X), _tile(256, 256, X + 0x10000)], LATENCY),
    "acc tile 16x32B contiguous": ([_tile(16, 32, elem_bytes=4, dst="acc")], LATENCY),
    "im2col 3x3 Cin=8, 8x8 px": ([_im2col(8, 1, 8)], LATENCY),
    "im2col 3x3 Cin=2, 3 taps/row": ([_im2col(2, 3, 8)], LATENCY),
    "NCHW transpose, 8 px/row": ([_load(dram_addr=X, pitch_y=8, pitch_x=1, pitch_c=64, bounded=1,
                                        height=8, width=8, y0=0, x0=-1, rows_outer=1,
                                        rows_inner=8, inner_dc=1, segs=1, seg_len=8, elem_dx=1)],
                                 LATENCY),
    "column gather, 8 rows apart": ([_load(dram_addr=X, pitch_y=64, pitch_c=1, rows_outer=1,
                                           rows_inner=8, inner_dc=1, segs=1, seg_len=8,
                                           elem_dy=1)], LATENCY),
}

#: name -> (out_h, out_w, layout, address, raw accumulator output)
STORE_CASES: dict[str, tuple[int, int, str, int, bool]] = {
    "8x8 px NHWC int8": (8, 8, "nhwc", X, False),
    "8x8 px NHWC int8, unaligned": (8, 8, "nhwc", X + 3, False),
    "8x8 px NCHW int8": (8, 8, "nchw", X, False),
    "8x8 px NHWC raw int32": (8, 8, "nhwc", X, True),
}


def _elem_bytes(config: AcceleratorConfig, f: dict[str, int]) -> int:
    return {"spad": config.spad_elem_bytes, "acc": config.acc_bytes,
            "table": config.requant_entry_bytes}[f["dst"]]


def _golden_cycles(config: AcceleratorConfig, instructions: list[Instruction]) -> int:
    """The golden model's estimate for ``instructions``: their ends, minus the fetch and dispatch
    of the first (the engines get their commands directly)."""
    dram = np.zeros(X + 0x20000, np.uint8)
    result = run_golden(config, instructions + [Instruction("FINISH")], dram)
    first = result.timings[0]
    return max(t.end for t in result.timings[:-1]) - first.start


def measure_gather(dma: ModuleType, config: AcceleratorConfig, loads: list[dict[str, int]], *,
                   latency: int) -> dict[str, Any]:
    """Offer ``loads`` to ``dma.GatherReader`` back to back; cycles in cycles, rows per cycle."""
    dut = dma.GatherReader(config)
    top = max(f["dram_addr"] + 0x11000 for f in loads)
    memory = AXIMemory(bytearray(top), config.dma_bytes, latency=(latency, latency))
    names = [name for name, _ in dma.LoadCommandLayout()]
    commands = [{name: _elem_bytes(config, f) if name == "elem_bytes" else f[name] for name in names}
                for f in loads]
    out: dict[str, Any] = {}

    async def driver(ctx):
        ctx.set(dut.rows.ready, 1)
        cycle, stamps, pending = 0, [], list(commands)
        while True:
            if pending:
                ctx.set(dut.cmd.valid, 1)
                ctx.set(dut.cmd.payload, pending[0])
            _, _, valid, busy, taken = await ctx.tick().sample(dut.rows.valid, dut.busy, dut.cmd.ready)
            cycle += 1
            if valid:
                stamps.append(cycle)
            if not busy and not pending:
                break
            if pending and taken:      # busy rises after this edge
                pending.pop(0)
                ctx.set(dut.cmd.valid, 0)
        out.update(cycles=cycle, first_row=stamps[0], rows=len(stamps),
                   steady_rows_per_cycle=(len(stamps) - 1) / (stamps[-1] - stamps[0])
                   if len(stamps) > 1 else 1.0,
                   rows_per_cycle=len(stamps) / cycle, bursts=memory.read_bursts,
                   beats=memory.read_beats, longest_burst=memory.longest_burst)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    memory.add_to(sim, dut, read=True)
    sim.add_testbench(driver)
    sim.run()
    return out


def _store_fields(config: AcceleratorConfig, out_h: int, out_w: int, layout: str, addr: int,
                  raw: bool) -> dict[str, int]:
    n = config.cols
    eb = config.acc_bytes if raw else config.input_bytes
    if layout == "nhwc":
        pitches = dict(pitch_c=eb, pitch_x=n * eb, pitch_y=out_w * n * eb)
    else:
        pitches = dict(pitch_x=eb, pitch_y=out_w * eb, pitch_c=out_h * out_w * eb)
    return dict(n=n, out_h=out_h, out_w=out_w, dram_addr=addr, out_type=int(raw), **pitches)


def measure_store(dma: ModuleType, config: AcceleratorConfig, out_h: int, out_w: int, layout: str,
                  addr: int, raw: bool) -> dict[str, Any]:
    """One STORE of ``out_h`` x ``out_w`` pixels of ``cols`` elements, pixels offered every cycle;
    cycles in cycles, pixels per cycle."""
    dut = dma.ScatterWriter(config)
    f = _store_fields(config, out_h, out_w, layout, addr, raw)
    memory = AXIMemory(bytearray(addr + out_h * out_w * config.cols * 4 + 4096), config.dma_bytes)
    command = {name: (config.acc_bytes if raw else config.input_bytes) if name == "elem_bytes"
               else f[name] for name, _ in dma.StoreCommandLayout()}
    out: dict[str, Any] = {}

    async def driver(ctx):
        ctx.set(dut.cmd.valid, 1)
        ctx.set(dut.cmd.payload, command)
        await ctx.tick().until(dut.cmd.ready)
        ctx.set(dut.cmd.valid, 0)
        ctx.set(dut.pixels.valid, 1)
        ctx.set(dut.pixels.payload, [0x5A] * dut.row_bytes)
        cycle, stamps = 1, []
        while True:
            _, _, ready, busy = await ctx.tick().sample(dut.pixels.ready, dut.busy)
            cycle += 1
            if ready:
                stamps.append(cycle)
                if len(stamps) == out_h * out_w:
                    ctx.set(dut.pixels.valid, 0)
            if not busy:
                break
        out.update(cycles=cycle, pixels=len(stamps),
                   steady_pixels_per_cycle=(len(stamps) - 1) / (stamps[-1] - stamps[0])
                   if len(stamps) > 1 else 1.0,
                   pixels_per_cycle=len(stamps) / cycle, bursts=memory.write_burst_count,
                   beats=memory.write_beats, longest_burst=memory.longest_burst)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    memory.add_to(sim, dut, read=False, write=True)
    sim.add_testbench(driver)
    sim.run()
    return out


def _store_golden(config: AcceleratorConfig, f: dict[str, int]) -> int:
    """Golden estimate of the STORE alone (its SFU pipeline latency included)."""
    raw = f["out_type"] == 1
    program = [Instruction("STORE", out_type="raw" if raw else "int", in_h=f["out_h"],
                           in_w=f["out_w"], **{k: v for k, v in f.items() if k != "out_type"})]
    return _golden_cycles(config, program)


def load_module(rev: str, source: str, *, replace: tuple[str, str] | None = None) -> ModuleType:
    """``hw/<source>.py`` of git revision ``rev`` as module ``systolic.hw._<source>_baseline``,
    importable next to the current one (``replace``: a text substitution first, e.g. to make it
    import the other baseline modules)."""
    text = subprocess.run(["git", "show", f"{rev}:hw/{source}.py"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout
    if replace is not None:
        text = text.replace(*replace)
    path = Path(tempfile.mkdtemp(prefix=f"{source}-baseline-")) / f"{source}.py"
    path.write_text(text)
    name = f"systolic.hw._{source}_baseline"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def baseline_verilog(rev: str, config: AcceleratorConfig) -> str:
    """Verilog (module ``systolic_top``) of the accelerator with ``hw/dma.py`` and ``hw/units.py``
    of git revision ``rev`` (the rest as it is now)."""
    from systolic.hw import top
    from systolic.sim.tools import to_verilog

    load_module(rev, "dma")
    units = load_module(rev, "units", replace=("from .dma import", "from ._dma_baseline import"))
    saved = top.LoadUnit, top.ComputeUnit, top.StoreUnit
    try:
        top.LoadUnit, top.ComputeUnit, top.StoreUnit = units.LoadUnit, units.ComputeUnit, units.StoreUnit
        return to_verilog(top.Accelerator(config), "systolic_top")
    finally:
        top.LoadUnit, top.ComputeUnit, top.StoreUnit = saved


def baseline_config(rev: str) -> AcceleratorConfig:
    """The default configuration with ``dma_outstanding`` as revision ``rev`` has it."""
    old = load_module(rev, "config").AcceleratorConfig()
    return CONFIG.replace(dma_outstanding=old.dma_outstanding)


def measure_gemm(config: AcceleratorConfig, shapes: list[tuple[int, int, int]], *,
                 verilog: str | None = None) -> list[dict[str, Any]]:
    """GEMMs (sim/programs.py gemm_case) on the accelerator's RTL (or on ``verilog``, a
    ``systolic_top`` for ``config``) with the fixed-latency memory model: cycles, MAC utilization
    (MACs / (cycles x rows x cols)), the golden estimate and the performance counters."""
    from systolic.sim.programs import gemm_case
    from systolic.sim.rtl import RTLRunner

    runner = RTLRunner(config, memory="fast", verilog=verilog)
    out = []
    for m, k, n in shapes:
        case = gemm_case(config, m, k, n, seed=1)
        golden = run_golden(config, case.program, case.dram)
        result = runner.run(case.program, case.dram, prog_addr=case.program_addr,
                            max_cycles=50_000_000)
        case.check(result.dram)
        peak = config.rows * config.cols
        out.append({"gemm": f"{m}x{k}x{n}", "macs": case.macs, "cycles": result.cycles,
                    "utilization": case.macs / (result.cycles * peak),
                    "golden_cycles": golden.cycles,
                    "golden_utilization": case.macs / (golden.cycles * peak),
                    "instructions": len(case.program.instructions),
                    "golden_busy": golden.busy})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", metavar="REV", help="also measure hw/dma.py of git revision REV")
    parser.add_argument("--gemm", action="store_true", help="also run GEMMs on the RTL (Verilator)")
    args = parser.parse_args()
    config = CONFIG
    engines = {"current": (current_dma, config)}
    if args.baseline:
        engines[f"baseline {args.baseline}"] = (load_module(args.baseline, "dma"),
                                                baseline_config(args.baseline))

    gathers = []
    for name, (loads, latency) in GATHER_CASES.items():
        golden = _golden_cycles(config, [Instruction("LOAD", **f) for f in loads]) \
            if latency == config.dram_latency else None
        for engine, (module, engine_config) in engines.items():
            figures = measure_gather(module, engine_config, loads, latency=latency)
            rows = figures["rows"]
            gathers.append({"case": name, "engine": engine, "loads": len(loads), "latency": latency,
                            "dma_outstanding": engine_config.dma_outstanding,
                            "golden_cycles": golden, **figures,
                            "overhead_per_load": (figures["cycles"] - rows) / len(loads)})
    stores = []
    for name, (out_h, out_w, layout, addr, raw) in STORE_CASES.items():
        golden = _store_golden(config, _store_fields(config, out_h, out_w, layout, addr, raw))
        for engine, (module, engine_config) in engines.items():
            figures = measure_store(module, engine_config, out_h, out_w, layout, addr, raw)
            stores.append({"case": name, "engine": engine, "golden_cycles": golden, **figures})
    report: dict[str, Any] = {"config": config.to_dict(), "bus_bytes": config.dma_bytes,
                              "gather": gathers, "store": stores}
    if args.gemm:
        shapes = [(64, 64, 64), (256, 256, 256)]
        report["gemm"] = [{"engine": "current", **r} for r in measure_gemm(config, shapes)]
        if args.baseline:
            old = baseline_config(args.baseline)
            report["gemm"] += [{"engine": f"baseline {args.baseline}", **r} for r in
                               measure_gemm(old, shapes, verilog=baseline_verilog(args.baseline, old))]
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "dma_throughput.json").write_text(json.dumps(report, indent=2) + "\n")

    print(f"GatherReader, default config ({config.dma_data_bits}-bit bus, bursts up to "
          f"{config.dma_max_burst} beats; N: dma_outstanding), no stalls; latency: cycles from AR "
          f"to first beat; golden: the ISA's LOAD estimate")
    header = (f"{'case':<34}{'engine':<18}{'N':>3}{'lat':>4}{'cycles':>8}{'golden':>8}{'1st row':>8}"
              f"{'rows/cyc':>9}{'steady':>8}{'ovh/LOAD':>9}{'bursts':>7}{'longest':>8}")
    print(header)
    print("-" * len(header))
    for r in gathers:
        golden = "" if r["golden_cycles"] is None else r["golden_cycles"]
        print(f"{r['case']:<34}{r['engine']:<18}{r['dma_outstanding']:>3}{r['latency']:>4}"
              f"{r['cycles']:>8}{golden:>8}"
              f"{r['first_row']:>8}{r['rows_per_cycle']:>9.3f}{r['steady_rows_per_cycle']:>8.3f}"
              f"{r['overhead_per_load']:>9.1f}{r['bursts']:>7}{r['longest_burst']:>8}")
    print()
    print(f"ScatterWriter, {config.cols} elements per pixel, pixels offered every cycle, no stalls")
    header = (f"{'case':<34}{'engine':<18}{'cycles':>8}{'golden':>8}{'px/cyc':>8}{'steady':>8}"
              f"{'bursts':>7}{'beats':>7}{'longest':>8}")
    print(header)
    print("-" * len(header))
    for r in stores:
        print(f"{r['case']:<34}{r['engine']:<18}{r['cycles']:>8}{r['golden_cycles']:>8}"
              f"{r['pixels_per_cycle']:>8.3f}{r['steady_pixels_per_cycle']:>8.3f}{r['bursts']:>7}"
              f"{r['beats']:>7}{r['longest_burst']:>8}")
    if args.gemm:
        print()
        print("GEMM on the accelerator RTL (Verilator, fixed DRAM latency), MAC utilization")
        header = f"{'gemm':<14}{'engine':<18}{'cycles':>10}{'util':>8}{'golden':>10}{'util':>8}"
        print(header)
        print("-" * len(header))
        for r in report["gemm"]:
            print(f"{r['gemm']:<14}{r['engine']:<18}{r['cycles']:>10}{r['utilization']:>8.1%}"
                  f"{r['golden_cycles']:>10}{r['golden_utilization']:>8.1%}")


if __name__ == "__main__":
    main()
