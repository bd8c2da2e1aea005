"""The Writer: tensors into a new .ink file, cut into chunks that are encoded on a thread
pool and written in the order they were added (the records then do not depend on the
thread count)."""
from __future__ import annotations

import collections
import concurrent.futures
import os
import threading
from concurrent.futures import Executor
from typing import Any, Callable, Mapping

import numpy as np

from .. import dtypes
from ..atomic import check_path
from ..codecs.chain import Pipeline, for_new_tensor
from ..codecs.entropy import Entropy, check_level
from ..codecs.lossless import PLANES, ByteGroup, planes_from
from ..container import layout
from ..container.index import TensorEntry, check_metadata, check_name, check_shape
from ..container.writer import ContainerWriter
from ..encode.sketch import Sketch, work_dtype
from ..encode import tensor as encoder
from ..encode.policy import Policy
from ..encode.policy import resolve as resolve_policy
from ..errors import InshrinkError, InvalidArgumentError
from .arguments import Progress, check_progress, checked_source, resolve_threads
from .info import TensorInfo
from .threads import executor

DEFAULT_CHUNK_BYTES = 4 << 20

# One-chunk tensors go to the encoder threads in batches of at most this many tensors or
# bytes: each pool job costs a few thread wake-ups and GIL hand-offs, more than the work of a
# tensor of a few KiB, while a batch of 256 KiB still leaves every thread a share of a
# checkpoint's small tensors.
_BATCH_TENSORS = 16
_BATCH_BYTES = 256 << 10


def file_minor(pipelines, reports: bool) -> int:
    """The lowest format minor the tensors' codecs need (reports in the index: 1.1)."""
    return max([p.minor for p in pipelines] + [1 if reports else 0])


# Tensors up to this size may be stored as one byte plane (encoder.lossless_pipeline).
TINY_TENSOR_BYTES = 16384

# Chunks smaller than this take no planes from the writer's pool (PLANES gives buffers
# under its min_bytes, 64 KiB, as new arrays, not kept): Writer._encode lends them none, and
# a small tensor's chunk costs no lease and no give() (a lock, a sort) for nothing.
_POOLED_CHUNK_BYTES = 64 << 10
_NONE_TAKEN = ()  # what such a chunk took from the pool



# The longest the calling thread waits for one of a save's first jobs to begin on its newly
# started thread (Writer._submit); a bound only, for a thread that cannot get a core.
_BEGIN_WAIT_S = 0.01


def _begin(begun: threading.Event, fn: Callable, *args, **kwargs) -> Any:
    """Run ``fn`` once ``begun`` is set (a job of Writer._submit)."""
    begun.set()
    return fn(*args, **kwargs)


def _writer_pool(threads: int) -> Executor | None:
    """The threads a Writer encodes on (None: it encodes on the calling thread). Started
    per Writer: a pool kept between saves was measured (2026-12-01) to fault 2-3 times as
    many pages in a 2-thread lossy save of a 256 MB tensor (its threads' malloc arenas kept
    being trimmed and refilled by the quantizer's per-chunk arrays), 5-12% more CPU, and
    saved nothing measurable on lossless saves."""
    return executor(threads)


