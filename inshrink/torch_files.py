"""Deprecated: moved to :mod:`inshrink.torch.files`, re-exported by :mod:`inshrink.torch`
(see CHANGELOG.md)."""
from ._moved import moved

__getattr__ = moved("inshrink.torch_files", "inshrink.torch.files")
