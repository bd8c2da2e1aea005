"""Atomic writes: no temporary file survives a failure, and errors name the destination."""
import errno
import os
import stat
import subprocess
import sys
import textwrap
import uuid

import numpy as np
import pytest

import inshrink
from inshrink import atomic
from inshrink.atomic import AtomicFile, hidden_prefix
from kit import ROOT

needs_dev_full = pytest.mark.skipif(not os.path.exists("/dev/full"),
                                    reason="needs /dev/full (Linux) to simulate a full disk")


def debris(directory):
    return [n for n in os.listdir(directory) if n.endswith(".tmp")]


def fill_up(fd):
    """Make every later write to ``fd`` fail as on a full disk (ENOSPC)."""
    full = os.open("/dev/full", os.O_WRONLY)
    os.dup2(full, fd)
    os.close(full)


@pytest.fixture
def full_disk(monkeypatch):
    """Every AtomicFile created from now on writes to a full disk."""
    real = atomic.tempfile.mkstemp

    def mkstemp(*args, **kwargs):
        fd, path = real(*args, **kwargs)
        fill_up(fd)
        return fd, path
    monkeypatch.setattr(atomic.tempfile, "mkstemp", mkstemp)


class FullDiskFile:
    """A file object that fails to close as a buffered file on a full disk does."""

    closed = False

    def write(self, data):
        return len(data)

    def close(self):
        raise OSError(errno.ENOSPC, "No space left on device")


def test_abort_removes_the_temporary_even_when_closing_fails(tmp_path):
    out = AtomicFile(tmp_path / "m.ink")
    out.file.close()
    out.file = FullDiskFile()
    out.abort()  # must not raise: it runs while the original error propagates
    assert os.listdir(tmp_path) == []


@needs_dev_full
def test_abort_with_buffered_data_on_a_full_disk_leaves_nothing(tmp_path):
    out = AtomicFile(tmp_path / "m.ink")
    fill_up(out.file.fileno())
    out.file.write(b"x" * 100)  # buffered: only close() finds the disk full
    out.abort()
    assert os.listdir(tmp_path) == [] and out.file.closed


@needs_dev_full
def test_a_full_disk_names_the_destination(tmp_path):
    path = str(tmp_path / "m.ink")
    (tmp_path / "m.ink").write_bytes(b"previous")
    out = AtomicFile(path)
    fill_up(out.file.fileno())
    with pytest.raises(OSError) as caught:
        out.file.write(b"x" * (1 << 20))
        out.commit()
    out.abort()
    exc = caught.value
    assert exc.errno == errno.ENOSPC and exc.filename == path
    assert path in str(exc) and ".tmp" not in str(exc)
    assert os.listdir(tmp_path) == ["m.ink"] and (tmp_path / "m.ink").read_bytes() == b"previous"


def test_failures_to_create_and_to_rename_name_the_destination(tmp_path):
    missing = str(tmp_path / "no" / "m.ink")
    with pytest.raises(FileNotFoundError) as caught:  # the subclass is kept
        AtomicFile(missing)
    assert caught.value.filename == missing and ".tmp" not in str(caught.value)
    with pytest.raises(IsADirectoryError) as caught:  # refused before anything is written
        AtomicFile(tmp_path)
    assert caught.value.filename == str(tmp_path)
    out = AtomicFile(tmp_path / "d")
    (tmp_path / "d").mkdir()  # meanwhile: a non-empty directory cannot be replaced by a file
    (tmp_path / "d" / "x").write_bytes(b"")
    out.file.write(b"data")
    with pytest.raises(OSError) as caught:
        out.commit()
    out.abort()
    assert caught.value.filename == str(tmp_path / "d") and ".tmp" not in str(caught.value)
    assert os.listdir(tmp_path) == ["d"] and os.listdir(tmp_path / "d") == ["x"]


