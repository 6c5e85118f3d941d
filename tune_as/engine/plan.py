"""Planning a search: resolve the request into one base trial config, a search space and prepared data.
No Ray here and nothing written but the data cache, so every bad input fails before a folder or a run exists.

Where a setting comes from, highest first: `--set KEY=VALUE`; the CLI's own options (`--max-epochs`,
`--max-length`, `--backbone`, ...); `--smoke`; the head defaults of `--encoder frozen` (FROZEN_HEAD, below);
the search space's `fixed`; the task's defaults (the paper's Table 5); the settings classes' field defaults.
The result is one `DataSettings` (the data, prepared once) and one base `TrialSettings` (what every trial
starts from; a loss's `fixed`, `paper` and searched parameters change only trial settings).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tune_as.engine.checks import (
    cache_dir,
    check_losses,
    check_one_step,
    check_request,
    check_settings,
    check_storage,
    setting_values,
)
from tune_as.engine.request import RESULT_OPTIONS, SearchRequest
from tune_as.engine.resume import check_same_search, read_state, resumed
from tune_as.engine.state import (
    new_token,
    search_experiment,
)
from tune_as.errors import UserError, first_line
from tune_as.paths import (
    absolute_sqlite,
    check_tracking_store,
    resolved,
)
from tune_as.settings import DATA_FIELDS, TRIAL_FIELDS, DataSettings, TrialSettings
from tune_as.space.overrides import check_overrides
from tune_as.space.search_space import (
    LossSpace,
    SearchSpace,
    default_space_path,
    load_search_space,
)
from tune_as.tasks import PreparedData, Task, build_task
from tune_as.tasks.backbones import MINILM, TINY
from tune_as.tasks.sources import hub_offline

# --smoke: a tiny random backbone and little data, so the whole pipeline runs in well under a minute.
SMOKE: dict[str, Any] = {"backbone": "tiny", "max_train_samples": 256, "max_eval_samples": 128,
                         "max_length": 32, "epochs": 2.0, "batch_size": 32, "lr": 1e-3}
SMOKE_TRIALS = 2
# --encoder frozen trains a head from scratch on cached features: the fine-tuning lr of Table 5 (2e-5) is far
# too small for it (clinc_oos, 3 epochs: 47.6% at 2e-5 against 85.7% at 1e-3; docs/results.md).
FROZEN_HEAD: dict[str, Any] = {"lr": 1e-3}


@dataclass(frozen=True)
class SearchPlan:
    """Everything resolved and validated before anything is written."""

    request: SearchRequest  # after a resume: the saved request, with this process's runtime options
    task: Task
    space: SearchSpace
    data_settings: DataSettings  # the data every trial trains on, prepared once
    base: TrialSettings  # the settings every trial starts from (its loss is the first of the search's)
    data: PreparedData
    name: str
    search_dir: Path
    experiment: str
    search_id: str
    token: str | None = None  # the name Ray knows the search's Tune experiments by (engine.state.new_token)

    @property
    def experiment_dir(self) -> Path:
        """The search's own Tune experiment (engine.state.search_experiment)."""
        return search_experiment(self.search_dir, self.token)

    @property
    def losses(self) -> list[str]:
        return list(self.space.losses)

    @property
    def metric(self) -> str:
        """The task metric that selects, e.g. "accuracy"."""
        return self.task.metrics[0]

    @property
    def confirming(self) -> bool:
        return bool(self.request.confirm or self.request.race)

    @property
    def baseline(self) -> str:
        from tune_as.results.ranking import baseline_for

        return baseline_for(self.task.kind, self.request.baseline)

    def quota(self, loss: str) -> int:
        """Search trials of `loss`. A loss with nothing to tune gets one when the answer is confirmed: more
        would only change its seed, and confirmation brings new seeds anyway (its budget goes there). A finite
        space gets at most one trial per setting: its trials share a seed, so a second would be the same run
        (the searcher never trains a setting twice)."""
        space = self.space.losses[loss]
        if self.confirming and not space.params:
            return 1
        size = space.size()
        return self.search_trials if size is None else min(self.search_trials, size)

    def quota_notes(self) -> list[str]:
        """One line per loss whose finite space holds fewer settings than the search's trials per loss."""
        return [f"{loss}: {self.quota(loss)} search trials, every setting of its space once (a setting is "
                "never trained twice)." for loss in self.losses
                if self.space.losses[loss].params and self.quota(loss) < self.search_trials]

    @property
    def search_trials(self) -> int:
        return search_trials(self.request, self.space, self.base)

    @property
    def n_trials(self) -> int:
        return sum(self.quota(loss) for loss in self.losses)

    def max_epochs(self, loss: str) -> float:
        return max_epochs(self.space, self.base, loss)


