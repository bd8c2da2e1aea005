"""The codec layer on its own: stages, pipelines, in-memory encode and decode of chunks."""
import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import ALL_DTYPES, random_bits
import inshrink
from inshrink import errors
from inshrink.io import frame as array
from inshrink.codecs import delta
from inshrink.codecs.chain import Pipeline, for_new_tensor
from inshrink.codecs.entropy import Entropy
from inshrink.codecs.factored import Factored
from inshrink.codecs.lossless import ByteGroup
from inshrink.codecs.quant import Quant
from inshrink.dtypes import by_name, of_numpy
from kit import fit_quantizer

F32 = by_name("F32")


def stages() -> list:
    levels = np.array([-1.0, 0.0, 0.5], np.float32)
    return [ByteGroup(4, True), ByteGroup(1, False), Quant(F32, levels, 2),
            Factored(F32, np.array([1.0, 2.0], np.float32)), delta.Xor(), delta.CodeDelta(7)]


@pytest.mark.parametrize("stage", stages(), ids=lambda s: s.id)
def test_stage_parameters_round_trip_and_compare_by_value(stage):
    again = type(stage).from_dict(stage.to_dict(), F32)
    assert again == stage and hash(again) == hash(stage) and again is not stage
    assert again.to_dict() == stage.to_dict()
    with pytest.raises(dataclasses.FrozenInstanceError):
        stage.id_ = 1  # frozen: a stage is what the file stores, nothing else
    assert stage != Quant(by_name("BF16"), np.zeros(3, np.uint16), 2)


def test_every_stage_names_its_format_minor():
    minors = {s.id: s.minor for s in stages()}
    assert minors == {"bytegroup": 0, "quant": 1, "factored": 4, "xor": 2, "codedelta": 2}
    assert Entropy.minor == 0
    quant = Quant(F32, np.zeros(1, np.float32), 1)
    assert Pipeline(ByteGroup(4, True)).minor == 0
    assert Pipeline(quant).minor == 1
    assert Pipeline(quant, delta.CodeDelta(2)).minor == 2
    assert Pipeline(ByteGroup(4, True), delta.Xor()).minor == 2
    with pytest.raises(errors.InvalidArgumentError, match="xor"):
        Pipeline(quant, delta.Xor())


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_lossless_pipeline_round_trips_one_chunk_in_memory(dtype):
    x = random_bits(dtype, (257,))
    raw = x.reshape(-1).view(np.uint8)
    pipeline = for_new_tensor(of_numpy(x.dtype), Entropy(3))
    encoded = pipeline.encode(raw)
    assert len(encoded) == pipeline.streams
    out = np.empty_like(raw)
    pipeline.decode(encoded, out)
    assert out.tobytes() == raw.tobytes()


