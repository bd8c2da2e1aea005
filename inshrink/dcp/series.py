"""A series of sharded DCP checkpoints: consecutive steps stored as per-rank deltas.

:class:`InkSeries` keeps the checkpoints of one training run, saved with ``dcp.save`` /
``dcp.async_save`` by any number of ranks, in one directory. Each step is an ordinary
:class:`inshrink.dcp.InkStorageWriter` checkpoint in a directory of its own. The newest step
is always whole; when a newer one of the same sharding is saved, each rank rewrites its file of
the previous step as a delta against its file of the new step (quantized tensors as code deltas,
lossless ones XORed: :func:`inshrink.rebase.write_delta`, as :class:`inshrink.Series` does).
Layout::

    run/
      series.json                       the manifest: every kept step, its files and bases
      step_000000000100/
          .metadata                     DCP's metadata of the step, as InkStorageWriter wrote it
          rank00000-<id>.d.ink          rank 0's file of the step, as a delta against rank 0's
          rank00001-<id>.d.ink          file of the base step (the next newer one)
      step_000000000200/
          .metadata
          rank00000-<id>.ink            the newest step: whole
          rank00001-<id>.ink

``series.json`` (``{"format": "inshrink-dcp-series", "version": 1, "checkpoints": [...]}``)
lists the steps in increasing order; each has ``step``, ``world_size``, ``layout`` (SHA-256 of
the shards each rank wrote), ``base`` (the step its files are deltas against, always a newer one
of the same world size and layout; null for a whole step) and ``files``: per rank that wrote
one, ``rank``, ``name`` (the file ``.metadata`` names), ``file`` (the file holding it now:
``name``, or ``name`` with ``.d.ink`` for a delta) and the ``sha256`` and ``bytes`` of that file.

Commit: every rank writes its file of the new step, and its delta file of the previous step
under a new name, beside the previous step's whole file; once every rank has finished, the
coordinator writes the step's ``.metadata``, then replaces ``series.json`` atomically (this one
switch commits the new step and the previous step's deltas together), then removes the
previous step's whole files. A save that fails or is killed anywhere before the switch leaves
the previous manifest, and every step it lists, as they were; the files it wrote are removed by
the next save that commits. A changed sharding (another world size, or other shards on a rank)
leaves the previous step whole: a keyframe.

One writer at a time: a save's coordinator takes an exclusive non-blocking ``flock`` on
``run/.lock`` before it reads the manifest or creates anything, and releases it once the save
has committed and removed what the new manifest no longer lists. A save by another job or
another ``InkSeries`` object meanwhile fails on every rank with
:class:`inshrink.errors.SeriesLockedError` (inside DCP's ``CheckpointException``), having
written nothing. After a save that fails once the ranks have begun writing, the
``InkSeries`` object keeps the lock until its next save ends or :meth:`InkSeries.close`.
Loading takes no lock.

The format of ``series.json`` and of the step directories is specified in spec/FORMAT.md,
section 25; every check of the manifest and of a step names its rule there (``[M-5] ...``).
The rules shared with :class:`inshrink.Series` (keyframe rule, manifest fields, links, lock)
are in :mod:`inshrink.series` (``keyframes``, ``manifest``, ``links``, ``directory``).

This module imports torch; ``import inshrink`` does not import it.

>>> series = InkSeries("run", policy="balanced", keep=5)            # doctest: +SKIP
>>> dcp.save(state, storage_writer=series.writer(step))              # doctest: +SKIP
>>> dcp.load(state, storage_reader=series.reader())                  # doctest: +SKIP
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import reprlib
import threading
import uuid
import weakref
from dataclasses import dataclass
from typing import Any, Callable, NoReturn

from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlanner, ReadItem, SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from .. import digest as _digest
from ..atomic import release_write_lock
from .calls import done, make_directory, named
from .chunkmap import MapFiles, checked, find_chunk_map
from .consolidation import checked_output, consolidate_to
from .inspect import describe_metadata
from .metadata import chunk_map_of, read_metadata_file
from .names import (CHUNK_MAP, METADATA, SERIES_MANIFEST, delta_name, is_delta_file,
                    is_rank_file, is_series_temporary, is_step_dir, is_weights_file, rank_of,
                    step_dir, weights_delta_name, weights_name)
from .reader import InkStorageReader
from .writer import InkStorageWriter
from . import weights_only
from ..errors import (BaseMismatchError, CorruptError, InshrinkError, InvalidArgumentError,
                      LimitExceededError, SeriesLockedError, UnsupportedVersionError)
from .. import strict_json
from ..encode.policy import Policy
from ..encode.policy import resolve as resolve_policy
from ..io.rebase import Decoded, write_delta
from ..io.arguments import resolve_threads
from ..io.file import File
from ..io.info import TensorInfo
from ..series.directory import remove, take_lock
from ..series.keyframes import previous_becomes_delta
from ..series.links import decode_each_link, decode_link, file_sha256, replay
from ..series.manifest import (MAX_MANIFEST_BYTES, SHA256, check_after, check_new_step,
                               file_problem, find_entry, has_exactly, read_manifest,
                               step_problem, write_manifest)

_LOG = logging.getLogger("inshrink.dcp")

__all__ = ["InkSeries", "InkSeriesWriter", "InkSeriesReader", "Step", "RankFile", "MANIFEST",
           "decode_manifest"]

MANIFEST = SERIES_MANIFEST
"""The manifest's file name (:data:`inshrink.dcp.names.SERIES_MANIFEST`), by its public name."""
FORMAT = "inshrink-dcp-series"
VERSION = 1
WEIGHTS_VERSION = 2
"""The manifest version of a series that lists a weights-only step (spec section 25.3)."""
_RESULT_FQN = "__inshrink_series__"
"""The index of the write result that carries a rank's files to the coordinator (never
stored: :meth:`InkSeriesWriter.finish` takes it out before DCP's metadata is written)."""


