"""How the Writer schedules its work on threads: jobs per tensor, the sketch pass, plane buffers."""
import os
import threading

import numpy as np
import pytest

import inshrink
from inshrink import dtypes
from inshrink.encode.policy import Policy, QuantConfig

from helpers import wait_for_child

F32 = dtypes.BY_NAME["F32"]
POLICY = Policy.uniform(QuantConfig(bins=16, protect=0.001))


def _mixed():
    """Empty, 0-d, tiny, one-chunk and many-chunk tensors, some quantized by POLICY."""
    rng = np.random.default_rng(11)
    return {"empty": np.zeros((0, 4), np.float32), "scalar": np.float32(3.5),
            "bias": rng.standard_normal(64).astype(np.float32),
            "a.weight": (rng.standard_normal((64, 320)) * 0.02).astype(np.float32),
            "nothing": np.zeros(0, np.float32),
            "big.weight": (rng.standard_normal((96, 1024)) * 0.02).astype(np.float32),
            "ids": np.arange(5000, dtype=np.int64),
            "b.weight": (rng.standard_normal((32, 300)) * 0.02).astype(np.float32)}


@pytest.mark.parametrize("policy", [None, POLICY])
def test_files_of_mixed_tensors_do_not_depend_on_the_thread_count(tmp_path, policy):
    written = []
    for threads in (1, 2, 3):
        path = tmp_path / f"t{threads}.ink"
        with inshrink.Writer(path, policy=policy, threads=threads, chunk_bytes=64 << 10) as w:
            for name, x in _mixed().items():
                w.add(name, x, wait=False)
        written.append(path.read_bytes())
    assert written[0] == written[1] == written[2]
    loaded = inshrink.load(tmp_path / "t2.ink")
    assert list(loaded) == list(_mixed())


def test_one_chunk_tensors_do_not_make_the_calling_thread_wait(tmp_path):
    # each tiny tensor is read while it is prepared; the first read blocks until released
    release = threading.Event()
    raw = np.arange(16, dtype=np.float32).view(np.uint8)

    def read(start, stop):
        release.wait(10)
        return raw[start:stop]
    added = threading.Event()
    w = inshrink.Writer(tmp_path / "x.ink", threads=2)

    def add_all():
        for i in range(8):  # more than threads + 1 tensors being prepared
            w.add_source(f"t{i}", F32, (16,), read)
        added.set()
    adder = threading.Thread(target=add_all)
    adder.start()
    try:
        assert added.wait(5), "add_source waited for a tensor to be prepared"
    finally:
        release.set()
        adder.join()
    w.close()
    assert len(inshrink.load(tmp_path / "x.ink")) == 8


def test_a_save_from_inside_a_pool_thread_does_not_wait_for_itself(tmp_path):
    # a source that saves another file on the pool thread that reads it
    inner = {"v": np.arange(100_000, dtype=np.float32)}
    raw = np.arange(200_000, dtype=np.float32).view(np.uint8)

    def read(start, stop):
        inshrink.save(tmp_path / f"inner{start}.ink", inner, threads=2)
        return raw[start:stop]
    done = threading.Event()

    def outer():
        with inshrink.Writer(tmp_path / "outer.ink", threads=2, chunk_bytes=64 << 10) as w:
            w.add_source("x", F32, (200_000,), read)
        done.set()
    saver = threading.Thread(target=outer, daemon=True)
    saver.start()
    assert done.wait(20), "a save on a pool thread waited for work queued behind it"
    assert inshrink.load(tmp_path / "outer.ink")["x"].view(np.uint8).tobytes() == raw.tobytes()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_saves_with_threads(tmp_path):
    tensors = {"w": np.ones(300_000, np.float32)}
    inshrink.save(tmp_path / "a.ink", tensors, threads=2)  # the parent has saved with threads
    pid = os.fork()
    if pid == 0:
        try:
            inshrink.save(tmp_path / "c.ink", tensors, threads=2)
        finally:
            os._exit(0)
    wait_for_child(pid, "the forked child waited for the parent's pool threads")
    assert (tmp_path / "c.ink").read_bytes() == (tmp_path / "a.ink").read_bytes()


