"""inshrink's numcodecs codecs: numcodecs' own codec checks, registration through the entry
point, committed fixtures decoded by later versions, typed errors on bad frames."""
from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("numcodecs")  # the numcodecs extra (in dev)
import numcodecs  # noqa: E402
from numcodecs.tests import common  # noqa: E402
from numcodecs.tests.common import (check_backwards_compatibility, check_config,  # noqa: E402
                                    check_encode_decode, check_err_decode_object_buffer,
                                    check_err_encode_object_buffer, check_repr)

from inshrink import errors  # noqa: E402
from inshrink.io import frame as array
from inshrink.numcodecs import Inshrink, InshrinkQuant  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "data" / "numcodecs"


def _arrays() -> list[np.ndarray]:
    """What numcodecs' own codec tests feed a compressor, plus checkpoint-like floats."""
    rng = np.random.default_rng(42)
    return [
        np.arange(1000, dtype="<i4"),
        np.linspace(1000, 1001, 1000, dtype="<f8"),
        (rng.standard_normal(1000) * 0.02).astype("<f4"),
        (rng.standard_normal((100, 10)) * 0.02).astype("<f2"),
        np.asfortranarray((rng.standard_normal((20, 50)) * 0.02).astype("<f4")),
        rng.integers(0, 2, size=1000).astype(bool),
        np.arange(1000, dtype="u1").reshape(10, 100),
        np.arange(100, dtype=">f8"),
        np.array(["2026-12-01", "1970-01-01"], "M8[D]"),
        np.array(3.25, "<f4"),
        np.zeros(0, "<f4"),
    ]


CODECS = [Inshrink(), Inshrink(level=19, chunk_bytes=1024), InshrinkQuant(bins=256),
          InshrinkQuant(bins=16, domain="signed_log", protect=0.001, max_rel_l2=0.05)]


@pytest.mark.parametrize("arr", _arrays(), ids=lambda a: f"{a.dtype.str}{a.shape}")
def test_lossless_encode_decode(arr):
    for codec in CODECS[:2]:
        check_encode_decode(arr, codec)


@pytest.mark.parametrize("arr", [a for a in _arrays() if a.dtype.kind not in "f"],
                         ids=lambda a: a.dtype.str)
def test_quant_codec_stores_other_dtypes_exactly(arr):
    check_encode_decode(arr, CODECS[2])


@pytest.mark.parametrize("arr", [a for a in _arrays() if a.dtype.kind == "f" and a.size],
                         ids=lambda a: f"{a.dtype.str}{a.shape}")
def test_quant_codec_within_its_reported_error(arr):
    codec = CODECS[3]
    check_encode_decode(arr, codec, precision=1)
    blob = codec.encode(arr)
    rep = array.report(blob)
    flat = arr.reshape(-1, order="A").astype(np.float64)
    back = np.asarray(codec.decode(blob), np.float64).reshape(-1)
    if rep is None:  # no bin count met the bound: exact
        assert back.tobytes() == flat.tobytes() or arr.dtype.byteorder == ">"
        return
    err = np.linalg.norm(back - flat) / np.linalg.norm(flat)
    assert err == pytest.approx(rep["rel_l2_error"], rel=1e-3, abs=1e-12)
    assert err <= 0.05


def test_bf16_round_trips_and_quantizes():
    x = (np.random.default_rng(1).standard_normal(4096) * 0.02).astype(ml_dtypes.bfloat16)
    assert Inshrink().decode(Inshrink().encode(x)).tobytes() == x.tobytes()
    blob = InshrinkQuant(bins=16).encode(x)
    assert array.report(blob)["levels"] <= 16 and len(blob) < x.nbytes / 2


@pytest.mark.parametrize("codec", CODECS, ids=repr)
def test_config_repr_and_registry(codec, monkeypatch):
    check_config(codec)
    # check_repr evaluates the repr among numcodecs' own names: add ours there
    for cls in (Inshrink, InshrinkQuant):
        monkeypatch.setattr(common, cls.__name__, cls, raising=False)
    check_repr(repr(codec))
    assert type(numcodecs.get_codec({"id": codec.codec_id})) is type(codec)
    assert numcodecs.get_codec(codec.get_config()) == codec


def test_object_buffers_are_refused():
    for codec in CODECS[:3]:
        check_err_encode_object_buffer(codec)
        check_err_decode_object_buffer(codec)


@pytest.mark.parametrize("kwargs", [{"level": 99}, {"chunk_bytes": 4}, {"chunk_bytes": 2.0}])
def test_bad_lossless_arguments(kwargs):
    with pytest.raises(errors.InvalidArgumentError):
        Inshrink(**kwargs)


@pytest.mark.parametrize("kwargs", [{"bins": -1}, {"domain": "cubic"}, {"protect": 1.0},
                                    {"max_rel_l2": -0.1}])
def test_bad_quant_arguments(kwargs):
    with pytest.raises(errors.InvalidArgumentError):
        InshrinkQuant(**kwargs)


def test_decode_into_a_too_small_out_is_refused_before_allocating():
    blob = Inshrink().encode(np.arange(1000, dtype="<f4"))
    with pytest.raises(errors.LimitExceededError):
        Inshrink().decode(blob, out=np.empty(999, "<f4"))
    with pytest.raises(errors.LimitExceededError):
        Inshrink().decode(blob, out=np.empty(2000, "<f4"))
    with pytest.raises(errors.CorruptError):
        Inshrink().decode(blob[:-1])


