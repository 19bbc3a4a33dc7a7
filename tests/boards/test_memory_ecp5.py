# amaranth: UnusedElaboratable=no
"""The banked SoC memory on ECP5 (boards/memory.py): its banks are DP16KD instances with the
block RAM's output register (REGMODE_A "OUTREG"), elsewhere amaranth Memory with a register on
the read data; both have the read latency of ``memory_read_latency`` (the bridge port one more,
for its register before the arbiter).

* The ECP5 variant's Verilog: how many DP16KD instances with which parameters, and which memories
  keep amaranth Memory on ECP5 (banks that are not 1024 words deep).
* The DP16KD instance's pins against yosys' own mapping of the same 1024 x 16 memory.
* In Verilator, with a behavioural model of the DP16KD (tests/boards/dp16kd_model.v, from Lattice
  TN1264 and yosys' brams_map_16kd.v): the ECP5 variant and the generic variant of the same memory
  under the same random traffic on the bridge port (random reads and writes back to back, random,
  full and empty byte masks, a few hot words at the banks' edges so that reads follow writes to
  the same word closely), both checked every read against a reference memory in the testbench:
  identical read data in identical cycles. Twice: with the DP16KD's output register enabled by
  OCEA alone, and by OCEA and CEA (which of the two the silicon does is not verified here).

Set SYSTOLIC_TEST_SEED to vary the random cases.
"""

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from systolic.boards.memory import (
    BANK_BYTES,
    DP16KD_WORDS,
    MAX_BANKS,
    SoCMemory,
    memory_read_latency,
)
from systolic.hw.bankram import DP16KDPort, dp16kd
from systolic.sim.tools import (
    to_verilog,
    yosys_synth,
)

from tests.boards.clocked_testbench import check_variant_summaries, random_top, run_clocked_testbench

SEED = int(os.environ.get("SYSTOLIC_TEST_SEED", "1"))
MODEL = Path(__file__).with_name("dp16kd_model.v")
_RANDOM_CYCLES = 40_000


class _ECP5:
    """The part of an ECP5 platform the memory looks at."""

    family = "ecp5"


def _instances(verilog: str) -> list[str]:
    """The text of every DP16KD instance (parameters and connections) in ``verilog``."""
    return re.findall(r"^\s*DP16KD\s*#\((.*?)\);", verilog, re.MULTILINE | re.DOTALL)


@pytest.mark.parametrize("bus_bits, memory_bytes", [(64, 16 * 1024), (64, 256 * 1024)])
def test_ecp5_banks_are_dp16kd_with_output_register(bus_bits, memory_bytes):
    """Each bank of a banked memory with 1024-word banks is bus bits / 16 DP16KD on ECP5, in the
    1024 x 18 mode with the output register, normal write mode, chip selects decoding 0; no
    amaranth memory is left, and the read latency is the generic variant's."""
    memory = SoCMemory(memory_bytes=memory_bytes, data_width=bus_bits)
    banks = memory.bank_count
    assert memory.memory_bytes // (bus_bits // 8) // banks == DP16KD_WORDS
    verilog = to_verilog(memory, "mem", platform=_ECP5())
    instances = _instances(verilog)
    assert len(instances) == banks * bus_bits // 16
    for text in instances:
        for name, value in (("DATA_WIDTH_A", r"32'(?:s)?d18"), ("REGMODE_A", '"OUTREG"'),
                            ("WRITEMODE_A", '"NORMAL"'), ("CSDECODE_A", '"0b000"'),
                            ("REGMODE_B", '"NOREG"')):
            assert re.search(rf"\.{name}\({value}\)", text), (name, text[:400])
        for port in ("OCEA", "CEA", "WEA", "CLKA", "RSTA", "ADA0", "ADA13", "DIA17", "DOA16"):
            assert re.search(rf"\.{port}\(", text), port
    assert not re.search(r"^\s*reg\s*\[\d+:0\]\s*\w+\s*\[", verilog, re.MULTILINE)   # no memory array
    # the bridge's view: the core's latency and the register before the arbiter
    assert memory.read_latency == memory_read_latency("bram", memory_bytes) + 1
    assert "DP16KD" not in to_verilog(SoCMemory(memory_bytes=memory_bytes, data_width=bus_bits), "mem")


