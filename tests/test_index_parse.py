"""The index parser's two ways: the writer's form is read with fewer objects
(``_parse_canonical``), anything else by the general parser, which names the first rule
broken. For every text, ``parse`` must give what the general parser gives: the same index,
or the same error."""
from __future__ import annotations

import random
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inshrink import dtypes
from inshrink.container import index, layout
from inshrink.container.index import Index, TensorEntry
from inshrink.errors import InshrinkError

F32 = dtypes.BY_NAME["F32"]
CODEC = [{"id": "bytegroup", "word": 4, "rotate": True}]
DATA_END = 1 << 20
pytestmark = pytest.mark.usefixtures("index_short_way")  # parse() takes its short way here


def _entry(name: str, numel: int, chunk_elements: int, at: list[int], streams: int = 4,
           report: dict | None = None) -> TensorEntry:
    chunks = -(-numel // chunk_elements) if numel else 0
    planes = []
    for s in range(streams):
        plane = []
        for c in range(chunks):
            n = min(chunk_elements, numel - c * chunk_elements)
            plane.append((at[0], n, (7919 * at[0] + s) & 0xFFFFFFFF, n,
                          "zstd" if s == 0 else "raw"))
            at[0] += layout.RECORD_HEADER_SIZE + n
            at[0] += layout.padding(at[0])
        planes.append(tuple(plane))
    return TensorEntry(name, F32, (numel,) if numel else (0, 3), CODEC, chunk_elements,
                       tuple(planes), report)


def _text(**extra) -> bytes:
    at = [layout.HEADER_SIZE]
    tensors = [_entry("a", 1000, 1000, at), _entry("b.weight", 2500, 1000, at),
               _entry("empty", 0, 16, at), _entry("ü name", 10, 4, at, streams=1,
                                                  report={"role": "small", "x": 0.5}),
               _entry("c", 3, 8, at)]
    return Index(tensors, {"k": "v"}, **extra).to_bytes()


def test_a_short_index_goes_to_the_general_parser(monkeypatch):
    monkeypatch.undo()
    monkeypatch.setattr(index, "_parse_canonical", mock.Mock(side_effect=AssertionError))
    assert len(VALID[0]) < index.CANONICAL_MIN_BYTES
    assert index.parse(VALID[0], DATA_END, 1 << 24) == index._parse_general(VALID[0], DATA_END,
                                                                           1 << 24)


def _outcome(parse, text: bytes):
    try:
        return parse(text, DATA_END, 1 << 24)
    except InshrinkError as exc:
        return type(exc), str(exc)


def _assert_same(text: bytes) -> None:
    general = _outcome(index._parse_general, text)
    canonical = _outcome(index._parse_canonical, text)
    assert canonical is None or canonical == general, text
    assert _outcome(index.parse, text) == general


VALID = [_text(), _text(safetensors_header='{"x":1}'),
         _text(base={"file": "b.ink", "sha256": "0" * 64}), Index([], {}).to_bytes()]


@pytest.mark.parametrize("text", VALID)
def test_the_writers_form_is_read_the_short_way_into_the_same_index(text):
    canonical = index._parse_canonical(text, DATA_END, 1 << 24)
    assert canonical is not None
    assert canonical == index._parse_general(text, DATA_END, 1 << 24)
    for entry in canonical.tensors:  # plain tuples, as the general parser makes them
        assert type(entry.streams) is tuple
        assert all(type(s) is tuple and all(type(c) is tuple for c in s)
                   for s in entry.streams)


# parts of a one-tensor index: its start, a chain, a stream of one record
HEAD = b'{"tensors":[{"name":"a","dtype":"F32","shape":[1],"chunk_elements":1,'
CHAIN = b'"codec":[{"id":"bytegroup","word":1,"rotate":false}],'
ONE = b'"streams":[[[64,4,1,4,"raw"]]]'
NESTED = b'"codec":[{"id":"bytegroup","word":1,"rotate":false,' + ONE + b"}],"
FORGERIES = [
    # a tensor's streams given as a number, another "streams" value elsewhere in its entry
    HEAD + NESTED + b'"streams":91111111111100000000}],"metadata":{}}',
    HEAD + NESTED + b'"streams":0}],"metadata":{}}',
    HEAD + CHAIN + b'"str\\u0065ams":0}],"metadata":{"x":"streams",' + ONE + b"}}",
    # a "streams" value inside a string; one in the metadata
    (b'{"tensors":[{"name":"\\"streams\\":[[[64,4,1,4,\\"raw\\"]]]","dtype":"F32",'
     b'"shape":[1],"chunk_elements":1,' + CHAIN + ONE + b'}],"metadata":{}}'),
    HEAD + CHAIN + ONE + b'}],"metadata":{"streams":[[[128,4,1,4,"raw"]]]}}',
    # not valid JSON once the value is cut out of a string
    b'{"tensors":[{"name":"a",' + ONE + b'"}],"metadata":{}}',
    # leading zeros, spaces, a negative number, a duplicate key, a BOM, huge numbers
    HEAD + CHAIN + b'"streams":[[[064,4,1,4,"raw"]]]}]}',
    HEAD + CHAIN + b'"streams":[[[64, 4,1,4,"raw"]]]}]}',
    HEAD + CHAIN + b'"streams":[[[64,4,-1,4,"raw"]]]}]}',
    HEAD + b'"name":"b",' + CHAIN + ONE + b"}]}",
    b'\xef\xbb\xbf{"tensors":[],"metadata":{}}',
    HEAD + CHAIN + b'"streams":[[[' + b"9" * 5000 + b',4,1,4,"raw"]]]}]}',
    # I-12: streams of unequal lengths whose entries add up; overlapping records
    (HEAD.replace(b"[1]", b"[2]") + CHAIN
     + b'"streams":[[[64,4,1,4,"raw"],[128,4,1,4,"raw"],[192,4,1,4,"raw"]],'
     + b'[[256,4,1,4,"raw"]]]}]}'),
    HEAD.replace(b"[1]", b"[2]") + CHAIN + b'"streams":[[[64,40,1,4,"raw"],[64,4,1,4,"raw"]]]}]}',
    HEAD + CHAIN + b'"streams":[[],[[64,4,1,4,"raw"]]]}]}',
    # "codec" values: given as a number, one more in the metadata, one with an array, one
    # whose string holds a brace, one not valid JSON on its own, one with a duplicate key
    HEAD + b'"codec":92222222222200000000,' + ONE + b'}],"metadata":{}}',
    HEAD + CHAIN + ONE + b'}],"metadata":{"codec":[{"id":"x"}]}}',
    HEAD + b'"codec":[{"id":"bytegroup","word":[1],"rotate":false}],' + ONE + b"}]}",
    HEAD + b'"codec":[{"id":"byte}group","word":1,"rotate":false}],' + ONE + b"}]}",
    HEAD + b'"codec":[{"id":"bytegroup","word":1,"rotate":fals}],' + ONE + b"}]}",
    HEAD + b'"codec":[{"id":"bytegroup","id":"bytegroup"}],' + ONE + b"}]}",
    HEAD + b'"codec":[{"id":"bytegroup","word":NaN}],' + ONE + b"}]}",
]


def test_tensors_with_the_same_codec_text_share_its_chain():
    parsed = index._parse_canonical(VALID[0], DATA_END, 1 << 24)
    assert parsed.tensors[0].codec == CODEC and parsed.tensors[0].codec is parsed.tensors[1].codec


@pytest.mark.parametrize("text", FORGERIES)
def test_texts_near_the_writers_form_give_the_general_parsers_outcome(text):
    _assert_same(text)


def test_a_number_where_a_streams_value_belongs_is_not_taken_for_one():
    # the general parser rejects the entry's streams (I-11) before its codec is looked at
    assert index._parse_canonical(FORGERIES[0], DATA_END, 1 << 24) is None
    with pytest.raises(InshrinkError, match=r"\[I-11\]"):
        index.parse(FORGERIES[0], DATA_END, 1 << 24)


_ALPHABET = [b"[", b"]", b"{", b"}", b",", b":", b'"', b"0", b"1", b"9", b" ", b"\\",
             b"-", b"[]", b'"raw"', b'"zstd"', b'"streams":', b"64", b"],[", b"]],[[",
             b'"codec":', b'[{"id":"x"}]', b"true", b'"id"']


def test_mutations_of_the_writers_form_give_the_general_parsers_outcome():
    rng = random.Random(1)
    for _ in range(1500):
        text = bytearray(rng.choice(VALID))
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(text))
            token = rng.choice(_ALPHABET)
            kind = rng.randrange(3)
            if kind == 0:
                text[at:at + 1] = token
            elif kind == 1:
                text[at:at] = token
            else:
                del text[at:at + rng.randint(1, 8)]
        _assert_same(bytes(text))


_DIMS = st.one_of(st.integers(-2, 1 << 64), st.sampled_from([0, 1, 1 << 24, 1 << 47, 1 << 63]),
                  st.booleans(), st.floats(0, 10), st.none())


@given(shape=st.one_of(st.lists(_DIMS, max_size=3), st.tuples(st.integers(0, 9))),
       itemsize=st.sampled_from([1, 2, 4, 8]))
def test_the_common_shapes_fast_check_agrees_with_the_general_one(shape, itemsize):
    def outcome(check):
        try:
            return check(shape, itemsize)
        except InshrinkError as exc:
            return type(exc), str(exc)
    assert outcome(index.check_shape) == outcome(index._check_shape)
