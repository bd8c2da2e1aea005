"""Where a search's report lives in a checkpoint: one metadata entry, written beside the
checkpoint it chose the policy of, and read back to continue a run's search after a restart.

A series stores whatever metadata it is given; only the search knows what this entry means.
"""
from __future__ import annotations

import json
from typing import Mapping

from ..errors import CorruptError, InvalidArgumentError
from .space import Choice

SEARCH_KEY = "inshrink.search"
"""Metadata key of the configuration search report (JSON) of a checkpoint."""


def report_metadata(report: Mapping) -> dict[str, str]:
    """The metadata entry that stores a search report (:attr:`SearchResult.report`)."""
    return {SEARCH_KEY: json.dumps(report)}


def stored_choice(metadata: Mapping[str, str], where: str = "checkpoint") -> Choice | None:
    """The weights' configuration a search chose for a checkpoint, from its metadata.

    Returns None when the checkpoint was not saved by a search, or the search kept the
    weights lossless.

    Raises
    ------
    CorruptError
        The report is there but is not one a search wrote (``where`` names the checkpoint).
    """
    stored = metadata.get(SEARCH_KEY)
    try:
        chosen = json.loads(stored).get("chosen") if stored else None
        return None if chosen is None else Choice.from_dict(chosen)
    except (ValueError, AttributeError, RecursionError, InvalidArgumentError) as exc:
        raise CorruptError(f"{where}: the search report is unreadable: {exc}") from None
