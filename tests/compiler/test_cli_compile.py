"""``systolic compile``, ``systolic run`` and ``systolic demo``: outputs, and every bad input as one
line on stderr, a non-zero exit and no traceback."""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from systolic.compiler import compile_model, run_model
from systolic.compiler.asm import assemble
from systolic.compiler.cli import main
from systolic.hw.config import AcceleratorConfig
from systolic.hw.isa import Program

from tests.compiler import models

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DIGITS = EXAMPLES / "digits_cnn_int8.onnx"


def run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_user_error(result: tuple[int, str, str], message: str, code: int = 1) -> None:
    status, out, err = result
    assert status == code, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if not line.startswith("systolic: warning:")]
    assert len(lines) == 1, err
    assert re.match(r"^systolic: error: " + message + r"\Z", lines[0]), err


def test_compile_writes_programs_image_and_plan(capsys, tmp_path: Path) -> None:
    code, out, err = run(capsys, "compile", DIGITS, "--out", tmp_path / "out")
    assert (code, err) == (0, "")
    assert re.match(r"^\S+digits_cnn_int8.onnx: 4 accelerator layers in 1 program\(s\) of \d+ "
                    r"instructions, 3 host node\(s\); DRAM image \d+ bytes; estimated \d+ cycles", out)
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == ["dram.bin", "plan.json", "segment0.bin", "segment0.s"]
    config = AcceleratorConfig()
    blob = (tmp_path / "out" / "segment0.bin").read_bytes()
    assert blob[:4] == b"SYST" and struct.unpack_from("<Q", blob, 8)[0] == config.hash
    program = Program.from_bytes(blob)
    listing = (tmp_path / "out" / "segment0.s").read_text()
    assert tuple(assemble(listing)) == program.instructions          # the listing assembles back
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert plan["config_hash"] == config.hash_hex
    segment = plan["segments"][0]
    assert segment["program"] == "segment0.bin"
    assert [layer["name"] for layer in segment["layers"]] == ["conv1", "conv2", "fc1", "fc2"]
    for layer in segment["layers"]:
        assert {"tiling", "addresses", "estimated_cycles", "instructions", "macs"} <= set(layer)
        assert layer["tiling"]["estimated_cycles"] == layer["estimated_cycles"] > 0
    image = np.fromfile(tmp_path / "out" / "dram.bin", np.uint8)
    assert image.size == plan["dram"]["total_bytes"]
    start = segment["address"]
    assert image[start:start + len(blob) - 32].tobytes() == blob[32:]   # the words are in the image
    assert plan["scratchpad"]["peak_rows"] <= config.spad_rows
    assert [s["step"] for s in plan["schedule"]] == ["host", "host", "accel", "host"]


