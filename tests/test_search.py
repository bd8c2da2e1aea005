"""The configuration search: optimality on synthetic monotone feasibility, the evaluation cap,
the neighbourhood rule, real quality callbacks, Series integration and bad input."""
import itertools
import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import inshrink
from inshrink.errors import CorruptError, InvalidArgumentError
from inshrink.encode.policy import role_of
from inshrink.search import Choice, Search, SearchSpace
from inshrink.search.allocation import MAX_SHIFT_BITS, allocation
from inshrink.search.evaluate import Evaluator
from inshrink.search.roundtrip import Roundtrip

SPACE = SearchSpace()
POINTS = list(itertools.product(*(range(len(a)) for a in SPACE.axes())))
METRICS = ("magnitude", "sensitivity")
NO_PRUNE = len(SPACE.prune) - 1  # the prune axis runs from the largest fraction to 0
STATE = {"model.w": np.zeros((64, 64), np.float32),
         "model.embed.weight": np.zeros((128, 32), np.float32)}
IMPORTANCE = {"model.w": np.ones((64, 64), np.float32)}


class Synthetic:
    """A monotone feasibility oracle: a point is feasible iff it dominates a generator.
    The candidate encodings are replaced by a marker, so the callback sees the choice."""

    def __init__(self, generators):
        self.generators = generators  # metric -> list of points
        self.calls = 0

    def feasible(self, point, metric):
        def above(gens):
            return any(all(a >= b for a, b in zip(point, g)) for g in gens)
        if point[2] == NO_PRUNE:  # without pruning the metric changes nothing
            return any(above(gens) for gens in self.generators.values())
        return above(self.generators[metric])

    def quality(self, state):
        self.calls += 1
        if "cfg" not in state:
            return 1.0  # the uncompressed baseline
        choice = Choice.from_dict(json.loads(state["cfg"].tobytes()))
        return 1.0 if self.feasible(SPACE.point(choice), choice.prune_metric) else 2.0


# expected sizes that do not grow monotonically with precision (as real ones: pruning adds a
# code), so the search must not assume they do
SHAPE = tuple(len(a) for a in SPACE.axes())
TABLE = np.random.default_rng(7).permutation(np.arange(np.prod(SHAPE), dtype=float) * 10 + 1000)
TABLE = (TABLE.reshape(SHAPE) + 50 * np.indices(SHAPE).sum(axis=0))


def synthetic_rel_l2(point):
    """A relative error falling with precision on every axis, as a real encoding's."""
    bins, embedding_bins, keep, protect = point
    return 1.0 / (1 + 2 * bins + embedding_bins + keep + protect)


@pytest.fixture
def synthetic_encoding(monkeypatch):
    def roundtrip(self, choice):
        marker = np.frombuffer(json.dumps(choice.to_dict()).encode(), np.uint8)
        point = SPACE.point(choice)
        return {"cfg": marker}, int(self.size_table()[point]), synthetic_rel_l2(point)
    monkeypatch.setattr(Evaluator, "roundtrip", roundtrip)
    monkeypatch.setattr(Evaluator, "size_table", lambda self: TABLE)


@pytest.fixture
def monotone_sizes(monkeypatch, synthetic_encoding):
    """Sizes growing with precision on every axis (bins weigh most)."""
    sizes = np.tensordot(np.array([1000.0, 100.0, 10.0, 1.0]), np.indices(SHAPE), axes=1)
    monkeypatch.setattr(Evaluator, "size_table", lambda self: sizes + 1)


def expected_bits(point):
    return float(TABLE[point])


def optimum(oracle, metrics, above=(0, 0, 0, 0)):
    feasible = [expected_bits(p) for p in POINTS for m in metrics
                if oracle.feasible(p, m) and all(a >= b for a, b in zip(p, above))]
    return min(feasible) if feasible else None


# the patched encoding is stateless, so one fixture for every example is fine
SYNTHETIC = settings(max_examples=60, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])
points = st.tuples(*(st.integers(0, len(a) - 1) for a in SPACE.axes()))
generators = st.lists(points, min_size=0, max_size=4)


@SYNTHETIC
@given(generators, generators)
def test_guided_search_finds_the_optimum(synthetic_encoding, gen_mag, gen_sens):
    oracle = Synthetic({"magnitude": gen_mag, "sensitivity": gen_sens})
    result = Search(epsilon=0.05, max_evals=10_000).choose(STATE, oracle.quality, IMPORTANCE)
    best = optimum(oracle, METRICS)
    if best is None:
        assert result.choice is None
        assert result.policy.roles.get("weight") is None
        return
    chosen = SPACE.point(result.choice)
    assert oracle.feasible(chosen, result.choice.prune_metric)
    assert expected_bits(chosen) == best
    assert result.report["evaluations_used"] < 2 * len(POINTS)  # it did not enumerate


@SYNTHETIC
@given(generators, st.integers(1, 12))
def test_cap_is_respected_and_nothing_infeasible_is_returned(synthetic_encoding, gen, cap):
    oracle = Synthetic({"magnitude": gen, "sensitivity": gen})
    search = Search(epsilon=0.05, max_evals=cap)
    result = search.choose(STATE, oracle.quality, IMPORTANCE)
    assert len(result.report["evaluations"]) <= cap
    assert oracle.calls <= cap + 1  # + the baseline
    if result.choice is not None:
        assert oracle.feasible(SPACE.point(result.choice), result.choice.prune_metric)
        assert result.report["chosen_result"]["feasible"]


class Bounded(Synthetic):
    """Feasible iff the oracle says so and the synthetic relative error is within a bound."""

    def __init__(self, generators, bound):
        super().__init__(generators)
        self.bound = bound

    def feasible(self, point, metric):
        return synthetic_rel_l2(point) <= self.bound and super().feasible(point, metric)


