"""How each tensor is stored: the encoder's decisions, and the objects that encode its chunks.

The Writer calls :func:`for_tensor` once per tensor. It decides, from the policy's config for
the tensor and the tensor's values: factored (the config says so and the tensor qualifies),
quantized (the sketch pass, importance, the fit, the error-bound search), or lossless (the
dtype's byte grouping, or one plane for a tiny tensor when that file is smaller). It returns
a :class:`LosslessTensor`, :class:`LossyTensor` or :class:`FactoredTensor`, whose ``pipeline``
is the tensor's codec chain and whose ``encode(raw, start, stop)`` the Writer runs on its
threads for every chunk; ``report()`` is what the index records about the tensor.

Deltas against a base file are decided later, when a whole file is rewritten
(:mod:`inshrink.rebase`).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from .. import dtypes
from ..codecs import factored
from ..codecs.chain import Encoded, Pipeline, for_new_tensor
from ..codecs.entropy import Entropy
from ..codecs.lossless import ByteGroup
from ..container import layout
from ..container.index import TensorEntry
from ..errors import InvalidArgumentError
from .fit import fewest_bins, fit
from .policy import QuantConfig
from .quantizer import ChunkStats, QuantEncoder
from .sketch import Sketch, work_dtype

Read = Callable[[int, int], Any]


@dataclass
class LosslessTensor:
    """A tensor stored losslessly; ``role`` set when the index reports on it."""

    pipeline: Pipeline
    role: str | None = None
    # a tiny tensor's one chunk as encoded while its pipeline was chosen: (its bytes, streams)
    first: tuple[bytes, Encoded] | None = None

    def encode(self, raw: np.ndarray, start: int, stop: int) -> tuple[Encoded, None]:
        """Encode the chunk holding elements [start, stop): (its streams, None)."""
        first, self.first = self.first, None  # held until the chunk is encoded, no longer
        if first is not None and start == 0 and first[0] == raw.tobytes():
            return first[1], None  # not encoded a third time (a fifth of a tiny tensor's save)
        return self.pipeline.encode(raw), None

    def report(self) -> dict | None:
        if self.role is None:
            return None
        return {"role": self.role, "rel_l2_error": 0.0, "max_abs_error": 0.0}


@dataclass
class LossyTensor:
    """A quantized tensor being written: the fitted encoder, the pipeline its chunks go
    through and the error measured so far."""

    role: str
    config: QuantConfig
    encoder: QuantEncoder
    sumsq: float
    force: np.ndarray | None = None
    stats: ChunkStats = field(default_factory=ChunkStats)
    pipeline: Pipeline | None = None

    def __post_init__(self) -> None:
        if self.pipeline is None:
            self.pipeline = Pipeline(self.encoder.stage)

    def encode(self, raw: np.ndarray, start: int, stop: int) -> tuple[Encoded, tuple]:
        """Encode the chunk holding elements [start, stop): (its streams, (its error stats,
        its codes))."""
        force = None if self.force is None else self.force[start:stop]
        chunk, stats = self.encoder.quantize(raw, force)
        return self.pipeline.encode(chunk), (stats, chunk.codes)

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


TensorEncoder = LosslessTensor | LossyTensor | FactoredTensor


def for_tensor(entry: TensorEntry, read: Read, role: str | None, config: QuantConfig | None,
               importance: Any = None, *, entropy: Entropy, report: bool, tiny_bytes: int,
               force: np.ndarray | None = None,
               sketch_pass: Callable | None = None) -> TensorEncoder:
    """Decide how one tensor is stored (see the module docstring) and return its encoder.

    ``config``: the policy's quantization config for the tensor, ``None`` for lossless;
    ``importance``: sensitivity scores, or ``force``: the overrides :func:`overrides` made of
    them already (a caller checks them first so that bad scores fail where they are given);
    ``entropy``: the entropy stage of every stream; ``report``: record the role of a lossless
    tensor in the index; ``tiny_bytes``: the size up to which one plane is tried;
    ``sketch_pass``: see :func:`prepare`. May set
    ``entry.chunk_elements`` (a factored tensor's chunks hold whole rows).
    """
    tensor = None
    if config is not None and config.domain == "factored" and entry.numel:
        tensor = prepare_factored(entry, read, role, config,
                                  layout.MAX_CHUNK_BYTES // entry.dtype.itemsize)
        config = replace(config, domain="log")  # for a tensor that does not qualify
    if tensor is None and config is not None and entry.numel:
        tensor = prepare(entry, read, role, config, importance, force, entropy=entropy,
                         sketch_pass=sketch_pass)
    if tensor is not None:
        if tensor.pipeline.entropy is not entropy:  # a factored tensor's
            tensor.pipeline = replace(tensor.pipeline, entropy=entropy)
        return tensor
    pipeline, first = _lossless_choice(entry, read, entropy, tiny_bytes)
    return LosslessTensor(pipeline, role if report else None, first)


def _record_bytes(payload: int) -> int:
    """File bytes a record with this payload takes: header, payload, padding."""
    size = layout.RECORD_HEADER_SIZE + payload
    return size + layout.padding(size)


def lossless_pipeline(entry: TensorEntry, read: Read, entropy: Entropy,
                      tiny_bytes: int) -> Pipeline:
    """The dtype's byte grouping, or one plane for a tiny tensor when that file is smaller:
    every plane is a record with a 32-byte header and padding to 64 bytes, which outweighs
    what grouping saves on a few hundred bytes (norm weights, biases, their moments)."""
    return _lossless_choice(entry, read, entropy, tiny_bytes)[0]


@functools.lru_cache(maxsize=16)
def _one_plane(entropy: Entropy) -> Pipeline:
    """A tiny tensor's one-plane pipeline: one object per entropy stage, shared as
    :func:`for_new_tensor`'s are (a save keeps each tensor's pipeline until close)."""
    return Pipeline(ByteGroup(1, False), entropy=entropy)


def _lossless_choice(entry: TensorEntry, read: Read, entropy: Entropy,
                     tiny_bytes: int) -> tuple[Pipeline, tuple[bytes, Encoded] | None]:
    """:func:`lossless_pipeline`'s choice, with the tiny tensor's chunk as encoded by the
    chosen pipeline (None when nothing was tried)."""
    pipeline = for_new_tensor(entry.dtype, entropy)
    nbytes = entry.numel * entry.dtype.itemsize
    if pipeline.stage.word == 1 or entry.chunk_count != 1 or nbytes > tiny_bytes:
        return pipeline, None
    raw = np.frombuffer(read(0, nbytes), np.uint8)
    if raw.size != nbytes:  # a short source: the Writer reports it with a typed error
        return pipeline, None
    one = _one_plane(entropy)
    single = one.encode(raw)
    cost = _file_bytes(single)
    # the planes take a record each, at least _record_bytes(0): a plane that cannot cost
    # less than that wins without the planes encoded (norm weights, step counters)
    if cost < pipeline.streams * _record_bytes(0):
        return one, (raw.tobytes(), single)
    grouped = pipeline.encode(raw)
    if cost < _file_bytes(grouped):
        return one, (raw.tobytes(), single)
    return pipeline, (raw.tobytes(), grouped)


def _file_bytes(streams: Encoded) -> int:
    """File bytes the records of one chunk's streams take."""
    return sum(_record_bytes(len(memoryview(payload))) for _, payload, _ in streams)


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
    itemsize, work = entry.dtype.itemsize, work_dtype(entry.dtype)
    for c in range(entry.chunk_count):
        start, stop = entry.chunk_range(c)
        raw = np.frombuffer(read(start * itemsize, stop * itemsize), np.uint8)
        if raw.size != (stop - start) * itemsize:
            raise InvalidArgumentError(f"tensor {entry.name!r}: source returned too few bytes")
        yield start, stop, raw, raw.view(entry.dtype.numpy).astype(work, copy=False)


