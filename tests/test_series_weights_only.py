"""Series.retain(keep_weights=...): older steps rewritten in place as their model only."""
import json
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inshrink import errors
from inshrink.series import Series
from inshrink.series.series import SERIES_VERSION, WEIGHTS_VERSION


def is_model(name):
    return name.startswith("model.")


def state(step, seed=0):
    """A drifting model (F32 matrix, BF16 vector, 0-d, empty) and optimizer state."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((96, 64)).astype(np.float32)
    drift = np.random.default_rng(seed * 1000 + step).standard_normal(w.shape)
    w = (w + 0.01 * step * drift).astype(np.float32)
    return {"model.w": w,
            "model.norm": (np.linspace(-1, 1, 16) * step).astype(ml_dtypes.bfloat16),
            "model.scale": np.array(0.5 * step, np.float32),
            "model.empty": np.zeros((0, 3), np.float32),
            "optimizer.exp_avg": (0.1 * drift).astype(np.float32),
            "optimizer.step": np.array(step, np.int64)}


def manifest(directory):
    return json.loads((directory / "manifest.json").read_text())


def snapshot(series):
    return {s: {n: a.tobytes() for n, a in series.load(s).items()} for s in series.steps()}


@pytest.mark.parametrize("policy", [None, "balanced"])
def test_older_steps_keep_their_models_bit_for_bit(tmp_path, policy):
    series = Series(tmp_path, policy, keyframe_every=3)
    seen = {}
    for step in range(1, 11):
        series.save(step, state(step))
        seen.update(snapshot(series))  # each step as it decodes while whole
        series.retain(2, keep_weights=4, model=is_model)
        steps = series.steps()
        assert steps == list(range(max(1, step - 5), step + 1))
        assert series.weights_only_steps() == steps[:-2]
        for s in steps:
            got = series.load(s)
            wanted = {n for n in seen[s] if s in steps[-2:] or is_model(n)}
            assert set(got) == wanted, s
            for name, array in got.items():
                assert array.tobytes() == seen[s][name], (s, name)
    assert series.verify() == []
    files = [e["file"] for e in manifest(tmp_path)["checkpoints"]]
    assert manifest(tmp_path)["version"] == WEIGHTS_VERSION
    assert any(f.endswith(".w.d.ink") for f in files) and any(f.endswith(".w.ink") for f in files)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(files + [".lock", "manifest.json"])


def test_weights_only_chains_stay_within_keyframe_every(tmp_path):
    series = Series(tmp_path, "balanced", keyframe_every=2)
    for step in range(1, 9):
        series.save(step, state(step))
        series.retain(1, keep_weights=6, model=is_model)
    for step in series.steps():
        assert len(series.chain(step)) <= 2


def test_weights_only_steps_save_space(tmp_path):
    sizes = {}
    for label, keep in (("whole", None), ("weights", 4)):
        series = Series(tmp_path / label, "balanced")
        for step in range(1, 9):
            series.save(step, state(step))
            if keep is None:
                series.retain(6)
            else:
                series.retain(2, keep_weights=keep, model=is_model)
        sizes[label] = sum(e.bytes for e in series.checkpoints())
    assert sizes["weights"] < sizes["whole"]


def test_a_lossier_policy_encodes_them_again(tmp_path):
    series = Series(tmp_path)  # lossless
    for step in (1, 2):
        series.save(step, state(step))
    original = series.load(1)
    series.retain(1, keep_weights=1, model=["model.w", "model.scale"], policy="aggressive")
    got = series.load(1)
    assert set(got) == {"model.w", "model.scale"}
    assert got["model.scale"] == original["model.scale"]  # small tensors stay exact
    error = np.linalg.norm(got["model.w"] - original["model.w"]) / np.linalg.norm(
        original["model.w"])
    assert 0 < error < 0.25  # quantized (aggressive: ~0.1 on Gaussian weights)
    assert series.checkpoints()[0].bytes < series.checkpoints()[1].bytes / 4


def test_the_manifest_returns_to_version_1_without_weights_only_steps(tmp_path):
    series = Series(tmp_path)
    for step in (1, 2, 3):
        series.save(step, state(step))
    series.retain(2, keep_weights=1, model=is_model)
    assert manifest(tmp_path)["version"] == WEIGHTS_VERSION
    assert Series(tmp_path).weights_only_steps() == [1]  # read back by a new object
    series.retain(2)
    assert manifest(tmp_path)["version"] == SERIES_VERSION and series.weights_only_steps() == []


def test_a_save_after_deleting_the_whole_steps_keeps_the_weights_only_one(tmp_path):
    series = Series(tmp_path)
    for step in (1, 2):
        series.save(step, state(step))
    series.retain(1, keep_weights=1, model=is_model)
    series.delete([2])
    assert series.steps() == [1] and series.weights_only_steps() == [1]
    series.save(3, state(3))
    assert series.weights_only_steps() == [1] and set(series.load(1)) == {
        n for n in state(1) if is_model(n)}
    assert set(series.load(3)) == set(state(3)) and series.verify() == []


def test_bad_arguments_change_nothing(tmp_path):
    series = Series(tmp_path)
    for step in (1, 2, 3):
        series.save(step, state(step))
    before = manifest(tmp_path)
    for kwargs, match in (({"keep_weights": 1}, "model"),
                          ({"keep_weights": 0, "model": is_model}, "keep_weights"),
                          ({"keep_weights": True, "model": is_model}, "keep_weights"),
                          ({"keep_weights": 1, "model": "model.w"}, "model"),
                          ({"keep_weights": 1, "model": 3}, "model"),
                          ({"model": is_model}, "keep_weights"),
                          ({"keep_weights": 1, "model": is_model, "policy": "nope"},
                           "unknown preset"),
                          ({"keep_weights": 2, "model": lambda n: False}, "none of")):
        with pytest.raises(errors.InvalidArgumentError, match=match):
            series.retain(1, **kwargs)
        assert manifest(tmp_path) == before
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [e["file"] for e in before["checkpoints"]] + [".lock", "manifest.json"])


def test_a_failure_midway_leaves_the_series_unchanged(tmp_path, monkeypatch):
    series = Series(tmp_path, "balanced")
    for step in range(1, 6):
        series.save(step, state(step))
    before, files = manifest(tmp_path), snapshot(series)
    calls = []
    real = Series._rewrite_weights_only

    def failing(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise OSError("disk full")
        return real(self, *args, **kwargs)
    monkeypatch.setattr(Series, "_rewrite_weights_only", failing)
    with pytest.raises(OSError, match="disk full"):
        series.retain(1, keep_weights=4, model=is_model)
    assert manifest(tmp_path) == before and snapshot(Series(tmp_path)) == files
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [e["file"] for e in before["checkpoints"]] + [".lock", "manifest.json"])


def test_manifest_rules_of_weights_only_names(tmp_path):
    series = Series(tmp_path)
    for step in (1, 2, 3):
        series.save(step, state(step))
    series.retain(1, keep_weights=2, model=is_model)
    doc = manifest(tmp_path)
    assert [e["file"] for e in doc["checkpoints"]] == [
        "step_000000000001.w.d.ink", "step_000000000002.w.ink", "step_000000000003.ink"]
    for change in (lambda d: d.update(version=1),
                   lambda d: d["checkpoints"][0].update(base=d["checkpoints"][2]["file"]),
                   lambda d: d["checkpoints"][1].update(
                       file=d["checkpoints"][1]["file"].replace(".w.ink", ".w.d.ink"))):
        bad = json.loads(json.dumps(doc))
        change(bad)
        (tmp_path / "manifest.json").write_text(json.dumps(bad))
        with pytest.raises(errors.CorruptError):
            Series(tmp_path)


def test_cli_lists_and_restores_a_weights_only_step(tmp_path):
    series = Series(tmp_path / "s")
    for step in (1, 2):
        series.save(step, state(step))
    series.retain(1, keep_weights=1, model=is_model)
    run = [sys.executable, "-m", "inshrink"]
    listing = subprocess.run(run + ["series", "ls", str(tmp_path / "s")], capture_output=True,
                             text=True, check=True).stdout.splitlines()
    assert "model" in listing[1] and "whole" in listing[2]
    out = subprocess.run(run + ["series", "ls", "--json", str(tmp_path / "s")],
                         capture_output=True, text=True, check=True).stdout
    assert [f["weights_only"] for f in json.loads(out)["files"]] == [True, False]
    done = subprocess.run(run + ["series", "restore", str(tmp_path / "s"), "--step", "1", "-o",
                                 str(tmp_path / "m.ink")], capture_output=True, text=True)
    assert done.returncode == 0 and "the model only" in done.stdout
    from inshrink import load
    assert set(load(str(tmp_path / "m.ink"))) == {n for n in state(1) if is_model(n)}


@settings(max_examples=15, deadline=None)
@given(plan=st.lists(st.tuples(st.integers(1, 3), st.one_of(st.none(), st.integers(1, 3))),
                     min_size=1, max_size=6),
       keyframe_every=st.integers(1, 4))
def test_any_plan_of_saves_and_retains_keeps_every_kept_step_as_it_was(
        tmp_path_factory, plan, keyframe_every):
    directory = tmp_path_factory.mktemp("plan")
    series = Series(directory, "balanced", keyframe_every=keyframe_every)
    seen = {}
    for step, (last, keep) in enumerate(plan, start=1):
        series.save(step, state(step, seed=1))
        seen[step] = {n: a.tobytes() for n, a in series.load(step).items()}
        if keep is None:
            series.retain(last)
        else:
            series.retain(last, keep_weights=keep, model=is_model)
        models = set(series.weights_only_steps())
        assert step not in models  # the newest stays whole
        for s in series.steps():
            got = series.load(s)
            assert set(got) == {n for n in seen[s] if s not in models or is_model(n)}
            assert all(a.tobytes() == seen[s][n] for n, a in got.items())
    assert series.verify() == []
