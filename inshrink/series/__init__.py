"""Series of checkpoints of one run: a keyframe, then deltas against the next newer step
(:mod:`.series`), and the per-step report (:mod:`.report`). What a series of .ink files and a
DCP series share is written once: the manifest's common fields and steps (:mod:`.manifest`),
the keyframe rule (:mod:`.keyframes`), the chains' links (:mod:`.links`) and the writer's lock
and clean-up (:mod:`.directory`)."""
from .._lazy import face

_NAMES = {
    **dict.fromkeys(["Series", "Checkpoint", "MANIFEST", "SEARCH_KEY"], ".series"),
    **dict.fromkeys(["MAX_STEP", "MAX_MANIFEST_BYTES"], ".manifest"),
    **dict.fromkeys(["decode_digest", "decode_link", "file_sha256"], ".links"),
    **dict.fromkeys(["LOCK"], ".directory"),
    **dict.fromkeys(["series_report", "format_table", "plot_series"], ".report"),
}
__getattr__, __dir__ = face(__name__, _NAMES, rest=".series")
__all__ = sorted(_NAMES)
