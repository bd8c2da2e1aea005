"""The ``inshrink`` command line: compress, decompress, info, verify.

Heavy modules are imported inside the commands so ``inshrink --help`` stays instant.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """A command-line mistake: reported in one line with exit status 2."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="inshrink", description="Compress deep-learning checkpoints (.safetensors <-> .ink).")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    c = sub.add_parser("compress", help="safetensors file or sharded directory -> .ink")
    c.add_argument("input", help="a .safetensors file or a directory of shards")
    c.add_argument("-o", "--output", help="output path (default: INPUT with .ink, or DIR-ink/)")
    c.add_argument("--level", type=int, default=None,
                   help="zstd level for every plane (default: fast plane settings)")
    lossy = c.add_argument_group(
        "lossy compression", "quantize weights and optimizer moments (small tensors, integers "
        "and steps stay exact); --lossy alone means --preset balanced")
    lossy.add_argument("--lossy", action="store_true", help="quantize (default preset)")
    lossy.add_argument("--preset", choices=["balanced", "aggressive", "compact", "lossless"],
                       help="a named policy (implies --lossy)")
    lossy.add_argument("--bins", type=int, help="quantization levels per tensor (k)")
    lossy.add_argument("--prune", type=float, help="fraction of smallest values set to 0")
    lossy.add_argument("--protect", type=float,
                       help="fraction of largest values stored exactly (default 0.0005)")
    lossy.add_argument("--max-rel-l2", "--max-rel-error", dest="max_rel_l2", type=float,
                       help="per-tensor bound on ||x - x'|| / ||x||: fewest bins meeting it")
    _common(c)

    d = sub.add_parser("decompress", help=".ink file or directory -> safetensors")
    d.add_argument("input", help="an .ink file or a directory of .ink shards")
    d.add_argument("-o", "--output",
                   help="output path (default: INPUT with .safetensors, or DIR-safetensors/)")
    _common(d)

    i = sub.add_parser("info", help="per-tensor table: dtype, shape, codec, ratio")
    i.add_argument("input", help="an .ink file")
    i.add_argument("--json", action="store_true", help="machine-readable output")

    v = sub.add_parser("verify", help="check structure and every checksum; exit 1 on a problem")
    v.add_argument("input", nargs="+", help=".ink files or directories of .ink shards")
    v.add_argument("--json", action="store_true", help="machine-readable output")
    v.add_argument("--threads", type=int, default=None, help="threads (default: all cores)")

    ser = sub.add_parser("series", help="checkpoint series: ls, restore, verify")
    ser_sub = ser.add_subparsers(dest="series_command", required=True, metavar="ACTION")
    ls = ser_sub.add_parser("ls", help="list the checkpoints of a series")
    ls.add_argument("directory")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    rs = ser_sub.add_parser("restore", help="write one checkpoint as .safetensors or .ink")
    rs.add_argument("directory")
    rs.add_argument("--step", type=int, default=None, help="step to restore (default: latest)")
    rs.add_argument("-o", "--output", required=True, help="OUT.safetensors or OUT.ink")
    rs.add_argument("-f", "--force", action="store_true", help="overwrite an existing output")
    sv = ser_sub.add_parser("verify", help="check every checkpoint and every delta chain")
    sv.add_argument("directory")
    sv.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-f", "--force", action="store_true", help="overwrite an existing output")
    p.add_argument("--threads", type=int, default=None, help="threads (default: all cores)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")
    p.add_argument("--json", action="store_true", help="print a JSON summary")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("inshrink")
    except PackageNotFoundError:
        return "unknown"


def _default_output(src: str, is_dir: bool, old: str, new: str, dir_suffix: str) -> str:
    src = src.rstrip("/\\") or src
    if is_dir:
        return src + dir_suffix
    return (src[:-len(old)] if src.endswith(old) else src) + new


def _tree_bytes(path: str, suffix: str) -> int:
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path)
                   if n.endswith(suffix))
    return os.path.getsize(path)


def _check_paths(src: str, dst: str, force: bool) -> None:
    if not os.path.exists(src):
        raise UsageError(f"{src}: no such file or directory")
    if os.path.abspath(src) == os.path.abspath(dst):
        raise UsageError("output would overwrite the input")
    if os.path.exists(dst) and not force:
        raise UsageError(f"{dst} exists (use --force to overwrite)")


def _ink_bytes(path: str) -> int:
    """Tensor bytes an .ink file (or directory of them) decodes to, for the progress bar."""
    from .tensorfile import File
    paths = _ink_files(path)
    total = 0
    for p in paths:
        with File(p, threads=1) as f:
            total += sum(i.nbytes for i in f.infos())
    return total


