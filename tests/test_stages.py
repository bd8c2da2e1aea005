"""Every codec stage on its own, in memory (:mod:`kit`'s checks): ``bytegroup``, ``quant``,
``factored``, ``xor``, ``codedelta`` and the entropy stage, over the dtypes each takes, empty,
0-d and one-element chunks, and non-finite values where a stage defines them; then the array
frame over every dtype. What quantization does to a tensor is checked here chunk by chunk,
without a file (tests/test_quant.py checks the same through files)."""
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from helpers import ALL_DTYPES, random_bits
from inshrink import errors
from inshrink.codecs import quant
from inshrink.codecs.chain import Pipeline
from inshrink.codecs.delta import CodeDelta, Xor, for_codes
from inshrink.codecs.entropy import PROBE_MIN_BYTES, Entropy
from inshrink.codecs.factored import Factored
from inshrink.codecs.lossless import SMALL_CHUNK_WORDS, ByteGroup
from inshrink.codecs.quant import Quant
from inshrink.dtypes import by_name, of_numpy
from kit import check_frame, check_parameters, check_pipeline, check_stage, quantized, rel_l2

QUANT_DTYPES = [np.float64, np.float32, np.float16, ml_dtypes.bfloat16]
FLOAT_DTYPES = QUANT_DTYPES + [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2]
SHAPES = [(0,), (), (1,), (257,), (SMALL_CHUNK_WORDS + 3,)]  # empty, 0-d, numpy and kernels
_ids = {"ids": lambda d: np.dtype(d).name}


def special_values(dtype) -> np.ndarray:
    """Signed zeros, infinities, NaNs, the smallest and largest values of a float dtype, and
    ordinary ones."""
    info = ml_dtypes.finfo(dtype)
    values = [0.0, -0.0, np.nan, -np.nan, info.smallest_subnormal, -info.tiny, info.max,
              info.min, 1.0, -0.5, 3.25]
    x = np.array(values, np.float64).astype(dtype)
    if not (np.issubdtype(dtype, np.floating) and np.dtype(dtype).itemsize >= 2) \
            and dtype != ml_dtypes.float8_e5m2:
        return x  # float8_e4m3fn: no infinities
    return np.concatenate([x, np.array([np.inf, -np.inf]).astype(dtype)])


def weights(shape, dtype=np.float32, seed=0, scale=0.02) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


def element_bytes(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x).reshape(-1).view(np.uint8)


# --- bytegroup and xor: lossless, every dtype -----------------------------------------------

@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", ALL_DTYPES, **_ids)
def test_bytegroup_is_bit_exact_for_every_dtype(dtype, shape):
    x = random_bits(dtype, shape, seed=len(shape))
    check_stage(ByteGroup.for_dtype(of_numpy(x.dtype)), element_bytes(x), of_numpy(x.dtype))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, **_ids)
def test_bytegroup_keeps_every_special_value(dtype):
    x = special_values(dtype)
    out = check_stage(ByteGroup.for_dtype(of_numpy(x.dtype)), element_bytes(x),
                      of_numpy(x.dtype))
    assert out == x.tobytes()


@pytest.mark.parametrize("word, rotate", [(1, False), (2, False), (2, True), (4, True)])
def test_bytegroup_of_any_word_that_divides_the_element(word, rotate):
    """Readers take every word width that divides the element, rotated or not (a writer
    picks one per dtype)."""
    x = random_bits(np.float32, (SMALL_CHUNK_WORDS + 1,), seed=word)
    check_stage(ByteGroup(word, rotate), element_bytes(x), by_name("F32"))


@pytest.mark.parametrize("level", [None, 1, 19, -5])
def test_bytegroup_decodes_alike_at_any_zstd_level(level):
    x = weights((64, 80))
    check_stage(ByteGroup(4, True), element_bytes(x), by_name("F32"), entropy=Entropy(level))


@given(data=st.binary(max_size=600), name=st.sampled_from(["F64", "F32", "BF16", "F8_E4M3",
                                                            "I64", "C64", "BOOL"]))