def test_plane_pool_promises_count_the_buffers_of_their_own_size():
    from inshrink.codecs import lossless
    pool = lossless.PlanePool(keep_bytes=1 << 20, min_bytes=1024)
    for _ in range(2):  # the second round finds the first round's buffers, allocates none
        pool.reserve(4096)
        pool.reserve(3000)  # the free 4096-byte buffer is promised: not counted for 3000
        free = {id(buf) for buf in pool._free}
        small, large = pool.take(3000), pool.take(4096)  # each its own size, none new
        assert {id(small.base), id(large.base)} == free
        assert (small.size, large.size) == (3000, 4096)
        pool.give([small, large])
        assert pool.free_bytes == 7096


def test_a_second_save_of_tensors_of_several_sizes_allocates_no_plane_buffer(
        tmp_path, monkeypatch):
    import types

    from inshrink.codecs import lossless
    pool = lossless.PlanePool(keep_bytes=8 << 20)
    monkeypatch.setattr("inshrink.io.writer.PLANES", pool)
    allocated = []

    def empty(shape, dtype=float):
        allocated.append(int(np.prod(shape)))
        return np.empty(shape, dtype)
    monkeypatch.setattr(lossless, "np", types.SimpleNamespace(**{**vars(np), "empty": empty}))
    rng = np.random.default_rng(2)
    # one-chunk tensors of three sizes, interleaved; each waited for, so that both saves have
    # the same buffers in use at once whatever the threads' timing (with tensors in flight
    # together, the first save may happen to need fewer at once than the second)
    tensors = {f"{i}.{n}": rng.standard_normal(n).astype(np.float32)
               for i in range(3) for n in (147_456, 36_864, 110_592)}
    for name in ("a.ink", "b.ink"):
        allocated.clear()
        with inshrink.Writer(tmp_path / name, threads=2) as w:
            for key, x in tensors.items():
                w.add(key, x)
    assert allocated == []
    assert (tmp_path / "a.ink").read_bytes() == (tmp_path / "b.ink").read_bytes()


def test_the_sketch_pass_of_a_many_chunk_tensor_runs_on_several_threads(tmp_path, monkeypatch):
    import time

    from inshrink.encode.sketch import Sketch
    sketchers, add = set(), Sketch.add

    def sketch_add(self, x):
        sketchers.add(threading.current_thread().name)
        return add(self, x)
    monkeypatch.setattr(Sketch, "add", sketch_add)
    x = (np.random.default_rng(4).standard_normal((40, 1024)) * 0.02).astype(np.float32)
    raw = x.view(np.uint8).reshape(-1)

    def read(start, stop):
        time.sleep(0.002)  # a source slow enough for the second thread to join in
        return raw[start:stop]
    written = []
    for threads in (2, 1):
        sketchers.clear()
        with inshrink.Writer(tmp_path / f"t{threads}.ink", policy=POLICY, threads=threads,
                             chunk_bytes=8192) as w:
            w.add_source("w.weight", F32, x.shape, read)
        written.append((tmp_path / f"t{threads}.ink").read_bytes())
        if threads == 2:
            assert len(sketchers) == 2 and all(n.startswith("inshrink") for n in sketchers)
    assert written[0] == written[1]


def test_a_small_tensor_that_fails_to_be_prepared_leaves_the_others_of_its_batch(tmp_path):
    rng = np.random.default_rng(4)
    good = {f"t{i}": rng.standard_normal(300 + i).astype(np.float32) for i in range(6)}
    with inshrink.Writer(tmp_path / "x.ink", threads=2) as w:
        for name in ("t0", "t1", "t2"):
            w.add(name, good[name], wait=False)
        # a source that does not return a buffer fails in the tensor's preparation
        w.add_source("bad", F32, (10,), lambda start, stop: "not a buffer")
        w.add("t3", good["t3"], wait=False)
        with pytest.raises(inshrink.errors.InvalidArgumentError, match="bad"):
            w.add("t4", good["t4"])  # waits for everything added so far
        w.add("t5", good["t5"], wait=False)
    with inshrink.File(tmp_path / "x.ink") as f:
        assert f.keys() == list(good)
        for name, x in good.items():
            np.testing.assert_array_equal(f[name], x)


