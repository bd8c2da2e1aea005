"""Models, data and deterministic training for the fault-tolerance benchmark (``bench_fault.py``).

Two tasks, each a real (small) training run on the CPU, single-threaded:

* ``lm``: a byte-level transformer language model (``train.ByteLM``: 2 layers, d_model 128,
  4 heads, context 128, ~0.48 M parameters) on the Python standard library's source text
  (``train.stdlib_corpus``, the first 6 MB), AdamW (betas 0.9/0.95 unless ``beta2`` is set, weight decay 0.1 on
  matrices), warmup then cosine decay to 10 %, gradient clipping at 1.0. Quality: loss on
  held-out text (the last 150 KB of the 6 MB, 128 windows of 128 bytes, lower is better).
* ``cnn``: a small CNN on scikit-learn's bundled ``load_digits`` (8x8 images, 10 classes):
  conv 1->32, conv 32->64, 2x2 max-pool, fc 1024->128, fc 128->10, ReLU, ~0.15 M parameters;
  SGD with momentum 0.9 (weight decay 5e-4), warmup then cosine decay; every training image
  is shifted by up to one pixel (a pure function of seed and step). Quality: held-out
  (450 images) cross-entropy and accuracy.

Determinism, so that a restore from a lossless checkpoint and a replay of the lost steps
gives bit-identical training:

* the model's initial weights are a function of the seed (``torch.manual_seed`` right
  before construction);
* the batch of step ``s`` (1-based) is a pure function of ``(seed, s)``: a fresh
  ``torch.Generator`` seeded with ``seed * 1_000_003 + s`` draws it (no global generator
  state is carried from step to step);
* the learning rate of step ``s`` is a function of ``s`` only, set before every step;
* no dropout, no batch norm (no buffers, no running statistics); one torch thread.

The held-out splits are fixed (independent of the seed). Each task also has *calibration*
batches, a held-out split disjoint from the test split, for checkpoint codecs that measure
the loss of a candidate configuration (``inshrink.torch.Checkpointer(eval_batches=...)``), so
that the final quality is never measured on data a codec has looked at.
"""
from __future__ import annotations

import copy
import hashlib
import math
import os
import sys
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from train import ByteLM, stdlib_corpus  # noqa: E402

STEP_SEED_STRIDE = 1_000_003


def step_generator(seed: int, step: int) -> torch.Generator:
    """The generator of step ``step``: depends on nothing but (seed, step)."""
    return torch.Generator().manual_seed(seed * STEP_SEED_STRIDE + step)


