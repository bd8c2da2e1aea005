"""What a series save costs: the delta of the previous checkpoint is the same file whether what
it refers to was kept in memory or is decoded back from the files, and memory stays bounded."""
import os
import tracemalloc

import numpy as np
import pytest

import inshrink
from inshrink import digest
from inshrink.series import series as series_module
from inshrink.io.rebase import Decoded, write_delta
from inshrink.series.series import Series, checkpoint_file

POLICY = inshrink.Policy(overrides={
    "model.w": inshrink.QuantConfig(bins=16),   # drifts: its code delta is kept
    "opt.m": inshrink.QuantConfig(bins=16),     # new noise each step: its delta is not kept
    "opt.v": inshrink.QuantConfig(bins=2, domain="factored"),
    "model.empty": inshrink.QuantConfig(bins=16)})


def states(n, seed=0):
    """Consecutive checkpoints: a quantized weight of two chunks that drifts, quantized and
    lossless tensors that do not (new noise), a drifting lossless one, an empty, a factored
    and an integer tensor."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((300, 4096)) * 0.02).astype(np.float32)  # > 4 MiB: two chunks
    x = rng.standard_normal(5000).astype(np.float32)
    out = []
    for i in range(n):
        w = w + (rng.standard_normal(w.shape) * 1e-5).astype(np.float32)
        x = x + np.float32(1e-6) * np.sign(x)
        out.append({"model.w": w.copy(), "model.x": x.copy(),
                    "opt.m": (rng.standard_normal(20000) * 1e-3).astype(np.float32),
                    "opt.v": rng.random((64, 32)).astype(np.float32),
                    "model.noise": rng.standard_normal(3000).astype(np.float32),
                    "model.empty": np.zeros((0, 4), np.float32),
                    "step": np.array(i, np.int64)})
    return out


def files(directory):
    return {n: (directory / n).read_bytes() for n in sorted(os.listdir(directory))
            if n != ".lock"}


def save_all(directory, policy, data, reopen=False):
    s = Series(directory, policy=policy, threads=1)
    for step, state in enumerate(data):
        if reopen:  # a resumed writer: nothing of the previous save is in memory
            s = Series(directory, policy=policy, threads=1)
        s.save(step, state)
    return files(directory)


@pytest.mark.parametrize("policy", [POLICY, None], ids=["lossy", "lossless"])
def test_delta_files_are_the_same_from_memory_from_the_files_and_after_a_restart(
        tmp_path, monkeypatch, policy):
    data = states(3)
    in_memory = save_all(tmp_path / "memory", policy, data)
    resumed = save_all(tmp_path / "resumed", policy, data, reopen=True)
    # the new codes held for the save, not kept after it (they need 2.4 MB)
    monkeypatch.setattr(series_module, "RETAIN_BYTES", 3 << 19)
    held = save_all(tmp_path / "held", policy, data)
    monkeypatch.setattr(series_module, "RETAIN_BYTES", 0)
    from_files = save_all(tmp_path / "files", policy, data)
    assert in_memory == resumed == held == from_files
    assert sorted(in_memory) == ["manifest.json", checkpoint_file(0, delta=True),
                                 checkpoint_file(1, delta=True), checkpoint_file(2)]


def test_series_delta_is_what_write_delta_writes_from_arrays_in_memory(tmp_path, monkeypatch):
    """The oracle: each file written whole with its codes and lossless tensors kept in memory,
    then the older one rewritten against the newer from those arrays (how a series saved
    before it decoded them back from its files)."""
    monkeypatch.setattr(series_module, "RETAIN_BYTES", 0)
    old, new = states(2)
    kept = {}
    for step, state in ((0, old), (1, new)):
        with inshrink.Writer(tmp_path / checkpoint_file(step), policy=POLICY, threads=1,
                             keep_codes=True) as w:
            for name, value in state.items():
                w.add(name, value)
            infos = w.close()
        kept[step] = ({i.name: state[i.name].copy() for i in infos if i.lossless}, w.codes)
    (exact0, codes0), (exact1, codes1) = kept[0], kept[1]
    write_delta(tmp_path / checkpoint_file(0), tmp_path / "oracle.ink", src_exact=exact0,
                src_codes=codes0, base_exact=exact1, base_codes=codes1,
                base_file=digest.base_reference(checkpoint_file(1), exact1, codes1))
    save_all(tmp_path / "s", POLICY, [old, new])
    mine = (tmp_path / "s" / checkpoint_file(0, delta=True)).read_bytes()
    assert mine == (tmp_path / "oracle.ink").read_bytes()
    with inshrink.open(tmp_path / "oracle.ink") as f:
        codecs = {i.name: i.codec for i in f.infos()}
    # both kinds of decision are covered: deltas kept and deltas given up
    assert codecs["model.w"].startswith("codedelta+") and codecs["model.x"].startswith("xor+")
    assert "delta" not in codecs["opt.m"] and not codecs["model.noise"].startswith("xor")


def test_decoded_view_of_a_file_matches_what_the_writer_kept(tmp_path):
    state = states(1)[0]
    with inshrink.Writer(tmp_path / "a.ink", policy=POLICY, threads=1, keep_codes=True) as w:
        for name, value in state.items():
            w.add(name, value)
        infos = w.close()
    with inshrink.open(tmp_path / "a.ink") as f:
        codes, exact = Decoded(f, codes=True), Decoded(f, codes=False)
        assert sorted(codes) == sorted(w.codes) == ["model.w", "opt.m"]
        assert sorted(exact) == sorted(i.name for i in infos if i.lossless) == [
            "model.empty", "model.noise", "model.x", "step"]
        assert "opt.v" not in codes and "opt.v" not in exact and len(exact) == 4
        for name in codes:
            assert np.array_equal(codes[name], w.codes[name])
        for name in exact:
            assert exact[name].tobytes() == state[name].tobytes()
        with pytest.raises(KeyError):
            codes["model.x"]
        assert digest.decode_digest(exact, codes) == digest.decode_digest(
            {n: state[n] for n in exact}, w.codes)


def _retained_and_peak(directory, data):
    s = Series(directory, threads=1)
    s.save(0, data[0])
    s.save(1, data[1])
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        s.save(2, data[2])
        after, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return after - before, peak - before


def test_a_series_past_its_memory_budget_keeps_nothing_and_decodes_one_tensor_at_a_time(
        tmp_path, monkeypatch):
    """16 lossless tensors of 256 KiB: within budget the series keeps the newest ones (4 MiB);
    past it, it keeps nothing between saves, and a save holds about one tensor at a time."""
    rng = np.random.default_rng(1)
    base = {f"t{i:02d}": rng.standard_normal(1 << 16).astype(np.float32) for i in range(16)}
    data = [{k: v + np.float32(step * 1e-7) for k, v in base.items()} for step in range(3)]
    size = sum(v.nbytes for v in base.values())
    retained, _ = _retained_and_peak(tmp_path / "within", data)
    assert retained >= size  # a copy: the caller may change its arrays after save returns
    monkeypatch.setattr(series_module, "RETAIN_BYTES", size // 2)
    retained, peak = _retained_and_peak(tmp_path / "past", data)
    assert retained < size // 16
    assert peak < size // 2
