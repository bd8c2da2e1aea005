"""The index: what the file holds and where (JSON, spec/FORMAT.md "Index").

Parsing validates every field the reader will later trust (types, limits, offsets in bounds,
records not overlapping), so nothing downstream sees an unchecked number.
"""
from __future__ import annotations

import itertools
import json
import math
import re
import sys
from dataclasses import dataclass, field
from json import encoder as _json_encoder
from typing import Mapping, NamedTuple

import numpy as np

from .. import dtypes
from ..errors import CorruptError, InshrinkError, LimitExceededError, UnknownCodecError
from . import layout


class Chunk(NamedTuple):
    """One record of a stream: where it lies and what it decodes to.

    The fields in order of a chunk entry. An index read from a file holds plain
    ``(offset, length, crc, size, coding)`` tuples instead, read by position: the garbage
    collector stops tracking a plain tuple of numbers and strings, never a named tuple, and
    a file opened keeps one per record alive while it is read.
    """

    offset: int      # of the record header
    length: int      # payload bytes
    crc: int         # CRC-32 of the payload
    size: int        # decoded bytes
    coding: str      # "zstd" or "raw"

    def to_json(self) -> list:
        return [self.offset, self.length, self.crc, self.size, self.coding]


@dataclass(slots=True)  # no __dict__ per entry: on Python 3.10 each was one more object
class TensorEntry:        # for the garbage collector to visit (3.11 makes none)
    """Everything the index says about one tensor."""

    name: str
    dtype: dtypes.DType
    shape: tuple[int, ...]
    codec: list[dict]
    chunk_elements: int
    # per stream, its chunks in order as plain (offset, length, crc, size, coding) tuples,
    # read by position (Chunk names the fields); an index read from a file holds tuples of
    # them (nothing changes them), a Writer's tensor too once written
    # (see ContainerWriter.write_chunks)
    streams: list = field(default_factory=list)
    report: dict | None = None   # optional, informational: what the encoder measured

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    @property
    def stored_bytes(self) -> int:
        return sum(c[1] for s in self.streams for c in s)  # c.length, of a plain tuple too

    @property
    def chunk_count(self) -> int:
        return -(-self.numel // self.chunk_elements)

    def chunk_range(self, c: int) -> tuple[int, int]:
        """Element range [start, stop) of chunk ``c``."""
        start = c * self.chunk_elements
        return start, min(start + self.chunk_elements, self.numel)

    def to_json(self) -> dict:
        """The entry as the index stores it, for :func:`json.dumps`: the shape and streams
        as they are, tuples (chunks too) written as arrays as lists are. A new list per
        chunk would be ~9 objects per small tensor, all alive until the whole index is
        written, that the garbage collector takes for long-lived ones."""
        doc = {"name": self.name, "dtype": self.dtype.name, "shape": self.shape,
               "chunk_elements": self.chunk_elements, "codec": self.codec,
               "streams": self.streams}
        if self.report is not None:
            doc["report"] = self.report
        return doc


@dataclass
class Index:
    tensors: list[TensorEntry]
    metadata: dict[str, str]
    safetensors_header: str | None = None
    base: dict | None = None   # {"file": name, "sha256": hex} of the file deltas refer to

    def to_bytes(self, texts: Mapping[int, str] | None = None) -> bytes:
        """The index JSON; ``texts`` maps ``id(entry)`` to :func:`entry_text` of entries
        whose text was made already (the same bytes as without it)."""
        texts = texts or {}
        tensors = ",".join(texts.get(id(t)) or entry_text(t) for t in self.tensors)
        doc: dict = {"metadata": self.metadata}
        if self.safetensors_header is not None:
            doc["safetensors_header"] = self.safetensors_header
        if self.base is not None:
            doc["base"] = self.base
        rest = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
        return f'{{"tensors":[{tensors}],{rest[1:]}'.encode()


def entry_text(entry: TensorEntry) -> str:
    """One tensor's JSON in the index (what :meth:`Index.to_bytes` joins): the text of
    ``json.dumps(entry.to_json(), ensure_ascii=False, separators=(",", ":"))``."""
    if _make_encoder is None:  # no C accelerator in this Python
        return json.dumps(entry.to_json(), ensure_ascii=False, separators=(",", ":"))
    # the C encoder json.dumps makes with these settings (markers, default, string encoder,
    # indent, key and item separators, sort_keys, skipkeys, allow_nan), without the
    # JSONEncoder object and its Python methods around it: 4.0 -> 3.1 us for a small
    # lossless tensor's entry. Made per call, as json.dumps does: its dict of the containers
    # being written (the circular-reference check) is then never shared by threads nor left
    # with entries by an error.
    encode = _make_encoder({}, _DEFAULT, _encode_string, None, ":", ",", False, False, True)
    return "".join(encode(entry.to_json(), 0))


_make_encoder = _json_encoder.c_make_encoder
_encode_string = _json_encoder.encode_basestring  # json.dumps's when ensure_ascii=False
_DEFAULT = json.JSONEncoder().default  # the same TypeError for what JSON cannot hold


# The index is JSON with many repeated keys: zstd shrinks it 5-7x (docs/decisions.md). Level 9
# costs about 1 ms per 100 KB of index; higher levels gain ~10% at 30x the time.
INDEX_ZSTD_LEVEL = 9
# Smaller indexes stay plain JSON (a frame would save little, and plain JSON stays readable).
MIN_COMPRESSED_INDEX = 1024


def pack_index(payload: bytes) -> bytes | None:
    """The index payload as one zstd frame (feature ``zindex``), or None when plain JSON is
    short or the frame would not be smaller."""
    if len(payload) < MIN_COMPRESSED_INDEX:
        return None
    frame = layout.zstd().ZstdCompressor(level=INDEX_ZSTD_LEVEL, write_content_size=True,
                                         write_checksum=False).compress(payload)
    return frame if len(frame) < len(payload) else None


def unpack_index(frame: bytes, file_size: int) -> bytes:
    """Decompress a ``zindex`` payload after checking that its frame declares a size within
    the index limits for a file of ``file_size`` bytes; typed errors for anything else (spec
    rules I-0a, I-0b)."""
    zstandard = layout.zstd()
    try:
        params = layout.zstd_frame_parameters(frame)
    except zstandard.ZstdError as exc:
        _fail("I-0a", f"compressed index: bad zstd frame header ({exc})")
    size = params.content_size
    if size == zstandard.CONTENTSIZE_UNKNOWN:
        _fail("I-0a", "compressed index: the zstd frame does not declare its size")
    if params.dict_id or params.window_size > layout.MAX_ZSTD_WINDOW:
        _fail("I-0a", f"compressed index: the zstd frame needs a dictionary "
                      f"({params.dict_id}) or a window over {layout.MAX_ZSTD_WINDOW} bytes "
                      f"({params.window_size})")
    limit = layout.max_index_text(file_size)
    if size > limit:
        raise LimitExceededError(f"[I-0a] compressed index declares {size} bytes, over the "
                                 f"{limit}-byte limit for a file of {file_size} bytes")
    try:
        out = layout.zstd_decompress_frame(zstandard.ZstdDecompressor(), frame, size)
    except zstandard.ZstdError as exc:
        _fail("I-0b", f"compressed index: corrupt zstd frame ({exc})")
    if len(out) != size:
        _fail("I-0b", f"compressed index: frame decoded to {len(out)} bytes, declared {size}")
    return out


_MAX_INT = 1 << 63


def _is_int(x, lo: int = 0, hi: int = _MAX_INT) -> bool:
    return type(x) is int and lo <= x <= hi


def _fail(rule: str, msg: str):
    """Raise the CorruptError of a rule of spec section 16 (its id first in the message)."""
    raise CorruptError(f"[{rule}] invalid index: {msg}")


def _reject_duplicate_keys(pairs):
    obj = dict(pairs)
    if len(obj) != len(pairs):
        _fail("I-1", "duplicate key in a JSON object")
    return obj


def _is_unicode(text) -> bool:
    """A str that is valid Unicode (no lone surrogates), so it encodes to UTF-8."""
    if not isinstance(text, str):
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _reject_constant(name: str):
    _fail("I-1", f"{name} is not valid JSON")


def check_name(name) -> None:
    """Names are non-empty Unicode strings of at most MAX_NAME_BYTES UTF-8 bytes."""
    if type(name) is str and 0 < len(name) <= layout.MAX_NAME_BYTES and name.isascii():
        return  # the common case, without encoding the name
    if not _is_unicode(name) or not name:
        _fail("I-7", f"tensor name {name!r} is not a non-empty Unicode string")
    if len(name.encode("utf-8")) > layout.MAX_NAME_BYTES:
        raise LimitExceededError(f"[I-7] tensor name longer than {layout.MAX_NAME_BYTES} bytes")


def check_metadata(metadata) -> None:
    if not isinstance(metadata, dict) or not all(
            _is_unicode(k) and _is_unicode(v) for k, v in metadata.items()):
        _fail("I-4", "metadata must map Unicode strings to Unicode strings")
    if len(metadata) > layout.MAX_METADATA_ENTRIES:
        raise LimitExceededError(f"[I-4] more than {layout.MAX_METADATA_ENTRIES} metadata "
                                 f"entries")


def check_shape(shape, itemsize: int = 1) -> tuple[int, ...]:
    """Dimensions are integers in [0, 2^63]; the product of the non-zero ones times the
    item size is at most MAX_TENSOR_BYTES (so even an empty tensor has a sane shape)."""
    if type(shape) is list and len(shape) <= 2:  # most tensors: valid, checked in one pass
        product = itemsize
        for dim in shape:
            if type(dim) is not int or not 0 <= dim <= _MAX_INT:
                break
            if dim:
                product *= dim
        else:
            if product <= layout.MAX_TENSOR_BYTES:
                return tuple(shape)
    return _check_shape(shape, itemsize)


def _check_shape(shape, itemsize: int) -> tuple[int, ...]:
    """:func:`check_shape` for any value: raises the error of the rule it breaks."""
    if not isinstance(shape, list) or shape and not (
            set(map(type, shape)) == {int} and min(shape) >= 0 and max(shape) <= _MAX_INT):
        _fail("I-9", f"shape {shape!r} is not a list of non-negative integers")
    if len(shape) > layout.MAX_NDIM:
        raise LimitExceededError(f"[I-9] tensor has {len(shape)} dimensions (limit "
                                 f"{layout.MAX_NDIM})")
    if math.prod(filter(None, shape)) * itemsize > layout.MAX_TENSOR_BYTES:
        raise LimitExceededError(f"[I-9] shape {shape} exceeds {layout.MAX_TENSOR_BYTES} bytes")
    return tuple(shape)


_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def check_base(base) -> None:
    """The ``base`` object of a delta file: exactly ``file`` (a non-empty name), ``sha256``
    (64 lowercase hex digits) and, since 1.5, optionally ``digest`` (the definition of the
    decode digest, an integer >= 1; absent means 1)."""
    if not (isinstance(base, dict) and set(base) - {"digest"} == {"file", "sha256"}
            and _is_unicode(base["file"]) and base["file"]
            and isinstance(base["sha256"], str) and _SHA256_HEX.fullmatch(base["sha256"])
            and _is_int(base.get("digest", 1), 1)):
        _fail("I-5a", 'base must be {"file": name, "sha256": 64 lowercase hex digits} '
                      'and optionally "digest": a positive integer')


def _parse_chunk(raw, data_end: int) -> tuple:
    if not isinstance(raw, list) or len(raw) != 5:
        _fail("I-13", "a chunk must be [offset, length, crc, size, coding]")
    offset, length, crc, size, coding = raw
    # _is_int written out: this runs for every record of the file
    if not (type(offset) is int and type(length) is int and type(crc) is int
            and type(size) is int and 0 <= offset <= _MAX_INT and 0 <= length <= _MAX_INT
            and 0 <= crc <= 0xFFFFFFFF and 0 <= size <= _MAX_INT and isinstance(coding, str)):
        _fail("I-13", f"chunk fields must be non-negative integers and a coding: {raw!r}")
    if coding not in ("zstd", "raw"):
        raise UnknownCodecError(f"[I-13] invalid index: unknown chunk coding {coding!r}")
    if size > layout.MAX_CHUNK_BYTES:
        raise LimitExceededError(f"[I-13] chunk decodes to {size} bytes (limit "
                                 f"{layout.MAX_CHUNK_BYTES})")
    if offset % layout.ALIGNMENT or offset < layout.HEADER_SIZE:
        _fail("I-13", f"chunk offset {offset} is not an aligned offset after the header")
    if offset + layout.RECORD_HEADER_SIZE + length > data_end:
        _fail("I-13", f"chunk at offset {offset} extends past the data section")
    return offset, length, crc, size, coding


def _is_report_value(value) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


_TENSOR_KEYS = ("name", "dtype", "shape", "chunk_elements", "codec", "streams")
_TENSOR_KEY_SET = frozenset(_TENSOR_KEYS)


def _parse_tensor(raw, data_end: int, check_chunks: bool = True) -> TensorEntry:
    if not isinstance(raw, dict):
        _fail("I-6", "a tensor entry must be an object")
    if not raw.keys() >= _TENSOR_KEY_SET:
        for key in _TENSOR_KEYS:
            if key not in raw:
                _fail("I-6", f"tensor entry lacks {key!r}")
    check_name(raw["name"])
    dtype = dtypes.BY_NAME.get(raw["dtype"]) if isinstance(raw["dtype"], str) else None
    if dtype is None:
        raise UnknownCodecError(f"[I-8] invalid index: unknown dtype {raw['dtype']!r}")
    shape = check_shape(raw["shape"], dtype.itemsize)
    per_chunk = raw["chunk_elements"]
    if not _is_int(per_chunk, 1):
        _fail("I-10", f"chunk_elements {per_chunk!r} is not a positive integer")
    if per_chunk * dtype.itemsize > layout.MAX_CHUNK_BYTES:
        raise LimitExceededError(f"[I-10] chunks of {per_chunk} elements exceed "
                                 f"{layout.MAX_CHUNK_BYTES} bytes")
    codec = raw["codec"]
    if not isinstance(codec, list) or not codec or not all(
            isinstance(s, dict) and isinstance(s.get("id"), str) for s in codec):
        _fail("I-11", "codec must be a non-empty list of objects with a string 'id'")
    streams = raw["streams"]
    # a tuple: chunk entries that _parse_canonical read and typed already (never from JSON)
    if type(streams) is not tuple and (not isinstance(streams, list)
                                       or not set(map(type, streams)) <= {list}):
        _fail("I-11", "streams must be a list of chunk lists")
    report = raw.get("report")
    if report is not None and not (isinstance(report, dict)
                                   and all(map(_is_report_value, report.values()))):
        _fail("I-11a", "report must be an object whose values are strings, numbers, "
                       "booleans or null")
    chunk_count = -(-math.prod(shape) // per_chunk)  # TensorEntry.chunk_count
    if not set(map(len, streams)) <= {chunk_count}:
        _fail("I-12", f"tensor {raw['name']!r}: every stream needs {chunk_count} chunks")
    if check_chunks:
        streams = tuple([tuple([_parse_chunk(c, data_end) for c in s]) for s in streams])
    # unchecked, the chunks stay as read: parse() checks all of the file's at once
    return TensorEntry(raw["name"], dtype, shape, codec, per_chunk, streams, report)


def _chunks_valid(tensors: list, data_end: int) -> bool:
    """Whether every chunk of these tensor entries (``raw["streams"]``, already known to be
    lists of lists) passes :func:`_parse_chunk`, checked for the whole file at once: the same
    conditions on columns of the index, so that a file of a million records opens quickly.
    False means some chunk breaks a rule; :func:`_parse_chunk` then names it."""
    rows = [c for t in tensors for s in t["streams"] for c in s]
    if not rows:
        return True
    if set(map(type, rows)) != {list} or set(map(len, rows)) != {5}:
        return False
    return _columns_valid(*zip(*rows), data_end)


def _columns_valid(offsets, lengths, crcs, sizes, codings, data_end: int) -> bool:
    """:func:`_chunks_valid` for the fields of the chunk entries as columns."""
    if not offsets:
        return True
    for column in (offsets, lengths, crcs, sizes):
        if set(map(type, column)) != {int} or min(column) < 0:
            return False
    if set(map(type, codings)) != {str} or not set(codings) <= {"zstd", "raw"}:
        return False
    return _in_bounds(offsets, lengths, crcs, sizes, data_end)


def _in_bounds(offsets, lengths, crcs, sizes, data_end: int) -> bool:
    """:func:`_columns_valid` for columns of non-negative ints (at least one row)."""
    # bounds first, so that the arithmetic below fits in 64 bits
    if (max(crcs) > 0xFFFFFFFF or max(sizes) > layout.MAX_CHUNK_BYTES
            or max(offsets) > data_end or max(lengths) > data_end):
        return False
    start = np.array(offsets, np.int64)
    return not ((start % layout.ALIGNMENT).any() or (start < layout.HEADER_SIZE).any()
                or (start + (layout.RECORD_HEADER_SIZE - data_end)
                    + np.array(lengths, np.int64) > 0).any())


def parse(payload: bytes, data_end: int, file_size: int | None = None) -> Index:
    """Parse and validate an index payload (the JSON text); ``data_end`` is the offset of the
    index record, ``file_size`` the size of the file (default: what a file with this plain
    index would have), which bounds the number of tensors (spec rule I-3)."""
    if file_size is None:
        file_size = layout.file_size(data_end, len(payload))
    index = (_parse_canonical(payload, data_end, file_size)
             if len(payload) >= CANONICAL_MIN_BYTES else None)
    if index is not None:
        return index
    return _parse_general(payload, data_end, file_size)


# Shorter indexes go to the general parser directly: the few objects their JSON makes cost
# the collector little, and cutting the text costs ~1.3 us a tensor more than it saves
# (final_bf16, 53 tensors, 13 KB: 0.34 ms general, 0.41 ms the short way; final_fp32, 212
# tensors, 53 KB, whose objects did bring full collections: 1.43 and 1.74 ms).
CANONICAL_MIN_BYTES = 32 << 10


# The chunk entries of an index as Index.to_bytes writes them: no spaces, integers without
# sign, fraction or leading zeros. Such a "streams" value is read without the JSON parser.
# (Leading zeros are looked for apart, in all values at once; the possessive quantifiers
# spare the matcher its backtracking records: about half the time. Python 3.10's re has
# none; there the same patterns are greedy, which match the same texts here: what follows
# each repetition can never be what it repeats.)
_P = "+" if sys.version_info >= (3, 11) else ""
_CHUNK = rf'\[[0-9]+{_P},[0-9]+{_P},[0-9]+{_P},[0-9]+{_P},"(?:zstd|raw)"\]'
_STREAM = rf"\[(?:{_CHUNK}(?:,{_CHUNK})*{_P})?{_P}\]"
_LEADING_ZERO = re.compile(r"[\[,]0[0-9]")
# A "codec" value whose objects hold no array or object: the same text in many tensors of
# a file is parsed once, and those tensors share its list (nothing changes a chain read).
_CODEC = rf"\[\{{[^\[\]{{}}]*{_P}\}}(?:,\{{[^\[\]{{}}]*{_P}\}})*{_P}\]"
_STREAMS = re.compile(rf'"streams":(\[(?:{_STREAM}(?:,{_STREAM})*{_P})?{_P}\])')
_CODECS = re.compile(rf'"codec":({_CODEC})')  # apart: a literal start is found fastest
_CODINGS = {'"zstd"': "zstd", '"raw"': "raw"}
# What stands for the k-th "streams" value in the text the JSON parser reads: the number
# _PLACEHOLDER + k (k < 10^8). No integer written in the text itself can equal one when
# its first digits, _PLACEHOLDER_DIGITS, occur nowhere in the text.
_PLACEHOLDER = 91111111111100000000
_PLACEHOLDER_DIGITS = str(_PLACEHOLDER)[:12]
_CODEC_PLACEHOLDER = 92222222222200000000  # the same for "codec" values
_CODEC_PLACEHOLDER_DIGITS = str(_CODEC_PLACEHOLDER)[:12]


def _read_streams(texts: list[str]) -> tuple[list[tuple], tuple] | None:
    """The chunk entries of "streams" values that :data:`_STREAMS` matched: for each value,
    its streams as tuples of ``(offset, length, crc, size, coding)`` tuples; and all entries
    in order as the five columns. Read for all values at once, in C as far as possible.
    None if a number has a leading zero (not JSON)."""
    if not texts:
        return [], ([], [], [], [], [])
    joined = ",".join(texts)
    if _LEADING_ZERO.search(joined):
        return None
    # without brackets, the values are one list of fields, five per entry
    fields = joined.replace("[", "").replace("]", "").split(",")
    empty = "[]" in joined  # a tensor without elements has empty streams
    if empty:
        fields = [f for f in fields if f]
    columns = (list(map(int, fields[0::5])), list(map(int, fields[1::5])),
               list(map(int, fields[2::5])), list(map(int, fields[3::5])),
               list(map(_CODINGS.__getitem__, fields[4::5])))
    chunks = iter(list(zip(*columns)))
    entries = [n >> 1 for n in map(str.count, texts, itertools.repeat('"'))]  # 2 per entry
    # each stream ends in "]]" (the last one in "]]]"): as many as entries, one entry each
    if not empty and joined.count("]]") == len(columns[0]):
        return [tuple(zip(itertools.islice(chunks, n))) for n in entries], columns
    values = []
    for text in texts:
        if "[]" in text:
            counts = [len(s) for s in json.loads(text)]
        else:
            counts = [s.count('"') >> 1 for s in text.split("]],[[")]
        values.append(tuple([tuple(itertools.islice(chunks, n)) for n in counts]))
    return values, columns


def _parse_canonical(payload: bytes, data_end: int, file_size: int) -> Index | None:
    """:func:`_parse_general`'s index, read with fewer objects, or None (then the general
    parser runs and raises the error of the first rule broken, if any).

    Each "streams" value in the writer's form becomes a number before the JSON parser sees
    the text, and its chunk entries tuples directly (each "codec" value too, parsed once per
    distinct text): on a file of many small tensors the lists of the chunk entries were most
    of the objects a parse made, and those that live through a collection drive the garbage
    collector to full collections. Only used when every number stands, after the JSON parse,
    exactly where a tensor's "streams" (or "codec") value belongs, in order (so the text was
    valid JSON exactly when the one parsed is), and every check of the general parser passes.
    """
    try:
        text = payload.decode("utf-8")
        if not text.startswith('{"tensors":['):
            return None
        # then a number in the text could pass for one
        if _PLACEHOLDER_DIGITS in text or _CODEC_PLACEHOLDER_DIGITS in text:
            return None
        texts: list[str] = []
        codec_texts: list[str] = []
        parts: list[str] = []
        at = 0
        for start, end, value in sorted([m.span(1) + (m[1],) for m in _STREAMS.finditer(text)]
                                        + [m.span(1) + (None,) for m in _CODECS.finditer(text)]):
            if start < at:
                return None
            if value is not None:
                parts += (text[at:start], str(_PLACEHOLDER + len(texts)))
                texts.append(value)
            else:
                parts += (text[at:start], str(_CODEC_PLACEHOLDER + len(codec_texts)))
                codec_texts.append(text[start:end])
            at = end
        parts.append(text[at:])
        read = _read_streams(texts)
        if read is None:
            return None
        streams, columns = read
        chains = {t: json.loads(t, object_pairs_hook=_reject_duplicate_keys,
                                parse_constant=_reject_constant) for t in set(codec_texts)}
        doc = json.loads("".join(parts), object_pairs_hook=_reject_duplicate_keys,
                         parse_constant=_reject_constant)
        raw = doc["tensors"]
        if (type(raw) is not list or len(raw) != len(streams)
                or len(raw) > layout.max_tensors(file_size)):
            return None
        codecs = 0  # "codec" values replaced so far
        for k, t in enumerate(raw, _PLACEHOLDER):
            if type(t) is not dict or type(t.get("streams")) is not int or t["streams"] != k:
                return None
            t["streams"] = streams[k - _PLACEHOLDER]
            if type(t.get("codec")) is int:
                if t["codec"] != _CODEC_PLACEHOLDER + codecs:
                    return None
                t["codec"] = chains[codec_texts[codecs]]
                codecs += 1
        if codecs != len(codec_texts):
            return None
        metadata = doc.get("metadata", {})
        check_metadata(metadata)
        header = doc.get("safetensors_header")
        if header is not None and not isinstance(header, str):
            return None
        base = doc.get("base")
        if base is not None:
            check_base(base)
        tensors = [_parse_tensor(t, data_end, check_chunks=False) for t in raw]
        if columns[0] and not _in_bounds(*columns[:4], data_end):  # ints >= 0 as read
            return None
        if len({t.name for t in tensors}) != len(tensors):
            return None
        offsets, lengths = columns[:2]
        if _first_overlap(np.array(offsets, np.int64), np.array(lengths, np.int64)) is not None:
            return None
    except Exception:  # noqa: BLE001  any problem: the general parser names it
        return None
    return Index(tensors, metadata, header, base)


def _parse_general(payload: bytes, data_end: int, file_size: int) -> Index:
    """:func:`parse` for any text: each rule checked in the spec's order."""
    try:
        doc = json.loads(payload.decode("utf-8"), object_pairs_hook=_reject_duplicate_keys,
                         parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:  # bad UTF-8, bad JSON, huge ints
        _fail("I-1", f"not valid UTF-8 JSON ({exc})")
    if not isinstance(doc, dict) or not isinstance(doc.get("tensors"), list):
        _fail("I-2", "top level must be an object with a 'tensors' list")
    limit = layout.max_tensors(file_size)
    if len(doc["tensors"]) > limit:
        raise LimitExceededError(f"[I-3] {len(doc['tensors'])} tensors, more than the "
                                 f"{limit} allowed in a file of {file_size} bytes")
    metadata = doc.get("metadata", {})
    check_metadata(metadata)
    header = doc.get("safetensors_header")
    if header is not None and not isinstance(header, str):
        _fail("I-5", "safetensors_header must be a string")
    base = doc.get("base")
    if base is not None:
        check_base(base)
    raw = doc["tensors"]
    # Each tensor's own fields first, then all chunks together (rules I-6 ... I-12, I-13);
    # the per-chunk parser only runs to name the rule a bad chunk breaks.
    try:
        tensors = [_parse_tensor(t, data_end, check_chunks=False) for t in raw]
        valid = _chunks_valid(raw, data_end)
    except InshrinkError:  # maybe a later tensor's: an earlier chunk entry may fail first
        valid = False
    if valid:  # plain tuples (see TensorEntry.streams): few objects for the collector
        for t in tensors:
            t.streams = tuple([tuple(map(tuple, s)) for s in t.streams])
    else:  # one entry after another, in the spec's order, to raise the first failure
        tensors = [_parse_tensor(t, data_end) for t in raw]
    if len({t.name for t in tensors}) != len(tensors):
        _fail("I-14", "duplicate tensor names")
    _check_no_overlap(tensors)
    return Index(tensors, metadata, header, base)


def _check_no_overlap(tensors: list[TensorEntry]) -> None:
    chunks = [c for t in tensors for s in t.streams for c in s]
    if len(chunks) < 2:
        return
    at = _first_overlap(np.fromiter((c[0] for c in chunks), np.int64, len(chunks)),  # offsets
                        np.fromiter((c[1] for c in chunks), np.int64, len(chunks)))  # lengths
    if at is not None:
        _fail("I-15", f"records overlap at offset {at}")


def _first_overlap(starts: np.ndarray, lengths: np.ndarray) -> int | None:
    """The offset of the first record (by offset) that starts inside the one before it, or
    None; ``starts`` and ``lengths`` of the chunk records, in the index's order."""
    if len(starts) < 2:
        return None
    ends = starts + layout.RECORD_HEADER_SIZE + lengths
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    overlap = np.flatnonzero(starts[1:] < ends[:-1])
    return int(starts[overlap[0] + 1]) if overlap.size else None
