"""inshrink.dcp.series: series of sharded DCP checkpoints stored as per-rank deltas.

The multi-process tests run this file as a script (a fresh interpreter) that forks the ranks
of each process group (FSDP2 on CPU with gloo; tests/helpers.py); the test then checks what
the ranks left on disk. The others run DCP in this process (one rank).
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest
import test_dcp_distributed as base
import torch
import torch.distributed.checkpoint as dcp
from helpers import run_scenario, scenario_main
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.checkpoint.api import CheckpointException

import inshrink
from inshrink import errors
from inshrink.dcp.series import MANIFEST, InkSeries, decode_manifest

HERE = os.path.abspath(__file__)
TIMEOUT = 120
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def blank(state):
    """A destination for dcp.load shaped like ``state``: tensors zeroed, other leaves kept
    (DCP replaces them)."""
    if isinstance(state, dict):
        return {k: blank(v) for k, v in state.items()}
    if isinstance(state, list):
        return [blank(v) for v in state]
    return torch.zeros_like(state) if isinstance(state, torch.Tensor) else state


def load_one_rank(series, step, like):
    """Step ``step`` loaded into this single process: a different world size (resharding)."""
    state = blank(like)
    dcp.load(state, storage_reader=series.reader(step), no_dist=True)
    return state


def within_reported_error(reference, restored, rows):
    """Every tensor of ``restored`` equals ``reference`` where its chunks are lossless, and is
    within the worst max_abs_error its chunks reported where they are not."""
    errors_of = {}
    for row in rows:
        errors_of.setdefault(row["fqn"], []).append(row["error"])
    reference, restored = base.flat(reference), base.flat(restored)
    lossy = 0
    for key, value in reference.items():
        if not isinstance(value, torch.Tensor):
            continue
        fqn = f"model.{key[6:]}" if key.startswith("model.") else key
        reported = errors_of.get(fqn.replace("optim.state.", "optim.state.", 1), [None])
        if all(e is None for e in reported):
            assert torch.equal(restored[key], value), key
            continue
        bound = max(e["max_abs_error"] for e in reported if e is not None)
        assert (restored[key].double() - value.double()).abs().max().item() <= bound, key
        lossy += 1
    return lossy


def test_2_ranks_series_restores_every_step_and_a_new_world_size_starts_a_keyframe(tmp_path):
    # lossless saved with dcp.save, lossy with dcp.async_save
    run_scenario(HERE, "series", tmp_path, TIMEOUT)
    lossless = InkSeries(tmp_path / "lossless", threads=1)
    entries = {s.step: s for s in lossless.checkpoints()}
    assert sorted(entries) == [1, 2, 3, 4, 5, 6, 7]
    # keyframe_every=4: 1, 2, 3 chain to 4; 5 to 6; 6 stays whole: 7 was saved by 3 ranks
    assert {s: e.base for s, e in entries.items()} == {1: 2, 2: 3, 3: 4, 4: None, 5: 6,
                                                       6: None, 7: None}
    assert [entries[s].world_size for s in range(1, 8)] == [2] * 6 + [3]
    assert all(f.file.endswith(".d.ink") for s in (1, 2, 3, 5) for f in entries[s].files)
    assert len(entries[1].files) == 2 and len(entries[7].files) == 3
    assert lossless.verify() == []
    # every step restored on 2 ranks (7 of them resharded from 3) bit for bit
    for step in range(1, 8):
        reference = torch.load(tmp_path / f"ref_{step}.pt", weights_only=False)
        assert reference["extra"]["step"] == step
        base.assert_bit_equal(reference, torch.load(tmp_path / f"lossless_{step}.pt",
                                                    weights_only=False))
    # and into this one process, from a delta chain and from the 3-rank step
    for step in (1, 7):
        reference = torch.load(tmp_path / f"ref_{step}.pt", weights_only=False)
        base.assert_bit_equal(reference, load_one_rank(lossless, step, reference))
    # the deltas are smaller than the whole files they replaced
    rows = {s: lossless.describe(s) for s in (3, 4)}
    assert {r["codec"].split("+")[0] for r in rows[3]} >= {"xor"}
    assert sum(r["stored_bytes"] for r in rows[3]) < sum(r["stored_bytes"] for r in rows[4])

    # keep=2, keep_weights=2: each rank rewrote its file of the step leaving the two newest
    weights = InkSeries(tmp_path / "weights", threads=1)
    assert weights.steps() == [3, 4, 5, 6] and weights.weights_only_steps() == [3, 4]
    assert json.loads((tmp_path / "weights" / MANIFEST).read_text())["version"] == 2
    assert weights.verify() == []
    # each rank rewrote its file of step 3 as a delta against its new file of step 4
    assert weights.entry(3).base == 4 and weights.entry(4).base is None
    for step, suffix in ((3, ".w.d.ink"), (4, ".w.ink")):
        entry = weights.entry(step)
        assert len(entry.files) == 2 and all(f.file.endswith(suffix) for f in entry.files)
        assert {r["fqn"].split(".")[0] for r in weights.describe(step)} == {"model"}
        reference = torch.load(tmp_path / f"ref_{step}.pt", weights_only=False)
        model = {"model": blank(reference["model"])}
        dcp.load(model, storage_reader=weights.reader(step), no_dist=True)
        base.assert_bit_equal({"model": reference["model"]}, model)
    whole = {r["fqn"].split(".")[0] for r in weights.describe(6)}
    assert {"model", "optim"} <= whole

    lossy = InkSeries(tmp_path / "lossy", threads=1)
    assert lossy.steps() == [2, 3, 4, 5, 6]  # keep=5
    assert not os.path.exists(tmp_path / "lossy" / f"step_{1:012d}")
    codecs = {r["codec"] for r in lossy.describe(2)}
    assert any(c.startswith("codedelta") for c in codecs), codecs
    assert lossy.verify() == []
    for step in lossy.steps():
        reference = torch.load(tmp_path / f"ref_{step}.pt", weights_only=False)
        restored = torch.load(tmp_path / f"lossy_{step}.pt", weights_only=False)
        assert within_reported_error(reference, restored, lossy.describe(step)) >= 3
        base.assert_bit_equal(reference["extra"], restored["extra"])


def test_a_rank_killed_mid_save_leaves_the_series_as_it_was(tmp_path):
    run_scenario(HERE, "series_killed", tmp_path, TIMEOUT)
    assert (tmp_path / "killed").read_text() == str(-signal.SIGKILL)
    series = InkSeries(tmp_path / "run", threads=1)
    assert series.steps() == [1, 2]
    assert series.entry(2).keyframe and series.entry(1).base == 2
    # what the killed save wrote is reported as debris, and nothing else is wrong
    problems = series.verify()
    assert problems and all("left by an interrupted save" in p for p in problems), problems
    assert any("step_000000000003" in p for p in problems)
    base.assert_bit_equal(torch.load(tmp_path / "ref_2.pt", weights_only=False),
                          torch.load(tmp_path / "loaded_2.pt", weights_only=False))
    for step in (1, 2):
        reference = torch.load(tmp_path / f"ref_{step}.pt", weights_only=False)
        base.assert_bit_equal(reference, load_one_rank(series, step, reference))
    # a missing rank file: every rank of the load fails at once, naming it (no hang)
    for rank in (0, 1):
        outcome = json.loads((tmp_path / f"outcome_{rank}.json").read_text())
        assert outcome["error"] == "CheckpointException", outcome
        assert outcome["missing"] in outcome["message"], outcome  # DCP keeps the message only
    # the next save, by one rank: a keyframe (another world size), and the debris goes
    reference = torch.load(tmp_path / "ref_2.pt", weights_only=False)
    dcp.save(reference, storage_writer=series.writer(3), no_dist=True)
    assert series.entry(2).keyframe and series.entry(3).world_size == 1
    assert series.verify() == []
    assert sorted(n for n in os.listdir(tmp_path / "run") if n.startswith("step_")) == [
        f"step_{s:012d}" for s in (1, 2, 3)]


# -- one rank, in this process ---------------------------------------------------------------

def _state(step, gen):
    return {"model": {"w": torch.randn(64, 64, generator=gen), "b": torch.full((8,), step * 1.)},
            "optim": {"state": {"w": {"exp_avg": torch.randn(64, 64, generator=gen)}}},
            "step": step}


def _saved_series(tmp_path, steps=3, **kwargs):
    gen = torch.Generator().manual_seed(0)
    series = InkSeries(tmp_path / "run", threads=1, **kwargs)
    states = {}
    for step in range(1, steps + 1):
        states[step] = _state(step, gen)
        dcp.save(states[step], storage_writer=series.writer(step), no_dist=True)
    return series, states


def test_one_rank_series_keep_and_keyframes(tmp_path):
    series, states = _saved_series(tmp_path, steps=6, keyframe_every=2, keep=4)
    assert series.steps() == [3, 4, 5, 6]
    assert [series.entry(s).base for s in series.steps()] == [4, None, 6, None]
    assert sorted(n for n in os.listdir(tmp_path / "run") if n != MANIFEST) == [".lock"] + [
        f"step_{s:012d}" for s in (3, 4, 5, 6)]
    for step in series.steps():
        base.assert_bit_equal(states[step], load_one_rank(series, step, states[step]))
    with pytest.raises(errors.InvalidArgumentError, match="not after the latest step 6"):
        series.writer(6)
    # a step stored as a delta, joined into one file
    series.consolidate(3, tmp_path / "step3.ink")
    with inshrink.open(tmp_path / "step3.ink") as f:
        assert torch.equal(torch.from_numpy(f["model.w"]), states[3]["model"]["w"])
        assert torch.equal(torch.from_numpy(f["optim.state.w.exp_avg"]),
                           states[3]["optim"]["state"]["w"]["exp_avg"])


def _model_of(series, step, like):
    target = {"model": blank(like["model"])}
    dcp.load(target, storage_reader=series.reader(step), no_dist=True)
    return target


def test_keep_weights_keeps_older_steps_as_their_model_only(tmp_path):
    series, states = _saved_series(tmp_path, steps=7, keyframe_every=3, keep=2, keep_weights=3)
    assert series.steps() == [3, 4, 5, 6, 7] and series.weights_only_steps() == [3, 4, 5]
    assert series.verify() == []
    run = tmp_path / "run"
    # the model-only steps chain as deltas between models, keyframe_every=3 files a chain:
    # 1 -> 2 -> 3 filled one, so 3 stayed whole; 4 -> 5 (1 and 2 have gone since)
    assert [series.entry(s).base for s in (3, 4, 5)] == [None, 5, None]
    names = {s: (series.entry(s).files[0].name, series.entry(s).files[0].file)
             for s in (3, 4, 5)}
    assert {s: file[len(name) - 4:] for s, (name, file) in names.items()} == {
        3: ".w.ink", 4: ".w.d.ink", 5: ".w.ink"}
    for step in (3, 4, 5):
        entry = series.entry(step)
        assert entry.weights_only
        names = sorted(os.listdir(run / entry.dir))
        assert names == [".metadata", "chunks.json", entry.files[0].file]  # nothing else left
        base.assert_bit_equal({"model": states[step]["model"]},
                              _model_of(series, step, states[step]))
        # its .metadata and chunk map describe the model only; loading the rest is refused
        assert {r["fqn"] for r in series.describe(step)} == {"model.w", "model.b"}
        doc = json.loads((run / entry.dir / "chunks.json").read_text())
        assert {i["fqn"] for i in doc["items"]} == {"model.w", "model.b"}
        with pytest.raises(CheckpointException):
            load_one_rank(series, step, states[step])
    # the whole steps restore whole, bit for bit (6 is a delta against 7)
    assert series.entry(6).base == 7
    for step in (6, 7):
        base.assert_bit_equal(states[step], load_one_rank(series, step, states[step]))
    # joined into one file without torch's metadata: the model only
    series.consolidate(4, tmp_path / "step4.ink")
    with inshrink.open(tmp_path / "step4.ink") as f:
        assert sorted(f.keys()) == ["model.b", "model.w"]
        assert torch.equal(torch.from_numpy(f["model.w"]), states[4]["model"]["w"])
    # weights-only files hold about a third of a whole step here (no optimizer moment)
    sizes = {s: sum(f.bytes for f in series.entry(s).files) for s in (5, 7)}
    assert sizes[5] < 0.6 * sizes[7]


def test_keep_weights_with_a_policy_and_a_model_predicate(tmp_path):
    series, states = _saved_series(tmp_path, steps=4, keep=1, keep_weights=2,
                                   weights_policy="aggressive",
                                   model=lambda fqn: fqn == "model.w")
    assert series.weights_only_steps() == [2, 3] and series.steps() == [2, 3, 4]
    rows = {r["fqn"]: r for r in series.describe(3)}
    assert set(rows) == {"model.w"} and rows["model.w"]["error"]["rel_l2_error"] > 0
    target = {"model": {"w": torch.zeros(64, 64)}}
    dcp.load(target, storage_reader=series.reader(3), no_dist=True)
    error = (target["model"]["w"] - states[3]["model"]["w"]).abs().max().item()
    assert 0 < error <= rows["model.w"]["error"]["max_abs_error"]
    assert series.verify() == []


def test_without_weights_only_steps_the_manifest_stays_version_1(tmp_path):
    series, _ = _saved_series(tmp_path, steps=3, keep=2)
    assert json.loads((tmp_path / "run" / MANIFEST).read_text())["version"] == 1
    assert series.weights_only_steps() == []


def test_keep_weights_arguments_are_checked(tmp_path):
    with pytest.raises(errors.InvalidArgumentError, match="with keep"):
        InkSeries(tmp_path / "a", keep_weights=2)
    with pytest.raises(errors.InvalidArgumentError, match="positive"):
        InkSeries(tmp_path / "a", keep=1, keep_weights=0)
    with pytest.raises(errors.InvalidArgumentError, match="predicate"):
        InkSeries(tmp_path / "a", keep=1, keep_weights=1, model="model.")
    with pytest.raises(errors.InvalidArgumentError):
        InkSeries(tmp_path / "a", keep=1, keep_weights=1, weights_policy="nonsense")
    # a state with no model item: the save that would keep one is refused, nothing changes
    series = InkSeries(tmp_path / "b", keep=1, keep_weights=1, threads=1)
    dcp.save({"w": torch.ones(3)}, storage_writer=series.writer(1), no_dist=True)
    before = (tmp_path / "b" / MANIFEST).read_bytes()
    with pytest.raises(CheckpointException):
        dcp.save({"w": torch.ones(3)}, storage_writer=series.writer(2), no_dist=True)
    assert (tmp_path / "b" / MANIFEST).read_bytes() == before
    assert series.steps() == [1]


def test_a_crash_before_the_metadata_is_narrowed_is_repaired_by_the_next_save(
        tmp_path, monkeypatch):
    import inshrink.dcp.weights_only as module
    calls = []
    real = module.kept_items

    def killed(*args):
        calls.append(args)
        raise OSError("killed")
    monkeypatch.setattr(module, "kept_items", killed)
    series, states = _saved_series(tmp_path, steps=3, keep=2, keep_weights=2)
    assert series.weights_only_steps() == [1] and calls
    # committed: the model loads; its .metadata still lists the moment, not in its file
    base.assert_bit_equal({"model": states[1]["model"]}, _model_of(series, 1, states[1]))
    with pytest.raises(errors.CorruptError, match="no tensor named 'optim.state.w.exp_avg'"):
        series.describe(1)
    assert any("step 1:" in p and "optim.state.w.exp_avg" in p for p in series.verify())
    monkeypatch.setattr(module, "kept_items", real)
    gen = torch.Generator().manual_seed(9)
    dcp.save(_state(4, gen), storage_writer=series.writer(4), no_dist=True)
    assert series.weights_only_steps() == [1, 2]
    for step in (1, 2):  # both narrowed now
        assert {r["fqn"] for r in series.describe(step)} == {"model.w", "model.b"}
    base.assert_bit_equal({"model": states[1]["model"]}, _model_of(series, 1, states[1]))
    assert series.verify() == []


def test_one_rank_lossy_series_restores_what_each_step_stored(tmp_path):
    gen = torch.Generator().manual_seed(0)
    series = InkSeries(tmp_path / "run", policy="balanced", threads=1)
    w, m = torch.randn(128, 128, generator=gen), torch.zeros(128, 128)
    states, fresh = {}, {}
    for step in range(1, 6):  # small steps, as training takes: the codes persist
        w = w + 1e-3 * torch.randn(128, 128, generator=gen)
        m = 0.9 * m + 1e-2 * torch.randn(128, 128, generator=gen)
        states[step] = {"model": {"w": w.clone()},
                        "optim": {"state": {"w": {"exp_avg": m.clone()}}}, "step": step}
        dcp.save(states[step], storage_writer=series.writer(step), no_dist=True)
        fresh[step] = load_one_rank(series, step, states[step])  # while it is whole
    assert [series.entry(s).base for s in series.steps()] == [2, 3, 4, 5, None]
    assert {r["codec"] for r in series.describe(1)} >= {"codedelta+quant+zstd"}
    for step in series.steps():
        restored = load_one_rank(series, step, states[step])
        base.assert_bit_equal(fresh[step], restored)
        assert within_reported_error(states[step], restored, series.describe(step)) == 2
    older = sum(f.bytes for s in (1, 2, 3, 4) for f in series.entry(s).files)
    assert older < 4 * series.entry(5).files[0].bytes


@settings(max_examples=6, deadline=None)
@given(keyframe_every=st.integers(1, 4), keep=st.one_of(st.none(), st.integers(1, 4)),
       widths=st.lists(st.sampled_from([8, 16]), min_size=1, max_size=6))
def test_any_sequence_of_saves_keeps_a_consistent_series(tmp_path_factory, keyframe_every,
                                                          keep, widths):
    """Whatever the keyframe interval, retention and changes of layout (a tensor's width),
    every kept step restores bit-exact, deltas only join steps of the same layout, and no
    chain is longer than keyframe_every files."""
    directory = tmp_path_factory.mktemp("run")
    series = InkSeries(directory, keyframe_every=keyframe_every, keep=keep, threads=1)
    gen = torch.Generator().manual_seed(0)
    states = {}
    for step, width in enumerate(widths):
        states[step] = {"w": torch.randn(8, width, generator=gen), "step": step}
        dcp.save(states[step], storage_writer=series.writer(step), no_dist=True)
    entries = series.checkpoints()
    assert [e.step for e in entries] == list(range(len(widths)))[-(keep or len(widths)):]
    assert entries[-1].keyframe
    for e in entries:
        if e.base is not None:
            assert e.base == e.step + 1 and widths[e.base] == widths[e.step]
        assert len(series.chain(e.step, 0)) <= keyframe_every
        base.assert_bit_equal(states[e.step], load_one_rank(series, e.step, states[e.step]))
    assert series.verify() == []


@settings(max_examples=8, deadline=None)
@given(keyframe_every=st.integers(1, 4), keep=st.integers(1, 3), keep_weights=st.integers(1, 3),
       widths=st.lists(st.sampled_from([8, 16]), min_size=1, max_size=7),
       policy=st.sampled_from([None, "balanced"]))
def test_any_sequence_of_saves_with_keep_weights_keeps_a_consistent_series(
        tmp_path_factory, keyframe_every, keep, keep_weights, widths, policy):
    """Whatever the keyframe interval, layouts and retention: the keep newest steps whole and
    restoring as saved (lossless: bit for bit), up to keep_weights before them model-only
    restoring their model as saved, nothing else kept, no delta against a model-only step,
    and the manifest's version 2 exactly when it lists one."""
    directory = tmp_path_factory.mktemp("run")
    series = InkSeries(directory, policy=policy, keyframe_every=keyframe_every, keep=keep,
                       keep_weights=keep_weights, threads=1)
    gen = torch.Generator().manual_seed(0)
    states = {}
    for step, width in enumerate(widths):
        states[step] = {"model": {"w": torch.randn(128, 8 * width, generator=gen)},
                        "optim": {"m": torch.randn(128, 8 * width, generator=gen)},
                        "step": step}
        dcp.save(states[step], storage_writer=series.writer(step), no_dist=True)
    steps = list(range(len(widths)))
    whole, models = steps[-keep:], steps[:-keep][-keep_weights:]
    assert series.steps() == models + whole and series.weights_only_steps() == models
    version = json.loads((directory / MANIFEST).read_text())["version"]
    assert version == (2 if models else 1)
    by_step = {e.step: e for e in series.checkpoints()}
    for step in series.steps():
        entry = by_step[step]
        if entry.base is not None:  # deltas join steps of one kind, sharding and chain rule
            assert by_step[entry.base].weights_only == entry.weights_only
            assert widths[entry.base] == widths[step]
        assert len(series.chain(step, 0)) <= keyframe_every
        if step in models:
            got = _model_of(series, step, states[step])["model"]["w"]
        else:
            got = load_one_rank(series, step, states[step])["model"]["w"]
        expected = states[step]["model"]["w"]
        # within what the step reported when saved (a model-only step keeps the reports)
        reported = [r["error"] for r in series.describe(step) if r["fqn"] == "model.w"]
        if policy is None or any(e is None or e["max_abs_error"] == 0 for e in reported):
            assert torch.equal(got, expected)
        else:
            bound = max(e["max_abs_error"] for e in reported)
            assert 0 < (got - expected).abs().max().item() <= bound
    assert series.verify() == []


def test_bad_series_input_is_a_typed_error_naming_the_file(tmp_path):
    series, states = _saved_series(tmp_path)
    entry = series.entry(1)
    delta = tmp_path / "run" / entry.dir / entry.files[0].file
    # a file whose bytes differ from the manifest's hash
    original = delta.read_bytes()
    delta.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
    with pytest.raises(errors.BaseMismatchError, match=str(delta)):
        series.decode(1, 0)
    with pytest.raises(CheckpointException, match="BaseMismatchError"):
        load_one_rank(series, 1, states[1])
    delta.write_bytes(original)
    # a missing rank file, found before any rank reads
    whole = tmp_path / "run" / series.entry(3).dir / series.entry(3).files[0].file
    whole.rename(tmp_path / "aside")
    with pytest.raises(errors.CorruptError, match=str(whole)):
        series.reader(1).read_metadata()
    (tmp_path / "aside").rename(whole)
    # .metadata and the manifest naming different rank files
    doc = json.loads((tmp_path / "run" / MANIFEST).read_text())
    good = json.dumps(doc)
    step_2 = tmp_path / "run" / series.entry(2).dir
    renamed = step_2 / "rank00000-000000000000.d.ink"
    (step_2 / series.entry(2).files[0].file).rename(renamed)
    doc["checkpoints"][1]["files"][0]["name"] = "rank00000-000000000000.ink"
    doc["checkpoints"][1]["files"][0]["file"] = renamed.name
    (tmp_path / "run" / MANIFEST).write_text(json.dumps(doc))
    with pytest.raises(errors.CorruptError, match="disagree on the step's rank files"):
        series.reader(2).read_metadata()
    # a delta whose base was saved by another world size
    doc = json.loads(good)
    doc["checkpoints"][2]["world_size"] = 3
    (tmp_path / "run" / MANIFEST).write_text(json.dumps(doc))
    with pytest.raises(errors.BaseMismatchError, match=r"rank00000-[0-9a-f]{12}\.d\.ink.*3 ranks"):
        series.checkpoints()
    (tmp_path / "run" / MANIFEST).write_text(good)
    # a damaged newest file is never made a delta; the next step is saved all the same
    newest = tmp_path / "run" / series.entry(3).dir / series.entry(3).files[0].file
    damaged = newest.read_bytes()
    newest.write_bytes(damaged[:100] + bytes([damaged[100] ^ 1]) + damaged[101:])
    states[4] = _state(4, torch.Generator())
    dcp.save(states[4], storage_writer=series.writer(4), no_dist=True)
    assert series.entry(3).keyframe and series.entry(4).keyframe
    assert [p.split(": ")[0] for p in series.verify()] == ["step 3", "step 1", "step 2"]
    base.assert_bit_equal(states[4], load_one_rank(series, 4, states[4]))
    (tmp_path / "run" / MANIFEST).write_text("{")
    with pytest.raises(errors.CorruptError, match=MANIFEST):
        series.writer(5)


def test_the_previous_file_is_rewritten_one_tensor_at_a_time_into_the_same_bytes(
        tmp_path, monkeypatch):
    """A rank rewriting its previous file as a delta decodes that file tensor by tensor (it
    holds about one tensor's codes, not the file's), and writes the bytes that decoding the
    whole file first gives."""
    import hashlib
    import tracemalloc

    import inshrink.dcp.series as module
    from inshrink import digest
    from inshrink.dcp.names import step_dir
    from inshrink.io.rebase import write_delta
    from inshrink.io.file import File
    gen = torch.Generator().manual_seed(0)
    series = InkSeries(tmp_path / "run", policy="balanced", threads=1)
    state = {"model": {f"w{i}": torch.randn(128, 1024, generator=gen) for i in range(8)},
             "b": torch.randn(1000, generator=gen)}  # lossless: an XOR delta
    dcp.save(state, storage_writer=series.writer(1), no_dist=True)
    fresh = load_one_rank(series, 1, state)  # while it is whole
    whole = tmp_path / "run" / series.entry(1).dir / series.entry(1).files[0].file
    shutil.copy(whole, tmp_path / "previous.ink")
    for tensor in state["model"].values():
        tensor.add_(1e-3 * torch.randn(tensor.shape, generator=gen))
    state["b"] += 1e-4 * torch.randn(1000, generator=gen)
    rewrite, seen = module.InkSeriesWriter._rewrite_previous, {}

    def measured(self, task, exact, codes):
        seen.update(exact=exact, codes=codes, base=os.path.join(step_dir(self.step),
                                                                task.file))
        tracemalloc.start()
        try:
            return rewrite(self, task, exact, codes)
        finally:
            seen["peak"] = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
    monkeypatch.setattr(module.InkSeriesWriter, "_rewrite_previous", measured)
    dcp.save(state, storage_writer=series.writer(2), no_dist=True)
    delta = tmp_path / "run" / series.entry(1).dir / series.entry(1).files[0].file
    assert {r["codec"] for r in series.describe(1)} == {"codedelta+quant+zstd",
                                                        "xor+bytegroup+zstd"}
    # the codes of one tensor and the buffers of its delta: about 5 tensors' codes here;
    # every code of the file decoded first: above 12
    one_tensor = 128 * 1024 * 2  # its codes: uint16
    assert seen["peak"] < 8 * one_tensor, seen["peak"] / one_tensor
    # the same bytes as a delta written from every code of the file decoded up front
    with File(tmp_path / "previous.ink", threads=1) as f:
        all_codes = {i.name: f.codes(i.name) for i in f.infos() if i.quantized}
    assert len(all_codes) == 8
    write_delta(tmp_path / "previous.ink", tmp_path / "eager.d.ink", src_codes=all_codes,
                base_exact=seen["exact"], base_codes=seen["codes"],
                base_file=digest.base_reference(seen["base"], seen["exact"], seen["codes"]))
    assert (hashlib.sha256(delta.read_bytes()).digest()
            == hashlib.sha256((tmp_path / "eager.d.ink").read_bytes()).digest())
    base.assert_bit_equal(fresh, load_one_rank(series, 1, state))


def test_a_failed_rewrite_keeps_the_previous_manifest(tmp_path, monkeypatch):
    series, states = _saved_series(tmp_path, steps=2)
    before = (tmp_path / "run" / MANIFEST).read_bytes()
    import inshrink.dcp.series as module

    def fail(*args, **kwargs):
        raise OSError(28, "no space left")
    monkeypatch.setattr(module, "write_delta", fail)
    with pytest.raises(CheckpointException, match="no space left"):
        dcp.save(_state(3, torch.Generator()), storage_writer=series.writer(3), no_dist=True)
    assert (tmp_path / "run" / MANIFEST).read_bytes() == before
    for step in (1, 2):
        base.assert_bit_equal(states[step], load_one_rank(series, step, states[step]))
    monkeypatch.undo()
    states[3] = _state(3, torch.Generator().manual_seed(3))
    dcp.save(states[3], storage_writer=series.writer(3), no_dist=True)
    assert series.verify() == [] and series.entry(2).base == 3
    for step in (1, 2, 3):
        base.assert_bit_equal(states[step], load_one_rank(series, step, states[step]))


def test_a_save_failing_after_the_model_files_are_written_changes_nothing(
        tmp_path, monkeypatch):
    series, states = _saved_series(tmp_path, steps=3, keep=2, keep_weights=2)
    before = (tmp_path / "run" / MANIFEST).read_bytes()
    import inshrink.dcp.series as module

    def fail(*args, **kwargs):
        raise OSError(28, "no space left")
    monkeypatch.setattr(module, "write_manifest", fail)  # the .w.ink files are written by then
    with pytest.raises(CheckpointException, match="no space left"):
        dcp.save(_state(4, torch.Generator()), storage_writer=series.writer(4), no_dist=True)
    assert (tmp_path / "run" / MANIFEST).read_bytes() == before
    left = [p for p in series.verify() if ".w.ink" in p]
    assert left and all("left by an interrupted save" in p for p in left)
    for step in (2, 3):  # the whole steps restore whole, as before the failed save
        base.assert_bit_equal(states[step], load_one_rank(series, step, states[step]))
    monkeypatch.undo()
    series.close()  # the failed save kept the lock (see One writer)
    states[4] = _state(4, torch.Generator().manual_seed(4))
    dcp.save(states[4], storage_writer=series.writer(4), no_dist=True)
    assert series.verify() == [] and series.weights_only_steps() == [1, 2]
    base.assert_bit_equal({"model": states[2]["model"]}, _model_of(series, 2, states[2]))


def test_cli_info_and_verify_understand_a_series(tmp_path):
    series, _ = _saved_series(tmp_path, steps=3, policy="balanced")

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "inshrink", *args], capture_output=True,
                              text=True, cwd=tmp_path, timeout=60)
    r = cli("info", "run")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("run: series of DCP checkpoints, 3 steps")
    assert [line.split()[:5] for line in lines[2:5]] == [
        ["1", "1", "delta", "->", "2"], ["2", "1", "delta", "->", "3"],
        ["3", "1", "whole", lines[4].split()[3], lines[4].split()[4]]]
    assert "LOSSY" in lines[-1]
    # the series, and an older step's directory, its delta file read through the series
    r = cli("verify", "run", f"run/{series.entry(1).dir}")
    assert (r.returncode, r.stdout) == (0, "OK    run (DCP series: 3 steps, 3 rank files)\n"
                                           f"OK    run/{series.entry(1).dir} (DCP checkpoint: "
                                           f"1 rank file, 4 chunks)\n"), r.stderr
    r = cli("consolidate", f"run/{series.entry(1).dir}", "-o", "one.safetensors")
    assert r.returncode == 0, r.stderr
    from safetensors.numpy import load_file
    assert load_file(tmp_path / "one.safetensors").keys() == {"model.w", "model.b",
                                                            "optim.state.w.exp_avg"}
    missing = tmp_path / "run" / series.entry(2).dir / series.entry(2).files[0].file
    missing.unlink()
    r = cli("verify", "--json", "run")
    assert r.returncode == 1
    report = json.loads(r.stdout)
    assert not report["ok"]
    assert [p.split(": ")[1] for p in report["problems"]] == ["step 2", "step 1"]
    assert f"{missing.relative_to(tmp_path)}: missing" in report["problems"][0]
    assert "base step 2 does not decode" in report["problems"][1]


