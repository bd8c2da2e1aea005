"""Generate the series vectors of spec/FORMAT.md section 23.3 (weights-only steps).

    PYTHONPATH=. python spec/vectors/series/make_series_vectors.py

``weights_only/`` is a series directory of manifest version 2: four steps saved (a model's
lossless and quantized tensors, an optimizer moment, a 0-d step counter), then kept as the
newest step whole and the two before it as their model only (step 2 a ``.w.d.ink`` delta
against step 3's ``.w.ink``); step 1 deleted. ``weights_only.expected.json`` lists what each
step decodes to: every tensor's dtype, shape and the SHA-256 of its bytes (elements
little-endian, row-major). Each negative vector is a ``manifest.json`` that replaces the
directory's own and is refused with ``CorruptError``.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def tensors(step: int) -> dict[str, np.ndarray]:
    """Step ``step``'s state: drifting weights, a moment and the step counter."""
    rng = np.random.default_rng(0)
    base = rng.standard_normal((64, 64)).astype(np.float32)
    drift = np.random.default_rng(step).standard_normal((64, 64)).astype(np.float32)
    return {"model.w": base + np.float32(0.01 * step) * drift,
            "model.b": np.arange(8, dtype=np.int32) * step,
            "optimizer.m": np.float32(0.1 * step) * drift,
            "step": np.array(step, np.float32)}


def describe(state: dict[str, np.ndarray]) -> dict:
    from inshrink.dtypes import of_numpy
    return {name: {"dtype": of_numpy(a.dtype).name, "shape": list(a.shape),
                   "sha256": hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()}
            for name, a in sorted(state.items())}


def main() -> int:
    from inshrink.series import Series
    directory = os.path.join(HERE, "weights_only")
    shutil.rmtree(directory, ignore_errors=True)
    series = Series(directory, "balanced", keyframe_every=10, threads=1)
    for step in range(1, 5):
        series.save(step, tensors(step))
    series.retain(1, keep_weights=2, model=lambda name: name.startswith("model."))
    os.remove(os.path.join(directory, ".lock"))
    expected = {"steps": {str(s): describe(series.load(s)) for s in series.steps()},
                "weights_only": series.weights_only_steps()}
    with open(os.path.join(HERE, "weights_only.expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
    with open(os.path.join(directory, "manifest.json")) as f:
        manifest = json.load(f)
    files = {e["step"]: e["file"] for e in manifest["checkpoints"]}
    negatives = {
        # version 1 does not know weights-only file names
        "version1": dict(manifest, version=1),
        # a weights-only step's base must be a weights-only step
        "mixed_base": dict(manifest, checkpoints=[
            dict(e, base=files[4]) if e["step"] == 2 else e for e in manifest["checkpoints"]]),
    }
    for name, doc in negatives.items():
        with open(os.path.join(HERE, f"{name}.manifest.json"), "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
