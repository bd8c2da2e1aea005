"""The Python API: typed errors for bad arguments, atomic writes, random access, metadata."""
import os

import numpy as np
import pytest

import inshrink
from inshrink import errors


def test_error_hierarchy_roots_at_value_error():
    for cls in (errors.CorruptError, errors.TruncatedError, errors.ChecksumError,
                errors.UnsupportedVersionError, errors.UnsupportedFeatureError,
                errors.UnknownCodecError, errors.LimitExceededError,
                errors.InvalidArgumentError, errors.TensorNotFoundError):
        assert issubclass(cls, inshrink.InshrinkError)
    assert issubclass(inshrink.InshrinkError, ValueError)
    assert issubclass(errors.TruncatedError, errors.CorruptError)
    assert issubclass(errors.TensorNotFoundError, KeyError)


def test_public_surface():
    assert set(inshrink.__all__) >= {"save", "load", "open", "Writer", "File", "TensorInfo",
                                     "InshrinkError"}
    for name in inshrink.__all__:
        assert hasattr(inshrink, name)


@pytest.mark.parametrize("tensors, match", [
    ({"": np.zeros(1)}, "name"),
    ({"x" * 1025: np.zeros(1)}, "longer"),
    ({"x": np.array(["a", "b"])}, "dtype"),
    ({"x": np.array([object()])}, "dtype"),
    ({"x": np.zeros(2, np.float128 if hasattr(np, "float128") else np.longdouble)}, "dtype"),
    ({"x": np.zeros(2, [("a", "f4")])}, "dtype"),
    ({"x": [[1, 2], [3]]}, "convert"),
    ({"x": np.zeros([1] * 33)}, "dimensions"),
])
def test_bad_tensors_raise_invalid_argument(tmp_path, tensors, match):
    with pytest.raises(errors.InvalidArgumentError, match=match):
        inshrink.save(tmp_path / "x.ink", tensors)
    assert os.listdir(tmp_path) == []  # no temporary file left behind


@pytest.mark.parametrize("kwargs, match", [
    (dict(metadata={"a": 1}), "metadata"),
    (dict(metadata={1: "a"}), "metadata"),
    (dict(threads=0), "threads"),
    (dict(threads=1.5), "threads"),
    (dict(level=99), "level"),
    (dict(level="3"), "level"),
])
def test_bad_options_raise_invalid_argument(tmp_path, kwargs, match):
    with pytest.raises(errors.InvalidArgumentError, match=match):
        inshrink.save(tmp_path / "x.ink", {"x": np.zeros(3)}, **kwargs)


def test_bad_chunk_size_and_duplicate_names(tmp_path):
    with pytest.raises(errors.InvalidArgumentError, match="chunk_bytes"):
        inshrink.Writer(tmp_path / "x.ink", chunk_bytes=4)
    with inshrink.Writer(tmp_path / "x.ink") as w:
        w.add("a", np.zeros(2))
        with pytest.raises(errors.InvalidArgumentError, match="duplicate"):
            w.add("a", np.zeros(2))
    assert list(inshrink.load(tmp_path / "x.ink")) == ["a"]


def test_save_requires_a_mapping(tmp_path):
    with pytest.raises(errors.InvalidArgumentError):
        inshrink.save(tmp_path / "x.ink", [np.zeros(2)])


def test_missing_tensor_is_a_typed_key_error(tmp_path):
    inshrink.save(tmp_path / "x.ink", {"a": np.zeros(2)})
    with inshrink.open(tmp_path / "x.ink") as f:
        assert "a" in f and "b" not in f and len(f) == 1
        with pytest.raises(errors.TensorNotFoundError, match="'b'"):
            f["b"]
        with pytest.raises(KeyError):
            f.info("b")


