"""Train the demo CNN on scikit-learn's 8x8 digits with numpy alone, export it to ONNX, and
quantize it with onnxruntime.

Data: ``sklearn.datasets.load_digits`` (1797 images, 8x8 grayscale, 16 levels, 10 classes), pixels
scaled to [0, 1]. Split: ``train_test_split(test_size=0.2, random_state=0, stratify=labels)``,
1437 training and 360 held-out images.

Model (NCHW, batch 1)::

    input 1x1x8x8 -> Conv 3x3 pad 1 (8) -> Relu -> MaxPool 2x2 -> Conv 3x3 pad 1 (16) -> Relu
    -> MaxPool 2x2 -> Flatten (64) -> Gemm (32) -> Relu -> Gemm (10) -> logits

Training: He initialisation, Adam (lr 0.01, halved every 8 epochs), batch 64, softmax
cross-entropy, 20 epochs, seed 0; about 10 s on one idle core.

Outputs (next to this script unless ``--out-dir``):

* ``digits_cnn.onnx`` -- float, opset 13, IR version 8;
* ``digits_cnn_int8.onnx`` -- QDQ int8 from ``onnxruntime.quantization.quantize_static``:
  per-channel symmetric int8 weights, per-tensor int8 activations calibrated (min/max) on 256
  training images.

It prints the held-out accuracy of the float and int8 models in onnxruntime and of the int8 model
compiled by systolic's front end and run by its reference executor (the integer semantics the
accelerator executes).
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from numpy.lib.stride_tricks import sliding_window_view
from onnx import helper, numpy_helper

__all__ = ["load_data", "train", "export", "quantize", "main"]

SEED = 0
HERE = Path(__file__).resolve().parent


def load_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): images float32 [N, 1, 8, 8] in [0, 1], labels int64."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=SEED, stratify=y)
    return x_train, y_train, x_test, y_test


# -- a tiny numpy CNN ------------------------------------------------------------------------------


def _im2col(x: np.ndarray) -> np.ndarray:
    """3x3 pad-1 patches of an NCHW batch: [N*H*W, C*9] in (c, kh, kw) order."""
    n, c, h, w = x.shape
    win = sliding_window_view(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), axis=(2, 3))
    return win.transpose(0, 2, 3, 1, 4, 5).reshape(n * h * w, c * 9)


def _col2im(cols: np.ndarray, shape: tuple[int, int, int, int]) -> np.ndarray:
    n, c, h, w = shape
    patches = cols.reshape(n, h, w, c, 3, 3)
    out = np.zeros((n, c, h + 2, w + 2), cols.dtype)
    for i in range(3):
        for j in range(3):
            out[:, :, i:i + h, j:j + w] += patches[:, :, :, :, i, j].transpose(0, 3, 1, 2)
    return out[:, :, 1:-1, 1:-1]


def _conv(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n, _, h, wd = x.shape
    cols = _im2col(x)
    out = cols @ w.reshape(w.shape[0], -1).T + b
    return out.reshape(n, h, wd, -1).transpose(0, 3, 1, 2), cols


def _pool(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n, c, h, w = x.shape
    blocks = x.reshape(n, c, h // 2, 2, w // 2, 2)
    out = blocks.max(axis=(3, 5))
    mask = blocks == out[:, :, :, None, :, None]
    mask = mask / mask.sum(axis=(3, 5), keepdims=True)
    return out, mask


def _unpool(d: np.ndarray, mask: np.ndarray) -> np.ndarray:
    n, c, h2, _, w2, _ = mask.shape
    return (mask * d[:, :, :, None, :, None]).reshape(n, c, h2 * 2, w2 * 2)


def _init(rng: np.random.Generator) -> dict[str, np.ndarray]:
    def he(shape: tuple[int, ...], fan_in: int) -> np.ndarray:
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    return {"w1": he((8, 1, 3, 3), 9), "b1": np.zeros(8, np.float32),
            "w2": he((16, 8, 3, 3), 72), "b2": np.zeros(16, np.float32),
            "w3": he((32, 64), 64), "b3": np.zeros(32, np.float32),
            "w4": he((10, 32), 32), "b4": np.zeros(10, np.float32)}


def forward(params: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """Logits [N, 10] of the float model."""
    return _forward(params, x)[0]


def _forward(p: dict[str, np.ndarray], x: np.ndarray) -> tuple[np.ndarray, dict]:
    c1, cols1 = _conv(x, p["w1"], p["b1"])
    r1 = np.maximum(c1, 0)
    p1, m1 = _pool(r1)
    c2, cols2 = _conv(p1, p["w2"], p["b2"])
    r2 = np.maximum(c2, 0)
    p2, m2 = _pool(r2)
    f = p2.reshape(len(x), -1)
    g1 = f @ p["w3"].T + p["b3"]
    r3 = np.maximum(g1, 0)
    logits = r3 @ p["w4"].T + p["b4"]
    return logits, dict(x=x, cols1=cols1, c1=c1, m1=m1, p1=p1, cols2=cols2, c2=c2, m2=m2, f=f, g1=g1, r3=r3)


def _backward(p: dict[str, np.ndarray], s: dict, dlogits: np.ndarray) -> dict[str, np.ndarray]:
    g = {"w4": dlogits.T @ s["r3"], "b4": dlogits.sum(0)}
    dg1 = (dlogits @ p["w4"]) * (s["g1"] > 0)
    g["w3"], g["b3"] = dg1.T @ s["f"], dg1.sum(0)
    dp2 = (dg1 @ p["w3"]).reshape(s["m2"].shape[0], 16, 2, 2)
    dc2 = _unpool(dp2, s["m2"]) * (s["c2"] > 0)
    d2 = dc2.transpose(0, 2, 3, 1).reshape(-1, 16)
    g["w2"], g["b2"] = (d2.T @ s["cols2"]).reshape(p["w2"].shape), d2.sum(0)
    dp1 = _col2im(d2 @ p["w2"].reshape(16, -1), s["p1"].shape)
    dc1 = _unpool(dp1, s["m1"]) * (s["c1"] > 0)
    d1 = dc1.transpose(0, 2, 3, 1).reshape(-1, 8)
    g["w1"], g["b1"] = (d1.T @ s["cols1"]).reshape(p["w1"].shape), d1.sum(0)
    return g


def train(x: np.ndarray, y: np.ndarray, *, epochs: int = 20, batch: int = 64, lr: float = 0.01,
          seed: int = SEED, log: bool = True) -> dict[str, np.ndarray]:
    """Train the CNN with Adam on softmax cross-entropy; returns float32 parameters."""
    rng = np.random.default_rng(seed)
    params = _init(rng)
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(v) for k, v in params.items()}
    step = 0
    for epoch in range(epochs):
        rate = lr * 0.5 ** (epoch // 8)
        order = rng.permutation(len(x))
        total = 0.0
        for start in range(0, len(x), batch):
            idx = order[start:start + batch]
            logits, state = _forward(params, x[idx])
            shifted = logits - logits.max(1, keepdims=True)
            prob = np.exp(shifted) / np.exp(shifted).sum(1, keepdims=True)
            total += -np.log(prob[np.arange(len(idx)), y[idx]] + 1e-12).sum()
            prob[np.arange(len(idx)), y[idx]] -= 1
            grads = _backward(params, state, prob / len(idx))
            step += 1
            for k in params:
                m[k] = 0.9 * m[k] + 0.1 * grads[k]
                v[k] = 0.999 * v[k] + 0.001 * grads[k] ** 2
                mhat, vhat = m[k] / (1 - 0.9 ** step), v[k] / (1 - 0.999 ** step)
                params[k] = (params[k] - rate * mhat / (np.sqrt(vhat) + 1e-8)).astype(np.float32)
        if log and (epoch % 4 == 3 or epoch == epochs - 1):
            acc = np.mean(forward(params, x).argmax(1) == y)
            print(f"epoch {epoch + 1:2d}: loss {total / len(x):.4f}, training accuracy {acc:.4f}")
    return params


# -- ONNX export and quantization ------------------------------------------------------------------


def export(params: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The float model: opset 13, IR version 8, input ``input`` [1, 1, 8, 8], output ``logits``."""
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in params.items()]
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], name="conv1", kernel_shape=[3, 3],
                         pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], name="conv2", kernel_shape=[3, 3],
                         pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("MaxPool", ["r2"], ["p2"], name="pool2", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p2"], ["flat"], name="flatten", axis=1),
        helper.make_node("Gemm", ["flat", "w3", "b3"], ["g1"], name="fc1", transB=1),
        helper.make_node("Relu", ["g1"], ["r3"], name="relu3"),
        helper.make_node("Gemm", ["r3", "w4", "b4"], ["logits"], name="fc2", transB=1),
    ]
    inputs = [helper.make_tensor_value_info("input", onnx.TensorProto.FLOAT, [1, 1, 8, 8])]
    outputs = [helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, [1, 10])]
    graph = helper.make_graph(nodes, "digits_cnn", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="systolic examples/train_digits.py")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def quantize(model: onnx.ModelProto, calibration: np.ndarray) -> onnx.ModelProto:
    """QDQ int8 model from onnxruntime's quantize_static (per-channel weights), calibrated with
    min/max on ``calibration`` images [N, 1, 8, 8]."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter({"input": calibration[i:i + 1]} for i in range(len(calibration)))

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.items, None)

    logging.getLogger().setLevel(logging.ERROR)     # quantize_static's advice to pre-process
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp, "float.onnx"), Path(tmp, "int8.onnx")
        onnx.save(model, src)
        quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
        out = onnx.load(dst)
    out.ir_version = 8
    return out


def _ort_accuracy(model: onnx.ModelProto, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    from systolic.compiler.ortsession import ort_session

    session = ort_session(model)   # exact int8 products on every x86 CPU
    logits = np.concatenate([session.run(None, {"input": x[i:i + 1]})[0] for i in range(len(x))])
    return float(np.mean(logits.argmax(1) == y)), logits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=HERE, help="where to write the .onnx files")
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    x_train, y_train, x_test, y_test = load_data()
    print(f"digits: {len(x_train)} training, {len(x_test)} held-out images")
    params = train(x_train, y_train, epochs=args.epochs)
    model = export(params)
    rng = np.random.default_rng(SEED)
    calibration = x_train[rng.choice(len(x_train), 256, replace=False)]
    qmodel = quantize(model, calibration)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    onnx.save(model, args.out_dir / "digits_cnn.onnx")
    onnx.save(qmodel, args.out_dir / "digits_cnn_int8.onnx")

    numpy_acc = float(np.mean(forward(params, x_test).argmax(1) == y_test))
    float_acc, _ = _ort_accuracy(model, x_test, y_test)
    int8_acc, int8_logits = _ort_accuracy(qmodel, x_test, y_test)
    from systolic.compiler.frontend import load_model
    from systolic.compiler.passes import optimize
    from systolic.compiler.reference import execute

    graph = optimize(load_model(qmodel), strict=True)
    ours = np.concatenate([execute(graph, {"input": x_test[i:i + 1]})["logits"] for i in range(len(x_test))])
    ref_acc = float(np.mean(ours.argmax(1) == y_test))
    same = float(np.mean(ours == int8_logits))
    print(f"held-out accuracy: float {float_acc:.4f} (numpy {numpy_acc:.4f}), int8 onnxruntime "
          f"{int8_acc:.4f}, int8 systolic reference {ref_acc:.4f} ({same:.2%} of logits identical "
          f"to onnxruntime's)")
    print(f"accelerator ops: {len(graph.accel_ops)}, host nodes: "
          f"{', '.join(n.op for n in graph.host_nodes) or 'none'}")
    print(f"wrote {args.out_dir / 'digits_cnn.onnx'} and {args.out_dir / 'digits_cnn_int8.onnx'} "
          f"in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
