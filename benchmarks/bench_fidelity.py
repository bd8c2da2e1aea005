"""Fidelity benchmark: what checkpoint compression does to a training run's final quality,
measured against the run-to-run noise, on a fixed task list (``fidelity_tasks.py``).

One run trains a task S steps on one torch thread, checkpoints it every S/20 steps through
``inshrink.torch.Checkpointer`` and, at 10 of the 20 checkpoints (:data:`RESTORE_AT`: the
2nd, every other one to the 18th and the 19th, at 95% of the run), replaces the live model
and optimizer state by the checkpoint just saved (``restore(step)`` right after
``save(step)``); training goes on from it with the same batches. The final metric is the
test loss (8192 tokens for the language models, the 450 held-out digits for the
classifiers; accuracy as well, secondary).

Configurations (``--configs`` adds more, ``--only`` replaces the list):

=================  ==========================================================================
``ref``            no checkpoints, no restores
``lossless``       ``Checkpointer()`` (lossless) with the restores; run on ``--sanity-seeds``
                   seeds: its final loss must equal ref's bit for bit (printed)
``jitter``         the noise floor: no checkpoints; at each restore point the weights are
                   multiplied by (1 + 1e-4 N(0, 1)) (``scale``), ``--jitter-draws`` draws of
                   that noise per seed
``balanced`` ...   ``Checkpointer(policy=name)``: a preset, no search (``aggressive``,
                   ``compact`` too)
``search``         the recommended mode of docs/torch.md: ``eval_batches=task.calib_batches``,
                   ``criterion="kl"`` (every task's outputs are logits), ``epsilon_follows_lr=1``,
                   the default ``epsilon``; ``search:epsilon=0.01,restores=10`` passes other
                   Checkpointer arguments (``moments=fixed`` among them), and two that
                   change its search space: ``moments_exact=true`` (the moments lossless:
                   the weights' share of the damage alone), ``no_prune=true`` (no pruning);
                   ``predict=true`` runs the search with ``Search(predict=True)``
=================  ==========================================================================

A run's degradation is (final test loss − ref's, same seed) / ref's. Per task and
configuration the table gives the ratio of the whole series (raw fp32 bytes of every
checkpoint's model and optimizer tensors / the series' file bytes; weights and optimizer
state alone from the per-tensor stored bytes), the mean degradation over the seeds with its
min and max, and a verdict against the **noise band** of the task: ``band = max |d| + 2 std(d)``
over the jitter runs' degradations ``d``. "within noise" if ``|mean| <= band``; "worse" if
``mean − 2 sem > band`` (sem = std / sqrt(seeds) of the configuration's own degradations: the
seeds agree that it is above the band), "better" if ``mean + 2 sem < −band``; otherwise
"unclear" (outside the band, but the seeds scatter too much: more seeds would tell).

Usage::

    python benchmarks/bench_fidelity.py --seeds 3 --out results.json
    python benchmarks/bench_fidelity.py --tasks cnn-sgdm-cosine --configs search:epsilon=0.01
    python benchmarks/bench_fidelity.py --held-out    # the final check, after tuning
    python benchmarks/bench_fidelity.py --tasks cnn-sgdm-cosine --restore-at 2,4,6,8

``--out`` is rewritten after every run and ``--resume`` skips the runs it already holds; the
tables go to ``--md`` (default: next to ``--out``), the plot to ``--plot``. Progress on stderr.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time

import numpy as np
import torch

import common
import fidelity_tasks as ft
import ft_models as fm
from bench_fault import _jsonable, _search_summary, group_of, series_sizes

RESTORE_AT = (2, 4, 6, 8, 10, 12, 14, 16, 18, 19)  # checkpoint numbers, of 20
PRESETS = ("balanced", "aggressive", "compact")
DEFAULT_CONFIGS = ("ref", "lossless", "jitter", *PRESETS, "search")
KINDS = ("ref", "lossless", "jitter", "preset", "search")
JITTER_SCALE = 1e-4
JITTER_STRIDE = 7919  # separates the jitter draws' generator seeds from the steps'


def _checkpoint_numbers(text: str) -> tuple[int, ...]:
    """``--restore-at``: distinct checkpoint numbers in 1..20, comma-separated."""
    try:
        numbers = tuple(sorted({int(n) for n in text.split(",")}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    if not numbers or numbers[0] < 1 or numbers[-1] > 20:
        raise argparse.ArgumentTypeError(f"checkpoint numbers are 1 to 20, got {text!r}")
    return numbers


def parse_config(text: str) -> dict:
    """``name[:key=value,...]`` as {"label", "kind", "name", "args"}; values are JSON where
    they parse as JSON (numbers, true/false), else strings."""
    name, _, rest = text.partition(":")
    args = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise SystemExit(f"--configs: {text!r}: expected name:key=value,...")
        try:
            args[key] = json.loads(value)
        except json.JSONDecodeError:
            args[key] = value
    kind = "preset" if name in PRESETS else name
    if kind not in KINDS:
        raise SystemExit(f"--configs: unknown configuration {name!r} (one of "
                         f"{', '.join(KINDS[:3] + PRESETS + ('search',))})")
    if kind in ("ref", "lossless") and args:
        raise SystemExit(f"--configs: {name} takes no arguments")
    if kind == "jitter" and set(args) - {"scale"}:
        raise SystemExit("--configs: jitter takes scale=... only")
    return {"label": text, "kind": kind, "name": name, "args": args}


def raw_bytes(task: fm.Task) -> dict:
    """fp32 bytes of one checkpoint's model and optimizer tensors, by group."""
    raw = {"model": 0, "optimizer": 0}
    for k, t in fm.flat_state(task.model, task.optimizer, clone=False).items():
        raw[group_of(k)] += t.numel() * t.element_size()
    return raw


