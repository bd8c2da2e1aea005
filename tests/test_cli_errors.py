"""The command line's errors: exit codes, paths in messages, wrong file kinds, odd metadata."""
import json
import os
import pickle
import resource
import signal
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import inshrink
from kit import ROOT, edit_index as with_index, one_line_error, run_cli as run


def test_files_of_other_formats_say_what_they_are(model):
    (model / "model.pt").write_bytes(pickle.dumps({"w": [1.0]}, protocol=2))
    (model / "notes.txt").write_text("just some notes\n")
    (model / "noise.bin").write_bytes(np.random.default_rng(1).bytes(300))
    inshrink.save(model / "done.ink", {"w": np.ones(3, np.float32)})
    expected = {"model.pt": "model.pt is not a safetensors file (it looks like a Python pickle",
                "notes.txt": "notes.txt is not a safetensors file (it looks like a text file)",
                "noise.bin": "noise.bin is not a safetensors file (its first 8 bytes declare",
                "done.ink": "done.ink is already compressed"}
    for name, message in expected.items():
        err = one_line_error(run("compress", name, cwd=model), 1)
        assert message in err and "100 MiB" not in err, err
    assert "safetensors.torch.save_file" in run("compress", "model.pt", cwd=model).stderr
    assert sorted(os.listdir(model)) == ["done.ink", "m.safetensors", "model.pt", "noise.bin",
                                         "notes.txt"]


@pytest.mark.parametrize("command", ["compress", "decompress", "info", "verify"])
def test_a_missing_input_is_a_usage_error_naming_it(model, command):
    err = one_line_error(run(command, "nope.ink", cwd=model), 2)
    assert "nope.ink: no such file or directory" in err


@pytest.mark.parametrize("args, flag", [
    (("compress", "m.safetensors", "--threads", "0"), "--threads"),
    (("compress", "m.safetensors", "--level", "100"), "--level"),
    (("compress", "m.safetensors", "--prune", "1.5"), "--prune"),
    (("compress", "m.safetensors", "--protect", "-0.1"), "--protect"),
    (("compress", "m.safetensors", "--max-rel-l2", "-1"), "--max-rel-l2"),
    (("compress", "m.safetensors", "--max-rel-l2", "nan"), "--max-rel-l2"),
    (("compress", "m.safetensors", "--bins", "0"), "--bins"),
    (("compress", "m.safetensors", "--prune", "0.6", "--protect", "0.5"), "--prune"),
    (("decompress", "m.ink", "--threads", "-2"), "--threads"),
    (("verify", "m.ink", "--threads", "x"), "--threads"),
    (("series", "restore", "s", "--step", "-1", "-o", "x.ink"), "--step"),
])
def test_bad_flags_are_usage_errors_naming_the_flag(model, args, flag):
    r = run(*args, cwd=model)
    assert r.returncode == 2 and flag in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "max_rel_l2" not in r.stderr and "threads must" not in r.stderr  # not Python names


def test_info_and_decompress_of_a_directory_or_safetensors_name_the_path(model):
    err = one_line_error(run("decompress", "m.safetensors", "-o", "x.safetensors", cwd=model), 1)
    assert "m.safetensors is not an .ink file (it looks like a safetensors file" in err
    err = one_line_error(run("info", "m.safetensors", cwd=model), 1)
    assert "m.safetensors is not an .ink file" in err


def limited(max_bytes: int):
    """Run the child with a file-size limit: writes beyond it fail (EFBIG) like a full disk."""
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))
    return apply


def run_limited(*args, cwd, max_bytes=8192):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "inshrink", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300,
                          preexec_fn=limited(max_bytes))


