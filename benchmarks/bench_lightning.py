#!/usr/bin/env python3
"""The size of a Lightning checkpoint: ``torch.save`` (Lightning's ``TorchCheckpointIO``)
against :class:`inshrink.lightning.InkCheckpointIO`, lossless and with a policy.

A byte-level MLP language model (``--context`` bytes embedded in ``--embd`` each, one hidden
layer of ``--hidden``) trains ``--steps`` steps with Adam and a scheduler on the source of
Python's standard library, with the ``Trainer``'s own ``ModelCheckpoint(save_last=True)``;
its ``last.ckpt`` (written by ``torch.save``) is then loaded and stored again by
``InkCheckpointIO()`` and ``InkCheckpointIO(policy=...)`` for each ``--policy``, each save
and load timed (median of ``--repeats``). Printed: size, ratio to torch.save, times, and for
a policy the worst relative L2 error of a quantized weight and of a quantized optimizer
tensor (with how many were quantized). Needs torch and lightning.

    nice -n 5 python benchmarks/bench_lightning.py                # about 1 minute on 2 cores
"""
from __future__ import annotations

import argparse
import glob
import os
import statistics
import sys
import sysconfig
import tempfile
import time
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import lightning as L  # noqa: E402
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from inshrink.lightning import InkCheckpointIO  # noqa: E402


class ByteMLP(L.LightningModule):
    def __init__(self, context: int, embd: int, hidden: int, lr: float, steps: int):
        super().__init__()
        self.save_hyperparameters()
        self.embed = torch.nn.Embedding(256, embd)
        self.hidden = torch.nn.Linear(context * embd, hidden)
        self.norm = torch.nn.LayerNorm(hidden)
        self.head = torch.nn.Linear(hidden, 256)

    def forward(self, x):
        h = torch.relu(self.norm(self.hidden(self.embed(x).flatten(1))))
        return self.head(h)

    def training_step(self, batch, index):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, self.hparams.steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler,
                                                          "interval": "step"}}


def corpus(context: int, count: int) -> TensorDataset:
    """``count`` windows of the standard library's source: ``context`` bytes, the next one."""
    data = b"".join(open(p, "rb").read() for p in
                    sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:200])
    data = np.frombuffer(data, np.uint8)
    starts = np.random.default_rng(0).integers(0, len(data) - context - 1, count)
    windows = np.stack([data[s:s + context + 1] for s in starts]).astype(np.int64)
    return TensorDataset(torch.from_numpy(windows[:, :-1]), torch.from_numpy(windows[:, -1]))


def timed(call, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def _worst(report, prefix: str) -> str:
    """The largest relative L2 error of the quantized tensors named ``prefix...``."""
    errors = [t.error["rel_l2_error"] for t in report
              if not t.lossless and t.name.startswith(prefix)]
    return f"{max(errors):.3f} ({len(errors)})" if errors else "exact"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--context", type=int, default=32)
    parser.add_argument("--embd", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--policy", action="append", default=None,
                        help="lossy presets to measure (default: balanced, compact)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    model = ByteMLP(args.context, args.embd, args.hidden, 3e-3, args.steps)
    params = sum(p.numel() for p in model.parameters())
    loader = DataLoader(corpus(args.context, 64 * args.steps), batch_size=64, shuffle=True)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        trainer = L.Trainer(max_steps=args.steps, accelerator="cpu", logger=False,
                            enable_progress_bar=False, enable_model_summary=False,
                            callbacks=[ModelCheckpoint(dirpath=tmp, save_last=True)])
        trainer.fit(model, loader)
        loss = float(trainer.callback_metrics["loss"])
        print(f"{params / 1e6:.2f} M parameters, {args.steps} steps in "
              f"{time.perf_counter() - start:.0f} s, loss {loss:.2f}")
        source = os.path.join(tmp, "last.ckpt")
        checkpoint = torch.load(source, weights_only=False)  # our own file
        rows = [("torch.save (TorchCheckpointIO)", TorchCheckpointIO(), None)]
        rows.append(("InkCheckpointIO() lossless", InkCheckpointIO(), None))
        for policy in args.policy or ["balanced", "compact"]:
            rows.append((f'InkCheckpointIO(policy="{policy}")', InkCheckpointIO(policy=policy),
                         policy))
        base = None
        print("| writer | size | ratio to torch.save | save | load | worst rel. L2: "
              "weights / optimizer |")
        print("|---|---:|---:|---:|---:|---:|")
        for label, io, policy in rows:
            path = os.path.join(tmp, f"{len(label)}-{policy}.ckpt")
            save_s, _ = timed(lambda: io.save_checkpoint(checkpoint, path), args.repeats)
            load_s, _ = timed(lambda: io.load_checkpoint(path), args.repeats)
            size = os.path.getsize(path)
            base = base or size
            worst = "exact"
            if policy is not None:
                worst = " / ".join(_worst(io.last_report, prefix) for prefix in ("model.",
                                                                                 "optimizer."))
            print(f"| {label} | {size / 1e6:.3f} MB | {base / size:.3f}x | "
                  f"{save_s * 1e3:.0f} ms | {load_s * 1e3:.0f} ms | {worst} |")


if __name__ == "__main__":
    main()
