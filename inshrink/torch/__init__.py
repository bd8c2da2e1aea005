"""PyTorch integration: model and optimizer state as named arrays, gradient capture, quality
callbacks for the search, a :class:`Checkpointer` for training loops, and
``safetensors.torch``'s calls for .ink files.

Only this package imports torch; ``import inshrink`` never does. Tensor names follow the
conventions :func:`inshrink.policy.role_of` recognises: ``model.<state_dict name>`` for
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

>>> ckpt = Checkpointer("ckpts/", model, optimizer, eval_batches=batches)  # doctest: +SKIP
>>> ckpt.save(step)                                                        # doctest: +SKIP
>>> step = ckpt.restore()                                                  # doctest: +SKIP
"""
from .._lazy import face

_NAMES = {
    **dict.fromkeys(["Checkpointer", "EPSILON_FLOOR", "LATE_LR", "PEAK_LR_METADATA",
                     "SEARCH_METADATA"], "..checkpointing.checkpointer"),
    **dict.fromkeys(["to_numpy", "to_torch"], ".convert"),
    **dict.fromkeys(["load", "load_file", "load_model", "save", "save_file", "save_model"],
                    ".files"),
    "GradientEMA": ".gradients",
    **dict.fromkeys(["CRITERIA", "quality_from"], ".quality"),
    **dict.fromkeys(["GROUPS", "MODEL", "OPTIMIZER", "OPTIMIZER_METADATA", "STATE",
                     "decode_nested", "encode_nested", "load_state", "state_to_numpy"],
                    ".state"),
}
__getattr__, __dir__ = face(__name__, _NAMES)
__all__ = sorted(_NAMES)
