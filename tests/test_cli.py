"""The command line, run as a user would: in a subprocess."""
import json
import subprocess
import sys
import os

import numpy as np
import pytest

from kit import ROOT, run_cli as run

pytestmark = pytest.mark.model("bf16_weights_and_f32_bits")


def test_compress_info_verify_decompress(model):
    r = run("compress", "m.safetensors", cwd=model)
    assert r.returncode == 0, r.stderr
    assert "m.safetensors -> m.ink" in r.stdout and (model / "m.ink").exists()
    r = run("info", "m.ink", cwd=model)
    assert r.returncode == 0 and "BF16" in r.stdout and "[256, 64]" in r.stdout
    r = run("verify", "m.ink", cwd=model)
    assert r.returncode == 0 and r.stdout.startswith("OK")
    r = run("decompress", "m.ink", "-o", "back.safetensors", cwd=model)
    assert r.returncode == 0, r.stderr
    assert (model / "back.safetensors").read_bytes() == (model / "m.safetensors").read_bytes()


def test_json_outputs(model):
    r = run("compress", "m.safetensors", "--json", cwd=model)
    summary = json.loads(r.stdout)
    assert summary["outputs"] == ["m.ink"] and summary["bytes_in"] > summary["bytes_out"]
    info = json.loads(run("info", "m.ink", "--json", cwd=model).stdout)
    assert {t["name"] for t in info["files"][0]["tensors"]} == {"b", "w"}
    assert info["files"][0]["format_version"] == "1.0"  # lossless, plain index
    assert "format 1.0" in run("info", "m.ink", cwd=model).stdout
    assert info["files"][0]["metadata"] == {"format": "np"}
    assert json.loads(run("verify", "m.ink", "--json", cwd=model).stdout)["ok"] is True


def test_user_errors_are_one_line_without_traceback(model):
    (model / "junk.ink").write_bytes(b"not an ink file at all" * 10)
    cases = [
        (("compress", "missing.safetensors"), 2, "no such file"),
        (("info", "junk.ink"), 1, "junk.ink is not an .ink file"),
        (("decompress", "junk.ink"), 1, "junk.ink is not an .ink file"),
        (("compress", "junk.ink"), 1, "junk.ink is not a safetensors file"),
    ]
    for args, code, text in cases:
        r = run(*args, cwd=model)
        assert r.returncode == code, (args, r.stderr)
        assert "Traceback" not in r.stderr and text in r.stderr.lower(), (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1


def test_refuses_to_overwrite_without_force(model):
    assert run("compress", "m.safetensors", cwd=model).returncode == 0
    r = run("compress", "m.safetensors", cwd=model)
    assert r.returncode == 2 and "--force" in r.stderr
    assert run("compress", "m.safetensors", "--force", "-q", cwd=model).returncode == 0


def test_verify_detects_corruption(model):
    run("compress", "m.safetensors", cwd=model)
    data = bytearray((model / "m.ink").read_bytes())
    data[200] ^= 0x40
    (model / "bad.ink").write_bytes(bytes(data))
    r = run("verify", "m.ink", "bad.ink", cwd=model)
    assert r.returncode == 1
    assert "OK    m.ink" in r.stdout and "FAIL  bad.ink" in r.stdout


def test_sharded_directory(model):
    shards = model / "ckpt"
    shards.mkdir()
    os.replace(model / "m.safetensors", shards / "model-00001-of-00001.safetensors")
    (shards / "model.safetensors.index.json").write_text("{}")
    assert run("compress", "ckpt", cwd=model).returncode == 0
    assert run("verify", "ckpt-ink", cwd=model).returncode == 0
    assert run("decompress", "ckpt-ink", "-o", "out", cwd=model).returncode == 0
    for name in os.listdir(shards):
        assert (model / "out" / name).read_bytes() == (shards / name).read_bytes()


def test_help_and_version(tmp_path):
    r = run("--help", cwd=tmp_path)
    assert r.returncode == 0 and "compress" in r.stdout and "verify" in r.stdout
    assert run("--version", cwd=tmp_path).returncode == 0
    assert run("frobnicate", cwd=tmp_path).returncode == 2



def test_help_imports_no_command_module_and_no_torch(tmp_path):
    # a command's module is imported when that command runs; the DCP names need no torch
    code = ("import sys\nfrom inshrink.cli import main\nimport inshrink.dcp.names\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m in {'torch', 'inshrink.cli.transfer', "
            "'inshrink.cli.inspect', 'inshrink.cli.dcp', 'inshrink.cli.series'}), "
            "file=sys.stderr)")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 0 and "consolidate" in r.stdout, r.stderr
    assert r.stderr.strip() == "[]", r.stderr


def test_info_shows_the_search_choice(tmp_path):
    import inshrink
    rng = np.random.default_rng(0)
    state = {"model.layer.weight": rng.standard_normal((128, 64)).astype(np.float32)}
    series = inshrink.Series(tmp_path)
    result = inshrink.Search().choose(state, lambda s: 1.0 + float(np.mean(
        (s["model.layer.weight"] - state["model.layer.weight"]) ** 2)))
    series.save(1, state, policy=result.policy, metadata=result.metadata())
    r = run("info", series.checkpoints()[0].file, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    chosen = result.choice
    assert "search: guided, epsilon 0.05" in r.stdout
    assert f"bins={chosen.bins}" in r.stdout