def test_run_writes_outputs_and_report(capsys, tmp_path: Path) -> None:
    x = np.random.default_rng(0).uniform(0, 1, (3, 1, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code, out, err = run(capsys, "run", DIGITS, "--input", f"input={tmp_path / 'x.npy'}",
                         "--output", tmp_path / "out.npz", "--report", tmp_path / "report.json")
    assert (code, err) == (0, "")
    assert out.startswith("output logits: float32[3, 10]\n3 image(s) on the golden backend: ")
    expected = run_model(compile_model(DIGITS, images_per_run=3), {"input": x})   # all 3 in a run
    with np.load(tmp_path / "out.npz") as saved:
        assert np.array_equal(saved["logits"], expected.outputs["logits"])
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["cycles"] == expected.report["cycles"]
    for key in ("backend", "config", "cycles", "macs", "utilization", "dram_read_bytes",
                "dram_write_bytes", "layers"):
        assert key in report
    assert [layer["name"] for layer in report["layers"] if not layer["host"]] == \
        ["conv1", "conv2", "fc1", "fc2"]
    # an unnamed --input is the first model input
    code, out2, _ = run(capsys, "run", DIGITS, "--input", tmp_path / "x.npy")
    assert code == 0 and out2 == out


def test_run_a_float_model_with_calibration_and_config(capsys, tmp_path: Path) -> None:
    model = models.conv_relu_pool_gemm()
    onnx.save(model, tmp_path / "m.onnx")
    np.savez(tmp_path / "cal.npz", **models.calibration_set(model, 3))
    np.save(tmp_path / "x.npy", models.calibration_set(model, 1, seed=4)["input"])
    (tmp_path / "os.toml").write_text('dataflow = "os"\nrows = 16\n')
    code, out, err = run(capsys, "run", tmp_path / "m.onnx", "--calibrate", tmp_path / "cal.npz",
                         "--config", tmp_path / "os.toml", "--input", tmp_path / "x.npy", "--strict")
    assert (code, err) == (0, "")
    assert "1 image(s) on the golden backend" in out


# -- bad inputs --------------------------------------------------------------------------------


def test_bad_model_files(capsys, tmp_path: Path) -> None:
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(DIGITS.read_bytes()[:300])
    assert_user_error(run(capsys, "compile", truncated, "--out", tmp_path / "o"),
                      re.escape(f"{truncated}: not an ONNX model or truncated") + ".*")
    text = tmp_path / "notes.onnx"
    text.write_text("this is not a model\n")
    assert_user_error(run(capsys, "compile", text, "--out", tmp_path / "o"),
                      re.escape(f"{text}: not an ONNX model or truncated") + ".*")
    missing = tmp_path / "missing.onnx"
    assert_user_error(run(capsys, "run", missing, "--input", "x.npy"),
                      re.escape(f"{missing}: cannot read the model file: No such file or directory"))


def _sigmoid_model(path: Path) -> None:
    node = helper.make_node("Sigmoid", ["x"], ["y"], name="squash")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)


def test_host_op_with_strict(capsys, tmp_path: Path) -> None:
    _sigmoid_model(tmp_path / "s.onnx")
    assert_user_error(run(capsys, "compile", tmp_path / "s.onnx", "--strict", "--out", tmp_path / "o"),
                      re.escape("node 'squash' (Sigmoid) cannot run on the accelerator; strict=True "
                                "forbids running it on the host"))
    # without --strict it runs on the host, with one warning line
    np.save(tmp_path / "x.npy", np.zeros((1, 4), np.float32))
    code, out, err = run(capsys, "run", tmp_path / "s.onnx", "--input", tmp_path / "x.npy")
    assert code == 0
    assert err == "systolic: warning: 1 node(s) run on the host: 'squash' (Sigmoid)\n"


def test_unknown_op_type(capsys, tmp_path: Path) -> None:
    node = helper.make_node("Frobnicate", ["x"], ["y"], name="mystery")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "u.onnx")
    assert_user_error(run(capsys, "compile", tmp_path / "u.onnx", "--strict", "--out", tmp_path / "o"),
                      re.escape(f"{tmp_path / 'u.onnx'}: node 'mystery': unknown op type 'Frobnicate' "
                                f"in the default domain"))


def test_symbolic_shape_given_on_the_command_line(capsys, tmp_path: Path) -> None:
    model = models.matmul_bias()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    onnx.save(model, tmp_path / "m.onnx")
    np.savez(tmp_path / "cal.npz", input=models.calibration_set(models.matmul_bias(), 2)["input"])
    np.save(tmp_path / "x.npy", np.ones((3, 12), np.float32))
    assert_user_error(run(capsys, "compile", tmp_path / "m.onnx", "--calibrate", tmp_path / "cal.npz",
                          "--out", tmp_path / "o"),
                      re.escape(f"{tmp_path / 'm.onnx'}: input 'input' has symbolic dimensions "
                                f"('batch', 12); give its shape") + ".*")
    code, out, err = run(capsys, "run", tmp_path / "m.onnx", "--calibrate", tmp_path / "cal.npz",
                         "--shape", "input=3,12", "--input", tmp_path / "x.npy")
    assert (code, err) == (0, "") and out.startswith("output out: float32[3, 7]\n")


def test_shape_errors(capsys, tmp_path: Path) -> None:
    assert_user_error(run(capsys, "compile", DIGITS, "--shape", "input=1,1,9,8", "--out", tmp_path),
                      re.escape(f"{DIGITS}: the shape given for input 'input', (1, 1, 9, 8), does not "
                                f"match the model's (1, 1, 8, 8)"))
    assert_user_error(run(capsys, "compile", DIGITS, "--shape", "input:1,2", "--out", tmp_path),
                      re.escape("--shape expects name=d0,d1,... (e.g. input=1,3,224,224), not "
                                "'input:1,2'"), code=2)


