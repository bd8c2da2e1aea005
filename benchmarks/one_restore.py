"""Lasting damage of one restore: does the loss right after a restore predict the final loss?

Trains the fault benchmark's language model (``ft_models``, same seed and batches) to step S,
then, per arm, replaces the weights by a quantized copy (the optimizer state stays exact),
trains on to the end of the schedule and reports the calibration loss right after the restore
and the final test loss (mean of the evaluations at the last three 5-step marks, against the
arm without a restore):

    ref        no restore                    noise      weights x (1 + 1e-3 N(0, 1))
    all32      every weight matrix 32 levels all16      every weight matrix 16 levels
    fc4/8/16   only the four MLP matrices (the least sensitive tensors), 4 / 8 / 16 levels

    OMP_NUM_THREADS=1 python benchmarks/one_restore.py --step 900      # ~4 min on 1 core

The per-tensor bins of the search (``SearchSpace(per_tensor_bins=True)``) quantize exactly the
insensitive matrices hardest; this measures what that costs once training resumes.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import ft_models as fm  # noqa: E402

inshrink, _why = common.import_inshrink()


def quantized(state: dict, bins_by_name: dict, workdir: str) -> dict:
    """``state`` saved with the given bins per tensor (protect 0.0005) and loaded back."""
    from inshrink.policy import Policy, QuantConfig
    tensors = {n: QuantConfig(bins=b, protect=0.0005) for n, b in bins_by_name.items()}
    path = os.path.join(workdir, "restore.ink")
    inshrink.save(path, state, policy=Policy(tensors=tensors))
    return inshrink.load(path)


def arms(state: dict, workdir: str) -> dict:
    matrices = [n for n, a in state.items() if a.ndim == 2]
    mlp = [n for n in matrices if ".fc" in n]
    rng = np.random.default_rng(0)
    noisy = {n: (a * (1 + 1e-3 * rng.standard_normal(a.shape))).astype(a.dtype)
             if a.ndim == 2 else a for n, a in state.items()}
    out = {"ref": None, "noise": noisy}
    for name, names, bins in (("all32", matrices, 32), ("all16", matrices, 16),
                              ("fc4", mlp, 4), ("fc8", mlp, 8), ("fc16", mlp, 16)):
        out[name] = quantized(state, dict.fromkeys(names, bins), workdir)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--step", type=int, default=900, help="restore after this step")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if inshrink is None:
        raise SystemExit(f"inshrink not importable: {_why}")
    task, snapshot = fm.trained("lm", args.seed, args.step, after=15)
    state = {k: v.numpy().copy() for k, v in snapshot[0].items()}
    marks = [task.steps - 10, task.steps - 5, task.steps]
    print(f"lm seed {args.seed}: restore after step {args.step} of {task.steps}; final = mean "
          f"test loss at steps {marks}")
    print("| arm | calibration loss after restore | final loss | final vs ref |")
    print("|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory(dir=common.tmp_root()) as workdir:
        base_calib = base_final = None
        for name, weights in arms(state, workdir).items():
            fm.rewind(task, snapshot)
            if weights is not None:
                task.model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v))
                                            for k, v in weights.items()})
            calib = task.evaluate(task.calib_batches)["loss"]
            finals = []
            for step in range(args.step + 1, task.steps + 1):
                task.train_step(step)
                if step in marks:
                    finals.append(task.evaluate()["loss"])
            final = float(np.mean(finals))
            if base_final is None:
                base_calib, base_final = calib, final
            print(f"| {name} | {calib:.4f} ({calib / base_calib - 1:+.2%}) | {final:.4f} | "
                  f"{final / base_final - 1:+.3%} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
