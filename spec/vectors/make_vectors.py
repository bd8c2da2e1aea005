"""Generate the test vectors of the .ink container format 1.x (spec/FORMAT.md, "Test vectors").

Usage (from the repository root)::

    PYTHONPATH=. python spec/vectors/make_vectors.py [--out DIR]

Output is deterministic: every input is a fixed bit pattern or comes from a SHA-256 counter
stream, every file is written with ``threads=1``, and negative vectors are byte patches of
positive ones. The only outside influence is the zstd library, whose compressed output may
differ between zstd releases; ``manifest.json`` records the version the vectors were made with.

For every positive vector ``NAME.ink`` the script writes ``NAME.expected.json``: per tensor the
dtype, shape, and the raw little-endian bytes (hex and SHA-256) a reader must return. Negative
vectors are listed in ``manifest.json`` with the error class a reader must raise.

The array-frame vectors (spec section 24) go to ``array/`` with their own ``manifest.json``.
The directories ``v1.0/`` ... ``v1.5/`` are frozen copies of the positive vectors of every
released format version and are never regenerated: a new format version is frozen once,
when its vectors are first generated, with ``freeze(HERE, version, source)``.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import struct
import sys
import tempfile
from pathlib import Path
from typing import Callable

import ml_dtypes
import numpy as np
import zstandard

import inshrink
from inshrink import dtypes
from inshrink.io import writer as tensor_writer
from inshrink.io.rebase import write_delta
from inshrink.codecs import lossless
from inshrink.codecs.chain import Pipeline
from inshrink.container import layout
from inshrink.container.index import TensorEntry, pack_index, unpack_index
from inshrink.container.writer import ContainerWriter
from inshrink.safetensors import compress_safetensors
from inshrink.encode.policy import Policy, QuantConfig
from inshrink.digest import base_reference, decode_digest

HERE = Path(__file__).resolve().parent
FORMAT_VERSION = f"{layout.VERSION_MAJOR}.{layout.VERSION_MINOR}"
ZSTD_VERSION = ".".join(map(str, zstandard.ZSTD_VERSION))


# --------------------------------------------------------------------------------------------
# Deterministic inputs
# --------------------------------------------------------------------------------------------

def prng_bytes(seed: str, n: int) -> bytes:
    """``n`` pseudo-random bytes: SHA-256 of ``seed:counter``, concatenated."""
    out = bytearray()
    counter = 0
    while len(out) < n:
        out += hashlib.sha256(f"{seed}:{counter}".encode()).digest()
        counter += 1
    return bytes(out[:n])


def bits(pattern: list[int], word: str, dtype) -> np.ndarray:
    """An array of ``dtype`` whose elements have exactly the given bit patterns."""
    return np.array(pattern, dtype=word).view(dtype)


F32_SPECIAL = [
    0x00000000,  # +0.0
    0x80000000,  # -0.0
    0x7F800000,  # +inf
    0xFF800000,  # -inf
    0x7FC00000,  # quiet NaN
    0xFFC00000,  # negative quiet NaN
    0x7F800001,  # signalling NaN, smallest payload
    0x7FBFFFFF,  # signalling NaN, largest payload
    0x7FC12345,  # quiet NaN with payload
    0xFFFFFFFF,  # NaN, all bits set
    0x00000001,  # smallest subnormal
    0x807FFFFF,  # negative largest subnormal
    0x00800000,  # smallest normal
    0x7F7FFFFF,  # largest finite
    0xFF7FFFFF,  # most negative finite
    0x3F800000,  # 1.0
    0xBF800000,  # -1.0
    0x3EAAAAAB,  # 1/3
    0x40490FDB,  # pi
    0x00400000,  # subnormal, half of the smallest normal
]

F64_SPECIAL = [
    0x0000000000000000, 0x8000000000000000,  # +-0.0
    0x7FF0000000000000, 0xFFF0000000000000,  # +-inf
    0x7FF8000000000000, 0xFFF8000000000000,  # quiet NaNs
    0x7FF0000000000001, 0x7FF7FFFFFFFFFFFF,  # signalling NaNs
    0x7FF8DEADBEEF0001, 0xFFFFFFFFFFFFFFFF,  # NaN payloads
    0x0000000000000001, 0x800FFFFFFFFFFFFF,  # subnormals
    0x0010000000000000,                      # smallest normal
    0x7FEFFFFFFFFFFFFF, 0xFFEFFFFFFFFFFFFF,  # largest / most negative finite
    0x3FF0000000000000, 0xBFF0000000000000,  # +-1.0
    0x3FD5555555555555, 0x400921FB54442D18,  # 1/3, pi
]

F16_SPECIAL = [
    0x0000, 0x8000, 0x7C00, 0xFC00,  # +-0, +-inf
    0x7E00, 0xFE00, 0x7C01, 0x7DFF,  # quiet / signalling NaNs
    0x7E5A, 0xFFFF,                  # NaN payloads
    0x0001, 0x83FF, 0x0400,          # subnormals, smallest normal
    0x7BFF, 0xFBFF,                  # largest / most negative finite
    0x3C00, 0xBC00, 0x3555, 0x4248,  # 1, -1, 1/3, pi
]

BF16_SPECIAL = [
    0x0000, 0x8000, 0x7F80, 0xFF80,  # +-0, +-inf
    0x7FC0, 0xFFC0, 0x7F81, 0x7FBF,  # quiet / signalling NaNs
    0x7FD5, 0xFFFF,                  # NaN payloads
    0x0001, 0x807F, 0x0080,          # subnormals, smallest normal
    0x7F7F, 0xFF7F,                  # largest / most negative finite
    0x3F80, 0xBF80, 0x3EAB, 0x4049,  # 1, -1, 1/3, pi
]


def int_extremes(np_type) -> np.ndarray:
    info = np.iinfo(np_type)
    lo, hi = int(info.min), int(info.max)
    values = [lo, lo + 1, lo + 2, 0, 1, 2, (lo + hi) // 2, hi - 2, hi - 1, hi]
    if lo < 0:
        values += [-1, -2, 0x5A, -0x5B]
    else:
        values += [0x5A, 0xA5, hi // 3, hi // 5]
    return np.array(values, dtype=np.dtype(np_type).newbyteorder("<"))


def mantissa_noise_f32(seed: str, n: int) -> np.ndarray:
    """Floats in [1, 2): constant exponent byte, pseudo-random mantissa bytes."""
    noise = np.frombuffer(prng_bytes(seed, 4 * n), "<u4") & np.uint32(0x007FFFFF)
    return (noise | np.uint32(0x3F800000)).astype("<u4").view("<f4")


# --------------------------------------------------------------------------------------------
# Writers
# --------------------------------------------------------------------------------------------

Tensors = dict[str, np.ndarray]


def write_plain(path: Path, tensors: Tensors, metadata: dict[str, str] | None = None,
                **kwargs) -> None:
    """Write with the library's Writer: the stages and chunking any default writer uses."""
    with inshrink.Writer(path, metadata, threads=1, **kwargs) as w:
        for name, arr in tensors.items():
            w.add(name, arr)


def write_custom(path: Path, specs: list[tuple[str, np.ndarray, lossless.ByteGroup, int]],
                 metadata: dict[str, str] | None = None) -> None:
    """Write tensors with explicit bytegroup parameters and chunk_elements.

    ``specs`` holds (name, array, stage, chunk_elements); used for layouts a default writer
    never chooses but every reader must accept.
    """
    cw = ContainerWriter(path)
    try:
        for name, arr, stage, per_chunk in specs:
            dt = dtypes.of_numpy(arr.dtype)
            entry = TensorEntry(name, dt, tuple(arr.shape), [stage.to_dict()], per_chunk,
                                [[] for _ in range(stage.streams)])
            cw.tensors.append(entry)
            flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
            for c in range(entry.chunk_count):
                start, stop = entry.chunk_range(c)
                raw = flat[start * dt.itemsize:stop * dt.itemsize]
                for stream, (coding, payload, size) in zip(entry.streams,
                                                           Pipeline(stage).encode(raw)):
                    stream.append(cw.write_chunk(coding, payload, size))
        cw.commit(dict(metadata or {}))
    except BaseException:
        cw.abort()
        raise


# --------------------------------------------------------------------------------------------
# Byte-level helpers (used by the patched vectors)
# --------------------------------------------------------------------------------------------

HEADER = struct.Struct("<8sHHIQQ28sI")  # the 64-byte header, as in layout.py
HEADER_FIELDS = ["magic", "major", "minor", "size", "required", "optional", "reserved", "crc"]


def patch_header(data: bytes, *, fix_crc: bool = True, **fields) -> bytes:
    """Change header fields (magic, major, minor, size, required, optional, reserved, crc)."""
    values = dict(zip(HEADER_FIELDS, HEADER.unpack(data[:layout.HEADER_SIZE])))
    values.update(fields)
    head = HEADER.pack(*(values[n] for n in HEADER_FIELDS))
    if fix_crc:
        head = head[:60] + struct.pack("<I", layout.crc32(head[:60]))
    return head + data[layout.HEADER_SIZE:]


def index_location(data: bytes) -> tuple[int, bytes]:
    """(index record offset, index payload) of a valid file."""
    offset, length, _ = layout.parse_tail(data[-layout.TAIL_SIZE:])
    start = offset + layout.RECORD_HEADER_SIZE
    return offset, data[start:start + length]


def replace_index_payload(data: bytes, payload: bytes) -> bytes:
    """Rewrite the index record and tail around a new payload, with consistent CRCs."""
    offset, _ = index_location(data)
    return (data[:offset] + layout.pack_record_header(layout.KIND_INDEX, payload) + payload
            + layout.pack_tail(offset, payload))


def dump_index(doc: dict) -> bytes:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()


def header_field(data: bytes, name: str) -> int:
    return dict(zip(HEADER_FIELDS, HEADER.unpack(data[:layout.HEADER_SIZE])))[name]


