"""The paper's tables (6, 2, 3, 4) and the confirmation table, built from selected cells.

Rows are losses in the paper's order, columns are tasks; a loss the search did not cover for a task
shows "-", as in the paper. "n/a" means the cell exists but the value cannot be computed (e.g. a
correlation over fewer than 3 evaluation points). "stopped early" means every trial of that task x loss was
stopped before its last epoch: it has no result to show (tune_as.results.selection.select).
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from collections.abc import Collection, Mapping, Sequence

import numpy as np

from tune_as.results import racing, ranking, verdicts
from tune_as.results.render import Table, fmt_value
from tune_as.results.selection import (
    PAPER_ROWS,
    PAPER_TASKS,
    Cell,
    Confirmation,
    mean_last,
    order,
)

MISSING = "-"
NA = "n/a"
STOPPED = "stopped early"
UNCONFIRMED = "†"
BASELINE = ranking.BASELINES["multiclass"]  # the paper's reference row (multilabel_softmax folds into it)

# One run's metric histories: metric name -> [(step, value), ...] in step order.
History = Mapping[str, Sequence[tuple[int, float]]]
Cells = Mapping[tuple[str, str], Cell]


def layout(cells: Cells) -> tuple[list[str], list[str]]:
    """Table rows (the paper's losses, then any other loss seen) and columns (tasks seen)."""
    tasks = order({t for t, _ in cells}, PAPER_TASKS)
    rows = order({r for _, r in cells} | set(PAPER_ROWS), PAPER_ROWS)
    return tasks, rows


def pct(x: float) -> str:
    return NA if math.isnan(x) else f"{100 * x:.2f}"


def table6(cells: Cells) -> Table:
    tasks, rows = layout(cells)

    def cell(c: Cell) -> str:
        trials = f"{c.n_trials} trial{'s' if c.n_trials > 1 else ''}"
        if c.stopped_early:
            return f"{STOPPED} [{trials}, none completed]"
        params = ", ".join(f"{k.removeprefix('loss.')}={fmt_value(c.params[k])}"
                           for k in c.shown) or "defaults"
        stopped = f", {c.n_stopped} {STOPPED}" if c.n_stopped else ""
        repeats = f", mean of {len(c.runs)} runs" if len(c.runs) > 1 else ""
        return f"{params} [{trials}{stopped}{repeats}]"

    body = [[row] + [cell(cells[t, row]) if (t, row) in cells else MISSING for t in tasks] for row in rows]
    return Table("table6", "Table 6: selected hyper-parameters (best mean validation metric)",
                 ["loss"] + tasks, body)


def selection_csv(cells: Cells) -> str:
    """Machine-readable Table 6: raw numbers, every hyper-parameter and the MLflow run ids behind each
    cell."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["task", "row", "loss", "metric", "val_mean", "n_runs", "n_trials", "n_stopped",
                     "stopped_early", "optimizer_steps", "train_seconds", "test", "test_confirmed",
                     "n_confirmations", "params", "run_ids", "confirmation_run_ids"])
    tasks, rows = layout(cells)
    for t in tasks:
        for row in rows:
            if (t, row) in cells:
                c = cells[t, row]
                m = c.runs[0].metric
                params = {k: v for k, v in sorted(c.params.items()) if k not in ("seed", "git_commit")}
                confirmed = mean_last(c.confirmations, f"test_{m}")
                writer.writerow([t, row, c.loss, m, c.val, len(c.runs), c.n_trials, c.n_stopped,
                                 c.stopped_early, c.steps, c.mean("train_seconds"), c.mean(f"test_{m}"),
                                 confirmed, len(c.confirmations), json.dumps(params),
                                 " ".join(r.run_id for r in c.runs),
                                 " ".join(r.run_id for r in c.confirmations)])
    return buf.getvalue()


def test_metric_columns(cells: Cells, tasks: Sequence[str]) -> list[tuple[str, str]]:
    """(task, metric) pairs: the selection metric first, then the task's other test metrics."""
    columns = []
    for t in tasks:
        task_cells = [c for (task, _), c in cells.items() if task == t]
        first = task_cells[0].runs[0].metric
        others = sorted({m for c in task_cells for r in c.runs for m in r.test_metrics()} - {first})
        columns += [(t, m) for m in [first, *others]]
    return columns


def test_result(c: Cell, metric: str) -> str:
    """Confirmed: mean ± std over the confirmation seeds (n=...). Else the selected run (mean of its repeats)
    marked † : chosen on these same runs' validation metric, never re-run with new seeds."""
    if c.stopped_early:
        return STOPPED
    values = [r.last[f"test_{metric}"] for r in c.results if f"test_{metric}" in r.last]
    if not values:
        return NA
    if not c.confirmations:
        return pct(statistics.fmean(values)) + UNCONFIRMED
    spread = f" ± {pct(statistics.stdev(values))}" if len(values) > 1 else ""
    return f"{pct(statistics.fmean(values))}{spread} (n={len(values)})"


def table2(cells: Cells) -> Table:
    tasks, rows = layout(cells)
    columns = test_metric_columns(cells, tasks)
    body = [[row] + [test_result(cells[t, row], m) if (t, row) in cells else MISSING for t, m in columns]
            for row in rows]
    notes = [f"Confirmed cells: mean ± std over n confirmation runs "
             f"(the selected setting with seeds no trial used). "
             f"{UNCONFIRMED} not confirmed: the selected trial run (or the mean of its repeats, Table 6), "
             f"chosen on the validation metric of these same runs; `--confirm N` re-runs it with new seeds. "
             f"{STOPPED}: every trial was stopped before its last epoch, so there is no result."]
    return Table("table2", "Table 2: test metric of the selected setting (best-validation checkpoint), in %",
                 ["loss"] + [f"{t} {m}" for t, m in columns], body, notes)


def table3(cells: Cells) -> Table:
    tasks, rows = layout(cells)

    def cell(t: str, row: str) -> str:
        if (t, row) not in cells:
            return MISSING
        if cells[t, row].stopped_early:
            return STOPPED
        secs = cells[t, row].mean("train_seconds")
        base = (cells[t, BASELINE].mean("train_seconds")
                if (t, BASELINE) in cells and not cells[t, BASELINE].stopped_early else math.nan)
        if math.isnan(secs):
            return NA
        if row == BASELINE or math.isnan(base) or base <= 0:
            seconds = f"{secs:.0f}" if secs >= 10 else f"{secs:.1f}"
            return seconds if row == BASELINE else f"{seconds}s"
        change = round(100 * (secs / base - 1))
        return "0" if change == 0 else f"{change:+d}%"

    return Table("table3", "Table 3: training time, seconds for softmax and relative to softmax for the rest",
                 ["loss"] + tasks, [[row] + [cell(t, row) for t in tasks] for row in rows])


def pearson(history: History, metric: str) -> float:
    """Pearson r between val_loss and val_<metric> over the evaluation points both were logged at."""
    loss = dict(history.get("val_loss", ()))
    pairs = [(loss[s], v) for s, v in history.get(f"val_{metric}", ()) if s in loss]
    if len(pairs) < 3:
        return math.nan
    x, y = np.array(pairs, dtype=float).T
    if x.std() == 0 or y.std() == 0:
        return math.nan
    return float(np.corrcoef(x, y)[0, 1])


def table4(cells: Cells, histories: Mapping[str, History]) -> Table:
    tasks, rows = layout(cells)

    def cell(t: str, row: str) -> str:
        if (t, row) not in cells:
            return MISSING
        c = cells[t, row]
        if c.stopped_early:
            return STOPPED
        rs = [r for r in (pearson(histories.get(run.run_id, {}), run.metric) for run in c.runs)
              if not math.isnan(r)]
        return f"{float(np.mean(rs)):.3f}" if rs else NA

    return Table("table4", "Table 4: Pearson correlation between validation loss and validation metric",
                 ["loss"] + tasks, [[row] + [cell(t, row) for t in tasks] for row in rows])


def race_of(task: str, cells: Mapping[tuple[str, str], Cell]) -> tuple[racing.Answer, racing.Plan] | None:
    """The verdicts of the report's own `--confirm` runs (a search that confirmed its answer is replayed
    instead, tune_as.report.answers): the search's rules (tune_as.results.racing) in one look over the seeds
    the runs have, Holm, the best set, at the default margin and alpha."""
    mine = {c.loss: c for (t, _), c in cells.items() if t == task and c.confirmations}
    kind = ("multilabel" if any(loss.startswith("multilabel_") or loss == "bce" for loss in mine)
            else "multiclass")
    baseline = ranking.baseline_for(kind)
    seeds = sorted({int(r.seed) for c in mine.values() for r in c.confirmations if r.seed.isdigit()})
    if baseline not in mine or len(mine) < 2 or len(seeds) < 2:
        return None
    runs = [r for c in mine.values() for r in c.confirmations if r.seed.isdigit()]
    metric = next(iter(mine.values())).runs[0].metric
    plan = racing.Plan.fixed(list(mine), baseline, seeds, len(seeds))
    return racing.decide(ranking.race_results(runs, metric), plan, 0), plan


def confirmation_table(confirmations: Mapping[tuple[str, str], Confirmation],
                       cells: Mapping[tuple[str, str], Cell], replayed: Collection[str] = ()) -> Table:
    """Mean ± std over the confirmation seeds. For a task whose search confirmed its own answer (`replayed`),
    the verdicts are that answer's (its own table); for the others, the report's `--confirm` runs decide in
    one look (`race_of`): the difference to the baseline with its simultaneous interval and the verdict,
    best-set members marked *."""
    tasks = order({t for t, _ in confirmations}, PAPER_TASKS)
    rows = order({r for _, r in confirmations}, PAPER_ROWS)
    races = {t: None if t in replayed else race_of(t, cells) for t in tasks}
    header = ["loss"]
    for t in tasks:
        metric = next(c.metric for (task, _), c in confirmations.items() if task == t)
        race = races[t]
        base = race[1].baseline if race else BASELINE
        header += [f"{t} {metric} mean ± std", f"{t} Δ vs {base} [simultaneous interval] verdict"]
    body = []
    marked = False
    for row in rows:
        line = [row]
        for t in tasks:
            c = confirmations.get((t, row))
            if c is None:
                line += [MISSING, MISSING]
                continue
            std = NA if math.isnan(c.std) else f"{100 * c.std:.2f}"
            race = races[t]
            loss = cells[t, row].loss
            star = "*" if race and loss in race[0].best else ""
            line.append(f"{100 * c.mean:.2f} ± {std} (n={len(c.by_seed)}){star}")
            if t in replayed:
                line.append("see the search's answer")
                continue
            if race is None or loss == race[1].baseline or not any(x.loss == loss for x in race[0].rows):
                line.append("reference" if race and loss == race[1].baseline else MISSING)
                continue
            v = race[0].row(loss)
            interval = f" [{100 * v.interval[0]:+.2f}, {100 * v.interval[1]:+.2f}]" if v.interval else ""
            word = verdicts.verdict_word(v, verdicts.points(race[1].margin_points))
            marked = marked or word.endswith(verdicts.STEP_DOWN_MARK)
            line.append(f"{100 * (v.mean_diff or 0.0):+.2f}{interval} {word}")
        body.append(line)
    return Table("confirmation", "Confirmation: selected settings re-run with new seeds (test metric, in %)",
                 header, body,
                 [*(["Verdicts of a search that confirmed its own answer are in that answer's table "
                     "(answer_<search>), replayed from its runs and plan."] if replayed else []),
                  "Verdicts here (where shown) are this report's own: its --confirm runs in one look "
                  "(Holm, family-wise 2.5%, margin ±0.5 points); * in the best set on validation "
                  "(Hsu) (docs/verdicts.md).",
                  *([verdicts.STEP_DOWN_NOTE] if marked else [])])
