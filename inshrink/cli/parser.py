"""The ``inshrink`` command line: compress, decompress, info, verify, consolidate, series.

Every command prints a one-line summary (or, with ``--json``, one JSON object of the shape
documented in README.md, "Command line") and exits 0 on success, 1 on an error in the data or
I/O, 2 on a usage error. This module holds the parser, its argument types and :func:`main`;
a command's module is imported only when that command runs, so that ``--help`` stays fast.
"""
from __future__ import annotations

import argparse
import importlib
import math
import sys
import time
from typing import Any, Callable

from ..encode.policy import MAX_BINS, PRESETS, SMALL_MOMENT, SMALL_TENSOR
from .output import LARGE_ERROR, clean
from .paths import os_error_message
from .status import EXIT_ERROR, EXIT_USAGE, UsageError


class _Parser(argparse.ArgumentParser):
    """argparse whose mistakes are one line, like every other error, instead of the whole
    usage text followed by the message."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {clean(message)} "
                              f"(see {self.prog} --help)\n")


# -- argument types: bad values exit 2 with the flag's name ---------------------------------

def _number(kind: Callable[[str], float], accepts: Callable[[float], bool], what: str
            ) -> Callable[[str], float]:
    """The argument type of a number that ``kind`` (int or float) reads and ``accepts``
    takes; anything else is refused as not ``what``."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not accepts(value):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    return parse


_positive_int = _number(int, lambda n: n >= 1, "a positive integer")
_step = _number(int, lambda n: n >= 0, "a non-negative integer")
# 0 levels exist for optimizer moments, not for a model
_bins = _number(int, lambda n: 1 <= n <= MAX_BINS, f"an integer in [1, {MAX_BINS}]")
_fraction = _number(float, lambda x: 0 <= x < 1, "a fraction in [0, 1)")
_positive_float = _number(float, lambda x: 0 < x < math.inf, "a positive number")


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


def _path(text: str) -> str:
    if not text:  # e.g. an unset shell variable: never fall back to the default name
        raise argparse.ArgumentTypeError("must not be empty")
    return text


# -- the parser ------------------------------------------------------------------------------

def _preset_help() -> str:
    """What each preset quantizes, read from the presets themselves."""
    import textwrap

    def fill(text: str, indent: str = "", first: str | None = None) -> str:
        return textwrap.fill(text, 79, initial_indent=indent if first is None else first,
                             subsequent_indent=indent, break_on_hyphens=False)

    def levels(config: Any) -> str:
        if config is None:
            return "exact"
        return f"{config.bins} (smallest {config.prune:.0%} as 0)" if config.prune else \
            f"{config.bins}"

    lines = ["presets (--preset NAME; --lossy alone means --preset balanced):"]
    described: dict[tuple, str] = {}
    for name, policy in PRESETS.items():
        roles = policy.roles
        if not any(roles.values()):
            lines.append(f"  {name:<11} nothing quantized: the same as no lossy option")
            continue
        lines.append(fill(
            f"{name:<11} levels: weights {levels(roles.get('weight'))}, embeddings "
            f"{levels(roles.get('embedding'))}, optimizer exp_avg "
            f"{levels(roles.get('exp_avg'))}, exp_avg_sq {levels(roles.get('exp_avg_sq'))}",
            " " * 14, first="  "))
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



# -- running a command -----------------------------------------------------------------------

COMMANDS = {"compress": (".transfer", "cmd_compress"),
            "decompress": (".transfer", "cmd_decompress"),
            "info": (".inspect", "cmd_info"), "verify": (".inspect", "cmd_verify"),
            "consolidate": (".dcp", "cmd_consolidate"), "series": (".series", "cmd_series")}
"""Each command's module (relative to this package) and function."""


def _run(args, started: float) -> int:
    """The command; a progress bar it left drawn ends its line before an error is printed."""
    try:
        module, function = COMMANDS[args.command]
        return getattr(importlib.import_module(module, __package__), function)(args, started)
    except BaseException:
        if getattr(args, "bar", None) is not None:
            args.bar.stop()
        raise


def main(argv: list[str] | None = None) -> int:
    """Run the command line.

    Parameters
    ----------
    argv
        The arguments after the program's name; ``sys.argv[1:]`` when None.

    Returns
    -------
    int
        The exit status: 0 success, 1 an error in the data or I/O, 2 a usage error, 130 an
        interrupt.
    """
    args = _parser().parse_args(argv)
    from ..errors import InshrinkError
    started = time.monotonic()
    try:
        return _run(args, started)
    except BrokenPipeError:  # output piped into e.g. `head`
        sys.stderr.close()
        return EXIT_ERROR
    except UsageError as exc:
        print(f"inshrink: error: {clean(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"inshrink: error: {clean(os_error_message(exc, args))}", file=sys.stderr)
        return EXIT_ERROR
    except (InshrinkError, RecursionError) as exc:
        print(f"inshrink: error: {clean(exc)}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("inshrink: interrupted", file=sys.stderr)
        return 130
