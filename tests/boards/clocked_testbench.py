"""Build and run a self-checking Verilog testbench in Verilator: a top module with ``clk`` and
``rst`` inputs that ends the simulation with ``$finish`` (or ``$fatal``) and prints its verdict."""

from __future__ import annotations

import re
import subprocess
from typing import Any

from systolic.sim.tools import (
    VERILATOR_WAIVERS,
    build_cache_dir,
    build_lock,
    design_hash,
    tool_env,
    verilator_bin,
)

#: A SystemVerilog function ``step`` (xorshift64) for testbenches' random traffic.
XORSHIFT64 = """\
  function automatic logic [63:0] step(input logic [63:0] x);
    logic [63:0] y = x ^ (x << 13);
    y = y ^ (y >> 7);
    return y ^ (y << 17);
  endfunction
"""

_MAIN = r"""
#include "V{top}.h"
#include "verilated.h"
int main(int argc, char** argv) {{
    VerilatedContext context;
    context.commandArgs(argc, argv);
    V{top} top{{&context}};
    top.rst = 1;
    top.clk = 0;
    for (long i = 0; !context.gotFinish(); i++) {{
        if (i == 8) top.rst = 0;
        top.clk = !top.clk;
        top.eval();
        if (i > 10000000) return 3;
    }}
    top.final();
    return 0;
}}
"""


def run_clocked_testbench(top: str, sources: list[str], *, defines: tuple[str, ...] = ()) -> str:
    """Build ``sources`` (Verilog texts; ``top`` is the testbench module) with Verilator, cached
    by their hash, run it with reset high for 4 cycles and return its output. Fails the test when
    the build fails, the testbench stops with an error or it runs 5 million cycles."""
    main = _MAIN.format(top=top)
    # -O0: these testbenches run for seconds; their five tests took 109 s instead of 131 s here
    args = [*VERILATOR_WAIVERS, "-Wno-fatal", "--x-assign", "unique", "--x-initial", "unique",
            "-CFLAGS", "-O0", *(f"-D{define}" for define in defines)]
    build = build_cache_dir(f"tb-{top}", design_hash("\n".join(sources), main, " ".join(args),
                                                     str(verilator_bin())))
    binary = build / "obj" / top
    with build_lock(build):             # two xdist workers that need one build make it once
        if not binary.is_file():
            for i, text in enumerate(sources):
                (build / f"source{i}.v").write_text(text)
            (build / "main.cpp").write_text(main)
            command = [str(verilator_bin()), "--cc", "--exe", "--build", "-j", "2", *args,
                       "--top-module", top, "-Mdir", "obj", "-o", top, "main.cpp",
                       *(f"source{i}.v" for i in range(len(sources)))]
            result = subprocess.run(command, cwd=build, env=tool_env(), capture_output=True,
                                    text=True, check=False)
            assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    result = subprocess.run([str(binary), "+verilator+seed+7", "+verilator+rand+reset+2"],
                            capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


_SEED_MULTIPLIERS = ((0x9E3779B97F4A7C15, 1), (0xD1B54A32D192ED03, 7), (0x94D049BB133111EB, 3))


def random_top(module: str, seed: int, last_cycle: int, body: str) -> str:
    """A testbench top ``module`` (inputs ``clk``, ``rst``) with three xorshift64 generators
    ``x1``, ``x2``, ``x3`` seeded from ``seed`` that step every cycle out of reset, a counter
    ``cycle``, ``$finish`` at ``last_cycle``, and ``body`` (its checks)."""
    seeds = [(multiplier * (seed + offset)) % (1 << 64) or 1 for multiplier, offset in _SEED_MULTIPLIERS]
    declared = ", ".join(f"x{i + 1} = 64'h{value:016x}" for i, value in enumerate(seeds))
    return f"""
module {module}(input logic clk, input logic rst);
  logic [63:0] {declared};
  logic [31:0] cycle = 0;
{XORSHIFT64}  always @(posedge clk) if (!rst) begin
    x1 <= step(x1); x2 <= step(x2); x3 <= step(x3);
    cycle <= cycle + 1;
    if (cycle == {last_cycle}) $finish;
  end
{body}endmodule
"""


def check_variant_summaries(output: str, cases: int, min_reads: int) -> None:
    """Assert that ``output`` has the summary line of ``cases`` cases, each with no mismatch of
    either variant and at least ``min_reads`` reads compared."""
    summaries = re.findall(r"case (\w+): compared (\d+) reads, (\d+) generic mismatches, "
                           r"(\d+) ecp5 mismatches", output)
    assert len(summaries) == cases, output
    for case, reads, generic_bad, ecp5_bad in summaries:
        assert (int(generic_bad), int(ecp5_bad)) == (0, 0), (case, output)
        assert int(reads) >= min_reads, (case, output)


def operand_declarations(k: int, a_shape: Any, b_shape: Any, product_width: int) -> str:
    """SystemVerilog declarations of a multiplier testbench's operands ``a{k}``, ``b{k}`` (of
    the Amaranth shapes ``a_shape``, ``b_shape``) and its product ``p{k}`` (signed)."""
    sign = {True: "signed ", False: ""}
    return (f"  logic {sign[a_shape.signed]}[{a_shape.width - 1}:0] a{k};\n"
            f"  logic {sign[b_shape.signed]}[{b_shape.width - 1}:0] b{k};\n"
            f"  logic signed [{product_width - 1}:0] p{k};\n")


def operand_assign(name: str, shape: Any, exhaustive_bits: str, mode: str, random_bits: str) -> str:
    """An ``assign`` of the operand ``name`` (of the Amaranth shape ``shape``): the bits
    ``exhaustive_bits`` (a counter's) when given, otherwise by the 3-bit ``mode`` the minimum,
    the maximum, all ones, 0 or 1, else ``random_bits``."""
    width = shape.width
    if exhaustive_bits:
        return f"  assign {name} = {exhaustive_bits};\n"
    lo = 1 << (width - 1) if shape.signed else 0
    hi = (1 << (width - 1)) - 1 if shape.signed else (1 << width) - 1
    return (f"  assign {name} = {mode} == 0 ? {width}'d{lo} : {mode} == 1 ? {width}'d{hi} : "
            f"{mode} == 2 ? {width}'d{(1 << width) - 1} : {mode} == 3 ? {width}'d0 : "
            f"{mode} == 4 ? {width}'d1 : {random_bits};\n")