@dataclass(frozen=True)
class RankFile:
    """One rank's file of a step."""

    rank: int
    name: str
    """The file name the step's ``.metadata`` uses."""
    file: str
    """The file that holds it: ``name``, its ``.d.ink`` delta, or its ``.w.ink`` model only."""
    sha256: str
    bytes: int


@dataclass(frozen=True)
class Step:
    """One manifest entry: a committed step."""

    step: int
    world_size: int
    layout: str
    base: int | None
    files: tuple[RankFile, ...]

    @property
    def dir(self) -> str:
        return step_dir(self.step)

    @property
    def keyframe(self) -> bool:
        """Stored whole (not a delta)."""
        return self.base is None

    @property
    def weights_only(self) -> bool:
        """Kept as its model's items only (manifest version 2: its files are ``.w.ink``, or
        ``.w.d.ink`` deltas)."""
        return bool(self.files) and all(
            f.file == (weights_name(f.name) if self.base is None else weights_delta_name(f.name))
            for f in self.files)

    def file_of(self, rank: int) -> RankFile | None:
        return next((f for f in self.files if f.rank == rank), None)


def _fail(rule: str, path: str, why: str, error: type[InshrinkError] = CorruptError
          ) -> NoReturn:
    """Raise the error of a rule of spec/FORMAT.md section 25 (its id first in the message)."""
    raise error(f"[{rule}] {path}: invalid DCP series manifest: {why}")


def decode_manifest(raw: bytes, path: str = SERIES_MANIFEST) -> list[Step]:
    """The steps of the bytes of a ``series.json`` (rules M-1 ... M-16)."""
    if len(raw) > MAX_MANIFEST_BYTES:
        _fail("M-1", path, f"larger than {MAX_MANIFEST_BYTES} bytes", LimitExceededError)
    try:
        doc = strict_json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        _fail("M-1", path, f"not JSON ({reprlib.repr(str(exc))})")
    return parse_manifest(doc, path)


def parse_manifest(doc: Any, path: str = SERIES_MANIFEST) -> list[Step]:
    """The steps of a decoded ``series.json``, every field checked (rules M-2 ... M-16);
    CorruptError naming ``path`` otherwise (UnsupportedVersionError for another version,
    BaseMismatchError for a delta against a step of another sharding)."""
    if type(doc) is not dict or doc.get("format") != FORMAT:
        _fail("M-2", path, f"not an object with format {FORMAT!r}")
    if type(doc.get("version")) is not int:
        _fail("M-3", path, "version must be an integer")
    if doc["version"] not in (VERSION, WEIGHTS_VERSION):
        _fail("M-3", path, f"version {doc['version']}; this reader reads versions {VERSION} "
                           f"and {WEIGHTS_VERSION}", UnsupportedVersionError)
    version = doc["version"]
    if set(doc) != {"format", "version", "checkpoints"} or type(doc["checkpoints"]) is not list:
        _fail("M-4", path, "must have exactly the members checkpoints, format, version, "
                           "checkpoints a list")
    steps: list[Step] = []
    for i, e in enumerate(doc["checkpoints"]):
        if not has_exactly(e, {"step", "world_size", "layout", "base", "files"}):
            _fail("M-5", path, f"checkpoint {i} must have exactly the keys base, files, layout, "
                               f"step, world_size")
        step, world, layout, base = e["step"], e["world_size"], e["layout"], e["base"]
        if (why := step_problem(i, step, steps)) is not None:
            _fail("M-6", path, why)
        if type(world) is not int or world < 1:
            _fail("M-7", path, f"step {step}: world_size must be a positive integer")
        if type(layout) is not str or not SHA256.match(layout):
            _fail("M-8", path, f"step {step}: layout must be 64 lowercase hexadecimal digits")
        if base is not None and (type(base) is not int or base <= step):
            _fail("M-9", path, f"step {step}: base must be null or a later step")
        if type(e["files"]) is not list:
            _fail("M-10", path, f"step {step}: files must be a list")
        files: list[RankFile] = []
        weights = False  # a weights-only step (version 2): its files are .w.ink
        for f in e["files"]:
            if not has_exactly(f, {"rank", "name", "file", "sha256", "bytes"}):
                _fail("M-10", path, f"step {step}: a file must have exactly the keys bytes, "
                                    f"file, name, rank, sha256")
            rank, name = f["rank"], f["name"]
            if type(rank) is not int or not 0 <= rank < world or any(
                    g.rank == rank for g in files):
                _fail("M-11", path, f"step {step}: rank {reprlib.repr(rank)} is not a distinct "
                                    f"rank below {world}")
            if not is_rank_file(name) or rank_of(name) != rank:
                _fail("M-12", path, f"step {step}: {reprlib.repr(name)} is not a file name of "
                                    f"rank {rank}")
            if version == WEIGHTS_VERSION and not files:  # the first file says for the step
                weights = f["file"] == (weights_name(name) if base is None
                                        else weights_delta_name(name))
            if base is None:
                expected = weights_name(name) if weights else name
            else:
                expected = weights_delta_name(name) if weights else delta_name(name)
            if f["file"] != expected:
                _fail("M-13", path, f"step {step}: rank {rank}'s file must be {expected!r}")
            if (why := file_problem(step, f["sha256"], f["bytes"])) is not None:
                _fail("M-14", path, why)
            files.append(RankFile(rank, name, expected, f["sha256"], f["bytes"]))
        steps.append(Step(step, world, layout, base, tuple(files)))
    by_step = {s.step: s for s in steps}
    for s in steps:  # bases are later steps, so following them always ends at a whole one
        if s.base is None:
            continue
        base = by_step.get(s.base)
        if base is None:
            _fail("M-15", path, f"step {s.step}: base step {s.base} is not in the manifest")
        if base.weights_only != s.weights_only:
            _fail("M-15", path, f"step {s.step}: base step {s.base} "
                                f"{'keeps its model only' if base.weights_only else 'is whole'}"
                                f"; a delta's base must be of its kind")
        if base.world_size != s.world_size or base.layout != s.layout or (
                {f.rank for f in base.files} != {f.rank for f in s.files}):
            first = os.path.join(s.dir, s.files[0].file) if s.files else s.dir
            raise BaseMismatchError(
                f"[M-16] {path}: {first} (step {s.step}, {s.world_size} ranks) is a delta "
                f"against step {base.step}, saved by {base.world_size} ranks with another "
                f"sharding: a delta needs the same sharding")
    return steps


