"""Disk space of a run's checkpoints with weights-only retention, against keeping whole steps.

    python benchmarks/bench_retention.py [--task lm-adamw95-cosine] [--policy balanced]
        [--weights-policy aggressive] [--dcp]

Trains one task of ``fidelity_tasks.py`` (a byte-level LM with AdamW by default) with a
checkpoint every twentieth of the run through ``inshrink.torch.Checkpointer`` and compares,
at the end of the run, the bytes on disk of

* ``keep_last=10``: the ten newest steps whole (model, optimizer and training state);
* ``keep_last=2, keep_weights=8``: the two newest whole and the eight before them as the
  model's tensors only, rewritten in place by the Checkpointer as the run moves on;
* the same with ``weights_policy`` (``--weights-policy``): the older models encoded again
  with a lossier preset;
* ``Series.retain(2, keep_weights=8)`` of the first series, once at the end: the eight older
  steps rewritten as their model's tensors (``step_….w.ink``), checked bit for bit,

all keeping ten steps' models. Prints the bytes of each and their ratio to the first.

With ``--dcp``, the same run's checkpoints as sharded ones instead (one rank, gloo):

* ``InkSeries(keep=10)`` against ``InkSeries(keep=2, keep_weights=8)`` (``dcp.save`` of
  ``{"model": ..., "optim": ...}``; older steps deltas, the eight model-only steps rewritten
  per rank as ``.w.ink`` files, the older of them ``.w.d.ink`` deltas), the models of the
  latter checked bit for bit at the end (lossless);
* the sharded ``Checkpointer(sharded=True)`` with ``keep_last=10`` against ``keep_last=2,
  keep_weights=8`` (its step directories rewritten in place, no deltas).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fidelity_tasks  # noqa: E402

from inshrink.series import Series  # noqa: E402
from inshrink.torch import Checkpointer  # noqa: E402
from inshrink.torch.state import MODEL  # noqa: E402


def disk_bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


def run(task_name: str, policy: str | None, out: Path, **retention) -> int:
    task = fidelity_tasks.make_task(task_name, seed=0)
    every = task.ckpt_every
    with Checkpointer(out, task.model, task.optimizer, policy=policy, grad_ema=False,
                      **retention) as ckpt:
        for step in range(1, task.steps + 1):
            task.train_step(step)
            if step % every == 0:
                ckpt.save(step)
    return disk_bytes(out)


def run_dcp(task_name: str, policy: str | None, out: Path, **retention) -> tuple[int, dict]:
    """The task's checkpoints saved into an InkSeries; its bytes on disk and the models
    saved at the steps it keeps, by step."""
    import torch.distributed.checkpoint as dcp

    from inshrink.dcp import InkSeries
    task = fidelity_tasks.make_task(task_name, seed=0)
    series = InkSeries(out, policy=policy, threads=1, **retention)
    models = {}
    for step in range(1, task.steps + 1):
        task.train_step(step)
        if step % task.ckpt_every == 0:
            state = {"model": task.model.state_dict(), "optim": task.optimizer.state_dict()}
            dcp.save(state, storage_writer=series.writer(step), no_dist=True)
            models[step] = {k: v.detach().clone() for k, v in task.model.state_dict().items()}
    if policy is None:  # lossless: every kept step's model restores bit for bit
        for step in series.steps():
            target = {"model": {k: torch.zeros_like(v) for k, v in models[step].items()}}
            dcp.load(target, storage_reader=series.reader(step), no_dist=True)
            for name, value in models[step].items():
                assert torch.equal(target["model"][name], value), (step, name)
    series.close()
    return disk_bytes(out), models


def run_sharded(task_name: str, policy: str | None, out: Path, **retention) -> int:
    return run(task_name, policy, out, sharded=True, **retention)


def main_dcp(args, policy: str | None) -> int:
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29533", rank=0, world_size=1)
    started = time.time()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            whole, _ = run_dcp(args.task, policy, Path(tmp) / "whole", keep=10)
            thin, _ = run_dcp(args.task, policy, Path(tmp) / "thin", keep=2, keep_weights=8)
            sharded_whole = run_sharded(args.task, policy, Path(tmp) / "s_whole", keep_last=10)
            sharded_thin = run_sharded(args.task, policy, Path(tmp) / "s_thin", keep_last=2,
                                       keep_weights=8)
    finally:
        dist.destroy_process_group()
    print(f"task {args.task}, policy {args.policy}, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"load {os.getloadavg()[0]:.2f}, {time.time() - started:.0f} s, DCP (one rank)")
    print("| retention | bytes on disk |\n|---|---:|")
    print(f"| InkSeries(keep=10) | {whole:,} |")
    print(f"| InkSeries(keep=2, keep_weights=8) | {thin:,} ({thin / whole:.2f}× of it) |")
    print(f"| sharded Checkpointer, keep_last=10 | {sharded_whole:,} |")
    print(f"| sharded Checkpointer, keep_last=2, keep_weights=8 | {sharded_thin:,} "
          f"({sharded_thin / sharded_whole:.2f}× of it) |")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="lm-adamw95-cosine", choices=sorted(fidelity_tasks.TASKS))
    parser.add_argument("--policy", default="balanced", help="a preset, or 'lossless'")
    parser.add_argument("--weights-policy", default="aggressive",
                        help="the preset of the older models in the third row")
    parser.add_argument("--dcp", action="store_true",
                        help="sharded checkpoints: InkSeries and the sharded Checkpointer")
    args = parser.parse_args()
    torch.set_num_threads(1)
    policy = None if args.policy == "lossless" else args.policy
    if args.dcp:
        return main_dcp(args, policy)
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        whole = run(args.task, policy, Path(tmp) / "whole", keep_last=10)
        thin = run(args.task, policy, Path(tmp) / "thin", keep_last=2, keep_weights=8)
        lossier = run(args.task, policy, Path(tmp) / "lossier", keep_last=2, keep_weights=8,
                      weights_policy=args.weights_policy)
        shutil.copytree(Path(tmp) / "whole", Path(tmp) / "in_place")
        series = Series(Path(tmp) / "in_place")
        before = {step: series.load(step) for step in series.steps()}
        rewrite = time.perf_counter()
        series.retain(2, keep_weights=8, model=lambda name: name.startswith(MODEL))
        rewrite = time.perf_counter() - rewrite
        for step in series.steps():  # the models as they were, bit for bit
            for name, array in series.load(step).items():
                assert array.tobytes() == before[step][name].tobytes(), (step, name)
        in_place = disk_bytes(Path(tmp) / "in_place")
    print(f"task {args.task}, policy {args.policy}, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"load {os.getloadavg()[0]:.2f}, {time.time() - started:.0f} s")
    print("| retention | bytes on disk |\n|---|---:|")
    print(f"| keep_last=10 | {whole:,} |")
    print(f"| keep_last=2, keep_weights=8 | {thin:,} ({thin / whole:.2f}× of it) |")
    print(f"| keep_last=2, keep_weights=8, weights_policy={args.weights_policy!r} | "
          f"{lossier:,} ({lossier / whole:.2f}× of it) |")
    print(f"| Series.retain(2, keep_weights=8) | {in_place:,} ({in_place / whole:.2f}× of it; "
          f"rewritten in {rewrite:.2f} s) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
