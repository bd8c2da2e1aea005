"""The File: random access to the tensors of an open .ink file by name, each read checking
only that tensor's records (the chains are validated by :mod:`inshrink.codecs.chain`)."""
from __future__ import annotations

import functools
import os
import threading
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np

from ..codecs import delta as deltas
from ..codecs.chain import Pipeline, pipeline_for
from ..codecs.entropy import decode as entropy_decode
from ..codecs.quant import Quant
from ..container import layout
from ..container.index import TensorEntry
from ..container.reader import ContainerReader
from ..errors import (BaseMismatchError, InshrinkError, InvalidArgumentError,
                      LimitExceededError, TensorNotFoundError, with_path)
from .arguments import Progress, check_progress, resolve_threads
from .info import TensorInfo
from .threads import in_order, read_pool, share, wait_for

# Chunks decoding to fewer bytes than this are left to the calling thread when a load is
# shared between threads: their decoding is mostly Python, holding the GIL, and two threads on
# them hand it to each other at every zstd or kernel call (measured 2026-12-01: 2,000 tensors
# of 1-16 KiB loaded in 82-90 ms of wall and 94-102 ms of CPU with 2 threads, 2,100 context
# switches per load, against 55-61 ms with one; a 64 KiB chunk's zstd alone takes about as
# long as its Python).
_SHARED_CHUNK_BYTES = 64 << 10


def _named(exc: InshrinkError, path: str | os.PathLike) -> InshrinkError:
    """``exc`` naming the file (:func:`~inshrink.errors.with_path`), raised from where
    ``exc`` was: a user reading many files learns which one is damaged."""
    if not isinstance(path, (str, bytes, os.PathLike)):  # the error is about the path
        return exc
    return with_path(exc, path).with_traceback(exc.__traceback__)


