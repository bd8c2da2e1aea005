"""Every kernel against a plain-numpy oracle."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from inshrink.codecs import lossless
from inshrink.codecs.lossless import SMALL_CHUNK_WORDS, ByteGroup
from inshrink.kernels import bytegroup

KERNELS = {2: (np.uint16, bytegroup.split_u16, bytegroup.join_u16),
           4: (np.uint32, bytegroup.split_u32, bytegroup.join_u32),
           8: (np.uint64, bytegroup.split_u64, bytegroup.join_u64)}


def oracle_split(words: np.ndarray, rotate: bool) -> np.ndarray:
    """Rotate each word left by one bit (optionally), then take its bytes, most significant first."""
    w = words.dtype.itemsize
    bits = np.unpackbits(words.astype(words.dtype.newbyteorder(">")).view(np.uint8)
                         .reshape(-1, w), axis=1)  # MSB first
    if rotate:
        bits = np.roll(bits, -1, axis=1)
    return np.packbits(bits, axis=1).T.copy()


@pytest.mark.parametrize("width", [2, 4, 8])
@pytest.mark.parametrize("rotate", [False, True])
@given(data=st.binary(max_size=512))
def test_split_and_join_match_oracle(width, rotate, data):
    word_type, split, join = KERNELS[width]
    words = np.frombuffer(data[:len(data) - len(data) % width], word_type)
    planes = np.empty((width, words.size), np.uint8)
    split(words, rotate, planes)
    np.testing.assert_array_equal(planes, oracle_split(words, rotate))
    back = np.empty_like(words)
    join(*planes, rotate, back)
    np.testing.assert_array_equal(back, words)


@pytest.mark.parametrize("width", [2, 4, 8])
def test_rotation_puts_float_exponent_in_plane_zero(width):
    float_type = {2: np.float16, 4: np.float32, 8: np.float64}[width]
    word_type, split, _ = KERNELS[width]
    x = np.array([-1.0, 1.0, 2.0, -0.0], float_type)
    planes = np.empty((width, 4), np.uint8)
    split(x.view(word_type), True, planes)
    # sign moves to bit 0 of the last plane; -1 and 1 share every other bit
    assert planes[-1, 0] & 1 == 1 and planes[-1, 1] & 1 == 0
    assert (planes[:-1, 0] == planes[:-1, 1]).all() and planes[-1, 0] ^ planes[-1, 1] == 1
    assert planes[0, 0] == planes[0, 1] != planes[0, 2]
    assert planes[:, 3].tolist() == [0] * (width - 1) + [1]


@pytest.mark.parametrize("width", [2, 4, 8])
def test_byte_grouping_of_unaligned_buffers_round_trips(width):
    """The kernels take aligned words only: the stage copies misaligned chunks and output."""
    stage = ByteGroup(width, True)
    n = SMALL_CHUNK_WORDS + 64  # large enough for the kernels
    data = np.arange(1 + n * width, dtype=np.uint8)[1:]  # starts one byte past an aligned one
    assert not data.view(KERNELS[width][0]).flags.aligned
    planes = stage.encode(data)
    out = np.zeros(data.size + 1, np.uint8)[1:]
    stage.decode([p.tobytes() for p in planes], out)
    np.testing.assert_array_equal(out, data)


@pytest.mark.parametrize("width", [2, 4, 8])
def test_join_takes_read_only_and_writable_planes(width):
    word_type, split, join = KERNELS[width]
    words = np.arange(100, dtype=word_type) * 977
    planes = np.empty((width, words.size), np.uint8)
    split(words, True, planes)
    read_only = [np.frombuffer(p.tobytes(), np.uint8) for p in planes]
    back = np.empty_like(words)
    join(*read_only[:1], *planes[1:], True, back)
    np.testing.assert_array_equal(back, words)


@pytest.mark.parametrize("width", [2, 4, 8])
@pytest.mark.parametrize("rotate", [False, True])
@pytest.mark.parametrize("n", [0, 1, 7, SMALL_CHUNK_WORDS - 1, SMALL_CHUNK_WORDS,
                               SMALL_CHUNK_WORDS + 3])
def test_stage_matches_oracle_on_both_sides_of_the_small_chunk_path(width, rotate, n):
    """Small chunks are grouped with numpy, larger ones by the kernels: same planes."""
    word_type = KERNELS[width][0]
    words = np.random.default_rng(n).integers(0, 1 << 63, n, dtype=np.uint64).astype(word_type)
    stage = ByteGroup(width, rotate)
    planes = stage.encode(words.view(np.uint8))
    np.testing.assert_array_equal(np.array(planes).reshape(width, n),
                                  oracle_split(words, rotate))
    out = np.empty(words.nbytes, np.uint8)
    stage.decode([p.tobytes() for p in planes], out)
    np.testing.assert_array_equal(out.view(word_type), words)


@pytest.mark.parametrize("width", [2, 4, 8])
def test_small_chunks_use_the_kernels_once_compiled(width, monkeypatch):
    """After a larger chunk compiled the kernels, small chunks skip numpy's grouping (about
    10 us slower a chunk): same planes, same decoded bytes, misaligned buffers included."""
    word_type, split, join = KERNELS[width]
    stage = ByteGroup(width, True)
    big = np.arange(SMALL_CHUNK_WORDS * width, dtype=np.uint8)
    stage.decode([p.tobytes() for p in stage.encode(big)], np.empty_like(big))
    assert split.ready and join.ready

    def numpy_path(*args):
        raise AssertionError("small chunk grouped with numpy although the kernel is ready")
    monkeypatch.setattr(lossless, "_split_small", numpy_path)
    monkeypatch.setattr(lossless, "_join_small", numpy_path)
    data = np.random.default_rng(width).integers(0, 256, 1 + 100 * width, np.uint8)[1:]
    planes = stage.encode(data)
    np.testing.assert_array_equal(np.array(planes),
                                  oracle_split(data.view(word_type).copy(), True))
    out = np.zeros(data.size + 1, np.uint8)[1:]  # misaligned output
    stage.decode([p.tobytes() for p in planes], out)
    np.testing.assert_array_equal(out, data)


@pytest.mark.parametrize("width", [2, 4, 8])
@pytest.mark.parametrize("rotate", [False, True])
@given(data=st.binary(max_size=256), skip=st.integers(0, 7))
def test_numpy_join_of_small_chunks_matches_oracle(width, rotate, data, skip):
    """The grouping a small chunk gets while the join kernel is not compiled: the words of
    the oracle's planes, in any buffer (misaligned output and read-only planes included)."""
    word_type = KERNELS[width][0]
    words = np.frombuffer(data[:len(data) - len(data) % width], word_type)
    planes = [p.tobytes() for p in oracle_split(words, rotate)]
    out = np.zeros(skip + words.nbytes, np.uint8)[skip:]
    lossless._join_small(planes, rotate, out)
    np.testing.assert_array_equal(out, words.view(np.uint8))


def _scaled_sum(x, factor):
    total = 0.0
    for i in range(x.shape[0]):
        total += x[i] * factor
    return total


def test_a_kernel_compiles_on_its_first_calls_once_then_calls_its_dispatcher():
    """Threads calling a kernel for the first time at once all get its result; the kernel
    is compiled once, and later calls go straight to what it compiled (the plain function
    with NUMBA_DISABLE_JIT=1), which another kernel's caller sees as ``ready``."""
    import threading

    from inshrink.kernels import Kernel

    k = Kernel(_scaled_sum, ["float64(Array(float64, 1, 'C', readonly=True), float64)"])
    assert not k.ready and k.__name__ == "_scaled_sum"
    x = np.arange(5.0)
    results: list = []
    barrier = threading.Barrier(4)

    def first_call() -> None:
        barrier.wait()
        results.append(k(x, 2.0))
    threads = [threading.Thread(target=first_call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [20.0] * 4
    assert k.ready and k._call is k.compiled()
    assert k(x, 0.5) == 5.0
    with pytest.raises(TypeError):  # a bad call still fails as the dispatcher fails it
        k()
