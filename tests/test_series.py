"""Checkpoint series: deltas against the previous checkpoint, keyframes, integrity, retention."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import inshrink
from inshrink import errors
from inshrink.series.series import Series
from kit import assert_same_tensors as assert_same, problem_class


def trajectory(n, seed=0):
    """n checkpoints of a slowly drifting model plus an integer counter."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((128, 96)) * 0.02).astype(np.float32)
    states = []
    for i in range(n):
        w = w + (rng.standard_normal(w.shape) * 1e-5).astype(np.float32)
        states.append({"model.w": w.copy(), "optimizer.state.0.step": np.array(i, np.int64),
                       "model.b": np.full(8, i, np.float16)})
    return states


def test_twenty_checkpoints_restore_exactly_with_keyframes(tmp_path):
    series = Series(tmp_path / "s", keyframe_every=5)
    states = trajectory(20)
    for step, state in enumerate(states):
        series.save(step * 10, state)
    entries = series.checkpoints()
    # the newest is whole; older ones are deltas against the next, with a keyframe kept
    # wherever a chain would exceed five files
    assert [e.keyframe for e in entries] == [i % 5 == 4 for i in range(20)]
    assert [e.base for e in entries[:4]] == [entries[i + 1].file for i in range(4)]
    assert len(series.chain(190)) == 1
    for step, state in enumerate(states):
        assert_same(series.load(step * 10), state)
        assert len(series.chain(step * 10)) <= 5
    assert series.verify() == []
    # deltas are never larger than the standalone file, and smaller for the drifting weights
    standalone = tmp_path / "alone.ink"
    inshrink.save(standalone, states[1])
    assert entries[1].bytes < os.path.getsize(standalone)


def test_lossy_series_equals_standalone_encoding(tmp_path):
    series = Series(tmp_path / "s", policy="aggressive", keyframe_every=3)
    states = trajectory(6, seed=1)
    for step, state in enumerate(states):
        series.save(step, state)
    for step, state in enumerate(states):
        inshrink.save(tmp_path / "one.ink", state, policy="aggressive")
        assert_same(series.load(step), inshrink.load(tmp_path / "one.ink"))


def test_tensors_added_removed_and_reshaped(tmp_path):
    series = Series(tmp_path / "s")
    a = {"x": np.arange(12, dtype=np.float32).reshape(3, 4), "gone": np.ones(3)}
    b = {"x": np.arange(12, dtype=np.float32).reshape(4, 3), "new": np.zeros(2, np.int8)}
    c = {"x": np.arange(12, dtype=np.float64).reshape(4, 3), "new": np.ones(2, np.int8)}
    for step, state in enumerate((a, b, c)):
        series.save(step, state)
    for step, state in enumerate((a, b, c)):
        assert_same(series.load(step), state)


def test_resume_continues_the_chain(tmp_path):
    states = trajectory(4)
    first = Series(tmp_path / "s", keyframe_every=10)
    first.save(0, states[0])
    first.save(1, states[1])
    resumed = Series(tmp_path / "s", keyframe_every=10)
    assert resumed.steps() == [0, 1] and resumed.latest() == 1
    resumed.save(2, states[2])
    assert resumed.checkpoints()[-2].base == "step_000000000002.ink"
    for step in range(3):
        assert_same(resumed.load(step), states[step])
    with pytest.raises(errors.InvalidArgumentError, match="after"):
        resumed.save(2, states[3])


def test_modified_or_missing_base_is_a_typed_error(tmp_path):
    series = Series(tmp_path / "s")
    for step, state in enumerate(trajectory(3)):
        series.save(step, state)
    files = [e.file for e in series.checkpoints()]
    assert files == ["step_000000000000.d.ink", "step_000000000001.d.ink",
                     "step_000000000002.ink"]
    newest = tmp_path / "s" / files[2]
    data = bytearray(newest.read_bytes())
    data[100] ^= 1
    newest.write_bytes(bytes(data))
    with pytest.raises(errors.BaseMismatchError, match="step_000000000002.ink"):
        series.load(0)
    assert any("step 0" in p for p in series.verify())
    (tmp_path / "s" / files[1]).unlink()
    with pytest.raises(errors.BaseMismatchError, match="missing"):
        series.load(0)


