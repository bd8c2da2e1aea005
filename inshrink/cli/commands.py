"""The ``inshrink`` command line: compress, decompress, info, verify, consolidate, series.

Every command prints a one-line summary (or, with ``--json``, one JSON object of the shape
documented in README.md, "Command line") and exits 0 on success, 1 on an error in the data or
I/O, 2 on a usage error. Text output escapes control characters of tensor names, metadata and
paths (they come from files that may be untrusted); JSON escaping covers ``--json``.
"""
from __future__ import annotations

import argparse
import errno
import json
import math
import os
import re
import sys
import time

from ..atomic import into_proc
from ..encode.policy import MAX_BINS, PRESETS, SMALL_MOMENT, SMALL_TENSOR

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2

LARGE_ERROR = 0.25
"""A quantized weight or embedding with a larger relative L2 error gets a warning. The presets
give trained weights 0.03 (64 levels, balanced) to 0.16 (16 levels, aggressive); beyond 0.25
(8 levels or fewer: --bins 1 gives 1.0) a quarter of the tensor's norm is error."""


class UsageError(Exception):
    """A command-line mistake: reported in one line with exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse whose mistakes are one line, like every other error, instead of the whole
    usage text followed by the message."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {_clean(message)} "
                              f"(see {self.prog} --help)\n")


# -- argument types: bad values exit 2 with the flag's name ---------------------------------

def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _step(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text!r}")
    return value


def _bins(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_BINS:  # 0 levels exist for optimizer moments, not for a model
        raise argparse.ArgumentTypeError(f"must be an integer in [1, {MAX_BINS}], got {text!r}")
    return value


def _level(text: str) -> int:
    from ..codecs.entropy import check_level
    from ..errors import InvalidArgumentError
    try:
        value = int(text)
        check_level(value)
    except (ValueError, InvalidArgumentError):
        from zstandard import MAX_COMPRESSION_LEVEL
        raise argparse.ArgumentTypeError(f"must be a zstd level, an integer in "
                                         f"[{-(1 << 17)}, {MAX_COMPRESSION_LEVEL}], "
                                         f"got {text!r}") from None
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be a fraction in [0, 1), got {text!r}")
    return value


def _path(text: str) -> str:
    if not text:  # e.g. an unset shell variable: never fall back to the default name
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


# -- the parser ------------------------------------------------------------------------------

def _preset_help() -> str:
    """What each preset quantizes, read from the presets themselves."""
    import textwrap

    def fill(text: str, indent: str = "") -> str:
        return textwrap.fill(text, 79, initial_indent=indent, subsequent_indent=indent,
                             break_on_hyphens=False)

    lines = ["presets (--preset NAME; --lossy alone means --preset balanced):"]
    described: dict[tuple, str] = {}
    for name, policy in PRESETS.items():
        roles = policy.roles
        if not any(roles.values()):
            lines.append(f"  {name:<11} nothing quantized: the same as no lossy option")
            continue
        levels = {r: (c.bins if c else "exact") for r, c in roles.items()}
        lines.append(f"  {name:<11} levels: weights {levels.get('weight', 'exact')}, "
                     f"embeddings {levels.get('embedding', 'exact')}, optimizer exp_avg "
                     f"{levels.get('exp_avg', 'exact')}, exp_avg_sq "
                     f"{levels.get('exp_avg_sq', 'exact')}")
        model = (roles.get("weight"), roles.get("embedding"))
        if model in described:
            lines.append(fill(f"= {described[model]} for weights and embeddings: the two give "
                              f"identical files for a model without optimizer state", " " * 14))
        described.setdefault(model, name)
    protect = {c.protect for p in PRESETS.values() for c in p.roles.values() if c}
    lines += ["", fill(
        f"Every quantized tensor keeps its {' / '.join(f'{p:.2%}' for p in sorted(protect))} "
        f"largest values exact. Always exact: integers, bool, fp8, complex, steps; weights "
        f"that are 1-D (biases, norms) or under {SMALL_TENSOR:,} elements; optimizer moments "
        f"under {SMALL_MOMENT:,} elements. Roles come from tensor names: exp_avg (also "
        f"momentum_buffer), exp_avg_sq, embeddings (embed, wte, wpe, lm_head); other "
        f"matrices are weights."),
        fill(f"A weight or embedding quantized with a relative L2 error above {LARGE_ERROR} "
             f"gets a warning on stderr (optimizer moments, quantized in the log domain, have "
             f"large relative errors by design). -f does not replace an existing file with "
             f"lossy data: add --allow-lossy-overwrite.")]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="inshrink", description="Compress deep-learning checkpoints (.safetensors <-> .ink).",
        epilog="Exit status: 0 success, 1 error in the data or I/O, 2 usage error.")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    c = sub.add_parser("compress", help="safetensors file or directory tree -> .ink",
                       epilog=_preset_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("input", help="a .safetensors file, or a directory: every .safetensors file "
                                 "under it (subdirectories too) is compressed, other files copied")
    c.add_argument("-o", "--output", type=_path,
                   help="output path (default: INPUT with .ink, or DIR-ink/)")
    c.add_argument("--level", type=_level, default=None,
                   help="zstd level for every plane (default: fast plane settings)")
    lossy = c.add_argument_group(
        "lossy compression", "quantize weights and optimizer moments (presets below)")
    lossy.add_argument("--lossy", action="store_true", help="quantize with --preset balanced")
    lossy.add_argument("--preset", choices=list(PRESETS),
                       help="a named policy, explained below (lossless: quantize nothing)")
    lossy.add_argument("--bins", type=_bins,
                       help="quantization levels per tensor (k; default 16 when only --prune "
                            "or --protect is given; with --max-rel-l2, the most tried: 256)")
    lossy.add_argument("--prune", type=_fraction, help="fraction of smallest values set to 0")
    lossy.add_argument("--protect", type=_fraction,
                       help="fraction of largest values stored exactly (default 0.0005)")
    lossy.add_argument("--max-rel-l2", "--max-rel-error", dest="max_rel_l2",
                       type=_positive_float,
                       help="per-tensor bound on ||x - x'|| / ||x||: fewest bins meeting it "
                            "(a tensor no count of bins up to --bins meets is stored exactly)")
    _common(c, lossy_output=True)

    d = sub.add_parser("decompress", help=".ink file or directory tree -> safetensors")
    d.add_argument("input", help="an .ink file or a directory of .ink files")
    d.add_argument("-o", "--output", type=_path,
                   help="output path (default: INPUT with .safetensors, or DIR-safetensors/)")
    _common(d, lossy_output=True)

    i = sub.add_parser("info", help="per-tensor table: dtype, shape, codec, ratio, error")
    i.add_argument("input", help="an .ink file, a directory (every .ink file under it), or a "
                                 "sharded torch.distributed.checkpoint directory")
    i.add_argument("--json", action="store_true", help="machine-readable output")

    v = sub.add_parser("verify", help="check structure and every checksum; exit 1 on a problem")
    v.add_argument("input", nargs="+", help=".ink files, directories of .ink files, or sharded "
                                            "torch.distributed.checkpoint directories")
    v.add_argument("--json", action="store_true", help="machine-readable output")
    v.add_argument("--threads", type=_positive_int, default=None,
                   help="threads (default: all cores)")

    co = sub.add_parser("consolidate", help="sharded torch.distributed.checkpoint directory "
                                            "-> one unsharded .safetensors or .ink file")
    co.add_argument("input", help="a checkpoint directory written by inshrink.dcp")
    co.add_argument("-o", "--output", type=_path, required=True,
                    help="OUT.safetensors (tensors only) or OUT.ink (non-tensor items kept)")
    co.add_argument("-f", "--force", action="store_true", help="overwrite an existing output")
    _allow_lossy(co)
    co.add_argument("--threads", type=_positive_int, default=None,
                    help="threads (default: all cores)")
    co.add_argument("-q", "--quiet", action="store_true", help="no summary")
    co.add_argument("--json", action="store_true", help="print a JSON summary")

    ser = sub.add_parser("series", help="checkpoint series: ls, restore, verify, report")
    ser_sub = ser.add_subparsers(dest="series_command", required=True, metavar="ACTION")
    ls = ser_sub.add_parser("ls", help="list the checkpoints of a series")
    ls.add_argument("directory")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    rs = ser_sub.add_parser("restore", help="write one checkpoint as .safetensors or .ink")
    rs.add_argument("directory")
    rs.add_argument("--step", type=_step, default=None, help="step to restore (default: latest)")
    rs.add_argument("-o", "--output", type=_path, required=True,
                    help="OUT.safetensors or OUT.ink")
    rs.add_argument("-f", "--force", action="store_true", help="overwrite an existing output")
    _allow_lossy(rs)
    rs.add_argument("--json", action="store_true", help="machine-readable output")
    sv = ser_sub.add_parser("verify", help="check every checkpoint and every delta chain")
    sv.add_argument("directory")
    sv.add_argument("--json", action="store_true", help="machine-readable output")
    sr = ser_sub.add_parser("report", help="per step: stored size, ratio, the searched "
                                           "configuration and its quality drop; --plot draws it")
    sr.add_argument("directory")
    sr.add_argument("--plot", metavar="OUT.png", type=_path,
                    help="draw the report into a PNG file (needs matplotlib: "
                         "pip install \"inshrink[plot]\")")
    sr.add_argument("-f", "--force", action="store_true", help="overwrite an existing OUT.png")
    sr.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def _allow_lossy(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-lossy-overwrite", action="store_true",
                   help="with -f, allow replacing an existing output with lossy (quantized) "
                        "data; -f alone refuses, so that an original is not lost by mistake")


def _common(p: argparse.ArgumentParser, lossy_output: bool = False) -> None:
    p.add_argument("-f", "--force", action="store_true", help="overwrite an existing output")
    if lossy_output:
        _allow_lossy(p)
    p.add_argument("--follow-symlinks", action="store_true",
                   help="in a directory, store the content of symbolic links that point "
                        "outside it (e.g. a Hugging Face cache snapshot); refused otherwise")
    p.add_argument("--threads", type=_positive_int, default=None,
                   help="threads (default: all cores)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")
    p.add_argument("--json", action="store_true", help="print a JSON summary")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("inshrink")
    except PackageNotFoundError:
        return "unknown"


# -- text output -----------------------------------------------------------------------------

def _clean(text) -> str:
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


def _short(value, limit: int = 60) -> str:
    """A metadata value of any shape as one short, clean line."""
    if not isinstance(value, str):
        try:
            value = json.dumps(value)
        except (TypeError, ValueError, RecursionError):
            value = f"<{type(value).__name__}>"
    value = _clean(value)
    return value if len(value) <= limit else value[:limit - 3] + "..."


def _num(value) -> str:
    """An error statistic as stored: a number, or whatever else the file holds, as text."""
    if value is None:
        return "-"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:.3g}"
    return _short(value, 10)


def _ratio(nbytes: int, stored: int, suffix: str = "") -> str:
    """``nbytes / stored`` to 3 decimals, or ``-`` when nothing is stored (an empty tensor,
    a file without tensors): no ratio, rather than ``inf``."""
    return f"{nbytes / stored:.3f}{suffix}" if stored else "-"


def _warn(message: str) -> None:
    print(f"inshrink: warning: {_clean(message)}", file=sys.stderr)


# -- paths -----------------------------------------------------------------------------------

def _default_output(src: str, is_dir: bool, old: str, new: str, dir_suffix: str) -> str:
    src = src.rstrip("/\\") or src
    if is_dir:
        return src + dir_suffix
    return (src[:-len(old)] if src.endswith(old) else src) + new


def _special(path: str) -> bool:
    """Whether ``path`` exists and is neither a regular file nor a directory (a FIFO, a
    device, a socket): reading a FIFO waits forever, and renaming a new file over a device
    such as /dev/null replaces the device."""
    return os.path.exists(path) and not (os.path.isfile(path) or os.path.isdir(path))


def _check_input(src: str) -> None:
    if not os.path.exists(src):
        raise UsageError(f"{src}: no such file or directory")
    if _special(src):
        raise UsageError(f"{src} is not a regular file (a device, FIFO or socket)")


def _same_file(src: str, dst: str) -> bool:
    """Whether ``dst`` is ``src``, also through a link or another spelling of its path."""
    if os.path.abspath(src) == os.path.abspath(dst):
        return True
    try:
        return os.path.samefile(src, dst)
    except OSError:  # one of them does not exist
        return False


def _check_output(src: str, dst: str, force: bool, inside: str | None = None) -> None:
    """Refuse an output that would replace the input or, with ``inside`` (the directory of
    a series or checkpoint that the command reads), one that would be written into it."""
    if _same_file(src, dst):
        raise UsageError(f"{dst}: the output would overwrite the input {src}")
    if _special(dst) or into_proc(dst):
        raise UsageError(f"{dst} is not a regular file (a device, FIFO, socket or "
                         f"/dev/stdout): the output is written whole and renamed into place, "
                         f"which would replace it")
    if (os.path.isdir(dst) or dst.endswith(("/", os.sep))) and not os.path.isdir(src):
        raise UsageError(f"{dst} is a directory; give a file name with -o")
    if inside is not None and os.path.isdir(inside):
        parent = os.path.realpath(os.path.dirname(os.path.abspath(dst)))
        if os.path.commonpath([parent, os.path.realpath(inside)]) == os.path.realpath(inside):
            raise UsageError(f"{dst}: the output would be written inside the input "
                             f"directory {inside}; give a path outside it with -o")
    if os.path.exists(dst) and not force:
        raise UsageError(f"{dst} exists (use --force to overwrite)")


def _check_lossy_overwrite(args, dst: str, lossy: bool) -> None:
    if lossy and os.path.exists(dst) and not args.allow_lossy_overwrite:
        raise UsageError(f"{dst} exists and the new data is lossy (quantized): -f alone "
                         f"does not replace a file with approximate values; add "
                         f"--allow-lossy-overwrite, or write elsewhere with -o")


def _files_in(target: str, suffix: str) -> list[str]:
    """``target`` itself, or the ``suffix`` files under a directory (none: a usage error)."""
    from ..safetensors import tensor_files
    _check_input(target)
    if not os.path.isdir(target):
        return [target]
    found = tensor_files(target, suffix)
    if not found:
        raise UsageError(f"{target} holds no {suffix} files (subdirectories included)")
    return found


_TEMPORARY = re.compile(r"^\.(.+)\.(?:old\.)?[A-Za-z0-9_]{8}(?:\.tmp)?$")


def _user_path(path, destination: str | None):
    """``path`` as the user knows it: a hidden temporary file or directory that inshrink
    writes beside ``destination`` (``.m.ink.k2x9a7qz.tmp``) is named as what it becomes."""
    if not destination or not isinstance(path, str):
        return path
    shown = os.sep.join(m.group(1) if (m := _TEMPORARY.match(part)) else part
                        for part in path.split(os.sep))
    target = os.path.abspath(destination)
    absolute = os.path.abspath(shown)
    if absolute == target or absolute.startswith(target + os.sep):
        return os.path.join(destination, os.path.relpath(absolute, target)) \
            if absolute != target else destination
    return path


_WRITE_ERRORS = {errno.ENOSPC, errno.EFBIG, errno.EROFS, getattr(errno, "EDQUOT", errno.ENOSPC)}


def _os_error_message(exc: OSError, args) -> str:
    """One line naming the user's path: never a temporary name, never a bare errno."""
    destination = getattr(args, "destination", None)
    reason = exc.strerror or str(exc)
    path = _user_path(exc.filename, destination)
    if path is None:  # e.g. a write into an open file: a full disk names the destination
        path = destination if exc.errno in _WRITE_ERRORS and destination else \
            getattr(args, "source", None) or destination
        return f"{path}: {reason}" if path else reason
    second = _user_path(exc.filename2, destination)
    if second is not None and second != path:
        return f"{path} -> {second}: {reason}"
    return f"{path}: {reason}"