def _layout(plans: list[SavePlan]) -> str:
    """SHA-256 of what every rank writes: per rank, each item's name, kind, offsets and
    sizes. Two saves with equal layouts have rank files that pair up tensor by tensor."""
    ranks = []
    for plan in plans:
        items = []
        for item in plan.items:
            chunk = item.tensor_data.chunk if item.tensor_data is not None else None
            items.append([item.index.fqn, item.type.name,
                          None if chunk is None else [int(d) for d in chunk.offsets],
                          None if chunk is None else [int(d) for d in chunk.sizes],
                          None if item.tensor_data is None
                          else str(item.tensor_data.properties.dtype)])
        ranks.append(items)
    return hashlib.sha256(json.dumps(ranks).encode()).hexdigest()


@dataclass(frozen=True)
class _Task:
    """What the coordinator asks one rank to do (its plan's storage_data)."""

    file: str
    previous: tuple[str, str] | None
    """The previous step's whole file of this rank to rewrite as a delta: (path from the
    series directory, the manifest's SHA-256 of it)."""
    models: tuple = ()
    """The files of steps leaving the ``keep`` newest that this rank rewrites as their
    model's items: (step, the file's rank, its kept (stored name, FQN) pairs, and the newest
    weights-only step's file of that rank to rewrite as a delta against it: (its step, its
    RankFile), or None) each."""


@dataclass(frozen=True)
class _Written:
    """What one rank wrote (carried to the coordinator in a write result)."""

    rank: int
    whole: RankFile | None
    delta: RankFile | None
    models: tuple[tuple[int, RankFile], ...] = ()
    """The weights-only files written: (step, its file) each."""
    chained: tuple[tuple[int, RankFile], ...] = ()
    """The weights-only steps' files rewritten as deltas: (step, its delta file) each."""