@SYNTHETIC
@given(generators, generators, st.sampled_from([0.02, 0.05, 0.08, 0.2, 1.0]))
def test_relative_error_bound_is_met_by_the_optimum(synthetic_encoding, gen_mag, gen_sens,
                                                    bound):
    oracle = Bounded({"magnitude": gen_mag, "sensitivity": gen_sens}, bound)
    search = Search(epsilon=0.05, max_evals=10_000, max_rel_l2=bound)
    result = search.choose(STATE, oracle.quality, IMPORTANCE)
    best = optimum(oracle, METRICS)
    rejected = [e for e in result.report["evaluations"] if e["quality"] is None]
    assert all(e["rel_l2"] > bound and not e["feasible"] for e in rejected)
    assert oracle.calls == 1 + len(result.report["evaluations"]) - len(rejected)
    assert result.report["max_rel_l2"] == bound
    if best is None:
        assert result.choice is None
        return
    chosen = SPACE.point(result.choice)
    assert synthetic_rel_l2(chosen) <= bound
    assert oracle.feasible(chosen, result.choice.prune_metric)
    assert expected_bits(chosen) == best


def test_guided_search_uses_few_evaluations(synthetic_encoding):
    oracle = Synthetic({"magnitude": [(3, 1, 2, 1)], "sensitivity": []})
    result = Search(max_evals=10_000).choose(STATE, oracle.quality)
    chosen = SPACE.point(result.choice)
    assert oracle.feasible(chosen, "magnitude")
    assert expected_bits(chosen) == optimum(oracle, ("magnitude",))
    assert len(POINTS) == 1386
    assert result.report["evaluations_used"] <= 40  # of 1386 configurations


def test_guided_search_measures_the_cube_top_only_when_nothing_below_is_feasible(
        synthetic_encoding):
    top = SPACE.top()
    evaluated = []
    for generators, epsilon in (({"magnitude": [(3, 1, 2, 1)], "sensitivity": []}, 0.05),
                                ({"magnitude": [top], "sensitivity": []}, 0.05),
                                ({"magnitude": [(3, 1, 2, 1)], "sensitivity": []}, 0.0)):
        oracle = Synthetic(generators)
        result = Search(epsilon, max_evals=10_000).choose(STATE, oracle.quality)
        assert expected_bits(SPACE.point(result.choice)) == optimum(oracle, ("magnitude",))
        evaluated.append([SPACE.point(Choice.from_dict(e["choice"]))
                          for e in result.report["evaluations"]])
    assert top not in evaluated[0]  # implied by what was found below it
    assert top in evaluated[1]  # only the top is feasible: measured after all
    assert evaluated[2][0] == top  # epsilon 0: nothing may be feasible, the top goes first


def test_infeasible_neighbourhood_costs_one_corner_evaluation(synthetic_encoding):
    start = (1, 0, 1, 0)
    oracle = Synthetic({"magnitude": [(5, 2, 4, 1)], "sensitivity": []})  # far above it
    search = Search(epsilon=0.05, max_evals=10_000)
    search.previous = SPACE.choice(start, "magnitude")
    result = search.choose(STATE, oracle.quality)
    near = [e for e in result.report["evaluations"] if e["phase"] == "neighbourhood"]
    assert len(near) == 2  # the previous choice, then the neighbourhood's most precise corner
    assert result.report["mode"] == "fallback"
    assert expected_bits(SPACE.point(result.choice)) == optimum(oracle, ("magnitude",),
                                                                above=start)


@SYNTHETIC
@given(generators, points)
def test_neighbourhood_never_more_aggressive(synthetic_encoding, gen, start):
    oracle = Synthetic({"magnitude": gen, "sensitivity": gen})
    search = Search(epsilon=0.05, max_evals=10_000)
    previous = SPACE.choice(start, "magnitude")
    search.previous = previous
    result = search.choose(STATE, oracle.quality)
    assert result.report["mode"] in ("neighbourhood", "fallback")
    best = optimum(oracle, ("magnitude",), above=start)
    if best is None:
        assert result.choice is None
        assert search.previous == previous  # nothing feasible: next time, the same start
        return
    chosen = SPACE.point(result.choice)
    assert all(a >= b for a, b in zip(chosen, start))
    assert oracle.feasible(chosen, result.choice.prune_metric)
    if oracle.feasible(start, "magnitude"):  # nothing tried that is larger than the start
        assert result.report["mode"] == "neighbourhood"
        assert expected_bits(chosen) <= expected_bits(start)
        assert all(e["stored_bytes"] <= expected_bits(start)
                   for e in result.report["evaluations"])
    if result.report["mode"] == "fallback":
        assert expected_bits(chosen) == best


def test_neighbourhood_prefers_the_nearest_feasible_neighbour(monotone_sizes):
    start = (2, 0, 3, 0)
    oracle = Synthetic({"magnitude": [(3, 0, 3, 0)], "sensitivity": []})
    search = Search()
    search.previous = SPACE.choice(start, "magnitude")
    result = search.choose(STATE, oracle.quality)
    assert result.report["mode"] == "neighbourhood"
    assert SPACE.point(result.choice) == (3, 0, 3, 0)


def test_neighbourhood_switches_metric_when_significantly_better(monotone_sizes):
    start = (2, 0, 3, 0)
    oracle = Synthetic({"magnitude": [(5, 2, 5, 2)], "sensitivity": [start]})
    search = Search()
    search.previous = SPACE.choice(start, "magnitude")
    result = search.choose(STATE, oracle.quality, IMPORTANCE)
    assert result.choice == SPACE.choice(start, "sensitivity")
    assert "switched prune metric" in result.report["reason"]


def test_sensitivity_needs_importance(synthetic_encoding):
    oracle = Synthetic({"magnitude": [(6, 2, 5, 2)], "sensitivity": [(0, 0, 0, 0)]})
    result = Search().choose(STATE, oracle.quality)  # no importance: magnitude only
    assert result.choice.prune_metric == "magnitude"
    assert all(e["choice"]["prune_metric"] == "magnitude" for e in result.report["evaluations"])


# -- real encodings ---------------------------------------------------------------------------

