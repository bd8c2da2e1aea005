"""The lossy codec end to end: partition, levels, error report, policies, bounds."""
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import inshrink
from inshrink import errors
from inshrink.errors import InvalidArgumentError
from inshrink.encode import fit as fitting
from inshrink.encode import quantizer, sketch as sketching
from inshrink.encode.policy import Policy, QuantConfig, role_of


def save_load(tmp_path, tensors, policy, **kwargs):
    path = tmp_path / "q.ink"
    report = inshrink.save(path, tensors, policy=policy, threads=1, **kwargs)
    return {r.name: r for r in report}, inshrink.load(path), path


def rel_l2(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(a))


def weights(shape=(256, 128), dtype=np.float32, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * 0.02).astype(dtype)


UNIFORM16 = Policy.uniform(QuantConfig(bins=16))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16])
def test_reported_error_is_the_actual_error(tmp_path, dtype):
    x = weights(dtype=dtype)
    report, out, _ = save_load(tmp_path, {"layer.weight": x}, UNIFORM16)
    info = report["layer.weight"]
    assert info.codec == "quant+zstd" and info.role == "weight" and not info.lossless
    assert out["layer.weight"].dtype == x.dtype
    assert math.isclose(info.error["rel_l2_error"], rel_l2(x, out["layer.weight"]),
                        rel_tol=1e-6, abs_tol=1e-12)
    diff = np.abs(x.astype(np.float64) - out["layer.weight"].astype(np.float64))
    assert math.isclose(info.error["max_abs_error"], diff.max(), rel_tol=1e-9)
    assert info.error["rel_l2_error"] < 0.2
    assert len(np.unique(out["layer.weight"])) <= 16 + int(0.001 * x.size) + 1


def test_sixteen_bins_on_fp32_weights_is_over_eight_times_smaller(tmp_path):
    x = weights((512, 512))
    report, _, _ = save_load(tmp_path, {"w.weight": x}, UNIFORM16)
    assert report["w.weight"].ratio > 8  # 4-bit codes plus the side streams


def test_protected_values_are_exact_and_levels_sorted(tmp_path):
    x = weights()
    x[3, 4], x[100, 7] = 5.0, -7.5  # far outliers: protected
    x[0, 0], x[0, 1], x[0, 2] = np.nan, np.inf, -np.inf
    report, out, path = save_load(tmp_path, {"w.weight": x}, UNIFORM16)
    y = out["w.weight"]
    assert y[3, 4] == 5.0 and y[100, 7] == -7.5
    assert np.isnan(y[0, 0]) and y[0, 1] == np.inf and y[0, 2] == -np.inf
    top = np.argsort(np.abs(x[np.isfinite(x)]))[-10:]
    assert np.array_equal(x[np.isfinite(x)][top], y[np.isfinite(x)][top])
    with inshrink.open(path) as f:
        stage = f._pipelines["w.weight"].stage
    levels = stage.levels.astype(np.float64)
    assert np.all(np.diff(levels) > 0)
    assert report["w.weight"].error["protected"] >= 5 / x.size


def test_pruned_values_are_exactly_zero(tmp_path):
    x = weights()
    policy = Policy.uniform(QuantConfig(bins=16, prune=0.3))
    report, out, _ = save_load(tmp_path, {"w.weight": x}, policy)
    y = out["w.weight"]
    smallest = np.argsort(np.abs(x), axis=None)[: int(0.25 * x.size)]
    assert np.all(y.reshape(-1)[smallest] == 0)
    assert 0.25 < report["w.weight"].error["pruned"] < 0.35


def test_same_input_same_bytes(tmp_path):
    x = weights()
    a = tmp_path / "a.ink"
    b = tmp_path / "b.ink"
    inshrink.save(a, {"w.weight": x}, policy="balanced", threads=1)
    inshrink.save(b, {"w.weight": x}, policy="balanced", threads=2)
    assert a.read_bytes() == b.read_bytes()


def test_optimizer_moments_keep_sign_and_never_flush(tmp_path):
    rng = np.random.default_rng(1)
    v = (rng.lognormal(-20, 4, (128, 64))).astype(np.float32)  # huge dynamic range, > 0
    v[0, :5] = 0.0
    m = (rng.standard_normal((128, 64)) * rng.lognormal(-10, 3, (128, 64))).astype(np.float32)
    tensors = {"optimizer.state.0.exp_avg_sq": v, "optimizer.state.0.exp_avg": m}
    report, out, path = save_load(tmp_path, tensors, Policy.uniform(QuantConfig(bins=8)))
    v2, m2 = out["optimizer.state.0.exp_avg_sq"], out["optimizer.state.0.exp_avg"]
    assert report["optimizer.state.0.exp_avg_sq"].role == "exp_avg_sq"
    assert np.all(v2 >= 0) and np.all((v > 0) == (v2 > 0)) and np.all(v2[0, :5] == 0)
    assert np.all(np.sign(m) == np.sign(m2))
    assert report["optimizer.state.0.exp_avg"].error["sign_flipped"] == 0
    # every value went to its nearest level in the log domain (or is exact: protected)
    with inshrink.open(path) as f:
        stage = f._pipelines["optimizer.state.0.exp_avg_sq"].stage
        levels = stage.levels.astype(np.float64)
    levels = levels[levels > 0]
    logs = np.log(levels)
    pos = v > 0
    nearest = levels[np.abs(np.log(v[pos].astype(np.float64))[:, None] - logs).argmin(1)]
    assert np.all((v2[pos] == nearest.astype(np.float32)) | (v2[pos] == v[pos]))


