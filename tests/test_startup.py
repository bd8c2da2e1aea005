"""Start-up: importing inshrink and asking for help stay cheap (no dependency: ml_dtypes,
zstandard, numpy and Numba, whose CPU target imports scipy, come when first needed); kernels
compile on first use, one specialisation each."""
import os
import subprocess
import sys

import numpy as np
import pytest

from inshrink.kernels import Kernel, kernel

HEAVY = ("numba", "llvmlite", "scipy")
# imported only when first needed: bf16/fp8 dtypes, kernels, zstd frames (and numpy by
# inshrink's modules, which neither import nor --help loads)
LAZY = ("ml_dtypes", "numba", "zstandard", "numpy")


def run_python(args, tmp_path, **env):
    environment = dict(os.environ, **env)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          env=environment, cwd=tmp_path, timeout=300)


def imported_modules(importtime_stderr: str) -> set[str]:
    """Module names from ``python -X importtime`` output."""
    return {line.rsplit("|", 1)[1].strip() for line in importtime_stderr.splitlines()
            if line.startswith("import time:") and "|" in line}


def test_import_inshrink_does_not_import_numba(tmp_path):
    r = run_python(["-c", "import sys, inshrink; inshrink.save, inshrink.load; "
                    "print(sorted(m for m in sys.modules if m.split('.')[0] in "
                    f"{HEAVY!r}))"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_import_inshrink_imports_no_dependency(tmp_path):
    r = run_python(["-c", "import sys, inshrink; print(sorted(m for m in sys.modules "
                    f"if m.split('.')[0] in {LAZY!r}))"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


@pytest.mark.parametrize("args", [["--help"], ["compress", "--help"], ["series", "--help"]])
def test_cli_help_imports_no_dependency(tmp_path, args):
    r = run_python(["-X", "importtime", "-m", "inshrink", *args], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "usage" in r.stdout
    modules = imported_modules(r.stderr)
    assert "inshrink.cli.parser" in modules
    assert not {m for m in modules if m.split(".")[0] in LAZY + HEAVY}


def test_dependencies_come_when_first_needed(tmp_path):
    script = """
import sys, inshrink
def loaded():
    return sorted({m.split(".")[0] for m in sys.modules} & {"ml_dtypes", "zstandard"})
inshrink.save, inshrink.File, inshrink.Policy
print(loaded())
import numpy as np
inshrink.save("f.ink", {"a": np.arange(10.0)})
print(loaded())
inshrink.load("f.ink")
from inshrink import dtypes
bf16 = dtypes.by_name("BF16")
print(loaded())
print(bf16.numpy, dtypes.of_numpy(bf16.numpy).name, loaded())
"""
    r = run_python(["-c", script], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == ["[]", "['zstandard']", "['zstandard']",
                                     "bfloat16 BF16 ['ml_dtypes', 'zstandard']"]


def test_an_ml_dtypes_array_imported_by_the_caller_is_stored(tmp_path):
    script = """
import ml_dtypes, numpy as np, inshrink
x = np.linspace(-1, 1, 4096, dtype=np.float32).astype(ml_dtypes.bfloat16)
inshrink.save("b.ink", {"x": x, "e4m3": x.astype(ml_dtypes.float8_e4m3fn)})
back = inshrink.load("b.ink")
print(back["x"].dtype, back["e4m3"].dtype, np.array_equal(back["x"].view(np.uint16),
                                                         x.view(np.uint16)))
"""
    r = run_python(["-c", script], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["bfloat16", "float8_e4m3fn", "True"]


def test_lossless_round_trip_compiles_one_specialisation_per_kernel(tmp_path):
    # read-only and writable, f16/f32/f64/int64 sources: still one signature per kernel
    script = """
import numpy as np, inshrink
from inshrink.kernels import bytegroup
rng = np.random.default_rng(0)
state = {"a": rng.standard_normal(5000).astype(np.float32),
         "b": rng.standard_normal(5000).astype(np.float16),
         "c": np.arange(5000, dtype=np.int64), "d": rng.standard_normal(5000)}
frozen = {k + "_ro": np.frombuffer(v.tobytes(), v.dtype) for k, v in state.items()}
inshrink.save("x.ink", {**state, **frozen}, threads=1)
back = inshrink.load("x.ink", threads=1)
assert all(np.array_equal(back[k], v) for k, v in {**state, **frozen}.items())
names = [n for n in dir(bytegroup) if n.startswith(("split_", "join_"))]
print({n: len(getattr(bytegroup, n).compiled().signatures) for n in names})
"""
    r = run_python(["-c", script], tmp_path, NUMBA_DISABLE_JIT="0")
    assert r.returncode == 0, r.stderr[-2000:]
    counts = eval(r.stdout)
    assert len(counts) == 6 and set(counts.values()) == {1}, counts


def test_kernel_is_compiled_on_first_call_and_keeps_the_function():
    @kernel
    def add_one(x, out):
        for i in range(x.shape[0]):
            out[i] = x[i] + 1

    assert isinstance(add_one, Kernel) and add_one.__name__ == "add_one"
    assert add_one._compiled is None  # nothing compiled at decoration
    out = np.empty(3)
    add_one(np.arange(3.0), out)
    assert out.tolist() == [1.0, 2.0, 3.0]
    assert add_one.py_func.__name__ == "add_one"


def test_due_counts_a_stand_ins_work_until_the_kernel_is_compiled():
    @kernel
    def negate(x, out):
        for i in range(x.shape[0]):
            out[i] = -x[i]

    assert not negate.due(6, 10) and not negate.due(4, 10)  # 10 done: not more than 10
    assert negate.due(1, 10) and negate.due(1, 10)  # from then on, and not compiled yet
    assert not negate.ready
    other = kernel(negate.py_func)
    other(np.ones(2), np.empty(2))
    assert other.ready and other.due(1 << 40, 0)  # compiled: always


def test_kernel_with_signatures_rejects_other_argument_types(tmp_path):
    script = """
import numpy as np
from inshrink.kernels import kernel

@kernel(signatures=["void(Array(float64, 1, 'C', readonly=True), float64[::1])"])
def copy(x, out):
    for i in range(x.shape[0]):
        out[i] = x[i]

out = np.empty(2)
copy(np.ones(2), out)                                  # writable converts to read-only
copy(np.frombuffer(np.ones(2).tobytes()), out)
try:
    copy(np.ones(2, np.float32), out)
except TypeError:
    print("refused", len(copy.compiled().signatures))
"""
    (tmp_path / "sig.py").write_text(script)  # Numba caches functions of files only
    r = run_python(["sig.py"], tmp_path, NUMBA_DISABLE_JIT="0",
                   XDG_CACHE_HOME=str(tmp_path / "cache"))  # a throwaway file's kernel
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["refused", "1"]


def test_a_file_of_small_tensors_never_starts_numba(tmp_path):
    script = """
import sys, numpy as np, inshrink
state = {"step": np.array(7, np.int64), "bias": np.linspace(-1, 1, 300, dtype=np.float32),
         "half": np.linspace(0, 1, 1000, dtype=np.float16)}
inshrink.save("small.ink", state)
back = inshrink.load("small.ink")
assert all(np.array_equal(back[k], v) for k, v in state.items())
print(sorted(m for m in sys.modules if m.split(".")[0] in ("numba", "scipy")))
"""
    r = run_python(["-c", script], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]"


def test_first_calls_from_several_threads_at_once(tmp_path):
    """Threads racing to a kernel's first call (one that calls another kernel) all get it."""
    script = """
import threading, numpy as np
from inshrink.kernels import delta
prev = np.arange(5000, dtype=np.uint16) % 7
counts = np.bincount(prev, minlength=7).astype(np.int64)
want = np.argsort(prev, kind="stable").astype(np.uint16)
start, errors = threading.Barrier(4), []
def work():
    start.wait()
    try:
        out = np.empty_like(prev)
        delta.regroup(prev, np.arange(5000, dtype=np.uint16), counts, out)
        assert np.array_equal(out, want)
    except Exception as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=work) for _ in range(4)]
[t.start() for t in threads]
[t.join() for t in threads]
print(errors)
"""
    r = run_python(["-c", script], tmp_path, NUMBA_DISABLE_JIT="0")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]"
