"""Where compiled kernels are cached: never inside the package directory (cache files there
survive ``pip uninstall`` and the leftover folder shadows a later editable install)."""
import glob
import os
import subprocess
import sys

import inshrink.kernels

PACKAGE_KERNELS = os.path.dirname(inshrink.kernels.__file__)
SCRIPT = """
import numpy as np, inshrink
inshrink.save({path!r}, {{"w": np.linspace(-1, 1, 8192, dtype=np.float32).reshape(64, 128)}},
              policy="balanced")
assert inshrink.load({path!r})["w"].shape == (64, 128)
"""


def run_fresh_process(tmp_path, env_overrides):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(env_overrides)
    script = SCRIPT.format(path=str(tmp_path / "w.ink"))
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=300)


def package_cache_files():
    return set(glob.glob(os.path.join(PACKAGE_KERNELS, "__pycache__", "*.nb*")))


def test_kernels_are_cached_in_the_user_cache_directory(tmp_path):
    before = package_cache_files()
    run_fresh_process(tmp_path, {"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert package_cache_files() == before
    cached = glob.glob(str(tmp_path / "cache" / "inshrink" / "numba" / "**" / "*.nbi"),
                       recursive=True)
    assert cached, "no kernel was cached in the user cache directory"


def test_numba_cache_dir_overrides_the_user_cache_directory(tmp_path):
    run_fresh_process(tmp_path, {"XDG_CACHE_HOME": str(tmp_path / "unused"),
                                 "NUMBA_CACHE_DIR": str(tmp_path / "numba")})
    assert glob.glob(str(tmp_path / "numba" / "**" / "*.nbi"), recursive=True)
    assert not os.path.exists(tmp_path / "unused" / "inshrink")


def test_other_libraries_keep_their_cache_location():
    from numba.core import config
    assert config.CACHE_DIR == os.environ.get("NUMBA_CACHE_DIR", "")
