"""inshrink as a zarr v3 serializer: real arrays in a LocalStore, written and read back."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

zarr = pytest.importorskip("zarr")  # the zarr extra (in dev)
from zarr.storage import LocalStore  # noqa: E402

from inshrink import errors  # noqa: E402
from inshrink.io import frame as array
from inshrink.zarr import InkCodec, InkQuantCodec  # noqa: E402

RNG = np.random.default_rng(5)


def _weights(shape, dtype="float32") -> np.ndarray:
    return (RNG.standard_normal(shape) * 0.02).astype(dtype)


def _special_f32() -> np.ndarray:
    bits = np.array([0x7FC12345, 0xFF800000, 0x80000000, 0x00000001, 0x7F800001], "<u4")
    x = _weights((37, 23))
    x.reshape(-1)[:5] = bits.view("<f4")
    return x


def _write(path, x, serializer, chunks=(16, 10)):
    a = zarr.create_array(LocalStore(path), shape=x.shape, chunks=chunks[:x.ndim],
                          dtype=x.dtype, serializer=serializer, compressors=None)
    a[...] = x
    return zarr.open_array(LocalStore(path), mode="r")


ARRAYS = [
    _special_f32(),                                      # NaN payloads, -0, subnormal
    _weights((37, 23), "float16"),
    _weights((37, 23), "float64"),
    RNG.integers(-2**31, 2**31, (37, 23)).astype("int32"),
    RNG.integers(0, 256, (37, 23)).astype("uint8"),
    RNG.integers(0, 2, (37, 23)).astype(bool),
    (_weights((37, 23)) + 1j * _weights((37, 23))).astype("complex64"),
    _weights((37, 23)).astype(">f4"),
]


def _check_exact(path, x, codec):
    back = _write(path, x, codec)[...]
    assert back.shape == x.shape and back.dtype == x.dtype.newbyteorder("=")
    assert back.astype(x.dtype).tobytes() == x.tobytes()


@pytest.mark.parametrize("x", ARRAYS, ids=lambda x: x.dtype.str)
def test_lossless_arrays_are_bit_exact(tmp_path, x):
    _check_exact(tmp_path / "a.zarr", x, InkCodec())


@pytest.mark.parametrize("x", [x for x in ARRAYS if x.dtype.kind not in "fc"],
                         ids=lambda x: x.dtype.str)
def test_quant_codec_stores_other_dtypes_exactly(tmp_path, x):
    _check_exact(tmp_path / "a.zarr", x, InkQuantCodec(bins=8))


def test_metadata_names_the_codec_and_a_fresh_process_reads_it(tmp_path):
    x = _weights((40, 30))
    _write(tmp_path / "a.zarr", x, InkCodec(level=3))
    meta = json.loads((tmp_path / "a.zarr" / "zarr.json").read_text())
    assert meta["codecs"] == [{"name": "inshrink",
                               "configuration": {"level": 3, "chunk_bytes": 4 << 20}}]
    # zarr finds the codec through the entry point, without importing inshrink first
    code = ("import sys, zarr, numpy as np; a = zarr.open_array(sys.argv[1], mode='r'); "
            "sys.stdout.write(a[...].tobytes().hex())")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "a.zarr")],
                         capture_output=True, text=True, timeout=60, check=True)
    assert bytes.fromhex(out.stdout) == x.tobytes()


def test_lossless_is_smaller_than_zarr_default_on_weights(tmp_path):
    x = _weights((256, 256))
    _write(tmp_path / "ink.zarr", x, InkCodec(), chunks=(128, 256))
    zarr.create_array(LocalStore(tmp_path / "default.zarr"), shape=x.shape,
                      chunks=(128, 256), dtype=x.dtype)[...] = x

    def size(name):
        return sum(p.stat().st_size for p in (tmp_path / name / "c").rglob("*") if p.is_file())
    assert size("ink.zarr") * 1.1 < size("default.zarr")


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_quantized_arrays_are_within_the_reported_error(tmp_path, dtype):
    x = _weights((64, 40), dtype)
    codec = InkQuantCodec(bins=16, protect=0.001)
    back = _write(tmp_path / "q.zarr", x, codec, chunks=(32, 40))[...]
    assert back.dtype == x.dtype and not np.array_equal(back, x)
    chunk_files = sorted((tmp_path / "q.zarr" / "c").rglob("*"))
    chunk_files = [p for p in chunk_files if p.is_file()]
    assert len(chunk_files) == 2
    for i, path in enumerate(chunk_files):  # c/0/0, c/1/0: rows [32 i, 32 (i + 1))
        report = array.report(path.read_bytes())
        want, got = (a[32 * i:32 * (i + 1)].astype(np.float64) for a in (x, back))
        rel = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert rel == pytest.approx(report["rel_l2_error"], rel=1e-3)
        assert np.abs(got - want).max() == pytest.approx(report["max_abs_error"], rel=1e-3)


def test_max_rel_l2_bounds_every_chunk(tmp_path):
    x = _weights((64, 40))
    back = _write(tmp_path / "q.zarr", x, InkQuantCodec(bins=256, max_rel_l2=0.01),
                  chunks=(32, 40))[...]
    for i in range(2):
        want, got = x[32 * i:32 * (i + 1)], back[32 * i:32 * (i + 1)]
        assert np.linalg.norm(got - want) / np.linalg.norm(want) <= 0.01


def test_codec_config_round_trips_and_bad_arguments_are_typed():
    codec = InkQuantCodec(bins=32, domain="signed_log", max_rel_l2=0.02)
    assert InkQuantCodec.from_dict(codec.to_dict()) == codec
    assert InkCodec.from_dict({"name": "inshrink"}) == InkCodec()
    assert zarr.registry.get_codec_class("inshrink-quant") is InkQuantCodec
    assert len({InkQuantCodec(bins=4), InkQuantCodec(bins=4), InkCodec()}) == 2
    assert InkCodec() != InkQuantCodec() and InkCodec(level=3) != InkCodec()
    with pytest.raises(errors.InvalidArgumentError):
        InkQuantCodec(domain="cubic")
    with pytest.raises(errors.InvalidArgumentError):
        InkCodec(level=1000)


def test_a_damaged_chunk_is_a_typed_error(tmp_path):
    x = _weights((32, 10))
    _write(tmp_path / "a.zarr", x, InkCodec(), chunks=(32, 10))
    chunk = tmp_path / "a.zarr" / "c" / "0" / "0"
    chunk.write_bytes(chunk.read_bytes()[:-3])
    with pytest.raises(errors.CorruptError):
        zarr.open_array(LocalStore(tmp_path / "a.zarr"), mode="r")[...]
    # a valid frame of another dtype in the chunk's place
    chunk.write_bytes(array.encode(np.zeros((32, 10), "int32")))
    with pytest.raises(errors.CorruptError, match="needs float32"):
        zarr.open_array(LocalStore(tmp_path / "a.zarr"), mode="r")[...]


def test_bfloat16_arrays(tmp_path):
    """The bfloat16 data type: zarr's default codecs, inshrink lossless bit-exact (NaN payload
    included), inshrink-quant within its report, and a fresh process that imports inshrink.zarr
    reads it."""
    import ml_dtypes

    x = _weights((48, 40)).astype(ml_dtypes.bfloat16)
    x.view("<u2")[0, :2] = [0x7FD5, 0x8000]  # NaN payload, -0
    zarr.create_array(LocalStore(tmp_path / "d.zarr"), shape=x.shape, chunks=(24, 40),
                      dtype=x.dtype, fill_value=float("nan"))[...] = x
    assert zarr.open_array(LocalStore(tmp_path / "d.zarr"))[...].tobytes() == x.tobytes()
    back = _write(tmp_path / "ink.zarr", x, InkCodec(), chunks=(24, 40))
    assert back.metadata.data_type.to_json(zarr_format=3) == "bfloat16"
    assert back[...].dtype == x.dtype and back[...].tobytes() == x.tobytes()
    y = x.copy()
    y.view("<u2")[0, 0] = 0  # a NaN would dominate the error
    q = _write(tmp_path / "q.zarr", y, InkQuantCodec(bins=16), chunks=(48, 40))[...]
    report = array.report((tmp_path / "q.zarr" / "c" / "0" / "0").read_bytes())
    want, got = y.astype(np.float64), q.astype(np.float64)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) == pytest.approx(
        report["rel_l2_error"], rel=1e-3)
    code = ("import sys, zarr, inshrink.zarr; a = zarr.open_array(sys.argv[1], mode='r'); "
            "sys.stdout.write(a[...].tobytes().hex())")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "ink.zarr")],
                         capture_output=True, text=True, timeout=60, check=True)
    assert bytes.fromhex(out.stdout) == x.tobytes()


def test_a_crc32c_after_the_serializer_catches_damage_the_frame_cannot(tmp_path):
    """Frames carry no checksum (spec 24.5): zarr's crc32c codec chained after inshrink
    detects a flipped bit in a raw byte plane, which the frame alone decodes silently."""
    x = np.random.default_rng(0).random((64, 16)).astype(np.float32)  # noisy: raw planes
    for name, compressors in (("plain", None), ("crc", [zarr.codecs.Crc32cCodec()])):
        a = zarr.create_array(LocalStore(tmp_path / name), shape=x.shape, chunks=x.shape,
                              dtype=x.dtype, serializer=InkCodec(), compressors=compressors)
        a[...] = x
        chunk = tmp_path / name / "c" / "0" / "0"
        data = bytearray(chunk.read_bytes())
        data[-10] ^= 1  # a mantissa byte of the last plane, stored raw
        chunk.write_bytes(bytes(data))
    assert not np.array_equal(zarr.open_array(LocalStore(tmp_path / "plain"))[...], x)
    with pytest.raises(ValueError):  # zarr's checksum error
        zarr.open_array(LocalStore(tmp_path / "crc"))[...]


def test_a_bfloat16_type_zarr_already_has_is_left_in_place(monkeypatch):
    from zarr.core.dtype import data_type_registry

    import inshrink.zarr as ink_zarr

    theirs = type("TheirBFloat16", (ink_zarr.BFloat16,), {})
    monkeypatch.setitem(data_type_registry.contents, "bfloat16", theirs)
    ink_zarr._register_bfloat16()
    assert data_type_registry.contents["bfloat16"] is theirs
    monkeypatch.delitem(data_type_registry.contents, "bfloat16")
    ink_zarr._register_bfloat16()
    assert data_type_registry.contents["bfloat16"] is ink_zarr.BFloat16


def test_sharded_arrays_keep_inshrink_as_the_inner_serializer(tmp_path):
    x = _weights((256, 64))
    a = zarr.create_array(LocalStore(tmp_path / "s.zarr"), shape=x.shape, chunks=(32, 64),
                          shards=(128, 64), dtype=x.dtype, serializer=InkCodec(),
                          compressors=None)
    a[...] = x
    b = zarr.open_array(LocalStore(tmp_path / "s.zarr"), mode="r")
    codecs = json.loads((tmp_path / "s.zarr" / "zarr.json").read_text())["codecs"]
    assert codecs[0]["name"] == "sharding_indexed"
    assert codecs[0]["configuration"]["codecs"][0]["name"] == "inshrink"
    assert b[...].tobytes() == x.tobytes()
    assert np.array_equal(b[40:50, 3:9], x[40:50, 3:9])  # one inner chunk read


def test_each_codec_makes_its_numcodecs_codec_once(tmp_path, monkeypatch):
    import inshrink.numcodecs as ink_numcodecs
    made = []
    init = ink_numcodecs.InshrinkQuant.__init__

    def counting_init(self, *args, **kwargs):
        made.append(1)
        init(self, *args, **kwargs)
    monkeypatch.setattr(ink_numcodecs.InshrinkQuant, "__init__", counting_init)
    codec = InkQuantCodec(bins=8, max_rel_l2=0.05)
    assert made == [1]
    x = _weights((64, 10))
    back = _write(tmp_path / "a.zarr", x, codec, chunks=(8, 10))[...]  # 8 chunks
    assert back.shape == x.shape
    # zarr may rebuild the codec from the array's metadata, never once per chunk
    assert len(made) < 8, made
    with pytest.raises(errors.InvalidArgumentError):
        InkQuantCodec(max_rel_l2=0)


def test_the_documented_lossy_example_quantizes(tmp_path):
    # docs/zarr.md's setting on weight-like data: quantized (not the lossless fallback),
    # several times smaller, within its bound
    import warnings
    x = _weights((512, 256))
    with warnings.catch_warnings():
        warnings.simplefilter("error", errors.LossyFallbackWarning)
        a = zarr.create_array(LocalStore(tmp_path / "m.zarr"), shape=x.shape, dtype=x.dtype,
                              compressors=None,
                              serializer=InkQuantCodec(bins=256, max_rel_l2=0.01))
        a[...] = x
    back = zarr.open_array(LocalStore(tmp_path / "m.zarr"), mode="r")[...]
    assert x.nbytes / a.nbytes_stored() > 3
    assert np.linalg.norm(back - x) / np.linalg.norm(x) <= 0.01


def test_a_zarr_lossy_codec_that_falls_back_warns(tmp_path):
    x = _weights((64, 40))
    with pytest.warns(errors.LossyFallbackWarning, match="losslessly"):
        _write(tmp_path / "f.zarr", x, InkQuantCodec(bins=16, max_rel_l2=0.01))
