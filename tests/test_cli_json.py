"""Every command's --json output has one shape (docs/cli.md, "--json")."""
import json
import os

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import inshrink
from kit import run_cli as run

KEYS = {"command", "ok", "inputs", "outputs", "bytes_in", "bytes_out", "tensor_bytes", "ratio",
        "lossy", "lossy_tensors", "max_rel_l2_error", "unmeasured_tensors", "seconds", "files",
        "problems"}
FILE_KEYS = {"input", "output", "bytes_in", "bytes_out", "copied", "ok", "error",
             "format_version", "metadata", "tensors"}
SERIES_KEYS = {"step", "keyframe", "base", "weights_only"}
TENSOR_KEYS = {"name", "dtype", "shape", "codec", "nbytes", "stored_bytes", "ratio", "role",
               "lossy", "error"}


@pytest.fixture()
def workdir(tmp_path):
    rng = np.random.default_rng(0)
    state = {"layer.weight": rng.standard_normal((64, 64)).astype(np.float32),
             "layer.bias": np.zeros(64, np.float32)}
    save_file(state, str(tmp_path / "m.safetensors"))
    inshrink.save(tmp_path / "lossy.ink", state, policy="balanced")
    series = inshrink.Series(tmp_path / "ckpts")
    series.save(1, state)
    series.save(2, {k: v + 1 for k, v in state.items()})
    return tmp_path


COMMANDS = {
    "compress": (("compress", "m.safetensors", "--lossy"), ["m.ink"], 1),
    "decompress": (("decompress", "lossy.ink", "-o", "out.safetensors"), ["out.safetensors"], 1),
    "info": (("info", "lossy.ink"), [], 1),
    "verify": (("verify", "lossy.ink", "m.safetensors"), [], 2),
    "series ls": (("series", "ls", "ckpts"), [], 2),
    "series restore": (("series", "restore", "ckpts", "--step", "1", "-o", "s1.safetensors"),
                       ["s1.safetensors"], 1),
    "series verify": (("series", "verify", "ckpts"), [], 2),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_has_the_same_json_shape(workdir, command):
    args, outputs, files = COMMANDS[command]
    r = run(*args, "--json", cwd=workdir)
    report = json.loads(r.stdout)
    assert set(report) == KEYS, set(report) ^ KEYS
    assert report["command"] == command and report["outputs"] == outputs
    assert isinstance(report["seconds"], float) and report["seconds"] >= 0
    assert len(report["files"]) == files
    for f in report["files"]:
        extra = SERIES_KEYS if command.startswith("series") else set()
        assert set(f) == FILE_KEYS | extra, set(f) ^ (FILE_KEYS | extra)
        for t in f["tensors"]:
            assert set(t) == TENSOR_KEYS
    if command == "verify":  # m.safetensors is not an .ink file: a problem, exit 1
        assert r.returncode == 1 and not report["ok"] and len(report["problems"]) == 1
        assert "m.safetensors" in report["problems"][0]
        return
    assert r.returncode == 0 and report["ok"] and report["problems"] == [], r.stderr
    assert report["ratio"] > 1 and report["tensor_bytes"] == (64 * 64 + 64) * 4 * (
        2 if command.startswith("series") and command != "series restore" else 1)
    lossy = command in ("compress", "decompress", "info")
    assert report["lossy"] is lossy and report["lossy_tensors"] == int(lossy)
    assert (report["max_rel_l2_error"] is not None) is lossy
    if lossy:
        assert 0 < report["max_rel_l2_error"] < 0.1
        tensor = next(t for f in report["files"] for t in f["tensors"]
                      if t["name"] == "layer.weight")
        assert tensor["lossy"] and tensor["error"]["rel_l2_error"] == report["max_rel_l2_error"]


def test_series_restore_uses_a_unique_temporary(workdir):
    (workdir / "s.safetensors.ink.tmp").write_text("someone's file")
    r = run("series", "restore", "ckpts", "-o", "s.safetensors", cwd=workdir)
    assert r.returncode == 0, r.stderr
    assert (workdir / "s.safetensors.ink.tmp").read_text() == "someone's file"
    assert load_file(str(workdir / "s.safetensors"))["layer.bias"][0] == 1
    assert sorted(n for n in os.listdir(workdir) if n.startswith(".")) == []


def test_series_restore_keeps_the_metadata_and_names_its_format(tmp_path):
    series = inshrink.Series(tmp_path / "ckpts")
    series.save(7, {"w": np.arange(6, dtype=np.float32)}, {"epoch": "3"})
    r = run("series", "restore", "ckpts", "-o", "s.ink", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    with inshrink.open(tmp_path / "s.ink") as f:
        assert f.metadata["epoch"] == "3" and f.metadata["step"] == "7"
    r = run("series", "restore", "ckpts", "-o", "s.pt", cwd=tmp_path)
    assert r.returncode == 2 and ".safetensors or .ink" in r.stderr
    assert not (tmp_path / "s.pt").exists()


def test_a_lossy_tensor_without_a_measured_error_is_counted_not_hidden(tmp_path):
    """A float64 weight of values whose squares underflow has rel_l2_error null: the summary's
    maximum leaves it out, so it says so (before: the other tensor's error alone, as if it
    were the worst)."""
    rng = np.random.default_rng(0)
    inshrink.save(tmp_path / "x.ink", {
        "a.weight": rng.standard_normal((64, 64)) * 1e-150,
        "b.weight": rng.standard_normal((64, 64)).astype(np.float32)}, policy="balanced")
    infos = {i.name: i for i in inshrink.open(tmp_path / "x.ink").infos()}
    assert not infos["a.weight"].lossless and infos["a.weight"].error["rel_l2_error"] is None
    text = run("info", "x.ink", cwd=tmp_path)
    assert text.returncode == 0 and "not recorded for 1)" in text.stdout, text.stdout
    report = json.loads(run("info", "x.ink", "--json", cwd=tmp_path).stdout)
    assert report["lossy_tensors"] == 2 and report["unmeasured_tensors"] == 1
    assert report["max_rel_l2_error"] == infos["b.weight"].error["rel_l2_error"]