def lm_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of (batch, time, vocab) logits against (batch, time) targets."""
    return F.cross_entropy(outputs.reshape(-1, outputs.shape[-1]), targets.reshape(-1))


def cnn_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs, targets)


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> float:
    return (outputs.argmax(-1) == targets).float().mean().item()


# --------------------------------------------------------------------------------------------
# configurations
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LMConfig:
    steps: int = 1200
    ckpt_every: int = 60
    d_model: int = 128
    layers: int = 2
    heads: int = 4
    ctx: int = 128
    batch: int = 16
    lr: float = 2e-3
    warmup: int = 30
    weight_decay: float = 0.1
    lr_min: float = 0.1
    beta2: float = 0.95
    data_bytes: int = 6_000_000
    test_bytes: int = 150_000
    calib_bytes: int = 50_000
    test_windows: int = 128
    calib_windows: int = 32
    eval_batch: int = 16


@dataclass(frozen=True)
class CNNConfig:
    steps: int = 6000
    ckpt_every: int = 300
    batch: int = 32
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 5e-4
    warmup: int = 50
    lr_min: float = 0.0
    test: int = 450
    calib: int = 150
    calib_batch: int = 75
    shift: int = 1


@dataclass(frozen=True)
class GPTConfig(LMConfig):
    """The ``gpt`` task: close to a user's run the lm task never resembled (4 layers, 400
    steps, restores up to 5% before the end; see GPTTask)."""
    steps: int = 400
    ckpt_every: int = 20
    d_model: int = 128
    layers: int = 4
    heads: int = 4
    batch: int = 8
    lr: float = 2e-3
    warmup: int = 30
    lr_min: float = 0.1
    calib_windows: int = 64   # 8 batches of 8
    eval_batch: int = 8


@dataclass(frozen=True)
class MixerConfig:
    """The ``mixer`` task: an MLP-Mixer on digits with AdamW and a linear decay."""
    steps: int = 1000
    ckpt_every: int = 50
    batch: int = 32
    lr: float = 2e-3
    beta2: float = 0.999
    weight_decay: float = 0.05
    warmup: int = 50
    dim: int = 96
    blocks: int = 3
    test: int = 450
    calib: int = 150
    calib_batch: int = 75
    shift: int = 1


CONFIGS = {"lm": LMConfig(), "cnn": CNNConfig(), "gpt": GPTConfig(), "mixer": MixerConfig()}
QUICK = {"lm": LMConfig(steps=40, ckpt_every=4, warmup=5, data_bytes=1_000_000,
                        test_windows=32, calib_windows=16),
         "cnn": CNNConfig(steps=300, ckpt_every=10, warmup=10, lr=0.03),
         "gpt": GPTConfig(steps=40, ckpt_every=2, warmup=5, d_model=64, layers=2,
                          data_bytes=1_000_000, test_windows=32, calib_windows=16),
         "mixer": MixerConfig(steps=200, ckpt_every=10, warmup=10)}


def config(name: str, quick: bool = False, **overrides):
    base = (QUICK if quick else CONFIGS)[name]
    return replace(base, **overrides) if overrides else base


# --------------------------------------------------------------------------------------------
# data (loaded once per process)
# --------------------------------------------------------------------------------------------

_CACHE: dict = {}


def lm_data(cfg: LMConfig) -> dict:
    key = ("lm", cfg.data_bytes, cfg.test_bytes, cfg.calib_bytes)
    if key not in _CACHE:
        text, info = stdlib_corpus(cfg.data_bytes)
        data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
        n_test, n_calib = cfg.test_bytes, cfg.calib_bytes
        _CACHE[key] = dict(train=data[:-(n_test + n_calib)],
                           calib=data[-(n_test + n_calib):-n_test],
                           test=data[-n_test:], info=info)
    return _CACHE[key]


def digits_data(cfg) -> dict:
    key = ("digits", cfg.test, cfg.calib)
    if key not in _CACHE:
        from sklearn.datasets import load_digits
        x, y = load_digits(return_X_y=True)
        x = torch.tensor(x, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0
        y = torch.tensor(y, dtype=torch.long)
        perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
        te, ca, tr = (perm[:cfg.test], perm[cfg.test:cfg.test + cfg.calib],
                      perm[cfg.test + cfg.calib:])
        _CACHE[key] = dict(train=(x[tr], y[tr]), calib=(x[ca], y[ca]), test=(x[te], y[te]),
                           info={"source": "sklearn.datasets.load_digits",
                                 "train": len(tr), "calib": len(ca), "test": len(te)})
    return _CACHE[key]


def windows(src: torch.Tensor, n: int, ctx: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` evenly spaced (input, target) windows of ``ctx`` bytes over ``src``."""
    starts = torch.linspace(0, len(src) - ctx - 1, n).long()
    idx = starts[:, None] + torch.arange(ctx + 1)[None]
    w = src[idx]
    return w[:, :-1].contiguous(), w[:, 1:].contiguous()


# --------------------------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------------------------

class DigitsCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 4 * 4, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class GPT(nn.Module):
    """A byte-level GPT whose embeddings and head carry short names (``tok``, ``pos``,
    ``head``), as in many hand-written training scripts; blocks as ``train.Block``."""

    def __init__(self, vocab: int, d_model: int, layers: int, heads: int, ctx: int):
        super().__init__()
        from train import Block
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(ctx, d_model)
        self.blocks = nn.ModuleList([Block(d_model, heads, 4, 0.0) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        for n, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if n.endswith(("proj.weight", "fc2.weight")) \
                    else 0.02
                nn.init.normal_(p, mean=0.0, std=std)
            elif n.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))[None]
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