@pytest.mark.parametrize("bus_bits, memory_bytes", [(32, 64 * 1024), (128, 256 * 1024), (64, 512 * 1024),
                                                    (64, 8 * 1024)])
def test_other_memories_keep_amaranth_memory_on_ecp5(bus_bits, memory_bytes):
    """Banks that are not 1024 words deep (a 32- or 128-bit bus, more than 256 KiB) and unbanked
    memories are amaranth memories on ECP5 too (yosys maps them without the output register)."""
    verilog = to_verilog(SoCMemory(memory_bytes=memory_bytes, data_width=bus_bits), "mem",
                         platform=_ECP5())
    assert "DP16KD" not in verilog
    assert re.search(r"^\s*reg\s*\[\d+:0\]\s*\w+\s*\[", verilog, re.MULTILINE)


def test_latency_is_one_more_for_the_output_register():
    """Banked memories: request, bank flags, bank, block RAM, output register and bank data
    registers, plus one select level per factor of 4 banks; unbanked memories and SPRAM: 1."""
    assert [memory_read_latency("bram", 1024 << i) for i in range(12)] == \
        [1, 1, 1, 1, 7, 7, 8, 8, 9, 9, 9, 9]     # 2, 4, 8, 16, 32 banks, then 32
    assert memory_read_latency("spram", 128 * 1024) == 1


# -- the ECP5 variant against the generic one, in Verilator --------------------------------------

_CASES = ((64, 16 * 1024), (64, 256 * 1024))     # (bus bits, bytes): 2 banks; 32 banks (ulx3s-85f)



def _instantiate(verilog: str, name: str, connections: dict[str, str]) -> str:
    """An instance of module ``name`` of ``verilog``: ``connections`` by port, other inputs 0."""
    header = re.search(rf"^module {name}\((.*?)\);", verilog, re.MULTILINE | re.DOTALL)
    assert header is not None
    ports = [p.strip() for p in header.group(1).split(",")]
    body = verilog[header.end():verilog.index("endmodule", header.end())]
    inputs = set(re.findall(r"^\s*input (?:\[\d+:0\] )?(\w+);", body, re.MULTILINE))
    pins = [f".{p}({connections.get(p, chr(39) + '0' if p in inputs else '')})" for p in ports]
    return f"  {name} {name}_i({', '.join(pins)});\n"


