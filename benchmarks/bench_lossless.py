#!/usr/bin/env python3
"""Lossless benchmark: inshrink vs. general-purpose and float-aware codecs.

Default mode
    For every safetensors file given (default: the ``final_*`` checkpoints
    written by ``train.py``) all tensors are read as raw bytes and compressed
    single-threaded by each codec, in one run, side by side:

    * ``inshrink``   ``inshrink.save(path, tensors, threads=1)`` /
                     ``inshrink.load(path, threads=1)`` on a temp file
                     (``/dev/shm`` when available); size = output file size.
    * ``zstd-1``, ``zstd-3``  python ``zstandard``, one frame per tensor.
    * ``zipnn``      ``zipnn.ZipNN(input_format="byte",
                     bytearray_dtype=<float32|bfloat16|float16>, threads=1)``,
                     one call per tensor.
    * ``blosc2``     byte shuffle + zstd, ``typesize`` = itemsize,
                     ``nthreads=1``, one chunk per tensor.
    * ``pcodec``     ``pcodec.standalone.simple_compress`` per tensor; bf16 is
                     not supported by pcodec and is compressed as its uint16
                     bit pattern.

    Reported per codec: ratio (original bytes / compressed bytes), compress
    and decompress MB/s (MB = 1e6 bytes of *original* data, best of
    ``--reps`` rounds; in each round every codec runs once, one after
    another, so load changes on a shared machine hit all codecs alike),
    CPU-time / wall-time (a value clearly above 1 means the codec used more
    than one thread) and whether the roundtrip is bit-exact.  A second table
    gives inshrink's speed relative to every peer (inshrink MB/s / peer MB/s),
    the same per core (the least CPU time of any round, peer / inshrink: on a
    busy machine the wall time also counts the time spent waiting for a core)
    and the peer's size relative to inshrink's.

``--threads-scaling FILE``
    Times ``inshrink.save`` / ``inshrink.load`` on FILE with threads=1 and
    threads=2 (``--threads-list``) and prints the speed-ups, cpu/wall, CPU times (the
    whole process and the calling thread), each save's minor page faults, how long the
    encoder threads were off the CPU during a save (waiting for work, the GIL, a lock, or a
    busy core) and the save's CPU relative to the first thread count; with ``--policy balanced`` (any
    preset) the saves are lossy.

``--memory FILE``
    Runs ``python -m inshrink compress FILE -o X`` and
    ``python -m inshrink decompress X -o Y.safetensors`` as subprocesses and
    reports their peak RSS next to the size of the largest tensor in FILE.

Peers that are not installed are skipped with a printed note; if inshrink is
not importable the peers are still benchmarked.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

import common

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
DATA = os.path.join(HERE, "data")
DEFAULT_FILES = [os.path.join(DATA, f) for f in
                 ("final_bf16.safetensors", "final_fp32.safetensors",
                  "final_weights_fp32.safetensors")]

try:
    import ml_dtypes  # bfloat16 / fp8 dtypes for numpy
except ImportError:  # pragma: no cover
    ml_dtypes = None


# --------------------------------------------------------------------------
# safetensors reading (no torch needed)
# --------------------------------------------------------------------------

def _dtype_map() -> dict[str, np.dtype]:
    m = {
        "F64": np.dtype(np.float64), "F32": np.dtype(np.float32),
        "F16": np.dtype(np.float16), "I64": np.dtype(np.int64),
        "I32": np.dtype(np.int32), "I16": np.dtype(np.int16),
        "I8": np.dtype(np.int8), "U64": np.dtype(np.uint64),
        "U32": np.dtype(np.uint32), "U16": np.dtype(np.uint16),
        "U8": np.dtype(np.uint8), "BOOL": np.dtype(np.bool_),
    }
    if ml_dtypes is not None:
        m["BF16"] = np.dtype(ml_dtypes.bfloat16)
        m["F8_E4M3"] = np.dtype(ml_dtypes.float8_e4m3fn)
        m["F8_E5M2"] = np.dtype(ml_dtypes.float8_e5m2)
    return m


DTYPES = _dtype_map()


def read_safetensors(path: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """All tensors of a safetensors file as numpy arrays (in file order)."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
        buf = bytearray(os.path.getsize(path) - 8 - n)
        fh.readinto(buf)
    meta = header.pop("__metadata__", None) or {}
    out = {}
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        dt = DTYPES.get(info["dtype"])
        if dt is None:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {info['dtype']}")
        a, b = info["data_offsets"]
        arr = np.frombuffer(buf, dtype=dt, count=(b - a) // dt.itemsize, offset=a)
        out[name] = arr.reshape(info["shape"])
    return out, meta


def digest(arrays) -> str:
    h = hashlib.sha1()
    for a in arrays:
        h.update(raw(a))
    return h.hexdigest()


def raw(arr: np.ndarray) -> memoryview:
    return memoryview(np.ascontiguousarray(arr).reshape(-1).view(np.uint8))


def same_bytes(a, arr: np.ndarray) -> bool:
    if isinstance(a, np.ndarray):
        a = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    else:
        a = np.frombuffer(a, dtype=np.uint8)
    b = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    return a.shape == b.shape and bool(np.array_equal(a, b))


# --------------------------------------------------------------------------
# inshrink import
# --------------------------------------------------------------------------

import_inshrink = common.import_inshrink
tmp_root = common.tmp_root


# --------------------------------------------------------------------------
# peer codecs: compress(list[arr]) -> list[blob]; decompress(blobs) -> list
# --------------------------------------------------------------------------

class Codec:
    name = "?"
    notes: list         # per-file notes (reset for every file)
    static_notes: list  # settings, shown for every file

    def __init__(self):
        self.notes = []
        self.static_notes = []

    def prepare(self, arrays):
        """Input conversion, done before every compress call, untimed."""
        return arrays

    def compress(self, arrays):
        raise NotImplementedError

    def decompress(self, blobs):
        raise NotImplementedError

    @staticmethod
    def size(blobs) -> int:
        return sum(len(b) for b in blobs)


class Zstd(Codec):
    def __init__(self, level: int):
        super().__init__()
        import zstandard as zstd
        self.name = f"zstd-{level}"
        self.c = zstd.ZstdCompressor(level=level)  # threads=0: single thread
        self.d = zstd.ZstdDecompressor()

    def compress(self, arrays):
        return [self.c.compress(raw(a)) for a in arrays]

    def decompress(self, blobs):
        return [self.d.decompress(b) for b in blobs]


class _Fallback:
    """zstd-3 for tensors a codec cannot take (recorded in the notes)."""

    def __init__(self):
        import zstandard as zstd
        self.c = zstd.ZstdCompressor(level=3)
        self.d = zstd.ZstdDecompressor()


class ZipNNCodec(Codec):
    # numpy dtype -> ZipNN bytearray_dtype
    SUPPORTED = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}

    def __init__(self):
        super().__init__()
        import zipnn
        self.name = "zipnn"
        self.inst = {k: zipnn.ZipNN(input_format="byte", bytearray_dtype=v, threads=1)
                     for k, v in self.SUPPORTED.items()}
        self.fb = None

    def prepare(self, arrays):
        # ZipNN's byte API takes a bytes object and reorders its bits IN PLACE
        # (zipnn 0.5.4: the input buffer is modified by compress()), so every
        # compress call gets a fresh copy, made here, untimed.
        return [(a, a.tobytes()) for a in arrays]

    def compress(self, arrays):
        out = []
        for a, ab in arrays:
            z = self.inst.get(a.dtype.name)
            if z is None or a.size == 0:
                self.fb = self.fb or _Fallback()
                out.append((None, self.fb.c.compress(raw(a))))
                note = f"{'empty ' if a.size == 0 else ''}{a.dtype.name} tensors via zstd-3"
                if note not in self.notes:
                    self.notes.append(note)
            else:
                out.append((a.dtype.name, z.compress(ab)))
        return out

    def decompress(self, blobs):
        return [self.inst[k].decompress(b) if k is not None else self.fb.d.decompress(b)
                for k, b in blobs]

    @staticmethod
    def size(blobs):
        return sum(len(b) for _, b in blobs)