def max_epochs(space: SearchSpace, base: TrialSettings, loss: str) -> float:
    """The most epochs a trial of `loss` can train: its own `fixed`/searched epochs, else the base's.
    Early stopping's max_t and "completed" are judged per trial against the trial's own epochs."""
    return max(setting_values(space, base, loss, "epochs"))


def search_trials(r: SearchRequest, space: SearchSpace, base: TrialSettings) -> int:
    """Trials per loss with parameters: --trials-per-loss (or the space's) if given, else under --budget what
    the budget pays after the first confirmation round (tune_as.results.budget; BudgetTooSmall when nothing
    fits)."""
    if r.budget is None:
        return space.trials_per_loss
    from tune_as.results.budget import search_trials as split
    from tune_as.results.racing import FIRST_LOOK

    losses = list(space.losses)
    # at most these are confirmed
    confirmed = losses if r.confirm_top is None else losses[: r.confirm_top + 1]
    asked = space.trials_per_loss if r.trials_per_loss or r.smoke else None  # else: what the budget pays
    return split(r.budget, {loss: max_epochs(space, base, loss) for loss in losses},
                 [loss for loss in losses if space.losses[loss].params],
                 confirmed if (r.confirm or r.race) else [],
                 r.confirm or (FIRST_LOOK if r.race else 0), asked)

def build(name: str, task_args: tuple[tuple[str, str], ...] = ()) -> Task:
    try:
        return build_task(name, **dict(task_args))
    except (ValueError, TypeError) as exc:
        raise UserError(str(exc)) from None


def state_of(plan: SearchPlan) -> dict[str, Any]:
    """What the search folder keeps: enough to resume from `--name` and `--storage-path` alone."""
    r = plan.request
    saved = {k: getattr(r, k) for k in RESULT_OPTIONS}
    saved = {k: (str(v) if isinstance(v, Path) else v) for k, v in saved.items()}
    from tune_as.tracking.client import redact_uri

    made = (read_state(plan.search_dir) or {}).get("folder") if r.resume else str(plan.search_dir)
    return {"search_id": plan.search_id, "token": plan.token, "task": plan.task.name,
            "fingerprint": plan.space.fingerprint(), "losses": plan.losses, "experiment": plan.experiment,
            "request": saved, "finished": False,
            "folder": made,  # the folder Ray's pickled state names: a resume elsewhere is refused (resume.py)
            "mlflow_uri": redact_uri(r.mlflow_uri) if r.mlflow_uri else None,  # never a password
            "mlflow_uri_redacted": r.mlflow_uri is not None and redact_uri(r.mlflow_uri) != r.mlflow_uri}


def resolve_settings(r: SearchRequest, task: Task, space: SearchSpace) -> tuple[DataSettings, TrialSettings]:
    """The search's data settings and base trial settings, by the precedence in this module's docstring."""
    d = task.defaults
    settings: dict[str, Any] = {"epochs": d.epochs, "batch_size": d.batch_size, "lr": d.lr,
                                "max_length": d.max_length, "backbone": d.backbone}
    settings.update(space.fixed)
    if r.encoder == "frozen" and task.uses_backbone:
        settings.update(FROZEN_HEAD)
    if r.smoke:
        settings.update(SMOKE)
    cli = {"epochs": r.max_epochs, "max_length": r.max_length, "backbone": r.backbone,
           "max_train_samples": r.max_train_samples, "max_eval_samples": r.max_eval_samples,
           "eval_every_steps": r.eval_every_steps}
    settings.update({k: v for k, v in cli.items() if v is not None})
    settings.update(space.overrides)
    if not task.uses_backbone:  # image tasks have no tokenizer: their max_length is meaningless
        settings.pop("max_length")
    cache = cache_dir(r)
    data = {k: v for k, v in settings.items() if k in DATA_FIELDS}
    trial = {k: v for k, v in settings.items() if k in TRIAL_FIELDS}
    try:
        data_settings = DataSettings(**{**data, "task": task.name, "data_dir": r.data_dir,
                                        "encoder": r.encoder, "encode_precision": r.encode_precision,
                                        "seed": r.seed, "cache_dir": cache})
        base = TrialSettings(**{**trial, "loss": next(iter(space.losses)), "seed": r.seed})
    except (TypeError, ValueError) as exc:
        raise UserError(f"settings: {first_line(exc)}") from None
    return data_settings, base


