"""The fixed task list of the fidelity benchmark (``bench_fidelity.py``).

Each task is one of ``ft_models``' four models (the byte-level ``lm`` and ``gpt`` on the
Python standard library's source, the ``cnn`` and ``mixer`` on scikit-learn's digits) with an
optimizer and a learning-rate schedule of its own, sized so that one training run takes a few
seconds on one CPU thread. ``ft_models``' determinism carries over (initial weights from the
seed, the batch of step ``s`` a pure function of ``(seed, s)``, the learning rate a function
of the step), so that two runs of one task and seed differ only by what a configuration does.

The list and its held-out part were fixed before anything was measured: the held-out tasks
(:data:`HELD_OUT`, each model family among them, each an optimizer/schedule pair no tuning task
has) are for a final check after the search has been changed, never for tuning it. A held-out
round is spent once it has been run: its tasks join the tuning tasks (:data:`SPENT`) and new
held-out tasks are fixed before the next change is tuned.
"""
from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field, replace

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import ft_models as fm  # noqa: E402

OPTIMIZERS = ("adam", "adamw", "sgd_momentum", "sgd_nesterov", "adafactor")
SCHEDULES = ("cosine", "linear", "constant", "step")
FAMILIES = {"lm": "language model", "gpt": "language model", "cnn": "cnn", "mixer": "mixer"}

# the small language models: d_model 64, 2 layers, context 64 (8192 test tokens, 2048 for
# the search's calibration), on 2 MB of the corpus
_LM = dict(d_model=64, layers=2, heads=4, ctx=64, batch=16, data_bytes=2_000_000,
           test_bytes=150_000, calib_bytes=50_000, test_windows=128, calib_windows=32,
           eval_batch=16)


