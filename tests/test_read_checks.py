"""The reader's checks done for many records at once (record headers, the index's chunk
entries, the codec chains shared by tensors) accept and reject exactly what the checks one
record at a time do, and report the failure the spec's check order names first (section 16),
with one thread or several."""
from __future__ import annotations

import os
import threading
import zlib
from unittest import mock
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import inshrink
from inshrink.io import file as tensor_file
from inshrink.container import layout
from inshrink.errors import ChecksumError, CorruptError, TruncatedError
from kit import edit_index

pytestmark = pytest.mark.usefixtures("index_short_way")  # both ways must check alike


@given(st.lists(st.tuples(st.integers(0, 2**63), st.integers(0, 0xFFFFFFFF)), max_size=20),
       st.sampled_from([layout.KIND_CHUNK, layout.KIND_INDEX]))
def test_record_headers_equal_record_header_row_by_row(rows, kind):
    lengths = np.array([r[0] for r in rows], np.uint64)
    crcs = np.array([r[1] for r in rows], np.uint64)
    headers = layout.record_headers(kind, lengths, crcs)
    assert headers.shape == (len(rows), layout.RECORD_HEADER_SIZE)
    for row, (length, crc) in zip(headers, rows):
        assert bytes(row) == layout.record_header(kind, length, crc)
        assert int.from_bytes(bytes(row[28:]), "little") == zlib.crc32(bytes(row[:28]))


def _file(path: Path) -> list:
    """Two fp32 tensors of 3 chunks each (4 records per chunk); the chunk entries in order."""
    with inshrink.Writer(path, chunk_bytes=256, threads=1) as writer:
        writer.add("a", np.linspace(-1, 1, 192, dtype=np.float32))
        writer.add("b", np.linspace(-2, 2, 192, dtype=np.float32))
    with inshrink.open(path) as f:
        return [[list(s) for s in e.streams] for e in f._reader.index.tensors]


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 1
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("threads", [1, 2])
def test_a_bad_payload_before_a_bad_header_is_reported_first(tmp_path, monkeypatch, threads):
    """The headers are compared for the whole load at once; a failure there must still report
    the first failing check in the spec's order: here the payload checksum (R-5) of tensor
    a's chunk 0, before the record header (R-1) of tensor b's last chunk."""
    monkeypatch.setattr(tensor_file, "_SHARED_CHUNK_BYTES", 0)  # share even tiny chunks
    path = tmp_path / "x.ink"
    streams = _file(path)
    first = streams[0][0][0]                   # tensor a, stream 0, chunk 0
    _flip(path, first[0] + layout.RECORD_HEADER_SIZE)
    _flip(path, streams[1][3][2][0])       # tensor b, stream 3, chunk 2: its tag
    with pytest.raises(ChecksumError, match=rf"\[R-5\] .* offset {first[0]}$"):
        inshrink.load(path, threads=threads)
    with inshrink.open(path, threads=threads) as f:
        with pytest.raises(CorruptError, match=r"\[R-1\]"):
            f["b"]


@pytest.mark.parametrize("threads", [1, 2])
def test_the_first_failing_chunk_in_order_is_reported(tmp_path, monkeypatch, threads):
    monkeypatch.setattr(tensor_file, "_SHARED_CHUNK_BYTES", 0)  # share even tiny chunks
    path = tmp_path / "x.ink"
    streams = _file(path)
    for tensor in (1, 0):
        chunk = streams[tensor][2][2]          # stream 2, chunk 2 of b, then of a
        _flip(path, chunk[0] + layout.RECORD_HEADER_SIZE)
    want = streams[0][2][2][0]
    for _ in range(5):  # whichever thread reaches the chunks first
        with pytest.raises(ChecksumError, match=rf"offset {want}$"):
            inshrink.load(path, threads=threads)


@pytest.mark.parametrize("threads", [2, 3])
def test_a_bad_large_chunk_is_reported_before_a_later_bad_small_one(tmp_path, threads):
    """The calling thread starts with the smallest chunk (here the last tensor's, corrupt):
    the error is still the first bad chunk in file order, a large one a pool thread takes."""
    path = tmp_path / "x.ink"
    with inshrink.Writer(path, chunk_bytes=64 << 10, threads=1) as writer:
        writer.add("big", np.linspace(-1, 1, 64 << 10, dtype=np.float32))
        writer.add("tiny", np.linspace(-1, 1, 5, dtype=np.float32))
    with inshrink.open(path) as f:
        big, tiny = (e.streams for e in f._reader.index.tensors)
    _flip(path, tiny[0][0][0] + layout.RECORD_HEADER_SIZE)
    want = big[0][1][0]  # chunk 1 of 4
    _flip(path, want + layout.RECORD_HEADER_SIZE)
    for _ in range(5):
        with pytest.raises(ChecksumError, match=rf"offset {want}$"):
            inshrink.load(path, threads=threads)