def prepare(spec: DataSettings, task: Task) -> PreparedData:
    """The trials' data, prepared once on the driver (and cached on disk). Loader errors are the user's."""
    from tune_as.tasks import prepare as prepare_data

    if spec.data_dir is not None and not spec.data_dir.exists():
        raise UserError(f"--data-dir: expected an existing folder, got {spec.data_dir} (not found)")
    hub_data = spec.data_dir is None and task.hub is not None
    hub_model = (task.uses_backbone and spec.backbone not in (MINILM, TINY)
                 and not Path(spec.backbone).expanduser().exists())
    offline = hub_offline() if hub_data or hub_model else None
    try:
        return prepare_data(task, spec)
    except (ValueError, FileNotFoundError, KeyError, OSError) as exc:  # OSError: the hub, missing model files
        if offline is None and not isinstance(exc, OSError):
            raise UserError(first_line(exc)) from None
        raise UserError(f"could not load {task.name}'s data or backbone {spec.backbone!r}: expected a "
                        "reachable Hugging Face hub or local files (--data-dir DIR, --backbone "
                        "minilm|tiny|PATH), got "
                        + (offline or f"{type(exc).__name__}: {first_line(exc)[:300]}")) from None


def plan_search(r: SearchRequest) -> SearchPlan:
    """One pass, top to bottom: the request and its folders checked, the saved search restored (--resume), the
    task and its search space, the trial settings resolved and checked, the data prepared. Writes nothing but
    the data cache; every refusal is a UserError naming the option."""
    storage = check_request(r)
    state, name = None, ""
    if r.resume:
        r, state, name = resumed(r, storage)
    r = dataclasses.replace(r, mlflow_uri=absolute_sqlite(r.mlflow_uri))
    check_tracking_store(r.mlflow_uri or "")
    task, space = task_and_space(r)
    if state is not None:
        check_same_search(state, space.fingerprint(), list(space.losses), r, storage / name)
    else:
        name = r.name or f"{task.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        if (storage / name).exists():
            raise UserError(f"--name: expected a new search name, but {storage / name} exists; "
                            "add --resume to continue it")
    data_settings, base = resolve_settings(r, task, space)
    check_settings(r, task, space, data_settings, base)
    try:  # a budget that cannot pay for the answer is refused before the data is prepared
        search_trials(r, space, base)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    data = prepare(data_settings, task)
    space.check_classes(data.num_labels)
    check_one_step(space, base, len(data.train))
    return SearchPlan(r, task, space, data_settings, base, data, name, storage / name,
                      r.experiment or task.name, state["search_id"] if state else name,
                      state.get("token") if state else new_token())


def task_and_space(r: SearchRequest) -> tuple[Task, SearchSpace]:
    """The task and its search space as the request shapes it: --losses, --set, --trials-per-loss, --smoke."""
    task = build(r.task, r.task_args)
    space = load_search_space(r.search_space or default_space_path(task.name, task.kind), task.kind)
    if space.task != task.name:
        raise UserError(f"{space.path}: task: expected {task.name!r} (the --task), got {space.task!r}")
    if r.losses:
        check_losses(r.losses, task.kind)
        space = space.restrict(list(r.losses))
    overrides = check_overrides(dict(r.overrides), space.fixed)
    if overrides:
        space = space.with_overrides(overrides)
    if r.trials_per_loss or r.smoke:
        space = dataclasses.replace(space, trials_per_loss=int(r.trials_per_loss or SMOKE_TRIALS))
    return task, space


def plan_confirmation(r: SearchRequest, data_settings: DataSettings,
                      configs: list[TrialSettings]) -> SearchPlan:
    """A plan that runs given trial settings on the data `data_settings` describes (the report's `--confirm`):
    the data is prepared from them, no search space is read and nothing is re-planned. `r` gives where to
    track and run (storage, MLflow, Ray) and the task's options (`--task-arg`)."""
    r.check()
    storage = resolved(r.storage_path, "--storage-path")
    check_storage(storage)
    task = build(data_settings.task, r.task_args)
    losses = sorted({c.loss for c in configs})
    check_losses(tuple(losses), task.kind)
    space = SearchSpace(Path("-"), task.name, 1, {}, {loss: LossSpace(loss, (), {}, None) for loss in losses})
    data_settings = dataclasses.replace(data_settings, cache_dir=cache_dir(r))
    data = prepare(data_settings, task)
    name = r.name or f"{task.name}-confirm-{os.getpid()}-{len(configs)}"
    if (storage / name).exists():
        raise UserError(f"--name: expected a new name for the confirmation runs, but {storage / name} exists")
    r = dataclasses.replace(r, task=task.name, mlflow_uri=absolute_sqlite(r.mlflow_uri), asha=False)
    return SearchPlan(r, task, space, data_settings, configs[0], data, name, storage / name,
                      r.experiment or task.name, name)


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """The code's commit, logged with every run (one `git` call per process, not one per trial)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
