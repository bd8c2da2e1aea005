"""Generate the sharded-checkpoint vectors of spec/FORMAT.md section 25.1.3 (chunk maps).

    PYTHONPATH=. python spec/vectors/dcp/make_dcp_vectors.py

Each positive vector is a checkpoint directory written by ``dcp.save`` with ``world`` ranks
(gloo on CPU, forked), through :class:`inshrink.dcp.InkStorageWriter` with a fixed save id
and checkpoint id so that it regenerates byte for byte; ``NAME.expected.json`` holds every
whole tensor's bytes and every typed value. Each negative vector is a ``chunks.json`` that
replaces its base vector's and fails with the listed rule. Needs torch (the vectors are read
without it).
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
SAVE_IDS = {2: "5eed0000c0de", 3: "5eed0000c0df"}
POSITIVE = [("ranks2", 2), ("ranks3", 3)]


def saved_state(world: int) -> dict:
    """What every rank saves: row- and column-sharded tensors (uneven over 2 and 3 ranks),
    a replicated tensor, a 0-d tensor, plain values and an opaque one."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (world,))
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(7, 4, generator=gen)
    rows[0, :4] = torch.tensor([0.0, -0.0, float("nan"), float("inf")])
    columns = torch.randn(3, 5, generator=gen).bfloat16()
    return {"model": {"w": distribute_tensor(rows, mesh, [Shard(0)]),
                      "c": distribute_tensor(columns, mesh, [Shard(1)]),
                      "b": torch.arange(-2, 3, dtype=torch.int64),
                      "s": torch.tensor(2.5, dtype=torch.float64)},
            "step": 7, "lr": 0.25, "name": "run-1", "flag": False, "nothing": None,
            "blob": b"\x00\xffink", "milestones": (1, 2)}


def save_rank(rank: int, world: int, directory: str, save_id: str | None = None) -> None:
    """A rank's part of one ``dcp.save`` of :func:`saved_state` into ``directory``; with
    ``save_id``, that id and a relative checkpoint id (reproducible bytes)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import StorageMeta

    from inshrink.dcp.writer import InkStorageWriter

    class Fixed(InkStorageWriter):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.save_id = save_id

        def reset(self, checkpoint_id=None):
            super().reset(checkpoint_id)
            self.save_id = save_id

        def storage_meta(self):
            return StorageMeta(checkpoint_id=os.path.basename(self.path), save_id=save_id)

    writer = (Fixed if save_id else InkStorageWriter)(directory, threads=1)
    dcp.save(saved_state(world), storage_writer=writer)


def run_ranks(world: int, fn: Callable, *args) -> None:
    """Fork ``world`` ranks in a gloo group, each calling ``fn(rank, world, *args)``."""
    import torch.multiprocessing as mp
    init = tempfile.mkdtemp(prefix="inshrink-init-")
    try:
        mp.start_processes(_rank_main, args=(world, f"file://{init}/init", fn, args),
                           nprocs=world, start_method="fork", join=True)
    finally:
        shutil.rmtree(init, ignore_errors=True)


def _rank_main(rank: int, world: int, init: str, fn: Callable, args: tuple) -> None:
    import warnings
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def expected(directory: str) -> dict:
    """What a reader must find: every whole tensor's bytes, every typed value."""
    from inshrink.dcp import chunkmap
    tensors = {}
    for fqn, array in chunkmap.iter_assembled(directory, threads=1):
        raw = array.tobytes()
        tensors[fqn] = {"dtype": next(i.dtype for i in chunkmap.read_chunk_map(directory).items
                                      if i.fqn == fqn),
                        "shape": list(array.shape), "sha256": hashlib.sha256(raw).hexdigest(),
                        "hex": raw.hex()}
    values = {}
    for item in chunkmap.read_chunk_map(directory).items:
        if isinstance(item, chunkmap.ValueItem):
            value = item.value
            if item.type == "bytes":
                value = base64.b64encode(value).decode("ascii")
            values[item.fqn] = {"kind": item.kind, "type": item.type, "value": value}
    return {"tensors": tensors, "values": values}


# -- negative vectors ------------------------------------------------------------------------

@dataclass(frozen=True)
class Negative:
    name: str
    base: str
    error: str
    rule: str
    description: str
    patch: Callable[[dict], object]
    """Changes the base's decoded document in place (or returns the bytes to write)."""


def _item(doc: dict, fqn: str) -> dict:
    return next(i for i in doc["items"] if i["fqn"] == fqn)


def _set(d: dict, **members) -> None:
    d.update(members)


def _other_save(doc: dict) -> None:
    doc["save_id"] = "0123456789ab"
    for item in doc["items"]:
        for place in item.get("chunks", [item]):
            place["file"] = place["file"][:10] + "0123456789ab.ink"


