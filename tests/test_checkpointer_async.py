"""Checkpointer(async_=True): saves return after the staging copy, training overlaps the
write, the next save waits for the previous, and a failure in the background surfaces."""
import threading
import time

import numpy as np
import pytest
import torch
from torch import nn

from inshrink import errors
from inshrink.torch import Checkpointer, state_to_numpy

torch.set_num_threads(1)


def make(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 80), nn.ReLU(), nn.Linear(80, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return model, optimizer, scheduler


def batch(seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 64, generator=gen)
    return x, (x[:, 0] > 0).long()


def train(model, optimizer, scheduler, steps, seed=0):
    for i in range(steps):
        x, y = batch(seed + i)
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()


def snapshot(model, optimizer):
    return {k: v.copy() for k, v in state_to_numpy(model, optimizer)[0].items()}


def held_writer(ckpt):
    """Make the series' writer wait until released; (started, release) events."""
    started, release = threading.Event(), threading.Event()
    original = ckpt.series.save

    def save(*args, **kwargs):
        started.set()
        assert release.wait(20)
        return original(*args, **kwargs)
    ckpt.series.save = save
    return started, release


def test_training_overlaps_a_save_which_stores_the_state_at_the_call(tmp_path):
    model, optimizer, scheduler = make()
    ckpt = Checkpointer(tmp_path / "c", model, optimizer, scheduler, async_=True,
                        grad_ema=False)
    train(model, optimizer, scheduler, 3)
    expected = snapshot(model, optimizer)
    started, release = held_writer(ckpt)
    report = ckpt.save(3)
    assert report["step"] == 3 and report["bytes"] is None and report["search"] is None
    assert started.wait(10)
    # the writer is at work (held) while training takes steps that change every tensor
    train(model, optimizer, scheduler, 2, seed=10)
    assert ckpt.steps() == [] and ckpt._pending is not None
    # the next save waits for the previous one
    threading.Timer(0.3, release.set).start()
    began = time.perf_counter()
    ckpt.save(5)
    assert time.perf_counter() - began >= 0.25
    finished = ckpt.wait()
    assert finished["step"] == 5 and finished["bytes"] > 0 and ckpt.steps() == [3, 5]
    assert ckpt.wait() is None  # nothing pending any more
    ckpt.close()

    fresh, fresh_optimizer, fresh_scheduler = make(seed=4)
    assert Checkpointer(tmp_path / "c", fresh, fresh_optimizer, fresh_scheduler).restore(3) == 3
    restored = snapshot(fresh, fresh_optimizer)
    assert sorted(restored) == sorted(expected)
    for name in expected:  # what was staged at the call, bit for bit
        assert restored[name].tobytes() == expected[name].tobytes(), name
    assert fresh_scheduler.last_epoch == 3


@pytest.mark.parametrize("next_call", ["save", "wait", "close", "restore"])
def test_a_failure_in_the_background_surfaces_on_the_next_call(tmp_path, next_call):
    model, optimizer, scheduler = make()
    ckpt = Checkpointer(tmp_path / "c", model, optimizer, scheduler, async_=True,
                        grad_ema=False)
    ckpt.save(1)
    ckpt.wait()
    original = ckpt.series.save

    def failing(*args, **kwargs):
        raise OSError(28, "No space left on device")
    ckpt.series.save = failing
    assert ckpt.save(2)["step"] == 2  # returns: the failure happens in the background
    with pytest.raises(OSError, match="No space left") as info:
        getattr(ckpt, next_call)(*((3,) if next_call == "save" else ()))
    ckpt.series.save = original
    assert any("step 2" in note for note in getattr(info.value, "__notes__", ["step 2"]))
    assert ckpt.steps() == [1]  # step 2 was not saved, step 3 not attempted
    # once raised, the failure is gone: the checkpointer goes on
    if next_call != "close":
        ckpt.save(3)
        ckpt.wait()
        assert ckpt.steps() == [1, 3]
    ckpt.close()


def test_the_context_manager_flushes_and_a_closed_checkpointer_refuses_saves(tmp_path):
    model, optimizer, scheduler = make()
    with Checkpointer(tmp_path / "c", model, optimizer, scheduler, async_=True,
                      grad_ema=False) as ckpt:
        _, release = held_writer(ckpt)
        ckpt.save(1)
        threading.Timer(0.2, release.set).start()
    assert ckpt.steps() == [1] and ckpt.last_report["step"] == 1
    with pytest.raises(errors.InvalidArgumentError, match="closed"):
        ckpt.save(2)
    assert ckpt.restore() == 1


def test_async_search_evaluates_a_copy_while_the_model_trains(tmp_path):
    model, optimizer, scheduler = make()
    x, y = batch(500)
    ckpt = Checkpointer(tmp_path / "c", model, optimizer, scheduler, async_=True,
                        eval_batches=[(x, y)], max_evals=6)
    train(model, optimizer, scheduler, 5)
    staged = snapshot(model, optimizer)
    started, release = held_writer(ckpt)
    ckpt.save(5)
    assert started.wait(10)
    train(model, optimizer, scheduler, 2, seed=20)
    live = snapshot(model, optimizer)
    release.set()
    report = ckpt.wait()
    assert report["search"] is not None and report["search"]["baseline"] is not None
    # the search ran on the copy, loaded with the staged weights: the live model untouched
    assert ckpt._evaluated is not model
    evaluated = {f"model.{k}": v.numpy() for k, v in ckpt._evaluated.state_dict().items()}
    for name, value in evaluated.items():
        assert np.array_equal(value, staged[name]), name
    assert all(np.array_equal(v, live[k]) for k, v in snapshot(model, optimizer).items())
    assert model.training
    ckpt.close()


def test_a_model_the_async_search_cannot_copy_is_a_typed_error(tmp_path):
    model, optimizer, _ = make()
    model.lock = threading.Lock()  # deepcopy refuses it
    with pytest.raises(errors.InvalidArgumentError, match="cannot be copied"):
        Checkpointer(tmp_path / "c", model, optimizer, async_=True, eval_batches=[batch(1)])
    Checkpointer(tmp_path / "c", model, optimizer, async_=True).close()  # no search: no copy


def test_the_time_a_save_waits_for_the_previous_one_is_reported(tmp_path):
    # the second save blocks until the first one's background write ends: that wait is
    # what training lost, so its report (and ckpt.seconds) must count it
    model, optimizer, scheduler = make()
    with Checkpointer(tmp_path / "c", model, optimizer, scheduler, async_=True) as ckpt:
        started, release = held_writer(ckpt)
        first = ckpt.save(1)
        assert started.wait(20)
        threading.Timer(0.6, release.set).start()
        began = time.perf_counter()
        second = ckpt.save(2)
        blocked = time.perf_counter() - began
        assert blocked >= 0.5
        assert second["seconds"] >= 0.5 and second["seconds"] <= blocked
        assert ckpt.seconds >= first["seconds"] + 0.5
    assert ckpt.steps() == [1, 2]
