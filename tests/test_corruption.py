"""The reader on damaged files: every failure is a typed InshrinkError, and no damage ever
returns different tensor data silently.

A small file (a few KB: several dtypes, a multi-chunk tensor, metadata) is truncated at every
offset, has one bit flipped at every byte, gets garbage appended or prepended, and is mutated at
random (with hypothesis), both as is and with its checksums repaired so that the mutation
reaches the index parser and the decoders.
"""
from __future__ import annotations

import json
import os
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import inshrink
import inshrink.io.writer
from inshrink.container import layout
from inshrink.errors import (BaseMismatchError, CorruptError, InshrinkError,
                             LimitExceededError, TruncatedError)
from kit import problem_class

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fuzz"))
import ink_repair  # noqa: E402

HEADER, RECORD, TAIL = 64, 32, 32

# At least 200 examples per test whatever the profile (tests/conftest.py); a larger profile
# (HYPOTHESIS_PROFILE=nightly) raises it.
HYPOTHESIS = settings(max_examples=max(settings.default.max_examples, 200), deadline=None,
                      suppress_health_check=[HealthCheck.too_slow])


@dataclass
class Sample:
    data: bytes
    tensors: dict[str, np.ndarray]
    metadata: dict[str, str]
    covered: bytearray          # 1 for every byte that belongs to a header, record or tail
    chunk_records: int


def _tensors() -> dict[str, np.ndarray]:
    return {
        "w.f32": np.linspace(-1, 1, 40, dtype=np.float32),         # 3 chunks x 4 planes
        "emb.bf16": (np.arange(12, dtype=np.float32).reshape(3, 4) / 7).astype(
            ml_dtypes.bfloat16),
        "ids.u8": np.arange(70, dtype=np.uint8),                   # 2 chunks, 1 plane
        "pos.i64": np.array([1, -2, 1 << 40], dtype=np.int64),     # 8 planes
        "mask": np.array([True, False, True, True, False]),
        "scale.f16": np.array(0.5, dtype=np.float16),               # 0-d
        "empty": np.zeros((0, 3), dtype=np.float32),                # no chunks
        "z.c64": np.array([1 + 2j, -3j], dtype=np.complex64),
    }


def _covered(data: bytes) -> tuple[bytearray, int]:
    """Mark the bytes the format protects: header, every record (header and payload), tail."""
    covered = bytearray(len(data))

    def mark(start: int, stop: int) -> None:
        covered[start:stop] = b"\x01" * (stop - start)

    mark(0, HEADER)
    mark(len(data) - TAIL, len(data))
    offset, doc = ink_repair.read_index(data)
    mark(offset, len(data) - TAIL)
    chunks = [c for t in doc["tensors"] for s in t["streams"] for c in s]
    for start, length, *_ in chunks:
        mark(start, start + RECORD + length)
    return covered, len(chunks)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("corruption")


@pytest.fixture(scope="module")
def sample(workdir) -> Sample:
    tensors = _tensors()
    metadata = {"format": "pt", "step": "1000", "note": "caf\u00e9"}
    path = workdir / "sample.ink"
    # Keep every dtype's byte planes (the writer may store tiny tensors as one plane): the
    # mutations below should reach many records and plane layouts.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(inshrink.io.writer, "TINY_TENSOR_BYTES", 0)
        with inshrink.Writer(path, metadata, chunk_bytes=64, threads=1) as writer:
            for name, array in tensors.items():
                writer.add(name, array)
    data = path.read_bytes()
    covered, chunk_records = _covered(data)
    return Sample(data, tensors, metadata, covered, chunk_records)


def read_all(path, threads: int = 1, use_mmap: bool = True):
    """("ok", metadata, {name: array}) or ("error", exception type, where it was raised)."""
    stage = "open"
    try:
        with inshrink.open(path, threads=threads, mmap=use_mmap) as f:
            stage = "read"
            arrays = {name: f[name] for name in f.keys()}
            stage = "verify"
            problems = f.verify()
            if problems:
                return "error", problem_class(problems[0]), stage
            return "ok", f.metadata, arrays
    except InshrinkError as exc:
        # which file is damaged is part of every error (a user loads many), after the rule id
        assert os.fspath(path) in str(exc), f"{stage}: {exc!r} does not name {path}"
        return "error", type(exc), stage


