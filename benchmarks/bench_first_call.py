"""First calls and many small tensors: what a fresh process pays, and what a save of a
checkpoint of thousands of small tensors costs per core and in the garbage collector.

    python benchmarks/bench_first_call.py first [--runs 5]
    python benchmarks/bench_first_call.py small [--tensors 2000] [--reps 10]
    python benchmarks/bench_first_call.py fresh [--runs 5] [--venv PATH] [--upgrade]

``first``: a small checkpoint (2.1 MB, 164 tensors: 41 parameters of a small model — 96×90
and 90×96 matrices, biases — their AdamW moments and steps) saved with
``policy="balanced"`` by a fresh process with an empty Numba cache (``NUMBA_CACHE_DIR`` a new
folder), then by a second fresh process with the cache the first one filled. Prints wall and
CPU seconds of ``import inshrink`` and of the save, per run.

``small``: a synthetic checkpoint of ``--tensors`` float32 tensors of 256–4,096 elements
(weights, first and second moments), saved ``--reps`` times with one thread, lossless and
``balanced``, in a process that has imported torch (a training process's heap, which the
collector's full passes visit). Prints CPU ms per save (least and mean), the collector's ms
per save and collections per save by generation, and MB per CPU second; then the same for
``--reps`` loads of the file saved (lines with ``"op": "load"``).

``fresh``: what a new user pays, in CPU seconds (user + system, every thread), median of
``--runs`` fresh processes each: ``python -c "import inshrink"`` and ``inshrink --help``
(whole processes, interpreter start included; ``python -c pass`` for reference), and the
``first`` checkpoint's balanced save (the ``inshrink.save`` call alone and its whole
process) with an empty Numba cache, then with the cache that save filled. It runs in a
virtualenv made with ``python -m venv`` holding the newest release of every core dependency
of pyproject.toml (``pip install --upgrade``) and this tree installed as a user installs it
(``pip install --no-deps .``, reinstalled each time, no editable finder); ``--venv PATH``
reuses (or makes) the virtualenv there, ``--upgrade`` upgrades its dependencies again.
Children run outside the tree with no ``PYTHONPATH``. Prints the versions used.

To compare revisions, run the script with each revision's tree on ``PYTHONPATH``,
alternating.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib  # (Python 3.11+, like the benchmarks' own virtualenv)

import numpy as np


def small_model_checkpoint(seed: int = 0) -> dict[str, np.ndarray]:
    """41 parameters of a small model, their AdamW moments and step counts (164 tensors)."""
    rng = np.random.default_rng(seed)
    shapes = [s for _ in range(10) for s in ((96, 90), (96,), (90, 96), (90,))] + [(8,)]
    state = {}
    for i, shape in enumerate(shapes):
        w = (rng.standard_normal(shape) * 0.02).astype(np.float32)
        g = (rng.standard_normal(shape) * 1e-3).astype(np.float32)
        state[f"model.p{i}.weight" if len(shape) > 1 else f"model.p{i}.bias"] = w
        state[f"optimizer.state.{i}.exp_avg"] = (g * 0.1).astype(np.float32)
        state[f"optimizer.state.{i}.exp_avg_sq"] = (g * g * 1e-3 + 1e-12).astype(np.float32)
        state[f"optimizer.state.{i}.step"] = np.array(1000.0, np.float32)
    return state


def many_small_tensors(count: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``count`` float32 tensors of 256–4,096 elements: weights, moments, squared moments."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    k = 0
    while len(out) < count:
        size = int(rng.integers(256, 4097))
        out[f"model.layers.{k}.weight"] = (rng.standard_normal(size) * 0.02).astype(np.float32)
        out[f"optimizer.state.{k}.exp_avg"] = (rng.standard_normal(size) * 1e-3).astype(np.float32)
        out[f"optimizer.state.{k}.exp_avg_sq"] = (rng.random(size) * 1e-6).astype(np.float32)
        k += 1
    return dict(list(out.items())[:count])


_CHILD = """
import sys, time
t0, c0 = time.perf_counter(), time.process_time()
import inshrink
t1, c1 = time.perf_counter(), time.process_time()
import numpy as np
state = dict(np.load(sys.argv[1]))
t2, c2 = time.perf_counter(), time.process_time()
inshrink.save(sys.argv[2], state, policy="balanced")
t3, c3 = time.perf_counter(), time.process_time()
print(f"{t1 - t0:.3f} {c1 - c0:.3f} {t3 - t2:.3f} {c3 - c2:.3f}")
"""


def first(runs: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        source = os.path.join(scratch, "ckpt.npz")
        np.savez(source, **small_model_checkpoint())
        target = os.path.join(scratch, "ckpt.ink")
        print("run | load | import wall / CPU s | first save, empty cache: wall / CPU s | "
              "first save, cache filled: wall / CPU s")
        for run in range(runs):
            cache = tempfile.mkdtemp(dir=scratch)
            env = {**os.environ, "NUMBA_CACHE_DIR": cache}
            rows = []
            for _ in range(2):  # empty cache, then the cache it filled
                out = subprocess.run([sys.executable, "-c", _CHILD, source, target], env=env,
                                     check=True, capture_output=True, text=True).stdout.split()
                rows.append([float(x) for x in out])
            (iw, ic, fw, fc), (_, _, cw, cc) = rows
            print(f"{run + 1} | {os.getloadavg()[0]:.2f} | {iw:.3f} / {ic:.3f} | "
                  f"{fw:.3f} / {fc:.3f} | {cw:.3f} / {cc:.3f}")


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# the save of ``fresh``: the in-process CPU seconds of the call, then the whole process's
_FRESH_SAVE = """
import sys, time
import numpy as np
import inshrink
save = inshrink.save  # (its modules imported here, as import inshrink used to)
state = dict(np.load(sys.argv[1]))
c0 = time.process_time()
save(sys.argv[2], state, policy="balanced")
print(time.process_time() - c0)
"""


def core_dependencies() -> list[str]:
    """pyproject.toml's ``[project] dependencies``, markers included."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]["dependencies"]


