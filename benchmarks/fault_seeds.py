"""Combine fault-tolerance results of several seeds: per model and run, the relative
degradation of each seed (against that seed's own reference run), their mean and standard
deviation, and the mean end-to-end ratio.

    python benchmarks/fault_seeds.py benchmarks/results/fault.json \
        benchmarks/results/fault_lm_seed1.json benchmarks/results/fault_lm_seed2.json

Each input is a JSON file written by ``bench_fault.py`` (``--seed`` chooses the seed). A single
run's final quality moves by a few percent under any perturbation of the trajectory (the fp16
cast shows it), so a degradation is only meaningful next to that spread.
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict


def collect(paths: list[str]) -> dict:
    """(model, run) -> {seed: (degradation in %, ratio)}."""
    table: dict = defaultdict(dict)
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        for r in doc["results"]:
            if "error" in r or r["run"] == "ref":
                continue
            key = "acc" if "acc" in r["degradation"] else "loss"
            table[(r["model"], r["run"])][doc["seed"]] = (100 * r["degradation"][key],
                                                          r["ratio"])
    return table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="+")
    args = ap.parse_args(argv)
    table = collect(args.json)
    print("| model | run | seeds | degradation per seed | mean | sd | mean ratio |")
    print("|---|---|---:|---|---:|---:|---:|")
    for (model, run), by_seed in sorted(table.items()):
        seeds = sorted(by_seed)
        degs = [by_seed[s][0] for s in seeds]
        sd = statistics.stdev(degs) if len(degs) > 1 else float("nan")
        per = ", ".join(f"{d:+.2f}%" for d in degs)
        ratio = statistics.mean(by_seed[s][1] for s in seeds)
        print(f"| {model} | {run} | {','.join(map(str, seeds))} | {per} | "
              f"{statistics.mean(degs):+.2f}% | {sd:.2f} | {ratio:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
