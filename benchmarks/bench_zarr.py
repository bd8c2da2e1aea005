#!/usr/bin/env python3
"""inshrink as a zarr v3 codec against zarr's own choices, on real checkpoint tensors.

Every tensor of the given safetensors files (default: ``final_weights_fp32`` and
``final_bf16`` written by ``train.py`` in ``benchmarks/data/``) is written to a zarr v3 array
in a LocalStore (in ``/dev/shm`` when available) and read back, once per codec, side by side:

* ``zarr-default``  what ``zarr.create_array`` picks: ``bytes`` + ``zstd`` level 0;
* ``zstd-1``        ``bytes`` + numcodecs ``Zstd(level=1)``, numcodecs' default (``zarr.codecs.numcodecs.Zstd``;
  zarr's level 0 is zstd's default, 3);
* ``blosc``         ``bytes`` + Blosc, byte shuffle + zstd level 5 (``zarr.codecs.BloscCodec``);
* ``inshrink``      ``serializer=InkCodec()``: byte planes, sign rotated, zstd (fast);
* ``inshrink-q16``  ``serializer=InkQuantCodec(bins=16)``: lossy, per-chunk fitted levels.

Chunks are rows of about ``--chunk-mb`` MiB (whole tensor when smaller). Reported per codec
and file: ratio (tensor bytes / chunk file bytes), write and read MB/s (MB = 1e6 bytes of
tensor data, best of ``--reps``, zarr's thread pool limited to ``--threads``), whether the
read is bit-exact, and for the lossy codec the relative L2 error over the file; encode and
decode MB/s of the codec alone on the same chunks in memory (numcodecs objects: zarr's
overhead, which dominates on small tensors, left out); then
inshrink's ratio and read speed relative to zarr's default, and the best ratio an order-0
coder of the sign-rotated byte planes could reach on the file's floats. Usage::

    nice -n 5 python benchmarks/bench_zarr.py [FILE.safetensors ...] [--reps 3]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import zarr
from safetensors.numpy import load_file
from zarr.codecs import BloscCodec
from zarr.storage import LocalStore

import inshrink.zarr  # noqa: F401  registers the bfloat16 data type
from inshrink.zarr import InkCodec, InkQuantCodec

HERE = Path(__file__).resolve().parent


def codecs() -> dict[str, dict]:
    """create_array arguments of every codec compared."""
    from zarr.codecs.numcodecs import Zstd

    # zarr warns that numcodecs codecs are outside the v3 spec: known, and so is inshrink
    warnings.filterwarnings("ignore", message="Numcodecs codecs are not in the Zarr")
    return {
        "zarr-default": {},
        "zstd-1": {"compressors": [Zstd(level=1)]},
        "blosc": {"compressors": [BloscCodec(cname="zstd", clevel=5, shuffle="shuffle")]},
        "inshrink": {"serializer": InkCodec(), "compressors": None},
        "inshrink-q16": {"serializer": InkQuantCodec(bins=16), "compressors": None},
    }


def numcodecs_of(name: str):
    """The numcodecs codec doing the same work on one chunk as zarr codec ``name``; its
    input: the chunk as bytes, as same-size unsigned words (Blosc's shuffle needs the
    itemsize), or with its dtype."""
    import numcodecs

    from inshrink.numcodecs import Inshrink, InshrinkQuant

    words = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
    return {
        "zarr-default": (numcodecs.Zstd(level=0), lambda c: c.view(np.uint8)),
        "zstd-1": (numcodecs.Zstd(level=1), lambda c: c.view(np.uint8)),
        "blosc": (numcodecs.Blosc(cname="zstd", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE),
                  lambda c: c.view(words[c.itemsize])),
        "inshrink": (Inshrink(), lambda c: c),
        "inshrink-q16": (InshrinkQuant(bins=16), lambda c: c),
    }[name]


def codec_speed(tensors: dict[str, np.ndarray], name: str, chunk_mb: float,
                reps: int) -> tuple[float, float]:
    """Encode and decode MB/s of the codec alone on the arrays' chunks, in memory."""
    codec, prepare = numcodecs_of(name)
    chunks = []
    for x in tensors.values():
        rows = chunks_for(x, chunk_mb)[:1] or (1,)
        flat = x.reshape(x.shape[0] if x.ndim else 1, -1)
        chunks += [prepare(np.ascontiguousarray(flat[i:i + rows[0]]).reshape(-1))
                   for i in range(0, flat.shape[0], rows[0])]
    raw = sum(c.nbytes for c in chunks)
    enc_s = dec_s = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        encoded = [codec.encode(c) for c in chunks]
        enc_s = min(enc_s, time.perf_counter() - start)
        start = time.perf_counter()
        for blob in encoded:
            codec.decode(blob)
        dec_s = min(dec_s, time.perf_counter() - start)
    return raw / 1e6 / enc_s, raw / 1e6 / dec_s


def load_tensors(path: Path) -> dict[str, np.ndarray]:
    """The file's tensors as numpy arrays (bf16 as ml_dtypes.bfloat16)."""
    try:
        return load_file(str(path))
    except TypeError:  # older safetensors without bf16 in numpy: go through torch
        import torch
        from safetensors.torch import load_file as load_torch

        out = {}
        for name, t in load_torch(str(path)).items():
            if t.dtype == torch.bfloat16:
                out[name] = t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
            else:
                out[name] = t.numpy()
        return out


