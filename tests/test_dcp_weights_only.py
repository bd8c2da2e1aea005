"""inshrink.dcp.weights_only: a committed DCP checkpoint rewritten in place as a subset of its
items (the sharded Checkpointer's weights-only steps; the multi-process use is in
test_checkpointer_sharded.py)."""
import json
import os

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from inshrink import errors
from inshrink.dcp import weights_only
from inshrink.dcp.chunkmap import assemble, read_chunk_map, values
from inshrink.dcp.inspect import describe, verify
from inshrink.dcp.reader import InkStorageReader
from inshrink.dcp.writer import InkStorageWriter

torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def model_item(fqn):
    return fqn.startswith("model.")


def state():
    gen = torch.Generator().manual_seed(3)
    special = torch.tensor([0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1e-45])
    return {
        "model": {"w": torch.randn(128, 96, generator=gen), "b": torch.randn(48, generator=gen),
                  "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 3),
                  "special": special, "half": torch.randn(9, generator=gen).bfloat16(),
                  "count": 7},
        "optim": {"m": torch.randn(64, 48, generator=gen), "lr": 0.01, "betas": (0.9, 0.99)},
        "training": {"step": 5},
    }


def saved(tmp_path, policy=None):
    path = tmp_path / "ckpt"
    dcp.save(state(), storage_writer=InkStorageWriter(path, threads=1, policy=policy),
             no_dist=True)
    return path


def rewrite(path, policy=None):
    plan = weights_only.plan_subset(path, model_item)
    for name in plan.files:
        weights_only.rewrite_file(plan, name, policy, threads=1)
    weights_only.commit(plan)
    return plan


def load_model(path):
    target = {"model": {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else None
                        for k, v in state()["model"].items()}}
    dcp.load(target, storage_reader=InkStorageReader(path, threads=1), no_dist=True)
    return target["model"]


def bits(tensor):
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def test_the_rewrite_keeps_the_model_bit_for_bit_and_drops_the_rest(tmp_path):
    path = saved(tmp_path)
    before = sorted(n for n in os.listdir(path) if n.endswith(".ink"))
    plan = rewrite(path)
    files = sorted(n for n in os.listdir(path) if n.endswith(".ink"))
    assert files == [plan.new_name(n) for n in before] and files != before  # old ones gone
    assert not any(n.endswith(".tmp") for n in os.listdir(path))
    model = load_model(path)
    for name, tensor in state()["model"].items():
        if isinstance(tensor, torch.Tensor):
            assert torch.equal(bits(model[name]), bits(tensor)), name
    assert model["count"] == 7  # a plain value of the model stays
    rows = describe(path)
    assert {r["fqn"] for r in rows} == {f"model.{k}" for k in state()["model"]}
    assert verify(path) == []
    # the chunk map: the new save id, the model's items only, the typed value kept
    chunk_map = read_chunk_map(path)
    assert chunk_map.save_id == plan.save_id
    assert values(path) == {"model.count": 7}
    assert set(assemble(path)) == {f"model.{k}" for k, v in state()["model"].items()
                                   if isinstance(v, torch.Tensor)}
    doc = json.loads((path / "chunks.json").read_text())
    assert all(not i["fqn"].startswith(("optim", "training")) for i in doc["items"])


def test_loading_what_the_rewrite_dropped_fails(tmp_path):
    path = saved(tmp_path)
    rewrite(path)
    target = {"optim": {"m": torch.zeros(64, 48)}}
    with pytest.raises(CheckpointException) as info:
        dcp.load(target, storage_reader=InkStorageReader(path, threads=1), no_dist=True)
    assert "optim.m" in repr(info.value.failures)


def test_until_the_commit_the_directory_reads_as_the_whole_checkpoint(tmp_path):
    path = saved(tmp_path)
    plan = weights_only.plan_subset(path, model_item)
    for name in plan.files:  # every file rewritten, then killed before the commit
        weights_only.rewrite_file(plan, name, threads=1)
    assert {r["fqn"] for r in describe(path)} >= {"optim.m", "training.step"}
    target = {"optim": {"m": torch.zeros(64, 48)}}
    dcp.load(target, storage_reader=InkStorageReader(path, threads=1), no_dist=True)
    assert torch.equal(target["optim"]["m"], state()["optim"]["m"])
    assert read_chunk_map(path).save_id == plan.old_save_id
    rewrite(path)  # a later rewrite commits, and removes the first one's files too
    assert len([n for n in os.listdir(path) if n.endswith(".ink")]) == 1


def test_a_commit_before_every_file_is_rewritten_is_refused(tmp_path):
    path = saved(tmp_path)
    plan = weights_only.plan_subset(path, model_item)
    with pytest.raises(errors.InvalidArgumentError, match="not written"):
        weights_only.commit(plan)
    assert {r["fqn"] for r in describe(path)} >= {"optim.m"}  # unchanged


def test_nothing_to_keep_is_refused(tmp_path):
    path = saved(tmp_path)
    with pytest.raises(errors.InvalidArgumentError, match="none of its items"):
        weights_only.plan_subset(path, lambda fqn: False)
    with pytest.raises(errors.CorruptError, match="not a DCP checkpoint"):
        weights_only.plan_subset(tmp_path / "nowhere", model_item)


def test_a_policy_encodes_the_kept_items_again_and_reports_their_error(tmp_path):
    path = saved(tmp_path)
    whole = sum(os.path.getsize(path / n) for n in os.listdir(path) if n.endswith(".ink"))
    rewrite(path, policy="aggressive")
    rows = {r["fqn"]: r for r in describe(path)}
    reported = rows["model.w"]["error"]["rel_l2_error"]
    model = load_model(path)
    original = state()["model"]["w"]
    actual = float((model["w"] - original).norm() / original.norm())
    assert 0 < reported < 0.3 and actual == pytest.approx(reported, rel=1e-3)  # as measured
    assert torch.equal(bits(model["special"]), bits(state()["model"]["special"]))  # tiny: exact
    assert model["count"] == 7
    smaller = sum(os.path.getsize(path / n) for n in os.listdir(path) if n.endswith(".ink"))
    assert smaller < whole / 2