class Mixer(nn.Module):
    """An MLP-Mixer for 8x8 digits: 2x2 patches (16 tokens), ``blocks`` mixer blocks, mean
    pooling; names unlike the transformers' (``stem``, ``mix``, ``classifier``)."""

    def __init__(self, dim: int, blocks: int, tokens: int = 16, classes: int = 10):
        super().__init__()
        self.stem = nn.Linear(4, dim)
        self.mix = nn.ModuleList()
        for _ in range(blocks):
            self.mix.append(nn.ModuleDict(dict(
                norm1=nn.LayerNorm(dim), token1=nn.Linear(tokens, 4 * tokens),
                token2=nn.Linear(4 * tokens, tokens), norm2=nn.LayerNorm(dim),
                channel1=nn.Linear(dim, 4 * dim), channel2=nn.Linear(4 * dim, dim))))
        self.norm = nn.LayerNorm(dim)
        self.classifier = nn.Linear(dim, classes)

    def forward(self, x):
        b = x.shape[0]
        p = x.view(b, 4, 2, 4, 2).permute(0, 1, 3, 2, 4).reshape(b, 16, 4)
        h = self.stem(p)
        for m in self.mix:
            t = m["norm1"](h).transpose(1, 2)
            h = h + m["token2"](F.gelu(m["token1"](t))).transpose(1, 2)
            h = h + m["channel2"](F.gelu(m["channel1"](m["norm2"](h))))
        return self.classifier(self.norm(h).mean(1))


# --------------------------------------------------------------------------------------------
# tasks
# --------------------------------------------------------------------------------------------

class Task:
    """One training run: ``model`` and ``optimizer`` fresh from ``seed``; ``train_step(s)``
    trains step ``s`` (1-based) and is a pure function of the state and (seed, s)."""

    name = ""
    quality = "loss"          # the primary quality measure, lower is better
    loss_fn = None            # loss_fn(outputs, targets) -> scalar tensor
    metric = None             # optional metric(outputs, targets) -> float, higher is better
    search_metric = None      # what a searching codec keeps within epsilon (None: the loss)
    search_settings: dict = {}  # inshrink.torch.Checkpointer settings recommended for the task

    def __init__(self, cfg, seed: int = 0):
        self.cfg = cfg
        self.seed = seed
        self.steps = cfg.steps
        self.ckpt_every = cfg.ckpt_every
        self.model, self.optimizer = self.build()
        self.model.train()

    # subclasses: build(), batch(step), lr_at(step), test_batches, calib_batches, clip

    clip: float | None = None
    late_failures = False     # True: failures every 2K steps, the last in the final 5%
    probe_batches: list = []  # a cheap part of the test set, for diagnostics at restores

    def set_lr(self, step: int) -> None:
        lr = self.lr_at(step)
        for g in self.optimizer.param_groups:
            g["lr"] = lr

    def lr_at(self, step: int) -> float:
        cfg = self.cfg
        if step <= cfg.warmup:
            return cfg.lr * step / cfg.warmup
        prog = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
        return cfg.lr * (cfg.lr_min + (1 - cfg.lr_min) * 0.5 * (1 + math.cos(math.pi * prog)))

    def train_step(self, step: int) -> float:
        self.set_lr(step)
        x, y = self.batch(step)
        loss = self.loss_fn(self.model(x), y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        return loss.item()

    @torch.no_grad()
    def evaluate(self, batches=None, state: dict | None = None) -> dict:
        """Mean loss (and accuracy for classifiers) over ``batches`` (default: the test set),
        weighted by batch size; with ``state`` (a model state_dict), of the model with those
        tensors instead of its own (``torch.func.functional_call``; the model is untouched)."""
        batches = self.test_batches if batches is None else batches
        loss_fn = self.loss_fn
        total, n, correct = 0.0, 0, 0.0
        for x, y in batches:
            out = self.model(x) if state is None else \
                torch.func.functional_call(self.model, state, (x,))
            k = len(x)
            total += loss_fn(out, y).item() * k
            if self.metric is not None:
                correct += self.metric(out, y) * k
            n += k
        res = {"loss": total / n}
        if self.metric is not None:
            res["acc"] = correct / n
        return res

    def describe(self) -> dict:
        return {"task": self.name, "config": asdict(self.cfg), "seed": self.seed,
                "params": sum(p.numel() for p in self.model.parameters()),
                "tensors": {n: list(p.shape) for n, p in self.model.named_parameters()}}


class LMTask(Task):
    name = "lm"
    loss_fn = staticmethod(lm_loss)
    # a language model's outputs are logits: the search measures a candidate by the output KL
    # divergence (far less noisy than the loss on 32 windows), and a linear learning-rate
    # scale of epsilon is then enough (docs/decisions.md)
    search_settings = {"criterion": "kl", "epsilon_follows_lr": 1}
    clip = 1.0

    def __init__(self, cfg: LMConfig | None = None, seed: int = 0):
        cfg = cfg or CONFIGS["lm"]
        self.data = lm_data(cfg)
        tx, ty = windows(self.data["test"], cfg.test_windows, cfg.ctx)
        self.test_batches = [(tx[i:i + cfg.eval_batch], ty[i:i + cfg.eval_batch])
                             for i in range(0, len(tx), cfg.eval_batch)]
        cx, cy = windows(self.data["calib"], cfg.calib_windows, cfg.ctx)
        self.calib_batches = [(cx[i:i + cfg.eval_batch], cy[i:i + cfg.eval_batch])
                              for i in range(0, len(cx), cfg.eval_batch)]
        self.probe_batches = self.test_batches[:2]
        self._offsets = torch.arange(cfg.ctx + 1)[None]
        super().__init__(cfg, seed)

    def build(self):
        cfg = self.cfg
        torch.manual_seed(self.seed)
        model = ByteLM(256, cfg.d_model, cfg.layers, cfg.heads, cfg.ctx, mlp_mult=4, dropout=0.0)
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=cfg.lr, betas=(0.9, cfg.beta2), eps=1e-8)
        return model, opt

    def batch(self, step: int):
        cfg, train = self.cfg, self.data["train"]
        ix = torch.randint(len(train) - cfg.ctx - 1, (cfg.batch,),
                           generator=step_generator(self.seed, step))
        w = train[ix[:, None] + self._offsets]
        return w[:, :-1], w[:, 1:]


