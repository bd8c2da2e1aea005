"""inshrink.lightning.InkCheckpointIO with a real Lightning Trainer on the CPU: a tiny model,
a few steps, every checkpoint an .ink file."""
import copy
import os
import pickle
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

import lightning as L  # noqa: E402  (in the dev extra: CI runs these)
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.plugins.io import AsyncCheckpointIO  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import inshrink  # noqa: E402
from inshrink.container.layout import MAGIC  # noqa: E402
from inshrink.errors import CorruptError, InvalidArgumentError  # noqa: E402
from inshrink.lightning import CHECKPOINT_METADATA, InkCheckpointIO  # noqa: E402

torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning",
                                        "ignore::FutureWarning")


class Net(L.LightningModule):
    """Adam and a step scheduler; the middle weight (6144 elements) is large enough for a
    policy to quantize it."""

    def __init__(self, hidden: int = 64, lr: float = 0.01, note=None):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.ReLU(),
                                       torch.nn.Linear(hidden, 96), torch.nn.ReLU(),
                                       torch.nn.Linear(96, 1))

    def training_step(self, batch, index):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        self.log("step_score", float(self.global_step))  # rises: the newest is the best
        return loss

    def validation_step(self, batch, index):
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(batch[0]), batch[1]))

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        return {"optimizer": optimizer,
                "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 3, gamma=0.5)}


def net(**hparams) -> Net:
    torch.manual_seed(0)
    return Net(**hparams)


def loader() -> DataLoader:
    gen = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(32, 8, generator=gen), torch.randn(32, 1, generator=gen))
    return DataLoader(data, batch_size=8)  # not shuffled: a resumed epoch sees the same batches


def trainer(io, callbacks=(), **kwargs) -> "L.Trainer":
    kwargs.setdefault("max_steps", 4)
    return L.Trainer(accelerator="cpu", devices=1, enable_progress_bar=False, logger=False,
                     enable_model_summary=False, enable_checkpointing=bool(callbacks),
                     num_sanity_val_steps=0, plugins=[io] if io is not None else None,
                     callbacks=list(callbacks), **kwargs)


class Recording(InkCheckpointIO):
    """Keeps a copy of each checkpoint Lightning hands over."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.given = {}

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        self.given[os.fspath(path)] = copy.deepcopy(checkpoint)
        super().save_checkpoint(checkpoint, path, storage_options)


def bits(tensor):
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def assert_identical(a, b, where="checkpoint"):
    """Same structure, types (a dict for an OrderedDict or AttributeDict) and values, tensors
    with the same dtype, shape and bits."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert (a.dtype, a.shape) == (b.dtype, b.shape), where
        assert torch.equal(bits(a), bits(b)), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), where
        for key in a:
            assert_identical(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_identical(x, y, f"{where}[{i}]")
    else:
        assert type(a) is type(b) and a == b, f"{where}: {a!r} != {b!r}"


# -- the normal path -----------------------------------------------------------------------

def test_fit_stores_every_checkpoint_as_ink_and_loads_it_back(tmp_path):
    io = Recording()
    checkpoints = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1,
                                  save_last=True)
    trainer(io, [checkpoints]).fit(net(), loader())
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt", "last.ckpt"]
    for name in names:
        path = tmp_path / name
        assert path.read_bytes()[:len(MAGIC)] == MAGIC
        loaded = io.load_checkpoint(path)
        given = io.given[os.fspath(path)]
        assert_identical(given, loaded)
        assert isinstance(loaded["state_dict"], OrderedDict)
    loaded = io.load_checkpoint(tmp_path / "last.ckpt")
    assert loaded["global_step"] == 4 and loaded["hyper_parameters"]["hidden"] == 64
    assert loaded["optimizer_states"][0]["param_groups"][0]["betas"] == (0.9, 0.999)
    with inshrink.open(tmp_path / "last.ckpt") as f:  # the names policies give roles by
        assert "model.net.2.weight" in f.keys() and "optimizer.state.2.exp_avg" in f.keys()
        assert all(n.startswith(("model.", "optimizer.", "lightning.")) for n in f.keys())
        assert CHECKPOINT_METADATA in f.metadata
    assert set(io.reports) == {os.fspath(tmp_path / n) for n in names}
    assert all(t.lossless for t in io.last_report)


