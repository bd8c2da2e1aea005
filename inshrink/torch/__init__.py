"""PyTorch integration: model and optimizer state as named arrays, gradient capture, quality
callbacks for the search, a :class:`Checkpointer` for training loops, and
``safetensors.torch``'s calls for .ink files.

Only this package imports torch; ``import inshrink`` never does. Tensor names follow the
conventions :func:`inshrink.encode.roles.role_of` recognises: ``model.<state_dict name>`` for
parameters and buffers, ``optimizer.state.<index>.<key>`` for optimizer state (``exp_avg``,
``exp_avg_sq``, ``momentum_buffer``, ``step``...).

=====================  ================================================================
``convert``            :func:`to_numpy`, :func:`to_torch`
``state``              :func:`state_to_numpy`, :func:`load_state`, nested values as arrays
``gradients``          :class:`GradientEMA`
``quality``            :func:`quality_from`
``training``           scheduler, random generators and extras as arrays plus JSON
``files``              :func:`save_file`, :func:`load_file`, :func:`save_model`...
=====================  ================================================================

:class:`Checkpointer` lives in :mod:`inshrink.checkpointing`. The metadata keys, the state's
group names and the nested-value helpers are imported from their modules (still resolved here
for old code, not listed in ``__all__``).

>>> ckpt = Checkpointer("ckpts/", model, optimizer, eval_batches=batches)  # doctest: +SKIP
>>> ckpt.save(step)                                                        # doctest: +SKIP
>>> step = ckpt.restore()                                                  # doctest: +SKIP
"""
from .._lazy import face

_NAMES = {
    "Checkpointer": "..checkpointing.checkpointer",
    **dict.fromkeys(["to_numpy", "to_torch"], ".convert"),
    **dict.fromkeys(["load", "load_file", "load_model", "save", "save_file", "save_model"],
                    ".files"),
    "GradientEMA": ".gradients",
    "quality_from": ".quality",
    **dict.fromkeys(["load_state", "state_to_numpy"], ".state"),
}
# constants and helpers this face once exported too: still resolved for old code, not listed
_KEPT = {
    **dict.fromkeys(["EPSILON_FLOOR", "LATE_LR"], "..checkpointing.budget"),
    **dict.fromkeys(["PEAK_LR_METADATA", "SEARCH_METADATA"], "..checkpointing.checkpointer"),
    "CRITERIA": ".quality",
    **dict.fromkeys(["GROUPS", "MODEL", "OPTIMIZER", "OPTIMIZER_METADATA", "STATE",
                     "decode_nested", "encode_nested"], ".state"),
}
__getattr__, __dir__ = face(__name__, {**_NAMES, **_KEPT})
__all__ = sorted(_NAMES)
