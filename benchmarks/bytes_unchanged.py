"""SHA-256 of the files two revisions of inshrink write from the same checkpoints, side by side.

A change that must not move the bytes on disk (a restructuring, a speed-up that keeps the
format) is checked with it: each revision is exported from git (``git archive``) and run in its
own subprocess on the same safetensors checkpoints, writing

* every checkpoint as a standalone file, lossless and with every preset, with 1 and 2 threads;
* a Series of all the checkpoints (the older steps rewritten as deltas), lossless and
  ``balanced``, with 1 and 2 threads;

and the table lists each file's digest under both revisions, with ``same`` or ``DIFFERENT``.

    python benchmarks/bytes_unchanged.py A B DIR [DIR ...]

A and B are git revisions; each DIR holds ``*.safetensors`` checkpoints (for example those of
``benchmarks/train.py``). Exits 1 when any digest differs.
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

# runs inside the revision's tree; prints {label: sha256}
WORKER = r"""
import glob, hashlib, json, os, sys
import inshrink
import ml_dtypes  # safetensors.numpy reads bf16 through it (inshrink imports it late)
from inshrink import PRESETS
from safetensors.numpy import load_file

def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()

out = sys.argv[1]
result = {}
imported = os.path.dirname(os.path.dirname(os.path.abspath(inshrink.__file__)))
for directory in sys.argv[2:]:
    files = sorted(glob.glob(os.path.join(directory, "*.safetensors")))
    checkpoints = [(os.path.basename(p), load_file(p)) for p in files]
    for threads in (1, 2):
        for name, tensors in checkpoints:
            for preset in sorted(PRESETS):
                path = os.path.join(out, "x.ink")
                inshrink.save(path, tensors, policy=preset, threads=threads)
                result[f"{name} {preset} threads={threads}"] = digest(path)
                os.remove(path)
        for preset in ("lossless", "balanced"):
            series_dir = os.path.join(out, f"series-{preset}-{threads}")
            series = inshrink.Series(series_dir, policy=preset, threads=threads)
            for step, (name, tensors) in enumerate(checkpoints):
                series.save(step, tensors)
            for path in sorted(glob.glob(os.path.join(series_dir, "*.ink"))):
                label = f"series {os.path.basename(directory)} {preset} threads={threads}"
                result[f"{label} {os.path.basename(path)}"] = digest(path)
print(json.dumps({"tree": imported, "digests": result}))
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


def digests(tree: Path, directories: list[str], work: Path) -> dict[str, str]:
    """Run the worker in ``tree`` (its own import path) and return its digests."""
    work.mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run([sys.executable, "-c", WORKER, str(work), *directories],
                          cwd=str(work), env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the worker failed in {tree}:\n{done.stderr}")
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    if os.path.realpath(answer["tree"]) != os.path.realpath(tree):  # an installed copy won
        raise SystemExit(f"the worker imported inshrink from {answer['tree']}, not {tree}")
    return answer["digests"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("directories", nargs="+")
    args = parser.parse_args()
    directories = [str(Path(d).resolve()) for d in args.directories]
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        results = []
        for label in ("a", "b"):
            revision = getattr(args, label)
            commit = export(revision, root / label / "tree")
            results.append((commit, digests(root / label / "tree", directories,
                                            root / label / "work")))
    (commit_a, a), (commit_b, b) = results
    differing = 0
    print(f"| file | {commit_a} | {commit_b} | |")
    print("|---|---|---|---|")
    for label in sorted(set(a) | set(b)):
        same = a.get(label) == b.get(label)
        differing += not same
        print(f"| {label} | {a.get(label, '-')[:16]} | {b.get(label, '-')[:16]} | "
              f"{'same' if same else 'DIFFERENT'} |")
    print(f"\n{len(set(a) | set(b)) - differing} of {len(set(a) | set(b))} files identical")
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    main()
