"""The decode digest (spec/FORMAT.md section 23.1): the worked example, an independent
implementation of definition 2 from the spec's text, and series that use it."""
from __future__ import annotations

import hashlib
import re
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import inshrink
from inshrink import digest, dtypes, errors
from inshrink.series.series import Series
from kit import ROOT

SPEC = (Path(__file__).resolve().parent.parent / "spec" / "FORMAT.md").read_text("utf-8")
DTYPE_NAMES = {np.dtype(np.float32): "F32", np.dtype(ml_dtypes.bfloat16): "BF16",
               np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3", np.dtype(np.int64): "I64"}


def spec_digest(exact: dict, codes: dict) -> str:
    """Definition 2 written from the spec's tables, without the library."""
    out = b""
    for name in sorted(set(exact) | set(codes), key=lambda n: n.encode("utf-8")):
        raw = name.encode("utf-8")
        out += struct.pack("<Q", len(raw)) + raw
        if name in codes:
            c = np.asarray(codes[name])
            out += b"C" + struct.pack("<Q", c.size) + c.astype("<u2").tobytes()
        else:
            a = np.asarray(exact[name])
            dtype = DTYPE_NAMES[a.dtype].encode("ascii")
            out += b"X" + struct.pack("<Q", len(dtype)) + dtype + struct.pack("<Q", a.ndim)
            out += b"".join(struct.pack("<Q", d) for d in a.shape) + a.tobytes()
    return hashlib.sha256(out).hexdigest()


def _example_tensors() -> tuple[dict, dict]:
    exact = {"step": np.array(1.0, np.float32),
             "w": np.array([1.0, -2.0], np.float32).astype(ml_dtypes.bfloat16),
             "e": np.array([0x38], np.uint8).view(ml_dtypes.float8_e4m3fn)}
    return exact, {"q": np.array([0, 2, 1], np.uint16)}


def test_worked_example_of_the_spec():
    section = SPEC[SPEC.index("### 23.1 Decode digest"):SPEC.index("### 23.2")]
    blocks = re.findall(r"```\n(.*?)```", section[section.index("*Worked example.*"):],
                        re.DOTALL)
    message = bytes.fromhex(blocks[0])
    expected = blocks[1].strip()
    exact, codes = _example_tensors()
    assert len(message) == 144
    assert b"".join(digest.digest_input(exact, codes)) == message
    assert hashlib.sha256(message).hexdigest() == expected
    assert digest.decode_digest(exact, codes) == expected == spec_digest(exact, codes)


def test_definition_2_keeps_a_0d_tensor_0d_and_names_dtypes_by_the_format():
    exact = {"step": np.array(3.0, np.float32)}
    message = b"".join(digest.digest_input(exact, {}))
    assert message == (struct.pack("<Q", 4) + b"step" + b"X" + struct.pack("<Q", 3) + b"F32"
                       + struct.pack("<Q", 0) + np.float32(3.0).tobytes())
    one_d = {"step": np.array([3.0], np.float32)}
    assert digest.decode_digest(exact, {}) != digest.decode_digest(one_d, {})


def test_definition_1_is_what_format_1_2_files_hold():
    # the reference writer of 1.2 - 1.4 hashed a 0-d tensor as shape (1,)
    exact = {"step": np.array(3.0, np.float32)}
    message = b"".join(digest.digest_input(exact, {}, version=1))
    assert message == b"step\0X<f4(1,)" + np.float32(3.0).tobytes()
    with pytest.raises(errors.InvalidArgumentError):
        digest.decode_digest(exact, {}, version=3)


def test_definition_1_types_come_from_the_spec_table_for_every_dtype():
    # the table of section 23.1 is what numpy and ml_dtypes spelled for the writers of
    # 1.2 - 1.4; the reference reader no longer asks them
    spec = (Path(ROOT) / "spec" / "FORMAT.md").read_text("utf-8")
    section = spec[spec.index("**Definition 1 (formats"):spec.index("### 23.2")]
    cells = re.findall(r"\| `([A-Z0-9_]+)` \| `([^`]+)` ", section)
    table = {name: text.replace("\\|", "|") for name, text in cells}
    assert table == digest.DEFINITION_1_TYPES and len(table) == len(dtypes.BY_NAME) == 17
    for name, dtype in dtypes.BY_NAME.items():
        for shape in [(), (0,), (3,), (2, 3), (2, 0, 1)]:
            x = np.zeros(shape, dtype.numpy)
            old = np.ascontiguousarray(x)  # what the writers of 1.2 - 1.4 hashed
            expected = b"t\0X" + old.dtype.str.encode() + repr(old.shape).encode() + old.tobytes()
            assert b"".join(digest.digest_input({"t": x}, {}, version=1)) == expected, (name, shape)


def _torch_like_states():
    """Two checkpoints as an optimizer writes them: 0-d step counters, BF16 and FP8 tensors."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal(2048).astype(np.float32)
    states = []
    for step in (1, 2):
        w = w + np.float32(1e-3) * rng.standard_normal(2048).astype(np.float32)
        states.append({"model.w": w.copy(),
                       "model.h": w[:512].astype(ml_dtypes.bfloat16),
                       "model.s": np.arange(16, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn),
                       "optimizer.state.0.step": np.array(float(step), np.float32),
                       "optimizer.state.1.step": np.array(step, np.int64)})
    return states


def test_series_delta_files_name_their_base_by_the_spec_definition(tmp_path):
    states = _torch_like_states()
    series = Series(tmp_path / "s", threads=1)
    for step, state in enumerate(states, 1):
        series.save(step, state)
    first, last = series.checkpoints()
    assert not first.keyframe and last.keyframe
    with inshrink.open(tmp_path / "s" / first.file) as f:
        base = f.base
        assert f.format_version == "1.5"
    assert base == {"file": last.file, "digest": 2, "sha256": spec_digest(states[1], {})}
    for step, state in enumerate(states, 1):
        restored = series.load(step)
        assert {k: v.tobytes() for k, v in restored.items()} == \
            {k: v.tobytes() for k, v in state.items()}
    assert series.verify() == []


def _write_with_base_reference(monkeypatch, tmp_path, reference) -> Series:
    monkeypatch.setattr(digest, "base_reference", reference)
    series = Series(tmp_path / "s", threads=1)
    for step, state in enumerate(_torch_like_states(), 1):
        series.save(step, state)
    return series


def test_series_of_format_1_2_files_still_restore(monkeypatch, tmp_path):
    """Delta files written before 1.5: no digest member, definition 1 (0-d as (1,))."""
    def legacy(file, exact, codes):
        return {"file": file, "sha256": digest.decode_digest(exact, codes, version=1)}
    series = _write_with_base_reference(monkeypatch, tmp_path, legacy)
    with inshrink.open(tmp_path / "s" / series.checkpoints()[0].file) as f:
        assert "digest" not in f.base and f.format_version in ("1.2", "1.3")
    assert float(series.load(1)["optimizer.state.0.step"]) == 1.0
    assert series.verify() == []


def test_series_refuses_a_digest_definition_it_does_not_know(monkeypatch, tmp_path):
    def future(file, exact, codes):
        return {"file": file, "sha256": "0" * 64, "digest": 3}
    series = _write_with_base_reference(monkeypatch, tmp_path, future)
    with pytest.raises(errors.BaseMismatchError, match=r"^\[B-3\] .*step_\d+\.d\.ink: .*definition 3"):
        series.load(1)
    assert series.load(2)  # the keyframe needs no base
    assert "B-3" in " ".join(series.verify())


def test_the_definition_1_vector_of_a_0d_tensor_names_its_base_by_that_digest():
    vectors = Path(ROOT) / "spec" / "vectors"
    base = inshrink.load(vectors / "digest1_scalar_base.ink")
    assert base["step"].shape == ()
    with inshrink.File(vectors / "digest1_scalar.ink", base=base) as f:
        assert "digest" not in f.base
        assert f.base["sha256"] == digest.decode_digest(base, {}, version=1)
        assert f.base["sha256"] != digest.decode_digest(base, {}, version=2)
        assert float(f.load()["step"]) == 4.0
