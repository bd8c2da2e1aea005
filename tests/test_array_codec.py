"""Array frames (spec/FORMAT.md section 24): encoder choices and the reader's limits."""
from __future__ import annotations

import fractions
import json
import struct

import ml_dtypes
import numpy as np
import pytest

from inshrink import errors
from inshrink.encode.policy import QuantConfig
from inshrink.io import frame as array


def _weights(n: int = 20_000, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * 0.02).astype(np.float32)


def test_lossless_frame_has_no_report_and_a_quantized_one_reports_its_error():
    x = _weights()
    assert array.report(array.encode(x)) is None
    blob = array.encode(x, bins=32)
    rep = array.report(blob)
    y = array.decode(blob)
    measured = float(np.linalg.norm((y - x).astype(np.float64)) / np.linalg.norm(x))
    assert rep["bins"] == 32 and rep["rel_l2_error"] == pytest.approx(measured, rel=1e-6)
    assert rep["max_abs_error"] == pytest.approx(float(np.abs(y - x).max()), rel=1e-6)


def test_max_rel_l2_takes_the_fewest_bins_that_meet_it():
    x = _weights()
    blob = array.encode(x, bins=256, max_rel_l2=0.02)
    rep = array.report(blob)
    assert rep["rel_l2_error"] <= 0.02 and rep["bins"] < 256
    y = array.decode(blob)
    assert np.linalg.norm(y - x) / np.linalg.norm(x) <= 0.02
    coarser = array.encode(x, bins=256, max_rel_l2=0.1)
    assert array.report(coarser)["bins"] < rep["bins"] and len(coarser) < len(blob)


def test_an_unreachable_bound_stores_the_array_losslessly():
    x = _weights()
    blob = array.encode(x, bins=4, max_rel_l2=1e-9)
    assert array.report(blob) is None and array.decode(blob).tobytes() == x.tobytes()


def test_bad_arguments_are_typed_errors():
    with pytest.raises(errors.InvalidArgumentError, match="max_rel_l2"):
        array.encode(_weights(10), max_rel_l2=0.1)  # no bins
    with pytest.raises(errors.InvalidArgumentError, match="max_rel_l2"):
        array.encode(_weights(10), bins=8, max_rel_l2=float("nan"))
    with pytest.raises(errors.InvalidArgumentError, match="bytes-like"):
        array.decode("INKA")


def test_non_contiguous_and_bf16_arrays_round_trip():
    x = np.arange(600, dtype=np.float32).reshape(20, 30).T
    assert np.array_equal(array.decode(array.encode(x)), x)
    b = _weights(999).astype(ml_dtypes.bfloat16)
    assert array.decode(array.encode(b, chunk_bytes=256)).tobytes() == b.tobytes()


def _with_header(blob: bytes, edit) -> bytes:
    (length,) = struct.unpack_from("<I", blob, 5)
    header = json.loads(blob[9:9 + length])
    edit(header)
    text = json.dumps(header).encode()
    return blob[:5] + struct.pack("<I", len(text)) + text + blob[9 + length:]


@pytest.mark.parametrize("edit, error, rule", [
    (lambda h: h.update(chunk_elements=(64 << 20) // 4 + 1), errors.LimitExceededError, "A-8"),
    (lambda h: h.update(chunk_elements=32.0), errors.CorruptError, "A-8"),
    (lambda h: h.update(shape=[-1]), errors.CorruptError, "A-7"),
    (lambda h: h.update(codec=[]), errors.CorruptError, "A-9"),
    (lambda h: h.update(codec=[{"id": "bytegroup2"}]), errors.UnknownCodecError, "C-1"),
    (lambda h: h.update(report=[1]), errors.CorruptError, "A-10"),
    (lambda h: h["chunks"][0][0].__setitem__(0, "lz4"), errors.UnknownCodecError, "A-12"),
    (lambda h: h["chunks"][0][0].__setitem__(2, (64 << 20) + 1), errors.LimitExceededError,
     "A-12"),
    (lambda h: h["chunks"][0].pop(), errors.CorruptError, "A-12"),
    # every coding is checked before any size (spec order)
    (lambda h: (h["chunks"][0][0].__setitem__(2, (64 << 20) + 1),
                h["chunks"][0][1].__setitem__(0, "lz4")), errors.UnknownCodecError, "A-12"),
])
def test_header_rules(edit, error, rule):
    blob = _with_header(array.encode(np.linspace(-1, 1, 100, dtype=np.float32)), edit)
    with pytest.raises(error) as caught:
        array.decode(blob)
    assert type(caught.value) is error and str(caught.value).startswith(f"[{rule}] ")


def test_an_array_over_2_to_the_48_bytes_is_refused_whatever_max_nbytes_says():
    blob = _with_header(array.encode(np.zeros(4, np.float32)),
                        lambda h: h.update(shape=[1 << 24, (1 << 22) + 1]))  # F32: over 2^48 bytes
    with pytest.raises(errors.LimitExceededError, match=r"^\[A-7\]"):
        array.decode(blob, max_nbytes=1 << 60)


@pytest.mark.parametrize("shape", [[1 << 62, 0], [1 << 40, 1 << 40, 0], [0, 1 << 49]])
def test_an_empty_array_whose_other_dimensions_are_over_2_to_the_48_is_refused(shape):
    # numel 0, so numel x itemsize is 0: the non-zero dimensions are bounded as in I-9
    blob = _with_header(array.encode(np.zeros(0, np.uint8)), lambda h: h.update(shape=shape))
    with pytest.raises(errors.LimitExceededError, match=r"^\[A-7\] .*non-zero"):
        array.decode(blob)


def test_an_empty_array_with_a_large_but_valid_shape_decodes():
    blob = _with_header(array.encode(np.zeros(0, np.uint8)),
                        lambda h: h.update(shape=[1 << 47, 0]))
    assert array.decode(blob).shape == (1 << 47, 0)


def test_a_null_report_is_the_same_as_none():
    x = np.arange(10, dtype=np.float32)
    blob = _with_header(array.encode(x), lambda h: h.update(report=None))
    assert array.decode(blob).tobytes() == x.tobytes() and array.report(blob) is None


def test_a_lone_surrogate_in_a_report_string_is_accepted():
    blob = _with_header(array.encode(np.arange(10, dtype=np.float32)),
                        lambda h: h.update(report={"note": "\ud800"}))
    assert array.report(blob) == {"note": "\ud800"}


def test_the_readers_own_bound_is_rule_a_7a():
    blob = array.encode(np.zeros(1000, np.float32))
    with pytest.raises(errors.LimitExceededError, match=r"^\[A-7a\] .*max_nbytes=3999"):
        array.decode(blob, max_nbytes=3999)


def test_header_length_over_the_limit_is_refused_before_reading_it():
    blob = b"INKA\x01" + struct.pack("<I", (16 << 20) + 1) + b"{}"
    with pytest.raises(errors.LimitExceededError, match=r"^\[A-3\]"):
        array.decode(blob)


def test_nan_tokens_in_the_header_are_refused():
    blob = array.encode(_weights(100), bins=8)
    (length,) = struct.unpack_from("<I", blob, 5)
    text = blob[9:9 + length].replace(b'"pruned":0.0', b'"pruned":NaN')
    damaged = blob[:5] + struct.pack("<I", len(text)) + text + blob[9 + length:]
    with pytest.raises(errors.CorruptError, match=r"^\[A-4\]"):
        array.decode(damaged)


from hypothesis import given, settings, strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(st.sampled_from([np.float32, np.float16, np.float64, np.int8, np.uint16,
                                   np.int64, np.bool_, np.complex64]),
                  hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=9)),
       st.integers(1, 64))
