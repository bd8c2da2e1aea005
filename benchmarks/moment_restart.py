"""What a restored first moment does to Adam: train on from one state with ``exp_avg`` replaced.

Trains the fault benchmark's language model (``ft_models``) to step S, then, per arm, restores
the exact weights and ``exp_avg_sq`` with ``exp_avg`` replaced as below, trains 60 steps and
reports the spread of the output head's weights (the tensor whose rows for rare bytes have a
tiny second moment) and the test loss:

    exact      exp_avg as it was             zero       exp_avg = 0 (momentum restart)
    bins0      QuantConfig(bins=0): zeros plus the 0.05% largest entries (the default)
    mean1      one linear level (the weighted mean) plus the 0.05% largest entries
    mean1np    one linear level, nothing protected
    two        2 signed-log levels (the ``compact`` preset)

    OMP_NUM_THREADS=1 python benchmarks/moment_restart.py --step 300     # ~1 min on 1 core

Adam's step is exp_avg / (sqrt(exp_avg_sq) + eps): any nonzero value restored where the
second moment is tiny becomes a huge step.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import ft_models as fm  # noqa: E402

inshrink, _why = common.import_inshrink()

ARMS = {"bins0": dict(bins=0), "mean1": dict(bins=1, domain="linear"),
        "mean1np": dict(bins=1, domain="linear", protect=0.0),
        "two": dict(bins=2, domain="signed_log")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--step", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps-after", type=int, default=60)
    args = ap.parse_args(argv)
    if inshrink is None:
        raise SystemExit(f"inshrink not importable: {_why}")
    from inshrink.encode.policy import Policy, QuantConfig
    task, snapshot = fm.trained("lm", args.seed, args.step, after=args.steps_after)
    print(f"lm seed {args.seed}: restore after step {args.step}, "
          f"{args.steps_after} steps on; head std before {snapshot[0]['head.weight'].std():.4f}")
    print("| arm | head std after | test loss after |")
    print("|---|---:|---:|")
    with tempfile.TemporaryDirectory(dir=common.tmp_root()) as workdir:
        path = os.path.join(workdir, "m.ink")

        def quantized(config):
            def replace(moment):
                name = "optimizer.state.0.exp_avg"
                inshrink.save(path, {name: moment.numpy()}, policy=Policy({"exp_avg": config}))
                return torch.from_numpy(inshrink.load(path)[name].copy())
            return replace

        arms = {"exact": lambda m: m, "zero": torch.zeros_like,
                **{k: quantized(QuantConfig(**v)) for k, v in ARMS.items()}}
        for name, replace in arms.items():
            fm.rewind(task, snapshot)
            state = task.optimizer.state_dict()
            for values in state["state"].values():
                values["exp_avg"] = replace(values["exp_avg"])
            task.optimizer.load_state_dict(state)
            for step in range(args.step + 1, args.step + args.steps_after + 1):
                task.train_step(step)
            head = task.model.state_dict()["head.weight"]
            print(f"| {name} | {head.std():.4f} | {task.evaluate()['loss']:.4f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
