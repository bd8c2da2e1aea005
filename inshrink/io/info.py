"""What the index says about one stored tensor, as the Writer and the File report it."""
from __future__ import annotations

from dataclasses import dataclass

from ..container.index import TensorEntry

ERROR_FIELDS = ("max_abs_error", "rel_l2_error", "protected", "pruned", "zeroed",
                "sign_flipped")
"""The keys of an index report that :attr:`TensorInfo.error` takes, what the encoder measured."""


@dataclass(frozen=True)
class TensorInfo:
    """What the index says about one stored tensor.

    ``role`` and ``error`` are present when the file was written with a lossy policy:
    ``error`` holds the error the encoder measured against the original, ``max_abs_error``,
    ``rel_l2_error`` (||x - x̂|| / ||x|| over the finite elements; NaN and ±inf are stored
    exactly; ``None`` where float64 cannot give it: float64 values whose squares underflow or
    overflow), and the fractions ``protected`` and ``pruned`` (of all elements), ``zeroed``
    and ``sign_flipped`` (of the finite non-zero elements).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    codec: str
    nbytes: int
    stored_bytes: int
    role: str | None = None
    error: dict | None = None

    @property
    def ratio(self) -> float:
        """Original bytes over stored bytes (``inf`` for a tensor stored in zero bytes)."""
        return self.nbytes / self.stored_bytes if self.stored_bytes else float("inf")

    @property
    def lossless(self) -> bool:
        return not {"quant", "factored"} & set(self.codec.split("+"))

    @property
    def quantized(self) -> bool:
        """Stored as quantization codes (which a series' code deltas refer to)."""
        return "quant" in self.codec.split("+")

    @classmethod
    def of(cls, entry: TensorEntry) -> "TensorInfo":
        report = entry.report or {}
        error = {k: report[k] for k in ERROR_FIELDS if k in report} or None
        role = report.get("role")
        return cls(entry.name, entry.dtype.name, entry.shape,
                   "+".join(s["id"] for s in entry.codec) + "+zstd",
                   entry.nbytes, entry.stored_bytes,
                   role if isinstance(role, str) else None, error)