def _model(seed=0):
    rng = np.random.default_rng(seed)
    state = {"model.layer.weight": rng.standard_normal((128, 96)).astype(np.float32),
             "model.tok_emb.weight": rng.standard_normal((64, 96)).astype(np.float32),
             "model.layer.bias": rng.standard_normal(128).astype(np.float32),
             "optimizer.state.0.exp_avg": rng.standard_normal((128, 96)).astype(np.float32),
             "optimizer.state.0.exp_avg_sq": rng.random((128, 96)).astype(np.float32),
             "optimizer.state.0.step": np.array(10.0, np.float32)}
    x = rng.integers(0, 64, 256)

    def loss(s):
        h = s["model.tok_emb.weight"][x] @ s["model.layer.weight"].T + s["model.layer.bias"]
        return float(np.log1p(np.mean(h.astype(np.float64) ** 2)))
    return state, loss


@pytest.mark.parametrize("epsilon", [0.001, 0.01, 0.05])
def test_real_search_choice_meets_epsilon_when_saved(tmp_path, epsilon):
    state, loss = _model()
    search = Search(epsilon)
    result = search.choose(state, loss)
    assert result.choice is not None
    path = tmp_path / "c.ink"
    inshrink.save(path, state, policy=result.policy)
    restored = inshrink.load(path)
    drop = (loss(restored) - loss(state)) / abs(loss(state))
    assert drop <= epsilon
    assert result.report["chosen_result"]["quality"] == pytest.approx(loss(restored))
    json.dumps(result.report)  # serialisable
    # the moments follow the space's fixed configurations, tiny tensors stay exact
    infos = {i.name: i for i in inshrink.open(path).infos()}
    assert not infos["optimizer.state.0.exp_avg_sq"].lossless
    assert infos["model.layer.bias"].lossless
    assert np.array_equal(restored["model.layer.bias"], state["model.layer.bias"])


def test_relative_error_bound_holds_in_the_saved_file(tmp_path):
    state, loss = _model()
    free = Search(0.05).choose(state, loss)
    calls = []

    def counted(s):
        calls.append(1)
        return loss(s)
    bounded = Search(0.05, max_rel_l2=0.03).choose(state, counted)
    assert bounded.choice is not None
    assert bounded.report["chosen_result"]["rel_l2"] <= 0.03
    assert free.report["chosen_result"]["rel_l2"] > 0.03  # the bound did bind
    assert (bounded.report["chosen_result"]["stored_bytes"]
            >= free.report["chosen_result"]["stored_bytes"])
    rejected = [e for e in bounded.report["evaluations"] if e["quality"] is None]
    assert rejected and len(calls) == 1 + len(bounded.report["evaluations"]) - len(rejected)
    infos = inshrink.save(tmp_path / "b.ink", state, policy=bounded.policy)
    searched = [i for i in infos if i.role in ("weight", "embedding")]
    assert searched and all(i.error["rel_l2_error"] <= 0.03 for i in searched)


def test_unreachable_relative_error_bound_keeps_the_weights_lossless():
    state, loss = _model()
    calls = []

    def counted(s):
        calls.append(1)
        return loss(s)
    result = Search(0.05, max_rel_l2=1e-9).choose(state, counted)
    assert result.choice is None and len(calls) == 1  # the baseline only
    assert result.policy.roles.get("weight") is None


def test_smaller_epsilon_is_never_more_compressive():
    state, loss = _model()
    sizes = [Search(eps).choose(state, loss).report["chosen_result"]["stored_bytes"]
             for eps in (0.001, 0.05)]
    assert sizes[0] >= sizes[1]


def test_accuracy_direction():
    state, loss = _model()
    accuracy = lambda s: 1.0 / (1.0 + loss(s))  # noqa: E731
    result = Search(0.01, higher_is_better=True).choose(state, accuracy)
    assert result.report["chosen_result"]["quality"] >= accuracy(state) * 0.99


def test_nan_quality_is_infeasible():
    state, _ = _model()
    calls = []

    def quality(s):
        calls.append(1)
        return 1.0 if len(calls) == 1 else math.nan
    result = Search().choose(state, quality)
    assert result.choice is None and result.report["mode"] == "guided"
    assert result.policy.roles.get("weight") is None


def test_a_bound_256_levels_miss_gets_finer_levels_not_lossless_weights():
    # the quality is the weights' relative error: 256 levels leave 0.006-0.007 on this
    # matrix, 1024 levels 0.0014-0.0017, so a bound of 0.003 needs the axis past 256
    w = np.random.default_rng(3).standard_normal((256, 256)).astype(np.float32)

    def quality(state):
        x = state["model.w"].astype(np.float64)
        return 1.0 + float(np.linalg.norm(x - w) / np.linalg.norm(w))

    result = Search(epsilon=0.003).choose({"model.w": w}, quality)
    assert result.choice is not None and result.choice.bins in (1024, 4096)
    assert 0 <= result.report["chosen_result"]["drop"] <= 0.003
    assert Search(epsilon=0.003, space=SearchSpace(bins=SPACE.bins[:-2])).choose(
        {"model.w": w}, quality).choice is None  # the axis as it was: lossless weights


def test_proxy_mode_without_callback(tmp_path):
    state, _ = _model()
    result = Search(space=SearchSpace(proxy_rel_l2=0.02)).choose(state, None)
    assert result.report["mode"] == "proxy" and result.choice is None
    infos = inshrink.save(tmp_path / "p.ink", state, policy=result.policy)
    weight = {i.name: i for i in infos}["model.layer.weight"]
    assert weight.error["rel_l2_error"] <= 0.02


def test_no_quantizable_tensor():
    result = Search().choose({"b": np.ones(3, np.float32)}, lambda s: 1.0)
    assert result.choice is None and result.report["mode"] == "none"


def test_a_search_stored_with_a_series_checkpoint_resumes(tmp_path):
    state, loss = _model()
    series = inshrink.Series(tmp_path)
    first = Search(0.05).choose(state, loss)
    series.save(1, state, policy=first.policy, metadata=first.metadata())
    assert first.report["mode"] == "guided"
    stored = json.loads(series.metadata(1)[inshrink.search.SEARCH_KEY])
    assert stored["chosen"] == first.choice.to_dict()
    # a new process: the search continues from the stored choice
    resumed, search = inshrink.Series(tmp_path), Search(0.05)
    search.resume(resumed.metadata(resumed.latest()))
    assert search.previous == first.choice
    state2 = {k: v * np.float32(1.001) for k, v in state.items()}
    second = search.choose(state2, loss)
    assert second.report["mode"] in ("neighbourhood", "fallback")
    chosen = SPACE.point(second.choice)
    assert all(a >= b for a, b in zip(chosen, SPACE.point(first.choice)))
    # a checkpoint saved without a search starts the next search afresh
    search.resume({})
    assert search.previous is None


