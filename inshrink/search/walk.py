"""The walks over the configuration cube: the guided search (diagonal binary search, then
best-first branch and bound over the sub-cubes) and the neighbourhood search around the
previous choice."""
from __future__ import annotations

import heapq
import itertools
import math

from .evaluate import Evaluator
from .predict import DropModel, measured_drop
from .space import Choice, Point

NEIGHBOURHOOD = 1
"""Radius of the neighbourhood search, in steps along each axis."""
SIGNIFICANT = 0.25
"""The other prune metric is adopted when it lowers the quality drop by this share of ε."""
MARGIN = 0.2
"""A neighbour whose predicted drop exceeds ε by more than this share is evaluated only after
the others (on the fault benchmark's lm, 0.1 chose 2.6% larger files, 0.4 cost 1.7
evaluations per checkpoint instead of 1.4)."""


def _diagonal(lo: Point, hi: Point) -> list[Point]:
    steps = max(h - l for l, h in zip(lo, hi))
    if steps == 0:
        return [lo]
    return [tuple(l + round(t * (h - l) / steps) for l, h in zip(lo, hi))
            for t in range(steps + 1)]


def _first_feasible(ev: Evaluator, points: list[Point], metric: str, phase: str,
                    probe_top: bool = True) -> Point | None:
    """Binary search for the least precise feasible point of a monotone chain of points.
    With ``probe_top`` False the last point is taken as feasible and measured only when
    nothing before it is feasible (for the whole cube's diagonal, whose last point is
    the cube's most precise one: feasible unless nothing is)."""
    def feasible(p: Point) -> bool | None:
        known = ev.known(p, metric)
        if known is not None:
            return known
        result = ev.evaluate(p, metric, phase)
        return None if result is None else result["feasible"]

    if probe_top and not feasible(points[-1]):
        return None
    lo, hi = 0, len(points) - 1  # points[hi] is feasible (or not measured yet)
    while lo < hi:
        mid = (lo + hi) // 2
        ok = feasible(points[mid])
        if ok is None:
            break  # cap reached: keep the feasible point we have
        if ok:
            hi = mid
        else:
            lo = mid + 1
    if not probe_top and hi == len(points) - 1 and not feasible(points[-1]):
        return None
    return points[hi]


def _best(ev: Evaluator, metrics: list[str]) -> Choice | None:
    """The smallest feasible evaluated configuration of the given metrics."""
    feasible = [(r["stored_bytes"], i, p, m) for i, ((p, m), r) in
                enumerate(ev.results.items()) if r["feasible"] and m in metrics]
    if not feasible:
        return None
    _, _, point, metric = min(feasible)
    return ev.space.choice(point, metric)


def guided(ev: Evaluator, lo: Point, hi: Point, metrics: list[str],
           phase: str) -> tuple[Choice | None, str]:
    """Guided search of the cube [lo, hi] once per prune metric."""
    for k, metric in enumerate(metrics):
        ev.budget = ev.settings.max_evals
        ev.budget = len(ev.log) + ev.left // (len(metrics) - k)  # share the cap
        _guided_one(ev, lo, hi, metric, phase)
    ev.budget = ev.settings.max_evals
    best = _best(ev, metrics)
    if best is None:
        return None, "no feasible configuration: weights stored losslessly"
    return best, "smallest feasible configuration found by the guided search"


def _guided_one(ev: Evaluator, lo: Point, hi: Point, metric: str, phase: str) -> None:
    """Diagonal binary search, then best-first branch and bound over the sub-cubes it
    leaves: a cube is searched only if its smallest expected size can beat the best
    feasible point found, and not at all when its most precise corner is infeasible."""
    best_bits = math.inf
    tie = itertools.count()
    cubes = [(ev.region_min(lo, hi)[0], next(tie), lo, hi)]
    while cubes and ev.left > 0:
        bound, _, c_lo, c_hi = heapq.heappop(cubes)
        if bound >= best_bits or ev.known(c_hi, metric) is False:
            continue
        if ev.known(c_lo, metric):  # all of it is feasible: try its smallest point
            result = ev.evaluate(ev.region_min(c_lo, c_hi)[1], metric, phase)
            if result is not None and result["feasible"]:
                best_bits = min(best_bits, bound)
            continue
        # the whole cube's most precise point is feasible unless nothing is: not probed
        # first when epsilon leaves room
        whole = (c_lo, c_hi) == (lo, hi) and c_hi == ev.space.top() and ev.settings.epsilon > 0
        found = _first_feasible(ev, _diagonal(c_lo, c_hi), metric, phase, probe_top=not whole)
        if found is None:
            continue
        # implied feasible is not enough: a choice is one whose encoding was measured
        result = ev.evaluate(found, metric, phase)
        if result is not None and result["feasible"]:
            best_bits = min(best_bits, ev.expected_bits(found))
        # per axis: below the point found, or at/above it (2^4 regions, none empty);
        # sizes need not grow with precision, so the region above it is searched too
        for axes in itertools.product((False, True), repeat=len(found)):
            if any(below and f == l for below, f, l in zip(axes, found, c_lo)):
                continue
            sub_lo = tuple(l if below else f for below, f, l in zip(axes, found, c_lo))
            sub_hi = tuple(f - 1 if below else h
                           for below, f, h in zip(axes, found, c_hi))
            if sub_lo != sub_hi or sub_lo != found:
                heapq.heappush(cubes, (ev.region_min(sub_lo, sub_hi)[0], next(tie),
                                       sub_lo, sub_hi))