def test_bytegroup_round_trips_any_bytes(data, name):
    dtype = by_name(name)
    raw = np.frombuffer(data[:len(data) // dtype.itemsize * dtype.itemsize], np.uint8)
    check_stage(ByteGroup.for_dtype(dtype), raw, dtype)


@pytest.mark.parametrize("shape", [(0,), (), (300,), (SMALL_CHUNK_WORDS + 5,)], ids=str)
@pytest.mark.parametrize("dtype", ALL_DTYPES, **_ids)
def test_xor_delta_is_bit_exact_against_any_base(dtype, shape):
    x = random_bits(dtype, shape, seed=1)
    base = random_bits(dtype, shape, seed=2)
    check_stage(Xor(), element_bytes(x), of_numpy(x.dtype),
                array_stage=ByteGroup.for_dtype(of_numpy(x.dtype)), ref=element_bytes(base))


def test_xor_of_a_slow_drift_is_smaller_than_the_tensor_alone():
    x = weights((128, 64))
    drifted = x + weights((128, 64), seed=1, scale=1e-6)
    plain = Pipeline(ByteGroup(4, True)).encode(element_bytes(drifted))
    delta = Pipeline(ByteGroup(4, True), Xor()).encode(element_bytes(drifted), element_bytes(x))
    stored = [sum(len(memoryview(p)) for _, p, _ in chunks) for chunks in (plain, delta)]
    assert stored[1] < stored[0]


# --- quant: the dtypes it takes -----------------------------------------------------------

@pytest.mark.parametrize("bins", [0, 1, 2, 16, 300])
@pytest.mark.parametrize("dtype", QUANT_DTYPES, **_ids)
def test_quant_round_trips_to_its_levels_and_escapes(dtype, bins):
    x = weights((40, 64), dtype, seed=bins)
    stage, chunk, _, _ = quantized(x, bins, protect=0.01)
    out = np.frombuffer(check_stage(stage, chunk, of_numpy(x.dtype)), x.dtype)
    exact = out[chunk.positions] == x.reshape(-1)[chunk.positions]
    assert exact.all()  # escaped: stored exactly
    on_level = np.isin(out, stage.levels) | (out == x.reshape(-1))
    assert on_level.all()


@pytest.mark.parametrize("dtype", QUANT_DTYPES, **_ids)
def test_quant_keeps_non_finite_and_special_values_exact(dtype):
    x = np.concatenate([special_values(dtype), weights((500,), dtype)])
    stage, chunk, _, _ = quantized(x, 8, protect=0.0)
    out = np.frombuffer(check_stage(stage, chunk, of_numpy(x.dtype)), x.dtype)
    finite = np.isfinite(x.astype(np.float64))
    assert out[~finite].tobytes() == x[~finite].tobytes()  # NaN payloads too


@pytest.mark.parametrize("shape", [(0,), (), (1,)], ids=str)
@pytest.mark.parametrize("dtype", QUANT_DTYPES, **_ids)
def test_quant_of_empty_zero_d_and_one_element_chunks(dtype, shape):
    x = np.full(shape, 0.75, dtype)
    stage, chunk, _, _ = quantized(x, 4)
    assert len(check_stage(stage, chunk, of_numpy(x.dtype))) == x.nbytes


@pytest.mark.parametrize("bits", list(range(1, 17)))
def test_quant_packs_codes_at_every_width(bits):
    levels = np.linspace(-1, 1, min(1 << bits, quant.MAX_LEVELS), dtype=np.float32)
    rng = np.random.default_rng(bits)
    codes = rng.integers(0, levels.size, 1001).astype(np.uint16)
    positions = np.array([0, 17, 1000], np.int64)
    values = np.array([9.0, -np.inf, np.nan], np.float32).view(np.uint8)
    stage = Quant(by_name("F32"), levels, bits)
    check_stage(stage, quant.QuantChunk(codes, positions, values), by_name("F32"))


def test_quant_parameters_are_refused_on_dtypes_it_does_not_take():
    levels = Quant(by_name("F32"), np.zeros(2, np.float32), 1).to_dict()
    for name in ("F8_E4M3", "I32", "C64", "BOOL"):
        with pytest.raises(errors.CorruptError, match="C-3"):
            Quant.from_dict(levels, by_name(name))


# --- quant: what quantizing a tensor does, chunk by chunk (test_quant.py through files) ------

@pytest.mark.parametrize("dtype", QUANT_DTYPES, **_ids)
def test_quant_reported_error_is_the_actual_error(dtype):
    x = weights((256, 128), dtype)
    stage, chunk, stats, sumsq = quantized(x, 16, protect=0.0005)
    y = np.frombuffer(check_stage(stage, chunk, of_numpy(x.dtype)), x.dtype)
    assert math.isclose(stats.rel_l2(sumsq), rel_l2(x.reshape(-1), y), rel_tol=1e-6,
                        abs_tol=1e-12)
    diff = np.abs(x.reshape(-1).astype(np.float64) - y.astype(np.float64))
    assert math.isclose(stats.max_abs, diff.max(), rel_tol=1e-9)
    assert stats.rel_l2(sumsq) < 0.2
    assert len(np.unique(y)) <= 16 + int(0.001 * x.size) + 1


def test_quant_protected_values_are_exact_and_levels_sorted():
    x = weights((256, 128))
    x[3, 4], x[100, 7] = 5.0, -7.5  # far outliers: protected
    x[0, 0], x[0, 1], x[0, 2] = np.nan, np.inf, -np.inf
    stage, chunk, stats, _ = quantized(x, 16, protect=0.0005)
    y = np.frombuffer(check_stage(stage, chunk, by_name("F32")), np.float32).reshape(x.shape)
    assert y[3, 4] == 5.0 and y[100, 7] == -7.5
    assert np.isnan(y[0, 0]) and y[0, 1] == np.inf and y[0, 2] == -np.inf
    top = np.argsort(np.abs(x[np.isfinite(x)]))[-10:]
    assert np.array_equal(x[np.isfinite(x)][top], y[np.isfinite(x)][top])
    assert np.all(np.diff(stage.levels.astype(np.float64)) > 0)
    assert stats.protected >= 5


def test_quant_pruned_values_are_exactly_zero():
    x = weights((256, 128))
    stage, chunk, stats, _ = quantized(x, 16, prune=0.3, protect=0.0005)
    y = np.frombuffer(check_stage(stage, chunk, by_name("F32")), np.float32)
    smallest = np.argsort(np.abs(x), axis=None)[: int(0.25 * x.size)]
    assert np.all(y[smallest] == 0)
    assert 0.25 < stats.pruned / x.size < 0.35


@pytest.mark.parametrize("value", [0.0, 1.5, -2.0])
def test_quant_of_a_constant_chunk_is_exact(value):
    x = np.full((100, 100), value, np.float32)
    stage, chunk, stats, sumsq = quantized(x, 16, protect=0.0005)  # QuantConfig's default
    assert check_stage(stage, chunk, by_name("F32")) == x.tobytes()
    assert stats.rel_l2(sumsq) == 0


def test_quant_of_an_all_non_finite_chunk_is_exact():
    x = np.full((80, 80), np.nan, np.float32)
    x[::2] = np.inf
    stage, chunk, _, _ = quantized(x, 16)
    assert check_stage(stage, chunk, by_name("F32")) == x.tobytes()


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], **_ids)
def test_quant_zero_bins_keep_only_the_protected_entries(dtype):
    m = weights((128, 64), dtype, seed=5, scale=1e-3)
    m[0, :3] = [np.nan, np.inf, -0.0]
    stage, chunk, _, _ = quantized(m, 0, domain="signed_log", protect=0.001)
    x = np.frombuffer(check_stage(stage, chunk, of_numpy(m.dtype)), m.dtype).reshape(m.shape)
    kept = x != 0
    assert np.isnan(x[0, 0]) and x[0, 1] == np.inf  # non-finite values are always exact
    finite = np.isfinite(m.astype(np.float32))
    assert math.ceil(0.001 * m.size) <= np.count_nonzero(kept & finite) <= 0.002 * m.size
    assert np.array_equal(x[kept & finite], m[kept & finite])
    assert np.abs(m.astype(np.float32)[kept & finite]).min() >= \
        np.abs(m.astype(np.float32)[~kept & finite]).max()


