"""The quantization encoder: the sketch pass, the fit of the levels, code assignment.

Encoding a tensor takes two passes over its chunks. The first builds a log-bucket sketch of
the magnitudes (per sign). From it :func:`fit` chooses protect and prune thresholds from its
quantiles and ``bins`` levels by weighted k-means on its buckets, in a domain (``linear``,
``log``, ``signed_log``). The result, a :class:`QuantEncoder`, holds the stored stage
(:class:`~inshrink.codecs.quant.Quant`: the level table) next to what only the encoder uses
(decision boundaries and thresholds). The second pass assigns every element the code of its
nearest level, or the zero level (pruned), or the *escape* code (protected or non-finite: its
exact value goes to the side streams); one kernel per chunk assigns the codes, lists the
escapes and measures the error.

Nothing here reads a policy: callers pass plain values.
"""
from __future__ import annotations

import bisect
import functools
import math
import struct
import threading
from dataclasses import dataclass

import numpy as np

from ..dtypes import DType
from ..errors import InvalidArgumentError
from ..kernels import quant as kernels
from ..codecs.quant import WORDS, Quant, QuantChunk, packing_bits

BIN_LADDER = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
              1536, 2048, 4096, 8192, 16384, 32768, 65000)


def work_dtype(dtype: DType) -> np.dtype:
    """The float type codes are computed in: exact for every lossy dtype."""
    return _FLOAT64 if dtype.name == "F64" else _FLOAT32


_FLOAT64, _FLOAT32 = np.dtype(np.float64), np.dtype(np.float32)


# --- pass 1: the sketch ---------------------------------------------------------------------

_FLOAT_BITS = {4: (np.uint32, 23), 8: (np.uint64, 52)}
# by work itemsize: the word type, all bits but the sign, the pattern of +inf (the sketch
# kernel's constants); struct formats of a word and of the float
_WORDS = {4: (np.uint32, np.uint64(0x7FFFFFFF), np.uint64(0x7F800000)),
          8: (np.uint64, np.uint64(0x7FFFFFFFFFFFFFFF), np.uint64(0x7FF0000000000000))}
_STRUCT = {4: ("<I", "<f"), 8: ("<Q", "<d")}


@functools.lru_cache(maxsize=64)
def _geometry(work: np.dtype, alpha: float, bins: int) -> tuple[int, int]:
    """(shift, buckets per sign) of :meth:`Sketch.for_dtype`."""
    mantissa = _FLOAT_BITS[work.itemsize][1]
    kept = max(math.ceil(math.log2(1 / (2 * alpha))), min(12, bins.bit_length() + 2))
    exponent = 8 * work.itemsize - 1 - mantissa
    kept = min(mantissa, 20 - exponent, max(1, kept))  # at most 2^20 buckets per sign
    shift = mantissa - kept
    return shift, int(_WORDS[work.itemsize][2] >> np.uint64(shift)) + 1