def test_one_level_for_signed_moments_is_their_mean(tmp_path):
    """A single level cannot keep signs; it must not push every element one way."""
    m = np.random.default_rng(2).normal(1e-5, 1e-3, 20000).astype(np.float32)
    config = QuantConfig(bins=1, protect=0.0, domain="signed_log")
    report, out, _ = save_load(tmp_path, {"optimizer.state.0.exp_avg": m},
                               Policy({"exp_avg": config}))
    m2 = out["optimizer.state.0.exp_avg"]
    assert len(np.unique(m2)) == 1
    assert abs(float(m2[0])) < 1e-4
    # about the error of storing zeros (the linear fit weighs buckets by size, not only count)
    assert report["optimizer.state.0.exp_avg"].error["rel_l2_error"] <= 1.01


@pytest.mark.parametrize("value", [0.0, 1.5, -2.0])
def test_constant_tensors(tmp_path, value):
    x = np.full((100, 100), value, np.float32)
    report, out, _ = save_load(tmp_path, {"w.weight": x}, UNIFORM16)
    assert np.array_equal(out["w.weight"], x)
    assert report["w.weight"].error["rel_l2_error"] == 0


def test_all_non_finite_tensor_is_exact(tmp_path):
    x = np.full((80, 80), np.nan, np.float32)
    x[::2] = np.inf
    _, out, _ = save_load(tmp_path, {"w.weight": x}, UNIFORM16)
    assert np.array_equal(np.isnan(out["w.weight"]), np.isnan(x))
    assert np.array_equal(out["w.weight"][::2], x[::2])


def test_small_and_exact_tensors_stay_lossless(tmp_path):
    tensors = {"layer.bias": weights((64,)), "norm.weight": weights((32, 2)),
               "optimizer.state.0.step": np.array(12.0, np.float32),
               "ids": np.arange(10_000, dtype=np.int64), "w.weight": weights()}
    report, out, _ = save_load(tmp_path, tensors, "aggressive")
    for name in ("layer.bias", "norm.weight", "optimizer.state.0.step", "ids"):
        assert report[name].lossless and np.array_equal(out[name], tensors[name])
    assert not report["w.weight"].lossless


def test_compact_preset_keeps_moment_signs_in_two_levels(tmp_path):
    """Two levels per moment, signs kept; the smaller half of ``exp_avg`` restored as exact
    zeros, not as its sign's one magnitude: with Adam that magnitude, many times a small
    element's own first moment, made its updates explode after a restore."""
    rng = np.random.default_rng(4)
    m = (rng.standard_normal((128, 64)) * 1e-3).astype(np.float32)
    v = rng.lognormal(-14, 2, (128, 64)).astype(np.float32)
    tensors = {"w.weight": weights(), "optimizer.state.0.exp_avg": m,
               "optimizer.state.0.exp_avg_sq": v}
    report, out, _ = save_load(tmp_path, tensors, "compact")
    for name, x in (("optimizer.state.0.exp_avg", m), ("optimizer.state.0.exp_avg_sq", v)):
        exact = out[name] == x  # the protected 0.05%
        kept = ~exact & (out[name] != 0)
        assert len(np.unique(out[name][kept])) <= 2
        assert np.all(np.sign(out[name][kept]) == np.sign(x[kept]))
    assert np.all(out["optimizer.state.0.exp_avg_sq"] != 0)
    restored = out["optimizer.state.0.exp_avg"]
    zeroed = restored == 0
    assert 0.45 <= zeroed.mean() <= 0.55  # the half pruned, to the sketch's bucket edges
    assert np.abs(m[zeroed]).max() <= np.abs(m[~zeroed]).min()  # the smaller magnitudes
    assert report["optimizer.state.0.exp_avg"].error["pruned"] == pytest.approx(
        zeroed.mean(), abs=1e-3)
    assert len(np.unique(out["w.weight"])) <= 16 + np.ceil(0.0005 * out["w.weight"].size)


def test_override_can_quantize_a_small_tensor(tmp_path):
    policy = Policy({"weight": QuantConfig(bins=8)}, overrides={"*.bias": QuantConfig(bins=4)})
    report, out, _ = save_load(tmp_path, {"a.bias": weights((300,))}, policy)
    assert not report["a.bias"].lossless and len(np.unique(out["a.bias"])) <= 4 + 1


