"""Predicted quality drops: what the drops measured on earlier checkpoints say about a
candidate on the next one, so the neighbourhood search can evaluate first the candidate most
likely to be chosen. A prediction only orders evaluations; a choice is always measured."""
from __future__ import annotations

import math

import numpy as np

from .space import Point

ROWS = 400
"""Pairs of candidates (their step and the ratio of their drops) kept for the axis fit."""
GROWTH = 3
"""Checkpoints whose drift of the drops (from one checkpoint to the next) is averaged."""
RIDGE = 0.1
"""Pull of the per-axis fit towards "a step changes nothing", for axes seldom stepped."""
STEP = -0.4
"""The least log-drop change credited to one step along an axis (a cut by a third)."""


def measured_drop(result: dict, two_sided: bool) -> float | None:
    """The drop that feasibility compares with epsilon, when it is positive and finite."""
    drop = result.get("drop")
    if drop is None or result.get("quality") is None or result.get("stopped"):
        return None  # rejected by the error bound, an infinite drop, or stopped
    value = abs(drop) if two_sided else drop
    return value if 0 < value < math.inf else None


class DropModel:
    """Log-linear model of a candidate's quality drop: ``log drop = c_t + w · point``, with a
    per-axis step ``w`` fitted over all pairs of candidates measured on the same checkpoint
    and the checkpoint's level ``c_t`` taken from the nearest measured candidate (this
    checkpoint's when there is one, else the previous checkpoint's, moved by the recent drift
    from one checkpoint to the next: the drops grow as training sharpens the model)."""

    def __init__(self, axes: tuple) -> None:
        self.axes = axes
        self.last: dict[tuple[Point, str], float] = {}
        self.rows: list[tuple[Point, float]] = []
        self.drift: list[float] = []
        self.weights: np.ndarray | None = None

    def predict(self, point: Point, metric: str, today: dict[tuple[Point, str], float],
                drift: bool = True) -> float | None:
        """The expected drop of ``point`` given this checkpoint's measured drops ``today``;
        None when nothing measured can tell. ``drift=False``: without the recent drift."""
        refs, shift = today, 0.0
        if not any(m == metric for _, m in refs):
            refs = self.last
            if drift and self.drift:
                shift = float(np.mean(self.drift[-GROWTH:]))
        near = [(sum(abs(a - b) for a, b in zip(point, p)), p, d)
                for (p, m), d in refs.items() if m == metric]
        if not near:
            return None
        _, ref, drop = min(near)
        if ref != point:
            if self.weights is None:
                return None
            shift += float(self.weights @ np.subtract(point, ref))
        return drop * math.exp(shift)

    def observe(self, results: dict[tuple[Point, str], dict], two_sided: bool) -> None:
        """Learn from one checkpoint's evaluations (all of them, whatever their phase)."""
        today = {key: d for key, r in results.items()
                 if (d := measured_drop(r, two_sided)) is not None}
        if today and self.last:
            residuals = [math.log(d / predicted) for (p, m), d in today.items()
                         if (predicted := self.predict(p, m, {}, drift=False)) is not None]
            if residuals:
                self.drift.append(float(np.mean(residuals)))
        items = list(today.items())
        for i, ((p, m), d) in enumerate(items):
            for (q, n), e in items[i + 1:]:
                if m == n and p != q:
                    self.rows.append((tuple(np.subtract(q, p)), math.log(e / d)))
        self.rows = self.rows[-ROWS:]
        if self.rows:
            steps = np.array([s for s, _ in self.rows], dtype=float)
            logs = np.array([y for _, y in self.rows])
            gram = steps.T @ steps + RIDGE * np.eye(steps.shape[1])
            # more precision never costs quality, and a step is credited with a cut by a third
            # at least: an axis the fit cannot tell from the others (the guided search moves
            # them together) is then tried rather than written off, which once locked a run
            # into ever more bins
            self.weights = np.minimum(np.linalg.solve(gram, steps.T @ logs), STEP)
        if today:
            self.last = today
