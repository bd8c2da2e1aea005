"""Misuse of the public Python API: bad arguments are typed errors raised before anything is
written, never a raw TypeError/ValueError/AttributeError from deep inside, a hang, or a file
that other readers reject."""
import os

import numpy as np
import pytest

import inshrink
from inshrink import File, Policy, QuantConfig, Series, Writer, dtypes
from inshrink.errors import BaseMismatchError, InshrinkError, InvalidArgumentError


def _never_read(start, stop):
    raise AssertionError("the source must not be read for a tensor that is refused")


def _debris(directory):
    return [n for n in os.listdir(directory) if n.endswith(".tmp")]


# -- Writer ---------------------------------------------------------------------------------

@pytest.mark.parametrize("threads", [1, 2])
def test_add_source_counts_the_item_size_in_the_tensor_size_limit(tmp_path, threads):
    # 2^46 elements are within the format's 2^48 bytes as bytes, not as 8-byte elements: the
    # writer encoded it for hours into a file every reader rejects (rule I-9)
    with Writer(tmp_path / "x.ink", threads=threads) as w:
        with pytest.raises(InshrinkError, match="exceeds"):
            w.add_source("x", dtypes.by_name("F64"), (1 << 46,), _never_read)
        w.add("y", np.ones(3, np.float32))
    assert list(inshrink.load(tmp_path / "x.ink")) == ["y"]


@pytest.mark.parametrize("shape", [3, None, 2.5])
def test_add_source_shape_that_is_not_a_sequence(tmp_path, shape):
    with Writer(tmp_path / "x.ink", threads=1) as w:
        with pytest.raises(InvalidArgumentError, match="shape"):
            w.add_source("x", dtypes.by_name("F32"), shape, _never_read)


@pytest.mark.parametrize("kwargs", [
    {"metadata": "ab"}, {"metadata": 5}, {"metadata": [1, 2]}, {"metadata": b"ab"},
])
def test_writer_mappings_of_the_wrong_type(tmp_path, kwargs):
    with pytest.raises(InvalidArgumentError):
        Writer(tmp_path / "x.ink", **kwargs)
    assert os.listdir(tmp_path) == []


def test_metadata_as_key_value_pairs_is_kept_as_before(tmp_path):
    inshrink.save(tmp_path / "x.ink", {"x": np.ones(3)}, metadata=[("a", "b"), ("c", "d")])
    assert inshrink.open(tmp_path / "x.ink").metadata == {"a": "b", "c": "d"}


def test_save_metadata_of_the_wrong_type(tmp_path):
    with pytest.raises(InvalidArgumentError, match="metadata"):
        inshrink.save(tmp_path / "x.ink", {"x": np.ones(3)}, metadata="ab")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("threads", [1, 2])
def test_progress_that_is_not_callable_is_refused_before_writing(tmp_path, threads):
    with pytest.raises(InvalidArgumentError, match="progress"):
        inshrink.save(tmp_path / "x.ink", {"x": np.ones(3)}, progress=3, threads=threads)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("threads", [1, 2])
def test_writer_dropped_without_close_leaves_no_temporary_file(tmp_path, threads):
    w = Writer(tmp_path / "x.ink", threads=threads)
    w.add("x", np.ones(3))
    w.add("y", np.ones(3), wait=False)
    assert _debris(tmp_path)
    del w
    import gc
    gc.collect()
    assert os.listdir(tmp_path) == []


# -- File -----------------------------------------------------------------------------------

@pytest.fixture
def ink(tmp_path):
    path = tmp_path / "f.ink"
    inshrink.save(path, {"x": np.arange(6, dtype=np.float32), "y": np.zeros(2, np.int8)})
    with File(path) as f:
        yield f


def test_file_contains_an_unhashable_value(ink):
    assert ["x"] not in ink
    assert "x" in ink


