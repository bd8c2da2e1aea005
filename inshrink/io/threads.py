"""The thread pools of reads and writes, and the two ways a read runs its chunk jobs on one:
shared between the calling thread and the pool's (:func:`share`), or in order with a bounded
window in flight (:func:`in_order`).

Reads share one pool per thread count for the whole process (:func:`read_pool`): starting a
pool's threads for every opened file cost about 0.7 ms of a 5 ms load. A read running on one
of its threads (a sink or a progress callback that reads another file) gets no pool and
decodes on that thread: a pool thread waiting for jobs queued behind it could wait forever.

``in_flight`` is a list of the jobs' owner (a :class:`~inshrink.io.file.File`) with one item
per read whose jobs may still run on the pool, the futures of those jobs: the owner waits for
them before it closes what they read with (list.append and pop are atomic, no lock needed).
"""
from __future__ import annotations

import collections
import concurrent.futures
import os
import threading
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, Callable, Iterable, Iterator

from .arguments import Progress


def executor(threads: int) -> Executor | None:
    """A pool of ``threads`` threads; None for one thread (the calling thread does the work)."""
    return ThreadPoolExecutor(threads, thread_name_prefix="inshrink") if threads > 1 else None


_read_pools: dict[int, ThreadPoolExecutor] = {}
_read_pools_lock = threading.Lock()
_this_thread = threading.local()


def _mark_read_thread() -> None:
    _this_thread.reads_pool = True


def read_pool(threads: int) -> Executor | None:
    """The process's read pool of ``threads`` threads, started on first use; None for one
    thread, and on a thread of a read pool (the read then runs on that thread)."""
    if threads < 2 or getattr(_this_thread, "reads_pool", False):
        return None
    with _read_pools_lock:
        pool = _read_pools.get(threads)
        if pool is None:
            pool = _read_pools[threads] = ThreadPoolExecutor(
                threads, thread_name_prefix=f"inshrink-read{threads}",
                initializer=_mark_read_thread)
        return pool


def wait_for(in_flight: list) -> None:
    """Wait for the jobs of every read listed in ``in_flight`` (a read whose own wait was
    interrupted, e.g. by KeyboardInterrupt)."""
    for jobs in list(in_flight):
        concurrent.futures.wait(list(jobs))


def _forget_read_pools() -> None:
    # a forked child has none of the parent's threads; a lock held at the fork stays held
    global _read_pools_lock
    _read_pools.clear()
    _read_pools_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_read_pools)


def share(pool: Executor, in_flight: list, run: Callable[[int], int], sizes: list[int],
          helpers: int, small: int, progress: Progress | None) -> None:
    """``run(i)`` for every job ``i`` (of ``sizes[i]`` bytes), on the calling thread and
    ``helpers`` of the pool's (whole chunks: no thread waits on another). Every thread
    takes the largest job not yet taken, except that the calling thread first takes the
    jobs under ``small`` bytes, smallest first, and the pool's threads none of
    them: a small chunk's decoding is mostly Python holding the GIL, a large one's mostly
    zstd and kernels without it, so the two kinds overlap instead of two threads handing
    the GIL to each other at every call. After a failure,
    only jobs earlier in order still run, so that the error raised is the first one in
    order, as with one thread."""
    order = sorted(range(len(sizes)), key=sizes.__getitem__, reverse=True)
    ends = [0, len(order)]  # order[ends[0]:ends[1]] not taken yet
    lock = threading.Lock()
    failed: dict[int, BaseException] = {}
    first_failed = [len(sizes)]
    finished: list[int] = []
    reported = [0]  # finished[:reported[0]] went to progress, on the calling thread

    def report() -> None:
        done = len(finished)
        if done > reported[0]:
            progress(sum(finished[reported[0]:done]))
            reported[0] = done

    def take(smallest: bool) -> int | None:
        with lock:
            if ends[0] == ends[1]:
                return None
            if smallest and sizes[order[ends[1] - 1]] < small:
                ends[1] -= 1
                return order[ends[1]]
            if sizes[order[ends[0]]] < small:
                return None  # only small chunks left: the calling thread's
            ends[0] += 1
            return order[ends[0] - 1]

    def work(calling_thread: bool = False) -> None:
        while (i := take(calling_thread)) is not None:
            if i > first_failed[0]:
                continue
            try:
                finished.append(run(i))
            except BaseException as exc:
                with lock:
                    failed[i] = exc
                    first_failed[0] = min(first_failed[0], i)
                if calling_thread and not isinstance(exc, Exception):
                    raise  # KeyboardInterrupt, SystemExit: stop now
                continue
            if calling_thread and progress is not None:
                report()

    futures = [pool.submit(work) for _ in range(helpers)]
    in_flight.append(futures)
    try:
        work(calling_thread=True)
    except BaseException:  # e.g. KeyboardInterrupt: the helpers stop after their job
        first_failed[0] = -1
        raise
    finally:
        for future in futures:
            # a helper still queued (the shared pool busy with other reads) has nothing left
            # to take: it is not waited for
            if not future.cancel():
                future.result()
        in_flight.pop()  # (not when the wait was interrupted: close then waits)
    if failed:
        raise failed[min(failed)]
    if progress is not None:
        report()


def in_order(pool: Executor | None, in_flight: list, fn: Callable[[Any], Any],
             items: Iterable, window: int) -> Iterator[Any]:
    """``map(fn, items)`` on the pool (on the calling thread without one), in order, with at
    most ``window + 1`` jobs in flight."""
    if pool is None:
        yield from map(fn, items)
        return
    jobs: collections.deque = collections.deque()
    in_flight.append(jobs)
    try:
        for item in items:
            jobs.append(pool.submit(fn, item))
            if len(jobs) > window:
                yield jobs.popleft().result()
        while jobs:
            yield jobs.popleft().result()
    finally:  # left early (a sink raised): no job of this file runs after it returns
        for future in jobs:
            future.cancel()
        concurrent.futures.wait(jobs)
        in_flight.pop()  # (not when the wait was interrupted: close then waits)
