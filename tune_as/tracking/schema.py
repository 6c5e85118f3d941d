"""The run schema, in one place: MLflow tag names and roles, artifact names and the search folder layout.
(A child run's MLflow params turn back into settings with `tune_as.settings.from_params`.)

The search writes this schema (tune_as.engine, tune_as.tracking.tracker) and the report reads it
(tune_as.report); neither spells a tag, an artifact or a file name of its own. docs/architecture.md
("MLflow schema") shows it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# -- MLflow tags ----------------------------------------------------------------------------------------
ROLE = "tune_as.role"  # one of the ROLE_* values below
TASK = "tune_as.task"
LOSS = "tune_as.loss"
TRIAL = "tune_as.trial_id"  # Ray's trial id: a restored trial finds its run again
SEARCH = "tune_as.search_id"  # the search (or confirmation batch) a run belongs to
METRIC = "tune_as.metric"  # the selection metric, e.g. "val_accuracy"
MODE = "tune_as.mode"  # "max"
LAST_STEP = "tune_as.last_step"  # the last metric step logged (dedupes replays after a restart)
ERROR = "tune_as.error"
NODE = "tune_as.node_id"
STOPPED_EARLY = "tune_as.stopped_early"  # "true" on a trial early stopping cut before its last epoch
# a child run's searched setting, as the answer prints it ("delta=0.3, warmup_r=0.1")
SETTING = "tune_as.setting"
# a search trial's Optuna trial: its study and number (that trial names its Ray trial and run: RAY_TRIAL_ATTR)
OPTUNA_STUDY, OPTUNA_TRIAL = "tune_as.optuna_study", "tune_as.optuna_trial"
OPTUNA_STORAGE = "tune_as.optuna_storage"  # on a search's parent run: its studies' database
PURPOSE = "tune_as.purpose"  # on a parent run that only holds confirmations
EXPERIMENTS = "tune_as.experiments"  # on a report run: the experiments it read
ORPHANED = "tune_as.orphaned"
# on a search's parent run: what in the data could mislead (leakage, ...)
DATA_WARNINGS = "tune_as.data_warnings"
PARENT = "mlflow.parentRunId"  # MLflow's own nesting tag
# a run's Description in the MLflow UI: on a search's parent run, its answer's table
NOTE = "mlflow.note.content"
# MLflow 3 opens an experiment in its GenAI view (traces) unless this experiment tag says it holds model runs;
# from MLflow 3.17 the browser's own choice wins over the tag, and only a page address (`ui_page`) opens the
# runs table
EXPERIMENT_KIND, MODEL_RUNS = "mlflow.experimentKind", "custom_model_development"
# An experiment tag per saved view of the MLflow UI's runs table (its "Views" menu; the page address names one
# with `?viewStateShareKey=<key>`): tune_as.tracking.views writes a search's
VIEW_TAG_PREFIX = "mlflow.sharedViewState."
# On a search's parent run, from its answer (tune_as.results.answer.summary): tags tune_as.winner,
# tune_as.best_set and tune_as.verdict.<loss>; metrics delta_<loss>, delta_low_<loss>, delta_high_<loss>
# (points).
ANSWER_TAG_PREFIX = "tune_as."

ROLE_SEARCH, ROLE_TRIAL, ROLE_CONFIRMATION, ROLE_REPORT = "search", "trial", "confirmation", "report"

# -- metrics ----------------------------------------------------------------------------------------------
# A child run logs its task's metrics as fractions (what the search and the report read) and, for a person
# reading the MLflow UI, the headline ones (`best_val_<m>`, `test_<m>`) again in percent, as the answer prints
# them: `best_val_accuracy_pct` = 93.21 beside `best_val_accuracy` = 0.93206...
PERCENT_SUFFIX = "_pct"
HEADLINE_PREFIXES = ("best_val_", "test_")


def with_percent(metrics: dict[str, Any]) -> dict[str, Any]:
    """A result's metrics and, for each headline metric (`best_val_<m>`, and `test_<m>` where the task scores
    the test split), its copy in percent to two decimals (the answer's points: a test item of digits is 0.28
    points)."""
    tasks = {k.removeprefix("best_val_") for k in metrics
             if k.startswith("best_val_") and not k.endswith(PERCENT_SUFFIX)}
    copies = {f"{prefix}{m}{PERCENT_SUFFIX}": round(100 * float(v), 2)
              for prefix in HEADLINE_PREFIXES for m in tasks
              if isinstance(v := metrics.get(prefix + m), (int, float)) and not isinstance(v, bool)}
    return {**metrics, **copies}


def fractions(metrics: dict[str, float]) -> dict[str, float]:
    """A run's metrics as the search reported them: the copies in percent (`with_percent`) left out, so a
    reader of `test_*` or of every metric sees what it saw before they were logged."""
    return {k: v for k, v in metrics.items()
            if not (k.endswith(PERCENT_SUFFIX) and k.startswith(HEADLINE_PREFIXES))}


# -- artifacts --------------------------------------------------------------------------------------------
PMARGIN_FILE = "pmargin.npy"  # p_t - max p_i on the test split, of the best-validation model (Figure 4)
RANKING_MD, RANKING_CSV = "ranking.md", "ranking.csv"  # the search's final answer, on its parent run
ANSWER_PNG = "answer.png"  # the answer as a forest plot (tune_as.results.forest), on the parent run
ANSWER_JSON = "answer.json"  # the answer's record (tune_as.results.answer): what the report replays
# its cost: parent run metrics
SEARCH_EPOCHS, CONFIRM_EPOCHS = "compute_search_epochs", "compute_confirm_epochs"

# -- the search's folder: <storage_path>/<name>/ ----------------------------------------------------------
SEARCH_STATE_FILE = "tune_as_search.json"  # what the search was started with (resume reads it)
OPTUNA_DB = "optuna.db"  # one Optuna study per loss, named STUDY_NAME
NAME_LOCK = ".tune_as.lock"  # held by the process that runs the search


def search_states(storage: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every search folder under `storage` with its saved state (unreadable ones are skipped): how the
    search's `--resume` and the report's Optuna look-up find searches."""
    found = []
    for path in storage.glob(f"*/{SEARCH_STATE_FILE}"):
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(state, dict):
            found.append((path.parent, state))
    return found


