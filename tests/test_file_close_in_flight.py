"""File.close while a load or read_into of the file still has jobs on its thread pool."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import inshrink
from inshrink.io import file as tensor_file
from inshrink.io import threads as tensor_threads


def _slow_after_first_chunk(monkeypatch) -> None:
    """Chunks after the first take a while to decode, so that they are still in flight
    when the first one reaches the sink."""
    decode = tensor_file.File._decode_chunk

    def slow(self, entry, c, *args, **kwargs):
        if c:
            threading.Event().wait(0.05)
        return decode(self, entry, c, *args, **kwargs)
    monkeypatch.setattr(tensor_file.File, "_decode_chunk", slow)


@pytest.mark.parametrize("threads", [2, 3])
def test_a_sink_that_closes_the_file_still_gets_the_chunks_in_flight(tmp_path, monkeypatch,
                                                                     threads):
    """close() from read_into's sink waits for the chunks already submitted (it did before
    the pool's threads were let go without joining): they read with the file's descriptor
    and buffers, which close gives up. Without the wait they raised OSError (a closed
    descriptor) or could decode from a buffer already handed to another file."""
    path = tmp_path / "x.ink"
    x = np.linspace(-1, 1, 3 * 1024, dtype=np.float32)
    with inshrink.Writer(path, chunk_bytes=4096, threads=1) as writer:
        writer.add("x", x)  # 3 chunks: all submitted before the first reaches the sink
    _slow_after_first_chunk(monkeypatch)
    f = inshrink.File(path, threads=threads)
    got = []

    def sink(start, chunk):
        if not got:
            f.close()
        got.append((start, chunk.copy()))
    f.read_into("x", sink)
    assert [start for start, _ in got] == [0, 4096, 8192]
    assert np.concatenate([chunk for _, chunk in got]).tobytes() == x.tobytes()


def _read_threads() -> set:
    return {t for t in threading.enumerate() if t.name.startswith("inshrink-read2_")}


def test_files_share_one_read_pool_and_close_leaves_it_running(tmp_path):
    """Opening a file starts no threads and closing it stops none: reads of every file use
    the process's pool for their thread count (starting one per file cost ~0.7 ms a load)."""
    path = tmp_path / "x.ink"
    with inshrink.Writer(path, chunk_bytes=1 << 16, threads=1) as writer:
        writer.add("a", np.linspace(0, 1, 1 << 16, dtype=np.float32))  # 4 chunks
        writer.add("b", np.linspace(1, 2, 1 << 16, dtype=np.float32))
    with inshrink.File(path, threads=2) as f:
        first = f.load()
    pool = _read_threads()
    assert 1 <= len(pool) <= 2
    for _ in range(5):
        with inshrink.File(path, threads=2) as f:
            got = f.load()
            f.read_into("a", lambda start, chunk: None)
            with pytest.raises(RuntimeError, match="stop"):
                f.read_into("b", lambda start, chunk: (_ for _ in ()).throw(RuntimeError("stop")))
        assert all(np.array_equal(got[k], first[k]) for k in first)
    assert _read_threads() == pool and all(t.is_alive() for t in pool)
    assert tensor_threads.read_pool(2) is tensor_threads.read_pool(2)
    assert tensor_threads.read_pool(1) is None


def test_a_sink_on_a_pool_thread_that_reads_another_file(tmp_path):
    """An unordered sink runs on the pool's threads; a read it makes decodes on that thread
    (waiting there for jobs queued behind the sink's own could wait forever)."""
    path = tmp_path / "x.ink"
    x = np.linspace(-1, 1, 16 * 1024, dtype=np.float32)
    with inshrink.Writer(path, chunk_bytes=4096, threads=1) as writer:
        writer.add("x", x)
    inner = inshrink.File(path, threads=2)
    seen = []

    def sink(start, chunk):
        seen.append(tensor_threads.read_pool(2) is None)
        assert inner.read("x").tobytes() == x.tobytes()
    with inshrink.File(path, threads=2) as outer:
        outer.read_into("x", sink, in_order=False)
    inner.close()
    assert len(seen) == 16 and any(seen)  # some chunks reached the sink on a pool thread


