"""The firmware controller's build and configuration rules (hw/fw_engine.py); its behaviour on
programs is in tests/sim/test_rtl_firmware.py.

* the packaged firmware image is what its source builds to (so the source is what runs);
* the generated header has every ISA field at the bit position of hw/isa.py;
* the parameter words describe the instance;
* configurations the firmware cannot serve are rejected with the field and the rule.
"""

from __future__ import annotations

import re

import pytest
from systolic.hw.config import AcceleratorConfig, ConfigError
from systolic.hw.fw_engine import (
    PARAMS,
    RAM_BYTES,
    FirmwareController,
    build_engine_firmware,
    engine_header,
    engine_image,
    params,
)
from systolic.hw.isa import LAYOUTS, Opcode

from .test_scratchpad import construct_rejected

FW = dict(dma_data_bits=32, control="firmware", load_queue_depth=2, compute_queue_depth=2,
          store_queue_depth=2, token_depth=2, requant_table_rows=8, rows=4, cols=4)


def test_the_packaged_image_is_built_from_the_source() -> None:
    built = build_engine_firmware()
    assert built == engine_image(), (
        "hw/firmware_src/engine.bin is stale: rebuild it with "
        "python -c 'from systolic.hw.fw_engine import build_engine_firmware as b; "
        "b(\"hw/firmware_src/engine.bin\")'")
    # code and data leave room for the zeroed data, the stack and the parameters
    assert len(built) + 4 * len(PARAMS) < RAM_BYTES - 1024


def test_the_header_has_every_field_of_the_isa() -> None:
    header = engine_header()
    tables = dict(re.findall(r"#define FIELDS_(\w+) \{(.*)\}\n", header))
    for op in Opcode:
        fields = [(f.offset, f.width) for name, f in LAYOUTS[op] if name != "_reserved" and f.offset >= 8]
        got = [tuple(map(int, t.split(",")[:2])) for t in re.findall(r"\{(\d+, \d+, \d)\}", tables[op.name])]
        assert got == (fields or [(0, 0)]), op
        used = max(f.offset + f.width for name, f in LAYOUTS[op] if name != "_reserved")
        assert f"#define USED_BITS_{op.name} {used}\n" in header
    assert "#define LOAD_Y0 11\n" in header and "{172, 16, 1}" in tables["LOAD"]   # signed


def test_parameters_describe_the_instance() -> None:
    config = AcceleratorConfig(**{**FW, "input_signed": False, "sfu_pooling": ("max",)})
    p = params(config)
    assert tuple(p) == PARAMS
    assert (p["cols"], p["spad_shift"], p["acc_shift"], p["input_signed"]) == (4, 2, 2, 0)
    assert (p["out_lo"], p["out_hi"]) == (0, 255)
    assert p["acc_lo"] == (-(1 << 31)) & 0xFFFF_FFFF
    assert p["features"] == 0b101111          # every activation, max pooling, residual


@pytest.mark.parametrize("changes, message", [
    (dict(control="cpu"), r"control must be one of 'hardware', 'firmware', not 'cpu'"),
    (dict(dma_data_bits=64), r"control = 'firmware' needs dma_data_bits = 32 \(the core's word\), not 64"),
    (dict(requant_table_rows=32), r"control = 'firmware' keeps the requantize table in the core's RAM: "
                                  r"requant_table_rows \* cols \* 12 must be at most 1024 bytes, not 1536 "
                                  r"\(32 x 4 x 12\)"),
    (dict(store_queue_depth=8), r"control = 'firmware' keeps queues of at most 4 instructions, so "
                                r"store_queue_depth must be at most 4, not 8"),
    (dict(acc_bits=32, acc_signed=False, input_signed=False, weight_signed=False),
     r"control = 'firmware' computes in 32 bits: a 32-bit accumulator must be signed"),
])
def test_configurations_the_firmware_cannot_serve(changes, message) -> None:
    with pytest.raises(ConfigError, match=f"^{message}$"):
        AcceleratorConfig(**{**FW, **changes})


def test_an_image_too_large_for_the_ram_is_rejected() -> None:
    config = AcceleratorConfig(**FW)
    with pytest.raises(ValueError, match=rf"^the firmware image \({RAM_BYTES} bytes\) leaves no room for "
                                         rf"the parameters in {RAM_BYTES} bytes of RAM$"):
        construct_rejected(lambda: FirmwareController(config, image=bytes(RAM_BYTES)))