# -- reports ---------------------------------------------------------------------------------

def _finite(value):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) else None


def _rel_l2(info) -> float | None:
    return _finite((info.error or {}).get("rel_l2_error"))


def _tensor_json(info) -> dict:
    return {"name": info.name, "dtype": info.dtype, "shape": list(info.shape),
            "codec": info.codec, "nbytes": info.nbytes, "stored_bytes": info.stored_bytes,
            "ratio": round(info.ratio, 6) if info.stored_bytes else None,
            "role": info.role, "lossy": not info.lossless,
            "error": {k: _finite(v) if isinstance(v, float) else v
                      for k, v in info.error.items()} if info.error else None}


def _ink_details(path: str) -> dict:
    """What the index of an .ink file says (opens the index only); errors name ``path``."""
    from ..errors import with_path
    from ..errors import InshrinkError
    from ..io.tensorfile import File
    try:
        with File(path, threads=1) as f:
            return {"format_version": f.format_version, "metadata": f.metadata,
                    "tensors": f.infos()}
    except InshrinkError as exc:
        raise with_path(exc, path) from None


def _file(path: str, output: str | None, bytes_in: int, bytes_out: int, *,
          tensors=None, copied: bool = False, error: str | None = None,
          format_version: str | None = None, metadata: dict | None = None, **extra) -> dict:
    """One entry of a report's ``files`` (``tensors``: TensorInfo objects until printed)."""
    return {"input": path, "output": output, "bytes_in": bytes_in, "bytes_out": bytes_out,
            "copied": copied, "ok": error is None, "error": error,
            "format_version": format_version, "metadata": metadata,
            "tensors": list(tensors or []), **extra}


