"""Ray Tune + Optuna + ASHA: the search engine. The only module (with the CLIs) that imports Ray.

Design: ONE Tuner runs every loss of the search, and `PerLossSearcher` keeps ONE Optuna study per loss
(TPE, multivariate, seeded, in an SQLite file optuna-dashboard can open). Each loss gets exactly its own trial
budget and TPE models each loss's own parameters, while the cluster stays full across losses (a Tuner per loss
would idle GPUs whenever one loss has fewer pending trials than there are GPUs). The paper's Table 6 setting
of each loss is enqueued first in its study as a warm start.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import math
import os
import pickle
import subprocess
import sys
import time
import zlib
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import ray
from ray import tune
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
from ray.tune.search import ConcurrencyLimiter, Searcher

from tune_as import tracking
from tune_as.config import LOSS_PREFIX, TrialConfig
from tune_as.errors import UserError, first_line, tcp_unreachable
from tune_as.search_space import SearchSpace, config_key, default_space_path, load_search_space
from tune_as.trainable import PMARGIN_FILE, run_trial

log = logging.getLogger(__name__)
STATE_FILE = "tune_as_search.json"
SMOKE: dict[str, Any] = {"backbone": "tiny", "max_train_samples": 256, "max_eval_samples": 128, "max_length": 32, "epochs": 2.0,
         "batch_size": 32, "lr": 1e-3, "trials_per_loss": 2}


@dataclass(frozen=True)
class SearchRequest:
    task: str
    losses: tuple[str, ...] | None = None
    trials_per_loss: int | None = None
    max_epochs: float | None = None
    backbone: str | None = None
    encoder: str = "finetune"
    max_length: int | None = None
    data_dir: Path | None = None
    max_train_samples: int | None = None
    max_eval_samples: int | None = None
    task_args: tuple[tuple[str, str], ...] = ()
    search_space: Path | None = None
    seed: int = 0
    gpus_per_trial: float | None = None
    cpus_per_trial: float = 1.0
    max_concurrent: int | None = None
    eval_every_steps: int | None = None
    address: str | None = None
    storage_path: Path = Path("tune_as_results")
    mlflow_uri: str | None = None
    experiment: str | None = None
    name: str | None = None
    resume: bool = False
    max_failures: int = 2
    grace_period: float = 1.0
    reduction_factor: float = 3.0
    asha: bool = True
    dashboard_host: str = "127.0.0.1"
    smoke: bool = False
    cache_dir: Path | None = None
    verbose: int = 1

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SearchRequest:
        losses = tuple(x.strip() for x in args.losses.split(",") if x.strip()) if args.losses else None
        task_args = []
        for item in args.task_arg or []:
            if "=" not in item:
                raise UserError(f"--task-arg: expected KEY=VALUE, got {item!r}")
            key, value = item.split("=", 1)
            task_args.append((key.strip(), value.strip()))
        return cls(task=args.task, losses=losses, trials_per_loss=args.trials_per_loss, max_epochs=args.max_epochs,
                   backbone=args.backbone, encoder=args.encoder, max_length=args.max_length, data_dir=args.data_dir,
                   max_train_samples=args.max_train_samples, task_args=tuple(task_args),
                   search_space=args.search_space, seed=args.seed, gpus_per_trial=args.gpus_per_trial,
                   cpus_per_trial=args.cpus_per_trial, max_concurrent=args.max_concurrent,
                   eval_every_steps=args.eval_every_steps, address=args.address, storage_path=args.storage_path,
                   mlflow_uri=args.mlflow_uri, experiment=args.experiment, name=args.name, resume=args.resume,
                   max_failures=args.max_failures, grace_period=args.grace_period,
                   reduction_factor=args.reduction_factor, asha=not args.no_asha,
                   dashboard_host=args.dashboard_host, smoke=args.smoke)


@dataclass
class SearchPlan:
    """Everything resolved and validated before anything is written (no run, no folder on bad input)."""

    request: SearchRequest
    task: Any
    space: SearchSpace
    base: dict[str, Any]  # constant trial settings, flat config keys
    data: Any
    name: str
    exp_dir: Path
    metric: str  # task metric that selects, e.g. "accuracy"
    experiment: str
    search_id: str

    @property
    def losses(self) -> list[str]:
        return list(self.space.losses)


# -- planning -------------------------------------------------------------------------------------------
def _positive(name: str, value: float | None, minimum: float = 0.0, strict: bool = True) -> None:
    if value is not None and (value <= minimum if strict else value < minimum):
        raise UserError(f"{name}: expected a number {'>' if strict else '>='} {minimum:g}, got {value}")


def _check_numbers(r: SearchRequest) -> None:
    _positive("--trials-per-loss", r.trials_per_loss)
    _positive("--max-epochs", r.max_epochs)
    _positive("--cpus-per-trial", r.cpus_per_trial)
    _positive("--gpus-per-trial", r.gpus_per_trial, strict=False)
    _positive("--max-concurrent", r.max_concurrent)
    _positive("--max-failures", r.max_failures, strict=False)
    _positive("--grace-period", r.grace_period)
    _positive("--eval-every-steps", r.eval_every_steps)
    _positive("--max-length", r.max_length, 3)
    _positive("--max-train-samples", r.max_train_samples)
    if r.reduction_factor <= 1:
        raise UserError(f"--reduction-factor: expected a number > 1, got {r.reduction_factor}")


def _build_task(r: SearchRequest) -> Any:
    from tune_as.tasks import build_task

    try:
        return build_task(r.task, **dict(r.task_args))
    except (ValueError, TypeError) as exc:
        raise UserError(str(exc)) from None


def _check_losses(names: tuple[str, ...], kind: str) -> None:
    from tune_as.losses import LOSSES

    for name in names:
        if name not in LOSSES:
            raise UserError(f"--losses: unknown loss {name!r}; expected some of {sorted(LOSSES)}")
        if kind not in LOSSES[name].kinds:
            applicable = sorted(k for k, cls in LOSSES.items() if kind in cls.kinds)
            raise UserError(f"--losses: {name!r} does not apply to {kind} tasks; expected some of {applicable}")


def _latest_search(storage: Path, task: str) -> str | None:
    found = sorted(storage.glob(f"{task}-*/{STATE_FILE}"), key=lambda p: p.stat().st_mtime)
    return found[-1].parent.name if found else None


def plan_search(r: SearchRequest) -> SearchPlan:
    """Validate the request, load the space and prepare (cached) data. Writes nothing but the data cache."""
    _check_numbers(r)
    if r.address:
        _check_address(r.address)
    task = _build_task(r)
    space = load_search_space(r.search_space or default_space_path(task.name), task.kind)
    if space.task != task.name:
        raise UserError(f"{space.path}: task: expected {task.name!r} (the --task), got {space.task!r}")
    if r.losses:
        _check_losses(r.losses, task.kind)
        space = space.restrict(list(r.losses))
    storage = r.storage_path.expanduser().resolve()
    name = r.name or (_latest_search(storage, task.name) if r.resume else None)
    if r.resume and name is None:
        raise UserError(f"--resume: expected a previous {task.name} search under {storage}, found none")
    name = name or f"{task.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    exp_dir = storage / name
    state = _read_state(exp_dir)
    if r.resume:
        if state is None:
            raise UserError(f"--resume: expected a search to resume at {exp_dir}, found nothing there")
        if state["fingerprint"] != space.fingerprint() or state["losses"] != list(space.losses):
            raise UserError(f"--resume: the search space changed since {name} started (expected fingerprint "
                            f"{state['fingerprint']} for losses {state['losses']}, got {space.fingerprint()} "
                            f"for {list(space.losses)}); start a new search instead")
    elif exp_dir.exists():
        raise UserError(f"--name: expected a new search name, but {exp_dir} exists; add --resume to continue it")
    smoke = SMOKE if r.smoke else {}
    defaults = task.defaults
    base: dict[str, Any] = {
        "task": task.name,
        "epochs": float(r.max_epochs or smoke.get("epochs") or space.fixed.get("epochs", defaults.epochs)),
        "batch_size": int(smoke.get("batch_size") or space.fixed.get("batch_size", defaults.batch_size)),
        "lr": float(smoke.get("lr") or space.fixed.get("lr", defaults.lr)),
        "max_length": int(r.max_length or smoke.get("max_length") or space.fixed.get("max_length", defaults.max_length)),
        "backbone": r.backbone or smoke.get("backbone") or defaults.backbone,
        "encoder": r.encoder,
        "seed": r.seed,
        "eval_every_steps": r.eval_every_steps,
        "data_dir": str(r.data_dir) if r.data_dir else None,
        "max_train_samples": r.max_train_samples or smoke.get("max_train_samples"),
        "max_eval_samples": r.max_eval_samples or smoke.get("max_eval_samples"),
    }
    base.update({k: v for k, v in space.fixed.items() if k not in base})
    if r.trials_per_loss or smoke:
        space = dataclasses.replace(space, trials_per_loss=int(r.trials_per_loss or smoke["trials_per_loss"]))
    data = _prepare(task, base, r)
    space.check_classes(data.num_labels)
    metric = task.metrics[0]
    experiment = r.experiment or task.name
    search_id = state["search_id"] if state else name
    return SearchPlan(r, task, space, base, data, name, exp_dir, metric, experiment, search_id)


def _prepare(task: Any, base: dict[str, Any], r: SearchRequest) -> Any:
    from tune_as.tasks import DataSpec

    if r.data_dir is not None and not r.data_dir.exists():
        raise UserError(f"--data-dir: expected an existing folder, got {r.data_dir} (not found)")
    cache = r.cache_dir or Path(os.environ.get("TUNE_AS_CACHE", "~/.cache/tune_as")).expanduser()
    # image tasks have no tokenizer: their max_length is meaningless and the spec keeps its default
    length = {"max_length": base["max_length"]} if task.uses_backbone else {}
    spec = DataSpec(task=task.name, data_dir=r.data_dir, backbone=base["backbone"], encoder=base["encoder"],
                    **length, max_train_samples=base["max_train_samples"],
                    max_eval_samples=base["max_eval_samples"], seed=r.seed, cache_dir=cache)
    try:
        return task.prepare(spec)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        raise UserError(first_line(exc)) from None
    except OSError as exc:  # hub unreachable (ConnectionError is an OSError), model files missing, ...
        raise UserError(f"could not load {task.name}'s data or backbone {spec.backbone!r}: expected a reachable "
                        f"Hugging Face hub or local files (--data-dir DIR, --backbone minilm|tiny|PATH), got "
                        f"{type(exc).__name__}: {first_line(exc)[:300]}") from None


def _read_state(exp_dir: Path) -> dict[str, Any] | None:
    path = exp_dir / STATE_FILE
    return json.loads(path.read_text()) if path.is_file() else None


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """The code's commit, logged with every run (one `git` call per process, not one per trial)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


