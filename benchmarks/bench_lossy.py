#!/usr/bin/env python3
"""Rate-distortion benchmark: inshrink's lossy mode vs. quantizers and error-bounded peers.

The tensors of one checkpoint (default ``data/final_fp32.safetensors``) are
split into three sets:

* ``weights``     ``model.*`` tensors with 2 or more dimensions and at least
                  ``--min-elements`` (4096) values;
* ``exp_avg``     every ``*.exp_avg`` tensor (AdamW first moment);
* ``exp_avg_sq``  every ``*.exp_avg_sq`` tensor (AdamW second moment).

Every codec is run on each set at every setting of its sweep.  Per point, over
the whole set: compression ratio (original bytes / compressed bytes), relative
L2 error ``||x - x'||_2 / ||x||_2`` of the concatenated set, max abs error, and:

* exp_avg_sq: the fraction of non-zero values decoded as ``<= 0`` ("flushed")
  and the number of negative decoded values;
* exp_avg: the fraction of non-zero values whose sign flips (``x * x' < 0``)
  and the fraction decoded as exactly zero.

Codecs (all single-threaded, per tensor):

* ``int8+zstd``   symmetric per-tensor int8 (scale = max|x|/127, round to
                  nearest) + zstd-3 on the int8 bytes, + 4 bytes of scale;
* ``int4+zstd``   same with scale = max|x|/7, two values packed per byte;
* ``fp16+zstd``, ``bf16+zstd``  cast (round to nearest) + zstd-3;
* ``sz3``         SZ3 (``pysz``), value-range-relative error bound swept;
* ``zfp-acc``     ZFP (``zfpy``) fixed-accuracy mode, tolerance = t * max|x|
                  of each tensor, t swept;
* ``zfp-prec``    ZFP fixed-precision mode, precision (bits) swept;
* ``inshrink``    ``inshrink.save`` with a uniform ``QuantConfig`` policy,
                  ``bins`` swept (see :func:`inshrink_codec`); the size is the
                  output file's size, container and tensor names included.

Outputs: a markdown table per set, a table of each codec's best measured ratio
with rel L2 <= each target error (no interpolation), a speed table (compress
and decompress MB/s, best of ``--reps``) for inshrink, SZ3 and ZFP at one
setting each, a PNG plot (``--plot``, default ``benchmarks/rd_curve.png``) and,
with ``--json FILE``, every number as JSON.  ``--quick`` runs a reduced sweep.

``--cpu-speed`` instead measures inshrink alone per core: CPU seconds of a one-thread save and
load (best of ``--reps``) of each set and of synthetic 64 MiB tensors at ``--time-bins``, and
the share of a two-thread save's CPU time spent on the calling thread (what bounds the speed-up
on two cores); CPU time, so that other work on the machine disturbs it less than wall time. It
measures a warm process: every kernel compiled, including those a process uses only after
256 numpy fits, rankings or packings (the fit, short-chunk ranking and bit packing).

``--checkpoint-speed`` instead times the whole file as a user saves it: ``inshrink.save(...,
policy="balanced", threads=1)`` and its load against SZ3 at ``--time-sz3`` (rel 1e-3) on every
float32 tensor, CPU seconds, best of ``--reps``, the two interleaved; ours ÷ SZ3 per CPU second.

A codec whose package is missing is skipped with a printed note.
"""

from __future__ import annotations

import os

# SZ3 / ZFP / BLAS: keep every library on one thread.
for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import atexit  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import struct  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import common  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
DATA = os.path.join(HERE, "data")
DEFAULT_FILE = os.path.join(DATA, "final_fp32.safetensors")
DEFAULT_PLOT = os.path.join(HERE, "rd_curve.png")

SETS = ("weights", "exp_avg", "exp_avg_sq")
DOMAIN = {"weights": "linear", "exp_avg": "signed_log", "exp_avg_sq": "log"}
TARGETS = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)

SWEEPS = {
    "full": {
        "sz3": [1e-1, 5e-2, 3e-2, 2e-2, 1e-2, 5e-3, 3e-3, 2e-3, 1e-3, 5e-4, 3e-4,
                2e-4, 1e-4, 3e-5, 1e-5],
        "zfp-acc": [1.0, 5e-1, 3e-1, 2e-1, 1e-1, 5e-2, 3e-2, 2e-2, 1e-2, 5e-3, 3e-3,
                    2e-3, 1e-3, 3e-4, 1e-4, 1e-5, 1e-6],
        "zfp-prec": [4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 16, 18, 20],
        "inshrink": [4, 6, 8, 12, 16, 24, 32, 48, 56, 64, 72, 80, 96, 128, 192, 256, 320, 384,
                     512, 640, 768, 1024, 2048, 4096],
        "inshrink-linear": [4, 8, 16, 24, 32, 48, 56, 64, 72, 80, 96, 128, 192, 256, 320, 384,
                            512, 640, 768, 1024, 2048, 4096],
    },
    "quick": {
        "sz3": [1e-1, 1e-2, 1e-3, 1e-4],
        "zfp-acc": [3e-1, 1e-1, 1e-2, 1e-3, 1e-4],
        "zfp-prec": [6, 10, 14],
        "inshrink": [4, 8, 16, 64, 256, 1024],
        "inshrink-linear": [8, 64, 1024],
    },
}
ALL_CODECS = ("int8+zstd", "int4+zstd", "fp16+zstd", "bf16+zstd",
              "sz3", "zfp-acc", "zfp-prec", "inshrink", "inshrink-linear")