def test_metadata_and_info(tmp_path):
    meta = {"format": "pt", "step": "1000", "unicode ✓": "ü"}
    report = inshrink.save(tmp_path / "m.ink", {"w": np.ones((4, 4), np.float32)}, meta)
    with inshrink.open(tmp_path / "m.ink") as f:
        assert f.metadata == meta
        info = f.info("w")
    assert info == report[0]
    assert (info.dtype, info.shape, info.nbytes) == ("F32", (4, 4), 64)
    assert info.codec == "bytegroup+zstd" and info.ratio == info.nbytes / info.stored_bytes


def test_failed_save_keeps_previous_file(tmp_path):
    path = tmp_path / "keep.ink"
    inshrink.save(path, {"old": np.arange(3)})
    before = path.read_bytes()

    class Exploding:
        def __array__(self, dtype=None, copy=None):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        inshrink.save(path, {"new": np.arange(5), "bad": Exploding()})
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["keep.ink"]


def test_exception_inside_writer_block_discards_file(tmp_path):
    with pytest.raises(ZeroDivisionError):
        with inshrink.Writer(tmp_path / "w.ink", threads=2) as w:
            w.add("a", np.zeros(10_000))
            1 / 0
    assert os.listdir(tmp_path) == []


def test_writer_cannot_be_used_after_close(tmp_path):
    w = inshrink.Writer(tmp_path / "w.ink")
    w.close()
    with pytest.raises(errors.InvalidArgumentError, match="closed"):
        w.add("a", np.zeros(1))


def test_file_permissions_follow_umask(tmp_path):
    inshrink.save(tmp_path / "p.ink", {"a": np.zeros(1)})
    mask = os.umask(0)
    os.umask(mask)
    assert os.stat(tmp_path / "p.ink").st_mode & 0o777 == 0o666 & ~mask


def test_open_nonexistent_is_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        inshrink.open(tmp_path / "none.ink")


def test_progress_reports_every_byte(tmp_path):
    seen = []
    tensors = {"a": np.zeros(100_000, np.float32), "b": np.ones(7, np.int8)}
    with inshrink.Writer(tmp_path / "p.ink", chunk_bytes=4096, progress=seen.append) as w:
        for k, v in tensors.items():
            w.add(k, v)
    assert sum(seen) == 400_007
    read = []
    inshrink.load(tmp_path / "p.ink", progress=read.append)
    assert sum(read) == 400_007


@pytest.mark.parametrize("tensors, metadata", [
    ({"\ud800": np.zeros(2)}, None),
    ({"ok": np.zeros(2)}, {"k": "\udfff"}),
])
def test_lone_surrogates_are_rejected_before_any_work(tmp_path, tensors, metadata):
    with pytest.raises(errors.InvalidArgumentError, match="Unicode"):
        inshrink.save(tmp_path / "u.ink", tensors, metadata)
    assert os.listdir(tmp_path) == []


def test_tensor_too_big_for_memory_is_a_limit_error(tmp_path, monkeypatch):
    inshrink.save(tmp_path / "big.ink", {"x": np.zeros(1000, np.float32)})

    def refuse(*args, **kwargs):
        raise MemoryError

    with inshrink.open(tmp_path / "big.ink") as f:
        monkeypatch.setattr(np, "empty", refuse)
        with pytest.raises(errors.LimitExceededError, match="read_into"):
            f["x"]


@pytest.mark.parametrize("value, match", [
    (np.ma.masked_array([1.0, 2.0], mask=[False, True]), "masked"),
    ("meta", "meta"),
])
def test_arrays_without_usable_data_are_refused(tmp_path, value, match):
    """A masked array would lose its mask (refused rather than storing .data); a torch meta
    tensor has no data at all."""
    if isinstance(value, str):
        torch = pytest.importorskip("torch")
        value = torch.empty(3, device="meta")
    with pytest.raises(errors.InvalidArgumentError, match=match):
        inshrink.save(tmp_path / "x.ink", {"x": value})
    assert os.listdir(tmp_path) == []


