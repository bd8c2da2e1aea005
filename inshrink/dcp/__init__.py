"""``torch.distributed.checkpoint`` storage for .ink files: one file per rank and save
(:mod:`.storage`), series of sharded checkpoints stored as per-rank deltas (:mod:`.series`) and
the Checkpointer's sharded mode (:mod:`.sharded`). Needs torch."""
from .._lazy import face

_NAMES = {
    **dict.fromkeys(["InkStorageWriter", "InkStorageReader", "read_metadata", "describe",
                     "verify", "consolidate", "METADATA_FILE", "BYTES_PREFIX"], ".storage"),
    **dict.fromkeys(["InkSeries", "InkSeriesWriter", "InkSeriesReader"], ".series"),
    **dict.fromkeys(["ShardedCheckpoints", "is_sharded"], ".sharded"),
}
__getattr__, __dir__ = face(__name__, _NAMES, rest=".storage")
__all__ = sorted(_NAMES)
