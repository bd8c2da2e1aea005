"""The numpy stand-ins a process runs before it compiles the quantisation kernels give the
kernels' results to the bit, and a small lossy save made with them is the file the kernels
write."""
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from inshrink.encode.fit import kmeans_numpy
from inshrink.encode.quantizer import quantize_numpy, rank_table
from inshrink.encode.sketch import sketch_words_numpy
from inshrink.kernels import quant
from test_quant_kernels import (FLOAT_TYPES, NO_FORCE, assign_case, float_arrays, kmeans_1d,
                                sketch_args, weighted_points)


def assert_same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()  # -0.0 and 0.0 differ here


@pytest.mark.parametrize("float_type", FLOAT_TYPES)
@given(data=st.data())
def test_sketch_stand_in_is_the_kernel(float_type, data):
    shift = data.draw(st.sampled_from([23 - 7, 23 - 1] if float_type == np.float32
                                      else [52 - 10, 52 - 7]))
    word, abs_mask, inf_bits, size = sketch_args(float_type, shift)
    chunks = data.draw(st.lists(float_arrays(float_type), min_size=1, max_size=3))
    results = []
    for add in (quant.sketch_words, sketch_words_numpy):
        counts = np.zeros((2, size), np.int64)
        totals, span = np.zeros(3), np.array([size, -1], np.int64)
        for x in chunks:  # counts accumulate over chunks
            add(x, x.view(word), abs_mask, inf_bits, np.uint64(shift), counts, totals, span)
        results.append((counts, totals, span))
    for kernel, numpy in zip(*results):
        assert_same_bits(numpy, kernel)


def run_kernel(x, boundaries, table, protect_at, prune_below, zero_code, escape, force):
    """quantize_chunk as the quantizer calls it: ranks from the rank table when there is one
    (float32), else counted by rank_chunk first."""
    padded = np.append(boundaries, np.inf)
    lut, probes = rank_table(boundaries) if x.dtype == np.float32 else (np.empty(0), 0)
    lut = lut.astype(np.uint16)
    codes = np.full(x.size, 0xBEEF, np.uint16)
    if not lut.size:
        quant.rank_chunk(x, padded, codes)
    positions, others, out = np.empty(x.size, np.int64), np.empty(x.size, np.int64), np.zeros(7)
    n = quant.quantize_chunk(x, x.view(np.uint32) if lut.size else np.empty(0, np.uint32),
                             padded, lut, probes, table, -protect_at, protect_at, prune_below,
                             zero_code, escape, NO_FORCE if force is None else force, codes,
                             positions, others, out)
    return codes, positions[:n], out


