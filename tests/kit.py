"""The test kit: checks that every codec stage, pipeline, array frame and frozen vector must
pass, and the small helpers many test files share (the command line in a subprocess, a
checkpoint series' states, an .ink file's index edited in place).

The codec checks take one object and what it is given and verify what the format promises of
it, the way numcodecs' ``tests/common.py`` checks a codec:

* :func:`check_stage` -- a stage's stored parameters survive ``to_dict`` / ``from_dict``
  (and JSON), it names its format minor, and a chunk round-trips through a
  :class:`~inshrink.codecs.chain.Pipeline` in memory, bit-exact where the stage is lossless;
* :func:`check_pipeline` -- a chain encodes and decodes chunks in memory: one stored stream per
  stream of the stage, sizes the chain accepts (rule C-5), the same bytes every time;
* :func:`check_frame` -- an array round-trips through an array frame (spec section 24);
* :func:`check_vector` -- a file under spec/vectors/ decodes to what its manifest expects.

What a chunk decodes to is computed here from the format's definition of each stage, in
numpy, independently of the decoder under test (:func:`expected_bytes`).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

import inshrink.errors
from inshrink import dtypes
from inshrink.codecs import quant
from inshrink.codecs.base import ArrayStage, DeltaStage, Stage
from inshrink.codecs.chain import Pipeline
from inshrink.codecs.delta import CodeDelta, Xor
from inshrink.codecs.entropy import Entropy
from inshrink.codecs.factored import Factored
from inshrink.codecs.lossless import ByteGroup
from inshrink.codecs.quant import Quant, QuantChunk

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The repository's root: the ``inshrink`` a subprocess of a test must import."""
TESTS = os.path.join(ROOT, "tests")
VECTORS = Path(ROOT) / "spec" / "vectors"

MINORS = {"bytegroup": 0, "quant": 1, "xor": 2, "codedelta": 2, "factored": 4, "zstd": 0}
"""The format minor version (of major 1) that first defines each stage (spec section 14)."""


# -- numbers ------------------------------------------------------------------------------------

def start_lossy_kernels() -> None:
    """Start Numba for the kernels a lossy save would first run as numpy stand-ins, so that
    the next save compiles (or loads) them, as a process that has saved enough does: for a
    warm-up that must leave nothing to compile later."""
    from inshrink.kernels import quant as kernels
    for k in (kernels.sketch_words, kernels.quantize_chunk, kernels.kmeans_1d):
        k.compiled()


def rel_l2(a, b) -> float:
    """||a - b|| / ||a||, in float64."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(a))


# -- codec stages and pipelines -------------------------------------------------------------

def fit_quantizer(x: np.ndarray, bins: int, *, domain: str | None = "linear",
                  protect: float = 0.0, prune: float = 0.0, alpha: float = 0.005):
    """``(encoder, sum of squares)``: the quantizer fitted to the whole of ``x`` (F64, F32,
    F16 or BF16) the way the writer fits a tensor's, from one sketch of it."""
    from inshrink.encode.fit import fit
    from inshrink.encode.sketch import Sketch, work_dtype

    dtype = dtypes.of_numpy(x.dtype)
    sketch = Sketch.for_dtype(dtype, alpha, bins)
    sketch.add(np.ascontiguousarray(x.reshape(-1).astype(work_dtype(dtype))))
    encoder = fit(sketch, dtype, bins=bins, domain=domain, prune=prune, protect=protect)
    return encoder, sketch.sumsq


def quantized(x: np.ndarray, bins: int, **fit_args) -> tuple[Quant, QuantChunk, Any, float]:
    """``(stage, chunk, stats, sum of squares)``: ``x`` quantized as one chunk by
    :func:`fit_quantizer`'s encoder (``stats``: the error it reports)."""
    encoder, sumsq = fit_quantizer(x, bins, **fit_args)
    chunk, stats = encoder.quantize(np.ascontiguousarray(x).reshape(-1).view(np.uint8))
    return encoder.stage, chunk, stats, sumsq


def expected_bytes(stage: ArrayStage, chunk: Any, dtype: dtypes.DType) -> bytes:
    """What ``chunk`` (what ``stage.encode`` takes) decodes to by the format's definition of
    the stage: the element bytes of ``bytegroup``; the levels the codes name, escaped elements
    replaced by their stored values, for ``quant``; ``a[i] × b[j]`` in the dtype for
    ``factored``."""
    if isinstance(stage, ByteGroup):
        return np.asarray(chunk, np.uint8).tobytes()
    if isinstance(stage, Quant):
        word = quant.WORDS[dtype.itemsize]
        words = stage.levels.view(word)[chunk.codes] if stage.levels.size else \
            np.zeros(chunk.codes.size, word)
        words[chunk.positions] = np.frombuffer(chunk.values.tobytes(), word)
        return words.tobytes()
    if isinstance(stage, Factored):
        rows = np.asarray(chunk, dtype.numpy)
        with np.errstate(over="ignore", under="ignore"):
            return (rows[:, None] * stage.columns[None, :]).astype(dtype.numpy).tobytes()
    raise TypeError(f"no definition of what a {type(stage).__name__} chunk decodes to")


