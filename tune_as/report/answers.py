"""The searches' own answers, replayed from MLflow: the record each search logged (answer.json) and its runs,
through the same function the search printed with (tune_as.results.answer.answer_table). Never re-derived by
other rules: a report and its search print the same Δ, intervals, verdicts, marks and best set."""

from __future__ import annotations

import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tune_as.results import ranking
from tune_as.results.answer import Answered, AnswerRecord, answer_table
from tune_as.results.render import Table
from tune_as.results.selection import TrialRun
from tune_as.settings import from_params
from tune_as.tracking import schema

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run


@dataclass(frozen=True)
class Replayed:
    """One search's answer as the report prints it, and whether it equals the table the search logged."""

    search: str
    parent_id: str
    answered: Answered
    same_as_logged: bool | None  # None: the search logged no ranking.csv to compare with
    record: AnswerRecord | None = None  # what the answer was replayed from (its baseline, metric and margin)

    @property
    def table(self) -> Table:
        t = self.answered.table
        return Table(f"answer_{self.search}", f"{t.title} [search {self.search}]", t.header, t.rows, t.notes)


def search_name(parent: Run) -> str:
    return parent.data.tags.get(schema.SEARCH, "") or parent.info.run_name or parent.info.run_id


def column_labels(parents: list[Run]) -> dict[str, str]:
    """Parent run id -> the report's column for its search: the task, or `task@search` where the report holds
    several searches of one task (their trials are never pooled: a 3-epoch and an 8-epoch search are two
    answers)."""
    task = {p.info.run_id: p.data.tags.get(schema.TASK, "") for p in parents}
    count = Counter(task.values())
    return {p.info.run_id: task[p.info.run_id] if count[task[p.info.run_id]] == 1
            else f"{task[p.info.run_id]}@{search_name(p)}" for p in parents}


def engine_run(run: Run, metric: str, completed: bool) -> TrialRun | None:
    """A child run as the search held it (tune_as.engine.record.trial_runs): typed settings from its params,
    its Ray trial id, its number in the search (from its name, `<loss>_<number>`), its last metrics and
    whether it completed its epochs (as the search's record says)."""
    data, settings = from_params(dict(run.data.params))
    number = (run.info.run_name or "").rsplit("_", 1)[-1]
    return ranking.trial_run(run.data.tags.get(schema.TRIAL, run.info.run_id), data, settings,
                             schema.fractions(dict(run.data.metrics)), metric, completed,
                             int(number) if number.isdigit() else 0)


def _artifact(client: MlflowClient, run_id: str, name: str, tmp: Path) -> str | None:
    from mlflow.exceptions import MlflowException

    try:
        return Path(client.download_artifacts(run_id, name, str(tmp))).read_text()
    except (MlflowException, OSError):
        return None


def replay(client: MlflowClient, parent: Run) -> Replayed | str:
    """The search's answer from its record and runs, or one line saying why it cannot be replayed."""
    name = search_name(parent)
    with tempfile.TemporaryDirectory() as tmp:
        text = _artifact(client, parent.info.run_id, schema.ANSWER_JSON, Path(tmp))
        logged = _artifact(client, parent.info.run_id, schema.RANKING_CSV, Path(tmp))
    if text is None:
        return (f"search {name}: no {schema.ANSWER_JSON} on its parent run (it ended before its answer, "
                "or an older tune_as ran it): its answer is not replayed")
    try:
        record = AnswerRecord.from_json(text)
    except ValueError as exc:
        return f"search {name}: {schema.ANSWER_JSON} unreadable ({exc}): its answer is not replayed"
    problem = record.disagreement(dict(parent.data.params))
    if problem is not None:
        return (f"search {name}: {schema.ANSWER_JSON} does not match its parent run ({problem}): "
                "its answer is not replayed")
    children = client.search_runs([parent.info.experiment_id], max_results=5000, filter_string=(
        f"tags.`{schema.SEARCH}` = '{name}' and tags.`{schema.ROLE}` != '{schema.ROLE_SEARCH}'"))
    runs: dict[str, list[TrialRun]] = {schema.ROLE_TRIAL: [], schema.ROLE_CONFIRMATION: []}
    for run in children:  # a run without a finite best validation metric has no result (ranking.trial_run)
        role = run.data.tags.get(schema.ROLE, "")
        made = engine_run(run, record.metric, record.trials.get(run.data.tags.get(schema.TRIAL, ""), True)) \
            if role in runs else None
        if made is not None:
            runs[role].append(made)
    answered = answer_table(record, runs[schema.ROLE_TRIAL], runs[schema.ROLE_CONFIRMATION])
    same = None if logged is None else logged == answered.table.csv()
    return Replayed(name, parent.info.run_id, answered, same, record)
