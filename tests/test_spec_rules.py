"""The rule tables of spec/FORMAT.md (section 16: .ink files, 24: array frames, 25: DCP series)
and the reference reader agree both ways: every check the reader makes names a rule of a table,
and every rule of the tables is checked."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from inshrink import errors

ROOT = Path(__file__).resolve().parent.parent
SPEC = (ROOT / "spec" / "FORMAT.md").read_text(encoding="utf-8")
PACKAGE = ROOT / "inshrink"
RULE = re.compile(r"[A-Z]-\d+[a-z]?")
FILE_ERRORS = {name for name in dir(errors)
               if isinstance(getattr(errors, name), type)
               and issubclass(getattr(errors, name), errors.InshrinkError)} - {
    "InshrinkError", "InvalidArgumentError", "TensorNotFoundError", "SeriesLockedError"}
# Raise sites of file errors that are not checks of their own: the index parser's ``_fail``,
# whose callers (scanned) pass the rule, and File.read's allocation of a tensor the system has
# no memory for (section 17 lists it under LimitExceededError).
NOT_RULES = {("index.py", "_fail"), ("file.py", "_allocate")}


def _section(number: int) -> str:
    start = SPEC.index(f"\n## {number}. ")
    end = SPEC.find("\n## ", start + 1)
    return SPEC[start:end if end >= 0 else len(SPEC)]


def spec_rules() -> list[str]:
    """The rules of section 16 (.ink files), 24 (array frames) and 25 (DCP series)."""
    return re.findall(r"^\| (" + RULE.pattern + r") \|",
                      _section(16) + _section(24) + _section(25), re.MULTILINE)


def _reader_sources() -> list[Path]:
    # io/frame.py reads array frames: its checks are the rules of section 24;
    # dcp/series.py reads DCP series manifests and steps, dcp/chunkmap.py chunk maps: section 25
    codecs = list((PACKAGE / "codecs").glob("*.py"))
    return sorted([*(PACKAGE / "container").glob("*.py"), *codecs, *(PACKAGE / "io").glob("*.py"),
                   PACKAGE / "digest.py", PACKAGE / "series" / "links.py",
                   PACKAGE / "dcp" / "series.py",
                   PACKAGE / "dcp" / "chunkmap.py"])


def _text_of(node: ast.AST) -> str:
    """The literal text of a message argument (the constant parts of an f-string)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return ""


def raise_sites() -> list[tuple[str, str, int, str | None]]:
    """(file, function, line, rule id or None) of every check: each raise of a file error
    and each call of the index parser's ``_fail(rule, message)``."""
    sites = []
    for path in _reader_sources():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        functions = {}
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    functions.setdefault(id(node), fn.name)
        for node in ast.walk(tree):
            rule = None
            if (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
                    and isinstance(node.exc.func, ast.Name) and node.exc.func.id in FILE_ERRORS):
                text = _text_of(node.exc.args[0]) if node.exc.args else ""
                found = re.match(r"\[(" + RULE.pattern + r")\] ", text)
                rule = found.group(1) if found else None
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id == "_fail"):
                text = _text_of(node.args[0]) if node.args else ""
                rule = text if RULE.fullmatch(text) else None
            else:
                continue
            sites.append((path.name, functions.get(id(node), "<module>"), node.lineno, rule))
    return sites


def test_the_scan_finds_the_reader_checks():
    sites = raise_sites()
    assert len(sites) > 60
    assert ("index.py", "_parse_chunk") in {(f, fn) for f, fn, _, _ in sites}
    assert ("series.py", "parse_manifest", "M-16") in {(f, fn, r) for f, fn, _, r in sites}
    assert ("chunkmap.py", "_check_cover", "K-9") in {(f, fn, r) for f, fn, _, r in sites}
    assert {"CorruptError", "LimitExceededError", "BaseMismatchError"} <= FILE_ERRORS


def test_every_check_of_the_reader_names_a_rule_of_the_spec():
    rules = set(spec_rules())
    unnamed = [f"{f}:{line} ({fn})" for f, fn, line, rule in raise_sites()
               if rule is None and (f, fn) not in NOT_RULES]
    assert not unnamed, f"raise sites without a [rule] id: {unnamed}"
    unknown = sorted({rule for _, _, _, rule in raise_sites() if rule and rule not in rules})
    assert not unknown, f"rule ids the spec's section 16 does not define: {unknown}"


def test_every_rule_of_the_spec_is_checked_by_the_reader():
    checked = {rule for _, _, _, rule in raise_sites()}
    missing = [rule for rule in spec_rules() if rule not in checked]
    assert not missing, f"rules of section 16 that the reference reader never raises: {missing}"


def test_rule_ids_are_unique_in_the_spec():
    rules = spec_rules()
    assert len(rules) == len(set(rules)) > 40


def _negative_table() -> list[list[str]]:
    text = _section(18)
    table = text[text.index("| vector | base | error | raised by | rule |"):]
    rows = [line.split("|")[1:-1] for line in table.splitlines()[2:] if line.startswith("| `")]
    return [[cell.strip().strip("`") for cell in row] for row in rows]


def test_negative_vectors_in_the_spec_match_the_manifest():
    manifest = json.loads((ROOT / "spec" / "vectors" / "manifest.json").read_text("utf-8"))
    listed = {row[0]: (row[1], row[2], row[3], row[4]) for row in _negative_table()}
    assert listed == {e["name"]: (e["base"], e["error"], e["raised_by"], e["rule"])
                      for e in manifest["negative"]}
    rules = set(spec_rules())
    assert {rule for _, _, _, rule in listed.values()} <= rules
