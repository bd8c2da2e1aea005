"""Host memory and blocked time of asynchronous saves: Checkpointer(async_=True) with the
state copied at the call (async_staging="copy") against the state read in place, the next
optimizer step waiting for the save ("in_place").

A model of a few large linear layers trained with AdamW on CPU, saved every few steps; each
configuration runs in a fresh process. Reported: the state's bytes, its largest tensor, the
peak RSS growth during the saves over the RSS before the first (VmHWM after
/proc/self/clear_refs, Linux), the time training was blocked (Checkpointer.seconds) and the
time of the whole loop.

    python benchmarks/bench_async_memory.py [--width 2048] [--layers 4] [--saves 4]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, os, sys, tempfile, time
import torch
from torch import nn
from inshrink.torch import Checkpointer
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

def kib(field):
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith(field)).split()[1])

step()  # the optimizer's state exists before the first save
state = sum(t.numel() * t.element_size() for t in model.state_dict().values())
state += sum(v.numel() * v.element_size() for s in optimizer.state.values()
             for v in s.values() if torch.is_tensor(v))
largest = max(p.numel() * p.element_size() for p in model.parameters())
with tempfile.TemporaryDirectory() as work:
    ckpt = Checkpointer(os.path.join(work, "c"), model, optimizer, async_=True,
                        async_staging=staging, policy=policy, grad_ema=False, threads=1)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = kib("VmRSS:")
    started = time.perf_counter()
    for k in range(saves * every):
        step()
        if k % every == every - 1:
            ckpt.save(k + 1)
    ckpt.close()
    loop = time.perf_counter() - started
    peak = kib("VmHWM:")
print(json.dumps({"staging": staging, "state_bytes": state, "largest_bytes": largest,
                  "peak_growth_bytes": (peak - before) << 10, "blocked_s": ckpt.seconds,
                  "loop_s": loop}))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--saves", type=int, default=4)
    p.add_argument("--every", type=int, default=3, help="training steps between saves")
    p.add_argument("--policy", default="lossless")
    p.add_argument("--json")
    args = p.parse_args()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
        + [q for q in os.environ.get("PYTHONPATH", "").split(os.pathsep) if q]))
    print(f"load average (1 min) {os.getloadavg()[0]:.2f}; {time.strftime('%Y-%m-%d %H:%M')}"
          f" UTC; {args.layers} x Linear({args.width}, {args.width}) + AdamW, "
          f"{args.saves} saves every {args.every} steps, policy {args.policy}")
    rows = []
    for staging in ("copy", "in_place"):
        out = subprocess.run([sys.executable, "-c", CHILD, str(args.width), str(args.layers),
                              str(args.saves), str(args.every), staging, args.policy],
                             env=env, check=True, capture_output=True, text=True,
                             cwd=tempfile.gettempdir()).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    mib = 1 << 20
    print(f"state {rows[0]['state_bytes'] / mib:.0f} MiB, largest tensor "
          f"{rows[0]['largest_bytes'] / mib:.0f} MiB\n")
    print("| staging | peak host memory added | ÷ state | blocked | loop | blocked share |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['staging']} | {r['peak_growth_bytes'] / mib:.0f} MiB | "
              f"{r['peak_growth_bytes'] / r['state_bytes']:.2f} | {r['blocked_s']:.2f} s | "
              f"{r['loop_s']:.2f} s | {r['blocked_s'] / r['loop_s']:.1%} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
