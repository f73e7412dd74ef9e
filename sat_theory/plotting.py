"""Plotting for run logs and study tables: the figures of ``sat figures`` and ``sat plot``.

Every function here draws from data on disk — a run's ``metrics.jsonl`` (and ``config.json``)
or a pandas frame read from a study's CSV — never from live objects, so the same functions
draw tabular and LLM runs.

``metrics.jsonl`` (issue 4): one JSON object per line with a ``kind`` field:

- ``"step"``: stage, step, agent, rollout_id, beta, kl (δ̂), kl_max, surrogate (L̂), and where
  the backend can compute them the exact ``L_seq``, ``L_stale``, ``delta``, ``true_gain``;
  ζ̂ proxies, clip fractions, backtracks, rejected;
- ``"stage"``: stage, order, J_before, J_after, true_improvement, lower_bound, the empirical
  certificate (sampled mode) and the tighter ladder.

One color per method across every figure (:data:`METHOD_COLORS`).
"""

from __future__ import annotations

import math
import re
from contextlib import contextmanager
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never open a window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import MaxNLocator, NullLocator, SymmetricalLogLocator  # noqa: E402

from .errors import InputError  # noqa: E402

__all__ = ["METHOD_COLORS", "METHOD_LABELS", "BOUND_COLORS", "BOUND_LABELS", "paper_style",
           "save_figure", "method_color", "read_metrics", "read_config", "load_runs",
           "spearman", "plot_training_curves", "plot_kl_distribution",
           "plot_certificate_tracking", "plot_certificate_vs_improvement", "plot_stale_gap",
           "plot_n_scaling", "plot_violation_rate", "plot_certificate_ladder",
           "plot_order_sensitivity", "plot_is_degeneracy", "plot_plug_and_play", "plot_run",
           "plot_runs"]

#: one color per method, shared by every figure (colorblind-safe Okabe–Ito palette)
METHOD_COLORS = {
    "sat": "#0072B2",     # blue
    "naive": "#D55E00",   # vermillion
    "joint": "#009E73",   # green
    "no-tr": "#CC79A7",   # purple
    "happo": "#E69F00",   # orange
    # plug-and-play strategies
    "no swap": "#0072B2",  # = sat
    "stage0": "#56B4E9",
    "stage0-project": "#9C8500",
    "direct": "#000000",
    "retrain": "#999999",
}
METHOD_LABELS = {"sat": "SAT / TeamTR", "naive": "naive sequential", "joint": "joint update",
                 "no-tr": "no trust region", "happo": "HAPPO", "stage0": "Stage-0 aligned swap (TeamTR distill)",
                 "stage0-project": "Stage-0 aligned swap (SAT projection)", "no swap": "no swap (SAT)",
                 "direct": "direct swap", "retrain": "retrain from scratch"}

#: the certificate ladder: the papers' forms, then this project's tighter rungs (THEORY §4)
BOUND_COLORS = {"true_improvement": "#000000", "lower_bound_estimated": "#CC79A7", "lower_bound_stale": "#D55E00",
                "lower_bound_max": "#E69F00", "lower_bound": "#0072B2",
                "lower_bound_fnorm": "#56B4E9", "lower_bound_tv": "#009E73"}
BOUND_LABELS = {"true_improvement": r"true improvement $J(\bar\pi) - J(\pi_{\mathrm{cur}})$",
                "lower_bound_estimated": "TeamTR Thm 3.6, estimated terms",
                "lower_bound_stale": "stale bound (TeamTR Prop. 3.3)",
                "lower_bound_max": "SAT Thm 4.4 (max-KL)",
                "lower_bound": "TeamTR Thm 3.6 (expected KL)",
                "lower_bound_fnorm": r"tighter: $\|f_i\|_\infty$ for $A_{\max}$",
                "lower_bound_tv": r"tighter: $\|f_i\|_\infty$ and exact TV"}

_FALLBACK = ["#56B4E9", "#F0E442", "#000000", "#8c564b", "#bcbd22", "#17becf"]


def method_color(method: str) -> str:
    """The method's color; unknown labels get a stable color from a fallback list."""
    if method in METHOD_COLORS:
        return METHOD_COLORS[method]
    return _FALLBACK[sum(map(ord, str(method))) % len(_FALLBACK)]


def method_label(method: str) -> str:
    return METHOD_LABELS.get(method, str(method))