@pytest.mark.parametrize("float_type", FLOAT_TYPES)
@given(data=st.data())
def test_quantize_stand_in_is_the_kernel(float_type, data):
    x, boundaries, _, _, force, levels = data.draw(assign_case(float_type))
    # levels between the boundaries, an exact zero among them or not, as a fit makes them
    edges = np.concatenate(([boundaries[0] - 1.0] if boundaries.size else [0.0], boundaries,
                            [boundaries[-1] + 1.0] if boundaries.size else []))
    table = ((edges[1:] + edges[:-1]) / 2 if boundaries.size else np.zeros(1))
    table = np.sort(table.astype(float_type).astype(np.float64))
    zero = np.flatnonzero(table == 0.0)
    if data.draw(st.booleans()) and table.size and not zero.size:
        table[table.size // 2] = 0.0
        table.sort()
        zero = np.flatnonzero(table == 0.0)
    escape = levels if data.draw(st.booleans()) or not table.size else 0
    zero_code = int(zero[0]) if zero.size else escape
    protect_at = data.draw(st.sampled_from([np.inf, 1.0, 1e3]))
    prune_below = data.draw(st.sampled_from([0.0, 1e-3, 0.5]))
    force = None if not force.size else force
    args = (x, boundaries, table, protect_at, prune_below, zero_code, escape, force)
    codes, positions, out = run_kernel(*args)
    got_codes, got_out = np.empty(x.size, np.uint16), np.zeros(7)
    with np.errstate(all="raise"):  # the stand-in silences what it expects
        got_positions = quantize_numpy(*args[:-1], force, got_codes, got_out)
    assert_same_bits(got_codes, codes)
    assert_same_bits(got_positions, positions)
    assert_same_bits(got_out, out)


def test_quantize_stand_in_on_a_long_chunk_with_the_rank_table():
    rng = np.random.default_rng(5)
    table = np.sort(rng.standard_normal(64)).astype(np.float32).astype(np.float64)
    table[31] = 0.0
    table.sort()
    boundaries = (table[1:] + table[:-1]) / 2
    x = rng.standard_normal(20000).astype(np.float32)
    x[::97], x[1::89], x[2::83] = np.nan, np.inf, 0.0
    force = rng.integers(0, 3, x.size).astype(np.int8)
    for f in (None, force):
        args = (x, boundaries, table, 2.5, 0.01, 31, 64, f)
        codes, positions, out = run_kernel(*args)
        got_codes, got_out = np.empty(x.size, np.uint16), np.zeros(7)
        got_positions = quantize_numpy(*args, got_codes, got_out)
        assert positions.size > 0 and out[3] > 0  # escapes and pruned elements
        assert_same_bits(got_codes, codes)
        assert_same_bits(got_positions, positions)
        assert_same_bits(got_out, out)


@given(pw=weighted_points(), k=st.integers(0, 12), seed=st.integers(0, 2**32 - 1),
       max_iter=st.integers(0, 100), tol=st.sampled_from([0.0, 1e-7, 1e-2]))
def test_kmeans_stand_in_is_the_kernel(pw, k, seed, max_iter, tol):
    points, weights = pw
    uniforms = np.random.default_rng(seed).random(k)
    start = np.unique(points)[:max(1, min(4, points.size))]  # Lloyd only, when k is 0
    want, got = np.full(max(k, start.size), np.nan), np.full(max(k, start.size), np.nan)
    if not k:
        want, got = start.copy(), start.copy()
    expected = kmeans_1d(points, weights, uniforms, want, max_iter, tol)
    assert kmeans_numpy(points, weights, uniforms, got, max_iter, tol) == expected
    assert_same_bits(got, want)


def test_kmeans_stand_in_on_many_points_and_levels():
    rng = np.random.default_rng(3)
    for n, k in ((4000, 64), (3000, 16), (500, 3)):
        points = np.sort(rng.standard_normal(n) * 0.02)
        weights = rng.random(n) * (rng.random(n) < 0.7)
        uniforms = rng.random(k)
        want, got = np.empty(k), np.empty(k)
        expected = kmeans_1d(points, weights, uniforms, want, 100, 1e-7)
        assert expected[1] > 3  # iterations ran
        assert kmeans_numpy(points, weights, uniforms, got, 100, 1e-7) == expected
        assert_same_bits(got, want)


SAVE_BOTH_WAYS = """
import sys, numpy as np, inshrink
from inshrink.encode import fit, quantizer, sketch
rng = np.random.default_rng(0)
state = {}
for i in range(3):
    state[f"model.layers.{i}.weight"] = (rng.standard_normal((64, 48)) * 0.02).astype(np.float32)
    g = (rng.standard_normal((64, 48)) * 1e-3).astype(np.float32)
    state[f"optimizer.state.{i}.exp_avg"] = g
    state[f"optimizer.state.{i}.exp_avg_sq"] = g * g + 1e-12
inshrink.save("numpy.ink", state, policy="balanced", threads=1)
print(sorted(m for m in sys.modules if m.split(".")[0] == "numba"))
sketch.NUMPY_ELEMENTS = quantizer.NUMPY_ELEMENTS = fit._NUMPY_KMEANS_WORK = -1  # kernels
inshrink.save("kernels.ink", state, policy="balanced", threads=1)
print(sorted({m.split(".")[0] for m in sys.modules} & {"numba"}))
"""


def test_a_small_lossy_save_starts_no_numba_and_writes_the_kernels_file(tmp_path):
    r = subprocess.run([sys.executable, "-c", SAVE_BOTH_WAYS], capture_output=True, text=True,
                       cwd=tmp_path, timeout=600,
                       env=dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache")))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split("\n")[:2] == ["[]", "['numba']"]  # then the kernels did run
    assert (tmp_path / "numpy.ink").read_bytes() == (tmp_path / "kernels.ink").read_bytes()
