"""The one configuration object of an accelerator.

:class:`AcceleratorConfig` is read by the gateware generators, the compiler and the golden model.
Every derived quantity (row widths, address widths, bank sizes, element sizes) is a property here,
so that no other module computes it a second time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

__all__ = ["AcceleratorConfig", "ConfigError", "ACTIVATIONS", "POOLINGS", "DATAFLOWS", "DMA_ENGINES",
           "BRAM_TABLE_ENTRIES", "SYNTHESIS_ONLY", "HASHED_UNLESS_DEFAULT", "field_docs", "int_range",
           "parse_assignment", "parse_size", "quarter_square_span"]

DATAFLOWS = ("ws", "os")
DMA_ENGINES = ("pipelined", "serial")
CONTROLS = ("hardware", "firmware")
ACTIVATIONS = ("relu", "relu6", "clip")
POOLINGS = ("max", "avg")
#: Most entries of a block-RAM multiplier's quarter-square table (``array_bram_multipliers``):
#: one 1024 x 18 block RAM (ECP5 DP16KD) read on both of its ports.
BRAM_TABLE_ENTRIES = 1024


class ConfigError(ValueError):
    """An accelerator configuration breaks a rule. The message names the field, the rule and
    the value that was given."""


def _is_pow2(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def _ceil_log2(value: int) -> int:
    return max(1, (value - 1).bit_length())


# Field documentation, shown by `systolic config --help-fields` and in the README.
_DOC = {
    "rows": "rows of the MAC array (R): the reduction (K) dimension in WS, output rows (M) in OS",
    "cols": "columns of the MAC array (C): output channels (N) per tile",
    "input_bits": "width of an input (activation) element, bits",
    "input_signed": "input elements are signed two's complement",
    "weight_bits": "width of a weight element, bits",
    "weight_signed": "weight elements are signed two's complement",
    "acc_bits": "width of an accumulator element, bits",
    "acc_signed": "accumulator elements are signed",
    "dataflow": "'ws' (weight-stationary) or 'os' (output-stationary)",
    "array_lut_multipliers": "PEs whose multiplier is logic (LUTs) instead of a DSP block, the last ones "
                             "in row-major order: for FPGAs with fewer DSP blocks than PEs",
    "array_bram_multipliers": "PEs whose multiplier is a quarter-square table in block RAM (one "
                              "1024 x 18 block RAM each) instead of a DSP block, the ones just before "
                              "the logic ones: for FPGAs with block RAM to spare; 8-bit elements only",
    "scratchpad_bytes": "scratchpad capacity, bytes",
    "scratchpad_banks": "scratchpad banks (ping-pong halves are made of banks)",
    "accumulator_bytes": "accumulator memory capacity, bytes",
    "memory_registers": "registers around every scratchpad and accumulator block RAM (requests "
                        "beside the bank, the block RAM's output register, a data register) and "
                        "between the compute unit and the scratchpad's and array's ports (both "
                        "ways): read latency 5 cycles, for 100 MHz on large FPGAs; false: read "
                        "latency 2 and far fewer flip-flops, for small, slow FPGAs",
    "requant_table_rows": "rows of the SFU's per-channel bias/multiplier/shift table",
    "requant_row_words": "with sfu_engine = 'serial' only: memory words per requantize-table row (1 "
                         "to 64): more make the table's block RAMs narrower and deeper (fewer of them "
                         "on small FPGAs); a row then takes that many cycles to write or read, and a "
                         "register holds the row in use. The pipelined SFU reads the table one lane "
                         "group (cols / sfu_row_cycles entries) a cycle, a memory word each, so it "
                         "must be 1 there",
    "requant_load_entries": "0: a dst=table LOAD may write any entries of a row. Otherwise a power "
                            "of two dividing cols: each row's entries that one table LOAD writes must "
                            "lie in one aligned group of this many (docs/isa.md, LOAD), so the LOAD "
                            "engine's rows are that many 12-byte entries wide instead of cols (on a "
                            "16x16 array: 64-byte rows instead of 192, about 3k LUTs fewer); the "
                            "compiler loads the table a group at a time",
    "dram_bytes": "size of the DRAM the accelerator addresses (program, weights, activations), bytes",
    "dma_data_bits": "AXI4 data width of the DMA and instruction fetch, bits",
    "dma_max_burst": "longest AXI4 INCR burst, beats",
    "dma_outstanding": "AXI4 read bursts in flight",
    "dram_latency": "DRAM read latency assumed by the cycle estimate, cycles",
    "gather_engine": "LOAD read engine: 'pipelined' (many bursts in flight, up to a row per cycle) or "
                     "'serial' (a row byte per cycle, one single-beat read at a time: under half the "
                     "logic and no block RAM, for small FPGAs; docs/arch-system.md)",
    "scatter_engine": "STORE write engine: 'pipelined' (bursts, up to a pixel per cycle) or 'serial' "
                      "(an output byte per cycle, single-beat writes: a fraction of the logic and no "
                      "block RAM, for small FPGAs; docs/arch-system.md)",
    "command_registers": "a register between the dispatcher and the load and store units for each "
                         "LOAD/STORE (it keeps a unit's readiness off the token checks and the "
                         "dispatcher's queue for high clocks); false saves its flip-flops, about 700, "
                         "on small, slow FPGAs",
    "fifo_block_ram_bits": "FIFOs storing at least this many bits (width x (depth - 1): the DMA "
                           "engines', the units' and the SFU's; width x depth: the clock-domain "
                           "crossings' of a compute_clock_mhz config, but the COMPUTE instructions' "
                           "crossing, never in block RAM; hw/fifo.py) keep them in block RAM "
                           "(yosys attribute ram_style = block) instead of distributed RAM; 0: yosys "
                           "chooses. For nearly full ECP5 devices, where distributed-RAM cells can keep "
                           "nextpnr's analytic placer from a legal placement; synthesis only (not part "
                           "of the config hash)",
    "load_queue_depth": "instructions buffered in the load queue",
    "compute_queue_depth": "instructions buffered in the compute queue",
    "store_queue_depth": "instructions buffered in the store queue",
    "token_depth": "dependency tokens each queue-to-queue channel can hold",
    "sfu_activations": "activations the SFU implements: any of relu, relu6, clip",
    "sfu_pooling": "pooling modes the SFU implements: any of max, avg",
    "sfu_residual": "the SFU can add a residual int tensor on the store path",
    "sfu_row_cycles": "cycles the SFU takes per accumulator row (a power of two, 1 to cols): its "
                      "cols / sfu_row_cycles lanes each process that many channels in turn; more "
                      "cycles share DSP blocks and logic on small FPGAs, at a slower store path",
    "sfu_engine": "SFU: 'pipelined' (a row every sfu_row_cycles cycles) or 'serial' (one channel "
                  "at a time through one adder, tens of cycles each: a fraction of the logic and "
                  "no DSP blocks, for small FPGAs; docs/arch-memory-sfu.md)",
    "control": "what executes the program: 'hardware' (fetcher, dispatcher, three queue sequencers, "
               "load and store units, SFU) or 'firmware' (an RV32 core, hw/cpu.py, runs firmware that "
               "fetches the program and executes LOAD, STORE, CONFIG and SYNC itself and hands COMPUTEs "
               "to the compute unit: far less logic, for the smallest FPGAs, but LOADs and STOREs take "
               "hundreds to thousands of cycles per element; needs dma_data_bits = 32, queues of at "
               "most 4, a requantize table of at most 1024 bytes; docs/arch-system.md)",
    "counter_bits": "width of each performance counter, bits (16 to 64; a counter wraps modulo "
                    "2**counter_bits): 32 halves their logic on small FPGAs",
    "clock_mhz": "target clock frequency, MHz",
    "compute_clock_mhz": "0: one clock. Otherwise the compute core (compute unit, scratchpad, "
                         "accumulator, array) runs on a clock of its own at this frequency (MHz, "
                         "between clock_mhz / 4 and 4 x clock_mhz; port compute_clk), joined to the "
                         "rest by clock-domain crossings, so that the array can run faster than the "
                         "control and DMA logic; needs control = 'hardware' (docs/arch-system.md)",
    "acc_crossing_pieces": "1: whole rows. Otherwise (a power of two up to 16, compute_clock_mhz configs "
                           "only) the two clock-domain crossings of accumulator rows (the LOADs' writes "
                           "into the compute core, the STOREs' read responses out of it) carry a row as "
                           "that many narrower pieces, one a cycle: their FIFOs are that many times "
                           "narrower (on a 16x16 array 15 block RAMs each become 4 with 4 pieces), and "
                           "each carries a row every that many cycles at most (docs/arch-system.md)",
}


#: Fields that only steer synthesis (attributes for yosys): the gateware's behaviour, and so the
#: programs it runs, do not depend on them, and :attr:`AcceleratorConfig.hash` leaves them out.
SYNTHESIS_ONLY = frozenset({"fifo_block_ram_bits"})

#: Fields added after configs had been hashed, with the value that means the behaviour of before:
#: :attr:`AcceleratorConfig.hash` leaves such a field out while it has that value, so that every
#: config written before the field keeps its hash (and so its gateware's CSR constant).
HASHED_UNLESS_DEFAULT: Mapping[str, object] = MappingProxyType({"compute_clock_mhz": 0.0,
                                                                "requant_load_entries": 0,
                                                                "acc_crossing_pieces": 1})


@dataclass(frozen=True)
class AcceleratorConfig:
    """Parameters of one accelerator instance. Frozen and validated at construction.

    Units: widths in bits, sizes in bytes, depths in entries, clock in MHz.
    """

    rows: int = 8
    cols: int = 8
    input_bits: int = 8
    input_signed: bool = True
    weight_bits: int = 8
    weight_signed: bool = True
    acc_bits: int = 32
    acc_signed: bool = True
    dataflow: str = "ws"
    array_lut_multipliers: int = 0
    array_bram_multipliers: int = 0
    scratchpad_bytes: int = 64 * 1024
    scratchpad_banks: int = 2
    accumulator_bytes: int = 16 * 1024
    memory_registers: bool = True
    requant_table_rows: int = 64
    requant_row_words: int = 1
    requant_load_entries: int = 0
    dram_bytes: int = 256 * 1024 * 1024
    dma_data_bits: int = 64
    dma_max_burst: int = 16
    dma_outstanding: int = 16
    dram_latency: int = 16
    gather_engine: str = "pipelined"
    scatter_engine: str = "pipelined"
    command_registers: bool = True
    fifo_block_ram_bits: int = 0
    load_queue_depth: int = 8
    compute_queue_depth: int = 8
    store_queue_depth: int = 8
    token_depth: int = 8
    sfu_activations: tuple[str, ...] = field(default=ACTIVATIONS)
    sfu_pooling: tuple[str, ...] = field(default=POOLINGS)
    sfu_residual: bool = True
    sfu_row_cycles: int = 1
    sfu_engine: str = "pipelined"
    control: str = "hardware"
    counter_bits: int = 64
    clock_mhz: float = 100.0
    compute_clock_mhz: float = 0.0
    acc_crossing_pieces: int = 1

    # -- validation -------------------------------------------------------------------------------

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", int):
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ConfigError(f"{f.name} must be an integer, not {value!r}")
            elif f.type in ("bool", bool):
                if not isinstance(value, bool):
                    raise ConfigError(f"{f.name} must be true or false, not {value!r}")
            elif f.type in ("float", float):
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise ConfigError(f"{f.name} must be a number, not {value!r}")
                object.__setattr__(self, f.name, float(value))
            elif f.type in ("str", str):
                if not isinstance(value, str):
                    raise ConfigError(f"{f.name} must be a string, not {value!r}")
            else:  # tuple[str, ...]
                if isinstance(value, str) or not isinstance(value, list | tuple):
                    raise ConfigError(f"{f.name} must be a list of strings, not {value!r}")
                object.__setattr__(self, f.name, tuple(value))

        for name in ("rows", "cols"):
            value = getattr(self, name)
            if not (_is_pow2(value) and 2 <= value <= 64):
                raise ConfigError(f"{name} must be a power of two between 2 and 64, not {value!r}")
        for name in ("input_bits", "weight_bits"):
            value = getattr(self, name)
            if value not in (8, 16):
                raise ConfigError(f"{name} must be 8 or 16, not {value!r}")
        if self.acc_bits not in (16, 32):
            raise ConfigError(f"acc_bits must be 16 or 32, not {self.acc_bits!r}")
        if self.acc_bits < self.input_bits + self.weight_bits:
            raise ConfigError(
                f"acc_bits must be at least input_bits + weight_bits "
                f"({self.input_bits + self.weight_bits}) so that one product fits, not {self.acc_bits!r}")
        if (self.input_signed or self.weight_signed) and not self.acc_signed:
            raise ConfigError("acc_signed must be true when input_signed or weight_signed is true, "
                              "not false")
        if self.dataflow not in DATAFLOWS:
            raise ConfigError(f"dataflow must be one of 'ws', 'os', not {self.dataflow!r}")
        if not 0 <= self.array_lut_multipliers <= self.rows * self.cols:
            raise ConfigError(f"array_lut_multipliers must be between 0 and rows * cols "
                              f"({self.rows * self.cols}), not {self.array_lut_multipliers!r}")
        free = self.rows * self.cols - self.array_lut_multipliers
        if not 0 <= self.array_bram_multipliers <= free:
            raise ConfigError(f"array_bram_multipliers must be between 0 and rows * cols - "
                              f"array_lut_multipliers ({free}), not {self.array_bram_multipliers!r}")
        if self.array_bram_multipliers:
            lo, hi = quarter_square_span(self.input_range, self.weight_range)
            if hi - lo + 1 > BRAM_TABLE_ENTRIES:
                raise ConfigError(
                    f"array_bram_multipliers needs a quarter-square table of at most "
                    f"{BRAM_TABLE_ENTRIES} entries (8-bit inputs and weights), but input_bits "
                    f"{self.input_bits} and weight_bits {self.weight_bits} give sums and "
                    f"differences of {hi - lo + 1} values; use 0 or 8-bit elements")

        if not _is_pow2(self.scratchpad_banks) or not 2 <= self.scratchpad_banks <= 64:
            raise ConfigError(f"scratchpad_banks must be a power of two between 2 and 64, "
                              f"not {self.scratchpad_banks!r}")
        if not _is_pow2(self.scratchpad_bytes):
            raise ConfigError(f"scratchpad_bytes must be a power of two, not {self.scratchpad_bytes!r}")
        min_spad = self.min_scratchpad_bytes
        if self.scratchpad_bytes < min_spad:
            raise ConfigError(
                f"scratchpad_bytes must hold one tile in each of {self.scratchpad_banks} banks "
                f"({self.tile_rows} rows of {self.spad_row_bytes} bytes per bank, {min_spad} bytes), "
                f"not {self.scratchpad_bytes!r}")
        if self.spad_rows > 1 << 16:
            raise ConfigError(f"scratchpad_bytes must give at most 65536 rows of {self.spad_row_bytes} "
                              f"bytes (the ISA's 16-bit row address), not {self.scratchpad_bytes!r}")
        if not _is_pow2(self.accumulator_bytes):
            raise ConfigError(f"accumulator_bytes must be a power of two, not {self.accumulator_bytes!r}")
        min_acc = 2 * self.rows * self.acc_row_bytes
        if self.accumulator_bytes < min_acc:
            raise ConfigError(
                f"accumulator_bytes must hold two output tiles ({2 * self.rows} rows of "
                f"{self.acc_row_bytes} bytes, {min_acc} bytes), not {self.accumulator_bytes!r}")
        if self.acc_rows > 1 << 16:
            raise ConfigError(f"accumulator_bytes must give at most 65536 rows of {self.acc_row_bytes} "
                              f"bytes (the ISA's 16-bit row address), not {self.accumulator_bytes!r}")
        if not _is_pow2(self.requant_table_rows) or not 1 <= self.requant_table_rows <= 4096:
            raise ConfigError(f"requant_table_rows must be a power of two between 1 and 4096, "
                              f"not {self.requant_table_rows!r}")

        if not 1 <= self.requant_row_words <= 64:
            raise ConfigError(f"requant_row_words must be between 1 and 64, not {self.requant_row_words!r}")
        if self.requant_load_entries and not (_is_pow2(self.requant_load_entries)
                                              and self.requant_load_entries <= self.cols):
            raise ConfigError(f"requant_load_entries must be 0 (whole rows) or a power of two between 1 "
                              f"and cols ({self.cols}), not {self.requant_load_entries!r}")

        if not 0 <= self.fifo_block_ram_bits <= 1 << 20:
            raise ConfigError(f"fifo_block_ram_bits must be 0 (yosys chooses) or between 1 and 2**20 "
                              f"bits, not {self.fifo_block_ram_bits!r}")

        if not _is_pow2(self.dram_bytes) or not 1 << 12 <= self.dram_bytes <= 1 << 32:
            raise ConfigError(f"dram_bytes must be a power of two between 4096 and 2**32 (the 32-bit "
                              f"DRAM address), not {self.dram_bytes!r}")
        if self.dma_data_bits not in (32, 64, 128):
            raise ConfigError(f"dma_data_bits must be 32, 64 or 128, not {self.dma_data_bits!r}")
        if not _is_pow2(self.dma_max_burst) or not 1 <= self.dma_max_burst <= 256:
            raise ConfigError(f"dma_max_burst must be a power of two between 1 and 256 beats, "
                              f"not {self.dma_max_burst!r}")
        if self.dma_max_burst * self.dma_bytes < 64:
            raise ConfigError(
                f"dma_max_burst times the bus width ({self.dma_bytes} bytes) must cover one 64-byte "
                f"instruction word, not {self.dma_max_burst!r} beats "
                f"({self.dma_max_burst * self.dma_bytes} bytes)")
        if not 1 <= self.dma_outstanding <= 16:
            raise ConfigError(f"dma_outstanding must be between 1 and 16, not {self.dma_outstanding!r}")
        if not 1 <= self.dram_latency <= 1024:
            raise ConfigError(f"dram_latency must be between 1 and 1024 cycles, not {self.dram_latency!r}")
        for name in ("gather_engine", "scatter_engine", "sfu_engine"):
            if getattr(self, name) not in DMA_ENGINES:
                raise ConfigError(f"{name} must be one of {', '.join(map(repr, DMA_ENGINES))}, "
                                  f"not {getattr(self, name)!r}")
        if self.control not in CONTROLS:
            raise ConfigError(f"control must be one of {', '.join(map(repr, CONTROLS))}, "
                              f"not {self.control!r}")
        if self.control == "firmware" and self.dma_data_bits != 32:
            raise ConfigError(f"control = 'firmware' needs dma_data_bits = 32 (the core's word), "
                              f"not {self.dma_data_bits!r}")
        for name in ("load_queue_depth", "compute_queue_depth", "store_queue_depth", "token_depth"):
            value = getattr(self, name)
            if not _is_pow2(value) or not 1 <= value <= 256:
                raise ConfigError(f"{name} must be a power of two between 1 and 256, not {value!r}")

        for name, allowed in (("sfu_activations", ACTIVATIONS), ("sfu_pooling", POOLINGS)):
            value = getattr(self, name)
            for item in value:
                if item not in allowed:
                    raise ConfigError(f"{name} entries must be among {', '.join(allowed)}, not {item!r}")
            if len(set(value)) != len(value):
                raise ConfigError(f"{name} must not repeat an entry, not {list(value)!r}")
            # canonical order, so that equal feature sets hash alike
            object.__setattr__(self, name, tuple(a for a in allowed if a in value))
        if not (_is_pow2(self.sfu_row_cycles) and self.sfu_row_cycles <= self.cols):
            raise ConfigError(f"sfu_row_cycles must be a power of two between 1 and cols ({self.cols}), "
                              f"not {self.sfu_row_cycles!r}")
        if self.sfu_engine == "pipelined" and self.requant_row_words != 1:
            raise ConfigError(f"requant_row_words must be 1 with sfu_engine = 'pipelined' (its SFU reads "
                              f"the requantize table a lane group per memory word: sfu_row_cycles words "
                              f"a row); it sets the words of the serial SFU's table, not "
                              f"{self.requant_row_words!r}")
        if not 16 <= self.counter_bits <= 64:
            raise ConfigError(f"counter_bits must be between 16 and 64, not {self.counter_bits!r}")
        if not 1.0 <= self.clock_mhz <= 1000.0:
            raise ConfigError(f"clock_mhz must be between 1 and 1000, not {self.clock_mhz!r}")
        highest = min(4 * self.clock_mhz, 1000.0)
        if self.compute_clock_mhz and not self.clock_mhz / 4 <= self.compute_clock_mhz <= highest:
            raise ConfigError(f"compute_clock_mhz must be 0 (one clock) or between clock_mhz / 4 and "
                              f"4 x clock_mhz ({self.clock_mhz / 4:g} to {highest:g}), "
                              f"not {self.compute_clock_mhz!r}")
        if not (_is_pow2(self.acc_crossing_pieces) and self.acc_crossing_pieces <= 16):
            raise ConfigError(f"acc_crossing_pieces must be a power of two between 1 and 16, "
                              f"not {self.acc_crossing_pieces!r}")
        if self.acc_crossing_pieces != 1 and not self.compute_clock_mhz:
            raise ConfigError(f"acc_crossing_pieces applies to the clock-domain crossings of a "
                              f"compute_clock_mhz config, so it must be 1 with one clock, "
                              f"not {self.acc_crossing_pieces!r}")
        if self.compute_clock_mhz and self.control != "hardware":
            raise ConfigError(f"compute_clock_mhz needs control = 'hardware' (the firmware control "
                              f"drives the compute core directly), not control = {self.control!r}")
        if self.control == "firmware":
            from .fw_engine import check_firmware_config  # it reads the fields checked above

            check_firmware_config(self)

    @property
    def array_clock_mhz(self) -> float:
        """The clock the array runs on, MHz: ``compute_clock_mhz`` when set, else ``clock_mhz``."""
        return self.compute_clock_mhz or self.clock_mhz

    # -- element types --------------------------------------------------------------------------

    @property
    def spad_elem_bits(self) -> int:
        """Width of one scratchpad element (inputs and weights share rows), bits."""
        return max(self.input_bits, self.weight_bits)

    @property
    def spad_elem_bytes(self) -> int:
        """Size of one scratchpad element in DRAM, bytes."""
        return self.spad_elem_bits // 8

    @property
    def input_bytes(self) -> int:
        return self.input_bits // 8

    @property
    def acc_bytes(self) -> int:
        """Size of one accumulator element in DRAM, bytes."""
        return self.acc_bits // 8

    @property
    def output_bits(self) -> int:
        """Width of a requantized output element: the input type of the next layer."""
        return self.input_bits

    @property
    def output_signed(self) -> bool:
        return self.input_signed

    @property
    def output_range(self) -> tuple[int, int]:
        """Inclusive (min, max) of a requantized output element."""
        return int_range(self.output_bits, self.output_signed)

    @property
    def input_range(self) -> tuple[int, int]:
        return int_range(self.input_bits, self.input_signed)

    @property
    def weight_range(self) -> tuple[int, int]:
        return int_range(self.weight_bits, self.weight_signed)

    @property
    def acc_range(self) -> tuple[int, int]:
        return int_range(self.acc_bits, self.acc_signed)

    # -- scratchpad geometry --------------------------------------------------------------------

    @property
    def spad_row_elems(self) -> int:
        """Elements in one scratchpad row: an input vector (rows) or a weight row (cols)."""
        return max(self.rows, self.cols)

    @property
    def spad_row_bits(self) -> int:
        return self.spad_row_elems * self.spad_elem_bits

    @property
    def spad_row_bytes(self) -> int:
        return self.spad_row_bits // 8

    @property
    def spad_rows(self) -> int:
        """Rows in the whole scratchpad."""
        return self.scratchpad_bytes // self.spad_row_bytes

    @property
    def spad_bank_rows(self) -> int:
        """Rows in one scratchpad bank; bank b holds rows [b * spad_bank_rows, (b+1) * ...)."""
        return self.spad_rows // self.scratchpad_banks

    @property
    def spad_addr_bits(self) -> int:
        return _ceil_log2(self.spad_rows)

    @property
    def tile_rows(self) -> int:
        """Scratchpad rows of one full operand tile (an R x C weight tile or R input rows)."""
        return self.spad_row_elems

    @property
    def min_scratchpad_bytes(self) -> int:
        return self.scratchpad_banks * self.tile_rows * self.spad_row_bytes

    # -- accumulator geometry -------------------------------------------------------------------

    @property
    def acc_row_elems(self) -> int:
        return self.cols

    @property
    def acc_row_bits(self) -> int:
        return self.cols * self.acc_bits

    @property
    def acc_row_bytes(self) -> int:
        return self.acc_row_bits // 8

    @property
    def acc_rows(self) -> int:
        return self.accumulator_bytes // self.acc_row_bytes

    @property
    def acc_addr_bits(self) -> int:
        return _ceil_log2(self.acc_rows)

    @property
    def requant_addr_bits(self) -> int:
        """Width of a requantize-table row address; at least 1 (Verilog has no empty vectors: a
        one-row table is built with two rows, row 1 never addressed)."""
        return max(1, (self.requant_table_rows - 1).bit_length())

    @property
    def table_load_entries(self) -> int:
        """Entries of a requantize-table row one dst=table LOAD may write, an aligned group:
        ``requant_load_entries``, or ``cols`` (the whole row) when that is 0."""
        return self.requant_load_entries or self.cols

    @property
    def requant_table_words(self) -> int:
        """Memory words per requantize-table row: one per lane group (``sfu_row_cycles``) for the
        pipelined SFU, which reads a group a cycle; ``requant_row_words`` for the serial one."""
        return self.sfu_row_cycles if self.sfu_engine == "pipelined" else self.requant_row_words

    @property
    def requant_entry_bytes(self) -> int:
        """One channel's requantize entry in DRAM: int32 bias, int32 multiplier, int32 shift."""
        return 12

    @property
    def sfu_lanes(self) -> int:
        """Channels the SFU processes per cycle: ``cols // sfu_row_cycles``."""
        return self.cols // self.sfu_row_cycles

    # -- bus ------------------------------------------------------------------------------------

    @property
    def dma_bytes(self) -> int:
        """Bytes per AXI4 beat."""
        return self.dma_data_bits // 8

    @property
    def pc_bits(self) -> int:
        """Width of an instruction index (program counter) and of an instruction count in the
        hardware: a program lies in DRAM, so it has at most ``dram_bytes / 64`` instructions."""
        return (self.dram_bytes // 64).bit_length()

    @property
    def peak_macs_per_cycle(self) -> int:
        return self.rows * self.cols

    # -- identity and serialization -------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for key, value in out.items():
            if isinstance(value, tuple):
                out[key] = list(value)
        return out

    @property
    def hash(self) -> int:
        """64-bit identity of the config, stored in program headers and in the CSRs (first 8
        bytes of SHA-256 over the canonical JSON of every field but :data:`SYNTHESIS_ONLY`'s,
        which change no behaviour: a program runs the same on configs that differ only there,
        and those of :data:`HASHED_UNLESS_DEFAULT` at their default)."""
        fields = {k: v for k, v in self.to_dict().items()
                  if k not in SYNTHESIS_ONLY and HASHED_UNLESS_DEFAULT.get(k, object()) != v}
        text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")

    @property
    def hash_hex(self) -> str:
        return f"{self.hash:016x}"

    @classmethod
    def from_dict(cls, values: dict[str, Any], *, source: str = "config") -> AcceleratorConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"{source}: unknown field {unknown[0]!r}; known fields are "
                              f"{', '.join(sorted(known))}")
        return cls(**values)

    @classmethod
    def from_toml(cls, path: str | Path) -> AcceleratorConfig:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: byte {exc.start} is not UTF-8 text") from None
        try:
            values = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
        for key, value in values.items():
            if isinstance(value, dict):
                raise ConfigError(f"{path}: tables are not used in a config file; "
                                  f"write fields at top level, not [{key}]")
        try:
            return cls.from_dict(values, source=str(path))
        except ConfigError as exc:
            message = str(exc)
            if not message.startswith(str(path)):
                message = f"{path}: {message}"
            raise ConfigError(message) from None

    def to_toml(self) -> str:
        lines = ["# systolic accelerator configuration", f"# hash {self.hash_hex}"]
        for f in fields(self):
            value = getattr(self, f.name)
            lines.append(f"{f.name} = {_toml_value(value)}")
        return "\n".join(lines) + "\n"

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_toml())

    def replace(self, **changes: Any) -> AcceleratorConfig:
        known = {f.name for f in fields(self)}
        for key in changes:
            if key not in known:
                raise ConfigError(f"unknown field {key!r}; known fields are {', '.join(sorted(known))}")
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        """Human-readable resolved config with derived quantities."""
        out = [f"AcceleratorConfig {self.hash_hex}"]
        width = max(len(f.name) for f in fields(self))
        for f in fields(self):
            out.append(f"  {f.name:<{width}} = {_toml_value(getattr(self, f.name))}")
        out.append("derived:")
        derived = {
            "peak MACs/cycle": self.peak_macs_per_cycle,
            "scratchpad rows": f"{self.spad_rows} x {self.spad_row_bytes} B "
                               f"({self.spad_row_elems} elements), {self.scratchpad_banks} banks of "
                               f"{self.spad_bank_rows} rows, {self.spad_addr_bits}-bit row address",
            "accumulator rows": f"{self.acc_rows} x {self.acc_row_bytes} B ({self.cols} x "
                                f"int{self.acc_bits}), {self.acc_addr_bits}-bit row address",
            "requant table": f"{self.requant_table_rows} rows x {self.cols} channels",
            "DMA beat": f"{self.dma_bytes} B, bursts up to {self.dma_max_burst * self.dma_bytes} B",
            "peak GOPS": f"{2 * self.rows * self.cols * self.array_clock_mhz / 1000:.2f}",
        }
        for key, value in derived.items():
            out.append(f"  {key:<{width}} : {value}")
        return "\n".join(out)


