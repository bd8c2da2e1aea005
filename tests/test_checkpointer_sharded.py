"""Checkpointer with a sharded model (FSDP2 fully_shard, gloo, CPU): the same API as for a
plain model, one DCP checkpoint per step with retention, the whole training state per rank,
async saves overlapping real steps, exact resume, failures raised on every rank.

Each test runs this file as a script (a fresh interpreter), which forks the ranks of each
process group it needs (tests/helpers.py); the test then checks what the ranks left on disk.
"""
import json
import os
import threading
import time

import pytest
import torch
from helpers import fully_sharded, run_scenario, scenario_main

from inshrink import errors
from inshrink.dcp.inspect import describe
from inshrink.torch import Checkpointer

HERE = os.path.abspath(__file__)
TIMEOUT = 90
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def read(directory, name):
    return json.loads((directory / name).read_text())


def test_sharded_async_saves_resume_exactly_on_the_same_ranks(tmp_path):
    run_scenario(HERE, "resume", tmp_path, TIMEOUT)
    for rank in (0, 1):
        first = read(tmp_path, f"first_{rank}.json")
        second = read(tmp_path, f"second_{rank}.json")
        # the async save returned at once; two steps ran while its write was held
        assert first["blocked"] < 5 and first["pending_while_training"], first
        # resumed from step 5 on fresh processes: the same losses, bit for bit
        assert second["restored"] == 5
        assert second["losses"] == first["losses"], rank
        # a rank whose state does not match fails, and the other rank with it (no hang)
        assert second["mismatch"]["type"] == "InvalidArgumentError"
        assert "extra['other']" in second["mismatch"]["message"]
        assert (rank == 1) != second["mismatch"]["message"].startswith("rank 1:")
        # a write that failed on rank 1 raised on both ranks; the step was not committed
        assert "disk on fire" in second["failure"] and second["steps_after_failure"] == [5, 6]
    assert read(tmp_path, "first_0.json")["losses"] != read(tmp_path, "first_1.json")["losses"]
    # one directory per step, the two newest kept; each a committed DCP checkpoint
    names = sorted(n for n in os.listdir(tmp_path / "ckpt") if not n.startswith("."))
    assert names == ["step_000000000006", "step_000000000008"]
    rows = describe(tmp_path / "ckpt" / "step_000000000008")
    assert len({row["file"] for row in rows}) == 2
    fqns = {row["fqn"] for row in rows}
    assert {"training_rank00000.document", "training_rank00001.document",
            "training_rank00000.arrays.training.rng.torch"} <= fqns
    # step 8 was saved with policy="balanced": per shard, with the error of each
    moment = [row for row in rows if row["fqn"] == "optim.state.0.weight.exp_avg"]
    assert len(moment) == 2 and all(row["error"] is not None for row in moment)
    assert all(row["error"]["max_abs_error"] == 0 for row in rows
               if row["fqn"].startswith("training_"))
    # three ranks (another world size) restore the newest step; rank 2, which did not
    # save, takes rank 0's scheduler and extras and keeps its own random generators
    for rank in (0, 1, 2):
        loaded = read(tmp_path, f"three_{rank}.json")
        assert loaded["restored"] == 8 and loaded["last_epoch"] == 8
        assert loaded["counter"] == 8 and loaded["rng_kept"] == (rank == 2)
        assert loaded["missing"] == "CorruptError"  # step 7 never committed, then removed


def test_sharded_mode_checks_its_arguments(tmp_path):
    model = torch.nn.Linear(4, 4)
    with pytest.raises(errors.InvalidArgumentError, match="no configuration search"):
        Checkpointer(tmp_path / "c", model, sharded=True, eval_batches=[(torch.ones(1, 4),
                                                                         torch.zeros(1))])
    with pytest.raises(errors.InvalidArgumentError, match="initialized process group"):
        Checkpointer(tmp_path / "c", model, sharded=True)


class _Runs:
    """Unpickling it would call print: what a hostile checkpoint would do."""

    def __reduce__(self):
        return print, ("unpickled",)


