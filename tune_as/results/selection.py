"""Pure selection logic for the report: trial runs in, one selected setting per task x loss out.

No MLflow here: `tune_as.report` turns MLflow runs into `TrialRun`s, everything below is plain Python so
the rules (only trials that completed their epochs are results, best mean validation metric, ties by fewer
optimizer steps, test metrics never consulted) are easy to read and test. The search's own ranking
(tune_as.results.ranking) uses the same rules.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tune_as.settings import TrialSettings

# Params that identify a run, not a setting: runs differing only in these are repeats of one setting.
NOT_HYPERPARAMS = frozenset({"seed", "git_commit"})

# Row order of the paper's Tables 2-6; losses the paper does not have follow in alphabetical order.
PAPER_ROWS = (
    "softmax", "t_softmax", "sparse_softmax", "sparsemax", "entmax15", "label_smoothing",
    "am_softmax", "as_softmax", "as_speed",
)
# Column order of the paper's tables (then GLUE, Table 8); other tasks follow alphabetically.
PAPER_TASKS = (
    "sst5", "clinc_oos", "conll2003", "sighan2015", "eurlex", "wos46985",
    "mnli", "mrpc", "qnli", "qqp", "rte", "sst2", "cola",
)
MULTILABEL_PREFIX = "multilabel_"


@dataclass(frozen=True)
class TrialRun:
    """One finished child run, as read from MLflow (schema: docs/architecture.md)."""

    run_id: str
    task: str
    loss: str
    params: dict[str, str]
    metric: str  # the selection metric without prefix, e.g. "accuracy" (tag tune_as.metric minus "val_")
    best_val: float  # best value of val_<metric> over the run's evaluation points
    last: dict[str, float]  # last logged value of every metric
    start_time: int = 0
    experiment_id: str = ""
    parent_id: str = ""  # the search's parent run
    stopped_early: bool = False  # ASHA stopped it before its last epoch
    # typed, where the run comes from the engine (None: read from MLflow)
    settings: TrialSettings | None = None

    @property
    def seed(self) -> str:
        return self.params.get("seed", "")

    @property
    def setting(self) -> tuple[tuple[str, str], ...]:
        """The hyper-parameters, as a hashable key that ignores seed and commit ("1e-5" == "1e-05")."""
        return tuple(sorted((k, canonical(v)) for k, v in self.params.items() if k not in NOT_HYPERPARAMS))

    def test_metrics(self) -> dict[str, float]:
        return {k.removeprefix("test_"): v for k, v in self.last.items() if k.startswith("test_")}


@dataclass(frozen=True)
class Cell:
    """The selected setting of one task x loss, and the runs behind it."""

    task: str
    row: str  # table row: the loss, with "multilabel_" folded into the paper's row (see `row_of`)
    loss: str
    runs: tuple[TrialRun, ...]  # the repeats (seeds) of the selected setting
    n_trials: int  # finished trials of this task x loss
    shown: tuple[str, ...]  # params worth showing in Table 6: loss.* plus what varied across trials
    n_stopped: int = 0  # of the n_trials, those early stopping cut before their last epoch
    # runs of the selected setting with new seeds (tag role=confirmation), one per seed; see
    # `with_confirmations`
    confirmations: tuple[TrialRun, ...] = ()
    val: float = field(init=False)
    steps: float = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "val", statistics.fmean(r.best_val for r in self.runs))
        object.__setattr__(self, "steps", mean_last(self.runs, "optimizer_steps"))

    @property
    def params(self) -> dict[str, str]:
        return self.runs[0].params

    @property
    def stopped_early(self) -> bool:
        """Every trial of this task x loss was stopped early: no result, only the best of the stopped runs."""
        return all(r.stopped_early for r in self.runs)

    @property
    def results(self) -> tuple[TrialRun, ...]:
        """The runs a reported number comes from: the confirmations if any, else the selected repeats."""
        return self.confirmations or self.runs

    def mean(self, key: str) -> float:
        return mean_last(self.runs, key)


def canonical(value: str) -> str:
    try:
        return repr(float(value))
    except ValueError:
        return value


def mean_last(runs: Iterable[TrialRun], key: str) -> float:
    """Mean over runs of a metric's last value; NaN when no run logged it."""
    values = [r.last[key] for r in runs if key in r.last]
    return statistics.fmean(values) if values else math.nan


def row_of(loss: str, losses_in_task: set[str]) -> str:
    """`multilabel_as_softmax` is the AS-Softmax row on a multi-label task, as in the paper's Table 2,
    unless the task also has the plain loss (then both keep their own rows)."""
    plain = loss.removeprefix(MULTILABEL_PREFIX)
    if loss != plain and plain in PAPER_ROWS and plain not in losses_in_task:
        return plain
    return loss


def order(names: Iterable[str], canonical: Sequence[str]) -> list[str]:
    names = set(names)
    return [n for n in canonical if n in names] + sorted(names - set(canonical))