def test_importance_must_be_scores(tmp_path):
    x = {"layer.weight": np.ones((100, 50), np.float32)}  # quantized by "balanced"
    with pytest.raises(errors.InvalidArgumentError, match="importance"):
        inshrink.save(tmp_path / "x.ink", x, importance="abc", policy="balanced")
    with pytest.raises(errors.InvalidArgumentError, match="importance"):
        inshrink.save(tmp_path / "x.ink", x, importance={"layer.weight": "abc"},
                      policy="balanced")
    with inshrink.Writer(tmp_path / "x.ink", policy="balanced") as w:
        with pytest.raises(errors.InvalidArgumentError, match="importance"):
            w.add("layer.weight", x["layer.weight"], importance=[["a"] * 50] * 100)
    assert os.listdir(tmp_path) == ["x.ink"]


def test_streaming_callbacks_must_give_and_take_buffers(tmp_path):
    f32 = inshrink.dtypes.BY_NAME["F32"]
    with inshrink.Writer(tmp_path / "x.ink", threads=1) as w:
        with pytest.raises(errors.InvalidArgumentError, match="NoneType"):
            w.add_source("none", f32, (3,), lambda start, stop: None)
        with pytest.raises(errors.InvalidArgumentError, match="callable"):
            w.add_source("data", f32, (3,), b"not a function")
        w.add("x", np.arange(3, dtype=np.float32))
    with inshrink.open(tmp_path / "x.ink") as f:
        with pytest.raises(errors.InvalidArgumentError, match="sink"):
            f.read_into("x", None)
        assert f.keys() == ["x"]


def test_save_over_the_index_limit_fails_and_keeps_the_previous_file(tmp_path):
    """An index over 64 MiB (here from metadata, or a kept safetensors header) makes a file
    no reader accepts: it was written, replacing the good one. Now the writer refuses first
    (rule T-3, checked before the rename)."""
    path = tmp_path / "x.ink"
    inshrink.save(path, {"x": np.arange(4, dtype=np.float32)})
    before = path.read_bytes()
    huge = "a" * (64 << 20)
    with pytest.raises(errors.LimitExceededError, match=r"^\[T-3\]"):
        inshrink.save(path, {"x": np.zeros(4, np.float32)}, metadata={"note": huge})
    with pytest.raises(errors.LimitExceededError, match=r"^\[T-3\]"):
        with inshrink.Writer(path) as w:
            w.add("x", np.zeros(4, np.float32))
            w.safetensors_header = huge
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["x.ink"]  # no temporary file left behind


def test_writer_keeps_a_small_file_with_many_empty_tensors_readable(tmp_path):
    """3,000 empty tensors compress to a few KB of index, more tensors than a file that size
    may hold (rule I-3): the writer stores that index as plain JSON instead."""
    path = tmp_path / "x.ink"
    inshrink.save(path, {f"t{i}": np.zeros(0, np.float32) for i in range(3000)})
    with inshrink.open(path) as f:
        assert len(f) == 3000
        assert f.format_version == "1.0"  # no zindex


def test_a_delta_rewrite_checks_the_base_reference(tmp_path):
    from inshrink.io.rebase import write_delta
    base = {"x": np.zeros(3, np.float32)}
    inshrink.save(tmp_path / "whole.ink", {"x": np.ones(3, np.float32)})
    with pytest.raises(errors.InvalidArgumentError, match="I-5a"):
        write_delta(tmp_path / "whole.ink", tmp_path / "x.ink", src_codes={},
                    base_exact=base, base_codes={},
                    base_file={"file": "b.ink", "sha256": "not hex"})
    assert os.listdir(tmp_path) == ["whole.ink"]


def test_presets_cannot_be_replaced_or_added():
    import pytest
    from inshrink.encode.policy import PRESETS
    with pytest.raises(TypeError):
        PRESETS["balanced"] = PRESETS["lossless"]
    with pytest.raises(TypeError):
        PRESETS["mine"] = PRESETS["lossless"]
    assert set(PRESETS) == {"lossless", "balanced", "aggressive", "compact"}
