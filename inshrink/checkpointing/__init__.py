"""Training checkpoints: :class:`~.checkpointer.Checkpointer` (a series of training states,
each searched within its share of the quality bound, :mod:`.budget`), re-exported by
:mod:`inshrink.torch`. Needs torch."""
from .._lazy import face

_NAMES = {"Checkpointer": ".checkpointer", "Budget": ".budget"}
__getattr__, __dir__ = face(__name__, _NAMES)
__all__ = sorted(_NAMES)
