"""Former home of :mod:`inshrink.torch`'s file calls; they live in :mod:`inshrink.torch.files`
and are re-exported by :mod:`inshrink.torch`."""
from .torch.files import load, load_file, load_model, save, save_file, save_model

__all__ = ["save_file", "load_file", "save", "load", "save_model", "load_model"]
