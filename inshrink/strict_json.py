"""JSON as the format's documents allow it: no duplicate key in an object, no NaN or
Infinity (which Python's ``json`` accepts by default)."""
from __future__ import annotations

import json
from typing import Any


def loads(text: str) -> Any:
    """``json.loads`` that raises ``ValueError`` on a duplicate key or on ``NaN``,
    ``Infinity`` or ``-Infinity``; callers turn it into their format rule's error."""
    return json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constant)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict:
    doc = dict(pairs)
    if len(doc) != len(pairs):
        raise ValueError("duplicate key")
    return doc


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")
