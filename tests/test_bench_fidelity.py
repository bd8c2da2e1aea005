"""The fidelity benchmark's task list (benchmarks/fidelity_tasks.py) and one tiny run of its
harness (benchmarks/bench_fidelity.py): cheap checks, no measurement."""
import argparse
import math
import os
import sys
from unittest import mock

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")  # the digits tasks; in the dev extra

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

import bench_fidelity as bf  # noqa: E402
import fidelity_tasks as ft  # noqa: E402


def test_every_task_builds_with_its_optimizer():
    kinds = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW,
             "sgd_momentum": torch.optim.SGD, "sgd_nesterov": torch.optim.SGD,
             "adafactor": torch.optim.Adafactor}
    for name, spec in ft.TASKS.items():
        task = ft.make_task(name, seed=0)
        assert task.name == name and task.steps == spec.steps
        assert task.ckpt_every * 20 == spec.steps  # 20 checkpoints a run
        opt = task.optimizer
        assert type(opt) is kinds[spec.optimizer], name
        group = opt.param_groups[0]
        if spec.optimizer in ("adam", "adamw"):
            assert group["betas"] == (0.9, spec.beta2)
        if spec.optimizer.startswith("sgd"):
            assert group["momentum"] == 0.9
            assert group["nesterov"] == (spec.optimizer == "sgd_nesterov")
        assert len(task.test_batches) and len(task.calib_batches)


def test_held_out_part_is_disjoint_about_a_third_every_family_and_new_pairs():
    names = set(ft.TASKS)
    assert ft.HELD_OUT <= names and ft.SPENT <= names
    assert not ft.HELD_OUT & ft.SPENT
    assert len(ft.HELD_OUT) / len(names) >= 0.3
    assert set(ft.TUNING) == names - ft.HELD_OUT
    held = [ft.TASKS[n] for n in ft.HELD_OUT]
    assert {s.family for s in held} == set(ft.FAMILIES.values())
    tuning_pairs = {(ft.TASKS[n].optimizer, ft.TASKS[n].beta2, ft.TASKS[n].schedule)
                    for n in ft.TUNING}
    for s in held:
        assert (s.optimizer, s.beta2, s.schedule) not in tuning_pairs, s.name


def test_optimizer_and_schedule_coverage():
    specs = list(ft.TASKS.values())
    adam_beta2 = {s.beta2 for s in specs if s.optimizer in ("adam", "adamw")}
    assert adam_beta2 >= {0.95, 0.99, 0.999}
    optimizers = {s.optimizer for s in specs}
    assert {"sgd_momentum", "sgd_nesterov"} <= optimizers
    assert "adafactor" in optimizers
    assert any(s.optimizer == "adam" and s.weight_decay == 0 for s in specs)
    assert {s.schedule for s in specs} == set(ft.SCHEDULES)
    # the tuning tasks alone cover every optimizer and schedule too
    assert {ft.TASKS[n].schedule for n in ft.TUNING} == set(ft.SCHEDULES)
    assert {ft.TASKS[n].optimizer for n in ft.TUNING} == set(ft.OPTIMIZERS)


@pytest.mark.parametrize("schedule", ft.SCHEDULES)
def test_schedules(schedule):
    spec = ft.Spec("x", "cnn", "sgd_momentum", schedule, steps=100, lr=1.0, warmup=10,
                   lr_min=0.1)
    lrs = [ft.lr_at(spec, s) for s in range(1, 101)]
    assert lrs[:10] == pytest.approx([s / 10 for s in range(1, 11)])  # linear warmup
    assert max(lrs) == pytest.approx(1.0)
    end = {"cosine": 0.1, "linear": 0.0, "constant": 1.0, "step": 0.01}[schedule]
    assert lrs[-1] == pytest.approx(end, abs=1e-9)
    if schedule == "step":
        assert lrs[50] == pytest.approx(0.1) and lrs[49] == pytest.approx(1.0)


def test_parse_config():
    c = bf.parse_config("search:epsilon=0.01,restores=10")
    assert c == {"label": "search:epsilon=0.01,restores=10", "kind": "search",
                 "name": "search", "args": {"epsilon": 0.01, "restores": 10}}
    assert bf.parse_config("compact")["kind"] == "preset"
    for bad in ("nope", "ref:x=1", "search:epsilon", "jitter:bins=3"):
        with pytest.raises(SystemExit):
            bf.parse_config(bad)