@given(st.binary(min_size=0, max_size=64).map(lambda b: b[:len(b) // 4 * 4]),
       st.integers(0, 2 ** 32 - 1))
def test_xor_delta_round_trips_against_its_reference(data, seed):
    raw = np.frombuffer(data, np.uint8)
    ref = np.random.default_rng(seed).integers(0, 256, raw.size, dtype=np.uint8)
    pipeline = Pipeline(ByteGroup(4, True), delta.Xor())
    out = np.empty_like(raw)
    pipeline.decode(pipeline.encode(raw, ref), out, ref)
    assert out.tobytes() == raw.tobytes()


def test_quant_and_code_delta_round_trip_in_memory():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(1000).astype(np.float32)
    encoder, _ = fit_quantizer(x, 8, protect=0.01)
    chunk, stats = encoder.quantize(x.view(np.uint8))
    assert stats.count == x.size and chunk.positions.size == stats.protected
    plain = Pipeline(encoder.stage)
    out = np.empty(x.nbytes, np.uint8)
    codes = plain.decode(plain.encode(chunk), out)
    assert np.array_equal(codes, chunk.codes)
    decoded = out.view(np.float32)
    assert np.array_equal(decoded[chunk.positions], x[chunk.positions])  # escaped: exact
    # the same chunk stored as a code delta against drifted codes decodes to the same values
    base = np.clip(chunk.codes.astype(np.int64) + rng.integers(-1, 2, x.size), 0,
                   len(encoder.stage.levels) - 1).astype(np.uint16)
    code_delta, stage = delta.for_codes(encoder.stage, base)
    assert stage.levels is encoder.stage.levels and code_delta.modulus >= len(stage.levels)
    pipeline = Pipeline(stage, code_delta)
    again = np.empty_like(out)
    assert np.array_equal(pipeline.decode(pipeline.encode(chunk, base), again, base), codes)
    assert again.tobytes() == out.tobytes()
    codes_only = pipeline.encode_codes(chunk.codes, base)
    assert np.array_equal(pipeline.decode_codes(codes_only, x.size, base), codes)
    with pytest.raises(errors.BaseMismatchError, match="B-2"):
        pipeline.decode(pipeline.encode(chunk, base), again, None)


def test_delta_rule_keeps_only_a_smaller_first_chunk():
    assert delta.keep(plain=100, delta=99)
    assert not delta.keep(plain=100, delta=100)
    assert delta.stored_size([("zstd", b"abc", 9), ("raw", b"de", 2)]) == 5


def test_chain_validation_from_a_file():
    bg = ByteGroup(4, True).to_dict()
    assert Pipeline.from_chain([bg], F32) == Pipeline(ByteGroup(4, True))
    xor = Pipeline.from_chain([{"id": "xor"}, bg], F32)
    assert xor.is_delta and xor.chain() == [{"id": "xor"}, bg]
    with pytest.raises(errors.CorruptError, match="C-2"):
        Pipeline.from_chain([{"id": "xor"}, bg], F32, has_base=False)
    with pytest.raises(errors.UnknownCodecError, match="C-1"):
        Pipeline.from_chain([{"id": "lz4"}], F32)
    with pytest.raises(errors.CorruptError, match="C-2"):
        Pipeline.from_chain([{"id": "xor"}, Quant(F32, np.zeros(1, np.float32), 1).to_dict()],
                            F32)
    quant = Quant(F32, np.zeros(5, np.float32), 4).to_dict()
    for modulus in (4, 17, 65537, None, 5.0):  # fewer than the levels, too wide, not an int
        with pytest.raises(errors.CorruptError, match="C-3a"):
            Pipeline.from_chain([{"id": "codedelta", "modulus": modulus}, quant], F32)
    assert Pipeline.from_chain([{"id": "codedelta", "modulus": 16}, quant], F32).minor == 2


# --- one array in memory ----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (1000,), (7, 33)])
def test_array_encode_decode_is_bit_exact(dtype, shape):
    x = random_bits(dtype, shape, seed=len(shape))
    blob = array.encode(x, chunk_bytes=512)
    assert isinstance(blob, bytes) and blob.startswith(array.MAGIC)
    y = array.decode(blob)
    assert y.shape == x.shape and y.dtype == x.dtype and y.tobytes() == x.tobytes()


def test_array_quantized_decodes_to_what_a_file_with_the_same_config_does(tmp_path):
    x = np.random.default_rng(3).standard_normal((128, 50)).astype(np.float32)  # not small
    blob = array.encode(x, bins=16, protect=0.001, chunk_bytes=4096)
    y = array.decode(blob)
    assert y.dtype == x.dtype and y.shape == x.shape and len(blob) < x.nbytes / 4
    policy = inshrink.Policy.uniform(inshrink.QuantConfig(bins=16, protect=0.001,
                                                          domain="linear"))
    report = inshrink.save(tmp_path / "x.ink", {"x": x}, policy=policy, threads=1)
    assert report[0].quantized
    assert inshrink.load(tmp_path / "x.ink")["x"].tobytes() == y.tobytes()
    with pytest.raises(errors.InvalidArgumentError, match="quantized"):
        array.encode(np.arange(4), bins=4)


def test_array_decode_refuses_a_shape_over_the_limit():
    blob = array.encode(np.zeros(1000, np.float32))
    assert array.decode(blob, max_nbytes=4000).size == 1000
    with pytest.raises(errors.LimitExceededError, match="max_nbytes"):
        array.decode(blob, max_nbytes=3999)


BLOBS = [array.encode(np.linspace(-1, 1, 300, dtype=np.float32).reshape(10, 30),
                      chunk_bytes=400),
         array.encode(np.linspace(-1, 1, 300, dtype=np.float32), bins=8, chunk_bytes=400)]


@given(st.sampled_from(BLOBS), st.data())
def test_array_decode_of_damaged_bytes_is_a_typed_error(blob, data):
    damaged = bytearray(blob)
    if data.draw(st.booleans()):
        damaged = damaged[:data.draw(st.integers(0, len(blob) - 1))]
    else:
        for _ in range(data.draw(st.integers(1, 4))):
            damaged[data.draw(st.integers(0, len(blob) - 1))] ^= 1 << data.draw(
                st.integers(0, 7))
    try:
        out = array.decode(bytes(damaged))
    except errors.InshrinkError:
        return
    assert out.size == 300  # a flipped bit in a value is still a valid array
