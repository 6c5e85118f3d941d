"""The report's build: select settings from MLflow, tabulate, draw, confirm, and log (`build_report`).

Reads the runs a search wrote (schema: tune_as.tracking.schema, docs/architecture.md), selects one setting per
task x loss on the validation metric among trials that completed their epochs (tune_as.results.selection),
attaches the confirmation runs of each selected setting (the search's `--confirm` or this report's), writes
the paper's Tables 6/2/3/4 as Markdown and CSV and its Figures 1-4 as PNG into --out, prints the tables, and
logs everything to a report run in MLflow (tag tune_as.role=report). `--confirm N` re-runs each selected
setting with N new seeds (docs/report.md).
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tune_as.engine.request import SearchRequest
from tune_as.errors import UserError
from tune_as.paths import check_sqlite_file, check_writable_folder
from tune_as.report.answers import Replayed, column_labels, replay, search_name
from tune_as.report.runs import connect, experiment_ids, history, search_all, trial_runs
from tune_as.report.tables import confirmation_table, selection_csv, table2, table3, table4, table6
from tune_as.results.forest import forest
from tune_as.results.render import Table
from tune_as.results.selection import (
    PAPER_TASKS,
    Cell,
    Confirmation,
    TrialRun,
    new_seeds,
    order,
    same_setting,
    select,
    unmatched_confirmations,
    with_confirmations,
)
from tune_as.settings import from_params
from tune_as.tracking import schema
from tune_as.tracking.schema import ROLE, SEARCH

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

HISTORY_KEYS = ("val_loss", "masked_ratio", "optimizer_steps")


@dataclass
class Report:
    out: Path
    cells: dict[tuple[str, str], Cell]
    tables: list[Table]
    figures: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    confirmations: dict[tuple[str, str], Confirmation] = field(default_factory=dict)
    report_run_id: str = ""


def as_softmax_study(cells: dict[tuple[str, str], Cell], task: str) -> str:
    """The Optuna study of the task's AS-Softmax row, named by the loss its runs trained: on a multi-label
    task the paper's as_softmax row is Eq. 18's multilabel_as_softmax (tune_as.results.selection.row_of)."""
    cell = cells.get((task, "as_softmax"))
    return schema.study_name(task, cell.runs[0].loss if cell is not None else "as_softmax")


def pmargins(client: MlflowClient, cells: dict[tuple[str, str], Cell], task: str,
             tmp: Path) -> dict[str, np.ndarray]:
    from mlflow.exceptions import MlflowException

    found = {}
    for row in ("softmax", "as_softmax"):  # the paper's rows (row_of: Eq. 14 and 18 on a multi-label task)
        if (task, row) in cells:
            run_id = cells[task, row].runs[0].run_id
            try:
                found[row] = np.load(client.download_artifacts(run_id, schema.PMARGIN_FILE, str(tmp)))
            except (MlflowException, OSError):
                continue
    return found


def optuna_file(storage: Path, task: str, search_ids: set[str]) -> Path:
    """The Optuna SQLite file of the task's latest search: `storage` itself, `storage/optuna.db`, or
    `storage/<search>/optuna.db` where that search's tune_as_search.json names this task and one of the
    experiment's search ids (the search writes it there; see `python -m tune_as.search --storage-path`)."""
    if storage.is_file() or (storage / schema.OPTUNA_DB).is_file():
        return storage if storage.is_file() else storage / schema.OPTUNA_DB
    found = [folder / schema.OPTUNA_DB for folder, info in schema.search_states(storage)
             if info.get("task") == task and info.get("search_id") in search_ids
             and (folder / schema.OPTUNA_DB).is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else storage / task / schema.OPTUNA_DB


def confirm(client: MlflowClient, cells: dict[tuple[str, str], Cell], trials: list[TrialRun], n: int,
            uri: str, names: dict[str, str], request: SearchRequest, notes: list[str]) -> None:
    """Re-run every selected setting with n new seeds, the same for every loss of a task (the search's
    `--confirm` picks the same ones, so runs it already logged for those seeds are reused, as are this
    report's from an interrupted earlier call). A cell whose trials were all stopped early is not confirmed:
    it has no result, as in the search's ranking."""
    from tune_as.engine.confirm import confirm_settings

    seeds = {t: [str(s) for s in new_seeds((r.seed for r in trials if r.task == t), n)] for t, _ in cells}
    done = trial_runs(client, list(names), schema.ROLE_CONFIRMATION, [])
    for task in sorted(seeds):
        task_cells = [c for (t, _), c in cells.items() if t == task and not c.stopped_early]
        notes += [f"--confirm: {c.task} x {c.row} not confirmed: every trial was stopped early"
                  for (t, _), c in cells.items() if t == task and c.stopped_early]
        configs = [dataclasses.replace(from_params(c.params)[1], seed=int(s)) for c in task_cells
                   for s in seeds[task] if not any(r.seed == s and same_setting(r, c.runs[0]) for r in done)]
        if configs:
            first = task_cells[0].runs[0]
            # the search's seed fixes the data (sub)sampling: the confirmations keep the same data
            data_seed = (int(client.get_run(first.parent_id).data.params.get("seed", "0"))
                         if first.parent_id else 0)
            data = dataclasses.replace(from_params(first.params)[0], seed=data_seed)
            confirm_settings(dataclasses.replace(request, task=task, mlflow_uri=uri,
                                                 experiment=names[first.experiment_id]), data, configs)


def searches_of(client: MlflowClient, ids: Sequence[str], wanted: Sequence[str]) -> list[Run]:
    """The parent runs of the experiments' searches (not the report's confirmation batches), those named in
    `wanted` if any (UserError naming the searches there are when one is not found)."""
    found = [r for r in search_all(client, ids, schema.ROLE_SEARCH) if schema.PURPOSE not in r.data.tags]
    if wanted:
        names = {search_name(r) for r in found}
        missing = [w for w in wanted if w not in names]
        if missing:
            raise UserError(f"--search: expected a search of the experiment(s) "
                            f"({', '.join(sorted(names)) or 'none'}), received {', '.join(missing)}")
        found = [r for r in found if search_name(r) in wanted]
    return sorted(found, key=lambda r: (r.info.start_time or 0, search_name(r)))


def answer_text(experiments: Sequence[str], tracking_uri: str, searches: Sequence[str], fmt: str) -> str:
    """One search's answer replayed from its record (`--print`), in `fmt`: what the search printed, or its
    structured JSON. UserError unless exactly one search is chosen and its answer can be replayed."""
    client = connect(tracking_uri)
    parents = searches_of(client, list(experiment_ids(client, experiments, tracking_uri)), searches)
    if len(parents) != 1:
        raise UserError(f"--print: expected one search, found {len(parents)}"
                        + (f" ({', '.join(search_name(p) for p in parents)}): choose one with --search"
                           if parents else ""))
    replayed = replay(client, parents[0])
    if isinstance(replayed, str):
        raise UserError(f"--print: {replayed}")
    return replayed.answered.render(fmt, replayed.record)


def per_search(runs: list[TrialRun], labels: dict[str, str], keep_other: bool) -> list[TrialRun]:
    """Runs of the given searches (parent run id -> column label, `answers.column_labels`), their task set to
    that label; `keep_other`: also runs of no such search (the report's own --confirm batches)."""
    return [dataclasses.replace(r, task=labels[r.parent_id]) if r.parent_id in labels else r
            for r in runs if keep_other or r.parent_id in labels]


def build_report(experiments: Sequence[str], out: Path, tracking_uri: str, confirm_seeds: int = 0,
                 optuna_storage: Path | None = None, placement: SearchRequest | None = None,
                 searches: Sequence[str] = ()) -> Report:
    """Read, select, tabulate, draw, log. Raises UserError before writing anything on bad input.
    `placement`: where confirmation runs go (Ray address, storage path, resources); task, data and settings
    come from the selected runs. `searches`: the searches to report (default: every search of the experiments,
    each its own column and its own answer)."""
    from tune_as.report import figures as figs

    check_writable_folder(out, "--out")
    if optuna_storage is not None and optuna_storage.is_file():
        check_sqlite_file(optuna_storage, "--optuna-storage")
    client = connect(tracking_uri)
    names = experiment_ids(client, experiments, tracking_uri)
    notes: list[str] = []
    parents = searches_of(client, list(names), searches)
    labels = column_labels(parents)
    replays = [replay(client, p) for p in parents]
    confirmed_tasks = {labels[r.parent_id] for r in replays
                       if isinstance(r, Replayed) and r.answered.decision}
    if confirm_seeds > 0 and any("@" in label for label in labels.values()):
        raise UserError(f"--confirm: expected one search per task, received several of one task "
                        f"({', '.join(sorted(v for v in labels.values() if '@' in v))}): "
                        "choose one with --search")
    if confirm_seeds > 0 and confirmed_tasks:
        raise UserError(f"--confirm: expected searches that did not confirm their answer, "
                        f"received searches of {', '.join(sorted(confirmed_tasks))} that did "
                        "(--race or --confirm): their answer is replayed as it is; more seeds would be a "
                        "second look at the same comparison")
    trials = per_search(trial_runs(client, list(names), schema.ROLE_TRIAL, notes), labels,
                        keep_other=not searches)
    if not trials:
        raise UserError(f"expected finished trial runs (tag {ROLE}=trial) in experiment(s) "
                        f"{', '.join(names.values())}, received none "
                        f"({'; '.join(notes) or 'no trial runs'}): run `python -m tune_as.search` first")
    cells = select(trials)
    if confirm_seeds > 0:
        confirm(client, cells, trials, confirm_seeds, tracking_uri, names,
                placement or SearchRequest(task=""), notes)
    confirmation_runs = per_search(trial_runs(client, list(names), schema.ROLE_CONFIRMATION, notes), labels,
                                   keep_other=True)
    cells = with_confirmations(cells, confirmation_runs)
    notes += unmatched_confirmations(cells, confirmation_runs)
    search_ids = {r.data.tags.get(SEARCH, "") for r in search_all(client, list(names), schema.ROLE_SEARCH)}
    histories = {r.run_id: history(client, r.run_id, (f"val_{r.metric}", *HISTORY_KEYS))
                 for c in cells.values() for r in c.runs}
    report = Report(out, cells, [table6(cells), table2(cells), table3(cells), table4(cells, histories)],
                    notes=notes)
    report.confirmations = {key: found for key, c in cells.items() if (found := Confirmation.of(c))}
    if report.confirmations:
        report.tables.append(confirmation_table(report.confirmations, cells, confirmed_tasks))
    for replayed in replays:
        if isinstance(replayed, str):
            notes.append(replayed)
            continue
        report.tables.append(replayed.table)
        if replayed.same_as_logged is False:
            notes.append(f"search {replayed.search}: the replayed answer differs from the ranking.csv "
                         "the search logged; this is a bug in tune_as, please report it with both files")
    out.mkdir(parents=True, exist_ok=True)
    for replayed in (r for r in replays if isinstance(r, Replayed) and r.record is not None):
        assert replayed.record is not None
        path = out / f"answer_{replayed.search}.png"  # the search's own answer as a forest plot
        if forest(replayed.answered, replayed.record.margin_points, replayed.record.baseline,
                  replayed.record.metric, path,
                  f"{replayed.record.task}: search {replayed.search}") is not None:
            report.figures.append(path)
    with tempfile.TemporaryDirectory() as tmp:
        for task in order({t for t, _ in cells}, PAPER_TASKS):
            storage = optuna_file(optuna_storage or Path("tune_as_results"), task, search_ids)
            drawn = [figs.fig1_masked_ratio(task, cells, histories, out), figs.fig2_delta(task, trials, out),
                     figs.fig3_curves(task, cells, histories, out),
                     figs.fig4_pmargin(task, cells, pmargins(client, cells, task, Path(tmp)), out),
                     figs.optuna_history(storage, as_softmax_study(cells, task), out)]
            report.figures += [d.path for d in drawn if isinstance(d, figs.Drawing)]
            notes += [d for d in drawn if isinstance(d, str)]
    written = write(report)
    run = client.create_run(next(iter(names)), run_name=schema.ROLE_REPORT,
                            tags={ROLE: schema.ROLE_REPORT, schema.EXPERIMENTS: ",".join(names.values())})
    for path in written:  # only this report's files, not whatever else lies in --out
        client.log_artifact(run.info.run_id, str(path), "report")
    client.set_terminated(run.info.run_id)
    report.report_run_id = run.info.run_id
    return report


def write(report: Report) -> list[Path]:
    """Each table as Markdown and CSV, and report.md with everything; returns every file of this report."""
    parts, written = ["# tune_as report", ""], list(report.figures)
    for table in report.tables:
        for path, text in ((report.out / f"{table.name}.md", table.markdown()),
                           (report.out / f"{table.name}.csv", table.csv())):
            path.write_text(text)
            written.append(path)
        parts.append(table.markdown())
    (report.out / "selection.csv").write_text(selection_csv(report.cells))
    written.append(report.out / "selection.csv")
    parts += ["## Figures", ""] + [f"![{p.stem}]({p.name})\n" for p in report.figures]
    parts += ["## Notes", ""] + [f"- {n}" for n in report.notes]
    (report.out / "report.md").write_text("\n".join(parts) + "\n")
    return [*written, report.out / "report.md"]


def show(report: Report) -> None:
    from rich.console import Console
    from rich.markup import escape

    console = Console(highlight=False)
    for table in report.tables:
        print(table.terminal())
    for note in report.notes:
        console.print(f"note: {escape(note)}")
    console.print(f"wrote {len(report.tables)} tables and {len(report.figures)} figures to {report.out}; "
                  f"MLflow report run {report.report_run_id}")