def test_validate_and_test_read_the_checkpoint_through_the_plugin(tmp_path):
    io = InkCheckpointIO()
    trainer(io, [ModelCheckpoint(dirpath=tmp_path, save_last=True)]).fit(net(), loader())
    model = net()
    result = trainer(InkCheckpointIO()).validate(model, loader(),
                                                 ckpt_path=tmp_path / "last.ckpt")
    assert result and "val_loss" in result[0]
    stored = io.load_checkpoint(tmp_path / "last.ckpt")["state_dict"]
    assert all(torch.equal(v, stored[k]) for k, v in model.state_dict().items())


def test_loading_never_unpickles(tmp_path, monkeypatch):
    io = InkCheckpointIO()
    io.save_checkpoint({"state_dict": net().state_dict(), "epoch": 1}, tmp_path / "a.ckpt")

    def refuse(*args, **kwargs):
        raise AssertionError("unpickled")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    assert io.load_checkpoint(tmp_path / "a.ckpt", weights_only=False)["epoch"] == 1


def test_values_json_cannot_tell_apart_are_kept(tmp_path):
    checkpoint = {"epoch": 3, "ratio": 0.1, "inf": float("inf"), "none": None, "flag": True,
                  "pair": (1, (2.5, "x")), "items": [1, [2, {"k": torch.arange(3)}]],
                  "state_dict": OrderedDict(w=torch.ones(2, 2, dtype=torch.bfloat16)),
                  "empty": {}, "score": torch.tensor(0.25, dtype=torch.float64)}
    io = InkCheckpointIO()
    io.save_checkpoint(checkpoint, tmp_path / "x.ckpt")
    assert_identical(checkpoint, io.load_checkpoint(tmp_path / "x.ckpt"))


# -- resuming --------------------------------------------------------------------------------

def test_resume_gives_the_weights_of_an_uninterrupted_run_bit_for_bit(tmp_path):
    whole = net()
    trainer(InkCheckpointIO(), max_steps=-1, max_epochs=3).fit(whole, loader())

    first = net()
    checkpoints = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    trainer(InkCheckpointIO(), [checkpoints], max_steps=-1, max_epochs=2).fit(first, loader())
    resumed = net(lr=0.5)  # the weights and the optimizer's rate come from the checkpoint
    resumed.net[0].weight.data.zero_()
    second = trainer(InkCheckpointIO(), [ModelCheckpoint(dirpath=tmp_path / "again")],
                     max_steps=-1, max_epochs=3)
    second.fit(resumed, loader(), ckpt_path=tmp_path / "last.ckpt")
    assert second.global_step == 12
    for name, value in whole.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[name]), name
    assert_identical(trainer_state(whole), trainer_state(resumed))


def trainer_state(model):
    optimizer = model.trainer.optimizers[0]
    scheduler = model.trainer.lr_scheduler_configs[0].scheduler
    return {"optimizer": optimizer.state_dict()["state"], "scheduler": scheduler.state_dict()}


# -- ModelCheckpoint's bookkeeping -----------------------------------------------------------

def test_save_top_k_removes_what_it_stored(tmp_path):
    io = InkCheckpointIO()
    checkpoints = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=2,
                                  monitor="step_score", mode="max")
    trainer(io, [checkpoints], max_steps=5).fit(net(), loader())
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["epoch=0-step=4.ckpt", "epoch=1-step=5.ckpt"]
    assert set(io.reports) == {os.fspath(tmp_path / n) for n in names}
    assert os.fspath(tmp_path / names[-1]) in checkpoints.best_k_models
    io.remove_checkpoint(tmp_path / "never-written.ckpt")  # nothing there: nothing done


def test_remove_checkpoint(tmp_path):
    io = InkCheckpointIO()
    path = tmp_path / "a.ckpt"
    io.save_checkpoint({"epoch": 0}, path)
    assert os.fspath(path) in io.reports
    io.remove_checkpoint(path)
    assert not path.exists() and io.reports == {} and io.last_report is None
    (tmp_path / "dir.ckpt").mkdir()
    with pytest.raises(InvalidArgumentError, match="directory"):
        io.remove_checkpoint(tmp_path / "dir.ckpt")
    assert (tmp_path / "dir.ckpt").is_dir()


# -- AsyncCheckpointIO -----------------------------------------------------------------------

def test_async_checkpoint_io_composes(tmp_path):
    ink = InkCheckpointIO()
    model = net()
    checkpoints = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=2,
                                  monitor="step_score", mode="max", save_last=True)
    trainer(AsyncCheckpointIO(ink), [checkpoints], max_steps=5).fit(model, loader())
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 3 and "last.ckpt" in names
    assert not [n for n in names if n.startswith(".")]  # no temporary left behind
    stored = ink.load_checkpoint(tmp_path / "last.ckpt")
    assert stored["global_step"] == 5
    for name, value in model.state_dict().items():
        assert torch.equal(value, stored["state_dict"][name]), name


