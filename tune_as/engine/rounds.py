"""A search's confirmation, every round of its race, as ONE Ray Tune experiment (`confirm` in the search's folder).

`replay` is the race's rule over its runs, pure: from the outcome of each (loss, seed) run so far it gives the
rounds taken, the runs of the round to run now (none once every verdict is decided, --max-seeds is reached, the
budget is spent or a run of the last round failed) and why racing stopped early, if it did. `RaceSearcher` (a Ray
Tune `Searcher`) asks it each time a round has ended and hands out the next round's runs; after the fit the
answer asks it again over the result grid (`outcomes_of`), so the rounds the answer names are the ones that ran:
one rule over the same results. `--confirm N` is the race with one look (`racing.Plan.fixed`).

One experiment for every round: with `reuse_actors` its workers train every round, where a Tuner per round started
fresh workers each time (about 6 CPU s of imports per worker on a 2-core machine: docs/benchmarks.md).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ray.tune.search import Searcher

from tune_as.engine import members
from tune_as.engine.state import SEARCHER_WHAT, race_searcher_state, read_json, write_json
from tune_as.results import racing
from tune_as.results.render import fit
from tune_as.settings import TrialSettings

Pair = tuple[str, int]  # (loss, seed): one confirmation run
FAILED_NOTE = "Racing stopped early: a confirmation run failed (see the runs marked FAILED in MLflow)."


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one confirmation run gave the race: its best validation value and test value (None: no result, it
    failed or diverged) and the epochs it trained (counted against --budget either way)."""

    val: float | None
    test: float | None
    epochs: float


def outcome(metrics: Mapping[str, Any], metric: str) -> Outcome:
    """A run's last report as the race reads it (the rule of `ranking.trial_run`: no result on an error or a
    missing or NaN best value)."""
    best, test = metrics.get(f"best_val_{metric}"), metrics.get(f"test_{metric}")
    if metrics.get("error") or best is None or (isinstance(best, float) and math.isnan(best)):
        return Outcome(None, None, float(metrics.get("epoch", 0.0)))
    return Outcome(float(best), None if test is None else float(test), float(metrics.get("epoch", 0.0)))


