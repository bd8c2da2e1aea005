"""safetensors <-> .ink conversion: byte-identical round trips, shards, malformed inputs."""
import json
import os

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import inshrink
from inshrink import convert, errors
from helpers import assert_bit_exact, random_bits


def write_safetensors(path, tensors: dict, metadata=None, order=None) -> None:
    """A safetensors writer independent of the library, for layouts it would not choose."""
    header, position = {}, 0
    if metadata is not None:
        header["__metadata__"] = metadata
    names = order or list(tensors)
    for name in names:
        t = tensors[name]
        dtype = inshrink.dtypes.of_numpy(t.dtype).name
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [position, position + t.nbytes]}
        position += t.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for name in names:
            f.write(np.ascontiguousarray(tensors[name]).tobytes())


def test_safetensors_round_trip_is_byte_identical(tmp_path):
    tensors = {"model.w": random_bits(np.float32, (64, 32), 1),
               "model.bf": random_bits(ml_dtypes.bfloat16, (100,), 2),
               "model.b": np.zeros(0, np.float16), "step": np.array(7, np.int64)}
    src = tmp_path / "m.safetensors"
    save_file(tensors, str(src), metadata={"format": "np", "epoch": "3"})
    report = convert.compress_safetensors(src, tmp_path / "m.ink")
    assert {r.name for r in report} == set(tensors)
    with inshrink.open(tmp_path / "m.ink") as f:
        assert f.metadata == {"format": "np", "epoch": "3"}
        assert_bit_exact(tensors["model.bf"], f["model.bf"])
    convert.decompress_to_safetensors(tmp_path / "m.ink", tmp_path / "back.safetensors")
    assert (tmp_path / "back.safetensors").read_bytes() == src.read_bytes()


def test_unusual_layouts_and_fp8_stay_byte_identical(tmp_path):
    tensors = {"z": random_bits(ml_dtypes.float8_e5m2, (9,), 3),
               "a": random_bits(np.complex128, (2, 2), 4),
               "m": random_bits(np.bool_, (5,), 5)}
    src = tmp_path / "odd.safetensors"
    write_safetensors(src, tensors, order=["m", "z", "a"])  # unaligned, unsorted data
    convert.compress_safetensors(src, tmp_path / "odd.ink", threads=2)
    convert.decompress_to_safetensors(tmp_path / "odd.ink", tmp_path / "odd2.safetensors")
    assert (tmp_path / "odd2.safetensors").read_bytes() == src.read_bytes()


def test_ink_without_original_header_converts_to_valid_safetensors(tmp_path):
    tensors = {"w": random_bits(np.float32, (3, 5), 7), "bf": random_bits(ml_dtypes.bfloat16,
                                                                           (4,), 8)}
    inshrink.save(tmp_path / "n.ink", tensors, {"k": "v"})
    convert.decompress_to_safetensors(tmp_path / "n.ink", tmp_path / "n.safetensors")
    loaded = load_file(str(tmp_path / "n.safetensors"))
    for name, value in tensors.items():
        assert_bit_exact(value, loaded[name])
    raw = (tmp_path / "n.safetensors").read_bytes()
    header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    assert header["__metadata__"] == {"k": "v"}


def test_sharded_directory_round_trip(tmp_path):
    src = tmp_path / "ckpt"
    src.mkdir()
    shards = {"model-00001-of-00002.safetensors": {"a": random_bits(np.float32, (10,), 1)},
              "model-00002-of-00002.safetensors": {"b": random_bits(ml_dtypes.bfloat16,
                                                                    (20,), 2)}}
    weight_map = {}
    for shard, tensors in shards.items():
        save_file(tensors, str(src / shard), metadata={"format": "pt"})
        weight_map.update({k: shard for k in tensors})
    (src / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 50}, "weight_map": weight_map}))
    (src / "config.json").write_text('{"hidden": 4}')
    convert.compress_directory(str(src), str(tmp_path / "ckpt-ink"))
    assert sorted(os.listdir(tmp_path / "ckpt-ink")) == [
        "config.json", "model-00001-of-00002.ink", "model-00002-of-00002.ink",
        "model.safetensors.index.json"]
    convert.decompress_directory(str(tmp_path / "ckpt-ink"), str(tmp_path / "back"))
    for name in os.listdir(src):
        assert (tmp_path / "back" / name).read_bytes() == (src / name).read_bytes()
    # converting again over an existing output replaces it whole
    convert.decompress_directory(str(tmp_path / "ckpt-ink"), str(tmp_path / "back"))
    assert sorted(os.listdir(tmp_path / "back")) == sorted(os.listdir(src))


@pytest.mark.parametrize("payload, error", [
    (b"", errors.CorruptError),
    (b"\x05\x00\x00\x00\x00\x00\x00\x00{}", errors.CorruptError),
    ((2 ** 40).to_bytes(8, "little"), errors.LimitExceededError),
    (b"\x02\x00\x00\x00\x00\x00\x00\x00[]", errors.CorruptError),
    (b"\x04\x00\x00\x00\x00\x00\x00\x00\xff\xfe{}", errors.CorruptError),
])
def test_malformed_safetensors_raise_typed_errors(tmp_path, payload, error):
    (tmp_path / "bad.safetensors").write_bytes(payload)
    with pytest.raises(error):
        convert.compress_safetensors(tmp_path / "bad.safetensors", tmp_path / "bad.ink")
    assert not (tmp_path / "bad.ink").exists()


@pytest.mark.parametrize("header", [
    {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}},       # size mismatch
    {"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}},       # hole at the start
    {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
     "b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},       # overlap
    {"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}},
    {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "x": 1}},
    {"__metadata__": {"a": 1}},
])
def test_inconsistent_safetensors_headers_are_corrupt(tmp_path, header):
    text = json.dumps(header).encode()
    (tmp_path / "b.safetensors").write_bytes(len(text).to_bytes(8, "little") + text + bytes(8))
    with pytest.raises(errors.CorruptError):
        convert.compress_safetensors(tmp_path / "b.safetensors", tmp_path / "b.ink")


def test_unsupported_safetensors_dtype_is_invalid_argument(tmp_path):
    text = json.dumps({"a": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}}).encode()
    (tmp_path / "f4.safetensors").write_bytes(len(text).to_bytes(8, "little") + text + b"\0")
    with pytest.raises(errors.InvalidArgumentError, match="F4"):
        convert.compress_safetensors(tmp_path / "f4.safetensors", tmp_path / "f4.ink")
