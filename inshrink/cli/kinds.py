"""Which kind of directory an input is: a checkpoint series, a sharded
torch.distributed.checkpoint directory, or a series of those. Recognised by file names and
the series manifest alone, so that only the commands that read a sharded checkpoint import
torch."""
from __future__ import annotations

import json
import os

from ..dcp.names import METADATA, SERIES_MANIFEST, is_rank_name


def is_series(path: str) -> bool:
    """A directory of an inshrink.series series: its manifest.json says so. A tree may hold
    another program's manifest.json (compress copies it): that one is no series."""
    from ..series.series import MANIFEST, MAX_MANIFEST_BYTES, SERIES_FORMAT
    manifest = os.path.join(path, MANIFEST)
    if not os.path.isfile(manifest):
        return False
    try:
        with open(manifest, "rb") as f:
            doc = json.loads(f.read(MAX_MANIFEST_BYTES + 1))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("format") == SERIES_FORMAT


def is_dcp_series(path: str) -> bool:
    """A directory of an inshrink.dcp series (its manifest, ``series.json``)."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, SERIES_MANIFEST))


def is_dcp(path: str) -> bool:
    """A directory holding DCP's ``.metadata`` or an inshrink.dcp rank file (committed or
    not: one without ``.metadata`` is then reported as an incomplete checkpoint)."""
    if not os.path.isdir(path):
        return False
    try:
        names = os.listdir(path)
    except OSError:
        return False
    return METADATA in names or any(is_rank_name(n) for n in names)
