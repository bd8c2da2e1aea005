"""safetensors <-> .ink conversion: byte-identical round trips, shards, malformed inputs."""
import json
import os

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
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
    # converting again over an existing output replaces it whole, when asked to
    (tmp_path / "back" / "stale.json").write_text("{}")
    with pytest.raises(errors.InvalidArgumentError, match="exists"):
        convert.decompress_directory(str(tmp_path / "ckpt-ink"), str(tmp_path / "back"))
    assert (tmp_path / "back" / "stale.json").exists()
    convert.decompress_directory(str(tmp_path / "ckpt-ink"), str(tmp_path / "back"),
                                 overwrite=True)
    assert sorted(os.listdir(tmp_path / "back")) == sorted(os.listdir(src))


@pytest.mark.parametrize("payload, error", [
    (b"", errors.CorruptError),
    (b"\x05\x00\x00\x00\x00\x00\x00\x00{}", errors.CorruptError),
    ((2 ** 40).to_bytes(8, "little"), errors.CorruptError),  # header longer than the file
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


def test_a_header_over_the_limit_is_limit_exceeded(tmp_path):
    path = tmp_path / "huge.safetensors"
    n = convert.MAX_SAFETENSORS_HEADER + 8
    with open(path, "wb") as f:  # sparse: the header is declared and present, not written
        f.write(n.to_bytes(8, "little") + b"{")
        f.truncate(8 + n)
    with pytest.raises(errors.LimitExceededError, match="huge.safetensors"):
        convert.compress_safetensors(path, tmp_path / "huge.ink")


def _torch_like_pickle() -> bytes:
    import pickle
    return pickle.dumps({"weight": [1.0, 2.0]}, protocol=2)


@pytest.mark.parametrize("content, said", [
    (b"PK\x03\x04" + bytes(60), "zip archive, e.g. a PyTorch torch.save checkpoint; torch "
                                "pickles are not read"),
    (_torch_like_pickle(), "Python pickle, e.g. a PyTorch torch.save checkpoint; torch pickles"),
    (b"hello, this is a text file\n", "looks like a text file"),
])
def test_files_of_other_formats_say_what_they_are(tmp_path, content, said):
    (tmp_path / "model.pt").write_bytes(content)
    with pytest.raises(errors.InvalidArgumentError, match="model.pt is not a safetensors") as e:
        convert.compress_safetensors(tmp_path / "model.pt", tmp_path / "model.ink")
    assert said in str(e.value) and "100 MiB" not in str(e.value)


def test_random_bytes_and_ink_files_are_not_safetensors(tmp_path):
    (tmp_path / "r.bin").write_bytes(np.random.default_rng(0).bytes(100))
    with pytest.raises(errors.CorruptError, match="r.bin is not a safetensors file"):
        convert.compress_safetensors(tmp_path / "r.bin", tmp_path / "r.ink")
    inshrink.save(tmp_path / "a.ink", {"w": np.ones(3, np.float32)})
    with pytest.raises(errors.InvalidArgumentError, match="a.ink is already compressed"):
        convert.compress_safetensors(tmp_path / "a.ink", tmp_path / "b.ink")
    save_file({"w": np.ones(3, np.float32)}, str(tmp_path / "s.safetensors"))
    with pytest.raises(errors.InvalidArgumentError, match="looks like a safetensors file"):
        convert.decompress_to_safetensors(tmp_path / "s.safetensors", tmp_path / "o")
    assert sorted(os.listdir(tmp_path)) == ["a.ink", "r.bin", "s.safetensors"]


def make_tree(root):
    """Tensors in subfolders only (diffusers layout), configs at every level."""
    for i, sub in enumerate(["unet", "vae/decoder"]):
        (root / sub).mkdir(parents=True)
        save_file({"w": random_bits(np.float32, (8, 4), i)}, str(root / sub / "m.safetensors"))
        (root / sub / "config.json").write_text(json.dumps({"i": i}))
    (root / "empty_folder").mkdir()
    (root / "model_index.json").write_text("{}")


def test_directories_recurse_and_return_a_report(tmp_path):
    make_tree(tmp_path / "src")
    report = convert.compress_directory(tmp_path / "src", tmp_path / "ink")
    assert [(r.source, r.output, r.copied) for r in report] == [
        ("model_index.json", "model_index.json", True),
        ("unet/config.json", "unet/config.json", True),
        ("unet/m.safetensors", "unet/m.ink", False),
        ("vae/decoder/config.json", "vae/decoder/config.json", True),
        ("vae/decoder/m.safetensors", "vae/decoder/m.ink", False)]
    assert [t.name for t in report[2].tensors] == ["w"]
    assert report[2].bytes_out == os.path.getsize(tmp_path / "ink" / "unet" / "m.ink")
    back = convert.decompress_directory(tmp_path / "ink", tmp_path / "back")
    assert [r.output for r in back if not r.copied] == ["unet/m.safetensors",
                                                        "vae/decoder/m.safetensors"]
    assert (tmp_path / "back" / "empty_folder").is_dir()
    for r in report:
        assert (tmp_path / "back" / r.source).read_bytes() == \
            (tmp_path / "src" / r.source).read_bytes()


def test_directory_without_safetensors_is_an_error(tmp_path):
    (tmp_path / "src" / "sub").mkdir(parents=True)
    (tmp_path / "src" / "sub" / "config.json").write_text("{}")
    with pytest.raises(errors.InvalidArgumentError, match="no .safetensors files"):
        convert.compress_directory(tmp_path / "src", tmp_path / "out")
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_a_failed_directory_conversion_leaves_no_partial_destination(tmp_path):
    make_tree(tmp_path / "src")
    (tmp_path / "src" / "vae" / "decoder" / "z.safetensors").write_bytes(b"\x10" + bytes(20))
    with pytest.raises(errors.CorruptError, match="z.safetensors"):
        convert.compress_directory(tmp_path / "src", tmp_path / "ink")
    assert sorted(os.listdir(tmp_path)) == ["src"]  # no destination, no staging debris
    (tmp_path / "ink").mkdir()
    (tmp_path / "ink" / "keep.txt").write_text("previous")
    with pytest.raises(errors.CorruptError):
        convert.compress_directory(tmp_path / "src", tmp_path / "ink", overwrite=True)
    assert sorted(os.listdir(tmp_path)) == ["ink", "src"]
    assert os.listdir(tmp_path / "ink") == ["keep.txt"]


def test_destination_must_not_be_or_contain_the_source(tmp_path):
    make_tree(tmp_path / "src")
    for dst, message in [(tmp_path / "src" / "out", "inside the source"),
                         (tmp_path, "would replace the source"),
                         (tmp_path / "src", "would replace the source")]:
        with pytest.raises(errors.InvalidArgumentError, match=message):
            convert.compress_directory(tmp_path / "src", dst, overwrite=True)
    assert sorted(os.listdir(tmp_path / "src")) == ["empty_folder", "model_index.json",
                                                    "unet", "vae"]


def test_symbolic_links(tmp_path):
    make_tree(tmp_path / "src")
    src = tmp_path / "src"
    (tmp_path / "outside.json").write_text("outside")
    os.symlink(src / "unet" / "config.json", src / "inner_link.json")  # inside: its content
    convert.compress_directory(src, tmp_path / "a")
    assert (tmp_path / "a" / "inner_link.json").read_text() == '{"i": 0}'

    os.symlink(tmp_path / "outside.json", src / "outer_link.json")
    with pytest.raises(errors.InvalidArgumentError, match="outer_link.json is a symbolic link"):
        convert.compress_directory(src, tmp_path / "b")
    report = convert.compress_directory(src, tmp_path / "b", follow_symlinks=True)
    linked = [r for r in report if r.link_target is not None]
    assert [r.source for r in linked] == ["outer_link.json"]
    assert linked[0].link_target == os.path.realpath(tmp_path / "outside.json")
    assert (tmp_path / "b" / "outer_link.json").read_text() == "outside"

    os.unlink(src / "outer_link.json")
    os.symlink(tmp_path / "missing", src / "broken")
    with pytest.raises(errors.InvalidArgumentError, match="broken symbolic link"):
        convert.compress_directory(src, tmp_path / "c", follow_symlinks=True)
    os.unlink(src / "broken")
    os.symlink(src / "unet", src / "unet_again")
    with pytest.raises(errors.InvalidArgumentError, match="link to a directory"):
        convert.compress_directory(src, tmp_path / "c", follow_symlinks=True)
    assert not (tmp_path / "c").exists()


def test_an_error_in_a_directory_names_the_file(tmp_path):
    make_tree(tmp_path / "src")
    text = json.dumps({"a": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}}).encode()
    (tmp_path / "src" / "unet" / "f4.safetensors").write_bytes(
        len(text).to_bytes(8, "little") + text + b"\0")
    with pytest.raises(errors.InvalidArgumentError,
                       match=r"src/unet/f4.safetensors: tensor 'a': unsupported dtype"):
        convert.compress_directory(tmp_path / "src", tmp_path / "out")


@given(st.binary(max_size=200) | st.builds(
    lambda n, body: n.to_bytes(8, "little") + body,
    st.integers(0, 300), st.binary(max_size=200)))
def test_any_bytes_give_a_typed_error_or_a_file(tmp_path_factory, content):
    folder = tmp_path_factory.mktemp("any")
    (folder / "x.safetensors").write_bytes(content)
    try:
        convert.compress_safetensors(folder / "x.safetensors", folder / "x.ink")
    except errors.InshrinkError as exc:
        assert "x.safetensors" in str(exc)
        assert sorted(os.listdir(folder)) == ["x.safetensors"]


@pytest.mark.parametrize("link", [False, True])
def test_a_conversion_whose_output_is_its_input_is_refused(tmp_path, link):
    """Before: the source was replaced by the converted file (with lossy values when a
    policy quantized it)."""
    src = tmp_path / "model.safetensors"
    weights = {"w.weight": np.random.default_rng(0).standard_normal((64, 64), np.float32)}
    save_file(weights, str(src))
    before = src.read_bytes()
    dst = src
    if link:
        dst = tmp_path / "other.ink"
        dst.symlink_to(src)
    with pytest.raises(inshrink.errors.InvalidArgumentError, match="is the input"):
        convert.compress_safetensors(src, dst, policy="balanced")
    assert src.read_bytes() == before
    ink = tmp_path / "model.ink"
    convert.compress_safetensors(src, ink)
    packed = ink.read_bytes()
    with pytest.raises(inshrink.errors.InvalidArgumentError, match="is the input"):
        convert.decompress_to_safetensors(ink, ink)
    assert ink.read_bytes() == packed
    assert sorted(os.listdir(tmp_path)) == sorted(["model.safetensors", "model.ink"]
                                                  + (["other.ink"] if link else []))
