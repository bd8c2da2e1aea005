"""Host memory and blocked time of asynchronous saves: Checkpointer(async_=True) with the
state copied at the call (async_staging="copy") against the state read in place, the next
optimizer step waiting for the save ("in_place"), and synchronous saves ("sync") for scale;
"none" is the same loop without saves, whose peak (training's own) the others are compared to.

A model of a few large linear layers trained with AdamW on CPU, saved every few steps; each
configuration runs in a fresh process. Reported: the state's bytes, its largest tensor, the
process's peak RSS (VmHWM, Linux: what the allocator keeps after a save counts too) and what
the saves add to it over the same run without saves ("none"), the time training was blocked
(Checkpointer.seconds) and the time of the loop. Every run, "none" too, makes one save
before the loop (imports, kernels), not counted in the blocked time.

    python benchmarks/bench_async_memory.py [--width 2048] [--layers 4] [--saves 4]
    python benchmarks/bench_async_memory.py --sharded 2 ...   # FSDP2 on 2 gloo ranks
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

MEASURE = r"""
import time
from inshrink.torch import Checkpointer

def kib(field):
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith(field)).split()[1])

def measure(directory, model, optimizer, step, staging, policy, saves, every, **options):
    # One warm-up save (imports, kernels, first allocations), then the timed loop.
    ckpt = Checkpointer(directory, model, optimizer, async_=staging in ("copy", "in_place"),
                        async_staging=staging if staging in ("copy", "in_place") else "copy",
                        policy=policy, threads=1, **options)
    ckpt.save(0)
    ckpt.wait()
    warm_up = ckpt.seconds
    started = time.perf_counter()
    for k in range(saves * every):
        step()
        if k % every == every - 1 and staging != "none":
            ckpt.save(k + 1)
    ckpt.close()
    loop = time.perf_counter() - started
    # VmHWM is the whole process's: memory freed and kept by the allocator counts too.
    return {"staging": staging, "peak_bytes": kib("VmHWM:") << 10,
            "blocked_s": ckpt.seconds - warm_up, "loop_s": loop}
"""

CHILD = MEASURE + r"""
import json, os, sys, tempfile
import torch
from torch import nn
width, layers, saves, every, staging, policy = (int(sys.argv[1]), int(sys.argv[2]),
    int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6])
torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(32, width)

def step():
    loss = model(x).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

step()  # the optimizer's state exists before the first save
state = sum(t.numel() * t.element_size() for t in model.state_dict().values())
state += sum(v.numel() * v.element_size() for s in optimizer.state.values()
             for v in s.values() if torch.is_tensor(v))
largest = max(p.numel() * p.element_size() for p in model.parameters())
with tempfile.TemporaryDirectory() as work:
    row = measure(os.path.join(work, "c"), model, optimizer, step, staging, policy, saves,
                  every, grad_ema=False)
print(json.dumps({**row, "state_bytes": state, "largest_bytes": largest}))
"""


SHARDED_CHILD = MEASURE + r"""
import json, os, sys, tempfile
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
width, layers, saves, every, staging, policy, world = (int(sys.argv[1]), int(sys.argv[2]),
    int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6], int(sys.argv[7]))

def rank_main(rank, work):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{work}/.init", rank=rank,
                            world_size=world)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(32, width)

    def step():
        loss = model(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    step()
    local = lambda t: t.to_local() if hasattr(t, "to_local") else t
    state = sum(local(p).numel() * 4 for p in model.parameters()) * 3  # + AdamW's 2 moments
    largest = max(local(p).numel() * 4 for p in model.parameters())
    row = measure(os.path.join(work, "c"), model, optimizer, step, staging, policy, saves,
                  every)
    with open(os.path.join(work, f"rank{rank}.json"), "w") as f:
        json.dump({**row, "state_bytes": state, "largest_bytes": largest}, f)
    dist.destroy_process_group()

if __name__ == "__main__":
    import warnings
    warnings.simplefilter("ignore")
    with tempfile.TemporaryDirectory() as work:
        mp.start_processes(rank_main, args=(work,), nprocs=world, start_method="fork")
        rows = [json.load(open(os.path.join(work, f"rank{r}.json"))) for r in range(world)]
    worst = max(rows, key=lambda r: r["peak_bytes"])
    print(json.dumps({**worst, "blocked_s": max(r["blocked_s"] for r in rows),
                      "loop_s": max(r["loop_s"] for r in rows)}))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--saves", type=int, default=4)
    p.add_argument("--every", type=int, default=3, help="training steps between saves")
    p.add_argument("--policy", default="lossless")
    p.add_argument("--sharded", type=int, metavar="RANKS", default=0,
                   help="the sharded Checkpointer: FSDP2 over this many gloo ranks; the "
                        "numbers are the rank with the largest peak, per rank's shard")
    p.add_argument("--json")
    args = p.parse_args()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
        + [q for q in os.environ.get("PYTHONPATH", "").split(os.pathsep) if q]))
    print(f"load average (1 min) {os.getloadavg()[0]:.2f}; {time.strftime('%Y-%m-%d %H:%M')}"
          f" UTC; {args.layers} x Linear({args.width}, {args.width}) + AdamW, "
          f"{args.saves} saves every {args.every} steps, policy {args.policy}"
          + (f", sharded over {args.sharded} ranks (per rank)" if args.sharded else ""))
    rows = []
    for staging in ("none", "sync", "copy", "in_place"):
        child = [sys.executable, "-c", SHARDED_CHILD] if args.sharded else \
            [sys.executable, "-c", CHILD]
        out = subprocess.run(child + [str(args.width), str(args.layers), str(args.saves),
                                      str(args.every), staging, args.policy]
                             + ([str(args.sharded)] if args.sharded else []),
                             env=env, check=True, capture_output=True, text=True,
                             cwd=tempfile.gettempdir()).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    mib = 1 << 20
    print(f"state {rows[0]['state_bytes'] / mib:.0f} MiB, largest tensor "
          f"{rows[0]['largest_bytes'] / mib:.0f} MiB\n")
    base = rows[0]["peak_bytes"]  # the same run without saves
    print("| staging | peak RSS | added by the saves | ÷ state | ÷ (largest + 256 MiB) "
          "| blocked | loop | blocked share |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        added = r["peak_bytes"] - base
        print(f"| {r['staging']} | {r['peak_bytes'] / mib:.0f} MiB | {added / mib:.0f} MiB | "
              f"{added / r['state_bytes']:.2f} | "
              f"{added / (r['largest_bytes'] + (256 << 20)):.2f} | "
              f"{r['blocked_s']:.2f} s | {r['loop_s']:.2f} s | "
              f"{r['blocked_s'] / r['loop_s']:.1%} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