def test_cli_shows_weights_only_steps_and_consolidates_one(tmp_path):
    series, states = _saved_series(tmp_path, steps=3, keep=1, keep_weights=1)

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "inshrink", *args], capture_output=True,
                              text=True, cwd=tmp_path, timeout=60)
    r = cli("info", "run")
    assert r.returncode == 0, r.stderr
    assert [line.split()[:4] for line in r.stdout.splitlines()[2:4]] == [
        ["2", "1", "model", "only"], ["3", "1", "whole", r.stdout.splitlines()[3].split()[3]]]
    r = cli("info", "--json", "run")
    assert [(f["step"], f["weights_only"]) for f in json.loads(r.stdout)["files"]] == [
        (2, True), (3, False)]
    r = cli("verify", "run", f"run/{series.entry(2).dir}")
    assert r.returncode == 0, r.stdout + r.stderr
    r = cli("consolidate", f"run/{series.entry(2).dir}", "-o", "model.safetensors")
    assert r.returncode == 0, r.stderr
    from safetensors.numpy import load_file
    got = load_file(tmp_path / "model.safetensors")
    assert got.keys() == {"model.w", "model.b"}
    assert (got["model.w"] == states[2]["model"]["w"].numpy()).all()


def _failure(excinfo):
    """The one inshrink error inside a CheckpointException."""
    (failure,) = excinfo.value.failures.values()
    return failure[0] if isinstance(failure, tuple) else failure


