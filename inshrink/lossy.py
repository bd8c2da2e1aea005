"""Lossy encoding of one tensor: the sketch pass, importance, the error-bound search.

The Writer calls :func:`prepare` once per lossy tensor, then encodes its chunks with
:meth:`LossyTensor.encode` (or :meth:`FactoredTensor.encode`) like any other chunk job.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from .codecs import factored, quant
from .container.index import TensorEntry
from .errors import InvalidArgumentError
from .policy import QuantConfig

Read = Callable[[int, int], Any]


@dataclass
class LossyTensor:
    """A fitted plan plus what is needed to encode and report on a tensor's chunks."""

    role: str
    config: QuantConfig
    plan: quant.QuantPlan
    sumsq: float
    force: np.ndarray | None = None
    stats: quant.ChunkStats = field(default_factory=quant.ChunkStats)
    base_codes: np.ndarray | None = None  # the previous checkpoint's codes: a code delta
    _standalone: quant.QuantPlan | None = None  # the plan without the delta

    def use_delta(self, base_codes: np.ndarray) -> None:
        """Store codes as deltas from ``base_codes`` (one per element of the tensor)."""
        self.base_codes = base_codes
        self._standalone = self.plan
        self.plan = self.plan.with_delta(base_codes)

    def drop_delta(self) -> None:
        """Back to standalone codes."""
        self.plan, self.base_codes = self._standalone, None

    def encode(self, raw: np.ndarray, start: int, stop: int, level: int | None):
        """Encode the chunk holding elements [start, stop): (planes, (stats, codes))."""
        force = None if self.force is None else self.force[start:stop]
        base = None if self.base_codes is None else self.base_codes[start:stop]
        planes, stats, codes = quant.encode_chunk(raw, self.plan, level, force, base)
        return planes, (stats, codes)

    def report(self) -> dict:
        return {"role": self.role, "domain": self.config.domain, "bins": self.config.bins,
                "levels": len(self.plan.levels), "bits": self.plan.bits,
                **self.stats.report(self.sumsq)}


