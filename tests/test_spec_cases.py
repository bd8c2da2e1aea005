"""Cases the spec settles that an independent reader could not decide from the text before:
each one as the reference decides it (spec/FORMAT.md sections 8, 16, 24)."""
from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

import inshrink
from inshrink import errors
from inshrink.container.layout import FEATURE_DELTA

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fuzz"))
import ink_repair  # noqa: E402

REQUIRED_FEATURES = 16  # offset of the header's required_features (spec section 3)


def _edited(path: Path, edit, *, delta_bit: bool | None = None) -> Path:
    """``path`` with its index changed by ``edit(index)`` (and the delta feature bit set or
    cleared), checksums fixed, written beside it."""
    data = path.read_bytes()
    offset, index = ink_repair.read_index(data)
    edit(index)
    payload = json.dumps(index, separators=(",", ":")).encode()
    out = bytearray(ink_repair.replace_index(data, offset, payload))
    if delta_bit is not None:
        (features,) = struct.unpack_from("<Q", out, REQUIRED_FEATURES)
        features = features | FEATURE_DELTA if delta_bit else features & ~FEATURE_DELTA
        struct.pack_into("<Q", out, REQUIRED_FEATURES, features)
    edited = path.with_name("edited.ink")
    edited.write_bytes(ink_repair.fix_container(bytes(out)))
    return edited


def _plain(tmp_path: Path) -> Path:
    path = tmp_path / "plain.ink"
    inshrink.save(path, {"w": np.arange(12, dtype=np.float32), "e": np.zeros(0, np.float32)})
    return path


def test_a_null_report_and_a_null_base_are_the_same_as_absent(tmp_path):
    def nulls(index):
        index["base"] = None
        for tensor in index["tensors"]:
            tensor["report"] = None
    with inshrink.open(_edited(_plain(tmp_path), nulls)) as f:
        assert f.base is None and f.load()["w"].tobytes() == np.arange(12, dtype=np.float32).tobytes()


def test_a_lone_surrogate_in_a_report_is_accepted_and_in_a_name_refused(tmp_path):
    def report(index):
        index["tensors"][0]["report"] = {"note": "\ud800"}
    with inshrink.open(_edited(_plain(tmp_path), report)) as f:
        assert f.load()["w"].size == 12

    def name(index):
        index["tensors"][0]["name"] = "w\ud800"
    with pytest.raises(errors.CorruptError, match=r"^\[I-7\]"):
        inshrink.open(_edited(_plain(tmp_path), name))


def _empty_xor(index):
    index["base"] = {"file": "base.ink", "sha256": "0" * 64, "digest": 2}
    empty = next(t for t in index["tensors"] if t["name"] == "e")
    empty["codec"] = [{"id": "xor"}, *empty["codec"]]


@pytest.mark.parametrize("read", ["load", "read", "read_into", "verify"])
def test_an_empty_delta_tensor_still_needs_its_base(tmp_path, read):
    path = _edited(_plain(tmp_path), _empty_xor, delta_bit=True)
    with inshrink.open(path) as f:  # no base given: B-1 for "e", though it has no chunk
        if read == "verify":  # without a base, verify checks a delta tensor's streams only
            assert f.verify() == []
            return
        with pytest.raises(errors.BaseMismatchError, match=r"^\[B-1\]"):
            {"load": f.load, "read": lambda: f.read("e"),
             "read_into": lambda: f.read_into("e", lambda start, chunk: None)}[read]()
        assert f.read("w").size == 12  # a standalone tensor of the delta file reads alone


def test_an_empty_delta_tensor_with_a_base_of_the_wrong_shape_is_refused(tmp_path):
    path = _edited(_plain(tmp_path), _empty_xor, delta_bit=True)
    with inshrink.File(path, base={"e": np.zeros(3, np.float32)}) as f:
        with pytest.raises(errors.BaseMismatchError, match=r"^\[B-1\].*\[0\]"):
            f.read("e")
    with inshrink.File(path, base={"e": np.zeros(0, np.float32)}) as f:
        assert f.read("e").shape == (0,)


def _two_step_series(tmp_path: Path):
    from inshrink.series.series import Series
    series = Series(tmp_path / "s", keyframe_every=10, threads=1)
    rng = np.random.default_rng(0)
    w = rng.standard_normal(256).astype(np.float32)
    for step in (0, 1):
        series.save(step, {"w": w + np.float32(step * 1e-3)})
    delta, whole = series.checkpoints()
    assert not delta.keyframe and whole.keyframe
    return series, tmp_path / "s" / delta.file, tmp_path / "s" / whole.file


def _relist(directory: Path, name: str) -> None:
    """The manifest's sha256 and bytes of file ``name`` made to match it again."""
    from inshrink.series.links import file_sha256
    manifest = directory / "manifest.json"
    doc = json.loads(manifest.read_text("utf-8"))
    for entry in doc["checkpoints"]:
        if entry["file"] == name:
            entry["sha256"] = file_sha256(str(directory / name))
            entry["bytes"] = (directory / name).stat().st_size
    manifest.write_text(json.dumps(doc), "utf-8")


def test_a_delta_steps_file_without_a_base_fails_b3(tmp_path):
    series, delta, _ = _two_step_series(tmp_path)
    inshrink.save(delta, {"w": np.zeros(256, np.float32)})  # a whole file where a delta was
    _relist(delta.parent, delta.name)
    from inshrink.series.series import Series
    with pytest.raises(errors.BaseMismatchError, match=r"^\[B-3\] .*a whole file where a delta"):
        Series(delta.parent).load(0)


def test_a_whole_steps_file_with_a_base_fails_b3(tmp_path):
    series, delta, whole = _two_step_series(tmp_path)
    whole.write_bytes(delta.read_bytes())  # a delta file where the keyframe was
    _relist(whole.parent, whole.name)
    from inshrink.series.series import Series
    with pytest.raises(errors.BaseMismatchError, match=r"^\[B-3\] .*a delta file .*where a whole"):
        Series(whole.parent).load(1)


def test_a_step_absent_from_the_manifest_is_the_callers_error(tmp_path):
    series, _, _ = _two_step_series(tmp_path)
    with pytest.raises(errors.InvalidArgumentError):
        series.load(7)