def test_stored_values_are_unpickled_as_plain_data_only(capsys):
    import io
    import pickle
    from types import SimpleNamespace

    from inshrink.dcp.sharded import _SafeLoadPlanner
    planner = _SafeLoadPlanner(flatten_state_dict=False)
    planner.state_dict = {}
    item = SimpleNamespace(dest_index=SimpleNamespace(fqn="optim.param_groups.0.lr"))
    with pytest.raises(errors.CorruptError, match="optim.param_groups.0.lr"):
        planner.load_bytes(item, io.BytesIO(pickle.dumps(_Runs(), protocol=2)))
    assert "unpickled" not in capsys.readouterr().out
    buffer = io.BytesIO()
    torch.save({"lr": 0.5, "betas": (0.9, 0.99)}, buffer)
    buffer.seek(0)
    planner.load_bytes(item, buffer)
    assert planner.state_dict["optim.param_groups.0.lr"] == {"lr": 0.5, "betas": (0.9, 0.99)}


# -- the ranks (run as a script) -----------------------------------------------------------

class Counter:
    """A Stateful extra: the number of steps taken."""

    def __init__(self):
        self.count = 0

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = state["count"]


def _sharded(world, seed):
    torch.manual_seed(seed)
    return fully_sharded(torch.nn.Sequential(torch.nn.Linear(64, 100), torch.nn.ReLU(),
                                             torch.nn.Dropout(0.3), torch.nn.Linear(100, 4)),
                         world)


def _train(model, optim, sched, counter, steps):
    """Steps on batches drawn from the global generator (each rank's own), with dropout."""
    losses = []
    for _ in range(steps):
        x = torch.randn(8, 64)
        loss = torch.nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long())
        loss.backward()
        optim.step()
        optim.zero_grad()
        sched.step()
        counter.count += 1
        losses.append(loss.item())
    return losses


def _write(directory, name, rank, doc):
    with open(os.path.join(directory, f"{name}_{rank}.json"), "w") as f:
        json.dump(doc, f)


def _first(rank, world, directory):
    """Train with async saves (the writer slowed down), then go on uninterrupted."""
    from inshrink.dcp.writer import InkStorageWriter
    model, optim, sched = _sharded(world, seed=0)
    torch.manual_seed(100 + rank)  # each rank its own batches and dropout
    counter = Counter()
    ckpt = Checkpointer(os.path.join(directory, "ckpt"), model, optim, sched,
                        extra={"counter": counter}, async_=True, keep_last=2)
    _train(model, optim, sched, counter, 2)
    original, release = InkStorageWriter.write_data, threading.Event()

    def held(self, plan, planner):  # the write waits until training has taken two steps
        assert release.wait(30)
        return original(self, plan, planner)
    InkStorageWriter.write_data = held
    began = time.perf_counter()
    ckpt.save(2)
    blocked = time.perf_counter() - began
    _train(model, optim, sched, counter, 2)
    pending = not ckpt._pending[1].done()
    release.set()
    InkStorageWriter.write_data = original
    ckpt.save(4)  # waits for step 2 first
    _train(model, optim, sched, counter, 1)
    ckpt.save(5)
    ckpt.wait()
    losses = _train(model, optim, sched, counter, 3)
    ckpt.close()
    _write(directory, "first", rank, {"blocked": blocked, "pending_while_training": pending,
                                      "losses": losses})


def _second(rank, world, directory):
    """Fresh processes: a mismatching restore fails everywhere; then resume from step 5."""
    torch.manual_seed(7)
    model, optim, sched = _sharded(world, seed=3)
    counter = Counter()
    extra = {"counter": counter, **({"other": Counter()} if rank == 1 else {})}
    mismatch = None
    try:
        Checkpointer(os.path.join(directory, "ckpt"), model, optim, sched,
                     extra=extra, keep_last=2).restore()
    except errors.InshrinkError as exc:
        mismatch = {"type": type(exc).__name__, "message": str(exc)}
    ckpt = Checkpointer(os.path.join(directory, "ckpt"), model, optim, sched,
                        extra={"counter": counter}, keep_last=2, policy="balanced")
    restored = ckpt.restore()
    losses = _train(model, optim, sched, counter, 1)
    ckpt.save(6)  # synchronous, lossy
    losses += _train(model, optim, sched, counter, 2)
    # rank 1 fails to write step 7: every rank raises it, nothing is committed
    from inshrink.dcp.writer import InkStorageWriter
    original = InkStorageWriter.write_data

    def failing(self, plan, planner):
        if self.rank == 1:
            raise OSError(28, "disk on fire")
        return original(self, plan, planner)
    InkStorageWriter.write_data = failing
    failure = None
    try:
        ckpt.save(7)
    except OSError as exc:
        failure = str(exc)
    InkStorageWriter.write_data = original
    steps_after_failure = ckpt.steps()
    ckpt.save(8)  # retention keeps 6 and 8, and removes 7, which never committed
    _write(directory, "second", rank, {"restored": restored, "losses": losses,
                                       "mismatch": mismatch, "failure": failure,
                                       "steps_after_failure": steps_after_failure})