@dataclass
class FactoredTensor:
    """A second moment stored as the outer product of row and column factors."""

    role: str
    config: QuantConfig
    plan: factored.FactoredPlan
    rows: np.ndarray  # the row factors, in the dtype
    sumsq: float
    stats: quant.ChunkStats = field(default_factory=quant.ChunkStats)

    def encode(self, raw: np.ndarray, start: int, stop: int, level: int | None):
        """Encode the chunk holding elements [start, stop) (whole rows): (planes, (stats,
        None)); the stats compare the decoded chunk with the original."""
        columns = self.plan.columns.size
        rows = self.rows[start // columns:stop // columns]
        x = raw.view(self.plan.dtype.numpy).astype(np.float64).reshape(-1, columns)
        decoded = (rows[:, None] * self.plan.columns[None, :]).astype(np.float64)
        error = np.abs(decoded - x)
        stats = quant.ChunkStats(count=x.size, sse=float(np.square(error).sum()),
                                 max_abs=float(error.max(initial=0.0)),
                                 zeroed=int(np.count_nonzero((decoded == 0) & (x != 0))),
                                 nonzero=int(np.count_nonzero(x)))
        return factored.encode_chunk(rows, level), (stats, None)

    def report(self) -> dict:
        return {"role": self.role, "domain": "factored", "rows": int(self.rows.size),
                "columns": int(self.plan.columns.size), **self.stats.report(self.sumsq)}


def prepare_factored(entry: TensorEntry, read: Read, role: str, config: QuantConfig,
                     max_chunk_elements: int) -> FactoredTensor | None:
    """Row and column factors of a non-negative, finite F32/F64 tensor of >= 2 dimensions,
    with ``entry.chunk_elements`` then rounded down to whole rows (at least one); None if the
    tensor does not qualify (the caller then quantizes it in the log domain)."""
    columns = entry.shape[-1] if entry.shape else 0
    if not factored.eligible(entry.dtype, entry.shape) or columns > max_chunk_elements:
        return None
    whole_rows = replace(entry, chunk_elements=max(1, entry.chunk_elements // columns) * columns)
    row_sums = np.empty(entry.numel // columns)
    column_sums = np.zeros(columns)
    sumsq = 0.0
    for start, stop, _, x in _chunks(whole_rows, read):
        block = x.astype(np.float64).reshape(-1, columns)
        if not np.isfinite(block).all() or (block < 0).any():
            return None
        row_sums[start // columns:stop // columns] = block.sum(axis=1)
        column_sums += block.sum(axis=0)
        sumsq += float(np.square(block).sum())
    fitted = factored.factors(row_sums, column_sums, entry.dtype)
    if fitted is None:
        return None
    entry.chunk_elements = whole_rows.chunk_elements
    rows, cols = fitted
    return FactoredTensor(role, config, factored.FactoredPlan(entry.dtype, cols), rows, sumsq)


def _chunks(entry: TensorEntry, read: Read):
    """(start, stop, values in the work dtype) for every chunk of a tensor."""
    itemsize, work = entry.dtype.itemsize, quant.work_dtype(entry.dtype)
    for c in range(entry.chunk_count):
        start, stop = entry.chunk_range(c)
        raw = np.frombuffer(read(start * itemsize, stop * itemsize), np.uint8)
        if raw.size != (stop - start) * itemsize:
            raise InvalidArgumentError(f"tensor {entry.name!r}: source returned too few bytes")
        yield start, stop, raw, raw.view(entry.dtype.numpy).astype(work)


def _force(importance: Any, config: QuantConfig, numel: int) -> np.ndarray | None:
    """Per-element overrides from sensitivity scores: 1 = protect, 2 = prune."""
    if importance is None:
        if config.prune_metric == "sensitivity" and config.prune > 0:
            raise InvalidArgumentError("prune_metric='sensitivity' needs importance scores")
        return None
    try:
        scores = np.abs(np.asarray(importance, dtype=np.float64)).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"importance must be an array of numbers: {exc}") from None
    if scores.size != numel:
        raise InvalidArgumentError(f"importance has {scores.size} elements, tensor {numel}")
    scores = np.nan_to_num(scores, nan=0.0, posinf=np.finfo(np.float64).max)
    force = np.zeros(numel, np.int8)
    n_protect = math.ceil(config.protect * numel)
    if n_protect:
        force[np.argpartition(scores, numel - n_protect)[numel - n_protect:]] = 1
    n_prune = int(config.prune * numel)
    if config.prune_metric == "sensitivity" and n_prune:
        lowest = np.argpartition(scores, n_prune - 1)[:n_prune]
        force[lowest[force[lowest] == 0]] = 2
    return force


def prepare(entry: TensorEntry, read: Read, role: str, config: QuantConfig,
            importance: Any = None) -> LossyTensor | None:
    """Sketch the tensor and fit its plan; ``None`` if no bin count meets the error bound
    (the caller then stores the tensor losslessly)."""
    force = _force(importance, config, entry.numel)
    sketch = quant.Sketch.for_dtype(entry.dtype, config.alpha, config.bins)
    for _, _, _, x in _chunks(entry, read):
        sketch.add(x)
    by_sensitivity = config.prune_metric == "sensitivity"
    fit_config = replace(config, prune=0.0) if by_sensitivity else config
    zero_level = by_sensitivity and config.prune > 0
    bound = config.max_rel_l2
    for bins in (quant.bin_candidates(config) if bound else [config.bins]):
        plan = quant.plan(sketch, fit_config, entry.dtype, bins, zero_level)
        tensor = LossyTensor(role, replace(config, bins=bins), plan, sketch.sumsq, force)
        if bound is None:
            return tensor
        if quant.estimate_rel_l2(sketch, plan) > 1.5 * bound:
            continue  # clearly too coarse; skip the exact pass
        if _measure(entry, read, tensor).rel_l2(sketch.sumsq) <= bound:
            return tensor
    return None


def _measure(entry: TensorEntry, read: Read, tensor: LossyTensor) -> quant.ChunkStats:
    """The exact error of a plan over the whole tensor."""
    total = quant.ChunkStats()
    for start, stop, _, x in _chunks(entry, read):
        force = None if tensor.force is None else tensor.force[start:stop]
        codes = quant.assign(tensor.plan, x, force)
        total.merge(quant.chunk_stats(tensor.plan, x, codes))
    return total
