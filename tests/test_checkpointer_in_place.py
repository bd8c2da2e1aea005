"""Checkpointer(async_=True, async_staging="in_place"): no copy of the parameters and the
optimizer's state; the next optimizer.step() waits for the save; a change elsewhere fails
that save instead of storing a mix of two steps."""
import threading
import time

import numpy as np
import pytest
import torch
from torch import nn

from inshrink import errors
from inshrink.torch import Checkpointer

from test_checkpointer_async import batch, held_writer, make, snapshot, train

torch.set_num_threads(1)


def with_norm(seed=0):
    """A model with buffers that a forward pass changes (BatchNorm's running statistics)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 80), nn.BatchNorm1d(80), nn.ReLU(), nn.Linear(80, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, optimizer


def step(model, optimizer, seed):
    x, y = batch(seed)
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def test_the_next_step_waits_and_the_checkpoint_is_the_state_at_the_call(tmp_path):
    model, optimizer = with_norm()
    ckpt = Checkpointer(tmp_path / "c", model, optimizer, async_=True,
                        async_staging="in_place", grad_ema=False)
    for i in range(3):
        step(model, optimizer, i)
    expected = snapshot(model, optimizer)
    live = {n: p.data_ptr() for n, p in model.named_parameters()}
    seen = {}
    original = ckpt.series.save

    def save(step_, state, **kwargs):  # what the background save reads: the parameters
        seen.update({n[len("model."):]: a.ctypes.data for n, a in state.items()})
        return original(step_, state, **kwargs)
    ckpt.series.save = save
    started, release = held_writer(ckpt)
    ckpt.save(3)
    assert started.wait(10)
    x, y = batch(10)  # forward and backward overlap the save (BatchNorm's buffers change)
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    threading.Timer(0.3, release.set).start()
    began, blocked = time.perf_counter(), ckpt.seconds
    optimizer.step()  # waits for the save
    assert time.perf_counter() - began >= 0.25 and ckpt.seconds - blocked >= 0.25
    assert ckpt.steps() == [3]
    assert all(seen[n] == ptr for n, ptr in live.items())  # read in place, not copied
    ckpt.close()
    fresh, fresh_optimizer = with_norm(seed=5)
    Checkpointer(tmp_path / "c", fresh, fresh_optimizer).restore(3)
    restored = snapshot(fresh, fresh_optimizer)
    assert sorted(restored) == sorted(expected)
    for name in expected:  # bit for bit, the buffers changed by the forward pass included
        assert restored[name].tobytes() == expected[name].tobytes(), name


def test_a_change_outside_the_step_fails_the_save_and_stores_nothing(tmp_path):
    model, optimizer, scheduler = make()
    ckpt = Checkpointer(tmp_path / "c", model, optimizer, scheduler, async_=True,
                        async_staging="in_place", grad_ema=False)
    train(model, optimizer, scheduler, 2)
    ckpt.save(2)
    assert ckpt.wait()["step"] == 2
    before = sorted(p.name for p in (tmp_path / "c").iterdir())
    started, release = held_writer(ckpt)
    ckpt.save(4)
    assert started.wait(10)
    with torch.no_grad():
        model[0].weight.mul_(0.5)  # not optimizer.step(): nothing waits for the save
    release.set()
    with pytest.raises(errors.InvalidArgumentError, match="step 4 was not saved"):
        ckpt.wait()
    assert ckpt.steps() == [2]
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == before  # no debris
    ckpt.save(5)  # the series goes on
    assert ckpt.wait()["step"] == 5 and ckpt.steps() == [2, 5]
    assert len(optimizer._optimizer_step_pre_hooks) == 1
    ckpt.close()
    assert not optimizer._optimizer_step_pre_hooks  # closed: the step waits for nothing
    train(model, optimizer, scheduler, 1)


def test_training_with_in_place_saves_matches_copied_saves(tmp_path):
    runs = {}
    for staging in ("copy", "in_place"):
        model, optimizer, scheduler = make()
        with Checkpointer(tmp_path / staging, model, optimizer, scheduler, async_=True,
                          async_staging=staging, grad_ema=False) as ckpt:
            for k in range(4):
                train(model, optimizer, scheduler, 2, seed=10 * k)
                ckpt.save(2 * k + 2)
        runs[staging] = ckpt.series.load(8)
        assert ckpt.steps() == [2, 4, 6, 8]
    assert sorted(runs["copy"]) == sorted(runs["in_place"])
    for name, array in runs["copy"].items():
        assert np.array_equal(array, runs["in_place"][name], equal_nan=True), name


@pytest.mark.parametrize("kwargs, match", [
    ({"async_staging": "in_place"}, "needs async_=True"),
    ({"async_staging": "in_place", "async_": True, "optimizer": None}, "an optimizer"),
    ({"async_staging": "lazy", "async_": True}, "must be one of"),
])
def test_bad_staging_arguments(tmp_path, kwargs, match):
    model, optimizer, _ = make()
    args = {"optimizer": optimizer, **kwargs}
    with pytest.raises(errors.InvalidArgumentError, match=match):
        Checkpointer(tmp_path / "c", model, args.pop("optimizer"), **args)