def test_model_larger_than_memory(capsys, tmp_path: Path) -> None:
    (tmp_path / "small.toml").write_text("dram_bytes = 4096\n")
    assert_user_error(run(capsys, "compile", DIGITS, "--config", tmp_path / "small.toml", "--out", tmp_path),
                      r"the model needs \d+ bytes of DRAM \(constants \d+, activations 1 x \d+, "
                      r"programs \d+\), but the config has dram_bytes=4096")
    (tmp_path / "acc.toml").write_text("accumulator_bytes = 512\n")
    big = models.global_avg_pool(size=5)
    onnx.save(big, tmp_path / "gap.onnx")
    np.savez(tmp_path / "cal.npz", **models.calibration_set(big, 2))
    assert_user_error(run(capsys, "compile", tmp_path / "gap.onnx", "--calibrate", tmp_path / "cal.npz",
                          "--config", tmp_path / "acc.toml", "--out", tmp_path),
                      r"accelerator op '\w+' \(conv\): one output pixel needs an accumulator image of "
                      r"\d+x\d+ = \d+ rows, but an accumulator buffer holds 8 rows .*")


def test_bad_input_arrays(capsys, tmp_path: Path) -> None:
    np.save(tmp_path / "wrong_shape.npy", np.zeros((1, 1, 8, 7), np.float32))
    np.save(tmp_path / "wrong_dtype.npy", np.zeros((1, 1, 8, 8), np.float64))
    (tmp_path / "junk.npy").write_text("junk")
    assert_user_error(run(capsys, "run", DIGITS, "--input", tmp_path / "wrong_shape.npy"),
                      re.escape("input 'input' must have shape (1, 1, 8, 8) (or (k * 1, 1, 8, 8) for "
                                "k images), not (1, 1, 8, 7)"))
    assert_user_error(run(capsys, "run", DIGITS, "--input", tmp_path / "wrong_dtype.npy"),
                      re.escape("input 'input' must have dtype float32, not float64"))
    assert_user_error(run(capsys, "run", DIGITS, "--input", tmp_path / "junk.npy"),
                      re.escape(f"{tmp_path / 'junk.npy'}: input 'input' is not a .npy array file") + ".*")
    assert_user_error(run(capsys, "run", DIGITS, "--input", tmp_path / "none.npy"),
                      re.escape(f"{tmp_path / 'none.npy'}: cannot read input 'input': No such file or "
                                f"directory"))


def test_rtl_backend_failure_is_one_line(capsys, tmp_path: Path, monkeypatch) -> None:
    """When the RTL runner cannot be used, --backend rtl says why in one line."""
    import systolic.sim.rtl as rtl

    def unavailable(*args, **kwargs):
        raise rtl.RTLError("Verilator is not installed")

    monkeypatch.setattr(rtl.RTLRunner, "run", unavailable)
    np.save(tmp_path / "x.npy", np.zeros((1, 1, 8, 8), np.float32))
    assert_user_error(run(capsys, "run", DIGITS, "--input", tmp_path / "x.npy", "--backend", "rtl"),
                      re.escape("the rtl backend failed on segment 0: Verilator is not installed"))


def test_demo_on_the_golden_model(capsys, tmp_path: Path) -> None:
    code, out, err = run(capsys, "demo", "--backend", "golden", "--images", "12", "--out", tmp_path / "demo")
    assert code == 0, err
    assert re.search(r"held-out accuracy: float \(onnxruntime\) \d+\.\d+%, int8 \(onnxruntime\) "
                     r"\d+\.\d+%, accelerator \(golden\) \d+\.\d+%", out)
    assert re.search(r"cycles per image: \d+ \(golden: cycle estimate of docs/isa.md\)", out)
    verilog = (tmp_path / "demo" / "systolic_top.v").read_text()
    assert "module systolic_top" in verilog
    assert (tmp_path / "demo" / "segment0.bin").is_file()
    shutil.rmtree(tmp_path / "demo")
