#!/usr/bin/env python3
"""A small Hugging Face model end to end: train, save, load, and the Trainer callback's cost.

A GPT-2 built from a config (byte-level, ``--layers`` x ``--embd``; nothing downloaded) trains
``--steps`` steps on the CPU with the ``transformers.Trainer`` on the source of Python's
standard library (as ``train.py`` does), with :class:`inshrink.transformers.Callback` storing
each of ``--checkpoints`` Trainer checkpoints in a lossless series. Then the trained model is
saved with ``save_pretrained`` and loaded back ``--repeats`` times each, interleaved:

* ``safetensors``: ``AutoModelForCausalLM.from_pretrained`` of the uncompressed directory;
* ``inshrink``: :func:`inshrink.transformers.from_pretrained` of the compressed directory
  (:func:`inshrink.transformers.save_pretrained`, lossless), whose logits must equal the
  original's;
* ``zipnn``: ZipNN's Hugging Face hook (``zipnn_hf()``) on ``model.safetensors.znn``, if
  zipnn is installed and its hook works with this transformers version; otherwise a printed
  note says why, and the row is left out.

Printed: sizes and ratios, the median load times and their ratio to the uncompressed load
(target for lossless: at most 1.2x), the load's CPU time (all threads) and its ratio, the
peak memory of a load of ``safetensors`` and of ``inshrink``, each in ``--memory-runs`` fresh
processes (``ru_maxrss`` after the load, and its growth over the same after the imports),
and the callback's time per checkpoint as a share of the training time between checkpoints.

    nice -n 5 python benchmarks/bench_hf.py            # about 3 minutes on 2 cores
    nice -n 5 python benchmarks/bench_hf.py --json results.json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

from common import import_inshrink, tmp_root  # noqa: E402
from train import stdlib_corpus  # noqa: E402

inshrink, why = import_inshrink()
if inshrink is None:
    sys.exit(f"inshrink is not importable: {why}")
import inshrink.transformers as ink
from transformers import (AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, Trainer,  # noqa: E402
                          TrainingArguments)
from transformers.utils import logging as hf_logging  # noqa: E402

hf_logging.disable_progress_bar()


class Windows(torch.utils.data.Dataset):
    """Random ``length``-byte windows of ``data`` (fixed by ``seed``)."""

    def __init__(self, data: bytes, length: int, count: int, seed: int) -> None:
        self.tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
        gen = torch.Generator().manual_seed(seed)
        self.starts = torch.randint(0, len(self.tokens) - length - 1, (count,), generator=gen)
        self.length = length

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> dict:
        x = self.tokens[self.starts[i]:self.starts[i] + self.length]
        return {"input_ids": x, "labels": x}


class TimedCallback(ink.Callback):
    """The callback, with the time each ``on_save`` takes and when it ends."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.spent: list[float] = []
        self.ended: list[float] = []

    def on_train_begin(self, args, state, control, **kwargs):
        self.begin = time.perf_counter()

    def on_save(self, args, state, control, **kwargs):
        started = time.perf_counter()
        super().on_save(args, state, control, **kwargs)
        self.ended.append(time.perf_counter())
        self.spent.append(self.ended[-1] - started)


def train(workdir: str, args) -> tuple[GPT2LMHeadModel, dict]:
    data, _ = stdlib_corpus(8 << 20)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=256, n_positions=args.context, n_embd=args.embd,
                        n_layer=args.layers, n_head=max(1, args.embd // 64),
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    every = max(1, args.steps // args.checkpoints)
    training = TrainingArguments(
        os.path.join(workdir, "out"), max_steps=args.steps, per_device_train_batch_size=args.batch,
        learning_rate=1e-3, warmup_steps=args.steps // 10, save_strategy="steps",
        save_steps=every, report_to=[], use_cpu=True, logging_strategy="no",
        disable_tqdm=True, seed=0, dataloader_num_workers=0)
    callback = TimedCallback(os.path.join(workdir, "series"), remove_checkpoint=True)
    trainer = Trainer(model, training, train_dataset=Windows(data, args.context,
                                                             args.steps * args.batch, 0),
                      callbacks=[callback])
    started = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - started
    # training time between checkpoints: from the end of one save to the start of the next
    # (the first interval from the start of training), the callback's own time left out
    ends = [callback.begin] + callback.ended[:-1]
    gaps = [end - spent - start for start, end, spent in
            zip(ends, callback.ended, callback.spent)]
    series_bytes = sum(e.bytes for e in callback.series.checkpoints())
    return model, {
        "params": sum(p.numel() for p in model.parameters()),
        "steps": args.steps, "checkpoints": len(callback.spent), "train_seconds": total,
        "callback_seconds": callback.spent, "between_seconds": gaps,
        "callback_share": statistics.median(s / g for s, g in zip(callback.spent, gaps)),
        "series_bytes": series_bytes, "unverified": list(callback.unverified)}


def dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(root, n))
               for root, _, names in os.walk(path) for n in names)


