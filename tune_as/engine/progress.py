"""The search's progress view: one line per loss, at most 100 columns, instead of Ray's table with a column for
every parameter of every loss (250+ columns, most cells empty, wrapped in any terminal). `--verbose` brings
Ray's per-trial table back.

`loss_lines` is pure (plain records in, lines out) so its widths are tested without Ray; `LossProgress` is the
Ray `ProgressReporter` that turns Tune's trials into those records.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ray.tune import CLIReporter, ProgressReporter

from tune_as.engine.plan import SearchPlan
from tune_as.space.search_space import config_key
from tune_as.tracking import schema

WIDTH = 100
LOSS_WIDTH = 22


@dataclass(frozen=True)
class TrialStatus:
    """What the view needs of one trial."""

    loss: str
    status: str  # Tune's: PENDING, RUNNING, PAUSED, TERMINATED, ERROR
    epoch: float  # epochs trained so far
    epochs: float  # its own epochs (a trial that ended before them was stopped early)
    best_val: float | None  # best validation metric so far (a fraction)
    setting: str  # its searched parameters, "k=v, ..."
    error: bool = False  # it failed or diverged (Tune may still call it TERMINATED: it reported its error)


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def loss_lines(trials: Sequence[TrialStatus], title: str, metric: str, total: int | None = None) -> list[str]:
    """A header line, a column line, then per loss: trials done / running / stopped early / failed, the best
    validation metric so far and the setting that reached it. Every line at most WIDTH characters. `total`: the
    trials the run will have (Tune creates them as the searcher suggests them)."""
    done = sum(t.status in ("TERMINATED", "ERROR") for t in trials)  # ended, whichever way
    running = sum(t.status == "RUNNING" for t in trials)
    lines = [_fit(f"{title}: {done}/{max(total or 0, len(trials))} trials ended, {running} running", WIDTH),
             f"{'loss':<{LOSS_WIDTH}} {'done':>4} {'run':>4} {'stop':>4} {'fail':>4} {'best ' + metric[:9]:>14}  setting"]
    for loss in dict.fromkeys(t.loss for t in trials):
        mine = [t for t in trials if t.loss == loss]
        failed = sum(t.status == "ERROR" or t.error for t in mine)
        ended = [t for t in mine if t.status == "TERMINATED" and not t.error]
        stopped = sum(t.epoch < t.epochs - 1e-6 for t in ended)
        scored = [t for t in mine if t.best_val is not None]
        best = max(scored, key=lambda t: t.best_val or 0.0) if scored else None
        value = f"{100 * best.best_val:.2f}" if best is not None and best.best_val is not None else "-"
        head = (f"{_fit(loss, LOSS_WIDTH):<{LOSS_WIDTH}} {len(ended) - stopped:>4} "
                f"{sum(t.status == 'RUNNING' for t in mine):>4} {stopped:>4} {failed:>4} {value:>14}  ")
        lines.append(head + _fit(best.setting if best else "", WIDTH - len(head)))
    return lines


class LossProgress(ProgressReporter):
    """Prints `loss_lines` at most every `every_s` seconds while the trials run, and once at the end."""

    def __init__(self, title: str, metric: str, searched: dict[str, tuple[str, ...]], every_s: float = 30.0) -> None:
        self.title, self.metric, self.searched, self.every_s = title, metric, searched, every_s
        self.last = 0.0
        self.total: int | None = None

    def setup(self, start_time: float | None = None, total_samples: int | None = None, metric: str | None = None,
              mode: str | None = None, **kwargs: Any) -> None:
        self.total = total_samples

    def should_report(self, trials: list[Any], done: bool = False) -> bool:
        return done or time.monotonic() - self.last >= self.every_s

    def report(self, trials: list[Any], done: bool, *sys_info: str) -> None:
        self.last = time.monotonic()
        rows = [self._status(t) for t in trials]
        print("\n".join(loss_lines(rows, self.title, self.metric, self.total)) + "\n", file=sys.stdout, flush=True)

    def _status(self, trial: Any) -> TrialStatus:
        config, last = trial.config or {}, trial.last_result or {}
        loss = str(config.get("loss", "?"))
        setting = ", ".join(f"{k.removeprefix('loss.')}={config[k]}" for k in self.searched.get(loss, ())
                            if k in config)
        best = last.get(f"best_val_{self.metric}")
        return TrialStatus(loss, str(trial.status), float(last.get("epoch", 0.0)), float(config.get("epochs", 0.0)),
                           float(best) if isinstance(best, (int, float)) else None, setting, bool(last.get("error")))


def reporter(plan: SearchPlan, role: str) -> ProgressReporter:
    """One line per loss in 100 columns; `--verbose`: Ray's per-trial table. Validation only: test metrics during
    a search invite choosing on test."""
    metric = plan.metric
    if plan.request.verbose >= 2:
        params = {"seed": "seed"} | {config_key(d.name): d.name for s in plan.space.losses.values() for d in s.params}
        return CLIReporter(metric_columns={"epoch": "epoch", f"val_{metric}": f"val_{metric}",
                                           f"best_val_{metric}": f"best_val_{metric}", "masked_ratio": "masked"},
                           parameter_columns=params, max_report_frequency=30, sort_by_metric=False)
    searched = {loss: tuple(config_key(d.name) for d in s.params) for loss, s in plan.space.losses.items()}
    what = "confirmation" if role == schema.ROLE_CONFIRMATION else "search"
    return LossProgress(f"{plan.task.name} {what}", metric, searched)