def _report(command: str, started: float, inputs: list[str], outputs: list[str],
            files: list[dict], uncompressed: int | None = None, compressed: int | None = None,
            problems: list[str] | None = None) -> dict:
    """The one JSON shape of every command (README.md, "Command line"). The ratio is
    ``uncompressed / compressed``: by default the tensors' bytes over the input files'."""
    infos = [t for f in files for t in f["tensors"]]
    if uncompressed is None:
        uncompressed = sum(t.nbytes for t in infos)
    if compressed is None:
        compressed = sum(f["bytes_in"] for f in files)
    lossy = [t for t in infos if not t.lossless]
    errors = [e for e in map(_rel_l2, lossy) if e is not None]
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


def _print_json(report: dict) -> None:
    files = [{**f, "tensors": [_tensor_json(t) for t in f["tensors"]]}
             for f in report["files"]]
    print(json.dumps({**report, "files": files}, allow_nan=False))


MOMENTS = ("exp_avg", "exp_avg_sq")
"""Roles of optimizer moments: quantized in the log domain, where a large relative L2 error is
by design (0.2-0.4 at the balanced preset's 16 levels), so they get no warning and their worst
error is reported apart from the weights'."""


def _lossy_text(infos) -> str:
    """'; LOSSY: ...' for a summary line, or '' when every tensor is exact."""
    infos = list(infos)
    lossy = [t for t in infos if not t.lossless]
    if not lossy:
        return ""
    model = [e for t in lossy if t.role not in MOMENTS and (e := _rel_l2(t)) is not None]
    moments = [e for t in lossy if t.role in MOMENTS and (e := _rel_l2(t)) is not None]
    if not moments:
        worst = f"max relative L2 error {max(model):.3g}" if model else "error not recorded"
    else:
        worst = "max relative L2 error: " + ", ".join(
            ([f"weights {max(model):.3g}"] if model else [])
            + [f"optimizer moments {max(moments):.3g}"])
    unmeasured = len(lossy) - len(model) - len(moments)
    if unmeasured and (model or moments):  # the maximum above leaves them out
        worst += f"; not recorded for {unmeasured}"
    return f"; LOSSY: {len(lossy)} of {len(infos)} tensors quantized ({worst})"


def _all_tensors(report: dict) -> list:
    return [t for f in report["files"] for t in f["tensors"]]


