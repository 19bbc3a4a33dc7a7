"""``systolic demo``: the digits CNN from ONNX to accelerator, end to end.

:func:`run_demo` compiles ``examples/digits_cnn_int8.onnx`` (onnxruntime's int8 QDQ model of the
small CNN of ``examples/train_digits.py``) for the default :class:`AcceleratorConfig`, writes the
accelerator's Verilog (``systolic.hw.top.Accelerator`` as module ``systolic_top``), the programs,
the DRAM image and the plan, then runs the 360 held-out digits on the RTL backend (the Verilog in
Verilator) when it can be built, else on the golden model -- saying which -- and prints the
accuracy of the float model and of the int8 model in onnxruntime next to the accelerator's, the
cycles per image and the array's utilization.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import numpy as np
from systolic.hw.config import AcceleratorConfig

from .errors import CompileError

__all__ = ["run_demo", "EXAMPLES", "IMAGES_PER_RUN"]

#: The repository's examples folder (the demo needs an editable install: ``pip install -e .``).
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
#: Held-out images per program run (one simulator start per run on the RTL).
IMAGES_PER_RUN = 60


def _load_examples() -> tuple[Path, Path, Any]:
    int8, flt, script = (EXAMPLES / "digits_cnn_int8.onnx", EXAMPLES / "digits_cnn.onnx",
                         EXAMPLES / "train_digits.py")
    for path in (int8, flt, script):
        if not path.is_file():
            raise CompileError(f"{path}: not found; the demo uses the repository's examples/ folder "
                               f"(install with pip install -e . from a checkout)")
    spec = importlib.util.spec_from_file_location("systolic_examples_train_digits", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return int8, flt, module


def _ort_logits(path: Path, x: np.ndarray) -> np.ndarray:
    from .ortsession import ort_session

    session = ort_session(path)
    name = session.get_inputs()[0].name
    return np.concatenate([session.run(None, {name: x[i:i + 1]})[0] for i in range(len(x))])


def _verilog(config: AcceleratorConfig) -> str:
    """The accelerator's Verilog as module ``systolic_top`` (cached by the RTL runner's tools)."""
    try:
        from systolic.sim.rtl import accelerator_verilog
    except Exception:   # the simulation extras are missing: convert directly
        from amaranth.back import verilog
        from systolic.hw.top import Accelerator
        return verilog.convert(Accelerator(config), name="systolic_top")
    return accelerator_verilog(config)


def run_demo(*, backend: str = "auto", images: int = 0, out: Path = Path("systolic-demo"),
             stream: TextIO | None = None) -> int:
    """Run the demo (see the module docstring); ``images`` > 0 runs only the first ones.
    Returns the exit status."""
    from .api import compile_model
    from .runtime import run_model

    stream = stream if stream is not None else sys.stdout
    start = time.perf_counter()

    def say(text: str) -> None:
        print(text, file=stream, flush=True)

    int8_path, float_path, train_digits = _load_examples()
    _, _, x_test, y_test = train_digits.load_data()
    if images:
        x_test, y_test = x_test[:images], y_test[:images]
    say(f"systolic demo: digits CNN (examples/digits_cnn_int8.onnx), {len(x_test)} held-out images")
    float_acc = float(np.mean(_ort_logits(float_path, x_test).argmax(1) == y_test))
    int8_acc = float(np.mean(_ort_logits(int8_path, x_test).argmax(1) == y_test))

    config = AcceleratorConfig()
    per_run = min(IMAGES_PER_RUN, len(x_test))
    compiled = compile_model(int8_path, config=config, strict=True, images_per_run=per_run)
    out.mkdir(parents=True, exist_ok=True)
    saved = compiled.save(out)
    verilog_path = out / "systolic_top.v"
    verilog_path.write_text(_verilog(config))
    say(f"compiled for config {config.hash_hex} ({config.rows}x{config.cols} "
        f"{config.dataflow.upper()}): {len(compiled.graph.accel_ops)} accelerator layers, "
        f"{len(compiled.segments[0].program.instructions)} instructions per run of {per_run} images")

    chosen = backend
    if backend in ("auto", "rtl"):
        try:
            from systolic.sim.rtl import RTLRunner
            say("building the accelerator in Verilator (cached after the first time) ...")
            size = 1 << max(16, (int(compiled.image.size) - 1).bit_length())
            from .runtime import quiet_output
            with quiet_output():
                RTLRunner(config, memory="fast", dram_bytes=size).build()
            chosen = "rtl"
        except Exception as exc:
            if backend == "rtl":
                raise CompileError(f"the rtl backend is not available: "
                                   f"{' '.join(str(exc).split()) or type(exc).__name__}") from None
            say(f"the RTL backend is not available ({' '.join(str(exc).split())[:200]}); "
                f"running on the golden model instead")
            chosen = "golden"
    result = run_model(compiled, {"input": x_test}, backend=chosen, progress=None)
    acc = float(np.mean(result.outputs["logits"].argmax(1) == y_test))
    report = result.report
    say(f"held-out accuracy: float (onnxruntime) {float_acc:.2%}, int8 (onnxruntime) "
        f"{int8_acc:.2%}, accelerator ({chosen}) {acc:.2%}")
    say(f"cycles per image: {report['cycles_per_image']:.0f} ({chosen}: "
        f"{'performance counters' if chosen == 'rtl' else 'cycle estimate of docs/isa.md'}), "
        f"{report['cycles_per_image'] / config.clock_mhz:.1f} us at {config.clock_mhz:g} MHz; "
        f"array utilization {report['utilization']:.1%}")
    say(f"Verilog: {verilog_path}")
    for path in saved:
        say(f"{'program' if path.suffix in ('.bin', '.s') and path.stem != 'dram' else 'file'}: {path}")
    say(f"done in {time.perf_counter() - start:.0f} s")
    return 0
