"""inshrink.series.report and `inshrink series report`: per-step records from the manifest and each
file's index, a text table, --json, and a PNG drawn with matplotlib."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import inshrink
from inshrink import errors
from inshrink.series.report import SEARCH_FIELDS, plot_series, search_summary, series_report
from inshrink.search import SEARCH_KEY
from inshrink.io.file import File
from kit import ROOT, run_cli as run
from test_cli_json import FILE_KEYS, KEYS, SERIES_KEYS

PNG = b"\x89PNG\r\n\x1a\n"


def weights(seed):
    rng = np.random.default_rng(seed)
    return {"layer.weight": (rng.standard_normal((96, 64)) * 0.05).astype(np.float32),
            "layer.bias": np.zeros(64, np.float32)}


def quality(state):
    """A loss that grows with the weights' distance from the reference."""
    return 1.0 + float(np.mean((state["layer.weight"] - REFERENCE) ** 2)) * 100


REFERENCE = weights(0)["layer.weight"]


@pytest.fixture()
def searched(tmp_path):
    """Steps 1-3 chosen by a search, step 4 lossless without one, step 5 with a report of
    another shape (metadata any writer may set)."""
    series = inshrink.Series(tmp_path / "s", keyframe_every=3)
    search = inshrink.Search(0.05, max_evals=3)
    for step in (1, 2, 3):
        result = search.choose(weights(0), quality)
        series.save(step, weights(0), policy=result.policy, metadata=result.metadata())
    series.save(4, weights(1))
    series.save(5, weights(2), metadata={SEARCH_KEY: "[1, 2"})
    return tmp_path / "s"


def test_records_come_from_the_manifest_and_each_index(searched):
    series = inshrink.Series(searched)
    records = series_report(searched)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert any(not r["keyframe"] for r in records) and records[-1]["keyframe"]
    for r, entry in zip(records, series.checkpoints()):
        assert (r["file"], r["keyframe"], r["base"], r["stored_bytes"]) == \
            (entry.file, entry.keyframe, entry.base, entry.bytes)
        with File(searched / entry.file) as f:
            assert r["tensor_bytes"] == sum(i.nbytes for i in f.infos())
        assert r["ratio"] == pytest.approx(r["tensor_bytes"] / r["stored_bytes"])
    for r in records[:3]:
        report = json.loads(series.metadata(r["step"])[SEARCH_KEY])
        chosen = report["chosen"]
        assert r["search"] == report["mode"] and r["bins"] == chosen["bins"]
        assert (r["prune"], r["protect"]) == (chosen["prune"], chosen["protect"])
        assert r["drop"] == report["chosen_result"]["drop"]
        assert r["epsilon"] == 0.05 and r["lossy_tensors"] == 1
        assert 0 < r["max_rel_l2_error"] < 1
    assert records[3] == {**records[3], **dict.fromkeys(SEARCH_FIELDS), "lossy_tensors": 0,
                          "max_rel_l2_error": None}
    assert records[4]["search"] == "unreadable" and records[4]["bins"] is None