def _warn_large_errors(report: dict) -> None:
    large = [(e, t.name) for t in _all_tensors(report)
             if not t.lossless and t.role not in MOMENTS
             and (e := _rel_l2(t)) is not None and e > LARGE_ERROR]
    if large:
        worst, name = max(large)
        _warn(f"{len(large)} tensor{'s' if len(large) > 1 else ''} quantized with a relative "
              f"L2 error above {LARGE_ERROR} (worst {worst:.3g}, {name!r}): use more --bins, "
              f"a milder --preset, or --max-rel-l2")


def _transfer_summary(args, report: dict, src: str, dst: str) -> None:
    if args.json:
        _print_json(report)
        return
    if args.quiet:
        return
    ratio = f" ({report['ratio']:.3f}x)" if report["ratio"] else ""
    converted = [f for f in report["files"] if not f["copied"]]
    copied = len(report["files"]) - len(converted)
    what = "" if len(report["files"]) == 1 and not os.path.isdir(src) else (
        f" {len(converted)} files converted, {copied} copied;")
    print(_clean(f"{src} -> {dst}:{what} {report['bytes_in']:,} -> "
                 f"{report['bytes_out']:,} bytes{ratio}{_lossy_text(_all_tensors(report))}"))


# -- commands --------------------------------------------------------------------------------

def _source_and_destination(args, in_ext: str, out_ext: str, dir_suffix: str):
    """The input's files, whether it is a directory, and the checked output path."""
    src = args.source = args.input
    sources = _files_in(src, in_ext)
    is_dir = os.path.isdir(src)
    dst = args.destination = args.output if args.output is not None else _default_output(
        src, is_dir, in_ext, out_ext, dir_suffix)
    if not is_dir and dst.lower().endswith(in_ext):  # the other format's name: a mix-up
        raise UsageError(f"{dst}: {args.command} writes {'an' if out_ext == '.ink' else 'a'} "
                         f"{out_ext} file; give an output name that does not end in {in_ext}")
    _check_output(src, dst, args.force, inside=src if is_dir else None)
    return src, sources, is_dir, dst


def cmd_compress(args, started: float) -> int:
    from .. import safetensors as convert
    from ..errors import InshrinkError
    from ..progress import ProgressBar
    src, sources, is_dir, dst = _source_and_destination(args, ".safetensors", ".ink", "-ink")
    policy = _policy(args)
    _check_lossy_overwrite(args, dst, policy not in (None, "lossless"))
    bar = args.bar = ProgressBar(sum(os.path.getsize(s) for s in sources), "compress",
                                 sys.stderr.isatty() and not args.quiet)
    kwargs = dict(level=args.level, threads=args.threads, progress=bar, policy=policy)
    if is_dir:
        done = convert.compress_directory(src, dst, overwrite=args.force,
                                          follow_symlinks=args.follow_symlinks, **kwargs)
        files = [_converted(os.path.join(src, r.source), os.path.join(dst, r.output), r,
                            os.path.join(dst, r.output)) for r in done]
    else:
        try:
            tensors = convert.compress_safetensors(src, dst, **kwargs)
        except InshrinkError as exc:
            raise convert.with_path(exc, src) from None
        files = [_file(src, dst, os.path.getsize(src), os.path.getsize(dst), tensors=tensors,
                       **_version_and_metadata(dst))]
    bar.finish()
    _notice_links(args, done if is_dir else [])
    converted = [f for f in files if not f["copied"]]
    report = _report("compress", started, [src], [dst], files,
                     sum(f["bytes_in"] for f in converted), sum(f["bytes_out"] for f in converted))
    _transfer_summary(args, report, src, dst)
    _warn_large_errors(report)
    return EXIT_OK


def _version_and_metadata(path: str) -> dict:
    details = _ink_details(path)
    return {"format_version": details["format_version"], "metadata": details["metadata"]}


def _converted(path: str, output: str, r, ink: str) -> dict:
    """A file entry from a directory conversion's FileReport (``ink``: its .ink side)."""
    if r.copied:
        return _file(path, output, r.bytes_in, r.bytes_out, copied=True)
    return _file(path, output, r.bytes_in, r.bytes_out, tensors=r.tensors,
                 **_version_and_metadata(ink))


def _notice_links(args, reports) -> None:
    for r in reports:
        if r.link_target is not None:
            print(_clean(f"inshrink: note: {os.path.join(args.input, r.source)} is a link to "
                         f"{r.link_target}, outside {args.input}: its content was stored"),
                  file=sys.stderr)


def _policy(args):
    """The policy the lossy options describe (None: lossless)."""
    from ..errors import InvalidArgumentError
    from ..encode.policy import Policy, QuantConfig
    explicit = {k: getattr(args, k) for k in ("bins", "prune", "protect", "max_rel_l2")
                if getattr(args, k) is not None}
    if explicit and args.preset:
        raise UsageError("use either --preset or --bins/--prune/--protect/--max-rel-l2")
    if args.lossy and args.preset == "lossless":
        raise UsageError("--lossy and --preset lossless contradict each other: give one")
    if explicit:
        if "max_rel_l2" in explicit and "bins" not in explicit:
            explicit["bins"] = 256  # the bound picks the fewest bins up to this
        try:
            return Policy.uniform(QuantConfig(**explicit))
        except InvalidArgumentError as exc:  # a combination, e.g. --prune + --protect >= 1
            raise UsageError(str(exc).replace("prune + protect", "--prune + --protect")
                             ) from None
    if args.preset:
        return args.preset
    return "balanced" if args.lossy else None


def cmd_decompress(args, started: float) -> int:
    from .. import safetensors as convert
    from ..errors import InshrinkError
    from ..progress import ProgressBar
    if _is_series(args.input):
        raise UsageError(f"{args.input} is a checkpoint series: restore one step with "
                         f"inshrink series restore {args.input} --step N -o OUT")
    if _is_dcp_series(args.input):
        step = os.path.join(args.input, "step_<12 digits>")
        raise UsageError(f"{args.input} is a series of sharded checkpoints: join one step "
                         f"with inshrink consolidate {step} -o OUT")
    src, sources, is_dir, dst = _source_and_destination(args, ".ink", ".safetensors",
                                                        "-safetensors")
    indexes = {}
    for path in sources:
        convert.check_ink(path)
        indexes[path] = _standalone_infos(path)
    _check_lossy_overwrite(args, dst, any(not t.lossless for infos in indexes.values()
                                          for t in infos))
    bar = args.bar = ProgressBar(sum(t.nbytes for infos in indexes.values() for t in infos),
                                 "decompress", sys.stderr.isatty() and not args.quiet)
    kwargs = dict(threads=args.threads, progress=bar)
    if is_dir:
        done = convert.decompress_directory(src, dst, overwrite=args.force,
                                            follow_symlinks=args.follow_symlinks, **kwargs)
        files = [_converted(os.path.join(src, r.source), os.path.join(dst, r.output), r,
                            os.path.join(src, r.source)) for r in done]
    else:
        try:
            tensors = convert.decompress_to_safetensors(src, dst, **kwargs)
        except InshrinkError as exc:
            raise convert.with_path(exc, src) from None
        files = [_file(src, dst, os.path.getsize(src), os.path.getsize(dst), tensors=tensors,
                       **_version_and_metadata(src))]
    bar.finish()
    _notice_links(args, done if is_dir else [])
    converted = [f for f in files if not f["copied"]]
    report = _report("decompress", started, [src], [dst], files,
                     sum(f["bytes_out"] for f in converted), sum(f["bytes_in"] for f in converted))
    _transfer_summary(args, report, src, dst)
    return EXIT_OK


