"""Lossless round trips: bit-exact for every dtype, shape and value."""
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import inshrink
from inshrink.io.rebase import write_delta
from helpers import ALL_DTYPES, assert_bit_exact, random_bits, wait_for_child


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (1,), (257,), (33, 65)])
def test_every_dtype_and_shape_round_trips_bit_exact(tmp_path, dtype, shape):
    tensors = {"x": random_bits(dtype, shape, seed=len(shape))}
    inshrink.save(tmp_path / "a.ink", tensors)
    assert_bit_exact(tensors["x"], inshrink.load(tmp_path / "a.ink")["x"])


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, ml_dtypes.bfloat16])
def test_special_float_values_are_preserved(tmp_path, dtype):
    finfo = ml_dtypes.finfo(dtype)
    values = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, finfo.smallest_subnormal,
                       -finfo.smallest_subnormal, finfo.max, finfo.min, finfo.tiny], dtype)
    word = {8: np.uint64, 4: np.uint32, 2: np.uint16}[np.dtype(dtype).itemsize]
    payload_nan = np.array([values.view(word)[4] | 1], word).view(dtype)  # NaN with a payload
    x = np.concatenate([values, payload_nan])
    inshrink.save(tmp_path / "s.ink", {"x": x})
    assert_bit_exact(x, inshrink.load(tmp_path / "s.ink")["x"])


def test_float8_every_bit_pattern(tmp_path):
    for dtype in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2):
        x = np.arange(256, dtype=np.uint8).view(dtype)
        inshrink.save(tmp_path / "f8.ink", {"x": x})
        assert_bit_exact(x, inshrink.load(tmp_path / "f8.ink")["x"])


def test_non_contiguous_and_big_endian_inputs(tmp_path):
    base = random_bits(np.float32, (40, 30), seed=3)
    tensors = {"strided": base[::3, 1::2], "transposed": base.T, "big": base.astype(">f4"),
               "big_int": np.arange(-50, 50, dtype=">i8"), "fortran": np.asfortranarray(base)}
    inshrink.save(tmp_path / "n.ink", tensors)
    out = inshrink.load(tmp_path / "n.ink")
    for name, value in tensors.items():
        assert_bit_exact(value, out[name])
        assert out[name].dtype.byteorder in "<=|"


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_output_bytes_do_not_depend_on_threads(tmp_path, threads):
    tensors = {"a": random_bits(np.float32, (5000,), 1), "b": random_bits(np.int16, (77,), 2)}
    writer_args = dict(chunk_bytes=1024, threads=threads)
    with inshrink.Writer(tmp_path / "t.ink", **writer_args) as w:
        for k, v in tensors.items():
            w.add(k, v)
    with inshrink.Writer(tmp_path / "ref.ink", chunk_bytes=1024, threads=1) as w:
        for k, v in tensors.items():
            w.add(k, v)
    assert (tmp_path / "t.ink").read_bytes() == (tmp_path / "ref.ink").read_bytes()
    out = inshrink.load(tmp_path / "t.ink", threads=threads)
    for k, v in tensors.items():
        assert_bit_exact(v, out[k])


def test_streaming_writer_equals_one_shot_save(tmp_path):
    tensors = {f"layer.{i}": random_bits(np.float16, (i * 31,), i) for i in range(6)}
    inshrink.save(tmp_path / "one.ink", tensors, {"k": "v"}, threads=1)
    with inshrink.Writer(tmp_path / "stream.ink", {"k": "v"}, threads=1) as w:
        for k, v in tensors.items():
            w.add(k, v)
    assert (tmp_path / "one.ink").read_bytes() == (tmp_path / "stream.ink").read_bytes()


def test_random_access_equals_full_load(tmp_path):
    tensors = {f"t{i}": random_bits(ALL_DTYPES[i], (i + 2, 3), i) for i in range(len(ALL_DTYPES))}
    inshrink.save(tmp_path / "r.ink", tensors)
    full = inshrink.load(tmp_path / "r.ink")
    with inshrink.open(tmp_path / "r.ink") as f:
        assert f.keys() == list(tensors)
        for name in reversed(f.keys()):
            assert_bit_exact(full[name], f[name])


def test_multi_chunk_tensor_and_chunk_streaming(tmp_path):
    x = random_bits(np.float64, (1000,), 9)
    with inshrink.Writer(tmp_path / "c.ink", chunk_bytes=800) as w:
        w.add("x", x)
    with inshrink.open(tmp_path / "c.ink", threads=2) as f:
        pieces = []
        f.read_into("x", lambda start, chunk: pieces.append((start, chunk.tobytes())))
        assert [p[0] for p in pieces] == list(range(0, 8000, 800))
        assert b"".join(p[1] for p in pieces) == x.tobytes()
        assert_bit_exact(x, f["x"])


