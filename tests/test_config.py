"""AcceleratorConfig: defaults, every validation rule, TOML files, hash, derived quantities."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path

import pytest
from systolic.hw.config import (
    ACTIVATIONS,
    HASHED_UNLESS_DEFAULT,
    POOLINGS,
    SYNTHESIS_ONLY,
    AcceleratorConfig,
    ConfigError,
    field_docs,
    parse_assignment,
    parse_size,
)


def _exact(message: str) -> str:
    """An anchored regex matching exactly ``message``."""
    return "^" + re.escape(message) + "$"


# -- defaults ----------------------------------------------------------------------------------------

def test_defaults() -> None:
    c = AcceleratorConfig()
    assert (c.rows, c.cols) == (8, 8)
    assert (c.input_bits, c.weight_bits, c.acc_bits) == (8, 8, 32)
    assert c.input_signed and c.weight_signed and c.acc_signed
    assert c.dataflow == "ws"
    assert (c.scratchpad_bytes, c.scratchpad_banks, c.accumulator_bytes) == (65536, 2, 16384)
    assert c.requant_table_rows == 64
    assert (c.dma_data_bits, c.dma_max_burst, c.dma_outstanding, c.dram_latency) == (64, 16, 16, 16)
    assert (c.load_queue_depth, c.compute_queue_depth, c.store_queue_depth, c.token_depth) == (8, 8, 8, 8)
    assert c.sfu_activations == ("relu", "relu6", "clip")
    assert c.sfu_pooling == ("max", "avg")
    assert c.sfu_residual is True
    assert c.array_lut_multipliers == 0
    assert c.counter_bits == 64
    assert c.clock_mhz == 100.0 and isinstance(c.clock_mhz, float)


def test_every_field_is_documented() -> None:
    assert set(field_docs()) == {f.name for f in dataclasses.fields(AcceleratorConfig)}
    assert all(doc.strip() for doc in field_docs().values())


def test_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        AcceleratorConfig().rows = 16  # type: ignore[misc]


# -- validation: one case per rule -------------------------------------------------------------------

RULES = [
    # types
    ({"rows": "8"}, "rows must be an integer, not '8'"),
    ({"rows": True}, "rows must be an integer, not True"),
    ({"scratchpad_bytes": 65536.0}, "scratchpad_bytes must be an integer, not 65536.0"),
    ({"input_signed": 1}, "input_signed must be true or false, not 1"),
    ({"sfu_residual": "yes"}, "sfu_residual must be true or false, not 'yes'"),
    ({"clock_mhz": "100"}, "clock_mhz must be a number, not '100'"),
    ({"clock_mhz": True}, "clock_mhz must be a number, not True"),
    ({"dataflow": 1}, "dataflow must be a string, not 1"),
    ({"sfu_activations": "relu"}, "sfu_activations must be a list of strings, not 'relu'"),
    ({"sfu_pooling": None}, "sfu_pooling must be a list of strings, not None"),
    # array shape
    ({"rows": 3}, "rows must be a power of two between 2 and 64, not 3"),
    ({"rows": 1}, "rows must be a power of two between 2 and 64, not 1"),
    ({"rows": 128}, "rows must be a power of two between 2 and 64, not 128"),
    ({"cols": 0}, "cols must be a power of two between 2 and 64, not 0"),
    ({"cols": -8}, "cols must be a power of two between 2 and 64, not -8"),
    # element types
    ({"input_bits": 4}, "input_bits must be 8 or 16, not 4"),
    ({"weight_bits": 12}, "weight_bits must be 8 or 16, not 12"),
    ({"acc_bits": 24}, "acc_bits must be 16 or 32, not 24"),
    ({"acc_bits": 64}, "acc_bits must be 16 or 32, not 64"),
    ({"input_bits": 16, "acc_bits": 16},
     "acc_bits must be at least input_bits + weight_bits (24) so that one product fits, not 16"),
    ({"acc_signed": False},
     "acc_signed must be true when input_signed or weight_signed is true, not false"),
    ({"input_signed": False, "acc_signed": False},
     "acc_signed must be true when input_signed or weight_signed is true, not false"),
    ({"dataflow": "rs"}, "dataflow must be one of 'ws', 'os', not 'rs'"),
    ({"dataflow": "WS"}, "dataflow must be one of 'ws', 'os', not 'WS'"),
    # scratchpad
    ({"scratchpad_banks": 3}, "scratchpad_banks must be a power of two between 2 and 64, not 3"),
    ({"scratchpad_banks": 1}, "scratchpad_banks must be a power of two between 2 and 64, not 1"),
    ({"scratchpad_banks": 128}, "scratchpad_banks must be a power of two between 2 and 64, not 128"),
    ({"scratchpad_bytes": 65000}, "scratchpad_bytes must be a power of two, not 65000"),
    ({"scratchpad_bytes": 0}, "scratchpad_bytes must be a power of two, not 0"),
    ({"scratchpad_bytes": 64},
     "scratchpad_bytes must hold one tile in each of 2 banks (8 rows of 8 bytes per bank, 128 bytes), "
     "not 64"),
    ({"rows": 16, "input_bits": 16, "scratchpad_banks": 4, "scratchpad_bytes": 1024},
     "scratchpad_bytes must hold one tile in each of 4 banks (16 rows of 32 bytes per bank, 2048 bytes), "
     "not 1024"),
    ({"rows": 2, "cols": 2, "scratchpad_bytes": 1 << 18},
     "scratchpad_bytes must give at most 65536 rows of 2 bytes (the ISA's 16-bit row address), "
     "not 262144"),
    # accumulator
    ({"accumulator_bytes": 10000}, "accumulator_bytes must be a power of two, not 10000"),
    ({"accumulator_bytes": 256},
     "accumulator_bytes must hold two output tiles (16 rows of 32 bytes, 512 bytes), not 256"),
    ({"rows": 2, "cols": 2, "input_bits": 8, "acc_bits": 16, "accumulator_bytes": 1 << 19},
     "accumulator_bytes must give at most 65536 rows of 4 bytes (the ISA's 16-bit row address), "
     "not 524288"),
    ({"requant_table_rows": 3}, "requant_table_rows must be a power of two between 1 and 4096, not 3"),
    ({"requant_table_rows": 0}, "requant_table_rows must be a power of two between 1 and 4096, not 0"),
    ({"requant_table_rows": 8192},
     "requant_table_rows must be a power of two between 1 and 4096, not 8192"),
    # bus
    ({"dram_bytes": 3 << 20}, "dram_bytes must be a power of two between 4096 and 2**32 (the 32-bit "
                              "DRAM address), not 3145728"),
    ({"dram_bytes": 2048}, "dram_bytes must be a power of two between 4096 and 2**32 (the 32-bit "
                           "DRAM address), not 2048"),
    ({"dma_data_bits": 16}, "dma_data_bits must be 32, 64 or 128, not 16"),
    ({"dma_data_bits": 256}, "dma_data_bits must be 32, 64 or 128, not 256"),
    ({"dma_max_burst": 3}, "dma_max_burst must be a power of two between 1 and 256 beats, not 3"),
    ({"dma_max_burst": 512}, "dma_max_burst must be a power of two between 1 and 256 beats, not 512"),
    ({"dma_data_bits": 32, "dma_max_burst": 8},
     "dma_max_burst times the bus width (4 bytes) must cover one 64-byte instruction word, not 8 beats "
     "(32 bytes)"),
    ({"dma_max_burst": 4},
     "dma_max_burst times the bus width (8 bytes) must cover one 64-byte instruction word, not 4 beats "
     "(32 bytes)"),
    ({"dma_outstanding": 0}, "dma_outstanding must be between 1 and 16, not 0"),
    ({"dma_outstanding": 17}, "dma_outstanding must be between 1 and 16, not 17"),
    ({"fifo_block_ram_bits": -1},
     "fifo_block_ram_bits must be 0 (yosys chooses) or between 1 and 2**20 bits, not -1"),
    ({"fifo_block_ram_bits": (1 << 20) + 1},
     "fifo_block_ram_bits must be 0 (yosys chooses) or between 1 and 2**20 bits, not 1048577"),
    ({"dram_latency": 0}, "dram_latency must be between 1 and 1024 cycles, not 0"),
    ({"dram_latency": 1025}, "dram_latency must be between 1 and 1024 cycles, not 1025"),
    ({"gather_engine": "fast"}, "gather_engine must be one of 'pipelined', 'serial', not 'fast'"),
    ({"gather_engine": 1}, "gather_engine must be a string, not 1"),
    ({"scatter_engine": "burst"}, "scatter_engine must be one of 'pipelined', 'serial', not 'burst'"),
    ({"sfu_engine": "lut"}, "sfu_engine must be one of 'pipelined', 'serial', not 'lut'"),
    # queues
    ({"load_queue_depth": 3}, "load_queue_depth must be a power of two between 1 and 256, not 3"),
    ({"compute_queue_depth": 0}, "compute_queue_depth must be a power of two between 1 and 256, not 0"),
    ({"store_queue_depth": 512}, "store_queue_depth must be a power of two between 1 and 256, not 512"),
    ({"token_depth": 6}, "token_depth must be a power of two between 1 and 256, not 6"),
    # SFU features
    ({"sfu_activations": ["relu", "gelu"]},
     "sfu_activations entries must be among relu, relu6, clip, not 'gelu'"),
    ({"sfu_activations": ["relu", "relu"]}, "sfu_activations must not repeat an entry, not ['relu', 'relu']"),
    ({"sfu_pooling": ["min"]}, "sfu_pooling entries must be among max, avg, not 'min'"),
    ({"sfu_pooling": ["avg", "avg"]}, "sfu_pooling must not repeat an entry, not ['avg', 'avg']"),
    # MAC array multipliers in logic
    ({"array_lut_multipliers": -1}, "array_lut_multipliers must be between 0 and rows * cols (64), not -1"),
    ({"rows": 2, "cols": 4, "array_lut_multipliers": 9},
     "array_lut_multipliers must be between 0 and rows * cols (8), not 9"),
    # ... and in block RAM
    ({"array_bram_multipliers": -1},
     "array_bram_multipliers must be between 0 and rows * cols - array_lut_multipliers (64), not -1"),
    ({"rows": 2, "cols": 4, "array_lut_multipliers": 3, "array_bram_multipliers": 6},
     "array_bram_multipliers must be between 0 and rows * cols - array_lut_multipliers (5), not 6"),
    ({"input_bits": 16, "acc_bits": 32, "array_bram_multipliers": 1},
     "array_bram_multipliers needs a quarter-square table of at most 1024 entries (8-bit inputs and "
     "weights), but input_bits 16 and weight_bits 8 give sums and differences of 65792 values; use 0 "
     "or 8-bit elements"),
    # performance counters
    ({"counter_bits": 15}, "counter_bits must be between 16 and 64, not 15"),
    ({"counter_bits": 65}, "counter_bits must be between 16 and 64, not 65"),
    # clock
    ({"clock_mhz": 0.5}, "clock_mhz must be between 1 and 1000, not 0.5"),
    ({"clock_mhz": 1001}, "clock_mhz must be between 1 and 1000, not 1001.0"),
    ({"clock_mhz": float("nan")}, "clock_mhz must be between 1 and 1000, not nan"),
]


@pytest.mark.parametrize(("changes", "message"), RULES, ids=[m.split(" must")[0] for _, m in RULES])
def test_validation_rule(changes: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=_exact(message)):
        AcceleratorConfig(**changes)


def test_config_error_is_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize("changes", [
    {"rows": 2, "cols": 2},
    {"rows": 64, "cols": 64, "accumulator_bytes": 1 << 15},
    {"rows": 64, "cols": 2, "input_bits": 16, "weight_bits": 16},
    {"input_signed": False, "weight_signed": False, "acc_signed": False, "acc_bits": 16},
    {"input_bits": 16, "acc_bits": 32},
    {"dma_data_bits": 128, "dma_max_burst": 256},   # exactly 4096 bytes per burst
    {"dma_data_bits": 32, "dma_max_burst": 16},     # exactly one instruction word per burst
    {"dataflow": "os", "sfu_activations": [], "sfu_pooling": [], "sfu_residual": False},
    {"requant_table_rows": 1, "load_queue_depth": 1, "token_depth": 256},
    {"clock_mhz": 1, "dram_latency": 1024, "dma_outstanding": 16},
    {"counter_bits": 16}, {"counter_bits": 33},
    {"scratchpad_bytes": 128, "accumulator_bytes": 512},   # the smallest that hold the tiles
])
def test_valid_extremes(changes: dict) -> None:
    config = AcceleratorConfig(**changes)
    assert config == AcceleratorConfig.from_dict(config.to_dict())


def test_feature_lists_are_canonical() -> None:
    a = AcceleratorConfig(sfu_activations=["clip", "relu"], sfu_pooling=("avg", "max"))
    b = AcceleratorConfig(sfu_activations=("relu", "clip"), sfu_pooling=["max", "avg"])
    assert a.sfu_activations == ("relu", "clip") and a.sfu_pooling == ("max", "avg")
    assert a == b and a.hash == b.hash


def test_replace_validates_and_names_unknown_fields() -> None:
    config = AcceleratorConfig().replace(rows=16)
    assert config.rows == 16 and config.cols == 8
    with pytest.raises(ConfigError, match=_exact("rows must be a power of two between 2 and 64, not 5")):
        AcceleratorConfig().replace(rows=5)
    with pytest.raises(ConfigError, match=r"^unknown field 'row'; known fields are acc_bits, "):
        AcceleratorConfig().replace(row=16)


def test_from_dict_unknown_field() -> None:
    with pytest.raises(ConfigError, match=r"^cfg: unknown field 'colums'; known fields are acc_bits, "):
        AcceleratorConfig.from_dict({"rows": 8, "colums": 8}, source="cfg")


# -- TOML files ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("rows=16", ("rows", 16)),
    (" dataflow = os ", ("dataflow", "os")),
    ('dataflow="ws"', ("dataflow", "ws")),
    ("sfu_residual=false", ("sfu_residual", False)),
    ('sfu_pooling=["max"]', ("sfu_pooling", ["max"])),
    ("sfu_pooling=[]", ("sfu_pooling", [])),
    ("clock_mhz=62.5", ("clock_mhz", 62.5)),
])
def test_parse_assignment(text: str, expected: tuple) -> None:
    assert parse_assignment(text) == expected
    name, value = parse_assignment(text)
    AcceleratorConfig.from_dict({name: value})          # each is a valid field value


@pytest.mark.parametrize(("text", "message"), [
    ("rows", "--set expects field=value, not 'rows'"),
    ("=16", "--set expects field=value, not '=16'"),
    ("rows=[1,", "--set rows: '[1,' is not a TOML value"),
    ("dataflow=o s", "--set dataflow: 'o s' is not a TOML value"),
])
def test_parse_assignment_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_assignment(text)
    with pytest.raises(ConfigError, match=re.escape(message.replace("--set", "--option"))):
        parse_assignment(text, flag="--option")


def test_parse_size() -> None:
    assert parse_size("8x8") == (8, 8)
    assert parse_size(" 16X4 ") == (16, 4)
    for text in ("8", "8x", "x8", "8by8", "8x8x8", "-4x4", ""):
        with pytest.raises(ConfigError, match=_exact(
                f"--sizes takes an array size RxC (rows x cols, e.g. 8x8), not {text!r}")):
            parse_size(text, flag="--sizes")


def test_toml_round_trip(tmp_path) -> None:
    configs = [
        AcceleratorConfig(),
        AcceleratorConfig(rows=16, cols=4, input_bits=16, dataflow="os", clock_mhz=48.5,
                          sfu_activations=["relu"], sfu_pooling=[], sfu_residual=False),
        AcceleratorConfig(input_signed=False, weight_signed=False, acc_signed=False, acc_bits=16),
    ]
    for i, config in enumerate(configs):
        path = tmp_path / f"c{i}.toml"
        config.save(path)
        text = path.read_text()
        assert text.startswith(f"# systolic accelerator configuration\n# hash {config.hash_hex}\n")
        loaded = AcceleratorConfig.from_toml(path)
        assert loaded == config and loaded.hash == config.hash
        assert loaded.to_toml() == text


def test_toml_partial_file_uses_defaults(tmp_path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('rows = 16\ndataflow = "os"\nclock_mhz = 200\n')
    assert AcceleratorConfig.from_toml(path) == AcceleratorConfig(rows=16, dataflow="os", clock_mhz=200.0)


def test_toml_unknown_key(tmp_path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("rows = 8\nbanks = 2\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: unknown field 'banks'; known fields "):
        AcceleratorConfig.from_toml(path)


def test_toml_tables_rejected(tmp_path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("rows = 8\n[array]\ncols = 8\n")
    with pytest.raises(ConfigError, match=_exact(f"{path}: tables are not used in a config file; "
                                                 f"write fields at top level, not [array]")):
        AcceleratorConfig.from_toml(path)
    path.write_text("array.cols = 8\n")   # a dotted key is a table too
    with pytest.raises(ConfigError, match=_exact(f"{path}: tables are not used in a config file; "
                                                 f"write fields at top level, not [array]")):
        AcceleratorConfig.from_toml(path)


def test_toml_wrong_type_names_file_and_field(tmp_path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('rows = "8"\n')
    with pytest.raises(ConfigError, match=_exact(f"{path}: rows must be an integer, not '8'")):
        AcceleratorConfig.from_toml(path)
    path.write_text("rows = 8.0\n")
    with pytest.raises(ConfigError, match=_exact(f"{path}: rows must be an integer, not 8.0")):
        AcceleratorConfig.from_toml(path)
    path.write_text('sfu_pooling = "max"\n')
    message = f"{path}: sfu_pooling must be a list of strings, not 'max'"
    with pytest.raises(ConfigError, match=_exact(message)):
        AcceleratorConfig.from_toml(path)
    path.write_text("cols = 12\n")
    with pytest.raises(ConfigError,
                       match=_exact(f"{path}: cols must be a power of two between 2 and 64, not 12")):
        AcceleratorConfig.from_toml(path)


def test_toml_syntax_error(tmp_path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("rows = = 8\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: not valid TOML: .*line 1"):
        AcceleratorConfig.from_toml(path)


def test_toml_not_utf8(tmp_path) -> None:
    path = tmp_path / "c.toml"
    path.write_bytes(b"rows = 8\n\xff\xfe\n")
    with pytest.raises(ConfigError, match=_exact(f"{path}: not valid TOML: byte 9 is not UTF-8 text")):
        AcceleratorConfig.from_toml(path)


def test_toml_missing_file(tmp_path) -> None:
    path = tmp_path / "absent.toml"
    message = f"{path}: cannot read config file: No such file or directory"
    with pytest.raises(ConfigError, match=_exact(message)):
        AcceleratorConfig.from_toml(path)


# -- hash --------------------------------------------------------------------------------------------

def test_hash_is_sha256_of_canonical_json() -> None:
    config = AcceleratorConfig(rows=16, sfu_pooling=["max"])
    fields = {name: value for name, value in config.to_dict().items() if name not in SYNTHESIS_ONLY}
    # a field added later is left out at the value that means the behaviour of before
    assert fields.pop("compute_clock_mhz") == HASHED_UNLESS_DEFAULT["compute_clock_mhz"] == 0.0
    assert fields.pop("requant_load_entries") == HASHED_UNLESS_DEFAULT["requant_load_entries"] == 0
    assert fields.pop("acc_crossing_pieces") == HASHED_UNLESS_DEFAULT["acc_crossing_pieces"] == 1
    with pytest.raises(TypeError):          # read-only: no caller can change which hashes hold
        HASHED_UNLESS_DEFAULT["compute_clock_mhz"] = 1.0  # type: ignore[index]
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).digest()
    # The program header stores the hash as little-endian u64: its bytes are the digest's first 8.
    assert config.hash.to_bytes(8, "little") == digest[:8]
    assert config.hash_hex == f"{config.hash:016x}" and len(config.hash_hex) == 16


def test_hash_includes_a_later_field_once_it_is_set() -> None:
    config = AcceleratorConfig(rows=16, sfu_pooling=["max"], compute_clock_mhz=150.0,
                               requant_load_entries=4)
    fields = {name: value for name, value in config.to_dict().items() if name not in SYNTHESIS_ONLY}
    assert fields.pop("acc_crossing_pieces") == HASHED_UNLESS_DEFAULT["acc_crossing_pieces"]
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    assert config.hash.to_bytes(8, "little") == hashlib.sha256(text.encode()).digest()[:8]
    assert config.hash != AcceleratorConfig(rows=16, sfu_pooling=["max"]).hash
    assert config.hash != AcceleratorConfig(rows=16, sfu_pooling=["max"], compute_clock_mhz=150.0).hash
    assert config.hash != AcceleratorConfig(rows=16, sfu_pooling=["max"], requant_load_entries=4).hash


@pytest.mark.parametrize(("values", "message"), [
    ({"compute_clock_mhz": 24.0}, "compute_clock_mhz must be 0 (one clock) or between clock_mhz / 4 and "
                                  "4 x clock_mhz (25 to 400), not 24.0"),
    ({"compute_clock_mhz": 401.0}, "compute_clock_mhz must be 0 (one clock) or between clock_mhz / 4 and "
                                   "4 x clock_mhz (25 to 400), not 401.0"),
    ({"clock_mhz": 300.0, "compute_clock_mhz": 1001.0},
     "compute_clock_mhz must be 0 (one clock) or between clock_mhz / 4 and 4 x clock_mhz (75 to 1000), "
     "not 1001.0"),
])
def test_compute_clock_range(values, message) -> None:
    with pytest.raises(ConfigError, match=_exact(message)):
        AcceleratorConfig(**values)


@pytest.mark.parametrize(("values", "message"), [
    ({"acc_crossing_pieces": 3, "compute_clock_mhz": 150.0},
     "acc_crossing_pieces must be a power of two between 1 and 16, not 3"),
    ({"acc_crossing_pieces": 32, "compute_clock_mhz": 150.0},
     "acc_crossing_pieces must be a power of two between 1 and 16, not 32"),
    ({"acc_crossing_pieces": 0, "compute_clock_mhz": 150.0},
     "acc_crossing_pieces must be a power of two between 1 and 16, not 0"),
    ({"acc_crossing_pieces": 2},
     "acc_crossing_pieces applies to the clock-domain crossings of a compute_clock_mhz config, so it "
     "must be 1 with one clock, not 2"),
])
def test_acc_crossing_pieces_rules(values, message) -> None:
    with pytest.raises(ConfigError, match=_exact(message)):
        AcceleratorConfig(**values)
    assert AcceleratorConfig(acc_crossing_pieces=16, compute_clock_mhz=150.0).acc_crossing_pieces == 16


def test_compute_clock_needs_hardware_control() -> None:
    with pytest.raises(ConfigError, match=_exact(
            "compute_clock_mhz needs control = 'hardware' (the firmware control drives the compute "
            "core directly), not control = 'firmware'")):
        AcceleratorConfig(rows=2, cols=2, control="firmware", dma_data_bits=32, load_queue_depth=4,
                          compute_queue_depth=4, store_queue_depth=4, token_depth=4,
                          requant_table_rows=16, compute_clock_mhz=50.0)
    config = AcceleratorConfig(clock_mhz=75.0, compute_clock_mhz=100.0)
    assert config.array_clock_mhz == 100.0 and AcceleratorConfig().array_clock_mhz == 100.0


@pytest.mark.parametrize("value", [-1, 3, 16, 6])
def test_requant_load_entries_power_of_two_up_to_cols(value) -> None:
    with pytest.raises(ConfigError, match=_exact(
            f"requant_load_entries must be 0 (whole rows) or a power of two between 1 and cols (8), "
            f"not {value}")):
        AcceleratorConfig(requant_load_entries=value)
    entries = [AcceleratorConfig(requant_load_entries=n).table_load_entries for n in (0, 1, 4, 8)]
    assert entries == [8, 1, 4, 8]


def test_hash_stable_for_equal_configs() -> None:
    assert AcceleratorConfig().hash == AcceleratorConfig().hash
    assert AcceleratorConfig(clock_mhz=100).hash == AcceleratorConfig(clock_mhz=100.0).hash
    assert AcceleratorConfig(rows=16).hash == AcceleratorConfig().replace(rows=16).hash


# A valid value different from the default for every field.
_OTHER_VALUE = {
    "rows": 16, "cols": 4, "input_bits": 16, "input_signed": False, "weight_bits": 16,
    "weight_signed": False, "acc_bits": 16, "acc_signed": False, "dataflow": "os",
    "array_lut_multipliers": 3, "array_bram_multipliers": 2,
    "scratchpad_bytes": 1 << 17, "scratchpad_banks": 4, "accumulator_bytes": 1 << 15,
    "requant_table_rows": 32, "dram_bytes": 1 << 20, "dma_data_bits": 128, "dma_max_burst": 8,
    "dma_outstanding": 2,
    "dram_latency": 40, "gather_engine": "serial", "scatter_engine": "serial",
    "command_registers": False, "fifo_block_ram_bits": 512, "memory_registers": False, "load_queue_depth": 4,
    "compute_queue_depth": 16, "store_queue_depth": 2,
    "token_depth": 4, "sfu_activations": ("relu",), "sfu_pooling": ("avg",), "sfu_residual": False,
    "counter_bits": 32, "clock_mhz": 50.0, "compute_clock_mhz": 150.0, "requant_row_words": 3,
    "requant_load_entries": 2, "acc_crossing_pieces": 4,
    "sfu_row_cycles": 2,
    "sfu_engine": "serial", "control": "firmware",
}
# Changes that need a companion change to stay valid.
_COMPANION = {"acc_signed": {"input_signed": False, "weight_signed": False},
              "requant_row_words": {"sfu_engine": "serial"},
              "acc_crossing_pieces": {"compute_clock_mhz": 150.0},
              "control": {"dma_data_bits": 32, "load_queue_depth": 4, "compute_queue_depth": 4,
                          "store_queue_depth": 4, "requant_table_rows": 8}}


def test_hash_differs_for_every_field() -> None:
    assert set(_OTHER_VALUE) == {f.name for f in dataclasses.fields(AcceleratorConfig)}
    default = AcceleratorConfig()
    hashes = {default.hash}
    for name, value in _OTHER_VALUE.items():
        if name in SYNTHESIS_ONLY:
            continue
        changed = AcceleratorConfig(**{name: value, **_COMPANION.get(name, {})})
        assert changed != default
        assert changed.hash not in hashes, name
        hashes.add(changed.hash)


def test_synthesis_only_fields_leave_the_hash_alone() -> None:
    """A program runs the same on configs that differ only in how yosys maps them; the hash of
    a config is what it was before such a field existed (the 16x16 ULX3S example's, recorded
    with its measurements in docs/boards.md)."""
    assert SYNTHESIS_ONLY == {"fifo_block_ram_bits"}
    default = AcceleratorConfig()
    for name in SYNTHESIS_ONLY:
        changed = default.replace(**{name: _OTHER_VALUE[name]})
        assert changed != default and changed.hash == default.hash
    example = Path(__file__).resolve().parent.parent / "examples" / "ulx3s-85f-16x16.toml"
    # 373a85b8367bbbfa until the example dropped requant_row_words = 4 (the pipelined SFU's table
    # words became its lane groups: the same 4 words a row)
    assert AcceleratorConfig.from_toml(example).hash_hex == "f1700daefbcdfa88"


# -- derived quantities -----------------------------------------------------------------------------

def test_derived_default() -> None:
    c = AcceleratorConfig()
    assert (c.spad_elem_bits, c.spad_elem_bytes, c.input_bytes, c.acc_bytes) == (8, 1, 1, 4)
    assert (c.spad_row_elems, c.spad_row_bits, c.spad_row_bytes) == (8, 64, 8)
    assert (c.spad_rows, c.spad_bank_rows, c.spad_addr_bits) == (8192, 4096, 13)
    assert (c.tile_rows, c.min_scratchpad_bytes) == (8, 128)
    assert (c.acc_row_elems, c.acc_row_bits, c.acc_row_bytes) == (8, 256, 32)
    assert (c.acc_rows, c.acc_addr_bits) == (512, 9)
    assert (c.requant_entry_bytes, c.dma_bytes, c.peak_macs_per_cycle) == (12, 8, 64)
    assert c.input_range == c.weight_range == c.output_range == (-128, 127)
    assert (c.output_bits, c.output_signed) == (8, True)
    assert c.acc_range == (-(2 ** 31), 2 ** 31 - 1)


def test_derived_wide_inputs_non_square() -> None:
    c = AcceleratorConfig(rows=16, cols=4, input_bits=16, scratchpad_bytes=1 << 15, dma_data_bits=32)
    assert (c.spad_elem_bits, c.spad_elem_bytes, c.input_bytes) == (16, 2, 2)
    assert (c.spad_row_elems, c.spad_row_bytes, c.spad_rows, c.spad_bank_rows, c.spad_addr_bits) == \
        (16, 32, 1024, 512, 10)
    assert (c.tile_rows, c.min_scratchpad_bytes) == (16, 1024)
    assert (c.acc_row_elems, c.acc_row_bytes, c.acc_rows, c.acc_addr_bits) == (4, 16, 1024, 10)
    assert c.input_range == c.output_range == (-32768, 32767)
    assert c.weight_range == (-128, 127)
    assert (c.dma_bytes, c.peak_macs_per_cycle) == (4, 64)


def test_derived_unsigned_and_smallest() -> None:
    c = AcceleratorConfig(rows=2, cols=2, input_signed=False, weight_signed=False, acc_signed=False,
                          acc_bits=16, scratchpad_bytes=8, accumulator_bytes=16)
    assert c.input_range == c.weight_range == c.output_range == (0, 255)
    assert c.acc_range == (0, 65535)
    assert (c.spad_row_bytes, c.spad_rows, c.spad_bank_rows, c.spad_addr_bits) == (2, 4, 2, 2)
    assert (c.acc_row_bytes, c.acc_rows, c.acc_addr_bits) == (4, 4, 2)
    assert c.min_scratchpad_bytes == 8


def test_derived_many_banks() -> None:
    c = AcceleratorConfig(rows=32, cols=64, scratchpad_banks=8, scratchpad_bytes=1 << 16,
                          accumulator_bytes=1 << 16)
    assert (c.spad_row_elems, c.spad_row_bytes, c.spad_rows, c.spad_bank_rows) == (64, 64, 1024, 128)
    assert (c.acc_row_bytes, c.acc_rows, c.acc_addr_bits) == (256, 256, 8)


def test_describe_shows_fields_hash_and_derived() -> None:
    c = AcceleratorConfig(rows=16, dataflow="os")
    text = c.describe()
    assert text.splitlines()[0] == f"AcceleratorConfig {c.hash_hex}"
    assert re.search(r"^  rows\s+= 16$", text, re.M)
    assert re.search(r'^  dataflow\s+= "os"$', text, re.M)
    assert re.search(r"^  peak MACs/cycle\s+: 128$", text, re.M)
    assert "derived:" in text


def test_feature_constants() -> None:
    assert ACTIVATIONS == ("relu", "relu6", "clip") and POOLINGS == ("max", "avg")