def _ink_files(path: str) -> list[str]:
    if os.path.isdir(path):
        return [os.path.join(path, n) for n in sorted(os.listdir(path)) if n.endswith(".ink")]
    return [path]


def _summary(args, src: str, dst: str, in_suffix: str, out_suffix: str) -> None:
    before, after = _tree_bytes(src, in_suffix), _tree_bytes(dst, out_suffix)
    if args.json:
        print(json.dumps({"input": src, "output": dst, "input_bytes": before,
                          "output_bytes": after}))
    elif not args.quiet:
        print(f"{src} -> {dst}: {before:,} -> {after:,} bytes "
              f"({before / after if after else float('inf'):.3f}x)" if in_suffix == ".safetensors"
              else f"{src} -> {dst}: {before:,} -> {after:,} bytes")


def cmd_compress(args) -> int:
    from . import convert
    from .progress import ProgressBar
    src, is_dir = args.input, os.path.isdir(args.input)
    dst = args.output or _default_output(src, is_dir, ".safetensors", ".ink", "-ink")
    _check_paths(src, dst, args.force)
    policy = _policy(args)
    bar = ProgressBar(_tree_bytes(src, ".safetensors"), "compress",
                      sys.stderr.isatty() and not args.quiet)
    kwargs = dict(level=args.level, threads=args.threads, progress=bar, policy=policy)
    if is_dir:
        convert.compress_directory(src, dst, **kwargs)
    else:
        convert.compress_safetensors(src, dst, **kwargs)
    bar.finish()
    _summary(args, src, dst, ".safetensors", ".ink")
    return EXIT_OK


def _policy(args):
    """The policy the lossy options describe (None: lossless)."""
    from .policy import Policy, QuantConfig
    explicit = {k: getattr(args, k) for k in ("bins", "prune", "protect", "max_rel_l2")
                if getattr(args, k) is not None}
    if explicit and args.preset:
        raise UsageError("use either --preset or --bins/--prune/--protect/--max-rel-l2")
    if explicit:
        if explicit.get("bins", 1) < 1:  # 0 levels exist for optimizer moments, not for a model
            raise UsageError("--bins must be at least 1")
        if "max_rel_l2" in explicit and "bins" not in explicit:
            explicit["bins"] = 256  # the bound picks the fewest bins up to this
        return Policy.uniform(QuantConfig(**explicit))
    if args.preset:
        return args.preset
    return "balanced" if args.lossy else None


def cmd_decompress(args) -> int:
    from . import convert
    from .progress import ProgressBar
    src, is_dir = args.input, os.path.isdir(args.input)
    dst = args.output or _default_output(src, is_dir, ".ink", ".safetensors", "-safetensors")
    _check_paths(src, dst, args.force)
    bar = ProgressBar(_ink_bytes(src), "decompress", sys.stderr.isatty() and not args.quiet)
    kwargs = dict(threads=args.threads, progress=bar)
    if is_dir:
        convert.decompress_directory(src, dst, **kwargs)
    else:
        convert.decompress_to_safetensors(src, dst, **kwargs)
    bar.finish()
    _summary(args, src, dst, ".ink", ".safetensors")
    return EXIT_OK


def cmd_info(args) -> int:
    from .tensorfile import File
    with File(args.input, threads=1) as f:
        infos, metadata, version = f.infos(), f.metadata, f.format_version
    total, stored = sum(i.nbytes for i in infos), sum(i.stored_bytes for i in infos)
    if args.json:
        print(json.dumps({"path": args.input, "file_bytes": os.path.getsize(args.input),
                          "format_version": version,
                          "metadata": metadata, "tensor_bytes": total, "stored_bytes": stored,
                          "tensors": [dict(name=i.name, dtype=i.dtype, shape=list(i.shape),
                                           codec=i.codec, nbytes=i.nbytes,
                                           stored_bytes=i.stored_bytes,
                                           ratio=round(i.ratio, 6) if i.stored_bytes else None,
                                           role=i.role, error=i.error)
                                      for i in infos]}))
        return EXIT_OK
    width = max([len(i.name) for i in infos] + [4])
    lossy = any(i.error for i in infos)
    extra = f" {'role':<10} {'rel L2 err':>10} {'max |err|':>10}" if lossy else ""
    print(f"{'name':<{width}}  {'dtype':<8} {'shape':<20} {'codec':<16} "
          f"{'bytes':>14} {'stored':>14} {'ratio':>8}{extra}")
    for i in infos:
        row = (f"{i.name:<{width}}  {i.dtype:<8} {str(list(i.shape)):<20} {i.codec:<16} "
               f"{i.nbytes:>14,} {i.stored_bytes:>14,} {i.ratio:>8.3f}")
        if lossy:
            err = i.error or {}
            row += (f" {i.role or '-':<10} {_num(err.get('rel_l2_error')):>10} "
                    f"{_num(err.get('max_abs_error')):>10}")
        print(row)
    ratio = total / stored if stored else float("inf")
    print(f"{len(infos)} tensors, {total:,} bytes -> {stored:,} stored ({ratio:.3f}x); "
          f"file {os.path.getsize(args.input):,} bytes; metadata keys: {len(metadata)}; "
          f"format {version}")
    _print_search(metadata)
    return EXIT_OK


