"""Torch tensors to numpy arrays and back, with the dtypes numpy lacks (bfloat16, float8).

The one table of those dtypes lives here: :func:`to_numpy`, :func:`to_torch` and
:func:`dtype_name` (the file dtype name of a torch dtype, which the DCP storage layer checks
its chunks against) all read it.
"""
from __future__ import annotations

import numpy as np
import torch

from ..dtypes import BY_NAME, as_numpy, of_numpy
from ..errors import InvalidArgumentError

__all__ = ["to_numpy", "to_torch", "dtype_name"]

# torch dtypes numpy lacks: the stored dtype of their values (an ml_dtypes type, imported
# when first met), and the same-width integer both sides view the bits through (neither
# library wraps the other's type directly)
_WITHOUT_NUMPY = {
    torch.bfloat16: (BY_NAME["BF16"], torch.int16),
    torch.float8_e4m3fn: (BY_NAME["F8_E4M3"], torch.int8),
    torch.float8_e5m2: (BY_NAME["F8_E5M2"], torch.int8),
}
_TORCH_OF_NAME = {stored.name: torch_dtype for torch_dtype, (stored, _) in _WITHOUT_NUMPY.items()}


def to_numpy(tensor: torch.Tensor, name: str = "tensor") -> np.ndarray:
    """A CPU tensor's data as a numpy array, sharing its memory where possible.

    bf16 and fp8 come back as :mod:`ml_dtypes` arrays (viewed, not converted);
    non-contiguous tensors and tensors on other devices are copied.

    Parameters
    ----------
    tensor : torch.Tensor
        A strided tensor with data (not a meta tensor).
    name : str
        What error messages call the tensor.

    Returns
    -------
    numpy.ndarray
        C-contiguous and little-endian, of the dtype inshrink stores.
    """
    if tensor.layout != torch.strided:
        raise InvalidArgumentError(f"{name}: {tensor.layout} tensors are not supported")
    if tensor.is_meta:  # (.cpu() would raise NotImplementedError)
        raise InvalidArgumentError(f"{name}: a meta tensor has no data to store")
    tensor = tensor.detach().cpu().resolve_conj().resolve_neg()
    try:
        via = _WITHOUT_NUMPY.get(tensor.dtype)
        if via is not None and not tensor.is_nested:  # (as_numpy refuses nested tensors)
            stored, integer = via
            return as_numpy(tensor.contiguous().view(integer).numpy().view(stored.numpy))
        return as_numpy(tensor.contiguous())
    except (TypeError, RuntimeError) as exc:  # e.g. complex32, quantized tensors
        raise InvalidArgumentError(f"{name}: cannot convert {tensor.dtype}: {exc}") from None


def to_torch(array: np.ndarray) -> torch.Tensor:
    """A numpy array (ml_dtypes bf16/fp8 included) as a CPU tensor sharing its memory.

    Read-only arrays (memory maps) are copied: torch tensors are always writable.

    Parameters
    ----------
    array : numpy.ndarray
        Any array inshrink stores (see :func:`inshrink.dtypes.as_numpy`).

    Returns
    -------
    torch.Tensor
    """
    array = as_numpy(array)
    if not array.flags.writeable:
        array = array.copy()
    torch_dtype = _TORCH_OF_NAME.get(of_numpy(array.dtype).name)
    if torch_dtype is not None:
        return torch.from_numpy(array.view(f"<i{array.itemsize}")).view(torch_dtype)
    return torch.from_numpy(array)


def dtype_name(dtype: torch.dtype, name: str = "tensor") -> str:
    """inshrink's name of a torch dtype, as a file's index spells it (``F32``, ``BF16``...).

    Parameters
    ----------
    dtype : torch.dtype
    name : str
        What an error message calls the tensor of that dtype.

    Returns
    -------
    str

    Raises
    ------
    InvalidArgumentError
        A dtype inshrink cannot store (``torch.complex32``, quantized dtypes...).
    """
    return of_numpy(to_numpy(torch.empty(0, dtype=dtype), name).dtype).name
