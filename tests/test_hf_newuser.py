"""inshrink.transformers and inshrink.torch used as their docs pages and docstrings describe:
what a user doing something wrong is told. Tiny models from configs: nothing is downloaded."""
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers reads it

import shutil  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import numpy as np  # noqa: E402
from transformers import (AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel,  # noqa: E402
                          Trainer, TrainingArguments)

import inshrink.torch  # noqa: E402
import inshrink.transformers as ink
from inshrink.errors import CorruptError, InvalidArgumentError  # noqa: E402

torch.set_num_threads(1)


def gpt2():
    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16,
                        bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config).eval()


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """A tied GPT-2 saved compressed in several shards with their index."""
    model = gpt2()
    path = tmp_path_factory.mktemp("hf") / "gpt-ink"
    ink.save_pretrained(model, path, max_shard_size="20KB")
    return model, path


def test_sharded_model_loads_back_bit_exact(sharded):
    model, path = sharded
    assert "model.safetensors.index.json" in os.listdir(path)
    loaded = ink.from_pretrained(AutoModelForCausalLM, path).eval()
    tokens = torch.tensor([[1, 5, 9, 42]])
    with torch.no_grad():
        assert torch.equal(model(tokens).logits, loaded(tokens).logits)


def test_missing_shard_is_named_in_the_users_directory(sharded, tmp_path):
    _, path = sharded
    broken = tmp_path / "broken-ink"
    shutil.copytree(path, broken)
    shard = sorted(n for n in os.listdir(broken) if n.endswith(".ink"))[1]
    os.remove(broken / shard)
    # was: FileNotFoundError naming the .safetensors file of a removed temporary directory
    with pytest.raises(CorruptError, match=rf"{broken}/{shard}: missing"):
        ink.from_pretrained(AutoModelForCausalLM, broken, tmp_dir=tmp_path)
    assert os.listdir(tmp_path) == ["broken-ink"]  # no temporary copy left


def test_load_file_to_a_device_the_machine_lacks(tmp_path):
    inshrink.torch.save_file({"w": torch.ones(3)}, tmp_path / "t.ink")
    absent = f"cuda:{torch.cuda.device_count()}"
    # was: AssertionError (CPU build) or RuntimeError, once the whole file was decoded
    with pytest.raises(InvalidArgumentError, match="device"):
        inshrink.torch.load_file(tmp_path / "t.ink", device=absent)


def test_restore_checkpoint_from_a_wrong_directory(tmp_path):
    # was: "the series ... is empty", leaving the directory and a .lock file behind
    with pytest.raises(InvalidArgumentError, match="not a series"):
        ink.restore_checkpoint(tmp_path / "typo", tmp_path / "resume")
    trainer_out = tmp_path / "out"
    (trainer_out / "checkpoint-2").mkdir(parents=True)
    with pytest.raises(InvalidArgumentError, match="not a series"):
        ink.restore_checkpoint(trainer_out, tmp_path / "resume")
    assert sorted(os.listdir(tmp_path)) == ["out"]
    assert os.listdir(trainer_out) == ["checkpoint-2"]
    # a Checkpointer's series, not a Trainer's: was "... ('inshrink.transformers.checkpoint':
    # 'inshrink.transformers.checkpoint')", a KeyError's text
    model = torch.nn.Linear(2, 2)
    inshrink.torch.Checkpointer(tmp_path / "ckpts", model).save(1)
    with pytest.raises(CorruptError, match=r"no 'inshrink.transformers.checkpoint' metadata"):
        ink.restore_checkpoint(tmp_path / "ckpts", tmp_path / "resume")
    assert not os.path.exists(tmp_path / "resume")


def test_restore_into_a_model_on_the_meta_device(tmp_path):
    # was: restore() returned the step and load_model returned ([], []), copying nothing
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    inshrink.torch.Checkpointer(tmp_path / "ckpts", model, optimizer).save(1)
    inshrink.torch.save_model(model, tmp_path / "model.ink")
    moments = optimizer.state_dict()["state"][0]["exp_avg"].clone()
    model.to("meta")
    with pytest.raises(InvalidArgumentError, match="meta device"):
        inshrink.torch.Checkpointer(tmp_path / "ckpts", model, optimizer).restore()
    assert torch.equal(optimizer.state_dict()["state"][0]["exp_avg"], moments)  # untouched
    with pytest.raises(InvalidArgumentError, match="meta device"):
        inshrink.torch.load_model(model, tmp_path / "model.ink")
    model.to_empty(device="cpu")  # as the message says: then it restores
    assert inshrink.torch.Checkpointer(tmp_path / "ckpts", model, optimizer).restore() == 1


def test_callback_on_a_series_with_later_steps_refuses_before_training(tmp_path):
    # a rerun, or a resume from an older step, into the same series: was an error at the
    # first save, after training up to it (and the Trainer's directory of that step kept)
    callback = ink.Callback(tmp_path / "series")
    callback.series.save(6, {"model.w": np.zeros(2, np.float32)})
    args = TrainingArguments(str(tmp_path / "out"), max_steps=2, save_steps=2, report_to=[],
                             use_cpu=True, disable_tqdm=True, per_device_train_batch_size=2)
    batches = [{"input_ids": x, "labels": x} for x in torch.randint(0, 64, (4, 8))]
    run = Trainer(gpt2(), args, train_dataset=batches, callbacks=[callback])
    with pytest.raises(InvalidArgumentError, match=r"holds step\(s\) \[6\] after step 0"):
        run.train()
    assert run.state.global_step == 0 and callback.series.steps() == [6]


def test_save_pretrained_of_something_that_is_not_a_model(tmp_path):
    # was: AttributeError; then an error naming a removed temporary directory
    with pytest.raises(InvalidArgumentError, match="save_pretrained method"):
        ink.save_pretrained(torch.nn.Linear(2, 2), tmp_path / "lin")
    from transformers import GenerationConfig
    with pytest.raises(InvalidArgumentError, match=r"GenerationConfig.save_pretrained wrote no"):
        ink.save_pretrained(GenerationConfig(), tmp_path / "gen")
    assert os.listdir(tmp_path) == []
