"""The entropy stage's probe: a large stream whose first 64 KiB zstd cannot shrink is stored
raw without compressing the rest (default settings only); anything else compresses as before."""
import numpy as np
import pytest

from inshrink.codecs import entropy

RNG = np.random.default_rng(7)
NOISE = RNG.integers(0, 256, 4 * entropy.PROBE_MIN_BYTES, dtype=np.uint8)


def test_incompressible_stream_is_raw_and_not_copied():
    coding, payload = entropy.encode(NOISE)
    assert coding == entropy.RAW and payload is NOISE


def test_compressible_stream_is_compressed_and_round_trips():
    skewed = np.minimum(RNG.geometric(0.3, NOISE.size), 255).astype(np.uint8)
    coding, payload = entropy.encode(skewed)
    assert coding == entropy.ZSTD and len(payload) < skewed.size // 2
    assert entropy.decode(coding, payload, skewed.size) == skewed.tobytes()


@pytest.mark.parametrize("level", [None, 3])
def test_probe_judges_the_head_of_large_default_streams_only(level):
    # noise first, then zeros: the probe sees only noise
    mixed = np.concatenate([NOISE[:entropy.PROBE_BYTES],
                            np.zeros(entropy.PROBE_MIN_BYTES, np.uint8)])
    coding, _ = entropy.encode(mixed, level)
    assert coding == (entropy.RAW if level is None else entropy.ZSTD)


def test_small_streams_are_always_tried_whole():
    small = np.concatenate([NOISE[:entropy.PROBE_BYTES],
                            np.zeros(entropy.PROBE_MIN_BYTES - entropy.PROBE_BYTES - 1,
                                     np.uint8)])
    assert entropy.encode(small)[0] == entropy.ZSTD


def test_word_arrays_are_measured_in_bytes():
    words = NOISE.view(np.uint32)
    coding, payload = entropy.encode(words)
    assert coding == entropy.RAW and payload is words