def symlog_y(ax, values) -> float:
    """Put ``ax``'s y axis on a symmetric-log scale that reads cleanly; return its linear
    half-width ``t``.

    ``t = 10^⌊log10 median|v|⌋`` (a power of ten), so every major tick is 0 or ``±10^k`` with
    ``10^k ≥ t`` and, with ``linscale = 1``, 0 sits one decade's height from ``±t`` — no two
    tick labels meet at the linear/log break (a non-decade ``t`` put a ``10^k`` tick inside
    the linear band, next to 0). The band ``|y| < t`` is shaded and named in the y label.
    """
    v = np.abs(np.asarray(values, float))
    v = v[np.isfinite(v) & (v > 0)]
    t = 10.0 ** math.floor(math.log10(float(np.quantile(v, 0.5)))) if v.size else 1.0
    ax.set_yscale("symlog", linthresh=t, linscale=1.0)
    ax.yaxis.set_major_locator(SymmetricalLogLocator(base=10, linthresh=t, subs=[1.0]))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.axhspan(-t, t, color="0.5", alpha=0.08, lw=0, zorder=0)
    ax.set_ylabel(ax.get_ylabel() + f"\nsymlog: linear for |y| < {t:g} (shaded)")
    return t


def stage_axis(ax, label: str = "stage") -> None:
    """Integer stage ticks starting at 0 (``MaxNLocator(integer=True)``)."""
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(left=0)
    ax.set_xlabel(label)


def legend_outside(ax, **kw) -> None:
    """The legend to the right of the axes, where it cannot cover data."""
    ax.legend(frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, **kw)


#: two curves closer than this share of the axes' height at every x overlap on the page
OVERLAP = 0.02


def _labelled_curves(ax) -> list:
    """``(artist, line)`` of every labelled curve of ``ax``: plain lines, and error-bar
    containers (labelled on the container, data on its first line)."""
    out = [(c, c.lines[0]) for c in ax.containers
           if hasattr(c, "lines") and c.lines[0] is not None and not c.get_label().startswith("_")]
    inside = {id(line) for _, line in out}
    out += [(ln, ln) for ln in ax.lines if not ln.get_label().startswith("_") and id(ln) not in inside]
    return out


def note_overlaps(ax, share: float = OVERLAP, after: float = -math.inf) -> None:
    """Name, in the legend, every curve that would hide under one drawn before it: equal data
    gets ", identical to X" (and is dashed on top); data whose drawn height differs by less
    than ``share`` of the axes' height at every x the two share (at least two) gets
    ", overlaps X". Measured on the page (display coordinates after autoscaling), so log and
    symlog axes count as drawn. Only points with ``x > after`` are compared. Call after
    drawing, before ``legend()``."""
    ax.get_xlim(), ax.get_ylim()  # run the pending autoscale: the view is final
    height = ax.bbox.height
    seen = []
    for artist, line in _labelled_curves(ax):
        pts = dict(zip(np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float),
                       strict=True))
        for other, opts in seen:
            xs = np.array(sorted(k for k in pts.keys() & opts.keys()
                                 if k > after and np.isfinite(pts[k]) and np.isfinite(opts[k])))
            if xs.size < 2:
                continue
            y, oy = np.array([pts[k] for k in xs]), np.array([opts[k] for k in xs])
            if np.array_equal(y, oy):
                artist.set_label(f"{artist.get_label()}, identical to {other}")
                if artist is line:
                    line.set_linestyle((0, (4, 3)))
                break
            py = ax.transData.transform(np.column_stack([xs, y]))[:, 1]
            po = ax.transData.transform(np.column_stack([xs, oy]))[:, 1]
            if np.max(np.abs(py - po)) < share * height:
                artist.set_label(f"{artist.get_label()}, overlaps {other}")
                break
        seen.append((_curve_name(artist.get_label()), pts))


def _curve_name(label: str) -> str:
    """A legend label without its trailing details (seed count, fitted exponent, notes)."""
    label = re.split(r", (?:identical to|overlaps) ", label)[0].split(": ")[0]
    return re.sub(r" \(\d+ seeds?\)$", "", label)


@contextmanager
def paper_style():
    """Readable fonts, light grid, no top/right spines."""
    rc = {"font.size": 11, "axes.titlesize": 12, "axes.labelsize": 11, "legend.fontsize": 9,
          "xtick.labelsize": 10, "ytick.labelsize": 10, "axes.grid": True, "grid.alpha": 0.3,
          "axes.spines.top": False, "axes.spines.right": False, "figure.dpi": 110,
          "savefig.dpi": 150, "savefig.bbox": "tight", "lines.linewidth": 1.8,
          "pdf.fonttype": 42}
    with plt.rc_context(rc):
        yield


