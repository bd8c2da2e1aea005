#!/usr/bin/env python3
"""torch.distributed.checkpoint storage layers side by side, on a trained model's sharded state.

A byte-level transformer (benchmarks/train.py's ByteLM, small settings, trained here on the
standard library's source: nothing is downloaded) is trained for a few steps under FSDP2
(``fully_shard``, CPU, gloo) on 2 ranks; its model and AdamW state are then saved with

* ``fs``: DCP's FileSystemWriter,
* ``fs+zstd``: FileSystemWriter with DCP's ``_extension.ZStandard`` stream compression,
* ``ink``: inshrink.dcp.InkStorageWriter, lossless,
* ``ink-balanced``: InkStorageWriter with the ``balanced`` preset,

measuring per method: checkpoint bytes, the time ``dcp.save`` blocks (the whole save), the
time ``dcp.async_save`` blocks (until the state is staged) and takes in all, the load time on
the 2 ranks that saved, and the load time into 1 rank (a different world size). Times are the
median of ``--repeats`` runs, measured on rank 0 between barriers.

Run with ``nice -n 5 python benchmarks/bench_dcp.py``; ``--json out.json`` keeps the numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import import_inshrink, tmp_root  # noqa: E402

import_inshrink()
from train import ByteLM, stdlib_corpus  # noqa: E402

METHODS = ("fs", "fs+zstd", "ink", "ink-balanced")


def writer(method: str, path: str):
    import torch.distributed.checkpoint as dcp
    from inshrink.dcp.writer import InkStorageWriter
    if method == "fs":
        return dcp.FileSystemWriter(path)
    if method == "fs+zstd":
        from torch.distributed.checkpoint._extension import ZStandard
        return dcp.FileSystemWriter(path, _extensions=[ZStandard()])
    return InkStorageWriter(path, policy="balanced" if method == "ink-balanced" else None,
                            threads=1)  # one rank per core


def reader(method: str, path: str):
    import torch.distributed.checkpoint as dcp
    from inshrink.dcp.reader import InkStorageReader
    if method.startswith("fs"):
        return dcp.FileSystemReader(path)
    return InkStorageReader(path, threads=1)


def sharded(world: int, args) -> tuple:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(args.seed)
    model = ByteLM(256, args.d_model, args.layers, args.heads, args.ctx)
    mesh = init_device_mesh("cpu", (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    return model, optim


def train(model, optim, args, steps: int | None = None, seed: int | None = None) -> float:
    data = torch.frombuffer(bytearray(stdlib_corpus(2_000_000)[0]), dtype=torch.uint8).long()
    gen = torch.Generator().manual_seed(args.seed if seed is None else seed)
    loss = float("nan")
    for _ in range(args.steps if steps is None else steps):
        starts = torch.randint(0, data.numel() - args.ctx - 1, (args.batch,), generator=gen)
        x = torch.stack([data[s:s + args.ctx] for s in starts])
        y = torch.stack([data[s + 1:s + args.ctx + 1] for s in starts])
        out = model(x)
        loss = torch.nn.functional.cross_entropy(out.reshape(-1, 256), y.reshape(-1))
        loss.backward()
        optim.step()
        optim.zero_grad()
    return float(loss)


def dcp_state(model, optim, step: int) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model_sd, optim_sd = get_state_dict(model, optim)
    return {"model": model_sd, "optim": optim_sd, "step": step}


def timed(fn) -> float:
    import torch.distributed as dist
    dist.barrier()
    start = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - start


def dir_bytes(path: str) -> int:
    """Bytes of every file under ``path``."""
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(path)
               for n in names)


def save_phase(rank: int, world: int, root: str, args) -> None:
    """Train on ``world`` ranks, then save (sync and async) and load with every method."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    model, optim = sharded(world, args)
    start = time.perf_counter()
    loss = train(model, optim, args)
    train_s = time.perf_counter() - start
    state = dcp_state(model, optim, args.steps)
    raw = sum(t.to_local().nbytes if hasattr(t, "to_local") else t.nbytes
              for t in _tensors(state))
    raw = sum(dist_all_gather(raw))
    # loads go into another model's state: a lossy load must not change what is saved next
    dest = dcp_state(*sharded(world, args), 0)
    ckpt_group = dist.new_group()  # async saves' collectives apart from training's
    results = {"train_s": train_s, "loss": loss, "state_bytes": raw, "methods": {}}
    for method in METHODS:  # warm-up: compiled kernels, imports, first-touch of pages
        path = os.path.join(root, "warmup", method.replace("+", "_"))
        dcp.save(state, storage_writer=writer(method, path))
        dcp.load(dest, storage_reader=reader(method, path))
    for method in METHODS:
        sync, blocking, async_total, load = [], [], [], []
        for r in range(args.repeats):
            path = os.path.join(root, method.replace("+", "_"), f"sync{r}")
            sync.append(timed(lambda: dcp.save(state, storage_writer=writer(method, path))))
            apath = os.path.join(root, method.replace("+", "_"), f"async{r}")
            dist.barrier()
            start = time.perf_counter()
            future = dcp.async_save(state, storage_writer=writer(method, apath),
                                    process_group=ckpt_group)
            blocking.append(time.perf_counter() - start)
            future.result()
            dist.barrier()
            async_total.append(time.perf_counter() - start)
            load.append(timed(lambda: dcp.load(dest, storage_reader=reader(method, path))))
        if rank == 0:
            path = os.path.join(root, method.replace("+", "_"), "sync0")
            results["methods"][method] = {
                "bytes": dir_bytes(path), "save_s": statistics.median(sync),
                "async_blocking_s": statistics.median(blocking),
                "async_total_s": statistics.median(async_total),
                "load_s": statistics.median(load)}
    if args.series:
        results["series"] = series_run(rank, world, root, model, optim, args)
    if rank == 0:
        with open(os.path.join(root, "save.json"), "w") as f:
            json.dump(results, f)


