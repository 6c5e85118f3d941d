"""The paper's Figures 1-4 and an Optuna view, as PNG files (matplotlib, Agg backend, no display).

Each function draws one task's figure into `out` and returns a `Drawing` (the file, the figure, and the runs
drawn as stopped early), or a one-line note saying why the figure was skipped (e.g. the search did not cover
AS-Softmax for that task).

Conventions, the same in every figure (docs/report.md, "Figures"):
- a loss has one colour and one marker everywhere (`style`): a colour of its own (Okabe-Ito's colour-blind
  safe seven first, then Paul Tol's muted ones), and a marker too, which tells apart two colours a reader's
  eyes may not;
- metrics in points (%), as the tables print them; an axis spans at least `MIN_SPAN` points, so a spread of
  a few test items is not drawn as a trend;
- a run early stopping cut before its last epoch is drawn hollow (dashed when a line, grey in Figure 2) and
  named in the legend, so a 1-epoch point is never read as a peer of a 10-epoch point;
- legends sit outside the axes, never over the data.
"""

from __future__ import annotations

import functools
import warnings
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from tune_as.report.tables import BASELINE, History
from tune_as.results.selection import MULTILABEL_PREFIX, PAPER_ROWS, Cell, TrialRun, order
from tune_as.tracking import schema

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

AS_ROWS = ("as_softmax", "as_speed")
Cells = Mapping[tuple[str, str], Cell]

# Okabe & Ito (2008), "Color Universal Design": distinguishable under the common colour-vision deficiencies
# (their yellow, #F0E442, is left out: too faint on white); then Paul Tol's muted scheme and three more, so
# every loss the code knows has a colour of its own (tests/test_report.py checks it).
PALETTE = ("#000000", "#D55E00", "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9",
           "#882255", "#117733", "#332288", "#999933", "#AA4499", "#44AA99", "#DDCC77", "#CC6677",
           "#661100", "#6699CC", "#BBCC33")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">")
MIN_SPAN = 2.0  # points: the least span of a metric axis
STOPPED_COLOUR = "#999999"  # Figure 2: the stopped trials of the one loss it shows
# The paper's protagonists take the first, most distinct colours:
# softmax black, AS-Softmax vermillion, AS-Speed blue.
STYLE_FIRST = ("softmax", "as_softmax", "as_speed")


@dataclass(frozen=True)
class Style:
    colour: str
    marker: str


@dataclass(frozen=True)
class Drawing:
    path: Path
    figure: Figure  # closed (no window, no memory in pyplot), its artists still readable
    stopped: tuple[str, ...]  # run ids drawn as stopped early


Drawn = Drawing | str  # the figure drawn, or why nothing was


@functools.cache
def style_order() -> tuple[str, ...]:
    """Every loss the code knows, in a fixed order: a loss's style never depends on which others a figure,
    task or search has."""
    from tune_as.losses import LOSSES

    first = (*STYLE_FIRST, *(r for r in PAPER_ROWS if r not in STYLE_FIRST))
    return tuple(order(set(LOSSES) | set(PAPER_ROWS), first))


def style(loss: str) -> Style:
    """The colour and marker of a loss (a table row), the same in every figure of every report."""
    known = style_order()
    # a loss no longer in the registry (an old run) still gets a stable style, from its name
    i = known.index(loss) if loss in known else zlib.crc32(loss.encode()) % (len(PALETTE) * len(MARKERS))
    return Style(PALETTE[i % len(PALETTE)], MARKERS[i % len(MARKERS)])


def _pyplot() -> ModuleType:
    import matplotlib

    matplotlib.use("Agg")  # files only: never open a window, works without a display
    import matplotlib.pyplot as plt

    return plt


def joined(history: History, x_key: str, y_key: str) -> tuple[np.ndarray, np.ndarray]:
    """y against x at the evaluation points (steps) where both were logged; x falls back to the step."""
    xs = dict(history.get(x_key, ()))
    pairs = [(xs.get(s, float(s)) if xs else float(s), v) for s, v in history.get(y_key, ())]
    if not pairs:
        return np.zeros(0), np.zeros(0)
    x, y = np.array(pairs, dtype=float).T
    return x, y


def _legend_outside(ax: Axes) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize="small",
              frameon=False)


