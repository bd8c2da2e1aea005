"""File.close while a load or read_into of the file still has jobs on its thread pool."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import inshrink
from inshrink import tensorfile


def _slow_after_first_chunk(monkeypatch) -> None:
    """Chunks after the first take a while to decode, so that they are still in flight
    when the first one reaches the sink."""
    decode = tensorfile.File._decode_chunk

    def slow(self, entry, c, *args, **kwargs):
        if c:
            threading.Event().wait(0.05)
        return decode(self, entry, c, *args, **kwargs)
    monkeypatch.setattr(tensorfile.File, "_decode_chunk", slow)


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


def test_close_after_a_load_does_not_wait_for_the_idle_threads(tmp_path, monkeypatch):
    """With nothing in flight, close lets the idle threads go without joining them."""
    path = tmp_path / "x.ink"
    with inshrink.Writer(path, chunk_bytes=1 << 16, threads=1) as writer:
        writer.add("a", np.linspace(0, 1, 1 << 16, dtype=np.float32))  # 4 chunks
        writer.add("b", np.linspace(1, 2, 1 << 16, dtype=np.float32))
    waits = []
    shutdown = tensorfile.ThreadPoolExecutor.shutdown

    def record(self, wait=True, **kwargs):
        waits.append(wait)
        return shutdown(self, wait=wait, **kwargs)
    monkeypatch.setattr(tensorfile.ThreadPoolExecutor, "shutdown", record)
    with inshrink.File(path, threads=2) as f:
        f.load()
        f.read_into("a", lambda start, chunk: None)
        with pytest.raises(RuntimeError, match="stop"):
            f.read_into("b", lambda start, chunk: (_ for _ in ()).throw(RuntimeError("stop")))
    assert waits == [False]
