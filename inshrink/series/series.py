"""A training run's checkpoints: one .ink file per step in a directory, plus a manifest.

The manifest (``manifest.json``) lists every checkpoint in step order with its file, whether it
is a keyframe, the file it is a delta against (its base) and the SHA-256 of its bytes. A
checkpoint file is written (atomically) before the manifest names it, and the manifest is
replaced atomically, so a crash at any point leaves a consistent series: at worst an orphan
file that the manifest does not list.

The newest checkpoint is always stored whole, so restoring it — what resuming training
needs — reads one file. When a newer checkpoint arrives, the previous one is rewritten as a
delta against it (lossless tensors XORed, quantized tensors as code deltas), under a new file
name so the manifest switch stays atomic, unless that would make a chain longer than
``keyframe_every`` files: then it stays whole, as a keyframe. Each delta file records the name
and SHA-256 of its base; restoring an older step replays its chain back from the keyframe after
it, checking every link.

A series has one writer at a time: saving, deleting and retaining hold an exclusive advisory
lock (``flock``) on ``.lock`` in the directory and re-read the manifest under it, so a second
process writing at the same moment gets a :class:`SeriesLockedError` at once instead of
waiting (a save may take minutes) or silently dropping the other's steps.

:meth:`Series.retain` can keep older steps as their model only (``keep_weights``): such a step's
file is rewritten as ``step_….w.ink`` holding the model's tensors as they decoded before, older
such steps as deltas against the next (``step_….w.d.ink``, a chain of their own: a whole step
is never their base, nor they a whole step's), and the manifest says version 2 while it lists
one.

The rules this series shares with the DCP series (:class:`inshrink.dcp.InkSeries`) are in
:mod:`.keyframes`, :mod:`.manifest`, :mod:`.links` and :mod:`.directory`.
"""
from __future__ import annotations

import json
import os
import re
import reprlib
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from typing import Any, Callable, Collection, Iterator, Mapping

import numpy as np

from .. import digest as _digest
from ..atomic import release_write_lock
from ..dtypes import as_numpy
from ..encode.policy import Policy, resolve
from ..errors import (BaseMismatchError, CorruptError, InshrinkError, InvalidArgumentError,
                      SeriesLockedError)
from ..io.rebase import Decoded, write_delta, write_standalone
from ..io.arguments import resolve_threads
from ..io.file import File
from ..io.info import TensorInfo
from ..io.writer import Writer
from ..search.stored import SEARCH_KEY  # named here too, as before
from .directory import LOCK, remove, take_lock
from .keyframes import previous_becomes_delta
from .links import (decode_digest, decode_each_link, decode_link, file_sha256, replay,
                    replay_each)
from .manifest import (MAX_MANIFEST_BYTES, MAX_STEP, check_after, check_new_step, file_problem,
                       find_entry, has_exactly, read_manifest, step_problem, write_manifest)

__all__ = ["Series", "Checkpoint", "MANIFEST", "LOCK", "SEARCH_KEY", "SERIES_FORMAT",
           "SERIES_VERSION", "WEIGHTS_VERSION", "RETAIN_BYTES", "MAX_MANIFEST_BYTES", "MAX_STEP",
           "checkpoint_file",
           "decode_manifest", "parse_manifest", "decode_digest", "decode_link", "file_sha256"]

MANIFEST = "manifest.json"
SERIES_FORMAT = "inshrink-series"
SERIES_VERSION = 1
WEIGHTS_VERSION = 2
"""The manifest version of a series that lists a weights-only step (a ``.w.ink`` file): a
reader of version 1 refuses it rather than read such a step as a whole training state."""
RETAIN_BYTES = 96 << 20
"""Between saves, a series keeps what the next delta refers to (the newest checkpoint's codes
and lossless tensors) in memory up to this many bytes; the rest is decoded back from its file
one tensor at a time when the delta is written. A save holds at most twice this (what was
kept of the previous checkpoint and the new one's codes) besides one tensor being decoded:
within the largest tensor + 256 MB whatever the checkpoint's size."""
_ENTRY_KEYS = frozenset(("step", "file", "keyframe", "base", "sha256", "bytes"))
# ASCII digits and \A...\Z: "$" would accept a trailing newline, "\d" any Unicode digit
_FILE = re.compile(r"\Astep_[0-9]{12}(\.w)?(\.d)?\.ink\Z", re.ASCII)
# AtomicFile's temporaries of the series' own files: "." + name + "." + mkstemp's 8 characters
_TEMPORARY = re.compile(
    r"\A\.(step_[0-9]{12}(\.w)?(\.d)?\.ink|manifest\.json)\.[a-z0-9_]{8}\.tmp\Z", re.ASCII)