class Blosc2Codec(Codec):
    def __init__(self, clevel: int):
        super().__init__()
        import blosc2
        self.blosc2 = blosc2
        blosc2.set_nthreads(1)
        self.clevel = clevel
        self.name = "blosc2"
        self.static_notes.append(f"shuffle+zstd clevel={clevel}")

    def compress(self, arrays):
        b = self.blosc2
        return [b.compress2(raw(a), typesize=max(1, a.dtype.itemsize), clevel=self.clevel,
                            codec=b.Codec.ZSTD, filters=[b.Filter.SHUFFLE], nthreads=1)
                for a in arrays]

    def decompress(self, blobs):
        return [self.blosc2.decompress2(b, nthreads=1) for b in blobs]


class PcodecCodec(Codec):
    def __init__(self):
        super().__init__()
        from pcodec import ChunkConfig, standalone
        self.name = "pcodec"
        self.sa = standalone
        self.cfg = ChunkConfig()
        self.fb = None

    def _view(self, a: np.ndarray):
        if a.dtype.name == "bfloat16":
            note = "bf16 compressed as uint16 bits (pcodec has no bf16)"
            if note not in self.notes:
                self.notes.append(note)
            return a.reshape(-1).view(np.uint16)
        return np.ascontiguousarray(a).reshape(-1)

    def compress(self, arrays):
        out = []
        for a in arrays:
            v = self._view(a)
            try:
                if v.size == 0:
                    raise TypeError("empty")
                out.append((True, self.sa.simple_compress(v, self.cfg)))
            except (TypeError, RuntimeError, ValueError):
                self.fb = self.fb or _Fallback()
                out.append((False, self.fb.c.compress(raw(a))))
                note = f"{'empty ' if a.size == 0 else ''}{a.dtype.name} tensors via zstd-3"
                if note not in self.notes:
                    self.notes.append(note)
        return out

    def decompress(self, blobs):
        return [self.sa.simple_decompress(b) if ok else self.fb.d.decompress(b)
                for ok, b in blobs]

    @staticmethod
    def size(blobs):
        return sum(len(b) for _, b in blobs)