# -- the searcher ---------------------------------------------------------------------------------------
class PerLossSearcher(Searcher):
    """One Optuna study per loss behind one Ray Searcher; losses take turns so each gets its quota."""

    def __init__(self, space: SearchSpace, base: dict[str, Any], storage_url: str, study_prefix: str,
                 metric: str, seed: int) -> None:
        super().__init__(metric=metric, mode="max")
        self.space, self.base, self.storage_url = space, base, storage_url
        self.study_prefix, self.seed = study_prefix, seed
        self.suggested = {loss: 0 for loss in space.losses}
        self.live: dict[str, tuple[str, int]] = {}  # Ray trial id -> (loss, Optuna trial number)
        self._studies: dict[str, optuna.Study] = {}

    def study(self, loss: str) -> optuna.Study:
        if loss not in self._studies:
            sampler = optuna.samplers.TPESampler(seed=self.seed + zlib.crc32(loss.encode()) % 10_000,
                                                 multivariate=True, constant_liar=True)
            study = optuna.create_study(study_name=f"{self.study_prefix}-{loss}", storage=self.storage_url,
                                        direction="maximize", sampler=sampler, load_if_exists=True)
            paper = self.space.losses[loss].paper
            if paper and not study.trials and self.space.losses[loss].params:
                study.enqueue_trial({d.name: paper[d.name] for d in self.space.losses[loss].params if d.name in paper})
            self._studies[loss] = study
        return self._studies[loss]

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:  # type: ignore[override]  # FINISHED is a str
        open_losses = [loss for loss in self.space.losses if self.suggested[loss] < self.space.trials_per_loss]
        if not open_losses:
            return Searcher.FINISHED
        loss = min(open_losses, key=lambda name: self.suggested[name])
        space = self.space.losses[loss]
        trial = self.study(loss).ask()
        params = {config_key(d.name): d.suggest(trial) for d in space.params}
        if not space.params:  # nothing to tune: repeat over seeds, so every loss is "best of N" alike
            params["seed"] = self.base["seed"] + self.suggested[loss]
        self.suggested[loss] += 1
        self.live[trial_id] = (loss, trial.number)
        return {**self.base, **space.constants(), "loss": loss, **params}

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        if trial_id not in self.live:
            return
        loss, number = self.live.pop(trial_id)
        study = self.study(loss)
        if study.get_trials(deepcopy=False)[number].state.is_finished():
            return  # told before a driver restart whose searcher checkpoint predates the tell
        value = None if (error or not result or result.get("error")) else result.get(self.metric)
        state = optuna.trial.TrialState.COMPLETE if value is not None else optuna.trial.TrialState.FAIL
        study.tell(number, value, state=state)

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump({"suggested": self.suggested, "live": self.live}, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            saved = pickle.load(f)
        self.suggested, self.live = saved["suggested"], saved["live"]
        # Optuna trials asked after the last searcher checkpoint belong to no Ray trial: close them.
        known = {(loss, number) for loss, number in self.live.values()}
        for loss in self.space.losses:
            for t in self.study(loss).get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
                if (loss, t.number) not in known:
                    self.study(loss).tell(t.number, state=optuna.trial.TrialState.FAIL)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_studies"] = {}  # studies live in the database, not in pickles
        return state


# -- Ray adapters ---------------------------------------------------------------------------------------
class _RayReporter:
    def __init__(self, fill: tuple[str, ...], loss: str) -> None:
        self.fill, self.loss = fill, loss
        self.node_id = ray.get_runtime_context().get_node_id()

    def report(self, metrics: dict[str, Any], checkpoint_dir: Path) -> None:
        metrics = {**metrics, "node_id": self.node_id}
        if metrics.get("error"):  # Tune needs the selection metrics in every result: a failed trial is worst
            metrics.update({k: 0.0 for k in self.fill if k not in metrics})
        ckpt = tune.Checkpoint.from_directory(str(checkpoint_dir)) if any(checkpoint_dir.iterdir()) else None
        tune.report(metrics, checkpoint=ckpt)
        if os.environ.get("TUNE_AS_FAULT_DIR"):
            _inject_fault(Path(os.environ["TUNE_AS_FAULT_DIR"]), metrics, self.loss)


def _inject_fault(where: Path, metrics: dict[str, Any], loss: str) -> None:
    """Fault injection for the reliability tests; inactive unless TUNE_AS_FAULT_DIR is set. Writes the worker's
    pid to `pid_<trial id>` (so a test can SIGKILL it) and, with TUNE_AS_FAIL_AT_EPOCH=E, raises after a report
    at epoch >= E, at most TUNE_AS_FAIL_TIMES times per trial (default 1), only for loss TUNE_AS_FAIL_LOSS if set."""
    trial_id = tune.get_context().get_trial_id()
    (where / f"pid_{trial_id}").write_text(str(os.getpid()))
    at, only = os.environ.get("TUNE_AS_FAIL_AT_EPOCH"), os.environ.get("TUNE_AS_FAIL_LOSS")
    if not at or metrics.get("epoch", 0) < float(at) or (only and only != loss):
        return
    done = len(list(where.glob(f"fault_{trial_id}_*")))
    if done < int(os.environ.get("TUNE_AS_FAIL_TIMES", "1")):
        (where / f"fault_{trial_id}_{done}").touch()
        raise RuntimeError(f"injected failure {done + 1} (TUNE_AS_FAIL_AT_EPOCH={at})")


def _trainable(config: dict[str, Any], data: Any = None, task: Any = None, fill: tuple[str, ...] = ()) -> None:
    checkpoint = tune.get_checkpoint()
    with checkpoint.as_directory() if checkpoint else nullcontext(None) as restore_dir:
        reporter = _RayReporter(fill, str(config.get("loss")))
        run_trial(config, data, task, reporter, Path(restore_dir) if restore_dir else None)


_ACTIVE: dict[str, tracking.MlflowTracker] = {}  # the driver's tracker; callbacks look it up at call time


class MlflowCallback(tune.Callback):
    """Driver-side bridge from Tune's trial events to `tracking.MlflowTracker`.

    It holds no tracker: Ray pickles the RunConfig's callbacks with the experiment and brings the pickled copy
    back on `Tuner.restore`, so the callback finds the tracker of the driver process it runs in instead."""

    def __init__(self, metric: str, max_epochs: float, role: str = "trial") -> None:
        self.metric, self.max_epochs, self.role = metric, max_epochs, role

    @property
    def tracker(self) -> tracking.MlflowTracker:
        return _ACTIVE["tracker"]

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        config = {**trial.config, "git_commit": git_commit()}
        self.tracker.trial_started(trial.trial_id, config, tags={
            tracking.ROLE: self.role, tracking.TASK: str(trial.config["task"]), tracking.LOSS: str(trial.config["loss"]),
            tracking.METRIC: f"val_{self.metric}"})

    def on_trial_result(self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any) -> None:
        if result.get("error"):
            result = {k: v for k, v in result.items() if not k.startswith(("val_", "best_val_", "test_"))}
        self.tracker.trial_result(trial.trial_id, result)

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        last = trial.last_result or {}
        error = last.get("error")
        tags = {}
        if not error and last.get("epoch", 0) < self.max_epochs - 1e-6:
            tags["tune_as.stopped_early"] = "true"
        self.tracker.trial_ended(trial.trial_id, "FAILED" if error else "FINISHED", error=error,
                                 artifacts=_checkpoint_files(trial, PMARGIN_FILE), tags=tags)

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        message = _trial_error(trial)
        self.tracker.trial_ended(trial.trial_id, "FAILED", error=message, artifacts=_checkpoint_files(trial, PMARGIN_FILE))

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        if self.tracker.pending:
            self.tracker.flush()


def _trial_error(trial: Any) -> str:
    path = getattr(trial, "error_file", None) or ""
    try:
        lines = [ln for ln in Path(path).read_text().splitlines() if ln.strip()]
        return lines[-1] if lines else "trial failed"
    except OSError:
        return "trial failed (no error file)"


def _checkpoint_files(trial: Any, name: str) -> list[Path]:
    checkpoint = getattr(trial, "checkpoint", None)
    if checkpoint is None:
        return []
    path = Path(checkpoint.path) / name
    return [path] if path.is_file() else []


# -- running --------------------------------------------------------------------------------------------
def _check_address(address: str) -> None:
    """Fail in seconds on an unreachable cluster: ray.init would retry for minutes before giving up."""
    if address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"--address: expected 'auto', HOST:PORT or ray://HOST:PORT, got {address!r}")
    reason = tcp_unreachable(host, int(port))
    if reason:
        raise UserError(f"--address: expected a reachable Ray cluster at {address}, got {reason}")