def test_exact_name_configs_come_before_overrides(tmp_path):
    names = ("a[0].weight", "a*.weight", "b.weight")  # glob characters are plain text here
    policy = Policy({"weight": QuantConfig(bins=16)}, overrides={"a*": QuantConfig(bins=8)},
                    tensors={"a[0].weight": QuantConfig(bins=2), "b.weight": QuantConfig(4)})
    report, out, _ = save_load(tmp_path, {n: weights((64, 64)) for n in names}, policy)
    protected = np.ceil(0.0005 * 64 * 64)
    for name, bins in zip(names, (2, 8, 4)):
        assert policy.config_for(name, "F32", (64, 64)) == ("weight", QuantConfig(
            bins=bins, domain="linear"))
        assert len(np.unique(out[name])) <= bins + protected
    with pytest.raises(InvalidArgumentError):
        Policy(tensors={"w": 16})


def test_error_bound_picks_fewest_bins(tmp_path):
    x = weights((256, 256))
    policy = Policy.uniform(QuantConfig(bins=256, max_rel_l2=0.02))
    report, out, path = save_load(tmp_path, {"w.weight": x}, policy)
    achieved = rel_l2(x, out["w.weight"])
    assert achieved <= 0.02 and report["w.weight"].error["rel_l2_error"] <= 0.02
    bins = report["w.weight"]
    with inshrink.open(path) as f:
        chosen = f._entries["w.weight"].report["bins"]
    assert chosen < 256
    smaller = [b for b in (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192) if b < chosen]
    if smaller:  # the next smaller bin count misses the bound
        _, out2, _ = save_load(tmp_path, {"w.weight": x},
                               Policy.uniform(QuantConfig(bins=smaller[-1])))
        assert rel_l2(x, out2["w.weight"]) > 0.02 or bins.ratio > 0


def test_unreachable_bound_falls_back_to_lossless(tmp_path):
    x = weights()
    report, out, _ = save_load(tmp_path, {"w.weight": x},
                               Policy.uniform(QuantConfig(bins=4, max_rel_l2=1e-6)))
    assert report["w.weight"].lossless and np.array_equal(out["w.weight"], x)


def test_importance_protects_and_prunes(tmp_path):
    x = weights()
    scores = np.random.default_rng(5).random(x.shape)
    policy = Policy.uniform(QuantConfig(bins=16, protect=0.01, prune=0.2,
                                        prune_metric="sensitivity"))
    _, out, _ = save_load(tmp_path, {"w.weight": x}, policy, importance={"w.weight": scores})
    y = out["w.weight"]
    order = np.argsort(scores, axis=None)
    top, bottom = order[-int(0.01 * x.size):], order[: int(0.2 * x.size)]
    assert np.array_equal(y.reshape(-1)[top], x.reshape(-1)[top])
    # protection (here: the 1% largest magnitudes) wins over pruning
    kept = y.reshape(-1)[bottom] != 0
    assert np.array_equal(y.reshape(-1)[bottom][kept], x.reshape(-1)[bottom][kept])
    assert kept.mean() < 0.02


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_zero_bins_keep_only_the_protected_entries(tmp_path, dtype):
    rng = np.random.default_rng(5)
    m = (rng.standard_normal((128, 64)) * 1e-3).astype(dtype)
    m[0, :3] = [np.nan, np.inf, -0.0]
    policy = Policy({"exp_avg": QuantConfig(bins=0, protect=0.001)})
    report, out, _ = save_load(tmp_path, {"optimizer.state.0.exp_avg": m}, policy)
    x = out["optimizer.state.0.exp_avg"]
    kept = x != 0
    assert not report["optimizer.state.0.exp_avg"].lossless
    assert np.isnan(x[0, 0]) and x[0, 1] == np.inf  # non-finite values are always exact
    finite = np.isfinite(m.astype(np.float32))
    # the largest 0.1%, rounded outward to whole sketch buckets, exactly
    assert math.ceil(0.001 * m.size) <= np.count_nonzero(kept & finite) <= 0.002 * m.size
    assert np.array_equal(x[kept & finite], m[kept & finite])
    assert np.abs(m.astype(np.float32)[kept & finite]).min() >= \
        np.abs(m.astype(np.float32)[~kept & finite]).max()


def test_bad_configs_and_policies():
    for kwargs in (dict(bins=-1), dict(bins=True), dict(bins=70_000), dict(prune=1.0), dict(protect=-0.1),
                   dict(prune=0.6, protect=0.5), dict(prune_metric="x"), dict(domain="x"),
                   dict(max_rel_l2=0), dict(sigma=2), dict(alpha=0.5), dict(seed=1.5)):
        with pytest.raises(errors.InvalidArgumentError):
            QuantConfig(**kwargs)
    with pytest.raises(errors.InvalidArgumentError):
        Policy({"nonsense": QuantConfig()})
    with pytest.raises(errors.InvalidArgumentError):
        inshrink.save("unused.ink", {"a": np.zeros(2)}, policy="no-such-preset")


def test_sensitivity_pruning_needs_importance(tmp_path):
    policy = Policy.uniform(QuantConfig(prune=0.1, prune_metric="sensitivity"))
    with pytest.raises(errors.InvalidArgumentError, match="importance"):
        inshrink.save(tmp_path / "s.ink", {"w.weight": weights()}, policy=policy)