def _is_series(path: str) -> bool:
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


def _standalone_infos(path: str) -> list:
    """The tensors of an .ink file that decodes on its own (opens the index only). A delta
    file of a series decodes only against its base: the error points to the command that
    reads it."""
    from ..errors import with_path
    from ..errors import InshrinkError
    from ..io.tensorfile import File
    try:
        with File(path, threads=1) as f:
            base, infos = f.base, f.infos()
    except InshrinkError as exc:
        raise with_path(exc, path) from None
    if base is not None:
        directory = os.path.dirname(path) or "."
        against = f" against {base.get('file')}" if isinstance(base, dict) else ""
        how = (f"join its step with inshrink consolidate {directory} -o OUT"
               if _is_dcp(directory) else
               f"restore its step with inshrink series restore {directory} --step N -o OUT")
        raise UsageError(f"{path} is a delta{against} in a checkpoint series: {how}")
    return infos


def cmd_info(args, started: float) -> int:
    from ..safetensors import check_ink
    args.source = args.input
    if _is_dcp_series(args.input):
        return _dcp_series_info(args, started)
    if _is_dcp(args.input):
        return _dcp_info(args, started)
    paths = _files_in(args.input, ".ink")
    files = []
    for path in paths:
        check_ink(path)
        details = _ink_details(path)
        files.append(_file(path, None, os.path.getsize(path), 0, **details))
    report = _report("info", started, [args.input], [], files)
    if args.json:
        _print_json(report)
        return EXIT_OK
    for n, f in enumerate(files):
        if len(files) > 1:
            print(("\n" if n else "") + _clean(f"{f['input']}:"))
        _print_table(f)
    if len(files) > 1:
        ratio = f" ({report['ratio']:.3f}x)" if report["ratio"] else ""
        print(f"\n{len(files)} files, {report['tensor_bytes']:,} tensor bytes in "
              f"{report['bytes_in']:,} file bytes{ratio}{_lossy_text(_all_tensors(report))}")
    return EXIT_OK


def _print_table(f: dict) -> None:
    infos = f["tensors"]
    names = [_clean(i.name) for i in infos]
    width = max([len(n) for n in names] + [4])
    lossy = any(i.error for i in infos)
    extra = f" {'role':<10} {'rel L2 err':>10} {'max |err|':>10}" if lossy else ""
    print(f"{'name':<{width}}  {'dtype':<8} {'shape':<20} {'codec':<16} "
          f"{'bytes':>14} {'stored':>14} {'ratio':>8}{extra}")
    for name, i in zip(names, infos):
        row = (f"{name:<{width}}  {i.dtype:<8} {str(list(i.shape)):<20} "
               f"{_clean(i.codec):<16} {i.nbytes:>14,} {i.stored_bytes:>14,} "
               f"{_ratio(i.nbytes, i.stored_bytes):>8}")
        if lossy:
            err = i.error or {}
            row += (f" {_clean(i.role or '-'):<10} {_num(err.get('rel_l2_error')):>10} "
                    f"{_num(err.get('max_abs_error')):>10}")
        print(row)
    total = sum(i.nbytes for i in infos)
    stored = sum(i.stored_bytes for i in infos)
    print(f"{len(infos)} tensors, {total:,} bytes -> {stored:,} stored "
          f"({_ratio(total, stored, 'x')}); "
          f"file {f['bytes_in']:,} bytes; metadata keys: {len(f['metadata'])}; "
          f"format {f['format_version']}{_lossy_text(infos)}")
    line = _search_line(f["metadata"])
    if line:
        print(line)


def _search_line(metadata: dict) -> str | None:
    """One line on the configuration search that chose this checkpoint's policy, if any.

    The report is metadata any writer may set: an unexpected shape is shown as raw text."""
    from ..series.series import SEARCH_KEY
    raw = metadata.get(SEARCH_KEY)
    if raw is None:
        return None
    try:
        report = json.loads(raw)
    except (ValueError, RecursionError):
        report = None
    if not isinstance(report, dict):
        return f"search: unrecognised report {_short(raw)}"
    chosen = report.get("chosen")
    if chosen is None:
        what = "lossless weights"
    elif isinstance(chosen, dict):
        what = ", ".join(f"{_short(k, 30)}={_short(v, 30)}" for k, v in chosen.items())
    else:
        what = _short(chosen)
    return (f"search: {_short(report.get('mode'), 30)}, epsilon "
            f"{_short(report.get('epsilon'), 30)}, {_short(report.get('evaluations_used', 0), 30)}"
            f" evaluations -> {what}")


def cmd_verify(args, started: float) -> int:
    from ..safetensors import check_ink
    from ..errors import InshrinkError
    from ..io.tensorfile import File
    paths = [p for target in args.input
             for p in ([target] if _is_dcp(target) or _is_dcp_series(target)
                       else _files_in(target, ".ink"))]
    args.source = args.input[0]
    files = []
    problems = []
    for path in paths:
        if _is_dcp_series(path):
            found, entries = _dcp_series_verify(path)
            problems += found
            files += entries
            continue
        if _is_dcp(path):
            files += _dcp_verify(path, args)
            continue
        try:
            check_ink(path)
            with File(path, threads=args.threads, mmap=False) as f:
                f.verify()
                files.append(_file(path, None, os.path.getsize(path), 0,
                                   format_version=f.format_version, metadata=f.metadata,
                                   tensors=f.infos()))
        except (InshrinkError, OSError) as exc:
            message = _os_error_message(exc, args) if isinstance(exc, OSError) else str(exc)
            files.append(_file(path, None, _size(path), 0,
                               error=f"{type(exc).__name__}: {message}"))
    report = _report("verify", started, list(args.input), [], files,
                     problems=problems)
    if args.json:
        _print_json(report)
    else:
        shown = set()
        for problem in problems:
            print(_clean(f"FAIL  {problem}"))
        for f in files:
            checkpoint = f.get("checkpoint")
            if f.get("series") is not None:
                if f["series"] not in shown and not problems:
                    shown.add(f["series"])
                    mine = [g for g in files if g.get("series") == f["series"]]
                    print(_clean(f"OK    {f['series']} (DCP series: "
                                 f"{_count(len({g['step'] for g in mine}), 'step')}, "
                                 f"{_count(len(mine), 'rank file')})"))
            elif checkpoint is None:
                print(_clean(f"OK    {f['input']} ({len(f['tensors'])} tensors)" if f["ok"]
                             else f"FAIL  {f['input']}: {f['error']}"))
            elif checkpoint not in shown:  # a verified checkpoint: one line for its files
                shown.add(checkpoint)
                mine = [g for g in files if g.get("checkpoint") == checkpoint]
                print(_clean(f"OK    {checkpoint} (DCP checkpoint: "
                             f"{_count(len(mine), 'rank file')}, "
                             f"{sum(len(g['tensors']) for g in mine)} chunks)"))
    return EXIT_OK if report["ok"] else EXIT_ERROR