def index_is_compressed(data: bytes) -> bool:
    return bool(header_field(data, "required") & layout.FEATURE_ZINDEX)


def index_doc(data: bytes) -> dict:
    """The parsed index document of a valid file, compressed (``zindex``) or not."""
    _, payload = index_location(data)
    return json.loads(unpack_index(payload, len(data)) if index_is_compressed(data)
                      else payload)


def edit_index(data: bytes, edit: Callable[[dict], None]) -> bytes:
    """Apply ``edit`` to the parsed index document and write it back with fixed CRCs (as a
    zstd frame again if the file's index was one)."""
    compressed = index_is_compressed(data)
    doc = index_doc(data)
    edit(doc)
    new = dump_index(doc)
    if compressed:
        new = pack_index(new)
        assert new is not None
    return replace_index_payload(data, new)


def replace_chunk_payload(data: bytes, offset: int, payload: bytes) -> bytes:
    """Overwrite the payload of the chunk record at ``offset`` (it must fit its old slot)."""
    _, old_length, _ = layout.parse_record_header(
        data[offset:offset + layout.RECORD_HEADER_SIZE], offset)
    slot = layout.RECORD_HEADER_SIZE + old_length
    slot += layout.padding(offset + slot)
    record = layout.pack_record_header(layout.KIND_CHUNK, payload) + payload
    if len(record) > slot:
        raise ValueError("replacement payload does not fit the record's slot")
    record += bytes(slot - len(record))
    return data[:offset] + record + data[offset + slot:]


# --------------------------------------------------------------------------------------------
# Positive vectors
# --------------------------------------------------------------------------------------------

class Positive:
    """A positive vector: ``build(path)`` writes the file and returns what it must decode to."""

    def __init__(self, name: str, covers: str, build: Callable[[Path], dict],
                 base: str | None = None) -> None:
        self.name, self.covers, self.build, self.base = name, covers, build, base


POSITIVE: list[Positive] = []


@contextlib.contextmanager
def per_dtype_grouping():
    """Keep the byte grouping of section 10.5's table even for tiny tensors (the reference
    writer may store those as one plane): the vectors exist to exercise every plane layout,
    and the negative vectors patch particular planes."""
    saved = tensor_writer.TINY_TENSOR_BYTES
    tensor_writer.TINY_TENSOR_BYTES = 0
    try:
        yield
    finally:
        tensor_writer.TINY_TENSOR_BYTES = saved


def positive(name: str, covers: str, base: str | None = None):
    def register(fn):
        @functools.wraps(fn)
        def build(path: Path) -> dict:
            with per_dtype_grouping():
                return fn(path)
        POSITIVE.append(Positive(name, covers, build, base))
        return fn
    return register


def contents(tensors: Tensors, metadata: dict[str, str] | None = None,
             safetensors_header: str | None = None) -> dict:
    return {"tensors": tensors, "metadata": dict(metadata or {}),
            "safetensors_header": safetensors_header}


@positive("minimal", "smallest useful file: one F32 tensor of two elements, four raw plane "
                     "chunks; annotated in minimal.hexdump.md")
def build_minimal(path: Path) -> dict:
    tensors = {"x": np.array([1.0, -2.0], "<f4")}
    write_plain(path, tensors)
    return contents(tensors)


@positive("f32", "F32: signed zeros, infinities, quiet/signalling NaNs with payloads, "
                 "subnormals, extremes; a 2-d tensor")
def build_f32(path: Path) -> dict:
    tensors = {"special": bits(F32_SPECIAL, "<u4", "<f4"),
               "matrix": np.arange(-6, 6, dtype="<f4").reshape(3, 4) / np.float32(4)}
    write_plain(path, tensors)
    return contents(tensors)


@positive("f64", "F64: signed zeros, infinities, NaN payloads, subnormals, extremes")
def build_f64(path: Path) -> dict:
    tensors = {"special": bits(F64_SPECIAL, "<u8", "<f8")}
    write_plain(path, tensors)
    return contents(tensors)


@positive("f16", "F16: signed zeros, infinities, NaN payloads, subnormals, extremes")
def build_f16(path: Path) -> dict:
    tensors = {"special": bits(F16_SPECIAL, "<u2", "<f2")}
    write_plain(path, tensors)
    return contents(tensors)


@positive("bf16", "BF16: signed zeros, infinities, NaN payloads, subnormals, extremes")
def build_bf16(path: Path) -> dict:
    tensors = {"special": bits(BF16_SPECIAL, "<u2", ml_dtypes.bfloat16)}
    write_plain(path, tensors)
    return contents(tensors)


@positive("f8", "F8_E4M3 and F8_E5M2: all 256 bit patterns of each (bytegroup word 1)")
def build_f8(path: Path) -> dict:
    every = np.arange(256, dtype=np.uint8).reshape(16, 16)
    tensors = {"e4m3": every.view(ml_dtypes.float8_e4m3fn),
               "e5m2": every[::-1].copy().view(ml_dtypes.float8_e5m2)}
    write_plain(path, tensors)
    return contents(tensors)


@positive("ints", "I8, I16, I32, I64, U8, U16, U32, U64 including their extremes "
                  "(no rotation, word = itemsize)")
def build_ints(path: Path) -> dict:
    tensors = {np.dtype(t).name: int_extremes(t)
               for t in (np.int8, np.int16, np.int32, np.int64,
                         np.uint8, np.uint16, np.uint32, np.uint64)}
    write_plain(path, tensors)
    return contents(tensors)


@positive("bool", "BOOL (bytes 0x00 and 0x01), a 2-d tensor")
def build_bool(path: Path) -> dict:
    pattern = np.frombuffer(prng_bytes("bool", 14), np.uint8) & 1
    tensors = {"mask": pattern.astype(np.bool_).reshape(2, 7)}
    write_plain(path, tensors)
    return contents(tensors)


@positive("complex", "C64 and C128: special values in real and imaginary parts "
                     "(bytegroup word = half the itemsize)")
def build_complex(path: Path) -> dict:
    c64 = bits([0x3F800000, 0x40000000,   # 1 + 2j
                0x80000000, 0x7F800000,   # -0 + inf j
                0x7FC12345, 0xFF800000,   # nan(payload) - inf j
                0x00000001, 0x807FFFFF,   # subnormals
                0x7F7FFFFF, 0xFFFFFFFF],  # max + nan j
               "<u4", "<c8")
    c128 = bits([0x3FF0000000000000, 0xC000000000000000,
                 0x8000000000000000, 0x7FF0000000000000,
                 0x7FF8DEADBEEF0001, 0xFFF0000000000000,
                 0x0000000000000001, 0x800FFFFFFFFFFFFF],
                "<u8", "<c16")
    tensors = {"c64": c64, "c128": c128.reshape(2, 2)}
    write_plain(path, tensors)
    return contents(tensors)


@positive("scalar", "0-d tensors (shape [], one element, one chunk)")
def build_scalar(path: Path) -> dict:
    tensors = {"f32": np.array(3.5, "<f4"), "i64": np.array(-7, "<i8"),
               "bf16": np.array(0x3FC0, "<u2").view(ml_dtypes.bfloat16)}
    write_plain(path, tensors)
    return contents(tensors)


@positive("empty", "tensors with zero elements: chunk count 0, one empty chunk list per stream")
def build_empty(path: Path) -> dict:
    tensors = {"f32": np.zeros(0, "<f4"), "bf16": np.zeros((2, 0, 3), ml_dtypes.bfloat16),
               "u8": np.zeros(0, np.uint8), "c128": np.zeros((0, 4), "<c16")}
    write_plain(path, tensors)
    return contents(tensors)


@positive("multichunk", "several chunks per stream with a partial last chunk (chunk_bytes=256): "
                        "F32 (16 chunks, 4 streams, exponent planes zstd), BF16, U8")
def build_multichunk(path: Path) -> dict:
    u8 = np.frombuffer(prng_bytes("multichunk-u8", 600), np.uint8) % np.uint8(7)
    bf16 = mantissa_noise_f32("multichunk-bf16", 400).astype(ml_dtypes.bfloat16)
    tensors = {"f32": mantissa_noise_f32("multichunk-f32", 1000).reshape(10, 100),
               "bf16": bf16.reshape(4, 100),
               "u8": u8.copy()}
    write_plain(path, tensors, chunk_bytes=256)
    return contents(tensors)


@positive("codings", "both chunk codings: an F32 tensor whose exponent plane is zstd and whose "
                     "other planes are raw; a zstd U8 stream and a raw U8 stream")
def build_codings(path: Path) -> dict:
    tensors = {"mixed": mantissa_noise_f32("codings", 256),
               "zeros": np.zeros(200, np.uint8),
               "noise": np.frombuffer(prng_bytes("codings-noise", 200), np.uint8).copy()}
    write_plain(path, tensors)
    return contents(tensors)