def test_the_calling_thread_decodes_the_smallest_chunks_the_pool_the_largest(tmp_path,
                                                                           monkeypatch):
    """Small chunks are decoded mostly in Python, holding the GIL; two threads that both
    took them handed the GIL to each other at every call. The pool's thread starts from the
    largest chunk and takes no small one, the calling thread takes the small ones first,
    smallest first, then large ones."""
    path = tmp_path / "x.ink"
    state = {f"t{i}": np.linspace(-1, 1, 64 << i, dtype=np.float32) for i in range(10)}
    inshrink.save(path, state, threads=1)
    seen: dict[int, list[int]] = {}
    decode = inshrink.File._decode_chunk

    def spy(self, entry, c, out, headers=None):
        seen.setdefault(threading.get_ident(), []).append(out.size)
        return decode(self, entry, c, out, headers)
    monkeypatch.setattr(inshrink.File, "_decode_chunk", spy)
    with inshrink.File(path, threads=2) as f:
        out = f.load()
    sizes = sorted(a.nbytes for a in state.values())
    small = [size for size in sizes if size < tensor_file._SHARED_CHUNK_BYTES]
    assert 0 < len(small) < len(sizes)
    mine = seen.pop(threading.get_ident())
    assert mine[:len(small)] == small
    assert mine[len(small):] == sorted(mine[len(small):], reverse=True)
    pool = [size for sizes_of in seen.values() for size in sizes_of]
    assert not pool or (pool[0] == sizes[-1] and pool == sorted(pool, reverse=True))
    assert sorted(mine + pool) == sizes
    for name, array in state.items():
        assert np.array_equal(out[name], array)


def test_a_load_of_small_chunks_stays_on_the_calling_thread(tmp_path, monkeypatch):
    """Two threads on small chunks only handed the GIL to each other (2,000 tensors of a few
    KiB: 2,100 context switches and ~1.5x the CPU and wall of one thread per load)."""
    path = tmp_path / "x.ink"
    state = {f"t{i}": np.linspace(-1, 1, 100 + i, dtype=np.float32) for i in range(50)}
    inshrink.save(path, state, threads=1, policy="balanced")
    threads = set()
    decode = inshrink.File._decode_chunk

    def spy(self, *args):
        threads.add(threading.get_ident())
        return decode(self, *args)
    monkeypatch.setattr(inshrink.File, "_decode_chunk", spy)
    out = inshrink.load(path, threads=2)
    assert threads == {threading.get_ident()}
    for name, array in state.items():
        assert out[name].shape == array.shape


@pytest.mark.parametrize("threads", [1, 2])
def test_a_load_makes_no_tracked_objects_per_chunk(tmp_path, monkeypatch, threads):
    """What lives through a load's decoding is promoted by the garbage collector (a full
    collection comes sooner the more it promotes): the jobs of a load are flat lists, not a
    tuple and a list of headers per chunk (2 objects per chunk before)."""
    import gc
    path = tmp_path / "x.ink"
    state = {f"t{i}": np.full(16, i, np.float32) for i in range(400)}
    inshrink.save(path, state, threads=1)
    counts = []
    decode_all, decode = inshrink.File._decode_all, inshrink.File._decode_chunk

    def before(self, *args):
        gc.collect()
        counts.append(len(gc.get_objects()))
        return decode_all(self, *args)

    def during(self, *args):
        if len(counts) == 1:
            gc.collect()
            counts.append(len(gc.get_objects()))
        return decode(self, *args)
    monkeypatch.setattr(inshrink.File, "_decode_all", before)
    monkeypatch.setattr(inshrink.File, "_decode_chunk", during)
    with inshrink.File(path, threads=threads) as f:
        f.load()
    assert counts[1] - counts[0] < 100  # 400 chunks


@pytest.mark.parametrize("compact", [False, True])
def test_index_rules_follow_the_tensor_order(tmp_path, compact):
    """Chunk entries are checked for the whole file at once, but a bad chunk entry of the
    first tensor (I-13) is still reported before a bad name of the second (I-7)."""
    path = tmp_path / "x.ink"
    _file(path)

    def edit(doc):
        doc["tensors"][0]["streams"][1][1][0] += 1    # an unaligned offset
        doc["tensors"][1]["name"] = ""
    edit_index(path, edit, compact)
    with pytest.raises(CorruptError, match=r"\[I-13\]"):
        inshrink.open(path)