def test_a_swapped_base_is_detected_by_content(tmp_path):
    series = Series(tmp_path / "s")
    states = trajectory(3)
    for step, state in enumerate(states):
        series.save(step, state)
    # a newest file that is valid but holds other data, with the manifest updated to match:
    # file checks pass, the decode digest recorded in the older delta does not
    inshrink.save(tmp_path / "s" / "step_000000000002.ink", states[0])
    from inshrink.series.series import file_sha256
    import json
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    manifest["checkpoints"][2]["sha256"] = file_sha256(str(tmp_path / "s" /
                                                           "step_000000000002.ink"))
    (tmp_path / "s" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(errors.BaseMismatchError, match="digest"):
        Series(tmp_path / "s").load(1)


def test_delta_file_refuses_the_wrong_base(tmp_path):
    series = Series(tmp_path / "s")
    states = trajectory(2)
    series.save(0, states[0])
    series.save(1, states[1])
    delta = tmp_path / "s" / "step_000000000000.d.ink"
    with pytest.raises(errors.BaseMismatchError):
        inshrink.load(delta)
    with pytest.raises(errors.BaseMismatchError):
        with inshrink.File(delta, base={"model.w": np.zeros((2, 2), np.float32)}) as f:
            f.load()
    # the keywords load and open used to take: still honoured, with a warning
    with pytest.warns(DeprecationWarning, match="inshrink.File"):
        with pytest.raises(errors.BaseMismatchError):
            inshrink.load(delta, base={"model.w": np.zeros((2, 2), np.float32)})
    with pytest.warns(DeprecationWarning):
        with inshrink.open(delta, base_codes={}) as f:
            assert f.base is not None
    with pytest.raises(TypeError, match="bases"):
        inshrink.load(delta, bases={})


def test_retention_keeps_chains_of_kept_steps(tmp_path):
    series = Series(tmp_path / "s", keyframe_every=4)
    states = trajectory(10)
    for step, state in enumerate(states):
        series.save(step, state)
    removed = series.retain(3)  # older steps are deltas towards newer ones: nothing to keep
    assert series.steps() == [7, 8, 9]
    assert removed == [0, 1, 2, 3, 4, 5, 6]
    assert sorted(os.listdir(tmp_path / "s")) == sorted(
        [".lock", "manifest.json"] + [e.file for e in series.checkpoints()])
    for step in (7, 8, 9):
        assert_same(series.load(step), states[step])
    needed = {c.file for c in series.chain(7)}
    eight = series.checkpoints()[1].file
    series.delete([8])  # 8 stays listed exactly when 7's chain goes through its file
    assert (8 in series.steps()) == (eight in needed)
    assert_same(series.load(7), states[7])


def test_bad_arguments_and_empty_series(tmp_path):
    with pytest.raises(errors.InvalidArgumentError):
        Series(tmp_path / "s", keyframe_every=0)
    series = Series(tmp_path / "s")
    with pytest.raises(errors.InvalidArgumentError, match="empty"):
        series.load()
    with pytest.raises(errors.InvalidArgumentError):
        series.save(-1, {})
    with pytest.raises(errors.InvalidArgumentError, match="not in the series"):
        series.load(5)
    (tmp_path / "s" / "manifest.json").write_text("{not json")
    with pytest.raises(errors.CorruptError):
        Series(tmp_path / "s")


CRASHER = """
import sys, numpy as np
sys.path.insert(0, {root!r})
from inshrink.series import Series
s = Series({path!r})
print("ready", flush=True)
big = np.random.default_rng(0).standard_normal(30_000_000).astype(np.float32)
s.save(99, {{"model.w": big}})
"""


def test_kill_during_save_leaves_a_consistent_series(tmp_path):
    path = str(tmp_path / "s")
    series = Series(path)
    states = trajectory(2)
    series.save(0, states[0])
    series.save(1, states[1])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen([sys.executable, "-c", CRASHER.format(root=root, path=path)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(1.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    again = Series(path)
    assert again.steps() in ([0, 1], [0, 1, 99])
    assert_same(again.load(1), states[1])
    assert again.verify() == []


class SeriesMachine(RuleBasedStateMachine):
    """Random saves, loads and deletions agree with a plain dict of what was saved."""

    def __init__(self):
        super().__init__()
        import tempfile
        self.dir = tempfile.mkdtemp()
        self.series = Series(self.dir, keyframe_every=3, threads=1)
        self.saved = {}
        self.step = 0
        self.rng = np.random.default_rng(0)

    @rule(shape=st.sampled_from([(4, 4), (16,), (2, 8)]), drift=st.booleans())
    def save(self, shape, drift):
        self.step += 1
        last = self.saved[max(self.saved)] if self.saved else None
        w = (last["w"].reshape(-1)[:int(np.prod(shape))].reshape(shape) + np.float32(1e-6)
             if drift and last is not None and last["w"].size >= np.prod(shape)
             else self.rng.standard_normal(shape).astype(np.float32))
        state = {"w": w, "n": np.array(self.step)}
        self.series.save(self.step, state)
        self.saved[self.step] = state

    @precondition(lambda self: self.saved)
    @rule(data=st.data())
    def load(self, data):
        step = data.draw(st.sampled_from(sorted(self.saved)))
        assert_same(self.series.load(step), self.saved[step])

    @precondition(lambda self: len(self.saved) > 1)
    @rule(data=st.data())
    def delete(self, data):
        step = data.draw(st.sampled_from(sorted(self.saved)))
        self.series.delete([step])
        del self.saved[step]

    @invariant()
    def listed_steps_are_saved_ones(self):
        assert set(self.saved) <= set(self.series.steps())


TestSeriesMachine = SeriesMachine.TestCase
TestSeriesMachine.settings = settings(max_examples=25, stateful_step_count=15, deadline=None)


def test_cli_series_commands(tmp_path):
    series = Series(tmp_path / "s", keyframe_every=2)
    states = trajectory(3)
    for step, state in enumerate(states):
        series.save(step, state)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root)

    def run(*args):
        return subprocess.run([sys.executable, "-m", "inshrink", "series", *map(str, args)],
                              capture_output=True, text=True, env=env, timeout=300)
    r = run("ls", tmp_path / "s")
    assert r.returncode == 0 and "keyframe" in r.stdout and "delta" in r.stdout
    assert run("verify", tmp_path / "s").stdout.startswith("OK")
    r = run("restore", tmp_path / "s", "--step", 1, "-o", tmp_path / "one.ink")
    assert r.returncode == 0
    assert_same(inshrink.load(tmp_path / "one.ink"), states[1])
    assert run("restore", tmp_path / "s", "-o", tmp_path / "last.safetensors").returncode == 0
    r = run("ls", tmp_path / "missing")
    assert r.returncode == 2 and str(tmp_path / "missing") in r.stderr
    (tmp_path / "s" / series.checkpoints()[0].file).write_bytes(b"broken")
    r = run("verify", tmp_path / "s")
    assert r.returncode == 1 and "FAIL" in r.stdout


def test_code_delta_shrinks_drifting_quantized_weights(tmp_path):
    policy = inshrink.Policy.uniform(inshrink.QuantConfig(bins=16))
    series = Series(tmp_path / "s", policy=policy, keyframe_every=10)
    states = trajectory(3, seed=4)
    for step, state in enumerate(states):
        series.save(step, state)
    older = tmp_path / "s" / series.checkpoints()[1].file  # step 1, a delta against step 2
    with inshrink.open(older) as f:
        assert [s["id"] for s in f._entries["model.w"].codec] == ["codedelta", "quant"]
        with pytest.raises(errors.BaseMismatchError, match="codes"):
            f["model.w"]
    inshrink.save(tmp_path / "alone.ink", states[1], policy=policy)
    alone = inshrink.open(tmp_path / "alone.ink").info("model.w").stored_bytes
    delta = inshrink.open(older).info("model.w").stored_bytes
    assert delta * 2 < alone
    assert_same(series.load(1), inshrink.load(tmp_path / "alone.ink"))


def test_corrupt_code_delta_modulus_is_rejected(tmp_path):
    import json
    import zlib
    series = Series(tmp_path / "s", policy=inshrink.Policy.uniform(
        inshrink.QuantConfig(bins=16)))
    for step, state in enumerate(trajectory(2, seed=5)):
        series.save(step, state)
    from inshrink.container.reader import ContainerReader
    path = tmp_path / "s" / series.checkpoints()[0].file
    reader = ContainerReader(path)
    doc = json.loads(reader.index.to_bytes())
    reader.close()
    doc["tensors"][0]["codec"][0]["modulus"] = 3  # fewer than the levels
    payload = json.dumps(doc, separators=(",", ":")).encode()
    from inshrink.container import layout
    from inshrink.container.index import pack_index
    data = path.read_bytes()
    if int.from_bytes(data[16:24], "little") & layout.FEATURE_ZINDEX:
        payload = pack_index(payload)
    offset = int.from_bytes(data[-32:-24], "little")
    rebuilt = (data[:offset] + layout.pack_record_header(layout.KIND_INDEX, payload) + payload
               + layout.pack_tail(offset, payload))
    path.write_bytes(rebuilt)
    assert zlib.crc32(payload) == layout.crc32(payload)
    with pytest.raises(errors.CorruptError, match="modulus"):
        inshrink.open(path)


def test_bin_count_changing_between_checkpoints(tmp_path):
    coarse = inshrink.Policy.uniform(inshrink.QuantConfig(bins=8))
    fine = inshrink.Policy.uniform(inshrink.QuantConfig(bins=40))
    series = Series(tmp_path / "s", policy=fine)
    states = trajectory(3, seed=6)
    policies = [fine, coarse, fine]
    for step, (state, policy) in enumerate(zip(states, policies)):
        series.policy = policy
        series.save(step, state)
    for step, (state, policy) in enumerate(zip(states, policies)):
        inshrink.save(tmp_path / "alone.ink", state, policy=policy)
        assert_same(series.load(step), inshrink.load(tmp_path / "alone.ink"))
    with inshrink.open(tmp_path / "s" / series.checkpoints()[0].file) as f:
        codec = f._entries["model.w"].codec
    assert codec[0]["id"] == "codedelta" and codec[0]["modulus"] >= 40


def test_delta_files_verify_on_their_own(tmp_path):
    series = Series(tmp_path / "s", policy="balanced")
    for step, state in enumerate(trajectory(2, seed=8)):
        series.save(step, state)
    delta = tmp_path / "s" / series.checkpoints()[0].file
    with inshrink.open(delta) as f:
        assert f.verify() == []  # streams and checksums, without the base
    data = bytearray(delta.read_bytes())
    data[300] ^= 0x10
    delta.write_bytes(bytes(data))
    with inshrink.open(delta) as f:
        problems = f.verify()
    assert problems and all(issubclass(problem_class(p), errors.CorruptError) for p in problems)


def test_a_delta_rewrite_rejects_base_codes_of_another_type(tmp_path):
    from inshrink.io.rebase import write_delta
    policy = inshrink.Policy.uniform(inshrink.QuantConfig(bins=8))
    w = trajectory(1)[0]["model.w"]
    with inshrink.Writer(tmp_path / "whole.ink", policy=policy, keep_codes=True) as writer:
        writer.add("model.w", w)
    with pytest.raises(errors.InvalidArgumentError, match="uint16"):
        write_delta(tmp_path / "whole.ink", tmp_path / "x.ink", src_codes=writer.codes,
                    base_exact={}, base_codes={"model.w": np.zeros(w.size, np.int64)},
                    base_file={"file": "b.ink", "sha256": "0" * 64})
    assert not (tmp_path / "x.ink").exists()


def test_verify_decodes_each_link_once_and_names_what_breaks(tmp_path, monkeypatch):
    series = Series(tmp_path / "s", keyframe_every=4)
    for step, state in enumerate(trajectory(7)):
        series.save(step, state)
    calls = []
    original = Series._decode_link
    monkeypatch.setattr(Series, "_decode_link",
                        lambda self, entry, *a, **k: calls.append(entry.step)
                        or original(self, entry, *a, **k))
    assert series.verify() == []
    assert sorted(calls) == list(range(7))  # each checkpoint decoded once
    middle = next(e for e in series.checkpoints() if e.base is not None
                  and any(d.base == e.file for d in series.checkpoints()))
    path = tmp_path / "s" / middle.file
    data = bytearray(path.read_bytes())
    data[200] ^= 1
    path.write_bytes(bytes(data))
    problems = series.verify()
    broken = [e.step for e in series.checkpoints() if middle in series.chain(e.step)]
    assert len(broken) >= 2  # the corrupt file and what is restored through it
    assert sorted(int(p.split(":")[0].split()[1]) for p in problems) == sorted(broken)
    assert any(f"step {middle.step}: " in p and middle.file in p for p in problems)


def test_decode_chain_gives_every_step_of_a_chain_once(tmp_path, monkeypatch):
    series = Series(tmp_path / "s", policy="balanced", keyframe_every=3)
    states = trajectory(4, seed=2)
    for step, state in enumerate(states):
        series.save(step, state)
    chain = [e.step for e in series.chain(1)]
    assert chain == [2, 1]  # keyframe_every=3: steps 0-2 rest on the keyframe 2
    opened = []
    real = Series._decode_link

    def counting(self, entry, *args, **kwargs):
        opened.append(entry.step)
        return real(self, entry, *args, **kwargs)
    monkeypatch.setattr(Series, "_decode_link", counting)
    got = dict(series.decode_chain(1))
    assert opened == chain and list(got) == chain  # keyframe first, each file once
    for step in chain:
        assert_same(got[step], series.load(step))
    assert [s for s, _ in series.decode_chain(3)] == [3]  # the newest: whole
    with pytest.raises(errors.InvalidArgumentError, match="step 9"):
        list(series.decode_chain(9))


def test_decode_chain_names_a_damaged_base(tmp_path):
    series = Series(tmp_path / "s", policy="balanced")
    for step, state in enumerate(trajectory(2, seed=3)):
        series.save(step, state)
    newest = tmp_path / "s" / series.checkpoints()[-1].file
    data = bytearray(newest.read_bytes())
    data[200] ^= 1
    newest.write_bytes(bytes(data))
    with pytest.raises(errors.BaseMismatchError, match=series.checkpoints()[-1].file):
        list(series.decode_chain(0))