def save_figure(fig, out: Path | str, name: str) -> list[Path]:
    """Write ``name.png`` and ``name.pdf`` under ``out``; close the figure."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    for p in paths:
        fig.savefig(p, metadata={"CreationDate": None} if p.suffix == ".pdf" else None)
    plt.close(fig)
    return paths


# ------------------------------------------------------------------ reading run logs
def _float(x):
    """Strict-JSON non-finite strings back to floats."""
    if isinstance(x, str) and x in ("NaN", "Infinity", "-Infinity"):
        return float(x)
    return x


def read_metrics(path: Path | str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(steps, stages)`` frames from one ``metrics.jsonl`` (a folder is read as
    ``folder/metrics.jsonl``; parsing and the torn-last-line rule are
    :func:`sat_theory.metrics.read_metrics`'s). Records of other kinds are ignored. Stage
    records keep ``order`` as a list."""
    from .metrics import read_metrics as read_records

    steps, stages = [], []
    for rec in read_records(path):
        rec = {key: _float(v) for key, v in rec.items()}
        if rec["kind"] == "step":
            steps.append(rec)
        elif rec["kind"] == "stage":
            stages.append(rec)
    return pd.DataFrame(steps), pd.DataFrame(stages)


def read_config(run_dir: Path | str) -> dict:
    """A run folder's ``config.json`` (``{}`` when it has none; an unreadable one is an
    :class:`InputError`, :func:`sat_theory.metrics.read_config`)."""
    from .metrics import read_config as read_json

    p = Path(run_dir) / "config.json"
    return read_json(str(p)) if p.exists() else {}


def run_backend(config: dict) -> str | None:
    """The backend that wrote a run, ``"tabular"`` or ``"llm"``, from its config:
    ``backend.backend`` (``sat train``), ``backend.name`` (``experiments/runs.py``) or a plain
    string; ``None`` when the config does not say."""
    b = config.get("backend")
    if isinstance(b, dict):
        b = b.get("backend", b.get("name"))
    return b if isinstance(b, str) else None


def _flat(cfg: dict, key: str):
    """``cfg[key]`` looked up at the top level or one level down (nested config sections)."""
    if key in cfg:
        return cfg[key]
    for v in cfg.values():
        if isinstance(v, dict) and key in v:
            return v[key]
    return None


def load_runs(run_dirs, labels: dict | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Concatenate the ``metrics.jsonl`` of several run directories.

    Adds columns ``run`` (directory name), ``method`` and ``seed`` (from ``config.json``,
    or ``labels[run_dir]`` = ``(method, seed)`` when given).
    """
    all_steps, all_stages = [], []
    for rd in run_dirs:
        rd = Path(rd)
        cfg = read_config(rd)
        if labels and str(rd) in labels:
            method, seed = labels[str(rd)]
        else:
            method, seed = _flat(cfg, "method"), _flat(cfg, "seed")
        steps, stages = read_metrics(rd / "metrics.jsonl")
        for df in (steps, stages):
            df["run"] = rd.name
            df["method"] = method if method is not None else rd.name
            df["seed"] = seed if seed is not None else 0
        all_steps.append(steps)
        all_stages.append(stages)
    return (pd.concat(all_steps, ignore_index=True) if all_steps else pd.DataFrame(),
            pd.concat(all_stages, ignore_index=True) if all_stages else pd.DataFrame())


def spearman(x, y) -> float:
    """Spearman rank correlation (average ranks for ties); nan for fewer than 3 points."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 3:
        return math.nan
    rx, ry = pd.Series(x).rank().to_numpy(), pd.Series(y).rank().to_numpy()
    if rx.std() == 0 or ry.std() == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])


def _methods_in(df: pd.DataFrame) -> list[str]:
    order = list(METHOD_COLORS)
    ms = list(dict.fromkeys(df["method"]))
    return sorted(ms, key=lambda m: (order.index(m) if m in order else len(order), str(m)))


def _mean_std(ax, x, Y, color, label, marker=None, geometric: bool = False):
    """Mean line with a ±1 std band over the rows of Y (seeds × points). ``geometric``: the
    geometric mean with a ×/÷ geometric-std band (for positive data on a log axis, where an
    arithmetic band would cross zero)."""
    Y = np.atleast_2d(np.asarray(Y, float))
    if geometric:
        L = np.log(np.maximum(Y, 1e-300))
        m, s = np.nanmean(L, axis=0), (np.nanstd(L, axis=0) if Y.shape[0] > 1 else 0.0 * L[0])
        lo, mid, hi = np.exp(m - s), np.exp(m), np.exp(m + s)
    else:
        mid = np.nanmean(Y, axis=0)
        s = np.nanstd(Y, axis=0) if Y.shape[0] > 1 else np.zeros_like(mid)
        lo, hi = mid - s, mid + s
    ax.plot(x, mid, color=color, label=label, marker=marker, ms=4)
    ax.fill_between(x, lo, hi, color=color, alpha=0.18, lw=0)