def test_an_unreadable_search_report_is_corrupt_and_named(tmp_path):
    for raw in ("{not json", "[1, 2]", '{"chosen": {"bins": "x"}}', "[" * 100000):
        with pytest.raises(CorruptError, match="step 7"):
            Search().resume({inshrink.search.SEARCH_KEY: raw}, "step 7")


def test_space_point_maps_off_axis_values_upwards():
    assert SPACE.point(Choice(10, 20, 0.15, 0.001)) == (3, 1, 4, 1)  # 12 bins, 32, 0.1, 0.005
    assert SPACE.point(Choice(1000, 1000, 0.0, 0.5)) == (9, 5, 5, 2)  # 1024 levels
    assert SPACE.point(Choice(5000, 5000, 0.0, 0.5)) == SPACE.top()
    for p in POINTS[::17]:
        assert SPACE.point(SPACE.choice(p, "magnitude")) == p


def test_choice_round_trip_and_bad_dicts():
    c = Choice(8, 16, 0.1, 0.005, "sensitivity")
    assert Choice.from_dict(c.to_dict()) == c
    for bad in ({}, {"bins": "x"}, {**c.to_dict(), "bins": 0},
                {**c.to_dict(), "prune_metric": "other"}, {**c.to_dict(), "prune": 2.0}):
        with pytest.raises(InvalidArgumentError):
            Choice.from_dict(bad)


@pytest.mark.parametrize("kwargs", [
    {"bins": ()}, {"bins": (8, 4)}, {"bins": (1, 4)}, {"bins": (4.0,)},
    {"prune": (0.0, 0.99), "protect": (0.02,)}, {"protect": (-0.1,)},
    {"prune_metrics": ("gradient",)}, {"prune_metrics": ()}, {"exp_avg": 8},
    {"proxy_rel_l2": 0.0}, {"sigma": 1.5}])
def test_bad_search_space(kwargs):
    with pytest.raises(InvalidArgumentError):
        SearchSpace(**kwargs)


@pytest.mark.parametrize("kwargs", [{"max_rel_l2": 0}, {"max_rel_l2": -0.1},
                                    {"max_rel_l2": math.inf}, {"max_rel_l2": math.nan},
                                    {"max_rel_l2": "0.1"},
                                    {"epsilon": -0.1}, {"epsilon": math.inf},
                                    {"max_evals": 0}, {"space": "big"}])
def test_bad_search_arguments(kwargs):
    with pytest.raises(InvalidArgumentError):
        Search(**kwargs)


def test_bad_callbacks():
    state, _ = _model()
    with pytest.raises(InvalidArgumentError):
        Search().choose(state, lambda s: "good")
    with pytest.raises(InvalidArgumentError):
        Search().choose(state, lambda s: math.nan)  # the baseline must be finite
    with pytest.raises(InvalidArgumentError):
        Search().choose(state, "not callable")
    with pytest.raises(InvalidArgumentError):
        Search().choose([1, 2], lambda s: 1.0)


@pytest.mark.parametrize("importance", [[np.ones((128, 96))],
                                        {"model.layer.weight": np.ones(3)},
                                        {"model.layer.weight": "high"}])
def test_bad_importance(importance):
    state, loss = _model()
    with pytest.raises(InvalidArgumentError):
        Search(0.05, threads=1).choose(state, loss, importance)


def test_without_pruning_the_metric_check_costs_nothing(monotone_sizes):
    start = (2, 0, NO_PRUNE, 0)
    oracle = Synthetic({"magnitude": [start], "sensitivity": []})
    search = Search()
    search.previous = SPACE.choice(start, "sensitivity")
    result = search.choose(STATE, oracle.quality, IMPORTANCE)
    assert SPACE.point(result.choice) == start
    assert result.report["evaluations_used"] == 1 and oracle.calls == 2  # + the baseline


def test_expected_sizes_come_from_real_encodings():
    state, loss = _model()
    search = Search(0.05)
    result = search.choose(state, loss)
    shapes, table = search._size_table
    assert table.shape == SHAPE
    for e in result.report["evaluations"]:
        estimate = table[SPACE.point(Choice.from_dict(e["choice"]))] / 8
        assert 0.7 < e["stored_bytes"] / estimate < 1.3


# -- candidates in memory against the file path --------------------------------------------

def _file_roundtrip(self, choice, directory):
    """How candidates were evaluated before: saved to an .ink file and loaded back."""
    path = directory / "candidate.ink"
    infos = inshrink.save(path, self.searched, policy=choice.policy(self.space, self.shifts),
                          importance=self.importance, threads=1)
    errors = [(i.error or {}).get("rel_l2_error") for i in infos]
    worst = max((math.inf if e is None else e for e in errors), default=0.0)
    return inshrink.load(path), sum(i.stored_bytes for i in infos), worst


def _file_sample_bits(self, tensors, config, directory):
    if not tensors:
        return 0.0
    sample, scale = {}, {}
    for name, a in tensors.items():
        flat = a.reshape(-1)
        blocks = flat.size // 64
        rows = np.unique(np.linspace(0, blocks - 1, min(blocks, 64)).round().astype(np.int64))
        sample[name] = flat[:blocks * 64].reshape(blocks, 64)[rows]
        scale[name] = flat.size / sample[name].size
    infos = inshrink.save(directory / "sample.ink", sample,
                          policy=inshrink.Policy.uniform(config), threads=1)
    return sum(8 * i.stored_bytes * scale[i.name] for i in infos)


def _checkpoints(seed=0, count=3):
    """A drifting model state with importance scores, checkpoint after checkpoint."""
    import ml_dtypes
    state, loss = _model(seed)
    state["model.half.weight"] = (state["model.layer.weight"][:, :64] * 0.5).astype(
        ml_dtypes.bfloat16)
    rng = np.random.default_rng(seed + 1)
    importance = {"model.layer.weight": rng.random((128, 96)).astype(np.float32),
                  "model.half.weight": rng.random((128, 64)).astype(np.float32)}
    for k in range(count):
        yield ({n: (v + np.float32(0.02 * k) * v[::-1].reshape(v.shape)).astype(v.dtype)
                if n.startswith("model.") and v.ndim == 2 else v for n, v in state.items()},
               importance, loss)


