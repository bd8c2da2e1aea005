"""inshrink: smaller deep-learning checkpoints, losslessly or with a measured error.

>>> import inshrink
>>> inshrink.save("step_1000.ink", state)          # doctest: +SKIP
>>> state = inshrink.load("step_1000.ink")         # doctest: +SKIP
>>> with inshrink.open("step_1000.ink") as f:      # doctest: +SKIP
...     w = f["model.layers.3.attn.q_proj.weight"]
"""
from ._lazy import face

# Each name's module is imported when the name is first used (``inshrink.save``, ``from
# inshrink import File``), so ``import inshrink`` and ``inshrink --help`` cost no numpy and no
# codec modules; the names are the same objects as before.
_NAMES = {
    **dict.fromkeys(["load", "open", "save"], ".api"),
    **dict.fromkeys(["BaseMismatchError", "ChecksumError", "CorruptError", "InshrinkError",
                     "InvalidArgumentError", "LimitExceededError", "SeriesLockedError",
                     "TensorNotFoundError", "TruncatedError", "UnknownCodecError",
                     "UnsupportedFeatureError", "UnsupportedVersionError"], ".errors"),
    **dict.fromkeys(["PRESETS", "Policy", "QuantConfig"], ".encode.policy"),
    **dict.fromkeys(["Choice", "Search", "SearchResult", "SearchSpace"], ".search"),
    "Series": ".series.series",
    "File": ".io.file",
    "TensorInfo": ".io.info",
    "Writer": ".io.writer",
}
__getattr__, __dir__ = face(__name__, _NAMES)

__version__ = "0.1.0"

__all__ = [
    "save", "load", "open", "File", "Writer", "TensorInfo", "Policy", "QuantConfig", "PRESETS",
    "Series", "Search", "SearchSpace", "SearchResult", "Choice",
    "InshrinkError", "InvalidArgumentError", "CorruptError", "TruncatedError",
    "ChecksumError", "UnsupportedVersionError", "UnsupportedFeatureError",
    "UnknownCodecError", "LimitExceededError", "TensorNotFoundError", "BaseMismatchError",
    "SeriesLockedError",
    "__version__",
]
