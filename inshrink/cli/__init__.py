"""The ``inshrink`` command line (entry point ``inshrink.cli:main``).

=============  ======================================================================
``parser``     the parser, its argument types and :func:`main`
``status``     exit statuses and :class:`UsageError`
``output``     clean text, the JSON report, summaries and warnings
``paths``      input and output checks, default outputs, OS errors by the user's path
``kinds``      which kind of directory an input is (series, sharded checkpoint)
``transfer``   compress and decompress
``inspect``    info and verify of .ink files
``dcp``        info, verify and consolidate of sharded checkpoints and their series
``series``     series ls, restore, verify and report
=============  ======================================================================
"""
from .._lazy import face

_NAMES = {
    **dict.fromkeys(["COMMANDS", "main"], ".parser"),
    **dict.fromkeys(["EXIT_OK", "EXIT_ERROR", "EXIT_USAGE", "UsageError"], ".status"),
    **dict.fromkeys(["LARGE_ERROR", "MOMENTS"], ".output"),
    **dict.fromkeys(["cmd_compress", "cmd_decompress"], ".transfer"),
    **dict.fromkeys(["cmd_info", "cmd_verify"], ".inspect"),
    "cmd_consolidate": ".dcp",
    "cmd_series": ".series",
}
__getattr__, __dir__ = face(__name__, _NAMES)
__all__ = ["main"]
