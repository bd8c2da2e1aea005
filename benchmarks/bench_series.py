"""Checkpoint series benchmark: delta files against standalone files, on a real training run.

    python benchmarks/bench_series.py [--dir benchmarks/data/series20] [--policy balanced]
                                      [--moment-bins N] [--keyframe-every 10] [--json out.json]
    python benchmarks/bench_series.py --dir DIR --before REV [--big-mib N] [--repeats 3]

Reads every ``ckpt_<step>.safetensors`` of ``--dir`` (written by ``train.py --save-every``) and
reports, in one run:

1. lossy series (``--policy``): each checkpoint's file size against the same checkpoint saved
   standalone with the same policy, per tensor role for the last one;
   (the newest checkpoint stays whole; older ones become deltas against the next);
2. the paper's ablation on the quantized weights of consecutive checkpoints in the second half
   of training: codes alone / cyclic delta / delta + run lengths / delta + regrouping by the
   previous code (the format's choice), each packed like the codec does and zstd-coded;
3. lossless: XOR against wrapping subtraction on the weights, and a lossless series: each delta
   file against the standalone lossless file;
4. restore time of the newest and the oldest checkpoint against loading a standalone file.

``--before REV`` instead times series saves (lossy with ``--policy``, and lossless) of git
revision ``REV``'s inshrink against the same tree with this checkout's series modules
(:data:`SERIES_MODULES`), each in its own subprocess, taking turns on every repeat: CPU seconds
of the saves that write a delta, the series' bytes (and whether every file is the same), and
each save's peak RSS above the process's RSS before it plus what the series kept in memory
from the save before (so: above the caller's own memory). ``--big-mib N`` adds to every
checkpoint an fp32 tensor of N MiB tiled from its 2-D weights (as ``train.py --big-mb``), to
measure memory against the largest tensor.
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

import numpy as np
import zstandard
from safetensors.numpy import load_file

import common

inshrink, _err = common.import_inshrink(("Series", "save", "load"))
if inshrink is None:
    raise SystemExit(f"inshrink is not importable: {_err}")
from inshrink.codecs import quant  # noqa: E402
from inshrink.kernels import delta as kernels  # noqa: E402


def checkpoints(directory: str) -> list[tuple[int, str]]:
    found = []
    for path in glob.glob(os.path.join(directory, "ckpt_*.safetensors")):
        m = re.search(r"ckpt_(\d+)\.safetensors$", path)
        if m:
            found.append((int(m.group(1)), path))
    return sorted(found)


def lossy_series(ckpts, policy, keyframe_every, tmp):
    """Save every checkpoint; compare each final file (after later saves turned it into a
    delta) with the same checkpoint saved alone; roles of the newest delta file."""
    series = inshrink.Series(os.path.join(tmp, "lossy"), policy=policy,
                             keyframe_every=keyframe_every, threads=1)
    alone_sizes, alone_infos, save_s = {}, {}, {}
    for step, path in ckpts:
        state = load_file(path)
        t0 = time.perf_counter()
        series.save(step, state)
        save_s[step] = time.perf_counter() - t0
        alone_path = os.path.join(tmp, "alone.ink")
        alone_infos[step] = inshrink.save(alone_path, state, policy=policy, threads=1)
        alone_sizes[step] = os.path.getsize(alone_path)
    rows = [dict(step=e.step, keyframe=e.keyframe, delta_bytes=e.bytes,
                 standalone_bytes=alone_sizes[e.step], save_s=save_s[e.step])
            for e in series.checkpoints()]
    newest_delta = [e for e in series.checkpoints() if not e.keyframe][-1]
    with inshrink.open(os.path.join(series.directory, newest_delta.file)) as f:
        mine = {i.name: i for i in f.infos()}
    roles = defaultdict(lambda: [0, 0, 0])
    for info in alone_infos[newest_delta.step]:
        r = roles[info.role or "-"]
        r[0] += info.nbytes
        r[1] += info.stored_bytes
        r[2] += mine[info.name].stored_bytes
    return series, rows, dict(roles)


def weight_codes(state, policy):
    """Codes and code count of the quantized weights of one checkpoint (standalone plans)."""
    with tempfile.TemporaryDirectory() as tmp, \
            inshrink.Writer(os.path.join(tmp, "x.ink"), policy=policy, threads=1,
                            keep_codes=True) as w:
        for name, arr in state.items():
            w.add(name, arr)
        w.close()
        return {k: v for k, v in w.codes.items() if k.startswith("model.")}


def zsize(data: np.ndarray) -> int:
    return len(zstandard.ZstdCompressor(level=3).compress(np.ascontiguousarray(data)))


def packed(values: np.ndarray, levels: int) -> np.ndarray:
    return quant.pack_codes(values.astype(np.uint16), quant.packing_bits(levels))


def ablation(ckpts, policy):
    """Sizes of the weights' codes stream of each later checkpoint under four encodings."""
    second_half = ckpts[len(ckpts) // 2 - 1:]
    totals = defaultdict(int)
    previous = None
    for _, path in second_half:
        codes = weight_codes(load_file(path), policy)
        if previous is not None:
            for name, cur in codes.items():
                prev = previous.get(name)
                if prev is None or prev.shape != cur.shape or cur.size == 0:
                    continue
                modulus = int(max(prev.max(), cur.max())) + 1
                totals["codes alone"] += zsize(packed(cur, modulus))
                d = np.empty_like(cur)
                kernels.cyclic_delta(prev, cur, modulus, d)
                totals["delta"] += zsize(packed(d, modulus))
                starts = np.concatenate(([0], np.flatnonzero(np.diff(d)) + 1))
                run_lengths = np.diff(np.append(starts, d.size)).astype(np.uint32)
                totals["delta + run lengths"] += (zsize(packed(d[starts], modulus))
                                                  + zsize(run_lengths))
                counts = np.zeros(modulus, np.int64)
                kernels.group_counts(prev, modulus, counts)
                g = np.empty_like(d)
                kernels.regroup(prev, d, counts, g)
                totals["delta + regrouping"] += zsize(packed(g, modulus))
        previous = codes
    return dict(totals)


def lossless_ablation(ckpts):
    """Byte-grouped zstd size of the fp32 weights of the last checkpoint: alone, XORed with
    the previous checkpoint's, and as a wrapping uint32 difference (why the format uses XOR)."""
    from inshrink.codecs import lossless
    from inshrink.dtypes import by_name
    stage = lossless.plan(by_name("F32"))
    prev, cur = load_file(ckpts[-2][1]), load_file(ckpts[-1][1])
    totals = defaultdict(int)
    for name, a in cur.items():
        b = prev.get(name)
        if not name.startswith("model.") or a.dtype != np.float32 or b is None \
                or b.shape != a.shape:
            continue
        x, y = a.reshape(-1).view(np.uint32), b.reshape(-1).view(np.uint32)
        xor, sub = x ^ y, x - y  # uint32: the difference wraps
        for label, words in (("standalone", x), ("xor", xor), ("subtract", sub)):
            planes = lossless.encode_chunk(np.ascontiguousarray(words).view(np.uint8), stage, 3)
            totals[label] += sum(len(memoryview(p)) for _, p in planes)
    return dict(totals)


def lossless_series(ckpts, keyframe_every, tmp):
    series = inshrink.Series(os.path.join(tmp, "lossless"), keyframe_every=keyframe_every,
                             threads=1)
    alone = {}
    for step, path in ckpts:
        state = load_file(path)
        series.save(step, state)
        alone_path = os.path.join(tmp, "alone.ink")
        inshrink.save(alone_path, state, threads=1)
        alone[step] = os.path.getsize(alone_path)
    return [dict(step=e.step, keyframe=e.keyframe, delta_bytes=e.bytes,
                 standalone_bytes=alone[e.step]) for e in series.checkpoints()]


def restore_times(series, ckpts, policy, tmp, reps=3):
    """Restore the newest and the oldest step against loading one standalone file."""
    first_step, last_step = ckpts[0][0], ckpts[-1][0]
    alone_path = os.path.join(tmp, "alone_last.ink")
    inshrink.save(alone_path, load_file(ckpts[-1][1]), policy=policy, threads=1)
    best = {"newest": 1e9, "oldest": 1e9, "standalone": 1e9}
    for _ in range(reps):
        for key, step in (("newest", last_step), ("oldest", first_step)):
            t0 = time.perf_counter()
            series.load(step)
            best[key] = min(best[key], time.perf_counter() - t0)
        t0 = time.perf_counter()
        inshrink.load(alone_path, threads=1)
        best["standalone"] = min(best["standalone"], time.perf_counter() - t0)
    best["newest_chain"] = len(series.chain(last_step))
    best["oldest_chain"] = len(series.chain(first_step))
    return best


SERIES_MODULES = ("inshrink/series.py", "inshrink/rebase.py", "inshrink/codecs/delta.py")

# runs in a revision's tree: a warm-up series, then every checkpoint saved into a new series
SAVE_WORKER = r"""
import hashlib, json, os, sys, time
import numpy as np
import inshrink
from safetensors.numpy import load_file
paths, work, policy, big_mib, keyframe_every = json.loads(sys.argv[1])

def status(key):
    try:
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) / 1024 for l in f if l.startswith(key + ":"))
    except (OSError, StopIteration):
        return None

def state(path):
    tensors = load_file(path)
    if big_mib:
        pool = np.concatenate([v.reshape(-1) for k, v in tensors.items()
                               if k.startswith("model.") and v.ndim == 2])
        tensors["big.fp32"] = np.resize(pool, big_mib * 2**18).reshape(-1, 4096)
    return tensors

warm = inshrink.Series(os.path.join(work, "warm"), policy=policy, threads=1)
for step, path in enumerate(paths[:2]):
    warm.save(step, state(path))
del warm
series = inshrink.Series(os.path.join(work, "s"), policy=policy, threads=1,
                         keyframe_every=keyframe_every)
cpu = wall = 0.0
peak = 0.0
for step, path in enumerate(paths):
    tensors = state(path)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the high-water mark starts again from the current RSS
    except OSError:
        pass
    # what the series keeps in memory between saves (the same attributes in older revisions)
    kept = sum(a.nbytes for d in (series._previous or {}, series._previous_codes or {})
               for a in d.values()) / 2**20
    before = status("VmRSS")
    c, w = time.process_time(), time.perf_counter()
    series.save(step, tensors)
    if step:  # the first save writes no delta
        cpu += time.process_time() - c
        wall += time.perf_counter() - w
    if before is not None:
        peak = max(peak, status("VmHWM") - before + kept)
    del tensors
# a restarted writer: what the delta refers to is not in memory (the same state again)
resumed = inshrink.Series(series.directory, policy=policy, threads=1,
                          keyframe_every=keyframe_every)
tensors = state(paths[-1])
c = time.process_time()
resumed.save(len(paths), tensors)
resumed_cpu = time.process_time() - c
del tensors
digest = hashlib.sha256()
total = 0
for e in resumed.checkpoints():
    with open(os.path.join(resumed.directory, e.file), "rb") as f:
        data = f.read()
    digest.update(data)
    total += len(data)
largest = max(v.nbytes for v in state(paths[0]).values()) / 2**20
print(json.dumps(dict(cpu=cpu, wall=wall, resumed_cpu=resumed_cpu, bytes=total,
                      sha256=digest.hexdigest(), peak_mib=peak, largest_mib=largest)))
"""


def export_trees(before: str, tmp: str) -> tuple[str, str, str]:
    """``before``'s tree and the same with this checkout's series modules; its short id."""
    commit = subprocess.run(["git", "-C", common.REPO_ROOT, "rev-parse", "--short", before],
                            check=True, capture_output=True, text=True).stdout.strip()
    archive = subprocess.run(["git", "-C", common.REPO_ROOT, "archive", commit, "inshrink"],
                             check=True, capture_output=True).stdout
    trees = []
    for key in ("before", "after"):
        tree = os.path.join(tmp, key, "src")
        os.makedirs(tree)
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
        trees.append(tree)
    for module in SERIES_MODULES:
        shutil.copyfile(os.path.join(common.REPO_ROOT, module), os.path.join(trees[1], module))
    return trees[0], trees[1], commit


def compare_saves(ckpts, before: str, policy: str, keyframe_every: int, big_mib: int,
                  repeats: int) -> dict:
    """Series saves of ``before`` against this checkout's series modules, taking turns."""
    tmp = tempfile.mkdtemp(dir=common.tmp_root())
    try:
        trees = dict(zip(("before", "after"), export_trees(before, tmp)[:2]))
        best: dict = {}
        for repeat in range(repeats):
            for key in ("before", "after") if repeat % 2 == 0 else ("after", "before"):
                for mode in (policy, "lossless"):
                    work = os.path.join(tmp, key, f"work_{mode}")
                    shutil.rmtree(work, ignore_errors=True)
                    os.makedirs(work)
                    env = dict(os.environ, PYTHONPATH=trees[key], OMP_NUM_THREADS="1",
                               XDG_CACHE_HOME=os.path.join(tmp, key, "cache"))
                    env.pop("NUMBA_CACHE_DIR", None)
                    arg = json.dumps([[p for _, p in ckpts], work,
                                      None if mode == "lossless" else mode, big_mib,
                                      keyframe_every])
                    proc = subprocess.run([sys.executable, "-c", SAVE_WORKER, arg], env=env,
                                          cwd=work, capture_output=True, text=True,
                                          check=False)
                    if proc.returncode:
                        raise SystemExit(f"{key}: the worker failed:\n{proc.stderr}")
                    r = json.loads(proc.stdout.strip().splitlines()[-1])
                    old = best.get((key, mode))
                    if old is not None:
                        for k in ("cpu", "wall", "resumed_cpu"):
                            r[k] = min(r[k], old[k])
                        r["peak_mib"] = max(r["peak_mib"], old["peak_mib"])
                    best[key, mode] = r
        return best
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def print_comparison(best: dict, before: str, policy: str, n: int, repeats: int) -> None:
    print(f"## Series saves: {before} against this checkout's series modules\n")
    print(f"{n} checkpoints, {n - 1} saves that write a delta (total); best CPU seconds of {repeats} "
          f"runs taking turns, one thread; peak MiB: the largest rise of RSS during a save "
          f"plus what the series kept in memory since the save before, worst of the runs\n")
    print("| series | before cpu s | after cpu s | after / before | first save after a "
          "restart, before / after cpu s | before bytes | after bytes | same files | "
          "largest tensor MiB | before peak MiB | after peak MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    for mode in (policy, "lossless"):
        a, b = best["before", mode], best["after", mode]
        print(f"| {mode} | {a['cpu']:.2f} | {b['cpu']:.2f} | {b['cpu'] / a['cpu']:.2f} | "
              f"{a['resumed_cpu']:.2f} / {b['resumed_cpu']:.2f} | "
              f"{a['bytes']:,} | {b['bytes']:,} | {'yes' if a['sha256'] == b['sha256'] else 'NO'} "
              f"| {a['largest_mib']:.0f} | {a['peak_mib']:.0f} | {b['peak_mib']:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=os.path.join(common.REPO_ROOT, "benchmarks", "data",
                                                  "series20"))
    ap.add_argument("--policy", default="balanced")
    ap.add_argument("--moment-bins", type=int,
                    help="the preset with Adam's exp_avg and exp_avg_sq at this many levels")
    ap.add_argument("--keyframe-every", type=int, default=10)
    ap.add_argument("--json")
    ap.add_argument("--before", help="time series saves of this git revision against this "
                                     "checkout's series modules (nothing else runs)")
    ap.add_argument("--big-mib", type=int, default=0,
                    help="with --before: add an fp32 tensor of this many MiB to each checkpoint")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.before:
        ckpts = checkpoints(args.dir)
        if len(ckpts) < 3:
            raise SystemExit(f"need at least 3 checkpoints in {args.dir}")
        best = compare_saves(ckpts, args.before, args.policy, args.keyframe_every,
                             args.big_mib, args.repeats)
        print_comparison(best, args.before, args.policy, len(ckpts), args.repeats)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({f"{k} {m}": v for (k, m), v in best.items()}, f, indent=1)
        return
    policy = args.policy
    if args.moment_bins:
        roles = dict(inshrink.encode.policy.resolve(policy).roles)
        for role in ("exp_avg", "exp_avg_sq"):
            roles[role] = dataclasses.replace(roles[role], bins=args.moment_bins)
        policy = inshrink.Policy(roles)
        args.policy = f"{args.policy}, moments at {args.moment_bins} levels"
    ckpts = checkpoints(args.dir)
    if len(ckpts) < 4:
        raise SystemExit(f"need at least 4 checkpoints in {args.dir} (train.py --save-every)")
    tmp = tempfile.mkdtemp(dir=common.tmp_root())
    try:
        series, rows, roles = lossy_series(ckpts, policy, args.keyframe_every, tmp)
        print(f"## Lossy series, policy {args.policy!r}, keyframe every {args.keyframe_every}\n")
        print("| step | kind | file bytes | standalone bytes | standalone / file |")
        print("|---:|---|---:|---:|---:|")
        for r in rows:
            print(f"| {r['step']} | {'keyframe' if r['keyframe'] else 'delta'} | "
                  f"{r['delta_bytes']:,} | {r['standalone_bytes']:,} | "
                  f"{r['standalone_bytes'] / r['delta_bytes']:.2f} |")
        half = [r for r in rows[len(rows) // 2:] if not r["keyframe"]]
        gain = (sum(r["standalone_bytes"] for r in half) / sum(r["delta_bytes"] for r in half)
                if half else float("nan"))
        print(f"\nsecond half, delta files only: standalone / delta = {gain:.2f}\n")
        print("newest delta file by role:\n\n| role | raw bytes | standalone | in series | gain |")
        print("|---|---:|---:|---:|---:|")
        for role, (raw, alone, mine) in sorted(roles.items()):
            print(f"| {role} | {raw:,} | {alone:,} | {mine:,} | {alone / mine:.2f} |")
        abl = ablation(ckpts, policy)
        print("\n## Ablation: quantized weights' codes, consecutive checkpoints, second half\n")
        print("| encoding | bytes | vs codes alone |\n|---|---:|---:|")
        for k, v in abl.items():
            print(f"| {k} | {v:,} | {abl['codes alone'] / v:.2f} |")
        labl = lossless_ablation(ckpts)
        print("\n## Lossless delta of the fp32 weights, last two checkpoints\n")
        print("| encoding | bytes | vs standalone |\n|---|---:|---:|")
        for k, v in labl.items():
            print(f"| {k} | {v:,} | {labl['standalone'] / v:.3f} |")
        lrows = lossless_series(ckpts, args.keyframe_every, tmp)
        deltas = [r for r in lrows if not r["keyframe"]]
        worst = max(r["delta_bytes"] / r["standalone_bytes"] for r in deltas)
        lgain = sum(r["standalone_bytes"] for r in deltas) / sum(r["delta_bytes"] for r in deltas)
        print(f"\n## Lossless series\n\ndelta files: standalone / delta = {lgain:.3f} overall; "
              f"largest delta / standalone = {worst:.4f} (must be <= 1)")
        times = restore_times(series, ckpts, policy, tmp)
        print("\n## Restore (best of 3)\n\n| step | files read | seconds | / standalone |")
        print("|---|---:|---:|---:|")
        for key in ("newest", "oldest"):
            print(f"| {key} | {times[key + '_chain']} | {times[key]:.3f} | "
                  f"{times[key] / times['standalone']:.2f} |")
        print(f"| standalone file | 1 | {times['standalone']:.3f} | 1.00 |")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(lossy=rows, roles=roles, second_half_gain=gain, ablation=abl,
                               lossless_ablation=labl,
                               lossless=lrows, lossless_gain=lgain, restore=times), f,
                          indent=1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
