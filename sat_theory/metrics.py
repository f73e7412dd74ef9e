"""Run directories: ``config.json`` + ``metrics.jsonl`` (+ ``policies/stage{k}.npz``).

Every training run — tabular or LLM — writes one folder:

- ``config.json``: the run's configuration (the :class:`~sat_theory.algorithm.TrainConfig`
  fields plus backend settings), written atomically (temporary file + rename).
- ``metrics.jsonl``: one strict-JSON object per line, each with a ``kind``:

  ``"step"`` — one agent update: ``stage`` (from 0), ``step`` (1..n within the stage),
  ``agent``, ``rollout_id``, ``beta``, ``delta_i`` (the radius enforced), ``kl`` (δ̂),
  ``kl_max``, ``surrogate`` (L̂, reward units), ``backtracks``, ``rejected``,
  ``out_of_region`` (flagged step kept although δ̂ > δ_i), ``n_episodes``, ``reward_mean``,
  ``ess`` (stale+IS: ESS/B of the trajectory weights), ``adv_clip_frac``,
  ``ratio_clip_frac``, ζ proxies ``zeta_norm`` / ``zeta_clip`` / ``zeta_ratio`` /
  ``zeta_trunc`` and ``zeta`` (the value used in the empirical certificate); exact terms
  where the backend computes them (tabular): ``L_seq``, ``L_stale``, ``delta``,
  ``delta_max``, ``tv``, ``A_max``, ``f_inf``, ``true_gain`` (else ``null``), and ``J``
  (after the step), ``kl_violation_frac`` / ``kl_violation_mass`` (share / occupancy mass of
  the agent's states with per-state ``KL_s > δ_i``, SAT Fig. 1c),
  ``occ_drift`` (``½‖d^{π̂^{i−1}} − d^{π̂^0}‖_1``, tabular); stale+IS: ``w_max``, ``w_p95``,
  ``w_p99`` (self-normalized trajectory weights); HAPPO: ``m_factor_mean``; adaptive δ:
  ``rho`` (gain ratio).

  ``"stage"`` — ``stage`` (from 0), ``order`` (agent indices in update order),
  ``J_before``, ``J_after``, ``true_improvement``, ``lower_bound`` (THEORY §4 form from the
  stage's own terms; ``lower_bound_source`` says ``"exact"`` or ``"estimated"``),
  ``lower_bound_max``, ``lower_bound_stale``, the tighter ladder ``lower_bound_fnorm``,
  ``lower_bound_tv``, ``A_max``, ``c``, ``holds``, ``violated``; in sampled mode
  ``empirical_certificate`` (THEORY §6, TeamTR Thm E.10, evaluated with the estimated
  ``L̂_i, δ̂_i, ζ̂_i``, ``N_i`` episodes and ``A_clip := A_max`` because ``L̂`` is in reward
  units), ``empirical_certificate_sat`` (SAT's finite-sample term), ``lower_bound_estimated``
  (THEORY §4 form from the estimates, no finite-sample term) and ``empirical_holds``
  (``true_improvement ≥ empirical_certificate``, tabular only); ``rollouts`` / ``episodes``
  (cumulative budget), ``rejected_steps``, ``out_of_region_steps``.

  ``"swap"`` — a plug-and-play replacement: ``stage``, ``agent``, ``strategy``,
  ``J_before_swap``, ``J_after_swap`` and the alignment's own numbers.

Lines are appended with one ``write`` each and flushed, so a killed run leaves only
complete records (a torn last line is skipped by :func:`read_metrics` with a warning).
Non-finite floats are written as the strings ``"Infinity"``/``"NaN"`` (strict JSON).
"""

from __future__ import annotations

import json
import os
import warnings
from collections import Counter
from dataclasses import dataclass, field

from .checkpoint import write_atomic
from .errors import InputError
from .fileio import dumps, jsonable, read_utf8

__all__ = ["RunWriter", "Run", "read_config", "read_metrics", "load_run", "write_json_atomic"]


