"""Populations in Ray Tune: confirmation seeds of one setting grouped into one trial, and the fan-out that
makes each member its own result again (its MLflow child run, its TrialRun, its seed in the race).

A population trial's config is a solo trial's (the first member's seed) plus `POPULATION`, the seeds it
trains. Its reports to Tune carry every member's latest report under `member_<seed>.<key>` (a member that
reported at this evaluation has `member_<seed>.fresh` = 1), and the shared `epoch` (the members see the same
samples), so the last result of the trial holds each member's final report. Everything downstream reads
members through `members()`: a solo trial is a population of one, with its own keys. No Ray here (pure, tested
without it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

from tune_as.settings import TrialSettings

POPULATION = "population_seeds"  # in a Tune config: the seeds its population trains (absent: one seed)
FRESH = "fresh"  # in a member's keys: 1 if it reported at this evaluation


class Member(NamedTuple):
    run_id: str  # the trial id for a solo trial; `<trial id>-seed<seed>` for a population's member
    config: dict[str, Any]  # a solo trial's config, with the member's seed
    metrics: dict[str, Any]  # its report (the last one, in a final result)
    fresh: bool  # it reported in this result


def prefix(seed: int) -> str:
    return f"member_{seed}."


def group(configs: Sequence[TrialSettings], per_trial: int,
          problem: Callable[[TrialSettings], str | None]) -> tuple[list[dict[str, Any]], list[str]]:
    """Tune configs for `configs`: the seeds of one setting in populations of at most `per_trial`, in the
    given order; a setting that cannot be a population (`problem` says why) keeps one trial per seed, with a
    note."""
    by_setting: dict[str, list[TrialSettings]] = {}
    for c in configs:
        key = json.dumps({k: v for k, v in c.to_dict().items() if k != "seed"}, sort_keys=True, default=str)
        by_setting.setdefault(key, []).append(c)
    out: list[dict[str, Any]] = []
    notes: list[str] = []
    for same in by_setting.values():
        why = problem(same[0]) if per_trial > 1 and len(same) > 1 else None
        if why:
            notes.append(f"{same[0].loss}: one trial per seed ({why}).")
        size = 1 if why else per_trial
        for start in range(0, len(same), size):
            chunk = same[start:start + size]
            config = chunk[0].to_dict()
            if len(chunk) > 1:
                config[POPULATION] = [c.seed for c in chunk]
            out.append(config)
    return out, notes


def missing(configs: Sequence[dict[str, Any]], ran: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Tune configs of `configs` that no trial ran (`ran`: the configs of an experiment's trials), in
    order. A resumed round's Ray state can lack a trial its searcher handed out (a kill while Ray copied the
    state: docs/architecture.md), and the searcher never hands it out again."""
    have = {json.dumps(c, sort_keys=True, default=str) for c in ran}
    return [c for c in configs if json.dumps(c, sort_keys=True, default=str) not in have]


def population_problem(data: Any, settings: TrialSettings) -> str | None:
    """Why a setting's seeds cannot train as one population on `data` (tune_as.training.population), judged
    for the CPU (a GPU without bf16 would need fp16's scaler: such a population fails with that reason)."""
    from tune_as.training.population import problem

    return problem(settings, data, None)


def settings_config(config: dict[str, Any]) -> dict[str, Any]:
    """A Tune config without the population's key: what TrialSettings reads."""
    return {k: v for k, v in config.items() if k != POPULATION}


def members(trial_id: str, config: dict[str, Any], result: dict[str, Any]) -> list[Member]:
    """The runs inside one Tune trial's result: itself, or each member of its population."""
    seeds = config.get(POPULATION)
    if not seeds:
        return [Member(trial_id, config, result, True)]
    shared = {k: v for k, v in result.items()
              if not k.startswith("member_") and k not in ("epoch", "members")}
    out = []
    for seed in seeds:
        p = prefix(int(seed))
        own = {k[len(p):]: v for k, v in result.items() if k.startswith(p)}
        fresh = bool(own.pop(FRESH, 0))
        out.append(Member(f"{trial_id}-seed{seed}", {**settings_config(config), "seed": int(seed)},
                          {**shared, **own}, fresh))
    return out


def of_grid(grid: Any) -> Iterator[tuple[int, Member]]:
    """Every run of a Tune result grid with its trial's index: a trial, or each member of a population
    trial."""
    for i in range(len(grid)):
        metrics = grid[i].metrics or {}
        for member in members(str(metrics.get("trial_id", grid[i].path)), grid[i].config or {}, metrics):
            yield i, member


def flat_report(latest: dict[int, dict[str, Any]], fresh: set[int], size: int) -> dict[str, Any]:
    """One Tune result for a population: every member's latest report (seed -> report) under its prefix, which
    of them reported now, the shared epoch (the furthest any member has reached) and the population's size."""
    out: dict[str, Any] = {"members": size, "epoch": max(float(m.get("epoch", 0.0)) for m in latest.values())}
    for seed, report in sorted(latest.items()):
        p = prefix(seed)
        out.update({p + k: v for k, v in report.items()})
        out[p + FRESH] = int(seed in fresh)
    return out


def grid_epochs(grid: Any) -> float:
    """Epochs trained by every run of a Tune result grid (each member of a population counted), with or
    without a result."""
    return sum(float(m.metrics.get("epoch", 0.0)) for _, m in of_grid(grid))