def _three(rank, world, directory):
    model, optim, sched = _sharded(world, seed=5)
    counter = Counter()
    torch.manual_seed(11)
    state = torch.get_rng_state()
    ckpt = Checkpointer(os.path.join(directory, "ckpt"), model, optim, sched,
                        extra={"counter": counter})
    try:  # a step that is not there: a typed error on every rank
        ckpt.restore(7)
        missing = None
    except errors.InshrinkError as exc:
        missing = type(exc).__name__
    restored = ckpt.restore()
    _write(directory, "three", rank, {"missing": missing, "restored": restored, "last_epoch": sched.last_epoch,
                                       "counter": counter.count,
                                       "rng_kept": bool(torch.equal(torch.get_rng_state(),
                                                                    state))})


def _local_sum(model):
    return float(sum(p.to_local().double().sum() if hasattr(p, "to_local") else p.double().sum()
                     for p in model.parameters()))


def _weights(rank, world, directory):
    """keep_weights in the sharded mode: the model of older steps, without the training state."""
    model, optim, sched = _sharded(world, seed=1)
    torch.manual_seed(200 + rank)
    counter = Counter()
    ckpt = Checkpointer(os.path.join(directory, "ckpt"), model, optim, sched,
                        extra={"counter": counter}, async_=True, keep_last=1, keep_weights=2)
    sums = {}
    for step in (1, 2, 3, 4):
        _train(model, optim, sched, counter, 1)
        sums[step] = _local_sum(model)
        ckpt.save(step)
    ckpt.wait()
    refused = None
    try:
        ckpt.restore(2)
    except errors.InshrinkError as exc:
        refused = {"type": type(exc).__name__, "message": str(exc)}
    _train(model, optim, sched, counter, 1)
    restored = ckpt.restore_model(2)
    back = _local_sum(model)
    try:
        ckpt.restore_model(1)  # beyond keep_last + keep_weights: gone
        gone = None
    except errors.InshrinkError as exc:
        gone = type(exc).__name__
    steps, weights_steps = ckpt.steps(), ckpt.weights_steps()
    ckpt.close()
    _write(directory, "weights", rank, {"refused": refused, "restored": restored,
                                        "sum_saved": sums[2], "sum_restored": back,
                                        "gone": gone, "steps": steps,
                                        "weights_steps": weights_steps})


def _held_writes():
    """Make every rank's DCP write wait until the returned event is set."""
    from inshrink.dcp.writer import InkStorageWriter
    original, release = InkStorageWriter.write_data, threading.Event()

    def held(self, plan, planner):
        assert release.wait(30)
        return original(self, plan, planner)
    InkStorageWriter.write_data = held
    return release, lambda: setattr(InkStorageWriter, "write_data", original)


def _in_place(rank, world, directory):
    """async_staging="in_place": the step after a save waits for it; a change outside the
    step on one rank fails the step on both."""
    model, optim, sched = _sharded(world, seed=2)
    torch.manual_seed(300 + rank)
    counter = Counter()
    ckpt = Checkpointer(os.path.join(directory, "ckpt"), model, optim, sched,
                        extra={"counter": counter}, async_=True, async_staging="in_place")
    _train(model, optim, sched, counter, 2)
    saved = _local_sum(model)
    release, restore_writes = _held_writes()
    ckpt.save(2)
    threading.Timer(0.5, release.set).start()
    began = time.perf_counter()
    _train(model, optim, sched, counter, 1)  # its optimizer step waits for the save
    waited = time.perf_counter() - began
    restore_writes()
    ckpt.wait()
    release, restore_writes = _held_writes()
    ckpt.save(3)
    if rank == 1:
        with torch.no_grad():
            next(model.parameters()).mul_(0.5)  # not optimizer.step(): nothing waits
    release.set()
    failure = None
    try:
        ckpt.wait()
    except errors.InshrinkError as exc:
        failure = str(exc)
    restore_writes()
    steps = ckpt.steps()
    ckpt.restore(2)
    back = _local_sum(model)
    ckpt.save(4)  # its commit removes what the failed save left
    ckpt.close()
    _write(directory, "in_place", rank, {"waited": waited, "failure": failure, "steps": steps,
                                         "saved": saved, "restored": back})


