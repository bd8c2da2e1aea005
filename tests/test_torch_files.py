"""inshrink.torch_files: safetensors.torch's calls for .ink files."""
import pytest
import safetensors.torch
import torch

from inshrink.errors import CorruptError, InvalidArgumentError
from inshrink.torch import load, load_file, load_model, save, save_file, save_model

torch.set_num_threads(1)

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn,
          torch.float8_e5m2, torch.complex64, torch.complex128, torch.int8, torch.int16,
          torch.int32, torch.int64, torch.uint8, torch.uint16, torch.uint32, torch.uint64,
          torch.bool]


def random_bits(dtype, shape, seed=0):
    """A tensor of ``dtype`` whose bytes are random: NaN payloads, subnormals, -0."""
    gen = torch.Generator().manual_seed(seed)
    n = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n,), generator=gen, dtype=torch.uint8)
    if dtype == torch.bool:
        raw &= 1
    return raw.view(dtype).reshape(shape)


def same_bits(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                       b.contiguous().reshape(-1).view(torch.uint8))


def test_every_dtype_round_trips_bit_for_bit(tmp_path):
    tensors = {str(d): random_bits(d, (3, 5, 7), seed=i) for i, d in enumerate(DTYPES)}
    tensors["scalar"] = torch.tensor(2.5, dtype=torch.bfloat16)
    tensors["empty"] = torch.empty(0, 4, dtype=torch.float16)
    save_file(tensors, tmp_path / "t.ink", metadata={"format": "pt"})
    back = load_file(tmp_path / "t.ink")
    assert list(back) == list(tensors)
    for name, value in tensors.items():
        same_bits(value, back[name])
    assert back["scalar"].shape == () and back["empty"].shape == (0, 4)
    back["torch.float32"] += 1  # writable, owns its memory
    from_bytes = load(save(tensors))
    for name, value in tensors.items():
        same_bits(value, from_bytes[name])


def test_non_contiguous_and_views_that_share_nothing(tmp_path):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    halves = base.chunk(2)  # one storage, disjoint bytes: not shared
    tensors = {"t": torch.randn(5, 3).t(), "strided": torch.arange(20)[::3],
               "top": halves[0], "bottom": halves[1]}
    save_file(tensors, tmp_path / "v.ink")
    back = load_file(tmp_path / "v.ink")
    for name, value in tensors.items():
        assert torch.equal(back[name], value) and back[name].is_contiguous()


def test_shared_tensors_are_refused_by_name_as_safetensors_does(tmp_path):
    w = torch.randn(4, 4)
    for tensors in ({"a": w, "b": w}, {"a": w, "b": w.t()}, {"a": w, "b": w[1:3]}):
        with pytest.raises(RuntimeError):  # what safetensors does
            safetensors.torch.save_file(tensors, str(tmp_path / "s.safetensors"))
        with pytest.raises(InvalidArgumentError, match="share memory: a, b"):
            save_file(tensors, tmp_path / "s.ink")
    assert not (tmp_path / "s.ink").exists()


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 16)
        self.body = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32),
                                        torch.nn.Linear(32, 16, dtype=torch.bfloat16))
        self.head = torch.nn.Linear(16, 50, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("count", torch.tensor(7, dtype=torch.int64))


def test_state_dict_round_trips_into_load_state_dict(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                                torch.nn.Linear(16, 4, dtype=torch.float16))
    save_file(model.state_dict(), tmp_path / "m.ink")
    torch.manual_seed(1)
    other = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                                torch.nn.Linear(16, 4, dtype=torch.float16))
    other.load_state_dict(load_file(tmp_path / "m.ink"))
    for (name, a), b in zip(model.state_dict().items(), other.state_dict().values()):
        same_bits(a, b)


def test_save_model_keeps_tied_weights_once_as_safetensors_does(tmp_path):
    torch.manual_seed(0)
    model = Tied()
    with pytest.raises(InvalidArgumentError, match="embed.weight, head.weight"):
        save_file(model.state_dict(), tmp_path / "m.ink")
    safetensors.torch.save_model(model, str(tmp_path / "m.safetensors"))
    save_model(model, tmp_path / "m.ink")
    ours = load_file(tmp_path / "m.ink")
    theirs = safetensors.torch.load_file(str(tmp_path / "m.safetensors"))
    assert set(ours) == set(theirs)
    torch.manual_seed(1)
    other = Tied()
    assert load_model(other, tmp_path / "m.ink") == ([], [])
    assert other.head.weight is other.embed.weight
    for a, b in zip(model.state_dict().values(), other.state_dict().values()):
        same_bits(a, b)
    x = torch.tensor([[1, 2, 3]])
    assert torch.equal(other.head(other.embed(x)), model.head(model.embed(x)))
    with pytest.raises(InvalidArgumentError, match="missing"):
        load_model(torch.nn.Linear(2, 2), tmp_path / "m.ink")


def test_lossy_policy_reports_its_error(tmp_path):
    torch.manual_seed(0)
    weight = torch.randn(128, 128)
    report = save_file({"layer.weight": weight}, tmp_path / "q.ink", policy="balanced")
    assert not report[0].lossless and 0 < report[0].error["rel_l2_error"] < 0.1
    back = load_file(tmp_path / "q.ink")["layer.weight"]
    assert 0 < (back - weight).norm() / weight.norm() < 0.1


def test_bad_input_is_a_typed_error(tmp_path):
    cases = [([1, 2], "dict"), ({"a": [1.0]}, "torch.Tensor"),
             ({"s": torch.eye(3).to_sparse()}, "to_dense"),
             ({"m": torch.empty(3, device="meta")}, "meta")]
    for tensors, text in cases:
        with pytest.raises(InvalidArgumentError, match=text):
            save_file(tensors, tmp_path / "x.ink")
    with pytest.raises(InvalidArgumentError, match="bytes"):
        load("not bytes")
    with pytest.raises(CorruptError, match="not an .ink file"):
        load(b"garbage" * 20)
    assert not (tmp_path / "x.ink").exists()
