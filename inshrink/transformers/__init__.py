"""Hugging Face transformers: compressed model directories (``from_pretrained``,
``save_pretrained``) and the Trainer ``Callback`` that keeps its checkpoints in a series.
Needs torch and transformers."""
from .._lazy import face

_NAMES = dict.fromkeys(["from_pretrained", "save_pretrained", "lossy_summary", "Callback",
                        "checkpoint_to_numpy", "restore_checkpoint", "CHECKPOINT_METADATA"],
                       ".pretrained")
__getattr__, __dir__ = face(__name__, _NAMES, rest=".pretrained")
__all__ = sorted(_NAMES)
