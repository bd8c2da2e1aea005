"""Shared test helpers: dtypes to cover and bit-exact comparison."""
import ml_dtypes
import numpy as np

ALL_DTYPES = [np.float64, np.float32, np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn,
              ml_dtypes.float8_e5m2, np.complex64, np.complex128, np.int8, np.int16, np.int32,
              np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.bool_]


def random_bits(dtype, shape, seed=0) -> np.ndarray:
    """An array of ``dtype`` whose bytes are uniformly random (NaN payloads, subnormals...)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    if dtype == np.bool_:
        raw &= 1
    return raw.view(dtype).reshape(shape)


def assert_bit_exact(expected, actual) -> None:
    expected = np.asarray(expected)
    assert actual.shape == expected.shape
    assert actual.dtype == expected.dtype.newbyteorder("<") or actual.dtype == expected.dtype
    little = expected.astype(expected.dtype.newbyteorder("<"), copy=False) \
        if expected.dtype.byteorder == ">" else expected
    assert np.ascontiguousarray(little).tobytes() == actual.tobytes()
