"""``control = "firmware"`` (hw/fw_engine.py, hw/firmware_src/engine.c) on the RTL in Verilator:
the RV32 core's firmware executes the programs of the golden tests and the failing programs of
tests/sim/test_rtl.py as the hardware control does.

* the programs of the catalogue (sim/catalogue.py, on a 4x4 array with a 128-byte scratchpad as
  its "ws4" configuration, so that every dimension is tiled) of at most ``FW_CYCLE_LIMIT`` golden
  cycles (all of them with SYSTOLIC_RTL_LONG=1) and a few more (output-stationary, raw, extremes,
  an average pool padded by 2) leave the golden model's DRAM image, byte for byte, with the golden
  model's ``macs``, ``instructions`` and DRAM traffic (``dram_read_bytes``, ``dram_write_bytes``), for
  int8, unsigned int8, int16 and a 16-bit accumulator;
* illegal words, illegal flags, illegal COMPUTEs, a missing FINISH and AXI error responses on a
  fetch, a LOAD, a STORE and a residual read stop it with the error code and instruction of the
  hardware control; a token never sent hangs it (the watchdog);
* the program after a failing one runs clean (the core restarts its firmware at every start);
* the digits CNN compiled for the iCEBreaker preset (firmware control) runs bit-exact through
  the runtime's rtl backend.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from systolic.hw.config import AcceleratorConfig
from systolic.hw.fw_engine import ESTIMATE_FACTOR
from systolic.hw.isa import Program
from systolic.sim.catalogue import CATALOGUE, GEMM_INT32_WRAP, CaseSpec
from systolic.sim.golden import run_golden
from systolic.sim.programs import conv_case, gemm_case, pool_case, residual_case
from systolic.sim.rtl import RTLDeviceError, RTLJob, RTLRunner, RTLRunResult, RTLTimeoutError

from ..illegal_computes import illegal_computes, illegal_program
from .test_rtl import failing_batch

#: The failing programs' fields need 8 columns; the firmware keeps queues of up to 4
#: instructions and a table of up to 1024 bytes.
FW8 = AcceleratorConfig(dma_data_bits=32, control="firmware", load_queue_depth=4, compute_queue_depth=4,
                        store_queue_depth=4, token_depth=4, requant_table_rows=8)
FW4 = AcceleratorConfig(rows=4, cols=4, scratchpad_bytes=4096, accumulator_bytes=2048, dma_data_bits=32,
                        control="firmware", load_queue_depth=2, compute_queue_depth=2, store_queue_depth=1,
                        token_depth=2, requant_table_rows=8)

#: The catalogue's configuration: "ws4" of sim/catalogue.py under firmware control.
FWCAT = AcceleratorConfig(rows=4, cols=4, scratchpad_bytes=128, accumulator_bytes=2048, dma_data_bits=32,
                          control="firmware", load_queue_depth=2, compute_queue_depth=4, store_queue_depth=2,
                          token_depth=4, requant_table_rows=16)
#: every entry but the 131073-deep GEMM (a million hardware cycles, a thousand times that here)
SPECS = [spec for spec in CATALOGUE if spec != GEMM_INT32_WRAP]
LONG = os.environ.get("SYSTOLIC_RTL_LONG", "0") not in ("", "0")
#: Entries of more golden-model cycles than this on FWCAT run only with SYSTOLIC_RTL_LONG=1: the
#: firmware takes about a thousand cycles per golden cycle, and the 12 entries above it are 73% of
#: the catalogue's cycles (the two longest alone 43%). The 44 below it hold every kind, activation,
#: layout and option of the catalogue but two, which FW4's cases hold (extreme operands, an average
#: pool padded by 2): test_the_catalogue_entries_run_under_firmware_control_hold_every_feature.
#: The hardware control runs every entry in test_rtl_programs.py.
FW_CYCLE_LIMIT = 2000
_CYCLES = {}


def _golden_cycles(spec: CaseSpec) -> int:
    if spec not in _CYCLES:
        case = spec.build(FWCAT)
        _CYCLES[spec] = run_golden(FWCAT, case.program, case.dram).cycles
    return _CYCLES[spec]


SLOW = {spec for spec in SPECS if _golden_cycles(spec) > FW_CYCLE_LIMIT}
RUN_SPECS = [spec for spec in SPECS if LONG or spec not in SLOW]

CASES = {
    "gemm": lambda c: gemm_case(c, 9, 7, 6, seed=1, act="relu"),
    "gemm-extremes": lambda c: gemm_case(c, 5, 9, 4, extremes=True),
    "conv": lambda c: conv_case(c, 5, 6, 3, 5, 3, 3, stride=2, pad=1, act="relu", seed=4),
    "residual": lambda c: residual_case(c, 6, 5, 4, seed=7),
    "avg-pool": lambda c: pool_case(c, 5, 5, 4, pool="avg", kernel=3, stride=2, pad=1, seed=6),
    "avg-pool-pad2": lambda c: pool_case(c, 4, 3, 3, pool="avg", kernel=3, stride=1, pad=2, seed=31),
    "max-pool": lambda c: pool_case(c, 6, 5, 3, pool="max", kernel=2, stride=2, seed=2),
    "raw": lambda c: gemm_case(c, 6, 5, 4, seed=3, requant=False),
    "os-nchw": lambda c: conv_case(c.replace(dataflow="os"), 5, 5, 2, 3, 3, 3, pad=1, layout="nchw", seed=5),
}


@pytest.fixture(scope="module")
def fw4_runs() -> dict[str, tuple]:
    """Each case on FW4 (the OS case on its OS twin): (case, golden, outcome)."""
    runs = {}
    by_config: dict[AcceleratorConfig, list[str]] = {}
    built = {}
    for name, build in CASES.items():
        case = build(FW4)
        built[name] = (case, run_golden(case.config, case.program, case.dram))
        by_config.setdefault(case.config, []).append(name)
    for config, names in by_config.items():
        jobs = [RTLJob(built[n][0].program, built[n][0].dram, built[n][0].program_addr,
                       max_cycles=ESTIMATE_FACTOR * built[n][1].cycles + 100_000) for n in names]
        for name, outcome in zip(names, RTLRunner(config, seed=3).run_many(jobs), strict=True):
            runs[name] = (*built[name], outcome)
    return runs


@pytest.mark.parametrize("name", CASES)
def test_programs_match_the_golden_model(fw4_runs, name: str) -> None:
    case, golden, result = fw4_runs[name]
    assert isinstance(result, RTLRunResult), result
    case.check(result.dram)
    np.testing.assert_array_equal(result.dram, golden.dram, err_msg=name)
    assert (result.macs, result.instructions) == (golden.macs, golden.instructions)
    assert (result.dram_read_bytes, result.dram_write_bytes) == (golden.dram_read_bytes,
                                                                golden.dram_write_bytes)
    assert result.counters["load_busy"] > 0 and result.counters["store_busy"] > 0


#: Other element types under firmware control: unsigned int8, int16, and a 16-bit unsigned
#: accumulator (no residual add: it needs a signed accumulator's range here).
ELEMENT_TYPES = {
    "unsigned": FW4.replace(input_signed=False, weight_signed=False),
    "int16": FW4.replace(input_bits=16, weight_bits=16),
    "acc16": FW4.replace(accumulator_bytes=1024, acc_bits=16, input_signed=False, weight_signed=False,
                         acc_signed=False, sfu_residual=False),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", ELEMENT_TYPES)
def test_other_element_types_match_the_golden_model(name: str) -> None:
    config = ELEMENT_TYPES[name]
    cases = [gemm_case(config, 9, 7, 6, seed=1, act="relu"),
             gemm_case(config, 5, 6, 4, seed=3, requant=False),
             conv_case(config, 5, 6, 3, 5, 3, 3, stride=2, pad=1, act="relu", seed=4),
             pool_case(config, 5, 5, 4, pool="avg", kernel=3, stride=2, pad=1, seed=6)]
    if config.sfu_residual:
        cases.append(residual_case(config, 6, 5, 4, seed=7))
    goldens = [run_golden(config, case.program, case.dram) for case in cases]
    outcomes = RTLRunner(config).run_many([
        RTLJob(case.program, case.dram, case.program_addr, ESTIMATE_FACTOR * golden.cycles + 100_000)
        for case, golden in zip(cases, goldens, strict=True)])
    for case, golden, result in zip(cases, goldens, outcomes, strict=True):
        assert isinstance(result, RTLRunResult), (case.name, result)
        case.check(result.dram)
        np.testing.assert_array_equal(result.dram, golden.dram, err_msg=case.name)
        assert (result.dram_read_bytes, result.dram_write_bytes) == (golden.dram_read_bytes,
                                                                    golden.dram_write_bytes), case.name


@pytest.fixture(scope="module")
def catalogue_runs() -> dict[CaseSpec, tuple]:
    """The catalogue on FWCAT, one batch: spec -> (case, golden, outcome). The firmware takes
    about a thousand times the golden model's estimate (up to 3000): the watchdog allows
    ESTIMATE_FACTOR times it."""
    built = {}
    for spec in RUN_SPECS:
        case = spec.build(FWCAT)
        built[spec] = (case, run_golden(FWCAT, case.program, case.dram))
    jobs = [RTLJob(case.program, case.dram, case.program_addr,
                   max_cycles=ESTIMATE_FACTOR * golden.cycles + 100_000) for case, golden in built.values()]
    outcomes = RTLRunner(FWCAT, seed=1).run_many(jobs)
    return {spec: (*built[spec], outcome) for spec, outcome in zip(RUN_SPECS, outcomes, strict=True)}


@pytest.mark.parametrize("spec", [
    pytest.param(spec, marks=pytest.mark.skip(reason=f"over {FW_CYCLE_LIMIT} golden cycles, long under "
                                              "firmware control: set SYSTOLIC_RTL_LONG=1")
                 if spec not in RUN_SPECS else ())
    for spec in SPECS], ids=[spec.id for spec in SPECS])
def test_the_catalogue_matches_the_golden_model(catalogue_runs, spec: CaseSpec) -> None:
    case, golden, result = catalogue_runs[spec]
    assert isinstance(result, RTLRunResult), result
    case.check(result.dram)
    np.testing.assert_array_equal(result.dram, golden.dram, err_msg=spec.id)
    assert (result.macs, result.instructions) == (golden.macs, golden.instructions)
    assert (result.dram_read_bytes, result.dram_write_bytes) == (golden.dram_read_bytes,
                                                                golden.dram_write_bytes)


def _features(spec: CaseSpec) -> set[str]:
    """The kind and the options an entry's id names (``conv``, ``act=clip``, ``pad=2``, ...)."""
    kind, *options = spec.id.split("-")
    return {kind} | {option for option in options if "=" in option and not option.startswith("seed=")}


