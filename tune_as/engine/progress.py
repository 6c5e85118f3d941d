"""The search's progress view: one view for the whole run, on stderr (stdout keeps the answer).

A block per phase (the search, each confirmation round): the run's line (a bar over the run's trial-epochs,
the time elapsed and left), the phase's line ("confirmation round 1 of at most 2: 12/39 trials ended, 2
running"), then one line per loss (trials done, running, stopped early, failed; the best validation value so
far and its setting). Every line is cut to the terminal's width. In a terminal the block is redrawn in place
(up over the rows it drew, counted at the width now: a terminal that reflows shows a line wider than its new
width on more rows) and stays as it ended when its phase ends: one block per phase in the scrollback.
Elsewhere (a pipe, a log) the run's and the phase's lines are printed only when the phase's counts changed, at
most every `every_s`, and the block once, as its phase ends; never an escape sequence.

The run's trial-epochs: the search's (each loss's trials times their epochs, corrected as trials end: ASHA
stops some early, some fail) plus every confirmation round that may still run (the race's plan: the seeds each
look adds, times the losses still racing, times their epochs), at most the `--budget`. The time left is the
wall time per trial-epoch trained since the first one was seen (the start-up before it is not work), times the
trial-epochs left: none until one more trial-epoch is done. The clock and the screen are injected, so tests
need no sleeping and no terminal. `--verbose` brings Ray's per-trial table back instead.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TextIO

from ray.tune import CLIReporter, ProgressReporter

from tune_as.engine.members import POPULATION, members
from tune_as.engine.plan import SearchPlan
from tune_as.results.racing import FIRST_LOOK, LOOK_STEP, look_schedule
from tune_as.results.render import fit, one_setting, terminal_width
from tune_as.space.search_space import config_key

LOSS_WIDTH = 22
MIN_WORK = 1.0  # trial-epochs trained in the estimate's window before a time left is shown
Expected = Mapping[str, tuple[int, float]]  # a phase's plan: loss -> (runs, epochs each)


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
    members: int = 1  # runs it trains (a population's seeds: engine.members)

    @property
    def ended(self) -> bool:
        return self.status in ("TERMINATED", "ERROR") or self.error

    @property
    def trained(self) -> float:
        return self.members * min(self.epoch, self.epochs)

    @property
    def planned(self) -> float:
        """Its trial-epochs in the end: what it trained once it ended, else all of its epochs."""
        return self.trained if self.ended else self.members * self.epochs


@dataclass
class Phase:
    """One Tune experiment's part of the run (a resumed search's parts continue its phase)."""

    name: str
    expected: Expected
    trials: dict[str, TrialStatus] = field(default_factory=dict)
    total: int | None = None  # Tune's trials (populations: fewer than runs)

    def planned(self) -> float:
        """Its trial-epochs: its trials' (`TrialStatus.planned`), and those of the runs not created yet."""
        used: Counter[str] = Counter()
        for t in self.trials.values():
            used[t.loss] += t.members
        return (sum(t.planned for t in self.trials.values())
                + sum(max(0, runs - used[loss]) * epochs for loss, (runs, epochs) in self.expected.items()))

    def counts(self) -> tuple[int, int, int, int]:
        """Trials ended, running, failed, and all it will have."""
        trials = self.trials.values()
        of = max(self.total or sum(runs for runs, _ in self.expected.values()), len(self.trials))
        return (sum(t.ended for t in trials), sum(t.status == "RUNNING" for t in trials),
                sum(t.status == "ERROR" or t.error for t in trials), of)

    def line(self) -> str:
        ended, running, _, of = self.counts()
        return f"{self.name}: {ended}/{of} trials ended, {running} running"


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def clock(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}" if minutes >= 60 else f"{minutes}:{secs:02d}"


def run_line(title: str, done: float, total: float, elapsed: float, left: float | None, width: int) -> str:
    """The run's line: the title, the share done and a bar over the trial-epochs as wide as the line leaves it
    (10 to 40 columns, none when there is no room), the time left (when known), the time elapsed and the
    trial-epochs; the parts a narrow line has no room for are left out from the last."""
    share = done / total if total > 0 else 1.0
    head = f"{title} {math.floor(100 * share):>3}%"
    when = ("done" if done >= total else f"about {clock(left)} left" if left is not None
            else "time left after the first trial-epochs")
    parts = [when, f"{clock(elapsed)} elapsed", f"{done:.0f}/{total:.0f} trial-epochs"]
    while parts and len(" ".join([head, " · ".join(parts)])) > width:
        parts.pop()
    text = " · ".join(parts)
    room = min(40, width - len(head) - len(text) - 4)
    drawn = f"[{'#' * round(room * share)}{'.' * (room - round(room * share))}]" if room >= 10 else ""
    return _fit(" ".join(x for x in (head, drawn, text) if x), width)


