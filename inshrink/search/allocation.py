"""Per-tensor bit allocation: how many bits each searched tensor gets above or below a
configuration's bins, from its curvature (``SearchSpace.per_tensor_bins``)."""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

MAX_SHIFT_BITS = 3.0
"""Per-tensor allocation moves a tensor at most this many bits away from the base bins."""

Shifts = Mapping[str, tuple[str, float]]
"""Per searched tensor: (its role, bits above the configuration's bins; negative = below)."""

ALLOCATION_SAMPLE = 1 << 20
"""Elements per tensor (evenly strided) from which allocation estimates a tensor's spread."""


def allocation(searched: Mapping[str, np.ndarray], roles: Mapping[str, str],
               curvature: Mapping[str, np.ndarray]) -> dict[str, tuple[str, float]]:
    """How many bits each tensor should get above or below a configuration's bins.

    Quantizing tensor t with levels about ``sigma_t / bins_t`` apart raises the loss by about
    ``1/2 * sum_i F_i * delta_i**2 ~ n_t * mean(F_t) * sigma_t**2 / bins_t**2``, with F the
    curvature (an average of squared gradients: a diagonal Fisher estimate). For a given
    number of bits the sum over tensors is smallest with ``bins_t`` proportional to
    ``sqrt(mean(F_t)) * sigma_t``: each tensor gets log2 of that against the element-weighted
    geometric mean of its role (weights and embeddings separately), within
    ``MAX_SHIFT_BITS``. Tensors without curvature, or whose estimate is not finite, get 0;
    a tensor with zero curvature (no gradient seen) gets the least.
    """
    groups: dict[str, list[tuple[str, int, float]]] = {}
    for name, array in searched.items():
        if name not in curvature or array.size == 0:
            continue
        flat = array.reshape(-1)
        sample = flat[::max(1, flat.size // ALLOCATION_SAMPLE)].astype(np.float64)
        with np.errstate(all="ignore"):
            score = float(np.mean(curvature[name], dtype=np.float64)) * float(np.var(sample))
        if math.isfinite(score) and score >= 0:
            groups.setdefault(roles[name], []).append((name, array.size, score))
    shifts = {}
    for role, members in groups.items():
        positive = [(size, score) for _, size, score in members if score > 0]
        if not positive:
            continue
        reference = sum(size * math.log2(score) for size, score in positive) / \
            sum(size for size, _ in positive)
        for name, _, score in members:
            bits = 0.5 * (math.log2(score) - reference) if score > 0 else -MAX_SHIFT_BITS
            shifts[name] = (role, max(-MAX_SHIFT_BITS, min(MAX_SHIFT_BITS, bits)))
    return shifts


def shifted(axis: tuple[int, ...], bins: int, bits: float) -> int:
    """The value of ``axis`` nearest (in log2) to ``bins * 2**bits``; ties go up."""
    target = math.log2(bins) + bits
    return min(reversed(axis), key=lambda v: abs(math.log2(v) - target))