def quant_reference_decode(path: Path, base_codes: dict | None = None,
                           codes_out: dict | None = None) -> Tensors:
    """Decode the quant tensors of a file (the others are skipped) with plain numpy,
    independently of the library's decoder (spec sections 10.6 and 10.8): unpack codes, undo a
    code delta against ``base_codes``, look levels up, place escaped values. Codes go to
    ``codes_out``."""
    from inshrink.container.reader import ContainerReader
    reader = ContainerReader(path)
    out = {}
    try:
        for entry in reader.index.tensors:
            stage = entry.codec[-1]
            if stage["id"] != "quant":
                continue
            modulus = entry.codec[0]["modulus"] if entry.codec[0]["id"] == "codedelta" else None
            all_codes = np.empty(entry.numel, np.int64)
            word = np.dtype(f"<u{entry.dtype.itemsize}")
            levels = np.frombuffer(bytes.fromhex(stage["levels"]), word)
            result = np.empty(entry.numel, word)
            for c in range(entry.chunk_count):
                s, t = entry.chunk_range(c)
                n = t - s
                codes_raw, gaps_raw, values_raw = (
                    zstandard.ZstdDecompressor().decompress(reader.read_chunk(ch))
                    if ch[4] == "zstd" else reader.read_chunk(ch)
                    for ch in (stream[c] for stream in entry.streams))
                raw = np.frombuffer(codes_raw, np.uint8)
                def unpacked(data, width):
                    bitstring = np.unpackbits(data, bitorder="little")
                    return bitstring[:n * width].reshape(n, width) @ (1 << np.arange(width))
                if stage["bits"] > 8:  # top 8 bits as bytes, then the low bits packed
                    low_bits = stage["bits"] - 8
                    codes = (raw[:n].astype(np.int64) << low_bits) + unpacked(raw[n:], low_bits)
                else:
                    codes = unpacked(raw, stage["bits"])
                if modulus is not None:  # G regrouped by the base code P: undo, then C = P - D
                    prev = base_codes[entry.name][s:t].astype(np.int64)
                    deltas = np.empty(n, np.int64)
                    deltas[np.argsort(prev, kind="stable")] = codes
                    codes = (prev - deltas) % modulus
                all_codes[s:t] = codes
                chunk = levels[codes] if levels.size else np.zeros(n, word)
                positions = np.cumsum(np.frombuffer(gaps_raw, "<u4").astype(np.int64) + 1) - 1
                chunk[positions] = np.frombuffer(values_raw, word)
                result[s:t] = chunk
            out[entry.name] = result.view(entry.dtype.numpy).reshape(entry.shape)
            if codes_out is not None:
                codes_out[entry.name] = all_codes.astype(np.uint16)
    finally:
        reader.close()
    return out


@positive("quant_f32", "stage quant (format 1.1) on F32: 16 levels incl. an exact zero level "
                       "(10% pruned), escaped outliers, NaN and ±inf; expected values from an "
                       "independent numpy decoder; a tensor report")
def build_quant_f32(path: Path) -> dict:
    x = (mantissa_noise_f32("quant-f32", 2048) - np.float32(1.5)).reshape(32, 64)
    x[0, :4] = [np.nan, np.inf, -np.inf, 1e6]
    policy = Policy(overrides={"*": QuantConfig(bins=15, prune=0.1, protect=0.002)})
    inshrink.save(path, {"layer.weight": x}, policy=policy, threads=1)
    return contents(quant_reference_decode(path))


@positive("quant_bf16", "stage quant on BF16 in the log domain (an exp_avg_sq-like tensor with "
                        "zeros), several chunks (chunk_bytes=2048), 16 levels in 4-bit codes")
def build_quant_bf16(path: Path) -> dict:
    raw = np.frombuffer(prng_bytes("quant-bf16", 4 * 3000), "<u4")
    v = np.exp(-(raw % 2000).astype(np.float32) / 100).astype(ml_dtypes.bfloat16)
    v[::97] = 0
    policy = Policy(overrides={"*": QuantConfig(bins=15, protect=0.0, domain="log")})
    with inshrink.Writer(path, threads=1, chunk_bytes=2048, policy=policy) as w:
        w.add("optimizer.state.0.exp_avg_sq", v.reshape(30, 100))
    return contents(quant_reference_decode(path))


@positive("quant_wide", "stage quant with 10-bit codes (600 levels): a byte plane of the codes' "
                        "top 8 bits, then their low 2 bits packed")
def build_quant_wide(path: Path) -> dict:
    x = (mantissa_noise_f32("quant-wide", 2048) - np.float32(1.5)).reshape(32, 64)
    policy = Policy(overrides={"*": QuantConfig(bins=600, protect=0.0)})
    inshrink.save(path, {"w": x}, policy=policy, threads=1)
    return contents(quant_reference_decode(path))


def delta_tensors() -> tuple[Tensors, Tensors]:
    """A base checkpoint and the next one: small drifts, a changed shape, a new tensor."""
    w = mantissa_noise_f32("delta-w", 1024).reshape(32, 32)
    drift = w.copy()
    drift[::3] += np.float32(2.0 ** -20)
    base = {"w": w, "ids": np.arange(300, dtype="<i8"), "gone": np.ones(4, "<f4"),
            "reshaped": np.zeros((2, 3), "<f2")}
    nxt = {"w": drift, "ids": np.arange(300, dtype="<i8"), "new": np.full(5, 7, "<i4"),
           "reshaped": np.zeros((3, 2), "<f2")}
    return base, nxt


def write_as_delta(path: Path, tensors: Tensors, base_file: dict, *,
                   base: Tensors | None = None, base_codes: dict | None = None,
                   policy: Policy | None = None) -> None:
    """Write ``tensors`` as a delta file against the base named by ``base_file`` (its exact
    lossless tensors ``base``, the codes of its quantized ones ``base_codes``): a whole file
    first, rewritten by :func:`inshrink.io.rebase.write_delta`, as :class:`inshrink.Series`
    does."""
    with tempfile.TemporaryDirectory() as tmp:
        whole = Path(tmp) / "whole.ink"
        with inshrink.Writer(whole, threads=1, policy=policy, keep_codes=True) as w:
            for name, arr in tensors.items():
                w.add(name, arr)
        write_delta(whole, path, src_codes=w.codes, base_exact=base or {},
                    base_codes=base_codes or {}, base_file=base_file)


@positive("delta_base", "keyframe of a keyframe + delta pair (the base of vector delta)")
def build_delta_base(path: Path) -> dict:
    base, _ = delta_tensors()
    write_plain(path, base)
    return contents(base)


@positive("delta", "delta file (format 1.2, feature bit delta): tensors XORed with those of "
                   "delta_base.ink (chain [xor, bytegroup]), a reshaped and a new tensor stored "
                   "standalone; base.sha256 is delta_base's decode digest by definition 1 (no "
                   "digest member); decode with delta_base.ink's tensors as the base",
          base="delta_base")
def build_delta(path: Path) -> dict:
    base, nxt = delta_tensors()
    return write_definition_1_delta(path, base, nxt, "delta_base.ink")


def write_definition_1_delta(path: Path, base: Tensors, nxt: Tensors, base_name: str) -> dict:
    """``nxt`` as a delta against ``base``, as format 1.2 wrote it: ``base.sha256`` by decode
    digest definition 1, no ``digest`` member."""
    base_file = {"file": base_name, "sha256": decode_digest(base, {}, version=1)}
    write_as_delta(path, nxt, base_file, base=base)
    return contents(nxt)


def qdelta_tensors() -> tuple[Tensors, Tensors]:
    w = (mantissa_noise_f32("qdelta-w", 4096) - np.float32(1.5)).reshape(64, 64)
    drift = w.copy()
    drift[::5] *= np.float32(1.01)
    return {"layer.weight": w}, {"layer.weight": drift}


QDELTA_POLICY = Policy.uniform(QuantConfig(bins=16, protect=0.002))


@positive("qdelta_base", "keyframe of a quantized keyframe + code delta pair")
def build_qdelta_base(path: Path) -> dict:
    base, _ = qdelta_tensors()
    inshrink.save(path, base, policy=QDELTA_POLICY, threads=1)
    return contents(quant_reference_decode(path))


@positive("qdelta", "code delta (stage codedelta, format 1.2): codes stored as (base - current) "
                    "mod B regrouped by the base code; base.sha256 by decode digest definition "
                    "1; decode with qdelta_base.ink's tensors and codes as the base",
          base="qdelta_base")
def build_qdelta(path: Path) -> dict:
    base, nxt = qdelta_tensors()
    with tempfile.TemporaryDirectory() as tmp:
        base_path = Path(tmp) / "qdelta_base.ink"
        with inshrink.Writer(base_path, threads=1, policy=QDELTA_POLICY, keep_codes=True) as w:
            w.add("layer.weight", base["layer.weight"])
        codes = w.codes
        base_file = {"file": "qdelta_base.ink", "sha256": decode_digest({}, codes, version=1)}
        reference_codes: dict = {}
        quant_reference_decode(base_path, codes_out=reference_codes)
    write_as_delta(path, {"layer.weight": nxt["layer.weight"]}, base_file, base_codes=codes,
                   policy=QDELTA_POLICY)
    return contents(quant_reference_decode(path, base_codes=reference_codes))


def digest2_tensors() -> tuple[Tensors, Tensors]:
    """Two consecutive checkpoints of a tiny training run: a 0-d step counter, BF16 and FP8
    weights, a quantized F32 matrix."""
    w = mantissa_noise_f32("digest2-w", 128).astype(ml_dtypes.bfloat16).reshape(8, 16)
    scale = (np.frombuffer(prng_bytes("digest2-scale", 16), np.uint8) & np.uint8(0x3F))
    q = (mantissa_noise_f32("digest2-q", 256) - np.float32(1.5)).reshape(16, 16)
    drift_w = w.copy()
    drift_w[::2] = (drift_w[::2].astype(np.float32) * np.float32(1.0078125)).astype(
        ml_dtypes.bfloat16)
    drift_q = q.copy()
    drift_q[::7] *= np.float32(1.001)
    base = {"optimizer.state.0.step": np.array(100.0, "<f4"), "model.w": w,
            "model.scale": scale.view(ml_dtypes.float8_e4m3fn), "model.q": q}
    nxt = {"optimizer.state.0.step": np.array(101.0, "<f4"), "model.w": drift_w,
           "model.scale": base["model.scale"].copy(), "model.q": drift_q}
    return base, nxt


DIGEST2_POLICY = Policy(overrides={"model.q": QuantConfig(bins=4, protect=0.0)})


def write_digest2_base(path: Path) -> tuple[Tensors, dict]:
    """Write the keyframe; return what it decodes to and its codes (by the reference decoder)."""
    base, _ = digest2_tensors()
    write_plain(path, base, policy=DIGEST2_POLICY)
    codes: dict = {}
    decoded = dict(base)
    decoded.update(quant_reference_decode(path, codes_out=codes))
    return decoded, codes


