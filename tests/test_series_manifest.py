"""A crafted or damaged manifest.json is a CorruptError everywhere, never a crash; API misuse
is an InvalidArgumentError."""
import copy
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from inshrink import errors
from inshrink.series import series as series_module
from inshrink.series.series import Series
from kit import ROOT

DELTA, WHOLE = "step_000000000000.d.ink", "step_000000000001.ink"


def valid_doc():
    return {"format": "inshrink-series", "version": 1, "checkpoints": [
        {"step": 0, "file": DELTA, "keyframe": False, "base": WHOLE, "sha256": "a" * 64,
         "bytes": 10},
        {"step": 1, "file": WHOLE, "keyframe": True, "base": None, "sha256": "b" * 64,
         "bytes": 20}]}


def changed(path, value, doc=None):
    """valid_doc() with the member at ``path`` (keys and indices) set to ``value``."""
    doc = copy.deepcopy(doc or valid_doc())
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


def removed(path):
    doc = valid_doc()
    target = doc
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return doc


def renamed(name):
    """valid_doc() with the whole file named ``name``, and the delta's base with it."""
    return changed(["checkpoints", 1, "file"], name, changed(["checkpoints", 0, "base"], name))


NESTED = "[" * 100_000 + "]" * 100_000
CRAFTED = {
    "empty list": [],
    "string": "inshrink-series",
    "null": None,
    "deeply nested": NESTED,
    "nested in a field": '{"format": "inshrink-series", "version": 1, "checkpoints": '
                         + NESTED + "}",
    "not utf-8": b'{"format": "inshrink-series\xff"}',
    "wrong format": changed(["format"], "other"),
    "version true": changed(["version"], True),
    "version float": changed(["version"], 1.0),
    "version 3": changed(["version"], 3),
    "checkpoints object": changed(["checkpoints"], {}),
    "checkpoints null": changed(["checkpoints"], None),
    "entry a list": changed(["checkpoints", 0], ["x"]),
    "entry missing a key": removed(["checkpoints", 0, "bytes"]),
    "entry with another key": changed(["checkpoints", 0, "extra"], 1),
    "base a list": changed(["checkpoints", 0, "base"], ["x"]),
    "base a dict": changed(["checkpoints", 0, "base"], {}),
    "base not listed": changed(["checkpoints", 0, "base"], "step_000000000005.ink"),
    "bytes a string": changed(["checkpoints", 0, "bytes"], "x"),
    "bytes negative": changed(["checkpoints", 0, "bytes"], -1),
    "bytes true": changed(["checkpoints", 0, "bytes"], True),
    "bytes float": changed(["checkpoints", 0, "bytes"], 10.0),
    "step true": changed(["checkpoints", 1, "step"], True),
    "step negative": changed(["checkpoints", 0, "step"], -1),
    "step a string": changed(["checkpoints", 0, "step"], "0"),
    "step of 13 digits": changed(["checkpoints", 1, "step"], 10 ** 12),
    "steps not increasing": changed(["checkpoints", 1, "step"], 0),
    "keyframe 1": changed(["checkpoints", 1, "keyframe"], 1),
    "keyframe with a base": changed(["checkpoints", 1, "keyframe"], False),
    "delta without base": changed(["checkpoints", 0, "base"], None),
    "file with a newline": renamed(WHOLE + "\n"),
    "file with arabic digits": renamed("step_" + "\u0660" * 11 + "\u0661.ink"),
    "file of another step": renamed("step_000000000002.ink"),
    "file a path": renamed("../" + WHOLE),
    "file a number": renamed(1),
    "delta named whole": changed(["checkpoints", 0, "file"], "step_000000000000.ink"),
    "sha256 uppercase": changed(["checkpoints", 0, "sha256"], "A" * 64),
    "sha256 short": changed(["checkpoints", 0, "sha256"], "a" * 63),
    "sha256 a number": changed(["checkpoints", 0, "sha256"], 0),
    "base cycle": changed(["checkpoints", 1], {
        "step": 1, "file": "step_000000000001.d.ink", "keyframe": False, "base": DELTA,
        "sha256": "b" * 64, "bytes": 20}, changed(["checkpoints", 0, "base"],
                                                  "step_000000000001.d.ink")),
}


def write_manifest(directory, doc):
    os.makedirs(directory, exist_ok=True)
    if isinstance(doc, bytes):
        data = doc
    elif isinstance(doc, str):
        data = doc.encode()
    else:
        data = json.dumps(doc).encode()
    with open(os.path.join(directory, "manifest.json"), "wb") as f:
        f.write(data)