def test_a_second_writer_is_refused_while_a_save_runs(tmp_path, monkeypatch):
    import pickle

    import inshrink.dcp.series as module
    series, states = _saved_series(tmp_path, steps=1)
    run = tmp_path / "run"
    before = (run / MANIFEST).read_bytes()
    # another object, and a pickled copy (as a process-based async_save gets), saving while
    # series' save of step 2 runs (its ranks rewriting step 1): refused at once, naming the
    # holder, having written nothing
    others = [InkSeries(run, threads=1), pickle.loads(pickle.dumps(series))]
    refused = []
    write_delta = module.write_delta

    def meanwhile(*args, **kwargs):
        for other in others:
            with pytest.raises(CheckpointException) as excinfo:
                dcp.save(_state(3, torch.Generator()), storage_writer=other.writer(3),
                         no_dist=True)
            refused.append(_failure(excinfo))
        assert (run / MANIFEST).read_bytes() == before
        return write_delta(*args, **kwargs)
    monkeypatch.setattr(module, "write_delta", meanwhile)
    states[2] = _state(2, torch.Generator().manual_seed(2))
    dcp.save(states[2], storage_writer=series.writer(2), no_dist=True)
    monkeypatch.undo()
    assert [type(e) for e in refused] == [errors.SeriesLockedError] * 2, refused
    assert all(str(run) in str(e) and f"pid {os.getpid()}" in str(e) for e in refused)
    assert sorted(os.listdir(run)) == [".lock", MANIFEST] + [f"step_{s:012d}" for s in (1, 2)]
    assert series.entry(1).base == 2 and series.verify() == []
    # committed, the save let go: the other object saves the next step
    other = others[0]
    states[3] = _state(3, torch.Generator().manual_seed(3))
    dcp.save(states[3], storage_writer=other.writer(3), no_dist=True)
    # a save that fails once the ranks write keeps the lock until its object's close()
    monkeypatch.setattr(module, "write_delta", lambda *a, **k: 1 / 0)
    with pytest.raises(CheckpointException, match="ZeroDivisionError"):
        dcp.save(_state(4, torch.Generator()), storage_writer=other.writer(4), no_dist=True)
    monkeypatch.undo()
    with pytest.raises(CheckpointException, match="SeriesLockedError"):
        dcp.save(_state(4, torch.Generator()), storage_writer=series.writer(4), no_dist=True)
    other.close()
    with series:
        states[4] = _state(4, torch.Generator().manual_seed(4))
        dcp.save(states[4], storage_writer=series.writer(4), no_dist=True)
    assert series.steps() == [1, 2, 3, 4] and series.verify() == []
    for step in (1, 2, 3, 4):
        base.assert_bit_equal(states[step], load_one_rank(series, step, states[step]))