try:
    import ml_dtypes
except ImportError:  # pragma: no cover
    ml_dtypes = None


# --------------------------------------------------------------------------
# safetensors reading (numpy only)
# --------------------------------------------------------------------------

def _dtype_map() -> dict:
    m = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
         "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
         "BOOL": np.bool_}
    if ml_dtypes is not None:
        m["BF16"] = ml_dtypes.bfloat16
    return {k: np.dtype(v) for k, v in m.items()}


DTYPES = _dtype_map()


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
        buf = bytearray(os.path.getsize(path) - 8 - n)
        fh.readinto(buf)
    header.pop("__metadata__", None)
    out = {}
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        dt = DTYPES.get(info["dtype"])
        if dt is None:
            continue
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(buf, dtype=dt, count=(b - a) // dt.itemsize,
                                  offset=a).reshape(info["shape"])
    return out


def split_sets(tensors: dict, min_elements: int) -> dict[str, dict]:
    """name -> (float32 array, original bytes) for each of the three sets."""
    sets = {s: {} for s in SETS}
    for name, a in tensors.items():
        if a.dtype.kind not in "fV" and a.dtype != DTYPES.get("BF16"):
            continue
        if name.endswith(".exp_avg_sq"):
            key = "exp_avg_sq"
        elif name.endswith(".exp_avg"):
            key = "exp_avg"
        elif name.startswith("model.") and a.ndim >= 2 and a.size >= min_elements:
            key = "weights"
        else:
            continue
        if a.size == 0:
            continue
        sets[key][name] = (np.ascontiguousarray(a, dtype=np.float32), a.nbytes)
    return sets


# --------------------------------------------------------------------------
# codecs: compress(arrays) -> list of blobs; size(blobs); decompress(blobs)
# Each codec gets a list of contiguous float32 arrays and a setting.
# --------------------------------------------------------------------------

def _zstd():
    import zstandard
    return zstandard.ZstdCompressor(level=3), zstandard.ZstdDecompressor()


class IntQuant:
    """Symmetric per-tensor uniform quantization + zstd-3."""

    def __init__(self, bits: int):
        self.bits = bits
        self.qmax = 2 ** (bits - 1) - 1  # 127 or 7
        self.zc, self.zd = _zstd()

    def compress(self, arrays, setting=None):
        out = []
        for a in arrays:
            m = float(np.max(np.abs(a)))
            scale = m / self.qmax if m > 0 else 1.0
            q = np.clip(np.rint(a / np.float32(scale)), -self.qmax, self.qmax).astype(np.int8)
            if self.bits == 4:
                u = (q.reshape(-1) & 0xF).astype(np.uint8)
                if u.size % 2:
                    u = np.append(u, np.uint8(0))
                payload = (u[0::2] | (u[1::2] << 4)).astype(np.uint8)
            else:
                payload = q
            out.append((struct.pack("<f", scale), self.zc.compress(payload.tobytes())))
        return out

    @staticmethod
    def size(blobs):
        return sum(len(s) + len(z) for s, z in blobs)

    def decompress(self, blobs, arrays):
        out = []
        for (s, z), a in zip(blobs, arrays):
            (scale,) = struct.unpack("<f", s)
            raw = np.frombuffer(self.zd.decompress(z), dtype=np.uint8)
            if self.bits == 4:
                nib = np.empty(raw.size * 2, dtype=np.uint8)
                nib[0::2] = raw & 0xF
                nib[1::2] = raw >> 4
                q = nib[:a.size].astype(np.int8)
                q = np.where(q > 7, q - 16, q).astype(np.int8)
            else:
                q = raw.view(np.int8)
            out.append((q.astype(np.float32) * np.float32(scale)).reshape(a.shape))
        return out


class CastZstd:
    def __init__(self, dtype):
        self.dtype = np.dtype(dtype)
        self.zc, self.zd = _zstd()

    def compress(self, arrays, setting=None):
        return [self.zc.compress(a.astype(self.dtype).tobytes()) for a in arrays]

    @staticmethod
    def size(blobs):
        return sum(len(b) for b in blobs)

    def decompress(self, blobs, arrays):
        return [np.frombuffer(self.zd.decompress(b), dtype=self.dtype)
                .astype(np.float32).reshape(a.shape) for b, a in zip(blobs, arrays)]


