"""inshrink.dcp in one process: round trips through dcp.save/load, non-tensor items, policies
and their reported error, async save, atomic replacement, and bad checkpoints.

The multi-process tests (FSDP2, resharding, failing and killed ranks) are in
test_dcp_distributed.py.
"""
import collections
import io
import math
import os
import pickle
import subprocess
import sys
import threading

import pytest
import torch
import torch.distributed.checkpoint as dcp
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.checkpoint.api import CheckpointException

import inshrink
from inshrink import errors
from inshrink.dcp.consolidation import consolidate
from inshrink.dcp.inspect import describe, verify
from inshrink.dcp.metadata import BYTES_PREFIX, METADATA_FILE, read_metadata
from inshrink.dcp.reader import InkStorageReader
from inshrink.dcp.writer import InkStorageWriter

torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def save(state, path, **kwargs):
    return dcp.save(state, storage_writer=InkStorageWriter(path, threads=1, **kwargs),
                    no_dist=True)


def load(state, path):
    dcp.load(state, storage_reader=InkStorageReader(path, threads=1), no_dist=True)
    return state


def bits(tensor):
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def zeros_like(state):
    return {k: zeros_like(v) if isinstance(v, dict) else
            torch.zeros_like(v) if isinstance(v, torch.Tensor) else None
            for k, v in state.items()}


def mixed_state():
    gen = torch.Generator().manual_seed(0)
    special = torch.tensor([0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1e-45])
    return {
        "f32": torch.randn(33, 17, generator=gen),
        "bf16": torch.randn(8, 5, generator=gen).bfloat16(),
        "f16": torch.randn(7, generator=gen).half(),
        "f64": torch.randn(3, 2, 2, generator=gen, dtype=torch.float64),
        "i64": torch.arange(-5, 5),
        "bool": torch.tensor([True, False, True]),
        "u8": torch.randint(0, 255, (11,), dtype=torch.uint8, generator=gen),
        "scalar": torch.tensor(3.25),
        "empty": torch.zeros(0, 4),
        "special": special,
        "strided": torch.randn(6, 8, generator=gen).t(),
        "nested": {"deep": {"w": torch.randn(4, 4, generator=gen)}},
    }


def test_lossless_round_trip_is_bit_exact_for_every_dtype(tmp_path):
    state = mixed_state()
    save(state, tmp_path / "ckpt")
    loaded = load(zeros_like(state), tmp_path / "ckpt")
    for key in ("f32", "bf16", "f16", "f64", "i64", "bool", "u8", "scalar", "empty", "special",
                "strided"):
        assert loaded[key].dtype == state[key].dtype and loaded[key].shape == state[key].shape
        assert torch.equal(bits(loaded[key]), bits(state[key])), key
    assert torch.equal(loaded["nested"]["deep"]["w"], state["nested"]["deep"]["w"])
    # one rank file and the chunk map, committed by the metadata written last
    names = sorted(os.listdir(tmp_path / "ckpt"))
    assert names[:2] == [METADATA_FILE, "chunks.json"] and len(names) == 3
    assert names[2].endswith(".ink")
    with inshrink.open(tmp_path / "ckpt" / names[2]) as f:  # an ordinary .ink file
        assert torch.equal(torch.from_numpy(f["f32"]), state["f32"])
        assert f.metadata["dcp.rank"] == "0"


DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int32,
          torch.int8, torch.bool, torch.uint8]


@settings(max_examples=25)
@given(shapes=st.lists(st.lists(st.integers(0, 5), max_size=3), min_size=1, max_size=4),
       dtype_indices=st.lists(st.integers(0, len(DTYPES) - 1), min_size=4, max_size=4),
       seed=st.integers(0, 2**16))
