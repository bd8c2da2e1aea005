"""Weights-only retention, the rule every keeper of older steps as models shares (the
Checkpointer, sharded or not, and the Trainer callback): such a step cannot resume training."""
from __future__ import annotations

from typing import Sequence

from ..errors import InvalidArgumentError

__all__ = ["refuse_weights_only"]


def refuse_weights_only(step: int | None, whole: Sequence[int], models: Sequence[int],
                        where: str, load: str) -> None:
    """Raise if ``step`` is kept as a model only: among ``models`` (the steps whose model is
    kept) but not ``whole`` (the steps with their training state).

    Raises
    ------
    InvalidArgumentError
        Naming the step, ``where`` it is, how to ``load`` its model and the whole steps.
    """
    if step is not None and step not in whole and step in models:
        raise InvalidArgumentError(
            f"{where}: step {step} keeps the model's weights only (keep_weights): its "
            f"optimizer and training state are no longer kept; {load} loads the model, and "
            f"training resumes from one of the whole steps {list(whole)}")