@positive("digest2_base", "keyframe of a keyframe + delta pair identified by decode digest "
                          "definition 2: a 0-d F32 tensor, a BF16 and an F8_E4M3 tensor, a "
                          "quantized F32 tensor (4 levels)")
def build_digest2_base(path: Path) -> dict:
    decoded, _ = write_digest2_base(path)
    return contents(decoded)


@positive("digest2", "delta file (format 1.5) whose base object carries \"digest\": 2: "
                     "base.sha256 is digest2_base's decode digest by definition 2 (section "
                     "23.1); tensors as [xor, bytegroup] and [codedelta, quant]; decode with "
                     "digest2_base.ink's lossless tensors and codes as the base",
          base="digest2_base")
def build_digest2(path: Path) -> dict:
    base, nxt = digest2_tensors()
    with tempfile.TemporaryDirectory() as tmp:
        decoded, codes = write_digest2_base(Path(tmp) / "digest2_base.ink")
    exact = {name: decoded[name] for name in decoded if name not in codes}
    base_file = base_reference("digest2_base.ink", exact, codes)
    write_as_delta(path, nxt, base_file, base=exact, base_codes=codes, policy=DIGEST2_POLICY)
    doc = index_doc(path.read_bytes())
    chains = {t["name"]: [s["id"] for s in t["codec"]] for t in doc["tensors"]}
    assert chains["model.w"] == ["xor", "bytegroup"], chains
    assert chains["model.q"] == ["codedelta", "quant"], chains
    result = dict(nxt)
    result.update(quant_reference_decode(path, base_codes=codes))
    return contents(result)


def digest1_scalar_tensors() -> tuple[Tensors, Tensors]:
    """A step counter (0-d) and a weight, at two steps."""
    w = mantissa_noise_f32("digest1-scalar-w", 64)
    drift = w.copy()
    drift[::3] *= np.float32(1.001)
    return ({"step": np.array(3.0, "<f4"), "w": w},
            {"step": np.array(4.0, "<f4"), "w": drift})


@positive("digest1_scalar_base", "keyframe of a keyframe + delta pair identified by decode "
                                 "digest definition 1, holding a 0-d F32 tensor")
def build_digest1_scalar_base(path: Path) -> dict:
    base, _ = digest1_scalar_tensors()
    write_plain(path, base)
    return contents(base)


@positive("digest1_scalar", "delta file as format 1.2 wrote it (no digest member): base.sha256 "
                            "is digest1_scalar_base's decode digest by definition 1, whose 0-d "
                            "tensor is hashed with the shape string (1,) (section 23.1); "
                            "decode with digest1_scalar_base.ink's tensors as the base",
          base="digest1_scalar_base")
def build_digest1_scalar(path: Path) -> dict:
    base, nxt = digest1_scalar_tensors()
    return write_definition_1_delta(path, base, nxt, "digest1_scalar_base.ink")


@positive("metadata", "user metadata (Unicode, empty value, escapes) and Unicode tensor names")
def build_metadata(path: Path) -> dict:
    metadata = {"format": "pt", "note": "h\u00e9llo \u2713 \u65e5\u672c", "empty": "",
                "quote\"key": "line\nbreak\ttab\\"}
    tensors = {"layer.0.w\u00e9ight": np.array([0.5, -0.25, 8.0], "<f2"),
               "\u043a\u043b\u044e\u0447": np.array([1, 2, 3], "<i4"),
               "\U0001f642": np.array([True, False])}
    write_plain(path, tensors, metadata)
    return contents(tensors, metadata)


SAFETENSORS_TEXT = ('{"__metadata__":{"format":"pt","source":"hand-made"},'
                    '"b":{"dtype":"BF16","shape":[2,3],"data_offsets":[8,20]},'
                    '"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}')


def safetensors_bytes() -> tuple[bytes, Tensors, dict[str, str], str]:
    """A small safetensors file whose header order differs from its data order."""
    text = SAFETENSORS_TEXT + " " * (-(8 + len(SAFETENSORS_TEXT)) % 8)
    a = np.array([1.5, -0.0], "<f4")
    b = bits([0x3F80, 0xBF80, 0x7FC0, 0x0001, 0xFF80, 0x4049], "<u2",
             ml_dtypes.bfloat16).reshape(2, 3)
    raw = len(text).to_bytes(8, "little") + text.encode() + a.tobytes() + b.tobytes()
    metadata = {"format": "pt", "source": "hand-made"}
    return raw, {"b": b, "a": a}, metadata, text


@positive("safetensors", "converted from safetensors: the original header text kept in "
                         "safetensors_header; converting back must reproduce "
                         "safetensors.safetensors byte for byte")
def build_safetensors(path: Path) -> dict:
    raw, tensors, metadata, text = safetensors_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src.safetensors"
        src.write_bytes(raw)
        compress_safetensors(src, path, threads=1)
    # The Writer adds tensors in data order; report them in that order.
    ordered = {"a": tensors["a"], "b": tensors["b"]}
    return contents(ordered, metadata, text)


@positive("alt_bytegroup", "bytegroup parameters other than the per-dtype defaults (word "
                           "smaller than the float word, rotation off for floats and on for "
                           "integers, word 8 across a C64 element, word 1 for wide types) and "
                           "chunk_elements=5 with a partial last chunk")
def build_alt_bytegroup(path: Path) -> dict:
    bg = lossless.ByteGroup
    f32 = bits(F32_SPECIAL[:12], "<u4", "<f4")
    f64 = bits(F64_SPECIAL[:12], "<u8", "<f8")
    i64 = int_extremes(np.int64)[:12]
    u32 = int_extremes(np.uint32)[:12]
    bf16 = bits(BF16_SPECIAL[:12], "<u2", ml_dtypes.bfloat16)
    c64 = mantissa_noise_f32("alt-c64", 24).view("<c8")
    specs = [("f32_w2_rotate", f32, bg(2, True), 5),
             ("f64_w4", f64, bg(4, False), 5),
             ("i64_w1", i64, bg(1, False), 5),
             ("u32_w4_rotate", u32, bg(4, True), 5),
             ("bf16_w1", bf16, bg(1, False), 5),
             ("c64_w8_rotate", c64, bg(8, True), 5)]
    write_custom(path, specs, {"layout": "non-default"})
    return contents({name: arr for name, arr, _, _ in specs}, {"layout": "non-default"})


@positive("forward_compat", "what a later 1.x writer may add and a 1.0 reader must accept: "
                            "minor version 7, optional feature bits set, unknown keys at the "
                            "top level and in a tensor entry (same data as minimal)")
def build_forward_compat(path: Path) -> dict:
    tensors = {"x": np.array([1.0, -2.0], "<f4")}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base.ink"
        write_plain(base, tensors)
        data = base.read_bytes()

    def add_keys(doc: dict) -> None:
        doc["tensors"][0]["x_future_hint"] = {"any": ["json", 1, None, True]}
        doc["x_future_section"] = [{"nested": {"deeper": []}}, 2.5, "text"]

    data = edit_index(data, add_keys)
    data = patch_header(data, minor=7, optional=(1 << 63) | 1)
    path.write_bytes(data)
    return contents(tensors)


@positive("zindex", "an index of more than 1 KiB, which the writer stores as one zstd frame "
                    "(required feature bit 1, zindex, minor version 3): 6 small tensors")
def build_zindex(path: Path) -> dict:
    tensors = {f"encoder.layers.{i}.attention.output.bias": mantissa_noise_f32(f"zindex-{i}", 3)
               for i in range(6)}
    write_plain(path, tensors)
    assert index_is_compressed(path.read_bytes())
    return contents(tensors)


def factored_reference_decode(path: Path) -> Tensors:
    """Decode the factored tensors of a file with plain numpy, independently of the library's
    decoder (spec section 10.9): per chunk, its row factors times the column factors, one
    multiplication in the tensor's dtype."""
    from inshrink.container.reader import ContainerReader
    reader = ContainerReader(path)
    out = {}
    try:
        for entry in reader.index.tensors:
            float_type = np.dtype(f"<f{entry.dtype.itemsize}")
            columns = np.frombuffer(bytes.fromhex(entry.codec[0]["columns"]), float_type)
            rows = []
            for chunk in entry.streams[0]:
                payload = reader.read_chunk(chunk)
                if chunk[4] == "zstd":
                    payload = zstandard.ZstdDecompressor().decompress(payload)
                rows.append(np.frombuffer(payload, float_type))
            matrix = np.concatenate(rows)[:, None] * columns[None, :]
            out[entry.name] = matrix.astype(float_type).reshape(entry.shape)
    finally:
        reader.close()
    return out


@positive("factored", "stage factored (format 1.4): an F32 exp_avg_sq-like tensor of shape "
                      "[12, 3, 20] (36 rows of 20 columns, one of them all zero) in three "
                      "chunks of 12 rows (chunk_bytes=1024), and an F64 matrix [10, 7] in "
                      "one chunk; expected values from an independent numpy decoder")
def build_factored(path: Path) -> dict:
    raw = np.frombuffer(prng_bytes("factored-f32", 4 * 720), "<u4")
    v = np.exp(-(raw % 1000).astype(np.float32) / 150).reshape(36, 20)
    v[5] = 0
    raw64 = np.frombuffer(prng_bytes("factored-f64", 4 * 70), "<u4")
    w = (raw64 % 997).astype(np.float64).reshape(10, 7) / 31
    policy = Policy(overrides={"*": QuantConfig(bins=2, domain="factored")})
    with inshrink.Writer(path, threads=1, chunk_bytes=1024, policy=policy) as writer:
        writer.add("optimizer.state.0.exp_avg_sq", v.reshape(12, 3, 20))
        writer.add("optimizer.state.1.exp_avg_sq", w)
    return contents(factored_reference_decode(path))


# --------------------------------------------------------------------------------------------
# Negative vectors
# --------------------------------------------------------------------------------------------