PEERS = {
    "zstd-1": lambda a: Zstd(1),
    "zstd-3": lambda a: Zstd(3),
    "zipnn": lambda a: ZipNNCodec(),
    "blosc2": lambda a: Blosc2Codec(a.blosc_clevel),
    "pcodec": lambda a: PcodecCodec(),
}


# --------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------

def timed(fn, reps: int, setup=None):
    """Best wall time of ``reps`` calls, its CPU time, the last result, and the least CPU
    time of any call.

    ``setup()`` (untimed) is called before every repetition and its result is
    passed to ``fn``."""
    best = None
    least_cpu = None
    res = None
    for _ in range(reps):
        res = None
        arg = setup() if setup is not None else None
        gc.collect()
        c0, t0 = time.process_time(), time.perf_counter()
        res = fn(arg) if setup is not None else fn()
        t1, c1 = time.perf_counter(), time.process_time()
        if best is None or t1 - t0 < best[0]:
            best = (t1 - t0, c1 - c0)
        least_cpu = c1 - c0 if least_cpu is None else min(least_cpu, c1 - c0)
    return best[0], best[1], res, least_cpu


def bench_peer(codec: Codec, arrays, nbytes: int, reps: int) -> dict:
    # untimed warm-up on the smallest tensor of each dtype (lazy init, JIT)
    warm = {}
    for a in arrays:
        if a.dtype not in warm or a.nbytes < warm[a.dtype].nbytes:
            warm[a.dtype] = a
    codec.decompress(codec.compress(codec.prepare(list(warm.values()))))
    codec.notes = []
    tc, cc, blobs, cpu_c = timed(codec.compress, reps, setup=lambda: codec.prepare(arrays))
    csize = codec.size(blobs)
    td, cd, outs, cpu_d = timed(lambda: codec.decompress(blobs), reps)
    exact = len(outs) == len(arrays) and all(same_bytes(o, a) for o, a in zip(outs, arrays))
    return dict(codec=codec.name, orig_bytes=nbytes, comp_bytes=csize,
                ratio=nbytes / csize, comp_s=tc, decomp_s=td,
                comp_MBps=nbytes / 1e6 / tc, decomp_MBps=nbytes / 1e6 / td,
                comp_cpu_wall=cc / tc if tc > 0 else float("nan"),
                decomp_cpu_wall=cd / td if td > 0 else float("nan"),
                comp_cpu_s=cpu_c, decomp_cpu_s=cpu_d,
                exact=exact, notes="; ".join(codec.static_notes + codec.notes))


def check_loaded(loaded: dict, tensors: dict) -> tuple[bool, str]:
    if set(loaded) != set(tensors):
        miss = set(tensors) - set(loaded)
        extra = set(loaded) - set(tensors)
        return False, f"names differ (missing {len(miss)}, extra {len(extra)})"
    bad_dtype = []
    for k, a in tensors.items():
        b = np.asarray(loaded[k])
        if tuple(b.shape) != tuple(a.shape):
            return False, f"{k}: shape {b.shape} != {a.shape}"
        if not same_bytes(b, a):
            return False, f"{k}: bytes differ"
        if b.dtype != a.dtype:
            bad_dtype.append(k)
    if bad_dtype:
        return True, f"bytes exact but dtype differs for {len(bad_dtype)} tensor(s), e.g. {bad_dtype[0]}"
    return True, ""


