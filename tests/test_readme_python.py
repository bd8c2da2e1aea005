"""README.md, "Using it from Python" and "Lossy compression": the Python blocks run as
written, one after the other, in a fresh directory."""
import os
import re

from kit import ROOT


def _blocks(section: str) -> list[str]:
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    start = text.index(section)
    end = text.index("\n#", start + len(section))
    return re.findall(r"```python\n(.*?)```", text[start:end], re.S)


def test_the_first_python_blocks_run_as_written(tmp_path, monkeypatch, capsys):
    """The importance example used a key, "w", that the state above it does not have."""
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    blocks = _blocks("## Using it from Python") + _blocks("### Lossy compression")
    assert len(blocks) == 2
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)
    assert sorted(os.listdir(tmp_path)) == ["ckpt.ink", "step_1000.ink"]
    assert "model.w" in capsys.readouterr().out
