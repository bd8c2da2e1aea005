"""inshrink.transformers.Callback: a Trainer's checkpoints in a series, and resuming from one.

A tiny GPT-2 built from a config trains a few steps on the CPU: nothing is downloaded."""
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers reads it

import filecmp  # noqa: E402
import json  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

import inshrink  # noqa: E402
import inshrink.transformers as ink
from inshrink.transformers.checkpoints import is_model_tensor  # noqa: E402
from inshrink.errors import CorruptError, InvalidArgumentError  # noqa: E402

torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


def model():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=64, n_head=2, vocab_size=100,
                                      n_positions=16, bos_token_id=0, eos_token_id=0))


def data():
    gen = torch.Generator().manual_seed(0)
    return [{"input_ids": x, "labels": x} for x in torch.randint(0, 100, (24, 16), generator=gen)]


def trainer(output_dir, callbacks=()):
    args = TrainingArguments(str(output_dir), max_steps=4, per_device_train_batch_size=4,
                             save_strategy="steps", save_steps=2, report_to=[], use_cpu=True,
                             logging_strategy="no", disable_tqdm=True, seed=0)
    return Trainer(model(), args, train_dataset=data(), callbacks=list(callbacks))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("trainer")
    callback = ink.Callback(root / "series")
    run = trainer(root / "out", [callback])
    run.train()
    return root, callback, run


def test_every_save_goes_into_the_series_and_restores_exactly(trained, tmp_path):
    root, callback, run = trained
    assert callback.series.steps() == [2, 4]
    original = root / "out" / "checkpoint-2"
    restored = callback.restore(tmp_path / "restored", step=2)
    assert sorted(os.listdir(restored)) == sorted(os.listdir(original))
    for name in os.listdir(original):
        if name != "optimizer.pt":  # a new pickle of the same state
            assert filecmp.cmp(original / name, os.path.join(restored, name), shallow=False)
    a = torch.load(original / "optimizer.pt", weights_only=True)
    b = torch.load(os.path.join(restored, "optimizer.pt"), weights_only=True)
    assert a["param_groups"] == b["param_groups"] and a["state"].keys() == b["state"].keys()
    for index, values in a["state"].items():
        for key, value in values.items():
            assert torch.equal(value, b["state"][index][key]), (index, key)
    names = callback.series.load(2).keys()
    assert any(n.startswith("optimizer.state.") and n.endswith(".exp_avg_sq") for n in names)
    assert "file.trainer_state.json" in names and "model.transformer.wte.weight" in names
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]  # no temporary left


