"""Fixtures that several test files use, defined once; hypothesis profiles.

Plain helper functions live in :mod:`kit` (the codec checks, the command line, series states)
and :mod:`helpers` (dtypes to cover, tests of several ranks).
"""
import os

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from helpers import random_bits

settings.register_profile("ci", derandomize=True, max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=100, deadline=None)
settings.register_profile("nightly", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _one_layer(rng):
    return "m.safetensors", {"layer.weight": rng.standard_normal((128, 64)).astype(np.float32)}, \
        None


def _bf16_weights_and_f32_bits(rng):
    return "m.safetensors", {"w": (rng.standard_normal((256, 64)) * 0.02).astype(
        ml_dtypes.bfloat16), "b": random_bits(np.float32, (64,), 1)}, {"format": "np"}


def _trained_like(rng):
    return "orig.safetensors", {
        "layer.weight": (rng.standard_normal((128, 64)) * 0.02).astype(np.float32),
        "layer.bias": np.zeros(64, np.float32)}, None


MODELS = {"one_layer": _one_layer, "bf16_weights_and_f32_bits": _bf16_weights_and_f32_bits,
          "trained_like": _trained_like}
"""The small safetensors checkpoints of the command-line tests, by name: each gives its file
name, tensors and metadata from a generator seeded with 0.

* ``one_layer``: m.safetensors, ``layer.weight`` F32 (128, 64), standard normal;
* ``bf16_weights_and_f32_bits``: m.safetensors, ``w`` BF16 (256, 64) weight-like and ``b``
  F32 (64,) of random bits (NaN payloads...), metadata ``{"format": "np"}``;
* ``trained_like``: orig.safetensors, ``layer.weight`` F32 (128, 64) weight-like (its values
  quantize without a warning) and a zero ``layer.bias``.
"""


def pytest_configure(config):
    config.addinivalue_line("markers", "model(name): the checkpoint the model fixture writes "
                            "(a name of conftest.MODELS; default one_layer)")


@pytest.fixture()
def model(request, tmp_path):
    """``tmp_path`` holding one small safetensors checkpoint of :data:`MODELS`: ``one_layer``
    unless the test or its module is marked ``@pytest.mark.model(name)``."""
    from safetensors.numpy import save_file

    marker = request.node.get_closest_marker("model")
    name, tensors, metadata = MODELS[marker.args[0] if marker else "one_layer"](
        np.random.default_rng(0))
    save_file(tensors, str(tmp_path / name), metadata=metadata)
    return tmp_path


@pytest.fixture()
def index_short_way(monkeypatch):
    """The index parser takes its short way for indexes of any length (by default only from
    ``index.CANONICAL_MIN_BYTES`` on), so that tests of small files cover it: both ways must
    check alike."""
    from inshrink.container import index
    monkeypatch.setattr(index, "CANONICAL_MIN_BYTES", 0)
