"""A checkpoint keeps the level tables of the one before (Writer(levels=...), Series.save)."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import inshrink
from inshrink import errors
from inshrink.series import Series


def encode(path, state, policy="balanced", levels=None, threads=1):
    with inshrink.Writer(path, policy=policy, levels=levels, threads=threads,
                         keep_codes=True) as w:
        for name, value in state.items():
            w.add(name, value)
        infos = w.close()
    with inshrink.open(path) as f:
        return {i.name: i for i in infos}, w.codes, f.level_tables(), f.load()


def weights(seed=0, n=50_000):
    """A weight matrix of ``n`` elements (a matrix: vectors are stored losslessly)."""
    return np.random.default_rng(seed).standard_normal((n // 100, 100)).astype(
        np.float32) * 0.02


def moved(x, share=0.1, seed=1):
    """``x`` with ``share`` of its elements moved a little."""
    rng = np.random.default_rng(seed)
    y = x.copy()
    at = rng.random(x.shape) < share
    y[at] += rng.standard_normal(int(at.sum())).astype(np.float32) * 0.002
    return y, at


def test_unmoved_elements_keep_their_codes(tmp_path):
    x = weights()
    _, codes0, levels0, _ = encode(tmp_path / "a.ink", {"layer.weight": x})
    y, at = moved(x)
    info, codes1, levels1, decoded = encode(tmp_path / "b.ink", {"layer.weight": y},
                                            levels=levels0)
    assert levels1["layer.weight"].levels.tobytes() == levels0["layer.weight"].levels.tobytes()
    same = codes1["layer.weight"] == codes0["layer.weight"]
    assert same[~at.ravel()].all()  # codes change only where values moved
    # the error reported is the error made, and no larger than a fresh fit's by much
    fresh, _, _, _ = encode(tmp_path / "c.ink", {"layer.weight": y})
    error = np.linalg.norm(decoded["layer.weight"] - y) / np.linalg.norm(y)
    assert info["layer.weight"].error["rel_l2_error"] == pytest.approx(error, rel=1e-6)
    assert error <= fresh["layer.weight"].error["rel_l2_error"] * 1.1


def test_levels_that_no_longer_fit_are_not_kept(tmp_path):
    x = weights()
    _, _, levels0, _ = encode(tmp_path / "a.ink", {"layer.weight": x})
    # ten times larger: the old table would clip almost everything
    _, _, levels1, decoded = encode(tmp_path / "b.ink", {"layer.weight": x * 10},
                                    levels=levels0)
    assert levels1["layer.weight"].levels.tobytes() != levels0["layer.weight"].levels.tobytes()
    error = np.linalg.norm(decoded["layer.weight"] - x * 10) / np.linalg.norm(x * 10)
    assert error < 0.05


@pytest.mark.parametrize("change", ["bins", "dtype", "lossless"])
def test_levels_of_another_configuration_are_not_kept(tmp_path, change):
    x = weights()
    _, _, levels0, _ = encode(tmp_path / "a.ink", {"layer.weight": x})
    state, policy = {"layer.weight": x}, "balanced"
    if change == "bins":
        policy = "aggressive"  # 16 weight levels, not 64
    elif change == "dtype":
        state = {"layer.weight": x.astype(np.float16)}
    else:
        policy = None
    info, _, levels1, decoded = encode(tmp_path / "b.ink", state, policy=policy,
                                       levels=levels0)
    if change == "lossless":
        assert levels1 == {} and decoded["layer.weight"].tobytes() == x.tobytes()
        return
    old, new = levels0["layer.weight"], levels1["layer.weight"]
    assert (len(new.levels), new.dtype) != (len(old.levels), old.dtype)
    assert info["layer.weight"].error["rel_l2_error"] < 0.2  # 16 levels: about 0.12


def test_nan_inf_and_empty_tensors_with_kept_levels(tmp_path):
    x = weights(n=10_000)
    x[0, :5] = [np.nan, np.inf, -np.inf, 0.0, -0.0]
    state = {"layer.weight": x, "empty.weight": np.zeros((0, 4), np.float32)}
    _, _, levels0, _ = encode(tmp_path / "a.ink", state)
    _, _, _, decoded = encode(tmp_path / "b.ink", state, levels=levels0)
    got = decoded["layer.weight"]
    assert np.isnan(got[0, 0]) and got[0, 1] == np.inf and got[0, 2] == -np.inf
    assert decoded["empty.weight"].shape == (0, 4)


@pytest.mark.parametrize("bad", [[1, 2], {"w": "levels"}, {"w": np.zeros(3)}, "levels"])
def test_bad_levels_are_an_invalid_argument(tmp_path, bad):
    with pytest.raises(errors.InvalidArgumentError, match="levels"):
        inshrink.Writer(tmp_path / "a.ink", policy="balanced", levels=bad)
    assert not (tmp_path / "a.ink").exists()


def test_threads_do_not_change_the_bytes(tmp_path):
    x = weights()
    _, _, levels0, _ = encode(tmp_path / "a.ink", {"layer.weight": x, "other.weight": -x})
    y, _ = moved(x)
    state = {"layer.weight": y, "other.weight": -y}
    encode(tmp_path / "one.ink", state, levels=levels0, threads=1)
    encode(tmp_path / "two.ink", state, levels=levels0, threads=2)
    assert (tmp_path / "one.ink").read_bytes() == (tmp_path / "two.ink").read_bytes()


def test_a_series_keeps_the_levels_of_its_newest_step(tmp_path):
    x = weights()
    series = Series(tmp_path / "s", policy="balanced", threads=1)
    states = [{"layer.weight": x}]
    for seed in (1, 2, 3):
        states.append({"layer.weight": moved(states[-1]["layer.weight"], seed=seed)[0]})
    for step, state in enumerate(states):
        series.save(step, state)
    tables = []
    for entry in series.checkpoints():
        with inshrink.open(tmp_path / "s" / entry.file) as f:
            tables.append(f.level_tables()["layer.weight"].levels.tobytes())
    assert len(set(tables)) == 1  # one table, kept from the first step
    for step, state in enumerate(states):
        error = (np.linalg.norm(series.load(step)["layer.weight"] - state["layer.weight"])
                 / np.linalg.norm(state["layer.weight"]))
        assert error < 0.05
    assert series.verify() == []


@settings(max_examples=25, deadline=None)
@given(scale=st.floats(0.5, 2.0), share=st.floats(0.0, 1.0), seed=st.integers(0, 2**16))
def test_kept_levels_never_predict_more_error_than_a_fresh_fit(tmp_path_factory, scale,
                                                               share, seed):
    tmp = tmp_path_factory.mktemp("p")
    x = weights(seed, n=4096)
    _, _, levels0, _ = encode(tmp / "a.ink", {"layer.weight": x})
    y = moved(x, share, seed + 1)[0] * np.float32(scale)
    kept_info, _, _, kept = encode(tmp / "b.ink", {"layer.weight": y}, levels=levels0)
    fresh_info, _, _, _ = encode(tmp / "c.ink", {"layer.weight": y})
    # the choice is made on the sketch's prediction; the error made stays close to a fresh fit's
    assert (kept_info["layer.weight"].error["rel_l2_error"]
            <= fresh_info["layer.weight"].error["rel_l2_error"] * 1.15 + 1e-4)
