"""Experiment tracking: a run's records mirrored to TensorBoard, W&B or MLflow
(``sat train --report-to``, comma-separated like transformers' ``report_to``).

``metrics.jsonl`` stays the source of truth; a tracker is a view of it, written through
:class:`~sat_theory.metrics.RunWriter` (``trackers=``). The same mapping for every tracker:

- **scalars**: every number of a record (``int``, ``float``, ``bool`` as 0/1; strings, lists
  and ``None`` are left out) of kind ``K`` is logged as ``K/<field>`` — ``step/kl``,
  ``stage/J_after``, ``swap/J_after_swap`` — at x = the record's ordinal within its kind
  (:func:`tracked_records`): step records at the agent-update count (0, 1, …), stage records
  at the stage index, swap records in order. Each kind thus has its own x-axis.
- **hyperparameters**: the run's ``config.json``, flattened to ``section.key``
  (:func:`flat_config`; lists and ``null`` as JSON text).

**When.** A record is sent once it is final: covered by a checkpoint. The runner calls
``RunWriter.commit()`` right after each checkpoint (every agent update, swap and stage).
A resumed run redoes exactly the records beyond its checkpoint (:mod:`sat_theory.runner`),
and those were never sent, so no tracker gets a record twice and every tracker's history is
in order (TensorBoard event files, W&B history and MLflow metric history are append-only:
"overwrite by logging the same step again" is not something all three honour). The price:
a run killed in the instant between writing a checkpoint and sending its records lacks
them in the tracker (``metrics.jsonl`` always has them).

**Failures** never stop a run: a tracker that fails to import, start or write is dropped
with one warning line on stderr (``sat: warning: --report-to NAME: ...``) and training goes
on. Unknown names, ``none`` mixed with others, and a named tracker that is not installed are
refused before any work (one line, exit status 2).

Backends, each imported only when used:

- ``tensorboard``: event files in ``RUN_DIR/tb`` written with TensorBoard's own
  ``EventFileWriter`` — no torch or TensorFlow needed, so tabular runs are tracked too
  (``torch.utils.tensorboard`` would need the ``llm`` extra; ``tensorboardX`` is not a
  dependency). Scalars are TensorBoard ``simple_value`` (float32); the config goes to the
  HParams plugin. Every process writes its own event file (a resumed run adds one); the
  files are flushed after each commit. This is the default when ``tensorboard`` is
  importable (it is in the ``dev`` extra), else ``none``.
- ``wandb``: ``wandb.init(mode="offline")`` unless the user set ``WANDB_MODE``, files under
  ``RUN_DIR/wandb``, project ``$WANDB_PROJECT`` or ``sat``, the nested config as W&B config;
  ``K/index`` is each kind's step metric (``define_metric``), so W&B's own step counter is
  never given. A resumed run is a new W&B run (offline runs cannot be resumed).
- ``mlflow``: ``MlflowClient`` on ``$MLFLOW_TRACKING_URI`` or a local ``file:RUN_DIR/mlruns``
  store, experiment ``$MLFLOW_EXPERIMENT_NAME`` or ``sat``; metrics with ``step`` = x, the
  flattened config as params (values cut to MLflow's 6000 characters).
"""

from __future__ import annotations

import importlib.util
import json
import numbers
import os
import sys
import time
from pathlib import Path

import numpy as np

from .errors import InputError

__all__ = ["TRACKERS", "parse_report_to", "default_report_to", "check_installed", "Trackers",
           "scalars", "tracked_records", "flat_config"]

#: tracker name -> the module it needs
TRACKERS = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}


def _installed(name: str) -> bool:
    return importlib.util.find_spec(TRACKERS[name]) is not None


def default_report_to() -> tuple[str, ...]:
    """``("tensorboard",)`` when TensorBoard is importable, else ``()`` (none)."""
    return ("tensorboard",) if _installed("tensorboard") else ()


def parse_report_to(text: str | None) -> tuple[str, ...]:
    """``--report-to`` text → tracker names (``()`` for ``none``; ``None``: the default)."""
    if text is None:
        return default_report_to()
    names = [n.strip().lower() for n in str(text).split(",")]
    if not all(names):
        raise InputError(f"--report-to {text!r}: empty name (give names separated by commas)")
    if "none" in names:
        if len(names) > 1:
            raise InputError(f"--report-to {text!r}: 'none' cannot be combined with trackers")
        return ()
    unknown = [n for n in names if n not in TRACKERS]
    if unknown:
        raise InputError(f"--report-to: unknown tracker {unknown[0]!r}; choose none or any of "
                         f"{', '.join(TRACKERS)} (comma-separated)")
    return tuple(dict.fromkeys(names))


def check_installed(names) -> None:
    """Refuse (one line) a tracker whose package is not importable."""
    for n in names:
        if not _installed(n):
            raise InputError(f"--report-to {n}: the {TRACKERS[n]} package is not installed "
                             f"(pip install {TRACKERS[n]}, or --report-to none)")


# ------------------------------------------------------------------ the mapping
def scalars(record: dict) -> dict[str, float]:
    """The numbers of a record, ``{field: float}`` (bools as 0/1; ``kind``, strings, lists
    and ``None`` left out): what every tracker logs as ``kind/field``."""
    return {k: float(v) for k, v in record.items()
            if k != "kind" and isinstance(v, numbers.Real | bool | np.bool_)}