def test_the_catalogue_entries_run_under_firmware_control_hold_every_feature() -> None:
    """What the entries left to SYSTOLIC_RTL_LONG have that the others lack, FW4's cases have."""
    left_out = set().union(*map(_features, SPECS)) - set().union(*map(_features, RUN_SPECS))
    assert left_out <= {"extremes=True", "pad=2"}, left_out
    assert {"gemm-extremes", "avg-pool-pad2"} <= set(CASES)


@pytest.fixture(scope="module")
def failing_runs() -> dict[str, object]:
    return failing_batch(FW8, 300_000, 3_000_000)


# name -> (error code, error pc) as the hardware control reports them (tests/sim/test_rtl.py)
ERRORS = {
    "opcode": (1, 1), "reserved": (1, 1), "flags": (4, 0), "no finish": (5, 1),
    "load slverr": (2, 1), "store decerr": (3, 2), "residual slverr": (2, 3), "fetch slverr": (2, 2),
    "compute rows": (1, 1), "compute reuse": (1, 0),
}


@pytest.mark.parametrize("name", ERRORS)
def test_failing_programs_stop_with_the_hardware_controls_error(failing_runs, name: str) -> None:
    code, pc = ERRORS[name]
    error = failing_runs[name]
    assert isinstance(error, RTLDeviceError), error
    assert str(error).startswith(f"the accelerator stopped with error {code} ("), str(error)
    assert f" at instruction {pc} (" in str(error), str(error)