@pytest.mark.parametrize("call", [
    lambda f: f.read("x", progress=3),
    lambda f: f.load(progress=3),
    lambda f: f.read_into("x", lambda offset, chunk: None, progress=3),
])
def test_file_progress_that_is_not_callable(ink, call):
    with pytest.raises(InvalidArgumentError, match="progress"):
        call(ink)


def test_file_load_names_as_one_string(ink):
    # a string is a sequence of one-letter names: "xy" loaded tensors "x" and "y"
    with pytest.raises(InvalidArgumentError, match="names"):
        ink.load(names="xy")
    assert list(ink.load(names=["y"])) == ["y"]


# -- Series ---------------------------------------------------------------------------------

def test_series_save_after_the_newest_file_was_deleted(tmp_path):
    tensors = {"w": np.arange(64, dtype=np.float32)}
    series = Series(tmp_path)
    series.save(1, tensors)
    series.save(2, tensors)
    newest = series.checkpoints()[-1].file
    os.remove(tmp_path / newest)
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(BaseMismatchError, match="missing"):
        series.save(3, tensors)
    assert sorted(os.listdir(tmp_path)) == before
    assert series.steps() == [1, 2]


# -- Policy and codecs ----------------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [{"seed": -1}, {"max_rel_l2": True}])
def test_quant_config_values_refused_at_construction(kwargs):
    with pytest.raises(InvalidArgumentError):
        QuantConfig(**kwargs)


@pytest.mark.parametrize("kwargs", [
    {"roles": None}, {"roles": [("weight", None)]}, {"overrides": ["*"]}, {"tensors": None},
    {"overrides": {1: QuantConfig()}}, {"tensors": {1: QuantConfig()}},
])
def test_policy_fields_of_the_wrong_type(kwargs):
    with pytest.raises(InvalidArgumentError):
        Policy(**kwargs)


@pytest.mark.parametrize("kwargs", [
    {"seed": "1"}, {"seed": 1.5}, {"seed": -1}, {"seed": True}, {"max_rel_l2": "0.1"},
    {"protect": "0.1"}, {"prune": None},
])
def test_quantizing_numcodec_arguments(kwargs):
    from inshrink.numcodecs import InshrinkQuant
    with pytest.raises(InvalidArgumentError):
        InshrinkQuant(**kwargs)


@pytest.mark.parametrize("call", [
    lambda c, frame: c.decode(None),
    lambda c, frame: c.decode("abc"),
    lambda c, frame: c.encode("abc"),
    lambda c, frame: c.encode(np.array([1, None])),
    lambda c, frame: c.encode(np.arange(8.0)[::2]),
    lambda c, frame: c.decode(frame, out=np.arange(8.0)[::2]),
    lambda c, frame: c.decode(frame, out=_read_only(np.zeros(4))),
])
def test_numcodec_buffers_of_the_wrong_kind(call):
    from inshrink.numcodecs import Inshrink
    codec = Inshrink()
    frame = codec.encode(np.arange(4.0))
    with pytest.raises(InvalidArgumentError):
        call(codec, frame)


def _read_only(array):
    array.setflags(write=False)
    return array


# -- torch ----------------------------------------------------------------------------------

def test_save_torch_tensors_with_conjugate_or_negative_bit(tmp_path):
    torch = pytest.importorskip("torch")
    z = torch.tensor([1 + 2j, -3 - 4j], dtype=torch.complex64)
    tensors = {"conj": z.conj(), "neg": z.conj().imag}
    inshrink.save(tmp_path / "x.ink", tensors)
    out = inshrink.load(tmp_path / "x.ink")
    assert out["conj"].tolist() == [1 - 2j, -3 + 4j]
    assert out["neg"].tolist() == [-2.0, 4.0]


def test_save_nested_torch_tensor(tmp_path):
    torch = pytest.importorskip("torch")
    nested = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)], layout=torch.jagged)
    with pytest.raises(InvalidArgumentError, match="nested"):
        inshrink.save(tmp_path / "x.ink", {"x": nested})
    assert os.listdir(tmp_path) == []