def checkpointer(task: fm.Task, config: dict, directory: str):
    """The configuration's ``inshrink.torch.Checkpointer`` over the task's live state."""
    from inshrink.torch import Checkpointer
    kwargs: dict = {"threads": 1}  # one core: the machine is shared
    if config["kind"] == "preset":
        kwargs.update(policy=config["name"], **config["args"])
    elif config["kind"] == "search":
        kwargs.update(eval_batches=task.calib_batches, loss_fn=task.loss_fn, criterion="kl",
                      epsilon_follows_lr=1)
        args = dict(config["args"])
        space = {}
        if args.pop("moments_exact", False):  # the weights' share of the damage alone
            space.update(exp_avg=None, exp_avg_sq=None, late_exp_avg=None)
            kwargs["moments"] = "fixed"
        if args.pop("no_prune", False):  # the search space without pruning
            space["prune"] = (0.0,)
        if space:
            from inshrink.search import SearchSpace
            kwargs["space"] = SearchSpace(**space)
        predict = args.pop("predict", False)
        kwargs.update(args)
        ckpt = Checkpointer(directory, task.model, task.optimizer, **kwargs)
        ckpt.search.predict = bool(predict)  # Search(predict=True): see its docstring
        return ckpt
    return Checkpointer(directory, task.model, task.optimizer, **kwargs)


@torch.no_grad()
def jitter(task: fm.Task, seed: int, draw: int, step: int, scale: float) -> None:
    """Multiply every weight by (1 + scale N(0, 1)), from a generator of its own."""
    g = torch.Generator().manual_seed((seed * JITTER_STRIDE + draw) * fm.STEP_SEED_STRIDE + step)
    for p in task.model.parameters():
        p.mul_(1.0 + scale * torch.randn(p.shape, generator=g, dtype=p.dtype))


def run_one(task_name: str, config: dict, seed: int, draw: int = 0,
            steps: int | None = None, workdir: str | None = None,
            restore_at: tuple[int, ...] = RESTORE_AT) -> dict:
    """Train one run of ``task_name`` under ``config`` from ``seed``, restoring at the
    checkpoints numbered ``restore_at`` (of 20); return its record."""
    torch.set_num_threads(1)
    task = ft.make_task(task_name, seed, steps=steps)
    every, kind = task.ckpt_every, config["kind"]
    restore_steps = {k * every for k in restore_at if k * every <= task.steps}
    tmp = tempfile.mkdtemp(prefix="fidelity-", dir=workdir or common.tmp_root())
    ck = checkpointer(task, config, os.path.join(tmp, "series")) \
        if kind in ("lossless", "preset", "search") else None
    raw = {"model": 0, "optimizer": 0}
    saves, restores, train_s = [], [], 0.0
    started = time.perf_counter()
    try:
        for step in range(1, task.steps + 1):
            t0 = time.perf_counter()
            task.train_step(step)
            train_s += time.perf_counter() - t0
            if step % every:
                continue
            if ck is not None:
                saves.append(_search_summary(step, ck.save(step)))
                for group, n in raw_bytes(task).items():
                    raw[group] += n
            if step in restore_steps:
                if ck is not None:
                    ck.restore(step)
                elif kind == "jitter":
                    jitter(task, seed, draw, step, config["args"].get("scale", JITTER_SCALE))
                restores.append(step)
        final = task.evaluate()
        record = {"task": task_name, "config": config["label"], "kind": kind, "seed": seed,
                  "draw": draw, "steps": task.steps, "ckpt_every": every,
                  "restores": restores, "final": final,
                  "train_seconds": train_s, "seconds": time.perf_counter() - started}
        if ck is not None:
            ck.close()
            sizes = series_sizes(ck.series.directory, ck.series.checkpoints())
            stored = sizes["stored"]
            record.update(
                raw_bytes=raw, stored_bytes=stored, stored_total=sizes["stored_total"],
                ratio=sum(raw.values()) / sizes["stored_total"],
                ratio_model=raw["model"] / stored["model"] if stored["model"] else None,
                ratio_optimizer=(raw["optimizer"] / stored["optimizer"]
                                 if stored["optimizer"] else None),
                checkpointer_seconds=ck.seconds, saves=saves)
        return _jsonable(record)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# statistics, tables, plot