class Writer:
    """Write tensors one by one into a new .ink file, streaming and atomically.

    Each tensor is cut into chunks that are encoded (on ``threads`` threads) and written at
    once, so memory stays near a few chunks whatever the checkpoint size. A quantized tensor's
    sketch and fit run on those threads too, beside other tensors' (up to ``threads + 1``
    tensors of several chunks are prepared at once); chunks are written in the order tensors
    were added, so the
    file does not depend on the thread count. Nothing appears at
    ``path`` until :meth:`close` succeeds; leaving a ``with`` block by an exception discards
    the new file and keeps any previous one.

    With threads, the encoder threads also write the records (in order); the calling thread
    only waits. Tensors of at most one chunk (most of a checkpoint's) are prepared, encoded
    and written by one job per batch of up to 16 of them (256 KiB), so the calling thread does
    not wait for them and the threads hand work over less often; the sketch pass of a
    larger quantized tensor runs on every free thread. A chunk that fails to encode makes
    :meth:`close` fail. Byte-grouping planes
    come from buffers shared by the process's writers, of which up to 32 MiB stay allocated
    between saves (:data:`inshrink.codecs.lossless.PLANES`), so that saving again does not
    fault their pages in again.

    Parameters
    ----------
    path : str or os.PathLike
        Destination file.
    metadata : dict of str to str, optional
        User metadata (compatible with safetensors' ``__metadata__``).
    level : int, optional
        zstd level for every plane; ``None`` (default) uses inshrink's fast plane settings.
    chunk_bytes : int
        Uncompressed bytes per chunk (default 4 MiB, at most 64 MiB).
    threads : int, optional
        Encoder threads; ``None`` uses every core.
    progress : callable, optional
        Called with the number of tensor bytes each time a chunk is written.
    policy : Policy, str or None
        Which tensors are quantized and how (:mod:`inshrink.encode.policy`): a :class:`Policy`, a
        preset name (``"lossless"``, ``"balanced"``, ``"aggressive"``, ``"compact"``) or ``None``
        (lossless, the default).
    keep_codes : bool
        Collect every lossy tensor's codes in :attr:`codes` (for the next checkpoint's delta:
        a delta file is a whole file rewritten by :func:`inshrink.io.rebase.write_delta`, as
        :class:`inshrink.Series` does).
    """

    def __init__(self, path: str | os.PathLike, metadata: dict[str, str] | None = None, *,
                 level: int | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 threads: int | None = None, progress: Progress | None = None,
                 policy: Policy | str | None = None, keep_codes: bool = False) -> None:
        path = check_path(path)
        self._policy = resolve_policy(policy)
        check_progress(progress)
        self.codes: dict[str, np.ndarray] | None = {} if keep_codes else None
        self._codes = self.codes  # (filled in by the threads writing the records)
        try:  # a mapping, or (key, value) pairs as dict() takes them
            if isinstance(metadata, (str, bytes)):
                raise TypeError
            self.metadata = dict(metadata or {})
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"metadata must be a mapping of str to str or None, got "
                                       f"{type(metadata).__name__}") from None
        try:
            check_metadata(self.metadata)
        except InshrinkError as exc:
            raise InvalidArgumentError(str(exc)) from None
        check_level(level)
        if type(chunk_bytes) is not int or not 8 <= chunk_bytes <= layout.MAX_CHUNK_BYTES:
            raise InvalidArgumentError(
                f"chunk_bytes must be an integer in [8, {layout.MAX_CHUNK_BYTES}]")
        self._entropy = Entropy(level)
        self._chunk_bytes = chunk_bytes
        self._threads = resolve_threads(threads)
        self._progress = progress
        # name -> its encoder (None until prepared); once all its chunks are written, the
        # format minor version its pipeline needs (the encoder is let go)
        self._tensors: dict[str, encoder.TensorEncoder | int | None] = {}
        self._lossless: dict[int, tuple[Pipeline, list[dict], int]] = {}  # _lossless_chain
        self._codec_names: dict[int, str] = {}  # id of such a chain -> TensorInfo.codec
        policy = self._policy
        self._reports = bool(policy.roles or policy.overrides or policy.tensors)
        # a Policy of no roles, overrides or tensors stores every tensor losslessly
        self._lossless_only = type(policy) is Policy and not self._reports
        # for_tensor's options, one dict shared by the tensors without importance overrides
        self._options = {"entropy": self._entropy, "report": self._reports,
                         "tiny_bytes": TINY_TENSOR_BYTES, "force": None}
        self._pending: collections.deque = collections.deque()
        self._preparing: collections.deque = collections.deque()  # tensors being prepared
        self.safetensors_header: str | None = None
        self._container = ContainerWriter(path)
        self._pool = _writer_pool(self._threads)
        self._unstarted = self._threads  # pool threads not started yet (see _submit)
        self._infos: list[TensorInfo] = []  # what close returns, for the first tensors
        self._planes = PLANES  # plane buffers, recycled once their records are written
        # Records go out in file order, (tensor number, chunk number), written by the pool
        # threads: the thread that encodes the next chunk to write writes it and any later
        # ones already encoded. A tensor's chunk count is known once it is prepared.
        self._order = threading.Lock()
        self._encoded: dict[tuple[int, int], tuple] = {}  # waiting for a predecessor's write
        self._counts: dict[int, int] = {}  # tensor number -> chunks, once prepared
        self._next = (0, 0)  # the next chunk to write
        self._added = 0  # tensors numbered so far
        self._writing = False  # whether a pool thread is writing chunks now
        # jobs on the pool not waited for yet: (future, tensor bytes, tensor number, entry of a
        # whole-tensor job or None for one chunk); at most _window_bytes of tensor data once
        # there are more than 2 per thread, never more than _window_jobs
        self._window_bytes = 2 * self._threads * chunk_bytes
        self._window_jobs = 32 * self._threads
        self._pending_bytes = 0
        # one-chunk tensors added but not submitted yet: (number, args, options) each; they go
        # to the pool together (one job), up to _BATCH_TENSORS or _BATCH_BYTES
        self._batch: list[tuple] = []
        self._batch_bytes = 0
        self._failed: BaseException | None = None
        self._closed = False

    def add(self, name: str, array: Any, *, importance: Any = None, wait: bool = True) -> None:
        """Add one tensor (anything array-like; see :func:`inshrink.dtypes.as_numpy`).

        ``importance``: per-element sensitivity scores (e.g. |gradient × weight|, same
        number of elements) used to protect, and with ``prune_metric="sensitivity"`` to
        prune, when the policy quantizes this tensor.

        With ``wait=True`` this returns once the tensor is encoded, so the caller may then
        modify the array. ``wait=False`` lets encoding overlap the next tensors (faster with
        many small tensors, and a lossy tensor's sketch and fit run beside the others'); the
        array must then stay unmodified until :meth:`close`.
        """
        # a C-contiguous array of a stored dtype is what as_numpy would return (the common
        # case, without its dozen attribute lookups; bf16/fp8 once of_numpy has seen one)
        dtype = (dtypes.BY_NUMPY.get(array.dtype)
                 if type(array) is np.ndarray and array.flags.c_contiguous else None)
        if dtype is None:
            array = dtypes.as_numpy(array)
            dtype = dtypes.of_numpy(array.dtype)
        flat = array.reshape(-1).view(np.uint8)
        # its slices are contiguous buffers: no check of what read returns (checked_source)
        self._add_source(name, dtype, array.shape, lambda start, stop: flat[start:stop],
                         importance, True)
        if wait:  # the chunks are views of the caller's array
            self._drain()

    def add_source(self, name: str, dtype: dtypes.DType, shape: tuple[int, ...],
                   read: Callable[[int, int], Any], importance: Any = None) -> None:
        """Add a tensor whose little-endian bytes ``read(start, stop)`` returns piecewise.

        Lets a caller stream a tensor from disk without holding it in memory. Chunks may be
        encoded after this returns, so ``read`` must return buffers nobody modifies later.
        """
        self._add_source(name, dtype, shape, read, importance, False)

    def _add_source(self, name: str, dtype: dtypes.DType, shape: tuple[int, ...],
                    read: Callable[[int, int], Any], importance: Any, contiguous: bool) -> None:
        """:meth:`add_source`; ``contiguous``: ``read`` is known to return contiguous buffers
        (else what it returns is checked, :func:`~inshrink.io.arguments.checked_source`)."""
        self._check_open()
        if not isinstance(dtype, dtypes.DType):
            raise InvalidArgumentError(f"tensor {name!r}: dtype must be an inshrink.dtypes.DType")
        if not isinstance(shape, (tuple, list)):
            raise InvalidArgumentError(f"tensor {name!r}: shape must be a tuple of integers, "
                                       f"got {type(shape).__name__}")
        try:
            check_name(name)
            # in bytes, as readers check it (rule I-9): not just the element count
            shape = check_shape(list(shape), dtype.itemsize)
        except InshrinkError as exc:
            raise InvalidArgumentError(str(exc)) from None
        if name in self._tensors:
            raise InvalidArgumentError(f"duplicate tensor name {name!r}")
        if importance is not None and isinstance(importance, (str, bytes, Mapping)):
            raise InvalidArgumentError(f"tensor {name!r}: importance must be an array of "
                                       f"scores, not a {type(importance).__name__}")
        if not contiguous:
            read = checked_source(name, read)
        per_chunk = max(1, self._chunk_bytes // dtype.itemsize)
        entry = TensorEntry(name, dtype, tuple(shape), [], per_chunk)
        if self._lossless_only:  # (config_for would give a role that is not reported)
            role, config = None, None
        else:
            role, config = self._policy.config_for(name, dtype.name, entry.shape)
        force = (encoder.overrides(importance, config, entry.numel)
                 if config is not None and entry.numel else None)
        args = (entry, read, role, config)
        options = self._options if force is None else {**self._options, "force": force}
        if self._pool is None:
            self._start(entry, read, encoder.for_tensor(*args, **options))
            return
        if entry.chunk_count > 1:
            # every tensor before this one is submitted: its chunks can then always be
            # written once encoded (none waits in memory for an earlier tensor not submitted)
            self._submit_batch()
        number, self._added = self._added, self._added + 1
        self._tensors[name] = None  # until it is prepared
        self._container.tensors.append(entry)
        if entry.chunk_count <= 1:
            # one job prepares, encodes and writes the whole tensor, and the next one-chunk
            # tensors too (most tensors of a checkpoint): the calling thread does not wait for
            # them to be prepared, and a thread hand-off costs more than a small tensor's work
            self._batch.append((number, args, options))
            self._batch_bytes += entry.nbytes
            if len(self._batch) >= _BATCH_TENSORS or self._batch_bytes >= _BATCH_BYTES:
                self._submit_batch()
            return
        # the sketch and fit run on the pool too, beside other tensors' (chunks wait for them)
        self._preparing.append((number, entry, read, self._submit(
            encoder.for_tensor, *args, **options, sketch_pass=self._sketch_pass)))
        while self._preparing and (self._preparing[0][3].done()
                                   or len(self._preparing) > self._threads):
            self._start_oldest()

    def _submit_batch(self) -> None:
        """Submit the one-chunk tensors added since the last batch as one pool job."""
        if not self._batch:
            return
        self._make_room()  # may raise (a tensor being prepared failed): the batch stays
        batch, nbytes = self._batch, self._batch_bytes
        self._batch, self._batch_bytes = [], 0
        for _, (entry, _, _, config), _ in batch:  # promised only to jobs that will run
            if config is None and for_new_tensor(entry.dtype).stage.word > 1:  # planes
                self._planes.reserve(entry.nbytes)
        future = self._submit(self._batch_job, batch)
        self._pending.append((future, nbytes, batch[0][0], [job[1][0] for job in batch]))
        self._pending_bytes += nbytes

    def _submit(self, fn: Callable, *args, **kwargs) -> concurrent.futures.Future:
        """Submit a job from the calling thread. Each of the first ``threads`` jobs starts a
        pool thread, which needs the GIL to take its job: the calling thread, adding the next
        tensors, kept it until it had filled the window and waited (measured 2026-12-01: the
        first job of a save of final_fp32 began 1.1-1.4 ms after it was submitted, on each of
        the 2 threads, ~4% of the save). So it waits until such a job has begun (its
        thread then runs until it releases the GIL, in zstd or a kernel)."""
        if not self._unstarted:
            return self._pool.submit(fn, *args, **kwargs)
        self._unstarted -= 1
        begun = threading.Event()
        try:
            future = self._pool.submit(_begin, begun, fn, *args, **kwargs)  # starts a thread
            begun.wait(_BEGIN_WAIT_S)
        except BaseException as exc:  # (an interrupt) the job is queued, and its caller
            self._failed = self._failed or exc  # never tracks it: the file cannot be finished
            raise
        return future

    def _batch_job(self, batch: list[tuple]) -> tuple[list, BaseException | None]:
        """Prepare, encode and write one-chunk tensors in turn (runs on a pool thread; see
        :meth:`_tensor_job`). Returns the size of each tensor done (None: no chunk) and the
        first error; after a chunk failed to encode the file cannot be finished, and the
        rest of the batch is skipped."""
        sizes, error = [], None
        for number, args, options in batch:
            if self._failed is not None:
                break
            try:
                sizes.append(self._tensor_job(number, args, options))
            except BaseException as exc:
                error = error or exc
        return sizes, error

    def _start_oldest(self) -> None:
        """Wait for the oldest tensor being prepared and submit its chunks."""
        number, entry, read, future = self._preparing.popleft()
        try:
            tensor = future.result()
        except BaseException:  # as if the tensor had never been added: the writer stays usable
            self._drop(number, entry)
            raise
        self._start(entry, read, tensor, number)

    def _drop(self, number: int, entry: TensorEntry) -> None:
        """Forget a tensor that failed to be prepared (nothing of it was written)."""
        self._container.tensors.remove(entry)
        del self._tensors[entry.name]
        self._set_count(number, 0)

    def _set_count(self, number: int, count: int) -> None:
        """Record how many chunks tensor ``number`` has; one of none lets the records of
        the next tensors go out."""
        with self._order:
            self._counts[number] = count
        if count == 0:
            self._write_ready()

    def _prepared(self, entry: TensorEntry, tensor: encoder.TensorEncoder) -> None:
        """Record how a prepared tensor is stored."""
        if self._codes is not None and isinstance(tensor, encoder.LossyTensor):
            self._codes[entry.name] = np.empty(entry.numel, np.uint16)
        if isinstance(tensor, encoder.LosslessTensor):  # one chain per pipeline, shared
            entry.codec = self._lossless_chain(tensor.pipeline)[1]
        else:
            entry.codec = tensor.pipeline.chain()
        entry.streams = [[] for _ in range(tensor.pipeline.streams)]
        self._tensors[entry.name] = tensor
        if entry.chunk_count == 0:
            self._written(entry, tensor)

    def _start(self, entry: TensorEntry, read: Callable[[int, int], Any],
               tensor: encoder.TensorEncoder, number: int | None = None) -> None:
        """Record how a prepared tensor is stored and submit its chunks (``number``: the
        tensor's in the file's order, with threads)."""
        self._prepared(entry, tensor)
        left = entry.chunk_count  # chunks not written (no threads) or not submitted yet
        try:
            if self._pool is None:
                self._container.tensors.append(entry)
                for c in range(entry.chunk_count):
                    start, size, *rest = self._encode(entry, tensor.encode, read, c)
                    self._write(entry, start, *rest)
                    left -= 1
                    if self._progress is not None:
                        self._progress(size)
                return
            self._set_count(number, entry.chunk_count)
            grouped = (isinstance(tensor.pipeline.stage, ByteGroup)
                       and tensor.pipeline.streams > 1)
            for c in range(entry.chunk_count):
                start, stop = entry.chunk_range(c)
                nbytes = (stop - start) * entry.dtype.itemsize
                if grouped:  # its planes come from the calling thread
                    self._planes.reserve(nbytes)
                self._make_room()
                future = self._submit(self._chunk_job, number, entry, tensor.encode, read, c)
                self._pending.append((future, nbytes, number, None))
                self._pending_bytes += nbytes
                left -= 1
        except BaseException as exc:
            if left:  # a chunk failed, or the progress sink or an interrupt stopped the
                # loop: chunks of a tensor in the index will never be written
                self._failed = self._failed or exc
            raise

    def _sketch_pass(self, entry: TensorEntry, read: Callable[[int, int], Any],
                     sketch: Sketch) -> None:
        """Add every chunk of a tensor to an empty sketch, on as many threads as are free
        (:func:`encoder.prepare`'s ``sketch_pass``; runs on the pool thread preparing the
        tensor, which takes part and never waits for a helper that has not started). The
        chunks' totals are added in chunk order, as adding the chunks in order does, so the
        sketch and the file do not depend on the thread count."""
        n, itemsize = entry.chunk_count, entry.dtype.itemsize
        work = work_dtype(entry.dtype)
        totals: list[np.ndarray | None] = [None] * n
        chunks = iter(range(n))  # shared by the threads taking part: each takes the next

        def run(counts: np.ndarray, span: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            for c in chunks:
                start, stop = entry.chunk_range(c)
                raw = np.frombuffer(read(start * itemsize, stop * itemsize), np.uint8)
                if raw.size != (stop - start) * itemsize:
                    raise InvalidArgumentError(f"tensor {entry.name!r}: source returned too "
                                               f"few bytes")
                part = Sketch(sketch.work, sketch.shift, counts, np.zeros(3), span)
                part.add(raw.view(entry.dtype.numpy).astype(work, copy=False))
                totals[c] = part.totals
            return counts, span

        def helper() -> tuple[np.ndarray, np.ndarray]:
            return run(np.zeros_like(sketch.counts),
                       np.array([sketch.counts.shape[1], -1], np.int64))  # as for_dtype's
        helpers = [self._pool.submit(helper) for _ in range(min(self._threads, n) - 1)]
        try:
            run(sketch.counts, sketch.span)
        finally:
            for _ in chunks:  # after a failure, the helpers stop at their current chunk
                pass
            # (a cancelled job counts as done only once a thread dequeues it: not waited for)
            helpers = [future for future in helpers if not future.cancel()]
            concurrent.futures.wait(helpers)
        for future in helpers:
            counts, span = future.result()
            if span[1] >= span[0]:  # only the buckets it counted
                used = slice(int(span[0]), int(span[1]) + 1)
                sketch.counts[:, used] += counts[:, used]
                sketch.span[0] = min(sketch.span[0], span[0])
                sketch.span[1] = max(sketch.span[1], span[1])
        for part in totals:
            sketch.totals += part

    def _make_room(self) -> None:
        """Wait until one more job fits in the window (the oldest jobs first, a tensor
        being prepared before the jobs that follow it in the file)."""
        while self._pending and (len(self._pending) >= self._window_jobs
                                 or (len(self._pending) > 2 * self._threads
                                     and self._pending_bytes > self._window_bytes)):
            if self._preparing and self._preparing[0][0] < self._pending[0][2]:
                self._start_oldest()
            else:
                self._wait_oldest()

    def _drain(self, reports: bool = False) -> None:
        """Encode and write everything added so far (``reports``: meanwhile make what
        :meth:`close` returns for the tensors written, see :meth:`_report_written`)."""
        self._submit_batch()
        while self._preparing or self._pending:
            if self._preparing and (not self._pending
                                    or self._preparing[0][0] < self._pending[0][2]):
                self._start_oldest()
            else:
                if reports and not self._pending[0][0].done():
                    self._report_written()
                self._wait_oldest()
        if self._failed is not None:  # a chunk is missing: the file cannot be finished
            raise InvalidArgumentError(f"the file cannot be finished: a chunk failed "
                                       f"({self._failed})") from self._failed

    def _report_written(self, most: int = 32) -> None:
        """Make what :meth:`close` returns for up to ``most`` more of the first tensors, if
        written, while the encoder threads finish the last ones: made after them, the
        reports of 212 tensors took 0.46 ms of a 2-thread save of final_fp32 (~50 ms) in
        which both threads were idle (measured 2026-12-01). Made only in close: a save
        keeps no more objects for the garbage collector while it streams."""
        entries, tensors, infos = self._container.tensors, self._tensors, self._infos
        for entry in entries[len(infos):len(infos) + most]:
            if not isinstance(tensors[entry.name], int):  # not written (see _written)
                return
            infos.append(self._info(entry))

    def _wait_oldest(self) -> None:
        future, nbytes, number, entries = self._pending.popleft()
        self._pending_bytes -= nbytes
        if entries is None:  # one chunk of a larger tensor
            size = future.result()
            if self._progress is not None:
                self._progress(size)
            return
        sizes, error = future.result()  # a batch of one-chunk tensors
        if error is not None:  # (before the progress sink, which may raise)
            for entry in entries:
                if self._tensors.get(entry.name) is None:  # it failed before it was prepared
                    self._container.tensors.remove(entry)
                    del self._tensors[entry.name]
        if self._progress is not None:
            for size in sizes:
                if size is not None:
                    self._progress(size)
        if error is not None:
            raise error

    def _encode(self, entry: TensorEntry, encoder: Callable, read: Callable[[int, int], Any],
                c: int) -> tuple:
        """Read, encode and checksum one chunk (runs on a pool thread)."""
        start, stop = entry.chunk_range(c)
        first, last = start * entry.dtype.itemsize, stop * entry.dtype.itemsize
        raw = np.frombuffer(read(first, last), np.uint8)
        if raw.size != last - first:
            raise InvalidArgumentError(f"tensor {entry.name!r}: source returned "
                                       f"{raw.size} bytes instead of {last - first}")
        if raw.size < _POOLED_CHUNK_BYTES:  # its planes would be new arrays anyway
            planes, extra = encoder(raw, start, stop)
            taken = _NONE_TAKEN
        else:
            with planes_from(self._planes) as taken:
                planes, extra = encoder(raw, start, stop)
        crc32 = layout.crc32
        return start, raw.size, [(coding, payload, size, crc32(payload))
                                 for coding, payload, size in planes], extra, taken

    def _tensor_job(self, number: int, args: tuple, options: dict) -> int | None:
        """Prepare a tensor of at most one chunk, encode it and write it in its turn (runs on
        a pool thread). Returns its size in bytes (None: no chunk). A tensor that fails to
        be prepared counts as never added."""
        entry, read = args[0], args[1]
        try:
            tensor = encoder.for_tensor(*args, **options)
        except BaseException:
            self._set_count(number, 0)
            raise
        self._prepared(entry, tensor)
        with self._order:
            self._counts[number] = entry.chunk_count
        if entry.chunk_count == 0:
            self._write_ready()
            return None
        return self._chunk_job(number, entry, tensor.encode, read, 0)

    def _chunk_job(self, number: int, entry: TensorEntry, encoder: Callable,
                   read: Callable[[int, int], Any], c: int) -> int:
        """Encode chunk ``c`` of tensor ``number``, then write every encoded chunk whose
        predecessors are written, unless another thread is doing so (runs on a pool thread:
        the records go out in order while the calling thread only waits). Returns the chunk's
        size in bytes."""
        try:
            start, size, *rest = self._encode(entry, encoder, read, c)
        except BaseException as exc:
            self._failed = self._failed or exc  # the chunks after it can never be written
            raise
        with self._order:
            self._encoded[number, c] = (entry, start, *rest)
        self._write_ready()
        return size

    def _write_ready(self) -> None:
        """Write the chunks that are next in the file and encoded, unless another thread is
        doing so (it then writes them too)."""
        with self._order:
            if self._writing:
                return
            self._writing = True
        while True:
            with self._order:
                item = None if self._failed else self._next_encoded()
                if item is None:
                    self._writing = False
                    return
            try:
                self._write(*item)
            except BaseException as exc:
                with self._order:
                    self._failed, self._writing = self._failed or exc, False
                raise

    def _next_encoded(self) -> tuple | None:
        """The next chunk of the file if it is encoded, taken out (holding ``_order``)."""
        number, c = self._next
        while c >= self._counts.get(number, c + 1):  # that tensor is written: the next one
            number, c = number + 1, 0
        self._next = number, c
        item = self._encoded.pop((number, c), None)
        if item is not None:
            self._next = number, c + 1
        return item

    def _write(self, entry: TensorEntry, start: int, planes: list[tuple], extra,
               taken: list[np.ndarray]) -> None:
        chunks = self._container.write_chunks(planes)
        if taken:  # written: a raw payload was a view of one of them
            self._planes.give(taken)
        if extra is not None:  # a lossy chunk: its error stats and (quantized) codes
            stats, codes = extra
            self._tensors[entry.name].stats.merge(stats)
            if self._codes is not None and codes is not None:
                self._codes[entry.name][start:start + codes.size] = codes
        if start // entry.chunk_elements < entry.chunk_count - 1:
            for stream, chunk in zip(entry.streams, chunks):
                stream.append(chunk)
            return
        # the tensor's last chunk: its streams become tuples of plain tuples, which the
        # garbage collector stops tracking (lists and named tuples it would visit in every
        # collection until close, ~10 objects per small tensor)
        entry.streams = tuple([(*stream, chunk) for stream, chunk in zip(entry.streams, chunks)])
        self._written(entry, self._tensors[entry.name])

    def _lossless_chain(self, pipeline: Pipeline) -> tuple[Pipeline, list[dict], int]:
        """A lossless pipeline, its codec chain and format minor, one chain per pipeline
        object: those are shared (one per dtype, :func:`~inshrink.codecs.chain.for_new_tensor`),
        and a save keeps every tensor's chain until close. Keyed by identity: hashing a
        pipeline costs more than building its chain."""
        known = self._lossless.get(id(pipeline))
        if known is None:
            known = (pipeline, pipeline.chain(), pipeline.minor)
            if len(self._lossless) < 64:  # (the pipeline kept with it: its id stays its own)
                self._lossless[id(pipeline)] = known
        return known

    def _info(self, entry: TensorEntry) -> TensorInfo:
        """``TensorInfo.of(entry)``; for a lossless tensor without a report (most of a
        lossless save's), without the report's lookups and with the codec name of its
        shared chain (:meth:`_lossless_chain`) made once."""
        if entry.report is not None:
            return TensorInfo.of(entry)
        name = self._codec_names.get(id(entry.codec))
        if name is None:
            info = TensorInfo.of(entry)
            if any(known[1] is entry.codec for known in self._lossless.values()):
                self._codec_names[id(entry.codec)] = info.codec  # kept alive in _lossless
            return info
        return TensorInfo(entry.name, entry.dtype.name, entry.shape, name, entry.nbytes,
                          entry.stored_bytes)

    def _written(self, entry: TensorEntry, tensor: encoder.TensorEncoder) -> None:
        """A tensor's chunks are all written (a lossy one's error stats are then complete):
        its report goes into the entry now and its encoder is let go, keeping only the
        format minor its pipeline needs (a save of many small tensors otherwise holds each
        one's encoder objects until close, for the garbage collector to scan)."""
        entry.report = tensor.report()
        self._tensors[entry.name] = (self._lossless_chain(tensor.pipeline)[2]
                                     if isinstance(tensor, encoder.LosslessTensor)
                                     else tensor.pipeline.minor)
        self._container.finished(entry)  # its index JSON, made on this thread

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgumentError("writer is closed")

    def close(self) -> list[TensorInfo]:
        """Finish the file and move it into place; return a report per tensor."""
        self._check_open()
        try:
            self._drain(reports=True)
            held = []  # encoders not let go (none once everything is written)
            for entry in self._container.tensors:  # the rest have their report already
                tensor = self._tensors[entry.name]
                if not isinstance(tensor, int):
                    entry.report = tensor.report()
                    held.append(tensor.pipeline)
            minor = file_minor(held, any(e.report is not None for e in self._container.tensors))
            minor = max([minor, *(t for t in self._tensors.values() if isinstance(t, int))])
            if self._pool is not None:
                # every job is done: the threads may leave, and are not waited for (a thread
                # frees its compression contexts and scratch as it ends: joining them took
                # 0.2-0.45 ms of a 2-thread save of final_fp32, ~50 ms, measured 2026-12-01)
                self._pool.shutdown(wait=False)
            self._container.commit(self.metadata, self.safetensors_header, None, minor)
        except BaseException:
            self.abort()
            raise
        self._shutdown(wait=False)
        infos = self._infos  # (made while close waited for the last chunks) and the rest
        return infos + [self._info(e) for e in self._container.tensors[len(infos):]]

    def abort(self) -> None:
        """Discard the file being written; any previous file at the path is kept."""
        if self._closed:
            return
        jobs = [job[0] for job in self._pending] + [job[3] for job in self._preparing]
        running = [future for future in jobs if not future.cancel()]
        self._pending.clear()
        self._preparing.clear()
        self._batch.clear()  # never submitted
        self._failed = self._failed or InvalidArgumentError("the file was discarded")
        concurrent.futures.wait(running)  # nothing writes into the file any more
        self._shutdown()
        self._container.abort()

    def _shutdown(self, wait: bool = True) -> None:
        """Mark the writer closed and let its threads go (``wait``: until they have ended)."""
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=wait)

    def __enter__(self) -> "Writer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._closed:
            return
        if exc_type is None:
            self.close()
        else:
            self.abort()