def test_a_small_tensor_whose_chunk_fails_in_a_batch_leaves_no_file(tmp_path):
    x = np.arange(500, dtype=np.float32).view(np.uint8)
    reads = []

    def read(start, stop):  # right for the layout trial, short when the chunk is encoded
        reads.append(start)
        return x[start:stop] if len(reads) == 1 else x[start:stop - 4]
    w = inshrink.Writer(tmp_path / "x.ink", threads=2)
    w.add("a", np.ones(300, np.float32), wait=False)
    w.add_source("bad", F32, (500,), read)
    for i in range(40):  # several batches after it, none of them written
        w.add(f"t{i}", np.full(200, i, np.float32), wait=False)
    with pytest.raises(inshrink.errors.InvalidArgumentError, match="returned"):
        w.close()
    assert list(tmp_path.iterdir()) == []


def test_each_of_the_first_jobs_has_begun_before_the_calling_thread_goes_on(
        tmp_path, monkeypatch):
    # a new pool thread needs the GIL to take its job, which the calling thread would keep
    # while it adds the next tensors; jobs after the first `threads` are not waited for
    monkeypatch.setattr("inshrink.io.writer._BEGIN_WAIT_S", 10.0)  # a bound only
    release, began = threading.Event(), []

    def job(i):
        began.append(i)
        release.wait(10)
    w = inshrink.Writer(tmp_path / "x.ink", threads=2)
    try:
        for i in range(3):
            w._submit(job, i)
            assert began == [0, 1][:i + 1]  # the third waits for a free thread
    finally:
        release.set()
        w.abort()
    assert sorted(began) == [0, 1, 2] and list(tmp_path.iterdir()) == []


def test_close_reports_the_tensors_written_while_it_waits_for_the_last(tmp_path):
    # the reports of 212 tensors took 0.46 ms of a 2-thread save, ~50 ms, made after the
    # encoder threads were done; close now makes them while it waits for the last chunks
    rng = np.random.default_rng(5)
    tensors = {f"t{i}": rng.standard_normal(200 + i).astype(np.float32) for i in range(20)}
    release = threading.Event()
    last = np.arange(300, dtype=np.float32).view(np.uint8)

    def read(start, stop):
        release.wait(10)
        return last[start:stop]
    w = inshrink.Writer(tmp_path / "x.ink", threads=2, policy=POLICY)
    for name, x in tensors.items():
        w.add(name, x, wait=name == "t19")  # all 20 written before the last is added
    w.add_source("last", F32, (300,), read)
    closed = []
    closer = threading.Thread(target=lambda: closed.append(w.close()))
    closer.start()
    try:
        for _ in range(1000):  # the 20 tensors before the last are written: reported
            if len(w._infos) == 20:
                break
            threading.Event().wait(0.005)
        assert [i.name for i in w._infos] == list(tensors)
    finally:
        release.set()
        closer.join(10)
    with inshrink.File(tmp_path / "x.ink") as f:
        assert closed == [f.infos()]


def test_close_lets_the_threads_go_without_waiting_and_abort_waits(tmp_path, monkeypatch):
    # a thread ending frees its compression contexts: waiting for that took 0.2-0.45 ms of a
    # 2-thread save of final_fp32; nothing of the file is left to any thread by then. An
    # abort still waits: no thread may write into the discarded file
    from concurrent.futures import ThreadPoolExecutor
    waits = []
    shutdown = ThreadPoolExecutor.shutdown

    def recorded(self, wait=True, **kwargs):
        waits.append(wait)
        return shutdown(self, wait, **kwargs)
    monkeypatch.setattr(ThreadPoolExecutor, "shutdown", recorded)
    x = {f"t{i}": np.full(3000, i, np.float32) for i in range(40)}
    inshrink.save(tmp_path / "a.ink", x, threads=2)
    assert waits and not any(waits)
    waits.clear()
    with pytest.raises(RuntimeError, match="stop"):
        with inshrink.Writer(tmp_path / "b.ink", threads=2) as w:
            for name, array in x.items():
                w.add(name, array, wait=False)
            raise RuntimeError("stop")
    assert waits[-1] is True
    assert [p.name for p in tmp_path.iterdir()] == ["a.ink"]
