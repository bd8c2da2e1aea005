"""The command line used as a new user would, from docs/cli.md and --help: paths that reach the
input another way, outputs inside the input, empty or conflicting options, long names."""
import os
import stat
import subprocess
import sys

import numpy as np
import pytest

import inshrink
import kit
from kit import ROOT


def run(*args, cwd, timeout=60):
    return kit.run_cli(*args, cwd=cwd, timeout=timeout)


def one_line_error(r, code: int) -> str:
    """:func:`kit.one_line_error`, and no success message on stdout."""
    assert r.stdout == "", r.stdout
    return kit.one_line_error(r, code)


def test_an_output_that_is_the_input_through_a_link_is_refused(model):
    os.symlink(".", model / "here")
    os.replace(model / "m.safetensors", model / "m.bin")
    original = (model / "m.bin").read_bytes()
    err = one_line_error(run("compress", "m.bin", "-o", "here/m.bin", "-f", cwd=model), 2)
    assert "here/m.bin: the output would overwrite the input m.bin" in err, err
    assert (model / "m.bin").read_bytes() == original
    inshrink.save(model / "a.data", {"w": np.ones(3, np.float32)})
    packed = (model / "a.data").read_bytes()
    err = one_line_error(run("decompress", "a.data", "-o", "here/a.data", "-f", cwd=model), 2)
    assert "output would overwrite the input" in err
    assert (model / "a.data").read_bytes() == packed


def series_of_two(directory):
    series = inshrink.Series(directory)
    for step in (1, 2):
        series.save(step, {"w": np.full((8, 8), step, np.float32)})


def test_series_restore_into_the_series_directory_is_refused(tmp_path):
    series_of_two(tmp_path / "s")
    before = {n: (tmp_path / "s" / n).read_bytes() for n in os.listdir(tmp_path / "s")}
    for name in ("step_000000000002.ink", "extra.safetensors"):
        err = one_line_error(run("series", "restore", "s", "--step", "1", "-o",
                                 f"s/{name}", "-f", cwd=tmp_path), 2)
        assert "inside the input directory s" in err, err
    assert {n: (tmp_path / "s" / n).read_bytes() for n in os.listdir(tmp_path / "s")} == before
    assert run("series", "verify", "s", cwd=tmp_path).returncode == 0


def test_consolidate_into_the_checkpoint_directory_is_refused(tmp_path):
    # refused before the checkpoint is read: a directory that looks like one is enough
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / ".metadata").write_bytes(b"x")
    rank = tmp_path / "ck" / "rank00000-0123456789ab.ink"
    rank.write_bytes(b"rank data")
    err = one_line_error(run("consolidate", "ck", "-o", "ck/rank00000-0123456789ab.ink", "-f",
                             cwd=tmp_path), 2)
    assert "inside the input directory ck" in err, err
    assert rank.read_bytes() == b"rank data"


@pytest.mark.parametrize("args", [
    ("compress", "m.safetensors", "-o", ""),
    ("decompress", "m.ink", "-o", ""),
    ("consolidate", "ck", "-o", ""),
    ("series", "restore", "s", "-o", ""),
    ("series", "report", "s", "--plot", ""),
])
def test_an_empty_output_name_is_a_usage_error(model, args):
    inshrink.save(model / "m.ink", {"w": np.ones(3, np.float32)})
    before = sorted(os.listdir(model))
    err = one_line_error(run(*args, cwd=model), 2)
    assert "empty" in err, err
    assert sorted(os.listdir(model)) == before


def test_lossy_and_preset_lossless_conflict(model):
    err = one_line_error(run("compress", "m.safetensors", "--lossy", "--preset", "lossless",
                             cwd=model), 2)
    assert "--lossy" in err and "lossless" in err, err
    assert not (model / "m.ink").exists()


@pytest.mark.parametrize("args", [
    ("compress", "m.safetensors", "--bins", "0"),
    ("compress", "m.safetensors", "--preset", "fast"),
    ("compress", "m.safetensors", "--no-such-flag"),
    ("compress",),
    ("series", "restore", "s"),
    ("frobnicate",),
])
def test_usage_errors_of_the_parser_are_one_line(model, args):
    err = one_line_error(run(*args, cwd=model), 2)
    assert err.startswith("inshrink") and "--help" in err, err


def test_a_long_output_name_that_the_file_system_allows_is_written(model):
    name = "a" * (255 - len(".safetensors"))  # its .ink name fits; ".name.XXXXXXXX.tmp" not
    os.replace(model / "m.safetensors", model / f"{name}.safetensors")
    r = run("compress", f"{name}.safetensors", cwd=model)
    assert r.returncode == 0, r.stderr
    assert (model / f"{name}.ink").read_bytes().startswith(b"\x89INK")
    assert [n for n in os.listdir(model) if n.startswith(".")] == []  # no debris


def test_a_long_directory_name_is_converted(model):
    tree = model / ("t" * 250)  # its output tree-ink fits; the hidden staging name did not
    tree.mkdir()
    os.replace(model / "m.safetensors", tree / "m.safetensors")
    r = run("compress", tree.name, cwd=model)
    assert r.returncode == 0, r.stderr
    assert (model / f"{tree.name}-ink" / "m.ink").exists()
    assert [n for n in os.listdir(model) if n.startswith(".")] == []


