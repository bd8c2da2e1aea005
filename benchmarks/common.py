"""Helpers shared by the benchmark scripts."""
from __future__ import annotations

import os
import sys
import tempfile

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def import_inshrink(required=("save", "load")):
    """(module, None), or (None, why not): installed first, else from the repository root."""
    try:
        import inshrink  # noqa: F401
    except ImportError:
        if REPO_ROOT not in sys.path:
            sys.path.insert(0, REPO_ROOT)
        try:
            import inshrink  # noqa: F401
        except ImportError as e:
            return None, f"{type(e).__name__}: {e}"
    import inshrink
    missing = [n for n in required if not hasattr(inshrink, n)]
    if missing:
        return None, f"inshrink has no {', '.join(missing)}"
    return inshrink, None


def tmp_root() -> str:
    """/dev/shm when writable (timings without disk noise), else the system temp folder."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) \
        else tempfile.gettempdir()