def test_2_ranks_refused_while_another_job_holds_the_series(tmp_path):
    """While another job holds the series, every rank gets the error (dcp.save and
    dcp.async_save), none hangs, and none writes anything."""
    run_scenario(HERE, "series_locked", tmp_path, TIMEOUT)
    for rank in (0, 1):
        outcome = json.loads((tmp_path / f"locked_{rank}.json").read_text())
        assert outcome["pid"] != outcome["holder"]
        for kind in ("save", "async_save"):
            assert "SeriesLockedError" in outcome[kind], outcome
            assert f"pid {outcome['holder']}" in outcome[kind], outcome
    series = InkSeries(tmp_path / "run", threads=1)
    assert series.steps() == [1]
    # only the holder's failed save left a file (its one rank's), which its next save removes
    step_2 = tmp_path / "run" / f"step_{2:012d}"
    assert [n[:9] for n in os.listdir(step_2)] == ["rank00000"]
    assert [p.split(": ")[0] for p in series.verify()] == [str(step_2)]


# -- the manifest's rules (spec/FORMAT.md section 25) ------------------------------------------

def _spec_section(number):
    with open(os.path.join(os.path.dirname(HERE), "..", "spec", "FORMAT.md"),
              encoding="utf-8") as f:
        spec = f.read()
    start = spec.index(f"\n## {number}. ")
    return spec[start:spec.find("\n## ", start + 1)]


