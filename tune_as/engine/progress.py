"""The search's progress view: one line per loss, at most 100 columns, instead of Ray's table with a column
for every parameter of every loss (250+ columns, most cells empty, wrapped in any terminal). `--verbose`
brings Ray's per-trial table back.

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

from tune_as.engine.members import members
from tune_as.engine.plan import SearchPlan
from tune_as.results.render import one_setting
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


def clock(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}" if minutes >= 60 else f"{minutes}:{secs:02d}"


def time_left(trials: Sequence[TrialStatus], total: int | None, elapsed_s: float) -> float | None:
    """Seconds left, from the epochs trained so far per second of this run and the epochs still to train: the
    rest of every running or pending trial's epochs, and for trials not created yet the mean epochs of those
    that are (a trial that ended, stopped early or failed, has nothing left). None before the first epoch's
    progress."""
    ended = ("TERMINATED", "ERROR")
    trained = sum(min(t.epoch, t.epochs) for t in trials)
    if trained <= 0 or elapsed_s <= 0 or not trials:
        return None
    left = sum(max(0.0, t.epochs - t.epoch) for t in trials if t.status not in ended and not t.error)
    left += max(0, (total or 0) - len(trials)) * sum(t.epochs for t in trials) / len(trials)
    return left / (trained / elapsed_s)


def loss_lines(trials: Sequence[TrialStatus], title: str, metric: str, total: int | None = None,
               elapsed_s: float | None = None) -> list[str]:
    """A header line (with the elapsed time and an estimate of the time left when `elapsed_s` is given), a
    column line, then per loss: trials done / running / stopped early / failed, the best validation metric so
    far and the setting that reached it. Every line at most WIDTH characters. `total`: the trials the run will
    have (Tune creates them as the searcher suggests them)."""
    done = sum(t.status in ("TERMINATED", "ERROR") for t in trials)  # ended, whichever way
    running = sum(t.status == "RUNNING" for t in trials)
    when = ""
    if elapsed_s is not None:
        left = time_left(trials, total, elapsed_s)
        when = f"; {clock(elapsed_s)} elapsed" + (f", about {clock(left)} left" if left is not None else "")
    lines = [_fit(f"{title}: {done}/{max(total or 0, len(trials))} trials ended, {running} running{when}",
                  WIDTH),
             f"{'loss':<{LOSS_WIDTH}} {'done':>4} {'run':>4} {'stop':>4} {'fail':>4} "
             f"{'best ' + metric[:9]:>14}  setting"]
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
    """Prints `loss_lines` while the trials run, and once at the end. In a terminal the block is redrawn in
    place every `tty_every_s`; in a pipe or a log a block is appended only when something other than the clock
    changed, at most every `every_s`."""

    def __init__(self, title: str, metric: str, searched: dict[str, tuple[str, ...]], every_s: float = 30.0,
                 tty_every_s: float = 2.0) -> None:
        self.title, self.metric, self.searched = title, metric, searched
        self.tty = sys.stdout.isatty()
        self.every_s = tty_every_s if self.tty else every_s
        self.last = 0.0
        self.total: int | None = None
        self.start = time.monotonic()
        self.drawn = 0  # lines of the block on screen (a terminal's redraw moves up over them)
        self.shown: list[str] = []  # the last block appended, without its clock (a pipe's "no repeats")

    def setup(self, start_time: float | None = None, total_samples: int | None = None,
              metric: str | None = None, mode: str | None = None, **kwargs: Any) -> None:
        self.total = total_samples
        self.start = time.monotonic()

    def should_report(self, trials: list[Any], done: bool = False) -> bool:
        return done or time.monotonic() - self.last >= self.every_s

    def report(self, trials: list[Any], done: bool, *sys_info: str) -> None:
        self.last = time.monotonic()
        rows = [self._status(t) for t in trials]
        lines = loss_lines(rows, self.title, self.metric, self.total, self.last - self.start)
        if self.tty:
            up = f"\x1b[{self.drawn}F\x1b[J" if self.drawn else ""  # to the block's first line, clear below
            print(up + "\n".join(lines) + ("\n" if done else ""), file=sys.stdout, flush=True)
            self.drawn = 0 if done else len(lines)
            return
        without_clock = [lines[0].split("; ", 1)[0], *lines[1:]]
        if without_clock != self.shown or done:
            self.shown = without_clock
            print("\n".join(lines) + "\n", file=sys.stdout, flush=True)

    def _status(self, trial: Any) -> TrialStatus:
        config, last = trial.config or {}, trial.last_result or {}
        loss = str(config.get("loss", "?"))
        setting = one_setting(config, self.searched.get(loss, ()))
        return TrialStatus(loss, str(trial.status), float(last.get("epoch", 0.0)),
                           float(config.get("epochs", 0.0)), best_of(config, last, self.metric), setting,
                           bool(last.get("error")))


def best_of(config: dict[str, Any], last: dict[str, Any], metric: str) -> float | None:
    """A trial's best validation value so far: its own, or a population's best member's."""
    values = [m.metrics.get(f"best_val_{metric}") for m in members("", config, last)]
    numbers = [float(v) for v in values if isinstance(v, (int, float))]
    return max(numbers) if numbers else None


def reporter(plan: SearchPlan, role: str) -> ProgressReporter:
    """One line per loss in 100 columns; `--verbose`: Ray's per-trial table. Validation only: test metrics
    during a search invite choosing on test."""
    metric = plan.metric
    if plan.request.verbose >= 2:
        params = {"seed": "seed"} | {config_key(d.name): d.name for s in plan.space.losses.values()
                                     for d in s.params}
        return CLIReporter(metric_columns={"epoch": "epoch", f"val_{metric}": f"val_{metric}",
                                           f"best_val_{metric}": f"best_val_{metric}",
                                           "masked_ratio": "masked"},
                           parameter_columns=params, max_report_frequency=30, sort_by_metric=False)
    searched = {loss: s.searched() for loss, s in plan.space.losses.items()}
    what = "confirmation" if role == schema.ROLE_CONFIRMATION else "search"
    return LossProgress(f"{plan.task.name} {what}", metric, searched)
