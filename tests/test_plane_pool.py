"""The plane pool keeps and hands out the buffers its rules say, whatever the order of calls."""
from __future__ import annotations

import collections

import numpy as np
from hypothesis import given, settings, strategies as st

from inshrink.codecs.lossless import PlanePool


class _Reference(PlanePool):
    """The pool's rules written plainly: free buffers sorted largest first (stable), a
    Counter of promises copied for each give."""

    def reserve(self, nbytes: int) -> None:
        if nbytes < self._min_bytes:
            return
        with self._lock:
            self._promised[nbytes] += 1
            if sum(buf.size == nbytes for buf in self._free) < self._promised[nbytes]:
                self._free.append(np.empty(nbytes, np.uint8))
                self._free.sort(key=lambda b: -b.size)

    def give(self, buffers: list[np.ndarray]) -> None:
        with self._lock:
            for buf in buffers:
                base = buf if buf.base is None else buf.base
                if base.size >= self._min_bytes:
                    self._free.append(base)
            self._free.sort(key=lambda b: -b.size)
            promised = collections.Counter(self._promised)
            kept, total = [], 0
            for buf in self._free:
                if promised[buf.size] > 0:
                    promised[buf.size] -= 1
                elif total + buf.size > self._keep_bytes:
                    continue
                kept.append(buf)
                total += buf.size
            self._free = kept


_SIZES = st.sampled_from([50, 100, 120, 200, 200, 400])
_CALLS = st.lists(st.tuples(st.sampled_from(["reserve", "take", "give"]), _SIZES,
                            st.integers(0, 3)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(calls=_CALLS)
def test_the_pool_keeps_what_its_plain_rules_keep(calls):
    pools = PlanePool(keep_bytes=700, min_bytes=100), _Reference(keep_bytes=700, min_bytes=100)
    taken: list[list[np.ndarray]] = [[], []]
    for op, size, count in calls:
        for pool, held in zip(pools, taken):
            if op == "reserve":
                pool.reserve(size)
            elif op == "take":
                held.append(pool.take(size))
            else:  # hand back the first ones taken (base buffers: the same in both pools)
                pool.give(held[:count])
                del held[:count]
        fast, plain = pools
        assert [b.size for b in fast._free] == [b.size for b in plain._free]
        assert +fast._promised == +plain._promised
        assert fast.free_bytes == plain.free_bytes
