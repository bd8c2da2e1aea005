"""The JSON reader of the format's documents (array frame headers, the DCP series manifest)."""
import pytest

from inshrink import strict_json
from inshrink.io import frame as array


@pytest.mark.parametrize("text", ['{"a": 1, "a": 2}', '{"x": {"k": 1, "k": 1}}', '[NaN]',
                                  '{"v": Infinity}', '{"v": -Infinity}'])
def test_duplicate_keys_and_non_json_constants_are_refused(text):
    with pytest.raises(ValueError):
        strict_json.loads(text)


def test_plain_json_reads_as_json():
    assert strict_json.loads('{"a": [1, 2.5, "x", null, true], "b": {}}') == {
        "a": [1, 2.5, "x", None, True], "b": {}}


def test_an_array_frame_header_with_a_duplicate_key_is_a_corrupt_error():
    import numpy as np
    from inshrink.errors import CorruptError
    blob = bytearray(array.encode(np.arange(8, dtype=np.float32)))
    length = int.from_bytes(blob[5:9], "little")
    header = bytes(blob[9:9 + length])
    damaged = header.replace(b"{", b'{"dtype":"F32",', 1) if b'"dtype"' in header else None
    assert damaged is not None
    blob = blob[:5] + len(damaged).to_bytes(4, "little") + damaged + blob[9 + length:]
    with pytest.raises(CorruptError, match="A-4"):
        array.decode(bytes(blob))
