"""The search's answer: per loss, the selected setting and its confirmed numbers, the verdict against the
task's baseline and whether it is in the best set. Pure: trial runs in, a table out (no Ray, no MLflow).

Selection follows tune_as.results.selection: only trials that completed their epochs are results; the setting
with the best mean validation metric is selected; test metrics never choose. tune_as.results.answer calls
`rank` and `table` for both the search and the report's replay of it. The verdicts and the best set come from
the race (tune_as.results.racing: Holm over every printed claim, alpha spent per look; docs/verdicts.md).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tune_as.results import racing, verdicts
from tune_as.results.render import Table, short_settings
from tune_as.results.selection import Cell, TrialRun, new_seeds, same_setting, select
from tune_as.settings import DataSettings, TrialSettings

# The baseline every verdict compares with, by task kind: plain softmax cross-entropy, and for multi-label
# tasks its counterpart, Su's multi-label softmax (the AS-Softmax paper's Eq. 14), which AS-Softmax modifies.
BASELINES = {"multiclass": "softmax", "token": "softmax", "multilabel": "multilabel_softmax"}
# The AS-Softmax of each kind, the loss the paper's figures and study rows single out: Eq. 5, and for
# multi-label tasks Eq. 18 (the multi-label softmax with AS-Softmax's mask).
AS_SOFTMAX = {"multiclass": "as_softmax", "token": "as_softmax", "multilabel": "multilabel_as_softmax"}


def baseline_for(kind: str, chosen: str | None = None) -> str:
    return chosen or BASELINES[kind]


def trial_run(trial_id: str, data: DataSettings, settings: TrialSettings, metrics: dict[str, Any],
              metric: str, completed: bool, order: int = 0) -> TrialRun | None:
    """A finished trial as the report's TrialRun, with its typed settings (params: the strings MLflow logs,
    which identify a setting as the report does); None if it has no result. `order`: the trial's number in the
    search, so ties go to the earlier trial, as in the report (start time)."""
    best = metrics.get(f"best_val_{metric}")
    if metrics.get("error") or best is None or (isinstance(best, float) and math.isnan(best)):
        return None
    params = {k: str(v) for k, v in {**data.to_params(), **settings.to_dict()}.items()}
    last = {k: float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return TrialRun(trial_id, data.task, settings.loss, params, metric, float(best), last,
                    start_time=order, stopped_early=not completed, settings=settings)


def selected(runs: Sequence[TrialRun]) -> dict[str, Cell]:
    """Per loss, the selected setting among trials that completed their epochs (nothing for a loss
    without)."""
    return {cell.loss: cell for cell in select([r for r in runs if not r.stopped_early]).values()}


def confirmation_seeds(runs: Sequence[TrialRun], n: int) -> list[int]:
    """N seeds no trial of the search used: the same N for every loss, so differences pair by seed."""
    return new_seeds((r.seed for r in runs), n)


def race_results(confirmations: Sequence[TrialRun],
                 metric: str) -> dict[str, dict[int, tuple[float, float | None]]]:
    """Confirmation runs as the race reads them: loss -> seed -> (validation, test or None)."""
    out: dict[str, dict[int, tuple[float, float | None]]] = {}
    for r in confirmations:
        out.setdefault(r.loss, {})[int(r.seed)] = (r.best_val, r.last.get(f"test_{metric}"))
    return out


@dataclass(frozen=True)
class Row:
    loss: str
    setting: dict[str, str]  # the searched parameters of the selected setting
    trials: int  # trials of this loss with a result
    completed: int  # of which trained all their epochs
    val: list[float]  # best validation metric per confirmation seed (or of the selected run)
    test: list[float]  # test metric of the best-validation checkpoint, per seed
    confirmed: bool  # True: val/test are confirmation runs with new seeds
    diff: str = ""  # difference to the baseline with its simultaneous interval, in points
    verdict: str = ""  # win / loss / equivalent / undecided (n seeds); "baseline" on the baseline's row
    best: bool = False  # in the set that cannot be told apart from the best (validation)
    failure: str = ""  # why a loss has no result (every trial stopped early, failed or diverged)


def _mean_std(values: Sequence[float], scale: float) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0] * scale:.2f} (single run)"
    return f"{statistics.fmean(values) * scale:.2f} ± {statistics.stdev(values) * scale:.2f}"


def _diff(row: racing.Comparison, on_val: bool) -> str:
    if row.mean_diff is None:
        return ""
    text = f"{row.mean_diff * 100:+.2f}"
    if row.interval is not None:
        text += f" [{row.interval[0] * 100:+.2f}, {row.interval[1] * 100:+.2f}]"
    return text + (" (val)" if on_val else "")


def rank(runs: Sequence[TrialRun], confirmations: Sequence[TrialRun], metric: str, losses: Sequence[str] = (),
         answer: racing.Answer | None = None, plan: racing.Plan | None = None,
         failures: Mapping[str, str] | None = None) -> list[Row]:
    """Rows for every loss of the request (`losses`, plus any that has trials): best-set members first, then
    by confirmed (else selected) validation mean; confirmed rows before unconfirmed ones; losses without a
    result last, saying why. `answer`: the race's verdicts and best set over `confirmations`, under `plan`."""
    cells = selected(runs)
    test_key = f"test_{metric}"
    rows: list[Row] = []
    for loss in sorted(set(losses) | {r.loss for r in runs}):
        mine = [r for r in runs if r.loss == loss]
        done = sum(not r.stopped_early for r in mine)
        cell = cells.get(loss)
        if cell is None:
            why = (failures or {}).get(loss) or ("every trial was stopped early" if mine else "no trial ran")
            rows.append(Row(loss, {}, len(mine), done, [], [], False, failure=why))
            continue
        if answer is not None and plan is not None:  # the seeds the loss's decisions used
            seeds = {str(s) for s in plan.seeds[: answer.seeds_used.get(loss, 0)]}
        else:
            seeds = {c.seed for c in confirmations}
        # one run per seed, the one the race reads (`race_results`: the last): a seed run twice (a resume from
        # Ray state files of two snapshots, docs/architecture.md) must not count twice in mean ± std
        per_seed = {c.seed: c for c in confirmations if c.loss == loss and c.seed in seeds and _same(c, cell)}
        reps = sorted(per_seed.values(), key=lambda c: int(c.seed))
        source = reps or list(cell.runs)
        setting = {k: v for k, v in cell.params.items() if k in cell.shown}
        row = Row(loss, setting, len(mine), done, [r.best_val for r in source],
                  [r.last[test_key] for r in source if test_key in r.last], bool(reps))
        if answer is not None and plan is not None and reps:
            row = replace(row, best=loss in answer.best)
            if loss == plan.baseline:
                row = replace(row, verdict="baseline")
            elif any(c.loss == loss for c in answer.rows):
                c = answer.row(loss)
                word = verdicts.verdict_word(c, verdicts.points(plan.margin_points))
                row = replace(row, diff=_diff(c, answer.metric == "val"), verdict=word)
        rows.append(row)
    some = any(r.confirmed for r in rows)
    # the best set's members are tied, not ranked: by name among themselves
    return sorted(rows, key=lambda r: (not r.val, some and not r.confirmed, not r.best,
                                       0.0 if r.best else -statistics.fmean(r.val) if r.val else math.inf,
                                       r.loss))