def test_committed_file_has_the_content_and_usual_mode(tmp_path):
    out = AtomicFile(tmp_path / "m.ink")
    out.file.write(b"hello")
    out.commit()
    assert (tmp_path / "m.ink").read_bytes() == b"hello"
    assert os.stat(tmp_path / "m.ink").st_mode & 0o777 == 0o666 & ~atomic.current_umask()
    out.abort()  # after a commit: nothing to do, nothing removed
    assert os.listdir(tmp_path) == ["m.ink"]


@needs_dev_full
def test_save_on_a_full_disk_names_the_file_and_leaves_no_debris(tmp_path, full_disk):
    path = str(tmp_path / "m.ink")
    state = {"w": np.random.default_rng(0).standard_normal(100_000).astype(np.float32)}
    with pytest.raises(OSError) as caught:
        inshrink.save(path, state)
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == path
    assert os.listdir(tmp_path) == []


# -- a real full disk: a 2 MiB tmpfs (needs root and mount permission) -------------------


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs mounted at a fresh directory."""
    mountpoint = tmp_path / f"disk-{uuid.uuid4().hex[:8]}"
    mountpoint.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (the simulated full-disk tests ran)")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mountpoint)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"mounting a small tmpfs is not permitted here ({r.stderr.strip()}); "
                    f"the simulated full-disk tests ran")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)


def test_real_full_disk_library_and_cli(tmp_path, small_disk):
    big = np.random.default_rng(1).standard_normal(1_000_000).astype(np.float32)  # 4 MB
    path = str(small_disk / "m.ink")
    with pytest.raises(OSError) as caught:
        inshrink.save(path, {"w": big})
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == path
    assert os.listdir(small_disk) == []
    src = tmp_path / "big.ink"
    inshrink.save(src, {"w": big})
    out = small_disk / "big.safetensors"
    r = subprocess.run([sys.executable, "-m", "inshrink", "decompress", str(src), "-o",
                        str(out)], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 1 and r.stdout == ""
    assert os.listdir(small_disk) == [], r.stderr


def test_real_full_disk_series(small_disk):
    from inshrink.series.series import Series
    series = Series(small_disk / "s")
    small = {"w": np.arange(1000, dtype=np.float32)}
    series.save(0, small)
    listed = sorted(os.listdir(small_disk / "s"))
    big = {"w": np.random.default_rng(2).standard_normal(1_000_000).astype(np.float32)}
    with pytest.raises(OSError) as caught:
        series.save(1, big)
    assert caught.value.errno == errno.ENOSPC
    assert caught.value.filename == str(small_disk / "s" / "step_000000000001.ink")
    assert sorted(os.listdir(small_disk / "s")) == listed and series.verify() == []
    series.save(1, small)  # the space is free again
    assert Series(small_disk / "s").steps() == [0, 1]


def test_a_forked_child_leaves_its_parents_temporary_file_alone(tmp_path):
    """The finalizer of an uncommitted AtomicFile (what runs at a child's normal exit) must
    neither remove the parent's temporary file nor flush the child's copy of the buffer into
    it: the open file description is shared, so that wrote the buffered bytes a second time."""
    from helpers import wait_for_child
    path = tmp_path / "out.bin"
    out = AtomicFile(path)
    out.file.write(b"A" * 100)  # buffered, not yet written
    pid = os.fork()
    if pid == 0:
        try:
            out._discard()  # as at the child's interpreter exit
        finally:
            os._exit(0)
    wait_for_child(pid, "the child did not exit")
    assert os.path.exists(out.tmp_path)
    out.file.write(b"B" * 100)
    out.commit()
    assert path.read_bytes() == b"A" * 100 + b"B" * 100


def test_a_special_file_or_a_directory_is_not_replaced(tmp_path):
    """Before: inshrink.save("/dev/null", ...) renamed a regular file over the device; a
    FIFO the same; a directory failed only at the rename, after the whole write."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "dir").mkdir()
    state = {"w": np.arange(10, dtype=np.float32)}
    with pytest.raises(inshrink.errors.InvalidArgumentError, match="not a regular file"):
        inshrink.save(fifo, state)
    with pytest.raises(IsADirectoryError):
        inshrink.save(tmp_path / "dir", state)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(os.listdir(tmp_path)) == ["dir", "fifo"]
    (tmp_path / "link").symlink_to(tmp_path / "target.ink")  # a link is replaced, as before
    inshrink.save(tmp_path / "link", state)
    assert np.array_equal(inshrink.load(tmp_path / "link")["w"], state["w"])


# --- forked children, staging names, links into /proc ----------------------------------------

def _written_by(script: str, path):
    """``path`` once ``python -c script path`` has run (in a fresh interpreter: it forks)."""
    subprocess.run([sys.executable, "-c", script, str(path)], cwd=ROOT, check=True, timeout=60)
    return path


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
    path = _written_by(script, tmp_path / "out.bin")
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
    path = _written_by(script, tmp_path / "out.bin")
    assert path.read_bytes() == b"A" * 100 + b"B" * 100


def test_a_hidden_temporary_is_named_after_a_directory_given_with_its_slash():
    """``-o out/`` for a directory: the staging directory was named ``..<random>`` (the
    name after the slash is empty) instead of ``.out.<random>`` as before."""
    assert hidden_prefix("out/", room=8) == ".out."
    assert hidden_prefix("a/b/") == ".b."
    assert hidden_prefix("a/b.ink") == ".b.ink."


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_the_library_refuses_a_link_into_proc_as_the_command_line_does(tmp_path):
    """The command line refused -o /dev/stdout (a link to /proc/self/fd/1), but
    inshrink.save renamed its file over such a link, replacing it."""
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


def _killed_writer(path) -> str:
    """The temporary of ``path`` that a writer SIGKILLed mid-write left (as a killed
    ``inshrink compress`` leaves its output's)."""
    import signal
    import subprocess
    import sys
    code = ("import os, signal, sys; from inshrink.atomic import AtomicFile; "
            "out = AtomicFile(sys.argv[1]); out.file.write(b'x' * 100000); out.file.flush(); "
            "os.kill(os.getpid(), signal.SIGKILL)")
    r = subprocess.run([sys.executable, "-c", code, str(path)], timeout=60)
    assert r.returncode == -signal.SIGKILL
    [name] = [n for n in os.listdir(os.path.dirname(path)) if n.endswith(".tmp")]
    return os.path.join(os.path.dirname(path), name)


def test_the_next_write_removes_what_a_killed_writer_left(tmp_path):
    import time
    from inshrink import atomic
    out = tmp_path / "out.ink"
    stale = _killed_writer(out)
    # young: the next write leaves it (a writer between its creation and its lock)
    inshrink.save(out, {"w": np.ones(4, np.float32)})
    assert os.path.exists(stale)
    old = time.time() - atomic.STALE_SECONDS - 5
    os.utime(stale, (old, old))
    other = tmp_path / ".other.ink.abcdefgh.tmp"  # another output's: not this write's business
    other.write_bytes(b"y")
    os.utime(other, (old, old))
    inshrink.save(out, {"w": np.ones(4, np.float32)})
    assert not os.path.exists(stale) and other.exists()
    assert sorted(os.listdir(tmp_path)) == [".other.ink.abcdefgh.tmp", "out.ink"]


def test_a_live_writers_temporary_is_never_removed_however_old(tmp_path):
    import time
    from inshrink import atomic
    out = tmp_path / "out.ink"
    live = AtomicFile(out)
    live.file.write(b"z" * 1000)
    old = time.time() - 10 * atomic.STALE_SECONDS
    os.utime(live.tmp_path, (old, old))
    assert atomic.remove_stale_temporaries(out) == []
    with AtomicFile(out) as second:   # another writer of the same output
        second.file.write(b"second")
    assert os.path.exists(live.tmp_path)
    live.commit()                     # the rename still finds its temporary
    assert out.read_bytes() == b"z" * 1000
    assert [n for n in os.listdir(tmp_path) if n.endswith(".tmp")] == []