def _init_ray(r: SearchRequest) -> None:
    if r.dashboard_host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: --dashboard-host {r.dashboard_host} makes the Ray dashboard reachable beyond this machine; "
              "token authentication stays on", file=sys.stderr)
    if ray.is_initialized():
        return
    try:
        if r.address:
            ctx = ray.init(address=r.address, log_to_driver=False)
        else:
            ctx = ray.init(include_dashboard=True, dashboard_host=r.dashboard_host, log_to_driver=False)
    except Exception as exc:  # noqa: BLE001 - every failure to connect is the user's to fix
        raise UserError(f"--address: expected a reachable Ray cluster at {r.address!r}, got "
                        f"{type(exc).__name__}: {first_line(exc)[:300]}") from None
    url = getattr(ctx, "dashboard_url", None)
    if url:
        print(f"Ray dashboard: http://{url}  (token auth: the token is in ~/.ray/auth_token locally, or "
              "RAY_AUTH_TOKEN on a cluster; from a laptop: ssh -L 8265:127.0.0.1:8265 HEAD)")


def _resources(r: SearchRequest) -> dict[str, float]:
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    max_gpus = max((n["Resources"].get("GPU", 0.0) for n in nodes), default=0.0)
    gpus = r.gpus_per_trial if r.gpus_per_trial is not None else (1.0 if max_gpus >= 1 else 0.0)
    if gpus > max_gpus:
        raise UserError(f"--gpus-per-trial: expected at most {max_gpus:g} (the most GPUs on any node), got {gpus:g}")
    max_cpus = max((n["Resources"].get("CPU", 0.0) for n in nodes), default=0.0)
    if r.cpus_per_trial > max_cpus:
        raise UserError(f"--cpus-per-trial: expected at most {max_cpus:g} (the most CPUs on any node), got {r.cpus_per_trial:g}")
    return {"cpu": r.cpus_per_trial, "gpu": gpus}


