"""Coverage-guided fuzzing of the .ink reader with atheris (libFuzzer).

Usage (see fuzz/README.md)::

    python fuzz/fuzz_reader.py fuzz/corpus -max_total_time=150 -timeout=20

Every input is written to a file in /dev/shm (reused between runs), opened with
:func:`inshrink.open`, every tensor is read and :meth:`File.verify` is called. Any
:class:`inshrink.errors.InshrinkError` is an accepted outcome; any other exception, a hang or
an inconsistent result is a finding.

Almost every byte of an .ink file is covered by a CRC-32, so random mutations of a valid file
nearly always stop at a checksum. To reach the index parser, the codec chain and the kernels,
each input is therefore also tried after repairing its checksums (fuzz/ink_repair.py).

``NUMBA_DISABLE_JIT`` defaults to 1 here: the Numba kernels then run as plain Python, are
instrumented like the rest of the package and show up in coverage. Set ``NUMBA_DISABLE_JIT=0``
to fuzz the compiled kernels instead (they are then left uninstrumented, since Numba cannot
compile instrumented bytecode).
"""
from __future__ import annotations

import atexit
import os
import sys
import tempfile

os.environ.setdefault("NUMBA_DISABLE_JIT", "1")   # must precede the first import of numba
PYTHON_KERNELS = os.environ["NUMBA_DISABLE_JIT"].strip() not in ("", "0")

import atheris  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ink_repair import fix_chunks, fix_container  # noqa: E402  (stdlib only)

with atheris.instrument_imports(
        include=["inshrink"],
        exclude=[] if PYTHON_KERNELS else ["inshrink.kernels.bytegroup"]):
    import inshrink
    from inshrink.dtypes import BY_NAME as DTYPES
    from inshrink.errors import InshrinkError

import numpy as np  # noqa: E402

# Decoding a large tensor through the Python kernels takes seconds per MiB; such inputs are
# opened and validated but their data is not decoded (override with INSHRINK_FUZZ_MAX_DECODE).
MAX_DECODE_BYTES = int(os.environ.get("INSHRINK_FUZZ_MAX_DECODE",
                                      256 << 10 if PYTHON_KERNELS else 1 << 62))


def _scratch() -> tuple[int, str]:
    """One scratch file for every input: in /dev/shm (memory), unlinked at once and reopened
    through /proc/self/fd so nothing is left behind, whatever way the fuzzer exits."""
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    fd, path = tempfile.mkstemp(prefix="inshrink-fuzz-", suffix=".ink", dir=shm)
    proc = f"/proc/self/fd/{fd}"
    if os.path.exists(proc):
        os.unlink(path)
        return fd, proc
    atexit.register(os.unlink, path)
    return fd, path


SCRATCH_FD, PATH = _scratch()


def _write(data: bytes) -> None:
    os.ftruncate(SCRATCH_FD, 0)
    os.pwrite(SCRATCH_FD, data, 0)


def check_file(data: bytes) -> None:
    """Open, read every tensor and verify; raise on anything but a typed error."""
    _write(data)
    try:
        f = inshrink.open(PATH, threads=1)
    except InshrinkError:
        return
    with f:
        names = f.keys()
        assert len(names) == len(set(names)) == len(f), "duplicate or inconsistent keys"
        metadata = f.metadata
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
        infos = {name: f.info(name) for name in names}
        if sum(i.nbytes for i in infos.values()) > MAX_DECODE_BYTES:
            return
        all_read = True
        for name, info in infos.items():
            try:
                array = f[name]
            except InshrinkError:
                all_read = False
                continue
            assert isinstance(array, np.ndarray), type(array)
            assert array.shape == info.shape, (name, array.shape, info.shape)
            assert array.nbytes == info.nbytes, (name, array.nbytes, info.nbytes)
            assert array.dtype == DTYPES[info.dtype].numpy, (name, array.dtype, info.dtype)
        problems = f.verify()  # every damaged tensor, never an exception for one
        assert all(isinstance(p, str) and p.startswith("tensor ") for p in problems), problems
        verified = not problems
        if f.base is not None:
            # a delta file read without its base: its delta tensors cannot be read, but
            # verify() still checks their streams; a failed verify must still fail a read
            assert verified or not all_read, "verify() failed but every tensor read"
            return
        # verify() decodes exactly what reading does, so the two must agree.
        assert verified == all_read, f"verify()={verified} but reading every tensor={all_read}"