@pytest.mark.parametrize("name, dtype, shape, role", [
    ("model.layers.0.attn.q_proj.weight", "F32", (64, 64), "weight"),
    ("model.embed_tokens.weight", "BF16", (1000, 64), "embedding"),
    ("optimizer.state.3.exp_avg", "F32", (64, 64), "exp_avg"),
    ("optimizer.state.3.exp_avg_sq", "F32", (64, 64), "exp_avg_sq"),
    ("optimizer.state.3.momentum_buffer", "F32", (64, 64), "exp_avg"),
    ("optimizer.state.3.step", "F32", (), "exact"),
    ("model.norm.weight", "F32", (64,), "small"),
    ("model.norm.weight", "F32", (4096,), "small"),
    ("optimizer.state.5.exp_avg", "F32", (256,), "exp_avg"),
    ("optimizer.state.5.exp_avg_sq", "F32", (512,), "exp_avg_sq"),
    ("optimizer.state.5.exp_avg", "F32", (255,), "small"),
    ("optimizer.state.5.exp_avg_sq", "F32", (), "small"),
    ("model.w", "I64", (64, 64), "exact"),
    ("model.w", "F8_E4M3", (64, 64), "exact"),
])
def test_roles_from_names(name, dtype, shape, role):
    assert role_of(name, dtype, shape) == role


def test_lossy_files_are_format_1_1_and_lossless_files_1_0(tmp_path):
    inshrink.save(tmp_path / "a.ink", {"w.weight": weights()})
    inshrink.save(tmp_path / "b.ink", {"w.weight": weights()}, policy="balanced")
    assert (tmp_path / "a.ink").read_bytes()[8:12] == bytes([1, 0, 0, 0])
    assert (tmp_path / "b.ink").read_bytes()[8:12] == bytes([1, 0, 1, 0])


@given(x=hnp.arrays(np.float32, st.integers(4096, 6000),
                    elements=st.floats(-1e6, 1e6, width=32, allow_subnormal=True)),
       bins=st.integers(1, 40), prune=st.sampled_from([0.0, 0.1]),
       protect=st.sampled_from([0.0, 0.001, 0.05]),
       domain=st.sampled_from(["linear", "log", "signed_log"]))
def test_property_decoded_matches_report(tmp_path_factory, x, bins, prune, protect, domain):
    path = tmp_path_factory.mktemp("p") / "p.ink"
    policy = Policy.uniform(QuantConfig(bins=bins, prune=prune, protect=protect, domain=domain))
    info = inshrink.save(path, {"w.weight": x.reshape(-1, 64) if x.size % 64 == 0 else x},
                         policy=policy, threads=1)[0]
    y = inshrink.load(path)["w.weight"].reshape(-1)
    assert y.dtype == np.float32 and y.size == x.size
    if info.lossless:
        assert np.array_equal(x, y)
        return
    if np.any(x):
        assert math.isclose(info.error["rel_l2_error"], rel_l2(x, y), rel_tol=1e-5,
                            abs_tol=1e-9)
    distinct = np.unique(y[np.abs(x) < np.max(np.abs(x))])
    assert distinct.size <= bins + 1 + int(protect * x.size) + 1


@pytest.mark.parametrize("bins", [2, 5, 40, 300, 3000])
def test_every_code_width_round_trips(tmp_path, bins):
    x = weights((300, 200), seed=bins)
    report, out, path = save_load(tmp_path, {"w.weight": x},
                                  Policy.uniform(QuantConfig(bins=bins, protect=0.001)))
    with inshrink.open(path) as f:
        stage = f._pipelines["w.weight"].stage
    assert stage.bits >= max(1, (len(stage.levels) - 1).bit_length())
    assert math.isclose(report["w.weight"].error["rel_l2_error"], rel_l2(x, out["w.weight"]),
                        rel_tol=1e-6)
    table = stage.levels.astype(np.float32)
    on_level = np.isin(out["w.weight"], table) | (out["w.weight"] == x)
    assert on_level.all()


def test_multi_chunk_lossy_tensor_equals_one_chunk_stats(tmp_path):
    x = weights((500, 300), seed=7)
    policy = Policy.uniform(QuantConfig(bins=32))
    with inshrink.Writer(tmp_path / "m.ink", chunk_bytes=40_000, policy=policy, threads=2) as w:
        w.add("w.weight", x)
    info = inshrink.open(tmp_path / "m.ink").info("w.weight")
    out = inshrink.load(tmp_path / "m.ink")["w.weight"]
    assert math.isclose(info.error["rel_l2_error"], rel_l2(x, out), rel_tol=1e-6)
    single, out1, _ = save_load(tmp_path, {"w.weight": x}, policy)
    assert np.array_equal(out, out1["w.weight"])  # chunking does not change the codes