def _element_count(stage: ArrayStage, chunk: Any, dtype: dtypes.DType) -> int:
    if isinstance(stage, ByteGroup):
        return np.asarray(chunk).size // dtype.itemsize
    if isinstance(stage, Quant):
        return chunk.codes.size
    return np.asarray(chunk).size * stage.columns.size  # factored: rows × columns


def check_pipeline(pipeline: Pipeline, chunks: list, dtype: dtypes.DType, *,
                   refs: list | None = None, expected: list | None = None) -> list[bytes]:
    """Encode and decode each chunk of ``chunks`` with ``pipeline`` in memory and check it.

    Parameters
    ----------
    pipeline : Pipeline
        The chain under test.
    chunks : list
        What :meth:`Pipeline.encode` takes, one entry per chunk.
    dtype : inshrink.dtypes.DType
        The tensor's element type.
    refs : list, optional
        The base's same chunk for each chunk, for a delta chain (bytes for ``xor``, codes for
        ``codedelta``).
    expected : list of bytes, optional
        What each chunk decodes to; by default :func:`expected_bytes` of the chunk (for a
        ``codedelta`` chain, of the chunk the delta was taken from: its codes are restored).

    Returns
    -------
    list of bytes
        The decoded element bytes of each chunk.

    Checks: the chain survives :meth:`Pipeline.from_chain`; each chunk has one stored entry
    per stream, of a coding and decoded size the entropy stage gives, stored sizes the chain
    accepts (rule C-5), a payload no larger than the stream; encoding twice gives the same
    payloads; the decoded bytes are the expected ones; a ``quant`` chain returns the codes.
    """
    refs = [None] * len(chunks) if refs is None else refs
    again = Pipeline.from_chain(pipeline.chain(), dtype, has_base=pipeline.is_delta)
    assert again.stages == pipeline.stages and again.chain() == pipeline.chain()
    assert json.loads(json.dumps(pipeline.chain())) == pipeline.chain()
    decoded = []
    for k, (chunk, ref) in enumerate(zip(chunks, refs)):
        n = _element_count(pipeline.stage, chunk, dtype)
        encoded = pipeline.encode(chunk, ref)
        assert len(encoded) == pipeline.streams
        sizes = [size for _, _, size in encoded]
        assert pipeline.sizes_ok(n, sizes, dtype.itemsize), (n, sizes)
        for coding, payload, size in encoded:
            assert coding in ("zstd", "raw")
            assert len(memoryview(payload).cast("B")) <= size  # raw when zstd does not shrink
        twice = pipeline.encode(chunk, ref)
        assert [(c, bytes(p), s) for c, p, s in twice] == \
            [(c, bytes(p), s) for c, p, s in encoded], "encoding is not deterministic"
        out = np.empty(n * dtype.itemsize, np.uint8)
        returned = pipeline.decode(encoded, out, ref)
        want = expected[k] if expected is not None else expected_bytes(pipeline.stage, chunk,
                                                                       dtype)
        assert out.tobytes() == want, f"chunk {k} decodes to other bytes"
        if isinstance(pipeline.stage, Quant):  # the codes, with or without a code delta
            assert np.array_equal(returned, chunk.codes)
        decoded.append(out.tobytes())
    return decoded


def check_parameters(stage: Stage, dtype: dtypes.DType) -> None:
    """``stage``'s stored parameters survive ``to_dict`` / ``from_dict``, through JSON text
    too; equality and hashing follow them; the stage names its format minor."""
    stored = stage.to_dict()
    assert stored["id"] == stage.id
    text = json.loads(json.dumps(stored, allow_nan=False))
    again = type(stage).from_dict(text, dtype)
    assert again == stage and hash(again) == hash(stage) and again is not stage
    assert again.to_dict() == stored
    assert stage.minor == MINORS[stage.id]


