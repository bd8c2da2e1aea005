"""The writer's per-record fast paths give the bytes of the plain ones."""
from __future__ import annotations

import gc
import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import inshrink
from inshrink.io.writer import Writer

from inshrink.codecs import entropy
from inshrink.container import layout
from inshrink.container.index import Chunk
from inshrink.container.reader import ContainerReader
from inshrink.container.writer import ContainerWriter
from kit import start_lossy_kernels


def _payloads(rng: np.random.Generator) -> list:
    """Payloads of the kinds a save writes: zstd frames (bytes), raw planes (uint8 arrays,
    views too), empty ones, and some over the size written on its own."""
    out = []
    for size in (0, 1, 63, 64, 65, 3000, 70_000, 5, 200_000, 17):
        data = rng.integers(0, 256, size + 3, dtype=np.uint8)
        out.append(data[3:] if size % 2 else data[3:].tobytes())
    return out


def test_write_chunks_writes_what_write_chunk_writes(tmp_path):
    payloads = _payloads(np.random.default_rng(0))
    records = [("raw", p, len(p), layout.crc32(p)) for p in payloads]
    one = ContainerWriter(tmp_path / "one.ink")
    entries_one = [one.write_chunk(*r) for r in records[:4]]
    entries_one += [one.write_chunk(*r) for r in records[4:]]
    many = ContainerWriter(tmp_path / "many.ink")
    entries_many = many.write_chunks(records[:4]) + many.write_chunks(records[4:])
    assert many.write_chunks([]) == []
    assert entries_many == entries_one  # plain tuples, equal to the Chunks
    assert many.bytes_written == one.bytes_written
    for w in (one, many):
        w.commit({})
    assert (tmp_path / "one.ink").read_bytes() == (tmp_path / "many.ink").read_bytes()
    reader = ContainerReader(tmp_path / "many.ink")  # every record reads back
    try:
        for entry, payload in zip(entries_many, payloads):
            assert bytes(reader.read_chunk(Chunk(*entry))) == bytes(payload)
    finally:
        reader.close()


@pytest.mark.parametrize("level", [None, 3])
@pytest.mark.parametrize("size", [0, 10, 5000, entropy.PROBE_MIN_BYTES])
def test_entropy_stage_encodes_as_the_function_does(level, size):
    rng = np.random.default_rng(size)
    noise = rng.integers(0, 256, size, dtype=np.uint8)
    skewed = (rng.standard_normal(size) * 2).astype(np.int8).view(np.uint8)
    stage = entropy.Entropy(level)
    for data in (noise, skewed, skewed.tobytes(), memoryview(noise), noise.reshape(-1, 1)):
        coding, payload, nbytes = stage.encode(data)
        assert (coding, nbytes) == (entropy.encode(data, level)[0], size)
        assert bytes(payload) == bytes(entropy.encode(data, level)[1])
        assert bytes(entropy.decode(coding, payload, size)) == memoryview(data).tobytes()


