"""Fault-tolerance benchmark: train, checkpoint, fail, restore from a (compressed) checkpoint.

    python benchmarks/bench_fault.py                   # the full sweep, both models
    python benchmarks/bench_fault.py --quick           # a tiny smoke run (~1 min)
    python benchmarks/bench_fault.py --models cnn --only ref,lossless,eps0.05

The seed paper's experiment at small scale on the CPU (models and data: ``ft_models.py``). Each
run trains a model for N steps, saves a checkpoint every K steps with one *method*, and injects
F failures evenly spaced over the run: at a failure, after step f, the live model and optimizer
state are thrown away (every tensor set to NaN in place) and restored from the latest checkpoint
(step c <= f); training goes on from step c + 1, replaying the lost steps with the same batches
(the batch of a step is a function of (seed, step)). Failures never fall on a checkpoint step
(moved K/2 later if they would), so each one loses work that is replayed. The final quality is
compared with the uninterrupted run with the same seed and uncompressed checkpoints (``ref``).

Methods (all keep the AdamW ``step`` counters exact):

* ``none``: in-memory clones, uncompressed (the reference);
* ``lossless``: ``inshrink.Series`` without a policy (lossless, deltas between checkpoints);
  with failures it must end bit-identical to the reference;
* ``fp16``: every float tensor (weights and optimizer state) cast to float16 and back;
* ``int8``: per-tensor symmetric int8, scale = max|x| / 127 (4 bytes of scale per tensor);
  for both casts the ratio is fp32 bytes / cast bytes (no entropy coder); the table also gives
  the ratio with zstd-3 on the cast bytes (``ratio+zstd``, not timed);
* ``inshrink``: ``inshrink.torch.Checkpointer`` (lossy series; a configuration search on
  held-out calibration batches keeps the loss within ``epsilon``).

Per run: the end-to-end compression ratio of the whole series (sum of the raw fp32 bytes of all
checkpoints / sum of the stored bytes; for series on disk the stored bytes are the files'
sizes at the end of the run, deltas included), also for the weights (``model.*``) and the
optimizer state (``optimizer.*``) alone (sum of the per-tensor stored bytes, no container); the
final quality and its relative degradation against ``ref`` ((q - q_ref) / |q_ref| for losses,
positive = worse; (q_ref - q) / |q_ref| for accuracy); the time spent in the method's save and
restore calls as a fraction of the training time of the run (training steps only, replays
included); restores done and steps replayed.

Runs (``--only`` takes these names, comma-separated; ``ref`` always runs first):

    ref        none, no failure             seed      none, no failure, seed + 1 (spread)
    lossless   lossless, F=10               fp16      fp16, F=10
    int8       int8, F=10                   eps0.01   inshrink eps 0.01, F=10
    eps0.05    inshrink eps 0.05, F=10      eps0.1    inshrink eps 0.1, F=10
    f5, f20    inshrink eps 0.05, F=5 / 20  k2x       inshrink eps 0.05, F=10, every 2K steps
    khalf      inshrink eps 0.05, F=10, every K/2 steps
    async0.05  eps0.05 with Checkpointer(async_=True): its time is what the loop was blocked
    loss       inshrink eps 0.05, F=10, the Checkpointer's own defaults: the search measures
               the loss on the calibration batches, epsilon follows the square of the
               learning rate's ratio (what the lm task used before 2026-11-30)
    kl_sq      inshrink eps 0.05, F=10, the KL criterion with the square of that ratio
    none       none, F=10 (not in the default list)
    balanced, aggressive, compact
               the preset, no search (Checkpointer(policy=name)), F=10
    eps0.005, eps0.002
               inshrink eps 0.005 / 0.002, F=10

Epsilon is the Checkpointer's bound on the run's final quality, shared by its ``restores``
(default 5): each checkpoint's search gets epsilon / 5 (before 2026-12-01, epsilon itself). Tasks
with ``late_failures`` (gpt, mixer) restore every 2K steps, the last K before the end.

The ``inshrink`` runs use the Checkpointer's defaults plus the task's recommended search
settings (``Task.search_settings``) unless they say otherwise. For the lm task: the search
measures a candidate by the live model's loss plus its output KL divergence
(``criterion="kl"``) and epsilon is scaled linearly by the learning rate's ratio to its peak
(never below a tenth); the cnn task keeps its accuracy within epsilon, epsilon following the
square of that ratio. Both: shared bins for the weights, and the search's default moment
configurations: the first moment (Adam's ``exp_avg``, SGD's momentum) zeros plus its 0.05%
largest entries kept exactly (2 signed-log levels below half the peak learning rate), Adam's
``exp_avg_sq`` at 4 log-domain levels (before commit 4b9c052, of a matrix as row x column
factors, ``domain="factored"``, of a vector at 2 log-domain levels). ``--lm-beta2`` sets
AdamW's beta2 for the lm task (default 0.95).

Earlier studies, not in the default list, pin the search settings they were measured with
(the loss criterion; RESULTS.md has their numbers): ``mom2`` / ``mom4`` both moments at 2 / 4
levels; ``v4`` ``exp_avg_sq`` at 4 levels; ``lin`` / ``const`` epsilon linear in / independent
of the learning rate; ``alloc`` per-tensor bins (curvature); ``sigma1`` weight levels fitted
by frequency only. Runs that split the damage (epsilon linear, ``exp_avg_sq`` 4 levels):
``wonly`` weights searched, moments exact; ``oonly`` weights lossless (no search), moments
zero + 4 levels; ``o_v4`` first moment exact; ``o_m0p1`` its 1% largest exact; ``o_m2`` /
``o_m4`` at 2 / 4 levels. ``rel0.2`` / ``rel0.3``: a relative-error bound next to epsilon
(``Checkpointer(max_rel_l2=...)``). Where a restore's damage comes from, with the task's
search settings: ``r_mexact`` moments exact (weights searched), ``r_wexact`` weights lossless
(moments as the default space stores them before the late switch); ``early5`` / ``late5``
only the first / last five of the ten failures; ``m_v4`` the second moment at 4 log levels
instead of row x column factors; ``m_m2`` the first moment at 2 signed-log levels from the
start (no momentum restart). ``eps0.05T``: ``eps0.05`` with ``Checkpointer(total_steps=N)``;
``floor0.3``: ``eps0.05`` with the bound's floor at 0.3 instead of ``EPSILON_FLOOR`` (0.1).

``--ref-json`` takes the ``ref`` run from an earlier output with the same seed (the reference
does not depend on inshrink) instead of training it again.

Outputs: JSON (``--out``, default ``benchmarks/results/fault.json``, written after every run),
a markdown table (printed, and next to the JSON as ``.md``) and a plot (``--plot``, default
``benchmarks/fault_tolerance.png``): relative degradation against the end-to-end ratio.
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
import traceback

import numpy as np
import torch

import common
import ft_models as fm

inshrink, _inshrink_err = common.import_inshrink(("Series", "open"))

RESULTS = os.path.join(common.REPO_ROOT, "benchmarks", "results")
SEARCH_PREDICT = False  # --search-predict: Search(predict=True) in the searched runs


def group_of(name: str) -> str:
    return name.split(".", 1)[0] if name.startswith(("model.", "optimizer.")) else "other"


def is_counter(name: str, t: torch.Tensor) -> bool:
    """Optimizer step counters: kept exact by every method."""
    return name.endswith(".step") or not t.is_floating_point()


class Method:
    """save(step) / restore() -> step of the live ``model`` and ``optimizer`` of a task;
    ``seconds``: time spent in save and restore; ``sizes()``: raw and stored bytes by group."""

    name = ""

    def __init__(self, task: fm.Task, workdir: str):
        self.task, self.workdir = task, workdir
        self.model, self.optimizer = task.model, task.optimizer
        self.seconds = 0.0
        self.save_seconds = 0.0
        self.restore_seconds = 0.0
        self.raw = {"model": 0, "optimizer": 0, "other": 0}
        self.stored_bytes = {"model": 0, "optimizer": 0, "other": 0}
        self.stored_zstd = {"model": 0, "optimizer": 0, "other": 0}
        self.saves = 0

    def account_raw(self) -> None:
        for k, t in fm.flat_state(self.model, self.optimizer, clone=False).items():
            self.raw[group_of(k)] += t.numel() * t.element_size()

    def save(self, step: int) -> dict:
        t0 = time.perf_counter()
        info = self._save(step) or {}
        dt = time.perf_counter() - t0
        self.seconds += dt
        self.save_seconds += dt
        self.saves += 1
        self.account_raw()
        return info

    def restore(self) -> int:
        t0 = time.perf_counter()
        step = self._restore()
        dt = time.perf_counter() - t0
        self.seconds += dt
        self.restore_seconds += dt
        return step

    def sizes(self) -> dict:
        """{"raw": {group: bytes}, "stored": {group: bytes}, "stored_total": bytes, ...}"""
        return {"raw": dict(self.raw), "stored": dict(self.stored_bytes),
                "stored_total": sum(self.stored_bytes.values())}

    def extra(self) -> dict:
        return {}

    def close(self) -> None:
        pass


class NoneMethod(Method):
    name = "none"

    def _save(self, step):
        self.ckpt = (step, fm.flat_state(self.model, self.optimizer))
        for k, t in self.ckpt[1].items():
            self.stored_bytes[group_of(k)] += t.numel() * t.element_size()

    def _restore(self):
        step, flat = self.ckpt
        fm.load_flat_state(self.model, self.optimizer, flat)
        return step


class CastMethod(Method):
    """fp16 or int8 (per-tensor absmax) of every float tensor; step counters exact."""

    def __init__(self, task, workdir, kind: str):
        super().__init__(task, workdir)
        self.kind = self.name = kind
        import zstandard
        self.zstd = zstandard.ZstdCompressor(level=3)

    def _encode(self, t: torch.Tensor):
        if self.kind == "fp16":
            return t.to(torch.float16), None
        scale = t.abs().max().item() / 127.0
        scale = scale if scale > 0 and math.isfinite(scale) else 1.0
        return torch.round(t / scale).clamp_(-127, 127).to(torch.int8), scale

    def _save(self, step):
        flat = fm.flat_state(self.model, self.optimizer, clone=False)
        enc = {}
        for k, t in flat.items():
            enc[k] = (t.clone(), None, True) if is_counter(k, t) else (*self._encode(t), False)
        self.ckpt = (step, enc)

    def save(self, step):
        info = super().save(step)
        for k, (q, scale, exact) in self.ckpt[1].items():  # sizes: not timed
            n = q.numel() * q.element_size() + (4 if scale is not None else 0)
            self.stored_bytes[group_of(k)] += n
            z = len(self.zstd.compress(q.contiguous().numpy().tobytes()))
            self.stored_zstd[group_of(k)] += min(z, q.numel() * q.element_size()) + (
                4 if scale is not None else 0)
        return info

    def _restore(self):
        step, enc = self.ckpt
        flat = {k: (q.clone() if exact else
                    (q.to(torch.float32) if scale is None else q.to(torch.float32) * scale))
                for k, (q, scale, exact) in enc.items()}
        fm.load_flat_state(self.model, self.optimizer, flat)
        return step

    def sizes(self):
        s = super().sizes()
        s["stored_zstd"] = dict(self.stored_zstd)
        s["stored_zstd_total"] = sum(self.stored_zstd.values())
        return s


def series_sizes(directory: str, entries) -> dict:
    """Stored bytes of a series on disk: file sizes, and per-tensor stored bytes by group."""
    by_group = {"model": 0, "optimizer": 0, "other": 0}
    files = 0
    for e in entries:
        path = os.path.join(directory, e.file)
        files += os.path.getsize(path)
        with inshrink.open(path, threads=1) as f:
            for info in f.infos():
                by_group[group_of(info.name)] += info.stored_bytes
    return {"stored": by_group, "stored_total": files,
            "keyframes": sum(1 for e in entries if e.keyframe), "files": len(entries)}


class LosslessMethod(Method):
    name = "lossless"

    def __init__(self, task, workdir, keyframe_every=10):
        super().__init__(task, workdir)
        self.dir = os.path.join(workdir, "lossless")
        self.series = inshrink.Series(self.dir, policy=None, keyframe_every=keyframe_every,
                                      threads=1)

    def _save(self, step):
        flat = fm.flat_state(self.model, self.optimizer, clone=False)
        self.series.save(step, {k: t.numpy() for k, t in flat.items()})

    def _restore(self):
        step = self.series.latest()
        state = self.series.load(step)
        fm.load_flat_state(self.model, self.optimizer,
                           {k: torch.from_numpy(np.array(v)) for k, v in state.items()})
        return step

    def sizes(self):
        s = super().sizes()
        s.update(series_sizes(self.dir, self.series.checkpoints()))
        return s


class InshrinkMethod(Method):
    name = "inshrink"

    def __init__(self, task, workdir, epsilon: float, keyframe_every=10, max_evals=24,
                 moment_bins: tuple | None = None, space: dict | None = None,
                 checkpointer: dict | None = None, policy: dict | None = None,
                 preset: str | None = None):
        super().__init__(task, workdir)
        from inshrink.torch import Checkpointer
        self.dir = os.path.join(workdir, "inshrink")
        kwargs = dict(eval_batches=task.calib_batches, epsilon=epsilon,
                      keyframe_every=keyframe_every, max_evals=max_evals, threads=1)
        space = dict(space or {})  # SearchSpace fields that differ from the default
        if moment_bins is not None:  # the moments' fixed configuration, instead of the default
            from inshrink import QuantConfig
            (b1, d1), (b2, d2) = moment_bins  # (levels, domain or None: the role's default)
            space.update(exp_avg=QuantConfig(bins=b1, domain=d1),
                         exp_avg_sq=QuantConfig(bins=b2, domain=d2))
        if space:
            from inshrink.search import SearchSpace
            kwargs["space"] = SearchSpace(**space)
        settings = {**task.search_settings, **(checkpointer or {})}
        if task.search_metric is not None and settings.get("criterion") != "kl":
            kwargs["metric"] = task.search_metric  # higher is better
        else:
            kwargs["loss_fn"] = task.loss_fn
        if policy is not None:  # no search: weights lossless, the moments as given
            from inshrink.encode.policy import Policy, QuantConfig
            for key in ("eval_batches", "metric", "loss_fn"):
                kwargs.pop(key, None)
            kwargs["policy"] = Policy({role: QuantConfig(**kw) for role, kw in policy.items()
                                       if kw is not None})
        if preset is not None:  # a named policy, no search (what a Series with it stores)
            for key in ("eval_batches", "metric", "loss_fn", "epsilon"):
                kwargs.pop(key, None)
            kwargs["policy"] = preset
            settings = {}
        self.ck = Checkpointer(self.dir, self.model, self.optimizer, **kwargs, **settings)
        if SEARCH_PREDICT and self.ck.search is not None:
            self.ck.search.predict = True  # --search-predict
        self.epsilon = epsilon
        self.log = []

    def _save(self, step):
        info = self.ck.save(step)
        self.log.append(_search_summary(step, info))
        return info

    def _restore(self):
        return int(self.ck.restore())

    def sizes(self):
        self.ck.wait()  # async: the last save may still be writing (not timed: after the run)
        s = super().sizes()
        s.update(series_sizes(self.ck.series.directory, self.ck.series.checkpoints()))
        return s

    def extra(self):
        evals = [e.get("evaluations") or 0 for e in self.log]
        return {"checkpointer_seconds": getattr(self.ck, "seconds", None),
                "search_seconds": sum(e.get("search_seconds") or 0 for e in self.log),
                "evaluations": sum(evals),
                "evaluations_stopped": sum(e.get("evaluations_stopped") or 0 for e in self.log),
                # forward passes of the quality callback over one calibration batch
                "quality_passes": getattr(self.ck.quality, "passes", None),
                "lossless_weights": sum(
                    1 for e in self.log if "mode" in e and e.get("chosen") is None),
                "saves_log": self.log}


def _search_summary(step: int, info) -> dict:
    """The essentials of one Checkpointer.save() answer and its search report."""
    info = info if isinstance(info, dict) else {}
    out = {"step": step, "bytes": info.get("bytes"), "seconds": info.get("seconds")}
    rep = info.get("search")
    if isinstance(rep, dict):
        chosen = rep.get("chosen_result") or {}
        out.update(mode=rep.get("mode"), chosen=rep.get("chosen"),
                   evaluations=rep.get("evaluations_used"), cap_reached=rep.get("cap_reached"),
                   evaluations_stopped=sum(bool(e.get("stopped"))
                                           for e in rep.get("evaluations") or []),
                   baseline=rep.get("baseline"), drop=chosen.get("drop"),
                   weights_ratio=chosen.get("ratio"), search_seconds=rep.get("seconds"),
                   allocation=rep.get("allocation"),
                   moments={role: (m.get(role) or {}).get("chosen", "fixed")
                            for role in ("exp_avg", "exp_avg_sq")
                            for m in [rep.get("moments") or {}]} if rep.get("moments")
                   else None,
                   tried=[[*(e["choice"][k] for k in ("bins", "embedding_bins", "prune",
                                                      "protect")), e.get("drop"), e["feasible"]]
                          for e in rep.get("evaluations") or []])
    return _jsonable(out)


def _jsonable(x):
    """A JSON-friendly copy of a search report (numbers, strings, lists, dicts)."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (bool, int, str)) or x is None:
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else str(x)
    if isinstance(x, (np.integer, np.floating)):
        return _jsonable(x.item())
    if hasattr(x, "__dict__"):
        return _jsonable({k: v for k, v in vars(x).items() if not k.startswith("_")})
    return repr(x)