@dataclass
class Sketch:
    """Log-bucket histogram of one tensor's magnitudes per sign, plus the counts the fit
    needs. A magnitude's bucket is its float bit pattern shifted right by ``shift`` (exponent
    and top mantissa bits): log-spaced buckets of relative width at most 2·alpha, without the
    per-element logarithm. Sketches of different chunks merge by adding (the paper's parallel
    DDSketch without collapsing)."""

    work: np.dtype
    shift: int
    counts: np.ndarray  # int64, 2 rows (positive, negative) of one count per bucket
    totals: np.ndarray  # zeros, non-finite, sum of squares of the finite elements
    span: np.ndarray    # int64 [lowest, highest] bucket counted: the fit scans only these

    @property
    def pos(self) -> np.ndarray:
        return self.counts[0]

    @property
    def neg(self) -> np.ndarray:
        return self.counts[1]

    @property
    def occupied(self) -> tuple[int, int]:
        """``(first, stop)``: every counted bucket lies in ``[first, stop)`` (empty: 0, 0)."""
        first, last = int(self.span[0]), int(self.span[1])
        return (first, last + 1) if last >= first else (0, 0)

    @classmethod
    def for_dtype(cls, dtype: DType, alpha: float, bins: int = 1) -> "Sketch":
        """A sketch of relative bucket width <= 2·alpha, refined for many bins (k-means
        cannot place levels closer than the buckets: up to 2^12 buckets per octave)."""
        work = work_dtype(dtype)
        shift, size = _geometry(work, alpha, bins)
        counts = _spare_counts().pop(size, None)  # zeroed by the sketch that released it
        if counts is None:
            counts = np.zeros((2, size), np.int64)
        return cls(work, shift, counts, np.zeros(3, np.float64), np.array([size, -1], np.int64))

    def release(self) -> None:
        """Zero the buckets this sketch counted and keep its counts for the next sketch of
        their size made on this thread (a new table is 0.5-4 MB to zero, per tensor; larger
        ones, of float64 tensors with many bins, are not kept). The sketch must not be used
        afterwards."""
        if self.counts.shape[1] <= _CENTER_TABLE_MAX:
            first, stop = self.occupied
            self.counts[:, first:stop] = 0
            _spare_counts()[self.counts.shape[1]] = self.counts
        self.counts = None  # any later use fails loudly

    @staticmethod
    def _inf_bits(work: np.dtype) -> np.uint64:
        return _WORDS[work.itemsize][2]

    def add(self, x: np.ndarray) -> None:
        """Count one chunk (``x`` contiguous, in the work dtype)."""
        self.__dict__.pop("buckets", None)  # counts change
        word, abs_mask, inf_bits = _WORDS[self.work.itemsize]
        kernels.sketch_words(x, x.view(word), abs_mask, inf_bits, np.uint64(self.shift),
                             self.counts, self.totals, self.span)

    @functools.cached_property
    def buckets(self) -> "Buckets":
        """The occupied buckets, what the fit works on (computed once per sketch: a fit
        scans only these, and a search fits several bin counts)."""
        first, stop = self.occupied
        pos, neg = self.pos[first:stop], self.neg[first:stop]
        occupied = np.flatnonzero(pos | neg)
        index = occupied + first
        return Buckets(index, pos[occupied], neg[occupied], self.center(index))

    @property
    def zeros(self) -> int:
        return int(self.totals[0])

    @property
    def nonfinite(self) -> int:
        return int(self.totals[1])

    @property
    def sumsq(self) -> float:
        return float(self.totals[2])

    @property
    def count(self) -> int:
        first, stop = self.occupied
        return int(self.counts[:, first:stop].sum()) + self.zeros + self.nonfinite

    def _edge(self, index) -> np.ndarray:
        word = _FLOAT_BITS[self.work.itemsize][0]
        bits = (np.asarray(index, np.uint64) << np.uint64(self.shift)).astype(word)
        return bits.view(self.work).astype(np.float64)

    def upper(self, index):
        """Upper edge (exclusive) of the magnitudes in bucket ``index``."""
        return self._edge(np.asarray(index) + 1)

    def lower(self, index):
        return self._edge(index)

    def edge(self, index: int) -> float:
        """:meth:`lower` of one bucket as a float (no numpy calls: a fit takes two)."""
        size = self.work.itemsize
        bits = (index << self.shift) & ((1 << 8 * size) - 1)  # the wrap of astype(word)
        return struct.unpack(_STRUCT[size][1], struct.pack(_STRUCT[size][0], bits))[0]

    def center(self, index):
        """Representative magnitude of a bucket: the geometric middle of its edges."""
        if self.pos.size <= _CENTER_TABLE_MAX:  # one gather instead of a dozen array passes
            return _centers(self.work, self.shift, self.pos.size)[index]
        return _bucket_centers(self.work, self.shift, index)


_spare = threading.local()


def _spare_counts() -> dict[int, np.ndarray]:
    """This thread's released sketch counts, zero, by size."""
    spare = _spare.__dict__.get("counts")
    if spare is None:
        spare = _spare.counts = {}
    return spare


# elements: larger scratch arrays are made per call, not kept (a 4 MiB chunk of bfloat16 is
# 2^21 elements, its positions and others twice that; only their first entries are written)
_SCRATCH_KEPT = 1 << 22


def _scratch(name: str, dtype: type, n: int) -> np.ndarray:
    """``n`` elements of this thread's scratch array ``name`` (contents undefined): a chunk's
    or a fit's temporaries, taken again by the next one on the thread instead of allocated
    (and page-faulted) per call. Whatever uses it must not keep it, nor call what takes the
    same name while using it."""
    if n > _SCRATCH_KEPT:
        return np.empty(n, dtype)
    kept = _spare.__dict__.setdefault("scratch", {})
    array = kept.get(name)
    if array is None or array.size < n or array.dtype != dtype:
        array = kept[name] = np.empty(min(max(n, 2 * (0 if array is None else array.size)),
                                          _SCRATCH_KEPT), dtype)
    return array[:n]


def _bucket_centers(work: np.dtype, shift: int, index) -> np.ndarray:
    """:meth:`Sketch.center` of buckets ``index``: the geometric middle of their edges."""
    word = _FLOAT_BITS[work.itemsize][0]
    bits = np.asarray(index, np.uint64) << np.uint64(shift)  # lower() and upper()
    lo = bits.astype(word).view(work).astype(np.float64)
    hi = (bits + np.uint64(1 << shift)).astype(word).view(work).astype(np.float64)
    return np.where(lo > 0, np.sqrt(lo * hi), hi / 2)


_CENTER_TABLE_MAX = 1 << 18  # buckets per sign: a table of every center is at most 2 MiB
# A process's first fits run the numpy reference (same levels): compiling fit_points costs
# about 0.2 s in a fresh environment, and it saves about 12 us per fit, so it is compiled
# once this many fits have shown that the process fits enough tensors to pay for it.
_FITS_BEFORE_KERNEL = 256
_fits_so_far = 0