def test_the_spec_example_and_a_real_manifest_follow_the_rules(tmp_path):
    text = _spec_section(25)
    text = text[text.index("### 25.3"):]  # the manifest's example, not the chunk map's
    example = text[text.index("```json\n") + 8:]
    example = example[:example.index("```")]
    steps = decode_manifest(example.encode())
    assert [(s.step, s.base, s.world_size, [f.file for f in s.files]) for s in steps] == [
        (100, 200, 2, ["rank00000-3f2a9c1b7d40.d.ink", "rank00001-3f2a9c1b7d40.d.ink"]),
        (200, None, 2, ["rank00000-8e51d0c2a6f3.ink", "rank00001-8e51d0c2a6f3.ink"])]
    series, _ = _saved_series(tmp_path, steps=2)
    real = json.loads((tmp_path / "run" / MANIFEST).read_text())
    assert set(real) == set(json.loads(example)) == {"format", "version", "checkpoints"}
    example = json.loads(example)
    assert [set(e) for e in real["checkpoints"]] == [set(example["checkpoints"][0])] * 2
    assert [set(f) for e in real["checkpoints"] for f in e["files"]] == [
        set(example["checkpoints"][0]["files"][0])] * 2
    assert decode_manifest((tmp_path / "run" / MANIFEST).read_bytes()) == series.checkpoints()