# --------------------------------------------------------------------------------------------
# one run
# --------------------------------------------------------------------------------------------

LOSS_SQ = dict(criterion="loss", epsilon_follows_lr=2)  # the search settings of 2026-11-30

RUNS = {
    "ref": dict(method="none", failures=0),
    "seed": dict(method="none", failures=0, seed_offset=1),
    "none": dict(method="none", failures=10),
    "lossless": dict(method="lossless", failures=10),
    "fp16": dict(method="fp16", failures=10),
    "int8": dict(method="int8", failures=10),
    "eps0.01": dict(method="inshrink", epsilon=0.01, failures=10),
    "eps0.05": dict(method="inshrink", epsilon=0.05, failures=10),
    # the same with Checkpointer(async_=True): the method's time is then the time the loop
    # was blocked (staging, waiting for the previous save, restores)
    "async0.05": dict(method="inshrink", epsilon=0.05, failures=10,
                      checkpointer=dict(async_=True)),
    "eps0.1": dict(method="inshrink", epsilon=0.1, failures=10),
    "eps0.005": dict(method="inshrink", epsilon=0.005, failures=10),
    "eps0.002": dict(method="inshrink", epsilon=0.002, failures=10),
    "f5": dict(method="inshrink", epsilon=0.05, failures=5),
    "f20": dict(method="inshrink", epsilon=0.05, failures=20),
    "k2x": dict(method="inshrink", epsilon=0.05, failures=10, every_mult=2),
    "khalf": dict(method="inshrink", epsilon=0.05, failures=10, every_mult=0.5),
    # the library's defaults (the loss on the calibration batches, epsilon following the square
    # of the learning rate's ratio), and the KL criterion with that square
    "loss": dict(method="inshrink", epsilon=0.05, failures=10,
                 checkpointer=dict(criterion="loss", epsilon_follows_lr=2)),
    "loss0.1": dict(method="inshrink", epsilon=0.1, failures=10,
                    checkpointer=dict(criterion="loss", epsilon_follows_lr=2)),
    "kl_sq": dict(method="inshrink", epsilon=0.05, failures=10,
                  checkpointer=dict(criterion="kl", epsilon_follows_lr=2)),
    # the named presets, no search (Checkpointer(policy=name), i.e. a Series with it)
    "balanced": dict(method="inshrink", epsilon=None, failures=10, preset="balanced"),
    "aggressive": dict(method="inshrink", epsilon=None, failures=10, preset="aggressive"),
    "compact": dict(method="inshrink", epsilon=None, failures=10, preset="compact"),
    # where a late restore's lasting damage comes from, with the task's search settings
    # (2026-12-01): moments exact, weights searched / weights exact, moments as the default
    # space stores them / the second moment at 16 log levels instead of row x column factors
    "r_mexact": dict(method="inshrink", epsilon=0.05, failures=10,
                     space=dict(exp_avg=None, exp_avg_sq=None, late_exp_avg=None)),
    "r_wexact": dict(method="inshrink", epsilon=0.05, failures=10,
                     policy=dict(exp_avg=dict(bins=0), exp_avg_sq=dict(bins=2,
                                                                       domain="factored"))),
    "r_m0": dict(method="inshrink", epsilon=0.05, failures=10,
                 policy=dict(exp_avg=dict(bins=0), exp_avg_sq=None)),
    "r_m2": dict(method="inshrink", epsilon=0.05, failures=10,
                 policy=dict(exp_avg=dict(bins=2), exp_avg_sq=dict(bins=2, domain="factored"))),
    "r_m8": dict(method="inshrink", epsilon=0.05, failures=10,
                 policy=dict(exp_avg=dict(bins=8), exp_avg_sq=dict(bins=2, domain="factored"))),
    "r_vfac": dict(method="inshrink", epsilon=0.05, failures=10,
                   policy=dict(exp_avg=None, exp_avg_sq=dict(bins=2, domain="factored"))),
    # the run's length known to the Checkpointer (Checkpointer(total_steps=N))
    "eps0.05T": dict(method="inshrink", epsilon=0.05, failures=10, total_steps=True),
    # the bound's floor at the end of the schedule: 0.3 of epsilon / restores instead of 0.1
    "floor0.3": dict(method="inshrink", epsilon=0.05, failures=10, epsilon_floor=0.3),
    # which restores leave the damage: the first / last five of the ten failures only
    "early5": dict(method="inshrink", epsilon=0.05, failures=10, keep=(0, 5)),
    "late5": dict(method="inshrink", epsilon=0.05, failures=10, keep=(5, 10)),
    # the moments' share of that damage: the second moment at 4 log levels instead of row x
    # column factors (the default since) / the first moment at 2 signed-log levels from the
    # start (no restart), the second factored
    "m_v4": dict(method="inshrink", epsilon=0.05, failures=10, moment_bins=((0, None), (4, None))),
    "m_m2": dict(method="inshrink", epsilon=0.05, failures=10,
                 moment_bins=((2, None), (2, "factored"))),
    # earlier studies, with the search settings they were measured with (RESULTS.md)
    "mom2": dict(method="inshrink", epsilon=0.05, failures=10, checkpointer=LOSS_SQ,
                 moment_bins=((2, None), (2, None))),
    "mom4": dict(method="inshrink", epsilon=0.05, failures=10, checkpointer=LOSS_SQ,
                 moment_bins=((4, None), (4, None))),
    "v4": dict(method="inshrink", epsilon=0.05, failures=10, checkpointer=LOSS_SQ,
               moment_bins=((0, None), (4, None))),
    "lin": dict(method="inshrink", epsilon=0.05, failures=10,
                checkpointer=dict(criterion="loss", epsilon_follows_lr=1)),
    "alloc": dict(method="inshrink", epsilon=0.05, failures=10, checkpointer=LOSS_SQ,
                  space=dict(per_tensor_bins=True)),
    "const": dict(method="inshrink", epsilon=0.05, failures=10,
                  checkpointer=dict(criterion="loss", epsilon_follows_lr=False)),
    "sigma1": dict(method="inshrink", epsilon=0.05, failures=10, checkpointer=LOSS_SQ,
                   space=dict(sigma=1.0)),
    # where the damage comes from: moments exact / weights lossless (epsilon linear in the
    # learning rate, exp_avg_sq 4 levels, as measured at 18685fb)
    "wonly": dict(method="inshrink", epsilon=0.05, failures=10,
                  space=dict(exp_avg=None, exp_avg_sq=None),
                  checkpointer=dict(criterion="loss", epsilon_follows_lr=1)),
    "oonly": dict(method="inshrink", epsilon=0.05, failures=10,
                  policy=dict(exp_avg=dict(bins=0), exp_avg_sq=dict(bins=4))),
    "o_v4": dict(method="inshrink", epsilon=0.05, failures=10,
                 policy=dict(exp_avg=None, exp_avg_sq=dict(bins=4))),
    "o_m0p1": dict(method="inshrink", epsilon=0.05, failures=10,
                   policy=dict(exp_avg=dict(bins=0, protect=0.01), exp_avg_sq=dict(bins=4))),
    "o_m2": dict(method="inshrink", epsilon=0.05, failures=10,
                 policy=dict(exp_avg=dict(bins=2), exp_avg_sq=dict(bins=4))),
    "o_m4": dict(method="inshrink", epsilon=0.05, failures=10,
                 policy=dict(exp_avg=dict(bins=4), exp_avg_sq=dict(bins=4))),
    # a relative-error bound next to epsilon (epsilon linear in the learning rate)
    "rel0.2": dict(method="inshrink", epsilon=0.05, failures=10,
                   checkpointer=dict(criterion="loss", max_rel_l2=0.2, epsilon_follows_lr=1)),
    "rel0.3": dict(method="inshrink", epsilon=0.05, failures=10,
                   checkpointer=dict(criterion="loss", max_rel_l2=0.3, epsilon_follows_lr=1)),
}
DEFAULT_RUNS = ["ref", "seed", "lossless", "fp16", "int8", "eps0.01", "eps0.05", "eps0.1",
                "f5", "f20", "k2x", "khalf", "loss", "kl_sq"]