@functools.lru_cache(maxsize=4)
def _centers(work: np.dtype, shift: int, size: int) -> np.ndarray:
    """The center of every bucket of a sketch (read-only: shared by every fit)."""
    with np.errstate(invalid="ignore", over="ignore"):  # the top buckets: inf, NaN patterns
        table = _bucket_centers(work, shift, np.arange(size))
    table.flags.writeable = False
    return table


@functools.lru_cache(maxsize=4)
def _log_centers(work: np.dtype, shift: int, size: int) -> np.ndarray:
    """The logarithm of every bucket's center (read-only), what a log-domain fit clusters."""
    with np.errstate(invalid="ignore", divide="ignore"):
        table = np.log(_centers(work, shift, size))
    table.flags.writeable = False
    return table


@dataclass(frozen=True)
class Buckets:
    """The occupied buckets of a sketch, ascending: their indices, counts per sign and
    representative magnitudes (:meth:`Sketch.center`)."""

    index: np.ndarray    # int64
    pos: np.ndarray      # int64
    neg: np.ndarray      # int64
    centers: np.ndarray  # float64


# --- the fit --------------------------------------------------------------------------------

@dataclass(frozen=True)
class QuantEncoder:
    """The fitted quantizer of one tensor: the stored stage and the encoder's thresholds."""

    stage: Quant
    boundaries: np.ndarray        # float64, len(levels) - 1, in the value domain
    protect_at: float = math.inf  # |x| >= this: escaped
    prune_below: float = 0.0      # |x| < this: zero level

    def assign(self, x: np.ndarray, force: np.ndarray | None = None) -> np.ndarray:
        """Codes of one chunk (``x`` in the work dtype; ``force``: 1 protect, 2 prune)."""
        stage = self.stage
        codes = np.empty(x.size, np.uint16)
        kernels.assign_codes(x, self.boundaries, -self.protect_at, self.protect_at,
                             -self.prune_below, self.prune_below, stage.zero_code, stage.escape,
                             _NO_FORCE if force is None else force, codes)
        return codes

    def stats(self, x: np.ndarray, codes: np.ndarray) -> "ChunkStats":
        """The error the codes make on ``x`` (escaped elements are exact)."""
        out = np.zeros(7, np.float64)
        kernels.error_stats(x, codes, self._table, self.stage.escape, self.prune_below, out)
        return _stats(x.size, out)

    def error(self, x: np.ndarray) -> "ChunkStats":
        """The error quantizing one chunk (``x`` in the work dtype) makes, in the one pass
        :meth:`quantize` takes (:meth:`assign` and :meth:`stats` are its two-pass reference)."""
        return self._encode(x, None)[2]

    def _encode(self, x: np.ndarray, force: np.ndarray | None
                ) -> tuple[np.ndarray, np.ndarray, "ChunkStats"]:
        """(codes, escaped positions, error) of one chunk in one pass (``x`` in the work
        dtype); escaped elements keep their nearest level's code: smoother streams."""
        stage = self.stage
        if force is not None and force.shape != x.shape:  # the kernel indexes it by element
            raise InvalidArgumentError(f"{force.size} overrides for a chunk of {x.size}")
        codes = np.empty(x.size, np.uint16)  # the caller keeps them: not scratch
        scratch = _scratch("positions", np.int64, 2 * x.size)
        positions, others = scratch[:x.size], scratch[x.size:]
        out = np.zeros(7, np.float64)
        lut, probes = _NO_TABLE
        if x.dtype == np.float32 and x.size >= _RANK_TABLE_MIN:
            lut, probes = self._rank_table
        if not lut.size:  # the kernel reads ranks from codes
            if x.size < _RANK_TABLE_MIN and not (self.boundaries.size <= _KERNEL_RANK_MAX
                                                 and _rank_kernel_due()):
                codes[:] = np.searchsorted(self.boundaries, x, side="left")
            else:
                kernels.rank_chunk(x, self._padded, codes)
        escaped = kernels.quantize_chunk(x, x.view(np.uint32) if lut.size else _NO_WORDS,
                                         self._padded, lut, probes, self._table,
                                         -self.protect_at, self.protect_at, self.prune_below,
                                         stage.zero_code, stage.escape,
                                         _NO_FORCE if force is None else force, codes, positions,
                                         others, out)
        return codes, positions[:escaped].copy(), _stats(x.size, out)

    def measure(self, x: np.ndarray, force: np.ndarray | None = None) -> "ChunkStats":
        """The error the codes of one chunk make (``x`` in the work dtype)."""
        return self._encode(x, force)[2]

    def quantize(self, raw: np.ndarray, force: np.ndarray | None = None
                 ) -> tuple[QuantChunk, "ChunkStats"]:
        """One chunk (uint8 view of whole elements) as the stage stores it, and its error."""
        stage = self.stage
        x = raw.view(stage.dtype.numpy)
        work = work_dtype(stage.dtype)
        if x.dtype != work:  # e.g. bfloat16: widened into this thread's array, not a new one
            wide = _scratch("work", work, x.size)
            np.copyto(wide, x, casting="unsafe")  # the values astype() gives
            x = wide
        codes, positions, stats = self._encode(x, force)
        values = raw.view(WORDS[stage.dtype.itemsize])[positions].view(np.uint8)
        return QuantChunk(codes, positions, values), stats

    @functools.cached_property
    def _table(self) -> np.ndarray:
        """The levels as float64, what the error is measured against."""
        return self.stage.levels.astype(np.float64)

    @functools.cached_property
    def _padded(self) -> np.ndarray:
        """The boundaries and +inf after them: the kernel's rank search stops there."""
        padded = np.empty(self.boundaries.size + 1, np.float64)
        padded[:-1] = self.boundaries
        padded[-1] = math.inf
        return padded

    @functools.cached_property
    def _rank_table(self) -> tuple[np.ndarray, int]:
        return rank_table(self.boundaries)

    def estimate_rel_l2(self, sketch: Sketch) -> float:
        """Relative L2 error predicted from the histogram alone (bucket centers stand in for
        the values): cheap, used to skip bin counts that cannot meet a bound."""
        if sketch.sumsq <= 0:
            return 0.0
        first, stop = sketch.occupied
        pos = np.flatnonzero(sketch.pos[first:stop]) + first
        neg = np.flatnonzero(sketch.neg[first:stop]) + first
        values = np.concatenate([sketch.center(pos), -sketch.center(neg)])
        counts = np.concatenate([sketch.pos[pos], sketch.neg[neg]]).astype(np.float64)
        table = self.stage.levels.astype(np.float64)
        if table.size == 0:
            decoded = values.copy()
        else:
            decoded = table[np.searchsorted(self.boundaries, values, side="left")]
        decoded = np.where(np.abs(values) >= self.protect_at, values, decoded)
        decoded = np.where(np.abs(values) < self.prune_below, 0.0, decoded)
        return math.sqrt(float(np.dot(counts, (values - decoded) ** 2)) / sketch.sumsq)


