"""The command line on sharded torch.distributed.checkpoint directories written by inshrink.dcp:
info, verify and consolidate, run in subprocesses."""
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file

import inshrink
from inshrink.dcp.writer import InkStorageWriter
from kit import ROOT, run_cli as run
from test_cli_json import FILE_KEYS, KEYS, TENSOR_KEYS

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def state():
    gen = torch.Generator().manual_seed(0)
    return {"model": {"layer.weight": torch.randn(128, 64, generator=gen),
                      "layer.bias": torch.randn(64, generator=gen).bfloat16()},
            "step": 7}


@pytest.fixture()
def work(tmp_path):
    for name, policy in (("ck", None), ("lossy", "balanced")):
        dcp.save(state(), storage_writer=InkStorageWriter(tmp_path / name, threads=1,
                                                          policy=policy), no_dist=True)
    return tmp_path


def rank_file(directory):
    return next(n for n in os.listdir(directory) if n.startswith("rank"))


def test_info_shows_ranks_files_tensors_and_error(work):
    r = run("info", "lossy", cwd=work)
    assert r.returncode == 0, r.stderr
    assert "torch.distributed.checkpoint, 1 rank file," in r.stdout
    assert rank_file(work / "lossy") in r.stdout
    weight = next(line for line in r.stdout.splitlines() if line.startswith("model.layer.weight"))
    assert "F32" in weight and "[128, 64]" in weight and "quant" in weight
    assert "LOSSY: 1 of 3 tensors quantized" in r.stdout
    assert "BF16" in r.stdout and "(bytes)" in r.stdout  # the step: a non-tensor item

    report = json.loads(run("info", "lossy", "--json", cwd=work).stdout)
    assert set(report) == KEYS and report["ok"] and report["command"] == "info"
    [f] = report["files"]
    assert set(f) == FILE_KEYS | {"rank", "checkpoint"} and f["rank"] == 0
    assert f["checkpoint"] == "lossy" and f["bytes_in"] == os.path.getsize(
        work / "lossy" / rank_file(work / "lossy"))
    assert all(set(t) == TENSOR_KEYS for t in f["tensors"])
    weight = next(t for t in f["tensors"] if t["name"] == "model.layer.weight")
    assert weight["lossy"] and 0 < weight["error"]["rel_l2_error"] == report["max_rel_l2_error"]


def test_verify_checkpoints_and_ink_files(work):
    inshrink.save(work / "plain.ink", {"x": torch.arange(3).numpy()})
    r = run("verify", "ck", "plain.ink", "lossy", cwd=work)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["OK    ck (DCP checkpoint: 1 rank file, 3 chunks)",
                                     "OK    plain.ink (1 tensors)",
                                     "OK    lossy (DCP checkpoint: 1 rank file, 3 chunks)"]
    path = work / "ck" / rank_file(work / "ck")
    data = bytearray(path.read_bytes())
    data[300] ^= 0x10  # inside the weight's records: only decoding finds it
    path.write_bytes(bytes(data))
    assert run("info", "ck", cwd=work).returncode == 0
    r = run("verify", "ck", "lossy", "--json", cwd=work)
    report = json.loads(r.stdout)
    assert r.returncode == 1 and not report["ok"] and len(report["problems"]) == 1
    assert report["problems"][0].startswith("ck: ") and "Error" in report["problems"][0]


def test_incomplete_checkpoint_is_named(work):
    os.unlink(work / "ck" / ".metadata")
    for args in (("info", "ck"), ("consolidate", "ck", "-o", "out.ink")):
        r = run(*args, cwd=work)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert "incomplete checkpoint" in r.stderr and ".metadata is missing" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    r = run("verify", "ck", cwd=work)
    assert r.returncode == 1 and r.stdout.startswith("FAIL  ck: IncompleteCheckpointError: "
                                                     "incomplete checkpoint")
    assert not (work / "out.ink").exists()


def test_a_metadata_file_not_written_by_inshrink_is_refused(work):
    dcp.save(state(), storage_writer=dcp.FileSystemWriter(str(work / "plain")), no_dist=True)
    r = run("info", "plain", cwd=work)
    assert r.returncode == 1 and "not written by InkStorageWriter" in r.stderr, r.stderr


def test_consolidate_to_safetensors_and_ink(work):
    r = run("consolidate", "ck", "-o", "m.safetensors", cwd=work)
    assert r.returncode == 0, r.stderr
    assert "ck -> m.safetensors: 1 rank file, 3 chunks" in r.stdout
    tensors = load_file(work / "m.safetensors")
    for name, value in state()["model"].items():
        assert torch.equal(tensors["model." + name], value)
    assert set(tensors) == {"model.layer.weight", "model.layer.bias"}

    r = run("consolidate", "lossy", "-o", "m.ink", "--json", cwd=work)
    report = json.loads(r.stdout)
    assert r.returncode == 0 and set(report) == KEYS and report["outputs"] == ["m.ink"]
    assert report["lossy"] and report["max_rel_l2_error"] > 0  # the checkpoint's error
    assert report["files"][0]["bytes_out"] == os.path.getsize(work / "m.ink")
    with inshrink.open(work / "m.ink") as f:
        assert "__dcp_bytes__.step" in [i.name for i in f.infos()]