# ------------------------------------------------------------------ run-log figures
def plot_training_curves(stages: pd.DataFrame, *, x: str = "stage", ax=None,
                         title: str | None = None, ylabel: str = "team return J (exact)"):
    """TeamTR Fig. 3: J after each stage, mean ± std over seeds, one line per method.

    ``x`` is a stage-record column (``stage``, or a rollout count for matched budgets); stage
    0's ``J_before`` is drawn as the starting point.
    """
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(6, 4))
    for m in _methods_in(stages):
        d = stages[stages.method == m]
        curves = []
        for _, g in d.groupby("seed"):
            g = g.sort_values("stage")
            xs = np.concatenate([[0 if x == "stage" else 0.0], g[x].to_numpy(float) + (1 if x == "stage" else 0)])
            ys = np.concatenate([[g["J_before"].iloc[0]], g["J_after"].to_numpy(float)])
            curves.append((xs, ys))
        L = min(len(c[1]) for c in curves)
        nseed = len(curves)
        _mean_std(ax, curves[0][0][:L], [c[1][:L] for c in curves], method_color(m),
                  f"{method_label(m)} ({nseed} seed{'s' if nseed > 1 else ''})")
    note_overlaps(ax)
    stage_axis(ax, "stage" if x == "stage" else x.replace("_", " "))
    ax.set_ylabel(ylabel)
    ax.legend(frameon=False)
    if title:
        ax.set_title(title)
    return fig or ax.figure


def plot_kl_distribution(steps: pd.DataFrame, delta: float | None = None, *, ax=None,
                         kl_col: str = "kl", title: str | None = None):
    """TeamTR Fig. 4a: per-update KL (δ̂) per method, δ marked, out-of-region rate on top.

    Out-of-region rate: fraction of updates with ``kl > δ`` (the ``delta`` argument, one line
    for every method as in the paper; without it each step's own ``delta_i``)."""
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(6, 4))
    methods = _methods_in(steps)
    rng = np.random.default_rng(0)  # horizontal jitter only; deterministic
    for k, m in enumerate(methods):
        v = steps.loc[steps.method == m, kl_col].to_numpy(float)
        v = v[np.isfinite(v)]
        if v.size == 0:
            continue
        pos = np.maximum(v, 1e-12)
        parts = ax.violinplot([np.log10(pos)], positions=[k], widths=0.8, showextrema=False)
        for b in parts["bodies"]:
            b.set_facecolor(method_color(m))
            b.set_alpha(0.35)
        ax.scatter(k + rng.uniform(-0.15, 0.15, v.size), np.log10(pos), s=6,
                   color=method_color(m), alpha=0.6, lw=0)
        # the paper marks one δ for every method; without it use each step's own radius
        if delta is not None:
            lim = np.full(v.size, float(delta))
        elif "delta_i" in steps.columns:
            sel = steps.loc[steps.method == m, [kl_col, "delta_i"]].astype(float)
            sel = sel[np.isfinite(sel[kl_col])]
            v, lim = sel[kl_col].to_numpy(), sel["delta_i"].fillna(np.inf).to_numpy()
        else:
            lim = None
        if lim is not None:
            rate = float(np.mean(v > lim))
            ax.annotate(f"{100 * rate:.0f}% out", (k, 1.0), xycoords=("data", "axes fraction"),
                        ha="center", va="bottom", fontsize=9)
    if delta is not None:
        ax.axhline(np.log10(delta), color="red", ls="--", lw=1.2, label=rf"$\delta$ = {delta:g}")
        ax.legend(frameon=False, loc="lower right")
    ax.set_xticks(range(len(methods)), [method_label(m) for m in methods], rotation=15)
    ax.set_ylabel(r"$\log_{10}$ per-update KL (nats)")
    if title:
        ax.set_title(title, pad=16)
    return fig or ax.figure