class Negative:
    """A negative vector: ``patch(base bytes)`` returns the bad file, which fails ``rule``."""

    def __init__(self, name, base, error, raised_by, rule, description, patch) -> None:
        self.name, self.base, self.error, self.rule = name, base, error, rule
        self.raised_by, self.description, self.patch = raised_by, description, patch


NEGATIVE: list[Negative] = []


def negative(name: str, base: str, error: str, raised_by: str, rule: str, description: str):
    assert hasattr(inshrink.errors, error), error
    assert raised_by in ("open", "read")

    def register(fn):
        NEGATIVE.append(Negative(name, base, error, raised_by, rule, description, fn))
        return fn
    return register


def first_chunk(data: bytes, tensor: int = 0, stream: int = 0, chunk: int = 0) -> list:
    return index_doc(data)["tensors"][tensor]["streams"][stream][chunk]


@negative("bad_magic", "minimal", "CorruptError", "open", "H-2",
          "first byte of the magic changed from 0x89 to 0x88")
def neg_bad_magic(data: bytes) -> bytes:
    return b"\x88" + data[1:]


@negative("truncated_tail", "minimal", "TruncatedError", "open", "T-1",
          "last byte removed: the file no longer ends with the magic")
def neg_truncated_tail(data: bytes) -> bytes:
    return data[:-1]


@negative("truncated_short", "minimal", "TruncatedError", "open", "H-1",
          "only the first 100 bytes (less than header + record header + tail)")
def neg_truncated_short(data: bytes) -> bytes:
    return data[:100]


@negative("bad_header_crc", "minimal", "ChecksumError", "open", "H-4",
          "header CRC field (offset 60) incremented")
def neg_bad_header_crc(data: bytes) -> bytes:
    crc = struct.unpack_from("<I", data, 60)[0]
    return patch_header(data, fix_crc=False, crc=(crc + 1) & 0xFFFFFFFF)


@negative("unsupported_major", "minimal", "UnsupportedVersionError", "open", "H-3",
          "major version 2, header CRC fixed")
def neg_unsupported_major(data: bytes) -> bytes:
    return patch_header(data, major=2)


@negative("unknown_required_feature", "minimal", "UnsupportedFeatureError", "open", "H-6",
          "required feature bit 63 (not defined) set, header CRC fixed")
def neg_unknown_required_feature(data: bytes) -> bytes:
    return patch_header(data, required=1 << 63)


@negative("zindex_bad_frame", "zindex", "CorruptError", "open", "I-0a",
          "the compressed index replaced by bytes that are not a zstd frame; record header and "
          "tail CRCs fixed")
def neg_zindex_bad_frame(data: bytes) -> bytes:
    return replace_index_payload(data, b"not a zstd frame")


@negative("zindex_no_size", "zindex", "CorruptError", "open", "I-0a",
          "the compressed index re-written as a zstd frame that does not declare its content "
          "size; record header and tail CRCs fixed")
def neg_zindex_no_size(data: bytes) -> bytes:
    text = json.dumps(index_doc(data), ensure_ascii=False, separators=(",", ":")).encode()
    frame = zstandard.ZstdCompressor(level=3, write_content_size=False).compress(text)
    return replace_index_payload(data, frame)


@negative("zindex_over_limit", "zindex", "LimitExceededError", "open", "I-0a",
          "the compressed index replaced by a small zstd frame that declares 64 MiB + 1 bytes "
          "of content (zeros); record header and tail CRCs fixed")
def neg_zindex_over_limit(data: bytes) -> bytes:
    frame = zstandard.ZstdCompressor(level=3, write_content_size=True).compress(
        bytes(layout.MAX_INDEX_BYTES + 1))
    return replace_index_payload(data, frame)


@negative("delta_without_base", "minimal", "CorruptError", "open", "I-16",
          "required feature bit 0 (delta) set, but the index names no base file; CRC fixed")
def neg_delta_without_base(data: bytes) -> bytes:
    return patch_header(data, required=1)


@negative("reserved_nonzero", "minimal", "CorruptError", "open", "H-5",
          "a reserved header byte (offset 40) set to 1, header CRC fixed")
def neg_reserved_nonzero(data: bytes) -> bytes:
    return patch_header(data, reserved=bytes(8) + b"\x01" + bytes(19))


@negative("bad_tail_crc", "minimal", "ChecksumError", "open", "T-2",
          "tail CRC field incremented")
def neg_bad_tail_crc(data: bytes) -> bytes:
    at = len(data) - layout.TAIL_SIZE + 20
    crc = struct.unpack_from("<I", data, at)[0]
    return data[:at] + struct.pack("<I", (crc + 1) & 0xFFFFFFFF) + data[at + 4:]


@negative("tail_pointer", "minimal", "CorruptError", "open", "T-4",
          "tail points 64 bytes before the index record (an aligned chunk record); tail CRC fixed")
def neg_tail_pointer(data: bytes) -> bytes:
    offset, payload = index_location(data)
    tail = layout.pack_tail(offset - layout.ALIGNMENT, payload)
    return data[:-layout.TAIL_SIZE] + tail


@negative("index_crc_mismatch", "minimal", "ChecksumError", "open", "R-5",
          "one byte of the index JSON changed ('\"x\"' -> '\"y\"'); CRCs left as they were")
def neg_index_crc_mismatch(data: bytes) -> bytes:
    offset, payload = index_location(data)
    start = offset + layout.RECORD_HEADER_SIZE
    new = payload.replace(b'"name":"x"', b'"name":"y"', 1)
    assert new != payload
    return data[:start] + new + data[start + len(payload):]


@negative("index_not_json", "minimal", "CorruptError", "open", "I-1",
          "index payload is not JSON; record header and tail CRCs fixed")
def neg_index_not_json(data: bytes) -> bytes:
    return replace_index_payload(data, b"{\"tensors\":[}")


@negative("duplicate_key", "minimal", "CorruptError", "open", "I-1",
          "the tensor entry has two 'dtype' keys; CRCs fixed")
def neg_duplicate_key(data: bytes) -> bytes:
    _, payload = index_location(data)
    new = payload.replace(b'"dtype":"F32",', b'"dtype":"F32","dtype":"F32",', 1)
    assert new != payload
    return replace_index_payload(data, new)


@negative("unknown_codec_id", "minimal", "UnknownCodecError", "open", "C-1",
          "codec stage id 'bytegroup' replaced by 'bytegroup2'; CRCs fixed")
def neg_unknown_codec_id(data: bytes) -> bytes:
    def edit(doc):
        doc["tensors"][0]["codec"][0]["id"] = "bytegroup2"
    return edit_index(data, edit)


@negative("unknown_dtype", "minimal", "UnknownCodecError", "open", "I-8",
          "dtype 'F32' replaced by 'F24'; CRCs fixed")
def neg_unknown_dtype(data: bytes) -> bytes:
    def edit(doc):
        doc["tensors"][0]["dtype"] = "F24"
    return edit_index(data, edit)


@negative("unknown_coding", "minimal", "UnknownCodecError", "open", "I-13",
          "chunk coding 'raw' replaced by 'lz4'; CRCs fixed")
def neg_unknown_coding(data: bytes) -> bytes:
    def edit(doc):
        doc["tensors"][0]["streams"][0][0][4] = "lz4"
    return edit_index(data, edit)


@negative("ndim_limit", "scalar", "LimitExceededError", "open", "I-9",
          "a 0-d tensor's shape replaced by 33 ones (one element, so chunking stays valid); "
          "CRCs fixed")
def neg_ndim_limit(data: bytes) -> bytes:
    def edit(doc):
        doc["tensors"][0]["shape"] = [1] * 33
    return edit_index(data, edit)


@negative("overlapping_records", "codings", "CorruptError", "open", "I-15",
          "stream 2's chunk offset moved 64 bytes into stream 1's 288-byte record; CRCs fixed")
def neg_overlapping_records(data: bytes) -> bytes:
    def edit(doc):
        streams = doc["tensors"][0]["streams"]
        assert streams[1][0][1] > layout.ALIGNMENT  # record spans past the next aligned offset
        streams[2][0][0] = streams[1][0][0] + layout.ALIGNMENT
    return edit_index(data, edit)


@negative("misaligned_chunk", "minimal", "CorruptError", "open", "I-13",
          "a chunk offset moved by 8 bytes (not a multiple of 64); CRCs fixed")
def neg_misaligned_chunk(data: bytes) -> bytes:
    def edit(doc):
        doc["tensors"][0]["streams"][3][0][0] += 8
    return edit_index(data, edit)


@negative("chunk_past_data", "minimal", "CorruptError", "open", "I-13",
          "a chunk offset points at the index record (outside the data section); CRCs fixed")
def neg_chunk_past_data(data: bytes) -> bytes:
    offset, _ = index_location(data)

    def edit(doc):
        doc["tensors"][0]["streams"][3][0][0] = offset
    return edit_index(data, edit)


@negative("stream_count", "minimal", "CorruptError", "open", "C-4",
          "an F32 tensor with bytegroup word 4 lists only 3 streams; CRCs fixed")
def neg_stream_count(data: bytes) -> bytes:
    def edit(doc):
        del doc["tensors"][0]["streams"][3]
    return edit_index(data, edit)


@negative("record_mismatch", "minimal", "CorruptError", "read", "R-4",
          "index says a chunk payload is 1 byte, its record header says 2; CRCs fixed")
def neg_record_mismatch(data: bytes) -> bytes:
    def edit(doc):
        doc["tensors"][0]["streams"][1][0][1] = 1
    return edit_index(data, edit)


@negative("record_header_crc", "minimal", "ChecksumError", "read", "R-2",
          "a reserved byte of a chunk record header set to 1; that header's CRC left as it was")
def neg_record_header_crc(data: bytes) -> bytes:
    at = first_chunk(data, stream=2)[0] + 20
    return data[:at] + b"\x01" + data[at + 1:]


@negative("chunk_crc_mismatch", "minimal", "ChecksumError", "read", "R-5",
          "one byte of a chunk payload changed; CRCs left as they were")