def test_any_tensors_round_trip_bit_for_bit(tmp_path_factory, shapes, dtype_indices, seed):
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for i, (shape, d) in enumerate(zip(shapes, dtype_indices)):
        raw = torch.randint(0, 256, (math.prod(shape) * DTYPES[d].itemsize,), dtype=torch.uint8,
                            generator=gen)
        if DTYPES[d] == torch.bool:
            raw = raw % 2
        state[f"t{i}"] = raw.view(DTYPES[d]).reshape(shape)  # any bits: NaNs, -0.0, subnormals
    path = tmp_path_factory.mktemp("ckpt")
    save(state, path)
    loaded = load({k: torch.zeros_like(v) for k, v in state.items()}, path)
    for key, value in state.items():
        assert loaded[key].dtype == value.dtype and loaded[key].shape == value.shape
        assert torch.equal(bits(loaded[key]), bits(value)), key


def test_reads_are_batched_by_decoded_size(tmp_path, monkeypatch):
    import inshrink.dcp.reader as reader
    state = {f"t{i}": torch.full((10 + i,), float(i)) for i in range(6)}
    save(state, tmp_path / "ckpt")
    batches = []
    original = inshrink.File.load

    def load_batch(self, progress=None, names=None):
        batches.append(list(names))
        return original(self, progress, names)
    monkeypatch.setattr(inshrink.File, "load", load_batch)
    monkeypatch.setattr(reader, "READ_BATCH_BYTES", 100)  # two or three tensors
    loaded = load({k: torch.zeros_like(v) for k, v in state.items()}, tmp_path / "ckpt")
    assert all(torch.equal(loaded[k], v) for k, v in state.items())
    assert len(batches) == 4 and sorted(sum(batches, [])) == sorted(state)


def test_the_checkpoint_id_given_to_dcp_chooses_the_directory(tmp_path):
    writer = InkStorageWriter(tmp_path / "default", threads=1)
    dcp.save({"w": torch.ones(2)}, storage_writer=writer, checkpoint_id=tmp_path / "chosen",
             no_dist=True)
    assert not (tmp_path / "default").exists()
    loaded = {"w": torch.zeros(2)}
    dcp.load(loaded, storage_reader=InkStorageReader(tmp_path / "other"),
             checkpoint_id=tmp_path / "chosen", no_dist=True)
    assert torch.equal(loaded["w"], torch.ones(2))


def test_non_tensor_items_are_stored_and_restored(tmp_path):
    model = torch.nn.Linear(4, 3)
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(optim, step_size=1, gamma=0.5)
    optim.step()
    sched.step()
    state = {"model": model.state_dict(),
             "train": {"step": 1234, "epoch": 2.5, "name": "run-7", "loader": [3, {"seed": 9}],
                       "sched": sched.state_dict(), "rng": torch.get_rng_state()}}
    save(state, tmp_path / "ckpt")
    fresh_sched = torch.optim.lr_scheduler.StepLR(
        torch.optim.SGD(model.parameters(), lr=1.0), step_size=7, gamma=0.1)
    target = {"model": torch.nn.Linear(4, 3).state_dict(),
              "train": {"step": 0, "epoch": 0.0, "name": "", "loader": [0, {"seed": 0}],
                        "sched": fresh_sched.state_dict(),
                        "rng": torch.zeros_like(state["train"]["rng"])}}
    load(target, tmp_path / "ckpt")
    assert target["train"]["step"] == 1234 and target["train"]["name"] == "run-7"
    assert target["train"]["epoch"] == 2.5 and target["train"]["loader"] == [3, {"seed": 9}]
    assert target["train"]["sched"] == sched.state_dict()
    assert torch.equal(target["train"]["rng"], state["train"]["rng"])
    assert torch.equal(target["model"]["weight"], model.weight)
    # stored as uint8 tensors under the reserved prefix, in the rank's file
    rows = {row["fqn"]: row for row in describe(tmp_path / "ckpt")}
    assert rows["train.step"]["tensor"] == BYTES_PREFIX + "train.step"
    assert rows["train.step"]["dtype"] == "U8" and rows["train.step"]["sizes"] is None