def plot_certificate_tracking(stages: pd.DataFrame, *, ax=None, bound_cols=("lower_bound",),
                              title: str | None = None):
    """TeamTR Fig. 4b: cumulative measured improvement (solid) vs cumulative certified lower
    bounds (one line style per column of ``bound_cols``), per method, mean ± std over seeds."""
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(6.5, 4.3))
    styles = ["--", ":", "-.", (0, (5, 1))]
    for m in _methods_in(stages):
        d = stages[stages.method == m]
        c = method_color(m)
        for k, col in enumerate(["true_improvement", *bound_cols]):
            # x = stages completed: nothing is gained (or certified) after 0 stages
            curves = [np.concatenate([[0.0], g.sort_values("stage")[col].cumsum().to_numpy(float)])
                      for _, g in d.groupby("seed")]
            L = min(map(len, curves))
            lab = "measured J gain" if col == "true_improvement" else BOUND_LABELS.get(col, col)
            cc = c if k == 0 or len(_methods_in(stages)) > 1 else BOUND_COLORS.get(col, c)
            _mean_std(ax, np.arange(L), [x[:L] for x in curves], cc,
                      f"{method_label(m)}: {lab}" if len(_methods_in(stages)) > 1 else lab)
            if k:
                ax.lines[-1].set_linestyle(styles[(k - 1) % len(styles)])
    ax.axhline(0, color="k", lw=0.6)
    stage_axis(ax, "stages completed")
    ax.set_ylabel("cumulative improvement of J (return units)")
    symlog_y(ax, stages["true_improvement"])
    legend_outside(ax, fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    return fig or ax.figure


def plot_certificate_vs_improvement(stages: pd.DataFrame, *, ax=None,
                                    bound_col: str = "lower_bound", title: str | None = None):
    """TeamTR Fig. 4c: per-stage certificate vs measured improvement, with the Spearman rank
    correlation and the violation rate (fraction of stages where certificate > measured)."""
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(5, 4.5))
    for m in _methods_in(stages):
        d = stages[stages.method == m]
        x, y = d[bound_col].to_numpy(float), d["true_improvement"].to_numpy(float)
        rho = spearman(x, y)
        viol = float(np.mean(x > y)) if len(x) else math.nan
        ax.scatter(x, y, s=14, color=method_color(m), alpha=0.7,
                   label=f"{method_label(m)}: ρ={rho:.2f}, viol.={100 * viol:.0f}%")
    # the identity line, drawn without stretching the axes beyond the data (with the
    # papers' constants the certificate can sit orders of magnitude below the improvement)
    x = stages[bound_col].to_numpy(float)
    y = stages["true_improvement"].to_numpy(float)
    if x.size:
        for lim, v in ((ax.set_xlim, x), (ax.set_ylim, y)):
            lo, hi = np.nanmin(v), np.nanmax(v)
            pad = 0.08 * (hi - lo) if hi > lo else 0.1 * max(abs(hi), 1e-12)
            lim(lo - pad, hi + pad)
        ax.autoscale(False)
    ax.axline((0, 0), slope=1, color="k", lw=1, ls=":", label="certificate = measured")
    ax.set_xlabel("per-stage certificate (lower bound)")
    ax.set_ylabel("per-stage measured improvement of J")
    ax.legend(frameon=False, fontsize=8)
    if title:
        ax.set_title(title)
    return fig or ax.figure


def plot_stale_gap(steps: pd.DataFrame, *, within: tuple[int, ...] = (2, 3), ax=None,
                   value: str | None = None,
                   ylabel: str = r"$|L_i^{\mathrm{stale}} - L_i^{\mathrm{seq}}|$ (return units)",
                   title: str | None = None):
    """TeamTR Fig. 2: a per-step gap per stage for within-stage steps ``i`` in ``within``
    (1-based), per method; geometric mean ×/÷ geometric std over seeds (log axis). ``value``: the column to draw (default
    ``|L_stale − L_seq|`` computed from the exact columns)."""
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(6, 4))
    styles = ["-", "--", ":", "-."]
    df = steps.copy()
    if value is None:
        df["gap"] = (df["L_stale"] - df["L_seq"]).abs()
        value = "gap"
    for m in _methods_in(df):
        for k, i in enumerate(within):
            d = df[(df.method == m) & (df.step == i)]
            if d.empty:
                continue
            piv = d.pivot_table(index="seed", columns="stage", values=value)
            _mean_std(ax, piv.columns.to_numpy(), piv.to_numpy(), method_color(m),
                      f"{method_label(m)}, $i = {i}$", geometric=True)
            ax.lines[-1].set_linestyle(styles[k % len(styles)])
    ax.set_yscale("log")
    stage_axis(ax)
    ax.set_ylabel(ylabel)
    ax.legend(frameon=False, fontsize=8)
    if title:
        ax.set_title(title)
    return fig or ax.figure


# ------------------------------------------------------------------ study-table figures
def plot_n_scaling(df: pd.DataFrame, fits: pd.DataFrame, metrics: list[str],
                   metric_labels: dict[str, str], layout_labels: dict[str, str]):
    """TeamTR Table 5 as a figure: log-log metric vs team size ``n`` per method, with the
    fitted power law (exponent α in the legend) and the analytic penalty shapes.

    ``df``: columns layout, method, metric, n, mean, std. ``fits``: layout, method, metric,
    exponent, prefactor. Rows with method ``analytic`` are drawn as grey reference lines.
    """
    layouts = [x for x in layout_labels if x in set(df.layout)]
    layouts += [x for x in dict.fromkeys(df.layout) if x not in layouts]
    # legends go under their panel (a legend inside a log-log panel covered points)
    fig, axes = plt.subplots(len(layouts), len(metrics), figsize=(4.3 * len(metrics), 4.9 * len(layouts)),
                             squeeze=False)
    for r, lay in enumerate(layouts):
        for c, met in enumerate(metrics):
            ax = axes[r, c]
            d = df[(df.layout == lay) & (df.metric == met)]
            for m in [x for x in _methods_in(d) if x != "analytic"]:
                _plot_power_law(ax, d[d.method == m].sort_values("n"), m,
                                fits[(fits.layout == lay) & (fits.method == m) & (fits.metric == met)])
            _plot_penalty_shapes(ax, d[d.method != "analytic"])
            _n_scaling_axes(ax, sorted(d.n.unique()), metric_labels.get(met, met),
                            layout_labels.get(lay, lay))
    fig.tight_layout()
    return fig


