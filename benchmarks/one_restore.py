"""Lasting damage of one restore: does the loss right after a restore predict the final loss?

Trains the fault benchmark's language model (``ft_models``, same seed and batches) to step S,
then, per arm, replaces the weights by a quantized copy (the optimizer state stays exact),
trains on to the end of the schedule and reports the calibration loss right after the restore
and the final test loss (mean of the evaluations at the last three 5-step marks, against the
arm without a restore):

    ref        no restore                    noise      weights x (1 + 1e-3 N(0, 1))
    all32      every weight matrix 32 levels all16      every weight matrix 16 levels
    fc4/8/16   only the four MLP matrices (the least sensitive tensors), 4 / 8 / 16 levels
    all8, all4 every weight matrix 8 / 4 levels (with --arms)
    all8p40    every weight matrix 8 levels, its 40% smallest entries zero (with --arms)
    m0, v4, v2 weights exact, the first moment zero (plus its 0.05% largest) / the second
               moment at 4 / 2 levels (with --arms); opt4 = m0 + v4 (the default), opt2
               = m0 + v2; m0p1 / m0p5 the first moment zero but its 1% / 5% largest; m2 the
               first moment at 2 levels
    u2, u4     the first moment from Adam's update direction exp_avg / (sqrt(exp_avg_sq) +
               eps) at 2 signed-log / 4 linear levels; u0p1 that direction zero but its 1%
               largest (with --arms; the second moment exact)
    vfac       the second moment of every matrix as the outer product of its row sums / their
               total and its column sums (Adafactor's factorization, what the ``factored``
               stage stores), vectors at 2 levels; vfacm0 also the first moment zero (plus its
               0.05% largest), as the default stores it (with --arms)

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


def quantized(state: dict, bins_by_name: dict, workdir: str, prune: float = 0.0) -> dict:
    """``state`` saved with the given bins per tensor (protect 0.0005, ``prune`` of each
    tensor's smallest entries set to zero) and loaded back."""
    from inshrink.encode.policy import Policy, QuantConfig
    tensors = {n: QuantConfig(bins=b, prune=prune, protect=0.0005)
               for n, b in bins_by_name.items()}
    path = os.path.join(workdir, "restore.ink")
    inshrink.save(path, state, policy=Policy(tensors=tensors))
    return inshrink.load(path)


# name -> (which matrices, levels, pruned fraction)
QUANTIZED_ARMS = {"all32": ("all", 32, 0.0), "all16": ("all", 16, 0.0),
                  "all8": ("all", 8, 0.0), "all4": ("all", 4, 0.0),
                  "all8p40": ("all", 8, 0.4), "fc4": ("mlp", 4, 0.0),
                  "fc8": ("mlp", 8, 0.0), "fc16": ("mlp", 16, 0.0)}
# name -> QuantConfig arguments of (the first moment, the second; None: exact), weights exact
M0 = dict(bins=0)
OPTIMIZER_ARMS = {"m0": (M0, None), "v4": (None, dict(bins=4)), "v2": (None, dict(bins=2)),
                  "opt4": (M0, dict(bins=4)), "opt2": (M0, dict(bins=2)),
                  "m0p1": (dict(bins=0, protect=0.01), None),
                  "m0p5": (dict(bins=0, protect=0.05), None), "m2": (dict(bins=2), None)}
DEFAULT_ARMS = ("noise", "all32", "all16", "fc4", "fc8", "fc16")


# name -> QuantConfig arguments of u = exp_avg / (sqrt(exp_avg_sq) + eps), Adam's update
# direction; the first moment is restored as u' * (sqrt(exp_avg_sq) + eps), the rest exact
UPDATE_ARMS = {"u2": dict(bins=2, domain="signed_log"), "u4": dict(bins=4, domain="linear"),
               "u0p1": dict(bins=0, protect=0.01)}


def restore_update_direction(optimizer, config: dict, workdir: str) -> None:
    """Replace each Adam first moment by the one its quantized update direction implies."""
    from inshrink.encode.policy import Policy, QuantConfig
    directions, scales = {}, {}
    for index, group in enumerate(optimizer.param_groups):
        for n, param in enumerate(group["params"]):
            state = optimizer.state[param]
            name = f"u.{index}.{n}"
            scales[name] = state["exp_avg_sq"].sqrt() + group["eps"]
            directions[name] = (state["exp_avg"] / scales[name]).numpy()
    path = os.path.join(workdir, "directions.ink")
    inshrink.save(path, directions,
                  policy=Policy(tensors=dict.fromkeys(directions, QuantConfig(**config))))
    restored = inshrink.load(path)
    for index, group in enumerate(optimizer.param_groups):
        for n, param in enumerate(group["params"]):
            name = f"u.{index}.{n}"
            optimizer.state[param]["exp_avg"].copy_(torch.from_numpy(restored[name]) *
                                                    scales[name])


def restore_moments(optimizer, levels: tuple, workdir: str) -> None:
    """Replace the optimizer's moments by their quantized copies (the search space's default
    configurations for these roles, with the given levels)."""
    from inshrink.encode.policy import Policy, QuantConfig
    from inshrink.torch import load_state, state_to_numpy
    tensors, metadata = state_to_numpy(None, optimizer)
    roles = {role: QuantConfig(**kw) for role, kw in zip(("exp_avg", "exp_avg_sq"), levels)
             if kw is not None}
    path = os.path.join(workdir, "moments.ink")
    inshrink.save(path, tensors, policy=Policy(roles))
    load_state(inshrink.load(path), metadata, optimizer=optimizer)


# the second moment of every matrix as the rank-1 product of its row and column sums over
# their total (Adafactor's factorization), vectors at 2 levels, the first moment exact; "vfacm0"
# with the first moment zero (plus its 0.05% largest), as the default stores it
FACTORED_ARMS = {"vfac": None, "vfacm0": M0}


def restore_factored(optimizer, first: dict | None, workdir: str) -> None:
    """Replace each matrix's ``exp_avg_sq`` by its rank-1 factorization; vectors at 2 levels."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    exact = {p: optimizer.state[p]["exp_avg_sq"].clone() for p in params}
    restore_moments(optimizer, (first, dict(bins=2)), workdir)
    for p in params:
        v = exact[p]
        if v.dim() >= 2:
            m = v.reshape(-1, v.shape[-1]).double()
            rows, cols = m.sum(1), m.sum(0)
            total = rows.sum()
            approx = torch.outer(rows / total, cols) if total > 0 else torch.zeros_like(m)
            optimizer.state[p]["exp_avg_sq"].copy_(approx.reshape(v.shape).to(v.dtype))


def arms(state: dict, workdir: str, names=DEFAULT_ARMS) -> dict:
    matrices = [n for n, a in state.items() if a.ndim == 2]
    which = {"all": matrices, "mlp": [n for n in matrices if ".fc" in n]}
    out = {"ref": None}
    for name in names:
        if name in OPTIMIZER_ARMS or name in UPDATE_ARMS or name in FACTORED_ARMS:
            out[name] = None  # weights exact; see restore_moments / restore_update_direction
            continue
        if name == "noise":
            rng = np.random.default_rng(0)
            out[name] = {n: (a * (1 + 1e-3 * rng.standard_normal(a.shape))).astype(a.dtype)
                         if a.ndim == 2 else a for n, a in state.items()}
            continue
        group, bins, prune = QUANTIZED_ARMS[name]
        out[name] = quantized(state, dict.fromkeys(which[group], bins), workdir, prune)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--step", type=int, default=900, help="restore after this step")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                    help=f"comma-separated, of noise,{','.join(QUANTIZED_ARMS)},"
                         f"{','.join(OPTIMIZER_ARMS)},{','.join(UPDATE_ARMS)}")
    args = ap.parse_args(argv)
    names = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in names if a != "noise" and a not in QUANTIZED_ARMS
               and a not in OPTIMIZER_ARMS and a not in UPDATE_ARMS and a not in FACTORED_ARMS]
    if unknown:
        ap.error(f"unknown arms {unknown}")
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
        for name, weights in arms(state, workdir, names).items():
            fm.rewind(task, snapshot)
            if weights is not None:
                task.model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v))
                                            for k, v in weights.items()})
            if name in OPTIMIZER_ARMS:
                restore_moments(task.optimizer, OPTIMIZER_ARMS[name], workdir)
            if name in UPDATE_ARMS:
                restore_update_direction(task.optimizer, UPDATE_ARMS[name], workdir)
            if name in FACTORED_ARMS:
                restore_factored(task.optimizer, FACTORED_ARMS[name], workdir)
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
