"""The dtype registry: file dtype names <-> numpy dtypes, and conversion of array-likes.

File dtype names follow safetensors (``F32``, ``BF16``...) so conversion is a lookup.
Data is always stored little-endian.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from .errors import InvalidArgumentError, UnknownCodecError


@dataclass(frozen=True)
class DType:
    """One storable element type.

    Attributes
    ----------
    name : str
        Name used in the file index (safetensors spelling).
    numpy : numpy.dtype
        Little-endian numpy dtype of one element.
    word : int
        Width in bytes of the float word the sign-rotation works on (a complex number is two
        float words); 0 for integer and bool types, which are never rotated.
    """

    name: str
    numpy: np.dtype
    word: int

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize


_TABLE = [
    DType("F64", np.dtype("<f8"), 8),
    DType("F32", np.dtype("<f4"), 4),
    DType("F16", np.dtype("<f2"), 2),
    DType("BF16", np.dtype(ml_dtypes.bfloat16), 2),
    DType("F8_E4M3", np.dtype(ml_dtypes.float8_e4m3fn), 1),
    DType("F8_E5M2", np.dtype(ml_dtypes.float8_e5m2), 1),
    DType("C64", np.dtype("<c8"), 4),
    DType("C128", np.dtype("<c16"), 8),
    DType("I8", np.dtype("i1"), 0),
    DType("I16", np.dtype("<i2"), 0),
    DType("I32", np.dtype("<i4"), 0),
    DType("I64", np.dtype("<i8"), 0),
    DType("U8", np.dtype("u1"), 0),
    DType("U16", np.dtype("<u2"), 0),
    DType("U32", np.dtype("<u4"), 0),
    DType("U64", np.dtype("<u8"), 0),
    DType("BOOL", np.dtype("?"), 0),
]
BY_NAME = {d.name: d for d in _TABLE}
_BY_NUMPY = {d.numpy: d for d in _TABLE}

# torch dtypes numpy cannot hold natively, viewed through a same-width integer first.
_TORCH_VIA_INT = {
    "torch.bfloat16": ("int16", ml_dtypes.bfloat16),
    "torch.float8_e4m3fn": ("int8", ml_dtypes.float8_e4m3fn),
    "torch.float8_e5m2": ("int8", ml_dtypes.float8_e5m2),
}


def by_name(name: str) -> DType:
    """Return the registry entry for a file dtype name, or raise :class:`UnknownCodecError`."""
    try:
        return BY_NAME[name]
    except (KeyError, TypeError):
        raise UnknownCodecError(f"unknown dtype {name!r}") from None


def of_numpy(dtype: np.dtype) -> DType:
    """Return the registry entry for a numpy dtype (either byte order)."""
    dt = np.dtype(dtype)
    if dt.byteorder == ">":
        dt = dt.newbyteorder("<")
    try:
        return _BY_NUMPY[dt]
    except KeyError:
        raise InvalidArgumentError(f"unsupported dtype {dt}") from None


def as_numpy(value: Any) -> np.ndarray:
    """Turn an array-like into a C-contiguous little-endian numpy array, bit for bit.

    Accepts numpy arrays, objects with ``__array__`` or ``__dlpack__`` and torch tensors
    (moved to host; bf16/fp8 included). Non-contiguous and big-endian inputs are copied.
    Masked arrays and torch meta tensors raise :class:`InvalidArgumentError`.
    """
    if isinstance(value, np.ma.MaskedArray):
        # the mask would be lost: storing .data silently keeps values the caller masked out
        raise InvalidArgumentError("masked arrays are not supported: store .data (and the "
                                   "mask as a BOOL tensor) or .filled(value) explicitly")
    torch_dtype = str(getattr(value, "dtype", ""))
    if torch_dtype.startswith("torch.") and hasattr(value, "detach"):
        if getattr(getattr(value, "device", None), "type", None) == "meta":
            raise InvalidArgumentError("a torch meta tensor has no data to store")
        if getattr(value, "is_nested", False):
            raise InvalidArgumentError("a torch nested tensor has no single shape: store its "
                                       "tensors (.unbind()) one by one")
        # a conjugate or negative view's values, which numpy() refuses to see through
        value = value.detach().cpu().resolve_conj().resolve_neg()
        if torch_dtype in _TORCH_VIA_INT:
            import torch  # only reachable when the caller already uses torch

            int_name, ml_type = _TORCH_VIA_INT[torch_dtype]
            value = value.contiguous().view(getattr(torch, int_name)).numpy().view(ml_type)
    if isinstance(value, np.ndarray) and type(value) is not np.ndarray:
        # a subclass may reshape differently (np.matrix stays 2-D): the same memory as a
        # plain array
        value = value.view(np.ndarray)
    if not isinstance(value, np.ndarray):
        try:
            if hasattr(value, "__dlpack__") and not hasattr(value, "__array__"):
                value = np.from_dlpack(value)
            else:
                value = np.asarray(value)
        except (ValueError, TypeError, BufferError) as exc:
            raise InvalidArgumentError(
                f"cannot convert {type(value).__name__} to an array: {exc}") from None
    if value.dtype.hasobject or value.dtype.fields is not None:
        raise InvalidArgumentError(f"unsupported dtype {value.dtype}")
    of_numpy(value.dtype)  # raises for unsupported dtypes
    if value.dtype.byteorder == ">":
        value = value.byteswap().view(value.dtype.newbyteorder("<"))
    return value if value.flags.c_contiguous else value.copy(order="C")  # keeps 0-d shape


def python_number(value: Any) -> Any:
    """A numpy scalar (``np.int64(16)``, ``np.float32(0.01)``) as the Python int or float of
    the same value, so that settings given from numpy arrays pass the same checks and write
    the same JSON as plain numbers; anything else unchanged (bools too)."""
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value