def _plot_power_law(ax, g: pd.DataFrame, method: str, fit: pd.DataFrame) -> None:
    """One method's mean ± std against ``n`` and its fitted ``prefactor · n^α`` (α in the legend;
    NaN without a fit)."""
    alpha = float(fit.exponent.iloc[0]) if len(fit) else math.nan
    # ±std, the lower bar clipped above 0 so it stays drawable on a log axis
    lower = np.minimum(g["std"], 0.95 * g["mean"])
    ax.errorbar(g.n, g["mean"], yerr=[lower, g["std"]], color=method_color(method), marker="o",
                ms=4, lw=0, elinewidth=1, capsize=2,
                label=rf"{method_label(method)}: $\alpha$ = {alpha:.2f}")
    if len(fit) and np.isfinite(alpha):
        xs = np.linspace(g.n.min(), g.n.max(), 50)
        ax.plot(xs, float(fit.prefactor.iloc[0]) * xs ** alpha, color=method_color(method), lw=1.2)


def _plot_penalty_shapes(ax, g: pd.DataFrame) -> None:
    """The analytic penalty shapes ``n√δ`` (intermediate occupancy) and ``n(n+1)√δ/2`` (stale),
    scaled through the largest mean at the smallest ``n`` of the measured rows ``g``."""
    if g.empty:
        return
    n0 = g.n.min()
    y0 = g[g.n == n0]["mean"].max()
    xs = np.linspace(g.n.min(), g.n.max(), 50)
    for k, (name, shape) in enumerate(((r"n\sqrt{\delta}", lambda n: n),
                                       (r"n(n+1)\sqrt{\delta}/2", lambda n: n * (n + 1) / 2))):
        ax.plot(xs, y0 * shape(xs) / shape(n0), color="0.5", lw=1,
                ls=["--", ":"][k], label=rf"$\propto {name}$ (through $n$ = {n0:g})")