class InkSeries:
    """The sharded checkpoints of one training run, in ``directory``.

    Every rank creates the same ``InkSeries``; ``dcp.save`` and ``dcp.load`` then take a
    writer and a reader from it.

    Parameters
    ----------
    directory : str or os.PathLike
        The series directory (created if missing); an existing series is resumed.
    policy : Policy, str or None
        Compression per shard, as for :class:`inshrink.dcp.InkStorageWriter` (``None``:
        lossless, every step restores bit-exact).
    keyframe_every : int
        A step stays whole (a keyframe) at least every this many steps, so that restoring any
        step decodes at most this many files per rank.
    keep : int or None
        Keep only the newest ``keep`` steps (older ones are removed when a new step commits);
        ``None`` keeps every step.
    threads : int, optional
        Encoder/decoder threads per rank (default: every core).
    keep_weights : int, optional
        With ``keep``: also keep this many steps before the ``keep`` newest as their model's
        items only (a weights-only step). A step leaving the ``keep`` newest is rewritten
        once, in the save that makes it leave: every rank writes its file of it again with
        those items only (``rank…-<id>.w.ink``, decoded through its chain: bit for bit as
        stored, unless ``weights_policy``), the manifest switch commits them with the new
        step, and the step's ``.metadata`` and chunk map then describe those items only.
    model : callable, optional
        Which items are the model's, by fully-qualified name (default: those under
        ``model.``, as ``{"model": ..., "optim": ...}`` states name them). With DCP's
        process-based ``async_save``, which pickles the writer, a module-level function
        (not a lambda).
    weights_policy : Policy, str or None
        Encode the weights-only steps' items again with this policy.

    Notes
    -----
    One writer at a time: a save's coordinator (the process, or ``dcp.async_save``'s
    background thread or process, that writes ``series.json``) holds an exclusive
    non-blocking ``flock`` on ``directory/.lock`` from before it reads the manifest until the
    save has committed. Meanwhile a save through another ``InkSeries`` object or another job
    fails on every rank, before it writes anything, with
    :class:`inshrink.errors.SeriesLockedError` (``dcp.save`` raises DCP's
    ``CheckpointException`` carrying it); it never waits. DCP tells a storage writer nothing
    when a save fails after planning (a rank's write failed), so then this object keeps the
    lock until its next save ends or :meth:`close` (or ``with``'s end, its garbage collection,
    the end of its process). Loading takes no lock. One save at a time through one object
    (with ``dcp.async_save``, wait for the previous future before the next save), and no load
    while a save runs: a save removes the whole files of the step before it once its deltas
    are committed. Steps of another
    sharding (world size, or the shards each rank holds) are saved whole and start a new
    chain; any step loads into any world size (DCP reshards).

    Examples
    --------
    >>> series = InkSeries("ckpt", policy="balanced", keyframe_every=10, keep=20)  # doctest: +SKIP
    >>> dcp.save(state, storage_writer=series.writer(step))                     # doctest: +SKIP
    >>> dcp.load(state, storage_reader=series.reader())      # the latest step  # doctest: +SKIP
    """

    def __init__(self, directory: str | os.PathLike, policy: Policy | str | None = None, *,
                 keyframe_every: int = 10, keep: int | None = None,
                 threads: int | None = None, keep_weights: int | None = None,
                 model: Callable[[str], bool] | None = None,
                 weights_policy: Policy | str | None = None) -> None:
        if not isinstance(directory, (str, os.PathLike)):
            raise InvalidArgumentError("directory must be a str or os.PathLike")
        if type(keyframe_every) is not int or keyframe_every < 1:
            raise InvalidArgumentError("keyframe_every must be a positive integer")
        if keep is not None and (type(keep) is not int or keep < 1):
            raise InvalidArgumentError("keep must be a positive integer or None")
        if keep_weights is not None and (type(keep_weights) is not int or keep_weights < 1
                                         or keep is None):
            raise InvalidArgumentError("keep_weights must be a positive integer, with keep")
        if model is not None and not callable(model):
            raise InvalidArgumentError("model must be a predicate on an item's name")
        resolve_policy(policy)  # a bad policy fails here, not in the middle of a save
        resolve_policy(weights_policy)
        self.keep_weights = keep_weights
        self.model = model if model is not None else weights_only.is_model_item
        self.weights_policy = weights_policy
        self.directory = os.fspath(directory)
        self.policy = policy
        self.keyframe_every = keyframe_every
        self.keep = keep
        self.threads = resolve_threads(threads)
        self._lock_state()

    # -- the writer's lock -----------------------------------------------------------------

    def _lock_state(self) -> None:
        self._guard = threading.Lock()  # async saves plan in a thread of their own
        self._lock_fd: int | None = None
        self._unlock: weakref.finalize | None = None

    def __getstate__(self) -> dict:
        # a copy (DCP's process-based async_save pickles the writer) takes a lock of its own
        state = self.__dict__.copy()
        for name in ("_guard", "_lock_fd", "_unlock"):
            del state[name]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock_state()

    def _hold_lock(self) -> None:
        """Take the series' write lock for this object, unless it holds it already (a save
        of its own failed before its commit); SeriesLockedError at once if another object or
        process holds it."""
        with self._guard:
            if self._lock_fd is not None:
                return
            os.makedirs(self.directory, exist_ok=True)
            fd = take_lock(self.directory, "holds this DCP series; it takes one writer at a "
                                           "time (close() the other InkSeries, or end its job)")
            if fd is None:  # no flock on this platform
                return
            self._lock_fd = fd
            self._unlock = weakref.finalize(self, release_write_lock, fd, os.getpid())

    def close(self) -> None:
        """Release the write lock if this object holds it (after a save that failed before
        its commit): another ``InkSeries`` or job may then save into the series. The object
        can still load, and save again."""
        self._release_lock()

    def _release_lock(self) -> None:
        with self._guard:
            if self._unlock is not None:
                self._unlock()
            self._lock_fd, self._unlock = None, None

    def __enter__(self) -> "InkSeries":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the manifest ----------------------------------------------------------------------

    def _path(self, *names: str) -> str:
        return os.path.join(self.directory, *names)

    def checkpoints(self) -> list[Step]:
        """The committed steps, oldest first ([] for a new series)."""
        path = self._path(SERIES_MANIFEST)
        raw = read_manifest(path)
        return [] if raw is None else decode_manifest(raw, path)

    def _write_manifest(self, steps: list[Step]) -> None:
        version = WEIGHTS_VERSION if any(s.weights_only for s in steps) else VERSION
        write_manifest(self._path(SERIES_MANIFEST), FORMAT, version, steps)

    def steps(self) -> list[int]:
        """The committed steps, ascending (weights-only ones included)."""
        return [s.step for s in self.checkpoints()]

    def weights_only_steps(self) -> list[int]:
        """The committed steps kept as their model's items only (``keep_weights``)."""
        return [s.step for s in self.checkpoints() if s.weights_only]

    def latest(self) -> int | None:
        """The newest committed step, or None for an empty series."""
        steps = self.checkpoints()
        return steps[-1].step if steps else None

    def entry(self, step: int | None = None) -> Step:
        """The manifest entry of ``step`` (default: the latest)."""
        steps = self.checkpoints()
        if step is None:
            if not steps:
                raise InvalidArgumentError(f"the series {self.directory} is empty")
            return steps[-1]
        return find_entry(steps, step, self.directory)

    # -- saving and loading ----------------------------------------------------------------

    def writer(self, step: int) -> "InkSeriesWriter":
        """A storage writer that adds ``step`` (after every committed step) to the series:
        ``dcp.save(state, storage_writer=series.writer(step))``."""
        check_new_step(step)
        check_after(self.checkpoints(), step, f"the series {self.directory}")
        return InkSeriesWriter(self, step)

    def reader(self, step: int | None = None) -> "InkSeriesReader":
        """A storage reader of ``step`` (default: the latest), into any world size:
        ``dcp.load(state, storage_reader=series.reader(step))``."""
        return InkSeriesReader(self, self.entry(step).step)

    def chain(self, step: int, rank: int) -> list[tuple[Step, RankFile]]:
        """The files a restore of ``rank``'s file of ``step`` decodes, the whole one first."""
        by_step = {s.step: s for s in self.checkpoints()}
        entry = by_step.get(step)
        if entry is None:
            raise InvalidArgumentError(f"step {step} is not in the series {self.directory}")
        chain = []
        while True:
            file = entry.file_of(rank)
            if file is None:
                raise InvalidArgumentError(f"{self._path(SERIES_MANIFEST)}: step {entry.step} "
                                           f"has no file of rank {rank}")
            chain.append((entry, file))
            if entry.base is None:
                return chain[::-1]
            entry = by_step[entry.base]

    def decode(self, step: int, rank: int) -> dict:
        """Decode ``rank``'s file of ``step`` through its chain, checking every file against
        the manifest and every delta against its base; tensors by stored name."""
        return replay(self.chain(step, rank), self._decode_link, codes_of_last=False)[0]

    def _decode_link(self, link: tuple[Step, RankFile], previous: tuple[Step, RankFile] | None,
                     exact: dict, codes: dict, *, whole: bool, with_codes: bool
                     ) -> tuple[dict, dict, dict]:
        """One file of a chain, checked against the manifest, decoded against what the file
        before it (``previous``) decoded to (:func:`inshrink.series.links.decode_link`)."""
        path = self._path(link[0].dir, link[1].file)
        self._check_file(path, link[1])
        base = None if previous is None else os.path.join(previous[0].dir, previous[1].file)
        return named(path, lambda: decode_link(path, exact, codes, base, whole=whole,
                                                with_codes=with_codes, threads=self.threads))

    def _check_file(self, path: str, file: RankFile) -> None:
        if not os.path.isfile(path):
            raise CorruptError(f"[M-18] {path}: missing (named by "
                               f"{self._path(SERIES_MANIFEST)})")
        if file_sha256(path) != file.sha256:
            raise BaseMismatchError(f"[M-19] {path}: content differs from "
                                    f"{self._path(SERIES_MANIFEST)}")

    # -- retention -------------------------------------------------------------------------

    def _retention(self, steps: list[Step]) -> tuple[set[int] | None, set[int]]:
        """For the save of a new step after ``steps``: the older steps it keeps (None:
        all), and those that leave the ``keep`` newest to become weights-only."""
        if self.keep is None:
            return None, set()
        whole = [s.step for s in steps if not s.weights_only]
        kept = whole[-(self.keep - 1):] if self.keep > 1 else []
        if self.keep_weights is None:
            return set(kept), set()
        gone = whole[:len(whole) - len(kept)]
        models = sorted({s.step for s in steps if s.weights_only} | set(gone))
        models = models[-self.keep_weights:]
        return set(kept) | set(models), {s for s in gone if s in models}

    def _model_jobs(self, steps: list[Step], leaving: set[int], keep: set[int] | None,
                    world: int) -> list[tuple]:
        """Per rank of a save of ``world`` ranks, the weights-only rewrites it does: each
        file of a step ``leaving`` goes to the rank of its own number modulo ``world``, with
        (when one step leaves) the newest weights-only step's file of that rank, if that step
        is whole and kept, to rewrite as a delta against it (the keyframe rule of whole
        steps, with the same sharding)."""
        jobs: list[list] = [[] for _ in range(world)]
        models = [e for e in steps if e.weights_only]
        chained = None
        if len(leaving) == 1 and models:
            (step,) = leaving
            new = next(e for e in steps if e.step == step)
            older = [e for e in models if e.step < step]
            if older and (keep is None or older[-1].step in keep) and previous_becomes_delta(
                    older, self.keyframe_every,
                    compatible=(older[-1].world_size, older[-1].layout) == (
                        new.world_size, new.layout)):
                chained = older[-1]
        for entry in steps:
            if entry.step not in leaving:
                continue
            path = self._path(entry.dir)
            metadata = read_metadata_file(path)
            _check_metadata_files(metadata, entry, path)
            kept: dict[str, list[tuple[str, str]]] = {}
            for index, e in metadata.storage_data.items():
                if self.model(index.fqn):
                    kept.setdefault(e["file"], []).append((e["tensor"], index.fqn))
            if not kept:
                raise InvalidArgumentError(f"{path}: none of its items is the model's "
                                           f"(model=...); it cannot be kept as weights only")
            for file in entry.files:
                previous = None if chained is None else chained.file_of(file.rank)
                jobs[file.rank % world].append((
                    entry.step, file.rank, tuple(sorted(kept.get(file.name, []))),
                    None if previous is None else (chained.step, previous)))
        return [tuple(j) for j in jobs]

    def _describe_kept(self, steps: list[Step]) -> None:
        """Make each weights-only step's ``.metadata`` and chunk map describe only what its
        files hold (after the manifest switch that committed them; again at a later save if
        a crash came between)."""
        for entry in steps:
            if not entry.weights_only:
                continue
            try:
                kept = {}
                for f in entry.files:
                    with File(self._path(entry.dir, f.file), threads=1, mmap=False) as opened:
                        kept[f.name] = set(opened.keys())
                weights_only.kept_items(self._path(entry.dir), kept)
            except (InshrinkError, OSError) as exc:  # the step is committed: say, go on
                _LOG.warning("%s: its .metadata still describes the whole step (%s); the "
                             "next save tries again", self._path(entry.dir), exc)

    # -- inspection ------------------------------------------------------------------------

    def describe(self, step: int | None = None) -> list[dict]:
        """What :func:`inshrink.dcp.describe` says of a step's chunks; ``file`` names the file
        that holds each chunk now (a ``.d.ink`` delta for an older step), ``stored_bytes`` is
        its size there, ``error`` the error measured when the step was saved."""
        entry = self.entry(step)
        path = self._path(entry.dir)
        metadata = read_metadata_file(path)
        _check_metadata_files(metadata, entry, path)
        return describe_metadata(metadata, path, {f.name: f.file for f in entry.files})

    def consolidate(self, step: int, out: str | os.PathLike, *,
                    policy: Policy | str | None = None) -> list[TensorInfo]:
        """Join the shards of ``step`` into one unsharded file, as
        :func:`inshrink.dcp.consolidate` does for one checkpoint (an older step is decoded
        through its chain, one rank file at a time in memory)."""
        out = checked_output(out, policy)
        entry = self.entry(step)
        path = self._path(entry.dir)
        metadata = read_metadata_file(path)
        _check_metadata_files(metadata, entry, path)
        layout = checked(chunk_map_of(metadata), os.path.join(path, METADATA))
        return consolidate_to(out, path, layout, _SeriesFiles(self, entry), policy,
                              self.threads)

    def verify(self) -> list[str]:
        """Decode every file of every step, checking every checksum, every hash the manifest
        holds and every base digest (each file once: from each whole step back along the
        deltas against it); return the problems found (none: the series is whole), files an
        interrupted save left included."""
        steps = self.checkpoints()
        problems = []
        for entry in steps:
            path = self._path(entry.dir)
            try:
                _check_metadata_files(read_metadata_file(path), entry, path)
                if entry.weights_only:  # its .metadata names only what its files hold (M-20)
                    self.describe(entry.step)
            except (InshrinkError, OSError) as exc:
                problems.append(f"step {entry.step}: {exc}")
        after: dict[int | None, list[Step]] = {}
        for entry in steps:
            after.setdefault(entry.base, []).append(entry)
        for rank in sorted({f.rank for entry in steps for f in entry.files}):
            def links(base: int | None) -> list[tuple[Step, RankFile]]:
                return [(e, e.file_of(rank)) for e in after.get(base, []) if e.file_of(rank)]
            found, tried = decode_each_link(links(None), lambda link: links(link[0].step),
                                            self._decode_link, lambda link: link[0].step)
            problems += found
            reached = {entry.step for entry, _ in tried}
            for entry in steps:  # not tried: what its base needs failed (reported above)
                if entry.file_of(rank) and entry.step not in reached:
                    problems.append(f"step {entry.step}: rank {rank}'s file cannot be restored: "
                                    f"its base step {entry.base} does not decode")
        for name in self._debris(steps):
            problems.append(f"{self._path(name)}: not in {SERIES_MANIFEST}, left by an "
                            f"interrupted save; the next save removes it")
        return problems

    def _debris(self, steps: list[Step]) -> list[str]:
        """Paths (from the directory) that no committed step uses: what failed or
        interrupted saves left, and the files a commit replaced."""
        listed = {s.dir: {f.file for f in s.files} | {METADATA} for s in steps}
        out = []
        try:
            names = sorted(os.listdir(self.directory))
        except OSError:
            return []
        for name in names:
            if is_series_temporary(name):
                out.append(name)
            elif is_step_dir(name):
                if name not in listed:
                    out.append(name)
                    continue
                try:
                    inside = sorted(os.listdir(self._path(name)))
                except OSError:
                    continue
                out += [os.path.join(name, n) for n in inside if n not in listed[name] and (
                    is_rank_file(n) or is_delta_file(n) or is_weights_file(n)
                    or is_series_temporary(n))]
        return out


