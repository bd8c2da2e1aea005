"""Exit stress of the sharded async Checkpointer under ``torchrun``: many two-rank runs that
train an FSDP2 model, save four steps in the background and end without ``close()`` or
``destroy_process_group()``; counts the runs whose ranks did not exit cleanly (torchrun's exit
status, "terminate called" on stderr).

Usage::

    python benchmarks/exit_stress.py --runs 40                 # the library in this checkout
    python benchmarks/exit_stress.py --runs 40 --repo /path/to/other/checkout

Odd runs save losslessly, even runs with ``policy="balanced"``. Each run takes ~4 s on 2 cores.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

RANK = r'''
import sys, warnings
warnings.simplefilter("ignore")
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from inshrink.torch import Checkpointer
torch.set_num_threads(1)
dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(6)])
for layer in model:
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
policy = sys.argv[2] if len(sys.argv) > 2 else None
ck = Checkpointer(sys.argv[1], model, optim, async_=True, keep_last=2, policy=policy)
for step in range(1, 5):
    model(torch.randn(4, 64)).sum().backward()
    optim.step(); optim.zero_grad()
    ck.save(step)
# the script ends here: no close(), no destroy_process_group()
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--repo", default=os.path.dirname(os.path.dirname(os.path.abspath(
        __file__))), help="the checkout whose inshrink the ranks import")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="exit-stress-")
    script = os.path.join(work, "rank.py")
    with open(script, "w") as f:
        f.write(RANK)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = dict(os.environ, PYTHONPATH=os.path.abspath(args.repo))
    failed = 0
    try:
        for run in range(1, args.runs + 1):
            policy = ["balanced"] if run % 2 == 0 else []
            out = subprocess.run([torchrun, "--nproc_per_node", "2", "--master_port",
                                  str(29400 + run % 500), script,
                                  os.path.join(work, f"ck{run}"), *policy],
                                 env=env, capture_output=True, text=True, timeout=300)
            aborted = "terminate called" in out.stderr
            bad = out.returncode != 0 or aborted
            failed += bad
            print(f"run {run}: exit {out.returncode}{' (terminate called)' if aborted else ''}",
                  flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{failed} of {args.runs} runs did not exit cleanly")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