def _run(epsilon, **kwargs):
    search = Search(epsilon, **{"threads": 1, **kwargs})
    reports = []
    for state, importance, loss in _checkpoints():
        def quality(s, loss=loss):
            return loss({k: np.asarray(v, np.float32) for k, v in s.items()})
        reports.append(search.choose(state, quality, importance).report)
    return reports


@pytest.mark.parametrize("epsilon,kwargs", [(0.01, {"max_evals": 12, "threads": 2}),
                                            (0.05, {"max_rel_l2": 0.05, "max_evals": 12})])
def test_search_chooses_as_with_candidate_files(tmp_path, monkeypatch, epsilon, kwargs):
    # the in-memory evaluation is a speed-up only: every decision, size, error and quality
    # is the one that saving each candidate to a file and loading it back gave
    fresh = _run(epsilon, **kwargs)
    monkeypatch.setattr(Evaluator, "roundtrip",
                        lambda self, choice: _file_roundtrip(self, choice, tmp_path))
    monkeypatch.setattr(Evaluator, "sample_bits",
                        lambda self, tensors, config: _file_sample_bits(self, tensors, config,
                                                                        tmp_path))
    with_files = _run(epsilon, **kwargs)
    assert [r["mode"] for r in fresh] == ["guided", "neighbourhood", "neighbourhood"] or \
        "fallback" in [r["mode"] for r in fresh]
    for new, old in zip(fresh, with_files):
        for key in ("mode", "reason", "chosen", "chosen_result", "evaluations", "baseline"):
            assert new[key] == old[key]


def test_size_table_is_reused_until_the_tensors_or_the_axes_change(monkeypatch):
    built = []
    size_table = Evaluator.size_table

    def counted(self):
        built.append(self.space.bins)
        return size_table(self)
    monkeypatch.setattr(Evaluator, "size_table", counted)
    state, loss = _model()
    search = Search(0.05, threads=1)
    search.choose(state, loss)
    search.choose({k: v * np.float32(0.99) for k, v in state.items()}, loss)
    assert built == [SPACE.bins]  # the next checkpoint orders its candidates with it
    search.space = SearchSpace(bins=(4, 8, 16))
    search.choose(state, loss)
    assert built == [SPACE.bins, (4, 8, 16)]


def test_candidates_in_memory_equal_the_saved_file(tmp_path):
    state, importance, _ = next(_checkpoints())
    searched = {n: v for n, v in state.items() if n.startswith("model.") and v.ndim == 2}
    shifts = {"model.layer.weight": ("weight", 1.0)}
    encode = Roundtrip(searched, importance, threads=2)
    for choice in (Choice(8, 32, 0.2, 0.005, "sensitivity"), Choice(4, 16, 0.5, 0.0005),
                   Choice(256, 256, 0.0, 0.01)):
        policy = choice.policy(SPACE, shifts)
        decoded, stored, worst = encode(policy)
        infos = inshrink.save(tmp_path / "c.ink", searched, policy=policy,
                              importance=importance)
        loaded = inshrink.load(tmp_path / "c.ink")
        assert set(decoded) == set(loaded)
        for name in loaded:
            assert decoded[name].dtype == loaded[name].dtype
            assert decoded[name].tobytes() == loaded[name].tobytes()
        assert stored == sum(i.stored_bytes for i in infos)
        assert worst == max(i.error["rel_l2_error"] for i in infos)
    again = encode.encodings
    encode(Choice(4, 64, 0.5, 0.0005).policy(SPACE, shifts))  # only the embedding changes
    assert encode.encodings == again + 1
    encode(Choice(4, 16, 0.5, 0.0005).policy(SPACE, shifts))
    encode(Choice(4, 64, 0.5, 0.0005).policy(SPACE, shifts))  # the one before: kept
    assert encode.encodings == again + 2


def test_large_tensors_keep_one_encoding(monkeypatch):
    monkeypatch.setattr("inshrink.search.roundtrip.KEEP_SECOND_BYTES", 1000)
    state, importance, _ = next(_checkpoints())
    encode = Roundtrip({"model.layer.weight": state["model.layer.weight"]}, importance, 1)
    for bins in (4, 8, 4):
        encode(Choice(bins, 16, 0.0, 0.0005).policy(SPACE))
    assert encode.encodings == 3


def test_search_on_bf16_weights_with_empty_and_scalar_tensors(tmp_path):
    import ml_dtypes
    state, loss = _model()
    state = {k: (v.astype(ml_dtypes.bfloat16) if k.startswith("model.") else v)
             for k, v in state.items()}
    state["model.empty"] = np.zeros((0, 5), np.float32)
    state["model.scalar"] = np.array(3.0, np.float32)
    seen = []

    def quality(s):
        seen.append(s["model.layer.weight"].dtype)
        return loss({k: np.asarray(v, np.float32) for k, v in s.items()})
    result = Search(0.05).choose(state, quality)
    assert result.choice is not None and set(seen) == {np.dtype(ml_dtypes.bfloat16)}
    inshrink.save(tmp_path / "b.ink", state, policy=result.policy)
    back = inshrink.load(tmp_path / "b.ink")
    assert back["model.layer.weight"].dtype == ml_dtypes.bfloat16
    assert back["model.empty"].shape == (0, 5) and back["model.scalar"] == 3.0


# -- per-tensor bins --------------------------------------------------------------------------

def _two_tensors(seed=0, weight_a=100.0):
    """Two equal weight tensors; the loss is ``weight_a`` times more sensitive to ``a``."""
    rng = np.random.default_rng(seed)
    state = {"model.a.weight": rng.standard_normal((128, 128)).astype(np.float32),
             "model.b.weight": rng.standard_normal((128, 128)).astype(np.float32)}
    exact = {k: v.astype(np.float64) for k, v in state.items()}

    def loss(s):
        err = {k: np.mean((s[k].astype(np.float64) - exact[k]) ** 2) for k in exact}
        return 1.0 + weight_a * err["model.a.weight"] + err["model.b.weight"]
    curvature = {"model.a.weight": np.full((128, 128), weight_a, np.float32),
                 "model.b.weight": np.ones((128, 128), np.float32)}
    return state, loss, curvature