def trained_state(steps=3, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(collections.OrderedDict(
        embed=torch.nn.Embedding(100, 48), proj=torch.nn.Linear(48, 96),
        head=torch.nn.Linear(96, 4)))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        model(torch.randint(0, 100, (16,))).pow(2).mean().backward()
        optim.step()
        optim.zero_grad()
    return model, optim


def dcp_state(model, optim):
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model_sd, optim_sd = get_state_dict(model, optim)
    return {"model": model_sd, "optim": optim_sd}


def test_a_policy_applies_per_shard_with_roles_from_dcp_names_and_reports_its_error(tmp_path):
    model, optim = trained_state()
    state = dcp_state(model, optim)
    save(state, tmp_path / "ckpt", policy="balanced")
    rows = {row["fqn"]: row for row in InkStorageReader(tmp_path / "ckpt").report()}
    # DCP's optimizer names are optim.state.<parameter fqn>.<key>
    assert rows["model.embed.weight"]["role"] == "embedding"
    assert rows["model.proj.weight"]["role"] == "weight"
    assert rows["optim.state.proj.weight.exp_avg"]["role"] == "exp_avg"
    assert rows["optim.state.proj.weight.exp_avg_sq"]["role"] == "exp_avg_sq"
    for fqn in ("model.embed.weight", "model.proj.weight", "optim.state.proj.weight.exp_avg"):
        assert rows[fqn]["codec"].startswith("quant") and rows[fqn]["error"]["rel_l2_error"] > 0
    assert rows["model.proj.bias"]["codec"] == "bytegroup+zstd"
    assert rows["optim.state.proj.weight.step"]["role"] == "exact"
    loaded = load(dcp_state(*trained_state(steps=0, seed=1)), tmp_path / "ckpt")
    for fqn, row in rows.items():
        if row["sizes"] is None:
            continue
        section, _, key = fqn.partition(".")
        expected, actual = state[section], loaded[section]
        if section == "optim":  # optim.state.<param>.<key>
            param, _, moment = key[len("state."):].rpartition(".")
            expected, actual = expected["state"][param][moment], actual["state"][param][moment]
        else:
            expected, actual = expected[key], actual[key]
        if row["error"] is None or row["error"]["max_abs_error"] == 0:
            assert torch.equal(bits(actual), bits(expected)), fqn
        else:  # within the error the encoder measured and stored for this shard
            error = (actual.double() - expected.double()).abs().max().item()
            assert 0 < error <= row["error"]["max_abs_error"] * (1 + 1e-6), fqn


def test_the_policy_overrides_match_fully_qualified_names(tmp_path):
    model, optim = trained_state()
    policy = inshrink.Policy(overrides={"model.proj.*": inshrink.QuantConfig(bins=4)})
    save(dcp_state(model, optim), tmp_path / "ckpt", policy=policy)
    rows = {row["fqn"]: row for row in describe(tmp_path / "ckpt")}
    assert rows["model.proj.weight"]["codec"].startswith("quant")
    assert rows["model.embed.weight"]["codec"] == "bytegroup+zstd"


class GatedWriter(InkStorageWriter):
    """Writes only once the test opens the gate: the save is provably still running."""

    def __init__(self, *args, gate, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate = gate

    def write_data(self, plan, planner):
        assert self.gate.wait(30)
        return super().write_data(plan, planner)


def test_async_save_returns_at_once_and_saves_the_state_of_the_call(tmp_path):
    model, optim = trained_state()
    state = dcp_state(model, optim)
    snapshot = {k: v.clone() for k, v in model.state_dict().items()}
    gate = threading.Event()
    future = dcp.async_save(state, storage_writer=GatedWriter(tmp_path / "ckpt", threads=1,
                                                              gate=gate), no_dist=True)
    assert not future.done()
    for _ in range(2):  # training goes on while the save is in flight
        model(torch.randint(0, 100, (16,))).pow(2).mean().backward()
        optim.step()
        optim.zero_grad()
    assert not future.done()
    gate.set()
    future.result(timeout=30)
    loaded = load({"model": zeros_like(snapshot)}, tmp_path / "ckpt")["model"]
    for key, value in snapshot.items():
        assert torch.equal(bits(loaded[key]), bits(value)), key
    assert not torch.equal(loaded["proj.weight"], model.proj.weight.detach())  # trained since


def test_writer_and_reader_pickle_for_the_process_based_async_executor(tmp_path):
    # AsyncCheckpointerType.PROCESS sends the storage writer to a background process
    policy = inshrink.Policy(overrides={"model.*": inshrink.QuantConfig(bins=4)})
    writer = pickle.loads(pickle.dumps(InkStorageWriter(tmp_path / "ckpt", policy, threads=2)))
    assert (writer.path, writer.policy, writer.threads) == (str(tmp_path / "ckpt"), policy, 2)
    save_state = {"model.w": torch.randn(80, 80)}
    dcp.save(save_state, storage_writer=writer, no_dist=True)
    reader = pickle.loads(pickle.dumps(InkStorageReader(tmp_path / "ckpt")))
    assert describe(reader.path)[0]["codec"].startswith("quant")


def test_saving_again_replaces_the_checkpoint_atomically_and_removes_the_old_files(tmp_path):
    first = {"w": torch.ones(3, 3)}
    save(first, tmp_path / "ckpt")
    old_files = set(os.listdir(tmp_path / "ckpt"))
    (tmp_path / "ckpt" / ".rank00001-0123456789ab.ink.x1y2.tmp").write_bytes(b"debris")
    second = {"w": torch.full((3, 3), 2.0)}
    save(second, tmp_path / "ckpt")
    names = set(os.listdir(tmp_path / "ckpt"))
    assert len(names) == 3 and not (names - {METADATA_FILE, "chunks.json"}) & old_files
    assert torch.equal(load({"w": torch.zeros(3, 3)}, tmp_path / "ckpt")["w"], second["w"])


class FailingWriter(InkStorageWriter):
    def write_data(self, plan, planner):
        super().write_data(plan, planner)  # the new file is written, then the save fails
        raise OSError(28, "No space left on device")


def test_a_failed_save_into_a_checkpoint_keeps_the_previous_one(tmp_path):
    save({"w": torch.ones(3, 3)}, tmp_path / "ckpt")
    with pytest.raises(CheckpointException, match="No space left"):
        dcp.save({"w": torch.zeros(3, 3)}, storage_writer=FailingWriter(tmp_path / "ckpt"),
                 no_dist=True)
    assert torch.equal(load({"w": torch.zeros(3, 3)}, tmp_path / "ckpt")["w"], torch.ones(3, 3))


def test_a_save_that_never_committed_is_refused_naming_the_marker(tmp_path):
    save({"w": torch.ones(3, 3)}, tmp_path / "ckpt")
    os.unlink(tmp_path / "ckpt" / METADATA_FILE)
    with pytest.raises(errors.IncompleteCheckpointError, match=r"ckpt/\.metadata"):
        read_metadata(tmp_path / "ckpt")
    # dcp.load turns what read_metadata raises into an AssertionError inside its collective
    # step: the reader refuses an uncommitted checkpoint when it is made, before dcp.load
    with pytest.raises(errors.IncompleteCheckpointError, match=r"ckpt/\.metadata is missing"):
        load({"w": torch.zeros(3, 3)}, tmp_path / "ckpt")
    with pytest.raises(errors.IncompleteCheckpointError):  # checkpoint_id= resets the reader
        dcp.load({"w": torch.zeros(3, 3)}, storage_reader=InkStorageReader(tmp_path / "new"),
                 checkpoint_id=tmp_path / "ckpt", no_dist=True)


def test_a_rank_file_name_with_a_non_ascii_digit_is_not_a_rank_file(tmp_path):
    # rank numbers are ASCII digits; "\u0660" (ARABIC-INDIC DIGIT ZERO) is a digit to \d
    foreign = "rank\u06600000-0123456789ab.ink"
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / foreign).write_bytes(b"not ours")
    (tmp_path / "ckpt" / f".{foreign}.x1y2.tmp").write_bytes(b"not ours")
    with pytest.raises(errors.CorruptError, match=r"not a DCP checkpoint \(\.metadata") as excinfo:
        read_metadata(tmp_path / "ckpt")  # no save began here: nothing of it is a rank file
    assert not isinstance(excinfo.value, errors.IncompleteCheckpointError)
    save({"w": torch.ones(3, 3)}, tmp_path / "ckpt")  # a save removes its own debris only
    assert {foreign, f".{foreign}.x1y2.tmp"} <= set(os.listdir(tmp_path / "ckpt"))
    assert torch.equal(load({"w": torch.zeros(3, 3)}, tmp_path / "ckpt")["w"], torch.ones(3, 3))


def test_reserved_names_and_uncoordinated_saves_are_refused(tmp_path):
    with pytest.raises(CheckpointException, match="reserved"):
        save({BYTES_PREFIX + "x": torch.ones(2)}, tmp_path / "a")
    with pytest.raises(errors.InvalidArgumentError, match="use_collectives"):
        dcp.save({"w": torch.ones(2)}, storage_writer=InkStorageWriter(tmp_path / "b"),
                 no_dist=True, use_collectives=False)
    with pytest.raises(errors.InvalidArgumentError):
        InkStorageWriter(tmp_path / "c", policy="no such preset")
    with pytest.raises(errors.InvalidArgumentError):
        InkStorageWriter(tmp_path / "c", threads=0)
    with pytest.raises(errors.InvalidArgumentError):
        InkStorageReader(123)


# -- bad checkpoints -----------------------------------------------------------------------

def rank_file(path):
    return next(n for n in os.listdir(path) if n.endswith(".ink"))


def test_a_directory_that_is_not_a_dcp_checkpoint_is_refused(tmp_path):
    with pytest.raises(errors.CorruptError, match="not a DCP checkpoint directory"):
        read_metadata(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(errors.CorruptError, match=r"not a DCP checkpoint \(\.metadata"):
        read_metadata(tmp_path / "empty")
    # one written by DCP's own FileSystemWriter
    dcp.save({"w": torch.ones(2)}, storage_writer=dcp.FileSystemWriter(tmp_path / "plain"),
             no_dist=True)
    with pytest.raises(errors.CorruptError, match="not written by InkStorageWriter"):
        read_metadata(tmp_path / "plain")


@pytest.mark.parametrize("content", [b"", b"not a pickle", pickle.dumps({"a": 1}),
                                     pickle.dumps(os.system)])
def test_unreadable_or_foreign_metadata_is_refused(tmp_path, content):
    save({"w": torch.ones(2)}, tmp_path / "ckpt")
    (tmp_path / "ckpt" / METADATA_FILE).write_bytes(content)
    with pytest.raises(errors.CorruptError, match=r"\.metadata"):
        read_metadata(tmp_path / "ckpt")


def test_metadata_that_loads_code_is_refused_without_running_it(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.mkdir, (str(tmp_path / "pwned"),))
    save({"w": torch.ones(2)}, tmp_path / "ckpt")
    (tmp_path / "ckpt" / METADATA_FILE).write_bytes(pickle.dumps(Evil()))
    with pytest.raises(errors.CorruptError, match="refusing to load posix.mkdir"):
        read_metadata(tmp_path / "ckpt")
    assert not (tmp_path / "pwned").exists()


def test_metadata_calling_a_dcp_function_is_refused(tmp_path):
    from torch.distributed.checkpoint import format_utils

    class Convert:  # would write a file wherever it is told
        def __reduce__(self):
            return (format_utils.dcp_to_torch_save, (str(tmp_path / "ckpt"),
                                                    str(tmp_path / "written.pt")))
    save({"w": torch.ones(2)}, tmp_path / "ckpt")
    (tmp_path / "ckpt" / METADATA_FILE).write_bytes(pickle.dumps(Convert()))
    with pytest.raises(errors.CorruptError, match="refusing to load .*dcp_to_torch_save"):
        read_metadata(tmp_path / "ckpt")
    assert not (tmp_path / "written.pt").exists()


def test_a_missing_rank_file_is_named(tmp_path):
    save({"w": torch.ones(2)}, tmp_path / "ckpt")
    name = rank_file(tmp_path / "ckpt")
    os.unlink(tmp_path / "ckpt" / name)
    with pytest.raises(errors.CorruptError, match=f"{name}: missing"):
        read_metadata(tmp_path / "ckpt")
    # a file the committed metadata names is gone: incomplete, typed, before dcp.load's steps
    with pytest.raises(errors.IncompleteCheckpointError, match=f"{name}: missing"):
        load({"w": torch.zeros(2)}, tmp_path / "ckpt")


def test_a_truncated_rank_file_is_a_typed_error_naming_it(tmp_path):
    save({"w": torch.randn(64, 64)}, tmp_path / "ckpt")
    path = tmp_path / "ckpt" / rank_file(tmp_path / "ckpt")
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    reader = InkStorageReader(tmp_path / "ckpt", threads=1)
    with pytest.raises(errors.CorruptError, match=str(path)):
        describe(tmp_path / "ckpt")
    with pytest.raises(CheckpointException) as info:
        load({"w": torch.zeros(64, 64)}, tmp_path / "ckpt")
    failure = info.value.failures[0][0]
    assert isinstance(failure, errors.CorruptError) and str(path) in str(failure)
    assert reader.checkpoint_id == str(tmp_path / "ckpt")


def _identity(name: str) -> dict:
    """The index metadata a rank file of this name has (spec section 25.1.1)."""
    return {"dcp.rank": str(int(name[4:9])), "dcp.save_id": name[10:22]}


def test_a_rank_file_that_disagrees_with_the_metadata_is_named(tmp_path):
    save({"w": torch.ones(4, 4)}, tmp_path / "ckpt")
    name = rank_file(tmp_path / "ckpt")
    inshrink.save(tmp_path / "ckpt" / name, {"w": torch.ones(2, 8).numpy()},
                  metadata=_identity(name))
    with pytest.raises(CheckpointException) as info:
        load({"w": torch.zeros(4, 4)}, tmp_path / "ckpt")
    failure = info.value.failures[0][0]
    assert isinstance(failure, errors.CorruptError)
    assert name in str(failure) and "the metadata says" in str(failure)
    # a tensor the metadata names but the file lacks
    inshrink.save(tmp_path / "ckpt" / name, {"v": torch.ones(4, 4).numpy()},
                  metadata=_identity(name))
    with pytest.raises(CheckpointException) as info:
        load({"w": torch.zeros(4, 4)}, tmp_path / "ckpt")
    failure = info.value.failures[0][0]
    assert isinstance(failure, errors.TensorNotFoundError) and name in str(failure)


def test_bytes_read_back_from_a_tensor_entry_are_refused(tmp_path):
    save({"step": 5, "w": torch.ones(4)}, tmp_path / "ckpt")
    name = rank_file(tmp_path / "ckpt")
    inshrink.save(tmp_path / "ckpt" / name, {BYTES_PREFIX + "step": torch.ones(2).numpy(),
                                              "w": torch.ones(4).numpy()},
                  metadata=_identity(name))
    with pytest.raises(CheckpointException) as info:
        load({"step": 0, "w": torch.zeros(4)}, tmp_path / "ckpt")
    assert isinstance(info.value.failures[0][0], errors.CorruptError)


# -- inspection and consolidation ----------------------------------------------------------

def test_verify_reads_every_record_and_names_a_damaged_file(tmp_path):
    save({"w": torch.randn(64, 64), "step": 3}, tmp_path / "ckpt")
    assert verify(tmp_path / "ckpt") == []
    assert {row["fqn"] for row in describe(tmp_path / "ckpt")} == {"w", "step"}
    path = tmp_path / "ckpt" / rank_file(tmp_path / "ckpt")
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0xFF  # inside the tensor's records: the index still opens
    path.write_bytes(bytes(data))
    describe(tmp_path / "ckpt")  # reads the index only
    problems = verify(tmp_path / "ckpt")
    assert len(problems) == 1 and problems[0].startswith(f"{path}: tensor ")
    assert "ChecksumError" in problems[0] or "CorruptError" in problems[0]
    path.unlink()  # a missing rank file: reported, not raised
    problems = verify(tmp_path / "ckpt")
    assert len(problems) == 1 and problems[0].startswith("IncompleteCheckpointError: ")
    assert str(path) in problems[0] and "missing" in problems[0]
    assert "not a DCP checkpoint" in verify(tmp_path)[0]  # no .metadata
    with pytest.raises(errors.InvalidArgumentError):
        verify(None)


def test_consolidate_joins_the_shards_into_one_file(tmp_path):
    state = mixed_state()
    del state["strided"]  # saved contiguous; compared below against the original layout
    state["steps"] = 17
    save(state, tmp_path / "ckpt")
    consolidate(tmp_path / "ckpt", tmp_path / "full.ink")
    with inshrink.open(tmp_path / "full.ink") as f:
        assert torch.equal(bits(torch.from_numpy(f["f32"])), bits(state["f32"]))
        assert torch.equal(torch.from_numpy(f["nested.deep.w"]), state["nested"]["deep"]["w"])
        assert torch.load(io.BytesIO(f[BYTES_PREFIX + "steps"].tobytes())) == 17
    from safetensors.torch import load_file
    consolidate(tmp_path / "ckpt", tmp_path / "full.safetensors")
    tensors = load_file(tmp_path / "full.safetensors")
    assert torch.equal(bits(tensors["bf16"]), bits(state["bf16"]))
    assert torch.equal(bits(tensors["special"]), bits(state["special"]))
    assert not any(name.startswith(BYTES_PREFIX) for name in tensors)
    assert sorted(os.listdir(tmp_path)) == ["ckpt", "full.ink", "full.safetensors"]
    with pytest.raises(errors.InvalidArgumentError, match="must be an .ink or .safetensors"):
        consolidate(tmp_path / "ckpt", tmp_path / "full.pt")


def test_consolidate_names_chunks_that_do_not_cover_a_tensor(tmp_path):
    save({"w": torch.ones(4, 4)}, tmp_path / "ckpt")
    metadata = read_metadata(tmp_path / "ckpt")
    metadata.state_dict_metadata["w"].size = torch.Size([8, 4])  # a chunk is missing
    (tmp_path / "ckpt" / METADATA_FILE).write_bytes(pickle.dumps(metadata))
    (tmp_path / "ckpt" / "chunks.json").unlink()  # the layout of .metadata is checked alike
    with pytest.raises(errors.CorruptError, match=r"^\[K-9\] .*\.metadata: 'w': its chunks "
                                                  r"hold 16 elements, not the 32"):
        consolidate(tmp_path / "ckpt", tmp_path / "full.ink")
    assert not (tmp_path / "full.ink").exists()


def test_import_inshrink_does_not_import_torch():
    code = "import sys, inshrink; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_rank_file_whose_metadata_names_another_rank_or_save_is_refused(tmp_path):
    import json as _json
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "fuzz"))
    import ink_repair
    save({"w": torch.arange(8.0)}, tmp_path / "ckpt")
    path = tmp_path / "ckpt" / rank_file(tmp_path / "ckpt")
    data = path.read_bytes()
    offset, index = ink_repair.read_index(data)
    index["metadata"]["dcp.rank"] = "7"  # another rank's file under this name
    payload = _json.dumps(index, separators=(",", ":")).encode()
    data = ink_repair.replace_index(data, offset, payload)
    path.write_bytes(ink_repair.fix_container(data))
    with pytest.raises(CheckpointException) as info:
        load({"w": torch.zeros(8)}, tmp_path / "ckpt")
    failure = info.value.failures[0][0]
    assert isinstance(failure, errors.CorruptError) and "rank '7'" in str(failure)
