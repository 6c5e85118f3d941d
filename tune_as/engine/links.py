"""A search trial's three records, linked both ways: its Ray trial (id), its Optuna trial (study and number)
and its MLflow run (name; tag `tune_as.trial_id` = the Ray trial id).

The searcher marks each Optuna trial it asks with its Ray trial's id (`mark`, user attribute
`schema.RAY_TRIAL_ATTR`). When the trial's MLflow run opens, `OptunaLinks.tags` finds that Optuna trial again,
adds the run's name to it (`schema.RUN_NAME_ATTR`: optuna-dashboard shows both) and returns the tags that name
the study and trial number on the run (`schema.OPTUNA_STUDY`, `schema.OPTUNA_TRIAL`). The look-up goes through
the study's database, not the searcher's memory: a resumed search's callback is Ray's unpickled copy, with no
reference to the restored searcher.
"""

from __future__ import annotations

import contextlib
from typing import Any

import optuna

from tune_as.tracking import schema


def mark(trial: optuna.trial.Trial, ray_trial_id: str) -> None:
    """Name the Ray trial an Optuna trial was asked for."""
    trial.set_user_attr(schema.RAY_TRIAL_ATTR, ray_trial_id)


class OptunaLinks:
    """The Optuna side of a search's trials (its studies' storage and names), as the MLflow callback needs it.
    Pickled with Ray's callbacks: the storage is opened again after unpickling."""

    def __init__(self, storage_url: str, study_prefix: str) -> None:
        self.storage_url, self.study_prefix = storage_url, study_prefix
        self._storage: optuna.storages.RDBStorage | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_storage": None}

    def storage(self) -> optuna.storages.RDBStorage:
        if self._storage is None:
            self._storage = optuna.storages.RDBStorage(self.storage_url)
        return self._storage

    def tags(self, ray_trial_id: str, loss: str, run_name: str) -> dict[str, str]:
        """The MLflow tags naming the Optuna trial asked for `ray_trial_id` (and `run_name` noted on that
        trial), or none when no trial of the loss's study names it (a search resumed from before these
        links)."""
        study = schema.study_name(self.study_prefix, loss)
        storage = self.storage()
        try:
            study_id = storage.get_study_id_from_name(study)
        except KeyError:
            return {}
        found = next((t for t in storage.get_all_trials(study_id, deepcopy=False)
                      if t.user_attrs.get(schema.RAY_TRIAL_ATTR) == ray_trial_id), None)
        if found is None:
            return {}
        if found.user_attrs.get(schema.RUN_NAME_ATTR) != run_name:
            # a trial that ended before a driver restart is told already: it keeps what it has
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                storage.set_trial_user_attr(storage.get_trial_id_from_study_id_trial_number(
                    study_id, found.number), schema.RUN_NAME_ATTR, run_name)
        return {schema.OPTUNA_STUDY: study, schema.OPTUNA_TRIAL: str(found.number)}
