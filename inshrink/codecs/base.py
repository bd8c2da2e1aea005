"""What every codec stage is: stored parameters, one chunk's transform, a format version.

A tensor's codec chain (the index's ``codec`` list, spec section 10) is a list of stages. A
stage object holds exactly what the file stores about it (:meth:`Stage.to_dict` /
:meth:`Stage.from_dict`), is frozen and compares by value, names the lowest format minor
version that defines it, and encodes and decodes one chunk in memory. What an encoder chose
and why (fitted thresholds, the sizes it tried) lives in encoder objects, never in a stage.

Stages come in three kinds, by what they transform:

* a *delta* stage (``xor``, ``codedelta``), first in a chain, combines a chunk with the same
  chunk of the base file (its bytes, or its codes) and undoes that on decoding;
* an *array* stage (``bytegroup``, ``quant``, ``factored``) turns a chunk into its streams
  and back into element bytes;
* the *entropy* stage (:class:`inshrink.codecs.entropy.Entropy`, zstd or raw) codes every
  stream of every chunk; the chain does not list it, each chunk records its coding.

:class:`inshrink.codecs.chain.Pipeline` runs a chain.
"""
from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Any, Callable, ClassVar

import numpy as np

from ..dtypes import DType


class Stage(ABC):
    """One stage of a codec chain (see the module docstring).

    Subclasses are frozen dataclasses declared with ``eq=False``: equality and hashing come
    from here and compare what the file stores (the parameters and, when the stage has one,
    the tensor's dtype), so stages holding arrays compare by value.
    """

    id: ClassVar[str]
    """The stage's ``id`` in the codec chain."""
    minor: ClassVar[int]
    """The lowest format minor version (of major 1) that defines the stage."""

    @abstractmethod
    def to_dict(self) -> dict:
        """The stage's entry in the codec chain, as the index stores it."""

    @classmethod
    @abstractmethod
    def from_dict(cls, d: dict, dtype: DType) -> "Stage":
        """Validate a chain entry read from a file (raise CorruptError) and build the stage."""

    def _key(self) -> str:
        dtype = getattr(self, "dtype", None)
        return json.dumps([type(self).__name__, getattr(dtype, "name", None), self.to_dict()],
                          sort_keys=True)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stage) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


Undo = Callable[[Any], Any]
"""A delta stage's decoder bound to the base's chunk: applied to what it transformed."""


class ArrayStage(Stage):
    """The stage that turns a chunk into its streams (uncompressed) and back."""

    @property
    @abstractmethod
    def streams(self) -> int:
        """Number of streams per chunk."""

    @abstractmethod
    def stream_sizes_ok(self, n: int, sizes: list[int], itemsize: int) -> bool:
        """Whether decoded stream sizes fit a chunk of ``n`` elements (spec rule C-5)."""

    @abstractmethod
    def encode(self, chunk: Any) -> list[np.ndarray]:
        """The streams of one chunk, each a contiguous uint8 array, before entropy coding."""

    @abstractmethod
    def decode(self, streams: list, out: np.ndarray, undo: Undo | None = None) -> Any:
        """Decode one chunk's streams (decoded bytes) into ``out`` (uint8, n × itemsize);
        ``undo`` reverses a delta stage at the point this stage applies it."""


class DeltaStage(Stage):
    """A stage that stores a chunk relative to the base file's same chunk (``ref``)."""

    applies_to: ClassVar[str]
    """The id of the one array stage it may precede."""

    @abstractmethod
    def encode(self, chunk: Any, ref: np.ndarray) -> Any:
        """The chunk relative to ``ref``."""

    @abstractmethod
    def decode(self, stored: Any, ref: np.ndarray) -> Any:
        """Inverse of :meth:`encode`."""