SCENARIOS = {  # name: ((world size, rank function), ...)
    "resume": ((2, _first), (2, _second), (3, _three)),
    "weights": ((2, _weights),),
    "in_place": ((2, _in_place),),
}


if __name__ == "__main__":
    scenario_main(SCENARIOS)


def test_sharded_keep_weights_keeps_older_models_only(tmp_path):
    run_scenario(HERE, "weights", tmp_path, TIMEOUT)
    for rank in (0, 1):
        got = read(tmp_path, f"weights_{rank}.json")
        assert got["steps"] == [4] and got["weights_steps"] == [2, 3, 4], got
        assert got["refused"]["type"] == "InvalidArgumentError"
        assert "step 2 keeps the model's weights only" in got["refused"]["message"]
        assert got["restored"] == 2 and got["sum_restored"] == got["sum_saved"]  # lossless
        assert got["gone"] == "InvalidArgumentError"
    # rewritten in place: no second set of checkpoints; the older steps hold the model only
    names = sorted(n for n in os.listdir(tmp_path / "ckpt") if not n.startswith("."))
    assert names == ["step_000000000002", "step_000000000003", "step_000000000004"]
    whole = {row["fqn"] for row in describe(tmp_path / "ckpt" / names[2])}
    assert any(f.startswith("optim") for f in whole)
    for name in names[:2]:
        step = tmp_path / "ckpt" / name
        rows = describe(step)
        fqns = {row["fqn"] for row in rows}
        assert fqns == {f for f in whole if f.startswith("model.")}, name
        # one save id again in every file, the chunk map's; no file of the whole step left
        files = sorted(n for n in os.listdir(step) if n.endswith(".ink"))
        assert len(files) == 2 and len({n[10:22] for n in files}) == 1
        assert read(step, "chunks.json")["save_id"] == files[0][10:22]
        # read without torch's metadata, as any reader of the chunk map would
        from inshrink.dcp.chunkmap import assemble
        assert set(assemble(step)) == fqns


@pytest.mark.parametrize("keep_last", [None, 1])
def test_a_commit_removes_older_saves_that_never_committed(tmp_path, keep_last):
    """Without keep_last, the directory of a save killed part way stayed for good (unless
    the same step was saved again)."""
    from types import SimpleNamespace

    from inshrink.dcp.names import METADATA
    from inshrink.dcp.sharded import ShardedCheckpoints, step_directory
    for step, committed in [(1, True), (2, False), (3, True), (4, False), (5, True),
                            (6, False)]:
        path = tmp_path / step_directory(step)
        path.mkdir()
        (path / ("x.distcp" if not committed else METADATA)).write_bytes(b"")
    shards = SimpleNamespace(directory=str(tmp_path), keep_last=keep_last)
    shards._step_dirs = lambda: ShardedCheckpoints._step_dirs(shards)
    shards.committed = lambda: ShardedCheckpoints.committed(shards)
    keep = None if keep_last is None else shards.committed()[-keep_last:]
    ShardedCheckpoints._retain(shards, 5, keep)  # step 5 just committed; 6 is being written
    left = sorted(os.listdir(tmp_path))
    kept = [1, 3, 5, 6] if keep_last is None else [5, 6]
    assert left == [step_directory(s) for s in kept]


def test_sharded_in_place_staging_waits_in_the_step_and_fails_on_a_change(tmp_path):
    run_scenario(HERE, "in_place", tmp_path, TIMEOUT)
    for rank in (0, 1):
        got = read(tmp_path, f"in_place_{rank}.json")
        assert got["waited"] >= 0.4, got  # the step after the save waited for the write
        # rank 1 changed a parameter outside the step: step 3 failed on both ranks
        assert got["failure"] is not None and "step 3 was not saved" in got["failure"], got
        assert got["steps"] == [2]
        assert got["restored"] == got["saved"]  # step 2: the state at the call
    names = sorted(n for n in os.listdir(tmp_path / "ckpt") if not n.startswith("."))
    assert names == ["step_000000000002", "step_000000000004"]