NEGATIVE = [
    Negative("not_json", "ranks2", "CorruptError", "K-1", "the document cut after 100 bytes",
             lambda doc: json.dumps(doc).encode()[:100]),
    Negative("wrong_format", "ranks2", "CorruptError", "K-2", "format `inshrink-dcp-series`",
             lambda doc: _set(doc, format="inshrink-dcp-series")),
    Negative("version_2", "ranks2", "UnsupportedVersionError", "K-3", "version 2",
             lambda doc: _set(doc, version=2)),
    Negative("extra_member", "ranks2", "CorruptError", "K-4", "a member `x_note` at the top",
             lambda doc: _set(doc, x_note="hi")),
    Negative("duplicate_fqn", "ranks2", "CorruptError", "K-5",
             "the item `lr` renamed `step`, a FQN of an earlier item",
             lambda doc: _set(_item(doc, "lr"), fqn="step")),
    Negative("unknown_dtype", "ranks2", "CorruptError", "K-6", "`model.w` of dtype `F24`",
             lambda doc: _set(_item(doc, "model.w"), dtype="F24")),
    Negative("chunk_outside", "ranks2", "CorruptError", "K-7",
             "the second chunk of `model.w` moved one row down, past the shape",
             lambda doc: _item(doc, "model.w")["chunks"][1]["offsets"].__setitem__(0, 5)),
    Negative("other_save_file", "ranks2", "CorruptError", "K-8",
             "a chunk of `model.w` in a rank file of another save id",
             lambda doc: _set(_item(doc, "model.w")["chunks"][0],
                              file="rank00000-0123456789ab.ink")),
    Negative("overlap", "ranks3", "CorruptError", "K-9",
             "the last chunk of `model.w` moved from row 6 to row 5: as many elements as the "
             "tensor, row 5 twice and row 6 not at all",
             lambda doc: _item(doc, "model.w")["chunks"][2]["offsets"].__setitem__(0, 5)),
    Negative("gap", "ranks2", "CorruptError", "K-9", "the last chunk of `model.c` removed",
             lambda doc: _item(doc, "model.c")["chunks"].pop()),
    Negative("float_as_int", "ranks2", "CorruptError", "K-10",
             "the value of `lr` (type `float`) written `1`",
             lambda doc: _set(_item(doc, "lr"), value=1)),
    Negative("uncommitted", "ranks2", "IncompleteCheckpointError", "K-11",
             "every save id of the map changed to one that `.metadata` does not contain",
             _other_save),
    Negative("missing_file", "ranks2", "CorruptError", "K-12",
             "a chunk of `model.w` placed in `rank00002-…`, which does not exist",
             lambda doc: _set(_item(doc, "model.w")["chunks"][0], file="rank00002-"
                              + _item(doc, "model.w")["chunks"][0]["file"][10:])),
    Negative("wrong_tensor", "ranks2", "CorruptError", "K-13",
             "the chunk of `model.s` named `model.s#1`, which its rank file does not hold",
             lambda doc: _set(_item(doc, "model.s")["chunks"][0], tensor="model.s#1")),
]


def negative_bytes(vector: Negative, base: bytes) -> bytes:
    doc = json.loads(base)
    out = vector.patch(doc)
    if isinstance(out, bytes):
        return out
    return json.dumps(doc, separators=(",", ":")).encode("ascii") + b"\n"


def manifest() -> dict:
    return {"generator": {"script": "make_dcp_vectors.py"},
            "positive": [{"name": name, "directory": name, "world_size": world,
                          "save_id": SAVE_IDS[world], "expected": f"{name}.expected.json"}
                         for name, world in POSITIVE],
            "negative": [{"name": v.name, "file": f"{v.name}.chunks.json", "base": v.base,
                          "error": v.error, "rule": v.rule, "description": v.description}
                         for v in NEGATIVE]}


def build_positive(name: str, world: int, out: str) -> str:
    """Write the positive vector ``name`` into ``out``/``name``; return its directory."""
    directory = os.path.join(out, name)
    shutil.rmtree(directory, ignore_errors=True)
    run_ranks(world, save_rank, directory, SAVE_IDS[world])
    return directory


def main(out: str = HERE) -> None:
    for name, world in POSITIVE:
        directory = build_positive(name, world, out)
        with open(os.path.join(out, f"{name}.expected.json"), "w", encoding="utf-8") as f:
            json.dump(expected(directory), f, indent=1, sort_keys=True)
            f.write("\n")
    for vector in NEGATIVE:
        with open(os.path.join(out, vector.base, "chunks.json"), "rb") as f:
            base = f.read()
        with open(os.path.join(out, f"{vector.name}.chunks.json"), "wb") as f:
            f.write(negative_bytes(vector, base))
    with open(os.path.join(out, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest(), f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else HERE)
