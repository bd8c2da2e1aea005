"""The command line with lossy data: summaries say so, originals are not replaced by mistake."""
import numpy as np
import pytest
from safetensors.numpy import save_file

from inshrink.encode.policy import PRESETS
from kit import run_cli as run

pytestmark = pytest.mark.model("trained_like")


def test_lossy_summaries_say_lossy_with_the_error(model):
    r = run("compress", "orig.safetensors", "--lossy", cwd=model)
    assert r.returncode == 0, r.stderr
    assert "LOSSY: 1 of 2 tensors quantized (max relative L2 error 0.0" in r.stdout, r.stdout
    assert r.stderr == ""  # balanced on trained-like weights: nothing worth a warning
    r = run("decompress", "orig.ink", "-o", "back.safetensors", cwd=model)
    assert r.returncode == 0, r.stderr
    assert "LOSSY: 1 of 2 tensors quantized (max relative L2 error 0.0" in r.stdout, r.stdout
    r = run("compress", "orig.safetensors", "-o", "exact.ink", cwd=model)
    assert "LOSSY" not in r.stdout and "lossy" not in r.stdout.lower()


def test_force_alone_does_not_replace_an_original_with_lossy_data(model):
    original = (model / "orig.safetensors").read_bytes()
    assert run("compress", "orig.safetensors", "--lossy", "-q", cwd=model).returncode == 0
    r = run("decompress", "orig.ink", "-f", cwd=model)
    assert r.returncode == 2 and "--allow-lossy-overwrite" in r.stderr, r.stderr
    assert (model / "orig.safetensors").read_bytes() == original
    r = run("compress", "orig.safetensors", "--bins", "8", "-f", cwd=model)  # over orig.ink
    assert r.returncode == 2 and "--allow-lossy-overwrite" in r.stderr, r.stderr
    r = run("decompress", "orig.ink", "-f", "--allow-lossy-overwrite", "-q", cwd=model)
    assert r.returncode == 0, r.stderr
    assert (model / "orig.safetensors").read_bytes() != original


def test_force_replaces_with_lossless_data_as_before(model):
    assert run("compress", "orig.safetensors", "-q", cwd=model).returncode == 0
    r = run("decompress", "orig.ink", "-f", "-q", cwd=model)
    assert r.returncode == 0, r.stderr


def test_a_large_error_is_warned_about(model):
    r = run("compress", "orig.safetensors", "--bins", "1", cwd=model)
    assert r.returncode == 0, r.stderr
    assert "warning: 1 tensor quantized with a relative L2 error above 0.25" in r.stderr
    assert "'layer.weight'" in r.stderr and "worst 0.99" in r.stderr, r.stderr


def test_help_explains_every_preset_as_it_is():
    r = run("compress", "--help", cwd=".")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    def levels(config):
        return f"{config.bins}" + (f" (smallest {config.prune:.0%} as 0)" if config.prune else "")
    for name, policy in PRESETS.items():
        assert f" {name} " in text
        if policy.roles:
            assert (f"{name} levels: weights {levels(policy.roles['weight'])}, embeddings "
                    f"{levels(policy.roles['embedding'])}, optimizer exp_avg "
                    f"{levels(policy.roles['exp_avg'])}, exp_avg_sq "
                    f"{levels(policy.roles['exp_avg_sq'])}") in text
    assert "compact levels: weights 16, embeddings 32, optimizer exp_avg 2 (smallest 50% as " \
           "0), exp_avg_sq 2" in text
    assert "= aggressive for weights and embeddings: the two give identical files for a " \
           "model without optimizer state" in text
    assert "implies --lossy" not in text
    assert "lossless nothing quantized" in text


def test_optimizer_moments_are_reported_apart_and_not_warned_about(tmp_path):
    rng = np.random.default_rng(1)
    grad = rng.standard_normal((64, 64)).astype(np.float32) * 1e-3
    save_file({"model.layer.weight": (rng.standard_normal((64, 64)) * 0.02).astype(np.float32),
               "optimizer.state.0.exp_avg": grad * rng.random((64, 64)).astype(np.float32),
               "optimizer.state.0.exp_avg_sq": (grad ** 2 * rng.lognormal(0, 2, (64, 64))
                                                ).astype(np.float32)},
              str(tmp_path / "ckpt.safetensors"))
    r = run("compress", "ckpt.safetensors", "--preset", "compact", cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == "", r.stderr  # moments' large errors are by design
    assert "LOSSY: 3 of 3 tensors quantized (max relative L2 error: weights 0.1" in r.stdout
    assert ", optimizer moments " in r.stdout
