"""A save stopped part way through a tensor (its source, the progress sink or an interrupt
raising between its chunks) cannot be finished: close raises a typed error and leaves no
file, instead of writing an index that lists chunks never written."""
import os
import sys
import threading
import time

import numpy as np
import pytest

import inshrink
from inshrink import dtypes
from inshrink.errors import InvalidArgumentError

F32 = dtypes.BY_NAME["F32"]
CHUNK = 64 << 10
X = np.random.default_rng(0).standard_normal(4 * CHUNK // 4).astype(np.float32)  # 4 chunks


def _closes_with_no_file(w, path, error=InvalidArgumentError):
    with pytest.raises(error) as raised:
        w.close()
    if raised.type is InvalidArgumentError:
        assert "cannot be finished" in str(raised.value)
    assert os.listdir(path.parent) == []


@pytest.mark.parametrize("threads", [1, 2])
def test_a_source_failing_at_a_later_chunk(tmp_path, threads):
    raw = X.view(np.uint8)

    def read(start, stop):
        if start >= 2 * CHUNK:
            raise OSError("disk gone")
        return raw[start:stop]
    path = tmp_path / "x.ink"
    w = inshrink.Writer(path, threads=threads, chunk_bytes=CHUNK)
    w.add("a", X[:100])
    try:
        w.add_source("b", F32, X.shape, read)
        w.add("c", X[:100], wait=True)
    except OSError:
        pass  # where it surfaces depends on the threads
    _closes_with_no_file(w, path, (InvalidArgumentError, OSError))


@pytest.mark.parametrize("threads", [1, 2])
def test_a_progress_sink_failing_between_a_tensors_chunks(tmp_path, threads):
    calls = []

    def progress(nbytes):
        calls.append(nbytes)
        if len(calls) == 2:
            raise RuntimeError("sink")
    path = tmp_path / "x.ink"
    w = inshrink.Writer(path, threads=threads, chunk_bytes=CHUNK, progress=progress)
    many = np.tile(X, 8)  # 32 chunks: more than the threads' window, which add waits on
    with pytest.raises(RuntimeError, match="sink"):
        w.add("a", many, wait=False)
    _closes_with_no_file(w, path)


def test_a_progress_sink_failing_after_a_tensors_last_chunk_loses_nothing(tmp_path):
    calls = []

    def progress(nbytes):
        calls.append(nbytes)
        if len(calls) == 4:  # the last of a's 4 chunks, written already
            raise RuntimeError("sink")
    path = tmp_path / "x.ink"
    w = inshrink.Writer(path, threads=1, chunk_bytes=CHUNK, progress=progress)
    with pytest.raises(RuntimeError, match="sink"):
        w.add("a", X)
    w.add("b", X[:10])
    assert [info.name for info in w.close()] == ["a", "b"]
    back = inshrink.load(path)
    assert np.array_equal(back["a"], X) and np.array_equal(back["b"], X[:10])


class _InterruptedOnce(threading.Event):
    """An Event whose first wait in a function named ``where`` raises KeyboardInterrupt
    (Ctrl-C while the Writer waits for a save's first job to begin, or for the thread that
    runs it to start)."""
    where = None

    def wait(self, timeout=None):
        if sys._getframe(1).f_code.co_name == _InterruptedOnce.where:
            _InterruptedOnce.where = None
            raise KeyboardInterrupt
        return super().wait(timeout)


@pytest.mark.parametrize("where", ["_submit", "start"])
def test_an_interrupt_while_a_first_job_begins(tmp_path, monkeypatch, where):
    # the job submitted runs, but nothing waits for it: close must not commit an index
    # while it may still be writing, nor list what it never wrote
    raw = X.view(np.uint8)

    def slow(start, stop):
        time.sleep(0.3)
        return raw[start:stop]
    path = tmp_path / "x.ink"
    w = inshrink.Writer(path, threads=2, chunk_bytes=1 << 20)
    w.add_source("slow", F32, (100,), slow)
    monkeypatch.setattr(_InterruptedOnce, "where", where)
    monkeypatch.setattr(threading, "Event", _InterruptedOnce)
    with pytest.raises(KeyboardInterrupt):
        w.add("x", X[:100], wait=True)  # submits the batch: its job begins on a new thread
    monkeypatch.undo()
    _closes_with_no_file(w, path)


def test_a_progress_sink_failing_after_a_batch_with_a_failed_tensor(tmp_path):
    # the batch's tensor that failed is dropped even though the sink raised first
    def read(start, stop):
        raise OSError("unreadable")
    path = tmp_path / "x.ink"
    w = inshrink.Writer(path, threads=2, progress=lambda nbytes: 1 / 0)
    w.add_source("bad", F32, (10,), read)
    with pytest.raises(ZeroDivisionError):
        w.add("good", X[:10], wait=True)
    assert [info.name for info in w.close()] == ["good"]
    assert np.array_equal(inshrink.load(path)["good"], X[:10])
