"""Train a tiny character-level language model with numpy + Adam and save a real checkpoint.

The text is Python's own standard library source, so nothing is downloaded. The checkpoint
holds model weights (``model.*``) and Adam state (``optimizer.state.N.exp_avg`` /
``exp_avg_sq``) as safetensors, like a PyTorch training checkpoint flattened to names.

    python examples/train_tiny.py tiny.safetensors [--steps 300] [--bf16]
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
from safetensors.numpy import save_file

CONTEXT, EMBED, HIDDEN, VOCAB = 8, 32, 256, 128


def corpus(limit: int = 2_000_000) -> np.ndarray:
    """ASCII bytes of the standard library's .py files (deterministic order)."""
    root, chunks, total = os.path.dirname(os.__file__), [], 0
    for name in sorted(os.listdir(root)):
        if name.endswith(".py") and total < limit:
            with open(os.path.join(root, name), "rb") as f:
                data = f.read()
            chunks.append(data)
            total += len(data)
    text = np.frombuffer(b"".join(chunks)[:limit], np.uint8)
    return np.minimum(text, VOCAB - 1)


def init(rng) -> dict[str, np.ndarray]:
    def dense(n_in, n_out):
        return (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
    return {"embed.weight": (rng.standard_normal((VOCAB, EMBED)) * 0.1).astype(np.float32),
            "hidden.weight": dense(CONTEXT * EMBED, HIDDEN),
            "hidden.bias": np.zeros(HIDDEN, np.float32),
            "out.weight": dense(HIDDEN, VOCAB), "out.bias": np.zeros(VOCAB, np.float32)}


def loss_and_grads(p, x, y):
    """Forward and backward pass of embed -> tanh MLP -> softmax cross-entropy."""
    e = p["embed.weight"][x].reshape(len(x), -1)
    h = np.tanh(e @ p["hidden.weight"] + p["hidden.bias"])
    logits = h @ p["out.weight"] + p["out.bias"]
    logits -= logits.max(1, keepdims=True)
    prob = np.exp(logits)
    prob /= prob.sum(1, keepdims=True)
    loss = -np.log(prob[np.arange(len(y)), y] + 1e-12).mean()
    d = prob
    d[np.arange(len(y)), y] -= 1
    d /= len(y)
    g = {"out.weight": h.T @ d, "out.bias": d.sum(0)}
    dh = (d @ p["out.weight"].T) * (1 - h * h)
    g["hidden.weight"] = e.T @ dh
    g["hidden.bias"] = dh.sum(0)
    de = (dh @ p["hidden.weight"].T).reshape(len(x), CONTEXT, EMBED)
    g["embed.weight"] = np.zeros_like(p["embed.weight"])
    np.add.at(g["embed.weight"], x, de)
    return float(loss), g


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("output")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bf16", action="store_true", help="store the weights as bfloat16")
    args = ap.parse_args()

    rng = np.random.default_rng(args.seed)
    text = corpus()
    params = init(rng)
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(v) for k, v in params.items()}
    b1, b2, eps, start = 0.9, 0.999, 1e-8, time.time()
    for step in range(1, args.steps + 1):
        idx = rng.integers(0, len(text) - CONTEXT - 1, args.batch)
        x = text[idx[:, None] + np.arange(CONTEXT)]
        y = text[idx + CONTEXT]
        loss, grads = loss_and_grads(params, x, y)
        for k in params:  # Adam, as torch.optim.Adam does it
            m[k] = b1 * m[k] + (1 - b1) * grads[k]
            v[k] = b2 * v[k] + (1 - b2) * grads[k] ** 2
            m_hat, v_hat = m[k] / (1 - b1 ** step), v[k] / (1 - b2 ** step)
            params[k] -= (args.lr * m_hat / (np.sqrt(v_hat) + eps)).astype(np.float32)
        if step % 50 == 0 or step == 1:
            print(f"step {step:5d}  loss {loss:.4f}  ({time.time() - start:.1f}s)")

    state = {}
    for i, k in enumerate(params):
        w = params[k]
        if args.bf16:
            import ml_dtypes
            w = w.astype(ml_dtypes.bfloat16)
        state[f"model.{k}"] = w
        state[f"optimizer.state.{i}.exp_avg"] = m[k].astype(np.float32)
        state[f"optimizer.state.{i}.exp_avg_sq"] = v[k].astype(np.float32)
    meta = {"step": str(args.steps), "loss": f"{loss:.6f}",
            "config": json.dumps({"context": CONTEXT, "embed": EMBED, "hidden": HIDDEN})}
    save_file(state, args.output, metadata=meta)
    print(f"wrote {args.output}: {os.path.getsize(args.output):,} bytes")


if __name__ == "__main__":
    main()
