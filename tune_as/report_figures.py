"""The paper's Figures 1-4 and an Optuna view, as PNG files (matplotlib, Agg backend, no display).

Each function draws one task's figure into `out` and returns the file, or returns a one-line note
saying why the figure was skipped (e.g. the search did not cover AS-Softmax for that task).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from tune_as.report_select import PAPER_ROWS, Cell, TrialRun, order
from tune_as.report_tables import BASELINE, History

if TYPE_CHECKING:
    from matplotlib.figure import Figure

AS_ROWS = ("as_softmax", "as_speed")
Cells = Mapping[tuple[str, str], Cell]
Drawn = Path | str  # the PNG written, or why nothing was


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


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")  # keep legends placed outside the axes
    _pyplot().close(fig)
    return path


def selected_rows(cells: Cells, task: str, wanted: Sequence[str] | None = None) -> list[str]:
    rows = order({r for t, r in cells if t == task}, PAPER_ROWS)
    return [r for r in rows if wanted is None or r in wanted]


def fig1_masked_ratio(task: str, cells: Cells, histories: Mapping[str, History], out: Path) -> Drawn:
    rows = selected_rows(cells, task, (BASELINE, *AS_ROWS))
    if not any(r in AS_ROWS for r in rows):
        return f"figure 1 ({task}): skipped, the search has no AS-Softmax trials for this task"
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for row in rows:
        x, y = joined(histories.get(cells[task, row].runs[0].run_id, {}), "optimizer_steps", "masked_ratio")
        ax.plot(x, y, marker=".", label=row)
    ax.set(xlabel="optimizer steps", ylabel="masked-row ratio", title=f"Figure 1: masked rows, {task}")
    ax.legend()
    return _save(fig, out / f"fig1_masked_ratio_{task}.png")


def fig2_delta(task: str, trials: Sequence[TrialRun], out: Path) -> Drawn:
    runs = [r for r in trials if r.task == task and "loss.delta" in r.params and r.loss.endswith("as_softmax")]
    if not runs:
        return f"figure 2 ({task}): skipped, the search has no AS-Softmax trials with a delta for this task"
    plt = _pyplot()
    metric = runs[0].metric
    delta = np.array([float(r.params["loss.delta"]) for r in runs])
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter(delta, [r.best_val for r in runs], label=f"validation {metric} (best)")
    test = [(d, r.last[f"test_{metric}"]) for d, r in zip(delta, runs, strict=True) if f"test_{metric}" in r.last]
    if test:
        ax.scatter(*np.array(test).T, marker="x", label=f"test {metric} (at best validation)")
    ax.set(xlabel="δ (loss.delta)", ylabel=metric, title=f"Figure 2: {metric} vs δ, {task} ({len(runs)} trials)")
    ax.legend()
    return _save(fig, out / f"fig2_delta_{task}.png")


def fig3_curves(task: str, cells: Cells, histories: Mapping[str, History], out: Path) -> Drawn:
    rows = selected_rows(cells, task)
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    metric = cells[task, rows[0]].runs[0].metric
    for row in rows:
        h = histories.get(cells[task, row].runs[0].run_id, {})
        x, y = joined(h, "optimizer_steps", f"val_{metric}")
        left.plot(x, y, marker=".", label=row)
        x, loss = joined(h, "optimizer_steps", "val_loss")
        span = np.ptp(loss) if loss.size else 0.0
        # Losses live on different scales (an AS-Softmax loss reaches 0): min-max normalise each curve.
        right.plot(x, (loss - loss.min()) / span if span > 0 else loss * 0, marker=".", label=row)
    left.set(xlabel="optimizer steps", ylabel=f"validation {metric}", title=f"Figure 3: validation {metric}, {task}")
    right.set(xlabel="optimizer steps", ylabel="normalised validation loss", title="normalised validation loss")
    left.legend(fontsize="small")
    return _save(fig, out / f"fig3_curves_{task}.png")


def fig4_pmargin(task: str, margins: Mapping[str, np.ndarray], deltas: Mapping[str, float], out: Path) -> Drawn:
    if not margins:
        return f"figure 4 ({task}): skipped, no pmargin.npy artifact on the selected softmax/AS-Softmax runs"
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    bins = np.linspace(-1, 1, 51)
    for row, m in margins.items():
        ax.hist(np.ravel(m), bins=bins, alpha=0.5, label=f"{row} (n={np.size(m)})")
        if row in deltas:
            ax.axvline(deltas[row], color="gray", linewidth=0.8, label=f"δ = {deltas[row]:.3g}")
    ax.axvline(0.0, color="black", linestyle=":", label="p_margin = 0")
    ax.set(xlabel="p_margin = p_t − max non-target p", ylabel="test examples",
           title=f"Figure 4: p_margin on the test set, {task}")
    ax.legend(fontsize="small")
    return _save(fig, out / f"fig4_pmargin_{task}.png")


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
    return _save(plt.gcf(), out / f"optuna_history_{study_name}.png")