class _SeriesFiles(MapFiles):
    """The stored tensors of a series step, each rank file decoded through its chain once."""

    def __init__(self, series: InkSeries, entry: Step) -> None:
        super().__init__(series._path(entry.dir), series.threads)
        self.series, self.entry = series, entry
        self.rank: int | None = None
        self.arrays: dict = {}

    def file_of(self, file: str) -> str:
        return os.path.join(self.path, next(f.file for f in self.entry.files if f.name == file))

    def read(self, file: str, tensor: str) -> Any:
        rank = next(f.rank for f in self.entry.files if f.name == file)
        if rank != self.rank:  # one decoded rank file at a time
            self.arrays, self.rank = {}, None
            self.arrays, self.rank = self.series.decode(self.entry.step, rank), rank
        if tensor not in self.arrays:
            raise CorruptError(f"[M-20] {self.file_of(file)}: no tensor named {tensor!r}, "
                               f"which {METADATA} names")
        return self.arrays[tensor]

    def close(self) -> None:
        self.arrays, self.rank = {}, None


def _check_metadata_files(metadata: Metadata, entry: Step, path: str) -> None:
    """The step's ``.metadata``, and its chunk map if it has one, name exactly the rank files
    the manifest lists for it."""
    named = {e["file"] for e in metadata.storage_data.values()}
    listed = {f.name for f in entry.files}
    if named != listed:
        odd = sorted(named ^ listed)[0]
        raise CorruptError(f"[M-17] {os.path.join(path, odd)}: {METADATA} and the series "
                           f"manifest disagree on the step's rank files (one names it, the "
                           f"other does not)")
    layout = find_chunk_map(path, check_files=False)
    if layout is not None and set(layout.files) != listed:
        odd = sorted(set(layout.files) ^ listed)[0]
        raise CorruptError(f"[M-17] {os.path.join(path, odd)}: {CHUNK_MAP} and the series "
                           f"manifest disagree on the step's rank files (one names it, the "
                           f"other does not)")


