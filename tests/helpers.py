"""Shared test helpers: dtypes to cover and bit-exact comparison; the harness of the tests
whose ranks run in process groups (torch.distributed, gloo, CPU)."""
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import ml_dtypes
import numpy as np

ALL_DTYPES = [np.float64, np.float32, np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn,
              ml_dtypes.float8_e5m2, np.complex64, np.complex128, np.int8, np.int16, np.int32,
              np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.bool_]


def random_bits(dtype, shape, seed=0) -> np.ndarray:
    """An array of ``dtype`` whose bytes are uniformly random (NaN payloads, subnormals...)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    if dtype == np.bool_:
        raw &= 1
    return raw.view(dtype).reshape(shape)


def assert_bit_exact(expected, actual) -> None:
    expected = np.asarray(expected)
    assert actual.shape == expected.shape
    assert actual.dtype == expected.dtype.newbyteorder("<") or actual.dtype == expected.dtype
    little = expected.astype(expected.dtype.newbyteorder("<"), copy=False) \
        if expected.dtype.byteorder == ">" else expected
    assert np.ascontiguousarray(little).tobytes() == actual.tobytes()


# -- tests of several ranks --------------------------------------------------------------------
#
# Such a test runs its own file as a script, a fresh interpreter:
# ``run_scenario(__file__, name, directory)``. The file ends with
# ``if __name__ == "__main__": scenario_main(SCENARIOS)``, which warms up once, then forks the
# ranks of each process group of the scenario; the test then checks what they left on disk.
# torch is imported only here, in the script.

def wait_for_child(pid: int, what: str, timeout: float = 20) -> None:
    """Wait for a forked child; kill it and fail the test with ``what`` if it is still running
    after ``timeout`` seconds (a child that hangs must not hang the suite)."""
    import pytest
    deadline = time.monotonic() + timeout
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(what)
        time.sleep(0.01)


def run_scenario(script: str, name: str, directory, timeout: float = 120) -> None:
    """Run ``python script name directory`` in a session of its own.

    Fails (AssertionError) with the end of its stderr, where the traceback of a rank that
    failed is, if it exits with an error; if it runs past ``timeout`` seconds, kills it and
    every rank it forked, and fails with what it wrote so far.
    """
    process = subprocess.Popen([sys.executable, script, name, str(directory)], text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               start_new_session=True)  # its ranks: one process group
    try:
        try:
            _, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            _, stderr = process.communicate()
            _wait_until_group_ends(process.pid)
            raise AssertionError(f"{name}: still running after {timeout} s, killed with its "
                                 f"ranks\n{stderr[-6000:]}") from None
        assert process.returncode == 0, stderr[-6000:]
    finally:
        try:  # whatever of it is left, even if this test is interrupted
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()


def _wait_until_group_ends(group: int, timeout: float = 10) -> None:
    """Wait until no process of process group ``group`` runs any more (zombies count as
    ended): SIGKILL is delivered asynchronously, and a rank orphaned by the script's own
    death may still be exiting when the script has been reaped."""
    deadline = time.monotonic() + timeout
    while _running_in_group(group):
        if time.monotonic() > deadline:
            raise AssertionError(f"process group {group} still running {timeout} s after "
                                 "SIGKILL")
        time.sleep(0.01)


def _running_in_group(group: int) -> bool:
    if not os.path.isdir("/proc"):
        return False  # no way to look; the SIGKILL was sent
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # ended since listed
            continue
        if int(fields[2]) == group and fields[0] not in "ZX":  # state, ppid, pgrp...
            return True
    return False


def scenario_main(scenarios: dict, *, killed: tuple = ()) -> None:
    """The ``__main__`` of a test file run by :func:`run_scenario` (``sys.argv``: the
    scenario's name and directory): runs each step of ``scenarios[name]`` in turn.

    A step ``(world, fn)`` forks ``world`` ranks that call ``fn(rank, world, directory)``
    (:func:`run_ranks`); ``(None, fn)`` calls ``fn(directory)`` in this process. A rank of a
    function in ``killed`` is meant to kill itself: the exit code is written to
    ``directory/killed`` and the scenario goes on.
    """
    import warnings

    import torch.multiprocessing as mp
    warnings.simplefilter("ignore")
    name, directory = sys.argv[1], sys.argv[2]
    warm_up(directory)
    for group, (world, fn) in enumerate(scenarios[name]):
        if world is None:
            fn(directory)
            continue
        try:
            run_ranks(world, fn, directory, group=group)
        except mp.ProcessExitedException as exc:
            if fn not in killed:
                raise
            # the rank killed itself; the other ranks were then ended
            with open(os.path.join(directory, "killed"), "w") as f:
                f.write(str(exc.exit_code))


def warm_up(directory) -> None:
    """Import what the ranks use and load inshrink's kernels once, before forking, rather
    than again in every rank."""
    import torch._dynamo  # fully_shard imports it on first use
    import torch.distributed.checkpoint
    import torch.distributed.checkpoint.state_dict
    import torch.distributed.fsdp  # noqa: F401

    import inshrink
    import inshrink.dcp.sharded  # noqa: F401 - imported once here, not in each rank
    from kit import start_lossy_kernels
    start_lossy_kernels()  # compiled here, not in each rank
    warm = os.path.join(directory, ".warm.ink")
    gen = np.random.default_rng(0)
    inshrink.save(warm, {"w.weight": gen.standard_normal((64, 64), np.float32),
                         "s.exp_avg": gen.standard_normal(512, np.float32),
                         "s.exp_avg_sq": gen.random(512, np.float32)},
                  policy="balanced", threads=1)
    inshrink.load(warm)
    os.unlink(warm)


def run_ranks(world: int, fn, directory, *, group: int = 0, timeout: float = 60) -> None:
    """Fork ``world`` ranks, each calling ``fn(rank, world, directory)`` in a gloo process
    group of their own (initialized through ``directory/.init-{group}``); return once all
    have returned.

    A rank that raises: torch's ``ProcessRaisedException``, its message the rank's traceback
    (the other ranks are ended); one that dies: ``ProcessExitedException``. Ranks still
    running after ``timeout`` seconds dump their Python stacks to stderr and are killed:
    ``TimeoutError`` naming them.
    """
    import torch.multiprocessing as mp
    init = f"file://{os.path.join(directory, f'.init-{group}')}"
    began = time.monotonic()
    context = mp.start_processes(_rank_main, args=(world, init, fn, directory), nprocs=world,
                                 start_method="fork", join=False)
    while not context.join(timeout=max(began + timeout - time.monotonic(), 0)):
        if time.monotonic() < began + timeout:
            continue  # some ranks are done, not all
        hung = [(rank, p.pid) for rank, p in enumerate(context.processes) if p.is_alive()]
        for _, pid in hung:
            os.kill(pid, signal.SIGUSR1)  # faulthandler: where it hangs
        time.sleep(0.2)
        for p in context.processes:
            p.kill()
            p.join()
        raise TimeoutError(f"{fn.__name__}: ranks (rank, pid) {hung} of {world} still running "
                           f"after {timeout} s, killed; their stacks are above")
    print(f"{fn.__name__}: {time.monotonic() - began:.1f} s", file=sys.stderr)


def fully_sharded(model, world: int) -> tuple:
    """``model`` sharded over the ``world`` ranks of the current process group with FSDP2
    (each Linear layer, then the whole), and its AdamW optimizer and StepLR scheduler."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(optim, step_size=2, gamma=0.5)
    return model, optim, sched


def _rank_main(rank: int, world: int, init: str, fn, directory) -> None:
    import faulthandler

    import torch
    import torch.distributed as dist
    faulthandler.register(signal.SIGUSR1)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))
    try:
        fn(rank, world, directory)
    finally:
        dist.destroy_process_group()
