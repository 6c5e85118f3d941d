"""A race's rounds in one Tune experiment (tune_as.engine.rounds), without Ray: the searcher driven as Tune drives it
(suggest until it waits, reports, completions), against the race's pure replay over the same outcomes."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from tune_as.engine import members
from tune_as.engine.rounds import Budget, Outcome, RaceSearcher, replay
from tune_as.results import racing
from tune_as.settings import TrialSettings

TRIAL = TrialSettings(loss="softmax", epochs=2.0, batch_size=32, lr=1e-3)
LOSSES = ("softmax", "a", "b")
SEEDS = (11, 12, 13, 14, 15, 16, 17)


def race(max_seeds: int = 7) -> racing.Plan:
    return racing.Plan(LOSSES, "softmax", SEEDS, max_seeds=max_seeds, margin_points=0.5)


def searcher(plan: racing.Plan, per_trial: int = 1, budget: Budget | None = None) -> RaceSearcher:
    settings = {loss: dataclasses.replace(TRIAL, loss=loss) for loss in LOSSES}
    return RaceSearcher(plan, settings, "accuracy", budget or Budget(None, 6.0, 2.0), per_trial, {})


def value(loss: str, seed: int) -> float:
    """`a` clearly better than softmax, `b` within noise of it: `a` is decided early, `b` races on."""
    return {"softmax": 0.80, "a": 0.86, "b": 0.801}[loss] + ((seed * (2 + LOSSES.index(loss))) % 5) * 0.002


def report(config: dict[str, Any], fail: set[tuple[str, int]] = frozenset()) -> dict[str, Any]:  # type: ignore[assignment]
    """A trial's last result as Tune hands it to a searcher: solo, or a population's flat report."""
    seeds = config.get(members.POPULATION) or [config["seed"]]
    own = {s: ({"epoch": 2.0, "error": "non-finite training loss"} if (config["loss"], s) in fail else
               {"epoch": 2.0, "best_val_accuracy": value(config["loss"], s), "test_accuracy": value(config["loss"], s)})
           for s in seeds}
    if members.POPULATION not in config:
        return own[config["seed"]]
    return members.flat_report(own, set(seeds), len(seeds))


def drive(s: RaceSearcher, concurrent: int = 2, fail: set[tuple[str, int]] = frozenset(),  # type: ignore[assignment]
          stop_after: int | None = None) -> list[dict[str, Any]]:
    """Tune's loop: fill free slots with suggestions, end the oldest running trial, until FINISHED; returns the
    configs handed out, in order (stops early after `stop_after` completions, the searcher left mid-race)."""
    handed, running, n, completed = [], [], 0, 0
    while True:
        while len(running) < concurrent:
            n += 1
            config = s.suggest(f"t{n}")
            if config == RaceSearcher.FINISHED:
                assert not running, "FINISHED while trials of the round still train"
                return handed
            if config is None:
                assert running, "the searcher waits with nothing training: the race would hang"
                break
            handed.append(config)
            running.append((f"t{n}", config))
        trial_id, config = running.pop(0)
        s.on_trial_result(trial_id, report(config, fail))
        s.on_trial_complete(trial_id, report(config, fail))
        completed += 1
        if stop_after is not None and completed == stop_after:
            return handed


def pairs(configs: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(c["loss"], s) for c in configs for s in (c.get(members.POPULATION) or [c["seed"]])]


def test_the_searcher_runs_the_rounds_the_replay_names_each_pair_once() -> None:
    plan = race()
    s = searcher(plan)
    handed = drive(s)
    played = replay(plan, s.outcomes, s.budget)
    assert played.next == () and played.note is None and len(played.rounds) >= 2
    assert pairs(handed) == [p for r in played.rounds for p in r], "handed out exactly the replayed rounds, in order"
    assert len(set(pairs(handed))) == len(handed)
    # the replay's answer is the race's own: round 1 asks 3 seeds each, and the rounds end where decide ends
    assert played.rounds[0] == tuple((loss, seed) for loss in LOSSES for seed in SEEDS[:3])
    results = {loss: {seed: (value(loss, seed), value(loss, seed)) for l2, seed in pairs(handed) if l2 == loss}
               for loss in LOSSES}
    assert racing.decide(results, plan).done
    assert {seed for _, seed in played.rounds[1]} == set(SEEDS[3:5]), "round 2: the next two seeds"


def test_a_restored_searcher_goes_on_where_the_saved_one_stopped(tmp_path: Path) -> None:
    plan = race()
    whole = drive(searcher(plan), concurrent=1)
    first = searcher(plan)
    before = drive(first, concurrent=1, stop_after=10)  # mid round 2 (round 1: 9 runs)
    first.save(str(tmp_path / "searcher-state-1.pkl"))
    again = searcher(plan)
    again.restore(str(tmp_path / "searcher-state-1.pkl"))
    assert again.live == {} and again.queue == first.queue and again.outcomes == first.outcomes
    assert before + drive(again, concurrent=1) == whole


def test_populations_group_a_rounds_seeds_and_fan_out_again() -> None:
    plan = race()
    s = searcher(plan, per_trial=3)
    handed = drive(s)
    assert all(len(c.get(members.POPULATION) or [c["seed"]]) <= 3 for c in handed)
    assert handed[0][members.POPULATION] == list(SEEDS[:3])
    assert pairs(handed) == pairs(drive(searcher(plan)))  # the same runs as one seed per trial


def test_a_failed_run_stops_the_race_with_a_note() -> None:
    plan = race()
    s = searcher(plan)
    handed = drive(s, fail={("b", 12)})
    played = replay(plan, s.outcomes, s.budget)
    assert s.outcomes[("b", 12)] == Outcome(None, None, 2.0)
    assert played.note is not None and "a confirmation run failed" in played.note
    assert len(played.rounds) == 1 and len(handed) == 9, "the failed pair is not asked again"


def test_the_budget_bounds_the_rounds() -> None:
    plan = race()
    unbounded = drive(searcher(plan))
    s = searcher(plan, budget=Budget(6.0 + 9 * 2.0 + 1.0, 6.0, 2.0))  # round 1, and not one run more
    handed = drive(s)
    assert len(handed) == 9 < len(unbounded)
    assert replay(plan, s.outcomes, s.budget).spent == pytest.approx(18.0)
