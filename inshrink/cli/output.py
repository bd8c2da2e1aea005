"""What the commands print: clean text, the one JSON report shape, summaries and warnings.

Text output escapes control characters of tensor names, metadata and paths (they come from
files that may be untrusted); JSON escaping covers ``--json``.
"""
from __future__ import annotations

import json
import math
import sys
import time

LARGE_ERROR = 0.25
"""A quantized weight or embedding with a larger relative L2 error gets a warning. The presets
give trained weights 0.03 (64 levels, balanced) to 0.16 (16 levels, aggressive); beyond 0.25
(8 levels or fewer: --bins 1 gives 1.0) a quarter of the tensor's norm is error."""

MOMENTS = ("exp_avg", "exp_avg_sq")
"""Roles of optimizer moments: quantized in the log domain, where a large relative L2 error is
by design (0.2-0.4 at the balanced preset's 16 levels), so they get no warning and their worst
error is reported apart from the weights'."""


# -- text ------------------------------------------------------------------------------------

def clean(text) -> str:
    """``text`` with control and other non-printing characters escaped (``\\x1b``,
    ``\\n``, ``\\u202e``), so that names from a file cannot drive the terminal."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)


def _escape(ch: str) -> str:
    """One non-printing character as an escape; a byte of a path that is not UTF-8 (Python
    holds it as a lone surrogate, U+DC80-U+DCFF) as that byte, ``\\xff``."""
    if "\udc80" <= ch <= "\udcff":
        return f"\\x{ord(ch) - 0xDC00:02x}"
    return ch.encode("unicode_escape").decode("ascii")


def short(value, limit: int = 60) -> str:
    """A metadata value of any shape as one short, clean line."""
    if not isinstance(value, str):
        try:
            value = json.dumps(value)
        except (TypeError, ValueError, RecursionError):
            value = f"<{type(value).__name__}>"
    value = clean(value)
    return value if len(value) <= limit else value[:limit - 3] + "..."


def number_text(value) -> str:
    """An error statistic as stored: a number, or whatever else the file holds, as text."""
    if value is None:
        return "-"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:.3g}"
    return short(value, 10)


def ratio_text(nbytes: int, stored: int, suffix: str = "") -> str:
    """``nbytes / stored`` to 3 decimals, or ``-`` when nothing is stored (an empty tensor,
    a file without tensors): no ratio, rather than ``inf``."""
    return f"{nbytes / stored:.3f}{suffix}" if stored else "-"


def count(n: int, what: str) -> str:
    """``n`` and ``what``, plural unless ``n`` is 1."""
    return f"{n} {what}{'' if n == 1 else 's'}"


def warn(message: str) -> None:
    print(f"inshrink: warning: {clean(message)}", file=sys.stderr)


# -- reports ---------------------------------------------------------------------------------

def finite(value):
    """``value`` if it is a finite number, else None (JSON has no NaN)."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) else None


def rel_l2(info) -> float | None:
    return finite((info.error or {}).get("rel_l2_error"))


def _tensor_json(info) -> dict:
    return {"name": info.name, "dtype": info.dtype, "shape": list(info.shape),
            "codec": info.codec, "nbytes": info.nbytes, "stored_bytes": info.stored_bytes,
            "ratio": round(info.ratio, 6) if info.stored_bytes else None,
            "role": info.role, "lossy": not info.lossless,
            "error": {k: finite(v) if isinstance(v, float) else v
                      for k, v in info.error.items()} if info.error else None}


def ink_details(path: str) -> dict:
    """What the index of an .ink file says (opens the index only); errors name ``path``."""
    from ..errors import InshrinkError
    from ..io.file import File
    from ..errors import with_path
    try:
        with File(path, threads=1) as f:
            return {"format_version": f.format_version, "metadata": f.metadata,
                    "tensors": f.infos()}
    except InshrinkError as exc:
        raise with_path(exc, path) from None


def version_and_metadata(path: str) -> dict:
    """The format version and metadata of an .ink file, for :func:`file_entry`."""
    details = ink_details(path)
    return {"format_version": details["format_version"], "metadata": details["metadata"]}


