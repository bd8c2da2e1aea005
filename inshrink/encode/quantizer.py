"""Pass 2 of quantization: the fitted quantizer of one tensor and its chunks' codes.

A :class:`QuantEncoder` holds the stored stage (:class:`~inshrink.codecs.quant.Quant`: the
level table) next to what only the encoder uses (decision boundaries and thresholds). It
assigns every element the code of its nearest level, or the zero level (pruned), or the
*escape* code (protected or non-finite: its exact value goes to the side streams); one kernel
per chunk assigns the codes, lists the escapes and measures the error (:class:`ChunkStats`).
Float32 chunks start their rank search in a table by bit pattern (:func:`rank_table`).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from ..codecs.quant import WORDS, Quant, QuantChunk
from ..errors import InvalidArgumentError
from ..kernels import quant as kernels
from .scratch import scratch_array
from .sketch import NUMPY_ELEMENTS, Sketch, work_dtype


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

    def _encode(self, x: np.ndarray, force: np.ndarray | None
                ) -> tuple[np.ndarray, np.ndarray, "ChunkStats"]:
        """(codes, escaped positions, error) of one chunk in one pass (``x`` in the work
        dtype); escaped elements keep their nearest level's code: smoother streams."""
        stage = self.stage
        if force is not None and force.shape != x.shape:  # the kernel indexes it by element
            raise InvalidArgumentError(f"{force.size} overrides for a chunk of {x.size}")
        codes = np.empty(x.size, np.uint16)  # the caller keeps them: not scratch
        scratch = scratch_array("positions", np.int64, 2 * x.size)
        positions, others = scratch[:x.size], scratch[x.size:]
        out = np.zeros(7, np.float64)
        if not kernels.quantize_chunk.due(x.size, NUMPY_ELEMENTS):
            escaped = quantize_numpy(x, self.boundaries, self._table, self.protect_at,
                                     self.prune_below, stage.zero_code, stage.escape, force,
                                     codes, out)
            return codes, escaped, _stats(x.size, out)
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
        """The error quantizing one chunk (``x`` in the work dtype) makes, in the one pass
        :meth:`quantize` takes (:meth:`assign` and :meth:`stats` are its two-pass reference)."""
        return self._encode(x, force)[2]

    def quantize(self, raw: np.ndarray, force: np.ndarray | None = None
                 ) -> tuple[QuantChunk, "ChunkStats"]:
        """One chunk (uint8 view of whole elements) as the stage stores it, and its error."""
        stage = self.stage
        x = raw.view(stage.dtype.numpy)
        work = work_dtype(stage.dtype)
        if x.dtype != work:  # e.g. bfloat16: widened into this thread's array, not a new one
            wide = scratch_array("work", work, x.size)
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
        # float64 magnitudes past ~1e154: the squares overflow to inf, which skips the count
        # as rel_l2 counts a bound not met for them (see ChunkStats.rel_l2)
        with np.errstate(over="ignore", invalid="ignore"):
            return math.sqrt(float(np.dot(counts, (values - decoded) ** 2)) / sketch.sumsq)


@np.errstate(all="ignore")  # (the kernel raises and warns of nothing either)
def quantize_numpy(x: np.ndarray, boundaries: np.ndarray, table: np.ndarray,
                   protect_at: float, prune_below: float, zero_code: int, escape: int,
                   force: np.ndarray | None, codes: np.ndarray, out: np.ndarray) -> np.ndarray:
    """:func:`inshrink.kernels.quant.quantize_chunk` in numpy, with the same codes, escapes
    and ``out`` to the bit (the squared errors summed in element order, as the kernel sums
    them): what a process does before it has quantized enough to compile the kernel
    (:data:`~.sketch.NUMPY_ELEMENTS`). Returns the escaped positions."""
    v = x.astype(np.float64)
    rank = np.searchsorted(boundaries, v, side="left")  # (a NaN's is never used)
    code = np.where((-prune_below < v) & (v < prune_below), zero_code, rank)
    escaped = ~((-protect_at < v) & (v < protect_at))  # also NaN
    if force is not None:
        code[force == 2] = zero_code
        escaped |= force == 1
    escaped |= code == escape
    positions = np.flatnonzero(escaped)
    finite = np.isfinite(v)
    code[positions] = np.where(finite[positions], rank[positions], 0)
    codes[:] = code
    kept = ~escaped
    value = v[kept]
    level = table[code[kept]]
    error = np.abs(value - level)
    if error.size:
        out[0] += np.cumsum(error * error)[-1]  # sequential, not pairwise
        out[1] = max(out[1], error.max())
    nonzero = value != 0.0  # (every kept value is finite)
    out[2] += positions.size
    out[3] += np.count_nonzero(nonzero & (np.abs(value) < prune_below))
    out[4] += np.count_nonzero(nonzero & (level == 0.0))
    out[5] += np.count_nonzero(nonzero & (level != 0.0) & ((value < 0.0) != (level < 0.0)))
    out[6] += np.count_nonzero(finite & (v != 0.0))
    return positions


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