@pytest.fixture(scope="module")
def illegal_compute_runs() -> dict[str, tuple[str, object]]:
    """Every COMPUTE of tests/illegal_computes.py on FW4 and its OS twin: (field, outcome)."""
    runs = {}
    for config in (FW4, FW4.replace(dataflow="os")):
        cases = illegal_computes(config)
        jobs = []
        for _, bad, _ in cases:
            program = Program(tuple(illegal_program(config, bad)), config.hash)
            jobs.append(RTLJob(program, np.zeros(4096, np.uint8), 0, max_cycles=300_000))
        for (name, _, field), outcome in zip(cases, RTLRunner(config, seed=3).run_many(jobs), strict=True):
            runs[f"{config.dataflow}-{name}"] = (field, outcome)
    return runs


@pytest.mark.parametrize("name", [f"{flow}-{name}" for flow in ("ws", "os")
                                  for name, _, _ in illegal_computes(FW4.replace(dataflow=flow))])
def test_an_illegal_compute_stops_with_error_1(illegal_compute_runs, name: str) -> None:
    """The firmware checks each COMPUTE as the hardware control's ComputeCheck does: error 1 at
    its instruction, after the legal COMPUTE before it."""
    field, error = illegal_compute_runs[name]
    assert isinstance(error, RTLDeviceError), error
    assert str(error).startswith("the accelerator stopped with error 1 ("), str(error)
    assert " at instruction 1 (instruction 1: COMPUTE)" in str(error), str(error)