@pytest.mark.parametrize("bins", [2, 5, 40, 300, 3000])
def test_quant_every_code_width_round_trips(bins):
    x = weights((300, 200), seed=bins)
    stage, chunk, stats, sumsq = quantized(x, bins, protect=0.001)
    stage = Quant(stage.dtype, stage.levels, quant.packing_bits(len(stage.levels)))
    assert stage.bits >= quant.code_bits(len(stage.levels))
    y = np.frombuffer(check_stage(stage, chunk, by_name("F32")), np.float32)
    assert math.isclose(stats.rel_l2(sumsq), rel_l2(x.reshape(-1), y), rel_tol=1e-6)
    assert (np.isin(y, stage.levels) | (y == x.reshape(-1))).all()


def test_quant_chunking_does_not_change_the_codes():
    x = weights((500, 300), seed=7).reshape(-1)
    stage, whole, _, _ = quantized(x, 32, protect=0.0005)
    from kit import fit_quantizer
    encoder, _ = fit_quantizer(x, 32, protect=0.0005)
    parts = [encoder.quantize(element_bytes(x[a:a + 10_000]))[0]
             for a in range(0, x.size, 10_000)]
    assert np.array_equal(np.concatenate([p.codes for p in parts]), whole.codes)
    decoded = check_pipeline(Pipeline(stage), parts, by_name("F32"))
    assert b"".join(decoded) == check_stage(stage, whole, by_name("F32"))