def _fixture_arrays() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [(rng.standard_normal((64, 32)) * 0.02).astype("<f4"),
            np.linspace(-3, 3, 1000, dtype="<f8"),
            (rng.standard_normal(2000) * 0.1).astype("<f2"),
            np.arange(-500, 500, dtype="<i8"),
            np.asfortranarray(rng.standard_normal((30, 40)).astype("<f4")),
            np.arange(256, dtype="u1")]


def test_backwards_compatibility(monkeypatch):
    """Frames encoded by an earlier release (committed under tests/data/numcodecs) decode the
    same today: exactly for the lossless codecs, within the lossy codec's error."""
    codecs = [Inshrink(), Inshrink(level=3, chunk_bytes=512), InshrinkQuant(bins=32)]
    for codec in codecs:
        root = FIXTURES / "fixture" / codec.codec_id
        assert len(list(root.glob("array.*.npy"))) == len(_fixture_arrays())
    # numcodecs' helper writes whatever is missing: the checks above make sure nothing is
    monkeypatch.chdir(FIXTURES)
    check_backwards_compatibility("inshrink", _fixture_arrays(), codecs[:2])
    check_backwards_compatibility("inshrink-quant", _fixture_arrays(), codecs[2:],
                                  precision=[0])
    frames = sorted((FIXTURES / "fixture").glob("*/codec.*/encoded.*.dat"))
    assert len(frames) == 3 * len(_fixture_arrays())
    assert all(f.read_bytes().startswith(array.MAGIC) for f in frames)
    config = json.loads((FIXTURES / "fixture" / "inshrink-quant" / "codec.00" /
                         "config.json").read_text())
    assert config["id"] == "inshrink-quant" and config["bins"] == 32


def test_a_zarr_v2_array_takes_them_as_compressor(tmp_path):
    zarr = pytest.importorskip("zarr")
    x = (np.random.default_rng(3).standard_normal((96, 40)) * 0.02).astype("<f4")
    for codec in (Inshrink(), InshrinkQuant(bins=64)):
        path = tmp_path / codec.codec_id
        zarr.create_array(str(path), shape=x.shape, chunks=(32, 40), dtype=x.dtype,
                          zarr_format=2, compressors=codec)[...] = x
        meta = json.loads((path / ".zarray").read_text())
        assert meta["compressor"] == codec.get_config()
        back = zarr.open_array(str(path), mode="r")[...]
        if codec.codec_id == "inshrink":
            assert back.tobytes() == x.tobytes()
        else:
            assert np.linalg.norm(back - x) / np.linalg.norm(x) < 0.05


def test_quant_settings_are_validated_once_without_encoding(monkeypatch):
    def no_encode(*args, **kwargs):
        raise AssertionError("the constructor encoded an array")
    monkeypatch.setattr(array, "encode_config", no_encode)
    monkeypatch.setattr(array, "encode", no_encode)
    codec = InshrinkQuant(bins=8, max_rel_l2=0.05)
    assert "_config" not in codec.get_config()
    for kwargs in ({"max_rel_l2": 0}, {"protect": False}, {"bins": 8.0}):
        with pytest.raises(errors.InvalidArgumentError):
            InshrinkQuant(**kwargs)


def test_numpy_scalar_quant_settings_write_what_python_numbers_write():
    x = (np.random.default_rng(1).standard_normal(3000) * 0.02).astype("<f4")
    codec = InshrinkQuant(bins=np.int32(12), protect=np.float64(0.001), seed=np.int64(2))
    assert codec.get_config() == InshrinkQuant(bins=12, protect=0.001, seed=2).get_config()
    assert codec.encode(x) == InshrinkQuant(bins=12, protect=0.001, seed=2).encode(x)


def test_a_lossy_codec_that_stores_a_buffer_exactly_warns_once():
    # 16 levels cannot reach 1% relative L2 on weight-like data: the codec falls back to
    # lossless, and the user must hear of it (once per codec, not once per chunk)
    x = (np.random.default_rng(2).standard_normal(20000) * 0.02).astype("<f4")
    codec = InshrinkQuant(bins=16, max_rel_l2=0.01)
    with pytest.warns(errors.LossyFallbackWarning, match="max_rel_l2=0.01") as caught:
        blob = codec.encode(x)
        codec.encode(x)
    assert len([w for w in caught if issubclass(w.category, errors.LossyFallbackWarning)]) == 1
    assert array.report(blob) is None
    assert issubclass(errors.LossyFallbackWarning, UserWarning)


def test_a_lossy_codec_that_quantizes_does_not_warn():
    import warnings
    x = (np.random.default_rng(2).standard_normal(20000) * 0.02).astype("<f4")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        blob = InshrinkQuant(bins=256, max_rel_l2=0.01).encode(x)
        InshrinkQuant(bins=16, max_rel_l2=0.01).encode(np.zeros(0, "<f4"))  # nothing to fit
        InshrinkQuant(bins=16, max_rel_l2=0.01).encode(np.arange(5, dtype="<i4"))
    assert array.report(blob)["rel_l2_error"] <= 0.01