# --------------------------------------------------------------------------------------------

def _stats(values: list[float]) -> dict:
    a = np.asarray(values, dtype=float)
    return {"n": len(a), "mean": float(a.mean()), "min": float(a.min()), "max": float(a.max()),
            "std": float(a.std(ddof=1)) if len(a) > 1 else 0.0}


def verdict_of(deg: dict, band: float) -> str:
    """A configuration's verdict from its degradation statistics over the seeds: "within
    noise" if ``|mean| <= band``; "worse" if even ``mean - 2 sem`` (sem: the standard error
    of the mean over the seeds) is above the band, "better" if ``mean + 2 sem`` is below
    ``-band``; else "unclear": outside the band, but the seeds scatter too much to say."""
    mean, sem = deg["mean"], deg["std"] / math.sqrt(deg["n"])
    if abs(mean) <= band:
        return "within noise"
    if mean - 2 * sem > band:
        return "worse"
    if mean + 2 * sem < -band:
        return "better"
    return "unclear"


def summarize(runs: list[dict]) -> dict:
    """Per task: the noise band and, per configuration, ratio and degradation statistics."""
    out = {}
    for task in dict.fromkeys(r["task"] for r in runs):
        rows = [r for r in runs if r["task"] == task]
        ref = {r["seed"]: r["final"] for r in rows if r["kind"] == "ref"}
        per_config: dict[str, dict] = {}
        for r in rows:
            if r["kind"] == "ref" or r["seed"] not in ref:
                continue
            c = per_config.setdefault(r["config"], {"kind": r["kind"], "deg": [], "dacc": [],
                                                    "ratio": [], "ratio_model": [],
                                                    "ratio_optimizer": [], "identical": []})
            base = ref[r["seed"]]
            c["deg"].append((r["final"]["loss"] - base["loss"]) / base["loss"])
            if "acc" in base:
                c["dacc"].append(100.0 * (r["final"]["acc"] - base["acc"]))
            for key in ("ratio", "ratio_model", "ratio_optimizer"):
                if isinstance(r.get(key), (int, float)):
                    c[key].append(r[key])
            c["identical"].append(r["final"]["loss"] == base["loss"])
        jit = [d for c in per_config.values() if c["kind"] == "jitter" for d in c["deg"]]
        band = None
        if jit:
            s = _stats(jit)
            band = max(abs(d) for d in jit) + 2 * s["std"]
        table = {}
        for label, c in per_config.items():
            s = _stats(c["deg"])
            verdict = "" if band is None or c["kind"] in ("jitter", "lossless") else \
                verdict_of(s, band)
            table[label] = {
                "kind": c["kind"], "degradation": s, "verdict": verdict,
                "delta_acc_pt": _stats(c["dacc"]) if c["dacc"] else None,
                **{k: float(np.mean(c[k])) if c[k] else None
                   for k in ("ratio", "ratio_model", "ratio_optimizer")},
                "bit_identical": all(c["identical"]) if c["kind"] == "lossless" else None}
        losses = [v["loss"] for v in ref.values()]
        out[task] = {"seeds": sorted(ref), "ref_loss": {str(k): v["loss"] for k, v in ref.items()},
                     # the seeds' own spread, for scale: what a different training seed does
                     "ref_seed_spread": _stats(losses)["std"] / float(np.mean(losses)),
                     "noise_band": band, "configs": table}
    return out


def _pct(x: float | None, digits: int = 2) -> str:
    return "—" if x is None else f"{100 * x:+.{digits}f}%"


def _x(x: float | None) -> str:
    return "—" if x is None else f"{x:.1f}×"