class SZ3:
    """pysz: sz.compress(arr, szConfig) with errorBoundMode=REL (value range relative)."""

    def __init__(self):
        import pysz
        self.pysz = pysz

    def compress(self, arrays, rel):
        p = self.pysz
        out = []
        for a in arrays:
            cfg = p.szConfig(a.shape)
            cfg.errorBoundMode = p.szErrorBoundMode.REL
            cfg.relErrorBound = float(rel)
            cfg.openmp = False
            blob, _ = p.sz.compress(a, cfg)
            out.append(blob)
        return out

    @staticmethod
    def size(blobs):
        return sum(b.nbytes for b in blobs)

    def decompress(self, blobs, arrays):
        return [self.pysz.sz.decompress(b, np.float32, a.shape)[0]
                for b, a in zip(blobs, arrays)]


class ZFP:
    """zfpy.compress_numpy in fixed-accuracy (tolerance = t * max|x|) or fixed-precision mode."""

    def __init__(self, mode: str):
        import zfpy
        self.zfpy = zfpy
        self.mode = mode

    @staticmethod
    def _shape(a):
        # zfp handles 1-4 dimensions; fold leading dims beyond 4
        return a.reshape((-1,) + a.shape[-3:]) if a.ndim > 4 else a

    def compress(self, arrays, setting):
        z = self.zfpy
        out = []
        for a in arrays:
            if self.mode == "acc":
                m = float(np.max(np.abs(a)))
                tol = float(setting) * m if m > 0 else 1e-30
                out.append(z.compress_numpy(self._shape(a), tolerance=tol))
            else:
                out.append(z.compress_numpy(self._shape(a), precision=int(setting)))
        return out

    @staticmethod
    def size(blobs):
        return sum(len(b) for b in blobs)

    def decompress(self, blobs, arrays):
        return [self.zfpy.decompress_numpy(b).reshape(a.shape) for b, a in zip(blobs, arrays)]


# --------------------------------------------------------------------------
# inshrink
# --------------------------------------------------------------------------

def import_inshrink():
    return common.import_inshrink(("save", "load", "QuantConfig", "Policy"))


tmp_root = common.tmp_root


_TMPDIR = None


def _tmp_path() -> str:
    global _TMPDIR
    if _TMPDIR is None:
        _TMPDIR = tempfile.mkdtemp(prefix="inshrink-lossy-", dir=tmp_root())
        atexit.register(shutil.rmtree, _TMPDIR, True)
    return os.path.join(_TMPDIR, "x.ink")


def _inshrink_save(tmp_path: str, tensors: dict, setting, domain: str) -> int:
    import inshrink
    cfg = inshrink.QuantConfig(bins=setting, prune=0.0, protect=0.0005, domain=domain)
    inshrink.save(tmp_path, tensors, policy=inshrink.Policy.uniform(cfg), threads=1)
    return os.path.getsize(tmp_path)


def _inshrink_load(tmp_path: str) -> dict:
    import inshrink
    return inshrink.load(tmp_path, threads=1)


def inshrink_codec(tensors: dict, setting, domain: str = "linear"):
    """Compress ``tensors`` with inshrink's lossy mode; return (compressed bytes, decoded dict).

    ``setting`` is ``QuantConfig.bins``; ``domain`` is "linear" (weights),
    "signed_log" (exp_avg) or "log" (exp_avg_sq).  The size is the .ink file's
    size.  Raises ImportError/AttributeError when the lossy API is not available.
    """
    tmp_path = _tmp_path()
    size = _inshrink_save(tmp_path, tensors, setting, domain)
    return size, _inshrink_load(tmp_path)


class Inshrink:
    """inshrink_codec split in its two halves, so that each can be timed."""

    def __init__(self, domain: str):
        self.domain = domain
        self.names = None

    def compress(self, arrays, bins):
        return _inshrink_save(_tmp_path(), dict(zip(self.names, arrays)), bins, self.domain)

    @staticmethod
    def size(blobs):
        return blobs

    def decompress(self, blobs, arrays):
        d = _inshrink_load(_tmp_path())
        return [np.asarray(d[n], dtype=np.float32).reshape(a.shape)
                for n, a in zip(self.names, arrays)]


# --------------------------------------------------------------------------
# error metrics
# --------------------------------------------------------------------------

def metrics(set_name: str, arrays, decoded) -> dict:
    se = sx = 0.0
    maxabs = 0.0
    nz = flushed = negatives = flips = zeroed = 0
    finite = True
    for a, d in zip(arrays, decoded):
        d = np.asarray(d, dtype=np.float32).reshape(a.shape)
        if not np.all(np.isfinite(d)):
            finite = False
        diff = a.astype(np.float64) - d.astype(np.float64)
        se += float(np.dot(diff.ravel(), diff.ravel()))
        x64 = a.astype(np.float64).ravel()
        sx += float(np.dot(x64, x64))
        maxabs = max(maxabs, float(np.max(np.abs(diff))) if diff.size else 0.0)
        nzm = a != 0
        nz += int(nzm.sum())
        if set_name == "exp_avg_sq":
            flushed += int((nzm & (d <= 0)).sum())
            negatives += int((d < 0).sum())
        elif set_name == "exp_avg":
            flips += int((nzm & (np.sign(a) * np.sign(d) < 0)).sum())
            zeroed += int((nzm & (d == 0)).sum())
    out = dict(rel_l2=math.sqrt(se / sx) if sx > 0 else float("nan"),
               max_abs=maxabs, finite=finite)
    if set_name == "exp_avg_sq":
        out.update(flushed=flushed / nz if nz else 0.0, negatives=negatives)
    elif set_name == "exp_avg":
        out.update(sign_flips=flips / nz if nz else 0.0, zeroed=zeroed / nz if nz else 0.0)
    return out


