"""The DCP storage layer's former single module, split into :mod:`.writer`, :mod:`.reader`,
:mod:`.metadata`, :mod:`.inspect` and :mod:`.consolidation`: the names its callers still
import from here. Import from the defining modules instead."""
from .consolidation import consolidate
from .inspect import describe, verify
from .metadata import BYTES_PREFIX, METADATA_FILE, read_metadata
from .metadata import read_metadata_file as _read_metadata  # noqa: F401 (the CLI reads it)
from .reader import READ_BATCH_BYTES, InkStorageReader  # noqa: F401
from .writer import InkStorageWriter

__all__ = ["InkStorageWriter", "InkStorageReader", "read_metadata", "describe", "verify",
           "consolidate", "METADATA_FILE", "BYTES_PREFIX"]
