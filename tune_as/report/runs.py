"""The report's reads from MLflow: the client, experiments by name, a role's runs, metric histories."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tune_as.errors import UserError
from tune_as.results.selection import TrialRun
from tune_as.tracking import schema
from tune_as.tracking.client import TrackingUnusable, open_client, redact_uri
from tune_as.tracking.schema import LOSS, METRIC, PARENT, ROLE, STOPPED_EARLY, TASK

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run


def connect(uri: str) -> MlflowClient:
    """A client for `uri`, opened by tracking.open_client (a password in the URI is sent, never printed; no
    per-run links from MLflow), or a UserError in seconds when nothing usable answers there."""
    path = schema.sqlite_file(uri)  # an SQLite file that is not there is not created by reading it
    if path is not None and not path.is_file():
        raise UserError(f"expected an MLflow SQLite store at {uri}, received: no such file")
    try:
        return open_client(uri)
    except TrackingUnusable as exc:
        kind = "server" if uri.startswith(("http://", "https://")) else "store"
        raise UserError(f"expected a reachable MLflow tracking {kind} at {exc.shown}, "
                        f"received: {exc.reason}") from None


def experiment_ids(client: MlflowClient, names: Sequence[str], uri: str) -> dict[str, str]:
    """Experiment id -> name, for the names given on the command line."""
    found = {}
    for name in names:
        exp = client.get_experiment_by_name(name)
        if exp is None or exp.lifecycle_stage == "deleted":
            existing = sorted(e.name for e in client.search_experiments(max_results=50))
            raise UserError(f"expected an MLflow experiment named {name!r} at {redact_uri(uri)} "
                            f"(existing: {', '.join(existing) or 'none'}), received no such experiment")
        found[exp.experiment_id] = exp.name
    return found


def search_all(client: MlflowClient, ids: Sequence[str], role: str) -> list[Run]:
    runs: list[Run] = []
    token = None
    while True:
        page = client.search_runs(list(ids), f"tags.`{ROLE}` = '{role}'", max_results=1000, page_token=token)
        runs += list(page)
        token = page.token
        if not token:
            return runs


def history(client: MlflowClient, run_id: str, keys: Sequence[str]) -> dict[str, list[tuple[int, float]]]:
    out = {}
    for key in keys:
        points = sorted((m.step, m.timestamp, m.value) for m in client.get_metric_history(run_id, key))
        out[key] = list({s: v for s, _, v in points}.items())  # a re-logged step keeps its latest value
    return out


def trial_runs(client: MlflowClient, ids: Sequence[str], role: str, notes: list[str]) -> list[TrialRun]:
    """The FINISHED runs with tag tune_as.role=role; FAILED, KILLED and RUNNING ones are counted in a note."""
    runs, skipped = [], 0
    for run in search_all(client, ids, role):
        tags, metrics = run.data.tags, run.data.metrics
        metric = tags.get(METRIC, "").removeprefix("val_")
        if run.info.status != "FINISHED" or not metric:
            skipped += 1
            continue
        best = metrics.get(f"best_val_{metric}")
        if best is None:
            points = history(client, run.info.run_id, [f"val_{metric}"])[f"val_{metric}"]
            best = max((v for _, v in points if not math.isnan(v)), default=math.nan)
        if math.isnan(best):  # no evaluation point, or a diverged run: it must not poison a setting's mean
            skipped += 1
            continue
        runs.append(TrialRun(run.info.run_id, tags.get(TASK, run.data.params.get("task", "")),
                             tags.get(LOSS, run.data.params.get("loss", "")), dict(run.data.params), metric,
                             best, schema.fractions(dict(metrics)), run.info.start_time or 0,
                             run.info.experiment_id, tags.get(PARENT, ""), tags.get(STOPPED_EARLY) == "true"))
    if skipped:
        notes.append(f"{skipped} {role} run(s) not FINISHED or without a finite validation metric "
                     "were left out")
    return runs
