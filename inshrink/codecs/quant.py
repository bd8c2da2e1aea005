"""Dynamic quantization codec, stage ``quant`` (the paper's protect / prune / quantize).

Encoding a tensor takes two passes over its chunks. The first builds a log-bucket sketch of
the magnitudes (per sign). From it a :class:`QuantPlan` is fitted: protect and prune
thresholds from its quantiles, and ``bins`` levels by weighted k-means on its buckets, in the
config's domain. The second pass assigns every element the code of its nearest level, or the
zero level (pruned), or the *escape* code (protected or non-finite: its exact value goes to a
side streams). Decoding is a table lookup on the dtype's raw bit patterns, so the decoder
needs no float arithmetic and reproduces the level table bit for bit.

Streams per chunk: 0 = one code per element, bit-packed at ``bits`` = bit length of
(levels - 1), an escaped element carrying its nearest level's code; 1 = the escaped elements'
positions in the chunk as uint32 gaps (position minus previous position minus one); 2 = their
exact values, in the tensor's dtype. Each then goes through the per-chunk zstd/raw coding.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

import numpy as np

from ..dtypes import DType
from ..errors import BaseMismatchError, CorruptError
from ..kernels import delta as delta_kernels
from ..kernels import quant as kernels
from ..policy import QuantConfig
from . import entropy

STAGE_ID = "quant"
_HEX = re.compile(r"[0-9a-fA-F]*")  # hex digits of either case, nothing else (spec 10.6.1)
DELTA_ID = "codedelta"
MAX_LEVELS = 65_535
_WORDS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_BIN_LADDER = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
               1536, 2048, 4096, 8192, 16384, 32768, 65000)


def work_dtype(dtype: DType) -> np.dtype:
    """The float type codes are computed in: exact for every lossy dtype."""
    return np.dtype(np.float64 if dtype.name == "F64" else np.float32)


# --- pass 1: the sketch ---------------------------------------------------------------------

_FLOAT_BITS = {4: (np.uint32, 23), 8: (np.uint64, 52)}


@dataclass
class Sketch:
    """Log-bucket histogram of one tensor's magnitudes per sign, plus the counts the plan
    needs. A magnitude's bucket is its float bit pattern shifted right by ``shift`` (exponent
    and top mantissa bits): log-spaced buckets of relative width at most 2·alpha, without the
    per-element logarithm. Sketches of different chunks merge by adding (the paper's parallel
    DDSketch without collapsing)."""

    work: np.dtype
    shift: int
    pos: np.ndarray
    neg: np.ndarray
    totals: np.ndarray  # zeros, non-finite, sum of squares of the finite elements

    @classmethod
    def for_dtype(cls, dtype: DType, alpha: float, bins: int = 1) -> "Sketch":
        """A sketch of relative bucket width <= 2·alpha, refined for many bins (k-means
        cannot place levels closer than the buckets: up to 2^12 buckets per octave)."""
        work = work_dtype(dtype)
        word, mantissa = _FLOAT_BITS[work.itemsize]
        kept = max(math.ceil(math.log2(1 / (2 * alpha))), min(12, bins.bit_length() + 2))
        exponent = 8 * work.itemsize - 1 - mantissa
        kept = min(mantissa, 20 - exponent, max(1, kept))  # at most 2^20 buckets per sign
        shift = mantissa - kept
        size = int(cls._inf_bits(work) >> np.uint64(shift)) + 1
        return cls(work, shift, np.zeros(size, np.int64), np.zeros(size, np.int64),
                   np.zeros(3, np.float64))

    @staticmethod
    def _inf_bits(work: np.dtype) -> np.uint64:
        return np.uint64(np.array(np.inf, work).view(_FLOAT_BITS[work.itemsize][0]))

    def add(self, x: np.ndarray) -> None:
        """Count one chunk (``x`` contiguous, in the work dtype)."""
        word = _FLOAT_BITS[self.work.itemsize][0]
        abs_mask = np.uint64((1 << (8 * self.work.itemsize - 1)) - 1)
        kernels.sketch_words(x, x.view(word), abs_mask, self._inf_bits(self.work),
                             np.uint64(self.shift), self.pos, self.neg, self.totals)

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
        return int(self.pos.sum() + self.neg.sum()) + self.zeros + self.nonfinite

    def _edge(self, index) -> np.ndarray:
        word = _FLOAT_BITS[self.work.itemsize][0]
        bits = (np.asarray(index, np.uint64) << np.uint64(self.shift)).astype(word)
        return bits.view(self.work).astype(np.float64)

    def upper(self, index):
        """Upper edge (exclusive) of the magnitudes in bucket ``index``."""
        return self._edge(np.asarray(index) + 1)

    def lower(self, index):
        return self._edge(index)

    def center(self, index):
        """Representative magnitude of a bucket: the geometric middle of its edges."""
        lo, hi = self.lower(index), self.upper(index)
        return np.where(lo > 0, np.sqrt(lo * hi), hi / 2)


# --- the plan -------------------------------------------------------------------------------

@dataclass
class QuantPlan:
    """Everything the encoder needs for one tensor; ``to_dict`` is what the decoder gets."""

    dtype: DType
    levels: np.ndarray            # sorted level values, in the tensor's dtype
    bits: int
    boundaries: np.ndarray        # float64, len(levels) - 1, in the value domain
    protect_at: float = math.inf  # |x| >= this: escaped
    prune_below: float = 0.0      # |x| < this: zero level
    modulus: int | None = None    # set: codes are stored as cyclic deltas from a base's codes

    @property
    def escape(self) -> int:
        """The code the assignment kernel marks escaped elements with (never stored)."""
        return len(self.levels)

    @property
    def zero_code(self) -> int:
        hits = np.flatnonzero(self.levels.astype(np.float64) == 0)
        return int(hits[0]) if hits.size else self.escape

    def to_dict(self) -> dict:
        return {"id": STAGE_ID, "bits": self.bits, "levels": self.levels.tobytes().hex()}

    def chain(self) -> list[dict]:
        """The codec chain of a tensor encoded with this plan."""
        if self.modulus is None:
            return [self.to_dict()]
        return [{"id": DELTA_ID, "modulus": self.modulus}, self.to_dict()]

    def with_delta(self, base_codes: np.ndarray) -> "QuantPlan":
        """This plan storing codes as cyclic deltas from ``base_codes`` (the previous
        checkpoint's codes of the tensor), with a modulus covering both code ranges."""
        modulus = max(len(self.levels), int(base_codes.max()) + 1 if base_codes.size else 1, 1)
        return replace(self, modulus=modulus, bits=packing_bits(modulus))

    def check_delta(self, modulus) -> "QuantPlan":
        """Validate a ``codedelta`` stage read from a file and attach its modulus."""
        if type(modulus) is not int or not max(1, len(self.levels)) <= modulus <= 65_536:
            raise CorruptError(f"[C-3a] codedelta modulus {modulus!r} is not an integer that "
                               f"covers the {len(self.levels)} levels and is at most 65536")
        if code_bits(modulus) > self.bits:
            raise CorruptError(f"[C-3a] deltas modulo {modulus} need more than {self.bits} "
                               f"bits")
        return replace(self, modulus=modulus)

    @classmethod
    def from_dict(cls, d: dict, dtype: DType) -> "QuantPlan":
        """Validate stage parameters read from a file (decoder side)."""
        if set(d) != {"id", "bits", "levels"} or d["id"] != STAGE_ID:
            raise CorruptError(f"[C-3] bad quant stage parameters {sorted(d)}")
        bits, hexed = d["bits"], d["levels"]
        if type(bits) is not int or not 1 <= bits <= 16:
            raise CorruptError(f"[C-3] quant bits {bits!r} not in [1, 16]")
        # hex digits only: bytes.fromhex alone would skip whitespace
        if (not isinstance(hexed, str) or len(hexed) % (2 * dtype.itemsize)
                or not _HEX.fullmatch(hexed)):
            raise CorruptError("[C-3] quant levels are not a hex string of whole elements")
        if dtype.name not in ("F64", "F32", "F16", "BF16"):
            raise CorruptError(f"[C-3] quant stage on a {dtype.name} tensor")
        levels = np.frombuffer(bytes.fromhex(hexed), dtype.numpy)
        if len(levels) > MAX_LEVELS or code_bits(len(levels)) > bits:
            raise CorruptError(f"[C-3] {len(levels)} levels need more than {bits} bits")
        return cls(dtype, levels, bits, np.empty(0))

    @property
    def streams(self) -> int:
        return 3

    def stream_sizes_ok(self, n: int, sizes: list[int], itemsize: int) -> bool:
        """Codes take ceil(n × bits / 8) bytes; positions 4 bytes and values one element per
        escaped element, at most n of them."""
        codes, positions, values = sizes
        return (codes == codes_size(n, self.bits) and positions % 4 == 0
                and positions // 4 <= n and values == positions // 4 * itemsize)

    def decode_codes(self, packed, n: int, base_codes: np.ndarray | None) -> np.ndarray:
        """The level codes of a chunk of ``n`` elements from its decoded codes stream."""
        stored = np.empty(n, np.uint16)
        unpack_codes(np.frombuffer(packed, np.uint8), self.bits, stored)
        if self.modulus is None:
            return stored
        if base_codes is None or base_codes.shape != (n,):
            raise BaseMismatchError("[B-2] a code delta needs the base tensor's codes")
        if n and (int(stored.max()) >= self.modulus or int(base_codes.max()) >= self.modulus):
            raise CorruptError(f"[D-4a] code delta or base code not below modulus "
                               f"{self.modulus}")
        counts = np.zeros(self.modulus, np.int64)
        delta_kernels.group_counts(base_codes, self.modulus, counts)
        deltas = np.empty(n, np.uint16)
        delta_kernels.ungroup(base_codes, stored, counts, deltas)
        codes = np.empty(n, np.uint16)
        delta_kernels.cyclic_undelta(base_codes, deltas, self.modulus, codes)
        return codes

    def decode(self, chunks: list[tuple], out: np.ndarray,
               base_codes: np.ndarray | None = None) -> np.ndarray:
        """Decode one chunk, given its streams' (coding, payload, decoded size), into ``out``
        (uint8, n × itemsize bytes); ``base_codes`` for a code delta. Returns the codes."""
        itemsize = self.dtype.itemsize
        n = out.size // itemsize
        packed, gaps, values = (entropy.decode(coding, payload, size)
                                for coding, payload, size in chunks)
        word = _WORDS[itemsize]
        words = out.view(word)
        codes = self.decode_codes(packed, n, base_codes)
        positions = np.cumsum(np.frombuffer(gaps, "<u4").astype(np.int64) + 1) - 1
        if self.levels.size:
            bad = kernels.lookup_decode(codes, self.levels.view(word), self.escape,
                                        np.empty(0, word), words)
            if bad < 0:
                raise CorruptError(f"[D-5] quantization code out of range at element "
                                   f"{-1 - bad}")
        elif positions.size != n:
            raise CorruptError("[D-5] a chunk without levels must escape every element")
        if positions.size and positions[-1] >= n:
            raise CorruptError("[D-6] escaped position past the end of its chunk")
        words[positions] = np.frombuffer(values, word)
        return codes


def code_bits(levels: int) -> int:
    """Bits per code for a table of ``levels`` levels (at least 1)."""
    return max(1, (levels - 1).bit_length())


def codes_size(n: int, bits: int) -> int:
    """Bytes of the codes stream of a chunk of ``n`` elements."""
    if bits <= 8:
        return (n * bits + 7) // 8
    return n + (n * (bits - 8) + 7) // 8


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes stream: bit-packed up to 8 bits. Wider codes are split into their top 8 bits, one
    byte each, and their remaining low bits, bit-packed: the byte plane carries the skewed
    part of the distribution where zstd's Huffman stage can code it, the low bits are nearly
    uniform anyway (measured within 0.05 bit/code of the codes' entropy on trained weights)."""
    if bits == 8:
        return codes.astype(np.uint8)
    if bits < 8:
        packed = np.zeros(codes_size(codes.size, bits), np.uint8)
        kernels.pack_bits(codes, bits, packed)
        return packed
    low_bits = bits - 8
    low = np.zeros((codes.size * low_bits + 7) // 8, np.uint8)
    kernels.pack_bits(codes & np.uint16((1 << low_bits) - 1), low_bits, low)
    return np.concatenate([(codes >> low_bits).astype(np.uint8), low])


def unpack_codes(stream: np.ndarray, bits: int, out: np.ndarray) -> None:
    """Inverse of :func:`pack_codes` into ``out`` (uint16, one per element)."""
    n = out.size
    if bits == 8:
        out[:] = stream[:n]
        return
    if bits < 8:
        kernels.unpack_bits(stream, bits, n, out)
        return
    low_bits = bits - 8
    kernels.unpack_bits(stream[n:], low_bits, n, out)
    out |= stream[:n].astype(np.uint16) << np.uint16(low_bits)


def packing_bits(levels: int) -> int:
    """The width the writer packs codes at. Widths that do not divide a byte are widened so
    that codes line up with bytes and zstd's Huffman stage can exploit their skewed
    distribution, which bit-packed codes straddling bytes hide from it: 5-7 bits to 8
    (measured on trained weights: 7 -> 5.8 bits/code at 128 levels, 6 -> 4.9 at 64, 5 -> 4.6
    at 48), 3 bits to 4, two codes a byte (4 levels + pruned zeros: 2.14 -> 1.91 bits/element,
    8 levels: 2.45 -> 2.39, versus 8-bit codes)."""
    bits = code_bits(levels)
    return {3: 4, 5: 8, 6: 8, 7: 8}.get(bits, bits)


# --- fitting --------------------------------------------------------------------------------

def _thresholds(sketch: Sketch, config: QuantConfig) -> tuple[int, int, float, float]:
    """Buckets to fit levels on (indices strictly between lo and hi) and the prune/protect
    magnitudes: the smallest ``prune`` and the largest ``protect`` fraction of the finite
    elements, rounded outward to whole buckets."""
    counts = sketch.pos + sketch.neg
    occupied = np.flatnonzero(counts)  # cumulative counts only change at occupied buckets
    cumulative = np.cumsum(counts[occupied])
    finite = sketch.count - sketch.nonfinite
    lo, prune_below = -1, 0.0
    target = config.prune * finite - sketch.zeros
    if config.prune > 0 and target > 0:
        at = int(np.searchsorted(cumulative, target, side="left"))
        lo = int(occupied[at]) if at < occupied.size else len(counts)
        prune_below = float(sketch.upper(lo))
    hi, protect_at = len(counts) - 1, math.inf  # the last bucket starts at inf: always empty
    target = config.protect * finite
    if config.protect > 0 and target > 0:
        total = cumulative[-1] if occupied.size else 0
        from_top = total - cumulative + counts[occupied]  # elements in this bucket and above
        reached = np.flatnonzero(from_top >= target)
        hi = int(occupied[reached[-1]]) if reached.size else 0
        protect_at = float(sketch.lower(hi))
    return lo, hi, prune_below, protect_at


def _kmeans(points: np.ndarray, weights: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Weighted k-means++ then Lloyd on sorted 1-D points; at most k sorted centroids."""
    if points.size <= k:
        return points.copy()
    uniforms = np.random.default_rng(seed).random(k)
    seeds = np.empty(k, np.float64)
    m = kernels.kmeans_pp_seed(points, weights, k, uniforms, seeds)
    centroids = np.unique(seeds[:m])
    kernels.kmeans_1d(points, weights, centroids, 100, 1e-7)
    return np.unique(centroids)


def _fit_centroids(sketch: Sketch, lo: int, hi: int, config: QuantConfig) -> np.ndarray:
    """Centroids (value domain, float64) of the buckets strictly between lo and hi."""
    pos, neg = sketch.pos[lo + 1:hi], sketch.neg[lo + 1:hi]
    occupied = np.flatnonzero(pos | neg)  # a fine sketch has ~10^5 buckets, few occupied
    centers = sketch.center(occupied + (lo + 1)).astype(np.float64)
    pos, neg = pos[occupied], neg[occupied]
    if config.domain == "linear":
        points = np.concatenate([-centers[::-1][neg[::-1] > 0], centers[pos > 0]])
        freq = np.concatenate([neg[::-1][neg[::-1] > 0], pos[pos > 0]]).astype(np.float64)
        if points.size == 0:
            return points
        weights = (config.sigma * freq / freq.max()
                   + (1 - config.sigma) * np.abs(points) / np.abs(points).max())
        return _kmeans(points, weights, config.bins, config.seed)
    # log domains: each sign on its own, log magnitude, weighted by frequency only
    n_pos, n_neg = int(pos.sum()), int(neg.sum())
    k_pos = config.bins if not n_neg else 0 if not n_pos else min(
        max(1, round(config.bins * n_pos / (n_pos + n_neg))), max(1, config.bins - 1))
    fitted = []
    for sign, counts, k in ((1.0, pos, k_pos), (-1.0, neg, config.bins - k_pos)):
        used = counts > 0
        if k and used.any():
            logs = np.log(centers[used])
            fitted.append(sign * np.exp(_kmeans(logs, counts[used].astype(np.float64), k,
                                                config.seed)))
    return np.sort(np.concatenate(fitted)) if fitted else np.empty(0)


def _boundaries(levels: np.ndarray, domain: str) -> np.ndarray:
    """Decision thresholds between consecutive levels, in the value domain (float64)."""
    a, b = levels[:-1], levels[1:]
    if domain == "linear":
        return (a + b) / 2
    out = np.where(a * b > 0, np.sign(a) * np.sqrt(np.abs(a * b)), 0.0)
    # a negative level next to the zero level: only exact zeros (and -0.0) go to zero
    out[(a < 0) & (b == 0)] = -np.finfo(np.float64).smallest_subnormal
    return out


def plan(sketch: Sketch, config: QuantConfig, dtype: DType, bins: int | None = None,
         zero_level: bool = False) -> QuantPlan:
    """Fit the levels and thresholds of one tensor from its sketch (``zero_level`` forces an
    exact zero level, for pruning decided outside the sketch)."""
    if bins is not None:
        config = replace(config, bins=bins)
    if config.domain == "log" and sketch.neg.any():
        config = replace(config, domain="signed_log")
    if config.domain != "linear" and config.bins == 1 and sketch.pos.any() and sketch.neg.any():
        # one log-domain level keeps one sign only (every value pushed one way); the single
        # linear level, a weighted mean, is the better single value for signed data
        config = replace(config, domain="linear")
    lo, hi, prune_below, protect_at = _thresholds(sketch, config)
    centroids = _fit_centroids(sketch, lo, hi, config) if config.bins else np.empty(0)
    rounded = centroids.astype(dtype.numpy).astype(np.float64)
    rounded = rounded[np.isfinite(rounded) & (rounded != 0)]
    if sketch.zeros or prune_below > 0 or zero_level or not config.bins:
        rounded = np.append(rounded, 0.0)
    values = np.unique(rounded)
    levels = values.astype(dtype.numpy)
    bits = packing_bits(len(levels))
    return QuantPlan(dtype, levels, bits, _boundaries(values, config.domain),
                     protect_at, prune_below)


def estimate_rel_l2(sketch: Sketch, plan_: QuantPlan) -> float:
    """Relative L2 error predicted from the histogram alone (bucket centers stand in for the
    values): cheap, used to skip bin counts that cannot meet a bound."""
    if sketch.sumsq <= 0:
        return 0.0
    pos, neg = np.flatnonzero(sketch.pos), np.flatnonzero(sketch.neg)
    values = np.concatenate([sketch.center(pos), -sketch.center(neg)])
    counts = np.concatenate([sketch.pos[pos], sketch.neg[neg]]).astype(np.float64)
    table = plan_.levels.astype(np.float64)
    if table.size == 0:
        decoded = values.copy()
    else:
        decoded = table[np.searchsorted(plan_.boundaries, values, side="left")]
    decoded = np.where(np.abs(values) >= plan_.protect_at, values, decoded)
    decoded = np.where(np.abs(values) < plan_.prune_below, 0.0, decoded)
    return math.sqrt(float(np.dot(counts, (values - decoded) ** 2)) / sketch.sumsq)


def bin_candidates(config: QuantConfig) -> list[int]:
    """Bin counts tried, fewest first, when a config has an error bound."""
    return [b for b in _BIN_LADDER if b < config.bins] + [config.bins]


# --- pass 2: encoding -----------------------------------------------------------------------

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
        for name in ("count", "sse", "protected", "pruned", "zeroed", "sign_flipped", "nonzero"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.max_abs = max(self.max_abs, other.max_abs)

    def rel_l2(self, sumsq: float) -> float:
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


def assign(plan_: QuantPlan, x: np.ndarray, force: np.ndarray | None = None) -> np.ndarray:
    """Codes of one chunk (``x`` in the work dtype)."""
    codes = np.empty(x.size, np.uint16)
    kernels.assign_codes(x, plan_.boundaries, -plan_.protect_at, plan_.protect_at,
                         -plan_.prune_below, plan_.prune_below, plan_.zero_code, plan_.escape,
                         _NO_FORCE if force is None else force, codes)
    return codes


_NO_FORCE = np.empty(0, np.int8)


def chunk_stats(plan_: QuantPlan, x: np.ndarray, codes: np.ndarray) -> ChunkStats:
    """The error the codes make on ``x`` (escaped elements are exact)."""
    out = np.zeros(7, np.float64)
    kernels.error_stats(x, codes, plan_.levels.astype(np.float64), plan_.escape,
                        plan_.prune_below, out)
    sse, worst, escaped, pruned, zeroed, flipped, nonzero = out
    return ChunkStats(x.size, float(sse), float(worst), int(escaped), int(pruned), int(zeroed),
                      int(flipped), int(nonzero))


def code_delta(base_codes: np.ndarray, codes: np.ndarray, modulus: int) -> np.ndarray:
    """What a code delta stores: (base - codes) mod ``modulus``, regrouped by base code."""
    deltas = np.empty_like(codes)
    delta_kernels.cyclic_delta(base_codes, codes, modulus, deltas)
    counts = np.zeros(modulus, np.int64)
    delta_kernels.group_counts(base_codes, modulus, counts)
    grouped = np.empty_like(codes)
    delta_kernels.regroup(base_codes, deltas, counts, grouped)
    return grouped


def encode_chunk(raw: np.ndarray, plan_: QuantPlan, level: int | None,
                 force: np.ndarray | None = None,
                 base_codes: np.ndarray | None = None) -> tuple[list, ChunkStats, np.ndarray]:
    """Encode one chunk (uint8 view of whole elements): its three streams as
    (coding, payload, decoded size), its error stats, and its codes. With a delta plan the
    codes stream holds (base - codes) mod modulus, regrouped by the base code."""
    dtype = plan_.dtype
    x = raw.view(dtype.numpy).astype(work_dtype(dtype))
    codes = assign(plan_, x, force)
    stats = chunk_stats(plan_, x, codes)
    positions = np.flatnonzero(codes == plan_.escape)
    if positions.size:  # escaped elements keep their nearest level's code: smoother streams
        nearest = np.searchsorted(plan_.boundaries, x[positions], side="left")
        codes[positions] = np.where(np.isfinite(x[positions]), nearest, 0)
        if plan_.levels.size == 0:
            codes[positions] = 0
    stored = codes if plan_.modulus is None else code_delta(base_codes, codes, plan_.modulus)
    packed = pack_codes(stored, plan_.bits)
    gaps = np.diff(positions, prepend=-1) - 1
    gaps = gaps.astype("<u4").view(np.uint8)
    values = raw.view(_WORDS[dtype.itemsize])[positions].view(np.uint8)
    planes = [(*entropy.encode(packed, level), packed.size),
              (*entropy.encode(gaps, level), gaps.size),
              (*entropy.encode(values, level), values.size)]
    return planes, stats, codes