# -- sharded torch.distributed.checkpoint directories (inshrink.dcp) -------------------------
# Recognised here by name, so that only the commands that read one import torch.

DCP_METADATA = ".metadata"
_DCP_RANK_FILE = re.compile(r"\.?rank(\d{5})-[0-9a-f]{12}(?:\.d)?\.ink(?:\..*\.tmp)?")
DCP_SERIES_MANIFEST = "series.json"
_DCP_SERIES_STEP = re.compile(r"step_(\d{12})")


def _is_dcp_series(path: str) -> bool:
    """A directory of an inshrink.dcp_series series (its manifest, ``series.json``)."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, DCP_SERIES_MANIFEST))


def _dcp_series_step(path: str, threads: int | None = 1):
    """(InkSeries, step) when ``path`` is a step directory of a DCP series, else None."""
    parent, name = os.path.split(os.path.normpath(path))
    match = _DCP_SERIES_STEP.fullmatch(name)
    if match is None or not _is_dcp_series(parent or "."):
        return None
    from ..dcp.series import InkSeries
    return InkSeries(parent or ".", threads=threads), int(match.group(1))


def _is_dcp(path: str) -> bool:
    """A directory holding DCP's ``.metadata`` or an inshrink.dcp rank file (committed or
    not: one without ``.metadata`` is then reported as an incomplete checkpoint)."""
    if not os.path.isdir(path):
        return False
    try:
        names = os.listdir(path)
    except OSError:
        return False
    return DCP_METADATA in names or any(_DCP_RANK_FILE.fullmatch(n) for n in names)


def _dcp_call(path: str, call):
    """``call()``, an unfinished save's error saying so first."""
    from ..errors import IncompleteCheckpointError
    try:
        return call()
    except IncompleteCheckpointError as exc:
        raise IncompleteCheckpointError(f"incomplete checkpoint: {exc}") from None


def _dcp_details(path: str, threads: int | None = None, verify: bool = False):
    """(metadata, chunk rows, {rank file: TensorInfo list}) of a committed checkpoint,
    checked against each file's index (decoded in full with ``verify``)."""
    from ..dcp import storage as dcp
    from ..io.tensorfile import File
    in_series = _dcp_series_step(path, threads)
    if in_series is not None:  # an older step's files are deltas: read through the series
        series, step = in_series
        rows = series.describe(step)
        if verify:
            for file in series.entry(step).files:
                series.decode(step, file.rank)
        metadata = dcp._read_metadata(path)
    else:
        rows = _dcp_call(path, lambda: (dcp.verify(path, threads=threads) if verify
                                        else dcp.describe(path)))
        metadata = dcp.read_metadata(path)
    infos = {}
    for name in sorted({r["file"] for r in rows}):
        with File(os.path.join(path, name), threads=1) as f:
            infos[name] = f.infos()
    return metadata, rows, infos


def _dcp_files(path: str, infos: dict) -> list[dict]:
    """One report entry per rank file, with its rank."""
    files = []
    for name, tensors in infos.items():
        full = os.path.join(path, name)
        files.append(_file(full, None, _size(full), 0, tensors=tensors,
                           rank=int(_DCP_RANK_FILE.fullmatch(name).group(1)),
                           checkpoint=path, **_version_and_metadata(full)))
    return files


def _dcp_info(args, started: float) -> int:
    path = args.input
    metadata, rows, infos = _dcp_details(path)
    files = _dcp_files(path, infos)
    report = _report("info", started, [path], [], files)
    if args.json:
        _print_json(report)
        return EXIT_OK
    print(_clean(f"{path}: torch.distributed.checkpoint, {_count(len(files), 'rank file')}, "
                 f"{report['bytes_in']:,} bytes"))
    width = max([len(_clean(os.path.basename(f["input"]))) for f in files] + [4])
    print(f"{'rank':>5}  {'file':<{width}}  {'bytes':>14} {'chunks':>7}")
    for f in files:
        print(_clean(f"{f['rank']:>5}  {os.path.basename(f['input']):<{width}}  "
                     f"{f['bytes_in']:>14,} {len(f['tensors']):>7}"))
    print()
    _print_dcp_tensors(metadata, rows)
    infos_all = _all_tensors(report)
    ratio = f" ({report['ratio']:.3f}x)" if report["ratio"] else ""
    print(f"{len(metadata.state_dict_metadata)} items in {len(rows)} chunks, "
          f"{report['tensor_bytes']:,} bytes -> {report['bytes_in']:,} file bytes"
          f"{ratio}{_lossy_text(infos_all)}")
    return EXIT_OK


def _print_dcp_tensors(metadata, rows: list[dict]) -> None:
    """One line per fully-qualified name: its whole shape, its chunks' bytes, ratio and worst
    error (a relative error per chunk: the whole tensor's lies between their extremes)."""
    by_fqn: dict[str, list[dict]] = {}
    for row in rows:
        by_fqn.setdefault(row["fqn"], []).append(row)
    names = {fqn: _clean(fqn) for fqn in by_fqn}
    width = max([len(n) for n in names.values()] + [4])
    lossy = any(r["error"] for r in rows)
    extra = f" {'role':<10} {'rel L2 err':>10} {'max |err|':>10}" if lossy else ""
    print(f"{'name':<{width}}  {'dtype':<8} {'shape':<20} {'chunks':>6} {'codec':<16} "
          f"{'bytes':>14} {'stored':>14} {'ratio':>8}{extra}")
    for fqn, chunks in by_fqn.items():
        item = metadata.state_dict_metadata[fqn]
        shape = str(list(item.size)) if hasattr(item, "size") else "(bytes)"
        nbytes = sum(r["nbytes"] for r in chunks)
        stored = sum(r["stored_bytes"] for r in chunks)
        codecs = sorted({r["codec"] for r in chunks})
        dtype = chunks[0]["dtype"] if hasattr(item, "size") else "bytes"
        line = (f"{names[fqn]:<{width}}  {dtype:<8} {shape:<20} {len(chunks):>6} "
                f"{_clean(codecs[0] if len(codecs) == 1 else 'mixed'):<16} {nbytes:>14,} "
                f"{stored:>14,} {_ratio(nbytes, stored):>8}")
        if lossy:
            errors = [r["error"] or {} for r in chunks]
            role = chunks[0]["role"]

            def worst(key):
                values = [e.get(key) for e in errors if _finite(e.get(key)) is not None]
                return max(values) if values else None
            line += (f" {_clean(role or '-'):<10} {_num(worst('rel_l2_error')):>10} "
                     f"{_num(worst('max_abs_error')):>10}")
        print(line)