def select(runs: Sequence[TrialRun]) -> dict[tuple[str, str], Cell]:
    """Per (task, row): the setting with the best mean validation metric over its repeats that completed
    their epochs; ties go to fewer optimizer steps, then to the earlier run. Test metrics are never read here.

    Stopped runs never compete with completed ones. A cell whose trials were all stopped early still gets
    the best of them, marked `stopped_early`: the tables say so instead of a number, the figures draw it
    apart.
    """
    by_cell: dict[tuple[str, str], list[TrialRun]] = defaultdict(list)
    for task in {r.task for r in runs}:
        losses = {r.loss for r in runs if r.task == task}
        for r in runs:
            if r.task == task:
                by_cell[(task, row_of(r.loss, losses))].append(r)
    cells: dict[tuple[str, str], Cell] = {}
    for (task, row), trials in by_cell.items():
        # Stopped runs trained fewer epochs: averaged in, they would pull a setting's mean down for reasons of
        # budget, not merit; compared with completed runs, a 1-epoch number would stand next to a 10-epoch
        # one.
        completed = [r for r in trials if not r.stopped_early]
        n_stopped = len(trials) - len(completed)
        groups: dict[tuple[tuple[str, str], ...], list[TrialRun]] = defaultdict(list)
        for r in sorted(completed or trials, key=lambda r: (r.start_time, r.run_id)):
            groups[r.setting].append(r)
        candidates = [Cell(task, row, g[0].loss, tuple(g), len(trials), shown_params(trials), n_stopped)
                      for g in groups.values()]
        # min() keeps the first of equals, and candidates are in start order: the earlier setting wins.
        cells[(task, row)] = min(candidates, key=lambda c: (-c.val, nan_last(c.steps)))
    return cells


def with_confirmations(cells: dict[tuple[str, str], Cell], confirmations: Iterable[TrialRun]
                       ) -> dict[tuple[str, str], Cell]:
    """Each cell with the confirmation runs of its selected setting (same task, loss and hyper-parameters,
    seeds no trial used), whoever ran them: the search's `--confirm` or the report's. One run per seed, the
    latest. A cell whose trials were all stopped early has no result to confirm and gets none."""
    ordered = sorted(confirmations, key=lambda r: (r.start_time, r.run_id))  # a later run of a seed wins
    out = {}
    for key, cell in cells.items():
        by_seed = {r.seed: r for r in ordered if not r.stopped_early and same_setting(r, cell.runs[0])}
        found = () if cell.stopped_early else tuple(by_seed[s] for s in sorted(by_seed, key=seed_order))
        out[key] = dataclasses.replace(cell, confirmations=found)
    return out


def unmatched_confirmations(cells: dict[tuple[str, str], Cell],
                            confirmations: Iterable[TrialRun]) -> list[str]:
    """One line per task x loss whose confirmation runs confirm no selected setting (its selected trial run
    was deleted, or a later search selected another setting): they are left out of the tables, and said so."""
    left: dict[tuple[str, str], int] = {}
    for r in confirmations:
        if not r.stopped_early and not any(same_setting(r, cell.runs[0]) for cell in cells.values()):
            left[r.task, r.loss] = left.get((r.task, r.loss), 0) + 1
    return [f"{n} confirmation run(s) of {task} x {loss} confirm no selected setting (its trial run may have "
            "been deleted, or another setting is selected now): left out"
            for (task, loss), n in sorted(left.items())]


def seed_order(seed: str) -> tuple[int, str]:
    return (int(seed), "") if seed.lstrip("-").isdigit() else (0, seed)


def same_setting(run: TrialRun, ref: TrialRun) -> bool:
    """`run` has `ref`'s hyper-parameters. Params `run` has beyond `ref`'s are ignored: a run rebuilt from
    `ref`'s params may log defaults that the search did not set explicitly."""
    theirs = dict(run.setting)
    return run.task == ref.task and run.loss == ref.loss and all(theirs.get(k) == v for k, v in ref.setting)


def nan_last(x: float) -> float:
    return math.inf if math.isnan(x) else x


def shown_params(trials: Sequence[TrialRun]) -> tuple[str, ...]:
    keys = {k for r in trials for k in r.params if k not in NOT_HYPERPARAMS}
    varied = {k for k in keys if len({r.params.get(k) for r in trials}) > 1}
    return tuple(sorted(k for k in keys if k.startswith("loss.") or k in varied))


@dataclass(frozen=True)
class Confirmation:
    """Confirmation runs of one task x row: the selected setting re-run with new seeds."""

    task: str
    row: str
    metric: str  # test_<m> compared
    by_seed: dict[str, float]

    @classmethod
    def of(cls, cell: Cell) -> Confirmation | None:
        """The test metric of the cell's confirmation runs by seed; None when it has none."""
        metric = f"test_{cell.runs[0].metric}"
        by_seed = {r.seed: r.last[metric] for r in cell.confirmations if metric in r.last}
        return cls(cell.task, cell.row, metric, by_seed) if by_seed else None

    @property
    def mean(self) -> float:
        return statistics.fmean(self.by_seed.values())

    @property
    def std(self) -> float:
        return statistics.stdev(self.by_seed.values()) if len(self.by_seed) > 1 else math.nan


def new_seeds(used: Iterable[str], n: int) -> list[int]:
    """N seeds that no trial of the search used: the N integers after the largest seed seen."""
    ints = [int(s) for s in used if s.lstrip("-").isdigit()]
    start = max(ints, default=-1) + 1
    return list(range(start, start + n))
