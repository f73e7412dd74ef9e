"""The one training runner: stages of :func:`~sat_theory.algorithm.run_stage` for any
:class:`~sat_theory.team.Team`, with plug-and-play swaps, saved policies, progress, an
atomic checkpoint after every agent update, exact resume and an owned run folder.

Backends (tabular, LLM, LLM-on-Ray) supply only a team; the runner reaches the team's state
through ``team.state_dict()`` / ``team.load_state_dict(d)`` (a tree of arrays, tensors,
registered dataclasses and JSON values, :mod:`sat_theory.checkpoint`). ``sat train`` finds
a backend by name in :data:`BACKENDS` (``"module:attribute"``, imported only when used, so
``sat_theory`` never imports ``sat_llm``).

Run folder (``--out DIR``):

- ``.lock`` — held (``flock``) for the run's lifetime; a second process on the folder fails
  at once with one line. The lock dies with its process, even on SIGKILL.
- ``config.json`` — ``algorithm`` (the :class:`~sat_theory.algorithm.TrainConfig`),
  ``backend`` (what the backend needs to rebuild the team) and backend extras.
- ``metrics.jsonl`` — the records (:mod:`sat_theory.metrics`), each with ``seconds`` (wall
  time since the previous record: the one field a resumed run does not reproduce).
- ``checkpoint.safetensors`` — written atomically after config.json (nothing done yet), after
  every agent update, after a swap and after every stage: the team's state, the algorithm's
  :class:`~sat_theory.algorithm.RunState`, the position inside the stage (``run_stage``'s
  resume point: completed steps, order, stage-start snapshots, the batch in use, the
  importance-weight log-ratios and the adaptive-δ reference score) and how many records it
  covers.
- ``policies/stage{k}.<ext>`` (``--save-policies``) — the team's policy at the start of stage
  k (after a swap; ``stage{k}_preswap`` before it; ``stage{K}`` final), via ``team.save``.
- ``eval_{k}.jsonl`` — per-problem held-out results after ``k`` stages (``0``: the untrained
  team; with ``eval_every`` only where the team is evaluated: ``k = 0``, every
  ``eval_every``-th and the last) when the team has ``eval_records()``; ``eval_{k}_swap.jsonl`` right after a
  plug-and-play swap before stage ``k``.
- ``tb/``, ``wandb/``, ``mlruns/`` — the trackers of ``--report-to`` (:mod:`sat_theory.tracking`:
  the records mirrored once a checkpoint covers them; default ``tensorboard`` when installed).
  ``--resume`` reports to the saved run's trackers unless ``--report-to`` is given again.

Console (:mod:`sat_theory.progress`): a bar over agent updates (and, for LLM teams, bars
inside each update) on stderr when it is a terminal or with ``--verbose`` (which also prints
one line per stage); none with ``--quiet``. The summary line goes to stdout.

Resume (``--resume DIR``): lock, drop records beyond the checkpoint's count (they belong to
a step that is redone), restore, continue. Every record then equals the uninterrupted run's
but for ``seconds``. A folder whose run was killed before its first checkpoint restarts from
the beginning. A new run into a folder holding a run is refused unless ``--overwrite``
(which first removes the run's files listed in :data:`RUN_FILES`, and only from a folder
carrying the run marker ``.sat-run``; :mod:`sat_theory.ownership`).
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .algorithm import RunState, TrainConfig, run_stage, swap_agent
from .backends import BACKENDS, load_backend
from .checkpoint import load_state, save_state, write_atomic
from .errors import InputError
from .metrics import RunWriter, write_json_atomic
from .ownership import (
    RUN_ENTRIES,
    RUN_MARKER,
    check_out,
    is_run_entry,
    read_marker,
    remove_run_entries,
    run_temp_files,
    write_marker,
)
from .progress import bar as progress_bar
from .progress import note
from .team import Closeable, HasEvalRecords, HasPolicyFormat, SavesPolicy, Team
from .tracking import check_installed, default_report_to, parse_report_to

__all__ = ["Runner", "RunFolder", "RunOptions", "BACKENDS", "load_backend", "CHECKPOINT",
           "RUN_FILES", "run_fresh", "run_resume", "train",
           "train_config_from_dict"]

CHECKPOINT = "checkpoint.safetensors"
LOCK = ".lock"
#: what a run writes into its folder (``--overwrite`` removes exactly these)
RUN_FILES = RUN_ENTRIES  # and eval_{k}[_swap].jsonl, exact temp names (ownership.is_run_entry)

def train_config_from_dict(d: dict) -> TrainConfig:
    """A :class:`TrainConfig` from its ``to_dict()`` form (a saved ``config.json``)."""
    if not isinstance(d, dict):
        raise InputError("config.json: 'algorithm' is not an object")
    try:
        return TrainConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})
    except TypeError as e:
        raise InputError(f"config.json: bad algorithm settings ({e})") from None


# ------------------------------------------------------------------ the run folder
class RunFolder:
    """An owned run folder (module docstring). ``with RunFolder(path) as f:`` holds the
    lock; :meth:`claim` decides between a fresh run, an overwrite and a refusal."""

    def __init__(self, path):
        self.path = Path(path)
        self._fd: int | None = None
        self._new_marker = False  # claim() marked a folder that was not a run

    def __enter__(self):
        if self.path.exists() and not self.path.is_dir():
            raise InputError(f"--out {self.path} is a file, not a folder")
        self._made_dir = not self.path.exists()
        self._made_lock = not (self.path / LOCK).exists()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise InputError(f"cannot use {self.path} as a run folder: {e.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            other = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise InputError(f"{self.path} is in use by another run (pid {other}); wait for it "
                             "to finish or choose another --out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc):
        if self._fd is None:
            return
        try:  # a refused or failed start (nothing written yet) leaves the folder as it found it
            if self._new_marker and not self.has_run():
                (self.path / RUN_MARKER).unlink(missing_ok=True)
            if self._made_lock and read_marker(self.path) != "run":
                (self.path / LOCK).unlink(missing_ok=True)
                if self._made_dir and not any(self.path.iterdir()):
                    self.path.rmdir()
        except OSError:
            pass
        os.close(self._fd)  # releases the lock
        self._fd = None

    def remove_temp_files(self) -> None:
        """Delete the torn temporary files of a killed writer (exact names only; the caller
        holds the lock and has checked that the folder is a run)."""
        for tmp in run_temp_files(self.path):
            tmp.unlink(missing_ok=True)

    def has_run(self) -> bool:
        return any((self.path / n).exists() for n in ("config.json", "metrics.jsonl", CHECKPOINT))

    def claim(self, overwrite: bool) -> None:
        """Make the folder ready for a fresh run: refuse one holding a run unless
        ``overwrite``, which removes the run's files (:data:`RUN_FILES`) first — only from a
        folder with our marker; a folder inside or above a run or export, or holding
        run-named files of something else, is refused and nothing is deleted."""
        check_out(self.path, kind="run")
        if self.has_run() and not overwrite:
            raise InputError(f"{self.path} holds a run already; use --resume {self.path} to "
                             "continue it or --overwrite to replace it")
        if read_marker(self.path) == "run":
            remove_run_entries(self.path)  # a marked folder: ours to clear
        else:
            foreign = sorted(n for n in os.listdir(self.path) if is_run_entry(n))
            if foreign:
                raise InputError(f"{self.path} holds {', '.join(foreign[:4])} but is not a sat "
                                 f"run folder (no {RUN_MARKER}); nothing was deleted; choose "
                                 "another --out or remove them yourself")
        self._new_marker = read_marker(self.path) != "run"
        write_marker(self.path, "run", RUN_ENTRIES)

    def config(self) -> dict:
        path = self.path / "config.json"
        if not path.is_file():
            raise InputError(f"no run to resume in {self.path} (config.json missing)")
        try:
            conf = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise InputError(f"{path} is not valid JSON ({type(e).__name__})") from None
        if not isinstance(conf, dict) or "algorithm" not in conf or "backend" not in conf:
            raise InputError(f"{path} is not a run configuration (needs 'algorithm', 'backend')")
        return conf

    def checkpoint(self) -> dict | None:
        path = self.path / CHECKPOINT
        if not path.exists():
            return None
        ck = load_state(path)
        check_checkpoint(ck, path)
        return ck


def check_checkpoint(ck, path) -> None:
    """The runner's part of a checkpoint has the shape :meth:`Runner.checkpoint` writes (the
    team's part is the backend's to check): else one :class:`InputError`, never a KeyError
    deep inside a resume."""
    from numbers import Integral, Real

    def count(x):
        return isinstance(x, Integral) and not isinstance(x, bool) and x >= 0

    def bad(what):
        return InputError(f"{path} is not a checkpoint of this runner ({what})")

    if not isinstance(ck, dict):
        raise bad("not an object")
    missing = [k for k in ("team", "run_state", "position", "n_records", "J_start", "swapped")
               if k not in ck]
    if missing:
        raise bad(f"missing {', '.join(missing)}")
    st = ck["run_state"]
    if not isinstance(st, dict) or any(k not in st for k in ("rng", "beta", "delta", "stage",
                                                           "rollouts", "episodes")):
        raise bad("run_state lacks rng/beta/delta/stage/rollouts/episodes")
    for name, v in (("stage", st["stage"]), ("rollouts", st["rollouts"]),
                    ("episodes", st["episodes"]), ("n_records", ck["n_records"])):
        if not count(v):
            raise bad(f"{name} {v!r} is not an integer >= 0")
    for name in ("beta", "delta"):
        v = st[name]
        if not isinstance(v, list | tuple) or not all(
                isinstance(x, Real) and not isinstance(x, bool) for x in v):
            raise bad(f"run_state.{name} is not a list of numbers")
    pos = ck["position"]
    if pos is not None and not (isinstance(pos, dict) and count(pos.get("step"))):
        raise bad("position is neither null nor an object with an integer step >= 0")
    if ck["J_start"] is not None and not (isinstance(ck["J_start"], Real)
                                          and not isinstance(ck["J_start"], bool)):
        raise bad("J_start is not a number")


def truncate_metrics(path: Path, n_records: int) -> None:
    """Keep the first ``n_records`` lines of ``metrics.jsonl`` (atomically). A count that is
    not an integer >= 0 (a crafted checkpoint: ``lines[:-3]`` would silently drop the last
    records) is an :class:`InputError`."""
    from numbers import Integral

    if isinstance(n_records, bool) or not isinstance(n_records, Integral) or n_records < 0:
        raise InputError(f"the checkpoint's record count {n_records!r} is not an integer >= 0")
    if not path.exists():
        if n_records:
            raise InputError(f"{path} is missing but the checkpoint counts {n_records} records")
        return
    try:
        lines = [ln for ln in path.read_text(encoding="utf-8").split("\n") if ln.strip()]
    except UnicodeDecodeError:
        raise InputError(f"{path} is not UTF-8 text") from None
    if len(lines) < n_records:
        raise InputError(f"{path} has {len(lines)} records, the checkpoint counts {n_records}")
    write_atomic(path, lambda tmp: tmp.write_text("".join(ln + "\n" for ln in lines[:n_records]),
                                                  encoding="utf-8"))


# ------------------------------------------------------------------ the runner
class Runner:
    """Drives ``cfg.stages`` stages of ``run_stage`` on ``team`` (module docstring).

    ``writer``: where records go (a :class:`~sat_theory.metrics.RunWriter` or anything with
    ``log``/``write_config``/``policy_path``); ``folder``: a locked :class:`RunFolder` to
    checkpoint into (``None``: no checkpoints, e.g. in-memory runs); after each checkpoint
    the writer's ``commit()`` (if it has one) sends the records it covers to the trackers.
    ``progress``: a tqdm bar over agent steps on stderr (:func:`sat_theory.progress.bar`:
    shown on a terminal or with ``--verbose``); ``on_stage(record)`` after each stage."""

    def __init__(self, team, cfg: TrainConfig, *, writer=None, folder: RunFolder | None = None,
                 save_policies: bool = False, progress: bool = False,
                 on_stage: Callable[[dict], None] | None = None):
        if save_policies and (writer is None or not isinstance(team, SavesPolicy)):
            raise InputError("--save-policies needs an output folder and a backend that can save")
        self.team, self.cfg, self.writer, self.folder = team, cfg, writer, folder
        self.save_policies, self.on_stage = save_policies, on_stage
        self.state = RunState.initial(cfg, team.n_agents)
        self.n_records = 0
        self.J_start: float | None = None
        #: the held-out score after the stages done so far (None: not measured there,
        #: ``cfg.eval_every``); the next stage's ``J_before``
        self.J_now: float | None = None
        self.swapped = False  # the swap before stage cfg.swap_stage is done
        self.bar = None
        if progress:
            self.bar = progress_bar(cfg.stages * team.n_agents, unit="step",
                                    desc=f"sat train {cfg.method}")
        self._t = time.perf_counter()

    # ------------------------------------------------------------- records and checkpoints
    def log(self, rec: dict) -> None:
        now = time.perf_counter()
        rec["seconds"], self._t = now - self._t, now
        if self.writer is not None:
            self.writer.log(rec)
        self.n_records += 1

    def checkpoint(self, position: dict | None = None) -> None:
        """Save the state (with a folder); the records written so far are then final."""
        if self.folder is not None:
            state = dict(team=self.team.state_dict(), run_state=self.state.to_dict(),
                         position=position, n_records=self.n_records, J_start=self.J_start,
                         J_now=self.J_now, swapped=self.swapped)
            save_state(self.folder.path / CHECKPOINT, state)
        commit = getattr(self.writer, "commit", None)
        if commit is not None:
            commit()

    def on_step(self, rec: dict, position: dict) -> None:
        """After each agent update (``run_stage``'s hook): checkpoint, progress."""
        self.checkpoint(position)
        if self.bar is not None:
            self.bar.set_postfix(stage=rec["stage"], kl=f"{rec['kl']:.3g}", J=_fmt(rec.get("J")))
            self.bar.update(1)

    def _save_policy(self, name: str) -> None:
        if self.save_policies:
            ext = self.team.policy_format if isinstance(self.team, HasPolicyFormat) else "npz"
            path = Path(self.writer.policy_path(0)).with_name(f"{name}.{ext}")
            path.parent.mkdir(parents=True, exist_ok=True)
            self.team.save(str(path))

    def _eval_file(self, k: int | str) -> None:
        if not isinstance(self.team, HasEvalRecords) or self.folder is None:
            return
        from .fileio import dumps

        text = "".join(dumps(r) + "\n" for r in self.team.eval_records())
        write_atomic(self.folder.path / f"eval_{k}.jsonl",
                     lambda tmp: tmp.write_text(text, encoding="utf-8"))

    # ------------------------------------------------------------- the loop
    def start(self, config: dict | None = None) -> dict:
        """A fresh run: write ``config.json`` and the first checkpoint, then run."""
        if self.writer is not None and config is not None:
            self.writer.write_config(config)
        self.checkpoint()
        return self.run()

    def restore(self, ck: dict) -> dict | None:
        """Load a checkpoint (from :meth:`RunFolder.checkpoint`); returns the position."""
        self.team.load_state_dict(ck["team"])
        self.state = RunState.from_dict(ck["run_state"])
        self.n_records = int(ck["n_records"])
        self.J_start = ck["J_start"]
        self.swapped = bool(ck["swapped"])
        if "J_now" in ck:
            self.J_now = ck["J_now"]
        elif self.J_start is not None:  # a checkpoint of a version that evaluated every stage
            self.J_now = float(self.team.evaluate())
        if self.bar is not None:
            self.bar.update(self.state.stage * self.team.n_agents
                            + (ck["position"]["step"] if ck["position"] else 0))
        return ck["position"]

    def run(self, position: dict | None = None) -> dict:
        """Run (or finish) the stages; ``position``: a stage to continue (:meth:`restore`)."""
        t0 = time.perf_counter()
        stages: list[dict] = []
        try:
            if self.J_start is None:
                self.J_start = self.J_now = float(self.team.evaluate())
                self._eval_file(0)
            while self.state.stage < self.cfg.stages:
                if position is None:  # the stage has not begun
                    self._begin_stage(self.state.stage)
                stages.append(self._stage(self.state.stage, position))
                position = None
            self._save_policy(f"stage{self.cfg.stages}")
        finally:
            if self.bar is not None:
                self.bar.close()
        J_end = self.J_now if self.J_now is not None else float(self.team.evaluate())
        return run_summary(stages, self.J_start, J_end, self.state, time.perf_counter() - t0)

    def _begin_stage(self, k: int) -> None:
        """Before stage ``k``: the plug-and-play swap when it is due (the policies at the end
        of stage k−1 saved first, the swap record and its per-problem file written, then a
        checkpoint), and the policies at the start of stage ``k``."""
        if self.cfg.swap_stage == k and not self.swapped:
            self._save_policy(f"stage{k}_preswap")  # the end of stage k−1
            swap = swap_agent(self.team, self.cfg, self.state)
            self.log(swap)
            self.J_now = swap["J_after_swap"]
            self._eval_file(f"{k}_swap")  # per-problem: the shock's paired CI
            self.swapped = True
            self.checkpoint()
        self._save_policy(f"stage{k}")

    def _stage(self, k: int, position: dict | None) -> dict:
        """Stage ``k`` (continued from ``position``), evaluated after it when the schedule
        says so (``eval_every``), then checkpointed and reported; its record."""
        measure = self.cfg.evaluates_at(k + 1)
        rec = run_stage(self.team, self.cfg, self.state, log=self.log, on_step=self.on_step,
                        resume=position, J_before=self.J_now, evaluate_after=measure)
        self.swapped = False
        self.J_now = rec["J_after"]
        if measure:
            self._eval_file(k + 1)
        self.checkpoint()
        note(stage_line(rec))
        if self.on_stage is not None:
            self.on_stage(rec)
        return rec


def run_summary(stages: list[dict], J_start, J_end, state, seconds: float) -> dict:
    """The run's summary from its stage records: ``J_start``/``J_end``, the counts (stages,
    rollouts, episodes), certificate violations (``holds`` false), rejected and out-of-region
    steps, the sum of the stages' lower bounds (``None`` when none has one) and wall time."""
    lbs = [s["lower_bound"] for s in stages if s.get("lower_bound") is not None]
    return dict(J_start=J_start, J_end=J_end, stages=len(stages),
                rollouts=state.rollouts, episodes=state.episodes,
                bound_violations=sum(1 for s in stages if s.get("holds") is False),
                rejected_steps=sum(s["rejected_steps"] for s in stages),
                out_of_region_steps=sum(s["out_of_region_steps"] for s in stages),
                lower_bound_sum=float(np.sum(lbs)) if lbs else None, seconds=seconds)


def _fmt(x):
    return "-" if x is None or not isinstance(x, float) or not math.isfinite(x) else f"{x:.4g}"


def stage_line(rec: dict) -> str:
    """One line per stage (``--verbose``): J before and after, the certificate, counts."""
    holds = {True: "holds", False: "VIOLATED", None: "-"}[rec.get("holds")]
    return (f"stage {rec['stage']}: J {_fmt(rec.get('J_before'))} -> {_fmt(rec.get('J_after'))}"
            f", lower bound {_fmt(rec.get('lower_bound'))} ({holds}), rejected steps "
            f"{rec.get('rejected_steps', 0)}")


def train(team: Team, cfg: TrainConfig, *, writer=None, save_policies: bool = False,
          progress: Callable[[dict], None] | None = None, extra_config: dict | None = None) -> dict:
    """Run ``cfg.stages`` stages in memory with :class:`sat_theory.runner.Runner` (no
    checkpoints; ``sat train`` adds a run folder and resume).

    ``writer``: a :class:`sat_theory.metrics.RunWriter` (config.json, metrics.jsonl,
    ``policies/stage{k}.npz`` via ``team.save`` when ``save_policies``: the policy at the
    start of stage k, after a plug-and-play swap; ``stage{k}_preswap.npz`` the one before
    it, i.e. the end of stage k−1). ``progress(stage record)`` after each stage. Returns a
    summary dict (J at start and end, counts).
    """
    runner = Runner(team, cfg, writer=writer, save_policies=save_policies, on_stage=progress)
    config = {"algorithm": cfg.to_dict(), **(extra_config or {})}
    return runner.start(config if writer is not None else None)


# ------------------------------------------------------------------ sat train
def _terminate_as_interrupt():
    """SIGTERM behaves as Ctrl-C (temporary files are removed on the way out)."""
    def handler(signum, frame):
        raise KeyboardInterrupt
    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (e.g. inside a worker)
        pass


@dataclass
class RunOptions:
    """How a run is kept (not what it computes, which is the configuration): the run folder
    ``out``, ``overwrite`` an existing run there, ``save_policies``, the trackers
    ``report_to`` (names or a comma-separated string; ``None``: the default, or on resume
    the saved run's) and ``progress`` bars."""

    out: str | os.PathLike
    overwrite: bool = False
    save_policies: bool = False
    report_to: tuple | str | None = None
    progress: bool = True


def run_fresh(backend, cfg: TrainConfig, config: dict, opts: RunOptions) -> dict:
    """A fresh run of a configured backend (``cfg, config = backend.configure(...)``): claim
    the folder, write config.json (``algorithm``, the backend's sections, ``run``), build
    the team, run. Returns the summary."""
    _terminate_as_interrupt()
    report_to = parse_report_to(opts.report_to)
    check_installed(report_to)
    config = {"algorithm": cfg.to_dict(), **config,
              "run": {"save_policies": bool(opts.save_policies), "report_to": list(report_to)}}
    with RunFolder(opts.out) as folder:
        folder.claim(opts.overwrite)
        return _run(backend, folder, cfg, config, None, report_to, opts)


def run_resume(path, *, stages: int | None = None, report_to=None, backend=None,
               progress: bool = True) -> tuple[dict, TrainConfig, object]:
    """Continue the run saved in ``path``: ``stages`` (more, or as many as saved),
    ``report_to`` (this process's trackers; default the saved run's); ``backend``: a name
    (refuse a saved run of another backend) or a backend object to rebuild the team with
    (default: the registered one of the saved name). Returns ``(summary, cfg, backend)``."""
    _terminate_as_interrupt()
    with RunFolder(path) as folder:
        config = folder.config()
        folder.remove_temp_files()  # the lock is held and the folder is a run
        name = config["backend"].get("backend") if isinstance(config["backend"], dict) else None
        given = backend if backend is None or isinstance(backend, str) else backend.name
        if given not in (None, name):
            raise InputError(f"--backend {given} contradicts the saved run (backend {name})")
        loaded = load_backend(name) if backend is None or isinstance(backend, str) else backend
        cfg = train_config_from_dict(config["algorithm"])
        ck = folder.checkpoint()
        done = int(ck["run_state"]["stage"]) if ck else 0
        if stages is not None and stages != cfg.stages:
            if stages < done:
                raise InputError(f"--stages {stages}: the run has done {done} stages already")
            config["algorithm"]["stages"] = stages
            cfg = train_config_from_dict(config["algorithm"])
            write_json_atomic(str(folder.path / "config.json"), config)
        run = config.get("run", {})
        if report_to is not None:  # this process only
            report_to = parse_report_to(report_to)
            check_installed(report_to)
        else:  # the saved run's (a tracker no longer installed is dropped with a warning)
            report_to = tuple(run.get("report_to", default_report_to()))
        opts = RunOptions(out=folder.path, save_policies=bool(run.get("save_policies", False)),
                          progress=progress)
        return _run(loaded, folder, cfg, config, ck, report_to, opts), cfg, loaded


def _run(backend, folder: RunFolder, cfg, config, ck, report_to, opts: RunOptions) -> dict:
    team = backend.make_team(config, cfg, folder.path)
    try:
        truncate_metrics(folder.path / "metrics.jsonl", 0 if ck is None else ck["n_records"])
        with RunWriter(str(folder.path), append=ck is not None, report_to=report_to,
                       config=config) as writer:
            runner = Runner(team, cfg, writer=writer, folder=folder,
                            save_policies=opts.save_policies, progress=opts.progress)
            if ck is None:
                return runner.start(config)
            return runner.run(runner.restore(ck))
    finally:
        if isinstance(team, Closeable):
            team.close()
