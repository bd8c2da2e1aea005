"""Codec chains: the pipeline that runs one, and the validation of one read from a file
(its stages, rules C-1 ... C-3a, and its streams against the tensor's elements, C-4 and C-5).

Format 1.5 knows five chains, each an array stage, optionally preceded by a delta stage, and
followed by the entropy stage on every stream: ``[bytegroup]`` (lossless), ``[quant]``
(dynamic quantization), ``[xor, bytegroup]`` (lossless delta: the bytes are XORed with the
same tensor of the base file before byte grouping), ``[codedelta, quant]``
(quantization-aware delta: codes stored as cyclic differences from the base tensor's codes,
regrouped by the base code) and ``[factored]`` (a matrix as the outer product of row and
column factors).
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import numpy as np

from ..dtypes import DType
from ..errors import CorruptError, InvalidArgumentError, UnknownCodecError
from .base import ArrayStage, DeltaStage
from .delta import CodeDelta, Xor
from .entropy import Entropy
from .factored import Factored
from .lossless import ByteGroup
from .quant import Quant

ARRAY_STAGES: dict[str, type[ArrayStage]] = {s.id: s for s in (ByteGroup, Quant, Factored)}
DELTA_STAGES: dict[str, type[DeltaStage]] = {s.id: s for s in (Xor, CodeDelta)}

Encoded = list[tuple[str, Any, int]]
"""One chunk's streams as stored: ``(coding, payload, decoded size)`` each."""


@dataclass(frozen=True)
class Pipeline:
    """A codec chain: an array stage, an optional delta stage before it, and the entropy
    stage on every stream. Encodes and decodes one chunk at a time, in memory.

    ``ref`` arguments are the base file's same chunk that a delta stage needs: its bytes
    (``xor``) or its codes (``codedelta``).
    """

    stage: ArrayStage
    delta: DeltaStage | None = None
    entropy: Entropy = field(default_factory=Entropy)

    def __post_init__(self) -> None:
        if self.delta is not None and self.delta.applies_to != self.stage.id:
            raise InvalidArgumentError(f"a {self.delta.id} stage cannot precede "
                                       f"{self.stage.id}")

    def chain(self) -> list[dict]:
        """The codec chain as the index stores it."""
        return [s.to_dict() for s in self.stages]

    @property
    def stages(self) -> tuple:
        return (self.stage,) if self.delta is None else (self.delta, self.stage)

    @property
    def minor(self) -> int:
        """The lowest format minor version that defines every stage."""
        return max(s.minor for s in (*self.stages, self.entropy))

    @property
    def streams(self) -> int:
        return self.stage.streams

    @property
    def is_delta(self) -> bool:
        """Whether chunks decode against the base file's same tensor."""
        return self.delta is not None

    def encode(self, chunk: Any, ref: np.ndarray | None = None) -> Encoded:
        """Encode one chunk: element bytes (uint8) for ``bytegroup``, a
        :class:`~inshrink.codecs.quant.QuantChunk` for ``quant``, the row factors for
        ``factored``."""
        if self.delta is not None:
            chunk = self.delta.encode(chunk, ref)
        return [self.entropy.encode(stream) for stream in self.stage.encode(chunk)]

    def encode_codes(self, codes: np.ndarray, ref: np.ndarray | None = None) -> tuple:
        """The codes stream alone of a ``quant`` chunk, ``(coding, payload, size)`` (its escape
        streams do not depend on the delta)."""
        if self.delta is not None:
            codes = self.delta.encode_codes(codes, ref)
        return self.entropy.encode(self.stage.encode_codes(codes))

    def _undo(self, ref: np.ndarray | None):
        return None if self.delta is None else functools.partial(self.delta.decode, ref=ref)

    def decode(self, chunks: Encoded, out: np.ndarray, ref: np.ndarray | None = None) -> Any:
        """Decode one chunk into ``out`` (uint8, its elements' bytes); returns what the array
        stage returns (the codes, for ``quant``)."""
        streams = [self.entropy.decode(*chunk) for chunk in chunks]
        return self.stage.decode(streams, out, self._undo(ref))

    def decode_codes(self, chunk: tuple[str, Any, int], n: int,
                     ref: np.ndarray | None = None) -> np.ndarray:
        """The codes of a ``quant`` chunk of ``n`` elements from its codes stream alone."""
        return self.stage.decode_codes(self.entropy.decode(*chunk), n, self._undo(ref))

    def sizes_ok(self, n: int, sizes: list[int], itemsize: int) -> bool:
        """Whether a chunk of ``n`` elements has the stream sizes the chain gives (C-5)."""
        return self.stage.stream_sizes_ok(n, sizes, itemsize)

    @classmethod
    def from_chain(cls, codec: list[dict], dtype: DType, has_base: bool = True,
                   name: str = "") -> "Pipeline":
        """Validate a codec chain read from a file (rules C-1 ... C-3a of spec section 16, in
        their order) and build its pipeline; ``has_base``: whether the file names a base (a
        delta chain is invalid otherwise), ``name`` the tensor's, for messages."""
        for stage_id in (s["id"] for s in codec):
            if stage_id not in ARRAY_STAGES and stage_id not in DELTA_STAGES:
                raise UnknownCodecError(f"[C-1] tensor {name!r}: unknown codec stage "
                                        f"{stage_id!r}")
        delta_dict = None
        if (len(codec) == 2 and codec[0] == {"id": Xor.id}
                and codec[1]["id"] == Xor.applies_to):
            delta_dict, codec = codec[0], codec[1:]
        elif (len(codec) == 2 and codec[0]["id"] == CodeDelta.id
              and set(codec[0]) == {"id", "modulus"} and codec[1]["id"] == CodeDelta.applies_to):
            delta_dict, codec = codec[0], codec[1:]
        if len(codec) != 1 or codec[0]["id"] not in ARRAY_STAGES:
            raise CorruptError(f"[C-2] tensor {name!r}: expected one codec stage, "
                               f"[xor, bytegroup] or [codedelta, quant]")
        if delta_dict is not None and not has_base:
            raise CorruptError(f"[C-2] tensor {name!r}: a {delta_dict['id']} chain in a file "
                               f"that names no base")
        stage = ARRAY_STAGES[codec[0]["id"]].from_dict(codec[0], dtype)
        delta = None
        if delta_dict is not None:
            delta = DELTA_STAGES[delta_dict["id"]].from_dict(delta_dict, dtype)
            if isinstance(delta, CodeDelta):
                delta.check(stage)
        # one entropy stage for every pipeline read from files: a file's quantized tensors each
        # have their own pipeline, alive as long as the file is open
        return cls(stage, delta, _ENTROPY)