# --------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------

def make_codecs(wanted, notes):
    """codec name -> (factory(set_name) -> codec object, list of settings, label fn)."""
    out = {}

    def add(name, factory, settings, label):
        out[name] = (factory, settings, label)

    if "int8+zstd" in wanted:
        add("int8+zstd", lambda s: IntQuant(8), [None], lambda v: "scale=max/127")
    if "int4+zstd" in wanted:
        add("int4+zstd", lambda s: IntQuant(4), [None], lambda v: "scale=max/7")
    if "fp16+zstd" in wanted:
        add("fp16+zstd", lambda s: CastZstd(np.float16), [None], lambda v: "round")
    if "bf16+zstd" in wanted:
        if ml_dtypes is None:
            notes.append("bf16+zstd skipped: ml_dtypes is not installed")
        else:
            add("bf16+zstd", lambda s: CastZstd(ml_dtypes.bfloat16), [None], lambda v: "round")
    return out


def sweep_codecs(wanted, sweep, notes):
    codecs = make_codecs(wanted, notes)
    if "sz3" in wanted:
        try:
            import pysz  # noqa: F401
            codecs["sz3"] = (lambda s: SZ3(), sweep["sz3"], lambda v: f"rel={v:g}")
        except ImportError as e:
            notes.append(f"sz3 skipped: pysz not importable ({e})")
    for mode, key, lab in (("acc", "zfp-acc", lambda v: f"tol={v:g}*max"),
                           ("prec", "zfp-prec", lambda v: f"prec={v}")):
        if key in wanted:
            try:
                import zfpy  # noqa: F401
                codecs[key] = ((lambda m: (lambda s: ZFP(m)))(mode), sweep[key], lab)
            except ImportError as e:
                notes.append(f"{key} skipped: zfpy not importable ({e})")
    if "inshrink" in wanted:
        ins, err = import_inshrink()
        if ins is None:
            notes.append(f"inshrink skipped: {err}")
        else:
            codecs["inshrink"] = (lambda s: Inshrink(DOMAIN[s]), sweep["inshrink"],
                                  lambda v: f"bins={v}")
    if "inshrink-linear" in wanted and "inshrink" in codecs:
        # the same codec with levels fitted in the value domain for every set: the L2-optimal
        # choice, whereas the default log domains for moments target training behaviour
        codecs["inshrink-linear"] = (lambda s: Inshrink("linear"), sweep["inshrink-linear"],
                                     lambda v: f"bins={v} linear")
    return codecs


def run_point(codec, set_name, names, arrays, orig_bytes, setting):
    if isinstance(codec, Inshrink):
        codec.names = names
    t0 = time.perf_counter()
    blobs = codec.compress(arrays, setting)
    t1 = time.perf_counter()
    size = codec.size(blobs)
    decoded = codec.decompress(blobs, arrays)
    t2 = time.perf_counter()
    m = metrics(set_name, arrays, decoded)
    n = sum(a.size for a in arrays)
    return dict(compressed_bytes=int(size), ratio=orig_bytes / size,
                bits_per_value=8.0 * size / n, compress_s=t1 - t0, decompress_s=t2 - t1, **m)


def time_codec(codec, names, arrays, setting, reps):
    """Best-of-reps wall seconds for compress and decompress of the whole set."""
    if isinstance(codec, Inshrink):
        codec.names = names
    bc = bd = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        blobs = codec.compress(arrays, setting)
        t1 = time.perf_counter()
        codec.decompress(blobs, arrays)
        t2 = time.perf_counter()
        bc, bd = min(bc, t1 - t0), min(bd, t2 - t1)
    return bc, bd


# --------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------

def md_table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def fmt(x, spec=".3g"):
    if x is None:
        return "-"
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return format(x, spec)