def tracked_records(records, counts: dict[str, int] | None = None):
    """``(kind, x, scalars)`` for each record: ``x`` = how many records of its kind came
    before it (``counts``: those already sent, updated in place)."""
    counts = {} if counts is None else counts
    for rec in records:
        kind = rec["kind"]
        x = counts.get(kind, 0)
        counts[kind] = x + 1
        yield kind, x, scalars(rec)


def flat_config(config: dict, prefix: str = "") -> dict[str, bool | int | float | str]:
    """``{"algorithm": {"delta": 0.01}}`` → ``{"algorithm.delta": 0.01}``; lists, ``None``
    and other values as JSON text (what hyperparameter tables accept)."""
    out: dict = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat_config(v, key + "."))
        elif isinstance(v, bool | int | float | str):
            out[key] = v
        else:
            out[key] = json.dumps(v, default=str)
    return out


# ------------------------------------------------------------------ the trackers
class _TensorBoard:
    def __init__(self, run_dir: Path, config: dict):
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.plugins.hparams import summary_v2 as hparams
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event, self._summary = event_pb2.Event, summary_pb2.Summary
        self._w = EventFileWriter(str(run_dir / "tb"))
        self._w.add_event(self._event(wall_time=time.time(), step=0,
                                      summary=hparams.hparams_pb(flat_config(config))))

    def log(self, kind: str, x: int, values: dict[str, float]) -> None:
        Value = self._summary.Value
        summary = self._summary(value=[Value(tag=f"{kind}/{k}", simple_value=v)
                                       for k, v in values.items()])
        self._w.add_event(self._event(wall_time=time.time(), step=x, summary=summary))

    def flush(self) -> None:
        self._w.flush()

    def close(self) -> None:
        self._w.close()


class _WandB:
    def __init__(self, run_dir: Path, config: dict):
        import wandb

        self._run = wandb.init(
            mode=None if "WANDB_MODE" in os.environ else "offline", dir=str(run_dir),
            project=os.environ.get("WANDB_PROJECT", "sat"), name=run_dir.name, config=config,
            reinit="create_new", settings=wandb.Settings(console="off", silent=True))
        self._kinds: set[str] = set()

    def log(self, kind: str, x: int, values: dict[str, float]) -> None:
        if kind not in self._kinds:  # each kind on its own x-axis
            self._run.define_metric(f"{kind}/index")
            self._run.define_metric(f"{kind}/*", step_metric=f"{kind}/index")
            self._kinds.add(kind)
        self._run.log({**{f"{kind}/{k}": v for k, v in values.items()}, f"{kind}/index": x})

    def flush(self) -> None:
        pass  # W&B's own process writes as it goes

    def close(self) -> None:
        self._run.finish()


class _MLflow:
    MAX_PARAM = 6000  # MLflow's limit on a parameter value (characters)

    def __init__(self, run_dir: Path, config: dict):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI") or (run_dir / "mlruns").resolve().as_uri()
        self._client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "sat")
        exp = self._client.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp is not None else self._client.create_experiment(name)
        self._run_id = self._client.create_run(exp_id, run_name=run_dir.name).info.run_id
        params = [Param(k, str(v)[:self.MAX_PARAM]) for k, v in flat_config(config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self._client.log_batch(self._run_id, params=params[i:i + 100])

    def log(self, kind: str, x: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(f"{kind}/{k}", v, now, x) for k, v in values.items()]
        for i in range(0, len(metrics), 1000):  # MLflow's batch limit
            self._client.log_batch(self._run_id, metrics=metrics[i:i + 1000])

    def flush(self) -> None:
        pass  # every log_batch is written at once

    def close(self) -> None:
        self._client.set_terminated(self._run_id)


_BACKENDS = {"tensorboard": _TensorBoard, "wandb": _WandB, "mlflow": _MLflow}


class Trackers:
    """The run's trackers (module docstring): :meth:`send` records that are final. A tracker
    that raises is dropped with one warning line and the run goes on."""

    def __init__(self, names, run_dir, config: dict, counts: dict[str, int] | None = None):
        self.counts = dict(counts or {})  # records of each kind sent (by earlier processes too)
        self._open: dict[str, object] = {}
        for name in names:
            try:
                self._open[name] = _BACKENDS[name](Path(run_dir), config)
            except Exception as e:  # a tracker must never stop the run
                self._drop(name, e, "could not start")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._open)

    def _drop(self, name: str, e: Exception, what: str) -> None:
        self._open.pop(name, None)
        msg = (str(e).splitlines() or [""])[0][:200]
        print(f"sat: warning: --report-to {name}: {what} ({type(e).__name__}: {msg}); "
              "continuing without it (metrics.jsonl has every record)", file=sys.stderr)

    def _each(self, what: str, call) -> None:
        for name, tracker in list(self._open.items()):
            try:
                call(tracker)
            except Exception as e:
                self._drop(name, e, what)

    def send(self, records) -> None:
        """Log final records (in file order) and flush."""
        items = list(tracked_records(records, self.counts))
        if not self._open or not items:
            return

        def log_all(tracker):
            for kind, x, values in items:
                tracker.log(kind, x, values)
            tracker.flush()

        self._each("writing failed", log_all)

    def close(self) -> None:
        self._each("closing failed", lambda t: t.close())
        self._open.clear()
