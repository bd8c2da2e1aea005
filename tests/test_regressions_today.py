"""Legitimate uses that the day's new checks and fixes must keep working."""
import os
import subprocess
import sys
import textwrap

import pytest

from inshrink.atomic import hidden_prefix

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_exiting_normally_adds_nothing_to_its_parents_file(tmp_path):
    """A child of os.fork that ends with a normal interpreter exit frees its copy of an open
    AtomicFile, whose buffer is then flushed: through the shared file description it was
    written into the parent's temporary file a second time (the finalizer's pid check alone
    did not stop that)."""
    script = textwrap.dedent("""
        import os, sys
        from inshrink.atomic import AtomicFile
        out = AtomicFile(sys.argv[1])
        out.file.write(b"A" * 100)  # buffered, not yet written
        pid = os.fork()
        if pid == 0:
            sys.exit(0)  # the interpreter's own exit: the child's objects are freed
        os.waitpid(pid, 0)
        out.file.write(b"B" * 100)
        out.commit()
    """)
    path = tmp_path / "out.bin"
    subprocess.run([sys.executable, "-c", script, str(path)], cwd=ROOT, check=True,
                   timeout=60)
    assert path.read_bytes() == b"A" * 100 + b"B" * 100
    assert os.listdir(tmp_path) == ["out.bin"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_can_still_take_over_and_commit_the_file(tmp_path):
    """The child only stops writing into the shared file when it drops its copy (or exits):
    one that goes on writing and commits, its parent leaving without finalizing, still
    produces the whole file."""
    script = textwrap.dedent("""
        import os, sys
        from inshrink.atomic import AtomicFile
        out = AtomicFile(sys.argv[1])
        out.file.write(b"A" * 100)
        out.file.flush()
        pid = os.fork()
        if pid:
            os.waitpid(pid, 0)
            os._exit(0)  # the parent leaves the file to the child
        out.file.write(b"B" * 100)
        out.commit()
    """)
    path = tmp_path / "out.bin"
    subprocess.run([sys.executable, "-c", script, str(path)], cwd=ROOT, check=True,
                   timeout=60)
    assert path.read_bytes() == b"A" * 100 + b"B" * 100


def test_a_hidden_temporary_is_named_after_a_directory_given_with_its_slash():
    """``-o out/`` for a directory: the staging directory was named ``..<random>`` (the
    name after the slash is empty) instead of ``.out.<random>`` as before."""
    assert hidden_prefix("out/", room=8) == ".out."
    assert hidden_prefix("a/b/") == ".b."
    assert hidden_prefix("a/b.ink") == ".b.ink."


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "inshrink", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_decompress_of_a_tree_holding_another_programs_manifest_json(tmp_path):
    """compress copies a model directory's other files, a manifest.json among them: the
    directory it wrote was then refused by decompress as a checkpoint series (exit 2)."""
    import numpy as np
    from safetensors.numpy import save_file
    (tmp_path / "model").mkdir()
    tensors = {"w": np.arange(12, dtype=np.float32).reshape(3, 4)}
    save_file(tensors, str(tmp_path / "model" / "model.safetensors"))
    (tmp_path / "model" / "manifest.json").write_text('{"files": ["model.safetensors"]}')
    done = _cli("compress", "model", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    done = _cli("decompress", "model-ink", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "model-ink-safetensors"
    assert (out / "model.safetensors").read_bytes() == \
        (tmp_path / "model" / "model.safetensors").read_bytes()
    assert (out / "manifest.json").read_text() == '{"files": ["model.safetensors"]}'


def test_decompress_of_a_series_still_points_to_series_restore(tmp_path):
    import numpy as np
    from inshrink.series.series import Series
    series = Series(tmp_path / "ser")
    series.save(1, {"w": np.zeros(4, np.float32)})
    done = _cli("decompress", "ser", cwd=tmp_path)
    assert done.returncode == 2 and "series restore" in done.stderr


def test_importance_scores_of_a_numpy_dtype_inshrink_does_not_store():
    """Scores are converted to float64: since they went through as_numpy (as a tensor to
    store is), a float128 array was refused ('unsupported dtype float128')."""
    import numpy as np

    import inshrink
    from inshrink.encode.tensor import overrides
    from inshrink.encode.policy import QuantConfig
    scores = np.linspace(0, 1, 64, dtype=np.longdouble)
    config = QuantConfig(bins=16, prune=0.25, prune_metric="sensitivity")
    assert overrides(scores, config, 64) is not None
    with pytest.raises(inshrink.errors.InvalidArgumentError):  # still: not numbers
        overrides(np.array([None] * 64, dtype=object), config, 64)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_the_library_refuses_a_link_into_proc_as_the_command_line_does(tmp_path):
    """The command line refused -o /dev/stdout (a link to /proc/self/fd/1), but
    inshrink.save renamed its file over such a link, replacing it."""
    import numpy as np

    import inshrink
    link = tmp_path / "stdout"
    os.symlink("/proc/self/fd/1", link)
    with pytest.raises(inshrink.errors.InvalidArgumentError, match="/proc"):
        inshrink.save(link, {"x": np.zeros(3, np.float32)})
    assert os.readlink(link) == "/proc/self/fd/1"
    assert os.listdir(tmp_path) == ["stdout"]
    target = tmp_path / "real.ink"  # a link to a regular file is still replaced, as before
    os.symlink(target, tmp_path / "alias.ink")
    inshrink.save(tmp_path / "alias.ink", {"x": np.zeros(3, np.float32)})
    assert not os.path.islink(tmp_path / "alias.ink")
