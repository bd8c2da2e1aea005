"""Sharded torch.distributed.checkpoint directories (inshrink.dcp) and series of them:
``inshrink info`` and ``inshrink verify`` of one, and ``inshrink consolidate``. The only
command module that imports torch, and only when a command reads such a directory
(``consolidate`` of a checkpoint with a chunk map does not)."""
from __future__ import annotations

import os
import re

from ..dcp.names import CHUNK_MAP, METADATA, STEP_DIR_SHAPE, rank_of, step_of
from .kinds import is_dcp, is_dcp_series
from .output import (all_tensors, build_report, clean, count, file_entry, finite,
                     ink_details, lossy_text, number_text, print_json, ratio_text,
                     version_and_metadata)
from .paths import (check_checkpoint_output, check_input, check_lossy_overwrite, check_output,
                    error_entry_message, names_in, size_or_zero)
from .status import EXIT_OK, UsageError


def _step_in_series(path: str) -> tuple[str, int] | None:
    """(the series directory, the step) when ``path`` is a step directory of a DCP series,
    else None (from the names alone)."""
    parent, name = os.path.split(os.path.normpath(path))
    step = step_of(name)
    if step is None or not is_dcp_series(parent or "."):
        return None
    return parent or ".", step


def _series_step(path: str, threads: int | None = 1):
    """(InkSeries, step) when ``path`` is a step directory of a DCP series, else None."""
    located = _step_in_series(path)
    if located is None:
        return None
    from ..dcp.series import InkSeries
    return InkSeries(located[0], threads=threads), located[1]


def _dcp_call(call):
    """``call()``, an unfinished save's error saying so first."""
    from ..errors import IncompleteCheckpointError
    try:
        return call()
    except IncompleteCheckpointError as exc:
        raise IncompleteCheckpointError(f"incomplete checkpoint: {exc}") from None


def _details(path: str, threads: int | None = None, verify: bool = False):
    """(metadata, chunk rows, {rank file: TensorInfo list}) of a committed checkpoint,
    checked against each file's index (decoded in full with ``verify``)."""
    from ..dcp.inspect import describe_metadata, verify_rank_files
    from ..dcp.metadata import read_metadata, read_metadata_file
    from ..errors import CorruptError
    from ..io.file import File
    in_series = _series_step(path, threads)
    if in_series is not None:  # an older step's files are deltas: read through the series
        series, step = in_series
        rows = series.describe(step)
        if verify:
            for file in series.entry(step).files:
                series.decode(step, file.rank)
        metadata = read_metadata_file(path)
    else:
        metadata = _dcp_call(lambda: read_metadata(path))  # read once, for all of it
        rows = _dcp_call(lambda: describe_metadata(metadata, path))
        problems = verify_rank_files(metadata, path, threads) if verify else []
        if problems:
            raise CorruptError("; ".join(problems))
    infos = {}
    for name in sorted({r["file"] for r in rows}):
        with File(os.path.join(path, name), threads=1) as f:
            infos[name] = f.infos()
    return metadata, rows, infos


def _tensor_keys(files: list[dict], rows: list[dict] | None = None) -> list:
    """The tensor of each stored chunk of ``files`` (report entries of rank files), in the
    order of :func:`all_tensors`: its fully-qualified name from ``rows`` (:func:`_details`),
    else from its name in the file (the writer's ``#<k>`` of a further chunk removed), with
    the step of a series' file."""
    fqns = {(r["file"], r["tensor"]): r["fqn"] for r in rows or []}
    keys = []
    for f in files:
        name = os.path.basename(f["input"])
        for t in f["tensors"]:
            fqn = fqns.get((name, t.name)) or re.sub(r"#[0-9]+$", "", t.name)
            keys.append((f.get("step"), fqn))
    return keys


def _chunk_map(path: str):
    """The committed checkpoint's chunk map (read without torch); None if it has none, in
    which case reading its ``.metadata`` needs torch: UsageError if torch is missing."""
    from ..dcp.chunkmap import find_chunk_map
    chunk_map = find_chunk_map(path)
    if chunk_map is None:
        import importlib.util
        try:
            found = importlib.util.find_spec("torch") is not None
        except ValueError:  # torch in sys.modules as None: imports of it fail
            found = False
        if not found:
            raise UsageError(f"{path}: no chunk map ({CHUNK_MAP}) of its committed checkpoint "
                             f"(saved by an older inshrink?): reading its {METADATA} needs "
                             f"torch, which is not installed")
    return chunk_map