def test_cli_lossy_options(tmp_path):
    import subprocess
    import sys
    from safetensors.numpy import save_file
    save_file({"w.weight": weights((128, 64)), "b": np.zeros(3, np.float32)},
              str(tmp_path / "m.safetensors"))
    env = {"PYTHONPATH": str(__import__("pathlib").Path(__file__).parents[1])}

    def run(*args):
        return subprocess.run([sys.executable, "-m", "inshrink", *args], cwd=tmp_path,
                              capture_output=True, text=True, env={**__import__("os").environ,
                                                                   **env}, timeout=300)
    assert run("compress", "m.safetensors", "--lossy", "-o", "a.ink").returncode == 0
    r = run("info", "a.ink")
    assert "quant+zstd" in r.stdout and "rel L2 err" in r.stdout
    assert run("compress", "m.safetensors", "--bins", "8", "--prune", "0.1",
               "-o", "b.ink").returncode == 0
    import json
    info = json.loads(run("info", "b.ink", "--json").stdout)
    lossy = [t for t in info["files"][0]["tensors"] if t["codec"] == "quant+zstd"]
    assert lossy and lossy[0]["error"]["pruned"] > 0.05
    r = run("compress", "m.safetensors", "--preset", "balanced", "--bins", "8", "-o", "c.ink")
    assert r.returncode == 2 and "either" in r.stderr
    r = run("compress", "m.safetensors", "--bins", "0", "-o", "d.ink")
    assert r.returncode == 2 and "bins" in r.stderr and "Traceback" not in r.stderr
    assert run("decompress", "a.ink", "-o", "a.safetensors").returncode == 0


def test_a_failed_add_leaves_the_writer_usable(tmp_path):
    policy = Policy.uniform(QuantConfig(bins=8))
    with inshrink.Writer(tmp_path / "w.ink", policy=policy) as w:
        with pytest.raises(errors.InvalidArgumentError, match="importance"):
            w.add("w.weight", weights(), importance=np.ones(3))
        w.add("w.weight", weights())
    assert list(inshrink.load(tmp_path / "w.ink")) == ["w.weight"]


def _thresholds_over_every_bucket(sketch, config):
    """The thresholds computed over every bucket (the definition the fast path must match)."""
    counts = sketch.pos + sketch.neg
    finite = sketch.count - sketch.nonfinite
    cumulative = np.cumsum(counts)
    lo, prune_below = -1, 0.0
    target = config.prune * finite - sketch.zeros
    if config.prune > 0 and target > 0:
        lo = int(np.searchsorted(cumulative, target, side="left"))
        prune_below = float(sketch.upper(lo))
    hi, protect_at = len(counts) - 1, math.inf
    target = config.protect * finite
    if config.protect > 0 and target > 0:
        from_top = cumulative[-1] - cumulative + counts
        hi = max(int(np.count_nonzero(from_top >= target)) - 1, 0)
        protect_at = float(sketch.lower(hi))
    return lo, hi, prune_below, protect_at


@given(values=hnp.arrays(np.float32, st.integers(0, 300),
                         elements=st.floats(-1e6, 1e6, width=32) | st.sampled_from(
                             [0.0, np.inf, np.nan, 1e-30, -2.5])),
       prune=st.sampled_from([0.0, 0.1, 0.5, 0.7]),
       protect=st.sampled_from([0.0, 0.0005, 0.01, 0.29]))
def test_thresholds_match_the_every_bucket_definition(values, prune, protect):
    from inshrink.dtypes import BY_NAME
    sketch = sketching.Sketch.for_dtype(BY_NAME["F32"], QuantConfig().alpha, 16)
    sketch.add(np.ascontiguousarray(values))
    config = QuantConfig(bins=16, prune=prune, protect=protect)
    assert (fitting._thresholds(sketch, prune, protect)
            == _thresholds_over_every_bucket(sketch, config))


def test_overrides_of_the_wrong_length_are_refused_before_the_kernel():
    from inshrink.dtypes import BY_NAME
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    sketch = sketching.Sketch.for_dtype(BY_NAME["F32"], QuantConfig().alpha, 16)
    sketch.add(x)
    encoder = fitting.fit(sketch, BY_NAME["F32"], bins=16, domain="linear", protect=0.01)
    with pytest.raises(InvalidArgumentError, match="3 overrides"):
        encoder.quantize(x.view(np.uint8), np.zeros(3, np.int8))
    chunk, stats = encoder.quantize(x.view(np.uint8), np.zeros(1000, np.int8))
    assert stats.protected == chunk.positions.size == 10


def test_the_sketch_fit_scans_only_the_occupied_buckets_and_agrees_with_every_bucket():
    from inshrink.dtypes import BY_NAME
    x = np.random.default_rng(1).lognormal(-8, 2, 5000).astype(np.float32)
    x[::3] *= -1
    sketch = sketching.Sketch.for_dtype(BY_NAME["F32"], QuantConfig().alpha, 16)
    sketch.add(x)
    first, stop = sketch.occupied
    used = np.flatnonzero(sketch.pos + sketch.neg)
    assert (first, stop) == (used[0], used[-1] + 1) and stop - first < sketch.pos.size // 10
    assert sketch.count == x.size


@pytest.mark.parametrize("domain,prune,work", [("linear", 0.0, np.float32),
                                               (None, 0.05, np.float32),
                                               ("log", 0.0, np.float32),
                                               ("linear", 0.02, np.float64)])