@dataclass(frozen=True)
class Checkpoint:
    """One manifest entry."""

    step: int
    file: str
    keyframe: bool
    base: str | None
    sha256: str
    bytes: int

    @property
    def weights_only(self) -> bool:
        """Whether the step keeps its model's tensors only (:meth:`Series.retain`)."""
        return ".w." in self.file


def decode_manifest(raw: bytes, path: str = MANIFEST) -> list[Checkpoint]:
    """The checkpoints of the bytes of a ``manifest.json`` (spec section 23); CorruptError
    naming ``path`` for anything that is not a valid manifest."""
    if len(raw) > MAX_MANIFEST_BYTES:
        raise CorruptError(f"{path}: series manifest larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deeply
        raise CorruptError(f"{path}: invalid series manifest "
                           f"({reprlib.repr(str(exc))})") from None
    return parse_manifest(doc, path)


def parse_manifest(doc: Any, path: str = MANIFEST) -> list[Checkpoint]:
    """The checkpoints of a decoded ``manifest.json`` document, every field checked for its
    exact type and value (spec section 23); CorruptError naming ``path`` otherwise."""
    def bad(why: str) -> CorruptError:
        return CorruptError(f"{path}: invalid series manifest: {why}")
    if type(doc) is not dict or doc.get("format") != SERIES_FORMAT:
        raise CorruptError(f"{path}: not a series manifest")
    version = doc.get("version")
    if type(version) is not int or version not in (SERIES_VERSION, WEIGHTS_VERSION):
        raise CorruptError(f"{path}: not a version {SERIES_VERSION} or {WEIGHTS_VERSION} "
                           f"series manifest (version {reprlib.repr(version)})")
    checkpoints = doc.get("checkpoints")
    if type(checkpoints) is not list:
        raise bad("'checkpoints' must be a list")
    entries: list[Checkpoint] = []
    for i, e in enumerate(checkpoints):
        if not has_exactly(e, _ENTRY_KEYS):
            raise bad(f"checkpoint {i} must be an object with exactly the keys "
                      f"{sorted(_ENTRY_KEYS)}")
        step, keyframe, base, sha256, size = (e[k] for k in ("step", "keyframe", "base",
                                                             "sha256", "bytes"))
        if (why := step_problem(i, step, entries)) is not None:
            raise bad(why)
        if type(keyframe) is not bool:
            raise bad(f"step {step}: keyframe must be true or false")
        if keyframe != (base is None) or not (base is None or type(base) is str):
            raise bad(f"step {step}: a keyframe has base null, a delta a file name")
        expected = checkpoint_file(step, delta=not keyframe)
        if version == WEIGHTS_VERSION and e["file"] == checkpoint_file(
                step, delta=not keyframe, weights=True):
            expected = e["file"]  # a weights-only step, under its own name
        if e["file"] != expected:
            raise bad(f"step {step}: file must be {expected!r}, not {reprlib.repr(e['file'])}")
        if (why := file_problem(step, sha256, size)) is not None:
            raise bad(why)
        entries.append(Checkpoint(step, expected, keyframe, base, sha256, size))
    by_file = {e.file: e for e in entries}
    reaches_keyframe: set[str] = set()
    for e in entries:  # every base is listed, and its links lead to a keyframe
        path_of_e: list[str] = []
        link = e
        while link.base is not None and link.file not in reaches_keyframe:
            path_of_e.append(link.file)
            if link.base not in by_file:
                raise bad(f"step {link.step}: base {reprlib.repr(link.base)} is not in the "
                          f"manifest")
            link = by_file[link.base]
            if len(path_of_e) > len(entries):
                raise bad(f"step {e.step}: its base links form a cycle")
        reaches_keyframe.update(path_of_e)
        if e.base is not None and by_file[e.base].weights_only != e.weights_only:
            raise bad(f"step {e.step}: its base {e.base} must be a step that "
                      f"{'keeps its model only' if e.weights_only else 'is kept whole'} too")
    return entries


def checkpoint_file(step: int, delta: bool = False, weights: bool = False) -> str:
    """The file name of ``step`` in a series: whole (keyframe) or delta, of a whole step or
    (``weights``) of one that keeps its model only."""
    return f"step_{step:012d}{'.w' if weights else ''}{'.d' if delta else ''}.ink"


class Series:
    """Checkpoints of one training run in ``directory``.

    Parameters
    ----------
    directory : str or os.PathLike
        Created if missing; an existing series is resumed from its manifest.
    policy : Policy, str or None
        Compression policy for every checkpoint (see :func:`inshrink.save`).
    keyframe_every : int
        A full (non-delta) checkpoint at least every this many checkpoints, so that restoring
        any step replays a bounded chain.
    threads : int, optional
        Encoder/decoder threads.

    Notes
    -----
    One writer at a time: :meth:`save`, :meth:`delete` and :meth:`retain` hold an exclusive
    lock on ``directory/.lock`` while they change the series and re-read the manifest under
    it (another process may have saved since this object was opened). While another process
    or object holds it they raise :class:`inshrink.errors.SeriesLockedError` without waiting;
    a caller that wants to wait catches it and retries. Reading (``load``, ``verify``...)
    takes no lock.

    A save killed midway leaves a hidden temporary file (``.step_….ink.XXXXXXXX.tmp``,
    ``.manifest.json.XXXXXXXX.tmp``) or a checkpoint file the manifest does not name. Opening
    the series and every save, delete and retain remove such files while holding the lock
    (opening skips it while another writer is at work); :meth:`verify` reports any left.
    """

    def __init__(self, directory: str | os.PathLike, policy: Policy | str | None = None, *,
                 keyframe_every: int = 10, threads: int | None = None) -> None:
        if type(keyframe_every) is not int or keyframe_every < 1:
            raise InvalidArgumentError("keyframe_every must be a positive integer")
        if not isinstance(directory, (str, os.PathLike)):
            raise InvalidArgumentError("directory must be a str or os.PathLike")
        resolve(policy)  # a bad policy fails here, not at the first save
        if threads is not None:
            resolve_threads(threads)
        self.directory = os.fspath(directory)
        self.policy = policy
        self.keyframe_every = keyframe_every
        self.threads = threads
        os.makedirs(self.directory, exist_ok=True)
        self._checkpoints = self._read_manifest()
        # what the next delta refers to: the exact tensors and the codes of the checkpoint
        # _previous_entry, valid while that is still the newest one in the manifest
        self._previous: dict[str, np.ndarray] | None = None
        self._previous_codes: dict[str, np.ndarray] | None = None
        self._previous_entry: Checkpoint | None = None
        try:  # what an interrupted writer left, unless a writer is at work right now
            with self._writing():
                pass
        except (SeriesLockedError, OSError):  # busy, or a directory we may not write to
            pass

    # -- the writer's lock -----------------------------------------------------------------

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """Hold the series' write lock, with the manifest re-read under it and what an
        interrupted writer left removed (only under the lock: never a live writer's files)."""
        fd = self._lock()
        try:
            self._checkpoints = self._read_manifest()
            if fd is not None:
                for name in self._debris():
                    remove(self._path(name))
            yield
        finally:
            if fd is not None:
                release_write_lock(fd)  # unlocks also if a forked child shares the descriptor

    def _debris(self) -> list[str]:
        """Files an interrupted save left: temporaries of the series' own files, and
        checkpoint files that the manifest does not name (written, but never listed)."""
        listed = {e.file for e in self._checkpoints}
        try:
            names = sorted(os.listdir(self.directory))
        except OSError:
            return []
        return [n for n in names if _TEMPORARY.match(n)
                or (_FILE.match(n) and n not in listed)]

    def _lock(self) -> int | None:
        """Take the exclusive lock without waiting; SeriesLockedError if someone holds it."""
        return take_lock(self.directory,
                         "is saving into this series; a series takes one writer at a time")

    # -- manifest --------------------------------------------------------------------------

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def _read_manifest(self) -> list[Checkpoint]:
        """The manifest's entries ([] if there is none); CorruptError for anything that is
        not a valid manifest (spec section 23)."""
        path = self._path(MANIFEST)
        if os.path.exists(path) and not os.path.isfile(path):
            raise CorruptError(f"{path}: the series manifest is not a file")
        raw = read_manifest(path)
        return [] if raw is None else decode_manifest(raw, path)

    def _write_manifest(self, entries: list[Checkpoint]) -> None:
        version = (WEIGHTS_VERSION if any(e.weights_only for e in entries)
                   else SERIES_VERSION)
        write_manifest(self._path(MANIFEST), SERIES_FORMAT, version, entries)
        self._checkpoints = entries

    # -- queries ---------------------------------------------------------------------------

    def steps(self) -> list[int]:
        """Saved steps, ascending."""
        return [e.step for e in self._checkpoints]

    def latest(self) -> int | None:
        """The newest saved step, or None for an empty series."""
        return self._checkpoints[-1].step if self._checkpoints else None

    def checkpoints(self) -> list[Checkpoint]:
        return list(self._checkpoints)

    def _entry(self, step: int) -> Checkpoint:
        return find_entry(self._checkpoints, step, self.directory)

    def weights_only_steps(self) -> list[int]:
        """The steps kept as their model only (:meth:`retain` with ``keep_weights``): loading
        one gives the model's tensors, not a training state."""
        return [e.step for e in self._checkpoints if e.weights_only]

    def chain(self, step: int) -> list[Checkpoint]:
        """The checkpoints a restore of ``step`` reads: its keyframe first, ``step`` last."""
        return self._chain(self._checkpoints, step)

    def _chain(self, entries: list[Checkpoint], step: int) -> list[Checkpoint]:
        by_file = {e.file: e for e in entries}
        chain = [find_entry(entries, step, self.directory)]
        while chain[-1].base is not None:
            chain.append(by_file[chain[-1].base])
            if len(chain) > len(by_file):
                raise CorruptError(f"{self.directory}: the manifest's base links form a cycle")
        return chain[::-1]

    # -- saving ----------------------------------------------------------------------------

    def save(self, step: int, tensors: Mapping[str, Any],
             metadata: Mapping[str, str] | None = None,
             importance: Mapping[str, Any] | None = None,
             policy: Policy | str | None = None,
             before_commit: Callable[[], None] | None = None) -> list[TensorInfo]:
        """Add checkpoint ``step`` (greater than every saved step); return its tensor report.

        ``policy`` replaces the series' policy for this checkpoint only; deltas work across
        checkpoints of different policies. A configuration search chooses it outside the
        series (:meth:`inshrink.search.Search.choose`; ``metadata=result.metadata()`` stores
        its report with the checkpoint).

        The checkpoint is written and the manifest switched under the lock (:class:`Series`,
        Notes): raises :class:`inshrink.errors.SeriesLockedError` if another writer holds
        it. On any failure the series is unchanged and no file of this save is left behind.
        ``before_commit`` is called once the files are written, before the manifest switch:
        what it raises fails the save (e.g. a check that the arrays did not change meanwhile).
        """
        if not isinstance(tensors, Mapping):
            raise InvalidArgumentError("tensors must be a mapping of names to arrays")
        for what, value in (("metadata", metadata), ("importance", importance)):
            if value is not None and not isinstance(value, Mapping):
                raise InvalidArgumentError(f"{what} must be a mapping or None")
        self.check_step(step)  # a valid step, after every one this object knows
        importance = dict(importance or {})
        policy = self.policy if policy is None else policy
        metadata = dict(metadata or {})
        arrays = {key: as_numpy(value) for key, value in tensors.items()}
        with self._writing():
            self.check_step(step)  # again, with the manifest as it is now
            written: list[str] = []  # files of this save, not yet named by the manifest
            try:
                report, codes, newest = self._write_checkpoint(
                    step, arrays, metadata, importance, policy, written)
                # the new checkpoint's lossless tensors decode to the caller's arrays exactly
                exact = {i.name: arrays[i.name] for i in report if i.lossless}
                entries = list(self._checkpoints)
                replaced = None
                # the chain of whole steps (never a weights-only step: they are older)
                if previous_becomes_delta([e for e in entries if not e.weights_only],
                                          self.keyframe_every):
                    replaced = entries[-1]
                    rewritten = self._rewrite_as_delta(replaced, newest, exact, codes, written)
                    entries = [replace(e, base=rewritten.file) if e.base == replaced.file
                               else e for e in entries[:-1]] + [rewritten]
                if before_commit is not None:
                    before_commit()
                self._write_manifest(entries + [newest])
            except BaseException:
                self._discard(written)
                raise
            if replaced is not None:  # only now: the manifest no longer names it
                remove(self._path(replaced.file))
            self._retain(newest, exact, codes)
        return report

    def _retain(self, newest: Checkpoint, exact: dict[str, np.ndarray],
                codes: dict[str, np.ndarray] | None) -> None:
        """Keep what the next save's delta refers to in memory, as far as it fits in
        :data:`RETAIN_BYTES` (codes first: they cost half of what they stand for); the next
        save decodes the rest back from ``newest``'s file, one tensor at a time."""
        self._previous = self._previous_codes = self._previous_entry = None  # before copying
        kept = 0 if codes is None else sum(c.nbytes for c in codes.values())
        if kept > RETAIN_BYTES:
            codes, kept = None, 0
        if kept + sum(a.nbytes for a in exact.values()) <= RETAIN_BYTES:
            # a copy: the caller may change its arrays once save returns
            retained: dict | None = {n: np.array(a, copy=True) for n, a in exact.items()}
        else:
            retained = None
        self._previous, self._previous_codes, self._previous_entry = retained, codes, newest

    def check_step(self, step: int) -> None:
        """Raise :class:`~inshrink.errors.InvalidArgumentError` unless ``step`` is after every
        step this object knows of (a caller checks before long work, such as a search)."""
        check_new_step(step)
        check_after(self._checkpoints, step, self.directory)

    def _write_checkpoint(self, step: int, arrays: dict[str, np.ndarray],
                          metadata: dict[str, str], importance: dict[str, Any],
                          policy: Policy | str | None, written: list[str]
                          ) -> tuple[list[TensorInfo], dict | None, Checkpoint]:
        """Write ``step`` as a whole file; return its report, the codes of its quantized
        tensors (None when they and what the series kept may not fit in twice
        :data:`RETAIN_BYTES`: then they are read back from the file when needed), its entry."""
        name = checkpoint_file(step)
        path = self._path(name)
        written.append(name)  # the rename may happen even if a later step of close fails
        # at most one code (2 bytes) per element, held for this save's delta and digest beside
        # what the series kept of the previous checkpoint: twice RETAIN_BYTES in all
        held = sum(a.nbytes for kept in (self._previous, self._previous_codes) if kept
                   for a in kept.values())
        keep_codes = 2 * sum(a.size for a in arrays.values()) + held <= 2 * RETAIN_BYTES
        with Writer(path, metadata, threads=self.threads, policy=policy,
                    keep_codes=keep_codes) as writer:
            for key, value in arrays.items():
                writer.add(key, value, importance=importance.get(key), wait=False)
            report = writer.close()
            codes = writer.codes
        newest = Checkpoint(step, name, True, None, file_sha256(path), os.path.getsize(path))
        return report, codes, newest

    def _discard(self, names: list[str]) -> None:
        """Remove files a failed save wrote, unless the manifest on disk names them (a
        failure after the manifest switch, e.g. an interrupt while syncing the directory)."""
        try:
            listed = {e.file for e in self._read_manifest()}
        except (InshrinkError, OSError):
            return  # leave them: the next writer's clean-up removes orphans
        for name in names:
            if name not in listed:
                remove(self._path(name))

    def _rewrite_as_delta(self, entry: Checkpoint, base: Checkpoint, base_exact: dict,
                          base_codes: dict | None, written: list[str]) -> Checkpoint:
        """Write ``entry`` (the whole file before ``base``) again as a delta file against the
        newer checkpoint ``base``. What either one decodes to and is not in memory is decoded
        from its file tensor by tensor, as the delta needs it."""
        name = checkpoint_file(entry.step, delta=True, weights=entry.weights_only)
        written.append(name)
        path = self._path(name)
        with ExitStack() as files:
            def decoded(checkpoint: Checkpoint, codes: bool) -> Decoded:
                # read, not mapped: mapped pages of the file would count as the process's
                f = files.enter_context(File(self._path(checkpoint.file), mmap=False,
                                             threads=self.threads))
                return Decoded(f, codes=codes)
            src_exact, src_codes = self._previous, self._previous_codes
            if self._previous_entry != entry:
                # resumed, or another writer saved since: what the entry holds is in its file
                # (a keyframe: it decodes alone), checked against the manifest first
                self._check_file(entry)
                src_exact = src_codes = None
            else:  # its file is read too (the index, what was not kept): it must still exist
                self._check_file(entry, content=False)
            if src_exact is None:
                src_exact = decoded(entry, codes=False)
            if src_codes is None:
                src_codes = decoded(entry, codes=True)
            if base_codes is None:
                base_codes = decoded(base, codes=True)
            write_delta(self._path(entry.file), path, src_exact=src_exact, src_codes=src_codes,
                        base_exact=base_exact, base_codes=base_codes,
                        base_file=_digest.base_reference(base.file, base_exact, base_codes))
        return Checkpoint(entry.step, name, False, base.file, file_sha256(path),
                          os.path.getsize(path))

    # -- loading ---------------------------------------------------------------------------

    def load(self, step: int | None = None) -> dict[str, np.ndarray]:
        """The tensors of ``step`` (default: the latest), as encoded."""
        if step is None:
            step = self.latest()
            if step is None:
                raise InvalidArgumentError(f"the series {self.directory} is empty")
        return self._replay(step, codes_of_last=False)[0]

    def decode_chain(self, step: int) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        """Each step of ``step``'s chain (:meth:`chain`) with its tensors, keyframe first and
        ``step`` last, each file decoded and checked once, as :meth:`load` of ``step`` decodes
        them: a caller that wants the newer steps a delta rests on too gets them on the way."""
        for entry, state, _ in replay_each(self.chain(step), self._decode_link, whole=True,
                                           codes_of_last=False):
            yield entry.step, state

    def metadata(self, step: int | None = None) -> dict[str, str]:
        """The user metadata saved with ``step`` (default: the latest)."""
        if step is None:
            step = self.latest()
            if step is None:
                raise InvalidArgumentError("the series is empty")
        entry = self._entry(step)
        self._check_file(entry, content=False)  # the index has its own checksum
        with File(self._path(entry.file)) as f:
            return f.metadata

    def _replay(self, step: int, codes_of_last: bool = True) -> tuple[dict, dict]:
        """Decode the chain of ``step``: its tensors and (unless ``codes_of_last`` is false)
        the codes of its quantized ones."""
        return replay(self.chain(step), self._decode_link, codes_of_last=codes_of_last)

    def _decode_link(self, entry: Checkpoint, previous: Checkpoint | None,
                     exact: dict[str, np.ndarray], codes: dict[str, np.ndarray], *,
                     whole: bool, with_codes: bool = True) -> tuple[dict, dict, dict]:
        """Decode one link of a chain against what the link before it decoded to (its exact
        tensors and codes), the file's hash checked first (:func:`.links.decode_link`)."""
        self._check_file(entry)
        return decode_link(self._path(entry.file), exact, codes,
                           None if previous is None else previous.file, whole=whole,
                           with_codes=with_codes, threads=self.threads)

    def _check_file(self, entry: Checkpoint, content: bool = True) -> None:
        """The file exists and (``content``) hashes to what the manifest says."""
        path = self._path(entry.file)
        if not os.path.exists(path):
            raise BaseMismatchError(f"{path}: checkpoint file of step {entry.step} is missing")
        if content and file_sha256(path) != entry.sha256:
            raise BaseMismatchError(f"{path}: content differs from the manifest "
                                    f"(step {entry.step})")

    # -- maintenance -----------------------------------------------------------------------

    def delete(self, steps: list[int]) -> list[int]:
        """Forget ``steps``, keeping every file a remaining checkpoint needs; return the
        steps whose files were removed. Holds the series' lock (:class:`Series`, Notes)."""
        if isinstance(steps, (str, bytes, Mapping)) or not hasattr(steps, "__iter__"):
            raise InvalidArgumentError("steps must be a list of integers")
        steps = list(steps)
        with self._writing():
            return self._delete(steps)

    def _delete(self, steps: list[int], entries: list[Checkpoint] | None = None,
                replaced: list[Checkpoint] = ()) -> list[int]:
        """Forget ``steps`` of ``entries`` (default: the manifest's), whose files some of
        ``replaced`` were rewritten to (these are removed once the new manifest is in
        place); return the steps whose files were removed."""
        entries = self._checkpoints if entries is None else entries
        doomed = {find_entry(entries, s, self.directory).step for s in steps}
        keep = [e for e in entries if e.step not in doomed]
        needed = {c.file for e in keep for c in self._chain(entries, e.step)}
        survivors = [e for e in entries if e.step not in doomed or e.file in needed]
        removed = [e for e in entries if e not in survivors]
        self._write_manifest(survivors)  # first the manifest, then the files
        for e in [*removed, *replaced]:
            remove(self._path(e.file))
        return [e.step for e in removed]

    def retain(self, last: int, keep_weights: int | None = None,
               model: Callable[[str], bool] | Collection[str] | None = None,
               policy: Policy | str | None = None) -> list[int]:
        """Keep the ``last`` newest steps (and what they need); delete the rest, or keep up to
        ``keep_weights`` of the steps before them as their model only.

        Parameters
        ----------
        last : int
            The newest steps kept whole: what resuming training needs.
        keep_weights : int, optional
            How many steps before those to keep as their model's tensors only. Each is
            rewritten, once, as a file of those tensors alone (``step_….w.ink``), and the
            weights-only step before it as a delta against it (``step_….w.d.ink``; a chain of
            such steps follows ``keyframe_every`` as whole steps do), atomically: the
            manifest names the new files before the old ones are removed. Older steps are
            deleted.
        model : callable or collection of str
            Which tensors are the model: a predicate on a tensor's name, or the names. Needed
            with ``keep_weights``; a step with none of them is an error (nothing is changed).
        policy : Policy or str, optional
            Encode the model's tensors again with this policy (a lossier one saves more).
            Default: as they are, bit for bit (quantized tensors keep their levels and codes).

        Returns
        -------
        list of int
            The steps deleted.

        Notes
        -----
        Rewriting a step decodes its chain once (as loading it would). A step already kept
        as its model stays as it is; a later call with a larger ``last`` cannot make it
        whole again. :meth:`weights_only_steps` lists such steps; :meth:`load` of one returns
        its model's tensors. Holds the series' lock (:class:`Series`, Notes).
        """
        if type(last) is not int or last < 1:
            raise InvalidArgumentError("last must be a positive integer")
        if keep_weights is None:
            if model is not None or policy is not None:
                raise InvalidArgumentError("model and policy are for keep_weights")
            with self._writing():  # the newest steps as they are under the lock
                return self._delete(self.steps()[:-last])
        if type(keep_weights) is not int or keep_weights < 1:
            raise InvalidArgumentError("keep_weights must be a positive integer")
        selected = _model_selector(model)
        resolve(policy)
        with self._writing():
            older = self.steps()[:-last]
            weights = older[-keep_weights:]
            entries = list(self._checkpoints)
            written: list[str] = []
            replaced: list[Checkpoint] = []
            try:
                for step in weights:  # oldest first: each becomes the others' base
                    self._add_weights_only(entries, step, selected, policy, written, replaced)
                return self._delete(older[:-keep_weights], entries, replaced)
            except BaseException:
                self._discard(written)
                raise

    def _add_weights_only(self, entries: list[Checkpoint], step: int,
                          selected: Callable[[str], bool], policy: Policy | str | None,
                          written: list[str], replaced: list[Checkpoint]) -> None:
        """Rewrite ``step`` of ``entries`` (in place) as a weights-only step, unless it is
        one, and the newest weights-only step before it, if whole, as a delta against it
        (the keyframe rule of whole steps, :mod:`.keyframes`). The files these replace go
        to ``replaced``."""
        i = next(i for i, e in enumerate(entries) if e.step == step)
        if entries[i].weights_only:
            return
        replaced.append(entries[i])
        entries[i] = new = self._rewrite_weights_only(entries[i], selected, policy, written)
        chain = [e for e in entries[:i + 1] if e.weights_only]
        if not previous_becomes_delta(chain[:-1], self.keyframe_every):
            return
        previous = chain[-2]
        with ExitStack() as files:
            f = files.enter_context(File(self._path(new.file), mmap=False,
                                         threads=self.threads))
            rewritten = self._rewrite_as_delta(previous, new, Decoded(f, codes=False),
                                               Decoded(f, codes=True), written)
        replaced.append(previous)
        entries[:] = [rewritten if e is previous else
                      replace(e, base=rewritten.file) if e.base == previous.file else e
                      for e in entries]

    def _rewrite_weights_only(self, entry: Checkpoint, selected: Callable[[str], bool],
                              policy: Policy | str | None, written: list[str]) -> Checkpoint:
        """Write the model's tensors of ``entry`` as its weights-only file; its entry."""
        tensors, codes = self._replay(entry.step)
        names = [n for n in tensors if selected(n)]
        if not names:
            raise InvalidArgumentError(f"step {entry.step}: none of its {len(tensors)} "
                                       f"tensors is the model's (model=...)")
        name = checkpoint_file(entry.step, weights=True)
        written.append(name)
        path = self._path(name)
        if policy is None:
            write_standalone(self._path(entry.file), path, names, src_exact=tensors,
                             src_codes=codes)
        else:
            with File(self._path(entry.file)) as f:
                metadata = f.metadata
            with Writer(path, metadata, threads=self.threads, policy=policy) as writer:
                for n in names:
                    writer.add(n, tensors[n], wait=False)
        return Checkpoint(entry.step, name, True, None, file_sha256(path),
                          os.path.getsize(path))

    def verify(self) -> list[str]:
        """Check every file against the manifest and its own checksums, and every delta
        against its base, decoding each link once (keyframe first); return the problems,
        including files an interrupted save left (see :class:`Series`, Notes)."""
        after: dict[str | None, list[Checkpoint]] = {}
        for e in self._checkpoints:
            after.setdefault(e.base, []).append(e)
        problems, tried = decode_each_link(
            after.get(None, []), lambda e: after.get(e.file, []), self._decode_link,
            lambda e: e.step)
        reached = {e.step for e in tried}
        for e in self._checkpoints:
            if e.step not in reached:
                problems.append(f"step {e.step}: cannot be restored: its base {e.base} "
                                f"does not lead to a readable keyframe")
        for name in self._debris():
            what = "temporary file" if name.startswith(".") else "file not in the manifest"
            problems.append(f"{name}: {what}, left by an interrupted save; the next save "
                            f"(or opening the series) removes it")
        return problems


def _model_selector(model: Callable[[str], bool] | Collection[str] | None
                    ) -> Callable[[str], bool]:
    """``model`` (a predicate on names, or the names) as a predicate."""
    if model is None:
        raise InvalidArgumentError("keep_weights needs model: which tensors are the model")
    if callable(model):
        return lambda name: bool(model(name))
    if isinstance(model, (str, bytes)) or not isinstance(model, Collection):
        raise InvalidArgumentError("model must be a predicate on tensor names or a "
                                   "collection of names")
    names = frozenset(model)
    return names.__contains__
