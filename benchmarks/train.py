#!/usr/bin/env python3
"""Train a small byte-level transformer LM on CPU and dump real checkpoints.

The training text is the concatenated source of Python's standard library
(every ``*.py`` file below the directory that holds the ``os`` module,
``site-packages`` excluded), so no download is needed.  The checkpoints are
written as safetensors files and serve as realistic inputs for the
compression benchmarks in this directory.

Outputs (in ``--out``, default ``benchmarks/data/``):

* ``ckpt_<step>.safetensors``        every ``--save-every`` steps: weights
  (``model.<param>``) + AdamW state (``optimizer.state.<idx>.exp_avg``,
  ``.exp_avg_sq``, ``.step``), all fp32.
* ``final_fp32.safetensors``         last step, weights + optimizer state, fp32.
* ``final_weights_fp32.safetensors`` last step, weights only, fp32.
* ``final_bf16.safetensors``         last step, weights only, bfloat16.
* ``big.safetensors`` (``--big-mb N``) about N MB of large tensors filled by
  tiling the trained weights, alternating fp32 and bf16.
* ``loss.json``                      the loss curve.

Every file carries ``__metadata__`` (str -> str): step, model config (JSON),
seed, data description, ...
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import platform
import random
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))


# --------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------

def stdlib_corpus(max_bytes: int | None) -> tuple[bytes, dict]:
    root = os.path.dirname(os.path.abspath(os.__file__))
    files = sorted(
        f for f in glob.glob(os.path.join(root, "**", "*.py"), recursive=True)
        if "site-packages" not in os.path.relpath(f, root).split(os.sep)
    )
    chunks = []
    total = 0
    for f in files:
        try:
            with open(f, "rb") as fh:
                b = fh.read()
        except OSError:
            continue
        chunks.append(b)
        total += len(b)
        if max_bytes is not None and total >= max_bytes:
            break
    data = b"\n".join(chunks)
    if max_bytes is not None:
        data = data[:max_bytes]
    info = {
        "source": "python stdlib *.py under " + root,
        "python": platform.python_version(),
        "files": str(len(chunks)),
        "bytes": str(len(data)),
    }
    return data, info


# --------------------------------------------------------------------------
# model
# --------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int, mlp_mult: int, dropout: float):
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, mlp_mult * d_model)
        self.fc2 = nn.Linear(mlp_mult * d_model, d_model)
        self.dropout = dropout

    def forward(self, x):
        b, t, c = x.shape
        h = self.ln1(x)
        q, k, v = self.qkv(h).split(c, dim=2)
        q = q.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2)
        k = k.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2)
        v = v.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2)
        a = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        a = a.transpose(1, 2).contiguous().view(b, t, c)
        x = x + F.dropout(self.proj(a), self.dropout, self.training)
        h = self.fc2(F.gelu(self.fc1(self.ln2(x))))
        x = x + F.dropout(h, self.dropout, self.training)
        return x


class ByteLM(nn.Module):
    def __init__(self, vocab: int, d_model: int, n_layers: int, n_heads: int,
                 ctx: int, mlp_mult: int = 4, dropout: float = 0.0):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d_model)
        self.pos_emb = nn.Embedding(ctx, d_model)
        self.blocks = nn.ModuleList(
            [Block(d_model, n_heads, mlp_mult, dropout) for _ in range(n_layers)]
        )
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)  # untied on purpose
        self.apply(self._init)
        for n, p in self.named_parameters():
            if n.endswith("proj.weight") or n.endswith("fc2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layers))

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, idx):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)[None]
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


# --------------------------------------------------------------------------
# checkpoint helpers
# --------------------------------------------------------------------------

def weights_dict(model: nn.Module, dtype=torch.float32) -> dict[str, torch.Tensor]:
    return {
        "model." + n: p.detach().to(dtype).contiguous().clone()
        for n, p in model.named_parameters()
    }


def optimizer_dict(opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    out = {}
    sd = opt.state_dict()
    for idx, st in sorted(sd["state"].items()):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            v = st.get(key)
            if isinstance(v, torch.Tensor):
                out[f"optimizer.state.{idx}.{key}"] = v.detach().contiguous().clone()
    return out


def save(path: str, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> None:
    tmp = path + ".tmp"
    save_file(tensors, tmp, metadata={k: str(v) for k, v in meta.items()})
    os.replace(tmp, path)
    print(f"  wrote {path}  ({os.path.getsize(path) / 1e6:.2f} MB, "
          f"{len(tensors)} tensors)", flush=True)


def write_big(path: str, model: nn.Module, target_mb: float, seed: int,
              meta: dict[str, str]) -> None:
    """About ``target_mb`` MB of large 2-D tensors made of the trained weights.

    The flattened fp32 weights of all 2-D parameters form a pool; each output
    tensor is filled by tiling that pool starting at a random offset.  Tensor
    sizes cycle through 256, 128 and 64 MB and dtypes alternate between fp32
    and bf16 (bf16 tensors are the fp32 values rounded to bfloat16).
    """
    pool = torch.cat([p.detach().float().reshape(-1)
                      for p in model.parameters() if p.dim() == 2])
    rng = np.random.default_rng(seed)
    target = int(target_mb * 1e6)
    sizes_mb = [256, 128, 64]
    dtypes = [torch.float32, torch.bfloat16]
    cols = 4096
    tensors: dict[str, torch.Tensor] = {}
    total = 0
    i = 0
    min_bytes = min(32 * 2**20, target)
    while target - total >= min_bytes:
        dt = dtypes[i % len(dtypes)]
        item = 4 if dt == torch.float32 else 2
        nbytes = min(sizes_mb[i % len(sizes_mb)] * 2**20, target - total)
        rows = max(1, nbytes // (item * cols))
        n = rows * cols
        off = int(rng.integers(0, pool.numel()))
        reps = (off + n) // pool.numel() + 1
        flat = pool.repeat(reps)[off:off + n]
        t = flat.reshape(rows, cols).to(dt).contiguous()
        name = f"big.{i}.{'fp32' if dt == torch.float32 else 'bf16'}"
        tensors[name] = t
        total += t.numel() * item
        i += 1
        del flat
    m = dict(meta)
    m["kind"] = "big"
    m["note"] = ("tiled trained weights (2-D params), random start offset per "
                 "tensor; fp32 and bf16 alternate")
    save(path, tensors, m)
    for k, t in tensors.items():
        print(f"    {k}: {tuple(t.shape)} {str(t.dtype).replace('torch.', '')} "
              f"{t.numel() * t.element_size() / 2**20:.0f} MiB")


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(HERE, "data"))
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--save-every", type=int, default=50)
    ap.add_argument("--d-model", type=int, default=384)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--max-data-mb", type=float, default=None,
                    help="cap on training text size (default: whole stdlib)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads (default: torch's choice)")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--big-mb", type=float, default=0,
                    help="also write big.safetensors of about this many MB")
    ap.add_argument("--no-intermediate", action="store_true",
                    help="do not write ckpt_<step>.safetensors files")
    args = ap.parse_args(argv)

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    if args.threads:
        torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)

    max_bytes = int(args.max_data_mb * 1e6) if args.max_data_mb else None
    text, data_info = stdlib_corpus(max_bytes)
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
    n_val = max(args.ctx + 1, len(data) // 100)
    train_data, val_data = data[:-n_val], data[-n_val:]
    print(f"data: {data_info['files']} files, {len(data) / 1e6:.1f} MB "
          f"({data_info['source']})", flush=True)

    cfg = dict(vocab=256, d_model=args.d_model, n_layers=args.layers,
               n_heads=args.heads, ctx=args.ctx, mlp_mult=4, dropout=0.0)
    model = ByteLM(**cfg)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {json.dumps(cfg)}  params={n_params / 1e6:.2f}M  "
          f"torch threads={torch.get_num_threads()}", flush=True)

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
    )

    # map optimizer state index -> parameter name (the state_dict numbers
    # parameters in param-group order)
    name_of = {id(p): n for n, p in model.named_parameters()}
    idx_to_name = {}
    k = 0
    for g in opt.param_groups:
        for p in g["params"]:
            idx_to_name[str(k)] = name_of[id(p)]
            k += 1

    def lr_at(step: int) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        prog = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * prog)))

    gen = torch.Generator().manual_seed(args.seed)

    def batch(src):
        ix = torch.randint(len(src) - args.ctx - 1, (args.batch,), generator=gen)
        x = torch.stack([src[i:i + args.ctx] for i in ix])
        y = torch.stack([src[i + 1:i + 1 + args.ctx] for i in ix])
        return x, y

    @torch.no_grad()
    def val_loss(n_batches: int = 4) -> float:
        model.eval()
        g = torch.Generator().manual_seed(1234)
        losses = []
        for _ in range(n_batches):
            ix = torch.randint(len(val_data) - args.ctx - 1, (args.batch,), generator=g)
            x = torch.stack([val_data[i:i + args.ctx] for i in ix])
            y = torch.stack([val_data[i + 1:i + 1 + args.ctx] for i in ix])
            losses.append(F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1)).item())
        model.train()
        return float(np.mean(losses))

    def meta(step: int, loss: float) -> dict[str, str]:
        return {
            "format": "inshrink-benchmark-checkpoint",
            "step": str(step),
            "loss": f"{loss:.6f}",
            "model_config": json.dumps(cfg),
            "optimizer": json.dumps({"type": "AdamW", "lr": args.lr,
                                     "betas": [0.9, 0.95],
                                     "weight_decay": args.weight_decay}),
            "optimizer_index_to_param": json.dumps(idx_to_name),
            "seed": str(args.seed),
            "data": json.dumps(data_info),
            "torch": torch.__version__,
        }

    curve = []
    model.train()
    t0 = time.time()
    loss_v = float("nan")
    for step in range(1, args.steps + 1):
        for g in opt.param_groups:
            g["lr"] = lr_at(step - 1)
        x, y = batch(train_data)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_v = loss.item()
        curve.append({"step": step, "loss": loss_v})
        if step % args.log_every == 0 or step == 1 or step == args.steps:
            el = time.time() - t0
            print(f"step {step:5d}  loss {loss_v:.4f}  bits/byte "
                  f"{loss_v / math.log(2):.3f}  lr {lr_at(step - 1):.2e}  "
                  f"{el:6.1f}s ({el / step:.2f}s/step)", flush=True)
        if not args.no_intermediate and args.save_every > 0 and step % args.save_every == 0:
            t = weights_dict(model)
            t.update(optimizer_dict(opt))
            save(os.path.join(args.out, f"ckpt_{step}.safetensors"), t, meta(step, loss_v))

    vl = val_loss()
    print(f"final: step {args.steps}  train loss {loss_v:.4f}  val loss {vl:.4f} "
          f"({vl / math.log(2):.3f} bits/byte)  time {time.time() - t0:.1f}s", flush=True)

    m = meta(args.steps, loss_v)
    m["val_loss"] = f"{vl:.6f}"
    full = weights_dict(model)
    full.update(optimizer_dict(opt))
    save(os.path.join(args.out, "final_fp32.safetensors"), full, {**m, "kind": "weights+optimizer fp32"})
    save(os.path.join(args.out, "final_weights_fp32.safetensors"), weights_dict(model),
         {**m, "kind": "weights fp32"})
    save(os.path.join(args.out, "final_bf16.safetensors"), weights_dict(model, torch.bfloat16),
         {**m, "kind": "weights bf16"})
    with open(os.path.join(args.out, "loss.json"), "w") as fh:
        json.dump({"config": cfg, "args": vars(args), "val_loss": vl, "curve": curve}, fh)

    # compact loss curve
    print("loss curve (step: loss):")
    stride = max(1, len(curve) // 20)
    pts = curve[::stride] + ([curve[-1]] if (len(curve) - 1) % stride else [])
    print("  " + "  ".join(f"{c['step']}:{c['loss']:.3f}" for c in pts))

    if args.big_mb > 0:
        write_big(os.path.join(args.out, "big.safetensors"), model, args.big_mb,
                  args.seed, m)
    return 0


if __name__ == "__main__":
    sys.exit(main())
