"""Compiled models on the golden model (compiler/runtime.py): every accelerator layer of every
model of the compiler tests bit-exact against the reference executor, int8 models against
onnxruntime, batches, the report, and input errors."""

from __future__ import annotations

import io
import re
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from systolic.compiler import compile_model, run_model
from systolic.compiler.errors import InputError
from systolic.compiler.frontend import load_model
from systolic.compiler.ortsession import ort_session
from systolic.compiler.passes import HostFallbackWarning, optimize
from systolic.compiler.reference import execute
from systolic.compiler.runtime import BackendError
from systolic.compiler.runtime import run_model as run_compiled
from systolic.hw.config import AcceleratorConfig

from tests.compiler import models

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CONFIGS = {
    "ws8": AcceleratorConfig(),
    "os8": AcceleratorConfig(dataflow="os"),
    "ws4x16": AcceleratorConfig(rows=4, cols=16, accumulator_bytes=4096, requant_table_rows=2),
    "os16x8": AcceleratorConfig(rows=16, cols=8, dataflow="os", dma_data_bits=128),
}
# every model of the compiler tests, each on two configurations (float models are quantized with
# calibration; int8 models come from onnxruntime's quantize_static)
MODELS = {
    "conv_relu_pool_gemm": ("float", ["ws8", "os16x8"]),
    "residual_add": ("float", ["ws8", "os8"]),
    "depthwise": ("float", ["ws8", "ws4x16"]),
    "avg_pool": ("float", ["os8", "ws4x16"]),
    "global_avg_pool": ("float", ["ws8", "os16x8"]),
    "matmul_bias": ("float", ["os8", "ws4x16"]),
    "conv_bn_relu6": ("float", ["ws8", "os16x8"]),
    "concat_branches": ("float", ["ws4x16", "os8"]),
    "preact_scale": ("float", ["ws8", "os8"]),
    "qoperator_matmul_integer": ("int", ["ws8", "os8"]),
    "residual_add/qdq": ("qdq", ["ws8", "ws4x16"]),
    "depthwise/qdq": ("qdq", ["os8", "ws8"]),
}


def _graph(name: str, config: AcceleratorConfig):
    builder = getattr(models, name.split("/")[0])
    fm = builder()
    kind = MODELS[name][0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostFallbackWarning)
        if kind == "float":
            return fm, optimize(load_model(fm), calibration=models.calibration_set(fm, 3), config=config)
        if kind == "qdq":
            qm = models.quantize_qdq(fm, models.calibration_set(fm, 4))
            return qm, optimize(load_model(qm), config=config)
        return fm, optimize(load_model(fm), config=config)


@pytest.mark.parametrize("name,config", [(n, c) for n, (_, cs) in MODELS.items() for c in cs])
def test_every_layer_bit_exact(name: str, config: str) -> None:
    """The key test of the lowering: each accelerator layer's output, read back from DRAM after
    its program ran on the golden model, equals the reference executor's."""
    fm, graph = _graph(name, CONFIGS[config])
    compiled = compile_model(graph, config=CONFIGS[config], keep_intermediates=True)
    inputs = models.calibration_set(fm, 2, seed=11)
    result = run_model(compiled, inputs, capture=True)
    batch = graph.tensors[graph.inputs[0]].shape[0]
    for image in range(2):
        one = {k: v[image * batch:(image + 1) * batch] for k, v in inputs.items()}
        expected = execute(graph, one, intermediates=True)
        for op in graph.accel_ops:
            got = result.intermediates[image][op.output]
            assert np.array_equal(got, expected[op.output]), f"{op.label}, image {image}"
        for out in graph.outputs:
            rows = expected[out].shape[0] if expected[out].ndim else 0
            part = result.outputs[out][image * rows:(image + 1) * rows] if rows else result.outputs[out]
            assert np.array_equal(part, expected[out])


def test_digits_model_matches_onnxruntime() -> None:
    """The demo model: compiled, run on the golden model, its logits equal onnxruntime's int8
    model's on held-out-like inputs (the reference executor's are identical to them)."""
    path = EXAMPLES / "digits_cnn_int8.onnx"
    compiled = compile_model(path, strict=True, images_per_run=4)
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (10, 1, 8, 8)).astype(np.float32)
    x[0] = 0.0
    x[1] = 1.0
    result = run_model(compiled, {"input": x})
    session = ort_session(str(path))
    expected = np.concatenate([session.run(None, {"input": x[i:i + 1]})[0] for i in range(10)])
    assert np.array_equal(result.outputs["logits"], expected)
    assert result.report["program_runs"] == 3     # 4 + 4 + 2 images


