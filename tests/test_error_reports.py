"""A lossy tensor's report gives the error it actually has: recomputed here in float64 from
the original and decoded arrays, ‖x − x̂‖₂ / ‖x‖₂ over finite elements (spec 10.6.6)."""
import math

import numpy as np
import pytest

import inshrink
from inshrink import Policy, QuantConfig
from inshrink.io import frame as array


def _rel_l2(x: np.ndarray, y: np.ndarray) -> float:
    """The relative L2 error of finite elements, scaled so that no square under- or
    overflows."""
    x, y = x.astype(np.float64).ravel(), y.astype(np.float64).ravel()
    keep = np.isfinite(x)
    x, y = x[keep], y[keep]
    scale = np.abs(x).max()
    return float(np.linalg.norm((y - x) / scale) / np.linalg.norm(x / scale))


def _values(magnitude: float) -> np.ndarray:
    return np.random.default_rng(1).normal(0, 1, (64, 64)) * magnitude


# float64 values whose squares underflow (1e-160) or overflow (near the maximum) in float64
EXTREMES = [(_values(1e-160), {"domain": "log"}), (_values(1e-307), {"domain": "linear"}),
            (np.random.default_rng(0).uniform(-1, 1, (64, 64)) * np.finfo(np.float64).max,
             {"domain": "log", "prune": 0.1})]


@pytest.mark.parametrize("x, settings", EXTREMES, ids=["tiny", "tinier", "huge"])
def test_report_of_float64_beyond_squares_is_not_a_wrong_number(tmp_path, x, settings):
    path = tmp_path / "x.ink"
    policy = Policy.uniform(QuantConfig(bins=4, **settings))
    (info,) = inshrink.save(path, {"model.w.weight": x}, policy=policy)
    assert not info.lossless
    measured = _rel_l2(x, inshrink.load(path)["model.w.weight"])
    assert measured > 0.3  # 4 levels: a large error, whose report is checked
    reported = info.error["rel_l2_error"]
    # the figure is either the error or null (not measurable), never a smaller number
    assert reported is None or math.isclose(reported, measured, rel_tol=1e-6)
    with inshrink.open(path) as f:
        assert f.info("model.w.weight").error["rel_l2_error"] == reported


@pytest.mark.parametrize("x", [x for x, _ in EXTREMES], ids=["tiny", "tinier", "huge"])
def test_max_rel_l2_is_met_or_the_tensor_is_lossless(tmp_path, x):
    path = tmp_path / "x.ink"
    (info,) = inshrink.save(path, {"model.w.weight": x},
                            policy=Policy.uniform(QuantConfig(bins=64, max_rel_l2=1e-3)))
    y = inshrink.load(path)["model.w.weight"]
    if info.lossless:
        assert np.array_equal(x, y)
    else:
        assert _rel_l2(x, y) <= 1e-3


@pytest.mark.parametrize("x, settings", EXTREMES, ids=["tiny", "tinier", "huge"])
def test_array_frame_report_and_bound(x, settings):
    frame = array.encode(x, bins=4, **settings)
    reported = array.report(frame)["rel_l2_error"]
    measured = _rel_l2(x, array.decode(frame))
    assert reported is None or math.isclose(reported, measured, rel_tol=1e-6)
    bounded = array.encode(x, bins=64, max_rel_l2=1e-3)
    assert _rel_l2(x, array.decode(bounded)) <= 1e-3


def test_float32_extremes_are_still_measured(tmp_path):
    # float32 squares fit float64: the report keeps giving the number
    for magnitude in (1e-40, 1e37):
        x = (_values(1.0) * magnitude).astype(np.float32)
        path = tmp_path / "x.ink"
        (info,) = inshrink.save(path, {"model.w.weight": x},
                                policy=Policy.uniform(QuantConfig(bins=4, domain="log")))
        measured = _rel_l2(x, inshrink.load(path)["model.w.weight"])
        assert math.isclose(info.error["rel_l2_error"], measured, rel_tol=1e-6)


def _with_extremes(dtype) -> np.ndarray:
    x = (np.random.default_rng(3).standard_normal(8192) * 0.02).astype(dtype)
    big = np.finfo(dtype).max
    x[:6] = [big, -big, np.inf, -np.inf, np.nan, np.finfo(dtype).tiny]
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lossy_saves_of_extreme_values_give_no_numpy_warning(tmp_path, dtype):
    import warnings
    x = _with_extremes(dtype)
    policies = ["balanced", "aggressive", Policy.uniform(QuantConfig(bins=16)),
                Policy.uniform(QuantConfig(bins=16, domain="log")),
                Policy.uniform(QuantConfig(bins=16, max_rel_l2=0.05)),
                Policy.uniform(QuantConfig(bins=64, domain="signed_log", protect=0.01))]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflow or invalid-value RuntimeWarning fails
        for policy in policies:
            for name, value in (("model.layers.0.weight", x), ("optimizer.state.0.exp_avg", x),
                                ("optimizer.state.0.exp_avg_sq", np.abs(x))):
                inshrink.save(tmp_path / "x.ink", {name: value.reshape(64, -1)}, policy=policy)
                back = inshrink.load(tmp_path / "x.ink")[name].reshape(-1)
                assert np.isnan(back[4]) and np.isinf(back[2:4]).all()  # escaped exactly
        for kwargs in ({"bins": 16}, {"bins": 16, "domain": "log"},
                       {"bins": 64, "max_rel_l2": 0.01}, {"bins": 16, "domain": "signed_log"}):
            array.decode(array.encode(x, **kwargs))


def test_the_largest_float32_does_not_cost_the_other_levels():
    # the top bucket's center was inf: the fit kept one level, every other value lost
    x = _with_extremes(np.float32)
    blob = array.encode(x, bins=16)
    back = array.decode(blob)
    assert array.report(blob)["levels"] > 8
    rest = slice(6, None)
    assert _rel_l2(x[rest], back[rest]) < 0.3