def _n_scaling_axes(ax, ns: list, ylabel: str, title: str) -> None:
    """Log-log axes with the team sizes ``ns`` as ticks, labels, and the legend under the panel."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(ns, [f"{x:g}" for x in ns])
    ax.minorticks_off()
    ax.set_xlabel(r"team size $n$ (agents)")
    ax.set_ylabel(ylabel)
    ax.set_title(f"{title}", fontsize=10)
    note_overlaps(ax)
    ax.legend(frameon=False, fontsize=7.5, loc="upper center", bbox_to_anchor=(0.5, -0.2),
              ncol=1)


def plot_violation_rate(df: pd.DataFrame, fit: dict, *, ax=None):
    """SAT Fig. 1c: fraction of states with per-state KL > δ, against δ, with the fitted
    ``c·√δ`` curve (and the free power law). ``df``: delta, mean, std, weighting."""
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(5.5, 4))
    for k, (w, g) in enumerate(df.groupby("weighting", sort=False)):
        g = g.sort_values("delta")
        col = ["#0072B2", "#009E73"][k % 2]
        ax.errorbar(g.delta, g["mean"], yerr=g["std"], marker="o", ms=4, color=col, capsize=2,
                    label=f"measured ({w})")
        f = fit.get(w)
        if f:
            xs = np.geomspace(g.delta.min(), g.delta.max(), 60)
            ax.plot(xs, f["c_sqrt"] * np.sqrt(xs), color=col, ls="--", lw=1.2,
                    label=rf"fit $c\sqrt{{\delta}}$, $c$ = {f['c_sqrt']:.2f}")
            ax.plot(xs, f["prefactor"] * xs ** f["exponent"], color=col, ls=":", lw=1.2,
                    label=rf"fit $C\delta^{{\alpha}}$, $\alpha$ = {f['exponent']:.2f}")
    ax.set_xscale("log")
    note_overlaps(ax)
    ax.set_xlabel(r"trust-region radius $\delta$ (expected KL, nats)")
    ax.set_ylabel(r"fraction of states with $\mathrm{KL}_s > \delta$")
    legend_outside(ax, fontsize=8)
    return fig or ax.figure


def plot_certificate_ladder(df: pd.DataFrame, *, ax=None):
    """Certificate ladder vs δ: the papers' bounds, the tighter rungs (THEORY §4) and the true
    improvement. ``df``: delta, quantity, mean, std (quantity ∈ BOUND_COLORS)."""
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(6.5, 4.3))
    for q in BOUND_COLORS:
        g = df[df.quantity == q].sort_values("delta")
        if g.empty:
            continue
        ax.errorbar(g.delta, g["mean"], yerr=g["std"], color=BOUND_COLORS[q], marker="o", ms=3.5,
                    capsize=2, lw=2.4 if q == "true_improvement" else 1.5, label=BOUND_LABELS[q])
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xscale("log")
    ax.set_xlabel(r"per-agent trust-region radius $\delta$ (nats)")
    ax.set_ylabel("stage improvement / lower bound (return units)")
    symlog_y(ax, df.loc[df.quantity == "true_improvement", "mean"])
    legend_outside(ax, fontsize=8)
    return fig or ax.figure


def plot_order_sensitivity(df: pd.DataFrame):
    """Certified bound and true improvement per update order, minus the fixed order's, per
    instance. ``df``: targets, instance, order_kind, lower_bound, true_improvement (several
    rows per kind for random orders / all permutations). One row of panels per ``targets``."""
    kinds = list(dict.fromkeys(df.order_kind))
    palette = {"fixed": "#0072B2", "reverse": "#E69F00", "random": "#7f7f7f",
               "greedy": "#009E73", "all permutations": "#BBBBBB"}
    groups = list(dict.fromkeys(df["targets"])) if "targets" in df else [None]
    fig, axes = plt.subplots(len(groups), 2, figsize=(11, 3.6 * len(groups)), squeeze=False)
    for r, tg in enumerate(groups):
        sub = df if tg is None else df[df["targets"] == tg]
        for ax, col, lab in ((axes[r, 0], "lower_bound", "certified lower bound (Thm 3.6)"),
                             (axes[r, 1], "true_improvement", "true improvement")):
            seen, spread = set(), 0.0
            for inst, g in sub.groupby("instance"):
                base = g[g.order_kind == "fixed"][col].mean()
                spread = max(spread, float(np.ptp(g[col].to_numpy(float))))
                for k, kind in enumerate(kinds):
                    v = g[g.order_kind == kind][col].to_numpy(float) - base
                    if v.size == 0:
                        continue
                    x = np.full(v.size, inst) + (k - (len(kinds) - 1) / 2) * 0.13
                    ax.scatter(x, v, s=10 if kind == "all permutations" else 18,
                               color=palette.get(kind, "k"), zorder=1 if kind == "all permutations" else 2,
                               label=None if kind in seen else kind)
                    seen.add(kind)
            ax.axhline(0, color="k", lw=0.6)
            ax.set_xlabel("instance (random MDP and start policy)")
            ax.set_xticks(sorted(sub.instance.unique()))
            ax.set_ylabel(f"{lab}\n− fixed order's (return units)", fontsize=9)
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
            if spread <= 1e-12 * max(1.0, float(sub[col].abs().max())):
                # every order's points sit on the zero line: say why nothing else is visible
                ax.text(0.5, 0.9, "identical for every order on every instance\n(the same final team)",
                        transform=ax.transAxes, ha="center", va="top", fontsize=8)
            if tg is not None:
                ax.set_title(tg, fontsize=10)
        legend_outside(axes[r, 1], fontsize=8)
    fig.tight_layout()
    return fig


def plot_is_degeneracy(df: pd.DataFrame):
    """TeamTR Table 10 as a figure: ESS/B (exact, solid; from B sampled weights, crosses) and
    the P99 weight by within-stage step i. ``df``: n, delta, step, ess_over_B,
    ess_over_B_sampled, p99. One color per δ, one line style per n."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    deltas = sorted(df.delta.unique())
    cols = dict(zip(deltas, ["#0072B2", "#E69F00", "#D55E00", "#009E73", "#CC79A7"], strict=False))
    styles = dict(zip(sorted(df.n.unique()), ["-", "--", ":", "-."], strict=False))
    for (n, delta), g in df.groupby(["n", "delta"]):
        g = g.sort_values("step")
        c, ls = cols[delta], styles[n]
        lab = f"n={n}, δ={delta:g}"
        axes[0].plot(g.step, g.ess_over_B, marker="o", ls=ls, color=c, label=lab + " (exact)")
        if "ess_over_B_sampled" in g:
            axes[0].scatter(g.step, g.ess_over_B_sampled, marker="x", color=c, s=30)
        axes[1].plot(g.step, g.p99, marker="o", ls=ls, color=c, label=lab)
    axes[0].scatter([], [], marker="x", color="k", label="ESS/B of the B sampled weights")
    axes[0].set_ylabel("ESS / B")
    axes[0].set_ylim(-0.02, 1.02)
    axes[1].set_ylabel("P99 of the weight w (B sampled trajectories)")
    axes[1].set_yscale("log")
    for ax in axes:
        ax.set_xlabel("within-stage step i  (i−1 agents already updated)")
        ax.set_xticks(sorted(df.step.unique()))
        note_overlaps(ax)
        ax.legend(frameon=False, fontsize=7.5)
    fig.tight_layout()
    return fig