# (model, largest difference in LSB, least fraction identical) end to end. Layer by layer the
# accelerator is within 1 LSB and >= 99% identical (test_reference_ort.py), residual adds and
# average pools included; the few 1-LSB differences of an average pool (onnxruntime's float32
# sum landing beside an exact tie) grow through the layers after it.
QDQ_END_TO_END = [(models.conv_relu_pool_gemm, 1, 0.99), (models.depthwise, 1, 0.99),
                  (models.global_avg_pool, 1, 0.99), (models.avg_pool, 1, 0.8),
                  (models.residual_add, 1, 0.99)]


@pytest.mark.parametrize("builder,lsb,identical", QDQ_END_TO_END)
def test_qdq_models_close_to_onnxruntime(builder, lsb: int, identical: float) -> None:
    """int8 models from quantize_static, end to end through compile + golden, against
    onnxruntime: the output quantized with the model's output parameters."""
    fm = builder()
    qm = models.quantize_qdq(fm, models.calibration_set(fm, 8))
    data = models.calibration_set(fm, 40, seed=3, low=-1.2, high=1.2)
    with warnings.catch_warnings():     # a GlobalAveragePool changing zero points runs on the host
        warnings.simplefilter("ignore", HostFallbackWarning)
        compiled = compile_model(qm, images_per_run=8)
    got = run_model(compiled, data).outputs
    session = ort_session(qm)
    name = fm.graph.input[0].name
    out = fm.graph.output[0].name
    expected = np.concatenate([session.run(None, {name: data[name][i:i + 1]})[0] for i in range(40)])
    scale = _output_scale(qm, out)
    diff = np.abs(np.rint(got[out] / scale) - np.rint(expected / scale))
    assert diff.max() <= lsb
    assert np.mean(diff == 0) >= identical


def _output_scale(model: onnx.ModelProto, output: str) -> float:
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.output[0] == output:
            init = {t.name: t for t in model.graph.initializer}
            return float(onnx.numpy_helper.to_array(init[node.input[1]]))
    raise AssertionError(f"no DequantizeLinear produces {output}")


def test_report_is_consistent() -> None:
    compiled = compile_model(EXAMPLES / "digits_cnn_int8.onnx")
    x = np.random.default_rng(1).uniform(0, 1, (3, 1, 8, 8)).astype(np.float32)
    report = run_model(compiled, {"input": x}).report
    c = compiled.config
    for key in ("backend", "config", "cycles", "macs", "utilization", "dram_read_bytes",
                "dram_write_bytes", "layers"):
        assert key in report
    assert report["backend"] == "golden" and report["config"] == c.to_dict()
    assert report["images"] == 3 and report["program_runs"] == 3
    assert report["macs"] == 3 * compiled.macs
    assert report["utilization"] == pytest.approx(report["macs"] / (c.rows * c.cols * report["cycles"]))
    accel = [layer for layer in report["layers"] if not layer["host"]]
    host = [layer for layer in report["layers"] if layer["host"]]
    assert [layer["name"] for layer in accel] == [op.name for op in compiled.graph.accel_ops]
    assert {layer["op"] for layer in host} == {"QuantizeLinear", "Transpose", "DequantizeLinear"}
    assert 0 < sum(layer["cycles"] for layer in accel) <= report["cycles"]
    assert sum(layer["macs"] for layer in accel) == report["macs"]
    for layer in accel:
        assert layer["utilization"] == pytest.approx(layer["macs"] / (c.rows * c.cols * layer["cycles"]))
    # the compile-time estimate is close to the golden model's cycles
    estimate = sum(layer["estimated_cycles"] for layer in accel)
    assert 0.6 * report["cycles"] <= estimate <= 1.4 * report["cycles"]


@pytest.mark.slow
def test_a_compute_clock_of_its_own_on_the_rtl() -> None:
    """The digits model on the RTL of the default 8x8 config with its compute core on a clock of
    its own (75 and 100 MHz): the golden model's outputs, and a utilization taken over the
    array's own cycles (control-clock cycles x 100 / 75)."""
    config = AcceleratorConfig(clock_mhz=75.0, compute_clock_mhz=100.0)
    compiled = compile_model(EXAMPLES / "digits_cnn_int8.onnx", config=config)
    x = np.random.default_rng(4).uniform(0, 1, (2, 1, 8, 8)).astype(np.float32)
    golden = run_model(compiled, {"input": x})
    rtl = run_model(compiled, {"input": x}, backend="rtl")
    np.testing.assert_array_equal(rtl.outputs["logits"], golden.outputs["logits"])
    report = rtl.report
    assert report["macs"] == golden.report["macs"]
    assert report["utilization"] == pytest.approx(
        report["macs"] / (config.rows * config.cols * report["cycles"] * 100 / 75))
    assert 0 < report["utilization"] < 1
    assert golden.report["utilization"] == pytest.approx(
        golden.report["macs"] / (config.rows * config.cols * golden.report["cycles"]))