def _concurrency(r: SearchRequest, res: dict[str, float]) -> int:
    if r.max_concurrent:
        return r.max_concurrent
    total = ray.cluster_resources()
    fits = total.get("GPU", 0) / res["gpu"] if res["gpu"] else total.get("CPU", 1) / res["cpu"]
    return max(1, min(8, int(fits)))


def _start(r: SearchRequest, experiment: str, search_id: str, exp_dir: Path) -> tuple[tracking.MlflowTracker, dict[str, float]]:
    """Checks that need the outside world, in order of cost; nothing is written until all pass."""
    tracker = tracking.MlflowTracker(r.mlflow_uri, experiment, search_id)
    tracker.check_reachable()
    _init_ray(r)
    resources = _resources(r)
    exp_dir.mkdir(parents=True, exist_ok=True)
    _ACTIVE["tracker"] = tracker
    return tracker, resources


def run_search(r: SearchRequest) -> dict[str, dict[str, Any]]:
    """Plan, validate, then run the search; returns the best config per loss (by best validation metric)."""
    plan = plan_search(r)
    tracker, resources = _start(r, plan.experiment, plan.search_id, plan.exp_dir)
    if not r.resume:
        (plan.exp_dir / STATE_FILE).write_text(json.dumps({
            "search_id": plan.search_id, "fingerprint": plan.space.fingerprint(), "losses": plan.losses,
            "task": plan.task.name, "request": {k: tracking.redact_uri(str(v)) for k, v in dataclasses.asdict(r).items()}},
            indent=2))
    tracker.start_search(
        params={"task": plan.task.name, "losses": ",".join(plan.losses), "trials_per_loss": plan.space.trials_per_loss,
                "backbone": plan.base["backbone"], "encoder": plan.base["encoder"], "seed": r.seed,
                "git_commit": git_commit(), "search_space": str(plan.space.path)},
        tags={tracking.TASK: plan.task.name, tracking.METRIC: f"val_{plan.metric}", "tune_as.mode": "max"})
    print(f"MLflow: {tracking.redact_uri(tracker.uri)}  experiment {plan.experiment!r}, parent run {tracker.parent_id}")
    print(f"Optuna studies: sqlite:///{plan.exp_dir / 'optuna.db'}  (optuna-dashboard sqlite:///{plan.exp_dir / 'optuna.db'})")
    resume_hint = (f"python -m tune_as.search --task {plan.task.name} --name {plan.name} --resume "
                   f"--storage-path {r.storage_path}")
    if r.resume and tune.Tuner.can_restore(str(plan.exp_dir)):
        tuner = tune.Tuner.restore(str(plan.exp_dir), _trainable_for(plan.task, plan.data, resources, plan.metric),
                                   resume_unfinished=True, resume_errored=True)
    else:
        searcher = PerLossSearcher(plan.space, plan.base, f"sqlite:///{plan.exp_dir / 'optuna.db'}", plan.task.name,
                                   metric=f"best_val_{plan.metric}", seed=r.seed)
        epochs = float(plan.base["epochs"])
        # ASHA compares `epoch` (fractional) against float rungs: its int annotations are narrower than its code
        scheduler = (ASHAScheduler(time_attr="epoch", max_t=epochs, grace_period=min(r.grace_period, epochs),  # type: ignore[arg-type]
                                   reduction_factor=r.reduction_factor) if r.asha else FIFOScheduler())
        tuner = _tuner(r, plan.task, plan.data, plan.name, plan.exp_dir, resources, plan.metric, epochs, "trial",
                       ConcurrencyLimiter(searcher, max_concurrent=_concurrency(r, resources)), scheduler,
                       plan.space.trials_per_loss * len(plan.losses))
    grid = _fit(tuner, tracker, resume_hint, plan.space.trials_per_loss * len(plan.losses))
    return _best_per_loss(grid, plan)