def series_run(rank: int, world: int, root: str, model, optim, args) -> dict:
    """Go on training, saving every ``--series-every`` steps ``--series`` times: each step
    with FileSystemWriter (one directory per step) and into an InkSeries per policy (older
    steps rewritten as deltas); then restore each series' newest and oldest step."""
    import torch.distributed.checkpoint as dcp
    from inshrink.dcp.series import InkSeries
    policies = [None] + [p for p in args.series_policies.split(",") if p]
    series = {"ink-series" if p is None else f"ink-series-{p}": InkSeries(
        os.path.join(root, "series", "ink" if p is None else p), policy=p,
        keyframe_every=args.keyframe_every, threads=1) for p in policies}
    save_s: dict[str, list[float]] = {"fs": [], **{name: [] for name in series}}
    for k in range(args.series):
        train(model, optim, args, steps=args.series_every, seed=args.seed + 1 + k)
        step = args.steps + (k + 1) * args.series_every
        state = dcp_state(model, optim, step)
        path = os.path.join(root, "series", "fs", f"step_{step}")
        save_s["fs"].append(timed(lambda: dcp.save(state,
                                                   storage_writer=dcp.FileSystemWriter(path))))
        for name, s in series.items():
            save_s[name].append(timed(lambda: dcp.save(state, storage_writer=s.writer(step))))
    dest = dcp_state(*sharded(world, args), 0)
    newest = dcp.FileSystemReader(path)
    out = {"fs": {"bytes": dir_bytes(os.path.join(root, "series", "fs")),
                  "save_s": statistics.median(save_s["fs"]),
                  "load_newest_s": timed(lambda: dcp.load(dest, storage_reader=newest))}}
    for name, s in series.items():
        steps = s.steps()
        row = {"bytes": dir_bytes(s.directory), "save_s": statistics.median(save_s[name]),
               "load_newest_s": timed(lambda: dcp.load(dest, storage_reader=s.reader())),
               "load_oldest_s": timed(lambda: dcp.load(dest, storage_reader=s.reader(steps[0]))),
               "keyframes": sum(e.keyframe for e in s.checkpoints())}
        by_role: dict[str, dict[str, int]] = {}  # where the bytes go
        for st in steps:
            part = "whole" if st == steps[-1] else "delta"
            for r in s.describe(st):
                counts = by_role.setdefault(r["role"] or "other", {"delta": 0, "whole": 0})
                counts[part] += r["stored_bytes"]
        row["stored_by_role"] = by_role
        for kind, roles in (("weights", ("weight", "embedding")),
                            ("moments", ("exp_avg", "exp_avg_sq"))):
            errors = [r["error"]["rel_l2_error"] for r in s.describe(steps[0])
                      if r["error"] and r["role"] in roles]
            row[f"rel_l2_{kind}"] = max(errors) if errors else 0.0
        out[name] = row
    return {"checkpoints": args.series, "every": args.series_every, "methods": out}


def _tensors(state):
    if isinstance(state, dict):
        for value in state.values():
            yield from _tensors(value)
    elif isinstance(state, (list, tuple)):
        for value in state:
            yield from _tensors(value)
    elif isinstance(state, torch.Tensor):
        yield state