def test_quant_encodes_the_same_bytes_every_time():
    x = weights((256, 128))
    first = quantized(x, 16, protect=0.0005)
    again = quantized(x, 16, protect=0.0005)
    assert first[0] == again[0]
    payloads = [[bytes(p) for _, p, _ in Pipeline(s).encode(c)] for s, c, _, _ in (first, again)]
    assert payloads[0] == payloads[1]


@given(x=hnp.arrays(np.float32, st.integers(1, 3000),
                    elements=st.floats(-1e6, 1e6, width=32, allow_subnormal=True)),
       bins=st.integers(1, 40), prune=st.sampled_from([0.0, 0.1]),
       protect=st.sampled_from([0.0, 0.001, 0.05]),
       domain=st.sampled_from(["linear", "log", "signed_log"]))
def test_property_quant_decodes_to_what_its_error_report_says(x, bins, prune, protect, domain):
    stage, chunk, stats, sumsq = quantized(x, bins, prune=prune, protect=protect,
                                           domain=domain)
    y = np.frombuffer(check_stage(stage, chunk, by_name("F32")), np.float32)
    if np.any(x):
        assert math.isclose(stats.rel_l2(sumsq), rel_l2(x, y), rel_tol=1e-5, abs_tol=1e-9)
    distinct = np.unique(y[np.abs(x) < np.max(np.abs(x))])
    assert distinct.size <= bins + 1 + int(protect * x.size) + 1


# --- codedelta -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", QUANT_DTYPES, **_ids)
def test_codedelta_decodes_as_the_chunk_without_the_delta(dtype):
    rng = np.random.default_rng(1)
    x = weights((1000,), dtype)
    stage, chunk, _, _ = quantized(x, 8, protect=0.01)
    base = np.clip(chunk.codes.astype(np.int64) + rng.integers(-1, 2, x.size), 0,
                   len(stage.levels) - 1).astype(np.uint16)
    code_delta, wide = for_codes(stage, base)
    out = check_stage(code_delta, chunk, of_numpy(x.dtype), array_stage=wide, ref=base)
    assert out == check_stage(stage, chunk, of_numpy(x.dtype))


@given(codes=hnp.arrays(np.uint16, st.integers(0, 400), elements=st.integers(0, 6)),
       seed=st.integers(0, 2 ** 32 - 1))
def test_property_codedelta_round_trips_any_codes_against_any_base(codes, seed):
    levels = np.linspace(-1, 1, 7, dtype=np.float32)
    base = np.random.default_rng(seed).integers(0, 7, codes.size).astype(np.uint16)
    chunk = quant.QuantChunk(codes, np.empty(0, np.int64), np.empty(0, np.uint8))
    stage = Quant(by_name("F32"), levels, 4)
    code_delta, wide = for_codes(stage, base)
    check_stage(code_delta, chunk, by_name("F32"), array_stage=wide, ref=base)


def test_codedelta_needs_the_base_codes():
    stage = Quant(by_name("F32"), np.linspace(-1, 1, 4, dtype=np.float32), 2)
    chunk = quant.QuantChunk(np.zeros(10, np.uint16), np.empty(0, np.int64),
                             np.empty(0, np.uint8))
    pipeline = Pipeline(stage, CodeDelta(4))
    with pytest.raises(errors.BaseMismatchError, match="B-2"):
        pipeline.decode(pipeline.encode(chunk, np.zeros(10, np.uint16)),
                        np.empty(40, np.uint8), None)


