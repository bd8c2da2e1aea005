"""The Trainer :class:`Callback`: every checkpoint the ``Trainer`` saves goes into an
:class:`inshrink.Series` (:func:`~.checkpoints.checkpoint_to_numpy`), is read back and
checked, and its Trainer directory may go once it is. Imports torch and transformers."""
from __future__ import annotations

import hashlib
import os
import shutil
import warnings
from typing import Any, Mapping

import numpy as np
from transformers import TrainerCallback

from ..errors import InshrinkError, InvalidArgumentError
from ..encode.policy import Policy, resolve
from ..series.retention import refuse_weights_only
from ..series.series import Series
from .checkpoints import (checkpoint_files, checkpoint_to_numpy, is_model_tensor,
                          model_files, restore_checkpoint, write_checkpoint)

__all__ = ["Callback"]


class Callback(TrainerCallback):
    """Store every checkpoint the ``Trainer`` saves in an :class:`inshrink.Series`.

    After each save (``on_save``, on the main process) the checkpoint directory
    ``output_dir/checkpoint-<step>`` goes into the series as step ``<step>`` (see
    :func:`checkpoint_to_numpy`), and the stored step is read back and compared with what was
    stored (:meth:`verify_step`: every lossless tensor bit for bit, every quantized one within
    the error its report gives). The next save rewrites that step as a delta against the new
    one; it is then decoded again and must give the same values. The Trainer's own directory
    is left as it is (with ``save_total_limit`` the Trainer rotates it as usual), or, with
    ``remove_checkpoint=True``, removed only once both checks passed (the newest step's at
    the end of training): a step that fails one keeps its directory, gets a
    :class:`UserWarning` and is listed in :attr:`unverified`.
    :meth:`restore` writes a step back. A series takes only steps after its latest: training
    that starts before it (a rerun from scratch, a resume from an older step) is refused
    with :class:`InvalidArgumentError` when it begins (``on_train_begin``).

    Parameters
    ----------
    series_dir : str or os.PathLike
        The series' directory.
    policy : Policy, str or None
        Compression of weights and optimizer moments (``"balanced"``...); ``None``:
        lossless, and training resumes exactly as from the Trainer's own checkpoint.
    remove_checkpoint : bool
        Remove the Trainer's checkpoint directory once stored and verified.
    keep_last : int, optional
        Keep only the newest this many steps in the series (as ``save_total_limit`` does for
        the Trainer's directories), deleting older ones after each save
        (:meth:`inshrink.Series.retain`); None: keep every step.
    keep_weights : int, optional
        With ``keep_last``: also keep the model of this many steps before the ``keep_last``
        newest, without the optimizer, scheduler, RNG and trainer state: a step leaving the
        ``keep_last`` newest is rewritten in place as its model's files only (safetensors,
        config and tokenizer files; :meth:`inshrink.Series.retain`, bit for bit unless
        ``weights_policy``). :meth:`restore_model` writes such a step as a model directory
        (for ``from_pretrained``); :meth:`restore` refuses it by name.
    weights_policy : Policy, str or None
        Encode the weights-only steps again with this policy, from the values the checkpoint
        decodes to (a lossier one saves more). Default: as the checkpoint stored them.
    **series_kwargs
        ``keyframe_every``, ``threads``: see :class:`inshrink.Series`.

    Attributes
    ----------
    reports : dict
        Step -> the tensor report of its save.
    unverified : dict
        Step -> why its stored copy failed the check (its Trainer directory was kept).

    Examples
    --------
    >>> cb = Callback("ckpts-ink/", remove_checkpoint=True, keep_last=3)  # doctest: +SKIP
    >>> Trainer(model, args, train_dataset=data, callbacks=[cb]).train()  # doctest: +SKIP
    >>> trainer.train(resume_from_checkpoint=cb.restore("out/resume"))    # doctest: +SKIP
    """

    def __init__(self, series_dir: str | os.PathLike, policy: Policy | str | None = None, *,
                 remove_checkpoint: bool = False, keep_last: int | None = None,
                 keep_weights: int | None = None,
                 weights_policy: Policy | str | None = None,
                 **series_kwargs: Any) -> None:
        if keep_last is not None and (type(keep_last) is not int or keep_last < 1):
            raise InvalidArgumentError("keep_last must be a positive integer or None")
        if keep_weights is not None and (type(keep_weights) is not int or keep_weights < 1
                                         or keep_last is None):
            raise InvalidArgumentError("keep_weights must be a positive integer, with "
                                       "keep_last")
        self.series = Series(series_dir, policy, **series_kwargs)
        self.keep_weights = keep_weights
        resolve(weights_policy)  # a bad policy fails here, not at a save
        self.weights_policy = weights_policy
        self.remove_checkpoint = remove_checkpoint
        self.keep_last = keep_last
        self.reports: dict[int, list] = {}
        self.unverified: dict[int, str] = {}
        # the newest checked step: (step, its Trainer directory, digests of its tensors)
        self._pending: tuple[int, str, dict[str, bytes]] | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # a series takes only steps after its latest: refuse before training, not at a save
        latest = self.series.latest()
        if state.is_world_process_zero and latest is not None and latest > state.global_step:
            later = [s for s in self.series.steps() if s > state.global_step]
            raise InvalidArgumentError(
                f"{self.series.directory} already holds step(s) {later} after step "
                f"{state.global_step}, where this training starts, and a series only takes "
                f"steps after its latest: resume from step {latest} "
                f"(callback.restore(dir)), or give the Callback a new directory")

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
        step = int(state.global_step)
        directory = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")
        if not os.path.isdir(directory):
            raise InvalidArgumentError(f"{directory}: the Trainer's checkpoint is missing")
        arrays, metadata = checkpoint_to_numpy(directory)
        self.reports[step] = report = self.series.save(step, arrays, metadata)
        decoded = self._decode_new_and_previous(step)  # one decode of this step's file
        problem, digests = self._verify(step, arrays, report, decoded.get(step))
        del arrays  # one checkpoint in memory at a time
        self._settle_previous(decoded.get(self._pending[0]) if self._pending else None)
        if problem is not None:
            self._failed(step, problem, directory)
        else:
            self._pending = (step, directory, digests)
        if self.keep_weights is not None:
            self.series.retain(self.keep_last, self.keep_weights, model=is_model_tensor,
                               policy=self.weights_policy)
        elif self.keep_last is not None:
            self.series.retain(self.keep_last)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # the newest step stays a whole file, checked when it was saved: done with it
        if self._pending is not None and self.remove_checkpoint:
            shutil.rmtree(self._pending[1], ignore_errors=True)
        self._pending = None

    def _decode_new_and_previous(self, step: int) -> dict[int, Any]:
        """The tensors of the step just saved and, when the save rewrote the step before it
        as a delta against it, of that step too, from one decode of the chain (the delta's
        base is the new step's file); an error in place of tensors it could not give."""
        previous = None if self._pending is None else next(
            (e for e in self.series.checkpoints() if e.step == self._pending[0]), None)
        wanted = [step] if previous is None or previous.keyframe else [step, previous.step]
        decoded: dict[int, Any] = {}
        try:
            for at, tensors in self.series.decode_chain(wanted[-1]):
                if at in wanted:
                    decoded[at] = tensors
        except (InshrinkError, OSError) as exc:
            for at in wanted:  # a link that failed: what rests on it is unchecked too
                decoded.setdefault(at, exc)
        return decoded

    def _settle_previous(self, decoded: Any = None) -> None:
        """The step saved before the newest one: once the save rewrote it as a delta,
        compare what it decodes to now (``decoded``, from :meth:`_decode_new_and_previous`)
        with what it decoded to when it was checked; then (or at once, if it stayed whole)
        its Trainer directory may go."""
        if self._pending is None:
            return
        step, directory, digests = self._pending
        self._pending = None
        entry = next((e for e in self.series.checkpoints() if e.step == step), None)
        problem = None
        if entry is not None and not entry.keyframe:
            if decoded is None:
                problem = "not decoded after its rewrite as a delta"
            elif isinstance(decoded, BaseException):
                problem = f"{type(decoded).__name__}: {decoded}"
            elif {n: _digest(a) for n, a in decoded.items()} != digests:
                problem = "as a delta it decodes to other values than it was saved with"
        if problem is not None:
            self._failed(step, f"{problem} (after its rewrite as a delta)", directory)
        elif self.remove_checkpoint and os.path.isdir(directory):
            shutil.rmtree(directory)

    def _failed(self, step: int, problem: str, directory: str) -> None:
        self.unverified[step] = problem
        warnings.warn(f"step {step}: the compressed copy in {self.series.directory} failed "
                      f"its check ({problem}); {directory} is kept", UserWarning, stacklevel=3)

    def verify_step(self, step: int, arrays: Mapping[str, np.ndarray],
                    report: list) -> str | None:
        """Decode ``step`` from the series (checking the file's hash, every chunk's checksum
        and any delta's base) and compare it with ``arrays``, what was saved: lossless
        tensors bit for bit, quantized ones within the relative L2 error of ``report``.
        Returns None if it matches, else what is wrong."""
        return self._verify(step, arrays, report)[0]

    def _verify(self, step: int, arrays: Mapping[str, np.ndarray], report: list,
                decoded: Any = None) -> tuple[str | None, dict[str, bytes]]:
        """:meth:`verify_step`, and a digest of each decoded tensor (for the check after the
        step is rewritten as a delta); ``decoded``: the step's tensors, or the error decoding
        them gave, when the caller decoded them already."""
        if decoded is None:
            try:
                decoded = self.series.load(step)
            except (InshrinkError, OSError) as exc:
                decoded = exc
        if isinstance(decoded, BaseException):
            return f"{type(decoded).__name__}: {decoded}", {}
        if decoded.keys() != arrays.keys():
            return "the stored tensors are not the saved ones", {}
        infos = {info.name: info for info in report}
        for name, original in arrays.items():
            got, info = decoded[name], infos.get(name)
            if got.shape != original.shape or got.dtype != original.dtype:
                return f"tensor {name!r}: shape or dtype differs", {}
            if info is None or info.lossless:
                if not np.array_equal(_bytes_of(got), _bytes_of(original)):
                    return f"tensor {name!r}: not bit-exact", {}
                continue
            bound = (info.error or {}).get("rel_l2_error")
            if isinstance(bound, (int, float)) and np.isfinite(bound):
                reference = original.astype(np.float64)
                norm = float(np.linalg.norm(reference))
                error = float(np.linalg.norm(got.astype(np.float64) - reference))
                if error > (bound * (1 + 1e-3) + 1e-6) * norm:
                    return (f"tensor {name!r}: relative L2 error "
                            f"{error / norm if norm else error:.4g} above the reported "
                            f"{bound:.4g}"), {}
        return None, {name: _digest(a) for name, a in decoded.items()}

    def weights_steps(self) -> list[int]:
        """Every step whose model can be loaded (:meth:`restore_model`): the whole ones and,
        with ``keep_weights``, the weights-only ones before them."""
        return self.series.steps()

    def restore(self, directory: str | os.PathLike, step: int | None = None, *,
                overwrite: bool = False) -> str:
        """Write checkpoint ``step`` (default: the latest) as a Trainer checkpoint directory;
        see :func:`restore_checkpoint`. Returns ``directory``.

        Raises
        ------
        InvalidArgumentError
            ``step`` is a weights-only step (``keep_weights``): its training state is gone.
        """
        models = self.series.weights_only_steps()
        refuse_weights_only(step, [s for s in self.series.steps() if s not in models], models,
                            self.series.directory, f"restore_model(directory, {step})")
        return restore_checkpoint(self.series, directory, step, overwrite=overwrite)

    def restore_model(self, directory: str | os.PathLike, step: int | None = None, *,
                      overwrite: bool = False) -> str:
        """Write the model of ``step`` (default: the latest) as a model directory
        (safetensors, config and tokenizer files, for ``from_pretrained``), from a whole
        checkpoint or a weights-only step (``keep_weights``). Returns ``directory``."""
        steps = self.weights_steps()
        step = (steps[-1] if steps else None) if step is None else step
        if step is None:
            raise InvalidArgumentError(f"the series {self.series.directory} is empty")
        if step not in steps:
            raise InvalidArgumentError(f"no step {step} in {self.series.directory} (steps "
                                       f"with a model: {steps})")
        if os.path.lexists(directory) and not overwrite:
            raise InvalidArgumentError(f"{os.fspath(directory)} exists (pass overwrite=True "
                                       f"to replace it)")
        arrays, metadata = model_files(self.series.load(step), self.series.metadata(step))
        return write_checkpoint(checkpoint_files(metadata), arrays, directory,
                                f"step {step} of {self.series.directory}")


def _digest(array: np.ndarray) -> bytes:
    """A digest of the array's dtype, shape and bytes."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{array.dtype.str}{array.shape}".encode())
    h.update(_bytes_of(array))
    return h.digest()


def _bytes_of(array: np.ndarray) -> np.ndarray:
    """The array's bytes as a flat uint8 view (a copy only if it is not contiguous)."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)