class CNNTask(Task):
    name = "cnn"
    quality = "acc"           # a classifier: accuracy, as the paper's vision models
    loss_fn = staticmethod(cnn_loss)
    metric = staticmethod(accuracy)
    search_metric = staticmethod(accuracy)

    def __init__(self, cfg: CNNConfig | None = None, seed: int = 0):
        cfg = cfg or CONFIGS["cnn"]
        self.data = digits_data(cfg)
        tx, ty = self.data["test"]
        self.test_batches = [(tx, ty)]
        self.probe_batches = self.test_batches
        cx, cy = self.data["calib"]
        self.calib_batches = [(cx[i:i + cfg.calib_batch], cy[i:i + cfg.calib_batch])
                              for i in range(0, len(cx), cfg.calib_batch)]
        super().__init__(cfg, seed)

    def build(self):
        cfg = self.cfg
        torch.manual_seed(self.seed)
        model = DigitsCNN()
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                              weight_decay=cfg.weight_decay)
        return model, opt

    def batch(self, step: int):
        cfg = self.cfg
        x, y = self.data["train"]
        g = step_generator(self.seed, step)
        ix = torch.randint(len(y), (cfg.batch,), generator=g)
        xb, yb = x[ix], y[ix]
        s = cfg.shift
        if s:  # random translation by up to s pixels (zero padding), per image
            off = torch.randint(0, 2 * s + 1, (cfg.batch, 2), generator=g)
            padded = F.pad(xb, (s, s, s, s))
            rows = off[:, 0, None] + torch.arange(8)[None]
            cols = off[:, 1, None] + torch.arange(8)[None]
            b = torch.arange(cfg.batch)[:, None, None]
            xb = padded[b, 0, rows[:, :, None], cols[:, None, :]].unsqueeze(1)
        return xb, yb


class GPTTask(LMTask):
    """Held-out check, chosen before any tuning: a 4-layer byte-level GPT (d_model 128; 256
    would take ~4x the CPU time) with names ``tok``/``pos``/``head``, 400 steps, a checkpoint
    every 20, 10 restores every 40 steps restoring steps 20, 60, ..., 380 (the last 5% before
    the end). Calibration: 8 held-out batches of 8 windows."""

    name = "gpt"
    late_failures = True

    def __init__(self, cfg: GPTConfig | None = None, seed: int = 0):
        super().__init__(cfg or CONFIGS["gpt"], seed)

    def build(self):
        cfg = self.cfg
        torch.manual_seed(self.seed)
        model = GPT(256, cfg.d_model, cfg.layers, cfg.heads, cfg.ctx)
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=cfg.lr, betas=(0.9, cfg.beta2), eps=1e-8)
        return model, opt


