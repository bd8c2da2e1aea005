"""Package faces that import their modules when a name is first used (PEP 562), so that
``import inshrink.torch`` costs nothing until a name is needed and no module of a package
has to import the package's face."""
from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping


def face(package: str, names: Mapping[str, str], rest: str | None = None
         ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``names`` maps each public name to
    the module (relative to ``package``) that defines it; any other name is looked up in the
    module ``rest`` (the package's former single module, whose other names users may hold)."""

    def __getattr__(name: str) -> Any:
        module = names.get(name, rest)
        if module is None or name.startswith("__"):
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        try:
            value = getattr(importlib.import_module(module, package), name)
        except AttributeError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        globals_of(package)[name] = value  # later look-ups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted(set(globals_of(package)) | set(names))

    return __getattr__, __dir__


def globals_of(package: str) -> dict[str, Any]:
    """The namespace of an imported package."""
    return vars(importlib.import_module(package))