def loss_lines(trials: Sequence[TrialStatus], metric: str, width: int) -> list[str]:
    """A column line, then per loss: trials done / running / stopped early / failed, the best validation
    metric so far and the setting that reached it. Every line at most `width` characters."""
    lines = [f"{'loss':<{LOSS_WIDTH}} {'done':>4} {'run':>4} {'stop':>4} {'fail':>4} "
             f"{'best ' + metric[:9]:>14}  setting"]
    for loss in dict.fromkeys(t.loss for t in trials):
        mine = [t for t in trials if t.loss == loss]
        failed = sum(t.status == "ERROR" or t.error for t in mine)
        ended = [t for t in mine if t.status == "TERMINATED" and not t.error]
        stopped = sum(t.epoch < t.epochs - 1e-6 for t in ended)
        scored = [t for t in mine if t.best_val is not None]
        best = max(scored, key=lambda t: t.best_val or 0.0) if scored else None
        value = f"{100 * best.best_val:.2f}" if best is not None and best.best_val is not None else "-"
        lines.append(f"{_fit(loss, LOSS_WIDTH):<{LOSS_WIDTH}} {len(ended) - stopped:>4} "
                     f"{sum(t.status == 'RUNNING' for t in mine):>4} {stopped:>4} {failed:>4} {value:>14}  "
                     + (best.setting if best else ""))
    return [_fit(line.rstrip(), width) for line in lines]


def screen(stream: TextIO) -> tuple[int, int]:
    """The columns and rows `stream` is shown in: $COLUMNS/$LINES first, else its terminal's, else
    render.terminal_width() by 24."""
    try:
        cols, rows = os.get_terminal_size(stream.fileno())
    except (AttributeError, OSError, ValueError):  # not a terminal (a pipe, a test's stream)
        cols, rows = 0, 0
    cols, rows = cols or terminal_width(), rows or 24  # a terminal of unknown size says 0
    env = {k: os.environ.get(k, "") for k in ("COLUMNS", "LINES")}
    return (max(20, int(env["COLUMNS"]) if env["COLUMNS"].isdigit() else cols),
            max(5, int(env["LINES"]) if env["LINES"].isdigit() else rows))


