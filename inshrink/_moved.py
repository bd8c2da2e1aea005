"""Old import paths of modules that moved (see CHANGELOG.md): each old module is a short shim
whose names come from the new modules, with one DeprecationWarning when it is imported."""
from __future__ import annotations

import importlib
import warnings
from typing import Any, Callable


def moved(old: str, *new: str) -> Callable[[str], Any]:
    """Warn that ``old`` moved to ``new`` and return the old module's ``__getattr__``, which
    looks each name up in the new modules, in order."""
    warnings.warn(f"{old} is deprecated: import from {' or '.join(new)}", DeprecationWarning,
                  stacklevel=3)

    def __getattr__(name: str) -> Any:
        for module in new:
            target = importlib.import_module(module)
            if hasattr(target, name):
                return getattr(target, name)
        raise AttributeError(f"module {old!r} has no attribute {name!r}")

    return __getattr__