# --- factored ------------------------------------------------------------------------------

@pytest.mark.parametrize("rows", [1, 7, 300])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], **_ids)
def test_factored_decodes_to_the_outer_product(dtype, rows):
    rng = np.random.default_rng(rows)
    columns = rng.random(33).astype(dtype)
    row_factors = rng.random(rows).astype(dtype)
    out = check_stage(Factored(of_numpy(np.dtype(dtype)), columns), row_factors,
                      of_numpy(np.dtype(dtype)))
    assert np.frombuffer(out, dtype).reshape(rows, 33).tobytes() == \
        (row_factors[:, None] * columns[None, :]).tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64], **_ids)
def test_factored_products_may_overflow_and_underflow(dtype):
    """Finite factors whose products round to ±inf or 0 are valid values (section 10.9)."""
    big, small = np.finfo(dtype).max, np.finfo(dtype).smallest_subnormal
    columns = np.array([big, small, 1.0, -2.0], dtype)
    rows = np.array([4.0, 0.25, 0.0], dtype)
    out = np.frombuffer(check_stage(Factored(of_numpy(np.dtype(dtype)), columns), rows,
                                    of_numpy(np.dtype(dtype))), dtype).reshape(3, 4)
    assert out[0, 0] == np.inf and out[1, 1] == 0 and (out[2] == 0).all()


def test_factored_of_an_empty_chunk():
    check_stage(Factored(by_name("F32"), np.ones(5, np.float32)), np.empty(0, np.float32),
                by_name("F32"))


def test_factored_parameters_are_refused_on_dtypes_it_does_not_take():
    stored = Factored(by_name("F32"), np.ones(2, np.float32)).to_dict()
    for name in ("F16", "BF16", "F8_E5M2", "I64"):
        with pytest.raises(errors.CorruptError, match="C-3"):
            Factored.from_dict(stored, by_name(name))


# --- the entropy stage -----------------------------------------------------------------------

ENTROPY_DATA = {"empty": b"", "zeros": bytes(1000), "random": random_bits(np.uint8, (999,)),
                "compressible, probed": np.arange(PROBE_MIN_BYTES + 7, dtype=np.uint8) % 5,
                "incompressible, probed": random_bits(np.uint8, (PROBE_MIN_BYTES,), seed=3)}


@pytest.mark.parametrize("level", [None, 1, 3, -5])
@pytest.mark.parametrize("name", ENTROPY_DATA)
def test_entropy_stage_returns_every_stream_byte_for_byte(name, level):
    data = ENTROPY_DATA[name]
    check_stage(Entropy(level), np.frombuffer(bytes(data), np.uint8))


# --- stage parameters ----------------------------------------------------------------------

@pytest.mark.parametrize("name", ["F64", "F32", "F16", "BF16"])
def test_quant_levels_survive_the_index_in_every_dtype(name):
    dtype = by_name(name)
    levels = special_values(dtype.numpy)
    levels = np.unique(levels[np.isfinite(levels.astype(np.float64))])
    check_parameters(Quant(dtype, levels, quant.packing_bits(levels.size)), dtype)


def test_every_stage_of_a_chain_names_its_format_minor():
    f32 = by_name("F32")
    for stage in (ByteGroup(4, True), Quant(f32, np.zeros(1, np.float32), 1),
                  Factored(f32, np.ones(2, np.float32)), Xor(), CodeDelta(3)):
        check_parameters(stage, f32)


# --- the array frame ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ALL_DTYPES, **_ids)
def test_frame_of_specials_and_of_every_dtype_in_several_chunks(dtype):
    x = special_values(dtype) if dtype in FLOAT_DTYPES else random_bits(dtype, (300,), seed=4)
    check_frame(x, chunk_bytes=np.dtype(dtype).itemsize * 7)


@pytest.mark.parametrize("dtype", QUANT_DTYPES, **_ids)
def test_quantized_frame_decodes_to_its_levels(dtype):
    x = weights((64, 50), dtype, seed=3)
    y = check_frame(x, bins=16, protect=0.001, chunk_bytes=4096)
    assert len(np.unique(y)) <= 16 + int(0.001 * x.size) + 1


def test_frame_of_a_big_endian_array_decodes_little_endian():
    x = np.arange(100, dtype=">f4")
    assert check_frame(x).dtype == np.dtype("<f4")