def test_a_fault_of_the_core_ends_the_program_with_its_error(tmp_path, monkeypatch) -> None:
    """A firmware that stops the core (here an EBREAK at byte 8) ends the program: STATUS done
    with error 6 and ERROR_PC the core's address of the instruction, not a hang."""
    import numpy as np
    from systolic.hw import fw_engine
    from systolic.hw.csr import CORE_FAULT, ERROR_CODES
    from systolic.hw.firmware import build_firmware
    from systolic.hw.isa import Instruction, Program

    from tests.hw.accel_harness import run_accelerator

    source = tmp_path / "fault.S"
    source.write_text(".option norvc\n.section .text.start\n.globl _start\n_start:\n nop\n nop\n ebreak\n")
    image = build_firmware([source], ram_bytes=1024)
    monkeypatch.setattr(fw_engine, "engine_image", lambda: image)
    config = AcceleratorConfig(**FW)
    program = Program((Instruction("FINISH"),), config.hash)
    dram = np.zeros(4096, np.uint8)
    dram[:64] = np.frombuffer(program.words(), np.uint8)
    result = run_accelerator(config, program, dram, prog_addr=0, max_cycles=200)
    assert result.done and (result.error, result.error_pc) == (CORE_FAULT, 8)
    assert "firmware" in ERROR_CODES[CORE_FAULT]


def _load_firmware_writes(config) -> list[tuple[str, int]]:
    """The CSR writes that load ``config``'s firmware into a "loaded" core RAM."""
    from systolic.hw.fw_engine import firmware_load

    writes = []
    for first, words in firmware_load(config):
        writes.append(("fw_addr", first))
        writes += [("fw_data", word) for word in words]
    return writes + [("ctrl", 4)]


@pytest.mark.slow
def test_a_loaded_core_ram_runs_after_the_host_writes_the_firmware() -> None:
    """ram = "loaded" (as the iCE40 SPRAM, which a bitstream cannot initialize): a start before
    the firmware is there ends at once with error 7 and STATUS bit 2 clear; after the host's
    writes (fw_addr, fw_data, CTRL bit 2) STATUS bit 2 is set and a GEMM runs bit-exact."""
    import numpy as np
    from amaranth.sim import Simulator
    from systolic.hw.csr import NO_FIRMWARE, register_map
    from systolic.hw.top import Accelerator
    from systolic.sim.golden import run_golden
    from systolic.sim.programs import gemm_case

    from tests.hw.accel_harness import axi_view, lite_read, lite_write, start_and_wait
    from tests.hw.axi_model import AXIMemory

    config = AcceleratorConfig(**FW)
    case = gemm_case(config, 2, 3, 2, seed=5)
    golden = run_golden(config, case.program, case.dram)
    dut = Accelerator(config, firmware_ram="loaded")
    reg = {name: info["offset"] for name, info in register_map().items()}
    memory = bytearray(np.asarray(case.dram, np.uint8).tobytes())
    memory[case.program_addr:case.program_addr + len(case.program.words())] = case.program.words()
    axi = AXIMemory(memory, config.dma_bytes)
    seen = {}

    prog = (case.program_addr, len(case.program.instructions))

    async def bench(ctx):
        seen["before"] = await start_and_wait(ctx, dut, *prog, 50)
        for name, value in _load_firmware_writes(config):
            await lite_write(ctx, dut, reg[name], value)
        seen["loaded"], _ = await lite_read(ctx, dut, reg["status"])
        seen["after"] = await start_and_wait(ctx, dut, *prog, 400_000)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    axi.add_to(sim, axi_view(dut), read=True, write=True)
    sim.add_testbench(bench)
    sim.run()
    assert seen["before"] & 0b110 == 0b010 and seen["before"] >> 4 == NO_FIRMWARE
    assert seen["loaded"] & 0b100
    assert seen["after"] & 0b110 == 0b110 and seen["after"] >> 4 == 0
    result = np.frombuffer(bytes(memory), np.uint8)
    case.check(result)
    np.testing.assert_array_equal(result, golden.dram)
