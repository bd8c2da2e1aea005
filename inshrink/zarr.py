"""zarr v3 codecs that store each chunk as an inshrink array frame (spec section 24).

``InkCodec`` (name ``inshrink``, lossless) and ``InkQuantCodec`` (name ``inshrink-quant``,
dynamic quantization of floating-point chunks, lossless for other dtypes) are array-to-bytes
codecs: pass one as ``serializer=`` ::

    zarr.create_array(store, shape=..., chunks=..., dtype="float32",
                      serializer=InkCodec(), compressors=None)

They see each chunk with its dtype, so floating-point values are byte-grouped with the sign
rotated (or quantized), and they are registered through the ``zarr.codecs`` entry point, so
zarr opens such arrays once inshrink is installed. Parameters are those of the numcodecs
codecs :class:`inshrink.numcodecs.Inshrink` and :class:`~inshrink.numcodecs.InshrinkQuant`,
which do the work.

zarr 3.1 has no bfloat16 data type: :class:`BFloat16` (name ``bfloat16``) lets zarr store
``ml_dtypes.bfloat16`` arrays, with any codec. Importing this module registers it (zarr 3.1
lists the ``zarr.data_type`` entry point, which inshrink declares, but does not load it):
``import inshrink.zarr`` before opening such an array.
"""
from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import ml_dtypes
import numpy as np
from zarr.abc.codec import ArrayBytesCodec
from zarr.core.common import JSON, parse_named_configuration
from zarr.core.dtype import data_type_registry
from zarr.core.dtype.common import DataTypeValidationError
from zarr.core.dtype.npy.float import BaseFloat

from inshrink.io import frame as array
from inshrink.errors import CorruptError, InvalidArgumentError
from inshrink.numcodecs import Inshrink, InshrinkQuant, _as_elements

if TYPE_CHECKING:
    from typing import Self

    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import Buffer, NDBuffer

__all__ = ["BFloat16", "InkCodec", "InkQuantCodec"]

_BF16 = np.dtype(ml_dtypes.bfloat16)


@dataclass(frozen=True, kw_only=True)
class BFloat16(BaseFloat):
    """The zarr v3 data type ``bfloat16`` (``ml_dtypes.bfloat16``, 2 bytes), as zarr's own
    float types: fill values and scalars as JSON numbers or ``"NaN"``/``"Infinity"``."""

    dtype_cls = type(_BF16)
    _zarr_v3_name = "bfloat16"
    _zarr_v2_names: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_native_dtype(cls, dtype: Any) -> "BFloat16":
        if dtype == _BF16:
            return cls()
        raise DataTypeValidationError(f"invalid data type {dtype}: expected bfloat16")

    def to_native_dtype(self) -> np.dtype:
        return _BF16  # ml_dtypes types are little-endian on every machine numpy supports

    @property
    def item_size(self) -> int:
        return 2


def _register_bfloat16() -> None:
    """Register :class:`BFloat16` unless zarr already knows a bfloat16 type (a later zarr,
    or another package): its name and its dtype stay theirs."""
    if BFloat16._zarr_v3_name in data_type_registry.contents:
        return
    try:
        data_type_registry.match_dtype(_BF16)
    except ValueError:
        data_type_registry.register(BFloat16._zarr_v3_name, BFloat16)


_register_bfloat16()


def _little(dtype: np.dtype) -> np.dtype:
    return dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype


@dataclass(frozen=True, init=False)
class _Ink(ArrayBytesCodec):
    is_fixed_size = False
    codec_name = ""
    config: dict

    def __init__(self, **config: Any) -> None:
        # one numcodecs codec per zarr codec, made (and its settings validated) once: every
        # chunk is encoded by it
        codec = self._numcodec(config)
        object.__setattr__(self, "_codec", codec)
        object.__setattr__(self, "config", codec.get_config())
        self.config.pop("id")

    @staticmethod
    def _numcodec(config: dict) -> Inshrink:
        raise NotImplementedError

    @classmethod
    def from_dict(cls, data: dict[str, JSON]) -> Self:
        _, config = parse_named_configuration(data, cls.codec_name,
                                              require_configuration=False)
        try:
            return cls(**(config or {}))
        except TypeError as exc:  # an unknown key in the array's metadata
            if isinstance(exc, InvalidArgumentError):
                raise
            raise InvalidArgumentError(f"codec {cls.codec_name!r}: {exc}") from None

    def to_dict(self) -> dict[str, JSON]:
        return {"name": self.codec_name, "configuration": dict(self.config)}

    def __hash__(self) -> int:
        return hash((self.codec_name, tuple(sorted(self.config.items()))))

    def compute_encoded_size(self, input_byte_length: int, chunk_spec: ArraySpec) -> int:
        raise NotImplementedError  # variable size

    def _encode_sync(self, chunk_array: NDBuffer, chunk_spec: ArraySpec) -> Buffer | None:
        # frames are little-endian, and zarr v3 records no byte order for this serializer:
        # an array written big-endian is read back with the machine's
        little = _little(chunk_spec.dtype.to_native_dtype())
        data = np.ascontiguousarray(chunk_array.as_numpy_array().astype(little, copy=False))
        return chunk_spec.prototype.buffer.from_bytes(self._codec.encode(data))

    def _decode_sync(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> NDBuffer:
        native = chunk_spec.dtype.to_native_dtype()
        little = _little(native)
        nbytes = math.prod(chunk_spec.shape) * native.itemsize
        decoded = array.decode(chunk_bytes.as_numpy_array(), max_nbytes=nbytes)
        if decoded.dtype != _as_elements(np.empty(0, little)).dtype or decoded.nbytes != nbytes:
            raise CorruptError(f"chunk holds {decoded.dtype} x {decoded.size}, the array "
                               f"needs {native} x {math.prod(chunk_spec.shape)}")
        out = decoded.reshape(-1).view(little).reshape(chunk_spec.shape)
        out = out.astype(native, copy=False)
        return chunk_spec.prototype.nd_buffer.from_numpy_array(out)

    async def _encode_single(self, chunk_array: NDBuffer,
                             chunk_spec: ArraySpec) -> Buffer | None:
        return await asyncio.to_thread(self._encode_sync, chunk_array, chunk_spec)

    async def _decode_single(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> NDBuffer:
        return await asyncio.to_thread(self._decode_sync, chunk_bytes, chunk_spec)


@dataclass(frozen=True, init=False, eq=False)  # the base's __eq__ and __hash__
class InkCodec(_Ink):
    """Lossless inshrink serializer (name ``inshrink``): ``level`` (zstd, ``None`` = fast)
    and ``chunk_bytes``, as :class:`inshrink.numcodecs.Inshrink`."""

    codec_name = "inshrink"

    def __init__(self, *, level: int | None = None,
                 chunk_bytes: int = array.DEFAULT_CHUNK_BYTES) -> None:
        super().__init__(level=level, chunk_bytes=chunk_bytes)

    @staticmethod
    def _numcodec(config: dict) -> Inshrink:
        return Inshrink(**config)


@dataclass(frozen=True, init=False, eq=False)  # the base's __eq__ and __hash__
class InkQuantCodec(_Ink):
    """Lossy inshrink serializer (name ``inshrink-quant``): ``bins``, ``domain``,
    ``protect``, ``prune``, ``max_rel_l2``, ``seed``, ``level``, ``chunk_bytes`` as
    :class:`inshrink.numcodecs.InshrinkQuant`; each chunk is fitted on its own values and
    records its measured error (:func:`inshrink.io.frame.report` of the stored bytes)."""

    codec_name = "inshrink-quant"

    def __init__(self, *, bins: int = 16, domain: str = "linear", protect: float = 0.0,
                 prune: float = 0.0, max_rel_l2: float | None = None, seed: int = 0,
                 level: int | None = None,
                 chunk_bytes: int = array.DEFAULT_CHUNK_BYTES) -> None:
        super().__init__(bins=bins, domain=domain, protect=protect, prune=prune,
                         max_rel_l2=max_rel_l2, seed=seed, level=level,
                         chunk_bytes=chunk_bytes)

    @staticmethod
    def _numcodec(config: dict) -> Inshrink:
        return InshrinkQuant(**config)
