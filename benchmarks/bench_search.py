"""Time the configuration search over the checkpoints of one training run.

    python benchmarks/bench_search.py record     # train the lm task once, keep its checkpoints
    python benchmarks/bench_search.py replay     # time Search.choose (and a plain save) on each
    PYTHONPATH=/other/checkout python benchmarks/bench_search.py replay --label before

``record`` trains the fault-tolerance benchmark's lm task (``ft_models.py``, 1200 steps, a
checkpoint every 60: 20 per run) with ``inshrink.torch.Checkpointer`` as ``bench_fault.py
--only eps0.05`` sets it up (epsilon 0.05 shared by 5 restores, the task's search settings,
one thread), and keeps what every checkpoint's search was given: the state, the importance
scores, epsilon and whether the late first-moment configuration applied; plus the training
time (steps only). No failure is injected: the search sees one undisturbed run.

``replay`` runs one fresh ``Search`` over those checkpoints in order, as the Checkpointer does
(the model set to each checkpoint's weights, the KL quality callback reset; ``--predict``:
``Search(predict=True)``; ``--complete``: the callback's ``bounded`` hidden, so that every
evaluation runs every batch), and per checkpoint times ``Search.choose``, counts the quality
calls, and times a plain ``inshrink.save`` of the state with the chosen policy. The first
search of a process includes its start-up (Numba started, kernels loaded), which the saves
after it do not pay; ``--warm`` pays it first, apart (``startup_cpu``), so that the first
search compares with a save on equal terms. The inshrink it imports is the one on
``PYTHONPATH``, so two revisions replay the same recorded inputs. The JSON lines it prints
(and ``--out``) carry the choices, so two revisions can be checked for identical decisions.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ft_models as fm  # noqa: E402

DEFAULT_DIR = os.path.join(HERE, "data", "search_lm")
EPSILON, RESTORES = 0.05, 5


def record(directory: str, seed: int) -> None:
    torch.set_num_threads(1)
    os.makedirs(directory, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench_search_") as series:
        _record(directory, series, seed)


def _record(directory: str, series: str, seed: int) -> None:
    from inshrink.torch import Checkpointer
    task = fm.make_task("lm", seed=seed)
    ck = Checkpointer(series, task.model, task.optimizer, eval_batches=task.calib_batches,
                      loss_fn=task.loss_fn, epsilon=EPSILON, restores=RESTORES, threads=1,
                      **task.search_settings)
    choose, steps = ck.search.choose, []

    def recording(tensors, quality, importance=None, curvature=None):
        step = len(steps) + 1
        np.savez(os.path.join(directory, f"ckpt_{step:03d}.npz"), **tensors)
        np.savez(os.path.join(directory, f"importance_{step:03d}.npz"), **(importance or {}))
        steps.append({"epsilon": ck.search.epsilon,
                      "late": ck.search.space.exp_avg == ck.search.space.late_exp_avg})
        return choose(tensors, quality, importance, curvature)
    ck.search.choose = recording
    train_s = train_cpu = 0.0
    for step in range(1, task.steps + 1):
        started, cpu = time.perf_counter(), time.process_time()
        task.train_step(step)
        train_s += time.perf_counter() - started
        train_cpu += time.process_time() - cpu
        if step % task.ckpt_every == 0:
            ck.save(step)
    if hasattr(ck, "close"):
        ck.close()
    with open(os.path.join(directory, "run.json"), "w") as f:
        json.dump({"seed": seed, "train_seconds": train_s, "train_cpu_seconds": train_cpu,
                   "checkpoints": steps, "checkpointer_seconds": ck.seconds}, f, indent=1)
    print(f"recorded {len(steps)} checkpoints, training {train_s:.1f} s "
          f"({train_cpu:.1f} CPU-s), checkpointer {ck.seconds:.1f} s")


class _Counting:
    """The quality callback, its calls counted; ``bounded`` passed on only when asked."""

    def __init__(self, base, calls: list, bounded: bool) -> None:
        self.base, self.calls = base, calls
        if bounded and hasattr(base, "bounded"):
            self.bounded = self._bounded

    def __call__(self, state):
        self.calls.append(1)
        return self.base(state)

    def _bounded(self, state, limit):
        self.calls.append(1)
        return self.base.bounded(state, limit)


def replay(directory: str, label: str, out: str | None, limit: int | None,
           predict: bool = False, bounded: bool = True, warm: bool = False) -> None:
    import inshrink
    from inshrink.search import Search, SearchSpace
    from inshrink.torch.quality import quality_from
    torch.set_num_threads(1)
    with open(os.path.join(directory, "run.json")) as f:
        run = json.load(f)
    task = fm.make_task("lm", seed=run["seed"])
    settings = task.search_settings
    criterion = settings.get("criterion", "loss")
    space = SearchSpace()
    search = Search(EPSILON / RESTORES, space=space, max_evals=24, two_sided=True, threads=1,
                    **({"predict": True} if predict else {}))
    lines = []
    checkpoints = run["checkpoints"][:limit]
    startup_cpu = None
    if warm:  # the process's start-up (Numba, kernels loaded or compiled) paid here, apart
        state = dict(np.load(os.path.join(directory, "ckpt_001.npz")))
        with tempfile.TemporaryDirectory() as tmp:
            cpu = time.process_time()
            inshrink.save(os.path.join(tmp, "w.ink"), state, policy="balanced", threads=1)
            inshrink.load(os.path.join(tmp, "w.ink"), threads=1)
            startup_cpu = time.process_time() - cpu
    for i, meta in enumerate(checkpoints, 1):
        state = dict(np.load(os.path.join(directory, f"ckpt_{i:03d}.npz")))
        importance = dict(np.load(os.path.join(directory, f"importance_{i:03d}.npz")))
        live = task.model.state_dict()
        task.model.load_state_dict({n: torch.from_numpy(state["model." + n].copy())
                                    for n in live})
        base = quality_from(task.model, task.calib_batches, task.loss_fn, criterion=criterion)
        calls = []
        passes = getattr(base, "passes", 0)
        quality = _Counting(base, calls, bounded)
        search.epsilon = meta["epsilon"]
        search.space = space if not meta["late"] else \
            SearchSpace(exp_avg=space.late_exp_avg)
        started, cpu = time.perf_counter(), time.process_time()
        result = search.choose(state, quality, importance or None)
        search_s, search_cpu = time.perf_counter() - started, time.process_time() - cpu
        with tempfile.TemporaryDirectory() as tmp:
            started, cpu = time.perf_counter(), time.process_time()
            infos = inshrink.save(os.path.join(tmp, "c.ink"), state, policy=result.policy,
                                  threads=1)
            save_s, save_cpu = time.perf_counter() - started, time.process_time() - cpu
        report = result.report
        line = {"label": label, "checkpoint": i, "mode": report.get("mode"),
                "search_seconds": search_s, "save_seconds": save_s,
                "search_cpu": search_cpu, "save_cpu": save_cpu,
                "quality_calls": len(calls), "evaluations": report.get("evaluations_used"),
                "evaluations_stopped": sum(bool(e.get("stopped"))
                                           for e in report.get("evaluations", [])),
                "batch_passes": getattr(base, "passes", 0) - passes,
                "batches": len(task.calib_batches),
                "tensor_encodings": report.get("tensor_encodings"),
                **{k: report.get(k) for k in ("quality_seconds", "encode_seconds",
                                              "size_table_seconds")},
                "chosen": report.get("chosen"),
                "chosen_bytes": (report.get("chosen_result") or {}).get("stored_bytes"),
                "chosen_quality": (report.get("chosen_result") or {}).get("quality"),
                "file_bytes": sum(x.stored_bytes for x in infos),
                "walk": [[e["phase"], [e["choice"][k] for k in ("bins", "embedding_bins", "prune",
                                                                "protect")],
                          e["feasible"], e["stored_bytes"], e["drop"]]
                         for e in report.get("evaluations", [])]}
        lines.append(line)
        print(json.dumps(line), flush=True)
    later = lines[1:] or lines
    search_total = sum(x["search_seconds"] for x in lines)
    save_total = sum(x["save_seconds"] for x in lines)
    summary = {
        "label": label, "checkpoints": len(lines),
        # with --warm: CPU of the untimed first save and load (start-up), else None
        "warm": warm, "startup_cpu": startup_cpu,
        "first_search_s": lines[0]["search_seconds"], "first_save_s": lines[0]["save_seconds"],
        "first_search_over_save": lines[0]["search_seconds"] / lines[0]["save_seconds"],
        "later_search_s_mean": sum(x["search_seconds"] for x in later) / len(later),
        "later_evaluations_mean": sum(x["evaluations"] for x in later) / len(later),
        "later_quality_calls_mean": sum(x["quality_calls"] for x in later) / len(later),
        # forward passes over the calibration batches in units of one complete evaluation
        "first_passes_in_evaluations": lines[0]["batch_passes"] / lines[0]["batches"],
        "later_passes_in_evaluations_mean": sum(x["batch_passes"] / x["batches"]
                                                for x in later) / len(later),
        "chosen_bytes_total": sum(x["chosen_bytes"] or 0 for x in lines),
        **{f"later_{k}_mean": sum(x[k] for x in later) / len(later)
           for k in ("quality_seconds", "encode_seconds") if later[0].get(k) is not None},
        "later_save_s_mean": sum(x["save_seconds"] for x in later) / len(later),
        "search_s_total": search_total, "save_s_total": save_total,
        "first_search_cpu": lines[0]["search_cpu"], "first_save_cpu": lines[0]["save_cpu"],
        "later_search_cpu_mean": sum(x["search_cpu"] for x in later) / len(later),
        "later_save_cpu_mean": sum(x["save_cpu"] for x in later) / len(later),
        "search_cpu_total": sum(x["search_cpu"] for x in lines),
        "save_cpu_total": sum(x["save_cpu"] for x in lines),
        "train_s_recorded": run["train_seconds"],
        "train_cpu_recorded": run.get("train_cpu_seconds"),
        "share_of_training": (search_total + save_total) / run["train_seconds"],
        "cpu_share_of_training": (sum(x["search_cpu"] + x["save_cpu"] for x in lines)
                                  / run["train_cpu_seconds"]
                                  if run.get("train_cpu_seconds") else None),
        "load_average": os.getloadavg()}
    print(json.dumps(summary), flush=True)
    if out:
        with open(out, "w") as f:
            json.dump({"summary": summary, "checkpoints": lines}, f, indent=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=("record", "replay"))
    ap.add_argument("--dir", default=DEFAULT_DIR, help="recorded checkpoints")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--label", default="current")
    ap.add_argument("--out", help="JSON of the replay")
    ap.add_argument("--limit", type=int, help="replay only the first N checkpoints")
    ap.add_argument("--predict", action="store_true", help="Search(predict=True)")
    ap.add_argument("--complete", action="store_true",
                    help="hide the callback's bounded(): every evaluation runs every batch")
    ap.add_argument("--warm", action="store_true",
                    help="an untimed balanced save and load of the first checkpoint before the "
                         "replay, so that the first search does not include the process's "
                         "start-up (Numba, kernels loaded); its CPU is reported as startup_cpu")
    args = ap.parse_args(argv)
    if args.action == "record":
        record(args.dir, args.seed)
    else:
        replay(args.dir, args.label, args.out, args.limit, args.predict, not args.complete,
               args.warm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