def TestOneInput(data: bytes) -> None:  # noqa: N802 (libFuzzer's name)
    seen = []
    for label, variant in (("the input as given", data),
                           ("ink_repair.fix_container(input)", fix_container(data)),
                           ("ink_repair.fix_chunks(input)", fix_chunks(data))):
        if variant is None or variant in seen:
            continue
        seen.append(variant)
        try:
            check_file(variant)
        except BaseException:
            print(f"\nfuzz_reader: the failing file is {label}", file=sys.stderr)
            raise


def kernel_self_check() -> None:
    """Compare byte-group encoding and decoding with a plain-Python reference.

    The fuzzer cannot tell wrong tensor data from right data, so a kernel that decodes wrongly
    without raising would go unnoticed; this oracle covers that, for every word width and both
    rotation settings, in whichever mode (compiled or Python) the kernels run. It goes through
    the codec functions the reader calls, not through the kernels' own calling convention.
    """
    from inshrink.codecs import entropy, lossless

    rng = np.random.default_rng(0)
    for word, utype in ((2, np.uint16), (4, np.uint32), (8, np.uint64)):
        bits = 8 * word
        edges = [0, 1, (1 << bits) - 1, 1 << (bits - 1), (1 << (bits - 1)) - 1, 0x80, 0x7F]
        words = np.concatenate([np.array(edges, np.uint64).astype(utype),
                                rng.integers(0, 1 << 63, 64, np.uint64, True).astype(utype)])
        for rotate in (False, True):
            x = [int(v) for v in words]
            if rotate:
                x = [((v << 1) | (v >> (bits - 1))) & ((1 << bits) - 1) for v in x]
            want = [bytes((v >> (8 * (word - 1 - k))) & 0xFF for v in x) for k in range(word)]
            stage = lossless.ByteGroup(word, rotate)
            label = f"word {word}, rotate {rotate}"
            try:
                encoded = lossless.encode_chunk(words.view(np.uint8), stage, None)
                planes = [bytes(entropy.decode(coding, payload, words.size))
                          for coding, payload in encoded]
                out = np.zeros(words.nbytes, np.uint8)
                lossless.decode_chunk([("raw", p) for p in want], stage, out)
            except Exception as exc:
                raise AssertionError(f"byte-group codec failed ({label}): {exc!r}") from exc
            if planes != want:
                raise AssertionError(f"byte-group encoding gives wrong planes ({label})")
            if out.tobytes() != words.tobytes():
                raise AssertionError(f"byte-group decoding gives wrong words ({label})")


def _ensure_corpus(argv: list[str]) -> None:
    """Create the seed corpus when the first corpus directory is missing or empty."""
    dirs = [a for a in argv[1:] if not a.startswith("-")]
    if not dirs or (os.path.isdir(dirs[0]) and os.listdir(dirs[0])):
        return
    if os.path.exists(dirs[0]) and not os.path.isdir(dirs[0]):
        return  # a single input file to reproduce
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from make_corpus import write_corpus
    for path in write_corpus(dirs[0]):
        print(f"seed: {path}", file=sys.stderr)


def main() -> None:
    print(f"fuzz_reader: kernels {'as Python (instrumented)' if PYTHON_KERNELS else 'compiled by Numba'}"
          f", scratch file {PATH}", file=sys.stderr)
    kernel_self_check()
    _ensure_corpus(sys.argv)
    for arg in sys.argv[1:]:
        if arg.startswith("-artifact_prefix=") and arg.endswith("/"):
            os.makedirs(arg.split("=", 1)[1], exist_ok=True)
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