def neg_chunk_crc_mismatch(data: bytes) -> bytes:
    at = first_chunk(data, stream=0)[0] + layout.RECORD_HEADER_SIZE
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]


@negative("raw_size_mismatch", "minimal", "CorruptError", "read", "D-1",
          "a raw chunk's payload shortened to 1 byte while its decoded size stays 2; record "
          "header, index entry and CRCs fixed")
def neg_raw_size_mismatch(data: bytes) -> bytes:
    chunk = first_chunk(data, stream=0)
    offset = chunk[0]
    new_payload = data[offset + 32:offset + 33]
    data = replace_chunk_payload(data, offset, new_payload)

    def edit(doc):
        doc["tensors"][0]["streams"][0][0][1:3] = [len(new_payload), layout.crc32(new_payload)]
    return edit_index(data, edit)


@negative("zstd_size_mismatch", "codings", "CorruptError", "read", "D-3",
          "a zstd chunk replaced by a valid frame whose content size is one byte more than the "
          "index's decoded size; record header, index entry and CRCs fixed")
def neg_zstd_size_mismatch(data: bytes) -> bytes:
    chunk = first_chunk(data, stream=0)
    assert chunk[4] == "zstd"
    offset, size = chunk[0], chunk[3]
    frame = zstandard.ZstdCompressor(level=3, write_content_size=True).compress(
        b"\x7f" * (size + 1))
    data = replace_chunk_payload(data, offset, frame)

    def edit(doc):
        doc["tensors"][0]["streams"][0][0][1:3] = [len(frame), layout.crc32(frame)]
    return edit_index(data, edit)


@negative("zstd_trailing_bytes", "codings", "CorruptError", "read", "D-4",
          "four bytes appended after a valid zstd frame; record header, index entry and CRCs "
          "fixed")
def neg_zstd_trailing_bytes(data: bytes) -> bytes:
    chunk = first_chunk(data, stream=0)
    assert chunk[4] == "zstd"
    offset, length = chunk[0], chunk[1]
    start = offset + layout.RECORD_HEADER_SIZE
    payload = data[start:start + length] + b"JUNK"
    data = replace_chunk_payload(data, offset, payload)

    def edit(doc):
        doc["tensors"][0]["streams"][0][0][1:3] = [len(payload), layout.crc32(payload)]
    return edit_index(data, edit)


@negative("zstd_empty_trailing_bytes", "quant_wide", "CorruptError", "read", "D-4",
          "a 0-byte stream's raw payload replaced by a zstd frame declaring 0 bytes and four "
          "bytes after it; record header, index entry and CRCs fixed")
def neg_zstd_empty_trailing_bytes(data: bytes) -> bytes:
    chunk = first_chunk(data, stream=1)
    assert chunk[3] == 0 and chunk[4] == "raw"
    frame = zstandard.ZstdCompressor(write_content_size=True, write_checksum=False).compress(b"")
    payload = frame + b"JUNK"
    data = replace_chunk_payload(data, chunk[0], payload)

    def edit(doc):
        doc["tensors"][0]["streams"][1][0][1:3] = [len(payload), layout.crc32(payload)]
        doc["tensors"][0]["streams"][1][0][4] = "zstd"
    return edit_index(data, edit)


@negative("quant_code_range", "quant_f32", "CorruptError", "read", "D-5",
          "the level table cut to 4 levels, so stored codes exceed it; CRCs fixed")
def neg_quant_code_range(data: bytes) -> bytes:
    def edit(doc):
        stage = doc["tensors"][0]["codec"][0]
        stage["levels"] = stage["levels"][:4 * 2 * 4]
    return edit_index(data, edit)


@negative("quant_bits", "quant_f32", "CorruptError", "open", "C-3",
          "quant stage with bits 0; CRCs fixed")
def neg_quant_bits(data: bytes) -> bytes:
    def edit(doc):
        doc["tensors"][0]["codec"][0]["bits"] = 0
    return edit_index(data, edit)


@negative("factored_columns", "factored", "CorruptError", "open", "C-5",
          "the first tensor's column factors cut from 20 to 19, so its chunks of 240 "
          "elements do not hold whole rows; CRCs fixed")
def neg_factored_columns(data: bytes) -> bytes:
    def edit(doc):
        stage = doc["tensors"][0]["codec"][0]
        stage["columns"] = stage["columns"][:19 * 2 * 4]
    return edit_index(data, edit)


@negative("factored_dtype", "factored", "CorruptError", "open", "C-3",
          "the F32 tensor of the factored stage declared F16 (a dtype the stage does not "
          "support); CRCs fixed")
def neg_factored_dtype(data: bytes) -> bytes:
    def edit(doc):
        doc["tensors"][0]["dtype"] = "F16"
    return edit_index(data, edit)


@negative("zstd_window", "codings", "CorruptError", "read", "D-2a",
          "the zstd chunk of the 200 zero bytes replaced by a valid frame of them (one RLE "
          "block) whose header declares a Window_Size of 2^28; record header, index entry and "
          "CRCs fixed")
def neg_zstd_window(data: bytes) -> bytes:
    chunk = first_chunk(data, tensor=1, stream=0)
    assert chunk[4] == "zstd" and chunk[3] == 200
    size = chunk[3]
    frame = (b"\x28\xb5\x2f\xfd"            # magic
             + bytes([0x80, 0x90])             # 4-byte content size, window 2^(10+18)
             + struct.pack("<I", size)
             + ((size << 3) | 0b011).to_bytes(3, "little")  # last block, RLE, size
             + b"\x00")
    assert zstandard.get_frame_parameters(frame).window_size == 1 << 28
    data = replace_chunk_payload(data, chunk[0], frame)

    def edit(doc):
        doc["tensors"][1]["streams"][0][0][1:3] = [len(frame), layout.crc32(frame)]
    return edit_index(data, edit)


@negative("quant_levels_space", "quant_f32", "CorruptError", "open", "C-3",
          "a space inserted after each of the first 8 bytes of the quant level table (the "
          "length stays a whole number of elements); CRCs fixed")
def neg_quant_levels_space(data: bytes) -> bytes:
    def edit(doc):
        stage = doc["tensors"][0]["codec"][0]
        hexed = stage["levels"]
        stage["levels"] = "".join(hexed[i:i + 2] + " " for i in range(0, 16, 2)) + hexed[16:]
        assert bytes.fromhex(stage["levels"]) == bytes.fromhex(hexed)
    return edit_index(data, edit)


@negative("report_not_flat", "quant_f32", "CorruptError", "open", "I-11a",
          "a value of the tensor's report replaced by an array; CRCs fixed")
def neg_report_not_flat(data: bytes) -> bytes:
    def edit(doc):
        doc["tensors"][0]["report"]["bits"] = [4]
    return edit_index(data, edit)


@negative("base_extra_member", "delta", "CorruptError", "open", "I-5a",
          "the base object gets a member 'x_note' (the object is closed); CRCs fixed")
def neg_base_extra_member(data: bytes) -> bytes:
    def edit(doc):
        doc["base"]["x_note"] = "not allowed"
    return edit_index(data, edit)


@negative("xor_without_base", "delta", "CorruptError", "open", "C-2",
          "the base object removed and the delta feature bit cleared, so an [xor, bytegroup] "
          "tensor has nothing to decode against; CRCs fixed")
def neg_xor_without_base(data: bytes) -> bytes:
    def edit(doc):
        del doc["base"]
    data = edit_index(data, edit)
    return patch_header(data, required=header_field(data, "required") & ~layout.FEATURE_DELTA)


@negative("codedelta_modulus_null", "qdelta", "CorruptError", "open", "C-3a",
          "the codedelta stage's modulus replaced by null; CRCs fixed")
def neg_codedelta_modulus_null(data: bytes) -> bytes:
    def edit(doc):
        assert doc["tensors"][0]["codec"][0]["id"] == "codedelta"
        doc["tensors"][0]["codec"][0]["modulus"] = None
    return edit_index(data, edit)


@negative("index_expansion", "zindex", "LimitExceededError", "open", "I-0a",
          "the compressed index replaced by a frame of the same JSON followed by 2 MiB of "
          "spaces (valid JSON), more than 4 x the file size and more than 1 MiB; record "
          "header and tail CRCs fixed")
def neg_index_expansion(data: bytes) -> bytes:
    text = dump_index(index_doc(data)) + b" " * (2 << 20)
    frame = zstandard.ZstdCompressor(level=19, write_content_size=True).compress(text)
    data = replace_index_payload(data, frame)
    assert len(text) > layout.max_index_text(len(data))
    return data


@negative("tensor_count", "zindex", "LimitExceededError", "open", "I-3",
          "1,200 empty tensors added to a compressed index: more than 1,024 + file size / 64; "
          "CRCs fixed")
def neg_tensor_count(data: bytes) -> bytes:
    def edit(doc):
        doc["tensors"] += [{"name": f"e{i}", "dtype": "U8", "shape": [0], "chunk_elements": 1,
                            "codec": [{"id": "bytegroup", "word": 1, "rotate": False}],
                            "streams": [[]]} for i in range(1200)]
    data = edit_index(data, edit)
    assert len(index_doc(data)["tensors"]) > layout.max_tensors(len(data))
    return data


# --------------------------------------------------------------------------------------------
# Expected values, hexdump, manifest
# --------------------------------------------------------------------------------------------

def expected_json(vector: Positive, result: dict) -> dict:
    tensors = []
    for name, arr in result["tensors"].items():
        dt = dtypes.of_numpy(arr.dtype)
        raw = np.ascontiguousarray(arr).astype(dt.numpy, copy=False).tobytes()
        tensors.append({"name": name, "dtype": dt.name, "shape": list(arr.shape),
                        "nbytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest(),
                        "hex": raw.hex()})
    return {"format_version": FORMAT_VERSION, "vector": vector.name,
            "description": vector.covers, "metadata": result["metadata"],
            "safetensors_header": result["safetensors_header"], "tensors": tensors}