def zipnn_directory(plain: str, out: str) -> str | None:
    """``plain`` with model.safetensors as ZipNN's model.safetensors.znn; None if zipnn is
    missing (the reason is printed)."""
    try:
        from zipnn import ZipNN
    except ImportError as exc:
        print(f"note: zipnn skipped ({exc}); pip install zipnn to compare")
        return None
    shutil.copytree(plain, out)
    source = os.path.join(out, "model.safetensors")
    with open(source, "rb") as f:
        data = f.read()
    compressed = ZipNN(is_streaming=True, bytearray_dtype="float32").compress(data)
    with open(source + ".znn", "wb") as f:
        f.write(compressed)
    os.unlink(source)
    return out


def zipnn_via_directory(zipped: str):
    """Load ZipNN's directory without its hook: decompress model.safetensors.znn into a
    temporary copy of the directory, load that, remove it."""
    from zipnn import ZipNN
    work = tempfile.mkdtemp(prefix="zipnn-", dir=tmp_root())
    try:
        for name in os.listdir(zipped):
            source = os.path.join(zipped, name)
            if name.endswith(".znn"):
                with open(source, "rb") as f:
                    data = ZipNN(is_streaming=True).decompress(f.read())
                with open(os.path.join(work, name[:-4]), "wb") as f:
                    f.write(data)
            else:
                shutil.copy(source, work)
        return AutoModelForCausalLM.from_pretrained(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# one load in a fresh process: its RSS before the load and the peak RSS (VmHWM) after it,
# in KiB. Not ru_maxrss: Linux carries that over from the parent through fork and exec,
# so the benchmark's own size would hide the child's. With a warm-up directory (argv[4]),
# a tiny model of the same kind is loaded the same way first, so that the modules imported
# on first use, numba and inshrink's kernels are in the RSS before the load; then the peak
# is reset (clear_refs) to measure what the load itself adds at its highest. The peak is
# printed again after a forward pass: transformers maps a safetensors file and leaves the
# weights in the page cache until they are read
PEAK_RSS = """
import sys
import torch
from transformers import AutoModelForCausalLM
import inshrink.transformers as ink
torch.set_num_threads(int(sys.argv[3]))
def status(field):
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith(field)).split()[1])
def load(directory):
    if sys.argv[1] == "safetensors":
        return AutoModelForCausalLM.from_pretrained(directory)
    return ink.from_pretrained(AutoModelForCausalLM, directory)
if sys.argv[4]:
    load(sys.argv[4])
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
before = status("VmRSS:")
model = load(sys.argv[2])
loaded = status("VmHWM:")
with torch.no_grad():  # every weight read once: a mapped file's pages are then resident too
    model(torch.arange(32).reshape(1, -1))
print(before, loaded, status("VmHWM:"))
"""


def peak_rss(loader: str, directory: str, warmup: str, runs: int) -> dict:
    """Median peak RSS (bytes) of ``runs`` fresh processes that each load ``directory``:
    cold (the first load of the process) and after a warm-up load of the tiny model
    ``warmup``, with the growth of the peak over the RSS before the load (see
    ``PEAK_RSS``)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(inshrink.__file__))]
        + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    result = {}
    for mode, first in (("cold", ""), ("warm", warmup)):
        peaks, grown, used = [], [], []
        for _ in range(runs):
            out = subprocess.run([sys.executable, "-c", PEAK_RSS, loader, directory,
                                  str(torch.get_num_threads()), first], env=env, check=True,
                                 cwd=tmp_root(), capture_output=True, text=True).stdout.split()
            before, after, forward = (int(n) << 10 for n in out[-3:])
            peaks.append(after)
            grown.append(after - before)
            used.append(forward - before)
        result[mode] = {"peak_bytes": statistics.median(peaks),
                        "load_bytes": statistics.median(grown),
                        "with_forward_bytes": statistics.median(used)}
    return result


def tiny_model(workdir: str) -> tuple[str, str]:
    """A tiny GPT-2 of the benchmark's kind, as a safetensors and a compressed directory
    (the warm-up of :func:`peak_rss`)."""
    torch.manual_seed(1)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=16, n_embd=64, n_layer=1,
                                       n_head=1, bos_token_id=0, eos_token_id=0))
    plain, compressed = os.path.join(workdir, "tiny"), os.path.join(workdir, "tiny-ink")
    model.save_pretrained(plain)
    ink.save_pretrained(model, compressed)
    return plain, compressed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--checkpoints", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--embd", type=int, default=256)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--memory-runs", type=int, default=3,
                   help="fresh processes per loader for the peak memory (0: not measured)")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    torch.set_num_threads(min(4, len(os.sched_getaffinity(0))))
    workdir = tempfile.mkdtemp(prefix="bench-hf-", dir=tmp_root())
    try:
        results = run(workdir, args)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def run(workdir: str, args) -> dict:
    model, training = train(workdir, args)
    print(f"trained {training['params']:,} parameters for {training['steps']} steps in "
          f"{training['train_seconds']:.1f} s; {training['checkpoints']} checkpoints in a "
          f"lossless series of {training['series_bytes']:,} bytes")
    spent, gaps = training["callback_seconds"], training["between_seconds"]
    print(f"callback per checkpoint: median {statistics.median(spent):.2f} s "
          f"(store + verify + remove), training between checkpoints: median "
          f"{statistics.median(gaps):.2f} s -> {training['callback_share']:.1%} added"
          + (f"; UNVERIFIED steps {training['unverified']}" if training["unverified"] else ""))

    plain = os.path.join(workdir, "plain")
    model.save_pretrained(plain)
    compressed = os.path.join(workdir, "ink")
    ink.save_pretrained(model, compressed)
    zipped = zipnn_directory(plain, os.path.join(workdir, "zipnn"))
    sizes = {"safetensors": dir_bytes(plain), "inshrink": dir_bytes(compressed)}

    loads = {"safetensors": lambda: AutoModelForCausalLM.from_pretrained(plain),
             "inshrink": lambda: ink.from_pretrained(AutoModelForCausalLM, compressed)}
    if zipped is not None:
        try:
            import contextlib
            import io

            from zipnn import zipnn_hf
            zipnn_hf()
            with contextlib.redirect_stdout(io.StringIO()):  # it prints per file
                check = AutoModelForCausalLM.from_pretrained(zipped)
            if not all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                         check.state_dict().values())):
                raise RuntimeError("the loaded weights differ from the saved ones")
        except Exception as exc:  # a third-party hook: whatever it raises, report and go on
            print(f"note: ZipNN's Hugging Face hook fails with this transformers version "
                  f"({type(exc).__name__}: {str(exc)[:120]}); the zipnn row is instead "
                  f"its decompression into a temporary directory + from_pretrained, as "
                  f"inshrink loads")
            sizes["zipnn"] = dir_bytes(zipped)
            loads["zipnn"] = lambda: zipnn_via_directory(zipped)
        else:
            sizes["zipnn"] = dir_bytes(zipped)

            def quiet_zipnn():
                with contextlib.redirect_stdout(io.StringIO()):
                    return AutoModelForCausalLM.from_pretrained(zipped)
            loads["zipnn"] = quiet_zipnn

    times = {name: [] for name in loads}
    cpu = {name: [] for name in loads}
    for _ in range(args.repeats):  # interleaved: drift in the machine's load hits all alike
        for name, load in loads.items():
            started, cpu_started = time.perf_counter(), time.process_time()
            loaded = load()
            times[name].append(time.perf_counter() - started)
            cpu[name].append(time.process_time() - cpu_started)
            if name == "inshrink":
                ids = torch.arange(32).reshape(1, -1)
                model.eval()
                loaded.eval()
                with torch.no_grad():
                    if not torch.equal(model(ids).logits, loaded(ids).logits):
                        raise SystemExit("inshrink: logits differ from the original's")
    median = {name: statistics.median(t) for name, t in times.items()}
    cpu_median = {name: statistics.median(t) for name, t in cpu.items()}
    base, cpu_base = median["safetensors"], cpu_median["safetensors"]
    print(f"\n{'loader':<12} {'bytes':>12} {'ratio':>7} {'load (median)':>14} "
          f"{'vs safetensors':>15} {'CPU (median)':>13} {'vs safetensors':>15}")
    for name in loads:
        print(f"{name:<12} {sizes[name]:>12,} {sizes['safetensors'] / sizes[name]:>7.3f} "
              f"{median[name] * 1000:>11.1f} ms {median[name] / base:>14.2f}x "
              f"{cpu_median[name] * 1000:>10.1f} ms {cpu_median[name] / cpu_base:>14.2f}x")
    print(f"(median of {args.repeats} loads each; directory bytes include config files; "
          f"inshrink's logits equal the original's)")
    memory = {}
    if args.memory_runs > 0:
        tiny_plain, tiny_ink = tiny_model(workdir)
        memory = {"safetensors": peak_rss("safetensors", plain, tiny_plain, args.memory_runs),
                  "inshrink": peak_rss("inshrink", compressed, tiny_ink, args.memory_runs)}
        weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        largest = max(t.numel() * t.element_size() for t in model.state_dict().values())
        print(f"\npeak RSS of one load in a fresh process, median of {args.memory_runs} "
              f"(+ growth during the load / + growth to the end of a forward pass; weights "
              f"{weights / 2**20:.1f} MiB, largest tensor {largest / 2**20:.2f} MiB): cold = "
              f"the process's first load, warm = after a tiny model's load (imports and "
              f"kernels done)")
        for name, m in memory.items():
            print(f"{name:<12} " + ", ".join(
                f"{mode} {m[mode]['peak_bytes'] / 2**20:.1f} MiB "
                f"(+{m[mode]['load_bytes'] / 2**20:.1f} / "
                f"+{m[mode]['with_forward_bytes'] / 2**20:.1f})" for mode in ("cold", "warm")))
    return {"training": training, "bytes": sizes, "load_seconds": times,
            "load_median_seconds": median,
            "load_vs_safetensors": {n: median[n] / base for n in median},
            "load_cpu_seconds": cpu, "load_cpu_vs_safetensors":
                {n: cpu_median[n] / cpu_base for n in cpu_median},
            "peak_rss": memory, "torch_threads": torch.get_num_threads()}


if __name__ == "__main__":
    main()
