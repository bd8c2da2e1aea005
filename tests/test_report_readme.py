"""README.md, "Use with PyTorch / Hugging Face": the Python block runs as written, on a tiny
GPT-2 built from a config (nothing downloaded), and the shell block's command works."""
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers reads it

import re  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments  # noqa: E402

from kit import ROOT, run_cli as run  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


def section_blocks(kind):
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    start = text.index("### Use with PyTorch / Hugging Face")
    end = text.index("\n### ", start + 1)
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
    exec(compile(code, "README.md", "exec"), namespace)
    assert [r["step"] for r in namespace["records"]] == [1]
    assert (tmp_path / "ckpts.png").stat().st_size > 0
    assert namespace["cb"].series.steps() == [2] and not namespace["cb"].unverified
    assert not (tmp_path / "out" / "checkpoint-2").exists()  # removed once verified


def test_the_commands_run_as_written(tmp_path):
    import inshrink
    inshrink.Series(tmp_path / "ckpts").save(1, {"w": torch.ones(4).numpy()})
    (block,) = section_blocks("sh")
    for line in block.splitlines():
        command = line.split("#")[0].split()
        assert command[0] == "inshrink"
        r = run(*command[1:], cwd=tmp_path)
        assert r.returncode == 0, (line, r.stderr)
    assert (tmp_path / "ckpts.png").exists()