def _small_tensors(n: int) -> dict[str, np.ndarray]:
    """Weights, moments and biases of a few hundred elements: most of a checkpoint's tensors."""
    rng = np.random.default_rng(n)
    out = {}
    for i in range(n // 3):
        size = int(rng.integers(64, 1024))
        out[f"layers.{i}.weight"] = (rng.standard_normal(size) * 0.02).astype(np.float32)
        out[f"state.{i}.exp_avg"] = (rng.standard_normal(size) * 1e-3).astype(np.float32)
        out[f"layers.{i}.bias"] = rng.standard_normal(size % 61).astype(np.float32)  # some empty
    return out


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("chunk_bytes", [layout.MAX_CHUNK_BYTES, 1024])
@pytest.mark.parametrize("policy", [None, "balanced"])
def test_a_save_keeps_few_tracked_objects_per_tensor(tmp_path, threads, chunk_bytes, policy):
    # Everything a save keeps until close is visited by every full collection of the
    # garbage collector, and how many there are decides how often one runs: a written
    # tensor keeps its index entry (and a lossy one its codec list), not its chunks' lists
    # and named tuples or its encoder (10-15 objects per tensor before).
    tensors = _small_tensors(300)
    start_lossy_kernels()
    inshrink.save(tmp_path / "warm.ink", dict(list(tensors.items())[:9]), threads=threads,
                  policy=policy)  # imports, compiled kernels, caches: before the count
    gc.collect()
    before = len(gc.get_objects())
    writer = Writer(tmp_path / "a.ink", threads=threads, chunk_bytes=chunk_bytes, policy=policy)
    last = list(tensors)[-1]
    for name, array in tensors.items():
        writer.add(name, array, wait=name == last)  # the last waits for all
    for _ in range(3):  # a tuple is untracked once what it holds is: a level per collection
        gc.collect()
    kept = len(gc.get_objects()) - before
    infos = writer.close()
    assert kept <= 2 * len(tensors) + 100, kept / len(tensors)
    with inshrink.File(tmp_path / "a.ink") as f:
        assert infos == f.infos()
        for name in list(tensors)[::37]:
            if policy is None:
                assert np.array_equal(f.read(name), tensors[name])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("policy", [None, "balanced"])
def test_what_close_reports_is_what_the_file_says(tmp_path, threads, policy):
    # a written lossless tensor's report is taken when its last chunk is written, the rest at
    # close: the same either way, and the same as the index's
    tensors = _small_tensors(60)
    tensors["big"] = np.random.default_rng(1).standard_normal(5000).astype(np.float32)
    with Writer(tmp_path / "a.ink", threads=threads, chunk_bytes=4096, policy=policy) as w:
        for name, array in tensors.items():
            w.add(name, array)
        infos = w.close()
    with inshrink.File(tmp_path / "a.ink") as f:
        assert infos == f.infos()
    if policy is not None:
        assert any(i.role is not None and i.codec == "bytegroup+zstd" for i in infos)
        assert any(i.codec.startswith("quant") for i in infos)


def test_each_tensors_index_text_is_made_once_it_is_written_not_at_commit(tmp_path,
                                                                           monkeypatch):
    # at commit every encoder thread waits for the index: its parts are made before
    from inshrink.container import index

    made_at_commit = []
    real = index.entry_text
    monkeypatch.setattr(index, "entry_text", lambda e: made_at_commit.append(e.name) or real(e))
    tensors = {f"t{i}": np.arange(i * 300, dtype=np.float32) for i in range(24)}
    for threads in (1, 2):
        for policy in (None, "balanced"):
            inshrink.save(tmp_path / "a.ink", tensors, threads=threads, policy=policy)
            back = inshrink.load(tmp_path / "a.ink")
            assert list(back) == list(tensors)
    assert made_at_commit == []


def test_index_text_from_made_parts_is_the_json_of_the_whole_index():
    from inshrink import dtypes
    from inshrink.container.index import Index, TensorEntry, entry_text

    f32 = dtypes.BY_NAME["F32"]
    entries = [TensorEntry(f"é{i}", f32, (i, 3), [{"id": "bytegroup", "word": 4,
                                                   "rotate": True}], 1024,
                           [[Chunk(64 * i, 10, 7, 12 * i, "zstd")]],
                           {"role": "w", "rel_l2_error": 0.1 * i} if i % 2 else None)
               for i in range(5)]
    metadata, header, base = {"k": "ü"}, '{"a":1}', {"file": "b.ink", "sha256": "0" * 64}
    for made in ({}, {id(e): entry_text(e) for e in entries[::2]}):
        for extra in ((None, None), (header, None), (header, base)):
            doc = {"tensors": [e.to_json() for e in entries], "metadata": metadata}
            if extra[0] is not None:
                doc["safetensors_header"] = extra[0]
            if extra[1] is not None:
                doc["base"] = extra[1]
            whole = json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()
            assert Index(entries, metadata, *extra).to_bytes(made) == whole


def test_add_takes_any_array_layout_as_its_contiguous_little_endian_copy(tmp_path):
    # Writer.add takes a C-contiguous array of a stored dtype as it is (without as_numpy);
    # any other array-like still goes through as_numpy: the same file either way
    rng = np.random.default_rng(3)
    base = rng.standard_normal((6, 7)).astype(np.float32)
    forms = {"contiguous": base, "fortran": np.asfortranarray(base),
             "big_endian": base.astype(">f4"), "strided": np.repeat(base, 2, axis=1)[:, ::2],
             "buffer": memoryview(base), "subclass": base.view(np.matrix)}
    paths = {}
    for form, value in forms.items():
        paths[form] = tmp_path / f"{form}.ink"
        with Writer(paths[form], threads=1) as w:
            w.add("w", value)
            w.add("b", np.arange(5, dtype=np.int64))
    expected = paths["contiguous"].read_bytes()
    for form, path in paths.items():
        assert path.read_bytes() == expected, form
    with Writer(tmp_path / "bad.ink", threads=1) as w:
        with pytest.raises(inshrink.InvalidArgumentError):
            w.add("masked", np.ma.masked_array(base, mask=base > 0))
        with pytest.raises(inshrink.InvalidArgumentError):
            w.add("objects", np.array([object()] * 3))


def test_config_for_resolves_a_config_domain_once():
    # every tensor of a role shares the config resolved for it (replace() validates all the
    # fields again); each equals what replace() gives
    from dataclasses import replace

    from inshrink.encode.policy import DEFAULT_DOMAIN, PRESETS, Policy, QuantConfig

    policy = PRESETS["balanced"]
    for role, name in (("weight", "model.w"), ("exp_avg", "opt.0.exp_avg"),
                       ("exp_avg_sq", "opt.0.exp_avg_sq")):
        first = policy.config_for(name, "F32", (64, 64))
        again = policy.config_for(name + "2" if role == "weight" else name, "F32", (64, 64))
        assert first[1] is again[1]
        assert first[1] == replace(policy.roles[role], domain=DEFAULT_DOMAIN[role])
    config = QuantConfig(bins=5)  # a config with its own domain keeps it
    assert Policy({"weight": config}).config_for("w", "F32", (64, 64))[1] == replace(
        config, domain="linear")
    assert Policy({"weight": replace(config, domain="log")}).config_for(
        "w", "F32", (64, 64))[1].domain == "log"


def test_config_for_still_resolves_once_after_many_other_configs():
    # a process that has resolved hundreds of configs (a search's per-tensor ones, a test
    # suite) still resolves a save's few configs once each: the cache forgets the least
    # recently used ones, it does not stop caching once full
    from inshrink.encode.policy import PRESETS, Policy, QuantConfig

    for seed in range(600):
        Policy.uniform(QuantConfig(bins=16, seed=seed)).config_for("w", "F32", (64, 64))
    policy = PRESETS["balanced"]
    assert policy.config_for("model.w", "F32", (64, 64))[1] is \
        policy.config_for("model.v", "F32", (64, 64))[1]


@pytest.mark.parametrize("threads", [1, 2])
def test_only_chunks_the_plane_pool_keeps_buffers_for_borrow_from_it(tmp_path, monkeypatch,
                                                                      threads):
    # buffers under the pool's min_bytes are new arrays either way: a small chunk is lent
    # none, and gives none back (a lock and a sort of the pool per chunk otherwise)
    from inshrink.codecs import lossless

    given = []
    real = lossless.PlanePool.give
    monkeypatch.setattr(lossless.PlanePool, "give",
                        lambda self, buffers: given.append(len(buffers)) or real(self, buffers))
    rng = np.random.default_rng(5)
    tensors = {"big": rng.standard_normal(1 << 16).astype(np.float32)}  # split kernels run
    tensors.update({f"s{i}": rng.standard_normal(5000 + i).astype(np.float32)
                    for i in range(20)})
    inshrink.save(tmp_path / "a.ink", tensors, threads=threads)
    assert given == [1]  # the big tensor's planes (one buffer), once
    back = inshrink.load(tmp_path / "a.ink")
    assert all(np.array_equal(back[k], v) for k, v in tensors.items())


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_a_tiny_tensor_one_plane_cannot_beat_is_stored_without_its_planes_tried(tmp_path,
                                                                              monkeypatch,
                                                                              dtype):
    # one plane that costs less than the planes' least (a record each) is chosen without
    # them encoded: the same file as when both layouts are tried
    from inshrink.encode import tensor as encoder
    from inshrink.codecs import entropy

    calls = []
    real = entropy._encode
    monkeypatch.setattr(entropy, "_encode",
                        lambda data, level: calls.append(1) or real(data, level))
    tensors = {"ln.weight": np.ones(300, dtype), "step": np.array(1000.0, dtype),
               "bias": np.random.default_rng(2).normal(0, 1, 300).astype(dtype)}
    inshrink.save(tmp_path / "a.ink", tensors, threads=1)
    word = np.dtype(dtype).itemsize
    assert len(calls) == 1 + 1 + (1 + word)  # the random bias: both layouts tried
    monkeypatch.setattr(encoder, "_record_bytes", lambda payload, real=encoder._record_bytes:
                        0 if payload == 0 else real(payload))  # the shortcut never taken
    inshrink.save(tmp_path / "b.ink", tensors, threads=1)
    assert (tmp_path / "a.ink").read_bytes() == (tmp_path / "b.ink").read_bytes()
    back = inshrink.load(tmp_path / "a.ink")
    assert all(np.array_equal(back[k], v) for k, v in tensors.items())


def test_a_policy_subclass_of_no_roles_is_still_asked_for_every_tensor(tmp_path):
    # a lossless policy's tensors skip config_for (its roles are not reported), a subclass's
    # config_for still decides
    from dataclasses import dataclass

    from inshrink.encode.policy import Policy, QuantConfig

    @dataclass(frozen=True)
    class Everything(Policy):
        def config_for(self, name, dtype, shape):
            return "weight", QuantConfig(bins=4, domain="linear")

    x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    infos = inshrink.save(tmp_path / "a.ink", {"x": x}, policy=Everything(), threads=1)
    assert infos[0].quantized
    infos = inshrink.save(tmp_path / "b.ink", {"x": x}, policy=Policy(), threads=1)
    assert infos[0].lossless and infos[0].role is None


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=8)


