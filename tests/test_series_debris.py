"""What an interrupted or failed save leaves in a series directory, and who removes it."""
import errno
import os
import signal
import subprocess
import sys

import pytest

from inshrink import atomic
from inshrink.series.series import Series
from kit import ROOT, assert_restores, series_state as state


DEBRIS = [".step_000000000002.ink.9kf6u6k2.tmp", ".step_000000000001.d.ink.a_b0c1d2.tmp",
          ".manifest.json.zz9x8w7v.tmp", "step_000000000099.ink", "step_000000000000.ink"]
NOT_OURS = ["notes.txt", ".step_000000000002.ink.tmp", ".other.ink.9kf6u6k2.tmp",
            "step_1.ink", "step_000000000003.ink~", ".step_000000000002.ink.9KF6U6K2.tmp",
            "step_\u0660\u0660\u0660\u0660\u0660\u0660\u0660\u0660\u0660\u0660\u0660\u0661.ink"]


def make_series(directory):
    series = Series(directory, keyframe_every=3)
    series.save(0, state(0))
    series.save(1, state(1))  # files: step_0.d.ink, step_1.ink
    for name in DEBRIS + NOT_OURS:
        (directory / name).write_bytes(b"left over")
    return series


def test_verify_reports_and_reopening_removes_only_the_series_debris(tmp_path):
    series = make_series(tmp_path / "s")
    problems = series.verify()
    assert sorted(p.split(":")[0] for p in problems) == sorted(DEBRIS)
    assert all("interrupted save" in p for p in problems)
    again = Series(tmp_path / "s")
    assert again.verify() == []
    assert sorted(os.listdir(tmp_path / "s")) == sorted(
        [".lock", "manifest.json", "step_000000000000.d.ink", "step_000000000001.ink"]
        + NOT_OURS)
    assert_restores(again, [0, 1])


def test_a_save_removes_debris_too(tmp_path):
    series = make_series(tmp_path / "s")
    series.save(2, state(2))
    assert not set(DEBRIS) & set(os.listdir(tmp_path / "s"))
    assert series.verify() == []
    assert_restores(series, [0, 1, 2])


LOCKER = """
import fcntl, os, sys
fd = os.open(os.path.join(sys.argv[1], ".lock"), os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.readline()
"""


def test_nothing_is_removed_while_another_writer_holds_the_lock(tmp_path):
    make_series(tmp_path / "s")
    before = sorted(os.listdir(tmp_path / "s"))
    holder = subprocess.Popen([sys.executable, "-c", LOCKER, str(tmp_path / "s")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        opened = Series(tmp_path / "s")  # its temporaries may be a live writer's
        assert sorted(os.listdir(tmp_path / "s")) == before
        assert len(opened.verify()) == len(DEBRIS)
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)


KILLED = """
import os, sys, time, numpy as np
sys.path.insert(0, {root!r})
from inshrink.container import writer
from inshrink import series as series_module
from inshrink.series import Series
where = {where!r}

def stop(*args, **kwargs):
    print("stopped", flush=True)
    time.sleep(60)

if where == "temporary":  # the checkpoint's temporary file is written, not yet renamed
    writer.ContainerWriter.commit = stop
else:  # the checkpoint file is in place, the manifest does not name it yet
    series_module.Series._write_manifest = stop
s = Series({path!r}, keyframe_every=3)
s.save(2, {{"model.w": np.ones((64, 64), np.float32), "step": np.array(2)}})
"""


@pytest.mark.parametrize("where", ["temporary", "orphan"])
def test_a_save_killed_midway_is_cleaned_up_by_the_next_opening(tmp_path, where):
    path = tmp_path / "s"
    series = Series(path, keyframe_every=3)
    series.save(0, state(0))
    series.save(1, state(1))
    listed = sorted(os.listdir(path))
    proc = subprocess.Popen([sys.executable, "-c", KILLED.format(root=ROOT, path=str(path),
                                                                 where=where)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "stopped"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    left = set(os.listdir(path)) - set(listed)
    assert left, "the killed save left nothing to clean up"
    assert len(series.verify()) == len(left)  # reported by an object opened before
    again = Series(path)
    assert sorted(os.listdir(path)) == listed
    assert again.verify() == []
    assert_restores(again, [0, 1])
    again.save(2, state(2))
    assert_restores(Series(path), [0, 1, 2])


def full_disk_for(monkeypatch, prefix):
    """AtomicFiles whose name starts with ``prefix`` write to a full disk (ENOSPC)."""
    real = atomic.tempfile.mkstemp

    def mkstemp(*args, **kwargs):
        fd, name = real(*args, **kwargs)
        if os.path.basename(name).startswith(prefix):
            full = os.open("/dev/full", os.O_WRONLY)
            os.dup2(full, fd)
            os.close(full)
        return fd, name
    monkeypatch.setattr(atomic.tempfile, "mkstemp", mkstemp)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("prefix", [".step_000000000002.ink.", ".step_000000000001.d.ink.",
                                    ".manifest.json."])
def test_a_full_disk_fails_the_save_and_leaves_the_series_as_it_was(tmp_path, monkeypatch,
                                                                      prefix):
    path = tmp_path / "s"
    series = Series(path, keyframe_every=3)
    series.save(0, state(0))
    series.save(1, state(1))
    listed = sorted(os.listdir(path))
    full_disk_for(monkeypatch, prefix)
    with pytest.raises(OSError) as caught:
        series.save(2, state(2))
    assert caught.value.errno == errno.ENOSPC
    assert caught.value.filename == str(path / prefix[1:-1])  # the file, not its temporary
    assert sorted(os.listdir(path)) == listed  # neither temporaries nor unlisted files
    assert series.verify() == []
    monkeypatch.undo()
    series.save(2, state(2))
    assert_restores(Series(path), [0, 1, 2])