def test_restore_at_option():
    assert bf._checkpoint_numbers("8,2,4,4") == (2, 4, 8)
    for bad in ("", "x", "0,2", "21", "2,,4"):
        with pytest.raises(argparse.ArgumentTypeError):
            bf._checkpoint_numbers(bad)


def test_restores_happen_only_where_asked(tmp_path):
    run = bf.run_one("cnn-sgdm-cosine", bf.parse_config("ref"), 0, steps=8,
                     workdir=str(tmp_path), restore_at=(3, 20))
    every = run["ckpt_every"]
    assert run["restores"] == [3 * every]  # checkpoint 20 lies past an 8-step run


def test_tiny_runs_lossless_is_ref_and_preset_compresses(tmp_path):
    name = "cnn-sgdm-cosine"
    ref = bf.run_one(name, bf.parse_config("ref"), 0, steps=4, workdir=str(tmp_path))
    lossless = bf.run_one(name, bf.parse_config("lossless"), 0, steps=4, workdir=str(tmp_path))
    preset = bf.run_one(name, bf.parse_config("compact"), 0, steps=4, workdir=str(tmp_path))
    jit = bf.run_one(name, bf.parse_config("jitter:scale=0.05"), 0, steps=4,
                     workdir=str(tmp_path))
    assert ref["restores"] == [2, 4] == lossless["restores"]
    assert lossless["final"]["loss"] == ref["final"]["loss"]  # bit for bit
    assert jit["final"]["loss"] != ref["final"]["loss"]
    assert preset["restores"] == [2, 4] and len(preset["saves"]) == 4
    assert preset["ratio"] > 2 and preset["ratio_model"] > 2
    assert math.isfinite(preset["final"]["loss"])
    assert not os.listdir(tmp_path)  # each run's series is removed
    runs = [ref, lossless, jit, preset]
    summary = bf.summarize(runs)[name]
    assert summary["configs"]["lossless"]["bit_identical"] is True
    band = summary["noise_band"]
    assert band > 0
    table = bf.markdown({name: summary})
    assert "bit-identical to ref" in table and "| compact |" in table


def test_verdicts():
    def deg(mean, std, n=3):
        return {"mean": mean, "std": std, "n": n}
    assert bf.verdict_of(deg(0.001, 0.05), 0.002) == "within noise"
    assert bf.verdict_of(deg(-0.002, 0.0), 0.002) == "within noise"
    assert bf.verdict_of(deg(0.05, 0.001), 0.002) == "worse"
    assert bf.verdict_of(deg(-0.05, 0.001), 0.002) == "better"
    assert bf.verdict_of(deg(0.01, 0.02), 0.002) == "unclear"  # seeds disagree


def test_plot_draws_a_diverged_configuration_as_an_arrow(tmp_path):
    """A configuration whose worst seed ends beyond DIVERGED_PCT would flatten every other
    point of its panel: it is drawn as a labelled arrow, and the others keep their scale."""
    def config(kind, ratio, low, mean, high):
        return {"kind": kind, "ratio": ratio,
                "degradation": {"mean": mean, "min": low, "max": high, "std": 0.0, "n": 3}}
    summary = {"cnn": {"noise_band": 0.01, "configs": {
        "jitter": config("jitter", None, -0.01, 0.0, 0.01),
        "balanced": config("preset", 15.0, -0.04, 0.05, 0.13),
        "compact": config("preset", 41.0, 30.0, 4e4, 1.3e5)}}}
    path = tmp_path / "plot.png"
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    from matplotlib.axes import Axes
    labels = []
    annotate = Axes.annotate

    def recording(self, text, *args, **kwargs):
        labels.append(text)
        return annotate(self, text, *args, **kwargs)
    with mock.patch.object(Axes, "annotate", recording):
        bf.plot(summary, str(path))
    assert path.stat().st_size > 0
    assert any(t.startswith("compact: diverged") for t in labels)
    assert "balanced" in labels and "compact" not in labels