def dist_all_gather(value) -> list:
    import torch.distributed as dist
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def load_phase(rank: int, world: int, root: str, args) -> None:
    """Load every method's checkpoint (saved by more ranks) into ``world`` ranks."""
    import torch.distributed.checkpoint as dcp
    model, optim = sharded(world, args)
    state = dcp_state(model, optim, 0)
    results = {}
    for method in METHODS:
        path = os.path.join(root, method.replace("+", "_"), "sync0")
        dcp.load(state, storage_reader=reader(method, path))  # warm-up
        times = [timed(lambda: dcp.load(state, storage_reader=reader(method, path)))
                 for _ in range(args.repeats)]
        results[method] = statistics.median(times)
    if rank == 0:
        with open(os.path.join(root, f"load{world}.json"), "w") as f:
            json.dump(results, f)


def rank_main(rank, world, init, fn, root, args) -> None:
    import torch.distributed as dist
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        fn(rank, world, root, args)
    finally:
        dist.destroy_process_group()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2, help="ranks that train and save")
    ap.add_argument("--load-ranks", type=int, default=1, help="the other world size to load into")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--series", type=int, default=8,
                    help="checkpoints in the series comparison (0: none)")
    ap.add_argument("--series-every", type=int, default=10,
                    help="training steps between two checkpoints of the series")
    ap.add_argument("--series-policies", default="balanced,compact",
                    help="lossy policies of the series rows (comma-separated presets)")
    ap.add_argument("--keyframe-every", type=int, default=10)
    ap.add_argument("--json", help="write the numbers here")
    args = ap.parse_args(argv)

    import torch.distributed.checkpoint  # noqa: F401  (imported once, before forking)
    import torch.distributed.checkpoint.state_dict  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    import torch.multiprocessing as mp
    root = tempfile.mkdtemp(prefix="bench_dcp_", dir=tmp_root())
    try:
        for group, (world, fn) in enumerate(((args.ranks, save_phase),
                                             (args.load_ranks, load_phase))):
            init = f"file://{os.path.join(root, f'.init-{group}')}"
            mp.start_processes(rank_main, args=(world, init, fn, root, args), nprocs=world,
                               start_method="fork")
        with open(os.path.join(root, "save.json")) as f:
            results = json.load(f)
        with open(os.path.join(root, f"load{args.load_ranks}.json")) as f:
            other = json.load(f)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for method, row in results["methods"].items():
        row[f"load_into_{args.load_ranks}_s"] = other[method]
    results["config"] = vars(args)

    print(f"ByteLM d_model={args.d_model} layers={args.layers}, {args.steps} steps on "
          f"{args.ranks} ranks (loss {results['loss']:.3f}); model + AdamW state "
          f"{results['state_bytes'] / 1e6:.1f} MB; median of {args.repeats}")
    head = (f"{'method':<14}{'MB':>8}{'ratio':>7}{'save s':>9}{'async blk s':>13}"
            f"{'async all s':>13}{'load s':>9}{f'load->{args.load_ranks} s':>12}")
    print(head)
    for method, row in results["methods"].items():
        print(f"{method:<14}{row['bytes'] / 1e6:>8.2f}"
              f"{results['state_bytes'] / row['bytes']:>7.2f}{row['save_s']:>9.3f}"
              f"{row['async_blocking_s']:>13.3f}{row['async_total_s']:>13.3f}"
              f"{row['load_s']:>9.3f}{row[f'load_into_{args.load_ranks}_s']:>12.3f}")
    if "series" in results:
        print_series(results["series"], results["state_bytes"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


def print_series(series: dict, state_bytes: int) -> None:
    rows = series["methods"]
    plain = rows["fs"]["bytes"]
    print(f"\nseries: {series['checkpoints']} checkpoints, {series['every']} training steps "
          f"apart (plain DCP: {series['checkpoints']} directories)")
    print("(rel L2: the worst chunk's error in the oldest step, weights and moments)")
    print(f"{'method':<22}{'MB':>9}{'vs DCP':>8}{'save s':>9}{'newest s':>10}{'oldest s':>10}"
          f"{'keyframes':>10}{'rel L2 w':>10}{'rel L2 m':>10}")
    for name, row in rows.items():
        print(f"{name:<22}{row['bytes'] / 1e6:>9.2f}{plain / row['bytes']:>8.2f}"
              f"{row['save_s']:>9.3f}{row['load_newest_s']:>10.3f}"
              f"{row.get('load_oldest_s', row['load_newest_s']):>10.3f}"
              f"{row.get('keyframes', series['checkpoints']):>10}"
              f"{row.get('rel_l2_weights', 0.0):>10.4f}{row.get('rel_l2_moments', 0.0):>10.4f}")
    for name, row in rows.items():
        if "stored_by_role" not in row:
            continue
        parts = sorted(row["stored_by_role"].items(), key=lambda kv: -sum(kv[1].values()))
        print(f"{name}: stored MB by role, older steps (deltas) + newest (whole): " + ", ".join(
            f"{role} {c['delta'] / 1e6:.2f} + {c['whole'] / 1e6:.2f}" for role, c in parts))


if __name__ == "__main__":
    sys.exit(main())