def check_stage(stage: Stage | Entropy, chunk: Any, dtype: dtypes.DType | None = None, *,
                array_stage: ArrayStage | None = None, ref: Any = None,
                entropy: Entropy | None = None) -> bytes:
    """Check one codec stage on one chunk, in memory.

    Parameters
    ----------
    stage : Stage or Entropy
        An array stage (``bytegroup``, ``quant``, ``factored``), a delta stage (``xor``,
        ``codedelta``: then ``array_stage`` is the stage it precedes and ``ref`` the base's
        chunk), or the entropy stage (then ``chunk`` is a byte buffer).
    chunk
        What the chain's array stage encodes: element bytes (uint8) for ``bytegroup``, a
        :class:`~inshrink.codecs.quant.QuantChunk` for ``quant``, the row factors for
        ``factored``.
    dtype : inshrink.dtypes.DType
        The tensor's element type (not for the entropy stage).
    entropy : Entropy, optional
        The entropy stage of the pipeline (default: the default one).

    Returns
    -------
    bytes
        What the chunk decoded to.

    Checks :func:`check_parameters` of every stage of the chain, the chain's minor (the
    largest of its stages'), then :func:`check_pipeline` on the chunk: for ``bytegroup``
    (with or without ``xor``), bit-exact; for ``quant`` and ``factored``, the values their
    definition gives; a ``codedelta`` chunk decodes as the same chunk without the delta does.
    """
    if isinstance(stage, Entropy):
        return _check_entropy(stage, chunk)
    if isinstance(stage, DeltaStage):
        assert array_stage is not None and array_stage.id == stage.applies_to
        delta, array_stage = stage, array_stage
    else:
        delta, array_stage = None, stage
    pipeline = Pipeline(array_stage, delta, entropy or Entropy())
    for s in pipeline.stages:
        check_parameters(s, dtype)
    assert pipeline.minor == max(MINORS[s.id] for s in pipeline.stages)
    assert pipeline.is_delta == (delta is not None)
    expected = None
    if isinstance(delta, CodeDelta):  # the codes come back, so the plain chunk's values do
        expected = [expected_bytes(array_stage, chunk, dtype)]
    elif isinstance(delta, Xor):
        expected = [np.asarray(chunk, np.uint8).tobytes()]
    return check_pipeline(pipeline, [chunk], dtype, refs=[ref], expected=expected)[0]


def _check_entropy(stage: Entropy, data) -> bytes:
    """The entropy stage: a stream comes back byte for byte, stored raw when zstd does not
    shrink it, any level decoding alike."""
    assert stage.minor == MINORS[stage.id]
    raw = bytes(memoryview(data).cast("B"))
    coding, payload, size = stage.encode(data)
    assert size == len(raw) and coding in ("zstd", "raw")
    if coding == "raw":
        assert bytes(payload) == raw
    else:
        assert len(payload) < len(raw)
    back = Entropy.decode(coding, payload, size)
    assert bytes(back) == raw
    return bytes(back)


# -- array frames -----------------------------------------------------------------------------

def check_frame(array, **encode_args) -> np.ndarray:
    """Encode ``array`` into an array frame (:func:`inshrink.io.frame.encode`, with
    ``encode_args``) and decode it; returns the decoded array.

    Checks: the frame starts with the magic and is the same bytes when encoded again; the
    decoded array has the shape and dtype; it is bit-exact unless ``bins`` is given (then the
    frame carries its report, and :func:`inshrink.io.frame.report` returns it); decoding
    with ``max_nbytes`` the array's size succeeds.
    """
    from inshrink.io import frame

    x = np.asarray(array)
    blob = frame.encode(x, **encode_args)
    assert isinstance(blob, bytes) and blob.startswith(frame.MAGIC)
    assert frame.encode(x, **encode_args) == blob, "the frame is not deterministic"
    y = frame.decode(blob, max_nbytes=max(x.nbytes, 1))
    assert y.shape == x.shape and y.dtype == dtypes.of_numpy(x.dtype).numpy
    lossy = encode_args.get("bins") is not None and frame.report(blob) is not None
    if not lossy:
        assert frame.report(blob) is None
        assert y.tobytes() == np.ascontiguousarray(x).astype(y.dtype, copy=False).tobytes()
    return y


# -- frozen test vectors ------------------------------------------------------------------------

def decoded_base(path) -> tuple[dict, dict]:
    """What a delta refers to in the checkpoint at ``path``: its lossless tensors and the
    codes of its quantized ones."""
    import inshrink

    with inshrink.open(path) as f:
        exact = f.load(names=[i.name for i in f.infos() if i.lossless])
        codes = {i.name: f.codes(i.name) for i in f.infos() if i.quantized}
    return exact, codes


def vector_entry(path: Path) -> tuple[dict, dict]:
    """``(folder manifest, the manifest's positive entry)`` of a vector file."""
    path = Path(path)
    manifest = json.loads((path.parent / "manifest.json").read_text(encoding="utf-8"))
    entry = next(e for e in manifest["positive"] if e["file"] == path.name)
    return manifest, entry


