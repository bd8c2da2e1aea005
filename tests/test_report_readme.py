"""docs/torch.md, "Every call in one place": the Python block runs as written, on a tiny GPT-2
built from a config (nothing downloaded), and the shell block's commands work; README.md's
PyTorch example runs as written on a small model."""
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers reads it

import re  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments  # noqa: E402

from kit import ROOT  # noqa: E402
from test_readme_python import readme_examples, run_commands  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


def section_blocks(kind):
    text = open(os.path.join(ROOT, "docs", "torch.md"), encoding="utf-8").read()
    start = text.index("## Every call in one place")
    end = text.index("\n## ", start + 1)
    return re.findall(rf"```{kind}\n(.*?)```", text[start:end], re.S)


def test_the_python_calls_run_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64,
                                       n_positions=8, bos_token_id=0, eos_token_id=0))
    gen = torch.Generator().manual_seed(0)
    data = [{"input_ids": x, "labels": x} for x in torch.randint(0, 64, (4, 8), generator=gen)]
    args = TrainingArguments(str(tmp_path / "out"), max_steps=2, save_steps=2,
                             per_device_train_batch_size=2, report_to=[], use_cpu=True,
                             logging_strategy="no", disable_tqdm=True)
    optimizer = torch.optim.AdamW(model.parameters())
    namespace = {"model": model, "optimizer": optimizer, "step": 1, "args": args,
                 "data": data}
    (code,) = section_blocks("python")
    exec(compile(code, "docs/torch.md", "exec"), namespace)
    assert [r["step"] for r in namespace["records"]] == [1]
    assert (tmp_path / "ckpts.png").stat().st_size > 0
    assert namespace["cb"].series.steps() == [2] and not namespace["cb"].unverified
    assert not (tmp_path / "out" / "checkpoint-2").exists()  # removed once verified


def test_the_commands_run_as_written(tmp_path):
    import inshrink
    inshrink.Series(tmp_path / "ckpts").save(1, {"w": torch.ones(4).numpy()})
    (block,) = section_blocks("sh")
    run_commands(block, tmp_path)
    assert (tmp_path / "ckpts.png").exists()


def test_the_readme_pytorch_example_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (code,) = [b for b in readme_examples("python") if "inshrink.torch" in b]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.AdamW(model.parameters())
    loader = [(torch.randn(4, 8), torch.randint(0, 2, (4,))) for _ in range(200)]
    namespace = {"model": model, "optimizer": optimizer, "loader": loader,
                 "loss_fn": torch.nn.functional.cross_entropy}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["step"] == 200 and namespace["ckpt"].series.steps() == [100, 200]
