"""``inshrink series ls|restore|verify|report``: a checkpoint series of inshrink.series."""
from __future__ import annotations

import os
import sys

from .kinds import is_dcp_series
from .output import (all_tensors, build_report, clean, file_entry, ink_details, lossy_text,
                     print_json)
from .paths import check_checkpoint_output, check_input, check_lossy_overwrite, check_output
from .status import EXIT_ERROR, EXIT_OK, UsageError


def cmd_series(args, started: float) -> int:
    from ..series.series import MANIFEST, Series
    args.source = args.directory
    check_input(args.directory)
    if is_dcp_series(args.directory):
        raise UsageError(f"{args.directory} is a series of sharded checkpoints: read it with "
                         f"inshrink info, verify, or consolidate of one step")
    if not os.path.isfile(os.path.join(args.directory, MANIFEST)):
        raise UsageError(f"{args.directory}: not a series (no {MANIFEST})")
    series = Series(args.directory)
    if args.series_command == "restore":
        return _restore(args, series, started)
    if args.series_command == "report":
        return _report(args, series, started)
    problems = series.verify() if args.series_command == "verify" else []
    files = [_checkpoint_file(args.directory, e) for e in series.checkpoints()]
    report = build_report(f"series {args.series_command}", started, [args.directory], [],
                          files, problems=problems)
    if args.json:
        print_json(report)
    elif args.series_command == "ls":
        print(f"{'step':>12}  {'kind':<8} {'bytes':>14}  {'state':<7}  base")
        for f in files:
            print(clean(f"{f['step']:>12}  {'keyframe' if f['keyframe'] else 'delta':<8} "
                        f"{f['bytes_in']:>14,}  {'model' if f['weights_only'] else 'whole':<7}"
                        f"  {f['base'] or '-'}"))
        for problem in report["problems"]:  # the reason of exit status 1
            print(clean(f"inshrink: error: {problem}"), file=sys.stderr)
    else:
        print("\n".join(clean(f"FAIL  {p}") for p in problems) if problems
              else f"OK    {len(files)} checkpoints")
    return EXIT_OK if report["ok"] else EXIT_ERROR


def _checkpoint_file(directory: str, entry) -> dict:
    """The report entry of one checkpoint of the series, from its file's index."""
    from ..errors import InshrinkError
    path = os.path.join(directory, entry.file)
    extra = dict(step=entry.step, keyframe=entry.keyframe, base=entry.base,
                 weights_only=entry.weights_only)
    try:
        details = ink_details(path)
    except (InshrinkError, OSError) as exc:
        reason = f"{exc.strerror}" if isinstance(exc, OSError) and exc.strerror else exc
        return file_entry(path, None, entry.bytes, 0, error=f"{type(exc).__name__}: {reason}",
                          **extra)
    return file_entry(path, None, entry.bytes, 0, **details, **extra)


def _report(args, series, started: float) -> int:
    """``series report``: per step, size, ratio and the searched configuration; ``--plot``
    draws it."""
    from ..errors import InvalidArgumentError
    from ..series import report as plots
    dst = args.destination = args.plot
    if dst is not None:
        if not dst.lower().endswith(".png"):
            raise UsageError(f"{dst}: --plot writes a PNG file (give a name ending in .png)")
        check_output(args.directory, dst, args.force)
        try:
            plots.require_matplotlib()  # first: a missing matplotlib is a usage error
        except InvalidArgumentError as exc:
            raise UsageError(str(exc)) from None
    records = plots.series_report(args.directory)
    if dst is not None:
        if not records:
            raise UsageError(f"{args.directory}: the series is empty: nothing to plot")
        plots.plot_series(args.directory, dst, records=records)
    by_step = {r["step"]: r for r in records}
    files = [{**_checkpoint_file(args.directory, e),
              "search": {k: by_step[e.step][k] for k in plots.SEARCH_FIELDS}}
             for e in series.checkpoints()]
    report = build_report("series report", started, [args.directory], [dst] if dst else [],
                          files)
    if dst is not None:
        report["bytes_out"] = os.path.getsize(dst)
    if args.json:
        print_json(report)
    else:
        for line in plots.format_table(records).splitlines():  # mode names come from metadata
            print(clean(line))
        if dst is not None:
            print(clean(f"plot -> {dst}"))
    return EXIT_OK if report["ok"] else EXIT_ERROR


def _restore(args, series, started: float) -> int:
    """``series restore``: one step written as .safetensors or .ink."""
    import tempfile

    from .. import api
    from .. import safetensors as convert
    from ..atomic import hidden_prefix
    dst = args.destination = args.output
    check_checkpoint_output(dst)
    check_output(args.directory, dst, args.force, inside=args.directory)
    step = series.latest() if args.step is None else args.step
    if step is None:
        raise UsageError(f"{args.directory}: the series is empty")
    if step not in series.steps():
        raise UsageError(f"{args.directory}: no step {step} (steps: "
                         f"{', '.join(map(str, series.steps())) or 'none'})")
    entry = next(e for e in series.checkpoints() if e.step == step)
    source = _checkpoint_file(args.directory, entry)
    check_lossy_overwrite(args, dst, any(not t.lossless for t in source["tensors"]))
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
    files = [file_entry(source["input"], dst, source["bytes_in"], size,
                        tensors=source["tensors"], format_version=source["format_version"],
                        metadata=source["metadata"], step=step, keyframe=entry.keyframe,
                        base=entry.base, weights_only=entry.weights_only)]
    report = build_report("series restore", started, [args.directory], [dst], files,
                          sum(t.nbytes for t in source["tensors"]), source["bytes_in"])
    if args.json:
        print_json(report)
    else:
        print(clean(f"step {step} -> {dst}: {size:,} bytes"
                    f"{' (the model only: a weights-only step)' if entry.weights_only else ''}"
                    f"{lossy_text(all_tensors(report))}"))
    return EXIT_OK
