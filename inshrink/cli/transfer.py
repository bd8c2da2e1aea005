"""``inshrink compress`` and ``inshrink decompress``: a safetensors file or tree to .ink and
back, with one tail for both (progress, the report, the summary line)."""
from __future__ import annotations

import os
import sys
from typing import Callable

from ..dcp.names import STEP_DIR_SHAPE
from .kinds import is_dcp, is_dcp_series, is_series
from .output import (all_tensors, build_report, clean, file_entry, lossy_text, print_json,
                     version_and_metadata, warn_large_errors)
from .paths import check_lossy_overwrite, check_output, default_output, files_in
from .status import EXIT_OK, UsageError


def cmd_compress(args, started: float) -> int:
    from .. import safetensors as convert
    src, sources, is_dir, dst = _source_and_destination(args, ".safetensors", ".ink", "-ink")
    policy = _policy(args)
    check_lossy_overwrite(args, dst, policy not in (None, "lossless"))
    report = _convert(args, started, src, dst, is_dir, sum(os.path.getsize(s) for s in sources),
                      convert.compress_directory, convert.compress_safetensors,
                      compressing=True, level=args.level, policy=policy)
    warn_large_errors(report)
    return EXIT_OK


def cmd_decompress(args, started: float) -> int:
    from .. import safetensors as convert
    if is_series(args.input):
        raise UsageError(f"{args.input} is a checkpoint series: restore one step with "
                         f"inshrink series restore {args.input} --step N -o OUT")
    if is_dcp_series(args.input):
        step = os.path.join(args.input, STEP_DIR_SHAPE)
        raise UsageError(f"{args.input} is a series of sharded checkpoints: join one step "
                         f"with inshrink consolidate {step} -o OUT")
    src, sources, is_dir, dst = _source_and_destination(args, ".ink", ".safetensors",
                                                        "-safetensors")
    indexes = {}
    for path in sources:
        convert.check_ink(path)
        indexes[path] = _standalone_infos(path)
    check_lossy_overwrite(args, dst, any(not t.lossless for infos in indexes.values()
                                         for t in infos))
    _convert(args, started, src, dst, is_dir,
             sum(t.nbytes for infos in indexes.values() for t in infos),
             convert.decompress_directory, convert.decompress_to_safetensors,
             compressing=False)
    return EXIT_OK


def _source_and_destination(args, in_ext: str, out_ext: str, dir_suffix: str):
    """The input's files, whether it is a directory, and the checked output path."""
    src = args.source = args.input
    sources = files_in(src, in_ext)
    is_dir = os.path.isdir(src)
    dst = args.destination = args.output if args.output is not None else default_output(
        src, is_dir, in_ext, out_ext, dir_suffix)
    if not is_dir and dst.lower().endswith(in_ext):  # the other format's name: a mix-up
        raise UsageError(f"{dst}: {args.command} writes {'an' if out_ext == '.ink' else 'a'} "
                         f"{out_ext} file; give an output name that does not end in {in_ext}")
    check_output(src, dst, args.force, inside=src if is_dir else None)
    return src, sources, is_dir, dst


def _convert(args, started: float, src: str, dst: str, is_dir: bool, work: int,
             convert_tree: Callable, convert_file: Callable, *, compressing: bool,
             **options) -> dict:
    """Convert ``src`` (a file or a tree) into ``dst`` under a progress bar of ``work``
    bytes, print the summary and return the report; its ratio is the uncompressed side's
    bytes over the compressed side's, copied files left out."""
    from ..errors import InshrinkError
    from ..progress import ProgressBar
    from ..errors import with_path
    bar = args.bar = ProgressBar(work, args.command, sys.stderr.isatty() and not args.quiet)
    options.update(threads=args.threads, progress=bar)
    if is_dir:
        done = convert_tree(src, dst, overwrite=args.force,
                            follow_symlinks=args.follow_symlinks, **options)
        files = [_converted(os.path.join(src, r.source), os.path.join(dst, r.output), r,
                            os.path.join(dst, r.output) if compressing
                            else os.path.join(src, r.source)) for r in done]
    else:
        try:
            tensors = convert_file(src, dst, **options)
        except InshrinkError as exc:
            raise with_path(exc, src) from None
        files = [file_entry(src, dst, os.path.getsize(src), os.path.getsize(dst),
                            tensors=tensors,
                            **version_and_metadata(dst if compressing else src))]
    bar.finish()
    _notice_links(args, done if is_dir else [])
    converted = [f for f in files if not f["copied"]]
    bytes_in = sum(f["bytes_in"] for f in converted)
    bytes_out = sum(f["bytes_out"] for f in converted)
    report = build_report(args.command, started, [src], [dst], files,
                          *((bytes_in, bytes_out) if compressing else (bytes_out, bytes_in)))
    _summary(args, report, src, dst)
    return report


