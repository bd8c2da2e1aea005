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
``checkpointer``       :class:`Checkpointer`
``training``           scheduler, random generators and extras as arrays plus JSON
``sharded``            the Checkpointer's sharded mode (``torch.distributed.checkpoint``)
``files``              :func:`save_file`, :func:`load_file`, :func:`save_model`...
=====================  ================================================================

>>> ckpt = Checkpointer("ckpts/", model, optimizer, eval_batches=batches)  # doctest: +SKIP
>>> ckpt.save(step)                                                        # doctest: +SKIP
>>> step = ckpt.restore()                                                  # doctest: +SKIP
"""
from .checkpointer import (EPSILON_FLOOR, LATE_LR, PEAK_LR_METADATA, SEARCH_METADATA,
                           Checkpointer)
from .convert import to_numpy, to_torch
from .files import load, load_file, load_model, save, save_file, save_model
from .gradients import GradientEMA
from .quality import CRITERIA, quality_from
from .state import (GROUPS, MODEL, OPTIMIZER, OPTIMIZER_METADATA, STATE, decode_nested,
                    encode_nested, load_state, state_to_numpy)

__all__ = ["Checkpointer", "GradientEMA", "quality_from", "state_to_numpy", "load_state",
           "to_numpy", "to_torch", "encode_nested", "decode_nested", "OPTIMIZER_METADATA",
           "SEARCH_METADATA", "save_file", "load_file", "save_model", "load_model", "save",
           "load", "MODEL", "OPTIMIZER", "STATE", "GROUPS", "CRITERIA", "EPSILON_FLOOR",
           "LATE_LR", "PEAK_LR_METADATA"]