def test_every_way_of_ranking_a_chunk_gives_the_codes_of_assign_codes(domain, prune, work):
    """Short chunks are searched in numpy, long float32 ones take the rank table, long
    float64 ones are counted: all three agree with the reference kernels."""
    from inshrink.dtypes import BY_NAME
    dtype = BY_NAME["F64" if work == np.float64 else "F32"]
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(3 * quantizer._RANK_TABLE_MIN) * 0.02).astype(work)
    if domain == "log":
        x = x * x
    sketch = sketching.Sketch.for_dtype(dtype, QuantConfig().alpha, 16)
    sketch.add(x)
    encoder = fitting.fit(sketch, dtype, bins=16, domain=domain, prune=prune, protect=0.001)
    x[:8] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, *encoder.boundaries[:2]]
    for n in (100, quantizer._RANK_TABLE_MIN - 1, x.size):
        chunk = x[:n]
        codes, positions, stats = encoder._encode(chunk, None)
        assigned = encoder.assign(chunk)
        escaped = np.flatnonzero(assigned == encoder.stage.escape)
        np.testing.assert_array_equal(positions, escaped)
        kept = np.ones(n, bool)
        kept[escaped] = False
        np.testing.assert_array_equal(codes[kept], assigned[kept])
        assert stats == encoder.stats(chunk, assigned)


@given(bits=st.sampled_from([1, 2, 4]), codes=hnp.arrays(np.uint16, st.integers(0, 300)))
def test_numpy_packing_of_short_chunks_is_the_kernels(bits, codes):
    """Short chunks are packed by numpy until the kernels are compiled: same bytes, same codes
    back (high bits masked, padding zero)."""
    from inshrink.codecs import quant
    from inshrink.kernels import quant as kernels
    packed = np.full(quant.codes_size(codes.size, bits), 0xAA, np.uint8)
    quant._numpy_pack_bits(codes, bits, packed)
    expected = np.zeros_like(packed)
    kernels.pack_bits(codes, bits, expected)
    np.testing.assert_array_equal(packed, expected)
    back = np.full(codes.size, 0xFFFF, np.uint16)
    quant._numpy_unpack_bits(np.append(packed, np.uint8(0xFF)), bits, codes.size, back)
    np.testing.assert_array_equal(back, codes & ((1 << bits) - 1))


