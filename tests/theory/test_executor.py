"""Every executor returns exactly the serial results, in order; the process pool's workers
die with their parent, even when it is killed with SIGKILL."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from sat_theory import TeamPolicy, evaluate, random_mdp
from sat_theory.errors import InputError
from sat_theory.executor import map_tasks

ROOT = Path(__file__).resolve().parents[2]


def exact_J(seed: int) -> float:
    """A small independent case: J of a random policy on a random MDP, both from ``seed``."""
    mdp = random_mdp(8, 2, 3, layout="masked", seed=seed)
    return evaluate(mdp, TeamPolicy.random(mdp, seed + 1)).J


def test_process_equals_serial():
    seeds = list(range(6))
    serial = map_tasks(exact_J, seeds)
    assert serial == [exact_J(s) for s in seeds]
    assert map_tasks(exact_J, seeds, executor="process", workers=2) == serial


def test_ray_equals_serial():
    ray = pytest.importorskip("ray")
    import sys

    # the workers cannot import this test module: ship exact_J by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    seeds = list(range(6))
    try:
        got = map_tasks(exact_J, seeds, executor="ray")
    finally:
        ray.shutdown()
    np.testing.assert_array_equal(got, map_tasks(exact_J, seeds))


def test_unknown_executor_is_input_error():
    with pytest.raises(InputError, match="unknown executor"):
        map_tasks(exact_J, [0], executor="threads")


# ------------------------------------------------------------------ pool workers
def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan's zombie waits for its reaper)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    if stat.exists():
        try:
            return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            return False
    return True


POOL_SCRIPT = """
import functools, os, sys, time
import sat_theory.executor as E
from sat_theory.executor import map_tasks

if sys.argv[2] == "poll":  # the watcher thread of systems without prctl
    E._die_with_parent = functools.partial(E._die_with_parent, poll_s=0.1, prctl=False)

def hold(path):
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
    time.sleep(600)

map_tasks(hold, [os.path.join(sys.argv[1], f"w{k}") for k in range(2)],
          executor="process", workers=2)
"""


@pytest.mark.parametrize("mode", ["prctl", "poll"])
def test_process_pool_workers_die_with_a_killed_parent(tmp_path, mode):
    if mode == "prctl" and not sys.platform.startswith("linux"):
        pytest.skip("prctl is Linux-only")
    parent = subprocess.Popen([sys.executable, "-c", POOL_SCRIPT, str(tmp_path), mode], cwd=ROOT)
    files = [tmp_path / "w0", tmp_path / "w1"]
    try:
        deadline = time.monotonic() + 120  # a loaded CI machine starts interpreters slowly
        while not all(f.exists() for f in files):
            assert parent.poll() is None, "the pool script failed"
            assert time.monotonic() < deadline, "the workers never started"
            time.sleep(0.1)
        pids = [int(f.read_text()) for f in files]
        assert all(_alive(p) for p in pids)
    finally:
        parent.kill()  # SIGKILL: the parent runs no clean-up at all
        parent.wait()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in pids if _alive(p)]
    for p in left:  # do not leave orphans behind when the test fails
        os.kill(p, signal.SIGKILL)
    assert not left, f"pool workers {left} outlived their killed parent"
