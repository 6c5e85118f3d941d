"""Search spaces are data: `search_spaces/<task>.yaml`, loaded and validated here, in one place.

File format (see search_spaces/clinc_oos.yaml for a commented example)::

    task: clinc_oos
    trials_per_loss: 20          # Optuna trials per loss
    fixed: {epochs: 10, batch_size: 32, lr: 2.0e-5, max_length: 64}   # the paper's Table 5
    losses:
      as_softmax:
        params:                  # distributions: float / int (low, high, log, step) or categorical (choices)
          delta: {type: float, low: 0.05, high: 0.5}
          warmup_r: {type: float, low: 0.0, high: 0.3}
        fixed: {}                # constants for this loss only
        paper: {delta: 0.30, warmup_r: 0.15}   # the paper's Table 6 setting, evaluated first

Parameter names that are trial settings (``warmup_r``, ``lr``, ...) go to the trainer; every other name is a
hyper-parameter of the loss and becomes ``loss.<name>`` in the trial config.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from tune_as.config import LOSS_PREFIX, TrialConfig
from tune_as.errors import UserError

SPACES_DIR = Path(__file__).resolve().parent.parent / "search_spaces"
TRIAL_KEYS = {f.name for f in dataclasses.fields(TrialConfig)} - {"loss_params", "task", "loss"}
_TOP_KEYS = {"task", "trials_per_loss", "fixed", "losses"}
_LOSS_KEYS = {"params", "fixed", "paper"}
_DIST_KEYS = {"float": {"type", "low", "high", "log", "step"}, "int": {"type", "low", "high", "log", "step"},
              "categorical": {"type", "choices"}}


class OptunaTrialLike(Protocol):
    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = ..., log: bool = ...) -> float: ...
    def suggest_int(self, name: str, low: int, high: int, *, step: int = ..., log: bool = ...) -> int: ...
    def suggest_categorical(self, name: str, choices: Any) -> Any: ...


@dataclass(frozen=True)
class Distribution:
    name: str
    type: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple[Any, ...] = ()

    def suggest(self, trial: OptunaTrialLike) -> Any:
        if self.type == "categorical":
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.type == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high), step=int(self.step or 1), log=self.log)  # type: ignore[arg-type]
        return trial.suggest_float(self.name, float(self.low), float(self.high), step=self.step, log=self.log)  # type: ignore[arg-type]

    def extremes(self) -> list[Any]:
        return list(self.choices) if self.type == "categorical" else [self.low, self.high]


def config_key(name: str) -> str:
    """Flat trial-config key of a search-space parameter name."""
    return name if name in TRIAL_KEYS else LOSS_PREFIX + name


@dataclass(frozen=True)
class LossSpace:
    loss: str
    params: tuple[Distribution, ...]
    fixed: dict[str, Any]
    paper: dict[str, Any] | None

    def constants(self) -> dict[str, Any]:
        return {config_key(k): v for k, v in self.fixed.items()}

    def paper_point(self) -> dict[str, Any] | None:
        return None if self.paper is None else {config_key(k): v for k, v in self.paper.items()}


@dataclass(frozen=True)
class SearchSpace:
    path: Path
    task: str
    trials_per_loss: int
    fixed: dict[str, Any]
    losses: dict[str, LossSpace]

    def fingerprint(self) -> str:
        """Stable hash of the content: `--resume` refuses a search space that changed."""
        payload = {"task": self.task, "fixed": self.fixed, "losses": {
            k: {"params": [dataclasses.asdict(d) for d in v.params], "fixed": v.fixed, "paper": v.paper}
            for k, v in sorted(self.losses.items())}}
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def restrict(self, losses: list[str]) -> SearchSpace:
        missing = [name for name in losses if name not in self.losses]
        if missing:
            raise UserError(f"{self.path}: losses {missing} are not in this search space; it has {sorted(self.losses)}")
        return dataclasses.replace(self, losses={name: self.losses[name] for name in losses})

    def check_classes(self, num_labels: int) -> None:
        """Top-k losses cannot keep more classes than the task has."""
        for space in self.losses.values():
            ks = [d.high for d in space.params if d.name == "k"] + [space.fixed.get("k"), (space.paper or {}).get("k")]
            too_big = [k for k in ks if k is not None and k > num_labels]
            if too_big:
                raise UserError(f"{self.path}: losses.{space.loss}: expected k <= {num_labels} (the task's classes), "
                                f"got k={too_big[0]}")


def _fail(path: Path, where: str, message: str) -> UserError:
    return UserError(f"{path}: {where}: {message}")


def _mapping(path: Path, where: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(path, where, f"expected a mapping, got {type(value).__name__} {value!r}")
    return value


def _check_keys(path: Path, where: str, got: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(got) - allowed)
    if unknown:
        raise _fail(path, where, f"unknown key(s) {unknown}; expected some of {sorted(allowed)}")


def _distribution(path: Path, where: str, name: str, raw: Any) -> Distribution:
    raw = _mapping(path, where, raw)
    kind = raw.get("type")
    if kind not in _DIST_KEYS:
        raise _fail(path, where, f"expected type one of {sorted(_DIST_KEYS)}, got {kind!r}")
    _check_keys(path, where, raw, _DIST_KEYS[kind])
    if kind == "categorical":
        choices = raw.get("choices")
        if not isinstance(choices, list) or not choices:
            raise _fail(path, where, f"expected a non-empty list of choices, got {choices!r}")
        return Distribution(name, kind, choices=tuple(choices))
    low, high = raw.get("low"), raw.get("high")
    number = int if kind == "int" else (int, float)
    for label, v in (("low", low), ("high", high)):
        if isinstance(v, bool) or not isinstance(v, number):
            raise _fail(path, where, f"expected {label} to be {'an integer' if kind == 'int' else 'a number'}, got {v!r}")
    if not low < high:
        raise _fail(path, where, f"expected low < high (a non-empty range), got low={low}, high={high}")
    log = raw.get("log", False)
    if not isinstance(log, bool):
        raise _fail(path, where, f"expected log to be true/false, got {log!r}")
    return Distribution(name, kind, low=low, high=high, log=log, step=raw.get("step"))


def _validate_values(path: Path, where: str, loss: str, values: dict[str, Any], base: dict[str, Any]) -> None:
    """Let the loss and TrialConfig judge the values: their own checks say what is valid."""
    from tune_as.losses import build_loss

    loss_kw = {k: v for k, v in values.items() if k not in TRIAL_KEYS}
    trial_kw = {k: v for k, v in values.items() if k in TRIAL_KEYS}
    try:
        build_loss(loss, **loss_kw)
        TrialConfig(task="x", loss=loss, **{**base, **trial_kw})
    except (ValueError, TypeError) as exc:
        raise _fail(path, where, str(exc)) from None


def _loss_space(path: Path, loss: str, raw: Any, kind: str, base: dict[str, Any]) -> LossSpace:
    from tune_as.losses import LOSSES

    where = f"losses.{loss}"
    if loss not in LOSSES:
        raise _fail(path, where, f"unknown loss; expected one of {sorted(LOSSES)}")
    if kind not in LOSSES[loss].kinds:
        raise _fail(path, where, f"loss does not apply to {kind} tasks (it supports {sorted(LOSSES[loss].kinds)})")
    raw = _mapping(path, where, raw)
    _check_keys(path, where, raw, _LOSS_KEYS)
    accepted = set(LOSSES[loss]().hparams()) | TRIAL_KEYS
    params_raw = _mapping(path, where + ".params", raw.get("params"))
    fixed = _mapping(path, where + ".fixed", raw.get("fixed"))
    paper = raw.get("paper")
    for section, names in (("params", params_raw), ("fixed", fixed), ("paper", _mapping(path, where, paper))):
        bad = sorted(set(names) - accepted)
        if bad:
            raise _fail(path, f"{where}.{section}", f"unknown parameter(s) {bad}; {loss} takes {sorted(accepted - TRIAL_KEYS)} "
                        f"and the trial settings {sorted(TRIAL_KEYS)}")
    params = tuple(_distribution(path, f"{where}.params.{n}", n, d) for n, d in params_raw.items())
    for dist in params:
        for value in dist.extremes():
            _validate_values(path, f"{where}.params.{dist.name}", loss, {**fixed, dist.name: value}, base)
    _validate_values(path, f"{where}.fixed", loss, fixed, base)
    if paper is not None:
        _validate_values(path, f"{where}.paper", loss, {**fixed, **paper}, base)
    return LossSpace(loss, params, fixed, paper)


def load_search_space(path: Path, kind: str) -> SearchSpace:
    """Load and validate one YAML file for a task of `kind`; every problem is a UserError naming file and key."""
    if not path.is_file():
        raise UserError(f"search space file not found: expected {path} to exist")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        raise UserError(f"{path}: invalid YAML at {at}: {getattr(exc, 'problem', exc)}") from None
    raw = _mapping(path, "top level", raw)
    _check_keys(path, "top level", raw, _TOP_KEYS)
    task = raw.get("task")
    if not isinstance(task, str):
        raise _fail(path, "task", f"expected the task name as a string, got {task!r}")
    trials = raw.get("trials_per_loss", 20)
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise _fail(path, "trials_per_loss", f"expected an integer >= 1, got {trials!r}")
    fixed = _mapping(path, "fixed", raw.get("fixed"))
    _check_keys(path, "fixed", fixed, TRIAL_KEYS)
    losses_raw = _mapping(path, "losses", raw.get("losses"))
    if not losses_raw:
        raise _fail(path, "losses", "expected at least one loss, got none")
    base = {"epochs": 1, "batch_size": 1, "lr": 1e-3, "max_length": 8, "backbone": "x", **fixed}
    losses = {name: _loss_space(path, name, spec, kind, base) for name, spec in losses_raw.items()}
    return SearchSpace(path, task, trials, fixed, losses)


def default_space_path(task: str) -> Path:
    return SPACES_DIR / f"{task}.yaml"