def test_allocation_follows_curvature_and_clips():
    state, _, curvature = _two_tensors()
    roles = dict.fromkeys(state, "weight")
    shifts = allocation(state, roles, curvature)
    # equal sizes and spreads: +-1/4 log2(100) bits around the element-weighted mean
    assert shifts["model.a.weight"] == ("weight", pytest.approx(0.25 * math.log2(100), abs=0.02))
    assert shifts["model.b.weight"][1] == pytest.approx(-0.25 * math.log2(100), abs=0.02)
    huge = {**curvature, "model.a.weight": curvature["model.a.weight"] * 1e12}
    assert allocation(state, roles, huge)["model.a.weight"][1] == MAX_SHIFT_BITS
    zero = {**curvature, "model.b.weight": np.zeros((128, 128), np.float32)}
    assert allocation(state, roles, zero)["model.b.weight"][1] == -MAX_SHIFT_BITS
    nan = {**curvature, "model.b.weight": np.full((128, 128), np.nan, np.float32)}
    assert allocation(state, roles, nan) == {"model.a.weight": ("weight", 0.0)}
    assert allocation(state, roles, {}) == {}


@given(base=st.sampled_from(SPACE.bins), bits=st.floats(-MAX_SHIFT_BITS, MAX_SHIFT_BITS))
def test_shifted_bins_are_monotone_in_the_base(base, bits):
    choices = [Choice(b, 16, 0.0, 0.0005).policy(SPACE, {"model.w": ("weight", bits)})
               for b in SPACE.bins]
    bins = [p.config_for("model.w", "F32", (64, 64))[1].bins for p in choices]
    assert bins == sorted(bins) and set(bins) <= set(SPACE.bins)
    assert Choice(base, 16, 0.0, 0.0005).policy(SPACE, {"model.w": ("weight", 0.0)}) \
        .tensors == {}


PER_TENSOR = SearchSpace(per_tensor_bins=True)


def test_per_tensor_bins_beat_shared_bins_at_the_same_epsilon(tmp_path):
    state, loss, curvature = _two_tensors()
    shared = Search(0.01, space=PER_TENSOR).choose(state, loss)
    allocated = Search(0.01, space=PER_TENSOR).choose(state, loss, curvature=curvature)
    assert shared.report["allocation"] == {} and shared.report["shift_bits"] == {}
    bins = allocated.report["allocation"]
    assert bins["model.a.weight"] > bins["model.b.weight"]
    assert allocated.report["chosen_result"]["stored_bytes"] < \
        shared.report["chosen_result"]["stored_bytes"]
    path = tmp_path / "c.ink"
    inshrink.save(path, state, policy=allocated.policy)
    assert loss(inshrink.load(path)) - loss(state) <= 0.01 * loss(state)
    off = Search(0.01)  # the default: shared bins, curvature unused
    assert off.choose(state, loss, curvature=curvature).report["allocation"] == {}


@pytest.mark.parametrize("curvature", [
    [np.ones((128, 128))],
    {"model.a.weight": np.ones((128, 127), np.float32)},
    {"model.a.weight": np.ones((128, 128), np.int32)},
    {"model.a.weight": np.full((128, 128), "x", object)},
])
def test_bad_curvature(curvature):
    state, loss, _ = _two_tensors()
    with pytest.raises(InvalidArgumentError):
        Search(0.05, space=PER_TENSOR).choose(state, loss, curvature=curvature)


def test_curvature_of_other_tensors_is_ignored_and_bf16_is_accepted():
    import ml_dtypes
    state, loss, curvature = _two_tensors()
    curvature = {k: v.astype(ml_dtypes.bfloat16) for k, v in curvature.items()}
    curvature["optimizer.state.0.exp_avg"] = np.ones(3, np.float32)  # not searched
    result = Search(0.05, space=PER_TENSOR).choose(state, loss, curvature=curvature)
    assert set(result.report["shift_bits"]) == set(state)


@pytest.mark.parametrize("name", ["model.tok.weight", "model.pos.weight", "model.head.weight",
                                  "model.transformer.wte.weight", "model.lm_head.weight",
                                  "model.embed_tokens.weight", "model.decoder.pos.weight"])
def test_embedding_tables_and_output_heads_are_searched_as_embeddings(name):
    # hand-written GPTs name them tok / pos / head; as weights they got the weights' few
    # levels and never the embedding axis of the search
    assert role_of(name, "F32", (256, 128)) == "embedding"


@pytest.mark.parametrize("name", ["model.blocks.0.qkv.weight", "model.heads.weight",
                                  "model.pos_bias.weight", "model.classifier.weight",
                                  "model.head.proj.weight"])
def test_other_matrices_stay_weights(name):
    assert role_of(name, "F32", (256, 128)) == "weight"


def test_late_first_moment_configuration_is_validated():
    assert SearchSpace().late_exp_avg == inshrink.QuantConfig(bins=2)
    assert SearchSpace(late_exp_avg=None).late_exp_avg is None
    with pytest.raises(InvalidArgumentError):
        SearchSpace(late_exp_avg={"bins": 2})


def test_two_sided_search_rejects_a_lucky_improvement():
    rng = np.random.default_rng(0)
    state = {"model.w": rng.standard_normal((64, 128)).astype(np.float32)}
    original = state["model.w"].copy()

    def quality(s):  # every change "improves" the loss by 10% on these batches
        return 1.0 if np.array_equal(s["model.w"], original) else 0.9

    assert Search(0.05, max_evals=4).choose(state, quality).choice is not None
    result = Search(0.05, max_evals=4, two_sided=True).choose(state, quality)
    assert result.choice is None and result.report["two_sided"]


# --- the neighbourhood walk led by predicted drops ---------------------------------------