def test_a_long_restored_name_is_written(tmp_path):
    series_of_two(tmp_path / "s")
    r = run("series", "restore", "s", "-o", f"{'c' * 243}.safetensors", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["c" * 243 + ".safetensors", "s"]


def test_decompress_of_a_series_points_to_series_restore(tmp_path):
    series_of_two(tmp_path / "s")
    for target in ("s", "s/step_000000000001.d.ink"):
        err = one_line_error(run("decompress", target, "-o", "out.safetensors", cwd=tmp_path), 2)
        assert "inshrink series restore" in err, err
    assert sorted(os.listdir(tmp_path)) == ["s"]


def test_info_of_a_file_without_tensors_prints_no_infinite_ratio(tmp_path):
    inshrink.save(tmp_path / "none.ink", {})
    r = run("info", "none.ink", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "inf" not in r.stdout, r.stdout


def test_a_fifo_or_device_is_neither_read_nor_replaced(model):
    os.mkfifo(model / "in.safetensors")
    err = one_line_error(run("compress", "in.safetensors", "-o", "x.ink", cwd=model,
                             timeout=20), 2)
    assert "not a regular file" in err  # before: waited forever for a writer
    os.mkfifo(model / "out.ink")  # as /dev/null would be: replaced by a regular file
    err = one_line_error(run("compress", "m.safetensors", "-o", "out.ink", "-f", cwd=model), 2)
    assert "not a regular file" in err
    assert stat.S_ISFIFO(os.stat(model / "out.ink").st_mode)
    assert sorted(os.listdir(model)) == ["in.safetensors", "m.safetensors", "out.ink"]


def test_an_output_that_is_this_process_stdout_is_refused(model):
    # as -o /dev/stdout with stdout redirected to a file: the rename replaced the link
    os.symlink("/proc/self/fd/1", model / "out.ink")
    with open(model / "stdout.txt", "wb") as stdout:
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        r = subprocess.run([sys.executable, "-m", "inshrink", "compress", "m.safetensors",
                            "-o", "out.ink", "-f"], cwd=model, stdout=stdout,
                           stderr=subprocess.PIPE, text=True, env=env, timeout=60)
    assert r.returncode == 2 and "out.ink is not a regular file" in r.stderr, r.stderr
    assert os.path.islink(model / "out.ink")


def test_a_directory_as_output_is_named_before_force_is_asked_for(model):
    (model / "d").mkdir()
    err = one_line_error(run("compress", "m.safetensors", "-o", "d", cwd=model), 2)
    assert "d is a directory; give a file name with -o" in err, err
    err = one_line_error(run("compress", "m.safetensors", "-o", "new/", cwd=model), 2)
    assert "new/ is a directory; give a file name with -o" in err, err  # was: Not a directory


def test_decompress_refuses_a_dtype_safetensors_cannot_store(tmp_path):
    inshrink.save(tmp_path / "c.ink", {"c": np.ones(3, np.complex128)})
    err = one_line_error(run("decompress", "c.ink", cwd=tmp_path), 1)
    assert "c.ink" in err and "'c' is C128, which safetensors cannot store" in err, err
    assert sorted(os.listdir(tmp_path)) == ["c.ink"]  # before: a file safetensors rejects
    inshrink.save(tmp_path / "m.ink", {"__metadata__": np.ones(2, np.float32)})
    err = one_line_error(run("decompress", "m.ink", cwd=tmp_path), 1)
    assert "a tensor named '__metadata__' cannot be stored in safetensors" in err, err


def test_an_output_named_as_the_other_format_is_refused(model):
    err = one_line_error(run("compress", "m.safetensors", "-o", "copy.safetensors", cwd=model),
                         2)
    assert "copy.safetensors: compress writes an .ink file" in err, err
    inshrink.save(model / "a.ink", {"w": np.ones(3, np.float32)})
    err = one_line_error(run("decompress", "a.ink", "-o", "b.ink", cwd=model), 2)
    assert "b.ink: decompress writes a .safetensors file" in err, err
    assert sorted(os.listdir(model)) == ["a.ink", "m.safetensors"]


def fake_dcp_series(directory):
    """What the commands look at before reading a series of sharded checkpoints (no torch)."""
    step = directory / "step_000000000010"
    step.mkdir(parents=True)
    (directory / "series.json").write_text("{}")
    (step / ".metadata").write_bytes(b"x")
    (step / "rank00000-0123456789ab.ink").write_bytes(b"rank data")
    return step


def test_a_series_of_sharded_checkpoints_is_named_by_every_command(tmp_path):
    step = fake_dcp_series(tmp_path / "run")
    for args, hint in [(("consolidate", "run", "-o", "o.ink"), "consolidate one of its steps"),
                       (("decompress", "run", "-o", "o"), "inshrink consolidate run/step_"),
                       (("series", "ls", "run"), "read it with inshrink info")]:
        err = one_line_error(run(*args, cwd=tmp_path), 2)
        assert "run is a series of sharded checkpoints" in err and hint in err, err
    # another step's files belong to the series as much as this step's
    err = one_line_error(run("consolidate", "run/step_000000000010", "-o", "run/x.ink",
                             cwd=tmp_path), 2)
    assert "inside the input directory run" in err, err
    assert sorted(os.listdir(tmp_path / "run")) == ["series.json", step.name]


def test_decompress_of_a_sharded_delta_points_to_consolidate(tmp_path):
    series_of_two(tmp_path / "s")
    (tmp_path / "ck").mkdir()
    os.replace(tmp_path / "s" / "step_000000000001.d.ink",
               tmp_path / "ck" / "rank00000-0123456789ab.d.ink")
    err = one_line_error(run("decompress", "ck", cwd=tmp_path), 2)
    assert "is a delta" in err and "inshrink consolidate ck -o OUT" in err, err


def test_an_error_after_the_progress_bar_starts_is_on_a_line_of_its_own(tmp_path):
    import pty
    rng = np.random.default_rng(0)
    inshrink.save(tmp_path / "a.ink", {n: rng.standard_normal(1 << 18).astype(np.float32)
                                       for n in ("a", "b")}, threads=1)
    data = bytearray((tmp_path / "a.ink").read_bytes())
    data[len(data) * 3 // 4] ^= 0xFF  # in b's records: a is decoded first
    (tmp_path / "a.ink").write_bytes(bytes(data))
    # the bar is drawn at once rather than after half a second, on a terminal as stderr
    code = ("import sys, inshrink.progress as p; p.ProgressBar.__init__.__defaults__ = (0.0,); "
            "from inshrink.cli import main; sys.exit(main())")
    leader, follower = pty.openpty()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code, "decompress", "a.ink", "--threads", "1"],
                       cwd=tmp_path, stderr=follower, stdout=subprocess.PIPE, env=env,
                       timeout=60)
    os.close(follower)
    shown = b""
    while True:
        try:
            piece = os.read(leader, 65536)
        except OSError:  # the terminal is closed once everything was read
            break
        if not piece:
            break
        shown += piece
    os.close(leader)
    assert r.returncode == 1
    lines = shown.decode().replace("\r\n", "\n").split("\n")
    assert any("decompress [" in line for line in lines), shown
    assert any(line.startswith("inshrink: error: ") for line in lines), shown
    assert sorted(os.listdir(tmp_path)) == ["a.ink"]


def test_compress_help_gives_the_defaults_of_the_lossy_options(tmp_path):
    r = run("compress", "--help", cwd=tmp_path)
    text = " ".join(r.stdout.split())
    assert r.returncode == 0
    assert "default 16 when only --prune or --protect is given" in text, text
    assert "up to --bins meets is stored exactly" in text, text


def test_a_tree_written_inside_the_tree_read_is_a_usage_error(model):
    (model / "ck").mkdir()
    os.replace(model / "m.safetensors", model / "ck" / "m.safetensors")
    os.symlink("ck", model / "link")
    err = one_line_error(run("compress", "ck", "-o", "link/inner", cwd=model), 2)  # was 1
    assert "link/inner: the output would be written inside the input directory ck" in err
    assert sorted(os.listdir(model / "ck")) == ["m.safetensors"]


def test_a_path_that_is_not_utf8_is_shown_with_its_bytes(model):
    name = os.fsdecode(b"m\xff\x1b.safetensors")
    os.replace(model / "m.safetensors", model / name)
    r = run("compress", name, "-o", "out.ink", cwd=model)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("m\\xff\\x1b.safetensors -> out.ink: "), r.stdout  # not \udcff


def test_series_ls_says_why_it_exits_1(tmp_path):
    series_of_two(tmp_path / "s")
    os.unlink(tmp_path / "s" / "step_000000000002.ink")
    r = run("series", "ls", "s", cwd=tmp_path)
    assert r.returncode == 1 and "step_000000000002.ink" in r.stdout
    assert r.stderr.startswith("inshrink: error: s/step_000000000002.ink: "), r.stderr  # was ""
    assert "No such file or directory" in r.stderr and "Errno" not in r.stderr


def test_decompress_of_a_series_delta_names_the_delta_and_the_base_it_needs(tmp_path):
    series_of_two(tmp_path / "s")
    delta = "s/step_000000000001.d.ink"
    assert (tmp_path / delta).exists()
    err = one_line_error(run("decompress", delta, "-o", "out.safetensors", cwd=tmp_path), 2)
    # the base is named by a path that exists from where the command ran
    assert err.startswith(f"inshrink: error: {delta} is a delta file"), err
    assert "needs its base s/step_000000000002.ink" in err, err
    assert "inshrink series restore s --step 1 -o OUT" in err, err
    # alone, the delta's base is not there: the error says so instead of naming a file
    os.replace(tmp_path / delta, tmp_path / "lone.d.ink")
    err = one_line_error(run("decompress", "lone.d.ink", "-o", "out.safetensors",
                             cwd=tmp_path), 2)
    assert "needs its base step_000000000002.ink, which is not there" in err, err