def test_a_removal_skips_the_save_still_queued(tmp_path):
    io = InkCheckpointIO()
    worker = ThreadPoolExecutor(1)  # as AsyncCheckpointIO's: saves run on another thread
    worker.submit(io.save_checkpoint, {"epoch": 0}, tmp_path / "a.ckpt").result()
    io.remove_checkpoint(tmp_path / "b.ckpt")  # asked for, not written yet
    worker.submit(io.save_checkpoint, {"epoch": 1}, tmp_path / "b.ckpt").result()
    assert not (tmp_path / "b.ckpt").exists() and os.fspath(tmp_path / "b.ckpt") not in io.reports
    worker.submit(io.save_checkpoint, {"epoch": 2}, tmp_path / "b.ckpt").result()  # asked again
    assert io.load_checkpoint(tmp_path / "b.ckpt") == {"epoch": 2}
    worker.shutdown()
    sync = InkCheckpointIO()  # saving on the caller's thread, nothing is ever queued
    sync.remove_checkpoint(tmp_path / "c.ckpt")
    sync.save_checkpoint({"epoch": 3}, tmp_path / "c.ckpt")
    assert sync.load_checkpoint(tmp_path / "c.ckpt") == {"epoch": 3}


def test_async_reports_a_failed_save(tmp_path):
    model = net(note=object())  # no JSON for it: the save in the worker thread fails
    run = trainer(AsyncCheckpointIO(InkCheckpointIO()), [ModelCheckpoint(dirpath=tmp_path)],
                  max_steps=2)
    with pytest.raises(InvalidArgumentError, match="hyper_parameters.note"):
        run.fit(model, loader())


# -- lossy -----------------------------------------------------------------------------------

def test_a_policy_quantizes_weights_and_moments_only_and_reports_it(tmp_path):
    lossless, lossy = InkCheckpointIO(), InkCheckpointIO(policy="balanced")
    model = net()
    trainer(lossless, [ModelCheckpoint(dirpath=tmp_path / "a", save_last=True)]).fit(model,
                                                                                   loader())
    checkpoint = lossless.load_checkpoint(tmp_path / "a" / "last.ckpt")
    lossy.save_checkpoint(checkpoint, tmp_path / "b.ckpt")
    report = {t.name: t for t in lossy.last_report}
    quantized = sorted(n for n, t in report.items() if not t.lossless)
    # the one large weight, and the moments of the two weights (biases' and the last
    # layer's stay exact, as do steps and everything of Lightning's own)
    assert quantized == ["model.net.2.weight", "optimizer.state.0.exp_avg",
                         "optimizer.state.0.exp_avg_sq", "optimizer.state.2.exp_avg",
                         "optimizer.state.2.exp_avg_sq"]
    assert report["model.net.2.weight"].error["rel_l2_error"] < 0.05
    assert os.path.getsize(tmp_path / "b.ckpt") < os.path.getsize(tmp_path / "a" / "last.ckpt")
    back = lossy.load_checkpoint(tmp_path / "b.ckpt")
    assert not torch.equal(back["state_dict"]["net.2.weight"],
                           checkpoint["state_dict"]["net.2.weight"])
    assert_identical({k: v for k, v in checkpoint.items() if k not in ("state_dict",
                                                                       "optimizer_states")},
                     {k: v for k, v in back.items() if k not in ("state_dict",
                                                                 "optimizer_states")})
    # storage_options overrides the plugin's policy for one checkpoint
    lossy.save_checkpoint(checkpoint, tmp_path / "c.ckpt", storage_options={"policy": None})
    assert all(t.lossless for t in lossy.last_report)
    # training resumes from the lossy checkpoint
    run = trainer(InkCheckpointIO(), max_steps=6)
    run.fit(net(), loader(), ckpt_path=tmp_path / "b.ckpt")
    assert run.global_step == 6


# -- bad input -------------------------------------------------------------------------------

def test_a_torch_save_checkpoint_is_refused_with_a_hint(tmp_path):
    path = tmp_path / "torch.ckpt"
    TorchCheckpointIO().save_checkpoint({"state_dict": net().state_dict()}, path)
    with pytest.raises(InvalidArgumentError, match="TorchCheckpointIO"):
        InkCheckpointIO().load_checkpoint(path)


