"""Pass 1 of quantization: the log-bucket sketch of a tensor's magnitudes, per sign.

A magnitude's bucket is its float bit pattern shifted right (exponent and top mantissa bits):
log-spaced buckets without a per-element logarithm. Sketches of chunks merge by adding; the
fit (:mod:`.fit`) works on the occupied buckets and their centers.
"""
from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass

import numpy as np

from ..dtypes import DType
from ..kernels import quant as kernels
from .scratch import spare_counts


def work_dtype(dtype: DType) -> np.dtype:
    """The float type codes are computed in: exact for every lossy dtype."""
    return _FLOAT64 if dtype.name == "F64" else _FLOAT32


_FLOAT64, _FLOAT32 = np.dtype(np.float64), np.dtype(np.float32)


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


# Elements a process sketches (and quantizes) with numpy before it compiles the kernels: about
# the work one compile pays for (numpy takes ~25 ns an element more here, 100-200 more in
# quantizer.py; compiling sketch_words costs ~0.2 s, quantize_chunk ~0.8 s, starting Numba
# ~0.3 s), so a process that saves only a small checkpoint never starts Numba.
NUMPY_ELEMENTS = 1 << 21


@np.errstate(all="ignore")  # (inf or 0, as the kernel computes them, without warnings)
def sketch_words_numpy(x: np.ndarray, words: np.ndarray, abs_mask: np.uint64,
                       inf_bits: np.uint64, shift: np.uint64, counts: np.ndarray,
                       totals: np.ndarray, span: np.ndarray) -> None:
    """:func:`inshrink.kernels.quant.sketch_words` in numpy, with the same results to the
    bit (the sum of squares is summed in element order, as the kernel sums it)."""
    a = words & words.dtype.type(abs_mask)
    counted = (a != 0) & (a < words.dtype.type(inf_bits))
    zeros = int(np.count_nonzero(a == 0))
    totals[0] += zeros
    totals[1] += x.size - zeros - int(np.count_nonzero(counted))
    bits = a[counted]
    if not bits.size:
        return
    v = x[counted].astype(np.float64)
    v *= v
    totals[2] += np.cumsum(v)[-1]  # sequential, not pairwise: the kernel's sum
    last = counts.shape[1] - 1
    index = np.minimum((bits >> words.dtype.type(shift)).astype(np.int64), last)
    index += (a[counted] != words[counted]) * counts.shape[1]  # the sign picks the row
    np.add.at(counts.reshape(-1), index, 1)
    lowest = min(int(bits.min()) >> int(shift), last)
    highest = min(int(bits.max()) >> int(shift), last)
    span[0] = min(lowest, int(span[0]))
    span[1] = max(highest, int(span[1]))


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
        counts = spare_counts().pop(size, None)  # zeroed by the sketch that released it
        if counts is None:
            counts = np.zeros((2, size), np.int64)
        return cls(work, shift, counts, np.zeros(3, np.float64), np.array([size, -1], np.int64))

    def release(self) -> None:
        """Zero the buckets this sketch counted and keep its counts for the next sketch of
        their size made on this thread (a new table is 0.5-4 MB to zero, per tensor; larger
        ones, of float64 tensors with many bins, are not kept). The sketch must not be used
        afterwards."""
        if self.counts.shape[1] <= CENTER_TABLE_MAX:
            first, stop = self.occupied
            self.counts[:, first:stop] = 0
            spare_counts()[self.counts.shape[1]] = self.counts
        self.counts = None  # any later use fails loudly

    @staticmethod
    def _inf_bits(work: np.dtype) -> np.uint64:
        return _WORDS[work.itemsize][2]

    def add(self, x: np.ndarray) -> None:
        """Count one chunk (``x`` contiguous, in the work dtype)."""
        self.__dict__.pop("buckets", None)  # counts change
        word, abs_mask, inf_bits = _WORDS[self.work.itemsize]
        add = (kernels.sketch_words if kernels.sketch_words.due(x.size, NUMPY_ELEMENTS)
               else sketch_words_numpy)
        add(x, x.view(word), abs_mask, inf_bits, np.uint64(self.shift), self.counts,
            self.totals, self.span)

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
        if self.pos.size <= CENTER_TABLE_MAX:  # one gather instead of a dozen array passes
            return center_table(self.work, self.shift, self.pos.size)[index]
        return bucket_centers(self.work, self.shift, index)


def bucket_centers(work: np.dtype, shift: int, index) -> np.ndarray:
    """:meth:`Sketch.center` of buckets ``index``: the geometric middle of their edges."""
    word = _FLOAT_BITS[work.itemsize][0]
    bits = np.asarray(index, np.uint64) << np.uint64(shift)  # lower() and upper()
    lo = bits.astype(word).view(work).astype(np.float64)
    hi = (bits + np.uint64(1 << shift)).astype(word).view(work).astype(np.float64)
    # the top finite bucket ends at inf: its center would be inf, a level no value has (a
    # fit then lost every other level); its magnitudes end at the dtype's largest instead
    hi = np.where(np.isfinite(lo) & np.isinf(hi), np.finfo(work).max, hi)
    with np.errstate(over="ignore", under="ignore"):  # beyond float64: roots below
        center = np.where(lo > 0, np.sqrt(lo * hi), hi / 2)
    # float64 magnitudes past 1e154 or under 1e-154: lo * hi is inf or 0 (a center of 0 is
    # log(0) = -inf to a log-domain fit), the product of the roots is not
    lost = ((center == 0) | np.isinf(center)) & (lo > 0) & np.isfinite(lo)
    if lost.any():
        center = np.where(lost, np.sqrt(lo) * np.sqrt(hi), center)
    return center


CENTER_TABLE_MAX = 1 << 18  # buckets per sign: a table of every center is at most 2 MiB


@functools.lru_cache(maxsize=4)
def center_table(work: np.dtype, shift: int, size: int) -> np.ndarray:
    """The center of every bucket of a sketch (read-only: shared by every fit)."""
    with np.errstate(invalid="ignore", over="ignore"):  # the top buckets: inf, NaN patterns
        table = bucket_centers(work, shift, np.arange(size))
    table.flags.writeable = False
    return table


@functools.lru_cache(maxsize=4)
def log_center_table(work: np.dtype, shift: int, size: int) -> np.ndarray:
    """The logarithm of every bucket's center (read-only), what a log-domain fit clusters."""
    with np.errstate(invalid="ignore", divide="ignore"):
        table = np.log(center_table(work, shift, size))
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
