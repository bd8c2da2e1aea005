"""Series.verify agrees with Series.load: a healthy series of any domain verifies clean."""
import functools
import os
import subprocess
import sys

import numpy as np
import pytest

import inshrink
from inshrink.search import Search, SearchSpace
from inshrink.series.series import Series
from kit import ROOT, assert_same_tensors


def drifting(n, seed=0):
    """n checkpoints of a model with Adam-like state: weights, both moments, a counter."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((64, 96)) * 0.02).astype(np.float32)
    m = (rng.standard_normal((64, 96)) * 1e-3).astype(np.float32)
    v = (rng.standard_normal((64, 96)) * 1e-3).astype(np.float32) ** 2
    states = []
    for i in range(n):
        w = w + (rng.standard_normal(w.shape) * 1e-5).astype(np.float32)
        m = np.float32(0.9) * m + (rng.standard_normal(m.shape) * 1e-4).astype(np.float32)
        v = np.float32(0.999) * v + (rng.standard_normal(v.shape) * 1e-3).astype(np.float32) ** 2
        states.append({"model.w": w.copy(), "optimizer.state.0.exp_avg": m.copy(),
                       "optimizer.state.0.exp_avg_sq": v.copy(),
                       "optimizer.state.0.step": np.array(i, np.int64)})
    return states


def _uniform(domain):
    return inshrink.Policy.uniform(inshrink.QuantConfig(bins=8, domain=domain))


POLICIES = {
    "linear": _uniform("linear"),
    "log": _uniform("log"),
    "signed_log": _uniform("signed_log"),
    "factored": _uniform("factored"),
    "lossless": None,
    "mixed": inshrink.Policy({
        "weight": inshrink.QuantConfig(bins=16),
        "exp_avg": inshrink.QuantConfig(bins=0),
        "exp_avg_sq": inshrink.QuantConfig(bins=2, domain="factored")}),
}


assert_same = functools.partial(assert_same_tensors, in_order=False)


@pytest.mark.parametrize("domain", sorted(POLICIES))
def test_verify_is_clean_for_every_domain(tmp_path, domain):
    series = Series(tmp_path / "s", policy=POLICIES[domain], keyframe_every=3, threads=1)
    states = drifting(4)
    expected = []
    for step, state in enumerate(states):
        series.save(step, state)
        inshrink.save(tmp_path / "alone.ink", state, policy=POLICIES[domain])
        expected.append(inshrink.load(tmp_path / "alone.ink"))
    assert any(not e.keyframe for e in series.checkpoints())  # deltas are really checked
    assert series.verify() == []
    assert Series(tmp_path / "s").verify() == []  # a reopened series too
    for step in range(len(states)):
        assert_same(series.load(step), expected[step])


def test_verify_is_clean_for_a_searched_series_and_through_the_cli(tmp_path):
    # a searched space with exp_avg_sq of matrices factored (Adafactor's approximation)
    space = SearchSpace(bins=(4, 16), prune=(0.0,), protect=(0.0005,),
                        exp_avg_sq=inshrink.QuantConfig(bins=2, domain="factored"))
    series = Series(tmp_path / "s", threads=1)
    search = Search(0.5, space=space, max_evals=3, threads=1)
    states = drifting(3, seed=1)
    for step, state in enumerate(states):
        result = search.choose(state, lambda s: float(np.mean(s["model.w"] ** 2)))
        series.save(step, state, policy=result.policy, metadata=result.metadata())
    with inshrink.open(tmp_path / "s" / series.checkpoints()[0].file) as f:
        assert not f.info("optimizer.state.0.exp_avg_sq").lossless
    assert series.verify() == []
    for step in range(3):
        series.load(step)
    r = subprocess.run([sys.executable, "-m", "inshrink", "series", "verify", tmp_path / "s"],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0 and r.stdout.startswith("OK"), r.stdout + r.stderr