def _points_axis(ax: Axes) -> None:
    """A metric axis (already in points) at least MIN_SPAN points tall, centred on what it shows."""
    low, high = ax.get_ylim()
    if high - low < MIN_SPAN:
        mid = (low + high) / 2
        ax.set_ylim(mid - MIN_SPAN / 2, mid + MIN_SPAN / 2)


def _save(fig: Figure, path: Path, stopped: Sequence[str] = ()) -> Drawing:
    fig.savefig(path, dpi=120, bbox_inches="tight")  # the outside legends are part of the image
    _pyplot().close(fig)
    return Drawing(path, fig, tuple(stopped))


def _curve(ax: Axes, x: np.ndarray, y: np.ndarray, row: str, stopped: bool) -> None:
    """One loss's curve: its colour and marker; hollow markers on a dashed line when stopped early."""
    s = style(row)
    look: dict[str, Any] = {"linestyle": "--", "markerfacecolor": "none"} if stopped else {}
    ax.plot(x, y, color=s.colour, marker=s.marker, markersize=4, linewidth=1.2,
            label=f"{row} (stopped early)" if stopped else row, **look)


def selected_rows(cells: Cells, task: str, wanted: Sequence[str] | None = None) -> list[str]:
    rows = order({r for t, r in cells if t == task}, PAPER_ROWS)
    return [r for r in rows if wanted is None or r in wanted]


def fig1_masked_ratio(task: str, cells: Cells, histories: Mapping[str, History], out: Path) -> Drawn:
    rows = selected_rows(cells, task, (BASELINE, *AS_ROWS))
    if not any(r in AS_ROWS for r in rows):
        return f"figure 1 ({task}): skipped, the search has no AS-Softmax trials for this task"
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4), layout="constrained")
    stopped = []
    for row in rows:
        run = cells[task, row].runs[0]
        x, y = joined(histories.get(run.run_id, {}), "optimizer_steps", "masked_ratio")
        _curve(ax, x, y, row, run.stopped_early)
        stopped += [run.run_id] if run.stopped_early else []
    ax.set(xlabel="optimizer steps", ylabel="masked-row ratio", title=f"Figure 1: masked rows, {task}")
    _legend_outside(ax)
    return _save(fig, out / f"fig1_masked_ratio_{task}.png", stopped)


def fig2_delta(task: str, trials: Sequence[TrialRun], out: Path) -> Drawn:
    """Validation (left) and test (right) metric against δ for every AS-Softmax trial: completed trials
    filled, trials stopped early hollow and grey (they trained fewer epochs: not comparable)."""
    runs = [r for r in trials
            if r.task == task and "loss.delta" in r.params and r.loss.endswith("as_softmax")]
    if not runs:
        return f"figure 2 ({task}): skipped, the search has no AS-Softmax trials with a delta for this task"
    plt = _pyplot()
    metric, s = runs[0].metric, style("as_softmax")
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), sharex=True, layout="constrained")
    done, stopped = [r for r in runs if not r.stopped_early], [r for r in runs if r.stopped_early]
    for ax, value in ((left, lambda r: 100 * r.best_val),
                      (right, lambda r: 100 * r.last.get(f"test_{metric}", np.nan))):
        for group, look, label in (
            (done, {"color": s.colour}, f"completed its epochs ({len(done)})"),
            (stopped, {"facecolors": "none", "edgecolors": STOPPED_COLOUR},
             f"stopped early ({len(stopped)}): trained fewer epochs"),
        ):
            if group:
                ax.scatter([float(r.params["loss.delta"]) for r in group], [value(r) for r in group],
                           marker=s.marker, label=label, **look)
    left.set(xlabel="δ (loss.delta)", ylabel=f"best validation {metric} (%)",
             title=f"Figure 2: {metric} vs δ, {task} ({len(runs)} trials)")
    right.set(xlabel="δ (loss.delta)", ylabel=f"test {metric} at the best-validation checkpoint (%)",
              title="test")
    for ax in (left, right):
        _points_axis(ax)
    _legend_outside(right)
    return _save(fig, out / f"fig2_delta_{task}.png", [r.run_id for r in stopped])