def test_the_weights_only_example_and_a_real_manifest_follow_the_rules(tmp_path):
    text = _spec_section(25)
    text = text[text.index("### 25.7"):]
    example = text[text.index("```json\n") + 8:]
    example = example[:example.index("```")]
    steps = decode_manifest(example.encode())
    assert [(s.step, s.weights_only, [f.file for f in s.files]) for s in steps] == [
        (100, True, ["rank00000-3f2a9c1b7d40.w.ink"]),
        (200, False, ["rank00000-8e51d0c2a6f3.ink"])]
    series, _ = _saved_series(tmp_path, steps=3, keep=1, keep_weights=2)
    real = json.loads((tmp_path / "run" / MANIFEST).read_text())
    assert real["version"] == json.loads(example)["version"] == 2
    assert [set(e) for e in real["checkpoints"]] == [set(json.loads(example)["checkpoints"][0])] * 3
    assert decode_manifest((tmp_path / "run" / MANIFEST).read_bytes()) == series.checkpoints()


def _mutations(doc):
    """(rule, error, manifest text) for each rule M-1 ... M-16, from a valid 2-step manifest."""
    def changed(edit):
        copy = json.loads(json.dumps(doc))
        edit(copy)
        return json.dumps(copy)
    def first(d):  # the delta step
        return d["checkpoints"][0]

    def file0(d):
        return first(d)["files"][0]
    return [
        ("M-1", errors.CorruptError, '{"format": "a", "format": "b"}'),
        ("M-1", errors.CorruptError,
         json.dumps(doc).replace('"bytes": ', '"x": NaN, "bytes": ', 1)),
        ("M-1", errors.CorruptError, b"\xff"),
        ("M-2", errors.CorruptError, changed(lambda d: d.update(format="inshrink-series"))),
        ("M-3", errors.CorruptError, changed(lambda d: d.update(version="1"))),
        ("M-3", errors.UnsupportedVersionError, changed(lambda d: d.update(version=3))),
        ("M-4", errors.CorruptError, changed(lambda d: d.update(note="x"))),
        ("M-5", errors.CorruptError, changed(lambda d: first(d).pop("layout"))),
        ("M-6", errors.CorruptError, changed(lambda d: d["checkpoints"][1].update(step=1))),
        ("M-6", errors.CorruptError, changed(lambda d: first(d).update(step=-1))),
        ("M-7", errors.CorruptError, changed(lambda d: first(d).update(world_size=0))),
        ("M-8", errors.CorruptError, changed(lambda d: first(d).update(
            layout=first(d)["layout"].upper()))),
        ("M-9", errors.CorruptError, changed(lambda d: first(d).update(base=1))),
        ("M-10", errors.CorruptError, changed(lambda d: file0(d).update(extra=1))),
        ("M-11", errors.CorruptError, changed(lambda d: file0(d).update(rank=1))),
        ("M-12", errors.CorruptError, changed(lambda d: file0(d).update(
            name="rank00001" + file0(d)["name"][9:]))),
        ("M-13", errors.CorruptError, changed(lambda d: file0(d).update(
            file=file0(d)["name"]))),
        # a weights-only file name: only in version 2, and only for a whole step
        ("M-13", errors.CorruptError, changed(lambda d: d["checkpoints"][1]["files"][0].update(
            file=d["checkpoints"][1]["files"][0]["name"][:-4] + ".w.ink"))),
        ("M-13", errors.CorruptError, changed(lambda d: (d.update(version=2), file0(d).update(
            file=file0(d)["name"][:-4] + ".w.ink")))),
        ("M-14", errors.CorruptError, changed(lambda d: file0(d).update(sha256="0" * 63))),
        ("M-14", errors.CorruptError, changed(lambda d: file0(d).update(bytes=-1))),
        ("M-15", errors.CorruptError, changed(lambda d: d["checkpoints"].pop())),
        # version 2: no step is a delta against a weights-only one
        ("M-15", errors.CorruptError, changed(lambda d: (
            d.update(version=2), d["checkpoints"][1]["files"][0].update(
                file=d["checkpoints"][1]["files"][0]["name"][:-4] + ".w.ink")))),
        ("M-16", errors.BaseMismatchError, changed(lambda d: d["checkpoints"][1].update(
            world_size=2))),
    ]