def _dcp_verify(path: str, args) -> list[dict]:
    """verify's entries for one checkpoint: one per rank file, or one naming the problem."""
    from ..errors import InshrinkError
    try:
        _, _, infos = _dcp_details(path, threads=args.threads, verify=True)
    except (InshrinkError, OSError) as exc:
        message = _os_error_message(exc, args) if isinstance(exc, OSError) else str(exc)
        return [_file(path, None, sum(_size(os.path.join(path, n)) for n in _listdir(path)), 0,
                      error=f"{type(exc).__name__}: {message}")]
    return _dcp_files(path, infos)


def _dcp_series_files(path: str):
    """(InkSeries, one report entry per rank file of every step, each with its step, rank
    and base step), from each file's index."""
    from ..dcp.series import InkSeries
    series = InkSeries(path, threads=1)
    files = []
    for entry in series.checkpoints():
        for file in entry.files:
            full = os.path.join(path, entry.dir, file.file)
            files.append(_file(full, None, file.bytes, 0, step=entry.step, rank=file.rank,
                               world_size=entry.world_size, base=entry.base, series=path,
                               **_ink_details(full)))
    return series, files


def _dcp_series_info(args, started: float) -> int:
    path = args.input
    _, files = _dcp_series_files(path)
    report = _report("info", started, [path], [], files)
    if args.json:
        _print_json(report)
        return EXIT_OK
    steps: dict[int, list[dict]] = {}
    for f in files:
        steps.setdefault(f["step"], []).append(f)
    print(_clean(f"{path}: series of DCP checkpoints, {_count(len(steps), 'step')}, "
                 f"{report['bytes_in']:,} bytes"))
    print(f"{'step':>12}  {'ranks':>5}  {'kind':<16} {'bytes':>14} {'ratio':>8}")
    for step, mine in steps.items():
        base = mine[0]["base"]
        nbytes = sum(t.nbytes for f in mine for t in f["tensors"])
        stored = sum(f["bytes_in"] for f in mine)
        kind = "whole" if base is None else f"delta -> {base}"
        print(f"{step:>12}  {mine[0]['world_size']:>5}  {kind:<16} {stored:>14,} "
              f"{_ratio(nbytes, stored):>8}")
    ratio = f" ({report['ratio']:.3f}x)" if report["ratio"] else ""
    print(f"{report['tensor_bytes']:,} tensor bytes in {report['bytes_in']:,} file bytes"
          f"{ratio}{_lossy_text(_all_tensors(report))}")
    return EXIT_OK


def _dcp_series_verify(path: str) -> tuple[list[str], list[dict]]:
    """verify's problems and entries for a DCP series: every step restored through its
    chain, every file checked against the manifest."""
    from ..dcp.series import InkSeries
    from ..errors import InshrinkError
    try:
        problems = InkSeries(path, threads=1).verify()
        if problems:
            return [f"{path}: {p}" for p in problems], []
        return [], _dcp_series_files(path)[1]
    except (InshrinkError, OSError) as exc:
        return [f"{path}: {type(exc).__name__}: {exc}"], []


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def cmd_consolidate(args, started: float) -> int:
    src = args.source = args.input
    dst = args.destination = args.output
    _check_input(src)
    if _is_dcp_series(src):
        raise UsageError(f"{src} is a series of sharded checkpoints: consolidate one of its "
                         f"steps (inshrink info {src} lists them), e.g. "
                         f"{os.path.join(src, 'step_<12 digits>')}")
    if not _is_dcp(src):
        raise UsageError(f"{src}: not a sharded checkpoint directory (no {DCP_METADATA} and "
                         f"no rank files)")
    if not dst.endswith((".safetensors", ".ink")):
        raise UsageError(f"{dst}: the output must end with .safetensors or .ink (its format)")
    # a step of a series: the other steps' files are the series' too
    parent, name = os.path.split(os.path.normpath(src))
    in_series = _DCP_SERIES_STEP.fullmatch(name) and _is_dcp_series(parent or ".")
    _check_output(src, dst, args.force, inside=(parent or ".") if in_series else src)
    from ..dcp import storage as dcp
    _, rows, infos = _dcp_details(src)
    source = _dcp_files(src, infos)
    chunks = [t for f in source for t in f["tensors"]]
    _check_lossy_overwrite(args, dst, any(not t.lossless for t in chunks))
    in_series = _dcp_series_step(src, args.threads)
    if in_series is not None:  # an older step's files are deltas: read through the series
        in_series[0].consolidate(in_series[1], dst)
    else:
        _dcp_call(src, lambda: dcp.consolidate(src, dst, threads=args.threads))
    written = _ink_details(dst) if dst.endswith(".ink") else {}
    # the source's chunks are what the report describes: a lossy checkpoint stays reported
    # as lossy, with its measured error, though the joined file stores its values exactly
    files = [_file(src, dst, sum(f["bytes_in"] for f in source), os.path.getsize(dst),
                   tensors=chunks, format_version=written.get("format_version"),
                   metadata=written.get("metadata"))]
    report = _report("consolidate", started, [src], [dst], files,
                     sum(t.nbytes for t in chunks), files[0]["bytes_in"])
    if args.json:
        _print_json(report)
    elif not args.quiet:
        print(_clean(f"{src} -> {dst}: {_count(len(source), 'rank file')}, {len(rows)} chunks, "
                     f"{files[0]['bytes_in']:,} -> {files[0]['bytes_out']:,} bytes"
                     f"{_lossy_text(chunks)}"))
    return EXIT_OK


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def cmd_series(args, started: float) -> int:
    from ..series.series import MANIFEST, Series
    args.source = args.directory
    _check_input(args.directory)
    if _is_dcp_series(args.directory):
        raise UsageError(f"{args.directory} is a series of sharded checkpoints: read it with "
                         f"inshrink info, verify, or consolidate of one step")
    if not os.path.isfile(os.path.join(args.directory, MANIFEST)):
        raise UsageError(f"{args.directory}: not a series (no {MANIFEST})")
    series = Series(args.directory)
    if args.series_command == "restore":
        return _series_restore(args, series, started)
    if args.series_command == "report":
        return _series_report(args, series, started)
    problems = series.verify() if args.series_command == "verify" else []
    files = [_checkpoint_file(args.directory, e) for e in series.checkpoints()]
    report = _report(f"series {args.series_command}", started, [args.directory], [], files,
                     problems=problems)
    if args.json:
        _print_json(report)
    elif args.series_command == "ls":
        print(f"{'step':>12}  {'kind':<8} {'bytes':>14}  base")
        for f in files:
            print(_clean(f"{f['step']:>12}  {'keyframe' if f['keyframe'] else 'delta':<8} "
                         f"{f['bytes_in']:>14,}  {f['base'] or '-'}"))
        for problem in report["problems"]:  # the reason of exit status 1
            print(_clean(f"inshrink: error: {problem}"), file=sys.stderr)
    else:
        print("\n".join(_clean(f"FAIL  {p}") for p in problems) if problems
              else f"OK    {len(files)} checkpoints")
    return EXIT_OK if report["ok"] else EXIT_ERROR


