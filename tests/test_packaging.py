"""What ``pip install`` of an extra fetches: the torch the tests run against, not the newest."""
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _torch_requirement(extra: list[str]) -> str:
    found = [r for r in extra if re.match(r"torch\b", r)]
    assert len(found) == 1, extra
    return found[0].replace(" ", "")


def test_every_torch_extra_pins_the_torch_the_dev_extra_tests():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    tested = _torch_requirement(extras["dev"])
    assert re.fullmatch(r"torch==[0-9.]+", tested), tested
    for name in ("torch", "transformers"):
        assert _torch_requirement(extras[name]) == tested, name


def test_the_cpu_wheel_hints_install_the_tested_torch():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    tested = _torch_requirement(extras["dev"])
    for doc in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))):
        for line in doc.read_text().splitlines():
            if "download.pytorch.org" in line:
                assert f"pip install {tested} " in line, f"{doc.name}: {line}"
