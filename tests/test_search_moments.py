"""The optimizer moments chosen by the displacement they cause (inshrink.search.moments)."""
import math

import numpy as np
import pytest

from inshrink.encode.policy import Policy, QuantConfig
from inshrink.errors import InvalidArgumentError
from inshrink.search.moments import (FIRST_CANDIDATES, SECOND_CANDIDATES, Moments,
                                     choose_moments)


def _adam_state(seed=0, n=64):
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((20, n, n)).astype(np.float32) * 0.01
    m = np.zeros((n, n), np.float32)
    v = np.zeros((n, n), np.float32)
    for x in g:  # 20 Adam steps' moments: realistic magnitudes and signs
        m = 0.9 * m + 0.1 * x
        v = 0.999 * v + 0.001 * x * x
    w = rng.standard_normal((n, n)).astype(np.float32) * 0.05
    return {"model.w": w, "optimizer.state.0.exp_avg": m, "optimizer.state.0.exp_avg_sq": v,
            "optimizer.state.0.step": np.array(20.0, np.float32)}


def _group(lr=1e-3, **kw):
    return Moments("model.w", "adam", "optimizer.state.0.exp_avg",
                   "optimizer.state.0.exp_avg_sq", lr=lr, step=20.0, **kw)


def test_exact_moments_do_not_move_the_weights():
    s = _adam_state()
    g = _group()
    m, v = s["optimizer.state.0.exp_avg"], s["optimizer.state.0.exp_avg_sq"]
    assert g.first_displacement(m, m.copy(), v) == 0.0
    assert g.second_displacement(m, v, v.copy()) == 0.0


def test_a_restarted_first_moment_moves_them_by_its_lost_updates():
    s = _adam_state()
    g = _group(lr=1e-3)
    m, v = s["optimizer.state.0.exp_avg"], s["optimizer.state.0.exp_avg_sq"]
    d = g.first_displacement(m, np.zeros_like(m), v)
    bias1, bias2 = 1 - 0.9 ** 20, 1 - 0.999 ** 20
    update = 1e-3 * (m / bias1) / (np.sqrt(v / bias2) + 1e-8)
    assert d == pytest.approx(float(np.linalg.norm(update)) * 10, rel=1e-4)  # 1/(1-0.9) steps
    assert g.first_displacement(m, np.zeros_like(m), v) > 0
    # the horizon ends with the run
    short = _group(lr=1e-3, steps_left=2)
    assert short.first_displacement(m, np.zeros_like(m), v) == pytest.approx(d / 5, rel=1e-6)


def test_displacement_scales_with_the_learning_rate():
    s = _adam_state()
    m, v = s["optimizer.state.0.exp_avg"], s["optimizer.state.0.exp_avg_sq"]
    a = _group(lr=1e-3).second_displacement(m, v, v * 1.1)
    b = _group(lr=1e-4).second_displacement(m, v, v * 1.1)
    assert a == pytest.approx(10 * b, rel=1e-9) and a > 0


def test_the_bound_picks_cheapest_within_it():
    s = _adam_state()
    base = Policy({"weight": QuantConfig(bins=16)})
    loose, report = choose_moments(s, [_group()], 1e9, base)
    assert loose.roles["exp_avg"] == FIRST_CANDIDATES[0]
    assert loose.roles["exp_avg_sq"] == SECOND_CANDIDATES[0]
    assert loose.roles["weight"] == QuantConfig(bins=16)
    exact, report = choose_moments(s, [_group()], 0.0, base)
    assert exact.roles["exp_avg"] is None and exact.roles["exp_avg_sq"] is None
    assert [t["config"] for t in report["exp_avg"]["tried"]][-1] is None
    # in between: the displacements tried decrease until one is within the bound
    d_restart = report["exp_avg"]["tried"][0]["displacement"]
    mid, report = choose_moments(s, [_group()], d_restart * 0.5 * math.sqrt(2), base)
    tried = report["exp_avg"]["tried"]
    assert len(tried) >= 2 and tried[-1]["displacement"] <= report["bound"]
    assert all(t["displacement"] > report["bound"] for t in tried[:-1])


