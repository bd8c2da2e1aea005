"""inshrink.dcp with real process groups: FSDP2 (fully_shard) on CPU with gloo, saved by N
ranks and loaded by M, failures that must reach every rank, a rank killed mid-save.

Each test runs this file as a script (a fresh interpreter), which forks the ranks of each
process group it needs (tests/helpers.py); the test then checks what the ranks left on disk.
The harness itself is tested after the other tests.
"""
import json
import os
import signal
import time

import pytest
import torch
from helpers import fully_sharded, run_ranks, run_scenario, scenario_main

import inshrink
from inshrink import errors
from inshrink.dcp.inspect import describe
from inshrink.dcp.reader import InkStorageReader
from inshrink.dcp.writer import InkStorageWriter

HERE = os.path.abspath(__file__)
TIMEOUT = 60
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def flat(state, prefix=""):
    """Nested dicts and lists as {dotted key: leaf}."""
    if isinstance(state, dict):
        items = state.items()
    elif isinstance(state, (list, tuple)):
        items = enumerate(state)
    else:
        return {prefix: state}
    out = {}
    for key, value in items:
        out.update(flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def assert_bit_equal(expected, actual):
    expected, actual = flat(expected), flat(actual)
    assert sorted(expected) == sorted(actual)
    for key, value in expected.items():
        other = actual[key]
        if isinstance(value, torch.Tensor):
            assert other.dtype == value.dtype and other.shape == value.shape, key
            assert torch.equal(other.reshape(-1).view(torch.uint8),
                               value.reshape(-1).view(torch.uint8)), key
        else:
            assert other == value, key


def test_fsdp2_saved_by_2_ranks_loads_bit_exact_into_1_2_and_3(tmp_path):
    run_scenario(HERE, "reshard_from_2", tmp_path, TIMEOUT)
    reference = torch.load(tmp_path / "reference.pt", weights_only=False)
    assert reference["extra"]["step"] == 3
    for world in (1, 2, 3):
        loaded = torch.load(tmp_path / f"loaded_{world}.pt", weights_only=False)
        assert_bit_equal(reference, loaded)
    # every rank wrote its own file, with its own shards of the weights
    rows = describe(tmp_path / "ckpt")
    files = {row["file"] for row in rows}
    assert len(files) == 2
    weight = [row for row in rows if row["fqn"] == "model.0.weight"]
    assert sorted(row["offsets"] for row in weight) == [(0, 0), (100, 0)]
    assert len({row["file"] for row in weight}) == 2
    assert all(row["error"] is None for row in rows)  # lossless
    # joined into one unsharded file: the reference, bit for bit
    from inshrink.dcp.consolidation import consolidate
    from inshrink.dcp.inspect import verify
    assert verify(tmp_path / "ckpt") == []
    consolidate(tmp_path / "ckpt", tmp_path / "full.ink")
    with inshrink.open(tmp_path / "full.ink") as f:
        assert torch.equal(torch.from_numpy(f["model.0.weight"]), reference["model"]["0.weight"])
        moment = reference["optim"]["state"]["0.weight"]["exp_avg_sq"]
        assert torch.equal(torch.from_numpy(f["optim.state.0.weight.exp_avg_sq"]), moment)
        assert f.metadata["dcp.consolidated_from"] == "ckpt"


def test_fsdp2_async_and_lossy_saved_by_3_ranks_load_into_2(tmp_path):
    run_scenario(HERE, "reshard_from_3", tmp_path, TIMEOUT)
    reference = torch.load(tmp_path / "reference.pt", weights_only=False)
    loaded = torch.load(tmp_path / "loaded_async.pt", weights_only=False)
    assert_bit_equal(reference, loaded)
    # the lossy checkpoint: three files, per-shard errors reported, values within them
    rows = describe(tmp_path / "lossy")
    assert len({row["file"] for row in rows}) == 3
    lossy = {(row["fqn"], row["offsets"]): row for row in rows if row["error"]
             and row["codec"].startswith("quant")}
    assert {fqn for fqn, _ in lossy} >= {"model.0.weight", "optim.state.0.weight.exp_avg",
                                         "optim.state.0.weight.exp_avg_sq"}
    # the summary counts tensors (fully-qualified names) and their chunks apart
    def is_lossy(row):
        return bool({"quant", "factored"} & set(row["codec"].split("+")))
    fqns = {row["fqn"] for row in rows}
    lossy_fqns = {row["fqn"] for row in rows if is_lossy(row)}
    lossy_chunks = [row for row in rows if is_lossy(row)]
    assert len(lossy_chunks) > len(lossy_fqns) and len(rows) > len(fqns)
    from kit import run_cli
    out = run_cli("info", "lossy", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert (f"LOSSY: {len(lossy_fqns)} of {len(fqns)} tensors ({len(lossy_chunks)} of "
            f"{len(rows)} chunks) quantized") in out.stdout, out.stdout
    lossy_loaded = torch.load(tmp_path / "loaded_lossy.pt", weights_only=False)
    for key in ("0.weight",):
        exact, approx = reference["model"][key], lossy_loaded["model"][key]
        error = (approx - exact).abs().max().item()
        shard_errors = [row["error"]["max_abs_error"] for (fqn, _), row in lossy.items()
                        if fqn == f"model.{key}"]
        assert 0 < error <= max(shard_errors)
    # resharded, the lossy checkpoint gives exactly the values it stores
    from inshrink.dcp.consolidation import consolidate
    consolidate(tmp_path / "lossy", tmp_path / "lossy.ink")
    with inshrink.open(tmp_path / "lossy.ink") as f:
        weight = lossy_loaded["model"]["0.weight"]
        assert torch.equal(torch.from_numpy(f["model.0.weight"]), weight)
        moment = lossy_loaded["optim"]["state"]["0.weight"]["exp_avg"]
        assert torch.equal(torch.from_numpy(f["optim.state.0.weight.exp_avg"]), moment)
    # what is not lossy stays exact: biases, steps and the non-tensor items
    assert torch.equal(reference["model"]["0.bias"], lossy_loaded["model"]["0.bias"])
    assert_bit_equal(reference["extra"], lossy_loaded["extra"])


def test_a_rank_that_fails_fails_the_save_on_every_rank(tmp_path):
    run_scenario(HERE, "rank_fails", tmp_path, TIMEOUT)
    for rank in (0, 1):
        outcome = json.loads((tmp_path / f"outcome_{rank}.json").read_text())
        assert outcome["error"] == "CheckpointException", outcome
        assert "disk on fire" in outcome["message"]
    # nothing was committed: the directory is refused, naming the missing marker
    with pytest.raises(errors.IncompleteCheckpointError, match=r"\.metadata"):
        InkStorageReader(tmp_path / "ckpt").read_metadata()


def test_a_rank_killed_mid_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    run_scenario(HERE, "rank_killed", tmp_path, TIMEOUT)
    # the scenario checked that rank 1 died by SIGKILL and that the group was torn down
    assert (tmp_path / "killed").read_text() == str(-signal.SIGKILL)
    with pytest.raises(errors.IncompleteCheckpointError, match=r"\.metadata"):
        InkStorageReader(tmp_path / "partial").read_metadata()
    # rank 1 died with its file half written: only the temporary file exists
    names = os.listdir(tmp_path / "partial")
    assert any(n.startswith(".rank00001-") and n.endswith(".tmp") for n in names), names
    assert not any(n.startswith("rank00001-") for n in names), names
    # the previous checkpoint loads, bit-exact, in this single process
    import torch.distributed.checkpoint as dcp
    reference = torch.load(tmp_path / "reference.pt", weights_only=False)
    state = {"model": {k: torch.zeros_like(v) for k, v in reference["model"].items()}}
    dcp.load(state, storage_reader=InkStorageReader(tmp_path / "ckpt"), no_dist=True)
    assert_bit_equal(reference["model"], state["model"])


# -- the harness (tests/helpers.py), its ranks forked from this process --------------------

def _raises_on_rank_1(rank, world, directory):
    if rank == 1:
        raise ValueError("rank 1 cannot go on")


def _hangs_on_rank_1(rank, world, directory):
    if rank == 1:
        time.sleep(60)


def _gone(pid):
    """The process ``pid`` is not running (a zombie of a reaper that has not waited for it
    yet, or one being torn down, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in "ZX"
    except FileNotFoundError:
        return True


def test_harness_a_rank_that_raises_fails_the_group_with_its_traceback(tmp_path):
    import torch.multiprocessing as mp
    with pytest.raises(mp.ProcessRaisedException) as excinfo:
        run_ranks(2, _raises_on_rank_1, tmp_path, timeout=30)
    message = str(excinfo.value)
    assert "Process 1 terminated with the following error" in message
    assert "Traceback" in message and "in _raises_on_rank_1" in message
    assert message.rstrip().endswith("ValueError: rank 1 cannot go on")


def test_harness_a_hung_rank_is_killed_at_its_timeout_showing_where_it_hangs(tmp_path, capfd):
    began = time.monotonic()
    with pytest.raises(TimeoutError, match=r"_hangs_on_rank_1: ranks \(rank, pid\) \[\(1, "
                       r"\d+\)\] of 2 still running after 0.5 s") as excinfo:
        run_ranks(2, _hangs_on_rank_1, tmp_path, timeout=0.5)
    assert time.monotonic() - began < 10
    pid = int(str(excinfo.value).split("[(1, ")[1].split(")")[0])
    assert _gone(pid)
    assert "in _hangs_on_rank_1" in capfd.readouterr().err  # its stack, dumped before


def test_harness_a_script_past_its_timeout_is_killed_with_what_it_forked(tmp_path):
    script = tmp_path / "hangs.py"
    script.write_text("import os, sys, time\n"
                      "child = os.fork()\n"
                      "if child:\n"
                      "    with open(os.path.join(sys.argv[2], 'child'), 'w') as f:\n"
                      "        f.write(str(child))\n"
                      "print('started', file=sys.stderr, flush=True)\n"
                      "time.sleep(60)\n")
    began = time.monotonic()
    with pytest.raises(AssertionError, match=r"(?s)hangs: still running after 1 s, killed "
                       r"with its ranks\n.*started"):
        run_scenario(str(script), "hangs", tmp_path, timeout=1)
    assert time.monotonic() - began < 10
    assert _gone(int((tmp_path / "child").read_text()))


# -- the ranks (run as a script) -----------------------------------------------------------

def _model():
    # 200 and 10 rows shard unevenly over 3 ranks; 64 x 67 = 4288 weights per shard of the
    # first layer over 3 ranks are enough for the policy to quantize them
    return torch.nn.Sequential(torch.nn.Linear(64, 200), torch.nn.ReLU(),
                               torch.nn.Linear(200, 10))


def _sharded(world, seed):
    torch.manual_seed(seed)
    return fully_sharded(_model(), world)


def _train(model, optim, sched, steps, seed=1):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(8, 64, generator=gen)
        model(x).pow(2).mean().backward()
        optim.step()
        optim.zero_grad()
        sched.step()


def _state(model, optim, sched, step):
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model_sd, optim_sd = get_state_dict(model, optim)
    return {"model": model_sd, "optim": optim_sd,
            "extra": {"step": step, "sched": sched.state_dict(), "note": "resume here",
                      "rng": torch.get_rng_state()}}


def _full(model, optim, state):
    """The whole (unsharded) state, gathered; on rank 0 only."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    model_sd, optim_sd = get_state_dict(
        model, optim, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {"model": model_sd, "optim": optim_sd, "extra": state["extra"]}


def _save_trained(rank, world, directory, name, **writer_args):
    import torch.distributed.checkpoint as dcp
    model, optim, sched = _sharded(world, seed=0)
    _train(model, optim, sched, 3)
    state = _state(model, optim, sched, 3)
    dcp.save(state, storage_writer=InkStorageWriter(os.path.join(directory, name),
                                                    threads=1, **writer_args))
    full = _full(model, optim, state)
    if rank == 0:
        torch.save(full, os.path.join(directory, "reference.pt"))
    return model, optim, sched, state


def _load(rank, world, directory, name, out):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict
    model, optim, sched = _sharded(world, seed=123)  # other values, all overwritten
    state = _state(model, optim, sched, 0)
    state["extra"]["rng"] = torch.zeros_like(state["extra"]["rng"])
    dcp.load(state, storage_reader=InkStorageReader(os.path.join(directory, name), threads=1))
    set_state_dict(model, optim, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    full = _full(model, optim, state)
    if rank == 0:
        torch.save(full, os.path.join(directory, out))


def _reshard_from_2(rank, world, directory):
    _save_trained(rank, world, directory, "ckpt")


def _reshard_from_3(rank, world, directory):
    import torch.distributed.checkpoint as dcp
    model, optim, sched, state = _save_trained(rank, world, directory, "lossy",
                                               policy="balanced")
    # async: the save completes while training goes on, and holds the state at the call;
    # its collectives run on a group of their own, beside training's
    import torch.distributed as dist
    future = dcp.async_save(state, storage_writer=InkStorageWriter(
        os.path.join(directory, "async"), threads=1), process_group=dist.new_group())
    _train(model, optim, sched, 2, seed=2)
    future.result()


class _FailingWriter(InkStorageWriter):
    """Rank 1 fails while writing its file."""

    def write_data(self, plan, planner):
        if self.rank == 1:
            raise OSError(28, "disk on fire")
        return super().write_data(plan, planner)


def _rank_fails(rank, world, directory):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    model, optim, sched = _sharded(world, seed=0)
    state = _state(model, optim, sched, 0)
    try:
        dcp.save(state, storage_writer=_FailingWriter(os.path.join(directory, "ckpt"),
                                                          threads=1))
        outcome = {"error": None}
    except CheckpointException as exc:
        outcome = {"error": type(exc).__name__, "message": str(exc)}
    with open(os.path.join(directory, f"outcome_{rank}.json"), "w") as f:
        json.dump(outcome, f)


def _rank_killed(rank, world, directory):
    import torch.distributed.checkpoint as dcp

    from inshrink.io.writer import Writer
    model, optim, sched = _sharded(world, seed=0)
    _train(model, optim, sched, 1)
    state = _state(model, optim, sched, 1)
    dcp.save(state, storage_writer=InkStorageWriter(os.path.join(directory, "ckpt"), threads=1))
    full = _full(model, optim, state)
    if rank == 0:
        torch.save(full, os.path.join(directory, "reference.pt"))
    if rank == 1:  # dies in the middle of writing its file, after a few tensors
        added = []
        original = Writer.add

        def add(self, *args, **kwargs):
            added.append(args[0])
            if len(added) == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            return original(self, *args, **kwargs)
        Writer.add = add
    dcp.save(state, storage_writer=InkStorageWriter(os.path.join(directory, "partial"),
                                                    threads=1))


SCENARIOS = {  # name: ((world size, rank function), ...)
    "reshard_from_2": ((2, _reshard_from_2),
                       (1, lambda r, w, d: _load(r, w, d, "ckpt", "loaded_1.pt")),
                       (2, lambda r, w, d: _load(r, w, d, "ckpt", "loaded_2.pt")),
                       (3, lambda r, w, d: _load(r, w, d, "ckpt", "loaded_3.pt"))),
    "reshard_from_3": ((3, _reshard_from_3),
                       (2, lambda r, w, d: _load(r, w, d, "async", "loaded_async.pt")),
                       (2, lambda r, w, d: _load(r, w, d, "lossy", "loaded_lossy.pt"))),
    "rank_fails": ((2, _rank_fails),),
    "rank_killed": ((2, _rank_killed),),
}


if __name__ == "__main__":
    scenario_main(SCENARIOS, killed=(_rank_killed,))