_ENTROPY = Entropy()


class StoredTensor(Protocol):
    """What the chain checks read of a tensor as a file's index stores it
    (:class:`inshrink.container.index.TensorEntry` is one)."""

    name: str
    dtype: DType
    codec: list[dict]
    chunk_elements: int
    # per stream, its chunks in order, each a (offset, length, crc, size, coding) record
    streams: Sequence[Sequence[tuple]]

    @property
    def numel(self) -> int: ...


def pipeline_for(entry: StoredTensor, has_base: bool = True,
                 known: dict | None = None) -> Pipeline:
    """Validate a stored tensor's chain and stream sizes; return its pipeline.

    ``has_base``: whether the file names a base (a delta chain is invalid otherwise).
    Rules C-1 ... C-5 of spec section 16, in their order. ``known``: pipelines of chains
    already validated (a dict this fills in), so that the tensors of a file that share a
    chain validate it once.
    """
    pipeline = None
    if known is not None:  # first by the chain's list: tensors of a parsed index share it
        same = known.get((id(entry.codec), entry.dtype.name, has_base))
        if same is not None and same[0] is entry.codec:
            pipeline, streams = same[1], same[2]
    if pipeline is None:
        key = _chain_key(entry.codec, entry.dtype, has_base) if known is not None else None
        pipeline = known.get(key) if key is not None else None
        if pipeline is None:
            pipeline = Pipeline.from_chain(entry.codec, entry.dtype, has_base, entry.name)
            if key is not None:
                known[key] = pipeline
        streams = pipeline.streams  # (a frozen pipeline's: kept with it, two calls less)
        if known is not None:
            known[(id(entry.codec), entry.dtype.name, has_base)] = (entry.codec, pipeline,
                                                                    streams)
    if len(entry.streams) != streams:
        raise CorruptError(f"[C-4] tensor {entry.name!r}: {len(entry.streams)} streams, its "
                           f"codec needs {streams}")
    itemsize, per_chunk, numel = entry.dtype.itemsize, entry.chunk_elements, entry.numel
    for c in range(-(-numel // per_chunk)):  # the chunk count
        n = min(per_chunk, numel - c * per_chunk)  # the elements of chunk c
        # (a record's decoded size, by position: records are plain tuples)
        if not pipeline.sizes_ok(n, [stream[c][3] for stream in entry.streams], itemsize):
            raise CorruptError(f"[C-5] tensor {entry.name!r}: chunk {c} sizes do not match "
                               f"its element range")
    return pipeline


def _chain_key(codec: list[dict], dtype: DType, has_base: bool) -> tuple | None:
    """What :meth:`Pipeline.from_chain` depends on, as a dict key; None for a chain with a
    list or object value (rare, and not worth a key). The types are part of the key: JSON's
    ``true`` and ``1`` are equal in Python but not to the validator."""
    key = (dtype.name, has_base, tuple(map(len, codec)),  # a list of dicts (rule I-11)
           tuple(itertools.chain.from_iterable(map(dict.items, codec))),
           tuple(map(type, itertools.chain.from_iterable(map(dict.values, codec)))))
    try:
        hash(key)
    except TypeError:
        return None
    return key


@functools.lru_cache(maxsize=64)
def for_new_tensor(dtype: DType, entropy: Entropy = Entropy()) -> Pipeline:
    """The lossless pipeline the writer starts from for a tensor of this dtype (one object
    per dtype and setting, shared: pipelines are frozen, and a save of many small tensors
    then keeps two objects fewer per tensor for the garbage collector to scan)."""
    return Pipeline(ByteGroup.for_dtype(dtype), entropy=entropy)