class Drops:
    """A quality oracle whose relative drop is ``scale * exp(w · point)``: falling with
    precision on every axis, growing from one checkpoint to the next by ``scale``."""

    def __init__(self, weights, scale=1.0):
        self.weights, self.scale, self.calls = np.asarray(weights, float), scale, 0

    def drop(self, point):
        return self.scale * math.exp(float(self.weights @ np.asarray(point, float)))

    def quality(self, state):
        self.calls += 1
        if "cfg" not in state:
            return 1.0
        choice = Choice.from_dict(json.loads(state["cfg"].tobytes()))
        return 1.0 + self.drop(SPACE.point(choice))


def run_walk(oracle, epsilons, growth, **kwargs):
    """One Search over checkpoints with falling epsilon and growing drops; per checkpoint the
    report, after checking that the choice was measured within epsilon on that checkpoint."""
    search, reports = Search(epsilon=epsilons[0], max_evals=10_000, predict=True, **kwargs), []
    for eps in epsilons:
        search.epsilon = eps
        result = search.choose(STATE, oracle.quality)
        report = result.report
        if result.choice is not None:
            chosen = [e for e in report["evaluations"]
                      if e["choice"] == result.choice.to_dict()]
            assert chosen and chosen[0]["feasible"] and chosen[0]["drop"] <= eps
            assert report["chosen_result"] is chosen[0]
        reports.append(report)
        oracle.scale *= growth
    return reports


def test_predicted_walk_costs_about_one_evaluation_per_checkpoint(monotone_sizes):
    oracle = Drops([-0.6, -0.4, -0.3, -0.5], scale=0.02)
    epsilons = list(np.geomspace(0.01, 0.001, 12))
    reports = run_walk(oracle, epsilons, growth=1.1)
    later = [r["evaluations_used"] for r in reports[1:]]
    assert all(r["mode"] == "neighbourhood" for r in reports[1:])
    assert sum(later) / len(later) <= 1.5
    # the default walk (the cheapest feasible neighbour) needs more on the same inputs
    search = Search(epsilon=epsilons[0], max_evals=10_000)
    oracle.scale, plain = 0.02, []
    for eps in epsilons:
        search.epsilon = eps
        plain.append(search.choose(STATE, oracle.quality).report["evaluations_used"])
        oracle.scale *= 1.1
    assert sum(plain[1:]) > sum(later)


def test_default_walk_skips_only_the_corner_probe_that_predictions_call_feasible(
        monotone_sizes):
    epsilons = list(np.geomspace(0.01, 0.001, 12))
    runs = {}
    for remember in (True, False):
        oracle = Drops([-0.6, -0.4, -0.3, -0.5], scale=0.02)
        search, runs[remember] = Search(epsilon=epsilons[0], max_evals=10_000), []
        for eps in epsilons:
            search.epsilon = eps
            result = search.choose(STATE, oracle.quality)
            runs[remember].append((result.choice, result.report["evaluations_used"]))
            if not remember:
                search._drops = None  # as after a resume: nothing measured to predict from
            oracle.scale *= 1.1
    assert [c for c, _ in runs[True]] == [c for c, _ in runs[False]]  # the same choices
    assert sum(n for _, n in runs[True][1:]) < sum(n for _, n in runs[False][1:])


def test_previous_choice_predicted_infeasible_is_not_evaluated_first(monotone_sizes):
    oracle = Drops([-0.6, -0.4, -0.3, -0.5], scale=0.02)
    search = Search(epsilon=0.01, max_evals=10_000, predict=True)
    search.choose(STATE, oracle.quality)
    start = SPACE.point(search.previous)
    search.epsilon = 0.5 * oracle.drop(start)  # far below the drop measured last time
    result = search.choose(STATE, oracle.quality)
    first = result.report["evaluations"][0]
    assert SPACE.point(Choice.from_dict(first["choice"])) != start
    assert result.report["evaluations_used"] == 1 and first["feasible"]
    assert "predicted" in result.report["reason"]


def test_predicted_walk_falls_back_when_nothing_near_is_feasible(monotone_sizes):
    oracle = Drops([-0.6, -0.4, -0.3, -0.5], scale=0.02)
    search = Search(epsilon=0.01, max_evals=10_000, predict=True)
    search.choose(STATE, oracle.quality)
    start = SPACE.point(search.previous)
    corner = tuple(min(s + 1, t) for s, t in zip(start, SPACE.top()))
    search.epsilon = 0.5 * oracle.drop(corner)
    result = search.choose(STATE, oracle.quality)
    near = [e for e in result.report["evaluations"] if e["phase"] == "neighbourhood"]
    assert len(near) == 1 and not near[0]["feasible"]  # the corner: every neighbour fails
    assert result.report["mode"] == "fallback"
    assert oracle.drop(SPACE.point(result.choice)) <= search.epsilon


@SYNTHETIC
@given(st.tuples(*(st.floats(-1.0, 0.0) for _ in range(4))), st.floats(0.002, 0.2),
       st.lists(st.floats(0.3, 1.2), min_size=2, max_size=6),
       st.lists(st.floats(0.5, 3.0), min_size=6, max_size=6), st.booleans(), st.booleans())
def test_walks_choose_only_measured_feasible_candidates(
        synthetic_encoding, weights, scale, eps_steps, growth, two_sided, predict):
    oracle = Drops(weights, scale)
    search = Search(epsilon=0.01, max_evals=10_000, two_sided=two_sided, predict=predict)
    previous = None
    for step, g in zip(eps_steps, growth):
        search.epsilon *= step
        result = search.choose(STATE, oracle.quality)
        if result.choice is not None:
            chosen = result.report["chosen_result"]
            assert chosen in result.report["evaluations"]
            assert chosen["feasible"] and abs(chosen["drop"]) <= search.epsilon
            if previous is not None:  # never more aggressive than the previous choice
                assert all(a >= b for a, b in zip(SPACE.point(result.choice),
                                                  SPACE.point(previous)))
            previous = result.choice
        else:
            assert all(oracle.drop(p) > search.epsilon for p in POINTS
                       if previous is None or all(a >= b for a, b in
                                                  zip(p, SPACE.point(previous))))
        oracle.scale *= g