def _print_search(metadata: dict) -> None:
    """One line on the configuration search that chose this checkpoint's policy, if any."""
    from .series import SEARCH_KEY
    try:
        report = json.loads(metadata[SEARCH_KEY])
        chosen = report.get("chosen")
    except (KeyError, ValueError, AttributeError):
        return
    what = "lossless weights" if chosen is None else ", ".join(
        f"{k}={v}" for k, v in chosen.items())
    print(f"search: {report.get('mode')}, epsilon {report.get('epsilon')}, "
          f"{report.get('evaluations_used', 0)} evaluations -> {what}")


def _num(value) -> str:
    return "-" if value is None else f"{value:.3g}"


def cmd_verify(args) -> int:
    from .errors import InshrinkError
    from .tensorfile import File
    results, failed = [], False
    for target in args.input:
        for path in _ink_files(target):
            try:
                with File(path, threads=args.threads, mmap=False) as f:
                    f.verify()
                    results.append({"path": path, "ok": True, "tensors": len(f)})
            except (InshrinkError, OSError) as exc:
                failed = True
                results.append({"path": path, "ok": False,
                                "error": f"{type(exc).__name__}: {exc}"})
    if args.json:
        print(json.dumps(results))
    else:
        for r in results:
            print(f"OK    {r['path']} ({r['tensors']} tensors)" if r["ok"]
                  else f"FAIL  {r['path']}: {r['error']}")
    return EXIT_ERROR if failed or not results else EXIT_OK


def cmd_series(args) -> int:
    from .series import MANIFEST, Series
    if not os.path.isfile(os.path.join(args.directory, MANIFEST)):
        raise UsageError(f"{args.directory}: not a series (no {MANIFEST})")
    series = Series(args.directory)
    if args.series_command == "ls":
        entries = series.checkpoints()
        if args.json:
            print(json.dumps([e.__dict__ for e in entries]))
        else:
            print(f"{'step':>12}  {'kind':<8} {'bytes':>14}  base")
            for e in entries:
                print(f"{e.step:>12}  {'keyframe' if e.keyframe else 'delta':<8} "
                      f"{e.bytes:>14,}  {e.base or '-'}")
        return EXIT_OK
    if args.series_command == "verify":
        problems = series.verify()
        if args.json:
            print(json.dumps({"ok": not problems, "problems": problems}))
        else:
            print("\n".join(f"FAIL  {p}" for p in problems) if problems
                  else f"OK    {len(series.steps())} checkpoints")
        return EXIT_ERROR if problems else EXIT_OK
    _check_paths(args.directory, args.output, args.force)
    state = series.load(args.step)
    step = series.latest() if args.step is None else args.step
    if args.output.endswith(".safetensors"):
        from . import api, convert
        tmp = args.output + ".ink.tmp"
        try:
            api.save(tmp, state, {"step": str(step)})
            convert.decompress_to_safetensors(tmp, args.output)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    else:
        from . import api
        api.save(args.output, state, {"step": str(step)})
    print(f"step {step} -> {args.output}")
    return EXIT_OK


COMMANDS = {"compress": cmd_compress, "decompress": cmd_decompress,
            "info": cmd_info, "verify": cmd_verify, "series": cmd_series}


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status (0 ok, 1 error, 2 usage error)."""
    args = _parser().parse_args(argv)
    from .errors import InshrinkError
    try:
        return COMMANDS[args.command](args)
    except BrokenPipeError:  # output piped into e.g. `head`
        sys.stderr.close()
        return EXIT_ERROR
    except UsageError as exc:
        print(f"inshrink: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (InshrinkError, OSError) as exc:
        print(f"inshrink: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("inshrink: interrupted", file=sys.stderr)
        return 130
