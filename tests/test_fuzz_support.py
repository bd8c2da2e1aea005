"""The fuzzing support in fuzz/: the checksum repair helpers and the harness itself."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import inshrink
from inshrink.errors import ChecksumError

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "fuzz"))
import ink_repair  # noqa: E402


def _env(**extra) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


@pytest.fixture()
def raw_file(tmp_path) -> tuple[Path, bytes]:
    path = tmp_path / "raw.ink"
    values = np.random.default_rng(5).integers(0, 256, 100, dtype=np.uint8)  # stored raw
    inshrink.save(path, {"x": values}, threads=1)
    return path, path.read_bytes()


def test_repair_is_identity_on_a_valid_file(raw_file):
    _, data = raw_file
    assert ink_repair.fix_container(data) == data
    assert ink_repair.fix_chunks(data) == data      # an ASCII index is rewritten byte for byte
    assert ink_repair.variants(data) == [data]


def test_repaired_payload_damage_reaches_the_decoder(raw_file, tmp_path):
    path, data = raw_file
    offset, doc = ink_repair.read_index(data)
    start, length, _, _, coding = doc["tensors"][0]["streams"][0][0]
    assert coding == "raw"
    damaged = bytearray(data)
    damaged[start + 32 + 10] ^= 0xFF
    bad = tmp_path / "bad.ink"
    bad.write_bytes(damaged)
    with pytest.raises(ChecksumError):
        inshrink.load(bad, threads=1)
    bad.write_bytes(ink_repair.fix_chunks(bytes(damaged)))
    got = inshrink.load(bad, threads=1)["x"]
    want = inshrink.load(path, threads=1)["x"]
    assert np.flatnonzero(got != want).tolist() == [10]


@pytest.mark.skipif(importlib.util.find_spec("atheris") is None, reason="atheris not installed")
def test_fuzz_harness_runs(tmp_path):
    corpus = tmp_path / "corpus"  # empty: the harness writes the seeds itself
    proc = subprocess.run(
        [sys.executable, str(ROOT / "fuzz" / "fuzz_reader.py"), str(corpus),
         "-atheris_runs=300", f"-artifact_prefix={tmp_path}/", "-timeout=60"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env=_env(NUMBA_DISABLE_JIT="1"))  # the documented fuzzing mode
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(list(corpus.iterdir())) >= 8
    assert not list(tmp_path.glob("crash-*"))