def neighbourhood(ev: Evaluator, previous: Choice, metrics: list[str],
                  model: DropModel | None = None,
                  predict: bool = False) -> tuple[Choice | None, str, str]:
    """Around the previous choice, never more aggressive; the guided search above it
    when nothing there is feasible.

    By default the previous choice, then (if it fails) the neighbourhood's most precise
    corner unless ``model`` predicts it feasible, then the neighbours smallest first: the
    cheapest feasible neighbour. With ``predict`` (``Search(predict=True)``) and a ``model``
    that predicts the drops from earlier checkpoints, the candidates (the previous choice and
    its neighbours) predicted within ``(1 + MARGIN) * epsilon`` are evaluated first, smallest
    expected size first, and the first one measured feasible wins; the others only when
    none of those is left (the previous choice too, which a falling epsilon often rules
    out). Either way, a choice is a candidate measured feasible here."""
    space = ev.space
    start = space.point(previous)
    metric = previous.prune_metric if previous.prune_metric in metrics else metrics[0]
    eps = ev.settings.epsilon
    guess = None if model is None else model.predict(start, metric, {})
    predicted = guess is not None and predict
    why = []
    if not predicted or guess <= eps * (1 + MARGIN):
        # the metric check compares drops: measured to the end when there is one to make
        exact = len(metrics) > 1 and space.choice(start, metric).prune > 0
        current = ev.evaluate(start, metric, "neighbourhood", exact)
        for other in (m for m in metrics if m != metric):
            alt = ev.evaluate(start, other, "metric check", exact)
            if current is not None and alt is not None and alt["drop"] is not None and (
                    current["drop"] is None or
                    alt["drop"] < current["drop"] - SIGNIFICANT * eps):
                metric, current = other, alt
                why.append(f"switched prune metric to {other}")
    top = space.top()
    ranges = [range(s, min(s + NEIGHBOURHOOD, t) + 1) for s, t in zip(start, top)]
    corner = tuple(r[-1] for r in ranges)
    candidates = sorted(itertools.product(*ranges), key=ev.expected_bits)
    if predicted:
        found = _predicted_walk(ev, model, candidates, start, corner, metric)
        why.append("first neighbour measured feasible, in order of predicted feasibility "
                   "and expected size")
    else:
        found = _ordered_walk(ev, model, candidates, start, corner, metric)
        why.append("least precise feasible neighbour of the previous choice")
    if found is not None:
        return space.choice(found, metric), "; ".join(why), "neighbourhood"
    choice, reason = guided(ev, start, top, metrics, "fallback")
    return choice, "; ".join(why[:-1] + ["no feasible neighbour: " + reason]), "fallback"


def _ordered_walk(ev: Evaluator, model: DropModel | None, candidates: list[Point],
                  start: Point, corner: Point, metric: str) -> Point | None:
    """The first feasible neighbour in order of expected size (the cheapest feasible)."""
    current = ev.results.get((start, metric))
    if current is not None and not current["feasible"] and corner != start:
        today = {key: d for key, r in ev.results.items()
                 if (d := measured_drop(r, ev.settings.two_sided)) is not None}
        guess = None if model is None else model.predict(corner, metric, today)
        if guess is None or guess > ev.settings.epsilon:
            # the neighbourhood's most precise point first: if it fails, so does every
            # other neighbour (monotonicity), and one evaluation sends us to the fallback;
            # not when the drops measured so far predict it feasible (it decides nothing)
            ev.evaluate(corner, metric, "neighbourhood")
    for point in candidates:
        if ev.known(point, metric) is False:
            continue
        result = ev.evaluate(point, metric, "neighbourhood")
        if result is None:
            return None
        if result["feasible"]:
            return point
    return None


def _predicted_walk(ev: Evaluator, model: DropModel, candidates: list[Point], start: Point,
                    corner: Point, metric: str) -> Point | None:
    """The neighbours predicted feasible first, smallest expected size first, predictions
    renewed after each evaluation; the first measured feasible wins. When none is predicted
    feasible, the corner first: if it fails, every neighbour does."""
    eps = ev.settings.epsilon * (1 + MARGIN)
    probe = None
    if (start, metric) in ev.results and ev.results[(start, metric)]["feasible"]:
        return start
    while True:
        pending = [p for p in candidates
                   if (p, metric) not in ev.results and ev.known(p, metric) is not False]
        if not pending:
            break
        today = {key: d for key, r in ev.results.items()
                 if (d := measured_drop(r, ev.settings.two_sided)) is not None}
        likely = [p for p in pending
                  if (d := model.predict(p, metric, today)) is not None and d <= eps]
        if likely:
            point = likely[0]
        elif probe is None and corner in pending and corner != start:
            point = probe = corner
        else:
            point = pending[0]
        result = ev.evaluate(point, metric, "neighbourhood")
        if result is None:
            break  # cap reached
        if result["feasible"] and point != probe:
            return point
    if probe is not None and ev.results.get((probe, metric), {}).get("feasible"):
        return probe
    return None