def test_drop_model_learns_the_axes_and_the_drift():
    from inshrink.search.predict import DropModel
    weights, model = np.array([-0.6, -0.5, -0.45, -0.7]), DropModel(SPACE.axes())
    points = [(0, 0, 0, 0), (1, 0, 2, 1), (2, 1, 0, 0), (0, 3, 1, 2), (3, 2, 4, 1)]
    for scale in (0.01, 0.015, 0.0225):  # drops grow by half from one checkpoint to the next
        model.observe({(p, "magnitude"): {"quality": 1.0, "drop": scale * math.exp(
            weights @ p)} for p in points}, two_sided=False)
    np.testing.assert_allclose(model.weights, weights, rtol=0.02)
    target = (4, 4, 5, 2)  # never measured: from the nearest point, the axes and the drift
    predicted = model.predict(target, "magnitude", {})
    assert predicted == pytest.approx(0.0225 * 1.5 * math.exp(weights @ target), rel=0.05)
    today = {((3, 2, 4, 1), "magnitude"): 0.05}  # a measurement here replaces the drift
    assert model.predict(target, "magnitude", today) == pytest.approx(
        0.05 * math.exp(weights @ np.subtract(target, (3, 2, 4, 1))), rel=0.05)
    assert model.predict(target, "sensitivity", {}) is None  # nothing measured with it
    rejected = {"quality": None, "drop": None}  # the error bound's rejections teach nothing
    model.observe({((0, 0, 0, 0), "magnitude"): rejected}, two_sided=False)
    assert model.predict(target, "magnitude", {}) == pytest.approx(predicted)


# --- callbacks that stop an evaluation once it is proven infeasible ---------------------

class BoundedDrops(Drops):
    """:class:`Drops` with ``bounded``: above the limit it answers a lower bound between the
    limit and the quality (``lie``: a value below the limit, which proves nothing)."""

    def __init__(self, weights, scale=1.0, lie=False):
        super().__init__(weights, scale)
        self.lie, self.stopped, self.full = lie, 0, 0

    def bounded(self, state, limit):
        value = self.quality(state)
        if value > limit:
            self.stopped += 1
            return (limit - 1e-6 if self.lie else (limit + value) / 2), False
        return value, True

    def __call__(self, state):
        self.full += 1
        return self.quality(state)


@SYNTHETIC
@given(st.tuples(*(st.floats(-1.0, 0.0) for _ in range(4))), st.floats(0.002, 0.2),
       st.lists(st.floats(0.3, 1.2), min_size=2, max_size=6),
       st.lists(st.floats(0.5, 3.0), min_size=6, max_size=6), st.booleans())
def test_stopped_evaluations_leave_the_default_walks_choices_unchanged(
        synthetic_encoding, weights, scale, eps_steps, growth, two_sided):
    runs = {}
    for bounded in (False, True):
        oracle = BoundedDrops(weights, scale)
        search = Search(epsilon=0.01, max_evals=10_000, two_sided=two_sided)
        runs[bounded] = []
        for step, g in zip(eps_steps, growth):
            search.epsilon *= step
            result = search.choose(STATE, oracle if bounded else oracle.quality)
            report = result.report
            runs[bounded].append(result.choice)
            for e in report["evaluations"]:
                stopped = e.get("stopped", False)
                assert stopped in (False, True)
                assert not stopped or (not e["feasible"] and e["drop"] is e["quality"] is None)
                assert not stopped or bounded
            if result.choice is not None:
                assert "stopped" not in report["chosen_result"]
            oracle.scale *= g
        if bounded:  # every evaluation went through bounded(), the baselines did not
            assert oracle.full == len(runs[bounded])
    assert runs[True] == runs[False]


def test_a_stop_that_proves_nothing_is_measured_again(monotone_sizes):
    honest = BoundedDrops([-0.6, -0.4, -0.3, -0.5], scale=0.02)
    result = Search(epsilon=0.01, max_evals=10_000).choose(STATE, honest)
    stopped = [e for e in result.report["evaluations"] if e.get("stopped")]
    assert stopped and len(stopped) == honest.stopped and honest.full == 1  # the baseline
    oracle = BoundedDrops([-0.6, -0.4, -0.3, -0.5], scale=0.02, lie=True)
    result = Search(epsilon=0.01, max_evals=10_000).choose(STATE, oracle)
    infeasible = [e for e in result.report["evaluations"] if not e["feasible"]]
    assert infeasible and oracle.stopped == len(infeasible)
    assert oracle.full == 1 + len(infeasible)  # the baseline, and each stop measured again
    assert not any("stopped" in e for e in result.report["evaluations"])
    assert result.report["chosen_result"]["drop"] <= 0.01


def test_bounded_is_not_used_for_a_higher_is_better_quality_and_is_checked(monotone_sizes):
    class Accuracy:
        def __call__(self, state):
            return 1.0 if "cfg" not in state else 0.999

        def bounded(self, state, limit):
            raise AssertionError("an accuracy cannot stop early")
    result = Search(0.01, higher_is_better=True, max_evals=3).choose(STATE, Accuracy())
    assert result.choice is not None

    class Broken(Accuracy):
        def bounded(self, state, limit):
            return 2.0  # not a (value, complete) pair
    with pytest.raises(InvalidArgumentError, match="bounded"):
        Search(0.01, max_evals=3).choose(STATE, Broken())


def test_every_report_mode_is_documented():
    # the modes the search code writes into a report (mode="...", "mode": "...", and the
    # walks' returned mode), each a row of docs/search.md's table
    import pathlib
    import re
    root = pathlib.Path(__file__).resolve().parent.parent
    code = "".join(p.read_text() for p in sorted((root / "inshrink" / "search").glob("*.py")))
    modes = set(re.findall(r'mode="(\w+)"', code)) | set(re.findall(r'"mode": "(\w+)"', code))
    modes |= set(re.findall(r'return [^\n]*, "(\w+)"\n', code))
    assert {"guided", "neighbourhood", "fallback", "proxy", "none"} <= modes, modes
    doc = (root / "docs" / "search.md").read_text()
    rows = set(re.findall(r"^\| `(\w+)` \|", doc, re.M))
    assert modes <= rows, modes - rows
