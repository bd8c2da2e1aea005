"""inshrink: smaller deep-learning checkpoints, losslessly or with a measured error.

>>> import inshrink
>>> inshrink.save("step_1000.ink", state)          # doctest: +SKIP
>>> state = inshrink.load("step_1000.ink")         # doctest: +SKIP
>>> with inshrink.open("step_1000.ink") as f:      # doctest: +SKIP
...     w = f["model.layers.3.attn.q_proj.weight"]
"""
from .api import load, open, save
from .errors import (BaseMismatchError, ChecksumError, CorruptError, InshrinkError, InvalidArgumentError,
                     LimitExceededError, SeriesLockedError, TensorNotFoundError, TruncatedError,
                     UnknownCodecError, UnsupportedFeatureError, UnsupportedVersionError)
from .encode.policy import PRESETS, Policy, QuantConfig
from .search import Choice, Search, SearchResult, SearchSpace
from .series.series import Series
from .io.file import File
from .io.info import TensorInfo
from .io.writer import Writer

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
