"""Candidate encodings in memory: the searched tensors encoded at a policy exactly as a save
would encode them (:func:`inshrink.encode.tensor.for_tensor`, the Writer's chunking and entropy
settings), their stored bytes, their error, and their decoded values, without a file.

A save's stored bytes are its payloads (record headers and the index are not counted, as in
``TensorInfo.stored_bytes``), so the sizes here equal those of ``inshrink.save`` with the same
policy, and the decoded values equal what ``inshrink.load`` returns; ``tests/test_search.py``
checks both against the file path.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .. import dtypes
from ..encode import tensor as encoder
from ..codecs.entropy import Entropy
from ..container.index import TensorEntry
from ..encode.policy import Policy, QuantConfig
from ..io.arguments import resolve_threads
from ..io.writer import DEFAULT_CHUNK_BYTES, TINY_TENSOR_BYTES

KEEP = 2
"""Encodings of each tensor kept for reuse (a later candidate often differs from an earlier
one only in another role's configuration, e.g. the embedding bins); each holds a decoded copy
of its tensor. On the lm of ``benchmarks/bench_search.py`` two instead of one saved a fifth
of the weights' encodings."""
KEEP_SECOND_BYTES = 256 << 20
"""Above this many bytes of searched tensors only one encoding per tensor is kept, so the
search never holds more than one decoded copy of a large model besides the candidate's."""


@dataclass(frozen=True)
class Encoded:
    """One tensor encoded at one configuration: its stored bytes, its relative L2 error (None
    where the encoder could not measure it) and its decoded values (None when not asked)."""

    stored_bytes: int
    rel_l2: float | None
    decoded: np.ndarray | None


def encode_tensor(name: str, array: np.ndarray, policy: Policy, importance: Any = None, *,
                  decode: bool = True, entropy: Entropy = Entropy()) -> Encoded:
    """Encode one tensor as :class:`inshrink.io.writer.Writer` would with ``policy`` (default
    chunk size and entropy settings) and, with ``decode``, decode it as a reader would."""
    dtype = dtypes.of_numpy(array.dtype)
    flat = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    entry = TensorEntry(name, dtype, tuple(array.shape), [],
                        max(1, DEFAULT_CHUNK_BYTES // dtype.itemsize))
    role, config = policy.config_for(name, dtype.name, entry.shape)
    tensor = encoder.for_tensor(entry, lambda start, stop: flat[start:stop], role, config,
                                importance, entropy=entropy, report=True,
                                tiny_bytes=TINY_TENSOR_BYTES)
    out = np.empty(flat.size, np.uint8) if decode else None
    stored = 0
    size = dtype.itemsize
    for c in range(entry.chunk_count):
        start, stop = entry.chunk_range(c)
        planes, extra = tensor.encode(flat[start * size:stop * size], start, stop)
        stored += sum(len(memoryview(payload)) for _, payload, _ in planes)
        if extra is not None:
            tensor.stats.merge(extra[0])
        if out is not None:
            tensor.pipeline.decode(planes, out[start * size:stop * size])
    report = tensor.report() or {}
    decoded = None if out is None else out.view(dtype.numpy).reshape(array.shape)
    return Encoded(stored, report.get("rel_l2_error"), decoded)


class Roundtrip:
    """The searched tensors of one checkpoint, encoded and decoded per candidate policy.

    Each tensor's encoding is kept per configuration (the last :data:`KEEP`, or the last one
    above :data:`KEEP_SECOND_BYTES`), so that a candidate changing one role's configuration
    re-encodes only that role's tensors.

    Parameters
    ----------
    tensors : mapping of str to numpy.ndarray
        The searched tensors.
    importance : mapping of str to array-like
        Sensitivity scores of some of them (``inshrink.save``'s ``importance``).
    threads : int, optional
        Tensors encoded at once (None: one per core).
    """

    def __init__(self, tensors: Mapping[str, np.ndarray], importance: Mapping[str, Any],
                 threads: int | None = None) -> None:
        self.tensors, self.importance = dict(tensors), dict(importance)
        self.threads = resolve_threads(threads)
        self._kept: dict[str, OrderedDict] = {name: OrderedDict() for name in self.tensors}
        self.keep = KEEP if sum(a.nbytes for a in self.tensors.values()) <= KEEP_SECOND_BYTES \
            else 1
        self.encodings = 0  # tensors encoded (not taken from what was kept)

    def _config(self, name: str, policy: Policy) -> QuantConfig | None:
        a = self.tensors[name]
        return policy.config_for(name, dtypes.of_numpy(a.dtype).name, a.shape)[1]

    def _one(self, name: str, policy: Policy) -> tuple[Encoded, bool]:
        """(the tensor at ``policy``, whether it was encoded now)."""
        kept = self._kept[name]
        key = self._config(name, policy)
        if key in kept:
            kept.move_to_end(key)
            return kept[key], False
        result = encode_tensor(name, self.tensors[name], policy, self.importance.get(name))
        kept[key] = result
        while len(kept) > self.keep:
            kept.popitem(last=False)
        return result, True

    def __call__(self, policy: Policy) -> tuple[dict[str, np.ndarray], int, float]:
        """The tensors decoded at ``policy``, their stored bytes and the largest relative L2
        error among them (inf where the encoder could not measure it)."""
        names = list(self.tensors)
        if self.threads > 1 and len(names) > 1:
            with ThreadPoolExecutor(min(self.threads, len(names))) as pool:
                results = list(pool.map(lambda n: self._one(n, policy), names))
        else:
            results = [self._one(n, policy) for n in names]
        self.encodings += sum(fresh for _, fresh in results)
        results = [r for r, _ in results]
        worst = max((math.inf if r.rel_l2 is None else r.rel_l2 for r in results),
                    default=0.0)
        return ({n: r.decoded for n, r in zip(names, results)},
                sum(r.stored_bytes for r in results), worst)