def _trainable_for(task: Any, data: Any, resources: dict[str, float], metric: str) -> Any:
    fill = (f"val_{metric}", f"best_val_{metric}")
    return tune.with_resources(tune.with_parameters(_trainable, data=data, task=task, fill=fill), resources)


def _tuner(r: SearchRequest, task: Any, data: Any, name: str, exp_dir: Path, resources: dict[str, float],
           metric: str, epochs: float, role: str, search_alg: Any, scheduler: Any, num_samples: int) -> tune.Tuner:
    run_config = tune.RunConfig(
        name=name, storage_path=str(exp_dir.parent), callbacks=[MlflowCallback(metric, epochs, role)],
        verbose=r.verbose, failure_config=tune.FailureConfig(max_failures=r.max_failures),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=1))
    return tune.Tuner(_trainable_for(task, data, resources, metric), run_config=run_config, tune_config=tune.TuneConfig(
        metric=f"val_{metric}", mode="max", scheduler=scheduler, search_alg=search_alg, num_samples=num_samples,
        reuse_actors=True))


class SearchInterrupted(KeyboardInterrupt):
    """Ctrl-C: Ray Tune stopped the trials and saved its state; `fit` returned early."""


def _fit(tuner: tune.Tuner, tracker: tracking.MlflowTracker, resume_hint: str, expected: int) -> Any:
    """Run the tuner. Ray Tune swallows Ctrl-C (it checkpoints and returns), so an interruption is recognised
    by trials left open or not finished; their MLflow runs are then closed as KILLED."""
    status = "FAILED"
    try:
        grid = tuner.fit()
        # Ray's own bookkeeping spans driver restarts (the tracker only saw this process's trials)
        interrupted = bool(tracker.unfinished()) or grid.num_terminated + grid.num_errors < expected
        status = "KILLED" if interrupted else "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise SearchInterrupted(resume_hint) from None
    finally:
        tracker.search_ended(status)
    if status == "KILLED":
        raise SearchInterrupted(resume_hint)
    return grid