def test_to_numpy_of_a_meta_tensor():
    torch = pytest.importorskip("torch")
    from inshrink.torch import to_numpy
    with pytest.raises(InvalidArgumentError, match="meta"):
        to_numpy(torch.empty(3, device="meta"))


def test_checkpointer_of_a_model_on_the_meta_device(tmp_path):
    torch = pytest.importorskip("torch")
    from inshrink.torch import Checkpointer
    ckpt = Checkpointer(tmp_path / "run", torch.nn.Linear(2, 2, device="meta"))
    with pytest.raises(InvalidArgumentError, match="meta"):
        ckpt.save(1)
    ckpt.close()


@pytest.mark.parametrize("kwargs", [{"optimizer": 5}, {"eval_batches": 5}])
def test_checkpointer_arguments_of_the_wrong_type(tmp_path, kwargs):
    torch = pytest.importorskip("torch")
    from inshrink.torch import Checkpointer
    with pytest.raises(InvalidArgumentError):
        Checkpointer(tmp_path / "run", torch.nn.Linear(2, 2), **kwargs)


def test_load_model_with_a_shape_mismatch_changes_nothing(tmp_path):
    torch = pytest.importorskip("torch")
    from inshrink.torch import load_model, save_model
    saved = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    save_model(saved, tmp_path / "m.ink")
    other = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 4))
    before = {k: v.clone() for k, v in other.state_dict().items()}
    # load_state_dict copied the tensors that fit (layer 0), then raised RuntimeError
    with pytest.raises(InvalidArgumentError, match="shape"):
        load_model(other, tmp_path / "m.ink", strict=False)
    assert all(torch.equal(before[k], v) for k, v in other.state_dict().items())


@pytest.mark.parametrize("call", [
    lambda files, path: files.save_model(5, path),
    lambda files, path: files.load_model(5, path),
    lambda files, path: files.load_file(path, device="nowhere"),
])
def test_torch_files_arguments_of_the_wrong_type(tmp_path, call):
    torch = pytest.importorskip("torch")
    from inshrink.torch import files
    files.save_file({"x": torch.ones(2)}, tmp_path / "x.ink")
    with pytest.raises(InvalidArgumentError):
        call(files, tmp_path / "x.ink")


@pytest.mark.parametrize("kwargs", [{"base": 3}, {"base": [1]}, {"base_codes": 3}])
def test_file_base_of_the_wrong_type(ink, kwargs):
    # was accepted, then an AttributeError when a delta tensor was read
    with pytest.raises(InvalidArgumentError, match="mapping"):
        File(ink.path, **kwargs)


def test_numcodec_configuration_with_an_unknown_key():
    numcodecs = pytest.importorskip("numcodecs")
    import inshrink.numcodecs  # noqa: F401 (registers the codecs)
    for codec_id in ("inshrink", "inshrink-quant"):
        with pytest.raises(InvalidArgumentError, match="foo"):
            numcodecs.get_codec({"id": codec_id, "foo": 1})
    assert numcodecs.get_codec({"id": "inshrink", "level": 3}).level == 3


def test_zarr_codec_configuration_with_an_unknown_key():
    pytest.importorskip("zarr")
    from inshrink.zarr import InkCodec, InkQuantCodec
    for cls in (InkCodec, InkQuantCodec):
        with pytest.raises(InvalidArgumentError, match="foo"):
            cls.from_dict({"name": cls.codec_name, "configuration": {"foo": 1}})
    assert InkCodec.from_dict({"name": "inshrink", "configuration": {"level": 3}}).config[
        "level"] == 3