def study_name(prefix: str, loss: str) -> str:
    return f"{prefix}-{loss}"


def optuna_url(search_dir: Path) -> str:
    return f"sqlite:///{search_dir / OPTUNA_DB}"


# An Optuna trial's user attributes that name its Ray trial (its MLflow runs carry tag TRIAL with the same id)
# and its MLflow run (a search trial's run name: `<loss>_<number>`)
RAY_TRIAL_ATTR, RUN_NAME_ATTR = "ray_trial_id", "mlflow_run_name"


def sqlite_file(uri: str) -> Path | None:
    """The database file an `sqlite:///` store URI names (its query dropped); None for another store or an
    in-memory one."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri.removeprefix("sqlite:///").split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


def view_key(search_id: str, grouped: bool = False) -> str:
    """The key of a search's saved view of the runs table (`VIEW_TAG_PREFIX` + key on its experiment): its
    runs, or (`grouped`) its confirmation runs by loss."""
    return f"{search_id}-by-loss" if grouped else search_id


def ui_page(experiment_id: str, view: str) -> str:
    """The MLflow UI's runs table of an experiment in its saved view `view`, as a page address after the
    server's. The runs page is named (an experiment's own address opens MLflow 3.17's GenAI overview in a
    browser that has not chosen "Model training"); `workflowType=machine_learning` would choose it for this
    page only, and a 100-column terminal has no room for it."""
    return f"#/experiments/{experiment_id}/runs?viewStateShareKey={view}"


def ui_line(shown_uri: str, experiment_id: str, view: str) -> str:
    """Where a person sees a search's runs: the MLflow UI's runs table of its experiment, in the search's
    saved view `view` (the parent run holds the answer). `shown_uri` is the store without its password: a
    server's address, or a store `mlflow ui` serves."""
    page = ui_page(experiment_id, view)
    if shown_uri.startswith(("http://", "https://")):
        return f"MLflow UI: {shown_uri.rstrip('/')}/{page}"
    prefix = "sqlite:///"
    if shown_uri.startswith(prefix) and Path(shown_uri[len(prefix):]).is_relative_to(Path.cwd()):
        # as a person types it
        shown_uri = prefix + str(Path(shown_uri[len(prefix):]).relative_to(Path.cwd()))
    return f"MLflow UI: mlflow ui --backend-store-uri {shown_uri}\n  then open http://127.0.0.1:5000/{page}"
