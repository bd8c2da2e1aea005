"""The index parser's short way (``_parse_canonical``) against the general parser on indexes
in the writer's form with structural changes: duplicate keys in any object, keys in another
order, dropped keys, chains shared by tensors of other dtypes, "streams" and "codec" values
in the writer's form where they do not belong (a report, the metadata, a codec stage, the
top level), overlapping records, duplicate and escaped names. ``parse`` must give the
general parser's index or error for every text."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inshrink.container import index, layout
from inshrink.errors import InshrinkError

DATA_END = 1 << 16
ITEMSIZE = {"F32": 4, "F16": 2, "U8": 1}
CHAINS = [[{"id": "bytegroup", "word": 1, "rotate": False}],
          [{"id": "bytegroup", "word": 2, "rotate": True}],
          [{"id": "xor"}, {"id": "bytegroup", "word": 1, "rotate": False}]]
NAMES = ["a", "b", "ü", '"streams":[[[64,4,1,4,"raw"]]]', 'x\\"codec\\":']
# values in the writer's form that the short way replaces before the JSON parse
MISPLACED = [("streams", [[[64, 4, 1, 4, "raw"]]]), ("streams", []),
             ("codec", CHAINS[0]), ("codec", CHAINS[2])]


def _dump(value) -> str:
    """JSON in the writer's form; a tuple ``(pairs,)`` is an object (duplicate keys
    allowed)."""
    if isinstance(value, tuple):
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + _dump(v)
                              for k, v in value[0]) + "}"
    if isinstance(value, list):
        return "[" + ",".join(map(_dump, value)) + "]"
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@st.composite
def _indexes(draw) -> bytes:
    at = layout.HEADER_SIZE
    tensors, objects = [], {"tensor": [], "stage": [], "report": []}
    for _ in range(draw(st.integers(0, 3))):
        dtype = draw(st.sampled_from(sorted(ITEMSIZE)))
        numel = draw(st.integers(0, 4))
        per_chunk = draw(st.integers(1, 3))
        codec = [([*stage.items()],) for stage in draw(st.sampled_from(CHAINS))]
        streams = []
        for _ in range(draw(st.integers(1, 2))):
            stream = []
            for c in range(-(-numel // per_chunk)):
                size = min(per_chunk, numel - c * per_chunk) * ITEMSIZE[dtype]
                stream.append([at, size, 1, size, draw(st.sampled_from(["raw", "zstd"]))])
                at += layout.RECORD_HEADER_SIZE + size
                at += layout.padding(at) - 64 * (draw(st.integers(0, 9)) == 9)  # overlaps
            streams.append(stream)
        report = [("role", "x")]
        name = draw(st.sampled_from(NAMES)) + str(len(tensors) * draw(st.integers(0, 3)))
        pairs = [("name", name), ("dtype", dtype), ("shape", [numel]),
                 ("chunk_elements", per_chunk), ("codec", codec), ("streams", streams),
                 ("report", (report,))]
        tensors.append((pairs,))
        objects["tensor"].append(pairs)
        objects["stage"] += [stage[0] for stage in codec]
        objects["report"].append(report)
    top = [("tensors", tensors), ("metadata", ([("k", "v")],))]
    objects["top"] = [top]
    objects["metadata"] = [top[1][1][0]]
    for _ in range(draw(st.integers(0, 2))):  # structural changes
        pairs = draw(st.sampled_from(objects[draw(st.sampled_from(sorted(objects)))] or [top]))
        kind = draw(st.integers(0, 3))
        if kind == 0:  # a value in the writer's form where it does not belong
            pairs.insert(draw(st.integers(0, len(pairs))), draw(st.sampled_from(MISPLACED)))
        elif kind == 1 and pairs:  # a key twice
            pairs.append(draw(st.sampled_from(pairs)))
        elif kind == 2:  # keys in another order
            pairs.reverse()
        elif pairs:  # a key dropped
            del pairs[draw(st.integers(0, len(pairs) - 1))]
    return _dump((top,)).encode()


def _outcome(parse, text: bytes):
    try:
        return parse(text, DATA_END, 1 << 20)
    except InshrinkError as exc:
        return type(exc), str(exc)


@settings(max_examples=400, deadline=None)
@given(_indexes())
def test_structural_changes_give_the_general_parsers_outcome(text):
    general = _outcome(index._parse_general, text)
    canonical = _outcome(index._parse_canonical, text)
    assert canonical is None or canonical == general, text
    saved = index.CANONICAL_MIN_BYTES
    index.CANONICAL_MIN_BYTES = 0  # parse() takes the short way (no fixture per example)
    try:
        assert _outcome(index.parse, text) == general
    finally:
        index.CANONICAL_MIN_BYTES = saved


HEAD = b'{"tensors":[{"name":"a","dtype":"U8","shape":[1],"chunk_elements":1,'
CHAIN = b'"codec":[{"id":"bytegroup","word":1,"rotate":false}],'
ONE = b'"streams":[[[64,1,1,1,"raw"]]]'


@pytest.mark.parametrize("text", [
    # a value in the writer's form in the last tensor's report: one "streams" or "codec"
    # value more than the tensors have, the report's own before the tensor's
    HEAD + CHAIN + ONE + b',"report":{"streams":[]}}],"metadata":{}}',
    HEAD + CHAIN + ONE + b',"report":{"codec":[{"id":"x"}]}}],"metadata":{}}',
    HEAD + b'"report":{"codec":[{"id":"x"}]},' + CHAIN + ONE + b'}],"metadata":{}}',
    HEAD + b'"report":{"streams":[]},' + CHAIN + ONE + b'}],"metadata":{}}',
])
def test_a_writers_form_value_in_a_report_is_not_taken_for_the_tensors(text):
    assert index._parse_canonical(text, DATA_END, 1 << 20) is None
    with pytest.raises(InshrinkError, match=r"\[I-11a\]"):
        index._parse_general(text, DATA_END, 1 << 20)
