#!/usr/bin/env python3
"""Train transformers' GPT-2 (bench_hf.py's size: 4 layers x 256, 3.24 M parameters) with
AdamW on the Python standard library's source and write its checkpoint, weights and
optimizer state, as one safetensors file: a real checkpoint of many mid-size tensors (~160,
~39 MB) for ``bench_lossy.py --checkpoint-speed``.

    python benchmarks/train_gpt2.py [--steps 100] [-o benchmarks/data/gpt2_adamw.safetensors]

Tensor names as ``inshrink.torch.state_to_numpy`` gives them (``model.*``,
``optimizer.state.<i>.exp_avg``...), so that inshrink's roles apply. Deterministic for a seed
on one torch thread.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

from train import stdlib_corpus  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-o", "--out", default=os.path.join(HERE, "data", "gpt2_adamw.safetensors"))
    args = p.parse_args()
    from inshrink.torch import state_to_numpy
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    data, _ = stdlib_corpus(8 << 20)
    tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
    model = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=args.context, n_embd=256,
                                       n_layer=4, n_head=4, bos_token_id=0, eos_token_id=0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(args.seed)
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        starts = torch.randint(0, len(tokens) - args.context - 1, (args.batch,), generator=gen)
        x = torch.stack([tokens[s:s + args.context] for s in starts.tolist()])
        loss = model(input_ids=x, labels=x).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 25 == 0 or step == args.steps:
            print(f"step {step:4d}  loss {loss.item():.4f}  "
                  f"{time.perf_counter() - started:.1f} s", flush=True)
    arrays, _ = state_to_numpy(model, optimizer)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    # tied weights share memory: safetensors wants each tensor once, contiguous
    save_file({name: a.copy() for name, a in arrays.items()}, args.out)
    print(f"wrote {args.out}: {len(arrays)} tensors, "
          f"{sum(a.nbytes for a in arrays.values()) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