def fig3_curves(task: str, cells: Cells, histories: Mapping[str, History], out: Path) -> Drawn:
    rows = selected_rows(cells, task)
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), layout="constrained")
    metric = cells[task, rows[0]].runs[0].metric
    stopped = []
    for row in rows:
        run = cells[task, row].runs[0]
        h = histories.get(run.run_id, {})
        x, y = joined(h, "optimizer_steps", f"val_{metric}")
        _curve(left, x, 100 * y, row, run.stopped_early)
        x, loss = joined(h, "optimizer_steps", "val_loss")
        span = np.ptp(loss) if loss.size else 0.0
        # Losses live on different scales (an AS-Softmax loss reaches 0): min-max normalise each curve.
        _curve(right, x, (loss - loss.min()) / span if span > 0 else loss * 0, row, run.stopped_early)
        stopped += [run.run_id] if run.stopped_early else []
    left.set(xlabel="optimizer steps", ylabel=f"validation {metric} (%)",
             title=f"Figure 3: validation {metric}, {task}")
    _points_axis(left)
    right.set(xlabel="optimizer steps", ylabel="normalised validation loss",
              title="normalised validation loss")
    _legend_outside(right)
    return _save(fig, out / f"fig3_curves_{task}.png", stopped)


def fig4_pmargin(task: str, cells: Cells, margins: Mapping[str, np.ndarray], out: Path) -> Drawn:
    """Histograms of p_margin of the selected runs (`margins`: row -> values), with δ of AS-Softmax."""
    if not margins:
        return (f"figure 4 ({task}): skipped, no {schema.PMARGIN_FILE} artifact on the selected "
                "softmax/AS-Softmax runs")
    plt = _pyplot()
    from matplotlib.colors import to_rgba

    fig, ax = plt.subplots(figsize=(6.5, 4), layout="constrained")
    bins = np.linspace(-1, 1, 51)
    stopped = []
    for row, m in margins.items():
        run, s = cells[task, row].runs[0], style(row)
        # the loss itself: Eq. 14/18's multilabel_* in a multi-label row
        label = f"{run.loss} (n={np.size(m)})"
        if run.stopped_early:
            ax.hist(np.ravel(m), bins=bins, histtype="step", linestyle="--", color=s.colour,
                    label=f"{label}, stopped early")
            stopped.append(run.run_id)
        else:  # a translucent fill under a full-colour outline: softmax's black never fades to "stopped" grey
            ax.hist(np.ravel(m), bins=bins, histtype="stepfilled", facecolor=to_rgba(s.colour, 0.3),
                    edgecolor=s.colour, linewidth=1.2, label=label)
        if "loss.delta" in run.params:
            delta = float(run.params["loss.delta"])
            ax.axvline(delta, color=s.colour, linewidth=1.0, linestyle="-.",
                       label=f"δ = {delta:.3g} ({run.loss})")
    ax.axvline(0.0, color="dimgray", linestyle=":", label="p_margin = 0 (wrong | right)")
    # Section 4.5
    multilabel = any(cells[task, row].runs[0].loss.startswith(MULTILABEL_PREFIX) for row in margins)
    ax.set(xlabel="p_margin = min positive p − max negative p" if multilabel
           else "p_margin = p_t − max non-target p",
           ylabel="test examples",
           title=f"Figure 4: p_margin on the test set, {task}")
    _legend_outside(ax)
    return _save(fig, out / f"fig4_pmargin_{task}.png", stopped)


def optuna_history(storage: Path, study_name: str, out: Path) -> Drawn:
    """The optimization history of the AS-Softmax study from the search's Optuna SQLite file."""
    if not storage.is_file():
        return f"optuna view: skipped, no Optuna study file at {storage} (pass --optuna-storage)"
    import optuna
    from optuna.visualization.matplotlib import plot_optimization_history

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{storage.resolve()}"
    names = [s.study_name for s in optuna.get_all_study_summaries(url)]
    if study_name not in names:
        return f"optuna view: skipped, expected study {study_name!r} in {storage}, received {sorted(names)}"
    study = optuna.load_study(study_name=study_name, storage=url)
    if not any(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials):
        return f"optuna view: skipped, study {study_name!r} has no completed trial"
    plt = _pyplot()  # Agg before optuna's plot touches pyplot
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        ax = plot_optimization_history(study)  # draws on a new current figure
    ax.set_title(f"Optuna optimization history: {study_name}")
    plt.gcf().tight_layout()
    return _save(plt.gcf(), out / f"optuna_history_{study_name}.png")