def _same(run: TrialRun, cell: Cell) -> bool:
    """A confirmation of the cell's selected setting (its settings equal but for the seed)."""
    if run.settings is not None and cell.runs[0].settings is not None:
        return replace(run.settings, seed=0) == replace(cell.runs[0].settings, seed=0)
    return same_setting(run, cell.runs[0])


def header(baseline: str, margin_points: float, alpha: float) -> tuple[str, ...]:
    return ("rank", "loss", "selected setting", "trials (completed)", "val mean ± std", "test mean ± std",
            f"Δ test vs {baseline}, points [simultaneous interval] (val where no test)",
            f"verdict (Holm, family-wise {alpha / 2:.1%}, margin ±{margin_points:g} pts)", "best set (tied)")


def exact_value(v: str) -> str:
    """A logged param as it reproduces the run: a float in its shortest exact form (1.0001 stays 1.0001)."""
    try:
        return v if v.lstrip("-").isdigit() else repr(float(v))
    except ValueError:
        return v


def table_rows(rows: Sequence[Row], exact: bool = True) -> list[list[str]]:
    """The answer's cells; `exact`: each setting as it reproduces the run, else to a few digits (render)."""
    out: list[list[str]] = []
    tied = sum(r.best for r in rows)
    short = short_settings([r.setting for r in rows if r.val])
    for i, r in enumerate(rows, 1):
        if not r.val:
            out.append(["-", r.loss, f"no result: {r.failure}", f"{r.trials} ({r.completed})",
                        "-", "-", "-", "-", "-"])
            continue
        exact_text = ", ".join(f"{k.removeprefix('loss.')}={exact_value(v)}"
                               for k, v in sorted(r.setting.items()))
        setting = (exact_text if exact else short.pop(0)) or "-"
        out.append(["1=" if r.best and tied > 1 else str(i), r.loss, setting, f"{r.trials} ({r.completed})",
                    _mean_std(r.val, 100), _mean_std(r.test, 100), r.diff or "-",
                    r.verdict or ("-" if r.confirmed else "not confirmed"),
                    ("yes" if r.best else "no") if r.confirmed else "-"])
    return out


def table(rows: Sequence[Row], title: str, baseline: str, margin_points: float, alpha: float,
          notes: Sequence[str] = ()) -> Table:
    """The answer's table; `notes` (tune_as.results.answer) say what its verdicts and marks claim."""
    return Table("ranking", title, list(header(baseline, margin_points, alpha)), table_rows(rows),
                 list(notes), short_header=["#", "loss", "selected setting", "trials", "val %", "test %",
                                            f"Δ vs {baseline}", "verdict", "best"],
                 key=(f"trials: search trials (completed their epochs); val %, test %: mean ± std over the "
                      f"seeds; Δ vs {baseline}: test points [simultaneous interval] (val where no test); "
                      f"verdict: Holm, family-wise {alpha / 2:.1%}, margin ±{margin_points:g} points; "
                      f"best: in the best set (tied)"),
                 keep_whole=(0, 1), fold=(2,), shown=table_rows(rows, exact=False),
                 spill=(4, 3, 8, 2))  # narrow: val %, trials, best, the setting go to a second block