def test_many_threads_reading_through_the_shared_pool(tmp_path):
    path = tmp_path / "x.ink"
    data = {f"t{i}": np.arange(i, i + 40_000, dtype=np.float32) for i in range(6)}
    with inshrink.Writer(path, chunk_bytes=1 << 14, threads=1) as writer:
        for name, array in data.items():
            writer.add(name, array)
    errors = []

    def reader():
        try:
            for _ in range(10):
                with inshrink.File(path, threads=2) as f:
                    got = f.load()
                assert all(np.array_equal(got[k], data[k]) for k in data)
        except BaseException as exc:  # reported below
            errors.append(exc)
    workers = [threading.Thread(target=reader) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert not any(w.is_alive() for w in workers) and not errors, errors


def test_a_forked_child_reads_with_threads(tmp_path):
    """A child forked after the parent's reads has none of the pool's threads: it starts
    its own (the parent's pool object would queue jobs no thread takes: a hang)."""
    import os
    path = tmp_path / "x.ink"
    x = np.linspace(-1, 1, 64 * 1024, dtype=np.float32)
    with inshrink.Writer(path, chunk_bytes=4096, threads=1) as writer:
        writer.add("x", x)
        writer.add("y", x[::-1].copy())
    with inshrink.File(path, threads=2) as f:
        f.load()
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only if its threaded load is right
        status = 1
        try:
            with inshrink.File(path, threads=2) as f:
                status = 0 if f.load()["x"].tobytes() == x.tobytes() else 2
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def _written(path, chunks: int = 3) -> np.ndarray:
    x = np.linspace(-1, 1, chunks * 1024, dtype=np.float32)
    with inshrink.Writer(path, chunk_bytes=4096, threads=1) as writer:
        writer.add("x", x)
    return x


@pytest.mark.parametrize("read", ["read", "load", "read_into", "verify", "getitem"])
def test_a_read_after_close_is_a_typed_error(tmp_path, read):
    """Before: a raw OSError (EBADF) from the closed descriptor."""
    path = tmp_path / "x.ink"
    _written(path)
    f = inshrink.File(path, threads=2)
    f.close()
    calls = {"read": lambda: f.read("x"), "load": f.load, "verify": f.verify,
             "read_into": lambda: f.read_into("x", lambda start, chunk: None),
             "getitem": lambda: f["x"]}
    with pytest.raises(inshrink.errors.InvalidArgumentError, match="is closed"):
        calls[read]()
    f.close()  # twice: nothing happens
    assert f.keys() == ["x"] and f.info("x").shape == (3 * 1024,)  # the index stays


def test_codes_after_close_is_a_typed_error(tmp_path):
    path = tmp_path / "q.ink"
    weight = np.random.default_rng(0).standard_normal((256, 256), np.float32)
    inshrink.save(path, {"w.weight": weight}, policy="balanced")
    f = inshrink.File(path)
    assert f.codes("w.weight").shape == (256 * 256,)
    f.close()
    with pytest.raises(inshrink.errors.InvalidArgumentError, match="is closed"):
        f.codes("w.weight")


@pytest.mark.parametrize("threads", [1, 2])
def test_a_sink_that_closes_the_file_gets_every_chunk_past_the_pools_window(
        tmp_path, threads):
    """20 chunks: more than read_into keeps in flight, so chunks are still to be submitted
    after close. Before: RuntimeError from submitting to the pool close had shut down."""
    path = tmp_path / "x.ink"
    x = _written(path, chunks=20)
    f = inshrink.File(path, threads=threads)
    got = []

    def sink(start, chunk):
        if not got:
            f.close()
        got.append(chunk.copy())
    f.read_into("x", sink)
    assert np.concatenate(got).tobytes() == x.tobytes()
    assert f._reader._fd == -1  # given up when the read ended
    with pytest.raises(inshrink.errors.InvalidArgumentError, match="is closed"):
        f.read("x")


@pytest.mark.parametrize("threads", [1, 2])
def test_close_from_another_thread_during_a_load_lets_it_finish(tmp_path, monkeypatch,
                                                                threads):
    """Before: the load read through the closed descriptor (OSError) or from read buffers
    already given back for other files to use."""
    path = tmp_path / "x.ink"
    x = _written(path, chunks=6)
    started, closed = threading.Event(), threading.Event()
    decode = tensor_file.File._decode_chunk

    def held(self, entry, c, *args, **kwargs):
        started.set()
        assert closed.wait(10)
        return decode(self, entry, c, *args, **kwargs)
    monkeypatch.setattr(tensor_file.File, "_decode_chunk", held)
    f = inshrink.File(path, threads=threads)
    closer = threading.Thread(target=lambda: (started.wait(10), f.close(), closed.set()))
    closer.start()
    loaded = f.load()
    closer.join()
    assert loaded["x"].tobytes() == x.tobytes()
    assert f._reader._fd == -1
    with pytest.raises(inshrink.errors.InvalidArgumentError, match="is closed"):
        f.load()


def test_opening_a_directory_or_a_fifo(tmp_path):
    """A directory: IsADirectoryError naming it (it had no file name, raised by the first
    read). A FIFO: refused at once (opening it waited for a writer forever)."""
    import errno
    import os
    with pytest.raises(IsADirectoryError) as caught:
        inshrink.load(tmp_path)
    assert caught.value.errno == errno.EISDIR and caught.value.filename == str(tmp_path)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(inshrink.errors.InvalidArgumentError, match="not a regular file"):
        inshrink.open(tmp_path / "fifo")
    with pytest.raises(FileNotFoundError):
        inshrink.load(tmp_path / "missing.ink")