def plot_plug_and_play(df: pd.DataFrame, swap_stage: int, *, ax=None, ylabel="team return J (exact)"):
    """TeamTR Fig. 6: J over stages for the direct / Stage-0 / retrain strategies (mean ± std
    over seeds), the swap stage marked. ``df``: strategy, seed, stage, J."""
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(6, 4))
    before = []
    for s in dict.fromkeys(df.strategy):
        piv = df[df.strategy == s].pivot_table(index="seed", columns="stage", values="J")
        piv = piv.dropna(axis=1)  # the extra after-swap point exists only for swapping strategies
        _mean_std(ax, piv.columns.to_numpy(), piv.to_numpy(), method_color(s), method_label(s))
        before.append(piv.loc[:, piv.columns <= swap_stage].to_numpy())
    if len(before) > 1 and all(np.array_equal(b, before[0]) for b in before):
        # the curves lie on one another until the swap; say so instead of "overlaps" everywhere
        ax.text(0.02, 0.98, f"all strategies identical up to the swap\n(the same runs until stage {swap_stage})",
                transform=ax.transAxes, ha="left", va="top", fontsize=8)
    note_overlaps(ax, after=swap_stage)
    ax.axvline(swap_stage, color="k", ls=":", lw=1, label=f"swap at stage {swap_stage}")
    stage_axis(ax)
    ax.set_ylabel(ylabel)
    ax.legend(frameon=False, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    return fig or ax.figure


# ------------------------------------------------------------------ run directories
def plot_runs(run_dirs, out: Path | str, *, delta: float | None = None) -> list[Path]:
    """``sat plot``: the run-log figures of one or more runs (several runs are drawn together,
    one line per method, mean ± std over seeds), written to ``out``. Figures whose columns
    the logs lack are skipped."""
    run_dirs = [Path(d) for d in run_dirs]
    configs = [read_config(d) for d in run_dirs]
    kinds = {d: run_backend(c) for d, c in zip(run_dirs, configs, strict=True)}
    known = sorted({k for k in kinds.values() if k is not None})
    if len(known) > 1:  # exact J and held-out accuracy on one axis would mislead
        listed = "; ".join(f"{k}: {', '.join(str(d) for d, b in kinds.items() if b == k)}"
                           for k in known)
        raise InputError(f"cannot draw runs of different backends together ({listed}); "
                         "plot each backend separately")
    steps, stages = load_runs(run_dirs)
    if delta is None:
        d = _flat(configs[0], "delta")
        delta = float(d) if isinstance(d, int | float) else None
    # the score is the exact J in the tabular world, held-out task accuracy for LLM teams
    ylabel = ("held-out team score (J)" if known == ["llm"] else "team return J (exact)")
    written = []
    with paper_style():
        if not stages.empty and {"J_before", "J_after"} <= set(stages.columns):
            written += save_figure(plot_training_curves(stages, ylabel=ylabel), out, "training_curve")
        if not steps.empty and "kl" in steps.columns:
            written += save_figure(plot_kl_distribution(steps, delta), out, "kl_distribution")
        if not stages.empty and {"true_improvement", "lower_bound"} <= set(stages.columns):
            ok = stages.dropna(subset=["true_improvement", "lower_bound"])
            if not ok.empty:
                cols = [c for c in ("lower_bound_estimated", "lower_bound", "lower_bound_tv")
                        if c in ok.columns and ok[c].notna().any()]
                written += save_figure(plot_certificate_tracking(ok, bound_cols=cols), out,
                                       "certificate_tracking")
                written += save_figure(plot_certificate_vs_improvement(ok), out,
                                       "certificate_vs_improvement")
        if not steps.empty and {"L_seq", "L_stale"} <= set(steps.columns):
            ok = steps.dropna(subset=["L_seq", "L_stale"])
            within = tuple(i for i in (2, 3) if not ok.empty and i <= ok.step.max())
            if within:
                written += save_figure(plot_stale_gap(ok, within=within), out, "stale_gap")
    return written


def plot_run(run_dir: Path | str, out: Path | str | None = None) -> list[Path]:
    """The run-log figures of one run directory, in ``out`` (default ``RUN_DIR/plots``)."""
    return plot_runs([run_dir], Path(out) if out is not None else Path(run_dir) / "plots")