def _converted(path: str, output: str, r, ink: str) -> dict:
    """A file entry from a directory conversion's FileReport (``ink``: its .ink side)."""
    if r.copied:
        return file_entry(path, output, r.bytes_in, r.bytes_out, copied=True)
    return file_entry(path, output, r.bytes_in, r.bytes_out, tensors=r.tensors,
                      **version_and_metadata(ink))


def _notice_links(args, reports) -> None:
    for r in reports:
        if r.link_target is not None:
            print(clean(f"inshrink: note: {os.path.join(args.input, r.source)} is a link to "
                        f"{r.link_target}, outside {args.input}: its content was stored"),
                  file=sys.stderr)


def _summary(args, report: dict, src: str, dst: str) -> None:
    if args.json:
        print_json(report)
        return
    if args.quiet:
        return
    ratio = f" ({report['ratio']:.3f}x)" if report["ratio"] else ""
    converted = [f for f in report["files"] if not f["copied"]]
    copied = len(report["files"]) - len(converted)
    what = "" if len(report["files"]) == 1 and not os.path.isdir(src) else (
        f" {len(converted)} files converted, {copied} copied;")
    print(clean(f"{src} -> {dst}:{what} {report['bytes_in']:,} -> "
                f"{report['bytes_out']:,} bytes{ratio}{lossy_text(all_tensors(report))}"))


def _policy(args):
    """The policy the lossy options describe (None: lossless)."""
    from ..encode.policy import Policy, QuantConfig
    from ..errors import InvalidArgumentError
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


def _standalone_infos(path: str) -> list:
    """The tensors of an .ink file that decodes on its own (opens the index only). A delta
    file of a series decodes only against its base: the error points to the command that
    reads it."""
    from ..errors import InshrinkError
    from ..io.file import File
    from ..errors import with_path
    try:
        with File(path, threads=1) as f:
            base, infos = f.base, f.infos()
    except InshrinkError as exc:
        raise with_path(exc, path) from None
    if base is not None:
        raise UsageError(_delta_refusal(path, base))
    return infos


def _delta_refusal(path: str, base: object) -> str:
    """What a delta file needs: its base, named by a path from here (the file names the base
    by its name next to it), and the command that reads both."""
    directory = os.path.dirname(path) or "."
    name = base.get("file") if isinstance(base, dict) else None
    if isinstance(name, str) and name and os.path.basename(name) == name:
        where = os.path.join(os.path.dirname(path), name)
        needs = (f"it needs its base {where}" if os.path.isfile(where) else
                 f"it needs its base {where}, which is not there")
    else:
        needs = "it needs its base"
    if is_dcp(directory):
        how = f"join its step with inshrink consolidate {directory} -o OUT"
    elif is_series(directory):
        how = (f"restore its step with inshrink series restore {directory} --step "
               f"{_series_step(directory, os.path.basename(path))} -o OUT")
    else:
        how = "read it from its checkpoint series, beside its base"
    return f"{path} is a delta file of a checkpoint series, not decoded alone: {needs}; {how}"


def _series_step(directory: str, name: str) -> str:
    """The step of the series file ``name`` in its manifest, ``N`` if the manifest does not
    say (the hint is still right, only less specific)."""
    from ..errors import InshrinkError
    from ..series.manifest import read_manifest
    from ..series.series import MANIFEST, decode_manifest
    try:
        raw = read_manifest(os.path.join(directory, MANIFEST))
        entries = decode_manifest(raw) if raw is not None else []
    except (OSError, InshrinkError):
        return "N"
    return next((str(e.step) for e in entries if e.file == name), "N")