def test_realistic_weights_compress(tmp_path):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal(200_000) * 0.02).astype(ml_dtypes.bfloat16)
    report = inshrink.save(tmp_path / "w.ink", {"w": w})
    assert report[0].ratio > 1.2  # the exponent plane of Gaussian weights is highly skewed
    assert report[0].nbytes == w.nbytes


def test_array_likes_are_accepted(tmp_path):
    class ViaArray:
        def __array__(self, dtype=None, copy=None):
            return np.arange(6, dtype=np.int32).reshape(2, 3)

    class ViaDlpack:
        def __init__(self):
            self._a = np.linspace(0, 1, 5, dtype=np.float32)

        def __dlpack__(self, **kwargs):
            return self._a.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self._a.__dlpack_device__()

    inshrink.save(tmp_path / "l.ink", {"a": ViaArray(), "d": ViaDlpack(), "list": [1.5, 2.5]})
    out = inshrink.load(tmp_path / "l.ink")
    assert_bit_exact(np.arange(6, dtype=np.int32).reshape(2, 3), out["a"])
    assert_bit_exact(np.linspace(0, 1, 5, dtype=np.float32), out["d"])
    assert_bit_exact(np.array([1.5, 2.5]), out["list"])


dtype_strategy = st.sampled_from([np.dtype(d) for d in ALL_DTYPES if np.dtype(d).kind != "V"])


@given(arrays=st.dictionaries(
    st.text(min_size=1, max_size=20),
    hnp.arrays(dtype=st.sampled_from(["<f4", "<f8", "<f2", "<i4", "<u2", "|i1", "|b1", "<c8"]),
               shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=6)),
    max_size=5), chunk_bytes=st.integers(8, 4096))
def test_property_any_arrays_round_trip(tmp_path_factory, arrays, chunk_bytes):
    path = tmp_path_factory.mktemp("h") / "h.ink"
    with inshrink.Writer(path, chunk_bytes=chunk_bytes, threads=1) as w:
        for k, v in arrays.items():
            w.add(k, v)
    out = inshrink.load(path)
    assert list(out) == list(arrays)
    for k, v in arrays.items():
        assert_bit_exact(v, out[k])


@given(data=st.binary(max_size=2000), dtype=st.sampled_from(["BF16", "F32", "F64", "U64"]))
def test_property_random_bytes_round_trip(tmp_path_factory, data, dtype):
    from inshrink.dtypes import by_name
    dt = by_name(dtype).numpy
    x = np.frombuffer(data[:len(data) - len(data) % dt.itemsize], dt)
    path = tmp_path_factory.mktemp("b") / "b.ink"
    inshrink.save(path, {"x": x}, threads=1)
    assert_bit_exact(x, inshrink.load(path)["x"])