def markdown(summary: dict) -> str:
    """One frontier table per task."""
    parts = []
    for task, s in summary.items():
        band = s["noise_band"]
        parts.append(f"**{task}** (seeds {', '.join(map(str, s['seeds']))}; ref loss "
                     f"{np.mean(list(s['ref_loss'].values())):.4f}, std across seeds "
                     f"{_pct(s['ref_seed_spread'])[1:]}; noise band "
                     f"±{_pct(band, 3)[1:] if band is not None else '—'})\n")
        acc = any(c["delta_acc_pt"] for c in s["configs"].values())
        head = "| config | ratio | weights | optimizer | Δ loss mean | [min, max] | std |"
        head += " Δ acc (pt) |" if acc else ""
        parts.append(head + " verdict |")
        parts.append("|---" + "|---:" * (head.count("|") - 2) + "|---|")
        order = sorted(s["configs"].items(),
                       key=lambda kv: (KINDS.index(kv[1]["kind"]), kv[1]["ratio"] or 0))
        for label, c in order:
            d = c["degradation"]
            line = (f"| {label} | {_x(c['ratio'])} | {_x(c['ratio_model'])} | "
                    f"{_x(c['ratio_optimizer'])} | {_pct(d['mean'])} | "
                    f"[{_pct(d['min'])}, {_pct(d['max'])}] | {_pct(d['std'])[1:]} |")
            if acc:
                a = c["delta_acc_pt"]
                line += f" {a['mean']:+.2f} |" if a else " — |"
            verdict = c["verdict"]
            if c["kind"] == "lossless":
                verdict = "bit-identical to ref" if c["bit_identical"] else "DIFFERS from ref"
            elif c["kind"] == "jitter":
                verdict = "noise floor"
            parts.append(line + f" {verdict} |")
        parts.append("")
    return "\n".join(parts)


# a configuration whose worst seed ends this far above ref is drawn as an arrow, not a point
DIVERGED_PCT = 1000.0


