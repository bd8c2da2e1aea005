"""How a command ends: its exit status, and the error that means a command-line mistake."""
from __future__ import annotations

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
"""Success, an error in the data or I/O, a usage error."""


class UsageError(Exception):
    """A command-line mistake: reported in one line with exit status 2."""