@pytest.mark.parametrize("field,value,rule", [
    (0, 1 << 63, "I-13"), (1, -1, "I-13"), (2, 1 << 32, "I-13"), (3, True, "I-13"),
    (4, "lz4", "I-13"), (0, 7.0, "I-13")])
@pytest.mark.parametrize("compact", [False, True])
def test_each_bad_chunk_field_is_refused(tmp_path, field, value, rule, compact):
    path = tmp_path / "x.ink"
    _file(path)

    def edit(doc):
        doc["tensors"][1]["streams"][3][2][field] = value
    edit_index(path, edit, compact)
    with pytest.raises(inshrink.InshrinkError, match=rf"\[{rule}\]"):
        inshrink.open(path)


@pytest.mark.parametrize("compact", [False, True])
def test_overlapping_records_are_refused(tmp_path, compact):
    path = tmp_path / "x.ink"
    _file(path)

    def edit(doc):
        doc["tensors"][1]["streams"][0][1][0] = doc["tensors"][0]["streams"][2][0][0]
    edit_index(path, edit, compact)
    with pytest.raises(CorruptError, match=r"\[I-15\]"):
        inshrink.open(path)


@pytest.mark.parametrize("compact", [False, True])
def test_a_chain_shared_by_tensors_is_validated_with_its_types(tmp_path, compact):
    """The tensors' pipelines are built once per distinct chain; JSON's ``1`` equals
    ``true`` in Python but is still refused as the rotate flag (C-3)."""
    path = tmp_path / "x.ink"
    _file(path)

    def edit(doc):
        doc["tensors"][1]["codec"][0]["rotate"] = 1
    edit_index(path, edit, compact)
    with pytest.raises(CorruptError, match=r"\[C-3\] .*rotate"):
        inshrink.open(path)


@pytest.mark.parametrize("stream,rule", [(0, "C-5"), (None, "C-4")])
def test_tensors_sharing_a_chain_are_each_checked_against_it(tmp_path, monkeypatch, stream,
                                                             rule):
    """A file in the writer's form is parsed its short way and its tensors share one chain
    list and pipeline; the stream checks still run for every tensor."""
    from inshrink.container import index
    path = tmp_path / "x.ink"
    _file(path)

    def edit(doc):
        if stream is None:
            del doc["tensors"][1]["streams"][3]
        else:
            doc["tensors"][1]["streams"][stream][2][3] += 1  # a plane size off by one
    edit_index(path, edit, compact=True)
    monkeypatch.setattr(index, "_parse_general", mock.Mock(side_effect=AssertionError))
    with pytest.raises(CorruptError, match=rf"\[{rule}\] .*x\.ink: tensor 'b'"):
        inshrink.open(path)


def test_two_thread_load_reports_progress_on_the_calling_thread(tmp_path, monkeypatch):
    monkeypatch.setattr(tensor_file, "_SHARED_CHUNK_BYTES", 0)  # share even tiny chunks
    path = tmp_path / "x.ink"
    state = {f"t{i}": np.linspace(-i, i, 5000 + 77 * i, dtype=np.float32) for i in range(9)}
    inshrink.save(path, state, threads=1)
    calls = []
    with inshrink.File(path, threads=2) as f:
        out = f.load(lambda n: calls.append((n, threading.get_ident())))
    assert sum(n for n, _ in calls) == sum(a.nbytes for a in state.values())
    assert {ident for _, ident in calls} == {threading.get_ident()}
    for name, array in state.items():
        assert np.array_equal(out[name], array)


@pytest.mark.parametrize("mmap", [True, False])
def test_a_file_truncated_while_open_is_a_typed_error(tmp_path, mmap):
    """Records are read with pread whatever ``mmap`` says: a file cut short by another
    program after it was opened raises TruncatedError (through a map it was a SIGBUS)."""
    path = tmp_path / "x.ink"
    streams = _file(path)
    with inshrink.open(path, mmap=mmap) as f:
        os.truncate(path, streams[1][0][0][0] + 40)
        assert f["a"].shape == (192,)
        with pytest.raises(TruncatedError, match=r"\[R-0\]"):
            f["b"]