def print_set_table(set_name, info, points):
    print(f"\n### {set_name}: {info['tensors']} tensors, {info['values']:,} values, "
          f"{info['bytes'] / 1e6:.1f} MB\n")
    header = ["codec", "setting", "ratio", "bits/value", "rel L2", "max abs err"]
    if set_name == "exp_avg_sq":
        header += ["flushed (<=0)", "negatives"]
    elif set_name == "exp_avg":
        header += ["sign flips", "zeroed"]
    rows = []
    for p in points:
        r = [p["codec"], p["setting"], f"{p['ratio']:.2f}", f"{p['bits_per_value']:.2f}",
             fmt(p["rel_l2"]), fmt(p["max_abs"])]
        if set_name == "exp_avg_sq":
            r += [f"{p['flushed']:.2%}", f"{p['negatives']:,}"]
        elif set_name == "exp_avg":
            r += [f"{p['sign_flips']:.3%}", f"{p['zeroed']:.3%}"]
        if not p["finite"]:
            r[1] += " (non-finite output)"
        rows.append(r)
    print(md_table(header, rows))


def best_at_targets(points, codecs, sets):
    """set -> codec -> target -> best measured point with rel L2 <= target (or None)."""
    best = {}
    for s in sets:
        best[s] = {}
        for c in codecs:
            best[s][c] = {}
            pts = [p for p in points if p["set"] == s and p["codec"] == c and p["finite"]]
            for t in TARGETS:
                ok = [p for p in pts if p["rel_l2"] <= t]
                best[s][c][t] = max(ok, key=lambda p: p["ratio"]) if ok else None
    return best


def print_best(best):
    print("\n## Best measured ratio with rel L2 <= target (no interpolation)")
    for s, per_codec in best.items():
        print(f"\n### {s}\n")
        rows = []
        for c, per_t in per_codec.items():
            rows.append([c] + [f"{p['ratio']:.2f} ({p['setting']}){_damage(p)}" if p else "-"
                               for p in per_t.values()])
        print(md_table(["codec"] + [f"<= {t:g}" for t in TARGETS], rows))
    print("\n[...] marks a point that flushes (exp_avg_sq: non-zero -> <= 0), flips the "
          "sign of, or zeroes (exp_avg) at least 1 % of the non-zero values.")


def _damage(p) -> str:
    bad = [f"{p[k]:.0%} {lab}" for k, lab in (("flushed", "flushed"), ("sign_flips", "flipped"),
                                              ("zeroed", "zeroed")) if p.get(k, 0) >= 0.01]
    return f" [{', '.join(bad)}]" if bad else ""


def plot(points, sets, codecs, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError as e:
        print(f"NOTE: no plot written: matplotlib not importable ({e})")
        return False
    fig, axes = plt.subplots(1, len(sets), figsize=(6 * len(sets), 4.8), squeeze=False)
    markers = "os^vD<>px*h"
    for ax, s in zip(axes[0], sets):
        for i, c in enumerate(codecs):
            pts = sorted((p for p in points if p["set"] == s and p["codec"] == c
                          and p["finite"] and p["rel_l2"] > 0), key=lambda p: p["rel_l2"])
            if not pts:
                continue
            ax.plot([p["rel_l2"] for p in pts], [p["ratio"] for p in pts],
                    marker=markers[i % len(markers)], ms=5, lw=1.3, label=c)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(
            lambda v, _: f"{v:g}" if f"{v:.1g}"[0] in "25" else ""))
        ax.set_xlabel("relative L2 error  ||x - x'|| / ||x||")
        ax.set_ylabel("compression ratio")
        ax.set_title(s)
        for t in TARGETS:
            ax.axvline(t, color="0.85", lw=0.8, zorder=0)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# --------------------------------------------------------------------------

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", nargs="?", default=DEFAULT_FILE,
                    help="safetensors checkpoint (default: data/final_fp32.safetensors)")
    ap.add_argument("--quick", action="store_true", help="reduced sweeps")
    ap.add_argument("--codecs", default=",".join(ALL_CODECS),
                    help=f"comma-separated subset of {','.join(ALL_CODECS)}")
    ap.add_argument("--sets", default=",".join(SETS), help="comma-separated subset of sets")
    ap.add_argument("--min-elements", type=int, default=4096,
                    help="smallest weight tensor included in the weights set")
    ap.add_argument("--json", metavar="FILE", help="write every number as JSON")
    ap.add_argument("--plot", metavar="PNG", default=DEFAULT_PLOT,
                    help="rate-distortion plot path (default benchmarks/rd_curve.png)")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--no-timing", action="store_true", help="skip the speed table")
    ap.add_argument("--reps", type=int, default=3, help="timing repetitions (best is kept)")
    ap.add_argument("--cpu-speed", action="store_true",
                    help="only inshrink's per-core speed (CPU seconds) and two-thread share")
    ap.add_argument("--checkpoint-speed", action="store_true",
                    help="only a balanced save and load of the whole file against SZ3 at "
                         "--time-sz3 on its float32 tensors, MB per CPU second, one thread")
    ap.add_argument("--time-bins", type=int, default=16, help="inshrink setting timed")
    ap.add_argument("--time-sz3", type=float, default=1e-3, help="SZ3 rel bound timed")
    ap.add_argument("--time-zfp", type=float, default=1e-2,
                    help="ZFP tolerance (x max|x|) timed")
    ap.add_argument("--tmpdir", help="directory for inshrink's temp files "
                                     "(default /dev/shm when writable)")
    return ap.parse_args(argv)


