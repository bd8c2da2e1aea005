"""Which tensors are quantized, and how: QuantConfig, policies and presets.

A policy maps every tensor to a :class:`QuantConfig` (lossy) or ``None`` (lossless) from its
*role* (:mod:`inshrink.roles`: recognised from its name, dtype and size), with overrides by
name pattern.
"""
from __future__ import annotations

import fnmatch
import functools
import math
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Mapping

from ..errors import InvalidArgumentError
from .roles import LOSSY_DTYPES, ROLES, SMALL_MOMENT, SMALL_TENSOR, role_of

FITTED_DOMAINS = ("linear", "log", "signed_log")  # where k-means fits levels
DOMAINS = (*FITTED_DOMAINS, "factored")
PRUNE_METRICS = ("magnitude", "sensitivity")
MAX_BINS = 65_000  # levels + zero + escape must fit 16-bit codes


@dataclass(frozen=True)
class QuantConfig:
    """How one tensor is quantized (the paper's protect / prune / quantize partition).

    Parameters
    ----------
    bins : int
        Number of quantization levels fitted by histogram k-means (k). 0 fits none: every
        element that is not protected is stored as exactly 0 (an optimizer moment restarted
        from zero, its largest entries kept).
    prune : float
        Fraction of elements (the smallest by ``prune_metric``) set to exactly zero.
    prune_metric : {"magnitude", "sensitivity"}
        Ranking for pruning; "sensitivity" needs importance scores (|g·w|).
    protect : float
        Fraction of elements (the largest by magnitude, and by sensitivity when importance is
        given) stored exactly in the original dtype.
    domain : {"linear", "log", "signed_log"} or None
        Where levels are fitted and nearest levels chosen: "linear" for weights (the paper),
        "log" for non-negative tensors with a huge dynamic range (Adam's ``exp_avg_sq``),
        "signed_log" (log magnitude, sign kept) for gradient-like tensors (``exp_avg``).
        "factored" (format 1.4) stores a non-negative F32/F64 tensor of two or more
        dimensions as the outer product of row and column factors, rows running over all
        but the last dimension (Adam's ``exp_avg_sq`` of a matrix: R + C values instead of
        R × C); a tensor that does not qualify (negative or non-finite values, one dimension,
        another dtype) gets ``bins`` levels in the "log" domain instead.
        ``None`` takes the role's default.
    max_rel_l2 : float, optional
        Error bound: use the fewest bins (up to ``bins``) whose relative L2 error
        ||x - x̂|| / ||x|| is at most this; store the tensor losslessly if none is.
    sigma : float
        Bucket weight mix for "linear" fitting: sigma·frequency + (1 - sigma)·|center|.
    alpha : float
        Relative accuracy of the log-bucket histogram.
    seed : int
        Seed of the k-means++ initialisation (the output is deterministic for a seed).
    """

    bins: int = 16
    prune: float = 0.0
    prune_metric: str = "magnitude"
    protect: float = 0.0005
    domain: str | None = None
    max_rel_l2: float | None = None
    sigma: float = 0.2
    alpha: float = 0.005
    seed: int = 0

    def __post_init__(self) -> None:
        # the one validation of quantization settings: Policy's configs, the array frame
        # and the numcodecs / zarr codecs all take theirs from here
        for name in ("bins", "seed", "protect", "prune", "max_rel_l2", "sigma", "alpha"):
            value = getattr(self, name)
            if type(value) not in (int, float, type(None)):
                # a numpy scalar, perhaps; only then import dtypes (numpy), so that the
                # presets, and the command line's --help that reads them, need no numpy
                from ..dtypes import python_number
                object.__setattr__(self, name, python_number(value))
        if type(self.bins) is not int or not 0 <= self.bins <= MAX_BINS:
            raise InvalidArgumentError(f"bins must be an integer in [0, {MAX_BINS}]")
        for name in ("prune", "protect"):
            value = getattr(self, name)
            if not _is_number(value) or not 0 <= value < 1:
                raise InvalidArgumentError(f"{name} must be a fraction in [0, 1), got {value!r}")
        if self.prune + self.protect >= 1:
            raise InvalidArgumentError("prune + protect must be below 1")
        if self.prune_metric not in PRUNE_METRICS:
            raise InvalidArgumentError(f"prune_metric must be one of {PRUNE_METRICS}")
        if self.domain is not None and self.domain not in DOMAINS:
            raise InvalidArgumentError(f"domain must be one of {DOMAINS} or None")
        # a bound of 0 is refused: only lossless storage meets it, which needs no bins
        if self.max_rel_l2 is not None and not (_is_number(self.max_rel_l2)
                                                and 0 < self.max_rel_l2 < math.inf):
            raise InvalidArgumentError("max_rel_l2 must be a positive number")
        if self.max_rel_l2 is not None and self.domain == "factored":
            raise InvalidArgumentError("a factored tensor has no bins to meet max_rel_l2 with")
        if not _is_number(self.sigma) or not 0 <= self.sigma <= 1:
            raise InvalidArgumentError("sigma must be in [0, 1]")
        if not _is_number(self.alpha) or not 1e-4 <= self.alpha <= 0.1:
            raise InvalidArgumentError("alpha must be in [1e-4, 0.1]")
        if type(self.seed) is not int or self.seed < 0:  # (numpy's generators take no other)
            raise InvalidArgumentError("seed must be a non-negative integer")