def chunks_for(x: np.ndarray, chunk_mb: float) -> tuple[int, ...]:
    """Whole rows, about chunk_mb MiB per chunk."""
    if x.ndim == 0:
        return ()
    row = max(1, x[0].nbytes if x.ndim > 1 else x.itemsize)
    rows = max(1, min(x.shape[0], int(chunk_mb * (1 << 20)) // row))
    return (rows, *x.shape[1:])


def store_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()
               and p.name != "zarr.json")


def run_codec(tensors: dict[str, np.ndarray], kwargs: dict, root: Path, chunk_mb: float,
              reps: int) -> dict:
    write_s = read_s = float("inf")
    stored = 0
    exact = True
    sse = sumsq = 0.0
    for _ in range(reps):
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        start = time.perf_counter()
        for i, (name, x) in enumerate(tensors.items()):
            a = zarr.create_array(LocalStore(root / f"t{i}"), shape=x.shape,
                                  chunks=chunks_for(x, chunk_mb), dtype=x.dtype,
                                  **kwargs)
            a[...] = x
        write_s = min(write_s, time.perf_counter() - start)
        start = time.perf_counter()
        back = [zarr.open_array(LocalStore(root / f"t{i}"), mode="r")[...]
                for i in range(len(tensors))]
        read_s = min(read_s, time.perf_counter() - start)
    stored = store_bytes(root)
    for x, y in zip(tensors.values(), back):
        exact &= y.tobytes() == x.tobytes()
        if x.dtype.kind == "f" or x.dtype == np.dtype(ml_dtypes.bfloat16):
            xf, yf = x.astype(np.float64), y.astype(np.float64)
            sse += float(np.square(yf - xf).sum())
            sumsq += float(np.square(xf).sum())
    raw = sum(x.nbytes for x in tensors.values())
    return {"ratio": raw / stored, "write": raw / 1e6 / write_s, "read": raw / 1e6 / read_s,
            "exact": exact, "rel_l2": (sse / sumsq) ** 0.5 if sumsq else 0.0}


def plane_bound(tensors: dict[str, np.ndarray]) -> float | None:
    """The best lossless ratio an order-0 coder of the sign-rotated byte planes can reach
    (entropy of each plane's byte histogram): what inshrink's lossless codec aims at."""
    words = {4: np.uint32, 2: np.uint16}
    floats = [x for x in tensors.values() if x.dtype.itemsize in words
              and (x.dtype.kind == "f" or x.dtype == np.dtype(ml_dtypes.bfloat16))]
    if not floats:
        return None
    bits = raw = 0.0
    for size, word in words.items():
        group = [x.reshape(-1).view(word) for x in floats if x.dtype.itemsize == size]
        if not group:
            continue
        u = np.concatenate(group)
        rotated = (u << word(1)) | (u >> word(8 * size - 1))
        for k in range(size):
            counts = np.bincount(((rotated >> word(8 * k)) & word(0xFF)).astype(np.int64),
                                 minlength=256).astype(np.float64)
            p = counts[counts > 0] / counts.sum()
            bits += float(-(p * np.log2(p)).sum()) * u.size
        raw += 8.0 * size * u.size
    return raw / bits


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--data", type=Path, default=HERE / "data")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--chunk-mb", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=1, help="zarr's thread pool")
    args = ap.parse_args(argv)
    files = args.files or [args.data / "final_weights_fp32.safetensors",
                           args.data / "final_bf16.safetensors"]
    missing = [f for f in files if not f.exists()]
    if missing:
        print(f"missing {missing}: run benchmarks/train.py first", file=sys.stderr)
        return 2
    zarr.config.set({"threading.max_workers": args.threads})
    base = Path("/dev/shm") if os.path.isdir("/dev/shm") else Path(tempfile.gettempdir())
    work = Path(tempfile.mkdtemp(prefix="bench_zarr_", dir=base))
    print(f"zarr {zarr.__version__}, chunks of about {args.chunk_mb} MiB, best of {args.reps}, "
          f"zarr threads {args.threads}, store in {work}")
    try:
        for path in files:
            tensors = load_tensors(path)
            raw = sum(x.nbytes for x in tensors.values())
            dts = sorted({str(x.dtype) for x in tensors.values()})
            print(f"\n{path.name}: {len(tensors)} tensors, {raw / 1e6:.1f} MB, {', '.join(dts)}")
            print(f"{'':<14}{'':>8}{'zarr, MB/s':>23}{'codec alone, MB/s':>24}")
            print(f"{'codec':<14}{'ratio':>8}{'write':>12}{'read':>11}{'encode':>12}"
                  f"{'decode':>12}{'exact':>7}{'rel L2':>10}")
            results = {}
            for name, kwargs in codecs().items():
                r = results[name] = run_codec(tensors, kwargs, work / name, args.chunk_mb,
                                              args.reps)
                r["encode"], r["decode"] = codec_speed(tensors, name, args.chunk_mb, args.reps)
                print(f"{name:<14}{r['ratio']:>8.3f}{r['write']:>12.1f}{r['read']:>11.1f}"
                      f"{r['encode']:>12.1f}{r['decode']:>12.1f}"
                      f"{'yes' if r['exact'] else 'no':>7}{r['rel_l2']:>10.2e}")
            bound = plane_bound(tensors)
            if bound:
                print(f"order-0 entropy bound of the rotated byte planes: ratio {bound:.3f}")
            ink, ref = results["inshrink"], results["zarr-default"]
            print(f"inshrink / zarr-default: ratio x{ink['ratio'] / ref['ratio']:.3f}, "
                  f"read x{ink['read'] / ref['read']:.2f}, "
                  f"write x{ink['write'] / ref['write']:.2f}, "
                  f"codec decode x{ink['decode'] / ref['decode']:.2f}, "
                  f"codec encode x{ink['encode'] / ref['encode']:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