def _cpu_seconds(fn, reps):
    best = float("inf")
    for _ in range(reps):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def cpu_speed(sets, sets_wanted, bins, reps):
    """Rows of inshrink's per-core encode/decode speed and two-thread serial share."""
    import inshrink
    rng = np.random.default_rng(0)
    n = 16 << 20
    m = rng.standard_normal(n, dtype=np.float32) * np.float32(1e-4)
    weight = rng.standard_normal(n, dtype=np.float32) * np.float32(0.02)
    cases = [(s, {k: a for k, (a, _) in sets[s].items()}, DOMAIN[s]) for s in sets_wanted]
    cases += [("64 MiB weight", {"model.w.weight": weight.reshape(4096, 4096)}, "linear"),
              ("64 MiB exp_avg + exp_avg_sq (default roles)",
               {"optimizer.state.0.exp_avg": m.reshape(4096, 4096),
                "optimizer.state.0.exp_avg_sq": (m * m + np.float32(1e-12)).reshape(4096, 4096)},
               None)]
    # The steady state of a process that has saved before: its first 256 fits, rankings of
    # short chunks and packings of small ones use numpy (inshrink/codecs/quantize.py and
    # quant.py) unless those kernels are compiled, and a set of 19 tensors saved a few times
    # does not get there. Compiled (or loaded) here.
    from inshrink.kernels import quant as quant_kernels
    for name in ("fit_points", "rank_chunk", "pack_bits", "unpack_bits"):
        if hasattr(quant_kernels, name):
            getattr(quant_kernels, name).compiled()
    rows = []
    path = _tmp_path()
    for name, tensors, domain in cases:
        nbytes = sum(a.nbytes for a in tensors.values())
        policy = inshrink.Policy.uniform(inshrink.QuantConfig(bins=bins, prune=0.0,
                                                              protect=0.0005, domain=domain))
        save = lambda threads: inshrink.save(path, tensors, policy=policy,  # noqa: E731
                                             threads=threads)
        save(1)
        inshrink.load(path, threads=1)  # warm-up: kernels compiled or loaded
        encode = _cpu_seconds(lambda: save(1), reps)
        decode = _cpu_seconds(lambda: inshrink.load(path, threads=1), reps)
        share = 1.0
        for _ in range(reps):
            cpu, own = time.process_time(), time.thread_time()
            save(2)
            share = min(share, (time.thread_time() - own) / (time.process_time() - cpu))
        rows.append(dict(case=name, MB=nbytes / 1e6, ratio=nbytes / os.path.getsize(path),
                         encode_MB_per_cpu_s=nbytes / 1e6 / encode,
                         decode_MB_per_cpu_s=nbytes / 1e6 / decode, calling_thread_share=share,
                         two_core_bound=1 / (share + (1 - share) / 2)))
    return rows


def checkpoint_speed(tensors: dict, rel: float, reps: int) -> dict:
    """A ``balanced`` save (and load) of the whole checkpoint against SZ3 at ``rel`` on its
    float32 tensors, one thread each, interleaved: MB per CPU second (best of ``reps``) and
    the bytes each stores. inshrink's save also covers what it keeps lossless (norms, biases,
    step counters); SZ3 compresses every float32 tensor, each as one array."""
    import inshrink
    path = _tmp_path()
    floats = [np.atleast_1d(a) for a in tensors.values() if a.dtype == np.float32 and a.size]
    sz3 = SZ3()

    def save():
        inshrink.save(path, tensors, policy="balanced", threads=1)

    def load():
        inshrink.load(path, threads=1)

    blobs = sz3.compress(floats, rel)  # warm-ups: kernels compiled or loaded, pages touched
    sz3.decompress(blobs, floats)
    save()
    load()
    best = dict.fromkeys(("save", "load", "sz3_compress", "sz3_decompress"), math.inf)
    for _ in range(reps):  # interleaved: both codecs see the same machine load
        for key, fn in (("save", save), ("sz3_compress", lambda: sz3.compress(floats, rel)),
                        ("load", load), ("sz3_decompress", lambda: sz3.decompress(blobs, floats))):
            best[key] = min(best[key], _cpu_seconds(fn, 1))
    ours, theirs = sum(a.nbytes for a in tensors.values()), sum(a.nbytes for a in floats)
    return dict(tensors=len(tensors), bytes=ours, sz3_tensors=len(floats), sz3_bytes=theirs,
                stored=os.path.getsize(path), sz3_stored=sz3.size(blobs),
                **{f"{k}_MB_per_cpu_s": (ours if k in ("save", "load") else theirs) / 1e6 / v
                   for k, v in best.items()})


def cpu_note():
    try:
        import psutil
        busy = psutil.cpu_percent(interval=1.0)
        n = psutil.cpu_count()
        s = f"CPU busy during the last second: {busy:.0f}% of {n} cores"
        if busy > 100.0 / max(n, 1) * 0.5:
            s += " (WARNING: other processes are using the CPU; speeds may be low)"
        return s
    except Exception:  # psutil missing or unsupported
        return None