def test_no_tensor_payload_is_decoded(searched, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("decoded a tensor")
    monkeypatch.setattr(File, "load", refuse)
    for name in ("read", "read_into", "codes", "__getitem__"):
        monkeypatch.setattr(File, name, refuse)
    assert len(series_report(searched)) == 5


@pytest.mark.parametrize("raw, expected", [
    ('{"mode": "guided", "chosen": null, "epsilon": 0.1}',
     {"search": "guided", "bins": None, "epsilon": 0.1}),  # searched, weights kept lossless
    ('{"mode": 3, "chosen": {"bins": "8", "prune": true}, "epsilon": NaN}',
     {"search": "unknown", "bins": None, "prune": None, "epsilon": None}),
    ("[]", {"search": "unreadable"}),
    ("\xff{", {"search": "unreadable"}),
])
def test_search_summary_takes_only_values_of_the_expected_type(raw, expected):
    summary = search_summary(raw)
    assert set(summary) == set(SEARCH_FIELDS)
    assert summary == {**dict.fromkeys(SEARCH_FIELDS), **expected}


def test_plot_has_one_point_per_checkpoint_and_writes_a_png(searched, tmp_path):
    out = tmp_path / "series.png"
    fig = plot_series(searched, out)
    size, ratio, bins, fractions, drop = fig.axes[:5]
    points = {ax: {line.get_gid(): len(line.get_xdata()) for line in ax.get_lines()}
              for ax in fig.axes}
    assert points[size]["whole"] + points[size]["delta"] == 5
    assert points[ratio]["whole"] + points[ratio]["delta"] == 5
    assert points[size]["raw"] == 5
    assert points[bins]["bins"] == points[drop]["drop"] == points[fractions]["prune"] == 5
    bins_y = [y for y in bins.get_lines()[0].get_ydata()]
    assert np.isnan(bins_y[3:]).all() and not np.isnan(bins_y[:3]).any()  # no search: gap
    shaded = [p.get_x() for p in bins.patches if p.get_gid() == "no_search"]
    assert shaded == [3.5]  # steps 4 and 5 (no report, an unreadable one): one shaded span
    data = out.read_bytes()
    assert data.startswith(PNG) and len(data) > 10_000
    assert sorted(os.listdir(tmp_path)) == ["s", "series.png"]  # no temporary left


def test_plot_of_a_series_without_search_has_two_panels(tmp_path):
    series = inshrink.Series(tmp_path / "s")
    for step in (10, 20):
        series.save(step, weights(step))
    fig = plot_series(tmp_path / "s")
    assert len(fig.axes) == 2
    assert sum(len(line.get_xdata()) for line in fig.axes[0].get_lines()
               if line.get_gid() in ("whole", "delta")) == 2


def test_without_matplotlib_a_typed_error_says_how_to_install(searched, monkeypatch, tmp_path):
    for name in [n for n in sys.modules if n.split(".")[0] == "matplotlib"] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)  # as if it were not installed
    with pytest.raises(errors.InvalidArgumentError, match=r'pip install "inshrink\[plot\]"'):
        plot_series(searched, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_not_a_series_is_a_typed_error(tmp_path):
    with pytest.raises(errors.InvalidArgumentError, match="not a series"):
        series_report(tmp_path)


# -- the command line ------------------------------------------------------------------------

def test_cli_prints_a_table_and_draws_the_plot(searched, tmp_path):
    r = run("series", "report", searched, "--plot", "p.png", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:4] == ["step", "kind", "stored", "ratio"]
    assert [line.split()[0] for line in lines[1:6]] == ["1", "2", "3", "4", "5"]
    assert "unreadable" in lines[5] and lines[-1] == "plot -> p.png"
    assert (tmp_path / "p.png").read_bytes().startswith(PNG)
    again = run("series", "report", searched, "--plot", "p.png", cwd=tmp_path)
    assert again.returncode == 2 and "exists" in again.stderr
    bad = run("series", "report", searched, "--plot", "p.pdf", cwd=tmp_path)
    assert bad.returncode == 2 and ".png" in bad.stderr


def test_cli_json_has_the_shape_of_every_command(searched, tmp_path):
    r = run("series", "report", searched, "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert set(report) == KEYS and report["command"] == "series report"
    assert report["outputs"] == [] and len(report["files"]) == 5
    for f in report["files"]:
        assert set(f) == FILE_KEYS | SERIES_KEYS | {"search"}
        assert set(f["search"]) == set(SEARCH_FIELDS)
    assert report["files"][0]["search"]["bins"] == series_report(searched)[0]["bins"]
    assert report["files"][3]["search"]["search"] is None
    plotted = json.loads(run("series", "report", searched, "--json", "--plot", "p.png",
                             cwd=tmp_path).stdout)
    assert plotted["outputs"] == ["p.png"]
    assert plotted["bytes_out"] == os.path.getsize(tmp_path / "p.png")


def test_cli_without_matplotlib_exits_2_with_the_install_hint(searched, tmp_path):
    code = ("import sys; sys.modules['matplotlib'] = None; from inshrink.cli import main; "
            f"sys.exit(main(['series', 'report', {str(searched)!r}, '--plot', 'p.png']))")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 2
    assert 'pip install "inshrink[plot]"' in r.stderr and 'pip install ".[plot]"' in r.stderr
    assert not (tmp_path / "p.png").exists()
    # the table needs no matplotlib
    code = code.replace(", '--plot', 'p.png'", "")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("      step")


def test_cli_not_a_series_exits_2(tmp_path):
    r = run("series", "report", tmp_path, cwd=tmp_path)
    assert r.returncode == 2 and "not a series" in r.stderr
