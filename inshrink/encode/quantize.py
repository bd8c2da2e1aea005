"""The quantizer's names where modules not yet moved to :mod:`.sketch`, :mod:`.fit` and
:mod:`.quantizer` import them."""
from .fit import BIN_LADDER, bin_candidates, fewest_bins, fit  # noqa: F401
from .quantizer import ChunkStats, QuantEncoder, rank_table  # noqa: F401
from .sketch import Buckets, Sketch, work_dtype  # noqa: F401
