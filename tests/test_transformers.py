"""inshrink.transformers: Hugging Face models saved to and loaded from .ink directories.

Models are built from small configs: nothing is downloaded."""
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers reads it

import subprocess  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import (AutoModelForCausalLM, AutoTokenizer, GPT2Config,  # noqa: E402
                          GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                          PreTrainedTokenizerFast)

import inshrink.transformers as ink
from inshrink.errors import InvalidArgumentError  # noqa: E402
from kit import ROOT  # noqa: E402

torch.set_num_threads(1)
TOKENS = torch.tensor([[1, 5, 9, 42, 7, 3]])


def gpt2():
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32,
                        bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config).eval()


def llama():
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, vocab_size=128,
                         tie_word_embeddings=False, bos_token_id=0, eos_token_id=0,
                         pad_token_id=0)
    return LlamaForCausalLM(config).eval()


def logits(model):
    with torch.no_grad():
        return model(TOKENS).logits


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


def test_sharded_tied_model_loads_with_identical_logits(tmp_path):
    model = gpt2()
    reports = ink.save_pretrained(model, tmp_path / "g-ink", max_shard_size="20KB")
    names = sorted(os.listdir(tmp_path / "g-ink"))
    assert "model.safetensors.index.json" in names and "config.json" in names
    shards = [n for n in names if n.endswith(".ink")]
    assert len(shards) > 1 and not any(n.endswith(".safetensors") for n in names)
    assert os.listdir(tmp_path) == ["g-ink"]  # no temporary left beside it
    assert ink.lossy_summary(reports) is None

    back = ink.from_pretrained(AutoModelForCausalLM, tmp_path / "g-ink").eval()
    assert type(back) is GPT2LMHeadModel
    assert back.lm_head.weight.data_ptr() == back.transformer.wte.weight.data_ptr()  # tied
    original = model.state_dict()
    for name, value in back.state_dict().items():
        assert torch.equal(value, original[name]), name
    assert torch.equal(logits(back), logits(model))


def test_directory_compressed_by_the_command_line(tmp_path):
    model, tok = gpt2(), tokenizer()
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-m", "inshrink", "compress", "model", "-q"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    back, reports = ink.from_pretrained(GPT2LMHeadModel, tmp_path / "model-ink",
                                        return_reports=True)
    assert torch.equal(logits(back.eval()), logits(model))
    assert any(r.tensors for r in reports) and any(r.tensors is None for r in reports)
    tok_back = ink.from_pretrained(AutoTokenizer, tmp_path / "model-ink")
    assert tok_back("hello world")["input_ids"] == tok("hello world")["input_ids"] == [1, 2]


def test_lossy_model_reports_its_error(tmp_path):
    model = llama()
    reports = ink.save_pretrained(model, tmp_path / "l-ink", policy="balanced")
    summary = ink.lossy_summary(reports)
    assert summary.startswith("LOSSY: ") and "max relative L2 error 0.0" in summary
    with pytest.warns(UserWarning, match="LOSSY: .* quantized"):
        back = ink.from_pretrained(AutoModelForCausalLM, tmp_path / "l-ink").eval()
    assert type(back) is LlamaForCausalLM
    expected, got = logits(model), logits(back)
    assert not torch.equal(got, expected)
    assert (got - expected).norm() / expected.norm() < 0.1
    head = back.lm_head.weight
    assert head.data_ptr() != back.model.embed_tokens.weight.data_ptr()  # untied stays so


def test_errors_and_overwrite(tmp_path):
    with pytest.raises(InvalidArgumentError, match="not a directory"):
        ink.from_pretrained(AutoModelForCausalLM, tmp_path / "missing")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "config.json").write_text("{}")
    with pytest.raises(InvalidArgumentError, match="no .ink files"):
        ink.from_pretrained(AutoModelForCausalLM, tmp_path / "plain")
    with pytest.raises(InvalidArgumentError, match="exists"):
        ink.save_pretrained(gpt2(), tmp_path / "plain")
    assert os.listdir(tmp_path / "plain") == ["config.json"]
    ink.save_pretrained(gpt2(), tmp_path / "plain", overwrite=True)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # lossless: no warning
        ink.from_pretrained(AutoModelForCausalLM, tmp_path / "plain", tmp_dir=scratch)
    assert os.listdir(scratch) == []
    assert sorted(os.listdir(tmp_path)) == ["plain", "scratch"]