def _naming_the_file(method: Callable) -> Callable:
    """A read of :class:`File` whose errors name its file (decoders and checks below it
    say what is wrong, not where)."""
    @functools.wraps(method)
    def named(self: "File", *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except InshrinkError as exc:
            raise _named(exc, self.path) from exc.__cause__
    return named


class File:
    """An open .ink file: random access to tensors by name.

    Opening validates header, tail and index; reading a tensor reads and checks only that
    tensor's records. Use as a context manager, or call :meth:`close`.

    Parameters
    ----------
    path : str or os.PathLike
        The file to open.
    threads : int, optional
        Decoder threads; ``None`` uses every core.
    mmap : bool
        Accepted for compatibility, no effect: records are read with ``pread`` into a buffer
        of each decoding thread (one read for the planes of a chunk). That costs less than
        mapping and unmapping pages that are each read once, and a file truncated in place by
        another program while open is then a typed error, not a SIGBUS.
    base : mapping of str to numpy.ndarray, optional
        For a delta file (``File.base`` is set): the decoded lossless tensors of its base file
        (an XOR delta against a quantized or factored tensor is invalid, spec rule B-1).
        Reading a delta tensor without them raises :class:`BaseMismatchError`; the file's
        other tensors read without them. The caller vouches for these tensors: comparing
        their decode digest with ``File.base["sha256"]`` (:mod:`inshrink.digest`) is left to
        it, as :class:`inshrink.Series` does.
    base_codes : mapping of str to numpy.ndarray, optional
        For a delta file with code deltas: the base file's codes of its quantized tensors
        (see :meth:`codes`).
    """

    def __init__(self, path: str | os.PathLike, *, threads: int | None = None,
                 mmap: bool = True, base: Mapping[str, np.ndarray] | None = None,
                 base_codes: Mapping[str, np.ndarray] | None = None) -> None:
        self._threads = resolve_threads(threads)
        for what, value in (("base", base), ("base_codes", base_codes)):
            if value is not None and not isinstance(value, Mapping):
                raise InvalidArgumentError(f"{what} must be a mapping of tensor names to "
                                           f"arrays or None, got {type(value).__name__}")
        self._base, self._base_codes = base, base_codes
        try:
            self._reader = ContainerReader(path)
        except InshrinkError as exc:
            raise _named(exc, path) from exc.__cause__
        try:
            self._entries = {e.name: e for e in self._reader.index.tensors}
            has_base = self._reader.index.base is not None
            known: dict = {}
            self._pipelines = {name: pipeline_for(e, has_base, known)
                               for name, e in self._entries.items()}
        except BaseException as exc:
            self._reader.close()
            if isinstance(exc, InshrinkError):
                raise _named(exc, self._reader.path) from exc.__cause__
            raise
        # the jobs of each load or read_into whose jobs may still run on the pool (see close):
        # list.append and pop are atomic, no lock needed
        self._in_flight: list = []
        self._local = threading.local()
        # reads running now (any thread), and whether close was called: the descriptor, the
        # read buffers and the pool are given up when both say so (see close)
        self._readers = 0
        self._closed = False
        self._state_lock = threading.Lock()

    @property
    def path(self) -> str:
        return self._reader.path

    @property
    def format_version(self) -> str:
        """The format version in the file's header, e.g. ``"1.3"``: the lowest version
        whose features the file uses (a reader of that version or later can read it)."""
        major, minor = self._reader.version
        return f"{major}.{minor}"

    @property
    def metadata(self) -> dict[str, str]:
        """The user metadata map (a copy)."""
        return dict(self._reader.index.metadata)

    @property
    def base(self) -> dict | None:
        """``{"file", "sha256"}`` of the file this one's delta tensors decode against."""
        return self._reader.index.base

    @property
    def safetensors_header(self) -> str | None:
        """The original safetensors header, when the file was converted from one."""
        return self._reader.index.safetensors_header

    def keys(self) -> list[str]:
        """Tensor names in the order they were written."""
        return list(self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        try:
            return name in self._entries
        except TypeError:  # unhashable: no tensor has that name
            return False

    def _entry(self, name: str) -> TensorEntry:
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise TensorNotFoundError(f"no tensor named {name!r} in {self.path}") from None

    def info(self, name: str) -> TensorInfo:
        """Dtype, shape, codec and sizes of one tensor, without reading its data."""
        return TensorInfo.of(self._entry(name))

    def infos(self) -> list[TensorInfo]:
        return [TensorInfo.of(e) for e in self._entries.values()]

    def __getitem__(self, name: str) -> np.ndarray:
        return self.read(name)

    @_naming_the_file
    def read(self, name: str, progress: Progress | None = None) -> np.ndarray:
        """Decode one tensor into a new array (raises for a corrupt or truncated file)."""
        entry = self._entry(name)
        check_progress(progress)
        out = self._allocate(entry.nbytes, f"tensor {name!r}")
        self._begin_read()
        try:
            self._decode_all([entry], [out], progress)
        finally:
            self._end_read()
        return out.view(entry.dtype.numpy).reshape(entry.shape)

    def _begin_read(self) -> None:
        """Count a read that uses the descriptor; a closed file is a typed error."""
        with self._state_lock:
            if self._closed:
                raise InvalidArgumentError(f"{self.path}: the file is closed")
            self._readers += 1

    def _end_read(self) -> None:
        with self._state_lock:
            self._readers -= 1
            last = self._closed and not self._readers
        if last:  # closed while this read ran: it was the last to use the file
            self._release()

    @staticmethod
    def _allocate(nbytes: int, what: str) -> np.ndarray:
        """A 64-byte aligned buffer; a size the system refuses is a typed error."""
        try:
            raw = np.empty(nbytes + layout.ALIGNMENT, np.uint8)
        except MemoryError:
            raise LimitExceededError(f"{what} of {nbytes} bytes does not fit in memory; "
                                     f"stream tensors with read_into()") from None
        skip = -raw.ctypes.data % layout.ALIGNMENT
        return raw[skip:skip + nbytes]

    def _decode_all(self, entries: list[TensorEntry], outs: list[np.ndarray],
                    progress: Progress | None) -> None:
        """Decode every chunk of ``entries`` into ``outs`` (uint8, one per entry).

        The headers their records must have are computed first, for all at once. The calling
        thread decodes too (:func:`inshrink.io.threads.share`); a failure raises the error of
        the first chunk in order that fails, as one thread would.
        """
        self._check_bases(entries)
        headers = self._reader.expected_headers(
            [chunk for entry in entries for stream in entry.streams for chunk in stream])
        # job i: chunk cs[i] of tensors[i] into views[i], its records' headers from
        # headers[firsts[i]::counts[i]]. Flat lists of numbers and arrays, not a tuple and a
        # list per job: what lives through the decoding is promoted by the garbage collector,
        # and the more it promotes, the sooner a full collection comes
        tensors, cs, views, firsts, counts = [], [], [], [], []
        first = 0
        for entry, out in zip(entries, outs):
            n = entry.chunk_count
            if n == 1:  # most tensors of a checkpoint: the whole output is the chunk's
                tensors.append(entry)
                cs.append(0)
                views.append(out)
                firsts.append(first)
                counts.append(1)
            else:
                step = entry.chunk_elements * entry.dtype.itemsize
                tensors += [entry] * n
                cs += range(n)
                views += [out[c * step:(c + 1) * step] for c in range(n)]
                firsts += range(first, first + n)
                counts += [n] * n
            first += n * len(entry.streams)

        def run(i: int) -> int:
            entry, view, n = tensors[i], views[i], counts[i]
            self._decode_chunk(entry, cs[i], view,
                               headers[firsts[i]:firsts[i] + n * len(entry.streams):n])
            return view.size

        sizes = [view.size for view in views]
        # a pool thread for each chunk it may take (none: no thread is woken for the load)
        helpers = min(self._threads - 1, sum(size >= _SHARED_CHUNK_BYTES for size in sizes))
        pool = read_pool(self._threads)
        if pool is None or len(views) < 2 or not helpers:
            for i in range(len(views)):
                size = run(i)
                if progress is not None:
                    progress(size)
            return
        # the calling thread takes the chunks under _SHARED_CHUNK_BYTES
        share(pool, self._in_flight, run, sizes, helpers, _SHARED_CHUNK_BYTES, progress)

    @_naming_the_file
    def read_into(self, name: str, sink: Callable[[int, np.ndarray], None],
                  progress: Progress | None = None, *, in_order: bool = True) -> None:
        """Decode a tensor chunk by chunk: ``sink(byte_offset, uint8 chunk)`` for each chunk.

        Memory stays near a few chunks, so huge tensors can be streamed to another file. With
        ``in_order=False`` the sink runs on the decoding threads, in any order (it must be
        thread-safe, e.g. ``os.pwrite``), which lets the writing scale with the threads too.
        """
        entry = self._entry(name)
        if not callable(sink):
            raise InvalidArgumentError("sink must be callable as sink(byte_offset, chunk)")
        check_progress(progress)
        self._begin_read()
        try:
            self._stream(entry, sink, progress, in_order)
        finally:
            self._end_read()

    def _stream(self, entry: TensorEntry, sink: Callable[[int, np.ndarray], None],
                progress: Progress | None, in_order: bool) -> None:
        """:meth:`read_into` of an open file's read."""
        self._check_bases([entry])
        itemsize = entry.dtype.itemsize

        def decode(c: int) -> tuple[int, np.ndarray]:
            start, stop = entry.chunk_range(c)
            size = (stop - start) * itemsize
            # an unordered sink is done with the chunk before this thread decodes the next
            chunk = np.empty(size, np.uint8) if in_order else self._scratch(size)
            self._decode_chunk(entry, c, chunk)
            if not in_order:
                sink(start * itemsize, chunk)
            return start * itemsize, chunk

        for offset, chunk in self._in_order(decode, range(entry.chunk_count)):
            if in_order:
                sink(offset, chunk)
            if progress is not None:
                progress(chunk.size)

    def _scratch(self, size: int) -> np.ndarray:
        """A decode buffer owned by the calling thread, reused from chunk to chunk."""
        buffer = getattr(self._local, "scratch", None)
        if buffer is None or buffer.size < size:
            buffer = self._local.scratch = np.empty(size, np.uint8)
        return buffer[:size]

    def _in_order(self, fn: Callable[[int], Any], items) -> Iterator[Any]:
        """``map(fn, items)`` on the thread pool, in order, with a bounded window in flight."""
        return in_order(read_pool(self._threads), self._in_flight, fn, items, 2 * self._threads)

    def _decode_chunk(self, entry: TensorEntry, c: int, out: np.ndarray,
                      headers: list[bytes] | None = None) -> Any:
        """Decode chunk ``c`` of a tensor into ``out``; ``headers``: what its records' headers
        must be (:meth:`ContainerReader.expected_headers`), if computed already."""
        pipeline = self._pipelines[entry.name]
        # the base is checked (rules B-1, B-2) before any record of the tensor is read
        ref = self._chunk_ref(entry, pipeline, c) if pipeline.is_delta else None
        chunks = [stream[c] for stream in entry.streams]
        payloads = self._reader.read_chunks(chunks, headers)
        if ref is None:  # pipeline.decode without a delta stage, a call less per chunk
            # a chunk entry: (offset, length, crc, size, coding), read by position
            return pipeline.stage.decode([entropy_decode(chunk[4], payload, chunk[3])
                                          for chunk, payload in zip(chunks, payloads)], out)
        return pipeline.decode([(chunk[4], payload, chunk[3])
                                for chunk, payload in zip(chunks, payloads)], out, ref)

    def _chunk_ref(self, entry: TensorEntry, pipeline: Pipeline, c: int) -> np.ndarray:
        """What a delta chunk decodes against: the base's codes or bytes of the chunk."""
        if isinstance(pipeline.delta, deltas.CodeDelta):
            return self._chunk_base_codes(entry, c)
        start, stop = entry.chunk_range(c)
        itemsize = entry.dtype.itemsize
        return self._base_bytes(entry)[start * itemsize:stop * itemsize]

    def _base_name(self) -> str:
        return self.base["file"] if self.base else "a base"

    def _chunk_base_codes(self, entry: TensorEntry, c: int) -> np.ndarray:
        start, stop = entry.chunk_range(c)
        return self._base_codes_of(entry)[start:stop]

    def _base_codes_of(self, entry: TensorEntry) -> np.ndarray:
        """The base codes a code delta tensor decodes against (rule B-2: given, one per
        element; the base tensor's dtype and shape do not matter, the codes index the delta
        tensor's own levels)."""
        codes = None if self._base_codes is None else self._base_codes.get(entry.name)
        if (not isinstance(codes, np.ndarray) or codes.dtype != np.uint16
                or codes.shape != (entry.numel,)):
            raise BaseMismatchError(f"[B-2] {self.path}: tensor {entry.name!r} is a code delta "
                                    f"against {self._base_name()}, whose codes of it were not "
                                    f"given")
        return codes

    def _check_bases(self, entries: Iterable[TensorEntry]) -> None:
        """Rules B-1 and B-2 for the delta tensors among ``entries``, before any record is
        read: also for an empty tensor, which has no chunk to check them at."""
        for entry in entries:
            pipeline = self._pipelines[entry.name]
            if not pipeline.is_delta:
                continue
            if isinstance(pipeline.delta, deltas.CodeDelta):
                self._base_codes_of(entry)
            else:
                self._base_bytes(entry)

    @_naming_the_file
    def codes(self, name: str) -> np.ndarray:
        """The quantization codes of a lossy tensor (uint16, one per element), as a series
        needs them to decode the next checkpoint's code deltas. Reads only the codes."""
        entry = self._entry(name)
        pipeline = self._pipelines[name]
        if not isinstance(pipeline.stage, Quant):
            raise InvalidArgumentError(f"tensor {name!r} is not quantized")
        out = np.empty(entry.numel, np.uint16)
        self._begin_read()
        try:
            self._check_bases([entry])
            for c in range(entry.chunk_count):
                start, stop = entry.chunk_range(c)
                ref = self._chunk_base_codes(entry, c) if pipeline.is_delta else None
                chunk = entry.streams[0][c]
                payload = self._reader.read_chunks([chunk])[0]
                out[start:stop] = pipeline.decode_codes((chunk[4], payload, chunk[3]),
                                                        stop - start, ref)
        finally:
            self._end_read()
        return out

    def _base_bytes(self, entry: TensorEntry) -> np.ndarray:
        """The base tensor a delta tensor is XORed with, checked against the entry (rule
        B-1: given, stored losslessly by the base file, same dtype and shape)."""
        base = None if self._base is None else self._base.get(entry.name)
        if base is None:
            raise BaseMismatchError(f"[B-1] {self.path}: tensor {entry.name!r} is a delta "
                                    f"against {self._base_name()}, which was not given")
        if self._base_codes is not None and entry.name in self._base_codes:
            raise BaseMismatchError(f"[B-1] {self.path}: tensor {entry.name!r} is an XOR delta, "
                                    f"but its base tensor is quantized (only a lossless "
                                    f"tensor can be the base of one)")
        if (not isinstance(base, np.ndarray) or base.dtype != entry.dtype.numpy
                or tuple(base.shape) != entry.shape):
            raise BaseMismatchError(f"[B-1] {self.path}: base tensor {entry.name!r} is "
                                    f"{getattr(base, 'dtype', type(base).__name__)}"
                                    f"{list(getattr(base, 'shape', ()))}, the delta needs "
                                    f"{entry.dtype.name}{list(entry.shape)}")
        return np.ascontiguousarray(base).reshape(-1).view(np.uint8)

    @_naming_the_file
    def load(self, progress: Progress | None = None,
             names: list[str] | None = None) -> dict[str, np.ndarray]:
        """Decode every tensor, or those in ``names`` (chunks of all tensors share the thread
        pool).

        The arrays are views of one allocation (each 64-byte aligned): one large block is much
        cheaper for the OS to provide than hundreds of small ones.
        """
        if isinstance(names, (str, bytes)):  # not a sequence of one-letter names
            raise InvalidArgumentError("names must be a list of tensor names, not a string")
        check_progress(progress)
        entries = self._entries if names is None else {n: self._entry(n) for n in names}
        values = list(entries.values())
        sizes = [e.nbytes for e in values]
        starts, total = [], 0
        for size in sizes:
            starts.append(total)
            total += size + (-size % layout.ALIGNMENT)  # layout.padding, inlined
        block = self._allocate(total, "the checkpoint")
        outs = [block[start:start + size] for start, size in zip(starts, sizes)]
        self._begin_read()
        try:
            self._decode_all(values, outs, progress)
        finally:
            self._end_read()
        return {name: out.view(e.dtype.numpy).reshape(e.shape)
                for (name, e), out in zip(entries.items(), outs)}

    @_naming_the_file
    def verify(self) -> list[str]:
        """Read and decode every record, checking every checksum and size.

        Returns
        -------
        list of str
            The problems found, one per damaged tensor (``tensor 'name': ErrorClass:
            message``); empty when every record checks. Every ``verify`` of the library
            answers this way (series, sharded checkpoints and their series too).

        Raises
        ------
        OSError
            The file could not be read (a problem of the storage, not of the file).

        Notes
        -----
        A delta tensor whose base was not given is checked down to its streams (checksums,
        zstd frames, sizes); combining it with the base needs ``base``/``base_codes``.
        """
        problems = []
        self._begin_read()
        try:
            for name, entry in self._entries.items():
                try:
                    self._verify_entry(entry, self._pipelines[name])
                except InshrinkError as exc:
                    problems.append(f"tensor {name!r}: {type(exc).__name__}: {exc}")
        finally:
            self._end_read()
        return problems

    def _verify_entry(self, entry: TensorEntry, pipeline: Pipeline) -> None:
        if pipeline.is_delta and not self._has_base(entry, pipeline):
            for c in range(entry.chunk_count):
                chunks = [stream[c] for stream in entry.streams]
                for chunk, payload in zip(chunks, self._reader.read_chunks(chunks)):
                    pipeline.entropy.decode(chunk[4], payload, chunk[3])
        else:
            self._stream(entry, lambda start, chunk: None, None, True)

    def _has_base(self, entry: TensorEntry, pipeline: Pipeline) -> bool:
        codes = isinstance(pipeline.delta, deltas.CodeDelta)
        source = self._base_codes if codes else self._base
        return source is not None and entry.name in source

    def close(self) -> None:
        """End the use of the file: reads started after it raise
        :class:`InvalidArgumentError`.

        A read still running (in another thread, or one whose sink or progress callback
        calls this) finishes first, with every chunk it was asked for; the descriptor, the
        read buffers and the threads are given up when the last such read ends. Closing
        twice does nothing.
        """
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
            last = not self._readers
        if last:
            self._release()

    def _release(self) -> None:
        # load and read_into wait for their jobs, even when they raise; a read whose wait
        # was interrupted (KeyboardInterrupt) left them queued: those are waited for, as they
        # read with the descriptor closed below
        wait_for(self._in_flight)
        self._reader.close()

    def __enter__(self) -> "File":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