def test_a_small_lossy_save_and_load_compile_no_packing_or_fit_kernel(tmp_path):
    import subprocess
    import sys
    script = """
import numpy as np, inshrink
from inshrink.kernels import quant
rng = np.random.default_rng(0)
state = {"model.w.weight": rng.standard_normal((64, 64)).astype(np.float32),
         "optimizer.state.0.exp_avg": rng.standard_normal((64, 64)).astype(np.float32) * 1e-3}
inshrink.save("s.ink", state, policy=inshrink.Policy.uniform(inshrink.QuantConfig(bins=4)))
back = inshrink.load("s.ink")
assert all(back[k].shape == v.shape for k, v in state.items())
print(quant.pack_bits.ready, quant.unpack_bits.ready, quant.fit_points.ready,
      quant.rank_chunk.ready)
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["False", "False", "False", "False"]


@pytest.mark.parametrize("work", [np.float32, np.float64])
@pytest.mark.parametrize("bins", [1, 2, 16, 32, 64])
def test_short_chunks_ranked_by_the_kernel_are_quantized_as_by_numpys_search(monkeypatch,
                                                                             work, bins):
    # once a process has ranked enough short chunks with numpy, rank_chunk ranks them: the
    # same codes (escaped ones included: NaN, inf, protected, forced), escapes and error
    from inshrink.dtypes import BY_NAME
    dtype = BY_NAME["F32" if work is np.float32 else "F64"]
    rng = np.random.default_rng(bins)
    x = (rng.standard_normal(3000) * 1e-3).astype(work)
    x[[5, 17, 400]] = [np.nan, np.inf, -np.inf]
    x[[6, 7, 8]] = [0.0, -0.0, x.max() * 10]
    monkeypatch.setattr(quantizer, "NUMPY_ELEMENTS", -1)  # quantize_chunk, not its stand-in
    sketch = sketching.Sketch.for_dtype(dtype, QuantConfig().alpha, bins)
    sketch.add(x)
    raw = x.view(np.uint8)
    force = rng.integers(0, 3, x.size).astype(np.int8)
    for domain in ("linear", "signed_log"):
        encoder = fitting.fit(sketch, dtype, bins=bins, domain=domain, protect=0.001,
                               prune=0.01)
        for n in (1, 255, 3000):
            for f in (None, force[:n]):
                results = []
                for due in (False, True):
                    monkeypatch.setattr(quantizer, "_rank_kernel_due", lambda due=due: due)
                    chunk, stats = encoder.quantize(raw[:n * x.itemsize], f)
                    results.append((chunk.codes.tobytes(), chunk.positions.tobytes(),
                                    chunk.values.tobytes(), stats))
                assert results[0] == results[1], (domain, n)


def test_short_chunks_are_ranked_by_the_kernel_once_a_process_has_ranked_enough(monkeypatch):
    from inshrink.dtypes import BY_NAME
    calls = []
    real = quantizer.kernels.rank_chunk

    class Spy:
        ready = False  # as if not compiled

        def __call__(self, *args):
            calls.append(len(args[0]))
            return real(*args)
    monkeypatch.setattr(quantizer.kernels, "rank_chunk", Spy())
    monkeypatch.setattr(quantizer, "_SEARCHES_BEFORE_KERNEL", 3)
    monkeypatch.setattr(quantizer, "NUMPY_ELEMENTS", -1)  # quantize_chunk, not its stand-in
    monkeypatch.setattr(quantizer, "_searches_so_far", 0)
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    sketch = sketching.Sketch.for_dtype(BY_NAME["F32"], QuantConfig().alpha, 16)
    sketch.add(x)
    encoder = fitting.fit(sketch, BY_NAME["F32"], bins=16, domain="linear")
    wide = fitting.fit(sketch, BY_NAME["F32"], bins=64, domain="linear")
    codes = [encoder.quantize(x.view(np.uint8))[0].codes for _ in range(5)]
    assert calls == [1000, 1000]
    assert all(np.array_equal(c, codes[0]) for c in codes)
    wide.quantize(x.view(np.uint8))  # 63 boundaries: numpy's search is as fast
    assert calls == [1000, 1000]


def test_fits_use_the_kernel_once_a_process_has_fitted_enough_tensors(monkeypatch):
    from inshrink.dtypes import BY_NAME
    calls = []
    for name in ("_fit_kernel", "_fit_reference"):
        real = getattr(fitting, name)
        monkeypatch.setattr(fitting, name, lambda *a, _real=real, _name=name, **k:
                            calls.append(_name) or _real(*a, **k))
    monkeypatch.setattr(quantizer.kernels.fit_points, "_compiled", None)  # as if not compiled
    monkeypatch.setattr(fitting, "_FITS_BEFORE_KERNEL", 3)
    monkeypatch.setattr(fitting, "_fits_so_far", 0)
    sketch = sketching.Sketch.for_dtype(BY_NAME["F32"], QuantConfig().alpha, 16)
    sketch.add(np.random.default_rng(0).standard_normal(1000).astype(np.float32))
    fitted = [fitting.fit(sketch, BY_NAME["F32"], bins=16, domain="linear") for _ in range(5)]
    assert calls == ["_fit_reference"] * 3 + ["_fit_kernel"] * 2
    assert len({e.stage.levels.tobytes() for e in fitted}) == 1


@pytest.mark.parametrize("name", ["F32", "BF16", "F16", "F64"])
@pytest.mark.parametrize("bins", [1, 16, 64, 1024])
def test_bucket_centers_from_the_table_are_computed_ones(name, bins):
    """Small sketches look their bucket centers up in a table made once: the same values."""
    from inshrink.dtypes import BY_NAME
    dtype = BY_NAME[name]
    sketch = sketching.Sketch.for_dtype(dtype, QuantConfig().alpha, bins)
    work = sketching.work_dtype(dtype)
    tiny = np.finfo(work).smallest_subnormal
    sketch.add(np.array([tiny, 1e-30, 0.5, -3.0, 1e30, -np.finfo(work).max], work))
    index = sketch.buckets.index
    assert index.size >= 5
    np.testing.assert_array_equal(sketch.buckets.centers,
                                  sketching.bucket_centers(sketch.work, sketch.shift, index))


def test_a_released_sketch_gives_its_zeroed_counts_to_the_next_one():
    from inshrink.dtypes import BY_NAME
    rng = np.random.default_rng(2)
    first = sketching.Sketch.for_dtype(BY_NAME["F32"], 0.005, 16)
    first.add(rng.standard_normal(5000).astype(np.float32) * np.float32(1e3))
    counts = first.counts
    first.release()
    x = rng.standard_normal(3000).astype(np.float32) * np.float32(1e-5)
    second = sketching.Sketch.for_dtype(BY_NAME["F32"], 0.005, 16)
    assert second.counts is counts
    second.add(x)
    fresh = sketching.Sketch(second.work, second.shift, np.zeros_like(counts), np.zeros(3),
                            np.array([counts.shape[1], -1]))
    fresh.add(x)
    np.testing.assert_array_equal(second.counts, fresh.counts)
    np.testing.assert_array_equal(second.span, fresh.span)
    # a sketch of another size does not take them
    assert sketching.Sketch.for_dtype(BY_NAME["F32"], 0.005, 64).counts.shape != counts.shape


@given(values=hnp.arrays(np.float32, st.integers(0, 400),
                         elements=st.floats(-1e6, 1e6, width=32) | st.sampled_from(
                             [0.0, -0.0, np.inf, np.nan, 1e-30, -2.5, 3e38])),
       bins=st.sampled_from([0, 1, 2, 3, 16, 64, 1024]),
       domain=st.sampled_from([None, "log", "signed_log", "linear"]),
       prune=st.sampled_from([0.0, 0.1, 0.5]), protect=st.sampled_from([0.0, 0.0005, 0.2]),
       dtype=st.sampled_from(["F32", "BF16"]), zero_level=st.booleans())
def test_the_fit_kernel_gives_the_levels_of_the_numpy_fit(values, bins, domain, prune, protect,
                                                          dtype, zero_level):
    from inshrink.dtypes import BY_NAME
    sketch = sketching.Sketch.for_dtype(BY_NAME["F32"], QuantConfig().alpha, max(bins, 1))
    sketch.add(np.ascontiguousarray(values))
    args = dict(bins=bins, domain=domain, prune=prune, protect=protect, seed=7,
                zero_level=zero_level)
    got = fitting._fit_kernel(sketch, BY_NAME[dtype], sigma=0.2, **args)
    want = fitting._fit_reference(sketch, BY_NAME[dtype], sigma=0.2, **args)
    assert got.stage.levels.tobytes() == want.stage.levels.tobytes()
    assert got.boundaries.tobytes() == want.boundaries.tobytes()
    assert (got.protect_at, got.prune_below) == (want.protect_at, want.prune_below)


@pytest.mark.parametrize("name", ["F32", "BF16"])
def test_chunks_quantized_on_one_thread_keep_their_own_escapes(name):
    # the kernel's position and scratch arrays (and a bfloat16 chunk's float32 values) are
    # reused per thread: what a chunk returns must not change when the next one is quantized
    from inshrink.dtypes import BY_NAME
    dtype = BY_NAME[name]
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal(5000).astype(dtype.numpy) for _ in range(2))
    sketch = sketching.Sketch.for_dtype(dtype, QuantConfig().alpha, 16)
    sketch.add(a.astype(np.float32))
    encoder = fitting.fit(sketch, dtype, bins=16, domain="linear", protect=0.01)
    first, stats = encoder.quantize(a.view(np.uint8))
    assert stats == encoder.measure(a.astype(np.float32))
    kept = first.positions.copy(), first.codes.copy(), first.values.copy()
    second, _ = encoder.quantize(b.view(np.uint8))
    assert first.positions.size and second.positions.size
    for array, copy in zip((first.positions, first.codes, first.values), kept):
        np.testing.assert_array_equal(array, copy)
    again, _ = encoder.quantize(a.view(np.uint8))
    np.testing.assert_array_equal(again.positions, kept[0])
    np.testing.assert_array_equal(again.values, kept[2])


def test_the_levels_and_boundaries_of_few_centroids_made_on_a_list_are_numpys(monkeypatch):
    # _encoder makes a small tensor's levels and boundaries on a list: the same values as
    # numpy's passes, to the bit (NaN, inf, zeros, -0.0, equal neighbours, huge and tiny
    # values, every dtype, domain and zero-level setting)
    from types import SimpleNamespace

    from inshrink.dtypes import BY_NAME
    rng = np.random.default_rng(7)
    specials = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-310, -1e-310, 1e300, -1e300, 1e-45,
                -1e-45, 3e38, -3e38, 65504.0, 1e-8]
    cases = []
    for size in list(range(0, 9)) + [15, 16, 17, 63, 64]:
        for _ in range(25):
            c = rng.standard_normal(size) * 10.0 ** rng.integers(-40, 40)
            if size and rng.random() < 0.5:
                c[rng.integers(0, size, 1 + size // 4)] = rng.choice(specials, 1 + size // 4)
            if size > 1 and rng.random() < 0.3:
                c[1:] = np.where(rng.random(size - 1) < 0.3, c[:-1], c[1:])  # equal pairs
            cases.append(np.sort(c))
    for name in ("F32", "BF16", "F16", "F64"):
        dtype = BY_NAME[name]
        for centroids in cases:
            for domain in ("linear", "log", "signed_log"):
                for zeros in (0, 1):
                    sketch = SimpleNamespace(zeros=zeros)
                    made = []
                    for few in (64, -1):  # on a list, then numpy's passes
                        monkeypatch.setattr(fitting, "_FEW_LEVELS", few)
                        with np.errstate(all="ignore"):
                            e = fitting._encoder(sketch, dtype, centroids, 4, domain, 0.0,
                                                  1.0, False)
                        made.append((e.stage.levels.dtype, e.stage.levels.tobytes(),
                                     e.stage.bits, e.boundaries.dtype, e.boundaries.shape,
                                     e.boundaries.tobytes()))
                    assert made[0] == made[1], (name, domain, zeros, centroids)


def test_short_chunks_are_packed_by_the_kernel_once_a_process_has_packed_enough(monkeypatch):
    from inshrink.codecs import quant
    calls = []
    real = quant.kernels.pack_bits

    class Spy:
        ready = False  # as if not compiled

        def __call__(self, *args):
            calls.append(args[1])
            return real(*args)
    monkeypatch.setattr(quant.kernels, "pack_bits", Spy())
    monkeypatch.setattr(quant, "_PACKS_BEFORE_KERNEL", 3)
    monkeypatch.setattr(quant, "_packs_so_far", 0)
    codes = np.random.default_rng(0).integers(0, 16, 1001).astype(np.uint16)
    packed = [quant.pack_codes(codes, 4).tobytes() for _ in range(5)]
    assert calls == [4, 4]
    assert len(set(packed)) == 1
