"""The config files we ship (examples/*.toml, boards/presets/*.toml) are valid, and the digits CNN
they are measured with compiles for each and computes exactly what it computes on the default
config (the accelerator's arithmetic is exact integer arithmetic, so tiling must not change a
single logit)."""

from pathlib import Path

import numpy as np
import pytest
from systolic.compiler import compile_model, run_model
from systolic.hw.config import AcceleratorConfig

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "examples" / "digits_cnn_int8.onnx"
CONFIG_FILES = sorted([*ROOT.glob("examples/*.toml"), *ROOT.glob("boards/presets/*.toml")])


def _images() -> np.ndarray:
    rng = np.random.default_rng(7)
    images = rng.uniform(0, 1, (6, 1, 8, 8)).astype(np.float32)
    images[0] = 0.0                         # extremes: all dark, all bright
    images[1] = 1.0
    return images


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    compiled = compile_model(MODEL, config=AcceleratorConfig())
    return run_model(compiled, {"input": _images()}).outputs["logits"]


def test_the_shipped_config_files_are_found() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in CONFIG_FILES}
    assert {"boards/presets/icebreaker.toml", "boards/presets/ulx3s-85f.toml",
            "boards/presets/orangecrab-25f.toml", "examples/ulx3s-85f-16x16.toml"} <= names


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_digits_cnn_runs_exactly_on_every_shipped_config(path: Path, reference: np.ndarray) -> None:
    config = AcceleratorConfig.from_toml(path)
    compiled = compile_model(MODEL, config=config, strict=True)
    result = run_model(compiled, {"input": _images()})
    np.testing.assert_array_equal(result.outputs["logits"], reference)
    assert result.report["macs"] > 0 and result.report["cycles"] > 0