def _map_infos(path: str, chunk_map) -> dict:
    """{rank file: TensorInfo list} of the files a chunk map names, from their indexes."""
    from ..io.file import File
    infos = {}
    for name in chunk_map.files:
        with File(os.path.join(path, name), threads=1) as f:
            infos[name] = f.infos()
    return infos


def _rank_files(path: str, infos: dict) -> list[dict]:
    """One report entry per rank file, with its rank."""
    files = []
    for name, tensors in infos.items():
        full = os.path.join(path, name)
        files.append(file_entry(full, None, size_or_zero(full), 0, tensors=tensors,
                                rank=rank_of(name), checkpoint=path,
                                **version_and_metadata(full)))
    return files


# -- one checkpoint --------------------------------------------------------------------------

def dcp_info(args, started: float) -> int:
    """``inshrink info`` of a sharded checkpoint: its rank files, then one line per item."""
    path = args.input
    metadata, rows, infos = _details(path)
    files = _rank_files(path, infos)
    report = build_report("info", started, [path], [], files)
    if args.json:
        print_json(report)
        return EXIT_OK
    print(clean(f"{path}: torch.distributed.checkpoint, {count(len(files), 'rank file')}, "
                f"{report['bytes_in']:,} bytes"))
    width = max([len(clean(os.path.basename(f["input"]))) for f in files] + [4])
    print(f"{'rank':>5}  {'file':<{width}}  {'bytes':>14} {'chunks':>7}")
    for f in files:
        print(clean(f"{f['rank']:>5}  {os.path.basename(f['input']):<{width}}  "
                    f"{f['bytes_in']:>14,} {len(f['tensors']):>7}"))
    print()
    _print_items(metadata, rows)
    ratio = f" ({report['ratio']:.3f}x)" if report["ratio"] else ""
    print(f"{len(metadata.state_dict_metadata)} items in {len(rows)} chunks, "
          f"{report['tensor_bytes']:,} bytes -> {report['bytes_in']:,} file bytes"
          f"{ratio}{lossy_text(all_tensors(report), _tensor_keys(files, rows))}")
    return EXIT_OK


def _print_items(metadata, rows: list[dict]) -> None:
    """One line per fully-qualified name: its whole shape, its chunks' bytes, ratio and worst
    error (a relative error per chunk: the whole tensor's lies between their extremes)."""
    by_fqn: dict[str, list[dict]] = {}
    for row in rows:
        by_fqn.setdefault(row["fqn"], []).append(row)
    names = {fqn: clean(fqn) for fqn in by_fqn}
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
                f"{clean(codecs[0] if len(codecs) == 1 else 'mixed'):<16} {nbytes:>14,} "
                f"{stored:>14,} {ratio_text(nbytes, stored):>8}")
        if lossy:
            errors = [r["error"] or {} for r in chunks]
            role = chunks[0]["role"]

            def worst(key):
                values = [e.get(key) for e in errors if finite(e.get(key)) is not None]
                return max(values) if values else None
            line += (f" {clean(role or '-'):<10} {number_text(worst('rel_l2_error')):>10} "
                     f"{number_text(worst('max_abs_error')):>10}")
        print(line)


def dcp_verify(path: str, args) -> list[dict]:
    """verify's entries for one checkpoint: one per rank file, or one naming the problem."""
    from ..errors import InshrinkError
    try:
        _, _, infos = _details(path, threads=args.threads, verify=True)
    except (InshrinkError, OSError) as exc:
        size = sum(size_or_zero(os.path.join(path, n)) for n in names_in(path))
        return [file_entry(path, None, size, 0, error=error_entry_message(exc, args))]
    return _rank_files(path, infos)


