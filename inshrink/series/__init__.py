"""Series of checkpoints of one run: a keyframe, then deltas against the next newer step
(:mod:`.series`), and the per-step report (:mod:`.report`)."""
from .._lazy import face

_NAMES = {
    **dict.fromkeys(["Series", "Checkpoint", "MANIFEST", "SEARCH_KEY", "MAX_STEP"], ".series"),
    **dict.fromkeys(["series_report", "format_table", "plot_series"], ".report"),
}
__getattr__, __dir__ = face(__name__, _NAMES, rest=".series")
__all__ = sorted(_NAMES)