@dataclass(frozen=True)
class Spec:
    """One task: a model of ``ft_models``, an optimizer, a schedule and their numbers.

    ``optimizer``: one of :data:`OPTIMIZERS`; ``beta2`` for Adam/AdamW; ``weight_decay``
    (AdamW and the language models: matrices only). ``schedule``: one of :data:`SCHEDULES`,
    after ``warmup`` linear steps: ``cosine`` to ``lr_min`` × lr, ``linear`` to zero,
    ``constant``, ``step`` (× 0.1 at 50% and again at 75% of the run).
    """

    name: str
    model: str
    optimizer: str
    schedule: str
    steps: int
    lr: float
    warmup: int
    beta2: float | None = None
    weight_decay: float = 0.0
    lr_min: float = 0.0
    config: dict = field(default_factory=dict)  # further ft_models config fields

    @property
    def family(self) -> str:
        return FAMILIES[self.model]

    @property
    def ckpt_every(self) -> int:
        return max(1, self.steps // 20)

    def model_config(self):
        fields = dict(_LM) if self.model in ("lm", "gpt") else {}
        fields.update(self.config)
        # the schedule is lr_at's: ft_models' own lr_min and schedule go unused
        fields.update(steps=self.steps, ckpt_every=self.ckpt_every, lr=self.lr,
                      warmup=self.warmup)
        return fm.config(self.model, **fields)


TASKS: dict[str, Spec] = {s.name: s for s in (
    # ---- tuning tasks
    Spec("lm-adamw95-cosine", "lm", "adamw", "cosine", steps=300, lr=3e-3, warmup=20,
         beta2=0.95, weight_decay=0.1, lr_min=0.1),
    Spec("gpt-adam99-constant", "gpt", "adam", "constant", steps=300, lr=1e-3, warmup=20,
         beta2=0.99),
    Spec("cnn-sgdm-cosine", "cnn", "sgd_momentum", "cosine", steps=600, lr=0.02, warmup=20,
         weight_decay=5e-4),
    Spec("cnn-nesterov-step", "cnn", "sgd_nesterov", "step", steps=600, lr=0.03, warmup=20,
         weight_decay=5e-4),
    Spec("mixer-adamw999-linear", "mixer", "adamw", "linear", steps=600, lr=2e-3, warmup=30,
         beta2=0.999, weight_decay=0.05),
    Spec("mixer-adafactor-constant", "mixer", "adafactor", "constant", steps=600, lr=1e-2,
         warmup=30),
    # ---- held out: one per model family, optimizer/schedule pairs no tuning task has
    Spec("lm-adamw99-linear", "lm", "adamw", "linear", steps=300, lr=3e-3, warmup=20,
         beta2=0.99, weight_decay=0.1),
    Spec("cnn-adamw95-step", "cnn", "adamw", "step", steps=600, lr=1e-3, warmup=20,
         beta2=0.95, weight_decay=0.01),
    Spec("mixer-nesterov-cosine", "mixer", "sgd_nesterov", "cosine", steps=600, lr=0.05,
         warmup=30, weight_decay=5e-4),
    # ---- held out, second round (fixed 2026-12-06, before the search was tuned again):
    # pairs that none of the nine tasks above has
    Spec("gpt-adamw999-cosine", "gpt", "adamw", "cosine", steps=300, lr=1e-3, warmup=20,
         beta2=0.999, weight_decay=0.1, lr_min=0.1),
    Spec("lm-adafactor-linear", "lm", "adafactor", "linear", steps=300, lr=1e-2, warmup=20),
    Spec("cnn-adam-linear", "cnn", "adam", "linear", steps=600, lr=1e-3, warmup=20,
         beta2=0.99),
    Spec("mixer-sgdm-step", "mixer", "sgd_momentum", "step", steps=600, lr=0.05, warmup=30,
         weight_decay=5e-4),
    # ---- held out, third round (fixed 2026-12-06, after the second round was run, before any
    # further tuning): pairs that none of the thirteen tasks above has
    Spec("gpt-adamw95-linear", "gpt", "adamw", "linear", steps=300, lr=1e-3, warmup=20,
         beta2=0.95, weight_decay=0.1),
    Spec("lm-adam999-step", "lm", "adam", "step", steps=300, lr=3e-3, warmup=20, beta2=0.999),
    Spec("cnn-sgdm-constant", "cnn", "sgd_momentum", "constant", steps=600, lr=0.02, warmup=20,
         weight_decay=5e-4),
    Spec("cnn-adafactor-step", "cnn", "adafactor", "step", steps=600, lr=1e-2, warmup=20),
    Spec("mixer-adafactor-cosine", "mixer", "adafactor", "cosine", steps=600, lr=1e-2,
         warmup=30),
    Spec("mixer-adam95-constant", "mixer", "adam", "constant", steps=600, lr=2e-3, warmup=30,
         beta2=0.95),
)}

# the held-out rounds already run (RESULTS, "Fidelity"): tuning tasks since; the first round
# on 2026-12-04, the second on 2026-12-06
SPENT = frozenset({"lm-adamw99-linear", "cnn-adamw95-step", "mixer-nesterov-cosine",
                   "gpt-adamw999-cosine", "lm-adafactor-linear", "cnn-adam-linear",
                   "mixer-sgdm-step"})
# chosen with their specs, before any run: for the final check only (bench_fidelity --held-out)
HELD_OUT = frozenset({"gpt-adamw95-linear", "lm-adam999-step", "cnn-sgdm-constant",
                      "cnn-adafactor-step", "mixer-adafactor-cosine", "mixer-adam95-constant"})
TUNING = tuple(n for n in TASKS if n not in HELD_OUT)


def lr_at(spec: Spec, step: int) -> float:
    """The learning rate of step ``step`` (1-based) of ``spec``'s schedule."""
    if step <= spec.warmup:
        return spec.lr * step / spec.warmup
    prog = (step - spec.warmup) / max(1, spec.steps - spec.warmup)
    if spec.schedule == "cosine":
        return spec.lr * (spec.lr_min + (1 - spec.lr_min) * 0.5 * (1 + math.cos(math.pi * prog)))
    if spec.schedule == "linear":
        return spec.lr * max(0.0, 1.0 - prog)
    if spec.schedule == "constant":
        return spec.lr
    if spec.schedule == "step":
        return spec.lr * (0.1 ** ((step > spec.steps // 2) + (step > spec.steps * 3 // 4)))
    raise ValueError(f"unknown schedule {spec.schedule!r}")


def make_optimizer(spec: Spec, model: torch.nn.Module) -> torch.optim.Optimizer:
    """``spec``'s optimizer over ``model``'s parameters (the language models' AdamW decays
    the matrices only, as ft_models' lm)."""
    params = list(model.parameters())
    if spec.optimizer in ("adam", "adamw"):
        betas = (0.9, spec.beta2)
        if spec.optimizer == "adam":
            return torch.optim.Adam(params, lr=spec.lr, betas=betas, eps=1e-8,
                                    weight_decay=spec.weight_decay)
        if spec.model in ("lm", "gpt"):
            params = [{"params": [p for p in params if p.dim() >= 2],
                       "weight_decay": spec.weight_decay},
                      {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW(params, lr=spec.lr, betas=betas, eps=1e-8,
                                 weight_decay=spec.weight_decay)
    if spec.optimizer in ("sgd_momentum", "sgd_nesterov"):
        return torch.optim.SGD(params, lr=spec.lr, momentum=0.9,
                               nesterov=spec.optimizer == "sgd_nesterov",
                               weight_decay=spec.weight_decay)
    if spec.optimizer == "adafactor":
        return torch.optim.Adafactor(params, lr=spec.lr, weight_decay=spec.weight_decay)
    raise ValueError(f"unknown optimizer {spec.optimizer!r}")


_BASES = {"lm": fm.LMTask, "gpt": fm.GPTTask, "cnn": fm.CNNTask, "mixer": fm.MixerTask}
_CLASSES: dict[str, type] = {}


def _task_class(model: str) -> type:
    """ft_models' task class of ``model`` with the spec's optimizer and schedule."""
    if model not in _CLASSES:
        base = _BASES[model]

        class FidelityTask(base):
            def __init__(self, spec: Spec, seed: int = 0):
                self.spec = spec
                super().__init__(spec.model_config(), seed)
                self.name = spec.name

            def build(self):
                model, _ = super().build()  # the weights of ft_models' seeded construction
                return model, make_optimizer(self.spec, model)

            def lr_at(self, step: int) -> float:
                return lr_at(self.spec, step)

        FidelityTask.__name__ = f"Fidelity{base.__name__}"
        _CLASSES[model] = FidelityTask
    return _CLASSES[model]


def make_task(name: str, seed: int = 0, steps: int | None = None) -> fm.Task:
    """A fresh run of task ``name`` from ``seed`` (``steps``: a shorter run, for tests)."""
    spec = TASKS[name]
    if steps is not None:
        spec = replace(spec, steps=steps, warmup=min(spec.warmup, max(1, steps // 2)))
    return _task_class(spec.model)(spec, seed)