@pytest.mark.parametrize("name", ["token", "full queue"])
def test_a_token_never_sent_hangs(failing_runs, name: str) -> None:
    error = failing_runs[name]
    assert isinstance(error, RTLTimeoutError), error
    assert "the compute queue waits for a token" in str(error), str(error)


def test_the_good_program_after_the_failures(failing_runs) -> None:
    result, case, golden = failing_runs["good"]
    assert isinstance(result, RTLRunResult), result
    case.check(result.dram)
    np.testing.assert_array_equal(result.dram, golden.dram)
    assert (result.macs, result.instructions) == (golden.macs, golden.instructions)


@pytest.mark.slow
def test_the_digits_model_on_the_icebreaker_preset_under_firmware_control() -> None:
    """The committed int8 digits CNN on the iCEBreaker preset (firmware control, 64 KiB of DRAM,
    too small for its programs side by side: they run one at a time from one address), through
    the runtime's rtl backend: the golden model's outputs and counts. It takes about 130 times the
    estimate (ten million cycles), past the watchdog the estimate alone would give."""
    from pathlib import Path

    import systolic.compiler
    from systolic.boards.boards import load_preset
    from systolic.compiler import compile_model, run_model

    model = Path(systolic.compiler.__file__).parents[1] / "examples" / "digits_cnn_int8.onnx"
    config = load_preset("icebreaker")
    assert config.control == "firmware"
    compiled = compile_model(model, config=config)
    assert compiled.overlay and len(compiled.segments) >= 2
    image = np.random.default_rng(3).uniform(0, 1, (1, 1, 8, 8)).astype(np.float32)
    golden = run_model(compiled, {"input": image}, progress=False)
    rtl = run_model(compiled, {"input": image}, backend="rtl", progress=False)
    np.testing.assert_array_equal(rtl.outputs["logits"], golden.outputs["logits"])
    for key in ("macs", "dram_read_bytes", "dram_write_bytes"):
        assert rtl.report[key] == golden.report[key], key
    assert rtl.report["cycles"] > 50 * golden.report["cycles"]


def test_a_load_past_the_table_leaves_the_firmware_intact() -> None:
    """A LOAD into table rows past the table (an error the golden model reports; the hardware
    control wraps the row) must not overwrite the firmware's own data, which lies after its table
    in the core's RAM: the GEMM after it still runs as the golden model has it without that LOAD."""
    from systolic.hw.isa import Instruction, Program

    case = gemm_case(FW4, 9, 7, 6, seed=1, act="relu")
    bad = Instruction("LOAD", dst="table", dst_addr=200, dram_addr=0, pitch_c=12, rows_outer=1,
                      rows_inner=4, inner_dy=1, segs=1, seg_len=FW4.cols, elem_dc=1)
    with pytest.raises(ValueError, match="past its end"):
        run_golden(FW4, Program((bad, *case.program.instructions), FW4.hash), case.dram)
    program = Program((bad, *case.program.instructions), FW4.hash)
    golden = run_golden(FW4, case.program, case.dram)
    result = RTLRunner(FW4, seed=3).run(program, case.dram, prog_addr=case.program_addr,
                                        max_cycles=ESTIMATE_FACTOR * golden.cycles + 100_000)
    case.check(result.dram)
    words = len(program.words())
    outside = np.ones(result.dram.size, bool)
    outside[case.program_addr:case.program_addr + words] = False     # the longer program's words
    np.testing.assert_array_equal(result.dram[outside], np.asarray(golden.dram)[outside])
