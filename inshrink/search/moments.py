"""The optimizer moments' configuration, chosen by what a restored state does to the next
updates.

A restored moment is not judged by its own error but by the steps it produces. A first moment
(Adam's ``exp_avg``, SGD's ``momentum_buffer``) off by δ keeps adding ``lr·δ`` (Adam: divided
by its preconditioner) to the updates, decaying by β1 per step: the weights end displaced by
about ``lr·|δ / (√v̂ + eps)| / (1 - β1)``. A second moment off changes the preconditioner
``1 / (√v̂ + eps)``, hence the size of every update, for about ``1 / (1 - β2)`` steps; the
updates' directions decorrelate after about ``1 / (1 - β1)`` steps, so the displacements add up
as a random walk of such blocks: ``|lr·m̂·Δ(1 / (√v̂ + eps))| · √(H1·H2)``. Both horizons end
with the run when its length is known. No gradient is needed: the moments and the
hyperparameters give it all.

The weights' own error is what the search measured against the quality bound, so the moments
get the cheapest configuration whose displacement, over the whole model, stays within
``share`` of the weights' error (by default as much again, split between the two moments):
the quality the search bounded then moves by at most about ``1 + share²`` times its measured
drop. Weights kept exactly leave no room: their moments are kept exactly too.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import numpy as np

from .. import dtypes
from ..encode.policy import Policy, QuantConfig, role_of
from ..errors import InvalidArgumentError
from .roundtrip import encode_tensor

KINDS = ("adam", "momentum")
FIRST_CANDIDATES: tuple[QuantConfig | None, ...] = (
    QuantConfig(bins=0), QuantConfig(bins=2), QuantConfig(bins=4), QuantConfig(bins=16), None)
"""The first moment's candidates, cheapest first: restarted (its largest entries kept), 2, 4
and 16 signed-log levels, exact."""
SECOND_CANDIDATES: tuple[QuantConfig | None, ...] = (
    QuantConfig(bins=2), QuantConfig(bins=4), QuantConfig(bins=16), None)
"""The second moment's candidates, cheapest first: 2, 4 and 16 log levels, exact."""
DEFAULT_SHARE = 1.0


@dataclass(frozen=True)
class Moments:
    """One parameter's optimizer state and what turns it into that parameter's updates.

    Parameters
    ----------
    weight : str
        The parameter's tensor name in the checkpoint (the weights the search configured).
    kind : {"adam", "momentum"}
        Adam/AdamW (``first`` = exp_avg, ``second`` = exp_avg_sq) or SGD with momentum
        (``first`` = momentum_buffer, ``beta1`` = the momentum, no ``second``).
    first, second : str or None
        The moments' tensor names in the checkpoint.
    lr, beta1, beta2, eps : float
        The parameter group's hyperparameters (``beta2``, ``eps`` unused for momentum).
    step : float
        Optimizer steps taken (Adam's bias correction); 0 for momentum.
    steps_left : int or None
        Steps still to come in the run when its length is known (the horizons end there).
    """

    weight: str
    kind: str
    first: str | None
    second: str | None = None
    lr: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    step: float = 0.0
    steps_left: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidArgumentError(f"moments of {self.weight!r}: kind must be one of "
                                       f"{KINDS}")
        for name in ("lr", "eps", "step"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 <= value < math.inf):
                raise InvalidArgumentError(f"moments of {self.weight!r}: {name} must be a "
                                           f"non-negative number")
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 <= value < 1):
                raise InvalidArgumentError(f"moments of {self.weight!r}: {name} must be in "
                                           f"[0, 1)")

    def horizon(self, beta: float) -> float:
        """Steps a perturbation of a moment with decay ``beta`` lasts."""
        steps = 1.0 / (1.0 - beta)
        return steps if self.steps_left is None else max(1.0, min(steps, self.steps_left))

    def _preconditioner(self, v: np.ndarray) -> np.ndarray:
        bias2 = 1.0 - self.beta2 ** self.step if self.step > 0 else 1.0
        return 1.0 / (np.sqrt(np.maximum(v, 0.0) / bias2) + self.eps)

    def first_displacement(self, m: np.ndarray, m_hat: np.ndarray,
                           v: np.ndarray | None) -> float:
        """How far the weights end from where they would have gone, ``m`` restored as
        ``m_hat`` (``v``: the second moment, for Adam)."""
        delta = m_hat.astype(np.float64) - m
        if self.kind == "adam":
            bias1 = 1.0 - self.beta1 ** self.step if self.step > 0 else 1.0
            delta *= self._preconditioner(v.astype(np.float64)) / bias1
        return self.lr * float(np.linalg.norm(delta)) * self.horizon(self.beta1)

    def second_displacement(self, m: np.ndarray, v: np.ndarray, v_hat: np.ndarray) -> float:
        """The same for Adam's second moment ``v`` restored as ``v_hat``."""
        bias1 = 1.0 - self.beta1 ** self.step if self.step > 0 else 1.0
        change = self._preconditioner(v_hat.astype(np.float64)) - \
            self._preconditioner(v.astype(np.float64))
        steps = math.sqrt(self.horizon(self.beta1) * self.horizon(self.beta2))
        return self.lr * float(np.linalg.norm(m * change)) / bias1 * steps