def _checkpoint_file(directory: str, entry) -> dict:
    from ..errors import InshrinkError
    path = os.path.join(directory, entry.file)
    extra = dict(step=entry.step, keyframe=entry.keyframe, base=entry.base)
    try:
        details = _ink_details(path)
    except (InshrinkError, OSError) as exc:
        reason = f"{exc.strerror}" if isinstance(exc, OSError) and exc.strerror else exc
        return _file(path, None, entry.bytes, 0, error=f"{type(exc).__name__}: {reason}",
                     **extra)
    return _file(path, None, entry.bytes, 0, **details, **extra)


def _series_report(args, series, started: float) -> int:
    from ..series import report as _r
    from ..errors import InvalidArgumentError
    dst = args.destination = args.plot
    if dst is not None:
        if not dst.lower().endswith(".png"):
            raise UsageError(f"{dst}: --plot writes a PNG file (give a name ending in .png)")
        _check_output(args.directory, dst, args.force)
        try:
            _r.require_matplotlib()  # first: a missing matplotlib is a usage error
        except InvalidArgumentError as exc:
            raise UsageError(str(exc)) from None
    records = _r.series_report(args.directory)
    if dst is not None:
        if not records:
            raise UsageError(f"{args.directory}: the series is empty: nothing to plot")
        _r.plot_series(args.directory, dst, records=records)
    by_step = {r["step"]: r for r in records}
    files = [{**_checkpoint_file(args.directory, e),
              "search": {k: by_step[e.step][k] for k in _r.SEARCH_FIELDS}}
             for e in series.checkpoints()]
    report = _report("series report", started, [args.directory], [dst] if dst else [], files)
    if dst is not None:
        report["bytes_out"] = os.path.getsize(dst)
    if args.json:
        _print_json(report)
    else:
        for line in _r.format_table(records).splitlines():  # mode names come from metadata
            print(_clean(line))
        if dst is not None:
            print(_clean(f"plot -> {dst}"))
    return EXIT_OK if report["ok"] else EXIT_ERROR


def _series_restore(args, series, started: float) -> int:
    import tempfile

    from .. import api, safetensors as convert
    from ..atomic import hidden_prefix
    dst = args.destination = args.output
    if not dst.endswith((".safetensors", ".ink")):
        raise UsageError(f"{dst}: the output must end with .safetensors or .ink (its format)")
    _check_output(args.directory, dst, args.force, inside=args.directory)
    step = series.latest() if args.step is None else args.step
    if step is None:
        raise UsageError(f"{args.directory}: the series is empty")
    if step not in series.steps():
        raise UsageError(f"{args.directory}: no step {step} (steps: "
                         f"{', '.join(map(str, series.steps())) or 'none'})")
    entry = next(e for e in series.checkpoints() if e.step == step)
    source = _checkpoint_file(args.directory, entry)
    _check_lossy_overwrite(args, dst, any(not t.lossless for t in source["tensors"]))
    state = series.load(step)
    metadata = dict(source["metadata"] or {})  # the checkpoint's own, kept
    metadata.setdefault("step", str(step))
    if dst.endswith(".safetensors"):
        # a unique temporary beside the output, like every other write: never a fixed name
        # that could be someone's file
        fd, tmp = tempfile.mkstemp(prefix=hidden_prefix(dst), suffix=".tmp",
                                   dir=os.path.dirname(os.path.abspath(dst)))
        os.close(fd)
        try:
            api.save(tmp, state, metadata)
            convert.decompress_to_safetensors(tmp, dst)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    else:
        api.save(dst, state, metadata)
    size = os.path.getsize(dst)
    files = [_file(source["input"], dst, source["bytes_in"], size, tensors=source["tensors"],
                   format_version=source["format_version"], metadata=source["metadata"],
                   step=step, keyframe=entry.keyframe, base=entry.base)]
    report = _report("series restore", started, [args.directory], [dst], files,
                     sum(t.nbytes for t in source["tensors"]), source["bytes_in"])
    if args.json:
        _print_json(report)
    else:
        print(_clean(f"step {step} -> {dst}: {size:,} bytes"
                     f"{_lossy_text(_all_tensors(report))}"))
    return EXIT_OK


COMMANDS = {"compress": cmd_compress, "decompress": cmd_decompress, "info": cmd_info,
            "verify": cmd_verify, "consolidate": cmd_consolidate, "series": cmd_series}


def _run(args, started: float) -> int:
    """The command; a progress bar it left drawn ends its line before an error is printed."""
    try:
        return COMMANDS[args.command](args, started)
    except BaseException:
        if getattr(args, "bar", None) is not None:
            args.bar.stop()
        raise


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status (0 ok, 1 error, 2 usage error)."""
    args = _parser().parse_args(argv)
    from ..errors import InshrinkError
    started = time.monotonic()
    try:
        return _run(args, started)
    except BrokenPipeError:  # output piped into e.g. `head`
        sys.stderr.close()
        return EXIT_ERROR
    except UsageError as exc:
        print(f"inshrink: error: {_clean(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"inshrink: error: {_clean(_os_error_message(exc, args))}", file=sys.stderr)
        return EXIT_ERROR
    except (InshrinkError, RecursionError) as exc:
        print(f"inshrink: error: {_clean(exc)}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("inshrink: interrupted", file=sys.stderr)
        return 130
