"""Conformance of the reader and writer against the committed test vectors (spec/vectors/)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

import inshrink
from inshrink import digest, errors
from inshrink.safetensors import decompress_to_safetensors
from kit import check_vector, decoded_base, problem_class

VECTORS = Path(__file__).resolve().parent.parent / "spec" / "vectors"
MANIFEST = json.loads((VECTORS / "manifest.json").read_text(encoding="utf-8"))
POSITIVE = MANIFEST["positive"]
NEGATIVE = MANIFEST["negative"]


def _load_generator():
    spec = importlib.util.spec_from_file_location("make_vectors", VECTORS / "make_vectors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_vectors = _load_generator()


def _ids(entries):
    return [e["name"] for e in entries]


def test_manifest_lists_every_file():
    listed = {e["file"] for e in POSITIVE + NEGATIVE}
    listed |= {e["expected"] for e in POSITIVE}
    listed |= set(MANIFEST["extra_files"]) | {"manifest.json", "make_vectors.py"}
    present = {p.name for p in VECTORS.iterdir() if p.is_file()}
    assert present == listed
    assert _ids(POSITIVE) == [v.name for v in make_vectors.POSITIVE]
    assert _ids(NEGATIVE) == [v.name for v in make_vectors.NEGATIVE]


def test_vectors_are_small():
    assert sum(p.stat().st_size for p in VECTORS.iterdir()
               if p.suffix in (".ink", ".json", ".safetensors", ".md")) < 350_000


@pytest.mark.parametrize("entry", POSITIVE, ids=_ids(POSITIVE))
def test_positive_decodes_bit_exactly(entry):
    assert MANIFEST["format_version"] == "1.5"
    check_vector(VECTORS / entry["file"])


@pytest.mark.parametrize("entry", POSITIVE, ids=_ids(POSITIVE))
def test_positive_regenerates_byte_for_byte(entry, tmp_path):
    vector = next(v for v in make_vectors.POSITIVE if v.name == entry["name"])
    path, expected = make_vectors.build_positive(vector, tmp_path)
    committed = (VECTORS / entry["file"]).read_bytes()
    regenerated = path.read_bytes()
    if regenerated != committed and make_vectors.ZSTD_VERSION != MANIFEST["generator"]["zstd"]:
        pytest.skip(f"zstd {make_vectors.ZSTD_VERSION} here, vectors made with "
                    f"{MANIFEST['generator']['zstd']}: compressed bytes may legitimately differ")
    assert regenerated == committed
    committed_expected = json.loads((VECTORS / entry["expected"]).read_text(encoding="utf-8"))
    assert expected == committed_expected


@pytest.mark.parametrize("entry", NEGATIVE, ids=_ids(NEGATIVE))
def test_negative_regenerates_byte_for_byte(entry):
    vector = next(v for v in make_vectors.NEGATIVE if v.name == entry["name"])
    base = (VECTORS / f"{vector.base}.ink").read_bytes()
    assert vector.patch(base) == (VECTORS / entry["file"]).read_bytes()


@pytest.mark.parametrize("entry", NEGATIVE, ids=_ids(NEGATIVE))
def test_negative_raises_exact_error(entry):
    expected = getattr(errors, entry["error"])
    stage = "open"
    with pytest.raises(errors.InshrinkError) as caught:
        with inshrink.File(VECTORS / entry["file"], threads=1) as f:
            stage = "read"
            problems = f.verify()
            assert problems, entry["name"]  # each one names its tensor and the error class
            assert all(p.startswith("tensor ") for p in problems), problems
            assert expected in {problem_class(p) for p in problems}, (entry["name"], problems)
            f.load()
    assert type(caught.value) is expected, (entry["name"], caught.value)
    assert stage == entry["raised_by"], (entry["name"], caught.value)
    # the reference reader names the rule that failed first in its message
    assert str(caught.value).startswith(f"[{entry['rule']}] "), (entry["name"], caught.value)


@pytest.mark.parametrize("entry", [e for e in POSITIVE if "base" in e],
                         ids=[e["name"] for e in POSITIVE if "base" in e])
def test_delta_vector_names_its_base_by_decode_digest(entry):
    """base.sha256 of every delta vector is its base vector's decode digest, by the definition
    its base object names (absent: 1), and by no other definition."""
    with inshrink.open(VECTORS / entry["file"]) as f:
        base = f.base
    assert base["file"] == entry["base"]
    version = base.get("digest", 1)
    exact, codes = decoded_base(VECTORS / entry["base"])
    for other in digest.VERSIONS:
        assert (digest.decode_digest(exact, codes, other) == base["sha256"]) == (other == version)


def test_digest2_vector_covers_what_the_spec_promises():
    with inshrink.open(VECTORS / "digest2_base.ink") as f:
        dtypes_ = {i.dtype for i in f.infos()}
        shapes = {i.shape for i in f.infos()}
        quantized = [i.name for i in f.infos() if i.quantized]
    assert {"BF16", "F8_E4M3", "F32"} <= dtypes_ and () in shapes and quantized
    with inshrink.open(VECTORS / "digest2.ink") as f:
        assert f.format_version == "1.5" and f.base["digest"] == 2


def test_hexdump_is_current():
    text = make_vectors.hexdump_markdown((VECTORS / "minimal.ink").read_bytes())
    assert (VECTORS / "minimal.hexdump.md").read_text(encoding="utf-8") == text


def test_manifest_is_current():
    assert make_vectors.manifest()["positive"] == POSITIVE
    assert make_vectors.manifest()["negative"] == NEGATIVE


def test_safetensors_round_trip_is_byte_identical(tmp_path):
    out = tmp_path / "back.safetensors"
    decompress_to_safetensors(VECTORS / "safetensors.ink", out, threads=1)
    original = (VECTORS / "safetensors.safetensors").read_bytes()
    assert out.read_bytes() == original
    assert original == make_vectors.safetensors_bytes()[0]


# --- golden vectors of every released format version, frozen ---------------------------------

GOLDEN = sorted((p for p in VECTORS.glob("v1.*") if p.is_dir()),
                key=lambda p: int(p.name.split(".")[1]))  # v1.10 after v1.9
GOLDEN_POSITIVE = [(d, e) for d in GOLDEN
                   for e in json.loads((d / "manifest.json").read_text("utf-8"))["positive"]]


def test_every_released_format_version_is_frozen():
    major, current = MANIFEST["format_version"].split(".")
    assert [d.name for d in GOLDEN] == [f"v{major}.{m}" for m in range(int(current) + 1)]
    for folder in GOLDEN:
        doc = json.loads((folder / "manifest.json").read_text("utf-8"))
        listed = {e["file"] for e in doc["positive"]} | {e["expected"] for e in doc["positive"]}
        assert {p.name for p in folder.iterdir()} == listed | {"manifest.json"}
        assert doc["frozen_from"].startswith("git ")


@pytest.mark.parametrize("folder, entry", GOLDEN_POSITIVE,
                         ids=[f"{d.name}/{e['name']}" for d, e in GOLDEN_POSITIVE])
def test_frozen_vector_decodes_with_the_current_reader(folder, entry):
    """A file written to any earlier format version reads bit-exactly today (section 14)."""
    doc = json.loads((folder / "manifest.json").read_text("utf-8"))
    assert doc["format_version"] == folder.name[1:]
    check_vector(folder / entry["file"])


def test_the_current_version_is_frozen_as_generated():
    """v<current>/ holds exactly what the generator makes today (until the version moves on,
    when it stays as it was)."""
    frozen = VECTORS / f"v{MANIFEST['format_version']}"
    doc = json.loads((frozen / "manifest.json").read_text("utf-8"))
    assert doc["positive"] == POSITIVE
    for entry in POSITIVE:
        for name in (entry["file"], entry["expected"]):
            assert (frozen / name).read_bytes() == (VECTORS / name).read_bytes(), name


# --- array frames (section 24) ----------------------------------------------------------------

ARRAY = VECTORS / "array"
ARRAY_MANIFEST = json.loads((ARRAY / "manifest.json").read_text(encoding="utf-8"))


def _array_table() -> dict:
    spec = (VECTORS.parent / "FORMAT.md").read_text(encoding="utf-8")
    start = spec.index("### 24.6")
    end = spec.find("\n## ", start)  # the next section's tables are not this one's
    text = spec[start:end if end >= 0 else len(spec)]
    table = text[text.index("| vector | base | error | rule |"):]
    rows = [[c.strip().strip("`") for c in line.split("|")[1:-1]]
            for line in table.splitlines()[2:] if line.startswith("| `")]
    return {r[0]: (r[1], r[2], r[3]) for r in rows}


def test_array_manifest_is_current_and_lists_every_file():
    assert make_vectors.array_manifest() == ARRAY_MANIFEST
    listed = {e["file"] for e in ARRAY_MANIFEST["positive"] + ARRAY_MANIFEST["negative"]}
    listed |= {e["expected"] for e in ARRAY_MANIFEST["positive"]} | {"manifest.json"}
    assert {p.name for p in ARRAY.iterdir()} == listed
    assert _array_table() == {e["name"]: (e["base"], e["error"], e["rule"])
                              for e in ARRAY_MANIFEST["negative"]}


@pytest.mark.parametrize("entry", ARRAY_MANIFEST["positive"],
                         ids=_ids(ARRAY_MANIFEST["positive"]))
def test_array_positive_decodes_and_regenerates(entry):
    check_vector(ARRAY / entry["file"])
    data = (ARRAY / entry["file"]).read_bytes()
    expected = json.loads((ARRAY / entry["expected"]).read_text(encoding="utf-8"))
    vector = next(v for v in make_vectors.ARRAY_POSITIVE if v.name == entry["name"])
    regenerated, again = make_vectors.build_array_positive(vector)
    assert again == expected
    if make_vectors.ZSTD_VERSION == ARRAY_MANIFEST["generator"]["zstd"]:
        assert regenerated == data


@pytest.mark.parametrize("entry", ARRAY_MANIFEST["negative"],
                         ids=_ids(ARRAY_MANIFEST["negative"]))
def test_array_negative_raises_exact_error(entry):
    from inshrink.io import frame

    vector = next(v for v in make_vectors.ARRAY_NEGATIVE if v.name == entry["name"])
    data = (ARRAY / entry["file"]).read_bytes()
    assert vector.patch((ARRAY / f"{vector.base}.inka").read_bytes()) == data
    with pytest.raises(errors.InshrinkError) as caught:
        frame.decode(data)
    assert type(caught.value) is getattr(errors, entry["error"]), caught.value
    assert str(caught.value).startswith(f"[{entry['rule']}] "), caught.value


def test_the_array_frame_example_of_the_spec_is_the_scalar_vector():
    spec = (VECTORS.parent / "FORMAT.md").read_text(encoding="utf-8")
    example = spec[spec.index("### 24.7 Example"):]
    data = (ARRAY / "scalar.inka").read_bytes()
    length = int.from_bytes(data[5:9], "little")
    assert f"({len(data)} bytes)" in example and f"header_length {length}" in example
    for part in (data[:4], data[4:5], data[5:9], data[9 + length:]):
        assert f"\n{part.hex(' ').upper()} " in example
    header = "".join(line.split("(")[0].strip() for line in
                     example[example.index('{"dtype"'):example.index("(211 bytes")].splitlines())
    assert header.replace(" ", "") == data[9:9 + length].decode()