def test_any_array_round_trips_bit_exactly(x, chunk_items):
    chunk_bytes = max(chunk_items * x.itemsize, x.itemsize)
    y = array.decode(array.encode(x, chunk_bytes=chunk_bytes))
    assert y.dtype == x.dtype and y.shape == x.shape and y.tobytes() == x.tobytes()


# The frame's quantization settings are validated by QuantConfig: one answer for each setting
# the frame and QuantConfig used to judge differently.

def test_a_zero_error_bound_is_refused_as_by_quant_config():
    # only lossless storage meets a bound of 0, and a lossless frame needs no bins
    with pytest.raises(errors.InvalidArgumentError, match="max_rel_l2 must be a positive"):
        array.encode(_weights(10), bins=8, max_rel_l2=0)
    with pytest.raises(errors.InvalidArgumentError, match="max_rel_l2 must be a positive"):
        QuantConfig(max_rel_l2=0)


@pytest.mark.parametrize("name", ["protect", "prune"])
def test_a_bool_is_no_fraction(name):
    with pytest.raises(errors.InvalidArgumentError, match=f"{name} must be a fraction"):
        array.encode(_weights(10), bins=8, **{name: False})
    with pytest.raises(errors.InvalidArgumentError, match=f"{name} must be a fraction"):
        QuantConfig(**{name: False})


def test_a_fraction_object_is_no_setting():
    # settings are plain numbers (reports and manifests write them as JSON)
    with pytest.raises(errors.InvalidArgumentError, match="protect must be a fraction"):
        array.encode(_weights(10), bins=8, protect=fractions.Fraction(1, 100))
    with pytest.raises(errors.InvalidArgumentError, match="protect must be a fraction"):
        QuantConfig(protect=fractions.Fraction(1, 100))


def test_numpy_scalar_settings_are_their_python_numbers():
    x = _weights(5000)
    want = array.encode(x, bins=16, protect=0.001, max_rel_l2=0.05, seed=1)
    assert array.encode(x, bins=np.int64(16), protect=np.float32(0.001).item(),
                        max_rel_l2=np.float64(0.05), seed=np.uint8(1)) == want
    assert QuantConfig(bins=np.int64(16), seed=np.uint8(1)) == QuantConfig(bins=16, seed=1)


def test_bad_fractions_get_quant_configs_message():
    with pytest.raises(errors.InvalidArgumentError, match="prune \\+ protect must be below 1"):
        array.encode(_weights(10), bins=8, protect=0.5, prune=0.5)


@pytest.mark.parametrize("domain", [None, "factored", "cubic"])
def test_a_frame_fits_its_levels_in_a_domain_given(domain):
    # QuantConfig takes None (the role's default) and "factored" (a file's stage): a frame
    # has neither a role nor that stage
    with pytest.raises(errors.InvalidArgumentError, match="domain must be"):
        array.encode(_weights(10), bins=8, domain=domain)


@pytest.mark.parametrize("domain", [None, "factored"])
def test_encode_config_refuses_a_config_without_a_fitted_domain(domain):
    with pytest.raises(errors.InvalidArgumentError, match="domain must be"):
        array.encode_config(_weights(10), QuantConfig(bins=8, domain=domain))


def test_quant_config_gives_the_frames_settings_and_encode_config_their_bytes():
    x = _weights(5000)
    config = array.quant_config(16, "signed_log", 0.01, 0.1, 0.05, 3)
    assert config == QuantConfig(bins=16, domain="signed_log", protect=0.01, prune=0.1,
                                 max_rel_l2=0.05, seed=3)
    assert array.encode_config(x, config) == array.encode(
        x, bins=16, domain="signed_log", protect=0.01, prune=0.1, max_rel_l2=0.05, seed=3)
    assert array.quant_config(None) is None
    assert array.encode_config(x, None) == array.encode(x)