def test_no_learning_rate_no_damage():
    s = _adam_state()
    policy, _ = choose_moments(s, [_group(lr=0.0)], 0.0, Policy({}))
    assert policy.roles["exp_avg"] == FIRST_CANDIDATES[0]


def test_momentum_and_small_moments():
    rng = np.random.default_rng(1)
    s = {"model.w": rng.standard_normal((64, 64)).astype(np.float32),
         "optimizer.state.0.momentum_buffer": rng.standard_normal((64, 64)).astype(np.float32),
         "model.b": np.zeros(8, np.float32),
         "optimizer.state.1.momentum_buffer": np.ones(8, np.float32)}  # small: exact anyway
    groups = [Moments("model.w", "momentum", "optimizer.state.0.momentum_buffer", lr=0.1,
                      beta1=0.9),
              Moments("model.b", "momentum", "optimizer.state.1.momentum_buffer", lr=0.1,
                      beta1=0.9)]
    policy, report = choose_moments(s, groups, 1e9, Policy({}))
    assert report["exp_avg"]["tensors"] == 1 and "exp_avg_sq" not in report


@pytest.mark.parametrize("kw", [{"kind": "lion"}, {"lr": -1.0}, {"lr": math.nan},
                                {"beta1": 1.0}, {"beta2": -0.1}, {"eps": math.inf}])
def test_bad_hyperparameters(kw):
    args = {"weight": "w", "kind": "adam", "first": "m", "second": "v", **kw}
    with pytest.raises(InvalidArgumentError):
        Moments(**args)


def test_bad_share():
    with pytest.raises(InvalidArgumentError):
        choose_moments(_adam_state(), [_group()], 1.0, Policy({}), share=-1)


def _train(model, optimizer, steps=5):
    import torch
    gen = torch.Generator().manual_seed(3)
    for _ in range(steps):
        x = torch.randn(16, 64, generator=gen)
        loss = torch.nn.functional.cross_entropy(model(x), torch.randint(0, 4, (16,),
                                                                          generator=gen))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


@pytest.mark.parametrize("make", ["adamw", "sgd"])
def test_checkpointer_measures_the_moments_it_stores(tmp_path, make):
    torch = pytest.importorskip("torch")
    from inshrink.checkpointing.moments import optimizer_moments
    from inshrink.torch import Checkpointer
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(),
                                torch.nn.Linear(96, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2) if make == "adamw" else \
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _train(model, optimizer)
    groups = optimizer_moments(model, optimizer, steps_left=7)
    assert [g.weight for g in groups] == ["model." + n for n, _ in model.named_parameters()]
    assert {g.kind for g in groups} == {"adam" if make == "adamw" else "momentum"}
    assert all(g.steps_left == 7 and g.lr > 0 for g in groups)
    if make == "adamw":
        assert groups[0].step == 5 and groups[0].first == "optimizer.state.0.exp_avg"
    gen = torch.Generator().manual_seed(5)
    batches = [(torch.randn(32, 64, generator=gen), torch.randint(0, 4, (32,), generator=gen))]
    ckpt = Checkpointer(tmp_path / "measured", model, optimizer, eval_batches=batches,
                        grad_ema=False, max_evals=4)
    report = ckpt.save(5)["search"]
    moments = report["moments"]
    assert moments["exp_avg"]["tensors"] >= 2 and moments["exp_avg"]["tried"]
    assert ("exp_avg_sq" in moments) == (make == "adamw")
    # what was chosen is what was stored, and the restored state trains on
    ckpt.restore()
    _train(model, optimizer, 1)
    fixed = Checkpointer(tmp_path / "fixed", model, optimizer, eval_batches=batches,
                         grad_ema=False, max_evals=4, moments="fixed")
    assert "moments" not in fixed.save(6)["search"]
    from inshrink.errors import InvalidArgumentError
    with pytest.raises(InvalidArgumentError, match="moments"):
        Checkpointer(tmp_path / "bad", model, optimizer, moments="guessed")


def test_search_refuses_moments_that_are_not_moments():
    from inshrink.search import Search
    with pytest.raises(InvalidArgumentError, match="Moments"):
        Search().choose(_adam_state(), lambda s: 1.0, moments=[{"weight": "w"}])
