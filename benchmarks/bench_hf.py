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
(target for lossless: at most 1.5x), and the callback's time per checkpoint as a share of
the training time between checkpoints.

    nice -n 5 python benchmarks/bench_hf.py            # about 3 minutes on 2 cores
    nice -n 5 python benchmarks/bench_hf.py --json results.json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--checkpoints", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--embd", type=int, default=256)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--repeats", type=int, default=7)
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
    for _ in range(args.repeats):  # interleaved: drift in the machine's load hits all alike
        for name, load in loads.items():
            started = time.perf_counter()
            loaded = load()
            times[name].append(time.perf_counter() - started)
            if name == "inshrink":
                ids = torch.arange(32).reshape(1, -1)
                model.eval()
                loaded.eval()
                with torch.no_grad():
                    if not torch.equal(model(ids).logits, loaded(ids).logits):
                        raise SystemExit("inshrink: logits differ from the original's")
    median = {name: statistics.median(t) for name, t in times.items()}
    base = median["safetensors"]
    print(f"\n{'loader':<12} {'bytes':>12} {'ratio':>7} {'load (median)':>14} "
          f"{'vs safetensors':>15}")
    for name in loads:
        print(f"{name:<12} {sizes[name]:>12,} {sizes['safetensors'] / sizes[name]:>7.3f} "
              f"{median[name] * 1000:>11.1f} ms {median[name] / base:>14.2f}x")
    print(f"(median of {args.repeats} loads each; directory bytes include config files; "
          f"inshrink's logits equal the original's)")
    return {"training": training, "bytes": sizes, "load_seconds": times,
            "load_median_seconds": median,
            "load_vs_safetensors": {n: median[n] / base for n in median},
            "torch_threads": torch.get_num_threads()}


if __name__ == "__main__":
    main()
