"""Two processes writing one series: a lock, a typed error, and no step silently lost."""
import json
import os
import subprocess
import sys
import time

import pytest

from inshrink import errors
from inshrink.series.series import Series
from kit import ROOT, TESTS, assert_restores, series_state as state

WORKER = """
import json, sys, time
from inshrink import errors
from inshrink.series import Series
from kit import series_state as state  # the same states in the test and in the workers
series = Series(sys.argv[1], keyframe_every=3, threads=1)
print("ready", flush=True)
for line in sys.stdin:  # "save STEP [SIZE]": one JSON result line; "pause SECONDS"
    command, *args = line.split()
    if command == "pause":
        time.sleep(float(args[0]))
        continue
    step = int(args[0])
    try:
        series.save(step, state(*map(int, args)))
        result = "ok"
    except errors.InshrinkError as exc:
        result = type(exc).__name__ + ": " + str(exc)
    except Exception as exc:
        result = "UNTYPED " + repr(exc)
    print(json.dumps([step, result]), flush=True)
"""


class Worker:
    """A separate Python process with its own Series object on ``directory``."""

    def __init__(self, directory):
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, str(directory)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + TESTS))
        assert self.proc.stdout.readline().strip() == "ready"

    def send(self, *commands):
        self.proc.stdin.write("".join(f"{c}\n" for c in commands))
        self.proc.stdin.flush()

    def results(self, n):
        return [json.loads(self.proc.stdout.readline()) for _ in range(n)]

    def close(self):
        self.proc.stdin.close()
        assert self.proc.wait(timeout=60) == 0


def kind(result):
    return result.split(":")[0]


def test_interleaved_steps_from_two_processes_lose_nothing(tmp_path):
    a, b = Worker(tmp_path / "s"), Worker(tmp_path / "s")
    try:
        # at the same time, evens and odds, with pauses so that both get turns
        a.send(*(f"pause 0.01\nsave {s}" for s in range(0, 40, 2)))
        b.send(*(f"pause 0.01\nsave {s}" for s in range(1, 40, 2)))
        results = a.results(20) + b.results(20)
    finally:
        a.close()
        b.close()
    saved = [step for step, r in results if r == "ok"]
    failed = {kind(r) for _, r in results if r != "ok"}
    # a save fails only with a typed error: the lock is held, or the other process already
    # saved a later step; never untyped, never success for a step that is not kept
    assert failed <= {"SeriesLockedError", "InvalidArgumentError"}, results
    assert saved
    assert_restores(Series(tmp_path / "s"), saved)


def test_the_same_step_from_two_processes_then_later_saves(tmp_path):
    a, b = Worker(tmp_path / "s"), Worker(tmp_path / "s")
    try:
        for w in (a, b):
            w.send("save 0")  # both open the series with step 0 saved by one of them
        first = a.results(1) + b.results(1)
        big = 1 << 20  # a save that takes a while, so that the two overlap
        a.send(f"save 5 {big}")
        b.send(f"save 5 {big}")
        race = a.results(1) + b.results(1)
        b.send("save 6")  # each then saves again, one after the other
        later = b.results(1)
        a.send("save 7")
        later += a.results(1)
    finally:
        a.close()
        b.close()
    assert sorted(r == "ok" for _, r in first) == [False, True]
    assert sorted(r == "ok" for _, r in race) == [False, True], race
    loser = next(r for _, r in race if r != "ok")
    assert kind(loser) in ("SeriesLockedError", "InvalidArgumentError"), loser
    assert str(tmp_path / "s") in loser
    assert later == [[6, "ok"], [7, "ok"]]  # neither process is stuck with a stale manifest
    assert_restores(Series(tmp_path / "s"), [0, 5, 6, 7], sizes={5: big})


LOCKER = """
import fcntl, os, sys
fd = os.open(os.path.join(sys.argv[1], ".lock"), os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.pwrite(fd, str(os.getpid()).encode(), 0)
print("locked", flush=True)
sys.stdin.readline()
"""


def test_a_held_lock_is_a_typed_error_naming_the_holder(tmp_path):
    series = Series(tmp_path / "s", keyframe_every=3)
    series.save(0, state(0))
    series.save(1, state(1))
    holder = subprocess.Popen([sys.executable, "-c", LOCKER, str(tmp_path / "s")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        for attempt in (lambda: series.save(2, state(2)), lambda: series.delete([0]),
                        lambda: series.retain(1)):
            with pytest.raises(errors.SeriesLockedError, match=f"pid {holder.pid}"):
                attempt()
        assert Series(tmp_path / "s").steps() == [0, 1]  # reading needs no lock
        assert_restores(series, [0, 1])
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    series.save(2, state(2))  # released with its process
    assert_restores(Series(tmp_path / "s"), [0, 1, 2])


def test_a_stale_object_rereads_the_manifest_before_changing_it(tmp_path):
    first = Series(tmp_path / "s", keyframe_every=3)
    second = Series(tmp_path / "s", keyframe_every=3)
    first.save(0, state(0))
    second.save(1, state(1))  # knew of no step when it was opened
    first.save(2, state(2))  # its cache of step 0 is stale: step 1 came in between
    with pytest.raises(errors.InvalidArgumentError, match="not after the latest step 2"):
        second.save(2, state(2))
    assert second.retain(2) == [0]  # what "the last two" means as of now
    assert_restores(Series(tmp_path / "s"), [1, 2])