_NO_FORCE = np.empty(0, np.int8)
_NO_WORDS = np.empty(0, np.uint32)
_NO_TABLE = (np.empty(0, np.uint16), 0)
_RANK_TABLE_MIN = 1 << 12  # shorter chunks: a search costs less than building the table
# Shorter chunks with at most this many boundaries are ranked by rank_chunk (the same ranks;
# 2x faster than numpy's search from 256 elements and 3 boundaries to 4,096 and 31, measured
# 2026-12-01; even at 63, slower from 64 to 256, where it counts instead of searching) once
# the process has ranked _SEARCHES_BEFORE_KERNEL of them with numpy: a process that
# quantizes a few small tensors compiles no kernel for them (about 0.1 s in a fresh
# environment), one of many small moments saves ~8 us each (a fifth of its quantize call).
_KERNEL_RANK_MAX = 32
_SEARCHES_BEFORE_KERNEL = 256
_searches_so_far = 0


def _rank_kernel_due() -> bool:
    """Whether short chunks are ranked by the kernel now (see _KERNEL_RANK_MAX)."""
    global _searches_so_far
    if kernels.rank_chunk.ready:
        return True
    _searches_so_far += 1  # unlocked: a lost update only delays the switch a little
    return _searches_so_far > _SEARCHES_BEFORE_KERNEL
_MAX_PROBES = 4            # more comparisons per element than this: count or search instead


def rank_table(boundaries: np.ndarray) -> tuple[np.ndarray, int]:
    """The table that starts the kernel's rank search of a float32 element, and how many
    comparisons finish it.

    An element's bit pattern shifted right by ``RANK_SHIFT`` is its bucket: one sign and a
    run of consecutive patterns (log-spaced magnitudes, as in the sketch), whose values rise
    with the pattern for positive buckets and fall for negative ones. An element's rank (the
    number of boundaries strictly below it) does not fall as its value rises, so the rank of
    a bucket's least value is at most that of any element in it, and the ranks in a bucket
    exceed it by at most the least rank of the bucket of the next larger values minus its
    own: the number of comparisons needed.

    Returns
    -------
    (numpy.ndarray, int)
        uint16 rank of each bucket's least value, by bucket, and the most comparisons any
        bucket needs; an empty table when the boundaries are unsorted, too many (a rank over
        uint16) or crowded into too few buckets (more than ``_MAX_PROBES`` comparisons).
    """
    b = np.asarray(boundaries, np.float64)
    return _small_rank_table(b) if b.size <= _FEW_BOUNDARIES else _numpy_rank_table(b)


