"""Torch tensors to numpy arrays and back, with the dtypes numpy lacks (bfloat16, float8)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

from ..dtypes import as_numpy
from ..errors import InvalidArgumentError

__all__ = ["to_numpy", "to_torch"]

# numpy dtypes torch cannot wrap directly, viewed through a same-width integer
_VIA_INT = {
    np.dtype(ml_dtypes.bfloat16): (np.int16, torch.bfloat16),
    np.dtype(ml_dtypes.float8_e4m3fn): (np.int8, torch.float8_e4m3fn),
    np.dtype(ml_dtypes.float8_e5m2): (np.int8, torch.float8_e5m2),
}


def to_numpy(tensor: torch.Tensor, name: str = "tensor") -> np.ndarray:
    """A CPU tensor's data as a numpy array, sharing its memory where possible.

    bf16 and fp8 come back as :mod:`ml_dtypes` arrays (viewed, not converted);
    non-contiguous tensors and tensors on other devices are copied.
    """
    if tensor.layout != torch.strided:
        raise InvalidArgumentError(f"{name}: {tensor.layout} tensors are not supported")
    if tensor.is_meta:  # (.cpu() would raise NotImplementedError)
        raise InvalidArgumentError(f"{name}: a meta tensor has no data to store")
    tensor = tensor.detach().cpu().resolve_conj().resolve_neg()
    try:
        return as_numpy(tensor.contiguous())
    except (TypeError, RuntimeError) as exc:  # e.g. complex32, quantized tensors
        raise InvalidArgumentError(f"{name}: cannot convert {tensor.dtype}: {exc}") from None


def to_torch(array: np.ndarray) -> torch.Tensor:
    """A numpy array (ml_dtypes bf16/fp8 included) as a CPU tensor sharing its memory.

    Read-only arrays (memory maps) are copied: torch tensors are always writable.
    """
    array = as_numpy(array)
    if not array.flags.writeable:
        array = array.copy()
    via = _VIA_INT.get(array.dtype)
    if via is not None:
        return torch.from_numpy(array.view(via[0])).view(via[1])
    return torch.from_numpy(array)