class _FixedConfigs(Searcher):
    """Hands out given configs, once each, in order (confirmation runs of selected settings)."""

    def __init__(self, configs: list[dict[str, Any]], metric: str) -> None:
        super().__init__(metric=metric, mode="max")
        self.configs, self.next = configs, 0

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:  # type: ignore[override]  # FINISHED is a str
        if self.next >= len(self.configs):
            return Searcher.FINISHED
        self.next += 1
        return dict(self.configs[self.next - 1])

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        return None


def run_fixed_trials(r: SearchRequest, configs: list[dict[str, Any]], role: str = "confirmation") -> list[dict[str, Any]]:
    """Run complete trial configs (e.g. selected settings with new seeds) through the same Ray + MLflow path,
    without early stopping; child runs carry tag tune_as.role=<role>. Returns the final metrics per trial."""
    if not configs:
        raise UserError("run_fixed_trials: expected at least one trial config, got none")
    cfgs = [TrialConfig.from_dict(c) for c in configs]
    first = cfgs[0]
    task = _build_task(dataclasses.replace(r, task=first.task))
    base = {"backbone": first.backbone, "encoder": first.encoder, "max_length": first.max_length,
            "max_train_samples": first.max_train_samples, "max_eval_samples": first.max_eval_samples}
    data_dir = Path(first.data_dir) if first.data_dir else r.data_dir
    data = _prepare(task, base, dataclasses.replace(r, data_dir=data_dir))
    name = r.name or f"{task.name}-{role}-{time.strftime('%Y%m%d-%H%M%S')}"
    exp_dir = r.storage_path.expanduser().resolve() / name
    if exp_dir.exists():
        raise UserError(f"--name: expected a new name, but {exp_dir} exists")
    tracker, resources = _start(r, r.experiment or task.name, name, exp_dir)
    tracker.start_search(params={"task": task.name, "trials": len(cfgs), "git_commit": git_commit()},
                         tags={tracking.TASK: task.name, tracking.METRIC: f"val_{task.metrics[0]}",
                               "tune_as.mode": "max", "tune_as.purpose": role})
    searcher = ConcurrencyLimiter(_FixedConfigs([c.to_dict() for c in cfgs], f"best_val_{task.metrics[0]}"),
                                  max_concurrent=_concurrency(r, resources))
    tuner = _tuner(r, task, data, name, exp_dir, resources, task.metrics[0], max(c.epochs for c in cfgs), role,
                   searcher, FIFOScheduler(), len(cfgs))
    grid = _fit(tuner, tracker, "(confirmation runs are not resumable: rerun the report)", len(cfgs))
    return [dict(result.metrics or {}, config=result.config) for result in grid]


