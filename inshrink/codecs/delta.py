"""Delta stages: a chunk stored relative to the same chunk of a base file (format 1.2).

``xor`` (before ``bytegroup``): the chunk's bytes XORed with the base tensor's bytes, which
must be the base file's lossless decode of the same name, dtype and shape.

``codedelta`` (before ``quant``, the paper's quantization-aware delta): the codes stored as
D = (base - code) mod ``modulus``, regrouped by the base code so the decoder rebuilds the order
from the base's codes; the escape streams are stored as they are.

:func:`keep` is the one rule for whether a delta is worth storing.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from ..dtypes import DType
from ..errors import BaseMismatchError, CorruptError
from ..kernels import delta as kernels
from . import lossless
from . import quant
from .base import DeltaStage

XOR_ID = "xor"
CODEDELTA_ID = "codedelta"
MAX_MODULUS = 65_536


@dataclass(frozen=True, eq=False)
class Xor(DeltaStage):
    """Stage ``xor``: no parameters."""

    id: ClassVar[str] = XOR_ID
    minor: ClassVar[int] = 2
    applies_to: ClassVar[str] = lossless.STAGE_ID

    def to_dict(self) -> dict:
        return {"id": XOR_ID}

    @classmethod
    def from_dict(cls, d: dict, dtype: DType) -> "Xor":
        if d != {"id": XOR_ID}:
            raise CorruptError(f"[C-2] bad xor stage parameters {sorted(d)}")
        return cls()

    def encode(self, chunk: np.ndarray, ref: np.ndarray) -> np.ndarray:
        """The chunk's bytes XORed with the base's (uint8 arrays of one size)."""
        return np.bitwise_xor(chunk, ref)

    def decode(self, stored: np.ndarray, ref: np.ndarray) -> np.ndarray:
        """XOR the base's bytes back in place."""
        return np.bitwise_xor(stored, ref, out=stored)


@dataclass(frozen=True, eq=False)
class CodeDelta(DeltaStage):
    """Stage ``codedelta``: the modulus of the cyclic differences."""

    id: ClassVar[str] = CODEDELTA_ID
    minor: ClassVar[int] = 2
    applies_to: ClassVar[str] = quant.STAGE_ID
    modulus: int

    def to_dict(self) -> dict:
        return {"id": CODEDELTA_ID, "modulus": self.modulus}

    @classmethod
    def from_dict(cls, d: dict, dtype: DType) -> "CodeDelta":
        if set(d) != {"id", "modulus"} or d["id"] != CODEDELTA_ID:
            raise CorruptError(f"[C-2] bad codedelta stage parameters {sorted(d)}")
        modulus = d["modulus"]
        if type(modulus) is not int or not 1 <= modulus <= MAX_MODULUS:
            raise CorruptError(f"[C-3a] codedelta modulus {modulus!r} is not an integer that "
                               f"covers the levels and is at most {MAX_MODULUS}")
        return cls(modulus)

    def check(self, stage: quant.Quant) -> None:
        """Rule C-3a against the quant stage that follows (which rule C-3 validated): the
        modulus covers its levels, and the deltas fit its bits."""
        levels = len(stage.levels)
        if not max(1, levels) <= self.modulus:
            raise CorruptError(f"[C-3a] codedelta modulus {self.modulus!r} is not an integer "
                               f"that covers the {levels} levels and is at most "
                               f"{MAX_MODULUS}")
        if quant.code_bits(self.modulus) > stage.bits:
            raise CorruptError(f"[C-3a] deltas modulo {self.modulus} need more than "
                               f"{stage.bits} bits")

    def encode(self, chunk: quant.QuantChunk, ref: np.ndarray) -> quant.QuantChunk:
        """The chunk with its codes replaced by their deltas from ``ref`` (the base's codes),
        regrouped by the base code."""
        return replace(chunk, codes=self.encode_codes(chunk.codes, ref))

    def encode_codes(self, codes: np.ndarray, ref: np.ndarray) -> np.ndarray:
        """What :meth:`encode` stores in place of ``codes``."""
        return code_delta(ref, codes, self.modulus)

    def decode(self, stored: np.ndarray, ref: np.ndarray | None) -> np.ndarray:
        """The codes from their stored deltas and the base's codes of the chunk."""
        n = stored.size
        if ref is None or ref.shape != (n,):
            raise BaseMismatchError("[B-2] a code delta needs the base tensor's codes")
        if n and (int(stored.max()) >= self.modulus or int(ref.max()) >= self.modulus):
            raise CorruptError(f"[D-4a] code delta or base code not below modulus "
                               f"{self.modulus}")
        counts = np.zeros(self.modulus, np.int64)
        kernels.group_counts(ref, self.modulus, counts)
        deltas = np.empty(n, np.uint16)
        kernels.ungroup(ref, stored, counts, deltas)
        codes = np.empty(n, np.uint16)
        kernels.cyclic_undelta(ref, deltas, self.modulus, codes)
        return codes


def code_delta(base_codes: np.ndarray, codes: np.ndarray, modulus: int) -> np.ndarray:
    """What a code delta stores: (base - codes) mod ``modulus``, regrouped by base code."""
    deltas = np.empty_like(codes)
    kernels.cyclic_delta(base_codes, codes, modulus, deltas)
    counts = np.zeros(modulus, np.int64)
    kernels.group_counts(base_codes, modulus, counts)
    grouped = np.empty_like(codes)
    kernels.regroup(base_codes, deltas, counts, grouped)
    return grouped


def for_codes(stage: quant.Quant, base_codes: np.ndarray) -> tuple[CodeDelta, quant.Quant]:
    """The code delta against ``base_codes`` (a tensor's codes in the base file) and the quant
    stage it precedes: the same levels, packed at the width the modulus needs."""
    modulus = max(len(stage.levels), int(base_codes.max()) + 1 if base_codes.size else 1, 1)
    return CodeDelta(modulus), replace(stage, bits=quant.packing_bits(modulus))


def stored_size(chunks: list[tuple]) -> int:
    """Payload bytes of one encoded chunk's streams, ``(coding, payload, size)`` each."""
    return sum(len(memoryview(payload)) for _, payload, _ in chunks)


def keep(plain: int, delta: int) -> bool:
    """Whether to store a tensor as a delta, given the payload bytes its first chunk takes
    standalone (``plain``) and as a delta (``delta``): only when that is smaller. Weights
    drifting slowly gain; gradient-like moments refitted from scratch may not."""
    return delta < plain
