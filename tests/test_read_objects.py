"""An open file keeps few objects the garbage collector tracks: a load of many small tensors
otherwise triggers full collections that walk them all, again and again."""
from __future__ import annotations

import gc

import numpy as np

import inshrink

TENSORS = 200


def _tracked() -> int:
    # a collection untracks a tuple whose items it found untracked already; the order it
    # visits objects in may put a tuple before its items: the second one finishes the job
    gc.collect()
    gc.collect()
    return len(gc.get_objects())


def test_an_open_file_tracks_a_constant_number_of_objects_per_tensor(tmp_path):
    path = tmp_path / "many.ink"
    rng = np.random.default_rng(0)
    with inshrink.Writer(path, chunk_bytes=256, threads=1) as writer:
        for i in range(TENSORS):  # 2 chunks of several planes each
            writer.add(f"t{i}", rng.standard_normal(128).astype(np.float32))
    with inshrink.open(path, threads=1) as f:  # warm up: imports, caches, pipelines
        f["t0"]
    del f
    before = _tracked()
    with inshrink.open(path, threads=1) as f:
        streams = f._reader.index.tensors[0].streams
        assert len(streams) > 1 and len(streams[0]) == 2  # several records per tensor
        alive = _tracked() - before
        np.testing.assert_array_equal(f["t3"], inshrink.load(path)["t3"])
    # the tensor entry and its codec list; no object per stream or per record
    assert alive <= 3 * TENSORS + 50, f"{alive} tracked objects for {TENSORS} tensors"


def test_parsing_an_index_makes_few_tracked_objects_per_tensor(tmp_path, monkeypatch):
    # what the JSON parser hands back lives until the tensor entries are made: collections
    # that run meanwhile move it to the oldest generation, and when enough has moved there,
    # the next collection walks every object of the process (a training process has ~10^5)
    import json

    from inshrink.container import index

    path = tmp_path / "many.ink"
    rng = np.random.default_rng(0)
    with inshrink.Writer(path, chunk_bytes=256, threads=1) as writer:
        for i in range(TENSORS):  # 2 chunks of several planes each
            writer.add(f"t{i}", rng.standard_normal(128).astype(np.float32))
    alive = []

    class CountingJson:
        def __getattr__(self, name):
            return getattr(json, name)

        @staticmethod
        def loads(*args, **kwargs):
            doc = json.loads(*args, **kwargs)
            # a collection stops tracking a tuple of numbers and strings instead of moving it
            young = gc.get_objects(generation=0)
            alive.append(sum(type(o) is not tuple for o in young))
            return doc

    monkeypatch.setattr(index, "json", CountingJson())
    gc.collect()
    gc.disable()
    try:
        with inshrink.open(path, threads=1):
            pass
    finally:
        gc.enable()
    # the tensor's object, its codec list and object, its shape list: no list per stream
    # or per record (4 planes of one record each: 9 more lists per tensor)
    assert alive and max(alive) <= 5 * TENSORS + 50, f"{alive} for {TENSORS} tensors"