def write_json_atomic(path: str, obj) -> None:
    """Write ``obj`` as indented strict JSON to ``path`` atomically
    (:func:`sat_theory.checkpoint.write_atomic`: temporary file, fsync, rename; the temporary
    file is removed when the write fails or is interrupted)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    text = json.dumps(jsonable(obj), indent=2, sort_keys=True, allow_nan=False) + "\n"
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


class RunWriter:
    """Writes one run directory (see module docstring). ``append=True`` keeps an existing
    ``metrics.jsonl`` (resume); otherwise it is truncated.

    ``report_to``: tracker names (:mod:`sat_theory.tracking`) that mirror the records, with
    ``config`` as their hyperparameters. Records reach them only through :meth:`commit`,
    once final (the runner commits after each checkpoint), so a resumed run never sends a
    record twice."""

    def __init__(self, out_dir: str, *, append: bool = False, report_to=(),
                 config: dict | None = None):
        self.out_dir = os.fspath(out_dir)
        os.makedirs(self.out_dir, exist_ok=True)
        self.metrics_path = os.path.join(self.out_dir, "metrics.jsonl")
        self.trackers = None
        self._pending: list[dict] = []
        if report_to:
            from .tracking import Trackers

            kept = append and os.path.exists(self.metrics_path)  # sent by an earlier process
            sent = Counter(r["kind"] for r in read_metrics(self.metrics_path)) if kept else {}
            self.trackers = Trackers(report_to, self.out_dir, config or {}, counts=sent)
        self._f = open(self.metrics_path, "a" if append else "w")

    def write_config(self, config: dict) -> None:
        write_json_atomic(os.path.join(self.out_dir, "config.json"), config)

    def log(self, record: dict) -> None:
        if "kind" not in record:
            raise ValueError("metrics records need a 'kind'")
        self._f.write(dumps(record) + "\n")
        self._f.flush()
        if self.trackers is not None:
            self._pending.append(dict(record))  # as written now

    def commit(self) -> None:
        """The records logged since the last commit are final: send them to the trackers."""
        if self.trackers is not None:
            self.trackers.send(self._pending)
        self._pending = []

    def policy_path(self, stage: int) -> str:
        return os.path.join(self.out_dir, "policies", f"stage{stage}.npz")

    def close(self) -> None:
        """Close the file and the trackers (records never committed are not sent: a resumed
        run redoes them)."""
        if not self._f.closed:
            self._f.close()
        if self.trackers is not None:
            self.trackers.close()
            self.trackers = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_config(path: str) -> dict:
    """A run's ``config.json``; one that is not a UTF-8 JSON object is an :class:`InputError`."""
    try:
        config = json.loads(read_utf8(path))
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(config, dict):
        raise InputError(f"{path}: not a JSON object")
    return config


def read_metrics(path: str) -> list[dict]:
    """All records of a ``metrics.jsonl`` (a folder is read as ``folder/metrics.jsonl``)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    if not os.path.exists(path):
        raise InputError(f"metrics file not found: {path}")
    out = []
    lines = read_utf8(path).split("\n")
    for k, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if k >= len(lines) - 2:  # a torn last line from a killed run
                warnings.warn(f"{path}: skipping an incomplete last line", stacklevel=2)
                continue
            raise InputError(f"{path}: line {k + 1} is not valid JSON") from None
        if not isinstance(rec, dict) or "kind" not in rec:
            raise InputError(f"{path}: line {k + 1} is not a metrics record (no 'kind')")
        out.append(rec)
    return out


@dataclass
class Run:
    """A loaded run directory: ``config`` and its records split by kind."""

    path: str
    config: dict
    steps: list[dict] = field(default_factory=list)
    stages: list[dict] = field(default_factory=list)
    other: list[dict] = field(default_factory=list)


def load_run(path: str) -> Run:
    """Read ``config.json`` (empty if missing) and ``metrics.jsonl`` of a run directory."""
    path = os.fspath(path)
    cfg_path = os.path.join(path, "config.json")
    config = {}
    if os.path.exists(cfg_path):
        config = read_config(cfg_path)
    run = Run(path, config)
    for rec in read_metrics(path):
        {"step": run.steps, "stage": run.stages}.get(rec["kind"], run.other).append(rec)
    return run