def same_data(result, sample: Sample) -> bool:
    _, metadata, arrays = result
    if metadata != sample.metadata or list(arrays) != list(sample.tensors):
        return False
    for name, want in sample.tensors.items():
        got = arrays[name]
        if got.dtype != want.dtype or got.shape != want.shape:
            return False
        if got.tobytes() != want.tobytes():
            return False
    return True


class Scratch:
    """One file rewritten for each attempt."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self, data: bytes, threads: int = 1, use_mmap: bool = True):
        self.path.write_bytes(data)
        return read_all(self.path, threads, use_mmap)


@pytest.fixture(scope="module")
def scratch(workdir) -> Scratch:
    return Scratch(workdir / "scratch.ink")


def _unexpected(label: str, failures: list) -> str:
    shown = "\n".join(f"  {label} {where}: {exc!r}" for where, exc in failures[:10])
    return f"{len(failures)} non-InshrinkError exceptions, first ones:\n{shown}"


# --- the sample itself ------------------------------------------------------------------------

def test_sample_is_small_valid_and_multichunk(sample, scratch):
    assert 1_000 < len(sample.data) < 16_000
    result = scratch.read(sample.data)
    assert result[0] == "ok" and same_data(result, sample)
    with inshrink.open(scratch.path, threads=1) as f:
        assert len(f.info("w.f32").shape) == 1
    assert sample.chunk_records > 20
    assert 0 < sample.covered.count(0) < len(sample.data) // 2, "expected some alignment padding"


# --- truncation -------------------------------------------------------------------------------

def test_truncation_at_every_offset(sample, scratch):
    kinds: dict[str, int] = {}
    failures = []
    for size in range(len(sample.data)):
        try:
            result = scratch.read(sample.data[:size])
        except Exception as exc:  # noqa: BLE001 - collected and reported below
            failures.append((size, exc))
            continue
        assert result[0] == "error", f"truncated to {size} bytes, the file still read"
        _, cls, stage = result
        # The tail is gone, so the file must be rejected when it is opened.
        assert stage == "open", f"truncated to {size} bytes: {cls.__name__} only at {stage}"
        assert issubclass(cls, CorruptError), f"truncated to {size} bytes: {cls.__name__}"
        kinds[cls.__name__] = kinds.get(cls.__name__, 0) + 1
    assert not failures, _unexpected("truncated to", failures)
    # A file cut short anywhere is reported as truncated (it no longer ends with the magic).
    assert kinds == {"TruncatedError": len(sample.data)}, kinds


def test_truncation_with_thread_pool(sample, scratch):
    """The decoder pool must carry typed errors out of its threads too."""
    for size in range(0, len(sample.data), 97):
        result = scratch.read(sample.data[:size], threads=4)
        assert result[0] == "error" and issubclass(result[1], CorruptError)


# --- bit flips --------------------------------------------------------------------------------

@pytest.mark.parametrize("use_mmap", [True, False], ids=["mmap", "pread"])
@pytest.mark.parametrize("mask", [0x01, 0x80])
def test_bit_flip_at_every_byte(sample, scratch, mask, use_mmap):
    failures, silent_changes, undetected = [], [], []
    for i in range(len(sample.data)):
        damaged = bytearray(sample.data)
        damaged[i] ^= mask
        try:
            result = scratch.read(bytes(damaged), use_mmap=use_mmap)
        except Exception as exc:  # noqa: BLE001
            failures.append((i, exc))
            continue
        if result[0] == "error":
            continue
        if not same_data(result, sample):
            silent_changes.append(i)
        else:
            undetected.append(i)
    assert not failures, _unexpected(f"flip {mask:#04x} at", failures)
    assert not silent_changes, f"flips at {silent_changes[:20]} returned different data"
    # Every byte of a header, record or tail is under a CRC: a flip there must be detected.
    in_structures = [i for i in undetected if sample.covered[i]]
    assert not in_structures, f"flips at {in_structures[:20]} inside a structure went unnoticed"
    # Alignment padding between records is covered by no checksum; this reader ignores it.
    padding = [i for i in range(len(sample.data)) if not sample.covered[i]]
    assert undetected == padding


def test_bit_flips_with_thread_pool(sample, scratch):
    for i in range(0, len(sample.data), 13):
        damaged = bytearray(sample.data)
        damaged[i] ^= 0x10
        result = scratch.read(bytes(damaged), threads=4)
        assert result[0] == "error" or same_data(result, sample)


def test_byte_overwrites_on_a_stride(sample, scratch):
    """Whole-byte damage (0x00, 0xFF, a shifted copy) on a stride, not only single bits."""
    for i in range(0, len(sample.data), 5):
        for value in (0x00, 0xFF, sample.data[i - 1]):
            damaged = bytearray(sample.data)
            if damaged[i] == value:
                continue
            damaged[i] = value
            result = scratch.read(bytes(damaged))
            assert result[0] == "error" or (same_data(result, sample)
                                            and not sample.covered[i]), i


# --- garbage around the file, odd paths -------------------------------------------------------

@pytest.mark.parametrize("suffix", [
    b"\0", b"garbage", bytes(64), b"\x89INK\r\n\x1a\n", "tail", "whole file",
], ids=["zero byte", "text", "64 zeros", "magic", "copy of tail", "copy of file"])
def test_appended_garbage(sample, scratch, suffix):
    if suffix == "tail":
        suffix = sample.data[-TAIL:]
    elif suffix == "whole file":
        suffix = sample.data
    result = scratch.read(sample.data + suffix)
    assert result[0] == "error" and result[2] == "open"
    assert issubclass(result[1], CorruptError)


@pytest.mark.parametrize("prefix", [b"x", bytes(64), "header", "whole file"],
                         ids=["one byte", "64 zeros", "copy of header", "copy of file"])
def test_prepended_garbage(sample, scratch, prefix):
    if prefix == "header":
        prefix = sample.data[:HEADER]
    elif prefix == "whole file":
        prefix = sample.data
    result = scratch.read(prefix + sample.data)
    assert result[0] == "error" and result[2] == "open"
    assert issubclass(result[1], CorruptError)


@pytest.mark.parametrize("content", [
    b"", b"\x89", b"\x89INK\r\n\x1a\n", b"PK\x03\x04" + bytes(200), bytes(4096),
    "header only", "header and tail",
])
def test_small_and_foreign_files(sample, scratch, content):
    if content == "header only":
        content = sample.data[:HEADER]
    elif content == "header and tail":
        content = sample.data[:HEADER] + sample.data[-TAIL:]
    result = scratch.read(content)
    assert result[0] == "error" and result[2] == "open"
    assert issubclass(result[1], CorruptError)


def test_empty_file_is_truncated(scratch):
    result = scratch.read(b"")
    assert result[:2] == ("error", TruncatedError)


def test_directory_path(tmp_path):
    # An OS refusal to read a directory is a real I/O failure; anything else must be typed.
    with pytest.raises((InshrinkError, IsADirectoryError, PermissionError)):
        read_all(tmp_path)
    with pytest.raises((InshrinkError, IsADirectoryError, PermissionError)):
        inshrink.load(tmp_path)


@pytest.mark.parametrize("content", [b"random bytes " * 400, "truncated", "bad chunk"])
def test_errors_of_load_and_file_name_the_file_after_the_rule(sample, tmp_path, monkeypatch,
                                                              content):
    if content == "truncated":
        content = sample.data[:len(sample.data) // 2]
    elif content == "bad chunk":  # a payload byte: found when the tensor is read
        offset, doc = ink_repair.read_index(sample.data)
        start = doc["tensors"][0]["streams"][0][0][0]
        damaged = bytearray(sample.data)
        damaged[start + RECORD] ^= 0xFF
        content = bytes(damaged)
    monkeypatch.chdir(tmp_path)
    Path("random.bin").write_bytes(content)
    for read in (inshrink.load, lambda p: inshrink.File(p).load(),
                 lambda p: inshrink.open(p, threads=4).load()):
        with pytest.raises(CorruptError) as caught:
            read("random.bin")
        text = str(caught.value)
        assert "random.bin" in text, text
        # the spec's rule id stays first
        assert text.startswith("[") and "] random.bin: " in text, text


def test_nonexistent_path(tmp_path):
    with pytest.raises(FileNotFoundError):
        inshrink.open(tmp_path / "missing.ink")
    with pytest.raises(FileNotFoundError):
        inshrink.load(tmp_path / "missing.ink")


# --- hand-made indexes that pass the checksums ------------------------------------------------

def _with_index(sample: Sample, doc) -> bytes:
    offset, _ = ink_repair.read_index(sample.data)
    return ink_repair.replace_index(sample.data, offset, json.dumps(doc).encode())


def _one_tensor(shape, dtype="U8", streams=None, chunk_elements=1) -> dict:
    return {"tensors": [{"name": "t", "dtype": dtype, "shape": shape,
                         "chunk_elements": chunk_elements,
                         "codec": [{"id": "bytegroup", "word": 1, "rotate": False}],
                         "streams": streams if streams is not None else [[]]}],
            "metadata": {}}


@pytest.mark.parametrize("shape", [[0, 2**63], [0, 2**62, 2**62], [2**40, 0, 2**40]],
                         ids=["dim 2**63", "dims overflowing intp", "two large dims"])
def test_empty_tensor_with_huge_dimension(sample, scratch, shape):
    """A zero dimension makes the tensor empty, so the index limits accept huge other
    dimensions; numpy cannot build such a shape, and that must surface as a typed error."""
    result = scratch.read(_with_index(sample, _one_tensor(shape)))
    assert result[0] == "error" or result[2]["t"].shape == tuple(shape)


def test_declared_size_is_not_allocated_before_the_records_are_checked(workdir):
    """A 1.5 MB file whose index declares a 1 TiB tensor in 16384 chunks of 64 MiB, each
    pointing at an empty, invalid record: reading it must fail with a typed error, not with
    MemoryError from allocating the declared size up front."""
    chunk, count = 64 << 20, 16384
    streams = [[[HEADER + 64 * i, 0, 0, chunk, "raw"] for i in range(count)]]
    doc = _one_tensor([chunk * count], streams=streams, chunk_elements=chunk)
    body = layout.pack_header() + bytes(64 * count)
    payload = json.dumps(doc).encode()
    placeholder = body + bytes(RECORD) + payload + bytes(TAIL)
    data = ink_repair.replace_index(placeholder, len(body), payload)
    path = workdir / "huge.ink"
    path.write_bytes(data)
    with inshrink.open(path, threads=1) as f:
        problems = f.verify()
        assert len(problems) == 1 and problems[0].startswith("tensor 't': ")
        assert issubclass(problem_class(problems[0]), InshrinkError)
        with pytest.raises(InshrinkError):
            f["t"]
    with pytest.raises(InshrinkError):
        inshrink.load(path, threads=1)


# --- random input (hypothesis) ----------------------------------------------------------------

def _check_no_untyped(scratch: Scratch, data: bytes):
    """Read ``data``; any exception other than an InshrinkError propagates and fails."""
    return scratch.read(data)


@HYPOTHESIS
@given(data=st.binary(max_size=600))
def test_random_bytes(scratch, data):
    result = _check_no_untyped(scratch, data)
    assert result[0] == "error"


@HYPOTHESIS
@given(body=st.binary(max_size=600), repair=st.booleans())
def test_random_bytes_behind_a_valid_header(sample, scratch, body, repair):
    data = sample.data[:HEADER] + body
    if repair:
        data = ink_repair.fix_container(data)
    _check_no_untyped(scratch, data)


def _edits(size: int):
    return st.lists(st.tuples(st.integers(0, size - 1), st.integers(0, 255)),
                    min_size=1, max_size=8)


@HYPOTHESIS
@given(st.data())
def test_random_mutations_of_a_valid_file(sample, scratch, data):
    damaged = bytearray(sample.data)
    for offset, value in data.draw(_edits(len(damaged)), label="edits"):
        damaged[offset] = value
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(damaged))), label="cut")
    if cut is not None:
        damaged = damaged[:cut] + data.draw(st.binary(max_size=64), label="new end")
    damaged = bytes(damaged)
    result = _check_no_untyped(scratch, damaged)
    if damaged != sample.data and result[0] == "ok":
        # Only padding may change unnoticed, and then the data is what was written.
        assert len(damaged) == len(sample.data) and same_data(result, sample)
        assert all(a == b or not c for a, b, c in zip(damaged, sample.data, sample.covered))
    # The same damage with the checksums repaired reaches the index parser and decoders.
    # Any outcome is fine there (the file may now legitimately hold other data) except an
    # untyped exception.
    for variant in ink_repair.variants(damaged)[1:]:
        _check_no_untyped(scratch, variant)


_JSON_LEAVES = st.one_of(
    st.none(), st.booleans(),
    st.sampled_from([0, 1, -1, 7, 64, 2**31, 2**32, 2**48, 2**53 + 1, 2**62, 2**63 - 1, 2**63,
                     2**64, 64 << 20, (64 << 20) + 1, 10**30]),
    st.integers(), st.floats(allow_nan=False),
    st.sampled_from(["", "F32", "BF16", "I64", "U8", "BOOL", "C64", "zstd", "raw",
                     "bytegroup", "w.f32", "\ud800", "x" * 2000]),
    st.text(max_size=8),
)
_JSON = st.recursive(_JSON_LEAVES, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=8)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _paths(value, prefix + (i,))


@HYPOTHESIS
@given(st.data())
def test_random_index_edits_with_valid_checksums(sample, scratch, data):
    """Replace, delete or duplicate one node of the index JSON, keeping every checksum valid,
    so each edit reaches the index validator (and, if it passes, the decoders)."""
    _, doc = ink_repair.read_index(sample.data)
    paths = list(_paths(doc))
    for _ in range(data.draw(st.integers(1, 3), label="edit count")):
        path = data.draw(st.sampled_from(paths), label="path")
        action = data.draw(st.sampled_from(["replace", "delete", "duplicate"]), label="action")
        if not path:
            doc = data.draw(_JSON, label="new document")
            break
        parent = doc
        try:
            for key in path[:-1]:
                parent = parent[key]
            key = path[-1]
            if action == "replace":
                parent[key] = data.draw(_JSON, label="value")
            elif action == "delete":
                del parent[key]
            elif isinstance(parent, list):
                parent.insert(key, parent[key])
            else:
                parent[key + "_"] = parent[key]
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit removed or retyped this path
    try:
        payload = json.dumps(doc).encode()
    except (ValueError, UnicodeEncodeError):
        return
    offset, _ = ink_repair.read_index(sample.data)
    _check_no_untyped(scratch, ink_repair.replace_index(sample.data, offset, payload))


@HYPOTHESIS
@given(value=st.sampled_from([b'{"tensors": [], "tensors": []}', b"[]", b"null", b"\xff\xfe",
                              b'{"tensors": []}' + b" " * 3, b"[" * 100_000 + b"]" * 100_000,
                              b'{"tensors": [], "metadata": {"a": 1}}',
                              b'{"tensors": [], "metadata": {"\\ud800": "x"}}',
                              b'{"tensors": [], "x": ' + b"9" * 5000 + b"}"]))
def test_odd_index_documents(sample, scratch, value):
    offset, _ = ink_repair.read_index(sample.data)
    _check_no_untyped(scratch, ink_repair.replace_index(sample.data, offset, value))


def test_struct_sizes_match_the_layout():
    # The helpers above assume these sizes; fail loudly if the format changes them.
    assert (layout.HEADER_SIZE, layout.RECORD_HEADER_SIZE, layout.TAIL_SIZE) == (
        HEADER, RECORD, TAIL)
    assert layout.MAGIC == ink_repair.MAGIC
    assert struct.calcsize("<QQII8s") == TAIL
    assert os.path.basename(ink_repair.__file__) == "ink_repair.py"


# --- rules of format 1.5: what the reader refuses, typed and quickly --------------------------

VECTORS = Path(__file__).resolve().parent.parent / "spec" / "vectors"


def _zindex_file(text: bytes) -> bytes:
    """A file with no records whose compressed index is ``text``."""
    frame = zstandard.ZstdCompressor(level=1, write_content_size=True).compress(text)
    header = layout.pack_header(3, 0, layout.FEATURE_ZINDEX)
    return ink_repair.replace_index(header, HEADER, frame)


def _open_fails_quickly(path: Path, error: type, rule: str) -> None:
    start = time.perf_counter()
    with pytest.raises(error, match=rf"^\[{rule}\]"):
        inshrink.open(path, threads=1)
    assert time.perf_counter() - start < 1.0


def test_index_expanding_to_millions_of_values_is_refused_quickly(tmp_path):
    """6 KB whose index expands to 21 million empty arrays (64 MiB): it took 20 s and 1.7 GB
    to open; the expansion is now bounded by the file size (rule I-0a)."""
    text = b'{"tensors":[],"x":[' + b"[]," * 21_000_000 + b"[]]}"
    path = tmp_path / "bomb.ink"
    path.write_bytes(_zindex_file(text))
    assert path.stat().st_size < 8000
    _open_fails_quickly(path, LimitExceededError, "I-0a")


def test_half_a_million_empty_tensors_are_refused_quickly(tmp_path):
    """500,000 empty tensors in a file of about 500 KB took 38 s and 855 MB to open."""
    entry = ('{"name":"t%d","dtype":"U8","shape":[0],"chunk_elements":1,"codec":[{"id":'
             '"bytegroup","word":1,"rotate":false}],"streams":[[]]}')
    text = ('{"tensors":[' + ",".join(entry % i for i in range(500_000)) + "]}").encode()
    path = tmp_path / "tensors.ink"
    path.write_bytes(_zindex_file(text))
    assert path.stat().st_size < 1_000_000
    _open_fails_quickly(path, LimitExceededError, "I-0a")
    # the same tensors with an index that expands less still hit the tensor limit (I-3)
    few = ('{"tensors":[' + ",".join(entry % i for i in range(5_000)) + "]}").encode()
    path.write_bytes(_zindex_file(few))
    _open_fails_quickly(path, LimitExceededError, "I-3")


def _strip_base(data: bytes) -> bytes:
    """The delta file ``data`` with its base object removed and the delta bit cleared."""
    offset, doc = ink_repair.read_index(data)
    del doc["base"]
    payload = json.dumps(doc).encode()
    if ink_repair.index_compressed(data):
        payload = zstandard.ZstdCompressor(write_content_size=True).compress(payload)
    data = bytearray(ink_repair.replace_index(data, offset, payload))
    required = struct.unpack_from("<Q", data, 16)[0] & ~layout.FEATURE_DELTA
    struct.pack_into("<Q", data, 16, required)
    return ink_repair.fix_container(bytes(data))


@pytest.mark.parametrize("vector", ["delta", "qdelta"])
def test_delta_chain_in_a_file_without_base_is_refused(tmp_path, vector):
    """[xor, ...] and [codedelta, quant] need a base: without one, reading raised a bare
    TypeError while verify() passed. Now the file does not open (rule C-2)."""
    path = tmp_path / "nobase.ink"
    path.write_bytes(_strip_base((VECTORS / f"{vector}.ink").read_bytes()))
    with pytest.raises(CorruptError, match=r"^\[C-2\] .*names no base"):
        inshrink.open(path, threads=1)


def test_xor_against_a_quantized_base_tensor_is_refused():
    """An xor delta refers to a lossless tensor of its base: the decode digest does not cover
    a quantized tensor's values (rule B-1)."""
    with inshrink.open(VECTORS / "delta_base.ink") as b:
        base = b.load()
    codes = {"w": np.zeros(base["w"].size, np.uint16)}
    with inshrink.File(VECTORS / "delta.ink", threads=1, base=base, base_codes=codes) as f:
        assert f.info("w").codec.startswith("xor+")
        with pytest.raises(BaseMismatchError, match=r"^\[B-1\] .*quantized"):
            f["w"]
        f["ids"]  # other tensors are unaffected


def test_hex_digits_of_either_case_are_accepted(tmp_path):
    """Section 10.6.1: hex digits in either case, mixed too; nothing else (see the vector
    quant_levels_space)."""
    data = (VECTORS / "quant_f32.ink").read_bytes()
    offset, doc = ink_repair.read_index(data)
    with inshrink.open(VECTORS / "quant_f32.ink") as f:
        expected = f["layer.weight"].tobytes()
    levels = doc["tensors"][0]["codec"][0]["levels"]
    for variant in (levels.upper(), "".join(c.upper() if i % 3 else c
                                            for i, c in enumerate(levels))):
        doc["tensors"][0]["codec"][0]["levels"] = variant
        path = tmp_path / "case.ink"
        path.write_bytes(ink_repair.replace_index(data, offset, json.dumps(doc).encode()))
        with inshrink.open(path, threads=1) as f:
            assert f["layer.weight"].tobytes() == expected
    doc["tensors"][0]["codec"][0]["levels"] = "\n" + levels[1:]  # same length, a newline
    path.write_bytes(ink_repair.replace_index(data, offset, json.dumps(doc).encode()))
    with pytest.raises(CorruptError, match=r"^\[C-3\]"):
        inshrink.open(path, threads=1)