def check_vector(path) -> None:
    """A positive vector under spec/vectors/ (an .ink file of any frozen version, or an
    array frame) decodes to what its expected JSON file says, bit for bit.

    For an .ink file: it verifies, against its base vector when it has one; names, order,
    metadata, the safetensors header, and per tensor dtype, shape, size, SHA-256 and hex of
    the decoded bytes match. For an array frame: dtype, shape, bytes and report match.
    """
    path = Path(path)
    manifest, entry = vector_entry(path)
    expected = json.loads((path.parent / entry["expected"]).read_text(encoding="utf-8"))
    if path.suffix == ".inka":
        _check_array_vector(path, expected)
        return
    import inshrink

    assert expected["format_version"] == manifest["format_version"]
    base = base_codes = None
    if "base" in entry:
        base, base_codes = decoded_base(path.parent / entry["base"])
    with inshrink.File(path, threads=1, base=base, base_codes=base_codes) as f:
        assert f.verify() == []
        assert f.keys() == [t["name"] for t in expected["tensors"]]
        assert f.metadata == expected["metadata"]
        assert f.safetensors_header == expected["safetensors_header"]
        for t in expected["tensors"]:
            info = f.info(t["name"])
            array = f[t["name"]]
            assert (info.dtype, list(info.shape), info.nbytes) == \
                (t["dtype"], t["shape"], t["nbytes"])
            assert list(array.shape) == t["shape"]
            assert array.dtype == dtypes.by_name(t["dtype"]).numpy
            raw = array.tobytes()
            assert hashlib.sha256(raw).hexdigest() == t["sha256"], t["name"]
            assert raw.hex() == t["hex"], t["name"]


def _check_array_vector(path: Path, expected: dict) -> None:
    from inshrink.io import frame

    data = path.read_bytes()
    decoded = frame.decode(data)
    assert dtypes.of_numpy(decoded.dtype).name == expected["dtype"]
    assert list(decoded.shape) == expected["shape"]
    assert decoded.tobytes().hex() == expected["hex"]
    assert hashlib.sha256(decoded.tobytes()).hexdigest() == expected["sha256"]
    assert frame.report(data) == expected["report"]


# -- the command line ---------------------------------------------------------------------------

def run_cli(*args, cwd, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m inshrink ARGS`` in ``cwd``, importing this checkout's ``inshrink``;
    stdout and stderr as text."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "inshrink", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, env=env, timeout=timeout)


def one_line_error(r: subprocess.CompletedProcess, code: int) -> str:
    """The stderr of a command that failed with exit status ``code``: one line, no
    traceback."""
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    return r.stderr


# -- checkpoint series ----------------------------------------------------------------------------

def assert_same_tensors(a: dict, b: dict, *, in_order: bool = True) -> None:
    """Two dicts of arrays hold the same names (``in_order``: in the same order), dtypes and
    bytes."""
    assert (list(a) == list(b)) if in_order else (sorted(a) == sorted(b))
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), k


def series_state(step: int, size: int = 4096) -> dict:
    """The state a series test saves at ``step``: ``model.w`` (``size`` F32 values, rows of
    64, seeded by the step) and ``step``."""
    rng = np.random.default_rng(step)
    return {"model.w": rng.standard_normal((size // 64, 64)).astype(np.float32),
            "step": np.array(step, np.int64)}


def assert_restores(series, steps, sizes: dict | None = None, *, verify: bool = True) -> None:
    """``series`` lists exactly ``steps`` and restores each to :func:`series_state` of it,
    bit for bit (``sizes``: the state's size of the steps saved with another one);
    ``verify``: and :meth:`Series.verify` finds nothing wrong."""
    assert series.steps() == sorted(steps)
    if verify:
        assert series.verify() == []
    for step in steps:
        expected = series_state(step, *([sizes[step]] if sizes and step in sizes else []))
        got = series.load(step)
        assert sorted(got) == sorted(expected)
        assert all(got[k].tobytes() == expected[k].tobytes() for k in expected), step


# -- .ink files edited in place -------------------------------------------------------------------

def edit_index(path, edit, compact: bool = False) -> None:
    """Rewrite the (plain JSON) index of the .ink file at ``path`` with ``edit(doc)``
    applied, checksums made right; ``compact``: written in the writer's form (no spaces),
    which the parser reads its short way when nothing else is wrong."""
    if os.path.join(ROOT, "fuzz") not in sys.path:
        sys.path.insert(0, os.path.join(ROOT, "fuzz"))
    import ink_repair

    path = Path(path)
    data = path.read_bytes()
    offset, doc = ink_repair.read_index(data)
    edit(doc)
    text = (json.dumps(doc, separators=(",", ":"), ensure_ascii=False) if compact
            else json.dumps(doc))
    path.write_bytes(ink_repair.replace_index(data, offset, text.encode()))


PROBLEM = re.compile(r"""tensor (?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"): (\w+): """)


def problem_class(problem: str) -> type:
    """The error class a ``File.verify`` problem names (``tensor 'name': Class: message``)."""
    match = PROBLEM.match(problem)
    assert match, problem
    return getattr(inshrink.errors, match.group(1))