@pytest.mark.parametrize("call", [
    lambda it, m: it.state_to_numpy(5),
    lambda it, m: it.state_to_numpy(m, 5),
    lambda it, m: it.load_state({}, None, 5),
    lambda it, m: it.GradientEMA(5),
    lambda it, m: it.quality_from(5, [(1, 2)]),
    lambda it, m: it.quality_from(m, [5]),
    lambda it, m: it.quality_from(m, [(1, 2, 3)]),
])
def test_torch_state_functions_with_arguments_of_the_wrong_type(call):
    torch = pytest.importorskip("torch")
    import inshrink.torch as it
    with pytest.raises(InvalidArgumentError):
        call(it, torch.nn.Linear(2, 2))


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix
def test_writer_stores_an_ndarray_subclass_that_reshapes_differently(tmp_path):
    # np.matrix stays 2-D when flattened: its chunks after the first came out wrong sizes
    matrix = np.matrix(np.arange(12, dtype=np.float32).reshape(3, 4))
    with Writer(tmp_path / "m.ink", threads=1, chunk_bytes=16) as w:
        w.add("m", matrix)
    out = inshrink.load(tmp_path / "m.ink")["m"]
    assert type(out) is np.ndarray and out.tolist() == matrix.tolist()


def test_importance_given_as_torch_tensors(tmp_path):
    torch = pytest.importorskip("torch")
    weight = torch.randn(64, 64, requires_grad=True)
    scores = weight * 2  # needs grad, as |g * w| computed in a training loop does
    for importance in (scores, scores.detach().bfloat16()):
        inshrink.save(tmp_path / "x.ink", {"model.weight": weight}, policy="balanced",
                      importance={"model.weight": importance})
    with pytest.raises(InvalidArgumentError, match="importance"):
        inshrink.save(tmp_path / "x.ink", {"model.weight": weight}, policy="balanced",
                      importance={"model.weight": np.array([None] * 64 * 64)})


@pytest.mark.parametrize("path", [None, 3, "x\0y.ink"])
def test_paths_of_the_wrong_type(tmp_path, path):
    for call in (lambda: Writer(path), lambda: File(path), lambda: inshrink.load(path),
                 lambda: inshrink.save(path, {"x": np.ones(2)})):
        with pytest.raises(InvalidArgumentError, match="path"):
            call()


def test_bytes_paths_write_as_they_read(tmp_path):
    path = os.fsencode(tmp_path / "x.ink")
    inshrink.save(path, {"x": np.ones(2)})  # TypeError: can't mix bytes and non-bytes
    with File(path) as f:
        assert f["x"].tolist() == [1.0, 1.0]


def test_numpy_scalars_are_accepted_as_settings_and_stored_as_plain_numbers(tmp_path):
    """Settings taken from numpy arrays (a sweep over np.arange, say) were refused: bins,
    seed, protect and prune had to be Python ints and floats."""
    import json

    from inshrink import Policy, QuantConfig
    from inshrink.numcodecs import InshrinkQuant
    config = QuantConfig(bins=np.int64(16), seed=np.uint8(3), protect=np.float32(0.001),
                         prune=np.float64(0.0))
    assert config == QuantConfig(bins=16, seed=3, protect=float(np.float32(0.001)))
    assert type(config.bins) is int and type(config.protect) is float
    weight = np.random.default_rng(0).standard_normal((128, 128), np.float32)
    inshrink.save(tmp_path / "a.ink", {"w.weight": weight}, policy=Policy.uniform(config))
    assert inshrink.load(tmp_path / "a.ink")["w.weight"].shape == (128, 128)
    codec = InshrinkQuant(bins=np.int32(8), seed=np.int64(2), protect=np.float32(0.001))
    assert json.loads(json.dumps(codec.get_config()))["seed"] == 2
    assert codec.decode(codec.encode(weight)).size == weight.size
    for bad in (dict(bins=np.bool_(True)), dict(seed=np.int64(-1)), dict(bins=np.float64(16))):
        with pytest.raises(inshrink.errors.InvalidArgumentError):
            QuantConfig(**bad)