def test_the_valid_document_is_accepted(tmp_path):
    write_manifest(tmp_path, valid_doc())
    assert Series(tmp_path).steps() == [0, 1]


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_a_crafted_manifest_is_a_corrupt_error(tmp_path, case):
    write_manifest(tmp_path, CRAFTED[case])
    with pytest.raises(errors.CorruptError, match="manifest"):
        Series(tmp_path)


def test_a_manifest_damaged_after_opening_fails_the_next_change(tmp_path):
    series = Series(tmp_path)
    state = {"w": np.ones(8, np.float32)}
    series.save(0, state)
    series.save(1, state)
    write_manifest(tmp_path, CRAFTED["base a list"])
    for change in (lambda: series.save(2, state), lambda: series.delete([0]),
                   lambda: series.retain(1)):
        with pytest.raises(errors.CorruptError):
            change()


def test_size_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(series_module, "MAX_MANIFEST_BYTES", 1000)
    write_manifest(tmp_path, changed(["padding"], " " * 1000))
    with pytest.raises(errors.CorruptError, match="larger than 1000 bytes"):
        Series(tmp_path)


def test_a_manifest_that_is_a_directory(tmp_path):
    (tmp_path / "manifest.json").mkdir()
    with pytest.raises(errors.CorruptError):
        Series(tmp_path)


def test_cli_reports_a_crafted_manifest_as_an_error(tmp_path):
    for case, command in (("empty list", "ls"), ("base a list", "verify"),
                          ("deeply nested", "ls")):
        directory = tmp_path / case.replace(" ", "_")
        write_manifest(directory, CRAFTED[case])
        r = subprocess.run([sys.executable, "-m", "inshrink", "series", command,
                            str(directory)], capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, PYTHONPATH=ROOT))
        assert r.returncode == 1, (case, r.stderr)
        assert "Traceback" not in r.stderr and "manifest" in r.stderr, (case, r.stderr)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 2 ** 40) | st.floats(allow_nan=False)
    | st.text(max_size=30) | st.sampled_from([DELTA, WHOLE, "a" * 64, "inshrink-series"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["format", "version", "checkpoints", "step", "file", "keyframe",
                         "base", "sha256", "bytes"]) | st.text(max_size=5), inner, max_size=6),
    max_leaves=20)
PATHS = st.sampled_from([["format"], ["version"], ["checkpoints"], ["checkpoints", 0],
                         ["checkpoints", 1]] + [["checkpoints", i, key] for i in (0, 1) for key
                                                in valid_doc()["checkpoints"][0]])


def opened_or_corrupt(doc):
    """Series() on ``doc`` raises CorruptError or opens a series whose use raises only
    typed errors."""
    with tempfile.TemporaryDirectory() as directory:
        write_manifest(directory, doc)
        try:
            series = Series(directory)
        except errors.CorruptError:
            return
        assert all(isinstance(p, str) for p in series.verify())
        for step in series.steps():
            with pytest.raises(errors.InshrinkError):  # the files do not exist
                series.load(step)


@given(JSON)
def test_random_json_is_a_corrupt_error(doc):
    opened_or_corrupt(doc)


@given(PATHS, JSON)
def test_a_valid_manifest_with_one_member_replaced(path, value):
    opened_or_corrupt(changed(path, value))


@given(st.binary(max_size=200))
def test_random_bytes(data):
    opened_or_corrupt(data)


def test_api_misuse_is_an_invalid_argument_error(tmp_path):
    series = Series(tmp_path / "s")
    state = {"w": np.ones(4, np.float32)}
    series.save(0, state)
    for misuse in (lambda: series.save(1, [np.ones(3)]), lambda: series.save(1, None),
                   lambda: series.save(1, state, metadata=["a"]),
                   lambda: series.save(1, state, importance=[1]),
                   lambda: series.save(10 ** 12, state), lambda: series.save(True, state),
                   lambda: series.load(False), lambda: series.load("0"),
                   lambda: series.metadata(0.0), lambda: series.chain("x"),
                   lambda: series.delete(0), lambda: series.delete("0"),
                   lambda: series.delete([False]), lambda: series.check_step("1"),
                   lambda: Series(None), lambda: Series(tmp_path / "s", policy=3),
                   lambda: Series(tmp_path / "s", threads="x")):
        with pytest.raises(errors.InvalidArgumentError):
            misuse()
    assert series.steps() == [0]
    assert series.load(0)["w"].tobytes() == state["w"].tobytes()