def main(argv=None) -> int:
    args = parse_args(argv)
    global _TMPDIR
    if args.tmpdir:
        os.makedirs(args.tmpdir, exist_ok=True)
        _TMPDIR = tempfile.mkdtemp(prefix="inshrink-lossy-", dir=args.tmpdir)
        atexit.register(shutil.rmtree, _TMPDIR, True)
    wanted = [c.strip() for c in args.codecs.split(",") if c.strip()]
    bad = [c for c in wanted if c not in ALL_CODECS]
    if bad:
        print(f"unknown codec(s): {', '.join(bad)}", file=sys.stderr)
        return 2
    sets_wanted = [s.strip() for s in args.sets.split(",") if s.strip()]
    if any(s not in SETS for s in sets_wanted):
        print(f"unknown set; choose from {', '.join(SETS)}", file=sys.stderr)
        return 2
    sweep = SWEEPS["quick" if args.quick else "full"]

    t_start = time.perf_counter()
    note = cpu_note()
    if note:
        print(note)
    notes = []
    codecs = sweep_codecs(wanted, sweep, notes)
    for n in notes:
        print(f"NOTE: {n}")

    tensors = read_safetensors(args.file)
    sets = split_sets(tensors, args.min_elements)
    set_info = {}
    for s in sets_wanted:
        vals = sets[s]
        set_info[s] = dict(tensors=len(vals), values=sum(a.size for a, _ in vals.values()),
                           bytes=sum(b for _, b in vals.values()))
    if args.checkpoint_speed:
        try:
            import pysz  # noqa: F401
        except ImportError as e:
            print(f"--checkpoint-speed compares with SZ3: pysz is not importable ({e}); "
                  f"pip install pysz", file=sys.stderr)
            return 2
        r = checkpoint_speed(tensors, args.time_sz3, args.reps)
        print(f"\n## The whole checkpoint, one thread: inshrink balanced against SZ3 rel="
              f"{args.time_sz3:g} (MB per CPU second, best of {args.reps}, interleaved; load "
              f"average {os.getloadavg()[0]:.1f})\n")
        print(md_table(
            ["codec", "tensors", "MB", "ratio", "compress MB/CPU-s", "decompress MB/CPU-s"],
            [["inshrink balanced", r["tensors"], f"{r['bytes'] / 1e6:.1f}",
              f"{r['bytes'] / r['stored']:.2f}", f"{r['save_MB_per_cpu_s']:.0f}",
              f"{r['load_MB_per_cpu_s']:.0f}"],
             [f"SZ3 rel={args.time_sz3:g}", r["sz3_tensors"], f"{r['sz3_bytes'] / 1e6:.1f}",
              f"{r['sz3_bytes'] / r['sz3_stored']:.2f}", f"{r['sz3_compress_MB_per_cpu_s']:.0f}",
              f"{r['sz3_decompress_MB_per_cpu_s']:.0f}"],
             ["inshrink ÷ SZ3", "", "", "",
              f"{r['save_MB_per_cpu_s'] / r['sz3_compress_MB_per_cpu_s']:.2f}",
              f"{r['load_MB_per_cpu_s'] / r['sz3_decompress_MB_per_cpu_s']:.2f}"]]))
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(dict(file=os.path.abspath(args.file), checkpoint_speed=r), fh, indent=1)
        return 0
    if args.cpu_speed:
        rows = cpu_speed(sets, sets_wanted, args.time_bins, args.reps)
        print(f"\n## inshrink per core, bins={args.time_bins} (MB per CPU second, best of "
              f"{args.reps}; load average {os.getloadavg()[0]:.1f})\n")
        print(md_table(["case", "MB", "ratio", "encode MB/CPU-s", "decode MB/CPU-s",
                        "calling thread at 2 threads", "2-core speed-up bound"],
                       [[r["case"], f"{r['MB']:.1f}", f"{r['ratio']:.2f}",
                         f"{r['encode_MB_per_cpu_s']:.0f}", f"{r['decode_MB_per_cpu_s']:.0f}",
                         f"{r['calling_thread_share']:.2f}", f"{r['two_core_bound']:.2f}"]
                        for r in rows]))
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(dict(file=os.path.abspath(args.file), cpu_speed=rows), fh, indent=1)
        return 0
    print(f"\n# Lossy rate-distortion: {os.path.relpath(args.file)}"
          f"{' (--quick)' if args.quick else ''}")

    points = []
    for s in sets_wanted:
        names = list(sets[s])
        if not names:
            print(f"NOTE: set {s} is empty in this file; skipped")
            continue
        arrays = [sets[s][n][0] for n in names]
        orig = set_info[s]["bytes"]
        for cname, (factory, settings, label) in list(codecs.items()):
            codec = factory(s)
            for v in settings:
                try:
                    p = run_point(codec, s, names, arrays, orig, v)
                except (ImportError, AttributeError) as e:
                    if cname != "inshrink":
                        raise
                    msg = f"inshrink skipped: lossy API not available ({type(e).__name__}: {e})"
                    print(f"NOTE: {msg}")
                    notes.append(msg)
                    del codecs[cname]
                    break
                except Exception as e:  # a codec failing on some input
                    msg = f"{cname} {label(v)} failed on {s}: {type(e).__name__}: {e}"
                    print(f"NOTE: {msg}")
                    notes.append(msg)
                    continue
                p.update(set=s, codec=cname, setting=label(v), param=v)
                points.append(p)
        print_set_table(s, set_info[s], [p for p in points if p["set"] == s])

    codec_names = list(codecs)
    best = best_at_targets(points, codec_names, [s for s in sets_wanted if sets[s]])
    print_best(best)

    timing = []
    if not args.no_timing:
        timed = [("inshrink", args.time_bins, lambda v: f"bins={v}"),
                 ("sz3", args.time_sz3, lambda v: f"rel={v:g}"),
                 ("zfp-acc", args.time_zfp, lambda v: f"tol={v:g}*max")]
        rows = []
        for s in sets_wanted:
            names = list(sets[s])
            if not names:
                continue
            arrays = [sets[s][n][0] for n in names]
            orig = set_info[s]["bytes"]
            per = {}
            for cname, v, lab in timed:
                if cname not in codecs:
                    continue
                codec = codecs[cname][0](s)
                try:
                    p = run_point(codec, s, names, arrays, orig, v)  # also a warm-up
                    tc, td = time_codec(codec, names, arrays, v, args.reps)
                except Exception as e:
                    print(f"NOTE: timing {cname} on {s} failed: {type(e).__name__}: {e}")
                    continue
                rec = dict(set=s, codec=cname, setting=lab(v), ratio=p["ratio"],
                           rel_l2=p["rel_l2"], compress_MBps=orig / 1e6 / tc,
                           decompress_MBps=orig / 1e6 / td)
                per[cname] = rec
                timing.append(rec)
                rows.append([s, cname, rec["setting"], f"{rec['ratio']:.2f}", fmt(rec["rel_l2"]),
                             f"{rec['compress_MBps']:.0f}", f"{rec['decompress_MBps']:.0f}"])
            ins = per.get("inshrink")
            for peer in ("sz3", "zfp-acc"):
                if ins and peer in per:
                    ins[f"compress_vs_{peer}"] = ins["compress_MBps"] / per[peer]["compress_MBps"]
                    ins[f"decompress_vs_{peer}"] = (ins["decompress_MBps"]
                                                    / per[peer]["decompress_MBps"])
        print(f"\n## Speed, single thread (MB = 1e6 original bytes, best of {args.reps})\n")
        if rows:
            print(md_table(["set", "codec", "setting", "ratio", "rel L2", "compress MB/s",
                            "decompress MB/s"], rows))
        else:
            print("(none of inshrink, sz3, zfp-acc was run)")
        ratio_rows = [[t["set"], peer, fmt(t[f"compress_vs_{peer}"], ".2f"),
                       fmt(t[f"decompress_vs_{peer}"], ".2f")]
                      for t in timing if t["codec"] == "inshrink"
                      for peer in ("sz3", "zfp-acc") if f"compress_vs_{peer}" in t]
        if ratio_rows:
            print("\ninshrink speed / peer speed (>1: inshrink faster):\n")
            print(md_table(["set", "peer", "compress", "decompress"], ratio_rows))
        elif "inshrink" not in codecs:
            print("\n(no inshrink/peer speed ratios: inshrink was not run)")

    if not args.no_plot and points:
        if plot(points, [s for s in sets_wanted if sets[s]], codec_names, args.plot):
            print(f"\nplot: {args.plot}")

    elapsed = time.perf_counter() - t_start
    print(f"\ntotal time: {elapsed:.1f} s")
    for n in notes:
        print(f"NOTE: {n}")

    if args.json:
        out = dict(file=os.path.abspath(args.file), quick=args.quick, sets=set_info,
                   domains=DOMAIN, targets=list(TARGETS), points=points,
                   best={s: {c: {str(t): (None if p is None else
                                          dict(ratio=p["ratio"], rel_l2=p["rel_l2"],
                                               setting=p["setting"]))
                                 for t, p in per_t.items()}
                             for c, per_t in per_c.items()}
                         for s, per_c in best.items()},
                   timing=timing, notes=notes, seconds=elapsed,
                   env=dict(python=platform.python_version(), numpy=np.__version__,
                            machine=platform.machine(), cpu_count=os.cpu_count()))
        d = os.path.dirname(os.path.abspath(args.json))
        os.makedirs(d, exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1, default=float)
        print(f"json: {args.json}")

    if _TMPDIR is not None:
        shutil.rmtree(_TMPDIR, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
