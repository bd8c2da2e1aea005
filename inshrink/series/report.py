"""What a series holds, step by step, and a picture of it.

Everything comes from the manifest and each checkpoint's index (sizes, tensor bytes, the
search report in its metadata): no tensor payload is decoded, so a report of a long series
takes as long as opening its files. matplotlib is needed for :func:`plot_series` only and is
imported when it is called (``pip install "inshrink[plot]"``); figures are rendered by its
Agg canvas without pyplot, so no display is needed.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Callable

from ..atomic import AtomicFile
from ..errors import InshrinkError, InvalidArgumentError, with_path
from ..search.stored import SEARCH_KEY
from .series import MANIFEST, Series
from ..io.file import File

PLOT_HINT = 'pip install "inshrink[plot]" (in a checkout of inshrink: pip install ".[plot]")'

MOMENTS = ("exp_avg", "exp_avg_sq")
"""Roles of optimizer moments, left out of ``max_rel_l2_error`` (large by design, see the
command line's lossy summary)."""

SEARCH_FIELDS = ("search", "bins", "embedding_bins", "prune", "protect", "prune_metric",
                 "drop", "epsilon", "baseline", "evaluations")
"""Keys of a record that come from the checkpoint's search report (all None without one)."""


def _number(value: Any) -> float | int | None:
    """``value`` if it is a finite number (the report is metadata any writer may set)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return value
    return None


def search_summary(raw: str | None) -> dict[str, Any]:
    """The fields of :data:`SEARCH_FIELDS` from a stored search report (the JSON text under
    :data:`inshrink.search.SEARCH_KEY`).

    ``search`` is the search's mode (``"guided"``, ``"neighbourhood"``...), None when there is
    no report, ``"unreadable"`` for a report of another shape. ``bins`` ... ``prune_metric``
    are the chosen configuration (None when the search kept the weights lossless), ``drop``
    the relative quality drop it measured for that choice, ``epsilon`` the drop it allowed,
    ``baseline`` the uncompressed quality, ``evaluations`` how many configurations it tried.
    """
    out: dict[str, Any] = dict.fromkeys(SEARCH_FIELDS)
    if raw is None:
        return out
    try:
        report = json.loads(raw)
    except (TypeError, ValueError, RecursionError):
        report = None
    if not isinstance(report, dict):
        out["search"] = "unreadable"
        return out
    mode = report.get("mode")
    out["search"] = mode if isinstance(mode, str) else "unknown"
    chosen = report.get("chosen")
    if isinstance(chosen, dict):
        for key in ("bins", "embedding_bins", "prune", "protect"):
            out[key] = _number(chosen.get(key))
        metric = chosen.get("prune_metric")
        out["prune_metric"] = metric if isinstance(metric, str) else None
    result = report.get("chosen_result")
    if isinstance(result, dict):
        out["drop"] = _number(result.get("drop"))
    for key, stored in (("epsilon", "epsilon"), ("baseline", "baseline"),
                        ("evaluations", "evaluations_used")):
        out[key] = _number(report.get(stored))
    return out


def series_report(directory: str | os.PathLike) -> list[dict[str, Any]]:
    """One record per checkpoint of the series in ``directory``, in step order.

    Returns
    -------
    list of dict
        ``step``, ``file``, ``keyframe`` (stored whole) and ``base`` (the file a delta is
        against, None for a keyframe), from the manifest; ``stored_bytes`` (the file's size),
        ``tensor_bytes`` (the tensors' raw size, from the file's index), ``ratio``
        (``tensor_bytes / stored_bytes``), ``lossy_tensors`` and ``max_rel_l2_error`` (the
        worst relative L2 error of a quantized weight or embedding, optimizer moments left
        out; None when there is none), and the search's fields (:func:`search_summary`).

    Raises
    ------
    InvalidArgumentError
        ``directory`` is not a series (no ``manifest.json``).
    CorruptError
        The manifest or a checkpoint's index is damaged (the path is named).
    """
    directory = os.fspath(directory)
    if not os.path.isfile(os.path.join(directory, MANIFEST)):
        raise InvalidArgumentError(f"{directory}: not a series (no {MANIFEST})")
    records = []
    for entry in Series(directory).checkpoints():
        path = os.path.join(directory, entry.file)
        try:
            with File(path, threads=1) as f:  # the index only
                infos, metadata = f.infos(), f.metadata
        except InshrinkError as exc:
            raise with_path(exc, path) from None
        tensor_bytes = sum(i.nbytes for i in infos)
        lossy = [i for i in infos if not i.lossless]
        errors = [e for i in lossy if i.role not in MOMENTS
                  and (e := _number((i.error or {}).get("rel_l2_error"))) is not None]
        records.append({
            "step": entry.step, "file": entry.file, "keyframe": entry.keyframe,
            "base": entry.base, "stored_bytes": entry.bytes, "tensor_bytes": tensor_bytes,
            "ratio": tensor_bytes / entry.bytes if entry.bytes else None,
            "lossy_tensors": len(lossy), "max_rel_l2_error": max(errors) if errors else None,
            **search_summary(metadata.get(SEARCH_KEY))})
    return records


def _kept_lossless(record: dict[str, Any]) -> bool:
    """A search ran and chose no quantization for the weights."""
    return record["search"] not in (None, "unreadable") and record["bins"] is None


def format_table(records: list[dict[str, Any]]) -> str:
    """The records as a text table, one line per step."""
    def num(value: Any, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    lines = [f"{'step':>10} {'kind':<8} {'stored':>12} {'ratio':>7} {'search':<13} "
             f"{'bins':>5} {'emb':>4} {'prune':>6} {'protect':>8} {'drop':>8} {'epsilon':>8}"]
    for r in records:
        search = r["search"] or "-"
        if _kept_lossless(r):
            search += "*"  # searched, weights kept lossless
        lines.append(
            f"{r['step']:>10} {'keyframe' if r['keyframe'] else 'delta':<8} "
            f"{r['stored_bytes']:>12,} {num(r['ratio'], '.2f'):>7} {search[:13]:<13} "
            f"{num(r['bins'], 'd'):>5} {num(r['embedding_bins'], 'd'):>4} "
            f"{num(r['prune'], '.3f'):>6} {num(r['protect'], '.4f'):>8} "
            f"{num(r['drop'], '.4f'):>8} {num(r['epsilon'], '.4f'):>8}")
    total = sum(r["stored_bytes"] for r in records)
    lines.append(f"{len(records)} checkpoints, {total:,} bytes stored"
                 + ("; * = the search kept the weights lossless"
                    if any(map(_kept_lossless, records)) else ""))
    return "\n".join(lines)


def require_matplotlib() -> Callable[..., Any]:
    """A maker of matplotlib figures drawn by the Agg canvas; InvalidArgumentError naming the
    extra to install if matplotlib is missing.

    The figures are made without pyplot: no display is needed, and the caller's pyplot
    backend and open figures are left alone (``matplotlib.use("Agg")`` would switch a
    notebook's backend)."""
    try:
        import matplotlib  # noqa: F401  (first: its absence is what the message is about)
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise InvalidArgumentError(f"plotting needs matplotlib: {PLOT_HINT}") from None

    def figure(**kwargs: Any) -> Any:
        fig = Figure(**kwargs)
        FigureCanvasAgg(fig)  # attaches itself: savefig renders with Agg
        return fig
    return figure


def _unit(largest: float) -> tuple[str, float]:
    """A unit for byte counts up to ``largest`` and its scale factor."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if largest >= 1 << shift:
            return unit, 1 / (1 << shift)
    return "bytes", 1.0


def _human(count: int) -> str:
    unit, scale = _unit(count)
    return f"{count:,} bytes" if unit == "bytes" else f"{count * scale:,.2f} {unit}"


def _scale(ax: Any) -> None:
    """Linear from 0 unless the values spread over more than 20x (deltas far smaller than
    whole files): then logarithmic, with plain numbers as tick labels."""
    values = [v for line in ax.get_lines() for v in line.get_ydata() if v == v and v > 0]
    if values and max(values) > 20 * min(values):
        ax.set_yscale("log")
        from matplotlib.ticker import FuncFormatter, NullFormatter
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    elif values:
        ax.set_ylim(0, max(values) * 1.1)  # room above the highest point


def _unsearched_spans(steps: list[int], missing: list[bool]) -> list[tuple[float, float]]:
    """x ranges covering each run of steps without a search, halfway to their neighbours."""
    spans = []
    for i, (step, gone) in enumerate(zip(steps, missing)):
        if not gone:
            continue
        left = (steps[i - 1] + step) / 2 if i else step - (steps[1] - step if
                                                          len(steps) > 1 else 1) / 2
        right = (step + steps[i + 1]) / 2 if i + 1 < len(steps) else \
            step + (step - steps[i - 1] if i else 1) / 2
        if spans and spans[-1][1] == left:
            spans[-1] = (spans[-1][0], right)
        else:
            spans.append((left, right))
    return spans


def plot_series(directory: str | os.PathLike, out_png: str | os.PathLike | None = None,
                records: list[dict[str, Any]] | None = None) -> Any:
    """Draw a series per step: stored size (whole vs delta files) against the raw tensor
    size, the ratio, and, where a configuration search chose the checkpoint's weights, the
    levels, the prune and protect fractions and the quality drop it measured (with the drop
    it allowed).

    Parameters
    ----------
    directory : str or os.PathLike
        The series.
    out_png : str or os.PathLike, optional
        Where to write the picture (PNG, written atomically).
    records : list of dict, optional
        :func:`series_report`'s records, if already made.

    Returns
    -------
    matplotlib.figure.Figure
        The figure (its first axes hold one point per checkpoint, in the lines labelled
        ``whole`` and ``delta``).

    Raises
    ------
    InvalidArgumentError
        matplotlib is not installed (``pip install "inshrink[plot]"``), or not a series.
    """
    figure = require_matplotlib()
    if records is None:
        records = series_report(directory)
    if not records:
        raise InvalidArgumentError(f"{os.fspath(directory)}: the series is empty")
    searched = any(r["search"] for r in records)
    panels = 5 if searched else 2
    fig = figure(figsize=(9, 2.2 * panels + 0.8), layout="constrained")
    axes = fig.subplots(panels, 1, sharex=True, squeeze=False)[:, 0]
    steps = [r["step"] for r in records]
    nan = float("nan")

    def values(key: str, scale: float = 1.0) -> list[float]:
        return [nan if r[key] is None else r[key] * scale for r in records]

    unit, scale = _unit(max(max(r["tensor_bytes"], r["stored_bytes"]) for r in records))
    kinds = (("whole", True, "o", "tab:blue"), ("delta", False, "s", "tab:orange"))
    size, ratio = axes[0], axes[1]
    size.plot(steps, values("tensor_bytes", scale), "-", color="0.6", lw=1,
              label="raw tensors", gid="raw")
    for label, keyframe, marker, color in kinds:
        mine = [r for r in records if r["keyframe"] is keyframe]
        size.plot([r["step"] for r in mine], [r["stored_bytes"] * scale for r in mine],
                  marker, color=color, label=f"{label} file", gid=label)
        ratio.plot([r["step"] for r in mine],
                   [nan if r["ratio"] is None else r["ratio"] for r in mine], marker,
                   color=color, label=f"{label} file", gid=label)
    stored = _human(sum(r["stored_bytes"] for r in records))
    raw = _human(sum(r["tensor_bytes"] for r in records))
    size.set_title(f"{os.path.basename(os.path.abspath(directory))}: {len(records)} "
                   f"checkpoints, {stored} stored for {raw} of tensors", loc="left")
    size.set_ylabel(f"stored ({unit})")
    size.legend(loc="best", fontsize="small")
    ratio.set_ylabel("ratio (raw / stored)")
    for ax in (size, ratio):
        _scale(ax)
        ax.grid(True, which="major", alpha=0.3)
    if searched:
        bins, fractions, drop = axes[2], axes[3], axes[4]
        bins.plot(steps, values("bins"), "o-", label="weights", gid="bins")
        bins.plot(steps, values("embedding_bins"), "^--", label="embedding tables",
                  gid="embedding_bins")
        bins.set_yscale("log", base=2)
        from matplotlib.ticker import FuncFormatter
        bins.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        bins.set_ylabel("levels (bins)")
        fractions.plot(steps, values("prune", 100), "o-", color="tab:blue", label="pruned",
                       gid="prune")
        fractions.set_ylabel("pruned (%)", color="tab:blue")
        fractions.set_ylim(bottom=0)
        protect = fractions.twinx()  # a 0.05 % protect would vanish beside a 50 % prune
        protect.plot(steps, values("protect", 100), "^--", color="tab:green",
                     label="protected (exact)", gid="protect")
        protect.set_ylabel("protected (%)", color="tab:green")
        protect.set_ylim(bottom=0)
        drop.plot(steps, values("drop"), "o-", color="tab:red", label="measured drop",
                  gid="drop")
        drop.step(steps, values("epsilon"), "--", where="mid", color="0.4",
                  label="allowed (epsilon)", gid="epsilon")
        drop.axhline(0, color="0.8", lw=0.8)
        drop.set_ylabel("quality drop\n(relative, < 0: better)")
        lossless = [r["step"] for r in records if _kept_lossless(r)]
        if lossless:  # searched, nothing fitted: say so instead of leaving a silent gap
            for ax in (bins, drop):
                ax.plot(lossless, [ax.get_ylim()[0]] * len(lossless), "x", color="k",
                        clip_on=False, label="weights kept lossless", gid="lossless")
        unsearched = _unsearched_spans(steps, [r["search"] in (None, "unreadable")
                                               for r in records])
        for ax in (bins, fractions, drop):
            for i, (left, right) in enumerate(unsearched):  # a gap that says why
                named = i == 0 and ax is not fractions  # in the legends, once each
                ax.axvspan(left, right, color="0.92", zorder=0, gid="no_search",
                           label="no readable search report" if named else None)
        for ax in (bins, drop):
            ax.legend(loc="best", fontsize="small")
        for ax in (bins, fractions, drop):
            ax.grid(True, alpha=0.3)
    else:
        ratio.text(0.99, 0.04, "no configuration search stored in this series",
                   transform=ratio.transAxes, ha="right", fontsize="small", color="0.4")
    axes[-1].set_xlabel("step")
    if out_png is not None:
        with AtomicFile(out_png) as out:
            fig.savefig(out.file, format="png", dpi=110)
    return fig
