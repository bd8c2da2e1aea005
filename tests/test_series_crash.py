"""A series killed or failing at named points of a save or a pruning: reopened as a user would
after a crash, it restores every listed step exactly, holds no debris and takes the next save.
The scenarios are those of a randomized kill test (SIGKILL at random moments of series and
Checkpointer saves, with retain / keep_last), made deterministic."""
import errno
import os
import signal
import subprocess
import sys

import pytest

from inshrink import atomic
from inshrink.series.series import Series
from kit import ROOT, TESTS, assert_restores, series_state as state


def killed_at(code):
    """Run ``code`` in a fresh interpreter until it prints "stopped" (at the named point),
    then SIGKILL it: a crash exactly there."""
    proc = subprocess.Popen([sys.executable, "-c",
                             f"import sys; sys.path[:0] = [{ROOT!r}, {TESTS!r}]\n" + code],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "stopped"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)


STOP = """
import time
import numpy as np
from inshrink.container import writer
from inshrink.series import series as series_module
from inshrink.series import Series
from kit import series_state as state

def stop(*args, **kwargs):
    print("stopped", flush=True)
    time.sleep(60)
"""


def test_a_kill_while_the_previous_checkpoint_is_rewritten_as_a_delta(tmp_path):
    path = tmp_path / "s"
    series = Series(path, keyframe_every=3)
    series.save(0, state(0))
    series.save(1, state(1))  # step 1 whole, rewritten as a delta by the next save
    listed = sorted(os.listdir(path))
    killed_at(STOP + f"""
commit = writer.ContainerWriter.commit
def commit_or_stop(self, *args, **kwargs):
    if self._target.path.endswith(".d.ink"):  # the new step is in place, its delta is not
        stop()
    return commit(self, *args, **kwargs)
writer.ContainerWriter.commit = commit_or_stop
Series({str(path)!r}, keyframe_every=3).save(2, state(2))
""")
    assert any(name.startswith(".step_000000000001.d.ink.") for name in os.listdir(path))
    again = Series(path, keyframe_every=3)
    assert sorted(os.listdir(path)) == listed  # the new step and the temporary removed
    assert_restores(again, [0, 1])
    again.save(2, state(2))
    assert [e.keyframe for e in again.checkpoints()] == [False, False, True]
    assert_restores(Series(path), [0, 1, 2])


def test_a_kill_while_retain_removes_files(tmp_path):
    path = tmp_path / "s"
    series = Series(path, keyframe_every=3)
    for step in range(3):
        series.save(step, state(step))
    killed_at(STOP + f"""
series_module.remove = stop  # the manifest no longer lists steps 0 and 1; files not removed
Series({str(path)!r}).retain(1)
""")
    assert "step_000000000000.d.ink" in os.listdir(path)
    again = Series(path, keyframe_every=3)
    assert sorted(n for n in os.listdir(path) if n.startswith("step_")) == [
        "step_000000000002.ink"]
    assert_restores(again, [2])
    again.save(3, state(3))
    assert_restores(Series(path), [2, 3])


def test_a_failure_at_the_first_write_of_a_checkpoint_leaves_no_temporary(tmp_path,
                                                                           monkeypatch):
    path = tmp_path / "s"
    series = Series(path, keyframe_every=3)
    series.save(0, state(0))
    listed = sorted(os.listdir(path))

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(atomic._DestinationFile, "write", full)
    with pytest.raises(OSError) as caught:
        series.save(1, state(1))
    assert caught.value.errno == errno.ENOSPC
    # while the error (and so the traceback's frames) is still held, not only once collected
    assert sorted(os.listdir(path)) == listed
    monkeypatch.undo()
    series.save(1, state(1))
    assert_restores(Series(path), [0, 1])