@dataclasses.dataclass(frozen=True)
class Budget:
    """--budget in trial-epochs (None: none), what the search spent of it, and the epochs of one run."""

    total: float | None
    search_epochs: float
    per_run: float

    def runs_left(self, spent: float) -> int | None:
        if self.total is None:
            return None
        return max(0, int((self.total - self.search_epochs - spent) // self.per_run))


@dataclasses.dataclass(frozen=True)
class Replay:
    rounds: tuple[tuple[Pair, ...], ...]  # the rounds every run of which has an outcome, in order
    next: tuple[Pair, ...]  # the round to run now: () once the race has ended
    note: str | None  # why racing stopped early, if a failed run stopped it
    spent: float  # epochs of the runs of `rounds`


def replay(race: racing.Plan, outcomes: Mapping[Pair, Outcome], budget: Budget) -> Replay:
    """The race over `outcomes`, round by round, as far as they go (pure: the searcher and the answer both ask)."""
    rounds: list[tuple[Pair, ...]] = []
    results: dict[str, dict[int, tuple[float, float | None]]] = {}
    attempted: set[Pair] = set()
    spent = 0.0
    for _ in race.looks:
        answer = racing.decide(results, race, budget.runs_left(spent))
        if answer.done:
            break
        wanted = tuple((loss, int(s)) for loss, seeds in answer.next_seeds.items() for s in seeds)
        if attempted & set(wanted):  # a run of the last round failed: racing on would ask for it forever
            return Replay(tuple(rounds), (), FAILED_NOTE, spent)
        if any(pair not in outcomes for pair in wanted):
            return Replay(tuple(rounds), wanted, None, spent)
        attempted |= set(wanted)
        rounds.append(wanted)
        for loss, seed in wanted:
            done = outcomes[(loss, seed)]
            spent += done.epochs
            if done.val is not None:
                results.setdefault(loss, {})[seed] = (done.val, done.test)
    return Replay(tuple(rounds), (), None, spent)


def outcomes_of(grid: Any, metric: str) -> dict[Pair, Outcome]:
    """Every run of a confirmation experiment's result grid (each member of a population), by (loss, seed)."""
    return {(str(m.config["loss"]), int(m.config["seed"])): outcome(m.metrics, metric)
            for _, m in members.of_grid(grid)}


class RaceSearcher(Searcher):
    """Hands out a race's rounds: round k's runs (the seeds of one setting in populations of up to
    `per_trial`), nothing while they train, then the next round `replay` asks for, FINISHED once it asks for none.
    Its state (the round's queue, the trials out, every outcome) is saved as JSON with Ray's experiment snapshot."""

    def __init__(self, race: racing.Plan, settings: Mapping[str, TrialSettings], metric: str, budget: Budget,
                 per_trial: int, single: Mapping[str, str | None]) -> None:
        super().__init__(metric=f"best_val_{metric}", mode="max")
        self.race, self.settings, self.task_metric, self.budget = race, dict(settings), metric, budget
        self.per_trial, self.single = per_trial, dict(single)  # single: per loss, why its seeds train alone
        self.queue: list[dict[str, Any]] = []
        self.live: dict[str, dict[str, Any]] = {}  # trial id -> its config
        self.seen: dict[str, dict[int, Outcome]] = {}  # trial id -> seed -> outcome of its last report
        self.outcomes: dict[Pair, Outcome] = {}
        self.handed = 0  # trials handed out (the progress view's total, with the queue)

    def expected(self) -> int:
        """The trials of the rounds so far (the race does not know its later rounds before they come)."""
        return self.handed + len(self.queue)

    def _problem(self, settings: TrialSettings) -> str | None:
        return self.single.get(settings.loss)

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:  # type: ignore[override]  # FINISHED is a str
        if not self.queue:
            if self.live:
                return None  # the round is training: the next one depends on it
            step = replay(self.race, self.outcomes, self.budget)
            wanted = [pair for pair in step.next if pair not in self.outcomes]
            if not wanted:
                return Searcher.FINISHED
            configs = [dataclasses.replace(self.settings[loss], seed=seed) for loss, seed in wanted]
            self.queue, notes = members.group(configs, self.per_trial, self._problem)
            for note in notes:
                print(fit(note))
            seeds = sorted({seed for _, seed in wanted})
            print(f"\nConfirmation round {len(step.rounds) + 1}: {len(wanted)} runs of "
                  f"{len({loss for loss, _ in wanted})} losses, no early stopping (seeds {', '.join(map(str, seeds))})",
                  flush=True)
        config = self.queue.pop(0)
        self.live[trial_id] = config
        self.handed += 1
        return dict(config)

    def _outcomes(self, trial_id: str, result: dict[str, Any]) -> dict[int, Outcome]:
        return {int(m.config["seed"]): outcome(m.metrics, self.task_metric)
                for m in members.members(trial_id, self.live[trial_id], result)}

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        if trial_id in self.live:
            self.seen.setdefault(trial_id, {}).update(self._outcomes(trial_id, result))

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        if trial_id not in self.live:
            return
        # a trial that raised ends without a result: its last report stands, as in the result grid
        last = self._outcomes(trial_id, result) if result else self.seen.get(trial_id, {})
        config = self.live.pop(trial_id)
        self.seen.pop(trial_id, None)
        for seed in config.get(members.POPULATION) or [config["seed"]]:
            self.outcomes[(str(config["loss"]), int(seed))] = last.get(int(seed), Outcome(None, None, 0.0))

    def save(self, checkpoint_path: str) -> None:
        # Ray calls save/restore with a path in the experiment's folder: the file is JSON, never a pickle
        write_json(Path(checkpoint_path), {
            "race": True, "queue": self.queue, "live": self.live, "handed": self.handed,
            "seen": {t: [[s, *dataclasses.astuple(o)] for s, o in by.items()] for t, by in self.seen.items()},
            "outcomes": [[loss, seed, *dataclasses.astuple(o)] for (loss, seed), o in self.outcomes.items()]})

    def restore(self, checkpoint_path: str) -> None:
        saved = race_searcher_state(read_json(Path(checkpoint_path), SEARCHER_WHAT), Path(checkpoint_path))
        self.queue, self.live, self.handed = saved["queue"], saved["live"], saved["handed"]
        self.seen = {t: {s: Outcome(*o) for s, *o in rows} for t, rows in saved["seen"].items()}
        self.outcomes = {(loss, seed): Outcome(*o) for loss, seed, *o in saved["outcomes"]}