def test_every_manifest_rule_is_checked_with_its_id_and_error(tmp_path, monkeypatch):
    _saved_series(tmp_path, steps=2)
    raw = (tmp_path / "run" / MANIFEST).read_bytes()
    doc = json.loads(raw)
    checked = set()
    for rule, error, text in _mutations(doc):
        text = text.encode() if isinstance(text, str) else text
        with pytest.raises(error, match=rf"^\[{rule}\] run/{MANIFEST}: ") as excinfo:
            decode_manifest(text, f"run/{MANIFEST}")
        assert type(excinfo.value) is error, (rule, excinfo.value)
        checked.add(rule)
    import inshrink.dcp.series as module
    monkeypatch.setattr(module, "MAX_MANIFEST_BYTES", len(raw) - 1)
    with pytest.raises(errors.LimitExceededError, match=r"^\[M-1\] "):
        decode_manifest(raw)
    rules = re.findall(r"^\| (M-\d+) \|", _spec_section(25), re.MULTILINE)
    assert checked == {r for r in rules if int(r[2:]) <= 16} and len(checked) == 16


# -- the ranks (run as a script) -------------------------------------------------------------

def _save_step(rank, world, directory, model, optim, sched, step, series, async_=()):
    """Save ``step`` into each of ``series`` (with dcp.async_save into those of ``async_``,
    on a process group of its own, overlapping the other saves and the gathering)."""
    import torch.distributed as dist
    state = base._state(model, optim, sched, step)
    futures = [dcp.async_save(state, storage_writer=s.writer(step),
                              process_group=dist.new_group()) for s in async_]
    for s in series:
        dcp.save(state, storage_writer=s.writer(step))
    full = base._full(model, optim, state)
    for future in futures:
        future.result()
    if rank == 0:
        torch.save(full, os.path.join(directory, f"ref_{step}.pt"))


