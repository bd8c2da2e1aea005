"""Stage ``factored`` (format 1.4): a non-negative matrix as row x column factors."""
import json

import ml_dtypes
import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import inshrink
from inshrink import errors
from inshrink.codecs.factored import Factored
from inshrink.dtypes import by_name
from inshrink.encode.policy import Policy, QuantConfig

FACTORED = Policy({"exp_avg_sq": QuantConfig(bins=2, domain="factored")})
NAME = "optimizer.state.0.exp_avg_sq"


def second_moment(rows: int, columns: int, seed: int = 0, dtype=np.float32) -> np.ndarray:
    """Close to rank one, as Adam's exp_avg_sq of a weight matrix is."""
    rng = np.random.default_rng(seed)
    outer = np.outer(rng.random(rows) + 0.1, rng.random(columns) + 0.1)
    return (outer * np.exp(0.2 * rng.standard_normal((rows, columns)))).astype(dtype)


def stored_factors(path) -> tuple[np.ndarray, np.ndarray]:
    """The row and column factors as stored, read independently of the library's decoder."""
    with inshrink.open(path) as f:
        entry = f._entries[NAME]
        stage = f._pipelines[NAME].stage
        rows = [np.frombuffer(zstandard.ZstdDecompressor().decompress(f._reader.read_chunk(c))
                              if c[4] == "zstd" else f._reader.read_chunk(c),
                              entry.dtype.numpy) for c in entry.streams[0]]
    return np.concatenate(rows), stage.columns


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("chunk_bytes", [None, 512, 8])
def test_decodes_to_the_product_of_its_factors(tmp_path, dtype, chunk_bytes):
    v = second_moment(40, 24, dtype=dtype).reshape(8, 5, 24)
    v[3] = 0  # rows of zeros stay exactly zero
    path = tmp_path / "f.ink"
    kwargs = {} if chunk_bytes is None else {"chunk_bytes": chunk_bytes}
    with inshrink.Writer(path, policy=FACTORED, threads=1, **kwargs) as writer:
        writer.add(NAME, v)
    with inshrink.open(path) as f:
        info, = f.infos()
    assert info.codec == "factored+zstd" and not info.lossless and not info.quantized
    assert info.role == "exp_avg_sq"
    with inshrink.open(path) as f:
        assert f.format_version == "1.4"
        out = f.read(NAME)
        entry = f._entries[NAME]
        assert entry.chunk_elements % 24 == 0  # whole rows per chunk, at least one
    rows, columns = stored_factors(path)
    assert out.dtype == dtype and out.shape == v.shape
    np.testing.assert_array_equal(out.reshape(40, 24), rows[:, None] * columns[None, :])
    assert np.all(out[3] == 0)
    # the factors keep every column's and row's sum (up to rounding)
    np.testing.assert_allclose(out.reshape(40, 24).sum(0), v.reshape(40, 24).sum(0), rtol=1e-5)
    np.testing.assert_allclose(out.reshape(40, 24).sum(1), v.reshape(40, 24).sum(1),
                               rtol=1e-5, atol=1e-12)
    error = np.linalg.norm(out.astype(np.float64) - v) / np.linalg.norm(v.astype(np.float64))
    assert info.error["rel_l2_error"] == pytest.approx(error, rel=1e-6)
    assert 0 < error < 0.5
    assert info.stored_bytes < v.nbytes / 10


def test_an_exact_rank_one_matrix_is_nearly_exact(tmp_path):
    v = np.outer(np.arange(1, 65, dtype=np.float64), np.linspace(0.5, 2, 33))
    inshrink.save(tmp_path / "f.ink", {NAME: v}, policy=FACTORED)
    np.testing.assert_allclose(inshrink.load(tmp_path / "f.ink")[NAME], v, rtol=1e-12)


