"""Checkpointer: the whole training state (scheduler, random generators, extras) saved in the
same checkpoint as the model and optimizer, and an interrupted run that resumes exactly."""
import json
import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import inshrink
from inshrink import errors
from inshrink.series.series import Series
from inshrink.torch import Checkpointer, to_numpy
from inshrink.checkpointing.checkpointer import TRAINING_METADATA
from inshrink.torch.training import capture, decode

torch.set_num_threads(1)


def make(seed=0):
    """A model with dropout (so the random generators matter), AdamW and a schedule."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 80), nn.ReLU(), nn.Dropout(0.3), nn.Linear(80, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    return model, optimizer, scheduler


class Loader:
    """A data source whose position is training state (a Stateful): batches drawn from
    numpy's and Python's global generators, so that they matter too."""

    def __init__(self):
        self.position = 0
        self.history = []

    def batch(self):
        self.position += 1
        x = torch.from_numpy(np.random.standard_normal((8, 64)).astype(np.float32))
        x = x * (1 + random.random())
        return x, (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()

    def state_dict(self):
        return {"position": self.position, "history": list(self.history),
                "last": torch.tensor([self.position], dtype=torch.float32)}

    def load_state_dict(self, state):
        self.position = state["position"]
        self.history = state["history"]
        assert state["last"].dtype == torch.float32


def train(model, optimizer, scheduler, loader, steps):
    losses = []
    model.train()
    for _ in range(steps):
        x, y = loader.batch()
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        loader.history.append(round(loss.item(), 3))
        losses.append(loss.item())
    return losses


def seed_everything(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@pytest.mark.parametrize("policy", [None, "balanced"])
def test_an_interrupted_run_resumes_exactly(tmp_path, policy):
    seed_everything(1)
    model, optimizer, scheduler = make()
    loader = Loader()
    ckpt = Checkpointer(tmp_path / "c", model, optimizer, scheduler,
                        extra={"loader": loader}, policy=policy, grad_ema=False)
    train(model, optimizer, scheduler, loader, 4)
    ckpt.save(4)
    uninterrupted = train(model, optimizer, scheduler, loader, 5)

    # a new process, in effect: other weights, other generator states, a fresh schedule
    seed_everything(99)
    resumed, resumed_optimizer, resumed_scheduler = make(seed=7)
    resumed_loader = Loader()
    again = Checkpointer(tmp_path / "c", resumed, resumed_optimizer, resumed_scheduler,
                         extra={"loader": resumed_loader}, policy=policy)
    assert again.restore() == 4
    assert resumed_scheduler.last_epoch == 4 and resumed_loader.position == 4
    assert resumed_optimizer.param_groups[0]["lr"] == scheduler.base_lrs[0] * 0.5
    losses = train(resumed, resumed_optimizer, resumed_scheduler, resumed_loader, 5)
    if policy is None:  # lossless: bit for bit
        assert losses == uninterrupted
        assert resumed_loader.history == loader.history
    else:  # lossy weights, but the same batches and the same dropout masks
        assert resumed_loader.position == loader.position
        assert np.allclose(losses, uninterrupted, rtol=0.1, atol=0.02)


def test_saving_does_not_consume_the_random_streams(tmp_path):
    seed_everything(3)
    model, optimizer, scheduler = make()
    ckpt = Checkpointer(tmp_path / "c", model, optimizer, scheduler, policy="balanced",
                        grad_ema=False)
    state = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())
    ckpt.save(1)
    ckpt.save(2)
    assert torch.equal(torch.get_rng_state(), state[0])
    assert np.array_equal(np.random.get_state()[1], state[1])
    assert random.getstate() == state[2]


def test_the_state_is_in_the_checkpoint_file_and_never_quantized(tmp_path):
    model, optimizer, scheduler = make()

    class Big:  # a float matrix large enough to be a "weight" to any policy
        def __init__(self):
            self.table = torch.randn(64, 128)

        def state_dict(self):
            return {"table": self.table}

        def load_state_dict(self, state):
            self.table = state["table"]

    big = Big()
    ckpt = Checkpointer(tmp_path / "c", model, optimizer, scheduler, extra={"big": big},
                        policy="compact", grad_ema=False)
    ckpt.save(1)
    with inshrink.open(tmp_path / "c" / "step_000000000001.ink") as f:
        doc = json.loads(f.metadata[TRAINING_METADATA])
        assert doc["scheduler"]["last_epoch"] == 0 and "loader" not in doc["extra"]
        assert f.info("training.extra.big.table").lossless
        assert f.info("training.rng.torch").lossless
        assert not f.info("model.0.weight").lossless  # the policy did apply to the model
    restored = Big()
    restored.table = torch.zeros(1)
    Checkpointer(tmp_path / "c", model, optimizer, scheduler, extra={"big": restored},
                 policy="compact").restore()
    assert torch.equal(restored.table, big.table)


def test_values_json_cannot_hold_are_refused_by_name_before_anything_is_written(tmp_path):
    model, optimizer, scheduler = make()

    class Odd:
        def state_dict(self):
            return {"ok": 1, "callback": object()}

        def load_state_dict(self, state):
            pass

    ckpt = Checkpointer(tmp_path / "c", model, optimizer, scheduler, extra={"odd": Odd()},
                        grad_ema=False)
    with pytest.raises(errors.InvalidArgumentError, match=r"training\.extra\.odd\.callback"):
        ckpt.save(1)
    assert ckpt.steps() == []


def test_restore_checks_the_training_state_before_changing_anything(tmp_path):
    model, optimizer, _ = make()
    Checkpointer(tmp_path / "c", model, optimizer, grad_ema=False).save(1)  # no scheduler
    fresh, fresh_optimizer, fresh_scheduler = make(seed=5)
    before = fresh[0].weight.detach().clone()
    with pytest.raises(errors.InvalidArgumentError, match="missing scheduler"):
        Checkpointer(tmp_path / "c", fresh, fresh_optimizer, fresh_scheduler).restore()
    with pytest.raises(errors.InvalidArgumentError, match=r"missing extra\['loader'\]"):
        Checkpointer(tmp_path / "c", fresh, fresh_optimizer,
                     extra={"loader": Loader()}).restore()
    assert torch.equal(fresh[0].weight, before)

    Checkpointer(tmp_path / "d", model, optimizer, extra={"loader": Loader()},
                 grad_ema=False).save(1)
    with pytest.raises(errors.InvalidArgumentError, match=r"unexpected extra\['loader'\]"):
        Checkpointer(tmp_path / "d", fresh, fresh_optimizer).restore()
    assert torch.equal(fresh[0].weight, before)


def test_rng_false_leaves_the_generators_alone(tmp_path):
    model, optimizer, _ = make()
    Checkpointer(tmp_path / "c", model, optimizer, rng=False, grad_ema=False).save(1)
    with inshrink.open(tmp_path / "c" / "step_000000000001.ink") as f:
        assert not any(name.startswith("training.rng.") for name in f.keys())
    # a checkpoint with generator states, restored with rng=False: left alone
    Checkpointer(tmp_path / "d", model, optimizer, grad_ema=False).save(1)
    torch.manual_seed(42)
    state = torch.get_rng_state()
    Checkpointer(tmp_path / "d", model, optimizer, rng=False).restore()
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("kwargs, match", [
    ({"scheduler": object()}, "scheduler must have"),
    ({"extra": {"x": object()}}, r"extra\['x'\]"),
    ({"extra": {"a.b": Loader()}}, "without '.'"),
    ({"extra": [Loader()]}, "extra must be a mapping"),
    ({"rng": 1}, "rng must be"),
    ({"keep_last": 0}, "keep_last"),
    ({"sharded": "yes"}, "sharded must be"),
])
def test_bad_training_state_arguments(tmp_path, kwargs, match):
    model, optimizer, _ = make()
    with pytest.raises(errors.InvalidArgumentError, match=match):
        Checkpointer(tmp_path / "c", model, optimizer, **kwargs)


def test_keep_last_retains_the_newest_steps(tmp_path):
    model, optimizer, scheduler = make()
    ckpt = Checkpointer(tmp_path / "c", model, optimizer, scheduler, keep_last=2,
                        grad_ema=False)
    for step in range(1, 5):
        train(model, optimizer, scheduler, Loader(), 1)
        ckpt.save(step)
    assert ckpt.steps() == [3, 4]
    assert ckpt.restore(3) == 3 and scheduler.last_epoch == 3


@pytest.mark.parametrize("policy, async_", [(None, False), ("balanced", True)])
def test_keep_weights_keeps_older_steps_as_the_models_tensors_only(tmp_path, policy, async_):
    model, optimizer, scheduler = make()
    ckpt = Checkpointer(tmp_path / "c", model, optimizer, scheduler, policy=policy,
                        keep_last=2, keep_weights=3, grad_ema=False, async_=async_)
    kept, stored = {}, {}
    for step in range(1, 8):
        train(model, optimizer, scheduler, Loader(), 1)
        ckpt.save(step)
        ckpt.wait()
        kept[step] = {n: p.detach().clone() for n, p in model.state_dict().items()}
        stored[step] = Series(tmp_path / "c").load(step)  # as the whole step decodes
    assert ckpt.steps() == [6, 7] and ckpt.weights_steps() == [3, 4, 5, 6, 7]
    series = Series(tmp_path / "c")  # one directory: the older steps rewritten in place
    assert series.weights_only_steps() == [3, 4, 5] and series.steps() == [3, 4, 5, 6, 7]
    assert not (tmp_path / "c" / "weights").exists()
    for step in (3, 4, 5):  # the model's tensors only, as the whole step decoded them
        got = series.load(step)
        assert got.keys() == {n for n in stored[step] if n.startswith("model.")}
        for name, array in got.items():
            assert array.tobytes() == stored[step][name].tobytes(), (step, name)
    assert series.verify() == []
    with pytest.raises(errors.InvalidArgumentError, match=r"step 3 keeps the model's weights"):
        ckpt.restore(3)
    with pytest.raises(errors.InvalidArgumentError):
        ckpt.restore_model(2)  # gone: 3 weights-only steps before the 2 whole ones
    for step in (3, 6):
        assert ckpt.restore_model(step) == step
        for name, value in model.state_dict().items():
            if policy is None:  # lossless: the weights as they were
                assert torch.equal(value, kept[step][name]), (step, name)
            # the same values as the whole checkpoint's
            assert np.array_equal(value.numpy(), stored[step]["model." + name]), name
    assert ckpt.restore() == 7  # the training state of a whole step, as before
    ckpt.close()


def test_keep_weights_saves_space_and_needs_keep_last(tmp_path):
    sizes = {}
    for label, kwargs in (("whole", {"keep_last": 5}),
                          ("weights", {"keep_last": 2, "keep_weights": 3})):
        model, optimizer, scheduler = make()
        ckpt = Checkpointer(tmp_path / label, model, optimizer, scheduler, grad_ema=False,
                            **kwargs)
        for step in range(1, 8):
            train(model, optimizer, scheduler, Loader(), 1)
            ckpt.save(step)
        sizes[label] = sum(f.stat().st_size for f in (tmp_path / label).rglob("*.ink"))
    assert sizes["weights"] < sizes["whole"]
    model, optimizer, scheduler = make()
    for bad in ({"keep_weights": 2}, {"keep_last": 2, "keep_weights": 0},
                {"keep_last": 2, "keep_weights": True}):
        with pytest.raises(errors.InvalidArgumentError, match="keep_weights"):
            Checkpointer(tmp_path / "bad", model, optimizer, **bad)


# -- the stored form ---------------------------------------------------------------------

_leaves = (st.none() | st.booleans() | st.integers(-2 ** 63, 2 ** 64)
           | st.floats(allow_nan=False) | st.text(max_size=8)
           | st.builds(lambda n, d: torch.arange(n, dtype=d) / 3 if d.is_floating_point
                       else torch.arange(n, dtype=d),
                       st.integers(0, 5), st.sampled_from([torch.float32, torch.bfloat16,
                                                          torch.float64, torch.int64,
                                                          torch.uint8])))
_nested = st.recursive(_leaves, lambda inner: st.lists(inner, max_size=3)
                       | st.tuples(inner, inner)
                       | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                       max_leaves=12)


class Holder:
    def __init__(self, value=None):
        self.value = value

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value = state["value"]


def same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape \
            and to_numpy(a).tobytes() == to_numpy(b).tobytes()
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return type(b) is dict and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@settings(max_examples=60, deadline=None)
@given(_nested)
def test_any_json_and_tensor_state_round_trips_bit_for_bit(value):
    arrays, document = capture(extra={"h": Holder(value)}, rng=False)
    assert all(a.dtype.kind in "uib" for a in arrays.values())  # raw bits only
    restored = Holder()
    decode(document, arrays, scheduler=False, extra={"h": restored}, rng=False,
           where="here").apply(extra={"h": restored}, rng=False)
    assert same(value, restored.value)


def test_a_malformed_stored_training_state_is_refused_before_anything_changes(tmp_path):
    model, optimizer, scheduler = make()
    ckpt = Checkpointer(tmp_path / "c", model, optimizer, scheduler, grad_ema=False)
    ckpt.save(1)
    tensors, metadata = ckpt.series.load(1), ckpt.series.metadata(1)
    doc = json.loads(metadata[TRAINING_METADATA])
    bad_python = dict(doc, rng=dict(doc["rng"], python={"__tuple__": [3, [1, 2], None]}))
    cases = {2: ("not json", "unreadable training state"),
             3: (json.dumps(bad_python), "Python random state is malformed"),
             4: (json.dumps(dict(doc, format=9)), "unknown format")}
    series = Series(tmp_path / "c")
    for step, (document, _) in cases.items():
        series.save(step, tensors, metadata={**metadata, TRAINING_METADATA: document})
    series.save(5, {**tensors, "training.rng.torch": np.zeros(7, np.uint8)}, metadata=metadata)
    cases[5] = (None, "malformed random generator state")
    fresh, fresh_optimizer, fresh_scheduler = make(seed=5)
    before = fresh[0].weight.detach().clone()
    state = torch.get_rng_state()
    again = Checkpointer(tmp_path / "c", fresh, fresh_optimizer, fresh_scheduler)
    for step, (_, match) in cases.items():
        with pytest.raises(errors.InvalidArgumentError, match=match):
            again.restore(step)
        assert torch.equal(fresh[0].weight, before) and fresh_scheduler.last_epoch == 0
        assert torch.equal(torch.get_rng_state(), state)


def test_a_checkpoint_without_training_state_restores_model_and_optimizer_only(tmp_path):
    from inshrink.torch import state_to_numpy
    model, optimizer, _ = make()
    tensors, metadata = state_to_numpy(model, optimizer)  # as saved before the training state
    Series(tmp_path / "c").save(1, tensors, metadata=metadata)
    fresh, fresh_optimizer, fresh_scheduler = make(seed=5)
    torch.manual_seed(8)
    state = torch.get_rng_state()
    assert Checkpointer(tmp_path / "c", fresh, fresh_optimizer).restore() == 1
    assert torch.equal(fresh[0].weight, model[0].weight)
    assert torch.equal(torch.get_rng_state(), state)  # nothing stored: left alone
    with pytest.raises(errors.InvalidArgumentError, match="holds no training state"):
        Checkpointer(tmp_path / "c", fresh, fresh_optimizer, fresh_scheduler).restore()