def test_consolidate_output_rules(work):
    (work / "m.safetensors").write_text("original")
    cases = [(("ck", "-o", "m.safetensors"), "--force"),
             (("lossy", "-o", "m.safetensors", "-f"), "--allow-lossy-overwrite"),
             (("ck", "-o", "m.pt"), ".safetensors or .ink"),
             (("missing", "-o", "x.ink"), "no such file"),
             ((".", "-o", "x.ink"), "not a sharded checkpoint")]
    for args, text in cases:
        r = run("consolidate", *args, cwd=work)
        assert r.returncode == 2 and text in r.stderr, (args, r.stderr)
    assert (work / "m.safetensors").read_text() == "original"
    r = run("consolidate", "lossy", "-o", "m.safetensors", "-f", "--allow-lossy-overwrite",
            "-q", cwd=work)
    assert r.returncode == 0 and r.stdout == "", r.stderr
    assert load_file(work / "m.safetensors")["model.layer.weight"].shape == (128, 64)
    assert sorted(n for n in os.listdir(work) if n.startswith(".")) == []


def _rank(rank, world, init, directory):
    """One of two ranks saving a row-sharded weight (a DTensor) and a replicated bias."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        full = state()["model"]
        mesh = init_device_mesh("cpu", (world,))
        sharded = {"layer.weight": distribute_tensor(full["layer.weight"], mesh, [Shard(0)]),
                   "layer.bias": full["layer.bias"]}
        dcp.save({"model": sharded}, storage_writer=InkStorageWriter(directory, threads=1))
    finally:
        dist.destroy_process_group()


def test_two_ranks_info_and_consolidate(tmp_path):
    r = subprocess.run([sys.executable, __file__, str(tmp_path / "ck")], capture_output=True,
                       text=True, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0, r.stderr[-3000:]
    r = run("info", "ck", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "2 rank files" in r.stdout
    assert sorted(line.split()[0] for line in r.stdout.splitlines()[2:4]) == ["0", "1"]
    weight = next(line for line in r.stdout.splitlines() if line.startswith("model.layer.weight"))
    assert weight.split()[1:5] == ["F32", "[128,", "64]", "2"]  # dtype, whole shape, chunks
    r = run("consolidate", "ck", "-o", "m.safetensors", cwd=tmp_path)
    assert r.returncode == 0 and "2 rank files" in r.stdout, r.stderr
    assert torch.equal(load_file(tmp_path / "m.safetensors")["model.layer.weight"],
                       state()["model"]["layer.weight"])



def test_the_names_the_commands_recognise_are_those_a_save_writes(work):
    from inshrink.dcp import names
    written = sorted(os.listdir(work / "ck"))
    assert written[:2] == [names.METADATA, names.CHUNK_MAP] and len(written) == 3
    rank = written[2]
    assert not (names.is_rank_name(names.CHUNK_MAP) or names.is_step_dir(names.CHUNK_MAP))
    assert names.is_chunk_map_temporary(f".{names.CHUNK_MAP}.k2x9a7qz.tmp")
    assert not names.is_rank_name(f".{names.CHUNK_MAP}.k2x9a7qz.tmp")
    assert names.is_rank_file(rank) and names.is_rank_name(rank) and names.rank_of(rank) == 0
    assert names.rank_file_name(0, rank[10:22]) == rank
    delta = names.delta_name(rank)
    assert names.is_delta_file(delta) and not names.is_rank_file(delta)
    assert names.rank_of(delta) == 0 and names.is_rank_name(delta)
    for temporary in (f".{rank}.k2x9a7qz.tmp", f".{delta}.k2x9a7qz.tmp"):
        assert names.is_series_temporary(temporary) and names.is_rank_name(temporary)
    assert names.is_rank_temporary(f".{rank}.k2x9a7qz.tmp")
    assert not names.is_rank_temporary(f".{delta}.k2x9a7qz.tmp")
    assert names.is_series_temporary(f".{names.SERIES_MANIFEST}.k2x9a7qz.tmp")
    assert names.step_of(names.step_dir(42)) == 42 and names.is_step_dir("step_000000000042")
    # whole names only, ASCII digits only, and no answer for what is not a string
    for other in ("x" + rank, rank + "x", rank.replace("0", "\u0660"), "step_42",
                  "step_000000000042/", None, 7, b"step_000000000042"):
        assert not (names.is_rank_file(other) or names.is_rank_name(other)
                    or names.is_step_dir(other)) and names.rank_of(other) is None

def test_help_does_not_import_torch(tmp_path):
    code = ("import sys\nfrom inshrink.cli import main\ntry:\n    main(['--help'])\n"
            "except SystemExit:\n    pass\nassert 'torch' not in sys.modules, 'torch imported'")
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "consolidate" in r.stdout


if __name__ == "__main__":  # the two ranks of test_two_ranks_info_and_consolidate
    import torch.multiprocessing as mp
    warnings.simplefilter("ignore")
    target = sys.argv[1]
    mp.start_processes(_rank, args=(2, f"file://{target}.init", target), nprocs=2,
                       start_method="fork")