@pytest.mark.parametrize("use_mmap", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
def test_read_paths_agree(tmp_path, use_mmap, threads):
    tensors = {"a": random_bits(np.float32, (3000,), 1), "b": random_bits(np.int64, (5,), 2),
               "c": random_bits(ml_dtypes.bfloat16, (0,), 3)}
    with inshrink.Writer(tmp_path / "p.ink", chunk_bytes=1000) as w:
        for k, v in tensors.items():
            w.add(k, v)
    loaded = inshrink.load(tmp_path / "p.ink", threads=threads, mmap=use_mmap)
    with inshrink.open(tmp_path / "p.ink", threads=threads, mmap=use_mmap) as f:
        for k, v in tensors.items():
            assert_bit_exact(v, loaded[k])
            assert_bit_exact(v, f[k])
            assert loaded[k].ctypes.data % 64 == 0
            out = bytearray(v.nbytes)
            lock = __import__("threading").Lock()

            def sink(offset, chunk):
                with lock:
                    out[offset:offset + chunk.size] = chunk.tobytes()
            f.read_into(k, sink, in_order=False)
            assert bytes(out) == v.tobytes()


def _header_version_and_features(path) -> tuple[int, int, int]:
    data = open(path, "rb").read(24)
    return (int.from_bytes(data[8:10], "little"), int.from_bytes(data[10:12], "little"),
            int.from_bytes(data[16:24], "little"))


def test_the_container_marks_the_minor_its_caller_asks_for(tmp_path):
    """The container knows no stages: the caller says which minor the chains need."""
    from inshrink.container import layout
    from inshrink.container.writer import ContainerWriter
    for minor in (0, 4):
        writer = ContainerWriter(tmp_path / f"m{minor}.ink")
        writer.commit({}, minor=minor)
        assert _header_version_and_features(tmp_path / f"m{minor}.ink")[:2] == (1, minor)
    for bad in (-1, layout.VERSION_MINOR + 1, 2.0, None):
        writer = ContainerWriter(tmp_path / "bad.ink")
        with pytest.raises(inshrink.InvalidArgumentError, match="minor"):
            writer.commit({}, minor=bad)
        writer.abort()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m0.ink", "m4.ink"]
    # the Writer asks the stages: a quantized tensor needs 1.1
    report = inshrink.save(tmp_path / "q.ink",
                           {"w": np.linspace(-1, 1, 10000, dtype=np.float32).reshape(100, 100)},
                           policy=inshrink.Policy.uniform(inshrink.QuantConfig(bins=16)))
    assert report[0].quantized
    assert _header_version_and_features(tmp_path / "q.ink")[:2] == (1, 1)


def test_large_index_is_stored_compressed_and_small_one_plain(tmp_path):
    from inshrink.container import layout
    many = {f"block.{i}.norm.weight": np.full(3, i, np.float32) for i in range(60)}
    inshrink.save(tmp_path / "many.ink", many, metadata={"note": "x" * 5000})
    major, minor, required = _header_version_and_features(tmp_path / "many.ink")
    assert (major, minor) == (1, 3) and required == layout.FEATURE_ZINDEX
    back = inshrink.load(tmp_path / "many.ink")
    assert list(back) == list(many)
    for name in many:
        assert_bit_exact(many[name], back[name])
    with inshrink.open(tmp_path / "many.ink") as f:
        assert f.metadata == {"note": "x" * 5000}
        assert f.format_version == "1.3"
    # The index is what a compressed index saves: far below the JSON's length.
    assert (tmp_path / "many.ink").stat().st_size < 60 * 4 * 64 + 4000

    inshrink.save(tmp_path / "one.ink", {"x": np.ones(3, np.float32)})
    assert _header_version_and_features(tmp_path / "one.ink") == (1, 0, 0)
    with inshrink.open(tmp_path / "one.ink") as f:
        assert f.format_version == "1.0"


@settings(max_examples=25, deadline=None)
@given(names=st.lists(st.text(min_size=1, max_size=40), min_size=0, max_size=40, unique=True),
       note=st.text(max_size=3000))
def test_property_index_round_trips_plain_or_compressed(tmp_path_factory, names, note):
    path = tmp_path_factory.mktemp("zindex") / "f.ink"
    tensors = {n: np.arange(i % 5, dtype=np.int16) for i, n in enumerate(names)}
    inshrink.save(path, tensors, metadata={"note": note})
    with inshrink.open(path) as f:
        assert list(f) == names and f.metadata == {"note": note}
        for n in names:
            assert_bit_exact(tensors[n], f[n])


@settings(max_examples=30, deadline=None)
@given(arr=hnp.arrays(st.sampled_from([np.float32, np.float64, np.float16, np.int32,
                                       np.uint16]),
                      hnp.array_shapes(min_dims=0, max_dims=2, max_side=70)))
def test_property_tiny_tensor_layout_is_never_larger(tmp_path_factory, arr):
    """A tiny tensor may be stored as one plane; that choice never makes the file bigger and
    decodes bit-exactly."""
    d = tmp_path_factory.mktemp("tiny")
    tensors = {"x": arr, "y": np.ascontiguousarray(np.flip(arr))}
    inshrink.save(d / "chosen.ink", tensors)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(inshrink.io.writer, "TINY_TENSOR_BYTES", 0)
        inshrink.save(d / "planes.ink", tensors)
    assert (d / "chosen.ink").stat().st_size <= (d / "planes.ink").stat().st_size
    back = inshrink.load(d / "chosen.ink")
    assert_bit_exact(arr, back["x"])


def test_tiny_bias_is_one_record(tmp_path):
    norm = np.random.default_rng(0).normal(0, 0.02, 16).astype(np.float32)
    inshrink.save(tmp_path / "n.ink", {"ln.weight": norm})
    from inshrink.container.reader import ContainerReader
    reader = ContainerReader(tmp_path / "n.ink")
    entry = reader.index.tensors[0]
    reader.close()
    assert entry.codec == [{"id": "bytegroup", "word": 1, "rotate": False}]
    assert len(entry.streams) == 1
    assert_bit_exact(norm, inshrink.load(tmp_path / "n.ink")["ln.weight"])


@pytest.mark.parametrize("numel", [16, 5000])  # tiny (layout chosen by trial) and larger
def test_short_source_is_a_typed_error(tmp_path, numel):
    from inshrink import dtypes
    data = np.arange(numel, dtype=np.float32).tobytes()
    with inshrink.Writer(tmp_path / "s.ink") as w:
        with pytest.raises(inshrink.errors.InvalidArgumentError, match="source returned"):
            w.add_source("x", dtypes.of_numpy(np.dtype(np.float32)), (numel,),
                         lambda a, b: data[a:b][:-4])
            w.close()
        w.abort()


def test_compressed_index_frames_are_validated():
    import json as _json
    import struct

    import zstandard

    from inshrink.container.index import unpack_index
    from inshrink.errors import CorruptError, LimitExceededError
    text = _json.dumps({"tensors": [], "metadata": {"a": "b" * 2000}}).encode()
    good = zstandard.ZstdCompressor(write_checksum=True, write_content_size=True).compress(text)
    size = 10_000  # the size of the file the frame is in
    assert unpack_index(good, size) == text
    bad_checksum = good[:-1] + bytes([good[-1] ^ 1])
    no_size = zstandard.ZstdCompressor(write_content_size=False).compress(text)
    # a valid frame of the text, but declaring a 2^28-byte window (rule I-0a)
    wide = (b"\x28\xb5\x2f\xfd" + bytes([0x80, 0x90]) + struct.pack("<I", len(text))
            + ((len(text) << 3) | 1).to_bytes(3, "little") + text)
    for frame in (bad_checksum, good + b"JUNK", no_size, b"", b"not a frame", good[:10], wide):
        with pytest.raises(CorruptError):
            unpack_index(frame, size)
    huge = zstandard.ZstdCompressor(write_content_size=True).compress(bytes((64 << 20) + 1))
    with pytest.raises(LimitExceededError):
        unpack_index(huge, 1 << 40)
    # within 64 MiB, but more than 4 x the file size (and 1 MiB): refused before decompressing
    big = zstandard.ZstdCompressor(write_content_size=True).compress(bytes(2 << 20))
    with pytest.raises(LimitExceededError, match=r"^\[I-0a\]"):
        unpack_index(big, 500_000)
    assert len(unpack_index(big, 600_000)) == 2 << 20


def test_delta_file_reads_without_its_base_where_no_tensor_needs_it(tmp_path):
    """Spec 8.2: the base is needed only by the xor and codedelta tensors."""
    base = {"w": np.arange(64, dtype=np.float32)}
    reference = {"file": "base.ink", "sha256": "0" * 64, "digest": 2}
    # nothing to gain against an unrelated base: every tensor is stored standalone
    path = tmp_path / "d.ink"
    other = {"w": np.random.default_rng(0).standard_normal(64).astype(np.float32),
             "n": np.arange(5, dtype=np.int32)}
    inshrink.save(tmp_path / "whole.ink", other, threads=1)
    write_delta(tmp_path / "whole.ink", path, src_codes={}, base_exact=base, base_codes={},
                base_file=reference)
    with inshrink.open(path) as f:
        assert f.base == reference and f.format_version == "1.5"
        assert not any(i.codec.startswith(("xor", "codedelta")) for i in f.infos())
        loaded = f.load()
        assert f.verify() == []
    assert all(loaded[k].tobytes() == v.tobytes() for k, v in other.items())
    # and in a file with an xor tensor, the standalone tensors still read alone
    vectors = Path(__file__).resolve().parent.parent / "spec" / "vectors"
    with inshrink.open(vectors / "delta.ink") as f:
        assert f.info("w").codec.startswith("xor")
        assert f["new"].tolist() == [7] * 5
        with pytest.raises(inshrink.errors.BaseMismatchError, match=r"^\[B-1\]"):
            f["w"]


@pytest.mark.parametrize("threads", [1, 2])
def test_tiny_tensor_is_compressed_once_per_layout_tried(tmp_path, monkeypatch, threads):
    """The trial that chooses a tiny tensor's layout encodes its chunk both ways; the chosen
    encoding is written, not computed a third time. A source that returns other bytes the
    second time is encoded again (what is written is what it returned)."""
    from inshrink import dtypes
    from inshrink.codecs import entropy
    calls = []
    encode = entropy._encode  # what the entropy stage runs on every stream
    monkeypatch.setattr(entropy, "_encode", lambda data, level: (
        calls.append(memoryview(data).nbytes), encode(data, level))[1])
    bias = np.random.default_rng(1).normal(0, 1, 1000).astype(np.float32)
    inshrink.save(tmp_path / "b.ink", {"b": bias}, threads=threads)
    assert len(calls) == 5  # 1 plane, then 4 planes
    assert_bit_exact(bias, inshrink.load(tmp_path / "b.ink")["b"])

    reads = []

    def changing(start, stop):  # breaks the source contract: each read is new data
        reads.append(start)
        return (bias * len(reads)).tobytes()[start:stop]
    with inshrink.Writer(tmp_path / "c.ink", threads=threads) as w:
        w.add_source("b", dtypes.of_numpy(np.dtype(np.float32)), bias.shape, changing)
    assert len(reads) == 2
    assert_bit_exact(bias * 2, inshrink.load(tmp_path / "c.ink")["b"])


def _weights_like(n: int, seed: int) -> np.ndarray:
    """fp32 values whose exponent planes compress and mantissa planes are stored raw."""
    return (np.random.default_rng(seed).standard_normal(n) * 0.02).astype(np.float32)


def _save(path, tensors, threads):
    with inshrink.Writer(path, threads=threads, chunk_bytes=256 << 10) as w:
        for k, v in tensors.items():
            w.add(k, v, wait=False)


def test_recycled_plane_buffers_leave_the_file_unchanged(tmp_path):
    # 256 KiB chunks: every chunk's planes come from the shared pool, raw mantissa planes are
    # views of them, and up to 3 x threads chunks are in flight while buffers are handed back
    from inshrink.codecs.lossless import PLANES
    tensors = {"w": _weights_like(300_000, 1), "b": _weights_like(1000, 2),
               "v": _weights_like(170_001, 3)}
    written = []
    for threads in (1, 2, 3, 2):
        path = tmp_path / f"t{threads}.ink"
        _save(path, tensors, threads)
        written.append(path.read_bytes())
        for k, v in inshrink.load(path, threads=threads).items():
            assert_bit_exact(tensors[k], v)
    assert all(data == written[0] for data in written[1:])
    assert PLANES.free_bytes >= 256 << 10


def test_a_second_save_fills_the_same_plane_buffers(tmp_path, monkeypatch):
    import types

    from inshrink.codecs import lossless
    pool = lossless.PlanePool(keep_bytes=8 << 20)
    monkeypatch.setattr("inshrink.io.writer.PLANES", pool)
    allocated = []  # sizes of the buffers lossless.py allocates

    def empty(shape, dtype=float):
        allocated.append(int(np.prod(shape)))
        return np.empty(shape, dtype)
    monkeypatch.setattr(lossless, "np", types.SimpleNamespace(**{**vars(np), "empty": empty}))
    tensors = {"w": _weights_like(2_000_000, 4)}  # 31 chunks of 256 KiB
    _save(tmp_path / "a.ink", tensors, 2)
    assert 2 <= len(allocated) <= 10 and pool.free_bytes >= 2 * (256 << 10)
    allocated.clear()
    _save(tmp_path / "b.ink", tensors, 2)
    assert len(allocated) <= 2  # were 31 new buffers, one per chunk
    assert (tmp_path / "a.ink").read_bytes() == (tmp_path / "b.ink").read_bytes()


def test_plane_pool_keeps_the_largest_buffers_within_its_budget():
    from inshrink.codecs.lossless import PlanePool
    pool = PlanePool(keep_bytes=300, min_bytes=100)
    small, mid, big = pool.take(50), pool.take(120), pool.take(200)
    pool.give([small, mid, big])
    assert pool.free_bytes == 200  # 200 + 120 would pass the budget; 50 is never kept
    again = pool.take(150)
    assert again.size == 150 and again.base is big
    assert pool.free_bytes == 0


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_a_child_forked_while_the_plane_pool_is_locked_can_save(tmp_path):
    import os

    from inshrink.codecs.lossless import PLANES
    with PLANES._lock:  # as if another thread were taking a buffer at fork time
        pid = os.fork()
        if pid == 0:
            try:
                _save(tmp_path / "c.ink", {"w": _weights_like(100_000, 6)}, 2)
            finally:
                os._exit(0)
    wait_for_child(pid, "the forked child hung on the plane pool's lock")
    assert inshrink.load(tmp_path / "c.ink")["w"].size == 100_000
