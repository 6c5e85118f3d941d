"""A search, top to bottom: `run_search` is the one function to read.

    plan     every check of the request, nothing written (engine.plan)
    open     Ray, the MLflow parent run, the search's folder (engine.session)
    search   one Tuner: an Optuna study and ASHA rungs per loss (`search`)
    confirm  each loss's selected setting with new seeds, in the race's rounds (engine.confirm)
    decide   the race replayed from the answer's record: verdicts, intervals, the best set (tune_as.results)
    record   ranking.md/.csv, answer.json and answer.png on the parent run (`keep`)
    print    the answer, alone on stdout in a machine format (`show`)
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import TextIO

from ray import tune
from ray.tune.search import Searcher

from tune_as.engine import members, storage
from tune_as.engine.confirm import confirm
from tune_as.engine.folder import write_state
from tune_as.engine.head import Head
from tune_as.engine.plan import git_commit, plan_search, state_of
from tune_as.engine.progress import planned
from tune_as.engine.record import (
    Compute,
    Confirmed,
    answer_record,
    check_margin,
    failures_of,
    parent_params,
    trial_runs,
)
from tune_as.engine.request import SearchRequest
from tune_as.engine.session import (
    Session,
    fit,
    limited,
    open_session,
    per_loss,
    restored,
    search_scheduler,
    tuner,
)
from tune_as.engine.state import part_dir
from tune_as.errors import NO_RESULT, Ending
from tune_as.results import ranking
from tune_as.results.answer import Answered, AnswerRecord, answer_table, summary
from tune_as.results.forest import forest
from tune_as.results.render import MACHINE_FORMATS
from tune_as.results.render import fit as fitted
from tune_as.results.selection import TrialRun
from tune_as.tracking import schema


class NoResult(Exception, Ending):
    """The search ended with no result for any loss (the parent run is FAILED)."""
    exit_code = NO_RESULT


@dataclasses.dataclass
class Outcome:
    """What a finished search returns: the ranking rows, the trials behind them and what it all cost."""

    rows: list[ranking.Row]
    trials: list[TrialRun]
    confirmations: list[TrialRun]
    markdown: str
    compute: Compute


def run_search(r: SearchRequest, head: Head | None = None, answer_to: TextIO | None = None) -> Outcome:
    """Plan, open, search, confirm, decide, record, print (the module's docstring). `head`: the CLI's local
    Ray (engine.head), joined. `answer_to`: where the answer is printed (default stdout)."""
    plan = plan_search(r)
    check_margin(plan)
    state = state_of(plan)
    tags = {schema.DATA_WARNINGS: " | ".join(plan.data.warnings)[:5000]} if plan.data.warnings else {}
    with open_session(plan, parent_params(plan, git_commit()), tags, state, head=head) as session:
        _where(session)
        session.progress.expect(*planned(plan))
        tic = time.monotonic()
        grids = search(session)
        trials = trial_runs(grids, plan)
        search_epochs = sum(members.grid_epochs(grid) for grid in grids)
        confirmed = confirm(session, trials, search_epochs) if plan.confirming else Confirmed()
        record = answer_record(plan, trials, confirmed.race, confirmed.notes, confirmed.rounds,
                               failures_of(grids))
        answered = answer_table(record, trials, confirmed.runs)  # the decision, as the report replays it
        compute = Compute(search_epochs, confirmed.epochs, sum(map(len, grids)), len(confirmed.runs),
                          time.monotonic() - tic, r.budget)
        show(session, answered, record, compute, answer_to or sys.stdout)
        keep(session, record, answered, compute)
        if not any(row.val for row in answered.rows):
            raise NoResult(f"no loss has a result: every trial failed, diverged or was stopped early "
                           f"({'; '.join(f'{row.loss}: {row.failure}' for row in answered.rows)[:600]})")
    write_state(plan.search_dir, {**state, "finished": True})
    return Outcome(answered.rows, trials, confirmed.runs, answered.table.markdown(), compute)


def _shown(path: Path) -> Path:
    """A path as printed: relative to the working folder when inside it (a line a terminal can hold)."""
    try:
        return path.resolve().relative_to(Path.cwd())
    except ValueError:
        return path


def _where(session: Session) -> None:
    """Where to watch the search: its MLflow parent run, its Optuna studies, and what was done to the data."""
    plan = session.plan
    print(f"MLflow: {session.tracker.shown}\n  experiment {plan.experiment!r}, parent run "
          f"{session.tracker.parent_id}")
    studies = schema.optuna_url(_shown(plan.search_dir))
    print(fitted(f"Optuna studies: {studies}" if importlib.util.find_spec("optuna_dashboard") is None else
                 f"Optuna studies: optuna-dashboard {studies}"))
    for note in plan.data.notes:  # what was done to the data (carved splits, cut texts), built or cached
        print(fitted(f"Data: {note}"))


def search(session: Session) -> list[tune.ResultGrid]:
    """The search's trials: one Tuner (a resume restores it), and the parts that run trials its state lost."""
    plan = session.plan
    session.progress.begin("search")
    if plan.request.resume and storage.restorable(plan.experiment_dir):
        return _lost_trials(session, fit(session, restored(session, plan.experiment_dir, per_loss(session)),
                                         None))
    return [fit(session, tuner(session, plan.experiment_dir, schema.ROLE_TRIAL, _searcher(session),
                               search_scheduler(plan), plan.n_trials), plan.n_trials)]


def _searcher(session: Session, ran: dict[str, int] | None = None) -> Searcher:
    searcher = per_loss(session)  # `ran` trials of each loss already run, in a part (`_lost_trials`): no Ray
    if ran is not None:  # trial runs there, so an Optuna trial still running is an orphan
        searcher.close_running()
        searcher.suggested = {loss: ran.get(loss, 0) for loss in session.plan.losses}
    return limited(session, searcher)


def _lost_trials(session: Session, grid: tune.ResultGrid) -> list[tune.ResultGrid]:
    """The resumed search's grid and its parts: a trial Ray's state lost (docs/architecture.md), never asked
    for again by the searcher, runs in a part of the search's own, `<search>.part2`, asked from its loss's
    study."""
    plan, grids = session.plan, [grid]
    while True:
        ran = Counter(str((g[i].config or {}).get("loss")) for g in grids for i in range(len(g)))
        lost = {loss: plan.quota(loss) - ran[loss] for loss in plan.losses if ran[loss] < plan.quota(loss)}
        if not lost:
            return grids
        where = part_dir(plan.search_dir, plan.experiment_dir, len(grids) + 1)
        session.progress.begin("search")
        if storage.restorable(where):
            grids.append(fit(session, restored(session, where, per_loss(session), dict(ran)), None))
            continue
        session.progress.note(f"Search: Ray's saved state of {plan.experiment_dir.name} lacks "
                              f"{sum(lost.values())} trial(s) of {', '.join(sorted(lost))} (the driver was "
                              "killed while Ray copied it); they run now.")
        grids.append(fit(session, tuner(session, where, schema.ROLE_TRIAL, _searcher(session, dict(ran)),
                                        search_scheduler(plan), sum(lost.values())), sum(lost.values())))


def show(session: Session, answered: Answered, record: AnswerRecord, compute: Compute,
         answer_to: TextIO) -> None:
    """The answer in the request's format; in a machine format it is alone on `answer_to`, what it cost and
    where to look go to stdout apart."""
    r = session.plan.request
    shown = answered.render(r.output_format, record)
    tail = fitted(compute.line() + "\n" + schema.ui_line(session.tracker.shown,
                                                         str(session.tracker.experiment_id),
                                                         schema.view_key(session.plan.search_id)))
    if r.output_format in MACHINE_FORMATS:
        print(shown, end="", file=answer_to, flush=True)
        print(tail)
    else:
        print("\n" + shown + "\n" + tail, file=answer_to, flush=True)


def keep(session: Session, record: AnswerRecord, answered: Answered, compute: Compute) -> None:
    """The answer on the parent run: ranking.md and .csv, answer.json (what the report replays), answer.png,
    and the summary metrics and tags that let the MLflow UI show it."""
    plan = session.plan
    text = answered.table.markdown()
    with tempfile.TemporaryDirectory() as tmp:
        md, csv, record_file = (Path(tmp) / name for name in (schema.RANKING_MD, schema.RANKING_CSV,
                                                              schema.ANSWER_JSON))
        md.write_text(text)
        csv.write_text(answered.table.csv())
        record_file.write_text(record.to_json())
        metrics, tags = summary(answered, record.margin_points)
        figure = Path(tmp) / schema.ANSWER_PNG  # the answer as a forest plot (tune_as.results.forest)
        drawn = forest(answered, record.margin_points, plan.baseline, plan.metric, figure, plan.name)
        session.tracker.search_artifacts([md, csv, record_file, *([figure] if drawn else [])], {
            schema.SEARCH_EPOCHS: compute.search_epochs, schema.CONFIRM_EPOCHS: compute.confirm_epochs,
            **metrics},
            {schema.NOTE: text, **{schema.ANSWER_TAG_PREFIX + k: v for k, v in tags.items()}})