def plot(summary: dict, path: str) -> None:
    """Ratio (log x) against mean degradation with min/max bars, one panel per task; a
    configuration beyond :data:`DIVERGED_PCT` as an arrow labelled with its worst seed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n = len(summary)
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.0 * rows), squeeze=False)
    style = {"jitter": ("o", "grey"), "lossless": ("s", "black"), "preset": ("D", "tab:blue"),
             "search": ("*", "tab:red")}
    for ax, (task, s) in zip(axes.flat, summary.items()):
        band = s["noise_band"]
        if band is not None:
            ax.axhspan(-100 * band, 100 * band, color="grey", alpha=0.18, label="noise band")
        ax.axhline(0, color="black", lw=0.6)
        for label, c in s["configs"].items():
            marker, color = style[c["kind"]]
            d = c["degradation"]
            x = c["ratio"] or 1.0
            y, low, high = (100 * d[k] for k in ("mean", "min", "max"))
            if high > DIVERGED_PCT:  # a run that blew up would flatten every other point
                ax.annotate(f"{label}: diverged (max {high:+.3g}%)", (x, 0.98),
                            xycoords=("data", "axes fraction"), xytext=(x, 0.80),
                            textcoords=("data", "axes fraction"), fontsize=7, ha="right",
                            color=color, arrowprops={"arrowstyle": "->", "color": color})
                continue
            ax.errorbar([x], [y], yerr=[[y - low], [high - y]],
                        fmt=marker, color=color, ms=9 if c["kind"] == "search" else 6,
                        capsize=3)
            ax.annotate(label, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=7)
        ax.set_xscale("log")
        ax.set_title(task, fontsize=9)
        ax.set_xlabel("ratio of the series (log)")
        ax.set_ylabel("final test loss vs ref (%)")
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle("Fidelity: mean degradation over seeds (bars: min–max) against the ratio; "
                 "shaded: the jitter noise band", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------

def _save_json(path: str, setup: dict, runs: list[dict]) -> None:
    from inshrink.atomic import write_file
    write_file(path, json.dumps({"setup": setup, "runs": runs,
                                 "summary": _jsonable(summarize(runs))}, indent=1).encode())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", help="comma-separated task names (default: every tuning task, "
                                    "or every held-out one with --held-out)")
    ap.add_argument("--held-out", action="store_true",
                    help="run the held-out tasks: the final check, after tuning")
    ap.add_argument("--seeds", type=int, default=3, help="training seeds 0..N-1")
    ap.add_argument("--sanity-seeds", type=int, default=1,
                    help="seeds on which lossless runs (its final loss must equal ref's)")
    ap.add_argument("--jitter-draws", type=int, default=3, help="jitter runs per seed")
    ap.add_argument("--configs", default="", help="configurations to add, comma-separated "
                    "with ';' between them when they carry arguments "
                    "(e.g. 'search:epsilon=0.01;search:restores=10')")
    ap.add_argument("--only", help="the configurations instead of the default list "
                                   "(ref is always run)")
    ap.add_argument("--steps", type=int, help="shorter runs (a smoke test)")
    ap.add_argument("--restore-at", type=_checkpoint_numbers, default=RESTORE_AT,
                    help="comma-separated checkpoint numbers (1-20) restored right after "
                         "saving (default: %(default)s); e.g. 2,4,6,8 for early restores only")
    ap.add_argument("--out", default=os.path.join(common.REPO_ROOT, "benchmarks", "results",
                                                  "fidelity.json"))
    ap.add_argument("--md", help="the tables' file (default: --out with .md)")
    ap.add_argument("--plot", default=os.path.join(common.REPO_ROOT, "benchmarks",
                                                   "fidelity.png"))
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--resume", action="store_true", help="keep --out's runs, skip them")
    args = ap.parse_args(argv)

    pool = sorted(ft.HELD_OUT) if args.held_out else list(ft.TUNING)
    tasks = args.tasks.split(",") if args.tasks else pool
    for t in tasks:
        if t not in pool:
            raise SystemExit(f"--tasks: {t!r} is not a {'held-out' if args.held_out else 'tuning'}"
                             f" task ({', '.join(pool)})")

    def split(text: str) -> list[str]:
        return [c for c in (text.split(";") if ";" in text or ":" in text
                            else text.split(",")) if c]

    labels = split(args.only) if args.only else list(DEFAULT_CONFIGS)
    labels += [c for c in split(args.configs) if c not in labels]
    if "ref" not in labels:
        labels.insert(0, "ref")
    configs = [parse_config(c) for c in labels]

    setup = {"tasks": {t: _jsonable(ft.TASKS[t]) for t in tasks},
             "held_out": args.held_out, "configs": labels, "seeds": args.seeds,
             "sanity_seeds": args.sanity_seeds, "jitter_draws": args.jitter_draws,
             "restore_at": list(args.restore_at), "jitter_scale": JITTER_SCALE,
             "steps": args.steps,
             "argv": sys.argv, "date": time.strftime("%Y-%m-%d %H:%M"),
             "machine": platform.platform(), "cpus": os.cpu_count(),
             "load_start": os.getloadavg(), "torch": torch.__version__}
    runs: list[dict] = []
    if args.resume and os.path.exists(args.out):
        with open(args.out) as fh:
            previous = json.load(fh)
        runs = previous["runs"]
        # the first invocation's setup (its date and load) stays; this one's argv is added
        setup = {**previous.get("setup", {}), "resumed": setup["argv"],
                 "resumed_date": setup["date"]}
    done = {(r["task"], r["config"], r["seed"], r["draw"]) for r in runs}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)

    plan = []
    for t in tasks:
        for seed in range(args.seeds):
            for c in configs:
                if c["kind"] == "lossless" and seed >= args.sanity_seeds:
                    continue
                draws = args.jitter_draws if c["kind"] == "jitter" else 1
                plan += [(t, c, seed, d) for d in range(draws)
                         if (t, c["label"], seed, d) not in done]
    started = time.perf_counter()
    for i, (t, c, seed, draw) in enumerate(plan, 1):
        r = run_one(t, c, seed, draw, steps=args.steps, restore_at=args.restore_at)
        runs.append(r)
        ratio = f" ratio {r['ratio']:.1f}" if "ratio" in r else ""
        print(f"[{i}/{len(plan)}] {t} {c['label']} seed {seed}"
              f"{f' draw {draw}' if c['kind'] == 'jitter' else ''}: loss "
              f"{r['final']['loss']:.5f}{ratio} ({r['seconds']:.1f} s, train "
              f"{r['train_seconds']:.1f} s; {time.perf_counter() - started:.0f} s total)",
              file=sys.stderr, flush=True)
        setup["load_end"] = os.getloadavg()
        _save_json(args.out, setup, runs)

    if not plan and runs:  # --resume with nothing left: the summary as this code computes it
        _save_json(args.out, setup, runs)
    summary = summarize(runs)
    for task, s in summary.items():
        for label, c in s["configs"].items():
            if c["kind"] == "lossless":
                print(f"sanity: {task}: lossless restores give ref's final loss bit for bit: "
                      f"{c['bit_identical']}")
    text = markdown(summary)
    print(text)
    md = args.md or os.path.splitext(args.out)[0] + ".md"
    from inshrink.atomic import write_file
    write_file(md, text.encode())
    if not args.no_plot and summary:
        plot(summary, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