class MixerTask(CNNTask):
    """Held-out check, chosen before any tuning: an MLP-Mixer on digits with AdamW (betas
    0.9/0.999, weight decay 0.05), linear warmup then linear decay to zero, 1000 steps, a
    checkpoint every 50, 10 restores every 100 steps (the last restores step 950). Quality:
    held-out accuracy; the search measures the output KL (its outputs are logits)."""

    name = "mixer"
    late_failures = True
    search_metric = None
    search_settings = {"criterion": "kl", "epsilon_follows_lr": 1}

    def __init__(self, cfg: MixerConfig | None = None, seed: int = 0):
        super().__init__(cfg or CONFIGS["mixer"], seed)

    def build(self):
        cfg = self.cfg
        torch.manual_seed(self.seed)
        model = Mixer(cfg.dim, cfg.blocks)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, cfg.beta2),
                                eps=1e-8, weight_decay=cfg.weight_decay)
        return model, opt

    def lr_at(self, step: int) -> float:
        cfg = self.cfg
        if step <= cfg.warmup:
            return cfg.lr * step / cfg.warmup
        return cfg.lr * max(0.0, (cfg.steps - step) / (cfg.steps - cfg.warmup))


TASKS = {"lm": LMTask, "cnn": CNNTask, "gpt": GPTTask, "mixer": MixerTask}


def make_task(name: str, seed: int = 0, quick: bool = False, **overrides) -> Task:
    return TASKS[name](config(name, quick, **overrides), seed)


def trained(name: str, seed: int, steps: int, after: int = 1) -> tuple[Task, tuple]:
    """A task trained ``steps`` steps on one torch thread, with ``after`` steps of its schedule
    left, and a copy of its (model, optimizer) state dicts to go back to (:func:`rewind`)."""
    torch.set_num_threads(1)
    task = make_task(name, seed=seed)
    if not 0 < steps <= task.steps - after:
        raise SystemExit(f"{steps} steps leave fewer than {after} of {task.steps}")
    for step in range(1, steps + 1):
        task.train_step(step)
    return task, copy.deepcopy((task.model.state_dict(), task.optimizer.state_dict()))


def rewind(task: Task, snapshot: tuple) -> None:
    """Put a :func:`trained` snapshot back into the task's model and optimizer."""
    task.model.load_state_dict(snapshot[0])
    task.optimizer.load_state_dict(copy.deepcopy(snapshot[1]))


# --------------------------------------------------------------------------------------------
# the training state as flat named tensors
# --------------------------------------------------------------------------------------------

def flat_state(model: nn.Module, optimizer: torch.optim.Optimizer,
               clone: bool = True) -> dict[str, torch.Tensor]:
    """``model.<name>`` for every state_dict entry, ``optimizer.state.<idx>.<key>`` for every
    tensor of the optimizer state (the numbering of ``optimizer.state_dict()``)."""
    out = {}
    for n, t in model.state_dict().items():
        out["model." + n] = t.detach().clone() if clone else t.detach()
    for idx, st in sorted(optimizer.state_dict()["state"].items()):
        for key, v in st.items():
            if isinstance(v, torch.Tensor):
                out[f"optimizer.state.{idx}.{key}"] = v.detach().clone() if clone else v.detach()
    return out


def load_flat_state(model: nn.Module, optimizer: torch.optim.Optimizer,
                    flat: dict[str, torch.Tensor]) -> None:
    """Inverse of :func:`flat_state` (every tensor is copied into the live objects)."""
    model.load_state_dict({k[len("model."):]: v for k, v in flat.items()
                           if k.startswith("model.")}, strict=True)
    state: dict[int, dict] = {}
    for k, v in flat.items():
        if k.startswith("optimizer.state."):
            idx, key = k[len("optimizer.state."):].split(".", 1)
            state.setdefault(int(idx), {})[key] = v.clone()
    sd = optimizer.state_dict()
    optimizer.load_state_dict({"state": state, "param_groups": sd["param_groups"]})


@torch.no_grad()
def poison(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Throw the live state away: every parameter and optimizer-state tensor becomes NaN in
    place, so anything a restore fails to bring back shows up in the loss."""
    for p in model.parameters():
        p.fill_(float("nan"))
        p.grad = None
    for st in optimizer.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                v.fill_(float("nan"))


def state_digest(model: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """SHA-256 over every tensor of the training state (names, dtypes, shapes, bytes)."""
    h = hashlib.sha256()
    for name, t in sorted(flat_state(model, optimizer, clone=False).items()):
        a = t.contiguous().numpy()
        h.update(name.encode() + b"\0" + a.dtype.str.encode() + repr(a.shape).encode())
        h.update(a.reshape(-1).view(np.uint8).tobytes())
    return h.hexdigest()