class InkSeriesWriter(InkStorageWriter):
    """The storage writer of one step of an :class:`InkSeries` (from
    :meth:`InkSeries.writer`). Writes the step as :class:`inshrink.dcp.InkStorageWriter`
    does, into the step's directory; each rank also rewrites its file of the previous step
    as a delta against its new file, and the coordinator commits both in the manifest."""

    def __init__(self, series: InkSeries, step: int) -> None:
        super().__init__(series._path(step_dir(step)), policy=series.policy,
                         threads=series.threads)
        self.series = series
        self.step = step
        self._pending: tuple[str, Step | None] | None = None  # the coordinator's decision

    def _refuse_incomplete(self) -> None:
        pass  # an older step's rank files are deltas: read_metadata checks the manifest's

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id and os.fspath(checkpoint_id) != self.path:
            raise InvalidArgumentError(f"a series writer saves into {self.path}; no "
                                       f"checkpoint_id")
        super().reset()

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        # the step's directory is made by the coordinator once it holds the lock: a save
        # refused for another writer leaves nothing behind
        step_path, self.path = self.path, self.series.directory
        try:
            return super().prepare_local_plan(plan)  # checks the names; makes the series dir
        finally:
            self.path = step_path

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        self.series._hold_lock()  # before reading the manifest: it may not change under us
        try:
            return self._plan(plans)
        except BaseException:
            self.series._release_lock()  # nothing is written yet
            raise

    def _plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        plans = super().prepare_global_plan(plans)
        steps = self.series.checkpoints()
        check_after(steps, self.step, f"the series {self.series.directory}")
        layout = _layout(plans)
        same_sharding = bool(steps) and (steps[-1].world_size, steps[-1].layout) == (
            len(plans), layout)
        previous = steps[-1] if previous_becomes_delta(
            steps, self.series.keyframe_every, compatible=same_sharding) else None
        keep, leaving = self.series._retention(steps)
        if previous is not None and previous.step in leaving:
            previous = None  # rewritten as its model from its whole file: no delta first
        models = self.series._model_jobs(steps, leaving, keep, len(plans))
        self._pending = (layout, previous, keep, leaving)
        tasks = []
        for rank, plan in enumerate(plans):
            old = None if previous is None else previous.file_of(rank)
            tasks.append(dataclasses.replace(plan, storage_data=_Task(
                plan.storage_data, None if old is None else (
                    os.path.join(previous.dir, old.file), old.sha256), models[rank])))
        make_directory(self.path, "step directory")
        return tasks

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        task = plan.storage_data
        if not isinstance(task, _Task) or not is_rank_file(task.file):
            raise InvalidArgumentError("the save plan was not prepared by InkSeriesWriter")
        whole = delta = None
        results: list[WriteResult] = []
        if plan.items:  # a rank with nothing to save writes no file
            os.makedirs(self.path, exist_ok=True)  # the coordinator's, unless not shared yet
            results, exact, codes = self._write_rank_file(plan.items, planner, task.file,
                                                          keep_codes=True)
            path = os.path.join(self.path, task.file)
            whole = RankFile(self.rank, task.file, task.file, file_sha256(path),
                             os.path.getsize(path))
            if task.previous is not None:
                delta = self._rewrite_previous(task, exact, codes or {})
        models, chained = [], []
        for step, rank, kept, previous in task.models:
            try:
                file = self._rewrite_model(step, rank, kept)
                models.append((step, file))
                if previous is not None:
                    chained.append((previous[0], self._chain_model(step, file, *previous)))
            except InshrinkError as exc:  # a damaged step is dropped, not kept; saves go on
                _LOG.warning("step %d of %s: rank %d's file cannot be kept as its model "
                             "(%s); the step is removed", step, self.series.directory, rank,
                             exc)
        results.append(WriteResult(index=MetadataIndex(_RESULT_FQN), size_in_bytes=0,
                                   storage_data=_Written(self.rank, whole, delta,
                                                         tuple(models), tuple(chained))))
        return done(results)

    def _chain_model(self, step: int, file: RankFile, older: int, previous: RankFile
                     ) -> RankFile:
        """Write the weights-only file ``previous`` of step ``older`` again as a delta
        against ``file``, the same rank's new weights-only file of ``step`` (checked against
        the manifest first, as :meth:`_rewrite_previous` checks its source)."""
        series = self.series
        source = series._path(step_dir(older), previous.file)
        series._check_file(source, previous)
        base = series._path(step_dir(step), file.file)
        target = series._path(step_dir(older), weights_delta_name(previous.name))
        with named(base, lambda: File(base, threads=1, mmap=False)) as b, \
                named(source, lambda: File(source, threads=1, mmap=False)) as f:
            exact, codes = Decoded(b, codes=False), Decoded(b, codes=True)
            named(source, lambda: write_delta(
                source, target, src_exact=Decoded(f, codes=False),
                src_codes=Decoded(f, codes=True), base_exact=exact, base_codes=codes,
                base_file=_digest.base_reference(
                    os.path.join(step_dir(step), file.file), exact, codes)))
        return RankFile(previous.rank, previous.name, weights_delta_name(previous.name),
                        file_sha256(target), os.path.getsize(target))

    def _rewrite_model(self, step: int, rank: int, kept: tuple[tuple[str, str], ...]
                       ) -> RankFile:
        """Write ``rank``'s file of ``step`` again as its ``kept`` tensors only (the
        ``.w.ink`` file beside it), decoded through its chain, every file of which is checked
        against the manifest."""
        series = self.series
        chain = series.chain(step, rank)
        entry, file = chain[-1]
        source = series._path(entry.dir, file.file)
        exact, codes = replay(chain, series._decode_link, codes_of_last=True)
        target = series._path(entry.dir, weights_name(file.name))
        with named(source, lambda: File(source, threads=1, mmap=False)) as f:
            metadata = f.metadata
        named(source, lambda: weights_only.write_kept(
            source, target, kept, metadata, series.weights_policy, series.threads,
            decoded=exact, codes=codes))
        return RankFile(file.rank, file.name, weights_name(file.name), file_sha256(target),
                        os.path.getsize(target))

    def _rewrite_previous(self, task: _Task, exact: dict, codes: dict) -> RankFile | None:
        """Write this rank's file of the previous step again, as a delta against the file
        just written, under its delta name (the manifest switch makes it the step's file).
        None if that file is not what the manifest says: a damaged file is never made a
        delta, and the new step is saved all the same (the previous step stays whole, and
        :meth:`InkSeries.verify` and loading it report the damage)."""
        old, sha256 = task.previous
        source = self.series._path(old)
        if not os.path.isfile(source) or file_sha256(source) != sha256:
            return None
        target = delta_name(source)
        base = os.path.join(step_dir(self.step), task.file)
        # the previous file decodes tensor by tensor as the delta needs it, so the rewrite
        # holds one of its tensors at a time; read, not mapped: mapped pages would count
        # as the process's
        with named(source, lambda: File(source, threads=1, mmap=False)) as f:
            named(source, lambda: write_delta(
                source, target, src_exact=Decoded(f, codes=False),
                src_codes=Decoded(f, codes=True), base_exact=exact, base_codes=codes,
                base_file=_digest.base_reference(base, exact, codes)))
        name = os.path.basename(old)
        return RankFile(self.rank, name, delta_name(name), file_sha256(target),
                        os.path.getsize(target))

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        try:
            self._commit(metadata, results)
        finally:  # the save is over, committed or not: another writer may save
            self.series._release_lock()

    def _commit(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        written = {}
        kept = []
        for rank_results in results:
            for result in rank_results:
                if isinstance(result.storage_data, _Written):
                    written[result.storage_data.rank] = result.storage_data
            kept.append([r for r in rank_results if not isinstance(r.storage_data, _Written)])
        if self._pending is None:
            raise InvalidArgumentError("finish before prepare_global_plan")
        layout, previous, keep, leaving = self._pending
        super().finish(metadata, kept)  # the step's .metadata: all its rank files are in place
        steps = self.series.checkpoints()
        check_after(steps, self.step, f"the series {self.series.directory}")
        replaced = []
        if previous is not None:
            if not steps or steps[-1] != previous:
                raise SeriesLockedError(f"{self.series.directory}: another save through this "
                                        f"InkSeries changed the series during this one")
            deltas = tuple(w.delta for _, w in sorted(written.items()) if w.delta is not None)
            if len(deltas) == len(previous.files):  # else a file was damaged: stays whole
                steps[-1] = dataclasses.replace(previous, base=self.step, files=deltas)
                replaced = [os.path.join(previous.dir, f.file) for f in previous.files]
        models: dict[int, list[RankFile]] = {}
        chained: dict[int, list[RankFile]] = {}
        for _, w in sorted(written.items()):
            for step, file in w.models:
                models.setdefault(step, []).append(file)
            for step, file in w.chained:
                chained.setdefault(step, []).append(file)
        rewritten = set()
        for i, entry in enumerate(steps):
            if entry.step not in leaving:
                continue
            if len(models.get(entry.step, ())) == len(entry.files):
                steps[i] = dataclasses.replace(entry, base=None, files=tuple(
                    sorted(models[entry.step], key=lambda f: f.rank)))
                replaced += [os.path.join(entry.dir, f.file) for f in entry.files]
                rewritten.add(entry.step)
            else:  # a file could not be rewritten: the step goes, as without keep_weights
                keep = keep - {entry.step}
        for i, entry in enumerate(steps):  # the newest weights-only step, now a delta
            if entry.step in chained and len(chained[entry.step]) == len(entry.files) and (
                    rewritten):
                steps[i] = dataclasses.replace(entry, base=min(rewritten), files=tuple(
                    sorted(chained[entry.step], key=lambda f: f.rank)))
                replaced += [os.path.join(entry.dir, f.file) for f in entry.files]
        files = tuple(w.whole for _, w in sorted(written.items()) if w.whole is not None)
        steps.append(Step(self.step, len(results), layout, None, files))
        if keep is not None:  # a base is always newer: older ones can go
            steps = [s for s in steps if s.step in keep or s.step == self.step]
        self.series._write_manifest(steps)
        for name in replaced + self.series._debris(steps):  # only now: nothing lists them
            remove(self.series._path(name), tree=True)
        self.series._describe_kept(steps)


class InkSeriesReader(InkStorageReader):
    """The storage reader of one step of an :class:`InkSeries` (from
    :meth:`InkSeries.reader`): each loading rank decodes the rank files its shards overlap,
    each through its chain of deltas, every file checked against the manifest."""

    def __init__(self, series: InkSeries, step: int) -> None:
        super().__init__(series._path(step_dir(step)), threads=series.threads)
        self.series = series
        self.step = step
        self._entry: Step | None = None

    def _refuse_incomplete(self) -> None:
        pass  # an older step's rank files are deltas: read_metadata checks the manifest's

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id and os.fspath(checkpoint_id) != self.path:
            raise InvalidArgumentError(f"a series reader loads {self.path}; no checkpoint_id")
        super().reset()

    def _step_entry(self) -> Step:
        entry = self.series.entry(self.step)
        for step, file in (link for f in entry.files
                           for link in self.series.chain(entry.step, f.rank)):
            path = self.series._path(step.dir, file.file)
            if not os.path.isfile(path):
                raise CorruptError(f"[M-18] {path}: missing (named by "
                                   f"{self.series._path(SERIES_MANIFEST)})")
        return entry

    def read_metadata(self, *args: Any) -> Metadata:
        entry = self._step_entry()
        metadata = read_metadata_file(self.path)
        _check_metadata_files(metadata, entry, self.path)
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = uuid.uuid4().hex
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        self._entry = self._step_entry()  # every rank: only the coordinator read the metadata
        _check_metadata_files(metadata, self._entry, self.path)

    def _read_file(self, file_name: str, tensors: dict[str, list[ReadItem]],
                   planner: LoadPlanner) -> None:
        rank = next(f.rank for f in self._entry.files if f.name == file_name)
        path = os.path.join(self.path, self._entry.file_of(rank).file)
        arrays = self.series.decode(self.step, rank)
        for tensor_name, items in tensors.items():
            if tensor_name not in arrays:
                raise CorruptError(f"[M-20] {path}: no tensor named {tensor_name!r}, which "
                                   f"{METADATA} names")
            self._serve(path, tensor_name, arrays.pop(tensor_name), items, planner)

    def report(self) -> list[dict]:
        """Per stored chunk: what :meth:`InkSeries.describe` returns."""
        return self.series.describe(self.step)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return False  # made by InkSeries.reader, never from a checkpoint_id
