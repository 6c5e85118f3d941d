"""Confirmation: each loss's selected setting run again with new seeds, in the rounds the race asks for.

`confirm` plays the race (tune_as.results.racing): it asks which seeds to run, runs them as one round
(`run_round`, a Tune experiment of its own, resumable), and asks again until the race is decided, the budget
is spent or a run failed. `confirm_settings` is the report's `--confirm`: given settings, one round, its own
parent run.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from functools import partial

from ray.tune.schedulers import FIFOScheduler

from tune_as.engine import members, storage
from tune_as.engine.plan import git_commit, plan_confirmation
from tune_as.engine.progress import round_bounds
from tune_as.engine.record import Confirmed, margin_points, reach, resolution_points, trial_runs
from tune_as.engine.request import SearchRequest
from tune_as.engine.searcher import FixedConfigs
from tune_as.engine.session import Session, fit, limited, open_session, restored, tuner
from tune_as.engine.state import part_dir, round_name
from tune_as.errors import UserError
from tune_as.results import racing, ranking
from tune_as.results.budget import last_look
from tune_as.results.render import fit as fitted
from tune_as.results.selection import Cell, TrialRun
from tune_as.settings import DataSettings, TrialSettings
from tune_as.tracking import schema


def race_plan(session: Session, losses: list[str], seeds: list[int], search_epochs: float) -> racing.Plan:
    """The race's design, fixed before its first seed: fixed seeds (`--confirm N`), or looks up to the last
    look the budget pays for every loss."""
    plan, r = session.plan, session.plan.request
    # the request checked its choices
    noise: racing.Noise = "per-loss" if r.noise == "per-loss" else "moderated"
    margin, step = margin_points(plan), resolution_points(plan)
    if r.confirm:
        return racing.Plan.fixed(losses, plan.baseline, seeds, r.confirm, margin_points=margin,
                                 resolution_points=step, noise=noise)
    last = last_look(r.max_seeds, r.budget, search_epochs, len(losses), _per_run(session, losses))
    return racing.Plan(tuple(losses), plan.baseline, tuple(seeds), max_seeds=last, margin_points=margin,
                       resolution_points=step, noise=noise)


def _per_run(session: Session, losses: list[str]) -> float:
    return max(session.plan.max_epochs(loss) for loss in losses)


def confirm(session: Session, trials: list[TrialRun], search_epochs: float) -> Confirmed:
    """Confirm each loss's selected setting with new seeds, in the rounds the race decides (one for
    `--confirm N`), each a Tune experiment of its own: a resume restores its round and replays the pure race
    (no seed runs twice)."""
    plan, r = session.plan, session.plan.request
    cells = ranking.selected(trials)
    # best on the search's validation first: a round the budget
    # cannot pay in full goes to them (and the baseline)
    losses = sorted((loss for loss in plan.losses if loss in cells),
                    key=lambda loss: (-cells[loss].val, loss))
    if plan.baseline not in cells or len(losses) < 2:
        return Confirmed(notes=(f"Not confirmed: the baseline {plan.baseline} has no result (every trial "
                                "stopped early or failed), so no verdict can be given."
                                if plan.baseline not in cells else
                                "Not confirmed: fewer than two losses have a result.",))
    if r.confirm_top is not None:
        best = losses[: r.confirm_top]  # already best on validation first
        losses = [loss for loss in losses if loss in best or loss == plan.baseline]
    race = race_plan(session, losses, ranking.confirmation_seeds(trials, r.confirm or r.max_seeds),
                     search_epochs)
    per_run = _per_run(session, losses)
    runs: list[TrialRun] = []
    rounds: list[tuple[str, ...]] = []
    epochs, notes = 0.0, []
    if not r.confirm and race.max_seeds < r.max_seeds:
        notes.append(f"--budget {r.budget:g}: the race's last look is at {race.max_seeds} seeds per loss, "
                     "what the budget left after the search pays for every loss "
                     f"(--max-seeds {r.max_seeds}); its alpha goes there.")
    notes.append(reach(race, plan.baseline, search_epochs, per_run, fixed=bool(r.confirm)))
    print(fitted(notes[-1]))
    attempted: set[tuple[str, int]] = set()
    for round_no in range(1, len(race.looks) + 1):
        left = None if r.budget is None else max(0, int((r.budget - search_epochs - epochs) // per_run))
        answer = racing.decide(ranking.race_results(runs, plan.metric), race, left)
        if answer.done:
            break
        wanted = [(loss, s) for loss, ss in answer.next_seeds.items() for s in ss]
        if attempted & set(wanted):  # a run of this round failed: racing on would ask for it forever
            notes.append("Racing stopped early: a confirmation run failed "
                         "(see the runs marked FAILED in MLflow).")
            break
        attempted |= set(wanted)
        configs = [dataclasses.replace(_settings(cells[loss]), seed=s) for loss, s in wanted]
        session.progress.note(f"Confirmation round {round_no}: {len(configs)} runs of "
                              f"{len(answer.next_seeds)} losses, no early stopping "
                              f"(seeds {', '.join(map(str, sorted({seed for _, seed in wanted})))})")
        # the rounds that may follow: the seeds their looks add, for the losses still racing at most
        later = round_bounds(race.looks, len(answer.active), per_run, after=round_no)
        session.progress.rounds_left(later)
        new, spent = run_round(session, configs, round_no, round_no + len(later))
        runs += new
        rounds.append(tuple(run.run_id for run in new))
        epochs += spent
    session.progress.rounds_left([])
    results = ranking.race_results(runs, plan.metric)
    if r.budget is not None and not racing.decide(results, race, None).done:
        notes.append(f"--budget {r.budget:g} trial-epochs spent before every verdict was decided.")
    return Confirmed(runs, epochs, race, tuple(notes), tuple(rounds))


def _settings(cell: Cell) -> TrialSettings:
    settings = cell.runs[0].settings
    assert settings is not None, "a search's trial runs carry their typed settings"
    return settings


def run_round(session: Session, configs: list[TrialSettings], round_no: int = 1,
              rounds: int = 1) -> tuple[list[TrialRun], float]:
    """Run complete trial settings to the end as confirmation child runs, in a resumable Tune experiment of
    their own (`--seeds-per-trial N`: populations, engine.members); a lost run runs again in `<round>.part2`.
    `rounds`: how many the race may have. Returns the runs and the trial-epochs they took."""
    plan = session.plan
    runs_of = Counter(c.loss for c in configs)
    of = f"at most {rounds}" if rounds > round_no else str(rounds)
    session.progress.begin(f"confirmation round {round_no} of {of}",
                           {c.loss: (runs_of[c.loss], c.epochs) for c in configs})
    path = plan.search_dir / round_name(plan.search_dir, plan.token or plan.search_id, round_no)
    todo, notes = members.group(configs, plan.request.seeds_per_trial,
                                partial(members.population_problem, plan.data))
    for note in notes:
        print(fitted(note))
    runs: list[TrialRun] = []
    epochs, part = 0.0, 1
    while todo:
        where = part_dir(plan.search_dir, path, part)
        was_saved = storage.restorable(where)
        if was_saved:  # a restored round's trials all ended: whatever its state lost is `todo`
            grid = fit(session, restored(session, where), None)
        else:
            searcher = limited(session, FixedConfigs(todo, f"best_val_{plan.metric}"))
            grid = fit(session, tuner(session, where, schema.ROLE_CONFIRMATION, searcher, FIFOScheduler(),
                                      len(todo)), len(todo))
        runs += trial_runs([grid], plan)
        epochs += members.grid_epochs(grid)
        todo = members.missing(todo, [grid[i].config or {} for i in range(len(grid))])
        if todo and not was_saved:  # a new Tuner that ended runs every config (else fit raised): never a loop
            raise RuntimeError(f"{where.name}: expected a trial for each of its configs, got none for "
                               f"{todo[0]}")
        if todo:
            session.progress.note(f"Confirmation round {round_no}: Ray's saved state of {where.name} lacks "
                                  f"{len(todo)} of its runs (the driver was killed while Ray copied it); "
                                  "they run now.")
        part += 1
    return runs, epochs


def confirm_settings(r: SearchRequest, data: DataSettings, configs: list[TrialSettings]) -> list[TrialRun]:
    """The report's `--confirm`: run given settings (with their seeds) on the data `data` describes, as a
    confirmation batch of its own: a parent run with tag purpose=confirmation. `r` says where to track and
    run."""
    if not configs:
        raise UserError("confirm_settings: expected at least one trial setting, got none")
    plan = plan_confirmation(r, data, configs)
    params = {"task": plan.task.name, "trials": len(configs), "git_commit": git_commit()}
    with open_session(plan, params, {schema.PURPOSE: schema.ROLE_CONFIRMATION},
                      hint="(confirmation runs: rerun the report to continue)") as session:
        return run_round(session, configs)[0]