def test_read_buffers_are_reused_from_load_to_load(tmp_path, monkeypatch):
    """A fresh read buffer per load faulted its pages in again every time; buffers of at
    least a MiB go back to a pool when the file closes, and the next load takes them from
    there."""
    from inshrink.container import reader
    path = tmp_path / "x.ink"
    noise = np.random.default_rng(0).standard_normal(600_000).astype(np.float32)
    inshrink.save(path, {"w": noise}, threads=1)  # one 2.4 MB chunk, barely compressible
    pool = reader._BufferPool(keep_bytes=64 << 20)
    monkeypatch.setattr(reader, "_BUFFERS", pool)
    first = inshrink.load(path, threads=1)
    kept = {id(buffer) for buffer in pool._free}
    assert kept
    second = inshrink.load(path, threads=1)
    assert {id(buffer) for buffer in pool._free} == kept
    assert np.array_equal(first["w"], second["w"])


def test_small_and_outgrown_read_buffers_are_not_kept(tmp_path, monkeypatch):
    """Buffers under a MiB go back to the allocator, which serves them again without page
    faults, and a thread's buffer outgrown by a larger record is freed at once: neither is
    held for the process's life (transformers' own loader keeps nothing either)."""
    from inshrink.container import reader
    path = tmp_path / "x.ink"
    rng = np.random.default_rng(1)
    state = {f"t{i}": rng.standard_normal(n).astype(np.float32)
             for i, n in enumerate((1_000, 50_000, 120_000, 400_000))}
    inshrink.save(path, state, threads=1)
    pool = reader._BufferPool(keep_bytes=64 << 20)
    monkeypatch.setattr(reader, "_BUFFERS", pool)
    with inshrink.open(path, threads=1) as f:
        out = {name: f[name] for name in state}  # one thread reading ever larger records
        assert len(f._reader._taken) == 1  # its largest buffer only
        largest = next(iter(f._reader._taken.values())).size
    assert largest >= 1 << 20
    assert [b.size for b in pool._free] == [largest]
    with inshrink.open(path, threads=1) as f:
        f["t1"]  # records under a MiB only
    assert [b.size for b in pool._free] == [largest]
    for name, array in state.items():
        assert np.array_equal(out[name], array)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["<f4", "<f2", "<u2", "<i8", "u1"]),
                          st.integers(0, 700)), min_size=1, max_size=6),
       st.sampled_from([64, 256, 4096]), st.integers(0, 2**32 - 1))
def test_loads_with_any_thread_count_return_what_was_saved(tmp_path_factory, specs, chunk_bytes,
                                                           seed):
    """The pool's threads take the largest chunk first and the calling thread the smallest,
    not the file's order; every tensor still comes back bit for bit, whatever the thread
    count."""
    rng = np.random.default_rng(seed)
    state = {f"t{i}": rng.integers(0, 256, n * np.dtype(dt).itemsize, np.uint8).view(dt)
             for i, (dt, n) in enumerate(specs)}
    path = tmp_path_factory.mktemp("threads") / "x.ink"
    with inshrink.Writer(path, chunk_bytes=chunk_bytes, threads=1) as writer:
        for name, array in state.items():
            writer.add(name, array)
    for threads in (1, 2, 3):
        with mock.patch.object(tensor_file, "_SHARED_CHUNK_BYTES", 0):  # share tiny chunks
            out = inshrink.load(path, threads=threads)
        assert list(out) == list(state)
        for name, array in state.items():
            assert out[name].dtype == array.dtype
            assert out[name].tobytes() == array.tobytes()


def test_no_job_of_a_file_runs_once_read_into_has_raised(tmp_path, monkeypatch):
    """close() lets the pool's threads end without joining them: a read_into left early by
    its sink must not leave chunks decoding (they would read a closed descriptor)."""
    path = tmp_path / "x.ink"
    with inshrink.Writer(path, chunk_bytes=256, threads=1) as writer:
        writer.add("a", np.linspace(-1, 1, 4096, dtype=np.float32))  # 64 chunks
    running = []
    decode = tensor_file.File._decode_chunk

    def slow(self, *args, **kwargs):
        running.append(1)
        try:
            threading.Event().wait(0.002)
            return decode(self, *args, **kwargs)
        finally:
            running.pop()
    monkeypatch.setattr(tensor_file.File, "_decode_chunk", slow)

    def sink(start, chunk):
        raise RuntimeError("stop")
    with inshrink.File(path, threads=3) as f:
        with pytest.raises(RuntimeError, match="stop"):
            f.read_into("a", sink)
        assert not running  # nothing still decoding when read_into has returned