def bench_inshrink(ins, tensors, meta, nbytes: int, reps: int, threads: int = 1,
                   tmpdir: str | None = None, policy: str | None = None) -> dict:
    d = tempfile.mkdtemp(prefix="inshrink_bench_", dir=tmpdir or tmp_root())
    path = os.path.join(d, "x.ink")
    try:
        # untimed warm-up (imports, JIT compilation) on a slice of the largest tensor of each
        # dtype: a slice of a tiny tensor is grouped without the kernels and compiles none
        largest = {}
        for a in tensors.values():
            if a.dtype.name not in largest or a.size > largest[a.dtype.name].size:
                largest[a.dtype.name] = a
        warm = {name: np.ascontiguousarray(a.reshape(-1)[:65536])
                for name, a in largest.items()}
        ins.save(path, {f"w.{k}": v for k, v in warm.items()}, policy=policy, threads=threads)
        ins.load(path, threads=threads)
        os.remove(path)
        best_c = None
        cpu_c = None
        main_c, main_d = [], []  # CPU time of the calling thread alone, per repetition
        faults_c = []  # minor page faults of the whole process, per save
        idle_c = []  # time the encoder threads were not running during a save, per save
        for _ in range(reps):
            if os.path.exists(path):
                os.remove(path)
            gc.collect()
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            m0, c0, t0 = time.thread_time(), time.process_time(), time.perf_counter()
            ins.save(path, tensors, metadata=meta or None, policy=policy, threads=threads)
            t1, c1, m1 = time.perf_counter(), time.process_time(), time.thread_time()
            faults_c.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
            # the encoder threads' time not spent on the CPU: threads x wall - their CPU
            idle_c.append(threads * (t1 - t0) - ((c1 - c0) - (m1 - m0)) if threads > 1 else None)
            main_c.append(m1 - m0)
            if best_c is None or t1 - t0 < best_c[0]:
                best_c = (t1 - t0, c1 - c0)
            cpu_c = c1 - c0 if cpu_c is None else min(cpu_c, c1 - c0)
        csize = os.path.getsize(path)
        with open(path, "rb") as fh:
            digest = hashlib.sha256(fh.read()).hexdigest()

        def load():
            m0 = time.thread_time()
            loaded = ins.load(path, threads=threads)
            main_d.append(time.thread_time() - m0)
            return loaded
        td, cd, loaded, cpu_d = timed(load, reps)
        exact, note = check_loaded(loaded, tensors)
        del loaded
        tc, cc = best_c
        return dict(codec="inshrink" if threads == 1 else f"inshrink-t{threads}",
                    threads=threads, orig_bytes=nbytes, comp_bytes=csize,
                    ratio=nbytes / csize, comp_s=tc, decomp_s=td,
                    comp_MBps=nbytes / 1e6 / tc, decomp_MBps=nbytes / 1e6 / td,
                    comp_cpu_wall=cc / tc if tc > 0 else float("nan"),
                    decomp_cpu_wall=cd / td if td > 0 else float("nan"),
                    comp_cpu_s=cpu_c, decomp_cpu_s=cpu_d,
                    comp_main_cpu_s=min(main_c), decomp_main_cpu_s=min(main_d),
                    comp_minflt=min(faults_c), exact=exact,
                    comp_off_cpu_s=(None if None in idle_c else sorted(idle_c)[len(idle_c) // 2]), notes=("file size incl. container; " + note).rstrip("; "),
                    sha256=digest)
    finally:
        shutil.rmtree(d, ignore_errors=True)


# --------------------------------------------------------------------------
# printing
# --------------------------------------------------------------------------

def md_table(headers, rows, left=(0,)) -> str:
    """Markdown table; columns in ``left`` (and the last, if text) left-aligned."""
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---" if i in left else "---:" for i in range(len(headers))) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(lines)


def describe(tensors: dict) -> str:
    by = {}
    for a in tensors.values():
        by[a.dtype.name] = by.get(a.dtype.name, 0) + a.nbytes
    big = max((a.nbytes for a in tensors.values()), default=0)
    parts = ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in by.items())
    return f"{len(tensors)} tensors ({parts}); largest tensor {big / 1e6:.2f} MB"


def print_results(path: str, tensors: dict, results: list[dict]) -> None:
    nbytes = results[0]["orig_bytes"] if results else 0
    print(f"\n### {os.path.basename(path)}  ({nbytes / 1e6:.2f} MB; {describe(tensors)})\n")
    rows = []
    for r in results:
        rows.append([r["codec"], f"{r['ratio']:.4f}", f"{r['comp_bytes'] / 1e6:.3f}",
                     f"{r['comp_MBps']:.1f}", f"{r['decomp_MBps']:.1f}",
                     f"{r['comp_cpu_wall']:.2f}/{r['decomp_cpu_wall']:.2f}",
                     "yes" if r["exact"] else "**NO**", r.get("notes", "")])
    print(md_table(["codec", "ratio", "compressed MB", "compress MB/s", "decompress MB/s",
                    "cpu/wall c/d", "bit-exact", "notes"], rows, left=(0, 6, 7)))
    ins = next((r for r in results if r["codec"] == "inshrink"), None)
    if ins is None:
        return
    rows = []
    for r in results:
        if r is ins:
            continue
        rows.append([r["codec"],
                     f"{r['comp_bytes'] / ins['comp_bytes']:.3f}",
                     f"{ins['comp_MBps'] / r['comp_MBps']:.2f}",
                     f"{ins['decomp_MBps'] / r['decomp_MBps']:.2f}",
                     _cpu_speed_ratio(ins, r, "comp"), _cpu_speed_ratio(ins, r, "decomp")])
    print("\ninshrink relative to each peer (>1 favours inshrink; speed per core: the "
          "least CPU time of any repetition, peer / inshrink):\n")
    print(md_table(["peer", "peer size / inshrink size", "compress speed inshrink/peer",
                    "decompress speed inshrink/peer", "compress per core",
                    "decompress per core"], rows))


def _cpu_speed_ratio(ins: dict, peer: dict, what: str) -> str:
    mine, theirs = ins.get(f"{what}_cpu_s"), peer.get(f"{what}_cpu_s")
    return f"{theirs / mine:.2f}" if mine and theirs else "n/a"


# --------------------------------------------------------------------------
# modes
# --------------------------------------------------------------------------

def mode_compare(args) -> dict:
    ins, err = (None, "disabled by --no-inshrink") if args.no_inshrink else import_inshrink()
    if ins is None:
        print(f"NOTE: inshrink not benchmarked ({err}); peers only.")
    peers = []
    for name in args.codecs:
        try:
            peers.append(PEERS[name](args))
        except ImportError as e:
            print(f"NOTE: {name} skipped, package not installed ({e}).")
        except Exception as e:  # noqa: BLE001
            print(f"NOTE: {name} skipped, setup failed ({type(e).__name__}: {e}).")
    print(f"reps={args.reps} (best of), single-threaded; MB = 1e6 bytes of original data; "
          f"temp dir {args.tmpdir or tmp_root()}")
    report = {"mode": "compare", "reps": args.reps, "files": []}
    for path in args.files:
        if not os.path.exists(path):
            print(f"NOTE: {path} does not exist (run benchmarks/train.py first); skipped.")
            continue
        tensors, meta = read_safetensors(path)
        arrays = list(tensors.values())
        nbytes = sum(a.nbytes for a in arrays)
        # Rounds: every codec runs once per round, one after another, so a change in the
        # machine's load during the run affects all codecs alike; each keeps its best round.
        merged: dict[str, dict] = {}
        failed: set[str] = set()
        ref = digest(arrays)
        for _ in range(args.reps):
            if ins is not None and "inshrink" not in failed:
                try:
                    _merge(merged, bench_inshrink(ins, tensors, meta, nbytes, 1, threads=1,
                                                  tmpdir=args.tmpdir))
                except Exception as e:  # noqa: BLE001
                    failed.add("inshrink")
                    print(f"NOTE: inshrink failed on {path}: {type(e).__name__}: {e}")
            for codec in peers:
                if codec.name in failed:
                    continue
                try:
                    _merge(merged, bench_peer(codec, arrays, nbytes, 1))
                except Exception as e:  # noqa: BLE001
                    failed.add(codec.name)
                    print(f"NOTE: {codec.name} failed on {path}: {type(e).__name__}: {e}")
                if digest(arrays) != ref:  # a codec wrote into its input: start clean
                    print(f"NOTE: {codec.name} modified its input buffers; reloading {path}.")
                    if codec.name in merged:
                        merged[codec.name]["exact"] = False
                        merged[codec.name]["notes"] += "; modified its input"
                    tensors, meta = read_safetensors(path)
                    arrays = list(tensors.values())
        results = list(merged.values())
        print_results(path, tensors, results)
        report["files"].append({"file": path, "orig_bytes": nbytes,
                                "n_tensors": len(tensors), "results": results})
    return report


def _merge(merged: dict[str, dict], result: dict) -> None:
    """Fold one round's result into the codec's best so far: the fastest wall time (with its
    CPU/wall) and the least CPU time, each for compression and decompression."""
    best = merged.setdefault(result["codec"], result)
    if best is result:
        return
    for what in ("comp", "decomp"):
        if result[f"{what}_s"] < best[f"{what}_s"]:
            for key in (f"{what}_s", f"{what}_MBps", f"{what}_cpu_wall"):
                best[key] = result[key]
        best[f"{what}_cpu_s"] = min(best[f"{what}_cpu_s"], result[f"{what}_cpu_s"])
    best["exact"] = best["exact"] and result["exact"]


def mode_threads(args) -> dict:
    ins, err = import_inshrink()
    if ins is None:
        print(f"ERROR: --threads-scaling needs inshrink ({err}).")
        sys.exit(2)
    path = args.threads_scaling
    tensors, meta = read_safetensors(path)
    nbytes = sum(a.nbytes for a in tensors.values())
    print(f"{os.path.basename(path)}: {nbytes / 1e6:.1f} MB, {describe(tensors)}; "
          f"reps={args.reps}; cpus={os.cpu_count()}; policy={args.policy}; "
          f"load average {os.getloadavg()[0]:.2f}")
    results = []
    for t in args.threads_list:
        r = bench_inshrink(ins, tensors, meta, nbytes, args.reps, threads=t, tmpdir=args.tmpdir,
                           policy=args.policy)
        r["codec"] = f"inshrink threads={t}"
        results.append(r)
        print(f"  threads={t}: save {r['comp_MBps']:.1f} MB/s, load {r['decomp_MBps']:.1f} MB/s,"
              f" ratio {r['ratio']:.4f}, exact={r['exact']}", flush=True)
    base = results[0]
    rows = [[r["threads"], f"{r['comp_MBps']:.1f}", f"{r['comp_MBps'] / base['comp_MBps']:.2f}x",
             f"{r['decomp_MBps']:.1f}", f"{r['decomp_MBps'] / base['decomp_MBps']:.2f}x",
             f"{r['comp_cpu_wall']:.2f}/{r['decomp_cpu_wall']:.2f}",
             f"{r['comp_cpu_s'] * 1e3:.0f}/{r['decomp_cpu_s'] * 1e3:.0f}",
             f"{r['comp_main_cpu_s'] * 1e3:.0f}/{r['decomp_main_cpu_s'] * 1e3:.0f}",
             f"{_bound(base, r, 'comp')}/{_bound(base, r, 'decomp')}", str(r["comp_minflt"]),
             "-" if r["comp_off_cpu_s"] is None else f"{r['comp_off_cpu_s'] * 1e3:.1f}",
             f"{(r['comp_cpu_s'] / base['comp_cpu_s'] - 1) * 100:+.0f}%",
             f"{r['ratio']:.4f}",
             ("yes" if r["exact"] else "**NO**") if args.policy is None else "lossy",
             "same" if r["sha256"] == base["sha256"] else "differs"] for r in results]
    print()
    print(md_table(["threads", "save MB/s", "save speed-up", "load MB/s", "load speed-up",
                    "cpu/wall c/d", "CPU ms c/d", "calling thread ms c/d",
                    "speed-up bound c/d", "page faults c", "threads off CPU ms c",
                    "save CPU vs first", "ratio", "bit-exact",
                    f"file vs threads={base['threads']}"], rows))
    print("\nCPU ms: least process CPU time of any repetition; calling thread: the least CPU "
          "time of the thread that called save/load. Speed-up bound: what the CPU times allow "
          "with every thread on a free core, min(threads x CPU(first) / CPU, CPU(first) / "
          "calling thread), whatever else runs on the machine. Threads off CPU: median over "
          "the saves of threads x wall - the CPU of all but the calling thread, the time the "
          "encoder threads were not running (waiting for work, the GIL, a lock, or a core "
          "another process holds); near 0 on a quiet machine when they are busy all through "
          "the save.")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    return {"mode": "threads-scaling", "file": path, "orig_bytes": nbytes, "results": results}


def _bound(base: dict, r: dict, what: str) -> str:
    """The speed-up over ``base`` that ``r``'s CPU times allow on free cores (see the note
    printed under the thread table)."""
    cpu1, cpu, main = (base[f"{what}_cpu_s"], r[f"{what}_cpu_s"], r[f"{what}_main_cpu_s"])
    return f"{min(r['threads'] * cpu1 / cpu, cpu1 / main if main > 0 else float('inf')):.2f}x"


def _read_status(pid: int) -> dict[str, int]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                k, _, v = line.partition(":")
                if k in ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem"):
                    out[k] = int(v.split()[0]) * 1024
    except (OSError, ValueError):
        pass
    return out


def run_measured(cmd: list[str], env: dict, interval: float = 0.005) -> dict:
    """Run ``cmd``; return wall time, exact peak RSS (wait4 ru_maxrss) and
    sampled peaks of RssAnon / RssFile and of the whole process tree."""
    try:
        import psutil
    except ImportError:
        psutil = None
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out_chunks = []
    reader = threading.Thread(target=lambda: out_chunks.append(p.stdout.read()), daemon=True)
    reader.start()
    peak = {"RssAnon": 0, "RssFile": 0, "RssShmem": 0, "tree": 0, "VmHWM": 0}
    proc = psutil.Process(p.pid) if psutil else None
    rusage = None
    status = None
    while True:
        pid, st, ru = os.wait4(p.pid, os.WNOHANG)
        if pid == p.pid:
            status, rusage = st, ru
            break
        s = _read_status(p.pid)
        for k in ("RssAnon", "RssFile", "RssShmem", "VmHWM"):
            if k in s:
                peak[k] = max(peak[k], s[k])
        if proc is not None:
            try:
                tree = s.get("VmRSS", 0) + sum(c.memory_info().rss
                                                for c in proc.children(recursive=True))
                peak["tree"] = max(peak["tree"], tree)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        time.sleep(interval)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    reader.join(timeout=5)
    return {"cmd": cmd, "rc": p.returncode, "wall_s": wall,
            "peak_rss": max(rusage.ru_maxrss * 1024, peak["VmHWM"]),
            "peak_rss_anon_sampled": peak["RssAnon"],
            "peak_rss_file_sampled": peak["RssFile"],
            "peak_tree_rss_sampled": peak["tree"],
            "output": b"".join(c for c in out_chunks if c).decode(errors="replace")[-4000:]}


def mode_memory(args) -> dict:
    src = os.path.abspath(args.memory)
    with open(src, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
    header.pop("__metadata__", None)
    sizes = {k: v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items()}
    largest = max(sizes.values())
    fsize = os.path.getsize(src)
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    py = args.python or sys.executable
    extra = args.cli_extra.split() if args.cli_extra else []
    d = tempfile.mkdtemp(prefix="inshrink_mem_", dir=args.tmpdir or tmp_root())
    x = os.path.join(d, "x.ink")
    y = os.path.join(d, "y.safetensors")
    runs = {}
    try:
        runs["baseline"] = run_measured([py, "-c", "import numpy, inshrink"], env)
        runs["compress"] = run_measured([py, "-m", "inshrink", "compress", src, "-o", x] + extra, env)
        if runs["compress"]["rc"] == 0:
            runs["decompress"] = run_measured(
                [py, "-m", "inshrink", "decompress", x, "-o", y] + extra, env)
        for k, r in runs.items():
            if r["rc"] != 0:
                print(f"NOTE: {k} exited {r['rc']}: {' '.join(r['cmd'])}\n{r['output']}")
        exact = None
        csize = os.path.getsize(x) if os.path.exists(x) else None
        if os.path.exists(y):
            a, _ = read_safetensors(src)
            b, _ = read_safetensors(y)
            exact, note = check_loaded(b, a)
            if note:
                print("NOTE:", note)
            del a, b
    finally:
        shutil.rmtree(d, ignore_errors=True)
    base = runs["baseline"]["peak_rss"] if runs["baseline"]["rc"] == 0 else 0
    print(f"{os.path.basename(src)}: file {fsize / 2**20:.1f} MiB, {len(sizes)} tensors, "
          f"largest tensor {largest / 2**20:.1f} MiB"
          + (f", compressed {csize / 2**20:.1f} MiB (ratio {fsize / csize:.4f})" if csize else "")
          + (f", roundtrip bit-exact: {exact}" if exact is not None else ""))
    print(f"temp dir: {d} (tmpfs pages are not counted in the process RSS unless mapped)\n")
    rows = []
    for k, r in runs.items():
        over = r["peak_rss"] - base
        rows.append([k, r["rc"], f"{r['wall_s']:.2f}", f"{r['peak_rss'] / 2**20:.1f}",
                     f"{r['peak_rss_anon_sampled'] / 2**20:.1f}",
                     f"{r['peak_rss_file_sampled'] / 2**20:.1f}",
                     f"{r['peak_tree_rss_sampled'] / 2**20:.1f}",
                     "-" if k == "baseline" else f"{over / 2**20:.1f}",
                     "-" if k == "baseline" else f"{over / largest:.2f}"])
    print(md_table(["run", "rc", "wall s", "peak RSS MiB", "peak anon MiB (sampled)",
                    "peak file-backed MiB (sampled)", "peak tree MiB (sampled)",
                    "peak - baseline MiB", "(peak - baseline) / largest tensor"], rows))
    print(f"\nlargest tensor: {largest / 2**20:.1f} MiB; file: {fsize / 2**20:.1f} MiB")
    for r in runs.values():
        r.pop("output", None)
    return {"mode": "memory", "file": src, "file_bytes": fsize, "largest_tensor_bytes": largest,
            "compressed_bytes": csize, "exact": exact, "runs": runs}


def cpu_busy(interval: float = 1.0) -> float | None:
    """Fraction of all CPUs busy over ``interval`` seconds (Linux /proc/stat)."""
    def sample():
        with open("/proc/stat") as fh:
            v = [int(x) for x in fh.readline().split()[1:]]
        return sum(v[:8]), v[3] + v[4]  # total, idle + iowait
    try:
        t0, i0 = sample()
        time.sleep(interval)
        t1, i1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", default=DEFAULT_FILES,
                    help="safetensors files (default: benchmarks/data/final_*.safetensors)")
    ap.add_argument("--codecs", default=",".join(PEERS),
                    help=f"comma-separated peers to run (default: {','.join(PEERS)})")
    ap.add_argument("--no-inshrink", action="store_true", help="benchmark the peers only")
    ap.add_argument("--reps", type=int, default=3, help="repetitions, best is kept (default 3)")
    ap.add_argument("--blosc-clevel", type=int, default=5)
    ap.add_argument("--tmpdir", default=None,
                    help="where inshrink temp files go (default /dev/shm if present)")
    ap.add_argument("--json", default=None, help="also write the results as JSON here")
    ap.add_argument("--threads-scaling", metavar="FILE", default=None,
                    help="time inshrink save/load on FILE for each --threads-list value")
    ap.add_argument("--threads-list", default="1,2")
    ap.add_argument("--policy", default=None,
                    help="with --threads-scaling: a lossy policy preset for save (e.g. balanced)")
    ap.add_argument("--memory", metavar="FILE", default=None,
                    help="peak RSS of `python -m inshrink compress/decompress` on FILE")
    ap.add_argument("--python", default=None, help="interpreter for --memory (default: this one)")
    ap.add_argument("--cli-extra", default="", help="extra arguments for the --memory CLI calls")
    args = ap.parse_args(argv)
    args.codecs = [c.strip() for c in args.codecs.split(",") if c.strip()]
    unknown = [c for c in args.codecs if c not in PEERS]
    if unknown:
        ap.error(f"unknown codec(s): {unknown}; known: {list(PEERS)}")
    args.threads_list = [int(t) for t in args.threads_list.split(",")]

    busy = cpu_busy()
    load1 = os.getloadavg()[0]
    print(f"cpus={os.cpu_count()}  load average (1 min): {load1:.2f}"
          + (f"  CPU busy over the last second: {busy:.0%}" if busy is not None else ""))
    if busy is not None and busy > 0.10:
        print("WARNING: other processes are using the CPU; speeds will be lower and "
              "noisier than on an idle machine (thread scaling especially).")
    if args.threads_scaling:
        report = mode_threads(args)
    elif args.memory:
        report = mode_memory(args)
    else:
        report = mode_compare(args)
    report["python"] = sys.version.split()[0]
    report["loadavg_1min_at_start"] = load1
    report["cpu_busy_at_start"] = busy
    report["cpus"] = os.cpu_count()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=2)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