def test_a_full_disk_names_the_users_path_not_a_temporary(model):
    r = run_limited("compress", "m.safetensors", "-o", "out.ink", cwd=model)
    err = one_line_error(r, 1)
    assert "out.ink" in err and ".tmp" not in err and "File too large" in err, err
    inshrink.save(model / "m.ink", {"w": np.random.default_rng(0).standard_normal(
        (64, 64)).astype(np.float32)})
    r = run_limited("decompress", "m.ink", "-o", "back.safetensors", cwd=model)
    err = one_line_error(r, 1)
    assert "back.safetensors" in err and ".tmp" not in err, err
    (model / "tree").mkdir()
    os.replace(model / "m.safetensors", model / "tree" / "m.safetensors")
    err = one_line_error(run_limited("compress", "tree", cwd=model), 1)
    assert os.path.join("tree-ink", "m.ink") in err and ".tmp" not in err, err
    assert ".tree-ink" not in err
    assert sorted(os.listdir(model)) == ["m.ink", "tree"]  # no debris


@pytest.mark.parametrize("search", ['{"chosen": 5}', "[" * 100_000, '"text"', "{bad json",
                                    '{"chosen": {"bins": [[[1]]]}, "mode": {"x": 1}}'])
def test_info_shows_any_search_metadata_without_crashing(tmp_path, search):
    inshrink.save(tmp_path / "a.ink", {"w": np.ones(3, np.float32)},
                  {"inshrink.search": search})
    r = run("info", "a.ink", cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert "search: " in r.stdout


def test_info_shows_a_report_of_unexpected_types_as_text(tmp_path):
    path = tmp_path / "a.ink"
    inshrink.save(path, {"w": np.ones((64, 64), np.float32)}, policy="balanced")

    def edit(doc):
        doc["tensors"][0]["report"] = {"role": 7, "rel_l2_error": "tiny",
                                       "max_abs_error": True}
    with_index(path, edit)
    r = run("info", "a.ink", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "tiny" in r.stdout
    r = run("info", "a.ink", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    tensor = json.loads(r.stdout)["files"][0]["tensors"][0]
    assert tensor["error"]["rel_l2_error"] == "tiny"


def test_names_and_metadata_are_printed_with_control_characters_escaped(tmp_path):
    evil = "w\x1b[2J\nfake line\u202e"
    inshrink.save(tmp_path / "a.ink", {evil: np.ones(3, np.float32)},
                  {"inshrink.search": json.dumps({"mode": "\x1b]0;title\x07", "chosen": None})})
    r = run("info", "a.ink", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "\u202e" not in r.stdout and "\x07" not in r.stdout
    assert "w\\x1b[2J\\nfake line\\u202e" in r.stdout
    assert not any(line.startswith("fake line") for line in r.stdout.splitlines())
    r = run("info", "a.ink", "--json", cwd=tmp_path)
    assert json.loads(r.stdout)["files"][0]["tensors"][0]["name"] == evil  # JSON: exact
    os.replace(tmp_path / "a.ink", tmp_path / "x\x1b[31m.ink")
    r = run("verify", "x\x1b[31m.ink", cwd=tmp_path)
    assert r.returncode == 0 and "x\\x1b[31m.ink" in r.stdout and "\x1b" not in r.stdout


def test_errors_in_a_file_name_it_even_inside_a_directory(tmp_path):
    inshrink.save(tmp_path / "whole.ink", {"w": np.ones((64, 64), np.float32)})
    (tmp_path / "tree" / "sub").mkdir(parents=True)
    (tmp_path / "tree" / "sub" / "cut.ink").write_bytes((tmp_path / "whole.ink").read_bytes()[:300])
    err = one_line_error(run("info", "tree/sub/cut.ink", cwd=tmp_path), 1)
    assert "tree/sub/cut.ink: " in err
    err = one_line_error(run("decompress", "tree", cwd=tmp_path), 1)
    assert "tree/sub/cut.ink: " in err and not (tmp_path / "tree-safetensors").exists()


@given(st.text())
def test_clean_text_is_printable_and_leaves_printable_text_alone(text):
    from inshrink.cli.output import clean
    cleaned = clean(text)
    assert cleaned.isprintable()
    assert (cleaned == text) == text.isprintable()
