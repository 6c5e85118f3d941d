"""The answer's record, built from a finished search (tune_as.results.answer says what it holds and why), what
the search cost (`Compute`), and the verdicts' margin and resolution, derived from the plan (never saved: a
resume derives the same and says the same)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tune_as.engine import members
from tune_as.engine.callbacks import completed
from tune_as.engine.plan import SearchPlan
from tune_as.engine.request import RESULT_OPTIONS
from tune_as.errors import UserError
from tune_as.results import racing, ranking
from tune_as.results.answer import AnswerRecord, Mode
from tune_as.results.selection import TrialRun
from tune_as.settings import TrialSettings


@dataclasses.dataclass(frozen=True)
class Compute:
    """What a search cost: epochs trained by every trial (stopped, failed and diverged ones included) and wall
    time of this call (a resumed search counts the epochs of every call, the wall time of this one)."""

    search_epochs: float
    confirm_epochs: float
    search_trials: int
    confirm_trials: int
    wall_s: float
    budget: float | None = None

    def line(self) -> str:
        minutes, seconds = divmod(round(self.wall_s), 60)
        total = self.search_epochs + self.confirm_epochs
        of = f" of a budget of {self.budget:g}" if self.budget is not None else ""
        return (f"Compute: {total:g} trial-epochs{of} (search {self.search_epochs:g} in {self.search_trials} "
                f"trials, confirmation {self.confirm_epochs:g} in {self.confirm_trials} runs), "
                f"wall {minutes} min {seconds:02d} s")


def failures_of(grids: Sequence[Any]) -> dict[str, str]:
    """Per loss, why its trials gave no result, from the first that failed (its error's last line), over
    Tune's result grids of the search (its parts too)."""
    out: dict[str, str] = {}
    for grid in grids:
        for i, member in members.of_grid(grid):
            result = grid[i]
            loss = str(member.config.get("loss", ""))
            # a diverged trial reports its error as a result; a crashed one leaves Ray's exception
            error = member.metrics.get("error") or (
                (str(result.error).strip().splitlines() or [""])[-1] if result.error else None)
            if loss and error and loss not in out:
                out[loss] = f"failed or diverged: {str(error)[:200]} (trial folder {Path(result.path).name})"
    return out


def trial_runs(grids: Sequence[Any], plan: SearchPlan) -> list[TrialRun]:
    """The runs with a result of Tune's result grids (a search and its parts, or a round's), each with its
    number in the search; a part's trials are numbered after every trial before them (equal settings: the
    earlier wins)."""
    runs: list[TrialRun] = []
    for grid in grids:
        after = max((run.start_time for run in runs), default=0)
        for i, member in members.of_grid(grid):
            # the folder is the trial's name: <loss>_<number>
            number = Path(grid[i].path).name.rsplit("_", 1)[-1]
            settings = TrialSettings.from_dict(member.config)
            run = ranking.trial_run(member.run_id, plan.data_settings, settings, member.metrics, plan.metric,
                                    completed(member.metrics, settings.epochs),
                                    after + (int(number) if number.isdigit() else 0))
            if run is not None:
                runs.append(run)
    return runs


@dataclasses.dataclass(frozen=True)
class Confirmed:
    """What confirmation produced: its runs, their epochs, the race's design, notes, and the runs of each
    round (the race's answer is replayed from them: tune_as.results.answer)."""

    runs: list[TrialRun] = dataclasses.field(default_factory=list)
    epochs: float = 0.0
    race: racing.Plan | None = None
    notes: tuple[str, ...] = ()
    rounds: tuple[tuple[str, ...], ...] = ()  # the confirmation runs' Ray trial ids, round by round


def answer_record(plan: SearchPlan, trials: Sequence[TrialRun], race: racing.Plan | None,
                  notes: Sequence[str], rounds: tuple[tuple[str, ...], ...],
                  failures: dict[str, str]) -> AnswerRecord:
    """What the report replays: the race's plan (None: not confirmed), the trials with a result (Ray trial id
    -> completed), the confirmation runs of each round, why a loss has no result, and every note printed."""
    r = plan.request
    if race is None:
        how = "single runs, not confirmed: add --race or --confirm N"
    elif r.race:
        how = f"confirmed in rounds of new seeds, up to {race.max_seeds} per loss"
    else:
        how = f"{r.confirm} confirmation seeds" + (f" for the top {r.confirm_top} and {plan.baseline}, "
                                                   "single runs below" if r.confirm_top else "")
    title = f"{plan.task.name}: which loss wins ({plan.metric}, %; {epochs_title(plan)}; {how})"
    lines = ([f"Data: {w}" for w in (*plan.data.notes, *plan.data.warnings)] + plan_notes(plan) + list(notes)
             + plan.quota_notes())
    mode: Mode = "none" if race is None else "race" if r.race else "fixed"
    return AnswerRecord(plan.task.name, plan.metric, title, tuple(plan.losses), plan.baseline,
                        margin_points(plan), mode, race,
                        {t.run_id: not t.stopped_early for t in trials}, rounds, failures, tuple(lines))


def epochs_title(plan: SearchPlan) -> str:
    epochs = {loss: plan.max_epochs(loss) for loss in plan.losses}
    if len(set(epochs.values())) == 1:
        (each,) = set(epochs.values())  # the losses' own epochs, which need not be the base's
        return f"{each:g} epoch{'s' if each != 1 else ''} each"
    return "epochs per loss: " + ", ".join(f"{loss} {e:g}" for loss, e in epochs.items())


def _verdict_split(plan: SearchPlan) -> tuple[str, Any]:
    """The split the verdicts are computed on: test where it has labels, else validation (racing's "auto")."""
    return ("test", plan.data.test) if plan.data.test is not None else ("validation", plan.data.validation)


def resolution_points(plan: SearchPlan) -> float:
    """One item of the verdicts' split, in points: accuracy's step on it."""
    return 100.0 / max(len(_verdict_split(plan)[1]), 1)


def margin_points(plan: SearchPlan) -> float:
    """The verdicts' margin: --margin, or one item of the split where the default is smaller (a difference the
    split cannot measure)."""
    r, step = plan.request, resolution_points(plan)
    return step if plan.confirming and 0 < r.margin < step else r.margin


def check_margin(plan: SearchPlan) -> None:
    """A --margin a user gave below one item of the split is refused before anything runs."""
    r = plan.request
    if margin_points(plan) != r.margin and "margin" in r.given():
        raise UserError(f"--margin: expected 0 or at least one item of the {_verdict_split(plan)[0]} split "
                        f"({resolution_points(plan):.3g} points), got {r.margin:g}: a smaller difference "
                        "cannot be measured on it")


def plan_notes(plan: SearchPlan) -> list[str]:
    """What planning decided that the answer must say: the default margin raised to one item."""
    if margin_points(plan) == plan.request.margin:
        return []
    return [f"Margin: the default {plan.request.margin:g} points is less than one item of the "
            f"{_verdict_split(plan)[0]} split; equivalence is judged within ±{margin_points(plan):.3g} "
            "points (one item) instead."]


def reach(race: racing.Plan, baseline: str, search_epochs: float, per_run: float, fixed: bool,
          more: int = 10) -> str:
    """What the race's looks can decide, said before its first seed (racing.decidable), and, when its last
    look is below `more` seeds, what `more` would allow and the budget that pays it, in the flag of the
    search's own design: `fixed` (--confirm N) or a race (--max-seeds), even a race whose one look is at its
    first seeds."""
    line = (f"What the confirmation can decide: a claim needs |Δ| >= "
            f"{', '.join(f'{k:.3g}·s at {n} seeds' for n, k in racing.decidable(race))} (s: the spread over "
            f"seeds of a loss's difference to {baseline}, in points; Holm's first step).")
    if race.max_seeds < more:
        wider = dataclasses.replace(race, seeds=tuple(range(more)), max_seeds=more,
                                    first=more if fixed else race.first)
        budget = search_epochs + per_run * len(race.losses) * more
        line += (f" {'--confirm' if fixed else '--max-seeds'} {more} (a --budget of at most {budget:g} "
                 f"trial-epochs in all) would need {racing.decidable(wider)[-1][1]:.3g}·s at its last look.")
    return line


def parent_params(plan: SearchPlan, commit: str | None) -> dict[str, Any]:
    """The search's MLflow params: every option that changes results (request.RESULT_OPTIONS, as asked), then
    what the plan resolved them to (the losses, trials, backbone and epochs it runs, the margin it judges
    with)."""
    r = plan.request
    # --set pairs as KEY=VALUE
    asked = {k: ",".join(f"{x[0]}={x[1]}" if isinstance(x, tuple) else str(x) for x in v)
             if isinstance(v, tuple) else v
             for k in RESULT_OPTIONS if (v := getattr(r, k)) not in (None, ())}
    resolved = {"task": plan.task.name, "losses": ",".join(plan.losses),
                "trials_per_loss": plan.search_trials,
                "backbone": plan.data_settings.backbone, "encoder": plan.data_settings.encoder,
                "epochs": plan.base.epochs, "max_seeds": r.max_seeds if r.race else None,
                "margin_points": margin_points(plan), "baseline": plan.baseline, "git_commit": commit,
                "search_space": str(plan.space.path)}
    return {k: v for k, v in {**asked, **resolved}.items() if v is not None}