@pytest.mark.parametrize("value, why", [
    (lambda v: -v, "negative"),
    (lambda v: np.where(np.arange(v.size).reshape(v.shape) == 7, np.nan, v), "NaN"),
    (lambda v: np.where(np.arange(v.size).reshape(v.shape) == 7, np.inf, v), "inf"),
    (lambda v: v.reshape(-1), "one dimension"),
    (lambda v: v.astype(np.float16), "F16"),
    (lambda v: v.astype(ml_dtypes.bfloat16), "BF16"),
    (lambda v: np.full_like(v, 3e38), "sums overflow float32"),
])
def test_a_tensor_that_does_not_qualify_is_quantized_in_the_log_domain(tmp_path, value, why):
    v = value(second_moment(64, 80).astype(np.float32))
    info, = inshrink.save(tmp_path / "f.ink", {NAME: v}, policy=FACTORED)
    assert info.codec == "quant+zstd", why
    with inshrink.open(tmp_path / "f.ink") as f:
        assert f.format_version == "1.1"
        report = f._entries[NAME].report
        assert report["domain"] in ("log", "signed_log") and report["levels"] <= 3
        out = f.read(NAME)
    assert out.shape == v.shape and out.dtype == v.dtype
    finite = np.isfinite(v.astype(np.float64))
    np.testing.assert_array_equal(out[~finite], v[~finite])  # non-finite values escaped


def test_small_and_empty_tensors(tmp_path):
    tensors = {NAME: second_moment(8, 16),  # small: lossless
               "optimizer.state.1.exp_avg_sq": np.zeros((0, 300), np.float32),
               "optimizer.state.2.exp_avg_sq": np.zeros((64, 64), np.float32)}
    infos = {i.name: i for i in inshrink.save(tmp_path / "f.ink", tensors, policy=FACTORED)}
    assert infos[NAME].lossless
    assert infos["optimizer.state.2.exp_avg_sq"].codec == "factored+zstd"
    back = inshrink.load(tmp_path / "f.ink")
    for name, v in tensors.items():
        assert back[name].shape == v.shape
        np.testing.assert_array_equal(back[name], v)


def test_factored_cannot_promise_an_error_bound():
    with pytest.raises(errors.InvalidArgumentError, match="factored"):
        QuantConfig(domain="factored", max_rel_l2=0.1)
    with pytest.raises(errors.InvalidArgumentError, match="domain"):
        QuantConfig(domain="factorised")


def test_stage_validation():
    f32, f16 = by_name("F32"), by_name("F16")
    ok = {"id": "factored", "columns": np.ones(3, np.float32).tobytes().hex()}
    stage = Factored.from_dict(ok, f32)
    assert stage.streams == 1 and stage.to_dict() == ok
    assert stage == Factored.from_dict(dict(ok), f32) and stage != Factored.from_dict(
        dict(ok, columns=np.ones(2, np.float32).tobytes().hex()), f32)
    assert stage.stream_sizes_ok(6, [8], 4) and not stage.stream_sizes_ok(6, [12], 4)
    assert not stage.stream_sizes_ok(7, [8], 4)
    bad = [dict(ok, extra=1), {"id": "factored"}, dict(ok, columns=""),
           dict(ok, columns=ok["columns"][:-2]), dict(ok, columns=" " + ok["columns"][1:]),
           dict(ok, columns=np.array([1, np.nan, 2], np.float32).tobytes().hex()),
           dict(ok, columns=np.array([1, np.inf, 2], np.float32).tobytes().hex()), [1]]
    for d in bad:
        with pytest.raises(errors.CorruptError):
            Factored.from_dict(d, f32) if isinstance(d, dict) else \
                Factored.from_dict({"id": "factored", "columns": d}, f32)
    with pytest.raises(errors.CorruptError, match="F16"):
        Factored.from_dict({"id": "factored", "columns": "0000"}, f16)
    out = np.empty(6 * 4, np.uint8)
    stage.decode([np.array([1, 2], np.float32).tobytes()], out)
    np.testing.assert_array_equal(out.view(np.float32), [1, 1, 1, 2, 2, 2])
    with pytest.raises(errors.CorruptError, match="finite"):
        stage.decode([np.array([1, np.inf], np.float32).tobytes()], out)


