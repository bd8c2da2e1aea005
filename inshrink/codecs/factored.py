"""Stage ``factored`` (format 1.4): a non-negative matrix as the outer product of two vectors.

Adam's second moment (``exp_avg_sq``) of a weight matrix is close to rank one: rows and
columns of a layer see gradients of different scale. Adafactor trains with exactly this
approximation; stored this way, a second moment costs R + C values instead of R × C.

The tensor's elements, in row-major order, form a matrix of ``numel / C`` rows and ``C``
columns, ``C`` the number of column factors ``b`` the stage stores. Every chunk holds whole
rows; its one stream holds the chunk's row factors ``a``. Decoding is
``x[i, j] = a[i] × b[j]``, one correctly rounded multiplication in the tensor's dtype (F32 or
F64) of finite factors, so every decoder gives the same bits.

The encoder takes ``b`` = column sums and ``a`` = row sums / their total (the factorization
that keeps every row's and column's sum, Adafactor's), both computed in float64 and rounded
to the dtype once.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..dtypes import DType
from ..errors import CorruptError
from .base import ArrayStage, Undo

STAGE_ID = "factored"
DTYPES = ("F32", "F64")
_HEX = re.compile(r"[0-9a-fA-F]*")  # no whitespace, sign or prefix (spec 10.6.1)


@dataclass(frozen=True, eq=False)
class Factored(ArrayStage):
    """Stage ``factored``: the column factors, in the tensor's dtype."""

    id: ClassVar[str] = STAGE_ID
    minor: ClassVar[int] = 4
    dtype: DType
    columns: np.ndarray

    def to_dict(self) -> dict:
        return {"id": STAGE_ID, "columns": self.columns.astype(self.dtype.numpy).tobytes().hex()}

    @property
    def streams(self) -> int:
        return 1

    @classmethod
    def from_dict(cls, d: dict, dtype: DType) -> "Factored":
        """Validate stage parameters read from a file (decoder side)."""
        if set(d) != {"id", "columns"} or d["id"] != STAGE_ID:
            raise CorruptError(f"[C-3] bad factored stage parameters {sorted(d)}")
        if dtype.name not in DTYPES:
            raise CorruptError(f"[C-3] factored stage on a {dtype.name} tensor")
        hexed = d["columns"]
        if (not isinstance(hexed, str) or not hexed or len(hexed) % (2 * dtype.itemsize)
                or not _HEX.fullmatch(hexed)):
            raise CorruptError("[C-3] factored columns are not a non-empty hex string of whole "
                               "elements")
        columns = np.frombuffer(bytes.fromhex(hexed), dtype.numpy)
        if not np.isfinite(columns).all():
            raise CorruptError("[C-3] factored columns must be finite")
        return cls(dtype, columns)

    def stream_sizes_ok(self, n: int, sizes: list[int], itemsize: int) -> bool:
        """A chunk holds whole rows: n a multiple of C, and one row factor per row."""
        columns = self.columns.size
        return n % columns == 0 and sizes == [n // columns * itemsize]

    def encode(self, chunk: np.ndarray) -> list[np.ndarray]:
        """The one stream of a chunk: its row factors ``chunk`` (in the dtype)."""
        return [np.ascontiguousarray(chunk).view(np.uint8)]

    def decode(self, streams: list, out: np.ndarray, undo: Undo | None = None) -> None:
        """Decode one chunk's decoded row factors into ``out`` (uint8, n × itemsize bytes)."""
        rows = np.frombuffer(streams[0], self.dtype.numpy)
        if not np.isfinite(rows).all():
            raise CorruptError("[D-7] factored row factors must be finite")
        values = out.view(self.dtype.numpy).reshape(rows.size, self.columns.size)
        with np.errstate(over="ignore", under="ignore"):  # ±inf and 0 are valid values (10.9)
            np.multiply(rows[:, None], self.columns[None, :], out=values)


def eligible(dtype: DType, shape: tuple[int, ...]) -> bool:
    """Whether a tensor can be factored at all (its values decide the rest)."""
    return dtype.name in DTYPES and len(shape) >= 2 and math.prod(shape) > 0


def factors(row_sums: np.ndarray, column_sums: np.ndarray,
            dtype: DType) -> tuple[np.ndarray, np.ndarray] | None:
    """(a, b) in the dtype from float64 row and column sums; None if they do not fit it."""
    total = float(row_sums.sum())
    if not math.isfinite(total):
        return None
    with np.errstate(over="ignore"):  # a sum beyond the dtype: checked just below
        a = (row_sums / total if total > 0 else np.zeros_like(row_sums)).astype(dtype.numpy)
        b = column_sums.astype(dtype.numpy)
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return None
    return a, b
