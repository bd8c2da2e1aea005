"""Save and load times of two revisions of inshrink on the same checkpoint, in one run.

Each revision is exported from git (``git archive``) into a temporary directory and imported
from there in its own subprocess, with its own kernel cache (warmed up before timing). The
revisions take turns on every repeat, so machine load hits both alike; the table gives the
best CPU and wall seconds of each and the ratio B / A.

    python benchmarks/compare_revisions.py A B FILE.safetensors [--modes lossless balanced]

A and B are any git revisions (commit, tag, ``HEAD``); FILE holds F32/F16 tensors that
``safetensors.numpy`` reads (e.g. ``final_fp32.safetensors`` from ``benchmarks/train.py``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# runs inside the revision's tree: one warm-up, then one timed save and load per mode
WORKER = r"""
import json, os, sys, time
import inshrink
import ml_dtypes  # safetensors.numpy reads bf16 through it (inshrink imports it late)
from safetensors.numpy import load_file
tensors = load_file(sys.argv[1])
out = os.path.join(sys.argv[2], "x.ink")
result = {}
for mode in sys.argv[3].split(","):
    policy = None if mode == "lossless" else mode
    inshrink.save(out, tensors, policy=policy)          # warm-up: kernels compiled or loaded
    inshrink.load(out)
    for op in ("save", "load"):
        cpu, wall = time.process_time(), time.perf_counter()
        if op == "save":
            inshrink.save(out, tensors, policy=policy)
        else:
            inshrink.load(out)
        result[f"{mode} {op}"] = (time.process_time() - cpu, time.perf_counter() - wall)
    result[f"{mode} bytes"] = os.path.getsize(out)
print(json.dumps(result))
"""


def export(revision: str, into: Path) -> str:
    """Export ``revision``'s tree into ``into``; returns its short commit id."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", revision],
                            check=True, capture_output=True, text=True).stdout.strip()
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return commit


def run(tree: Path, cache: Path, path: str, modes: list[str], work: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), XDG_CACHE_HOME=str(cache),
               OMP_NUM_THREADS="1")
    env.pop("NUMBA_CACHE_DIR", None)
    proc = subprocess.run([sys.executable, "-c", WORKER, path, str(work), ",".join(modes)],
                          env=env, cwd=work, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{tree}: the worker failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("file")
    parser.add_argument("--modes", nargs="+", default=["lossless", "balanced"])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="inshrink-revs-") as tmp:
        tmp = Path(tmp)
        names = {}
        for key, revision in (("a", args.a), ("b", args.b)):
            names[key] = export(revision, tmp / key / "src")
            (tmp / key / "work").mkdir()
        best: dict[str, dict[str, list[float]]] = {"a": {}, "b": {}}
        sizes: dict[str, dict] = {}
        for repeat in range(args.repeats):
            for key in ("a", "b") if repeat % 2 == 0 else ("b", "a"):
                result = run(tmp / key / "src", tmp / key / "cache", os.path.abspath(args.file),
                             args.modes,
                             tmp / key / "work")
                for name, value in result.items():
                    if name.endswith("bytes"):
                        sizes.setdefault(key, {})[name] = value
                        continue
                    cur = best[key].setdefault(name, [float("inf"), float("inf")])
                    best[key][name] = [min(cur[0], value[0]), min(cur[1], value[1])]
    size = os.path.getsize(args.file)
    print(f"{args.file}: {size / 1e6:.1f} MB; A = {args.a} ({names['a']}), "
          f"B = {args.b} ({names['b']}); best of {args.repeats}, one thread per process")
    print("| mode / op | A cpu s | B cpu s | B/A cpu | A wall s | B wall s | B/A wall |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in best["a"]:
        (ca, wa), (cb, wb) = best["a"][name], best["b"][name]
        print(f"| {name} | {ca:.3f} | {cb:.3f} | {cb / ca:.2f} | {wa:.3f} | {wb:.3f} "
              f"| {wb / wa:.2f} |")
    for mode in args.modes:
        a, b = sizes["a"][f"{mode} bytes"], sizes["b"][f"{mode} bytes"]
        print(f"{mode}: A {a} bytes, B {b} bytes{' (identical size)' if a == b else ''}")


if __name__ == "__main__":
    main()