def _testbench(seed: int) -> list[str]:
    """Verilog sources: the DP16KD model, the generic and the ECP5 variant of each case's memory
    and a self-checking top that writes every word, then makes random accesses on the bridge
    port of both and compares each read's data with a reference memory's."""
    sources = [MODEL.read_text()]
    body = []
    for bits, size in _CASES:
        words = size // (bits // 8)
        addr_bits = (words - 1).bit_length()
        mask_bits = bits // 8
        latency = memory_read_latency("bram", size) + 1      # the bridge port's (SoCMemory.read_latency)
        banks = min(MAX_BANKS, max(1, size // BANK_BYTES))
        s = f"{bits}_{size // 1024}k"
        for variant, platform in (("generic", None), ("ecp5", _ECP5())):
            name = f"mem_{variant}_{s}"
            verilog = to_verilog(SoCMemory(memory_bytes=size, data_width=bits), name, platform=platform)
            assert verilog.count("DP16KD #(") == (banks * bits // 16 if platform else 0)
            sources.append(verilog)
            body.append(f"  wire [{bits - 1}:0] rdata_{variant}_{s};\n")
            body.append(_instantiate(verilog, name, {
                "clk": "clk", "rst": "rst", "bridge__cmd__valid": f"valid_{s}",
                "bridge__cmd__payload": f"cmd_{s}", "bridge__rdata": f"rdata_{variant}_{s}"}))
        index_bits = addr_bits - (banks - 1).bit_length()
        # hot words: the first and the last four of a bank
        hot = (f"{{x1[{addr_bits - 1}:{index_bits}], {{{index_bits - 2}{{x1[20]}}}}, x1[1:0]}}"
               if banks > 1 else f"{{{{{addr_bits - 2}{{x1[20]}}}}, x1[1:0]}}")
        body.append(f"""
  wire filling_{s} = cycle < {words};
  wire valid_{s} = !rst && (filling_{s} || x1[62:61] != 0);
  wire write_{s} = filling_{s} || x1[60];
  wire [{addr_bits - 1}:0] addr_{s} = filling_{s} ? {addr_bits}'(cycle)
      : x1[59] ? x1[{addr_bits - 1}:0] : {hot};
  wire [{mask_bits - 1}:0] mask_{s} = filling_{s} || x1[58:57] == 0 ? '1 : x1[58:57] == 1 ? '0
      : x1[{40 + mask_bits - 1}:40];
  wire [{bits - 1}:0] wdata_{s} = {{{bits // 64}{{x2}}}};
  wire [{bits + mask_bits + addr_bits}:0] cmd_{s} = {{mask_{s}, wdata_{s}, write_{s}, addr_{s}}};
  logic [{bits - 1}:0] ref_{s} [0:{words - 1}];
  logic [{bits - 1}:0] expected_{s} [0:{latency - 1}];
  logic [{latency - 1}:0] due_{s} = 0;        // a read was granted 1, 2, ... cycles ago
  logic [31:0] reads_{s} = 0, generic_bad_{s} = 0, ecp5_bad_{s} = 0;
  always @(posedge clk) if (!rst) begin
    if (valid_{s} && write_{s})
      for (int b = 0; b < {mask_bits}; b++)
        if (mask_{s}[b]) ref_{s}[addr_{s}][8 * b +: 8] <= wdata_{s}[8 * b +: 8];
    expected_{s}[0] <= ref_{s}[addr_{s}];
    for (int i = 1; i < {latency}; i++) expected_{s}[i] <= expected_{s}[i - 1];
    due_{s} <= {{due_{s}[{latency - 2}:0], valid_{s} && !write_{s}}};
    if (due_{s}[{latency - 1}]) begin
      reads_{s} <= reads_{s} + 1;
      if (rdata_generic_{s} != expected_{s}[{latency - 1}]) begin
        generic_bad_{s} <= generic_bad_{s} + 1;
        if (generic_bad_{s} < 5) $display("generic {s} cycle %0d: %h, expected %h", cycle,
                                          rdata_generic_{s}, expected_{s}[{latency - 1}]);
      end
      if (rdata_ecp5_{s} != expected_{s}[{latency - 1}]) begin
        ecp5_bad_{s} <= ecp5_bad_{s} + 1;
        if (ecp5_bad_{s} < 5) $display("ecp5 {s} cycle %0d: %h, expected %h", cycle,
                                       rdata_ecp5_{s}, expected_{s}[{latency - 1}]);
      end
    end
  end
  final $display("case {s}: compared %0d reads, %0d generic mismatches, %0d ecp5 mismatches",
                 reads_{s}, generic_bad_{s}, ecp5_bad_{s});
""")
    fill = max(size // (bits // 8) for bits, size in _CASES)
    sources.append(random_top("dp16kd_check", seed, fill + _RANDOM_CYCLES, "".join(body)))
    return sources


@pytest.mark.slow
@pytest.mark.parametrize("ce_gates_outreg", [False, True])
def test_ecp5_memory_behaves_like_the_generic_memory(ce_gates_outreg):
    """The ECP5 variant (DP16KD model) and the generic variant (amaranth Memory) return the
    reference memory's data for every read, in the cycle ``read_latency`` after its grant; also
    if the DP16KD's output register is enabled by CEA as well as by OCEA."""
    defines = ("DP16KD_CE_GATES_OUTREG",) if ce_gates_outreg else ()
    output = run_clocked_testbench("dp16kd_check", _testbench(SEED), defines=defines)
    check_variant_summaries(output, len(_CASES), _RANDOM_CYCLES // 4)


# -- the DP16KD's wiring against yosys' own mapping ----------------------------------------------

class _YosysRam(wiring.Component):
    """A 1024 x 16 single-port RAM with two byte enables as amaranth memory (yosys maps it to one
    DP16KD) or, with ``instance``, the DP16KD that boards/memory.py instantiates for it
    (``systolic.hw.bankram.dp16kd``)."""

    addr: In(10)
    data: In(16)
    be: In(2)
    ce: In(1)
    we: In(1)
    q: Out(16)

    def __init__(self, instance: bool):
        self.instance = instance
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        if self.instance:
            q, _ = dp16kd(m, "ram", a=DP16KDPort(addr=self.addr, enable=self.ce, write=self.we,
                                                 byte_enables=self.be, data=self.data,
                                                 output_register=True, output_enable=1))
            m.d.comb += self.q.eq(q)
        else:
            m.submodules.ram = ram = Memory(shape=16, depth=1024, init=[])
            write = ram.write_port(granularity=8)
            read = ram.read_port()
            m.d.comb += [write.addr.eq(self.addr), write.data.eq(self.data), write.en.eq(self.be),
                         read.addr.eq(self.addr), read.en.eq(self.ce & ~self.we), self.q.eq(read.data)]
        return m


def _dp16kd_pins(instance: bool, tmp: Path) -> dict[str, str]:
    """The DP16KD of :class:`_YosysRam` after ``synth_ecp5``: the top's port bit (``"addr[3]"``) or
    constant on each of its ADA and DIA pins, and the port bits that each DOA pin reaches through
    up to three cells (yosys adds a LUT after its DP16KD's output), joined with "|"."""
    netlist = tmp / f"ram{int(instance)}.json"
    yosys_synth(to_verilog(_YosysRam(instance), "ram"), "ram", "ecp5", netlist=netlist)
    module = json.loads(netlist.read_text())["modules"]["ram"]
    bits = {bit: f"{name}[{i}]" for name, port in module["ports"].items()
            for i, bit in enumerate(port["bits"])}
    cells = list(module["cells"].values())
    readers: dict[Any, list[dict[str, Any]]] = {}
    for cell in cells:
        for pin, net in cell["connections"].items():
            if cell["port_directions"].get(pin) == "input":
                for bit in net:
                    readers.setdefault(bit, []).append(cell)
    rams = [cell for cell in cells if cell["type"] == "DP16KD"]
    assert len(rams) == 1, [cell["type"] for cell in cells]
    pins = {}
    for pin, (bit,) in rams[0]["connections"].items():
        if re.fullmatch(r"(ADA|DIA)\d+", pin):
            pins[pin] = bits.get(bit, bit if isinstance(bit, str) else "logic")
        elif re.fullmatch(r"DOA\d+", pin):
            reached, front = set(), {bit}
            for _ in range(4):
                reached |= {bits[b] for b in front if b in bits}
                front = {b for f in front for cell in readers.get(f, ()) if cell is not rams[0]
                         for out, net in cell["connections"].items()
                         if cell["port_directions"].get(out) == "output" for b in net}
            pins[pin] = "|".join(sorted(reached))
    return pins


def test_dp16kd_wiring_is_yosys_mapping(tmp_path):
    """The DP16KD instance's address, byte-enable, data-in and data-out pins carry the same bits
    as in yosys' own mapping of a 1024 x 16 byte-enabled memory (brams_map_16kd.v): word address
    on ADA13:4, byte enables on ADA1:0, the bytes in DIA7:0 / DIA16:9 and DOA7:0 / DOA16:9."""
    ours = _dp16kd_pins(True, tmp_path)
    theirs = _dp16kd_pins(False, tmp_path)
    assert sorted(ours) == sorted(theirs) and len(ours) == 14 + 18 + 18
    used = {pin: net for pin, net in theirs.items() if net not in ("x", "logic", "")}
    assert len(used) == 14 + 16 + 16, theirs        # ADA3:2 are constants, DIA8, DIA17 x
    assert {pin: ours[pin] for pin in used} == used
    # DIA8 and DIA17, the 9th bits of the bytes, are tied to 0 in ours, and DOA8, DOA17 unused
    assert [ours[p] for p in ("DIA8", "DIA17", "DOA8", "DOA17")] == ["0", "0", "", ""], ours