def _hex_lines(data: bytes, base: int, width: int = 16) -> list[str]:
    lines = []
    for i in range(0, len(data), width):
        part = data[i:i + width]
        text = "".join(chr(b) if 0x20 <= b < 0x7F else "." for b in part)
        lines.append(f"{base + i:08x}  {part.hex(' '):<{3 * width - 1}}  |{text}|")
    return lines


def pretty_json(value, indent: str = "") -> str:
    """Indented JSON that keeps arrays of scalars (shapes, chunk entries) on one line."""
    inner = indent + "  "
    if isinstance(value, dict) and value:
        items = [f"{inner}{json.dumps(k, ensure_ascii=False)}: {pretty_json(v, inner)}"
                 for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(value, list) and any(isinstance(v, (list, dict)) for v in value):
        items = [inner + pretty_json(v, inner) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + indent + "]"
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def hexdump_markdown(data: bytes) -> str:
    """An annotated dump of the minimal vector, one structure at a time."""
    out: list[str] = []

    def field(offset: int, size: int, label: str) -> None:
        part = data[offset:offset + size]
        for i in range(0, max(size, 1), 16):
            out.append(f"{offset + i:08x}  {part[i:i + 16].hex(' '):<47}  "
                       f"{label if i == 0 else '(continued)'}")

    def pad(start: int, stop: int) -> None:
        if stop > start:
            assert data[start:stop] == bytes(stop - start)
            out.append(f"{start:08x}  {'00 .. 00':<47}  padding: {stop - start} zero bytes "
                       f"up to offset {stop:#x}")

    magic, major, minor, size, req, opt, _, hcrc = HEADER.unpack(data[:64])
    index_offset, index_length, index_crc = layout.parse_tail(data[-32:])
    index_payload = data[index_offset + 32:index_offset + 32 + index_length]
    doc = json.loads(index_payload)
    tensor = doc["tensors"][0]

    out.append("# Annotated hex dump of `minimal.ink`")
    out.append("")
    out.append("Generated by `make_vectors.py`; normative definitions are in "
               "[`../FORMAT.md`](../FORMAT.md). All integers are little-endian; offsets are "
               "absolute. The file holds one tensor `x`, dtype `F32`, shape `[2]`, values "
               "`[1.0, -2.0]`.")
    out.append("")
    out.append(f"File size: {len(data)} bytes = index record offset {index_offset} + 32 + "
               f"index length {index_length} + 32.")
    out.append("")
    out.append("## Byte planes")
    out.append("")
    out.append("The `bytegroup` stage (word 4, rotate true) turns each element into a 32-bit "
               "little-endian word, rotates it left by one bit, and sends byte `3-k` of the "
               "rotated word to plane `k`:")
    out.append("")
    out.append("| element | bits | rotated left by 1 | plane 0 | plane 1 | plane 2 | plane 3 |")
    out.append("|---|---|---|---|---|---|---|")
    for value in np.array([1.0, -2.0], "<f4"):
        v = int(value.view("<u4"))
        r = ((v << 1) | (v >> 31)) & 0xFFFFFFFF
        planes = " | ".join(f"`{(r >> (8 * (3 - k))) & 0xFF:02x}`" for k in range(4))
        out.append(f"| {float(value)} | `{v:08x}` | `{r:08x}` | {planes} |")
    out.append("")
    out.append("Each plane holds 2 bytes; zstd cannot shrink 2 bytes, so every chunk is stored "
               "`raw`.")
    out.append("")
    out.append("## Dump")
    out.append("")
    out.append("```")
    out.append("offset    bytes                                            meaning")
    out.append("--- header (64 bytes) ---")
    field(0, 8, f"magic {magic!r}")
    field(8, 2, f"major version = {major}")
    field(10, 2, f"minor version = {minor}")
    field(12, 4, f"header size = {size}")
    field(16, 8, f"required features = {req:#x}")
    field(24, 8, f"optional features = {opt:#x}")
    field(32, 28, "reserved, zero")
    field(60, 4, f"header CRC-32 of bytes 0..59 = {hcrc:#010x}")
    previous_end = 64
    per_chunk = tensor["chunk_elements"]
    numel = int(np.prod(tensor["shape"]))
    records = sorted((c[0], k, i, c) for k, s in enumerate(tensor["streams"])
                     for i, c in enumerate(s))
    for offset, k, i, chunk in records:
        start, stop = i * per_chunk, min((i + 1) * per_chunk, numel)
        label = f"stream {k} (plane {k}), chunk {i}"
        pad(previous_end, offset)
        tag, kind, _, length, pcrc, _, rcrc = struct.unpack_from("<4sB3sQI8sI", data, offset)
        out.append(f"--- chunk record: {label}, coding {chunk[4]}, decoded size {chunk[3]} ---")
        field(offset, 4, f"record tag {tag!r}")
        field(offset + 4, 1, f"kind = {kind} (chunk)")
        field(offset + 5, 3, "reserved, zero")
        field(offset + 8, 8, f"payload length = {length}")
        field(offset + 16, 4, f"payload CRC-32 = {pcrc:#010x} (index: {pcrc})")
        field(offset + 20, 8, "reserved, zero")
        field(offset + 28, 4, f"record header CRC-32 of bytes 0..27 = {rcrc:#010x}")
        field(offset + 32, length, f"payload ({chunk[4]}): plane {k} bytes of elements "
                                   f"[{start}, {stop})")
        previous_end = offset + 32 + length
    pad(previous_end, index_offset)
    tag, kind, _, length, pcrc, _, rcrc = struct.unpack_from("<4sB3sQI8sI", data, index_offset)
    out.append("--- index record ---")
    field(index_offset, 4, f"record tag {tag!r}")
    field(index_offset + 4, 1, f"kind = {kind} (index)")
    field(index_offset + 5, 3, "reserved, zero")
    field(index_offset + 8, 8, f"payload length = {length}")
    field(index_offset + 16, 4, f"payload CRC-32 = {pcrc:#010x}")
    field(index_offset + 20, 8, "reserved, zero")
    field(index_offset + 28, 4, f"record header CRC-32 of bytes 0..27 = {rcrc:#010x}")
    out.append(f"--- index payload: {index_length} bytes of UTF-8 JSON ---")
    out.extend(_hex_lines(index_payload, index_offset + 32))
    tail = len(data) - 32
    out.append("--- tail (32 bytes, immediately after the index payload, not aligned) ---")
    field(tail, 8, f"index record offset = {index_offset}")
    field(tail + 8, 8, f"index payload length = {index_length}")
    field(tail + 16, 4, f"index payload CRC-32 = {index_crc:#010x}")
    field(tail + 20, 4, f"tail CRC-32 of tail bytes 0..19 = "
                        f"{struct.unpack_from('<I', data, tail + 20)[0]:#010x}")
    field(tail + 24, 8, "magic again")
    out.append("```")
    out.append("")
    out.append("## The index, pretty-printed")
    out.append("")
    out.append("```json")
    out.append(pretty_json(doc))
    out.append("```")
    out.append("")
    out.append("Each chunk is `[offset, length, crc, size, coding]`: record offset, payload "
               "bytes, payload CRC-32, decoded bytes, and `raw` or `zstd`.")
    out.append("")
    return "\n".join(out)


def build_positive(vector: Positive, out_dir: Path) -> tuple[Path, dict]:
    """Write ``NAME.ink`` into ``out_dir`` and return its path and expected JSON."""
    path = out_dir / f"{vector.name}.ink"
    result = vector.build(path)
    return path, expected_json(vector, result)


def build_negative(vector: Negative, base_dir: Path, out_dir: Path) -> Path:
    path = out_dir / f"{vector.name}.ink"
    path.write_bytes(vector.patch((base_dir / f"{vector.base}.ink").read_bytes()))
    return path


def write_json(path: Path, doc) -> None:
    path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def manifest() -> dict:
    return {
        "format_version": FORMAT_VERSION,
        "generator": {"script": "make_vectors.py", "zstd": ZSTD_VERSION,
                      "python-zstandard": zstandard.__version__},
        "positive": [{"name": v.name, "file": f"{v.name}.ink",
                      "expected": f"{v.name}.expected.json", "covers": v.covers,
                      **({"base": f"{v.base}.ink"} if v.base else {})}
                     for v in POSITIVE],
        "negative": [{"name": v.name, "file": f"{v.name}.ink", "base": v.base,
                      "error": v.error, "raised_by": v.raised_by, "rule": v.rule,
                      "description": v.description}
                     for v in NEGATIVE],
        "extra_files": {"safetensors.safetensors": "original of safetensors.ink",
                        "minimal.hexdump.md": "annotated dump of minimal.ink"},
    }


def generate(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for vector in POSITIVE:
        _, expected = build_positive(vector, out_dir)
        write_json(out_dir / f"{vector.name}.expected.json", expected)
    for vector in NEGATIVE:
        build_negative(vector, out_dir, out_dir)
    (out_dir / "safetensors.safetensors").write_bytes(safetensors_bytes()[0])
    (out_dir / "minimal.hexdump.md").write_text(
        hexdump_markdown((out_dir / "minimal.ink").read_bytes()), encoding="utf-8")
    write_json(out_dir / "manifest.json", manifest())
    generate_array(out_dir / "array")


# --------------------------------------------------------------------------------------------
# Array frames (spec section 24): vectors in array/, with their own manifest
# --------------------------------------------------------------------------------------------

ARRAY_DIR = HERE / "array"


class ArrayPositive:
    """A positive array vector: ``build()`` gives the array and the ``encode`` arguments."""

    def __init__(self, name: str, covers: str,
                 build: Callable[[], tuple[np.ndarray, dict]]) -> None:
        self.name, self.covers, self.build = name, covers, build


class ArrayNegative:
    """A negative array vector: ``patch`` turns the frame of positive ``base`` into it."""

    def __init__(self, name: str, base: str, error: str, rule: str, description: str,
                 patch: Callable[[bytes], bytes]) -> None:
        self.name, self.base, self.error, self.rule = name, base, error, rule
        self.description, self.patch = description, patch


def _array_quant_input() -> np.ndarray:
    u = np.frombuffer(prng_bytes("array-quant", 4 * 4 * 2000), "<u4") / 2.0**32
    x = (u.reshape(4, -1).sum(axis=0) - 2.0).astype("<f4")  # bell-shaped: codes compress
    x[[5, 77, 1300]] = [40.0, -55.5, np.inf]  # outliers: escaped, exact
    return x.reshape(40, 50)


ARRAY_POSITIVE = [
    ArrayPositive("f32", "F32 lossless: special values (signed zeros, infinities, NaN payloads, "
                  "subnormals) and mantissa noise, shape [4, 20], three chunks "
                  "(chunk_elements 32, the last partial)",
                  lambda: (np.concatenate([bits(F32_SPECIAL, "<u4", "<f4"),
                                           mantissa_noise_f32("array-f32", 60)]).reshape(4, 20),
                           {"chunk_bytes": 128})),
    ArrayPositive("bf16", "BF16 lossless: special values, shape [2, 3, 5]",
                  lambda: (np.concatenate([bits(BF16_SPECIAL, "<u2", ml_dtypes.bfloat16),
                                           bits(BF16_SPECIAL[:11], "<u2", ml_dtypes.bfloat16)]
                                          ).reshape(2, 3, 5), {})),
    ArrayPositive("scalar", "a 0-d F64 array (shape [], one chunk)",
                  lambda: (np.array(-2.75, "<f8"), {})),
    ArrayPositive("empty", "an F32 array of shape [3, 0]: no chunks, chunks is [], no payload",
                  lambda: (np.zeros((3, 0), "<f4"), {})),
    ArrayPositive("ints", "I16 lossless, with its extremes",
                  lambda: (int_extremes(np.int16), {})),
    ArrayPositive("quant", "F32 quantized to 16 levels (stage quant, 3 streams per chunk) with "
                  "escaped outliers and a report; the expected values are the decoded ones",
                  lambda: (_array_quant_input(),
                           {"bins": 16, "protect": 0.001, "chunk_bytes": 4096})),
]


def _frame_parts(data: bytes) -> tuple[dict, bytes]:
    (length,) = struct.unpack_from("<I", data, 5)
    return json.loads(data[9:9 + length]), data[9 + length:]


def _frame(header: dict, payloads: bytes, *, head: bytes = b"INKA\x01") -> bytes:
    text = json.dumps(header, separators=(",", ":")).encode()
    return head + struct.pack("<I", len(text)) + text + payloads


def _edit_frame(edit: Callable[[dict], None]) -> Callable[[bytes], bytes]:
    def patch(data: bytes) -> bytes:
        header, payloads = _frame_parts(data)
        edit(header)
        return _frame(header, payloads)
    return patch


def _duplicate_dtype(data: bytes) -> bytes:
    header, payloads = _frame_parts(data)
    text = json.dumps(header, separators=(",", ":"))
    text = text.replace('"dtype":"F32"', '"dtype":"F32","dtype":"F32"', 1)
    return b"INKA\x01" + struct.pack("<I", len(text)) + text.encode() + payloads


def _header_past_end(data: bytes) -> bytes:
    return data[:5] + struct.pack("<I", len(data) - 9 + 1) + data[9:]


def _zstd_size(data: bytes) -> bytes:
    """The first zstd payload replaced by a frame of its content and one more byte."""
    header, payloads = _frame_parts(data)
    offset = 0
    for chunk in header["chunks"]:
        for stream in chunk:
            coding, length, size = stream
            if coding == "zstd":
                content = zstandard.ZstdDecompressor().decompress(
                    payloads[offset:offset + length])
                frame = zstandard.ZstdCompressor(write_content_size=True).compress(
                    content + b"\0")
                stream[1] = len(frame)
                return _frame(header, payloads[:offset] + frame + payloads[offset + length:])
            offset += length
    raise AssertionError("no zstd payload")


ARRAY_NEGATIVE = [
    ArrayNegative("bad_magic", "f32", "CorruptError", "A-1", "magic INKB",
                  lambda d: b"INKB" + d[4:]),
    ArrayNegative("short", "f32", "CorruptError", "A-1", "only the first 7 bytes",
                  lambda d: d[:7]),
    ArrayNegative("bad_version", "f32", "UnsupportedVersionError", "A-2", "version byte 2",
                  lambda d: d[:4] + b"\x02" + d[5:]),
    ArrayNegative("header_past_end", "f32", "CorruptError", "A-3",
                  "header_length one more than the bytes after offset 9", _header_past_end),
    ArrayNegative("duplicate_key", "f32", "CorruptError", "A-4",
                  "the header with a second dtype member", _duplicate_dtype),
    ArrayNegative("extra_member", "f32", "CorruptError", "A-5",
                  "a member x_note added to the header",
                  _edit_frame(lambda h: h.update(x_note="hi"))),
    ArrayNegative("unknown_dtype", "f32", "UnknownCodecError", "A-6", "dtype F24",
                  _edit_frame(lambda h: h.update(dtype="F24"))),
    ArrayNegative("ndim_limit", "scalar", "LimitExceededError", "A-7",
                  "33 dimensions of size 1", _edit_frame(lambda h: h.update(shape=[1] * 33))),
    ArrayNegative("empty_huge_shape", "empty", "LimitExceededError", "A-7",
                  "shape [2^62, 0]: no element, but non-zero dimensions over 2^48 bytes",
                  _edit_frame(lambda h: h.update(shape=[1 << 62, 0]))),
    ArrayNegative("delta_chain", "f32", "CorruptError", "C-2",
                  'codec [{"id": "xor"}, bytegroup]',
                  _edit_frame(lambda h: h.update(codec=[{"id": "xor"}, *h["codec"]]))),
    ArrayNegative("chunk_count", "f32", "CorruptError", "A-11",
                  "the last chunk entry removed", _edit_frame(lambda h: h["chunks"].pop())),
    ArrayNegative("stream_size", "f32", "CorruptError", "A-12", "a stream size one byte short",
                  _edit_frame(lambda h: h["chunks"][0][0].__setitem__(
                      2, h["chunks"][0][0][2] - 1))),
    ArrayNegative("trailing_bytes", "f32", "CorruptError", "A-13",
                  "a byte appended after the payloads", lambda d: d + b"\0"),
    ArrayNegative("zstd_size", "quant", "CorruptError", "D-3",
                  "a zstd payload replaced by a frame of its content and one more byte "
                  "(its length in the header updated, its size not)", _zstd_size),
]


def build_array_positive(vector: ArrayPositive) -> tuple[bytes, dict]:
    """The frame of one positive array vector and its expected JSON."""
    from inshrink.io import frame as array_frame

    x, kwargs = vector.build()
    data = array_frame.encode(x, **kwargs)
    decoded = array_frame.decode(data)
    if "bins" not in kwargs:
        assert decoded.tobytes() == x.tobytes()
    raw = decoded.tobytes()
    return data, {"vector": vector.name, "description": vector.covers,
                  "frame_version": data[4], "dtype": dtypes.of_numpy(decoded.dtype).name,
                  "shape": list(decoded.shape), "nbytes": len(raw),
                  "sha256": hashlib.sha256(raw).hexdigest(), "hex": raw.hex(),
                  "report": array_frame.report(data)}


def array_manifest() -> dict:
    return {"frame_version": 1,
            "generator": {"script": "make_vectors.py", "zstd": ZSTD_VERSION,
                          "python-zstandard": zstandard.__version__},
            "positive": [{"name": v.name, "file": f"{v.name}.inka",
                          "expected": f"{v.name}.expected.json", "covers": v.covers}
                         for v in ARRAY_POSITIVE],
            "negative": [{"name": v.name, "file": f"{v.name}.inka", "base": v.base,
                          "error": v.error, "rule": v.rule, "description": v.description}
                         for v in ARRAY_NEGATIVE]}


def generate_array(out_dir: Path) -> None:
    """Write the array-frame vectors and their manifest into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    frames = {}
    for vector in ARRAY_POSITIVE:
        frames[vector.name], expected = build_array_positive(vector)
        (out_dir / f"{vector.name}.inka").write_bytes(frames[vector.name])
        write_json(out_dir / f"{vector.name}.expected.json", expected)
    for vector in ARRAY_NEGATIVE:
        (out_dir / f"{vector.name}.inka").write_bytes(vector.patch(frames[vector.base]))
    write_json(out_dir / "manifest.json", array_manifest())


# --------------------------------------------------------------------------------------------
# Golden vectors per format version: frozen, never regenerated
# --------------------------------------------------------------------------------------------

def freeze(vectors_dir: Path, version: str, source: str) -> Path:
    """Copy the positive vectors of ``vectors_dir`` (and the files they need) into
    ``HERE / f"v{version}"`` with a manifest naming their source; run once per released
    format version, when it is superseded. ``generate`` never touches these directories."""
    import shutil

    doc = json.loads((vectors_dir / "manifest.json").read_text(encoding="utf-8"))
    assert doc["format_version"] == version, (doc["format_version"], version)
    out = HERE / f"v{version}"
    out.mkdir(exist_ok=False)
    for entry in doc["positive"]:
        for name in (entry["file"], entry["expected"], entry.get("base")):
            if name:
                shutil.copyfile(vectors_dir / name, out / name)
    write_json(out / "manifest.json", {"format_version": version, "frozen_from": source,
                                       "generator": doc["generator"],
                                       "positive": doc["positive"]})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="output directory")
    args = parser.parse_args(argv)
    generate(args.out)
    total = sum(p.stat().st_size for p in args.out.iterdir() if p.is_file())
    print(f"wrote {len(POSITIVE)} positive and {len(NEGATIVE)} negative vectors to "
          f"{args.out} ({total} bytes in the directory)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