def overrides(importance: Any, config: QuantConfig, numel: int) -> np.ndarray | None:
    """Per-element overrides from sensitivity scores: 1 = protect, 2 = prune (None: none).

    Raises
    ------
    InvalidArgumentError
        Scores that are not numbers, of the wrong size, or missing where the config prunes by
        sensitivity.
    """
    if importance is None:
        if config.prune_metric == "sensitivity" and config.prune > 0:
            raise InvalidArgumentError("prune_metric='sensitivity' needs importance scores")
        return None
    try:
        # as a tensor is stored (torch tensors needing grad, bf16, conjugate views included);
        # a numeric numpy array as it is: scores need not be of a dtype inshrink stores
        numeric = isinstance(importance, np.ndarray) and importance.dtype.kind in "biuf"
        scores = np.abs(np.asarray(importance if numeric else dtypes.as_numpy(importance),
                                   dtype=np.float64)).reshape(-1)
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
            importance: Any = None, force: np.ndarray | None = None, *,
            entropy: Entropy | None = None,
            sketch_pass: Callable | None = None) -> LossyTensor | None:
    """Sketch the tensor and fit its quantizer; ``None`` if no bin count meets the error
    bound (the caller then stores the tensor losslessly). ``force``: the overrides of
    ``importance`` when the caller made them already (:func:`overrides`); ``entropy``: the
    entropy stage of its streams (default: the default one); ``sketch_pass(entry, read,
    sketch)``: adds every chunk to the empty sketch, with the same result as adding them in
    order (default: adds them in order here)."""
    if force is None:
        force = overrides(importance, config, entry.numel)
    sketch = Sketch.for_dtype(entry.dtype, config.alpha, config.bins)
    if sketch_pass is not None:  # the Writer's, which spreads the chunks over its threads
        sketch_pass(entry, read, sketch)
    else:
        for _, _, _, x in _chunks(entry, read):
            sketch.add(x)
    try:
        return _fit(entry, read, role, config, sketch, force, entropy)
    finally:  # complete: its counts serve the next tensor's sketch on this thread
        sketch.release()


def _fit(entry: TensorEntry, read: Read, role: str, config: QuantConfig,
         sketch: Sketch, force: np.ndarray | None,
         entropy: Entropy | None) -> LossyTensor | None:
    """:func:`prepare`'s fit of a tensor's quantizer from its sketch."""
    by_sensitivity = config.prune_metric == "sensitivity"

    def fit_bins(bins: int) -> QuantEncoder:
        return fit(sketch, entry.dtype, bins=bins, domain=config.domain,
                   prune=0.0 if by_sensitivity else config.prune, protect=config.protect,
                   sigma=config.sigma, seed=config.seed,
                   zero_level=by_sensitivity and config.prune > 0)

    found = fewest_bins(sketch, config.bins, config.max_rel_l2, fit_bins,
                        lambda encoder: _measure(entry, read, encoder, force))
    if found is None:
        return None
    bins, encoder = found
    # (a small tensor's whole fit costs a few replace() calls)
    return LossyTensor(role, config if bins == config.bins else replace(config, bins=bins),
                       encoder, sketch.sumsq, force,
                       pipeline=Pipeline(encoder.stage,
                                         entropy=Entropy() if entropy is None else entropy))


def _measure(entry: TensorEntry, read: Read, encoder: QuantEncoder,
             force: np.ndarray | None) -> ChunkStats:
    """The exact error of a fitted quantizer over the whole tensor."""
    total = ChunkStats()
    for start, stop, _, x in _chunks(entry, read):
        total.merge(encoder.measure(x, None if force is None else force[start:stop]))
    return total
