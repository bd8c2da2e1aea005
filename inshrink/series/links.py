"""The links of a series' chains: a keyframe, then each delta file decoded against the file
decoded before it, every link checked (spec sections 23 and 25).

A link's base is identified by its decode digest (:func:`decode_digest`), what it decodes to,
not by the bytes of its file, which change when the file is rewritten as a delta; a file is
checked against its manifest by :func:`file_sha256`. :func:`replay` restores one step along
its chain, :func:`decode_each_link` verifies a whole series decoding each file once. Both
:class:`~.series.Series` and the DCP series decode with them; what a link is (a checkpoint, a
rank's file of a step) and how it is checked against the manifest is theirs to say.
"""
from __future__ import annotations

import hashlib
from typing import Callable, Iterator, Mapping, Protocol, Sequence, TypeVar

import numpy as np

from .. import digest as _digest
from ..errors import BaseMismatchError, InshrinkError
from ..io.file import File

L = TypeVar("L")
"""A link of a chain: what the caller decodes as one file (a checkpoint, a rank's file)."""
L_in = TypeVar("L_in", contravariant=True)


class DecodeLink(Protocol[L_in]):
    """Decode ``link`` against what ``previous`` (None for a keyframe) decoded to, checked
    first; returns the decoded tensors, the exact ones and the codes (see :func:`decode_link`)."""

    def __call__(self, link: L_in, previous: L_in | None, exact: dict[str, np.ndarray],
                 codes: dict[str, np.ndarray], *, whole: bool, with_codes: bool
                 ) -> tuple[dict, dict, dict]: ...


def decode_digest(exact: Mapping[str, np.ndarray], codes: Mapping[str, np.ndarray],
                  version: int = _digest.LATEST) -> str:
    """SHA-256 of what a delta decodes against: the exact bytes of a checkpoint's lossless
    tensors and the codes of its quantized ones (spec section 23.1), by definition
    ``version`` (see :mod:`inshrink.digest`). It does not change when the checkpoint's own
    file is rewritten as a delta, unlike the file's bytes."""
    return _digest.decode_digest(exact, codes, version)


def file_sha256(path: str) -> str:
    """SHA-256 of the bytes of the file at ``path``, as a manifest holds it (hexadecimal)."""
    digest = hashlib.sha256()
    block = bytearray(1 << 20)  # one buffer for the whole file
    view = memoryview(block)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(block):
            digest.update(view[:n])
    return digest.hexdigest()


def decode_link(path: str, exact: dict[str, np.ndarray], codes: dict[str, np.ndarray],
                previous: str | None, *, whole: bool, with_codes: bool = True,
                threads: int | None = None) -> tuple[dict, dict, dict]:
    """Decode one file of a chain against what the file before it (named ``previous``, None
    for a keyframe) decoded to: its exact tensors and codes. Checks the file's base digest
    first (BaseMismatchError naming ``path``).

    Returns the decoded tensors (every one if ``whole``, else only the exact ones), the exact
    (lossless) ones, which with the codes of the quantized ones are what the next link refers
    to and digests, and those codes (unless ``with_codes`` is false).

    Lossy tensors that are not quantized (e.g. factored) are never part of a base: a save
    digests only exact tensors and codes, so loading and verifying must too."""
    with File(path, threads=threads, base=exact, base_codes=codes) as f:
        # rule B-3: before any tensor of the file is read
        if previous is None and f.base:
            raise BaseMismatchError(f"[B-3] {path}: a delta file (its base has digest "
                                    f"{f.base['sha256']}) where a whole file was expected")
        if previous is not None:
            expected = decode_digest(exact, codes, _digest.version_of(f.base, path))
            if not f.base:
                raise BaseMismatchError(f"[B-3] {path}: a whole file where a delta against "
                                        f"{previous} was expected")
            if f.base["sha256"] != expected:
                raise BaseMismatchError(
                    f"[B-3] {path}: made against a base with digest {f.base['sha256']}, but "
                    f"{previous} decodes to {expected}")
        lossy = [i.name for i in f.infos() if not i.lossless]
        decoded = f.load() if whole else f.load(
            names=[n for n in f.keys() if n not in lossy])
        new_codes = {i.name: f.codes(i.name) for i in f.infos()
                     if i.quantized} if with_codes else {}
    new_exact = {n: a for n, a in decoded.items() if n not in lossy}
    return decoded, new_exact, new_codes


def replay(chain: Sequence[L], decode: DecodeLink[L], *, codes_of_last: bool = True
           ) -> tuple[dict, dict]:
    """Restore the last link of ``chain`` (its keyframe first): decode each link against what
    the one before it decoded to. Returns the last link's tensors and (unless
    ``codes_of_last`` is false) the codes of its quantized ones."""
    state: dict[str, np.ndarray] = {}
    codes: dict[str, np.ndarray] = {}
    for _, state, codes in replay_each(chain, decode, codes_of_last=codes_of_last):
        pass
    return state, codes


def replay_each(chain: Sequence[L], decode: DecodeLink[L], *, whole: bool = False,
                codes_of_last: bool = True) -> Iterator[tuple[L, dict, dict]]:
    """:func:`replay`, link by link: each link of ``chain`` with what it decoded to (every
    tensor of the last link, and of every link with ``whole``; else only the exact ones) and
    the codes of its quantized ones (unless it is the last and ``codes_of_last`` is false)."""
    exact: dict[str, np.ndarray] = {}
    codes: dict[str, np.ndarray] = {}
    previous = None
    for i, link in enumerate(chain):
        last = i == len(chain) - 1
        state, exact, codes = decode(link, previous, exact, codes, whole=whole or last,
                                     with_codes=codes_of_last or not last)
        previous = link
        yield link, state, codes


def decode_each_link(keyframes: Sequence[L], deltas_against: Callable[[L], Sequence[L]],
                     decode: DecodeLink[L], step_of: Callable[[L], int]
                     ) -> tuple[list[str], list[L]]:
    """Decode every link of a series once, whole (so every tensor is checked, as a restore
    would): each keyframe, then the deltas against it, each against what its base decoded to.

    Returns the problems (``"step N: error"``; the deltas against a link that fails are not
    tried) and the links tried, decoded or not: a link not among them cannot be restored."""
    problems: list[str] = []
    tried: list[L] = []
    todo: list[tuple[L, L | None, dict, dict]] = [(k, None, {}, {}) for k in keyframes]
    while todo:
        link, previous, exact, codes = todo.pop()
        tried.append(link)
        try:
            _, exact, codes = decode(link, previous, exact, codes, whole=True, with_codes=True)
        except (InshrinkError, OSError) as exc:
            problems.append(f"step {step_of(link)}: {exc}")
            continue  # what depends on it is the caller's to report as unreachable
        todo.extend((d, link, exact, codes) for d in deltas_against(link))
    return problems, tried
