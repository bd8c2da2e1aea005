"""Hugging Face transformers: compressed model directories (``from_pretrained``,
``save_pretrained``, :mod:`.pretrained`), Trainer checkpoint directories as series
checkpoints and back (:mod:`.checkpoints`) and the Trainer ``Callback`` that keeps them in a
series (:mod:`.callback`). Needs torch and transformers."""
from .._lazy import face

_NAMES = {
    **dict.fromkeys(["from_pretrained", "save_pretrained", "lossy_summary"], ".pretrained"),
    **dict.fromkeys(["checkpoint_to_numpy", "restore_checkpoint", "CHECKPOINT_METADATA"],
                    ".checkpoints"),
    "Callback": ".callback",
}
# the other names of the former single module: its checkpoint constants and helpers are in
# .checkpoints, which ``rest`` resolves; _check_shards, _digest and _bytes_of went to
# .pretrained and .callback
_KEPT = dict.fromkeys(["FILE", "OPTIMIZER_FILE"], ".checkpoints")
__getattr__, __dir__ = face(__name__, {**_NAMES, **_KEPT}, rest=".checkpoints")
__all__ = sorted(_NAMES)
