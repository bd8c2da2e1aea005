"""The Python blocks of docs/python.md and docs/lossy.md, then those of README.md's examples,
run as written, one after the other, in a fresh directory; the README's commands work."""
import os
import re

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

from kit import ROOT, run_cli as run


def page_blocks(page: str, kind: str = "python") -> list[str]:
    """The ``kind`` code blocks of one page of the repository, in order."""
    text = open(os.path.join(ROOT, page), encoding="utf-8").read()
    return re.findall(rf"```{kind}\n(.*?)```", text, re.S)


def readme_examples(kind: str) -> list[str]:
    """The ``kind`` blocks of README.md's "Examples" section."""
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    start = text.index("## Examples")
    end = text.index("\n## ", start + 1)
    return re.findall(rf"```{kind}\n(.*?)```", text[start:end], re.S)


def run_commands(block: str, cwd) -> None:
    """Run each line of a shell block, an ``inshrink`` command and its comment, in ``cwd``."""
    for line in block.splitlines():
        command = line.split("#")[0].split()
        assert command[0] == "inshrink"
        r = run(*command[1:], cwd=cwd)
        assert r.returncode == 0, (line, r.stderr)


def test_the_first_python_blocks_run_as_written(tmp_path, monkeypatch, capsys):
    """The importance example used a key, "w", that the state above it does not have."""
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    blocks = page_blocks("docs/python.md") + page_blocks("docs/lossy.md")
    assert len(blocks) == 2
    for block in blocks:
        exec(compile(block, "docs", "exec"), namespace)
    assert sorted(os.listdir(tmp_path)) == ["ckpt.ink", "step_1000.ink"]
    assert "model.w" in capsys.readouterr().out


def test_the_readme_examples_without_torch_run_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    blocks = [b for b in readme_examples("python") if "inshrink.torch" not in b]
    assert len(blocks) == 3
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)
    assert "model.w" in capsys.readouterr().out
    assert namespace["series"].steps() == [100, 200, 300] and namespace["problems"] == []
    assert sorted(namespace["state"]) == ["model.w", "optimizer.state.0.exp_avg"]


def test_the_readme_commands_run_as_written(tmp_path):
    rng = np.random.default_rng(0)
    save_file({"w": (rng.standard_normal((256, 64)) * 0.02).astype(ml_dtypes.bfloat16),
               "b": rng.standard_normal(64).astype(np.float32)},
              str(tmp_path / "model.safetensors"))
    (block,) = readme_examples("sh")
    run_commands(block, tmp_path)
    assert (tmp_path / "restored.safetensors").read_bytes() == \
        (tmp_path / "model.safetensors").read_bytes()


def test_the_try_it_command_leaves_no_untracked_file_in_the_checkout():
    # .ci/run takes the command from the README and moves what it writes: the names it moves
    # are those the command writes, and a user running it in a checkout sees none of them
    import fnmatch
    import subprocess
    import sys
    command = subprocess.run([sys.executable, ".ci/readme_command.py", "try"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
    written = sorted(set(re.findall(r"[\w.-]+\.(?:safetensors|ink)\b", command)))
    assert written == ["restored.safetensors", "tiny.ink", "tiny.safetensors"], command
    moved = re.search(r"mv ((?:[\w.-]+ )+)\"\$scratch\"",
                      open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read())
    assert moved and sorted(moved.group(1).split()) == written
    ignored = [line.strip() for line in open(os.path.join(ROOT, ".gitignore"),
                                             encoding="utf-8")
               if line.strip() and not line.startswith("#")]
    for name in written:
        assert any(fnmatch.fnmatch(name, pattern.lstrip("/")) for pattern in ignored), name
