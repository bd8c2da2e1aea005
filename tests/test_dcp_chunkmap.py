"""The chunk map of sharded checkpoints (inshrink.dcp.chunkmap, spec/FORMAT.md 25.1.3): written
by 1, 2 and 3 ranks and by a DCP series, reassembled without torch bit for bit as torch loads
it, crash orders between the map and the commit marker, corrupt maps, the vectors of
spec/vectors/dcp, checkpoints without a map, and ``inshrink consolidate`` with torch unimportable.

The multi-rank saves run this file as a script (tests/helpers.py forks the ranks)."""
import base64
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

import inshrink
from inshrink import errors
from inshrink.dcp import chunkmap
from inshrink.dcp.consolidation import consolidate
from inshrink.dcp.reader import InkStorageReader
from inshrink.dcp.writer import InkStorageWriter
from helpers import run_scenario, scenario_main
from kit import ROOT

HERE = os.path.abspath(__file__)
VECTORS = os.path.join(ROOT, "spec", "vectors", "dcp")
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _generator():
    spec = importlib.util.spec_from_file_location(
        "make_dcp_vectors", os.path.join(VECTORS, "make_dcp_vectors.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


make_dcp_vectors = _generator()
MANIFEST = json.loads(open(os.path.join(VECTORS, "manifest.json"), encoding="utf-8").read())


def save(state, path):
    dcp.save(state, storage_writer=InkStorageWriter(path, threads=1), no_dist=True)


def torch_load(path):
    """Every tensor of the checkpoint, whole, as ``dcp.load`` gives it in one process."""
    layout = chunkmap.read_chunk_map(path, check_files=False)
    state = {i.fqn: torch.zeros(i.shape, dtype=_TORCH[i.dtype]) for i in layout.items
             if isinstance(i, chunkmap.TensorItem)}
    dcp.load(state, storage_reader=InkStorageReader(path, threads=1), no_dist=True)
    return state


_TORCH = {"F32": torch.float32, "BF16": torch.bfloat16, "F64": torch.float64,
          "I64": torch.int64, "F16": torch.float16, "U8": torch.uint8, "BOOL": torch.bool}


def assert_bit_identical(arrays, tensors):
    assert sorted(arrays) == sorted(tensors)
    for fqn, array in arrays.items():
        tensor = tensors[fqn]
        assert tuple(array.shape) == tuple(tensor.shape), fqn
        expected = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        assert array.tobytes() == expected, fqn


# -- the ranks (run as a script) ---------------------------------------------------------------

def _save(rank, world, directory):
    make_dcp_vectors.save_rank(rank, world, os.path.join(directory, f"w{world}"))


def _series(rank, world, directory):
    from inshrink.dcp.series import InkSeries
    series = InkSeries(os.path.join(directory, "series"), threads=1)
    for step in (1, 2):
        dcp.save(make_dcp_vectors.saved_state(world), storage_writer=series.writer(step))


SCENARIOS = {"ranks": ((1, _save), (2, _save), (3, _save), (2, _series))}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    directory = tmp_path_factory.mktemp("ranks")
    run_scenario(HERE, "ranks", directory, 180)
    return directory


@pytest.mark.parametrize("world", [1, 2, 3])
def test_the_map_is_written_by_every_world_size_and_reassembles_as_torch_loads(saved, world):
    path = saved / f"w{world}"
    layout = chunkmap.read_chunk_map(path)
    assert len(layout.files) == world
    rows = next(i for i in layout.items if i.fqn == "model.w")
    assert rows.dtype == "F32" and rows.shape == (7, 4)
    # row-sharded, unevenly for 2 and 3 ranks; column-sharded; whole
    assert [c.offsets[0] for c in rows.chunks] == {1: [0], 2: [0, 4], 3: [0, 3, 6]}[world]
    columns = next(i for i in layout.items if i.fqn == "model.c")
    assert [c.offsets[1] for c in columns.chunks] == {1: [0], 2: [0, 3], 3: [0, 2, 4]}[world]
    assert len({c.file for c in rows.chunks}) == world
    assert_bit_identical(chunkmap.assemble(path, threads=1), torch_load(path))
    assert chunkmap.values(path) == {"step": 7, "lr": 0.25, "name": "run-1", "flag": False,
                                     "nothing": None, "blob": b"\x00\xffink"}
    opaque = next(i for i in layout.items if i.fqn == "milestones")
    assert opaque.kind == "opaque" and opaque.tensor == "__dcp_bytes__.milestones"
    # its torch.save bytes are where the map says
    with inshrink.open(path / opaque.file) as f:
        raw = f[opaque.tensor].tobytes()
    import io
    assert torch.load(io.BytesIO(raw), weights_only=True) == (1, 2)


def test_consolidation_reads_the_map_as_it_read_the_metadata(saved, tmp_path):
    path = tmp_path / "w3"
    shutil.copytree(saved / "w3", path)
    consolidate(path, tmp_path / "from_map.ink", threads=1)
    (path / "chunks.json").unlink()
    consolidate(path, tmp_path / "from_metadata.ink", threads=1)
    assert (tmp_path / "from_map.ink").read_bytes() == (tmp_path / "from_metadata.ink").read_bytes()


def test_series_steps_have_maps_naming_the_logical_rank_files(saved):
    from inshrink.dcp.series import InkSeries
    series = InkSeries(saved / "series", threads=1)
    older, newer = series.checkpoints()
    assert older.base == 2 and newer.base is None  # the older step is stored as deltas
    for entry in (older, newer):
        path = saved / "series" / entry.dir
        layout = chunkmap.read_chunk_map(path, check_files=entry.keyframe)
        assert layout.files == sorted(f.name for f in entry.files)  # as .metadata names them
    with pytest.raises(errors.CorruptError, match=r"^\[K-12\] .*rank00000-.*\.ink: missing"):
        chunkmap.read_chunk_map(saved / "series" / older.dir)  # only its .d.ink files are there
    assert_bit_identical(chunkmap.assemble(saved / "series" / newer.dir, threads=1),
                         torch_load(saved / "series" / newer.dir))


def test_a_series_step_whose_map_names_other_files_is_refused(saved, tmp_path):
    from inshrink.dcp.series import InkSeries
    shutil.copytree(saved / "series", tmp_path / "series")
    series = InkSeries(tmp_path / "series", threads=1)
    older = series.checkpoints()[0]
    path = tmp_path / "series" / older.dir / "chunks.json"
    doc = json.loads(path.read_bytes())
    doc["items"][0]["chunks"][0]["file"] = "rank00005-" + doc["save_id"] + ".ink"
    path.write_text(json.dumps(doc))
    with pytest.raises(errors.CorruptError, match=r"^\[M-17\] .*rank00005-.*chunks\.json and "
                                                  r"the series manifest disagree"):
        series.describe(older.step)


# -- crash orders ------------------------------------------------------------------------------

def _crash_between_map_and_commit(monkeypatch, path, state):
    import inshrink.dcp.writer as writer

    def dump(*args, **kwargs):
        raise OSError(28, "killed before the commit")
    monkeypatch.setattr(writer.pickle, "dump", dump)
    with pytest.raises(CheckpointException):
        save(state, path)
    monkeypatch.undo()


def test_a_new_map_beside_the_previous_commit_marker_is_not_used(tmp_path, monkeypatch):
    path = tmp_path / "ckpt"
    save({"w": torch.ones(4, 2), "step": 1}, path)
    first = chunkmap.read_chunk_map(path)
    _crash_between_map_and_commit(monkeypatch, path, {"w": torch.full((4, 2), 2.0), "step": 2})
    # the new map is in place, its save never committed: .metadata still is the first save's
    assert chunkmap.decode((path / "chunks.json").read_bytes()).save_id != first.save_id
    with pytest.raises(errors.IncompleteCheckpointError, match=r"^\[K-11\] .*did not commit"):
        chunkmap.read_chunk_map(path)
    assert chunkmap.find_chunk_map(path) is None
    # the committed checkpoint reads through .metadata: the first save
    consolidate(path, tmp_path / "full.ink", threads=1)
    with inshrink.open(tmp_path / "full.ink") as f:
        assert (f["w"] == 1).all()
    state = {"w": torch.zeros(4, 2)}
    dcp.load(state, storage_reader=InkStorageReader(path, threads=1), no_dist=True)
    assert (state["w"] == 1).all()
    # the next save that commits writes its own map again
    save({"w": torch.full((4, 2), 3.0), "step": 3}, path)
    assert (chunkmap.assemble(path)["w"] == 3).all() and chunkmap.values(path) == {"step": 3}
    assert not [n for n in os.listdir(path) if n.endswith(".tmp")]


def test_a_first_save_killed_before_its_commit_is_incomplete(tmp_path, monkeypatch):
    path = tmp_path / "ckpt"
    _crash_between_map_and_commit(monkeypatch, path, {"w": torch.ones(3)})
    assert (path / "chunks.json").exists()
    for call in (chunkmap.read_chunk_map, chunkmap.find_chunk_map, chunkmap.assemble):
        with pytest.raises(errors.IncompleteCheckpointError, match=r"^\[K-11\] .*\.metadata"):
            call(path)
    with pytest.raises(errors.IncompleteCheckpointError):
        consolidate(path, tmp_path / "full.ink")


def test_a_save_killed_before_its_map_leaves_the_previous_one(tmp_path, monkeypatch):
    import inshrink.dcp.writer as writer
    path = tmp_path / "ckpt"
    save({"w": torch.ones(2)}, path)

    def fail(*args):
        raise OSError(28, "killed before the map")
    monkeypatch.setattr(writer, "write_chunk_map", fail)
    with pytest.raises(CheckpointException):
        save({"w": torch.zeros(2)}, path)
    assert (chunkmap.assemble(path)["w"] == 1).all()


def test_a_layout_beyond_the_limits_gets_no_map_and_reads_through_metadata(tmp_path,
                                                                            monkeypatch):
    import inshrink.dcp.writer as writer
    path = tmp_path / "ckpt"
    save({"w": torch.ones(2)}, path)
    warned = []
    monkeypatch.setattr(chunkmap, "MAX_CHUNK_MAP_BYTES", 100)
    monkeypatch.setattr(writer._LOG, "warning", lambda *args: warned.append(args[0] % args[1:]))
    save({"w": torch.zeros(2), "x": torch.ones(3)}, path)
    assert not (path / "chunks.json").exists()
    assert len(warned) == 1 and "no chunk map" in warned[0] and "[K-1]" in warned[0]
    monkeypatch.undo()
    assert chunkmap.find_chunk_map(path) is None
    consolidate(path, tmp_path / "full.ink", threads=1)
    with inshrink.open(tmp_path / "full.ink") as f:
        assert (f["w"] == 0).all() and f.keys() == ["w", "x"]


# -- corrupt maps and the vectors --------------------------------------------------------------

def test_the_vectors_regenerate_byte_for_byte(tmp_path):
    make_dcp_vectors.main(str(tmp_path))
    for root, _, names in os.walk(VECTORS):
        for name in names:
            if name.endswith(".py"):
                continue
            mine = os.path.join(root, name)
            other = os.path.join(tmp_path, os.path.relpath(mine, VECTORS))
            assert open(other, "rb").read() == open(mine, "rb").read(), mine
    listed = {e["expected"] for e in MANIFEST["positive"]} | {
        e["directory"] for e in MANIFEST["positive"]} | {e["file"] for e in MANIFEST["negative"]}
    assert set(os.listdir(VECTORS)) == listed | {"manifest.json", "make_dcp_vectors.py"}


@pytest.mark.parametrize("entry", MANIFEST["positive"], ids=lambda e: e["name"])
def test_positive_vectors_decode_without_torch_as_expected(entry):
    path = os.path.join(VECTORS, entry["directory"])
    expected = json.loads(open(os.path.join(VECTORS, entry["expected"])).read())
    layout = chunkmap.read_chunk_map(path)
    assert layout.save_id == entry["save_id"] and len(layout.files) == entry["world_size"]
    arrays = chunkmap.assemble(path, threads=1)
    assert sorted(arrays) == sorted(expected["tensors"])
    for fqn, array in arrays.items():
        want = expected["tensors"][fqn]
        assert list(array.shape) == want["shape"] and array.tobytes().hex() == want["hex"]
        assert hashlib.sha256(array.tobytes()).hexdigest() == want["sha256"]
    values = {i.fqn: i for i in layout.items if isinstance(i, chunkmap.ValueItem)}
    for fqn, want in expected["values"].items():
        value = values[fqn].value
        if values[fqn].type == "bytes":
            value = base64.b64encode(value).decode()
        assert (values[fqn].kind, values[fqn].type, value) == (want["kind"], want["type"],
                                                               want["value"])
    assert_bit_identical(arrays, torch_load(path))


@pytest.mark.parametrize("entry", MANIFEST["negative"], ids=lambda e: e["name"])
def test_negative_vectors_fail_with_their_rule(entry, tmp_path):
    path = tmp_path / entry["base"]
    shutil.copytree(os.path.join(VECTORS, entry["base"]), path)
    patched = open(os.path.join(VECTORS, entry["file"]), "rb").read()
    vector = next(v for v in make_dcp_vectors.NEGATIVE if v.name == entry["name"])
    base = (path / "chunks.json").read_bytes()
    assert make_dcp_vectors.negative_bytes(vector, base) == patched
    (path / "chunks.json").write_bytes(patched)
    with pytest.raises(errors.InshrinkError) as caught:
        chunkmap.assemble(path, threads=1)
    assert type(caught.value) is getattr(errors, entry["error"]), caught.value
    assert str(caught.value).startswith(f"[{entry['rule']}] "), caught.value


def test_the_negative_vectors_cover_every_rule_of_the_chunk_map():
    spec = open(os.path.join(ROOT, "spec", "FORMAT.md"), encoding="utf-8").read()
    rules = {line.split("|")[1].strip() for line in spec.splitlines()
             if line.startswith("| K-")}
    assert {e["rule"] for e in MANIFEST["negative"]} == rules


@pytest.mark.parametrize("patch, error, rule", [
    (lambda d: d.update(save_id="5EED0000C0DE"), errors.CorruptError, "K-4"),
    (lambda d: d["items"].append({"fqn": "__dcp_bytes__.x", "kind": "opaque",
                                  "file": "rank00000-5eed0000c0de.ink", "tensor": "t"}),
     errors.CorruptError, "K-5"),
    (lambda d: d["items"][0].update(shape=[1] * 33), errors.LimitExceededError, "K-6"),
    (lambda d: d["items"][0].update(shape=[1 << 40, 1 << 20]), errors.LimitExceededError,
     "K-6"),
    (lambda d: d["items"][0]["chunks"][0].update(sizes=[4, True]), errors.CorruptError, "K-7"),
    (lambda d: d["items"][1]["chunks"][0].update(tensor="model.w", file=d["items"][0][
        "chunks"][0]["file"]), errors.CorruptError, "K-8"),
    (lambda d: d["items"][4].update(value=1 << 63), errors.CorruptError, "K-10"),
    (lambda d: d["items"][9].update(value="AP9pbms"), errors.CorruptError, "K-10"),
    (lambda d: d["items"][6].update(value="\ud800"), errors.CorruptError, "K-10"),
])
def test_corrupt_maps_are_typed_errors(patch, error, rule):
    doc = json.loads(open(os.path.join(VECTORS, "ranks2", "chunks.json"), "rb").read())
    patch(doc)
    with pytest.raises(errors.InshrinkError) as caught:
        chunkmap.decode(json.dumps(doc).encode())
    assert type(caught.value) is error and str(caught.value).startswith(f"[{rule}] ")


def _tensor_map(shape, boxes):
    file = "rank00000-000000000000.ink"
    return json.dumps({"format": "inshrink-dcp-chunks", "version": 1, "save_id": "0" * 12,
                       "items": [{"fqn": "t", "kind": "tensor", "dtype": "U8", "shape": shape,
                                  "chunks": [{"offsets": o, "sizes": n, "file": file,
                                              "tensor": f"t#{k}"}
                                             for k, (o, n) in enumerate(boxes)]}]}).encode()


def test_the_coverage_check_is_exact_and_bounded(monkeypatch):
    # each row split at another column: 400 chunks cut the tensor into 200 x 201 cells
    n = 200
    boxes = [b for i in range(n) for b in (([i, 0], [1, i + 1]), ([i, i + 1], [1, n - i]))]
    assert chunkmap.decode(_tensor_map([n, n + 1], boxes)).chunk_count == 2 * n
    monkeypatch.setattr(chunkmap, "MAX_GRID_CELLS", 0)  # beyond 64 x 400 cells: refused
    with pytest.raises(errors.LimitExceededError, match=r"^\[K-9\] .*cells"):
        chunkmap.decode(_tensor_map([n, n + 1], boxes))
    monkeypatch.undo()
    # as many elements as the tensor, but one overlap and one gap
    with pytest.raises(errors.CorruptError, match=r"^\[K-9\] .*overlaps another"):
        chunkmap.decode(_tensor_map([2, 2], [([0, 0], [1, 2]), ([0, 1], [1, 1]),
                                             ([1, 1], [1, 1])]))
    # empty and 0-d tensors
    assert chunkmap.decode(_tensor_map([0, 3], [])).chunk_count == 0
    assert chunkmap.decode(_tensor_map([], [([], [])])).chunk_count == 1
    with pytest.raises(errors.CorruptError, match=r"^\[K-9\] "):
        chunkmap.decode(_tensor_map([], []))


def test_a_rank_file_of_another_save_is_refused(tmp_path):
    path = tmp_path / "ranks2"
    shutil.copytree(os.path.join(VECTORS, "ranks2"), path)
    name = "rank00001-5eed0000c0de.ink"
    with inshrink.open(path / name) as f:
        arrays = f.load()
    inshrink.save(path / name, arrays, metadata={"dcp.rank": "1", "dcp.save_id": "0" * 12})
    with pytest.raises(errors.CorruptError, match=r"^\[K-12\] .*says save '000000000000'"):
        chunkmap.read_chunk_map(path)


def test_the_spec_example_is_a_valid_chunk_map():
    spec = open(os.path.join(ROOT, "spec", "FORMAT.md"), encoding="utf-8").read()
    text = spec[spec.index("#### 25.1.3"):]
    example = text[text.index("```json\n") + 8:]
    layout = chunkmap.decode(example[:example.index("```")].encode())
    assert layout.save_id == "5eed0000c0de" and layout.chunk_count == 3


# -- checkpoints without a map, and no torch ---------------------------------------------------

def test_a_checkpoint_without_a_map_still_loads_and_consolidates(tmp_path):
    path = tmp_path / "ckpt"
    save({"w": torch.arange(6.0).reshape(2, 3), "step": 4}, path)
    (path / "chunks.json").unlink()  # as an older inshrink wrote it
    assert chunkmap.find_chunk_map(path) is None
    with pytest.raises(errors.CorruptError, match=r"^\[K-1\] .*no chunk map"):
        chunkmap.read_chunk_map(path)
    state = {"w": torch.zeros(2, 3), "step": 0}
    dcp.load(state, storage_reader=InkStorageReader(path, threads=1), no_dist=True)
    assert state["step"] == 4 and torch.equal(state["w"], torch.arange(6.0).reshape(2, 3))
    consolidate(path, tmp_path / "full.ink", threads=1)
    with inshrink.open(tmp_path / "full.ink") as f:
        assert np.array_equal(f["w"], np.arange(6.0, dtype=np.float32).reshape(2, 3))


NO_TORCH = ("import sys\nsys.modules['torch'] = None  # import torch fails\n"
            "from inshrink.cli import main\n"
            "code = main(sys.argv[1:])\n"
            "assert sys.modules.get('torch') is None, 'torch imported'\n"
            "sys.exit(code)\n")


def _no_torch(*args, cwd):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-c", NO_TORCH, *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=120)


def test_consolidate_works_without_torch_where_the_map_is(tmp_path):
    shutil.copytree(os.path.join(VECTORS, "ranks3"), tmp_path / "ck")
    r = _no_torch("consolidate", "ck", "-o", "full.ink", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "3 rank files, 15 chunks" in r.stdout
    consolidate(tmp_path / "ck", tmp_path / "with_torch.ink", threads=1)
    assert (tmp_path / "full.ink").read_bytes() == (tmp_path / "with_torch.ink").read_bytes()
    r = _no_torch("consolidate", "ck", "-o", "full.safetensors", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    from safetensors.numpy import load_file
    joined = load_file(tmp_path / "full.safetensors")
    assert np.array_equal(joined["model.b"], np.arange(-2, 3))
    # a checkpoint without a map needs torch, and says so
    (tmp_path / "ck" / "chunks.json").unlink()
    r = _no_torch("consolidate", "ck", "-o", "again.ink", cwd=tmp_path)
    assert r.returncode == 2 and "no chunk map" in r.stderr and "needs torch" in r.stderr
    assert not (tmp_path / "again.ink").exists()


def test_the_reader_module_imports_without_torch():
    code = ("import sys\nsys.modules['torch'] = None\n"
            "import inshrink.dcp.chunkmap, inshrink.dcp.consolidation, inshrink.dcp.names\n")
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ,
                                                                        PYTHONPATH=ROOT))


if __name__ == "__main__":
    scenario_main(SCENARIOS)