QUICK_RUNS = ["ref", "seed", "lossless", "fp16", "int8", "eps0.05"]


def failure_steps(n_steps: int, every: int, count: int) -> list[int]:
    """``count`` failures evenly spaced over the run, none on a checkpoint step nor before the
    first checkpoint."""
    out = []
    for i in range(1, count + 1):
        f = round(i * n_steps / (count + 1))
        if f % every == 0:
            f += max(1, every // 2)
        f = max(f, every + max(1, every // 2))
        if f < n_steps and f not in out:
            out.append(f)
    return sorted(out)


def late_failure_steps(n_steps: int, every: int, count: int) -> list[int] | None:
    """Failures that restore checkpoints every 2K steps, the last one K before the end (for
    N = 400, K = 20, 10 failures: at 30, 70, ..., 390, restoring 20, 60, ..., 380), each
    halfway to the next checkpoint; None when they do not fit."""
    first = n_steps - every - 2 * every * (count - 1)
    if count < 1 or first < every:
        return None
    return [first + 2 * every * i + max(1, every // 2) for i in range(count)]


def make_method(spec: dict, task: fm.Task, workdir: str) -> Method:
    m = spec["method"]
    if m == "none":
        return NoneMethod(task, workdir)
    if m == "lossless":
        return LosslessMethod(task, workdir)
    if m in ("fp16", "int8"):
        return CastMethod(task, workdir, m)
    if m == "inshrink":
        return InshrinkMethod(task, workdir, spec["epsilon"],
                              moment_bins=spec.get("moment_bins"), space=spec.get("space"),
                              checkpointer={**({"total_steps": task.steps}
                                               if spec.get("total_steps") else {}),
                                            **(spec.get("checkpointer") or {})},
                              policy=spec.get("policy"), preset=spec.get("preset"))
    raise ValueError(m)


def run_with_floor(model_name: str, run_name: str, spec: dict, args, ref: dict | None) -> dict:
    """run_one, with ``inshrink.torch.budget.EPSILON_FLOOR`` set to the run's
    ``epsilon_floor`` meanwhile (a study of the bound at the end of the schedule)."""
    if "epsilon_floor" not in spec:
        return run_one(model_name, run_name, spec, args, ref)
    from inshrink.checkpointing import budget
    saved, budget.EPSILON_FLOOR = budget.EPSILON_FLOOR, spec["epsilon_floor"]
    try:
        return run_one(model_name, run_name, spec, args, ref)
    finally:
        budget.EPSILON_FLOOR = saved


def run_one(model_name: str, run_name: str, spec: dict, args, ref: dict | None) -> dict:
    seed = args.seed + spec.get("seed_offset", 0)
    task = fm.make_task(model_name, seed=seed, quick=args.quick, **args.overrides[model_name])
    n, every = task.steps, max(1, int(task.ckpt_every * spec.get("every_mult", 1)))
    fails = (task.late_failures and late_failure_steps(n, every, spec["failures"])) or \
        failure_steps(n, every, spec["failures"])
    if "keep" in spec:  # a subset of the run's failures (which restores leave the damage)
        fails = fails[slice(*spec["keep"])]
    workdir = tempfile.mkdtemp(prefix=f"fault_{model_name}_{run_name}_", dir=args.workdir)
    method = make_method(spec, task, workdir)
    curve, eval_curve = [], []
    eval_points = set(round(i * n / 10) for i in range(1, 11)) if run_name == "ref" else set()
    train_s = 0.0
    restores, replayed, diverged = [], 0, None
    pending = list(fails)
    steps_done = 0
    lossy = spec["method"] not in ("none", "lossless")
    shadow = None
    prefail = []  # train losses before the first failure, to compare with ref
    t_run = time.perf_counter()
    step = 0
    try:
        while step < n:
            step += 1
            t0 = time.perf_counter()
            loss = task.train_step(step)
            train_s += time.perf_counter() - t0
            steps_done += 1
            curve.append((step, loss))
            if not restores:
                prefail.append(loss)
            if not math.isfinite(loss):
                diverged = step
                break
            if step in eval_points:
                eval_curve.append({"step": step, **task.evaluate()})
            if step % every == 0:
                method.save(step)
                if lossy:  # not timed: the exact weights, to measure what a restore costs
                    shadow = {k: v.detach().clone() for k, v in task.model.state_dict().items()}
            if pending and step == pending[0]:
                pending.pop(0)
                fm.poison(task.model, task.optimizer)
                back = method.restore()
                replayed += step - back
                entry = {"at": step, "to": back}
                if lossy:  # probe loss of the restored weights against the exact ones
                    exact = task.evaluate(task.probe_batches, state=shadow)["loss"]
                    got = task.evaluate(task.probe_batches)["loss"]
                    entry.update(probe_loss_exact=exact, probe_loss_restored=got,
                                 probe_drop=(got - exact) / abs(exact))
                restores.append(entry)
                step = back
        final = task.evaluate()
        if diverged is None and not all(math.isfinite(v) for v in final.values()):
            diverged = n
        digest = fm.state_digest(task.model, task.optimizer)
        sizes = method.sizes()
        extra = method.extra()
    finally:
        method.close()
        shutil.rmtree(workdir, ignore_errors=True)
    wall = time.perf_counter() - t_run

    raw_total = sum(sizes["raw"].values())
    st = sizes["stored"]
    res = {
        "model": model_name, "run": run_name, "method": spec["method"],
        "epsilon": spec.get("epsilon"), "failures": len(fails), "failure_steps": fails,
        "steps": n, "ckpt_every": every, "checkpoints": method.saves, "seed": seed,
        "restores": len(restores), "restore_log": restores, "replayed_steps": replayed,
        "steps_trained": steps_done, "diverged_at": diverged,
        "final": final, "digest": digest,
        "raw_bytes": sizes["raw"], "stored_bytes": st, "stored_total": sizes["stored_total"],
        "ratio": raw_total / sizes["stored_total"] if sizes["stored_total"] else float("nan"),
        "ratio_model": sizes["raw"]["model"] / st["model"] if st["model"] else float("nan"),
        "ratio_optimizer": (sizes["raw"]["optimizer"] / st["optimizer"]
                            if st["optimizer"] else float("nan")),
        "train_seconds": train_s, "method_seconds": method.seconds,
        "save_seconds": method.save_seconds, "restore_seconds": method.restore_seconds,
        "time_fraction": method.seconds / train_s if train_s else float("nan"),
        "train_ms_per_step": 1000 * train_s / max(1, steps_done),
        "wall_seconds": wall,
        "train_loss_curve": _compact_curve(curve, n),
    }
    drops = [e["probe_drop"] for e in restores if "probe_drop" in e]
    if drops:
        res["restore_drop_mean"] = float(np.mean(drops))
        res["restore_drop_max"] = float(np.max(drops))
    for key in ("keyframes", "files"):
        if key in sizes:
            res[key] = sizes[key]
    if "stored_zstd_total" in sizes:
        res["stored_zstd"] = sizes["stored_zstd"]
        res["ratio_zstd"] = raw_total / sizes["stored_zstd_total"]
    res.update(extra)
    if eval_curve:
        res["eval_curve"] = eval_curve
    if ref is not None:
        res["degradation"] = degradation(final, ref["final"])
        res["bit_identical"] = digest == ref["digest"]
        res["train_step_vs_ref"] = res["train_ms_per_step"] / ref["train_ms_per_step"]
        # every training loss before the first restore equals ref's (saving perturbs nothing)
        res["prefail_identical"] = None if ref.get("_losses") is None else \
            prefail == ref["_losses"][:len(prefail)]
    else:
        res["degradation"] = {"loss": 0.0, **({"acc": 0.0} if "acc" in final else {})}
        res["bit_identical"] = True
    res["_losses"] = [l for _, l in curve]
    return res


def earlier_ref(path: str, model_name: str, seed: int) -> dict:
    """The ref run of ``model_name`` in an earlier output of this benchmark (same seed)."""
    with open(path) as f:
        doc = json.load(f)
    if doc.get("seed") != seed:
        raise SystemExit(f"{path} was run with seed {doc.get('seed')}, not {seed}")
    for r in doc["results"]:
        if r.get("model") == model_name and r.get("run") == "ref" and "error" not in r:
            return r
    raise SystemExit(f"{path} has no ref run of {model_name}")


def degradation(q: dict, q_ref: dict) -> dict:
    out = {}
    for key, val in q.items():
        if key not in q_ref:
            continue
        r = q_ref[key]
        if not math.isfinite(val):
            out[key] = float("inf")
        elif key == "acc":
            out[key] = (r - val) / abs(r)
        else:
            out[key] = (val - r) / abs(r)
    return out


def _compact_curve(curve, n, points=50):
    """Mean training loss over ``points`` windows of the final trajectory (replays drop the
    lost steps' losses)."""
    by_step = {}
    for s, l in curve:
        by_step[s] = l  # the last time a step ran is the one that counts
    out = []
    w = max(1, n // points)
    for start in range(1, n + 1, w):
        vals = [by_step[s] for s in range(start, min(n, start + w - 1) + 1) if s in by_step]
        if vals:
            out.append({"step": min(n, start + w - 1), "loss": float(np.mean(vals))})
    return out


# --------------------------------------------------------------------------------------------
# reporting
# --------------------------------------------------------------------------------------------

def fmt(x, spec=".3f", pct=False):
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return "diverged" if x > 0 or math.isnan(x) else str(x)
    return f"{100 * x:{spec}}%" if pct else f"{x:{spec}}"


def table(results: list[dict]) -> str:
    head = ("| model | run | method | eps | F | K | ratio | ratio weights | ratio optimizer | "
            "ratio+zstd | loss | Δ loss | acc | Δ acc | restore Δ | method time / train | "
            "restores | replayed | bit-identical | run s |")
    lines = [head, "|" + "---|" * 3 + "---:|" * 17]
    for r in results:
        d = r.get("degradation", {})
        ident = "yes" if r.get("bit_identical") else "no"
        lines.append(
            f"| {r['model']} | {r['run']} | {r['method']} | {fmt(r['epsilon'], 'g')} | "
            f"{r['failures']} | {r['ckpt_every']} | {fmt(r['ratio'], '.2f')} | "
            f"{fmt(r['ratio_model'], '.2f')} | {fmt(r['ratio_optimizer'], '.2f')} | "
            f"{fmt(r.get('ratio_zstd'), '.2f')} | "
            f"{fmt(r['final'].get('loss'), '.4f')} | {fmt(d.get('loss'), '+.2f', pct=True)} | "
            f"{fmt(r['final'].get('acc'), '.4f')} | {fmt(d.get('acc'), '+.2f', pct=True)} | "
            f"{fmt(r.get('restore_drop_mean'), '+.2f', pct=True)} | "
            f"{fmt(r['time_fraction'], '.1f', pct=True)} | {r['restores']} | "
            f"{r['replayed_steps']} | {ident} | {r['wall_seconds']:.1f} |")
    return "\n".join(lines)


def summary_lines(results: list[dict]) -> str:
    """Bit-identity of the lossless runs, seed spread, and inshrink time against K."""
    out = []
    for model in dict.fromkeys(r["model"] for r in results):
        rows = [r for r in results if r["model"] == model]
        for r in rows:
            if r["method"] in ("lossless", "none") and r["failures"]:
                out.append(f"- {model}/{r['run']}: {r['restores']} restores, final state "
                           f"{'bit-identical to' if r['bit_identical'] else 'DIFFERENT from'} "
                           f"ref (SHA-256 of every weight and optimizer tensor)")
            if r["run"] == "seed":
                out.append(f"- {model}: seed + 1 against ref (run-to-run spread): loss "
                           f"{100 * r['degradation']['loss']:+.2f}%" + (
                               f", acc {100 * r['degradation']['acc']:+.2f}%"
                               if "acc" in r["degradation"] else ""))
        ks = [r for r in rows if r["method"] == "inshrink" and r["epsilon"] == 0.05
              and r["failures"] == 10]
        for r in sorted(ks, key=lambda r: r["ckpt_every"]):
            per_save = r["save_seconds"] / max(1, r["checkpoints"])
            out.append(f"- {model}: inshrink eps 0.05, K = {r['ckpt_every']}: "
                       f"{r['checkpoints']} saves, {per_save:.3f} s per save, "
                       f"{r['restore_seconds'] / max(1, r['restores']):.3f} s per restore, "
                       f"method time {100 * r['time_fraction']:.1f}% of training "
                       f"(its training steps took {r.get('train_step_vs_ref', 1):.3f}x ref's "
                       f"time per step: gradient EMA hooks, noise), ratio {r['ratio']:.2f}")
        bad = [r["run"] for r in rows if r.get("prefail_identical") is False
               and r["run"] != "seed"]
        if bad:
            out.append(f"- {model}: WARNING: training before the first failure differs from "
                       f"ref in {', '.join(bad)} (saving perturbed training)")
    return "\n".join(out)


def setup_lines(setups: dict) -> str:
    out = []
    for name, s in setups.items():
        c = s["config"]
        out.append(f"- **{name}**: {s['params']:,} parameters, N = {c['steps']} steps, "
                   f"K = {c['ckpt_every']} ({c['steps'] // c['ckpt_every']} checkpoints), "
                   f"raw checkpoint {s['raw_checkpoint_bytes']:,} bytes; reference run "
                   f"{s.get('ref_train_seconds', float('nan')):.1f} s of training "
                   f"({s.get('ref_wall_seconds', float('nan')):.1f} s wall)")
        if s.get("eval_curve"):
            out.append("  eval curve: " + ", ".join(
                f"{e['step']}: {e['loss']:.4f}" + (f"/{e['acc']:.4f}" if "acc" in e else "")
                for e in s["eval_curve"]))
    return "\n".join(out)


def plot(results: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = list(dict.fromkeys(r["model"] for r in results))
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 4.8), squeeze=False)
    style = {"none": ("k", "o"), "lossless": ("tab:gray", "s"), "fp16": ("tab:orange", "^"),
             "int8": ("tab:red", "v"), "inshrink": ("tab:blue", "D")}
    cap = 1000.0  # %: worse points are drawn at the cap, hollow, their value in the label
    for ax, model in zip(axes[0], models):
        rows = [r for r in results if r["model"] == model]
        key = fm.TASKS[model].quality  # the model's primary quality: loss or accuracy
        ys = []
        for r in rows:
            color, marker = style.get(r["method"], ("tab:green", "x"))
            y = 100 * r["degradation"].get(key, float("nan"))
            label = r["run"]
            off = not math.isfinite(y) or y > cap
            if off:
                label += " (diverged)" if not math.isfinite(y) else f" ({y:.3g}%)"
                y = cap
            ys.append(y)
            ax.scatter([r["ratio"]], [y], marker=marker, s=60,
                       facecolors="none" if off else color, edgecolors=color)
            ax.annotate(label, (r["ratio"], y), textcoords="offset points", xytext=(5, 4),
                        fontsize=7)
        ratios = [r["ratio"] for r in rows if math.isfinite(r["ratio"])]
        ax.set_xlim(0.8, max(ratios + [2.0]) * 2.5)
        ax.set_ylim(min(ys + [0.0]) * 1.5 - 1, max(ys + [1.0]) * 3 + 1)
        ax.axhline(0, color="k", lw=0.5)
        spread = [abs(100 * r["degradation"][key]) for r in rows if r["run"] == "seed"
                  and math.isfinite(r["degradation"].get(key, float("nan")))]
        if spread:
            ax.axhspan(-spread[0], spread[0], color="tab:green", alpha=0.12,
                       label=f"|seed + 1 - ref| = {spread[0]:.2f}%")
            ax.legend(loc="lower right", fontsize=8)
        ax.set_xscale("log")
        ax.set_yscale("symlog", linthresh=1.0)
        ax.set_xlabel("end-to-end compression ratio of the series (log)")
        ax.set_ylabel(f"relative degradation of held-out {'accuracy' if key == 'acc' else 'loss'}"
                      f", % (symlog)")
        ax.set_title(f"{model}: final quality after failures and restores "
                     f"(inshrink: diamonds)", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------

def parse_overrides(text: str | None, models: list[str], key: str) -> dict:
    """"lm=600,cnn=2000" or "600" (every model) -> {model: {key: int}}."""
    out = {m: {} for m in models}
    if not text:
        return out
    for part in text.split(","):
        if "=" in part:
            m, v = part.split("=", 1)
            if m in out:
                out[m][key] = int(v)
        else:
            for m in models:
                out[m][key] = int(part)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny smoke run (~1 min)")
    ap.add_argument("--models", default="lm,cnn")
    ap.add_argument("--only", help="comma-separated run names (default: all; see above)")
    ap.add_argument("--out", help="JSON output (default benchmarks/results/fault.json, "
                                  "fault_quick.json with --quick); the table goes next to it "
                                  "as .md")
    ap.add_argument("--plot", help="PNG (default benchmarks/fault_tolerance.png, "
                                   "benchmarks/results/fault_quick.png with --quick)")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--steps", help="override N: '600' or 'lm=600,cnn=2000'")
    ap.add_argument("--every", help="override K: '12' or 'lm=12,cnn=40'")
    ap.add_argument("--lm-beta2", type=float, help="AdamW beta2 of the lm task (default 0.95)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ref-json", help="take each model's ref run from this earlier output "
                                       "(same seed and settings) instead of running it")
    ap.add_argument("--workdir", default=common.tmp_root(),
                    help="where the series directories go (default /dev/shm)")
    ap.add_argument("--search-predict", action="store_true",
                    help="the searched runs with Search(predict=True)")
    args = ap.parse_args(argv)
    global SEARCH_PREDICT
    SEARCH_PREDICT = args.search_predict

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True, warn_only=True)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models:
        if m not in fm.TASKS:
            ap.error(f"unknown model {m!r}; models are {sorted(fm.TASKS)}")
    runs = ([r.strip() for r in args.only.split(",") if r.strip()] if args.only
            else (QUICK_RUNS if args.quick else DEFAULT_RUNS))
    for r in runs:
        if r not in RUNS:
            ap.error(f"unknown run {r!r}; runs are {list(RUNS)}")
    if "ref" in runs:
        runs.remove("ref")
    runs.insert(0, "ref")
    args.overrides = parse_overrides(args.steps, models, "steps")
    for m, v in parse_overrides(args.every, models, "ckpt_every").items():
        args.overrides[m].update(v)
    if args.lm_beta2 is not None and "lm" in args.overrides:
        args.overrides["lm"]["beta2"] = args.lm_beta2
    out = args.out or os.path.join(RESULTS, "fault_quick.json" if args.quick else "fault.json")
    plot_path = args.plot or (os.path.join(RESULTS, "fault_quick.png") if args.quick else
                              os.path.join(common.REPO_ROOT, "benchmarks",
                                           "fault_tolerance.png"))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    md_path = os.path.splitext(out)[0] + ".md"

    need_inshrink = any(RUNS[r]["method"] in ("lossless", "inshrink") for r in runs)
    if need_inshrink and inshrink is None:
        raise SystemExit(f"inshrink is not importable: {_inshrink_err}")
    if any(RUNS[r]["method"] == "inshrink" for r in runs):
        try:
            from inshrink.torch import Checkpointer  # noqa: F401
        except Exception as e:  # noqa: BLE001
            print(f"note: inshrink.torch.Checkpointer unavailable ({type(e).__name__}: {e}); "
                  f"skipping the inshrink runs", flush=True)
            runs = [r for r in runs if RUNS[r]["method"] != "inshrink"]

    doc = {"benchmark": "fault tolerance", "quick": args.quick, "seed": args.seed,
           "torch": torch.__version__, "python": platform.python_version(),
           "threads": torch.get_num_threads(), "runs": runs, "setups": {}, "results": []}
    results = doc["results"]
    t_all = time.perf_counter()

    def write():
        clean = [{k: v for k, v in r.items() if not k.startswith("_")} for r in results]
        tmp = out + ".tmp"
        with open(tmp, "w") as f:
            json.dump({**doc, "results": clean}, f, indent=1, default=_jsonable)
        os.replace(tmp, out)

    for model_name in models:
        task = fm.make_task(model_name, seed=args.seed, quick=args.quick,
                            **args.overrides[model_name])
        setup = task.describe()
        del task
        print(f"## {model_name}: {setup['params']:,} parameters, N={setup['config']['steps']}, "
              f"K={setup['config']['ckpt_every']}", flush=True)
        doc["setups"][model_name] = setup
        ref = None
        for run_name in runs:
            spec = RUNS[run_name]
            print(f"  {model_name}/{run_name}: {spec} ...", end="", flush=True)
            try:
                r = earlier_ref(args.ref_json, model_name, args.seed) \
                    if run_name == "ref" and args.ref_json else \
                    run_with_floor(model_name, run_name, spec, args, ref)
            except Exception as e:  # noqa: BLE001 - report and go on with the next run
                traceback.print_exc()
                print(f" FAILED: {type(e).__name__}: {e}", flush=True)
                results.append({"model": model_name, "run": run_name, "error": repr(e)})
                write()
                if run_name == "ref":
                    break
                continue
            if run_name == "ref":
                ref = r
                setup["raw_checkpoint_bytes"] = sum(r["raw_bytes"].values()) // max(
                    1, r["checkpoints"])
                setup["ref_train_seconds"] = r["train_seconds"]
                setup["ref_wall_seconds"] = r["wall_seconds"]
                setup["eval_curve"] = r.get("eval_curve")
            results.append(r)
            d = r["degradation"]
            print(f" ratio {r['ratio']:.2f}  loss {r['final'].get('loss', float('nan')):.4f} "
                  f"({100 * d.get('loss', float('nan')):+.2f}%)  "
                  f"time {100 * r['time_fraction']:.1f}%  restores {r['restores']}  "
                  f"bit-identical {r['bit_identical']}  {r['wall_seconds']:.1f}s", flush=True)
            if spec["method"] in ("lossless", "none") and spec["failures"] and \
                    not r["bit_identical"]:
                print(f"  WARNING: {model_name}/{run_name} is not bit-identical to ref",
                      flush=True)
            write()

    ok = [r for r in results if "error" not in r]
    doc["total_seconds"] = time.perf_counter() - t_all
    write()
    text = (f"# Fault tolerance ({'quick' if args.quick else 'full'} run, seed {args.seed}, "
            f"torch {torch.__version__}, 1 thread)\n\n" + setup_lines(doc["setups"]) + "\n\n"
            + table(ok) + "\n\n" + summary_lines(ok) + "\n\n"
            "ratio: sum of raw fp32 bytes of all checkpoints / stored bytes (series on disk: "
            "file sizes; weights/optimizer: per-tensor stored bytes). Δ: relative degradation "
            "against ref (positive = worse). ratio+zstd: fp16/int8 bytes after zstd-3. "
            "restore Δ: mean relative change of the probe loss (part of the test set) right "
            "after a restore, restored weights against the exact weights that were saved.\n"
            f"\ntotal {doc['total_seconds']:.0f} s\n")
    print()
    print(text)
    with open(md_path, "w") as f:
        f.write(text)
    if not args.no_plot and ok:
        plot(ok, plot_path)
        print(f"plot: {plot_path}")
    print(f"json: {out}\ntable: {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