def test_a_non_finite_column_in_a_file_is_corrupt(tmp_path):
    from test_vectors import make_vectors  # its index editor
    path = tmp_path / "f.ink"
    inshrink.save(path, {NAME: second_moment(64, 80)}, policy=FACTORED)

    def edit(doc):
        stage = doc["tensors"][0]["codec"][0]
        stage["columns"] = np.float32(np.nan).tobytes().hex() + stage["columns"][8:]
    path.write_bytes(make_vectors.edit_index(path.read_bytes(), edit))
    with pytest.raises(errors.CorruptError, match="finite"):
        inshrink.open(path)


def test_series_and_delta_files_keep_factored_tensors_as_they_are(tmp_path):
    series = inshrink.Series(tmp_path / "s", FACTORED, keyframe_every=3)
    states = []
    for step in range(1, 6):
        state = {"model.w": second_moment(64, 80, seed=step) - 0.5,
                 NAME: second_moment(64, 80, seed=10 + step)}
        series.save(step, state)
        states.append(state)
    for step, state in enumerate(states, 1):
        back = series.load(step)
        np.testing.assert_array_equal(back["model.w"], state["model.w"])
        alone = tmp_path / f"alone{step}.ink"
        inshrink.save(alone, {NAME: state[NAME]}, policy=FACTORED)
        np.testing.assert_array_equal(back[NAME], inshrink.load(alone)[NAME])


@settings(max_examples=40, deadline=None)
@given(v=hnp.arrays(np.float32, st.tuples(st.integers(1, 40), st.integers(1, 30)),
                    elements=st.floats(0, 2.0**100, width=32, allow_subnormal=True)),
       chunk_bytes=st.sampled_from([8, 64, 1000, 1 << 22]))
def test_property_decoded_is_the_stored_product_and_the_report_is_true(
        tmp_path_factory, v, chunk_bytes):
    if v.size < 256:  # the moments' small-tensor floor: pad the matrix with rows
        v = np.concatenate([v, np.ones((256 // v.shape[1] + 1, v.shape[1]), np.float32)])
    path = tmp_path_factory.mktemp("f") / "f.ink"
    with inshrink.Writer(path, policy=FACTORED, threads=1, chunk_bytes=chunk_bytes) as w:
        w.add(NAME, v)
    with inshrink.open(path) as f:
        info, = f.infos()
        out = f.read(NAME)
    if info.codec != "factored+zstd":  # sums beyond float32
        assert not np.isfinite(v.astype(np.float64).sum(0).astype(np.float32)).all() or \
            not np.isfinite(v.astype(np.float64).sum(1) / v.astype(np.float64).sum()).all()
        return
    rows, columns = stored_factors(path)
    np.testing.assert_array_equal(out, rows[:, None] * columns[None, :])
    x = v.astype(np.float64)
    error = np.linalg.norm(out.astype(np.float64) - x)
    norm = np.linalg.norm(x)
    reported = info.error["rel_l2_error"]
    if norm > 0 and np.isfinite(error / norm):
        assert reported == pytest.approx(error / norm, rel=1e-6, abs=1e-12)
    assert json.dumps(info.error)  # JSON-safe (no NaN)


def test_a_product_beyond_the_dtype_is_inf_without_a_warning():
    """Spec 10.9: a product too large for the format is ±inf, a valid value; numpy's
    overflow warning reached the user's stderr on every such decode."""
    import warnings

    from inshrink.codecs.factored import Factored
    from inshrink.dtypes import by_name
    stage = Factored(by_name("F32"), np.array([3e38, -1e-30], np.float32))
    rows = np.array([10.0, 1e-30], np.float32)
    out = np.empty(4 * 4, np.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stage.decode([rows.tobytes()], out)
    values = out.view(np.float32)
    assert values[0] == np.inf and values[1] == np.float32(-1e-29)
    assert values[2] == np.float32(3e8) and values[3] == 0.0 and np.signbit(values[3])