def test_files_that_are_not_checkpoints(tmp_path):
    io = InkCheckpointIO()
    (tmp_path / "text.ckpt").write_text("not a checkpoint at all")
    with pytest.raises(CorruptError):
        io.load_checkpoint(tmp_path / "text.ckpt")
    inshrink.save(tmp_path / "plain.ink", {"w": np.ones(3, np.float32)})
    with pytest.raises(InvalidArgumentError, match=CHECKPOINT_METADATA):
        io.load_checkpoint(tmp_path / "plain.ink")
    with pytest.raises(FileNotFoundError):
        io.load_checkpoint(tmp_path / "missing.ckpt")
    with pytest.raises(InvalidArgumentError, match="local"):
        io.load_checkpoint("s3://bucket/last.ckpt")


def test_a_damaged_file_is_a_corrupt_error(tmp_path):
    io = InkCheckpointIO()
    path = tmp_path / "a.ckpt"
    io.save_checkpoint({"state_dict": net().state_dict(), "epoch": 1}, path)
    data = bytearray(path.read_bytes())
    (tmp_path / "short.ckpt").write_bytes(data[:len(data) // 2])
    with pytest.raises(CorruptError):
        io.load_checkpoint(tmp_path / "short.ckpt")
    data[len(data) // 3] ^= 0xFF
    (tmp_path / "flipped.ckpt").write_bytes(data)
    with pytest.raises(CorruptError):
        io.load_checkpoint(tmp_path / "flipped.ckpt")


@pytest.mark.parametrize("document", [
    "not json", "[]", '{"format": 2}',
    '{"format": 1, "keys": ["epoch"], "bits": {}, "rest": {}}',  # a key it lacks
    '{"format": 1, "keys": [], "bits": {}, "rest": {}}',  # a tensor nothing names
    '{"format": 1, "keys": ["x"], "bits": {"lightning.x": "F32"}, "rest": {"x": '
    '{"__tensor__": null}}}',  # the bits of an int64 array are no float32
    '{"format": 1, "keys": ["state_dict"], "bits": {}, "rest": {}, "state_dict": '
    '{"w": {"__tensor__": null}, "v": {"__tensor__": null}}}',  # a tensor it lacks
])
def test_a_malformed_document_is_a_corrupt_error(tmp_path, document):
    path = tmp_path / "bad.ckpt"
    inshrink.save(path, {"model.w": np.ones(2, np.float32), "lightning.x": np.ones(2, np.int64)},
                  {CHECKPOINT_METADATA: document})
    with pytest.raises(CorruptError, match=os.fspath(path)):
        InkCheckpointIO().load_checkpoint(path)


def test_values_that_cannot_be_stored_are_refused_by_path(tmp_path):
    io = InkCheckpointIO()
    with pytest.raises(InvalidArgumentError, match=r"lightning\.hyper_parameters\.path.*ignore"):
        io.save_checkpoint({"hyper_parameters": {"path": Path("x")}}, tmp_path / "a.ckpt")
    with pytest.raises(InvalidArgumentError, match="string keys"):
        io.save_checkpoint({"callbacks": {1: "x"}}, tmp_path / "a.ckpt")
    with pytest.raises(InvalidArgumentError):
        io.save_checkpoint(["not", "a", "dict"], tmp_path / "a.ckpt")
    with pytest.raises(InvalidArgumentError, match="storage_options"):
        io.save_checkpoint({"epoch": 0}, tmp_path / "a.ckpt", storage_options={"level": 3})
    assert not (tmp_path / "a.ckpt").exists()


def test_bad_arguments():
    with pytest.raises(InvalidArgumentError, match="preset"):
        InkCheckpointIO(policy="no-such-preset")
    with pytest.raises(InvalidArgumentError, match="threads"):
        InkCheckpointIO(threads=0)


def test_map_location(tmp_path):
    io = InkCheckpointIO()
    io.save_checkpoint({"state_dict": OrderedDict(w=torch.ones(2))}, tmp_path / "a.ckpt")
    for where in (None, "cpu", torch.device("cpu"), {"cuda:0": "cpu"}, lambda s, loc: s):
        assert io.load_checkpoint(tmp_path / "a.ckpt", where)["state_dict"]["w"].is_cpu
    with pytest.raises(InvalidArgumentError, match="map_location"):
        io.load_checkpoint(tmp_path / "a.ckpt", "no-such-device")


def test_the_plugin_pickles_for_spawned_processes(tmp_path):
    io = pickle.loads(pickle.dumps(InkCheckpointIO(policy="balanced", threads=2)))
    io.save_checkpoint({"epoch": 0}, tmp_path / "a.ckpt")
    assert io.policy == "balanced" and io.load_checkpoint(tmp_path / "a.ckpt") == {"epoch": 0}