def _best_per_loss(grid: Any, plan: SearchPlan) -> dict[str, dict[str, Any]]:
    key = f"best_val_{plan.metric}"
    best: dict[str, dict[str, Any]] = {}
    for result in grid:
        metrics = result.metrics or {}
        loss = (result.config or {}).get("loss")
        if loss is None or metrics.get("error") or key not in metrics:
            continue
        if loss not in best or metrics[key] > best[loss]["score"]:
            params = {k: v for k, v in result.config.items() if k.startswith(LOSS_PREFIX) or k == "warmup_r"}
            best[loss] = {"score": metrics[key], "params": params, "test": {
                k: v for k, v in metrics.items() if k.startswith("test_")}}
    print(f"\nBest per loss ({key}):")
    for loss, entry in sorted(best.items(), key=lambda kv: -kv[1]["score"]):
        tests = ", ".join(f"{k}={v:.4f}" for k, v in entry["test"].items())
        print(f"  {loss:28s} {entry['score']:.4f}  {entry['params']}  {tests}")
    return best


def _from_param(raw: str) -> Any:
    """An MLflow param string back to its value: None, int, finite float, else the string itself
    (so a categorical choice such as taylor_softmax's backward='inf' stays a string)."""
    if raw == "None":
        return None
    try:
        return int(raw)
    except ValueError:
        pass
    try:
        number = float(raw)
    except ValueError:
        return raw
    return number if math.isfinite(number) else raw


def config_from_params(params: dict[str, str]) -> dict[str, Any]:
    """Rebuild a trial config dict from the MLflow params of a child run (strings back to values)."""
    fields = {f.name: f for f in dataclasses.fields(TrialConfig)}
    config: dict[str, Any] = {}
    for key, raw in params.items():
        if key == "git_commit" or (key not in fields and not key.startswith(LOSS_PREFIX)):
            continue
        config[key] = _from_param(raw)
    return TrialConfig.from_dict(config).to_dict()
