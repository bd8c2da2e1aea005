"""Lossy encoding of one tensor: the sketch pass, importance, the error-bound search.

The Writer calls :func:`prepare` once per lossy tensor, then encodes its chunks with
:meth:`LossyTensor.encode` (or :meth:`FactoredTensor.encode`) like any other chunk job.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from .codecs import factored, quantize
from .codecs.chain import Encoded, Pipeline
from .codecs.quantize import ChunkStats, QuantEncoder
from .container.index import TensorEntry
from .errors import InvalidArgumentError
from .policy import QuantConfig

Read = Callable[[int, int], Any]


@dataclass
class LossyTensor:
    """A quantized tensor being written: the fitted encoder, the pipeline its chunks go
    through (the writer may give it a code delta) and the error measured so far."""

    role: str
    config: QuantConfig
    encoder: QuantEncoder
    sumsq: float
    force: np.ndarray | None = None
    stats: ChunkStats = field(default_factory=ChunkStats)
    pipeline: Pipeline | None = None
    base_codes: np.ndarray | None = None  # the previous checkpoint's codes, for a code delta

    def __post_init__(self) -> None:
        if self.pipeline is None:
            self.pipeline = Pipeline(self.encoder.stage)

    def encode(self, raw: np.ndarray, start: int, stop: int,
               pipeline: Pipeline | None = None) -> tuple[Encoded, tuple]:
        """Encode the chunk holding elements [start, stop) with ``pipeline`` (default: the
        tensor's): (its streams, (its error stats, its codes))."""
        pipeline = self.pipeline if pipeline is None else pipeline
        force = None if self.force is None else self.force[start:stop]
        chunk, stats = self.encoder.quantize(raw, force)
        ref = self.base_codes[start:stop] if pipeline.is_delta else None
        return pipeline.encode(chunk, ref), (stats, chunk.codes)

    def report(self) -> dict:
        return {"role": self.role, "domain": self.config.domain, "bins": self.config.bins,
                "levels": len(self.encoder.stage.levels), "bits": self.pipeline.stage.bits,
                **self.stats.report(self.sumsq)}


@dataclass
class FactoredTensor:
    """A second moment stored as the outer product of row and column factors."""

    role: str
    config: QuantConfig
    stage: factored.Factored
    rows: np.ndarray  # the row factors, in the dtype
    sumsq: float
    stats: ChunkStats = field(default_factory=ChunkStats)
    pipeline: Pipeline | None = None

    def __post_init__(self) -> None:
        if self.pipeline is None:
            self.pipeline = Pipeline(self.stage)

    def encode(self, raw: np.ndarray, start: int, stop: int) -> tuple[Encoded, tuple]:
        """Encode the chunk holding elements [start, stop) (whole rows): (its stream,
        (stats, None)); the stats compare the decoded chunk with the original."""
        columns = self.stage.columns.size
        rows = self.rows[start // columns:stop // columns]
        x = raw.view(self.stage.dtype.numpy).astype(np.float64).reshape(-1, columns)
        decoded = (rows[:, None] * self.stage.columns[None, :]).astype(np.float64)
        error = np.abs(decoded - x)
        stats = ChunkStats(count=x.size, sse=float(np.square(error).sum()),
                           max_abs=float(error.max(initial=0.0)),
                           zeroed=int(np.count_nonzero((decoded == 0) & (x != 0))),
                           nonzero=int(np.count_nonzero(x)))
        return self.pipeline.encode(rows), (stats, None)

    def report(self) -> dict:
        return {"role": self.role, "domain": "factored", "rows": int(self.rows.size),
                "columns": int(self.stage.columns.size), **self.stats.report(self.sumsq)}


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
    return FactoredTensor(role, config, factored.Factored(entry.dtype, cols), rows, sumsq)


def _chunks(entry: TensorEntry, read: Read):
    """(start, stop, values in the work dtype) for every chunk of a tensor."""
    itemsize, work = entry.dtype.itemsize, quantize.work_dtype(entry.dtype)
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
    """Sketch the tensor and fit its quantizer; ``None`` if no bin count meets the error
    bound (the caller then stores the tensor losslessly)."""
    force = _force(importance, config, entry.numel)
    sketch = quantize.Sketch.for_dtype(entry.dtype, config.alpha, config.bins)
    for _, _, _, x in _chunks(entry, read):
        sketch.add(x)
    by_sensitivity = config.prune_metric == "sensitivity"
    bound = config.max_rel_l2
    for bins in (quantize.bin_candidates(config.bins) if bound else [config.bins]):
        encoder = quantize.fit(sketch, entry.dtype, bins=bins, domain=config.domain,
                               prune=0.0 if by_sensitivity else config.prune,
                               protect=config.protect, sigma=config.sigma, seed=config.seed,
                               zero_level=by_sensitivity and config.prune > 0)
        tensor = LossyTensor(role, replace(config, bins=bins), encoder, sketch.sumsq, force)
        if bound is None:
            return tensor
        if encoder.estimate_rel_l2(sketch) > 1.5 * bound:
            continue  # clearly too coarse; skip the exact pass
        if _measure(entry, read, tensor).rel_l2(sketch.sumsq) <= bound:
            return tensor
    return None


def _measure(entry: TensorEntry, read: Read, tensor: LossyTensor) -> ChunkStats:
    """The exact error of a fitted quantizer over the whole tensor."""
    total = ChunkStats()
    for start, stop, _, x in _chunks(entry, read):
        force = None if tensor.force is None else tensor.force[start:stop]
        codes = tensor.encoder.assign(x, force)
        total.merge(tensor.encoder.stats(x, codes))
    return total
