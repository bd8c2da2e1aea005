"""``torch.distributed.checkpoint`` storage for .ink files: one file per rank and save
(:mod:`.writer` saves, :mod:`.reader` loads, :mod:`.metadata` reads and checks the commit
marker, :mod:`.chunkmap` reads the torch-free chunk map and joins tensors from it, :mod:`.inspect`
describes and verifies, :mod:`.consolidation` joins the shards),
series of sharded checkpoints stored as per-rank deltas (:mod:`.series`) and the
Checkpointer's sharded mode (:mod:`.sharded`). Needs torch, but for :mod:`.chunkmap` and
:func:`consolidate` of a checkpoint with a chunk map."""
from .._lazy import face

_NAMES = {
    "InkStorageWriter": ".writer",
    "InkStorageReader": ".reader",
    **dict.fromkeys(["read_metadata", "METADATA_FILE", "BYTES_PREFIX"], ".metadata"),
    **dict.fromkeys(["describe", "verify"], ".inspect"),
    "consolidate": ".consolidation",
    **dict.fromkeys(["read_chunk_map", "assemble", "iter_assembled", "CHUNK_MAP"], ".chunkmap"),
    **dict.fromkeys(["InkSeries", "InkSeriesWriter", "InkSeriesReader"], ".series"),
    **dict.fromkeys(["ShardedCheckpoints", "is_sharded"], ".sharded"),
}
# rest: READ_BATCH_BYTES, the one other public name of the former single module
__getattr__, __dir__ = face(__name__, _NAMES, rest=".reader")
__all__ = sorted(_NAMES)
