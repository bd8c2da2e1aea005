"""The Writer's lossy path: where tensors are prepared, what failures leave behind."""
import threading

import numpy as np
import pytest

import inshrink
from inshrink import dtypes, errors
from inshrink.encode.policy import Policy, QuantConfig

F32 = dtypes.BY_NAME["F32"]
POLICY = Policy.uniform(QuantConfig(bins=16, protect=0.001))


def tensors(count=6, shape=(64, 320)):
    """Weight matrices the policy quantizes (a 1-D or tiny tensor would be ``small``)."""
    rng = np.random.default_rng(3)
    return {f"layer{i}.weight": (rng.standard_normal(shape) * 0.02).astype(np.float32)
            for i in range(count)}


def test_sketch_and_fit_run_on_the_pool_threads(tmp_path):
    readers = set()
    with inshrink.Writer(tmp_path / "x.ink", policy=POLICY, threads=2) as w:
        for name, x in tensors().items():
            raw = x.view(np.uint8)

            def read(start, stop, raw=raw):
                readers.add(threading.current_thread().name)
                return raw[start:stop]
            w.add_source(name, F32, x.shape, read)
    with inshrink.open(tmp_path / "x.ink") as f:
        assert all(info.quantized for info in f.infos())
    assert threading.current_thread().name not in readers  # not even the sketch pass
    assert all(name.startswith("inshrink") for name in readers)


@pytest.mark.parametrize("chunk_bytes", [1 << 20, 8192])
def test_files_do_not_depend_on_the_thread_count(tmp_path, chunk_bytes):
    data = tensors()
    data["norm.weight"] = np.ones(64, np.float32)  # stored losslessly, between lossy ones
    data["last.weight"] = tensors(1, (8, 1024))["layer0.weight"]
    written = []
    for threads in (1, 2, 3):
        path = tmp_path / f"t{threads}.ink"
        with inshrink.Writer(path, policy=POLICY, threads=threads, chunk_bytes=chunk_bytes) as w:
            for name, x in data.items():
                w.add(name, x, wait=False)
        written.append(path.read_bytes())
    assert written[0] == written[1] == written[2]


def test_a_tensor_that_fails_on_a_pool_thread_is_dropped_and_the_writer_goes_on(tmp_path):
    a, b, c = tensors(3).values()
    with inshrink.Writer(tmp_path / "x.ink", policy=POLICY, threads=2) as w:
        with pytest.raises(errors.InvalidArgumentError, match="short.weight.*returned"):
            w.add_source("short.weight", F32, (64, 80),
                         lambda start, stop: b"\0" * (stop - start - 4))
            w.add("a", a)  # waits for everything added before it: the failure shows by now
        w.add("b", b)
        w.add("c", c, wait=False)
    with inshrink.open(tmp_path / "x.ink") as f:
        # "a" is stored when the failure showed in its add (it was queued by then)
        assert f.keys() in (["a", "b", "c"], ["b", "c"])
        assert all(f.info(name).quantized for name in f)


def test_bad_importance_fails_in_add_with_threads(tmp_path):
    with inshrink.Writer(tmp_path / "x.ink", policy=POLICY, threads=2) as w:
        with pytest.raises(errors.InvalidArgumentError, match="importance"):
            w.add("w.weight", tensors(1)["layer0.weight"], importance=np.ones(3), wait=False)
        w.add("w.weight", tensors(1)["layer0.weight"], wait=False)
    assert list(inshrink.load(tmp_path / "x.ink")) == ["w.weight"]


def test_records_are_written_by_the_pool_threads_in_order(tmp_path, monkeypatch):
    from inshrink.container.writer import ContainerWriter
    writers, original = set(), ContainerWriter.write_chunks

    def write_chunks(self, *args, **kwargs):
        writers.add(threading.current_thread().name)
        return original(self, *args, **kwargs)
    monkeypatch.setattr(ContainerWriter, "write_chunks", write_chunks)
    data = {"w": (np.random.default_rng(5).standard_normal(200_000) * 0.02).astype(np.float32),
            **tensors(3)}
    sizes = []
    for threads in (2, 1):
        with inshrink.Writer(tmp_path / f"t{threads}.ink", policy=POLICY, threads=threads,
                             chunk_bytes=64 << 10, progress=sizes.append) as w:
            for name, x in data.items():
                w.add(name, x, wait=False)
        if threads == 2:
            assert writers and all(name.startswith("inshrink") for name in writers)
    assert (tmp_path / "t1.ink").read_bytes() == (tmp_path / "t2.ink").read_bytes()
    assert sum(sizes) == 2 * sum(x.nbytes for x in data.values())  # progress: every chunk


def test_a_chunk_that_fails_on_a_pool_thread_leaves_no_file(tmp_path):
    x = np.arange(100_000, dtype=np.float32).view(np.uint8)

    def read(start, stop):  # the third chunk comes back short
        return x[start:stop - 4] if start == 2 * 8192 else x[start:stop]
    w = inshrink.Writer(tmp_path / "x.ink", threads=2, chunk_bytes=8192)
    with pytest.raises(errors.InvalidArgumentError, match="returned"):
        w.add_source("a", F32, (25_000,), read)
        w.add("b", np.ones(10, np.float32))  # waits for everything added before it
    with pytest.raises(errors.InvalidArgumentError, match="cannot be finished"):
        w.close()
    assert list(tmp_path.iterdir()) == []


# --- importance scores ------------------------------------------------------------------------

def test_importance_scores_of_a_numpy_dtype_inshrink_does_not_store():
    """Scores are converted to float64: since they went through as_numpy (as a tensor to
    store is), a float128 array was refused ('unsupported dtype float128')."""
    from inshrink.encode.tensor import overrides
    scores = np.linspace(0, 1, 64, dtype=np.longdouble)
    config = QuantConfig(bins=16, prune=0.25, prune_metric="sensitivity")
    assert overrides(scores, config, 64) is not None
    with pytest.raises(inshrink.errors.InvalidArgumentError):  # still: not numbers
        overrides(np.array([None] * 64, dtype=object), config, 64)
