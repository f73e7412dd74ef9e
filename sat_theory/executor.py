"""Run independent cases and seeds serially, in a process pool, or as Ray tasks.

``map_tasks(fn, items, executor=...)`` returns ``[fn(x) for x in items]`` in input order,
whatever the executor, so results are identical to the serial run as long as ``fn`` is a
pure function of its argument (every sweep here passes its seed inside the item).

- ``serial``: a plain loop (the default, and the reference).
- ``process``: :class:`concurrent.futures.ProcessPoolExecutor` (stdlib) with ``workers``.
- ``ray``: each item is a Ray task (``ray.remote(fn)``); connects to ``ray_address`` (e.g.
  ``auto`` or ``ray://host:10001``) or starts a local cluster. Ray is an optional extra:
  ``pip install -e '.[ray]'``.

``fn`` must be importable by name (a module-level function) for ``process`` and ``ray``.
Process-pool workers die with the process that started the pool, even when it is killed
with SIGKILL and runs no clean-up (:func:`_die_with_parent`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor

from .errors import InputError

__all__ = ["EXECUTORS", "map_tasks", "add_executor_arguments"]

EXECUTORS = ("serial", "process", "ray")


def add_executor_arguments(parser) -> None:
    """``--executor`` and ``--ray-address`` for sweep commands."""
    parser.add_argument("--executor", choices=EXECUTORS, default="serial",
                        help="where independent cases/seeds run: a serial loop (default), a "
                             "local process pool, or Ray tasks; results are identical")
    parser.add_argument("--workers", type=int, default=None,
                        help="process-pool size (default: number of CPUs)")
    parser.add_argument("--ray-address", default=None,
                        help="Ray cluster address for --executor ray (default: start a local "
                             "cluster); e.g. 'auto' or 'ray://head:10001'")


def map_tasks(fn: Callable, items: Iterable, *, executor: str = "serial",
              workers: int | None = None, ray_address: str | None = None,
              progress: Callable[[int], None] | None = None,
              ship_modules: tuple = ()) -> list:
    """``[fn(x) for x in items]`` on the chosen executor, in input order.

    ``progress(k)`` is called with the number of finished items as results arrive.
    ``ship_modules``: modules Ray workers may be unable to import (e.g. ``experiments/`` of a
    source checkout); their functions and classes are sent by value.
    """
    items = list(items)
    if executor == "serial":
        out = []
        for x in items:
            out.append(fn(x))
            if progress:
                progress(len(out))
        return out
    if executor == "process":
        if workers is not None and workers < 1:
            raise InputError(f"--workers must be >= 1, got {workers}")
        with ProcessPoolExecutor(max_workers=workers or os.cpu_count(),
                                 initializer=_die_with_parent, initargs=(os.getpid(),)) as pool:
            futures = [pool.submit(fn, x) for x in items]
            out = []
            for f in futures:
                out.append(f.result())
                if progress:
                    progress(len(out))
            return out
    if executor == "ray":
        ray = _ray(ray_address)
        for m in ship_modules:
            ray.cloudpickle.register_pickle_by_value(m)
        remote = ray.remote(fn)
        refs = [remote.remote(x) for x in items]
        pending, done = list(refs), 0
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            done += len(ready)
            if progress:
                progress(done)
        return ray.get(refs)
    raise InputError(f"unknown executor {executor!r}; choose one of {', '.join(EXECUTORS)}")


#: ``prctl`` option: the signal the kernel sends this process when its parent exits
PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int, poll_s: float = 0.5,
                     prctl: bool = sys.platform.startswith("linux")) -> None:
    """Process-pool initializer: end this worker when the process that started the pool
    (``parent_pid``) dies. A parent killed with SIGKILL runs no clean-up, and its idle
    workers would otherwise wait on their task queue for ever.

    Linux (``prctl``): the kernel sends SIGKILL when the worker's parent exits
    (``prctl(PR_SET_PDEATHSIG)``, which works even while the worker is in C code holding the
    GIL; the pool's workers are started by the thread calling :func:`map_tasks`, which
    outlives the pool, as ``PDEATHSIG`` fires when the creating *thread* exits). Elsewhere a
    daemon thread polls the parent pid every ``poll_s`` seconds (an orphan is re-parented,
    so its parent pid changes). A parent that died before either was armed is caught by the
    check in between.
    """
    ppid = os.getppid()  # parent_pid itself, or the fork server under "forkserver"
    armed = False
    if prctl:
        libc = ctypes.CDLL(None, use_errno=True)
        armed = libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    if ppid != parent_pid and not _alive(parent_pid):
        os._exit(1)
    if armed:
        return

    def watch():
        while os.getppid() == ppid:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only checks that the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # a process of another user: the pid was reused
        return False
    return True


def _ray(address: str | None):
    try:
        import ray
    except ImportError:
        raise InputError("--executor ray needs Ray: pip install -e '.[ray]'") from None
    if not ray.is_initialized():
        kwargs = dict(address=address, log_to_driver=False)
        if address is None:  # a local cluster; these may not be passed when connecting
            kwargs.update(num_cpus=os.cpu_count(), include_dashboard=False)
        try:
            ray.init(**kwargs)
        except ConnectionError as e:
            raise InputError(f"cannot connect to Ray at {address!r}: {e}") from None
    return ray
