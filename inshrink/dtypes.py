"""The dtype registry: file dtype names <-> numpy dtypes, and conversion of array-likes.

File dtype names follow safetensors (``F32``, ``BF16``...) so conversion is a lookup.
Data is always stored little-endian.

bf16 and fp8 are :mod:`ml_dtypes` types, imported when one is first needed (importing
ml_dtypes costs 0.5-0.9 CPU-s, which a process that never meets such a tensor should not
pay): the table names them, :attr:`DType.numpy` resolves them, and :func:`of_numpy` only
looks for them once ``ml_dtypes`` is imported (an array of theirs cannot exist before).
"""
from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from .errors import InvalidArgumentError, UnknownCodecError


@dataclass(frozen=True)
class DType:
    """One storable element type.

    Attributes
    ----------
    name : str
        Name used in the file index (safetensors spelling).
    spec : str
        The numpy dtype string (``"<f4"``), or ``"ml_dtypes.<type>"`` for a type of
        ml_dtypes.
    word : int
        Width in bytes of the float word the sign-rotation works on (a complex number is two
        float words); 0 for integer and bool types, which are never rotated.
    """

    name: str
    spec: str
    word: int

    @functools.cached_property
    def numpy(self) -> np.dtype:
        """Little-endian numpy dtype of one element (imports ml_dtypes for bf16/fp8)."""
        module, _, type_name = self.spec.rpartition(".")
        if not module:
            return np.dtype(self.spec)
        import ml_dtypes  # (not ml_dtypes(), which reads this property)
        return np.dtype(getattr(ml_dtypes, type_name))

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize


_TABLE = [
    DType("F64", "<f8", 8),
    DType("F32", "<f4", 4),
    DType("F16", "<f2", 2),
    DType("BF16", "ml_dtypes.bfloat16", 2),
    DType("F8_E4M3", "ml_dtypes.float8_e4m3fn", 1),
    DType("F8_E5M2", "ml_dtypes.float8_e5m2", 1),
    DType("C64", "<c8", 4),
    DType("C128", "<c16", 8),
    DType("I8", "i1", 0),
    DType("I16", "<i2", 0),
    DType("I32", "<i4", 0),
    DType("I64", "<i8", 0),
    DType("U8", "u1", 0),
    DType("U16", "<u2", 0),
    DType("U32", "<u4", 0),
    DType("U64", "<u8", 0),
    DType("BOOL", "?", 0),
]
BY_NAME = {d.name: d for d in _TABLE}
# numpy dtype -> entry; the ml_dtypes entries join it when ml_dtypes is first imported
# (:func:`ml_dtypes`), so a look-up that misses must call :func:`of_numpy`
BY_NUMPY = {d.numpy: d for d in _TABLE if not d.spec.startswith("ml_dtypes.")}

# torch dtypes numpy cannot hold natively, viewed through a same-width integer first.
_TORCH_VIA_INT = {
    "torch.bfloat16": ("int16", "BF16"),
    "torch.float8_e4m3fn": ("int8", "F8_E4M3"),
    "torch.float8_e5m2": ("int8", "F8_E5M2"),
}


def ml_dtypes() -> ModuleType:
    """The :mod:`ml_dtypes` module, imported on first use; its entries then join
    :data:`BY_NUMPY`."""
    import ml_dtypes as module  # a no-op once imported

    if len(BY_NUMPY) < len(_TABLE):
        BY_NUMPY.update({d.numpy: d for d in _TABLE})
    return module


def by_name(name: str) -> DType:
    """Return the registry entry for a file dtype name, or raise :class:`UnknownCodecError`."""
    try:
        return BY_NAME[name]
    except (KeyError, TypeError):
        raise UnknownCodecError(f"unknown dtype {name!r}") from None


def of_numpy(dtype: np.dtype) -> DType:
    """Return the registry entry for a numpy dtype (either byte order)."""
    try:
        dt = np.dtype(dtype)
    except TypeError:  # perhaps a name that ml_dtypes defines ("bfloat16")
        ml_dtypes()
        dt = np.dtype(dtype)
    if dt.byteorder == ">":
        dt = dt.newbyteorder("<")
    found = BY_NUMPY.get(dt)
    if found is None and "ml_dtypes" in sys.modules:  # not one of its types before it is
        ml_dtypes()
        found = BY_NUMPY.get(dt)
    if found is None:
        raise InvalidArgumentError(f"unsupported dtype {dt}")
    return found


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

            int_name, stored = _TORCH_VIA_INT[torch_dtype]
            value = (value.contiguous().view(getattr(torch, int_name)).numpy()
                     .view(BY_NAME[stored].numpy))
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