class RunView:
    """The run's view (the module's docstring). The engine says what the run will do (`expect`, `begin`,
    `rounds_left`); Tune's reporter (`LossProgress`) hands it each phase's trials (`update`)."""

    _views: ClassVar[dict[str, RunView]] = {}

    def __init__(self, title: str, metric: str, searched: Mapping[str, tuple[str, ...]] | None = None,
                 stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic,
                 size: Callable[[], tuple[int, int]] | None = None, every_s: float = 30.0,
                 sample_s: float = 1.0) -> None:
        self.title, self.metric, self.searched = title, metric, dict(searched or {})
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.clock, self.every_s, self.sample_s = clock, every_s, sample_s
        self.size = size or (lambda: screen(self.stream))
        self.start, self.sampled = clock(), -math.inf  # the last update's time (none yet)
        self.phases: list[Phase] = []
        self.current: Phase | None = None
        self.later: list[float] = []  # trial-epochs of each confirmation round that may follow, at most
        self.cap: float | None = None  # --budget
        self.before: dict[tuple[str, str], float] = {}  # a trial's epochs when first seen (a resume's)
        self.restoring = False  # the next update's unseen trials come from Ray's saved state
        self.window: tuple[float, float] | None = None  # (time, fresh trial-epochs) of the estimate's start
        self.drawn: list[str] = []  # the live block's lines (a terminal)
        self.printed: tuple[Any, ...] = ()  # what the last line said (elsewhere)
        self.printed_at = -math.inf

    def register(self, key: str) -> RunView:
        """The view a `LossProgress` of search `key` reports to (Ray unpickles reporters in a new driver)."""
        self._views[key] = self
        return self

    @classmethod
    def registered(cls, key: str | None) -> RunView:
        """The view registered for `key`; else the last one registered (a reporter pickled before views had
        keys)."""
        if key in cls._views:
            return cls._views[key]
        return list(cls._views.values())[-1] if cls._views else RunView("tune", "metric").register("")

    def expect(self, search: Expected, rounds: Sequence[float] = (), cap: float | None = None) -> None:
        """What the run will do, before it starts: the search's trials, each confirmation round's trial-epochs
        at most, and the budget."""
        self.phases.append(Phase("search", dict(search)))
        self.later, self.cap = list(rounds), cap

    def begin(self, name: str, expected: Expected | None = None) -> None:
        """A phase starts, or continues (a resume; a part running the trials Ray's state lost); `expected`:
        its runs (None: as `expect` said)."""
        self.drawn = []  # a block still live stays as drawn
        phase = next((p for p in self.phases if p.name == name), None)
        if phase is None:
            phase = Phase(name, {})
            self.phases.append(phase)
        phase.expected, phase.total = dict(phase.expected if expected is None else expected), None
        self.current, self.restoring = phase, True

    def rounds_left(self, bounds: Sequence[float]) -> None:
        """The trial-epochs of each confirmation round that may still follow, at most ([]: the race is
        over)."""
        self.later = list(bounds)

    def note(self, text: str) -> None:
        """A line of the run's own, between blocks."""
        self.drawn = []
        self.stream.write(fit(text, self.size()[0]) + "\n")
        self.stream.flush()

    def done(self) -> float:
        return sum(t.trained for p in self.phases for t in p.trials.values())

    def total(self) -> float:
        planned = sum(p.planned() for p in self.phases) + sum(self.later)
        return max(self.done(), planned if self.cap is None else min(planned, self.cap))

    def fresh(self) -> float:
        """Trial-epochs trained while this view watched."""
        return sum(t.trained - self.before.get((p.name, key), 0.0) for p in self.phases
                   for key, t in p.trials.items())

    def left(self) -> float | None:
        """Seconds left at the last update: the wall time per trial-epoch since the first was seen, times
        those left."""
        if self.window is None:
            return None
        since, before = self.window
        work = self.fresh() - before
        if work < MIN_WORK or self.sampled <= since:
            return None
        return (self.sampled - since) / work * max(0.0, self.total() - self.done())

    def should_update(self, done: bool) -> bool:
        return done or self.clock() - self.sampled >= self.sample_s

    def update(self, trials: Mapping[str, TrialStatus], done: bool = False, total: int | None = None) -> None:
        """The current phase's trials now (by trial id); `done`: the phase ended. Shown at once."""
        self.sampled = self.clock()
        if self.current is None:
            self.begin("trials", {})
        phase = self.current
        assert phase is not None
        phase.total = total or phase.total
        for key, t in trials.items():  # a trial new to this driver trains from 0, a restored one from its own
            self.before.setdefault((phase.name, key), t.trained if self.restoring else 0.0)
        phase.trials.update(trials)
        self.restoring = False
        if self.window is None and self.fresh() > 0:
            self.window = (self.sampled, self.fresh())
        self._show(done)

    def block(self, width: int) -> list[str]:
        phase = self.current
        assert phase is not None
        return [self.run_line(width), _fit(phase.line(), width),
                *loss_lines(list(phase.trials.values()), self.metric, width)]

    def run_line(self, width: int) -> str:
        return run_line(self.title, self.done(), self.total(), self.sampled - self.start, self.left(), width)

    def _show(self, done: bool) -> None:
        width, height = self.size()
        lines = self.block(width)
        if self.tty:
            # the cursor cannot move above the screen: a live block fits half of it (a terminal made half as
            # wide shows each line on two rows)
            if not done and len(lines) > (height - 1) // 2:
                keep = max(2, (height - 1) // 2 - 1)
                lines = [*lines[:keep], _fit(f"… {len(lines) - keep} more lines as the phase ends", width)]
            rows = sum(max(1, math.ceil(len(line) / width)) for line in self.drawn)  # as shown at `width`
            self.stream.write((f"\x1b[{rows}F\x1b[J" if rows else "") + "".join(f"{x}\n" for x in lines))
            self.drawn = [] if done else lines
        else:
            said = (lines[1], *self.current.counts()) if self.current else ()  # the clock is no change
            if done:
                self.stream.write("".join(f"{x}\n" for x in lines) + "\n")
            elif said != self.printed and self.sampled - self.printed_at >= self.every_s:
                self.stream.write(f"{lines[0]}\n{lines[1]}\n")  # the run's line and the phase's
            else:
                return
            self.printed, self.printed_at = said, self.sampled
        self.stream.flush()


class LossProgress(ProgressReporter):
    """Ray Tune's side of the view: Tune's trials as `TrialStatus`es. Ray pickles a run's reporter with the
    experiment and `Tuner.restore` brings that copy back in a new driver, so it holds only its search's id and
    finds the view that driver registered (`RunView.register`)."""

    def __init__(self, search_id: str) -> None:
        self.search_id = search_id

    @property
    def view(self) -> RunView:
        return RunView.registered(self.__dict__.get("search_id"))

    def setup(self, start_time: float | None = None, total_samples: int | None = None,
              metric: str | None = None, mode: str | None = None, **kwargs: Any) -> None:
        self.total = total_samples

    def should_report(self, trials: list[Any], done: bool = False) -> bool:
        return self.view.should_update(done)

    def report(self, trials: list[Any], done: bool, *sys_info: str) -> None:
        view = self.view
        view.update({str(t.trial_id): status(t, view.metric, view.searched) for t in trials}, done,
                    self.__dict__.get("total"))


def status(trial: Any, metric: str, searched: Mapping[str, tuple[str, ...]]) -> TrialStatus:
    """A Tune trial as the view sees it."""
    config, last = trial.config or {}, trial.last_result or {}
    loss = str(config.get("loss", "?"))
    setting = one_setting(config, searched.get(loss, ()))
    return TrialStatus(loss, str(trial.status), float(last.get("epoch", 0.0)),
                       float(config.get("epochs", 0.0)), best_of(config, last, metric), setting,
                       bool(last.get("error")), len(config.get(POPULATION) or ()) or 1)


def best_of(config: dict[str, Any], last: dict[str, Any], metric: str) -> float | None:
    """A trial's best validation value so far: its own, or a population's best member's."""
    values = [m.metrics.get(f"best_val_{metric}") for m in members("", config, last)]
    numbers = [float(v) for v in values if isinstance(v, (int, float))]
    return max(numbers) if numbers else None


def round_bounds(looks: Sequence[int], losses: int, per_run: float, after: int = 0) -> list[float]:
    """The trial-epochs of each round after the first `after`, at most: the seeds its look adds for each of
    `losses` losses, `per_run` epochs each."""
    steps = [n - before for before, n in zip((0, *looks), looks, strict=False)]
    return [step * losses * per_run for step in steps[after:]]


def view_for(plan: SearchPlan) -> RunView:
    """A search's view (or a confirmation batch's), registered for its reporters."""
    searched = {loss: s.searched() for loss, s in plan.space.losses.items()}
    return RunView(plan.task.name, plan.metric, searched).register(plan.search_id)


def planned(plan: SearchPlan) -> tuple[Expected, list[float], float | None]:
    """What a search will run (`RunView.expect`): its trials, each confirmation round's trial-epochs at most
    (the race's rounds as the request allows them: the race's own plan corrects them once it is made), its
    budget."""
    r = plan.request
    rounds: list[float] = []
    if plan.confirming:
        looks = (r.confirm,) if r.confirm else look_schedule(FIRST_LOOK, LOOK_STEP, r.max_seeds)
        losses = len(plan.losses) if r.confirm_top is None else min(len(plan.losses), r.confirm_top + 1)
        rounds = round_bounds(looks, losses, max(plan.max_epochs(loss) for loss in plan.losses))
    return {loss: (plan.quota(loss), plan.max_epochs(loss)) for loss in plan.losses}, rounds, r.budget


def reporter(plan: SearchPlan) -> ProgressReporter:
    """The run's view; `--verbose`: Ray's per-trial table. Validation only: test metrics during a search
    invite choosing on test."""
    if plan.request.verbose < 2:
        return LossProgress(plan.search_id)
    params = {"seed": "seed"} | {config_key(d.name): d.name for s in plan.space.losses.values()
                                 for d in s.params}
    return CLIReporter(metric_columns={"epoch": "epoch", f"val_{plan.metric}": f"val_{plan.metric}",
                                       f"best_val_{plan.metric}": f"best_val_{plan.metric}",
                                       "masked_ratio": "masked"},
                       parameter_columns=params, max_report_frequency=30, sort_by_metric=False)
