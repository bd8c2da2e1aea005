"""Write a seed corpus of small, valid .ink files for the reader fuzzer.

Usage::

    python fuzz/make_corpus.py [OUTDIR]      # default: fuzz/corpus

Every seed is a few hundred bytes to a few KB, so libFuzzer mutates them quickly. Between them
they cover every dtype, 0-d and empty tensors, multi-chunk tensors, both chunk codings (``zstd``
and ``raw``), several byte-group widths and user metadata. The conformance vectors in
``spec/vectors/*.ink`` are copied in as well when that directory exists.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import inshrink  # noqa: E402


def _seeds() -> dict[str, tuple[dict, dict, int | None]]:
    """name -> (tensors, metadata, chunk_bytes or None for the default)."""
    rng = np.random.default_rng(1234)
    smooth = np.linspace(-1, 1, 96, dtype=np.float32)          # compresses: zstd planes
    noise = rng.standard_normal(48).astype(np.float32)         # mostly raw planes
    return {
        "empty": ({}, {}, None),
        "metadata_only": ({}, {"format": "pt", "step": "1000", "note": "\u00e9\u00e8"}, None),
        "f32_small": ({"w": smooth.reshape(8, 12)}, {}, None),
        "all_dtypes": ({
            "f64": np.arange(6, dtype=np.float64) / 7,
            "f32": noise[:8],
            "f16": np.arange(10, dtype=np.float16) - 4,
            "bf16": (np.arange(12, dtype=np.float32) / 3).astype(ml_dtypes.bfloat16),
            "f8e4": np.linspace(-2, 2, 9).astype(ml_dtypes.float8_e4m3fn),
            "f8e5": np.linspace(-2, 2, 9).astype(ml_dtypes.float8_e5m2),
            "c64": (np.arange(4) + 1j * np.arange(4)).astype(np.complex64),
            "c128": (np.arange(3) - 2j).astype(np.complex128),
            "i8": np.arange(-5, 5, dtype=np.int8),
            "i16": np.arange(7, dtype=np.int16) * -300,
            "i32": np.arange(5, dtype=np.int32) * 70000,
            "i64": np.arange(4, dtype=np.int64) << 40,
            "u8": np.arange(16, dtype=np.uint8),
            "u16": np.arange(5, dtype=np.uint16) * 999,
            "u32": np.arange(5, dtype=np.uint32),
            "u64": np.array([0, 2**64 - 1], dtype=np.uint64),
            "bool": np.array([True, False, True]),
        }, {"kind": "dtypes"}, None),
        "shapes": ({
            "scalar": np.array(3.5, dtype=np.float32),
            "empty_1d": np.zeros(0, dtype=np.float32),
            "empty_2d": np.zeros((3, 0), dtype=np.int16),
            "ones_5d": np.ones((1, 2, 1, 3, 1), dtype=np.float16),
        }, {}, None),
        "multichunk": ({
            "smooth": smooth,                                  # 384 B in 64 B chunks
            "noise": noise,
            "bf16": smooth.astype(ml_dtypes.bfloat16),
            "zeros": np.zeros(200, dtype=np.uint8),
            "tail": np.arange(37, dtype=np.int32),             # last chunk shorter
        }, {"chunked": "yes"}, 64),
        "tiny_chunks": ({"x": np.arange(10, dtype=np.float32)}, {}, 8),
        "zeros_large": ({"z": np.zeros(4096, dtype=np.float32)}, {}, 4096),  # high zstd ratio
    }


def write_corpus(outdir: str | os.PathLike) -> list[Path]:
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (tensors, metadata, chunk_bytes) in _seeds().items():
        path = out / f"{name}.ink"
        kwargs = {} if chunk_bytes is None else {"chunk_bytes": chunk_bytes}
        with inshrink.Writer(path, metadata, threads=1, **kwargs) as writer:
            for key, value in tensors.items():
                writer.add(key, value)
        written.append(path)
    vectors = ROOT / "spec" / "vectors"
    if vectors.is_dir():
        for vector in sorted(vectors.glob("*.ink")):
            target = out / f"vector_{vector.name}"
            shutil.copyfile(vector, target)
            written.append(target)
    return written


def main() -> None:
    outdir = sys.argv[1] if len(sys.argv) > 1 else ROOT / "fuzz" / "corpus"
    for path in write_corpus(outdir):
        print(f"{path}  {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