def test_input_errors() -> None:
    compiled = compile_model(EXAMPLES / "digits_cnn_int8.onnx")
    good = np.zeros((1, 1, 8, 8), np.float32)
    cases = [
        ({"input": good.astype(np.float64)}, "input 'input' must have dtype float32, not float64"),
        ({"input": good[:, :, :7]}, "input 'input' must have shape (1, 1, 8, 8) (or (k * 1, 1, 8, 8) "
                                    "for k images), not (1, 1, 7, 8)"),
        ({}, "input 'input' is missing (the model's inputs are 'input')"),
        ({"input": good, "image": good}, "unknown input 'image'; the model's inputs are 'input'"),
        ({"input": [0.0]}, "input 'input' must be a numpy array, not list"),
    ]
    for inputs, message in cases:
        with pytest.raises(InputError, match="^" + re.escape(message) + "$"):
            run_model(compiled, inputs)


def test_unknown_backend() -> None:
    compiled = compile_model(EXAMPLES / "digits_cnn_int8.onnx")
    with pytest.raises(BackendError, match=r"^backend must be one of golden, rtl, board, not 'fpga'$"):
        run_model(compiled, {"input": np.zeros((1, 1, 8, 8), np.float32)}, backend="fpga")


def test_config_mismatch() -> None:
    compiled = compile_model(EXAMPLES / "digits_cnn_int8.onnx")
    other = AcceleratorConfig(rows=16)
    with pytest.raises(ValueError, match=rf"^the model was compiled for config "
                                         rf"{compiled.config.hash_hex}, not {other.hash_hex}; "):
        run_model(compiled, {"input": np.zeros((1, 1, 8, 8), np.float32)}, config=other)


def test_partial_last_run_computes_only_its_images() -> None:
    """5 images at 4 per run: the last run's program has one image slot, not four."""
    compiled = compile_model(EXAMPLES / "digits_cnn_int8.onnx", images_per_run=4)
    x = np.random.default_rng(2).uniform(0, 1, (5, 1, 8, 8)).astype(np.float32)
    four = run_model(compiled, {"input": x[:4]}).report["cycles"]
    five = run_model(compiled, {"input": x})
    assert five.report["program_runs"] == 2
    assert four < five.report["cycles"] < four + four // 2
    expected = np.concatenate([execute(compiled.graph, {"input": x[i:i + 1]})["logits"] for i in range(5)])
    assert np.array_equal(five.outputs["logits"], expected)


def test_progress_line() -> None:
    compiled = compile_model(EXAMPLES / "digits_cnn_int8.onnx", images_per_run=2)
    x = np.zeros((5, 1, 8, 8), np.float32)
    stream = io.StringIO()
    run_compiled(compiled, {"input": x}, progress=True, stream=stream)
    text = stream.getvalue()
    assert text.count("\r") == 3 and text.endswith("\n")
    assert "systolic: 2/5 images [############                  ]" in text
    assert "systolic: 5/5 images [" + "#" * 30 + "]" in text


def test_programs_larger_than_dram_side_by_side_run_one_at_a_time() -> None:
    """The digits CNN on the iCEBreaker preset (64 KiB of DRAM): its one program (1218
    instructions, 78 KB) is cut at layer boundaries into programs that each fit beside the
    constants and activations, all at one address, where the runtime writes each before it runs:
    outputs, MACs and DRAM traffic equal the same model's with 128 KiB and one program."""
    from systolic.boards.boards import load_preset

    config = load_preset("icebreaker")
    overlaid = compile_model(EXAMPLES / "digits_cnn_int8.onnx", config=config)
    whole = compile_model(EXAMPLES / "digits_cnn_int8.onnx", config=config.replace(dram_bytes=128 * 1024))
    assert not whole.overlay and len(whole.segments) == 1
    assert overlaid.overlay and len(overlaid.segments) >= 2
    assert len({seg.address for seg in overlaid.segments}) == 1
    assert overlaid.image.size <= config.dram_bytes
    layers = [op.name for seg in overlaid.segments for op in seg.ops]
    assert layers == [op.name for op in whole.segments[0].ops]
    assert overlaid.plan_dict()["dram"]["programs_overlaid"] is True
    images = np.random.default_rng(5).uniform(0, 1, (3, 1, 8, 8)).astype(np.float32)
    a = run_model(overlaid, {"input": images}, progress=False)
    b = run_model(whole, {"input": images}, progress=False)
    np.testing.assert_array_equal(a.outputs["logits"], b.outputs["logits"])
    for key in ("macs", "dram_read_bytes", "dram_write_bytes"):
        assert a.report[key] == b.report[key], key
