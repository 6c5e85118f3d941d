"""The search's answer: per loss, the selected setting and its confirmed numbers, ranked, with the paired
difference to softmax and its 95% interval. Pure: Ray results in, a table out (no Ray, no MLflow).

The rules are the report's (tune_as.results.selection), so a search and a later report can never disagree:
only trials that completed their epochs are results (a loss whose trials were all stopped early says so);
the setting with the best mean validation metric is selected; test metrics never choose.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tune_as.results.selection import Cell, TrialRun, new_seeds, paired_diff, same_setting, select
from tune_as.settings import DataSettings, TrialSettings

BASELINE = "softmax"


def trial_run(trial_id: str, data: DataSettings, settings: TrialSettings, metrics: dict[str, Any], metric: str,
              completed: bool, order: int = 0) -> TrialRun | None:
    """A finished trial as the report's TrialRun, with its typed settings (params: the strings MLflow logs, which
    identify a setting as the report does); None if it has no result. `order`: the trial's number in the search,
    so ties go to the earlier trial, as in the report (start time)."""
    best = metrics.get(f"best_val_{metric}")
    if metrics.get("error") or best is None or (isinstance(best, float) and math.isnan(best)):
        return None
    params = {k: str(v) for k, v in {**data.to_params(), **settings.to_dict()}.items()}
    last = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return TrialRun(trial_id, data.task, settings.loss, params, metric, float(best), last,
                    start_time=order, stopped_early=not completed, settings=settings)


def selected(runs: Sequence[TrialRun]) -> dict[str, Cell]:
    """Per loss, the selected setting among trials that completed their epochs (nothing for a loss without)."""
    return {cell.loss: cell for cell in select([r for r in runs if not r.stopped_early]).values()}


def confirmation_seeds(runs: Sequence[TrialRun], n: int) -> list[int]:
    """N seeds no trial of the search used: the same N for every loss, so differences pair by seed."""
    return new_seeds((r.seed for r in runs), n)


@dataclass(frozen=True)
class Row:
    loss: str
    setting: dict[str, str]  # the searched parameters of the selected setting
    trials: int  # trials of this loss with a result
    completed: int  # of which trained all their epochs
    val: list[float]  # best validation metric per confirmation seed (or of the selected run)
    test: list[float]  # test metric of the best-validation checkpoint, per seed
    confirmed: bool  # True: val/test are confirmation runs with new seeds
    diff: str = ""  # paired difference to softmax with its 95% interval, e.g. "+0.65 [+0.25, +1.05]"
    verdict: str = ""  # win / tie / loss against softmax


def _mean_std(values: Sequence[float], scale: float) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0] * scale:.2f} (single run)"
    return f"{statistics.fmean(values) * scale:.2f} ± {statistics.stdev(values) * scale:.2f}"


def rank(runs: Sequence[TrialRun], confirmations: Sequence[TrialRun], metric: str) -> list[Row]:
    """Rows for every loss that has trials, best confirmed (else selected) validation mean first; confirmed rows
    before unconfirmed ones."""
    cells = selected(runs)
    test_key = f"test_{metric}"
    rows: list[Row] = []
    by_seed: dict[str, dict[str, float]] = {}
    for loss in sorted({r.loss for r in runs}):
        mine = [r for r in runs if r.loss == loss]
        done = sum(not r.stopped_early for r in mine)
        cell = cells.get(loss)
        if cell is None:
            rows.append(Row(loss, {}, len(mine), done, [], [], False))
            continue
        reps = [c for c in confirmations if c.loss == loss and same_setting(c, cell.runs[0])]
        confirmed = bool(reps)
        source = reps or list(cell.runs)
        # the paired difference is on test; a task without test labels (GLUE) compares validation instead
        by_seed[loss] = {r.seed: r.last.get(test_key, r.best_val) for r in source}
        setting = {k: v for k, v in cell.params.items() if k in cell.shown}
        rows.append(Row(loss, setting, len(mine), done, [r.best_val for r in source],
                        [r.last[test_key] for r in source if test_key in r.last], confirmed))
    base = by_seed.get(BASELINE)
    final = []
    for row in rows:
        if base is not None and row.loss != BASELINE and row.loss in by_seed and row.confirmed:
            d = paired_diff(by_seed[row.loss], base)
            verdict = {"better": "win", "worse": "loss"}.get(d.verdict, "tie" if not math.isnan(d.low) else "")
            text = f"{d.mean * 100:+.2f} [{d.low * 100:+.2f}, {d.high * 100:+.2f}]" if not math.isnan(d.low) else ""
            if text and not row.test:
                text += " (val)"
            row = Row(**{**row.__dict__, "diff": text, "verdict": verdict})
        final.append(row)
    # with some losses confirmed (--confirm-top), they rank first: a selected run's validation is biased upward by
    # its selection, so it must not outrank a confirmed mean
    some = any(r.confirmed for r in final)
    return sorted(final, key=lambda r: (some and not r.confirmed, -statistics.fmean(r.val) if r.val else math.inf,
                                        r.loss))


HEADER = ("rank", "loss", "selected setting", "trials (completed)", "val mean ± std", "test mean ± std",
          "Δ test vs softmax [95% CI] (val where no test)", "verdict")


def table_rows(rows: Sequence[Row]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for i, r in enumerate(rows, 1):
        if not r.val:
            out.append(("-", r.loss, "every trial was stopped early or failed: no result", f"{r.trials} ({r.completed})",
                        "-", "-", "-", "-"))
            continue
        setting = ", ".join(f"{k.removeprefix('loss.')}={_short(v)}" for k, v in sorted(r.setting.items())) or "-"
        out.append((str(i), r.loss, setting, f"{r.trials} ({r.completed})", _mean_std(r.val, 100),
                    _mean_std(r.test, 100), r.diff or ("-" if r.loss == BASELINE else "n/a"), r.verdict or "-"))
    return out


def _short(value: str) -> str:
    try:
        return f"{float(value):.4g}"
    except ValueError:
        return value


def markdown(rows: Sequence[Row], title: str) -> str:
    lines = [f"### {title}", "", "| " + " | ".join(HEADER) + " |", "|" + " --- |" * len(HEADER)]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(rows)]
    return "\n".join(lines) + "\n"


def csv_text(rows: Sequence[Row]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(HEADER)
    writer.writerows(table_rows(rows))
    return buf.getvalue()