def _is_number(value: object) -> bool:
    """An int or a float, not a bool: settings are plain numbers (reports and manifests write
    them as JSON), and a bool is no fraction or bound."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


DEFAULT_DOMAIN = {"weight": "linear", "embedding": "linear", "exp_avg": "signed_log",
                  "exp_avg_sq": "log"}


@dataclass(frozen=True)
class Policy:
    """Role -> QuantConfig (or None: lossless), with per-name overrides.

    Parameters
    ----------
    roles : mapping of role to QuantConfig or None
        Missing roles are lossless; ``small`` and ``exact`` are always lossless.
    overrides : mapping of glob pattern to QuantConfig, None or a role name
        Checked in order before the role: the first pattern that matches a tensor name
        decides (a role name re-assigns the tensor to that role's config).
    tensors : mapping of exact tensor name to QuantConfig
        Checked before the overrides: per-tensor configurations (e.g. the bins the search
        allocates to each tensor); the tensor keeps its role.
    """

    roles: Mapping[str, QuantConfig | None] = field(default_factory=dict)
    overrides: Mapping[str, QuantConfig | str | None] = field(default_factory=dict)
    tensors: Mapping[str, QuantConfig] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for what in ("roles", "overrides", "tensors"):
            value = getattr(self, what)
            if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
                raise InvalidArgumentError(f"{what} must be a mapping with str keys")
        for role, cfg in self.roles.items():
            if role not in ROLES:
                raise InvalidArgumentError(f"unknown role {role!r}; roles are {ROLES}")
            if cfg is not None and not isinstance(cfg, QuantConfig):
                raise InvalidArgumentError(f"role {role!r}: expected a QuantConfig or None")
        for pattern, value in self.overrides.items():
            if not (value is None or isinstance(value, QuantConfig) or value in ROLES):
                raise InvalidArgumentError(f"override {pattern!r}: expected a QuantConfig, "
                                           f"None or a role name")
        for name, value in self.tensors.items():
            if not isinstance(value, QuantConfig):
                raise InvalidArgumentError(f"tensor {name!r}: expected a QuantConfig")

    @classmethod
    def uniform(cls, config: QuantConfig) -> "Policy":
        """The same config for weights, embeddings and optimizer moments."""
        return cls({role: config for role in DEFAULT_DOMAIN})

    def config_for(self, name: str, dtype: str,
                   shape: tuple[int, ...]) -> tuple[str, QuantConfig | None]:
        """(role, config with its domain resolved) for one tensor; config None = lossless.

        An override may quantize even a ``small`` tensor: the caller asked explicitly.
        """
        role = role_of(name, dtype, shape)
        config = None if role in ("small", "exact") else self.roles.get(role)
        if name in self.tensors:
            config = self.tensors[name]
        else:
            for pattern, value in self.overrides.items():
                if fnmatch.fnmatchcase(name, pattern):
                    if isinstance(value, str):
                        role, config = value, self.roles.get(value)
                    else:
                        config = value
                    break
        if config is None or dtype not in LOSSY_DTYPES:
            return role, None
        if config.domain is None:
            config = _with_domain(config, DEFAULT_DOMAIN.get(role, "linear"))
        return role, config


@functools.lru_cache(maxsize=256)
def _with_domain(config: QuantConfig, domain: str) -> QuantConfig:
    """``replace(config, domain=domain)``, made once per config and domain: config_for
    resolves the same few configs for every tensor of a save, and replace() validates every
    field again. Keyed by value (configs are frozen), the least recently used forgotten
    past 256 (a search makes per-tensor configs)."""
    return replace(config, domain=domain)


PRESETS: Mapping[str, Policy] = MappingProxyType({
    "lossless": Policy(),
    "balanced": Policy({
        "weight": QuantConfig(bins=64, protect=0.0005),
        "embedding": QuantConfig(bins=64, protect=0.0005),
        "exp_avg": QuantConfig(bins=16, protect=0.0005),
        "exp_avg_sq": QuantConfig(bins=16, protect=0.0005),
    }),
    "aggressive": Policy({
        "weight": QuantConfig(bins=16, protect=0.0005),
        "embedding": QuantConfig(bins=32, protect=0.0005),
        "exp_avg": QuantConfig(bins=8, protect=0.0005),
        "exp_avg_sq": QuantConfig(bins=8, protect=0.0005),
    }),
    "compact": Policy({
        "weight": QuantConfig(bins=16, protect=0.0005),
        "embedding": QuantConfig(bins=32, protect=0.0005),
        "exp_avg": QuantConfig(bins=2, prune=0.5, protect=0.0005),
        "exp_avg_sq": QuantConfig(bins=2, protect=0.0005),
    }),
})
"""Named policies. ``balanced`` follows measurements on real runs: 64 weight levels cost
nothing measurable, moments in the log domain are harmless at 8-16 levels. ``compact`` is
``aggressive`` with 2 levels per moment (sign and magnitude class), the smaller half of the
first moment pruned to exact zeros: with one magnitude per sign for all of it, Adam's
updates of weights whose moments are both small grew many times over after a restore, and a
CNN trained with AdamW diverged (docs/decisions.md). Delta files of a series gain 2x over
standalone ones because weights, whose codes persist between checkpoints, are most of each
file."""


def resolve(policy: "Policy | str | None") -> Policy:
    """A Policy from a Policy, a preset name or None (lossless)."""
    if policy is None:
        return PRESETS["lossless"]
    if isinstance(policy, str):
        try:
            return PRESETS[policy]
        except KeyError:
            raise InvalidArgumentError(f"unknown preset {policy!r}; presets are "
                                       f"{sorted(PRESETS)}") from None
    if not isinstance(policy, Policy):
        raise InvalidArgumentError("policy must be a Policy, a preset name or None")
    return policy