def prepare_venv(venv: str, upgrade: bool) -> str:
    """The python of ``venv`` (made when missing) with the newest core dependencies and this
    tree installed."""
    python = os.path.join(venv, "bin", "python")
    made = not os.path.exists(python)
    if made:
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    if made or upgrade:
        subprocess.run([*pip, "--upgrade", *core_dependencies()], check=True)
    # a copy of the tree as measured now, like a user's install (not the editable finder)
    subprocess.run([*pip, "--no-deps", "--force-reinstall", ROOT], check=True,
                   cwd=tempfile.gettempdir())
    return python


def child_cpu(args: list[str], env: dict[str, str], cwd: str) -> tuple[float, str]:
    """The CPU seconds (user + system) of one child process, and its output."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(args, env=env, cwd=cwd, check=True, capture_output=True,
                         text=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), out


def fresh(runs: int, venv: str | None, upgrade: bool) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        python = prepare_venv(venv or os.path.join(scratch, "venv"), upgrade)
        script = os.path.join(os.path.dirname(python), "inshrink")
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "NUMBA_CACHE_DIR", "VIRTUAL_ENV")}
        env["XDG_CACHE_HOME"] = os.path.join(scratch, "xdg")  # (no user's kernel cache)
        versions = subprocess.run(
            [python, "-c", "import importlib.metadata as m, re, sys; print(sys.version.split()[0],"
             " *(f'{n}=={m.version(n)}' for n in sys.argv[1:]))",
             *sorted({d.split(";")[0].split(">")[0].split("=")[0].split("<")[0].strip()
                      for d in core_dependencies()} | {"inshrink"})],
            env=env, cwd=scratch, check=True, capture_output=True, text=True).stdout.split()
        print("python", versions[0], "|", " ".join(versions[1:]))
        source = os.path.join(scratch, "ckpt.npz")
        np.savez(source, **small_model_checkpoint())
        target = os.path.join(scratch, "ckpt.ink")
        child_cpu([python, "-c", "import inshrink.api"], env, scratch)  # bytecode written
        times: dict[str, list[float]] = {}
        for _ in range(runs):
            for name, args in (("python -c pass", [python, "-c", "pass"]),
                               ("import inshrink", [python, "-c", "import inshrink"]),
                               ("inshrink --help", [script, "--help"])):
                times.setdefault(name, []).append(child_cpu(args, env, scratch)[0])
            cache_env = {**env, "NUMBA_CACHE_DIR": tempfile.mkdtemp(dir=scratch)}
            for state in ("empty", "filled"):  # the cache the first save filled
                total, out = child_cpu([python, "-c", _FRESH_SAVE, source, target],
                                       cache_env, scratch)
                times.setdefault(f"first save, cache {state}: save call", []).append(
                    float(out))
                times.setdefault(f"first save, cache {state}: whole process", []).append(
                    total)
        print(f"CPU s, median of {runs} fresh processes (least-most); load "
              f"{os.getloadavg()[0]:.2f}")
        for name, values in times.items():
            print(f"{name:40s} {statistics.median(values):6.3f} "
                  f"({min(values):.3f}-{max(values):.3f})")


def small(count: int, reps: int) -> None:
    import torch  # noqa: F401  a training process's heap

    import inshrink
    tensors = many_small_tensors(count)
    nbytes = sum(t.nbytes for t in tensors.values())
    collector = {"seconds": 0.0, "count": [0, 0, 0], "start": 0.0}

    def on_collect(phase: str, info: dict) -> None:
        if phase == "start":
            collector["start"] = time.perf_counter()
        else:
            collector["seconds"] += time.perf_counter() - collector["start"]
            collector["count"][info["generation"]] += 1

    gc.callbacks.append(on_collect)
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "small.ink")
        for policy in (None, "balanced"):
            inshrink.save(path, tensors, threads=1, policy=policy)  # compile, warm up
            cpu, collected, generations = [], [], [0, 0, 0]
            for _ in range(reps):
                collector["seconds"], collector["count"] = 0.0, [0, 0, 0]
                started = time.process_time()
                inshrink.save(path, tensors, threads=1, policy=policy)
                cpu.append(time.process_time() - started)
                collected.append(collector["seconds"])
                generations = [a + b for a, b in zip(generations, collector["count"])]
            print(json.dumps({
                "tensors": count, "MB": round(nbytes / 1e6, 2), "policy": policy or "lossless",
                "cpu_ms_least": round(1e3 * min(cpu), 1),
                "cpu_ms_mean": round(1e3 * statistics.mean(cpu), 1),
                "gc_ms_mean": round(1e3 * statistics.mean(collected), 1),
                "collections_per_save": [round(g / reps, 2) for g in generations],
                "MB_per_cpu_s": round(nbytes / 1e6 / min(cpu), 1),
                "load": round(os.getloadavg()[0], 2)}))
            # loads of the file just saved: opening its index (2,000 entries) and decoding
            # 2,000 one-chunk tensors, in a process with torch's heap
            inshrink.load(path, threads=1)
            cpu, collected, generations = [], [], [0, 0, 0]
            for _ in range(reps):
                collector["seconds"], collector["count"] = 0.0, [0, 0, 0]
                started = time.process_time()
                inshrink.load(path, threads=1)
                cpu.append(time.process_time() - started)
                collected.append(collector["seconds"])
                generations = [a + b for a, b in zip(generations, collector["count"])]
            print(json.dumps({
                "op": "load", "tensors": count, "policy": policy or "lossless",
                "cpu_ms_least": round(1e3 * min(cpu), 1),
                "cpu_ms_mean": round(1e3 * statistics.mean(cpu), 1),
                "gc_ms_mean": round(1e3 * statistics.mean(collected), 1),
                "collections_per_load": [round(g / reps, 2) for g in generations],
                "load": round(os.getloadavg()[0], 2)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    p_first = sub.add_parser("first", help="first lossy save in a fresh process")
    p_first.add_argument("--runs", type=int, default=5)
    p_small = sub.add_parser("small", help="saves of many small tensors")
    p_small.add_argument("--tensors", type=int, default=2000)
    p_small.add_argument("--reps", type=int, default=10)
    p_fresh = sub.add_parser("fresh", help="start-up and first saves in a fresh virtualenv")
    p_fresh.add_argument("--runs", type=int, default=5)
    p_fresh.add_argument("--venv", help="the virtualenv to use (made when missing)")
    p_fresh.add_argument("--upgrade", action="store_true",
                         help="upgrade the dependencies of an existing --venv")
    args = parser.parse_args()
    if args.mode == "first":
        first(args.runs)
    elif args.mode == "fresh":
        fresh(args.runs, args.venv, args.upgrade)
    else:
        small(args.tensors, args.reps)


if __name__ == "__main__":
    main()