@settings(max_examples=150, deadline=None)
@given(name=st.text(min_size=1), value=_JSON_VALUES,
       report=st.none() | st.dictionaries(st.text(max_size=5), st.floats() | st.text()))
def test_entry_text_is_the_text_json_dumps_makes(name, value, report):
    from inshrink import dtypes
    from inshrink.container.index import TensorEntry, entry_text

    entry = TensorEntry(name, dtypes.BY_NAME["BF16"], (3, 2), [{"id": "x", "v": value}], 6,
                        (((64, 1, 2, 12, "raw"),),), report)
    expected = json.dumps(entry.to_json(), ensure_ascii=False, separators=(",", ":"))
    assert entry_text(entry) == expected


def test_entry_text_raises_what_json_dumps_raises():
    from inshrink import dtypes
    from inshrink.container.index import TensorEntry, entry_text

    cycle: list = []
    cycle.append(cycle)
    entry = TensorEntry("t", dtypes.BY_NAME["F32"], (1,), [{"id": "x"}], 1, (), None)
    for codec, error, message in (([{"id": object()}], TypeError, "not JSON serializable"),
                                  (cycle, ValueError, "Circular reference")):
        entry.codec = codec
        for _ in range(2):  # an error leaves nothing behind for the next call
            with pytest.raises(error, match=message):
                entry_text(entry)
        entry.codec = [{"id": "x", "same": [1, 1]}]  # a list seen twice is no cycle
        assert entry_text(entry) == json.dumps(entry.to_json(), ensure_ascii=False,
                                               separators=(",", ":"))


def test_file_bytes_of_streams_is_what_their_records_take(tmp_path):
    # the tiny-tensor choice's cost of a layout: each stream's record (header, payload,
    # padding to the alignment), payloads as bytes or as raw arrays
    from inshrink.encode import tensor as encoder

    rng = np.random.default_rng(3)
    for sizes in ([0], [1, 31, 32, 33], [64 - 32, 4096, 5000, 7]):
        streams = [("zstd", bytes(n), n) if k % 2 else
                   ("raw", rng.integers(0, 256, n + 1, dtype=np.uint8)[1:], n)
                   for k, n in enumerate(sizes)]
        writer = ContainerWriter(tmp_path / "x.ink")
        start = writer.bytes_written
        writer.write_chunks([(c, p, n, 0) for c, p, n in streams])
        written = writer.bytes_written - start
        writer.abort()
        assert encoder._file_bytes(streams) == written + -written % layout.ALIGNMENT
        assert encoder._file_bytes(streams) == sum(
            encoder._record_bytes(len(memoryview(p))) for _, p, _ in streams)