def _norm(values: Sequence[float]) -> float:
    return math.sqrt(sum(v * v for v in values))


def _config_key(config: QuantConfig | None) -> Any:
    return None if config is None else {"bins": config.bins, "protect": config.protect,
                                        "domain": config.domain}


def choose_moments(arrays: Mapping[str, np.ndarray], groups: Sequence[Moments],
                   weight_error: float, policy: Policy, share: float = DEFAULT_SHARE,
                   ) -> tuple[Policy, dict[str, Any]]:
    """The moments' configurations whose displacement stays within ``share`` of the weights'
    error, cheapest first (see the module's description).

    Parameters
    ----------
    arrays : mapping of str to numpy.ndarray
        The checkpoint's tensors (the moments and weights named by ``groups``).
    groups : sequence of Moments
        The parameters whose moments are chosen; others keep ``policy``'s configuration.
    weight_error : float
        ``||ŵ - w||`` over the searched weights at the chosen configuration (0: exact).
    policy : Policy
        The weights' policy; its ``exp_avg`` and ``exp_avg_sq`` roles are replaced.
    share : float
        The moments' displacement allowed, relative to ``weight_error`` (split equally,
        in squares, between the first and the second moment).

    Returns
    -------
    policy : Policy
        ``policy`` with the chosen moment configurations.
    report : dict
        Per moment: every candidate tried with its displacement, the bound and the choice.
    """
    if not (isinstance(share, (int, float)) and 0 <= share < math.inf):
        raise InvalidArgumentError("share must be a non-negative number")
    started = time.perf_counter()
    bound = share * weight_error / math.sqrt(2.0)
    report: dict[str, Any] = {"weight_error": weight_error, "bound": bound, "share": share}
    roles = dict(policy.roles)
    for role, candidates, measure in (
            ("exp_avg", FIRST_CANDIDATES, _first), ("exp_avg_sq", SECOND_CANDIDATES, _second)):
        members = [g for g in groups if _has_role(arrays, g.first if role == "exp_avg"
                                                  else g.second, role)]
        if not members:
            continue
        tried = []
        chosen = None
        for config in candidates:
            if config is None:
                tried.append({"config": None, "displacement": 0.0})
                break
            trial = replace(policy, roles={**roles, role: config})
            displacement = _norm([measure(g, arrays, trial) for g in members])
            tried.append({"config": _config_key(config), "displacement": displacement})
            if displacement <= bound:
                chosen = config
                break
        roles[role] = chosen
        report[role] = {"tensors": len(members), "tried": tried,
                        "chosen": _config_key(chosen)}
    report["seconds"] = time.perf_counter() - started
    return replace(policy, roles=roles), report


def _has_role(arrays: Mapping[str, np.ndarray], name: str | None, role: str) -> bool:
    """Whether ``name`` is a tensor of ``arrays`` that the ``role`` configuration applies to
    (a moment too small to quantize is stored exactly whatever it is)."""
    if name is None or name not in arrays:
        return False
    array = arrays[name]
    return role_of(name, dtypes.of_numpy(array.dtype).name, array.shape) == role


def _decoded(name: str, arrays: Mapping[str, np.ndarray], policy: Policy) -> np.ndarray:
    return encode_tensor(name, arrays[name], policy).decoded


def _first(group: Moments, arrays: Mapping[str, np.ndarray], policy: Policy) -> float:
    m = arrays[group.first]
    v = arrays.get(group.second) if group.second is not None else None
    if group.kind == "adam" and v is None:  # no preconditioner stored: unscaled
        group = Moments(group.weight, "momentum", group.first, lr=group.lr,
                        beta1=group.beta1, steps_left=group.steps_left)
    return group.first_displacement(m, _decoded(group.first, arrays, policy), v)


def _second(group: Moments, arrays: Mapping[str, np.ndarray], policy: Policy) -> float:
    if group.first is None or group.first not in arrays:
        return 0.0  # no first moment: nothing for the preconditioner to scale
    v = arrays[group.second]
    return group.second_displacement(arrays[group.first], v,
                                     _decoded(group.second, arrays, policy))