def test_resuming_from_a_restored_checkpoint_trains_as_the_original(trained, tmp_path):
    root, callback, run = trained
    resumed = trainer(tmp_path / "out")
    resumed.train(resume_from_checkpoint=callback.restore(tmp_path / "restored", step=2))
    for (name, a), b in zip(run.model.state_dict().items(),
                            resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_lossy_series_reports_its_error_and_resumes(tmp_path):
    callback = ink.Callback(tmp_path / "series", "balanced", remove_checkpoint=True)
    trainer(tmp_path / "out", [callback]).train()
    assert not [n for n in os.listdir(tmp_path / "out") if n.startswith("checkpoint-")]
    lossy = [t for t in callback.reports[4] if not t.lossless]
    assert lossy and all(0 < t.error["rel_l2_error"] for t in lossy)
    resumed = trainer(tmp_path / "again")
    resumed.train(resume_from_checkpoint=callback.restore(tmp_path / "restored", step=2))
    assert resumed.state.global_step == 4


def test_an_optimizer_file_with_other_objects_is_kept_as_it_is(tmp_path):
    ckpt = tmp_path / "checkpoint-1"
    ckpt.mkdir()
    torch.save({"state": {0: {"x": torch.ones(2)}}, "extra": np.float64(1.5)},
               ckpt / "optimizer.pt")  # a numpy scalar: weights_only refuses it
    arrays, metadata = ink.checkpoint_to_numpy(ckpt)
    assert list(arrays) == ["file.optimizer.pt"]
    series = inshrink.Series(tmp_path / "series")
    series.save(1, arrays, metadata)
    out = ink.restore_checkpoint(tmp_path / "series", tmp_path / "back")
    assert filecmp.cmp(ckpt / "optimizer.pt", os.path.join(out, "optimizer.pt"), shallow=False)
    with pytest.raises(InvalidArgumentError, match="exists"):
        ink.restore_checkpoint(series, tmp_path / "back")


def test_bad_metadata_is_refused_before_writing(tmp_path):
    series = inshrink.Series(tmp_path / "series")
    bad = {"format": 1, "files": [{"path": "../escape", "kind": "file"}]}
    series.save(1, {"file.../escape": np.zeros(3, np.uint8)},
                {ink.CHECKPOINT_METADATA: json.dumps(bad)})
    series.save(2, {"x": np.zeros(3, np.uint8)})
    odd = {"format": 1, "files": [{"path": "model.safetensors", "kind": "safetensors",
                                   "tensors": 5}]}
    series.save(3, {"x": np.zeros(3, np.uint8)}, {ink.CHECKPOINT_METADATA: json.dumps(odd)})
    for step, text in ((1, "not a Trainer checkpoint"), (2, "not a Trainer checkpoint"),
                       (3, "malformed")):
        with pytest.raises(CorruptError, match=text):
            ink.restore_checkpoint(series, tmp_path / "out", step=step)
    assert sorted(os.listdir(tmp_path)) == ["series"]


# -- verify before remove, retention ---------------------------------------------------------

def _flip_a_byte_after_saving(callback, when, step=None):
    """Damage the file of ``step`` (default: ``when``) right after the series saves step
    ``when`` (storage gone bad)."""
    save = callback.series.save

    def damaged(at, *args, **kwargs):
        report = save(at, *args, **kwargs)
        if at == when:
            entry = next(e for e in callback.series.checkpoints() if e.step == (step or at))
            path = os.path.join(callback.series.directory, entry.file)
            with open(path, "r+b") as f:
                f.seek(100)
                byte = f.read(1)
                f.seek(100)
                f.write(bytes([byte[0] ^ 1]))
        return report
    callback.series.save = damaged


def test_the_trainer_directory_is_removed_only_after_its_copy_verifies(tmp_path):
    callback = ink.Callback(tmp_path / "series", remove_checkpoint=True, keep_last=1)
    _flip_a_byte_after_saving(callback, 4)
    with pytest.warns(UserWarning, match="step 4: the compressed copy .* failed its check"):
        trainer(tmp_path / "out", [callback]).train()
    assert (tmp_path / "out" / "checkpoint-4").is_dir()  # its copy is damaged: kept
    # step 2, now a delta against the damaged step 4, cannot be restored either: kept too
    assert (tmp_path / "out" / "checkpoint-2").is_dir()
    assert sorted(callback.unverified) == [2, 4]
    assert "BaseMismatchError" in callback.unverified[4]
    assert callback.series.steps() == [4]  # keep_last=1


def test_a_step_whose_rewrite_as_a_delta_fails_keeps_its_directory(tmp_path):
    callback = ink.Callback(tmp_path / "series", remove_checkpoint=True)
    _flip_a_byte_after_saving(callback, 4, step=2)  # step 2's delta file, once written
    with pytest.warns(UserWarning, match="step 2: .*after its rewrite as a delta"):
        trainer(tmp_path / "out", [callback]).train()
    assert list(callback.unverified) == [2]
    assert (tmp_path / "out" / "checkpoint-2").is_dir()
    assert not (tmp_path / "out" / "checkpoint-4").exists()  # whole and checked: removed
    assert callback.series.checkpoints()[0].keyframe is False


def test_keep_last_keeps_the_newest_steps_and_what_they_need(tmp_path):
    callback = ink.Callback(tmp_path / "series", keep_last=2)
    for step in (2, 4, 6):
        ckpt = tmp_path / "out" / f"checkpoint-{step}"
        ckpt.mkdir(parents=True)
        (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        args = type("Args", (), {"output_dir": str(tmp_path / "out")})()
        state = type("State", (), {"global_step": step, "is_world_process_zero": True})()
        callback.on_save(args, state, None)
    assert callback.series.steps() == [4, 6] and not callback.unverified
    back = callback.restore(tmp_path / "back", step=4)
    assert json.loads(open(os.path.join(back, "trainer_state.json")).read())["global_step"] == 4
    assert (tmp_path / "out" / "checkpoint-2").is_dir()  # not removed unless asked
    with pytest.raises(InvalidArgumentError, match="keep_last"):
        ink.Callback(tmp_path / "other", keep_last=0)


def test_verify_step_compares_what_was_saved(tmp_path):
    callback = ink.Callback(tmp_path / "series", "balanced")
    rng = np.random.default_rng(0)
    arrays = {"model.w": rng.standard_normal((128, 64)).astype(np.float32),
              "file.x": np.arange(10, dtype=np.uint8)}
    report = callback.series.save(1, arrays)
    assert callback.verify_step(1, arrays, report) is None
    changed = dict(arrays, **{"file.x": arrays["file.x"] + 1})
    assert "not bit-exact" in callback.verify_step(1, changed, report)
    moved = dict(arrays, **{"model.w": arrays["model.w"] + 1})
    assert "relative L2 error" in callback.verify_step(1, moved, report)
    assert "not the saved ones" in callback.verify_step(1, {"model.w": arrays["model.w"]},
                                                        report)


def test_keep_weights_keeps_older_models_without_training_state(tmp_path):
    callback = ink.Callback(tmp_path / "series", keep_last=1, keep_weights=2)
    args = TrainingArguments(str(tmp_path / "out"), max_steps=8, per_device_train_batch_size=4,
                             save_strategy="steps", save_steps=2, report_to=[], use_cpu=True,
                             logging_strategy="no", disable_tqdm=True, seed=0)
    Trainer(model(), args, train_dataset=data(), callbacks=[callback]).train()
    # keep_last + keep_weights steps, the older ones rewritten in place as the model only
    assert callback.series.steps() == callback.weights_steps() == [4, 6, 8]
    assert callback.series.weights_only_steps() == [4, 6]
    whole = set(callback.series.load(8))
    model_only = {n for n in whole if is_model_tensor(n)}
    assert model_only and whole - model_only  # the optimizer's and trainer's state
    for step in (4, 6):
        assert set(callback.series.load(step)) == model_only
    older = callback.weights_steps()[0]
    with pytest.raises(InvalidArgumentError, match=f"step {older} .*weights only"):
        callback.restore(tmp_path / "resume", step=older)
    assert not (tmp_path / "resume").exists()
    written = callback.restore_model(tmp_path / "model", step=older)
    names = set(os.listdir(written))
    assert "model.safetensors" in names and "config.json" in names
    assert not names & {"optimizer.pt", "scheduler.pt", "trainer_state.json",
                        "training_args.bin"} and not any(n.startswith("rng_state") for n in names)
    original = tmp_path / "out" / f"checkpoint-{older}"
    loaded = GPT2LMHeadModel.from_pretrained(written)
    expected = GPT2LMHeadModel.from_pretrained(original)
    for (name, a), (_, b) in zip(loaded.state_dict().items(), expected.state_dict().items()):
        assert torch.equal(a, b), name  # lossless by default: the same weights
    # a whole step's model comes from the checkpoint itself
    latest = callback.restore_model(tmp_path / "latest")
    assert torch.equal(GPT2LMHeadModel.from_pretrained(latest).transformer.wte.weight,
                       GPT2LMHeadModel.from_pretrained(
                           tmp_path / "out" / "checkpoint-8").transformer.wte.weight)
    with pytest.raises(InvalidArgumentError, match="exists"):
        callback.restore_model(tmp_path / "latest")
    with pytest.raises(InvalidArgumentError, match="no step 3"):
        callback.restore_model(tmp_path / "none", step=3)
    with pytest.raises(InvalidArgumentError, match="keep_weights"):
        ink.Callback(tmp_path / "bad", keep_weights=2)  # without keep_last
    with pytest.raises(InvalidArgumentError, match="keep_weights"):
        ink.Callback(tmp_path / "bad2", keep_last=1, keep_weights=0)
