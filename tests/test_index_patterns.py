"""The index parser's text patterns use possessive quantifiers where Python has them (3.11 on)
and greedy ones on 3.10, whose ``re`` has none. Both must find the same values in any text:
what follows each repetition can never be what it repeats, so backtracking changes nothing."""
from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from inshrink import dtypes
from inshrink.container import index, layout
from inshrink.container.index import TensorEntry

F32 = dtypes.BY_NAME["F32"]


def _greedy(pattern: re.Pattern) -> re.Pattern:
    return re.compile(pattern.pattern.replace("++", "+").replace("*+", "*").replace("?+", "?"))


def _same_matches(text: str) -> None:
    for pattern in (index._STREAMS, index._CODECS):
        greedy = _greedy(pattern)
        assert [m.span(1) for m in pattern.finditer(text)] == \
            [m.span(1) for m in greedy.finditer(text)]


def test_greedy_and_possessive_patterns_find_the_same_values_in_an_index():
    at = layout.HEADER_SIZE
    tensors = []
    for k, (numel, streams) in enumerate([(1000, 4), (0, 4), (7, 1), (2500, 2)]):
        planes = []
        for s in range(streams):
            chunks = [(at + 100 * c, 10, 12345 + c, numel, "zstd" if c % 2 else "raw")
                      for c in range(-(-numel // 1000))]
            at += 1000
            planes.append(tuple(chunks))
        tensors.append(TensorEntry(f"t{k}", F32, (numel,), [{"id": "bytegroup", "word": 4}],
                                   1000, tuple(planes)))
    text = '{"tensors":[' + ",".join(index.entry_text(t) for t in tensors) + "]}"
    assert index._STREAMS.search(text)
    _same_matches(text)


@given(st.text(alphabet='[]{},:"0123456789zstdrawcodecid', max_size=200))
def test_greedy_and_possessive_patterns_agree_on_any_text(body):
    _same_matches('"streams":' + body)
    _same_matches('"codec":' + body)
