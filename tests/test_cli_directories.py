"""The command line on directory trees: diffusers-style subfolders, empty directories, links."""
import json
import os

import numpy as np
import pytest
from safetensors.numpy import save_file

from kit import run_cli as run


@pytest.fixture()
def pipeline(tmp_path):
    """A diffusers-style pipeline: tensors only in subfolders, configs at every level."""
    rng = np.random.default_rng(0)
    src = tmp_path / "pipe"
    for i, sub in enumerate(["unet", "text_encoder", "vae"]):
        (src / sub).mkdir(parents=True)
        save_file({f"{sub}.weight": rng.standard_normal((64, 64)).astype(np.float32)},
                  str(src / sub / "diffusion_pytorch_model.safetensors"))
        (src / sub / "config.json").write_text(json.dumps({"layer": i}))
    (src / "scheduler").mkdir()
    (src / "scheduler" / "scheduler_config.json").write_text("{}")
    (src / "model_index.json").write_text('{"_class_name": "Pipeline"}')
    return tmp_path


def tree(root):
    """Relative path -> bytes of every file under root."""
    return {os.path.relpath(os.path.join(top, n), root): open(os.path.join(top, n), "rb").read()
            for top, _, names in os.walk(root) for n in names}


def test_subfolders_round_trip_through_compress_decompress_verify(pipeline):
    r = run("compress", "pipe", "--json", cwd=pipeline)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["bytes_in"] > 3 * 64 * 64 * 4  # the tensors were read, not skipped
    converted = sorted(f["output"] for f in report["files"] if not f["copied"])
    assert converted == [os.path.join("pipe-ink", s, "diffusion_pytorch_model.ink")
                         for s in ("text_encoder", "unet", "vae")]
    assert sum(len(f["tensors"]) for f in report["files"]) == 3
    r = run("verify", "pipe-ink", cwd=pipeline)
    assert r.returncode == 0 and r.stdout.count("OK ") == 3, r.stdout + r.stderr
    r = run("decompress", "pipe-ink", "-o", "back", cwd=pipeline)
    assert r.returncode == 0, r.stderr
    assert tree(pipeline / "back") == tree(pipeline / "pipe")


def test_info_summarises_every_ink_file_of_a_directory(pipeline):
    assert run("compress", "pipe", "-q", cwd=pipeline).returncode == 0
    r = run("info", "pipe-ink", cwd=pipeline)
    assert r.returncode == 0, r.stderr
    for sub in ("unet", "text_encoder", "vae"):
        assert f"{sub}.weight" in r.stdout and f"{sub}/diffusion_pytorch_model.ink" in r.stdout
    assert "3 files" in r.stdout


@pytest.mark.parametrize("command", [("compress", "empty"), ("decompress", "empty", "-o",
                                                                  "x.safetensors"),
                                     ("verify", "empty"), ("info", "empty")])
def test_a_directory_without_tensor_files_is_an_error(tmp_path, command):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    (tmp_path / "empty" / "sub" / "README.md").write_text("no tensors here")
    r = run(*command, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "empty holds no ." in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "x.safetensors").exists() and not (tmp_path / "empty-ink").exists()


def test_links_out_of_the_directory_are_refused_unless_followed(pipeline, tmp_path):
    (tmp_path / "elsewhere.json").write_text('{"secret": 1}')
    os.symlink(tmp_path / "elsewhere.json", pipeline / "pipe" / "linked.json")
    r = run("compress", "pipe", cwd=pipeline)
    assert r.returncode == 1 and "linked.json is a symbolic link" in r.stderr
    assert "--follow-symlinks" in r.stderr and not (pipeline / "pipe-ink").exists()
    r = run("compress", "pipe", "--follow-symlinks", cwd=pipeline)
    assert r.returncode == 0, r.stderr
    assert "linked.json is a link to" in r.stderr  # said, not silent
    assert (pipeline / "pipe-ink" / "linked.json").read_text() == '{"secret": 1}'
    assert not (pipeline / "pipe-ink" / "linked.json").is_symlink()


# --- decompress of a compressed tree and of a series -----------------------------------------

def test_decompress_of_a_tree_holding_another_programs_manifest_json(tmp_path):
    """compress copies a model directory's other files, a manifest.json among them: the
    directory it wrote was then refused by decompress as a checkpoint series (exit 2)."""
    (tmp_path / "model").mkdir()
    tensors = {"w": np.arange(12, dtype=np.float32).reshape(3, 4)}
    save_file(tensors, str(tmp_path / "model" / "model.safetensors"))
    (tmp_path / "model" / "manifest.json").write_text('{"files": ["model.safetensors"]}')
    done = run("compress", "model", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    done = run("decompress", "model-ink", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "model-ink-safetensors"
    assert (out / "model.safetensors").read_bytes() == \
        (tmp_path / "model" / "model.safetensors").read_bytes()
    assert (out / "manifest.json").read_text() == '{"files": ["model.safetensors"]}'


def test_decompress_of_a_series_still_points_to_series_restore(tmp_path):
    from inshrink.series.series import Series
    series = Series(tmp_path / "ser")
    series.save(1, {"w": np.zeros(4, np.float32)})
    done = run("decompress", "ser", cwd=tmp_path)
    assert done.returncode == 2 and "series restore" in done.stderr
