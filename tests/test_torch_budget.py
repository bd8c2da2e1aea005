"""inshrink.torch.budget: how the Checkpointer shares its run's quality bound over its
checkpoints (learning rate, share of the run left, late moment configurations)."""
import pytest
import torch
from torch import nn

from inshrink import errors
from inshrink.search import Search, SearchSpace
from inshrink.torch import Checkpointer
from inshrink.checkpointing.budget import EPSILON_FLOOR, LATE_LR, Budget, run_length

torch.set_num_threads(1)


def model_and_optimizer(lr=1e-2):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 4))
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def batches():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(32, 64, generator=gen)
    return [(x, torch.randint(0, 4, (32,), generator=gen))]


def test_bound_follows_a_power_of_the_learning_rate_with_a_floor():
    budget = Budget(0.05, restores=5, lr_power=2)
    assert budget.bound(1.0, 10) == pytest.approx(0.01)
    assert budget.bound(0.5, 10) == pytest.approx(0.0025)
    assert budget.bound(0.01, 10) == pytest.approx(0.01 * EPSILON_FLOOR)
    assert Budget(0.05, lr_power=0).bound(0.01, 10) == pytest.approx(0.01)


def test_known_run_length_shrinks_the_bound_whatever_the_learning_rate():
    # a constant learning rate says nothing about the end of the run; its length does
    budget = Budget(0.05, restores=5, lr_power=1, total_steps=100)
    assert budget.left(25) == pytest.approx(0.75)
    assert budget.bound(1.0, 25) == pytest.approx(0.0075)
    assert budget.bound(1.0, 80) == pytest.approx(0.002)
    assert budget.bound(1.0, 100) == pytest.approx(0.01 * EPSILON_FLOOR)
    assert budget.bound(1.0, 500) == pytest.approx(0.01 * EPSILON_FLOOR)  # past the end
    assert budget.bound(0.3, 25) == pytest.approx(0.003)  # the smaller of the two counts
    # at least linear in the share left, even where the learning rate does not count
    assert Budget(0.05, lr_power=0, total_steps=100).bound(1.0, 50) == pytest.approx(0.005)
    assert Budget(0.05, lr_power=2, total_steps=100).bound(1.0, 50) == pytest.approx(0.0025)


def test_late_checkpoints_by_learning_rate_or_share_left():
    space = SearchSpace()
    early, late = Budget(0.05), Budget(0.05, total_steps=100)
    assert not early.late(1.0, 90) and early.late(LATE_LR * 0.99, 1)
    assert late.late(1.0, 51) and not late.late(1.0, 50)
    assert late.space(space, 1.0, 90).exp_avg == space.late_exp_avg
    assert late.space(space, 1.0, 10) == space
    search = Search(1.0, space=space)
    late.apply(search, space, 1.0, 90, max_rel_l2=0.2)
    assert search.epsilon == pytest.approx(0.01 * EPSILON_FLOOR)
    assert search.max_rel_l2 == pytest.approx(0.2 * EPSILON_FLOOR ** 0.5)
    assert search.space.exp_avg == space.late_exp_avg


@pytest.mark.parametrize("kwargs", [{"epsilon": -1}, {"epsilon": float("nan")},
                                    {"epsilon": 0.05, "restores": 0},
                                    {"epsilon": 0.05, "lr_power": -1},
                                    {"epsilon": 0.05, "total_steps": 0},
                                    {"epsilon": 0.05, "total_steps": 10.5},
                                    {"epsilon": 0.05, "total_steps": True}])
def test_bad_budget_arguments(kwargs):
    with pytest.raises(errors.InvalidArgumentError):
        Budget(**kwargs)


def test_run_length_of_schedulers_that_know_it():
    _, opt = model_and_optimizer()
    sched = torch.optim.lr_scheduler
    assert run_length(sched.OneCycleLR(opt, max_lr=0.1, total_steps=300)) == 300
    _, opt = model_and_optimizer()
    assert run_length(sched.CosineAnnealingLR(opt, T_max=250)) == 250
    _, opt = model_and_optimizer()
    warm = sched.LinearLR(opt, start_factor=0.1, total_iters=10)
    cosine = sched.CosineAnnealingLR(opt, T_max=90)
    assert run_length(sched.SequentialLR(opt, [warm, cosine], milestones=[10])) == 100
    _, opt = model_and_optimizer()
    assert run_length(sched.LambdaLR(opt, lambda s: 1.0)) is None
    assert run_length(None) is None


def test_checkpointer_takes_the_run_length_from_its_argument_or_scheduler(tmp_path):
    model, optimizer = model_and_optimizer()
    ckpt = Checkpointer(tmp_path / "a", model, optimizer, eval_batches=batches(),
                        epsilon=0.05, max_evals=1, grad_ema=False, total_steps=100,
                        epsilon_follows_lr=1)
    # constant learning rate, 80% of the run done: a fifth of the share, late moments
    report = ckpt.save(80)["search"]
    assert report["epsilon"] == pytest.approx(0.002)
    assert ckpt.search.space.exp_avg == SearchSpace().late_exp_avg
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=400)
    assert Checkpointer(tmp_path / "b", model, optimizer, cosine).budget.total_steps == 400
    assert Checkpointer(tmp_path / "c", model, optimizer, cosine,
                        total_steps=50).budget.total_steps == 50
    assert Checkpointer(tmp_path / "d", model, optimizer).budget.total_steps is None
    with pytest.raises(errors.InvalidArgumentError):
        Checkpointer(tmp_path / "e", model, optimizer, total_steps=-5)