_BARE_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def parse_assignment(text: str, *, flag: str = "--set") -> tuple[str, Any]:
    """``(field, value)`` from a command line's ``field=value`` (given after ``flag``): the value is
    a TOML value (``16``, ``true``, ``["relu"]``), or a bare word as a string (``dataflow=os``).
    Whether the field exists is :meth:`AcceleratorConfig.from_dict`'s check. Raises
    :class:`ConfigError` when ``text`` is not of that form."""
    name, equals, value = text.partition("=")
    name, value = name.strip(), value.strip()
    if not equals or not name:
        raise ConfigError(f"{flag} expects field=value, not {text!r}")
    try:
        return name, tomllib.loads(f"value = {value}")["value"]
    except tomllib.TOMLDecodeError:
        if _BARE_WORD.fullmatch(value):
            return name, value
        raise ConfigError(f"{flag} {name}: {value!r} is not a TOML value "
                          f"(write e.g. 16, true, \"os\" or [\"relu\"])") from None


def parse_size(text: str, *, flag: str = "--size") -> tuple[int, int]:
    """``(rows, cols)`` from a command line's ``RxC`` array size (given after ``flag``), such as
    ``8x8`` or ``16X4``. Whether the size is a legal config is :class:`AcceleratorConfig`'s check.
    Raises :class:`ConfigError` when ``text`` is not of that form."""
    rows, sep, cols = text.strip().lower().partition("x")
    if not (sep and rows.isdigit() and cols.isdigit()):
        raise ConfigError(f"{flag} takes an array size RxC (rows x cols, e.g. 8x8), not {text!r}")
    return int(rows), int(cols)


def field_docs() -> dict[str, str]:
    return dict(_DOC)


def quarter_square_span(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    """Lowest and highest value of ``a + b`` and ``a - b`` over operands in the inclusive ranges
    ``a`` and ``b``: the indices of a block-RAM multiplier's quarter-square table
    (``a * b = floor((a + b)**2 / 4) - floor((a - b)**2 / 4)``)."""
    return min(a[0] + b[0], a[0] - b[1]), max(a[1] + b[1], a[1] - b[0])


def int_range(bits: int, signed: bool) -> tuple[int, int]:
    """Lowest and highest value of a ``bits``-wide integer, two's complement if ``signed``."""
    if signed:
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")