def _load_step(rank, world, series, step, out):
    from torch.distributed.checkpoint.state_dict import set_state_dict
    model, optim, sched = base._sharded(world, seed=123)  # other values, all overwritten
    state = base._state(model, optim, sched, 0)
    state["extra"]["rng"] = torch.zeros_like(state["extra"]["rng"])
    dcp.load(state, storage_reader=series.reader(step))
    set_state_dict(model, optim, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    full = base._full(model, optim, state)
    if rank == 0:
        torch.save(full, out)


def _series_2(rank, world, directory):
    lossless = InkSeries(os.path.join(directory, "lossless"), keyframe_every=4, threads=1)
    lossy = InkSeries(os.path.join(directory, "lossy"), policy="balanced", keep=5, threads=1)
    weights = InkSeries(os.path.join(directory, "weights"), keep=2, keep_weights=2, threads=1)
    model, optim, sched = base._sharded(world, seed=0)
    for step in range(1, 7):
        base._train(model, optim, sched, 1, seed=step)
        _save_step(rank, world, directory, model, optim, sched, step, (lossless, weights),
                   (lossy,))


def _series_3(rank, world, directory):
    lossless = InkSeries(os.path.join(directory, "lossless"), keyframe_every=4, threads=1)
    model, optim, sched = base._sharded(world, seed=7)
    base._train(model, optim, sched, 1)
    _save_step(rank, world, directory, model, optim, sched, 7, (lossless,))


def _series_load(rank, world, directory):
    for kind in ("lossless", "lossy"):
        series = InkSeries(os.path.join(directory, kind), threads=1)
        for step in series.steps():
            _load_step(rank, world, series, step, os.path.join(directory, f"{kind}_{step}.pt"))


def _killed(rank, world, directory):
    series = InkSeries(os.path.join(directory, "run"), threads=1)
    model, optim, sched = base._sharded(world, seed=0)
    for step in (1, 2):
        base._train(model, optim, sched, 1, seed=step)
        _save_step(rank, world, directory, model, optim, sched, step, (series,))
    if rank == 1:  # dies while rewriting its file of step 2, its file of step 3 written
        import inshrink.dcp.series as module

        def die(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)
        module.write_delta = die
    base._train(model, optim, sched, 1, seed=3)
    _save_step(rank, world, directory, model, optim, sched, 3, (series,))


def _break_a_copy(directory):
    """A copy of the series with rank 1's delta file of step 1 gone."""
    shutil.copytree(os.path.join(directory, "run"), os.path.join(directory, "broken"))
    series = InkSeries(os.path.join(directory, "broken"))
    missing = os.path.join(series.directory, series.entry(1).dir,
                           series.entry(1).file_of(1).file)
    os.unlink(missing)
    with open(os.path.join(directory, "missing"), "w") as f:
        f.write(missing)


def _load_after_kill(rank, world, directory):
    _load_step(rank, world, InkSeries(os.path.join(directory, "run"), threads=1), 2,
               os.path.join(directory, "loaded_2.pt"))
    with open(os.path.join(directory, "missing")) as f:
        outcome = {"missing": f.read()}
    try:
        _load_step(rank, world, InkSeries(os.path.join(directory, "broken"), threads=1), 1,
                   os.path.join(directory, "never.pt"))
        outcome["error"] = None
    except CheckpointException as exc:
        outcome.update(error=type(exc).__name__, message=str(exc))
    with open(os.path.join(directory, f"outcome_{rank}.json"), "w") as f:
        json.dump(outcome, f)


_HELD = []
"""The series the script's own process holds, while its forked ranks try to save."""


def _hold(directory):
    """A job whose save of step 2 failed once its ranks wrote: it keeps the lock."""
    import inshrink.dcp.series as module
    series = InkSeries(os.path.join(directory, "run"), threads=1)
    dcp.save({"r0": torch.zeros(16)}, storage_writer=series.writer(1), no_dist=True)
    write_delta, module.write_delta = module.write_delta, None  # not callable: fails
    try:
        dcp.save({"r0": torch.ones(16)}, storage_writer=series.writer(2), no_dist=True)
    except CheckpointException:
        _HELD.append(series)
    finally:
        module.write_delta = write_delta


def _refused(rank, world, directory):
    import torch.distributed as dist
    series = InkSeries(os.path.join(directory, "run"), threads=1)
    state = {f"r{rank}": torch.full((16,), float(rank))}
    outcome = {"pid": os.getpid(), "holder": os.getppid()}
    for kind in ("save", "async_save"):
        try:
            if kind == "save":
                dcp.save(state, storage_writer=series.writer(2))
            else:
                dcp.async_save(state, storage_writer=series.writer(2),
                               process_group=dist.new_group()).result()
            outcome[kind] = None
        except CheckpointException as exc:
            outcome[kind] = str(exc)
    with open(os.path.join(directory, f"locked_{rank}.json"), "w") as f:
        json.dump(outcome, f)


SCENARIOS = {  # name: ((world size, rank function) or (None, function of the directory), ...)
    "series": ((2, _series_2), (3, _series_3), (2, _series_load)),
    "series_killed": ((2, _killed), (None, _break_a_copy), (2, _load_after_kill)),
    "series_locked": ((None, _hold), (2, _refused)),
}


if __name__ == "__main__":
    scenario_main(SCENARIOS, killed=(_killed,))