def _numpy_rank_table(b: np.ndarray) -> tuple[np.ndarray, int]:
    """:func:`rank_table` of float64 boundaries, in numpy."""
    if b.size >= 0xFFFF or np.isnan(b).any() or (b.size > 1 and (b[1:] < b[:-1]).any()):
        return _NO_TABLE
    firsts = _bucket_firsts()
    # in the order of the values, the buckets from which on each boundary is below the least
    # value (ascending, as the boundaries): the rank of bucket B's least value is the number
    # of them at most B, and a bucket needs as many comparisons as there are boundaries at
    # the next bucket (the last bucket: above every least value)
    at = np.searchsorted(firsts, b, side="right")
    counted = at[np.searchsorted(at, 0, side="right"):]  # those at 0 are below every value
    probes = 0
    if counted.size:  # the longest run of equal buckets
        probes = int((np.arange(counted.size)
                      - np.searchsorted(counted, counted, side="left")).max()) + 1
    if probes > _MAX_PROBES:
        return _NO_TABLE
    runs = np.empty(b.size + 1, np.int64)  # the buckets of each rank, in value order
    runs[0] = at[0] if b.size else firsts.size
    if b.size:
        np.subtract(at[1:], at[:-1], out=runs[1:-1])
        runs[-1] = firsts.size - at[-1]
    ordered = np.repeat(np.arange(b.size + 1, dtype=np.uint16), runs)
    # by bucket: the positive patterns' buckets are the upper half in value order, the
    # negative ones the lower half reversed
    half = firsts.size // 2
    return np.concatenate((ordered[half:], ordered[half - 1::-1])), probes


_FEW_BOUNDARIES = 64  # up to this many: rank_table in Python on a list (fewer numpy calls)


def _small_rank_table(b: np.ndarray) -> tuple[np.ndarray, int]:
    """:func:`rank_table` of a few float64 boundaries: the table :func:`_numpy_rank_table`
    makes, with three numpy calls (a save runs it once per tensor, where each numpy call
    costs a few microseconds)."""
    values = b.tolist()
    if any(v != v for v in values) or any(
            after < before for before, after in zip(values, values[1:])):
        return _NO_TABLE  # NaN or unsorted
    firsts = _bucket_firsts()
    size = firsts.size
    half = size // 2
    at = np.searchsorted(firsts, b, side="right").tolist() + [size]  # as in rank_table
    probes = run = 0
    for k in range(len(values)):  # the longest run of equal buckets past the first
        run = run + 1 if k and at[k] == at[k - 1] else 1
        if at[k]:
            probes = max(probes, run)
    if probes > _MAX_PROBES:
        return _NO_TABLE
    # rank k covers the buckets [at[k - 1], at[k]) in value order (at[-1] = 0): the table by
    # bucket is the upper half of them in order, then the lower half reversed
    ranks, runs, lower = [], [], []
    start = 0
    for rank, stop in enumerate(at):
        if stop > half:
            ranks.append(rank)
            runs.append(stop - max(start, half))
        if start < half:
            lower.append((rank, min(stop, half) - start))
        start = max(start, stop)
    for rank, count in reversed(lower):
        ranks.append(rank)
        runs.append(count)
    return np.repeat(_RANKS[ranks], runs), probes


_RANKS = np.arange(_FEW_BOUNDARIES + 1, dtype=np.uint16)


@functools.lru_cache(maxsize=1)
def _bucket_firsts() -> np.ndarray:
    """The least value of each rank-table bucket in the order of the values (float64,
    ascending; NaN patterns stand for the infinity of their sign: a NaN is escaped, whatever
    its rank)."""
    keys = (np.arange(1 << (32 - kernels.RANK_SHIFT), dtype=np.uint64)
            << np.uint64(kernels.RANK_SHIFT)).astype(np.uint32)
    positive = keys >= np.uint32(0x80000000)
    bits = np.where(positive, keys ^ np.uint32(0x80000000), ~keys)
    with np.errstate(invalid="ignore"):  # NaN patterns
        values = bits.view(np.float32).astype(np.float64)
    nan = np.isnan(values)
    values[nan] = np.where(positive, math.inf, -math.inf)[nan]
    return values


def _stats(count: int, out: np.ndarray) -> "ChunkStats":
    """ChunkStats of ``count`` elements from a kernel's 7 accumulators."""
    sse, worst, escaped, pruned, zeroed, flipped, nonzero = out.tolist()  # Python floats
    return ChunkStats(count, sse, worst, int(escaped), int(pruned), int(zeroed), int(flipped),
                      int(nonzero))


def _thresholds(sketch: Sketch, prune: float, protect: float) -> tuple[int, int, float, float]:
    """Buckets to fit levels on (indices strictly between lo and hi) and the prune/protect
    magnitudes: the smallest ``prune`` and the largest ``protect`` fraction of the finite
    elements, rounded outward to whole buckets."""
    buckets = sketch.buckets  # cumulative counts only change at occupied buckets
    size = sketch.pos.size
    occupied = buckets.index
    counts = buckets.pos + buckets.neg
    cumulative = np.cumsum(counts)
    finite = int(cumulative[-1]) + sketch.zeros if occupied.size else sketch.zeros
    lo, prune_below = -1, 0.0
    target = prune * finite - sketch.zeros
    if prune > 0 and target > 0:
        at = int(np.searchsorted(cumulative, target, side="left"))
        lo = int(occupied[at]) if at < occupied.size else size
        prune_below = sketch.edge(lo + 1)
    hi, protect_at = size - 1, math.inf  # the last bucket starts at inf: always empty
    target = protect * finite
    if protect > 0 and target > 0:
        total = cumulative[-1] if occupied.size else 0
        from_top = total - cumulative + counts  # elements in this bucket and above
        reached = np.flatnonzero(from_top >= target)
        hi = int(occupied[reached[-1]]) if reached.size else 0
        protect_at = sketch.edge(hi)
    return lo, hi, prune_below, protect_at


