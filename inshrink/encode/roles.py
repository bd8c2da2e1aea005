"""Tensor roles: what a tensor is in a training checkpoint (a weight, an embedding, an Adam
moment, a small or exact tensor), recognised from its name, dtype name and shape.

Names follow PyTorch's conventions (``model.layers.3.attn.q_proj.weight``,
``optimizer.state.3.exp_avg``); a :class:`inshrink.policy.Policy` maps each role to how it is
stored.
"""
from __future__ import annotations

import math
import re

__all__ = ["ROLES", "LOSSY_DTYPES", "SMALL_TENSOR", "SMALL_MOMENT", "role_of"]

ROLES = ("weight", "embedding", "exp_avg", "exp_avg_sq", "small", "exact")
"""Tensor roles. ``small`` (biases, norms, scalars) and ``exact`` (integers, bool, steps,
fp8, complex) are always stored losslessly."""

LOSSY_DTYPES = ("F64", "F32", "F16", "BF16")

_EXP_AVG_SQ = re.compile(r"(^|[._])(exp_avg_sq|max_exp_avg_sq|square_avg|sum)$")
_EXP_AVG = re.compile(r"(^|[._])(exp_avg|momentum_buffer|momentum)$")
_EXACT = re.compile(r"(^|[._])(step|steps|num_batches_tracked)$")
_EMBEDDING = re.compile(r"(embed|wte|wpe|tok_emb|pos_emb|lm_head)", re.IGNORECASE)
# short module names hand-written models give their token and position tables and output head
# (``model.tok.weight``, ``model.pos.weight``, ``model.head.weight``): matched as whole name
# components only, so that e.g. ``heads`` or ``position_bias`` are not
_EMBEDDING_PART = re.compile(r"(^|\.)(tok|tokens?|pos|wte|wpe|head|lm_head|output_head|"
                             r"unembed|vocab|word_embeddings|position_embeddings)\.weight$",
                             re.IGNORECASE)

SMALL_TENSOR = 4096
"""Weights with fewer elements, or with fewer than two dimensions, are stored losslessly."""

SMALL_MOMENT = 256
"""Optimizer moments with fewer elements are stored losslessly. Smaller than for weights: the
moments of biases and norms quantize as well as any others, and on a model with many of them
they were a fifth of a lossy series (docs/decisions.md); below ~1 KB, the records of a quantized
tensor cost about as much as its lossless bytes."""


def role_of(name: str, dtype: str, shape: tuple[int, ...]) -> str:
    """The role of a tensor from its name, file dtype name and shape."""
    if dtype not in LOSSY_DTYPES or _EXACT.search(name):
        return "exact"
    if _EXP_AVG_SQ.search(name):
        return "exp_avg_sq" if math.prod(shape) >= SMALL_MOMENT else "small"
    if _EXP_AVG.search(name):
        return "exp_avg" if math.prod(shape) >= SMALL_MOMENT else "small"
    if len(shape) < 2 or math.prod(shape) < SMALL_TENSOR:
        return "small"
    embedding = _EMBEDDING.search(name) or _EMBEDDING_PART.search(name)
    return "embedding" if embedding else "weight"
