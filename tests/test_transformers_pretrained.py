"""inshrink.transformers.from_pretrained: a model gets the decoded weights as transformers'
state_dict, without a temporary directory, and loads as its safetensors directory does.

Models are built from small configs: nothing is downloaded."""
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers reads it

import contextlib  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import (AutoModelForCausalLM, AutoTokenizer, GPT2Config,  # noqa: E402
                          GPT2LMHeadModel, PreTrainedTokenizerFast)

import inshrink.torch.convert  # noqa: E402
import inshrink.transformers as ink  # noqa: E402
import inshrink.transformers.pretrained as pretrained  # noqa: E402
from inshrink import safetensors as convert  # noqa: E402
from inshrink.errors import CorruptError  # noqa: E402
from test_transformers import llama, logits  # noqa: E402  (its tiny models)


def gpt2(dtype=torch.float32):
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config).to(dtype).eval()
    model.generation_config.max_length = 23  # written to generation_config.json
    return model


def saved(model, tmp_path, **kwargs):
    """The model's safetensors directory and its compressed copy (lossless)."""
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    model.save_pretrained(plain, **kwargs)
    convert.compress_directory(plain, packed)
    return plain, packed


@contextlib.contextmanager
def no_temporary():
    """Inside it, any temporary file or directory made through tempfile fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("a temporary file or directory was made")
    with pytest.MonkeyPatch.context() as patch:
        for name in ("mkdtemp", "mkstemp", "TemporaryDirectory", "NamedTemporaryFile"):
            patch.setattr(tempfile, name, refuse)
        yield


def from_pretrained(*args, **kwargs):
    """ink.from_pretrained, making no temporary file or directory."""
    with no_temporary():
        return ink.from_pretrained(*args, **kwargs)


def assert_same_load(expected, got):
    """Same class, parameters and buffers (bit for bit, same dtypes), ties and logits."""
    assert type(got) is type(expected)
    want, have = expected.state_dict(), got.state_dict()
    assert list(have) == list(want)
    for name, value in have.items():
        assert value.dtype == want[name].dtype, name
        assert torch.equal(value.view(torch.uint8) if value.dtype.is_floating_point else value,
                           want[name].view(torch.uint8) if value.dtype.is_floating_point
                           else want[name]), name
    ties = {n: p.data_ptr() for n, p in expected.named_parameters(remove_duplicate=False)}
    got_ptrs = {n: p.data_ptr() for n, p in got.named_parameters(remove_duplicate=False)}
    for a in ties:
        for b in ties:
            assert (ties[a] == ties[b]) == (got_ptrs[a] == got_ptrs[b]), (a, b)
    assert torch.equal(logits(got), logits(expected))
    assert got.generation_config.to_dict() == expected.generation_config.to_dict()


@pytest.mark.parametrize("shard", [None, "20KB"], ids=["one-file", "sharded"])
def test_tied_gpt2_loads_as_its_safetensors_directory(tmp_path, shard):
    model = gpt2()
    plain, packed = saved(model, tmp_path, **({"max_shard_size": shard} if shard else {}))
    shards = [n for n in os.listdir(packed) if n.endswith(".ink")]
    assert (len(shards) > 1) == bool(shard)
    expected = AutoModelForCausalLM.from_pretrained(plain)
    got = from_pretrained(AutoModelForCausalLM, packed)
    assert_same_load(expected, got)
    assert got.lm_head.weight.data_ptr() == got.transformer.wte.weight.data_ptr()  # tied
    assert torch.equal(logits(got), logits(model))
    assert got.generation_config.max_length == 23
    assert got.config.name_or_path == str(packed) == got.name_or_path
    assert not got.training
    # the model class itself, and a config attribute given as a keyword, as transformers
    # takes it for a directory
    got = from_pretrained(GPT2LMHeadModel, packed, output_attentions=True)
    assert got.config.output_attentions is True
    assert_same_load(AutoModelForCausalLM.from_pretrained(plain, output_attentions=True), got)
    assert sorted(os.listdir(tmp_path)) == ["packed", "plain"]


def test_untied_llama_loads_as_its_safetensors_directory(tmp_path):
    plain, packed = saved(llama(), tmp_path, max_shard_size="40KB")
    got = from_pretrained(AutoModelForCausalLM, packed)
    assert_same_load(AutoModelForCausalLM.from_pretrained(plain), got)
    assert got.lm_head.weight.data_ptr() != got.model.embed_tokens.weight.data_ptr()


@pytest.mark.parametrize("saved_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("asked", [{}, {"dtype": "auto"}, {"dtype": torch.float32},
                                   {"torch_dtype": torch.bfloat16}],
                         ids=["default", "auto", "fp32", "torch_dtype-bf16"])
def test_dtype_as_the_safetensors_directory_gives_it(tmp_path, saved_dtype,
                                                     asked):
    plain, packed = saved(gpt2(saved_dtype), tmp_path, max_shard_size="20KB")
    expected = AutoModelForCausalLM.from_pretrained(plain, **asked)
    got = from_pretrained(AutoModelForCausalLM, packed, **asked)
    assert_same_load(expected, got)
    want = asked.get("dtype", asked.get("torch_dtype", "auto"))
    assert got.dtype == (saved_dtype if want == "auto" else want) == expected.dtype


def test_parameters_are_the_decoded_tensors(tmp_path, monkeypatch):
    # transformers assigns the state dict's tensors: no second copy of the weights
    _, packed = saved(gpt2(), tmp_path, max_shard_size="20KB")
    made = []
    to_torch = inshrink.torch.convert.to_torch

    def recording(array):
        tensor = to_torch(array)
        made.append(tensor.data_ptr())
        return tensor
    monkeypatch.setattr(inshrink.torch.convert, "to_torch", recording)
    got = from_pretrained(AutoModelForCausalLM, packed)
    params = {p.data_ptr() for p in got.parameters()}
    assert len(made) == len(params) and params == set(made)


def test_loading_info_device_map_and_reports(tmp_path):
    plain, packed = saved(gpt2(), tmp_path, max_shard_size="20KB")
    model, info = from_pretrained(AutoModelForCausalLM, packed, output_loading_info=True,
                                      device_map="cpu")
    _, expected_info = AutoModelForCausalLM.from_pretrained(plain, output_loading_info=True,
                                                            device_map="cpu")
    assert info == expected_info and model.device.type == "cpu"
    model, reports = from_pretrained(AutoModelForCausalLM, packed, return_reports=True)
    assert [r.source for r in reports] == sorted(os.listdir(packed))
    for r in reports:  # as decompressing would report them, without writing a file
        assert r.bytes_out == os.path.getsize(plain / r.output)
        assert (r.tensors is None) == (not r.source.endswith(".ink"))
    assert ink.lossy_summary(reports) is None


def test_tokenizer_loads_the_compressed_directory_itself(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    plain = tmp_path / "plain"
    gpt2().save_pretrained(plain)
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(plain)
    convert.compress_directory(plain, tmp_path / "packed")
    back = from_pretrained(AutoTokenizer, tmp_path / "packed")
    assert back("hello world")["input_ids"] == [1, 2]


def test_other_classes_load_a_temporary_copy(tmp_path):
    plain, packed = saved(gpt2(), tmp_path)
    seen = []

    class Loader:  # a from_pretrained class that is no transformers model
        @classmethod
        def from_pretrained(cls, directory, **kwargs):
            seen.append((directory, sorted(os.listdir(directory)), kwargs))
            return cls()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    assert isinstance(ink.from_pretrained(Loader, packed, tmp_dir=scratch, x=1), Loader)
    (directory, names, kwargs), = seen
    assert names == sorted(os.listdir(plain)) and kwargs == {"x": 1}
    assert directory.startswith(str(scratch)) and os.listdir(scratch) == []  # removed


def test_missing_shard_raises_before_decoding(tmp_path, monkeypatch):
    _, packed = saved(gpt2(), tmp_path, max_shard_size="20KB")
    shard = sorted(n for n in os.listdir(packed) if n.endswith(".ink"))[-1]
    os.remove(packed / shard)

    def no_decoding(*args, **kwargs):
        raise AssertionError("a file was decoded")
    monkeypatch.setattr(pretrained, "File", no_decoding)
    monkeypatch.setattr(convert, "decompress_directory", no_decoding)
    with pytest.raises(CorruptError, match=rf"{packed}/{shard}: missing"):
        ink.from_pretrained(AutoModelForCausalLM, packed)


@pytest.mark.parametrize("damage", ["flipped", "truncated", "not-ink"])
def test_corrupt_weight_file_names_it(tmp_path, damage):
    _, packed = saved(gpt2(), tmp_path, max_shard_size="20KB")
    shard = packed / sorted(n for n in os.listdir(packed) if n.endswith(".ink"))[1]
    data = bytearray(shard.read_bytes())
    if damage == "flipped":
        data[len(data) // 3] ^= 0xFF  # inside a tensor's records
    elif damage == "truncated":
        del data[len(data) // 2:]
    else:
        data[:8] = b"\x00" * 8
    shard.write_bytes(bytes(data))
    with pytest.raises(CorruptError, match=str(shard)):
        from_pretrained(AutoModelForCausalLM, packed)


def test_variant(tmp_path):
    plain, packed = saved(gpt2(), tmp_path, variant="v2", max_shard_size="20KB")
    assert "model.safetensors.index.v2.json" in os.listdir(packed)
    got = from_pretrained(AutoModelForCausalLM, packed, variant="v2")
    assert_same_load(AutoModelForCausalLM.from_pretrained(plain, variant="v2"), got)


def test_hf_cache_snapshot_links(tmp_path):
    # a Hugging Face cache snapshot: every file a link into blobs/
    plain, packed = saved(gpt2(), tmp_path, max_shard_size="20KB")
    blobs, snapshot = tmp_path / "blobs", tmp_path / "snapshot"
    shutil.copytree(packed, blobs)
    snapshot.mkdir()
    for name in os.listdir(blobs):
        os.symlink(blobs / name, snapshot / name)
    got = from_pretrained(AutoModelForCausalLM, snapshot)
    assert_same_load(AutoModelForCausalLM.from_pretrained(plain), got)