@functools.lru_cache(maxsize=64)
def _uniforms(seed: int, k: int) -> np.ndarray:
    """The k-means++ draws of a seed (a new generator costs more than a small tensor's fit);
    read-only, shared by every fit with that seed and bin count."""
    uniforms = np.random.default_rng(seed).random(k)
    uniforms.flags.writeable = False
    return uniforms


def _kmeans(points: np.ndarray, weights: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Weighted k-means++ then Lloyd on sorted 1-D points; at most k sorted centroids."""
    if points.size <= k:
        return points.copy()
    centroids = np.empty(k, np.float64)
    if points.size != weights.size:  # the kernel reads both up to len(points)
        raise InvalidArgumentError(f"{points.size} points and {weights.size} weights")
    m, _ = kernels.kmeans_1d(points, weights, _uniforms(seed, k), centroids, 100, 1e-7,
                             _scratch("kmeans", np.float64, 2 * (points.size + k)))
    centroids = centroids[:m]  # sorted: only equal neighbours to drop (rarely any)
    values = centroids.tolist()
    if any(after == before for before, after in zip(values, values[1:])):
        distinct = np.empty(m, bool)
        distinct[0] = True
        np.not_equal(centroids[1:], centroids[:-1], out=distinct[1:])
        centroids = centroids[distinct]
    return centroids


def _fit_centroids(sketch: Sketch, lo: int, hi: int, bins: int, domain: str | None,
                   sigma: float, seed: int) -> np.ndarray:
    """Centroids (value domain, float64) of the buckets strictly between lo and hi."""
    buckets = sketch.buckets  # a fine sketch has ~10^5 buckets, few occupied
    a = int(buckets.index.searchsorted(lo, side="right"))
    b = max(int(buckets.index.searchsorted(hi, side="left")), a)
    centers, pos, neg = buckets.centers[a:b], buckets.pos[a:b], buckets.neg[a:b]
    if domain == "linear":
        neg, negative, positive = neg[::-1], neg[::-1] > 0, pos > 0
        points = np.concatenate([-centers[::-1][negative], centers[positive]])
        freq = np.concatenate([neg[negative], pos[positive]]).astype(np.float64)
        if points.size == 0:
            return points
        magnitudes = np.abs(points)
        weights = sigma * freq / freq.max() + (1 - sigma) * magnitudes / magnitudes.max()
        return _kmeans(points, weights, bins, seed)
    # log domains: each sign on its own, log magnitude, weighted by frequency only
    n_pos, n_neg = int(pos.sum()), int(neg.sum())
    k_pos = bins if not n_neg else 0 if not n_pos else min(
        max(1, round(bins * n_pos / (n_pos + n_neg))), max(1, bins - 1))
    fitted = []
    for sign, counts, k in ((1.0, pos, k_pos), (-1.0, neg, bins - k_pos)):
        used = counts > 0
        if k and used.any():
            logs = np.log(centers[used])
            fitted.append(sign * np.exp(_kmeans(logs, counts[used].astype(np.float64), k,
                                                seed)))
    return np.sort(np.concatenate(fitted)) if fitted else np.empty(0)


_SMALLEST_SUBNORMAL = float(np.finfo(np.float64).smallest_subnormal)
_NO_LEVELS = np.empty(0, np.float64)
_ZERO_LEVEL = np.zeros(1, np.float64)


def _boundaries(levels: np.ndarray, domain: str | None) -> np.ndarray:
    """Decision thresholds between consecutive levels (sorted, distinct, no -0.0), in the
    value domain (float64)."""
    a, b = levels[:-1], levels[1:]
    if domain == "linear":
        return (a + b) / 2
    # the geometric middle, signed, of levels of one sign; 0 between levels of both signs
    product = a * b
    out = np.sqrt(np.abs(product))
    out = np.where(product > 0, np.copysign(out, a, out=out), 0.0)
    # a negative level next to the zero level: only exact zeros (and -0.0) go to zero
    zero = int(np.searchsorted(levels, 0.0))
    if 0 < zero < levels.size and levels[zero] == 0 and levels[zero - 1] < 0:
        out[zero - 1] = -_SMALLEST_SUBNORMAL
    return out


def _few_levels(rounded: list[float], zero: bool) -> list[float]:
    """:func:`_encoder`'s levels (float64) of a few rounded centroids (ascending), on a list:
    the distinct finite non-zero ones, and the zero level if ``zero``."""
    values = [v for i, v in enumerate(rounded)
              if math.isfinite(v) and v != 0 and (i == 0 or v != rounded[i - 1])]
    if zero:
        values.insert(bisect.bisect_left(values, 0.0), 0.0)  # numpy's searchsorted, left
    return values


def _few_boundaries(levels: list[float], domain: str | None) -> np.ndarray:
    """:func:`_boundaries` of a few levels, on a list (the same values: the same operations,
    each correctly rounded)."""
    pairs = zip(levels, levels[1:])
    if domain == "linear":
        return np.array([(a + b) / 2 for a, b in pairs], np.float64)
    out = [math.copysign(math.sqrt(abs(a * b)), a) if a * b > 0 else 0.0 for a, b in pairs]
    zero = bisect.bisect_left(levels, 0.0)
    if 0 < zero < len(levels) and levels[zero] == 0 and levels[zero - 1] < 0:
        out[zero - 1] = -_SMALLEST_SUBNORMAL
    return np.array(out, np.float64)


def fit(sketch: Sketch, dtype: DType, *, bins: int, domain: str | None, prune: float = 0.0,
        protect: float = 0.0, sigma: float = 0.2, seed: int = 0,
        zero_level: bool = False) -> QuantEncoder:
    """Fit the levels and thresholds of one tensor from its sketch.

    Parameters are those of :class:`inshrink.QuantConfig` (``bins`` levels in ``domain``,
    ``prune`` and ``protect`` fractions, k-means ``sigma`` and ``seed``); ``zero_level``
    forces an exact zero level, for pruning decided outside the sketch.
    """
    global _fits_so_far
    _fits_so_far += 1  # unlocked: a lost update only delays the switch a little
    how = _fit_kernel
    if (sketch.pos.size > _CENTER_TABLE_MAX  # no table of centers
            or (_fits_so_far <= _FITS_BEFORE_KERNEL and not kernels.fit_points.ready)):
        how = _fit_reference
    return how(sketch, dtype, bins=bins, domain=domain, prune=prune, protect=protect,
               sigma=sigma, seed=seed, zero_level=zero_level)


def _fit_kernel(sketch: Sketch, dtype: DType, *, bins: int, domain: str | None,
                prune: float, protect: float, sigma: float, seed: int,
                zero_level: bool) -> QuantEncoder:
    """:func:`fit` with the thresholds and k-means input from one ``fit_points`` kernel call
    (a sketch of at most ``_CENTER_TABLE_MAX`` buckets per sign)."""
    size = sketch.pos.size
    first, stop = sketch.occupied
    if not (0 <= first <= stop <= size and sketch.counts.shape == (2, size)):
        raise InvalidArgumentError(f"sketch span {first}..{stop} of {size} buckets")
    if domain != "linear" and bins == 1:
        counted = sketch.counts[:, first:stop].any(axis=1)
        if counted.all():  # one log-domain level keeps one sign only: see _fit_reference
            domain = "linear"
    linear = domain == "linear"
    table = (_centers if linear else _log_centers)(sketch.work, sketch.shift, size)
    half = stop - first
    scratch = _scratch("points", np.float64, 4 * half)  # results never point into it
    points, weights = scratch[:2 * half], scratch[2 * half:]
    lo, hi, n_neg, n_pos, elements_neg, elements_pos = kernels.fit_points(
        sketch.counts, first, stop, sketch.zeros, float(prune), float(protect), linear, table,
        points, weights)
    prune_below = sketch.edge(lo + 1) if lo >= 0 else 0.0
    protect_at = sketch.edge(hi) if hi < size - 1 else math.inf
    if not bins:
        centroids = np.empty(0)
    elif linear:
        points, freq = points[half - n_neg:half + n_pos], weights[half - n_neg:half + n_pos]
        if points.size:
            magnitudes = np.abs(points)
            freq = sigma * freq / freq.max() + (1 - sigma) * magnitudes / magnitudes.max()
            centroids = _kmeans(points, freq, bins, seed)
        else:
            centroids = points.copy()
    else:  # each sign on its own, log magnitudes
        k_pos = bins if not elements_neg else 0 if not elements_pos else min(
            max(1, round(bins * elements_pos / (elements_pos + elements_neg))), max(1, bins - 1))
        negative = positive = _NO_LEVELS  # logarithms of the magnitudes, ascending
        if bins - k_pos and n_neg:
            negative = _kmeans(points[:n_neg], weights[:n_neg], bins - k_pos, seed)
        if k_pos and n_pos:
            positive = _kmeans(points[half:half + n_pos], weights[half:half + n_pos], k_pos,
                               seed)
        # ascending: the negated exponentials of the negative side's logarithms, reversed,
        # then the positive side's (the sort of both but for the order of zeros exp() may
        # underflow to, which are dropped)
        centroids = np.exp(np.concatenate((negative[::-1], positive)))
        np.negative(centroids[:negative.size], out=centroids[:negative.size])
    return _encoder(sketch, dtype, centroids, bins, domain, prune_below, protect_at,
                    zero_level)


def _encoder(sketch: Sketch, dtype: DType, centroids: np.ndarray, bins: int,
             domain: str | None, prune_below: float, protect_at: float,
             zero_level: bool) -> QuantEncoder:
    """The encoder of fitted centroids (ascending): rounded to the dtype, the zero level
    added."""
    rounded = centroids.astype(dtype.numpy).astype(np.float64)  # still ascending
    zero = bool(sketch.zeros or prune_below > 0 or zero_level or not bins)
    if rounded.size <= _FEW_BOUNDARIES:  # a small tensor's: on a list, fewer numpy calls
        values = _few_levels(rounded.tolist(), zero)
        levels = np.array(values, np.float64).astype(dtype.numpy)
        stage = Quant(dtype, levels, packing_bits(len(levels)))
        return QuantEncoder(stage, _few_boundaries(values, domain), protect_at, prune_below)
    # the distinct finite non-zero ones (np.unique of them: equal values are neighbours)
    keep = np.isfinite(rounded)
    keep &= rounded != 0
    if rounded.size > 1:
        keep[1:] &= rounded[1:] != rounded[:-1]
    values = rounded[keep]
    if zero:
        at = int(np.searchsorted(values, 0.0))
        values = np.concatenate((values[:at], _ZERO_LEVEL, values[at:]))
    levels = values.astype(dtype.numpy)
    stage = Quant(dtype, levels, packing_bits(len(levels)))
    return QuantEncoder(stage, _boundaries(values, domain), protect_at, prune_below)


def _fit_reference(sketch: Sketch, dtype: DType, *, bins: int, domain: str | None,
                   prune: float = 0.0, protect: float = 0.0, sigma: float = 0.2,
                   seed: int = 0, zero_level: bool = False) -> QuantEncoder:
    """:func:`fit` in numpy, on the sketch's occupied buckets: the kernel's reference, and
    the fit of sketches too fine for a table of centers."""
    buckets = sketch.buckets
    positive, negative = buckets.pos.any(), buckets.neg.any()
    if domain == "log" and negative:
        domain = "signed_log"
    if domain != "linear" and bins == 1 and positive and negative:
        # one log-domain level keeps one sign only (every value pushed one way); the single
        # linear level, a weighted mean, is the better single value for signed data
        domain = "linear"
    lo, hi, prune_below, protect_at = _thresholds(sketch, prune, protect)
    centroids = (_fit_centroids(sketch, lo, hi, bins, domain, sigma, seed) if bins
                 else np.empty(0))
    return _encoder(sketch, dtype, centroids, bins, domain, prune_below, protect_at,
                    zero_level)


def bin_candidates(bins: int) -> list[int]:
    """Bin counts tried, fewest first, when an error bound is set."""
    return [b for b in BIN_LADDER if b < bins] + [bins]


# --- error statistics -----------------------------------------------------------------------

# a sum of squares at least this large per non-zero element loses at most a 2^-52 fraction of
# itself to squares that underflowed (each loses less than the smallest normal float64)
_SQUARES_EXACT = 2.0 ** -1022 * 2.0 ** 52


@dataclass
class ChunkStats:
    """Error statistics of one or more encoded chunks (they add up)."""

    count: int = 0
    sse: float = 0.0
    max_abs: float = 0.0
    protected: int = 0
    pruned: int = 0
    zeroed: int = 0
    sign_flipped: int = 0
    nonzero: int = 0

    def merge(self, other: "ChunkStats") -> None:
        # spelled out: it runs once per chunk on the thread that writes the file
        self.count += other.count
        self.sse += other.sse
        self.protected += other.protected
        self.pruned += other.pruned
        self.zeroed += other.zeroed
        self.sign_flipped += other.sign_flipped
        self.nonzero += other.nonzero
        self.max_abs = max(self.max_abs, other.max_abs)

    def rel_l2(self, sumsq: float) -> float:
        """||x - x̂|| / ||x|| from the float64 sums of squares; NaN where they cannot give it:
        float64 values below ~1e-146 or above ~1e154 have squares that underflow or overflow
        (the report then says null, and a bound counts as not met)."""
        if self.max_abs == 0:
            return 0.0  # every finite element decoded exactly, whatever the sums say
        if not (math.isfinite(sumsq) and math.isfinite(self.sse)):
            return math.nan
        if sumsq < self.nonzero * _SQUARES_EXACT:
            return math.nan  # squares lost to underflow may be all of it
        if sumsq > 0:
            return math.sqrt(self.sse / sumsq)
        return 0.0 if self.sse == 0 else math.inf

    def report(self, sumsq: float) -> dict:
        """Error fields for the index and the API (fractions of elements / of non-zeros)."""
        n = max(self.count, 1)
        fields = {"max_abs_error": self.max_abs, "rel_l2_error": self.rel_l2(sumsq),
                  "protected": self.protected / n, "pruned": self.pruned / n,
                  "zeroed": self.zeroed / max(self.nonzero, 1),
                  "sign_flipped": self.sign_flipped / max(self.nonzero, 1)}
        return {k: (v if math.isfinite(v) else None) for k, v in fields.items()}