def cmd_consolidate(args, started: float) -> int:
    src = args.source = args.input
    dst = args.destination = args.output
    check_input(src)
    if is_dcp_series(src):
        raise UsageError(f"{src} is a series of sharded checkpoints: consolidate one of its "
                         f"steps (inshrink info {src} lists them), e.g. "
                         f"{os.path.join(src, STEP_DIR_SHAPE)}")
    if not is_dcp(src):
        raise UsageError(f"{src}: not a sharded checkpoint directory (no {METADATA} and "
                         f"no rank files)")
    check_checkpoint_output(dst)
    # a step of a series: the other steps' files are the series' too
    located = _step_in_series(src)
    check_output(src, dst, args.force, inside=located[0] if located else src)
    from ..dcp.consolidation import consolidate
    chunk_map = None if located else _dcp_call(lambda: _chunk_map(src))
    if chunk_map is None:  # a series' step, or saved before chunk maps: .metadata, torch
        _, rows, infos = _details(src)
        chunk_count = len(rows)
    else:
        infos = _map_infos(src, chunk_map)
        chunk_count = chunk_map.chunk_count
        rows = None  # the tensors' names in the files say their FQNs (_tensor_keys)
    source = _rank_files(src, infos)
    chunks = [t for f in source for t in f["tensors"]]
    check_lossy_overwrite(args, dst, any(not t.lossless for t in chunks))
    in_series = _series_step(src, args.threads)
    if in_series is not None:  # an older step's files are deltas: read through the series
        in_series[0].consolidate(in_series[1], dst)
    else:
        _dcp_call(lambda: consolidate(src, dst, threads=args.threads))
    written = ink_details(dst) if dst.endswith(".ink") else {}
    # the source's chunks are what the report describes: a lossy checkpoint stays reported
    # as lossy, with its measured error, though the joined file stores its values exactly
    files = [file_entry(src, dst, sum(f["bytes_in"] for f in source), os.path.getsize(dst),
                        tensors=chunks, format_version=written.get("format_version"),
                        metadata=written.get("metadata"))]
    report = build_report("consolidate", started, [src], [dst], files,
                          sum(t.nbytes for t in chunks), files[0]["bytes_in"])
    if args.json:
        print_json(report)
    elif not args.quiet:
        print(clean(f"{src} -> {dst}: {count(len(source), 'rank file')}, {chunk_count} chunks, "
                    f"{files[0]['bytes_in']:,} -> {files[0]['bytes_out']:,} bytes"
                    f"{lossy_text(chunks, _tensor_keys(source, rows))}"))
    return EXIT_OK


# -- a series of checkpoints -----------------------------------------------------------------

def _series_files(path: str):
    """(InkSeries, one report entry per rank file of every step, each with its step, rank
    and base step), from each file's index."""
    from ..dcp.series import InkSeries
    series = InkSeries(path, threads=1)
    files = []
    for entry in series.checkpoints():
        for file in entry.files:
            full = os.path.join(path, entry.dir, file.file)
            files.append(file_entry(full, None, file.bytes, 0, step=entry.step, rank=file.rank,
                                    world_size=entry.world_size, base=entry.base,
                                    weights_only=entry.weights_only, series=path,
                                    **ink_details(full)))
    return series, files


def dcp_series_info(args, started: float) -> int:
    """``inshrink info`` of a series of sharded checkpoints: one line per step."""
    path = args.input
    _, files = _series_files(path)
    report = build_report("info", started, [path], [], files)
    if args.json:
        print_json(report)
        return EXIT_OK
    steps: dict[int, list[dict]] = {}
    for f in files:
        steps.setdefault(f["step"], []).append(f)
    print(clean(f"{path}: series of DCP checkpoints, {count(len(steps), 'step')}, "
                f"{report['bytes_in']:,} bytes"))
    print(f"{'step':>12}  {'ranks':>5}  {'kind':<16} {'bytes':>14} {'ratio':>8}")
    for step, mine in steps.items():
        base = mine[0]["base"]
        nbytes = sum(t.nbytes for f in mine for t in f["tensors"])
        stored = sum(f["bytes_in"] for f in mine)
        kind = ("model only" if mine[0]["weights_only"] else "whole") if base is None \
            else f"delta -> {base}"
        print(f"{step:>12}  {mine[0]['world_size']:>5}  {kind:<16} {stored:>14,} "
              f"{ratio_text(nbytes, stored):>8}")
    ratio = f" ({report['ratio']:.3f}x)" if report["ratio"] else ""
    print(f"{report['tensor_bytes']:,} tensor bytes in {report['bytes_in']:,} file bytes"
          f"{ratio}{lossy_text(all_tensors(report), _tensor_keys(files))}")
    return EXIT_OK


def dcp_series_verify(path: str) -> tuple[list[str], list[dict]]:
    """verify's problems and entries for a DCP series: every step restored through its
    chain, every file checked against the manifest."""
    from ..dcp.series import InkSeries
    from ..errors import InshrinkError
    try:
        problems = InkSeries(path, threads=1).verify()
        if problems:
            return [f"{path}: {p}" for p in problems], []
        return [], _series_files(path)[1]
    except (InshrinkError, OSError) as exc:
        return [f"{path}: {type(exc).__name__}: {exc}"], []
