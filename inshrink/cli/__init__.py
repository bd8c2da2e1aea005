"""The ``inshrink`` command line (entry point ``inshrink.cli:main``)."""
from .._lazy import face

__getattr__, __dir__ = face(__name__, {"main": ".commands"}, rest=".commands")
__all__ = ["main"]