def file_entry(path: str, output: str | None, bytes_in: int, bytes_out: int, *,
               tensors=None, copied: bool = False, error: str | None = None,
               format_version: str | None = None, metadata: dict | None = None,
               **extra) -> dict:
    """One entry of a report's ``files`` (``tensors``: TensorInfo objects until printed)."""
    return {"input": path, "output": output, "bytes_in": bytes_in, "bytes_out": bytes_out,
            "copied": copied, "ok": error is None, "error": error,
            "format_version": format_version, "metadata": metadata,
            "tensors": list(tensors or []), **extra}


def build_report(command: str, started: float, inputs: list[str], outputs: list[str],
                 files: list[dict], uncompressed: int | None = None,
                 compressed: int | None = None, problems: list[str] | None = None) -> dict:
    """The one JSON shape of every command (README.md, "Command line"). The ratio is
    ``uncompressed / compressed``: by default the tensors' bytes over the input files'."""
    infos = [t for f in files for t in f["tensors"]]
    if uncompressed is None:
        uncompressed = sum(t.nbytes for t in infos)
    if compressed is None:
        compressed = sum(f["bytes_in"] for f in files)
    lossy = [t for t in infos if not t.lossless]
    errors = [e for e in map(rel_l2, lossy) if e is not None]
    problems = list(problems or []) + [f"{f['input']}: {f['error']}" for f in files
                                        if f["error"]]
    return {"command": command, "ok": not problems, "inputs": inputs, "outputs": outputs,
            "bytes_in": sum(f["bytes_in"] for f in files),
            "bytes_out": sum(f["bytes_out"] for f in files),
            "tensor_bytes": sum(t.nbytes for t in infos),
            "ratio": round(uncompressed / compressed, 6) if compressed else None,
            "lossy": bool(lossy), "lossy_tensors": len(lossy),
            "max_rel_l2_error": max(errors) if errors else None,
            "unmeasured_tensors": len(lossy) - len(errors),
            "seconds": round(time.monotonic() - started, 3),
            "files": files, "problems": problems}


def print_json(report: dict) -> None:
    files = [{**f, "tensors": [_tensor_json(t) for t in f["tensors"]]}
             for f in report["files"]]
    print(json.dumps({**report, "files": files}, allow_nan=False))


def all_tensors(report: dict) -> list:
    return [t for f in report["files"] for t in f["tensors"]]


# -- lossy data ------------------------------------------------------------------------------

def lossy_text(infos, tensors: list | None = None) -> str:
    """'; LOSSY: ...' for a summary line, or '' when every tensor is exact.

    ``tensors``: for stored chunks of larger tensors (a sharded checkpoint's), the tensor of
    each of ``infos`` (any hashable key, e.g. its fully-qualified name): tensors and chunks
    are then counted apart."""
    infos = list(infos)
    lossy = [t for t in infos if not t.lossless]
    counted = f"{len(lossy)} of {len(infos)} tensors"
    if tensors is not None:
        whole = set(tensors)
        if len(whole) != len(infos):  # chunks are not tensors: a tensor of 4 shards is one
            lossy_whole = {key for key, t in zip(tensors, infos) if not t.lossless}
            counted = (f"{len(lossy_whole)} of {len(whole)} tensors ({len(lossy)} of "
                       f"{len(infos)} chunks)")
    if not lossy:
        return ""
    model = [e for t in lossy if t.role not in MOMENTS and (e := rel_l2(t)) is not None]
    moments = [e for t in lossy if t.role in MOMENTS and (e := rel_l2(t)) is not None]
    if not moments:
        worst = f"max relative L2 error {max(model):.3g}" if model else "error not recorded"
    else:
        worst = "max relative L2 error: " + ", ".join(
            ([f"weights {max(model):.3g}"] if model else [])
            + [f"optimizer moments {max(moments):.3g}"])
    unmeasured = len(lossy) - len(model) - len(moments)
    if unmeasured and (model or moments):  # the maximum above leaves them out
        worst += f"; not recorded for {unmeasured}"
    return f"; LOSSY: {counted} quantized ({worst})"


def warn_large_errors(report: dict) -> None:
    large = [(e, t.name) for t in all_tensors(report)
             if not t.lossless and t.role not in MOMENTS
             and (e := rel_l2(t)) is not None and e > LARGE_ERROR]
    if large:
        worst, name = max(large)
        warn(f"{len(large)} tensor{'s' if len(large) > 1 else ''} quantized with a relative "
             f"L2 error above {LARGE_ERROR} (worst {worst:.3g}, {name!r}): use more --bins, "
             f"a milder --preset, or --max-rel-l2")
