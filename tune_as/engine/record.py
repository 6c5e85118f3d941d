"""The answer's record, built from a finished search (tune_as.results.answer says what it holds and why)."""

from __future__ import annotations

from collections.abc import Sequence

from tune_as.engine.plan import SearchPlan
from tune_as.results import racing
from tune_as.results.answer import AnswerRecord, Mode
from tune_as.results.selection import TrialRun


def answer_record(plan: SearchPlan, trials: Sequence[TrialRun], race: racing.Plan | None, notes: Sequence[str],
                  rounds: tuple[tuple[str, ...], ...], failures: dict[str, str]) -> AnswerRecord:
    """What the report replays: the race's plan (None: not confirmed), the trials with a result (Ray trial id ->
    completed), the confirmation runs of each round, why a loss has no result, and every note printed."""
    r = plan.request
    if race is None:
        how = "single runs, not confirmed: add --race or --confirm N"
    elif r.race:
        how = f"confirmed in rounds of new seeds, up to {race.max_seeds} per loss"
    else:
        how = f"{r.confirm} confirmation seeds" + (f" for the top {r.confirm_top} and {plan.baseline}, single runs "
                                                   "below" if r.confirm_top else "")
    title = f"{plan.task.name}: which loss wins ({plan.metric}, %; {epochs_title(plan)}; {how})"
    lines = [f"Data: {w}" for w in plan.data.warnings] + list(plan.notes) + list(notes) + plan.quota_notes()
    mode: Mode = "none" if race is None else "race" if r.race else "fixed"
    return AnswerRecord(plan.task.name, plan.metric, title, tuple(plan.losses), plan.baseline, r.margin, mode, race,
                        {t.run_id: not t.stopped_early for t in trials}, rounds, failures, tuple(lines))


def epochs_title(plan: SearchPlan) -> str:
    epochs = {loss: plan.max_epochs(loss) for loss in plan.losses}
    if len(set(epochs.values())) == 1:
        (each,) = set(epochs.values())  # the losses' own epochs, which need not be the base's
        return f"{each:g} epoch{'s' if each != 1 else ''} each"
    return "epochs per loss: " + ", ".join(f"{loss} {e:g}" for loss, e in epochs.items())
