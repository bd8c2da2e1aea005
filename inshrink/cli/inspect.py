"""``inshrink info`` (a per-tensor table) and ``inshrink verify`` (structure and every
checksum) of .ink files; sharded checkpoints and their series go to :mod:`.dcp`."""
from __future__ import annotations

import json
import os

from .kinds import is_dcp, is_dcp_series
from .output import (all_tensors, build_report, clean, count, file_entry, ink_details,
                     lossy_text, number_text, print_json, ratio_text, short)
from .paths import error_entry_message, files_in, size_or_zero
from .status import EXIT_ERROR, EXIT_OK


def cmd_info(args, started: float) -> int:
    from ..safetensors import check_ink
    args.source = args.input
    if is_dcp_series(args.input):
        from .dcp import dcp_series_info
        return dcp_series_info(args, started)
    if is_dcp(args.input):
        from .dcp import dcp_info
        return dcp_info(args, started)
    paths = files_in(args.input, ".ink")
    files = []
    for path in paths:
        check_ink(path)
        details = ink_details(path)
        files.append(file_entry(path, None, os.path.getsize(path), 0, **details))
    report = build_report("info", started, [args.input], [], files)
    if args.json:
        print_json(report)
        return EXIT_OK
    for n, f in enumerate(files):
        if len(files) > 1:
            print(("\n" if n else "") + clean(f"{f['input']}:"))
        _print_table(f)
    if len(files) > 1:
        ratio = f" ({report['ratio']:.3f}x)" if report["ratio"] else ""
        print(f"\n{len(files)} files, {report['tensor_bytes']:,} tensor bytes in "
              f"{report['bytes_in']:,} file bytes{ratio}{lossy_text(all_tensors(report))}")
    return EXIT_OK


def _print_table(f: dict) -> None:
    infos = f["tensors"]
    names = [clean(i.name) for i in infos]
    width = max([len(n) for n in names] + [4])
    lossy = any(i.error for i in infos)
    extra = f" {'role':<10} {'rel L2 err':>10} {'max |err|':>10}" if lossy else ""
    print(f"{'name':<{width}}  {'dtype':<8} {'shape':<20} {'codec':<16} "
          f"{'bytes':>14} {'stored':>14} {'ratio':>8}{extra}")
    for name, i in zip(names, infos):
        row = (f"{name:<{width}}  {i.dtype:<8} {str(list(i.shape)):<20} "
               f"{clean(i.codec):<16} {i.nbytes:>14,} {i.stored_bytes:>14,} "
               f"{ratio_text(i.nbytes, i.stored_bytes):>8}")
        if lossy:
            err = i.error or {}
            row += (f" {clean(i.role or '-'):<10} {number_text(err.get('rel_l2_error')):>10} "
                    f"{number_text(err.get('max_abs_error')):>10}")
        print(row)
    total = sum(i.nbytes for i in infos)
    stored = sum(i.stored_bytes for i in infos)
    print(f"{len(infos)} tensors, {total:,} bytes -> {stored:,} stored "
          f"({ratio_text(total, stored, 'x')}); "
          f"file {f['bytes_in']:,} bytes; metadata keys: {len(f['metadata'])}; "
          f"format {f['format_version']}{lossy_text(infos)}")
    line = _search_line(f["metadata"])
    if line:
        print(line)


def _search_line(metadata: dict) -> str | None:
    """One line on the configuration search that chose this checkpoint's policy, if any.

    The report is metadata any writer may set: an unexpected shape is shown as raw text."""
    from ..search.stored import SEARCH_KEY
    raw = metadata.get(SEARCH_KEY)
    if raw is None:
        return None
    try:
        report = json.loads(raw)
    except (ValueError, RecursionError):
        report = None
    if not isinstance(report, dict):
        return f"search: unrecognised report {short(raw)}"
    chosen = report.get("chosen")
    if chosen is None:
        what = "lossless weights"
    elif isinstance(chosen, dict):
        what = ", ".join(f"{short(k, 30)}={short(v, 30)}" for k, v in chosen.items())
    else:
        what = short(chosen)
    return (f"search: {short(report.get('mode'), 30)}, epsilon "
            f"{short(report.get('epsilon'), 30)}, {short(report.get('evaluations_used', 0), 30)}"
            f" evaluations -> {what}")


def cmd_verify(args, started: float) -> int:
    paths = [p for target in args.input
             for p in ([target] if is_dcp(target) or is_dcp_series(target)
                       else files_in(target, ".ink"))]
    args.source = args.input[0]
    files = []
    problems = []
    for path in paths:
        if is_dcp_series(path):
            from .dcp import dcp_series_verify
            found, entries = dcp_series_verify(path)
            problems += found
            files += entries
        elif is_dcp(path):
            from .dcp import dcp_verify
            files += dcp_verify(path, args)
        else:
            files.append(_verify_file(path, args))
    report = build_report("verify", started, list(args.input), [], files, problems=problems)
    if args.json:
        print_json(report)
    else:
        _print_verified(files, problems)
    return EXIT_OK if report["ok"] else EXIT_ERROR


def _verify_file(path: str, args) -> dict:
    """verify's entry for one .ink file: every record decoded and checked."""
    from ..errors import InshrinkError
    from ..io.file import File
    from ..safetensors import check_ink
    try:
        check_ink(path)
        with File(path, threads=args.threads, mmap=False) as f:
            problems = f.verify()
            return file_entry(path, None, os.path.getsize(path), 0,
                              format_version=f.format_version, metadata=f.metadata,
                              tensors=f.infos(), error="; ".join(problems) or None)
    except (InshrinkError, OSError) as exc:
        return file_entry(path, None, size_or_zero(path), 0,
                          error=error_entry_message(exc, args))


def _print_verified(files: list[dict], problems: list[str]) -> None:
    """One line per problem and per file; one line for each checkpoint's or series' files."""
    shown = set()
    for problem in problems:
        print(clean(f"FAIL  {problem}"))
    for f in files:
        checkpoint = f.get("checkpoint")
        if f.get("series") is not None:
            if f["series"] not in shown and not problems:
                shown.add(f["series"])
                mine = [g for g in files if g.get("series") == f["series"]]
                print(clean(f"OK    {f['series']} (DCP series: "
                            f"{count(len({g['step'] for g in mine}), 'step')}, "
                            f"{count(len(mine), 'rank file')})"))
        elif checkpoint is None:
            print(clean(f"OK    {f['input']} ({len(f['tensors'])} tensors)" if f["ok"]
                        else f"FAIL  {f['input']}: {f['error']}"))
        elif checkpoint not in shown:  # a verified checkpoint: one line for its files
            shown.add(checkpoint)
            mine = [g for g in files if g.get("checkpoint") == checkpoint]
            print(clean(f"OK    {checkpoint} (DCP checkpoint: "
                        f"{count(len(mine), 'rank file')}, "
                        f"{sum(len(g['tensors']) for g in mine)} chunks)"))
