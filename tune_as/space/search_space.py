"""Search spaces are data: `search_spaces/<task>.yaml`, loaded and validated here, in one place.

File format (see search_spaces/clinc_oos.yaml for a commented example, docs/search_spaces.md for the rules)::

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

Every value is typed here, once: a setting by its annotation in `tune_as.settings`, a loss hyper-parameter by
the type of its default in the loss's ``__init__`` (so ``lr: 2e-5``, a string to YAML 1.1, is the float
2e-5). Each ``params`` entry becomes the optuna distribution the search draws from, so optuna's own checks
(``low <= high``, ``log`` needs ``low > 0``, ``step > 0``, ...) run when the file is loaded. A distribution
with a single value is a constant: it joins the loss's ``fixed``. YAML aliases are refused (a few hundred
bytes of nested aliases expand to gigabytes), and so are duplicate keys.

`tune_as.space.overrides` and `SearchSpace.with_overrides` implement ``--set KEY=VALUE``: a shared fixed trial
setting that wins over the file everywhere (a loss that searches it has it pinned).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optuna.distributions import (
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
    distribution_to_json,
)

from tune_as.errors import UserError, first_line
from tune_as.paths import shipped_spaces
from tune_as.settings import DATA_FIELDS, LOSS_PREFIX, TRIAL_FIELDS, trial_problem
from tune_as.settings import EXPECTED as _EXPECTED
from tune_as.settings import coerce_finite as _coerce
from tune_as.space.distribution import Distribution
from tune_as.space.strict_yaml import EXCERPT as _EXCERPT
from tune_as.space.strict_yaml import clip as _clip
from tune_as.space.strict_yaml import read_yaml
from tune_as.space.strict_yaml import show as _show

SPACES_DIR = shipped_spaces()
# Settings a loss may search or fix (per loss): trial settings only. The data is prepared once per search.
TRIAL_KEYS = frozenset(TRIAL_FIELDS) - {"loss"}
# Data settings the file's top-level `fixed` may set for the whole search
# (the others have command-line options).
SHARED_DATA_KEYS = frozenset({"max_length", "backbone", "max_train_samples", "max_eval_samples"})
_TYPES = {**DATA_FIELDS, **TRIAL_FIELDS}
_TOP_KEYS = {"task", "trials_per_loss", "fixed", "losses"}
_LOSS_KEYS = {"params", "fixed", "paper"}
_DIST_KEYS = {"float": {"type", "low", "high", "log", "step"}, "int": {"type", "low", "high", "log", "step"},
              "categorical": {"type", "choices"}}
# Distribution types that can only draw values of the parameter's type (an int parameter never gets 2.7).
_KINDS_FOR: dict[Any, set[str]] = {Any: set(_DIST_KEYS), float: set(_DIST_KEYS), int: {"int", "categorical"}}


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

    def searched(self) -> tuple[str, ...]:
        """The trial-config keys this loss's trials differ by (`loss.delta`, `warmup_r`)."""
        return tuple(config_key(d.name) for d in self.params)

    def size(self) -> int | None:
        """How many distinct settings the search can draw; None if one is continuous or nothing is tuned (its
        trials then differ by seed)."""
        counts = [d.count() for d in self.params]
        return None if not counts or None in counts else math.prod(c or 0 for c in counts)

    def points(self) -> list[dict[str, Any]]:
        """Every setting of a finite space (search-space names), in order."""
        return [dict(zip((d.name for d in self.params), combo, strict=True))
                for combo in itertools.product(*(d.values() or () for d in self.params))]

    def paper_point(self) -> dict[str, Any] | None:
        return None if self.paper is None else {config_key(k): v for k, v in self.paper.items()}

    def without(self, names: set[str]) -> LossSpace:
        """This loss's space with `names` neither searched nor fixed here (a shared setting pins them)."""
        paper = None if self.paper is None else {k: v for k, v in self.paper.items() if k not in names}
        return dataclasses.replace(self, params=tuple(d for d in self.params if d.name not in names),
                                   fixed={k: v for k, v in self.fixed.items() if k not in names}, paper=paper)


@dataclass(frozen=True)
class SearchSpace:
    path: Path
    task: str
    trials_per_loss: int
    fixed: dict[str, Any]
    losses: dict[str, LossSpace]
    # --set, typed; they win over everything
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)

    def fingerprint(self) -> str:
        """Stable hash of the content (with any --set overrides): `--resume` refuses a search space that
        changed."""
        payload = {"task": self.task, "fixed": {**self.fixed, **self.overrides}, "losses": {
            k: {"params": [[d.name, distribution_to_json(d.dist)] for d in v.params], "fixed": v.fixed,
                "paper": v.paper}
            for k, v in sorted(self.losses.items())}}
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def restrict(self, losses: list[str]) -> SearchSpace:
        missing = [name for name in losses if name not in self.losses]
        if missing:
            raise UserError(f"{self.path}: losses {missing} are not in this search space; "
                            f"it has {sorted(self.losses)}")
        return dataclasses.replace(self, losses={name: self.losses[name] for name in losses})

    def with_overrides(self, overrides: dict[str, Any]) -> SearchSpace:
        """This space with typed `overrides` (from `check_overrides`) in the shared `fixed`.

        An override wins everywhere: a loss that searches the setting (``warmup_r`` for as_softmax) or fixes
        it has it pinned instead (removed from its ``params``, ``fixed`` and ``paper``), so that no trial runs
        with another value. The fingerprint changes with the content, so `--resume` refuses different
        overrides.
        """
        return dataclasses.replace(self, overrides={**self.overrides, **overrides},
                                   losses={name: s.without(set(overrides))
                                           for name, s in self.losses.items()})

    def check_classes(self, num_labels: int) -> None:
        """Top-k losses cannot keep more classes than the task has."""
        for space in self.losses.values():
            ks = [v for d in space.params if d.name == "k" for v in d.extremes()]
            ks += [space.fixed.get("k"), (space.paper or {}).get("k")]
            too_big = [k for k in ks if isinstance(k, int | float) and k > num_labels]
            if too_big:
                raise UserError(f"{self.path}: losses.{space.loss}: expected k <= {num_labels} "
                                f"(the task's classes), got k={too_big[0]}")


# -- messages ---------------------------------------------------------------------------------------------
def _fail(path: Path, where: str, message: str) -> UserError:
    return UserError(f"{path}: {_clip(where, 100)}: {_clip(message, 400)}")


def _excerpted(exc: BaseException, values: dict[str, Any]) -> str:
    """A library's message about `values` (the settings', a loss's) with each long value cut to an excerpt."""
    message = first_line(exc)
    for value in values.values():
        if len(repr(value)) > _EXCERPT:
            message = message.replace(repr(value), _show(value))
    return message


def _trial_problem(settings: dict[str, Any]) -> str | None:
    """What the settings classes' own rules say about these settings, or None when they pass."""
    problem = trial_problem(settings)
    if problem is None:
        return None
    for value in settings.values():
        if len(repr(value)) > _EXCERPT:
            problem = problem.replace(repr(value), _show(value))
    return problem


def _typed(path: Path, where: str, value: Any, hint: Any) -> Any:
    try:
        return _coerce(value, hint)
    except ValueError as exc:
        raise _fail(path, where, f"expected {exc}, got {_show(value)}") from None



def _mapping(path: Path, where: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(path, where, f"expected a mapping, got {type(value).__name__} {_show(value)}")
    for key in value:
        if not isinstance(key, str):
            raise _fail(path, where, f"expected names as keys, got {type(key).__name__} {_show(key)}")
    return value


def _check_keys(path: Path, where: str, got: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(got) - allowed)
    if unknown:
        raise _fail(path, where, f"unknown key(s) {_show(unknown)}; expected some of {sorted(allowed)}")


# -- distributions ---------------------------------------------------------------------------------------
def _distribution(path: Path, where: str, name: str, raw: Any, hint: Any) -> Distribution:
    """The optuna distribution of one `params` entry; optuna's own checks (and warnings) refuse bad ones."""
    raw = _mapping(path, where, raw)
    kind = raw.get("type")
    if not isinstance(kind, str) or kind not in _DIST_KEYS:
        raise _fail(path, where + ".type", f"expected one of {sorted(_DIST_KEYS)}, got {_show(kind)}")
    _check_keys(path, where, raw, _DIST_KEYS[kind])
    allowed = _KINDS_FOR.get(hint, {"categorical"})
    if kind not in allowed:
        raise _fail(path, where + ".type", f"expected {' or '.join(sorted(allowed))} ({name} takes "
                    f"{_EXPECTED.get(hint, hint)}), got {kind}")
    if kind == "categorical":
        choices = raw.get("choices")
        if not isinstance(choices, list):
            raise _fail(path, where + ".choices", f"expected a list of values, got {_show(choices)}")
        args: dict[str, Any] = {"choices": [_typed(path, f"{where}.choices", c, hint) for c in choices]}
    else:
        number = int if kind == "int" else float
        args = {key: _typed(path, f"{where}.{key}", raw.get(key), number) for key in ("low", "high")}
        args["log"] = _typed(path, where + ".log", raw.get("log", False), bool)
        if "step" in raw or kind == "int":
            args["step"] = _typed(path, where + ".step", raw.get("step", 1), number)
        for key in ("low", "high", "step"):
            if not math.isfinite(args.get(key, 0)):
                raise _fail(path, f"{where}.{key}", f"expected a finite number, got {args[key]}")
    factory = {"float": FloatDistribution, "int": IntDistribution,
               "categorical": CategoricalDistribution}[kind]
    try:
        # optuna warns where it would change the range or cannot store a choice
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            dist = factory(**args)
    except (ValueError, Warning) as exc:
        raise _fail(path, where, f"invalid {kind} distribution: {first_line(exc)}") from None
    return Distribution(name, dist)


# -- the loader ------------------------------------------------------------------------------------------
def _validate_values(path: Path, where: str, loss: str, values: dict[str, Any], base: dict[str, Any]) -> None:
    """Let the loss and the settings classes judge the values: their own checks say what is valid."""
    from tune_as.losses import build_loss

    loss_kw = {k: v for k, v in values.items() if k not in TRIAL_KEYS}
    trial_kw = {k: v for k, v in values.items() if k in TRIAL_KEYS}
    try:
        build_loss(loss, **loss_kw)
    except (ValueError, TypeError) as exc:
        raise _fail(path, where, _excerpted(exc, loss_kw)) from None
    problem = _trial_problem({**base, "loss": loss, **trial_kw})
    if problem:
        raise _fail(path, where, problem)


def _loss_space(path: Path, loss: str, raw: Any, kind: str, base: dict[str, Any]) -> LossSpace:
    from tune_as.losses import LOSSES

    where = f"losses.{loss}"
    if loss not in LOSSES:
        raise _fail(path, where, f"unknown loss; expected one of {sorted(LOSSES)}")
    if kind not in LOSSES[loss].kinds:
        raise _fail(path, where,
                    f"loss does not apply to {kind} tasks (it supports {sorted(LOSSES[loss].kinds)})")
    raw = _mapping(path, where, raw)
    _check_keys(path, where, raw, _LOSS_KEYS)
    defaults = LOSSES[loss]().hparams()
    hints = {**{n: Any if v is None else type(v) for n, v in defaults.items()}, **TRIAL_FIELDS}
    sections = {s: _mapping(path, f"{where}.{s}", raw.get(s)) for s in ("params", "fixed", "paper")}
    for section, names in sections.items():
        data = sorted(set(names) & (set(DATA_FIELDS) - set(defaults) - TRIAL_KEYS))
        if data:
            raise _fail(path, f"{where}.{section}", f"{_show(data)}: data setting(s), prepared once for the "
                        "whole search; expected them in the file's top-level `fixed` or on the command line "
                        f"(--{data[0].replace('_', '-')}), not under one loss")
        bad = sorted(set(names) - set(defaults) - TRIAL_KEYS)
        if bad:
            raise _fail(path, f"{where}.{section}", f"unknown parameter(s) {_show(bad)}; {loss} takes "
                        f"{sorted(defaults)} and the trial settings {sorted(TRIAL_KEYS)}")
    if "seed" in set(sections["params"]) | set(sections["fixed"]) | set(sections["paper"]):
        raise _fail(path, where, "seed: expected no seed under a loss (seeds are the search's: --seed, and "
                    "confirmation draws new ones), got one")
    both = sorted(set(sections["params"]) & set(sections["fixed"]))
    if both:
        raise _fail(path, f"{where}.fixed", f"expected each name in params or in fixed, got {both} in both")
    fixed = {n: _typed(path, f"{where}.fixed.{n}", v, hints[n]) for n, v in sections["fixed"].items()}
    paper = None if raw.get("paper") is None else {
        n: _typed(path, f"{where}.paper.{n}", v, hints[n]) for n, v in sections["paper"].items()}
    params = []
    for name, spec in sections["params"].items():
        dist = _distribution(path, f"{where}.params.{name}", name, spec, hints[name])
        for value in dist.extremes():
            _validate_values(path, f"{where}.params.{name}", loss, {**fixed, name: value}, base)
        # one value: a constant, so a loss left with nothing to search repeats over seeds
        if dist.dist.single():
            fixed[name] = dist.extremes()[0]
        else:
            params.append(dist)
    _validate_values(path, f"{where}.fixed", loss, fixed, base)
    searched = {d.name: d for d in params}
    for name, value in (paper or {}).items():
        if name not in searched:  # the warm start sets only what is searched: anything else would be ignored
            raise _fail(path, f"{where}.paper.{name}", "expected a searched parameter "
                        f"({sorted(searched) or 'none'}; a constant belongs in fixed), got {name}")
        if not searched[name].contains(value):
            raise _fail(path, f"{where}.paper.{name}", f"expected a value the search can draw "
                        f"({_show(searched[name].extremes())}), got {_show(value)}")
    if paper is not None:
        _validate_values(path, f"{where}.paper", loss, {**fixed, **paper}, base)
    return LossSpace(loss, tuple(params), fixed, paper)


def load_search_space(path: Path, kind: str) -> SearchSpace:
    """Load and validate one YAML file for a task of `kind`; every problem is a UserError naming file and
    key."""
    raw = read_yaml(path, "search space")
    if raw is None:
        raise _fail(path, "top level", "expected a mapping with task and losses, got an empty file")
    if not isinstance(raw, dict):
        raise _fail(path, "top level",
                    f"expected a mapping with task and losses, got {type(raw).__name__} {_show(raw)}")
    raw = _mapping(path, "top level", raw)
    _check_keys(path, "top level", raw, _TOP_KEYS)
    task = raw.get("task")
    if not isinstance(task, str):
        raise _fail(path, "task", f"expected the task name as a string, got {_show(task)}")
    trials = _typed(path, "trials_per_loss", raw.get("trials_per_loss", 20), int)
    if trials < 1:
        raise _fail(path, "trials_per_loss", f"expected an integer >= 1, got {trials}")
    fixed_raw = _mapping(path, "fixed", raw.get("fixed"))
    _check_keys(path, "fixed", fixed_raw, set(TRIAL_KEYS | SHARED_DATA_KEYS))
    fixed = {k: _typed(path, f"fixed.{k}", v, _TYPES[k]) for k, v in fixed_raw.items()}
    problem = _trial_problem(fixed)
    if problem:
        raise _fail(path, "fixed", problem)
    losses_raw = _mapping(path, "losses", raw.get("losses"))
    if not losses_raw:
        raise _fail(path, "losses", "expected at least one loss, got none")
    losses = {name: _loss_space(path, name, spec, kind, fixed) for name, spec in losses_raw.items()}
    return SearchSpace(path, task, trials, fixed, losses)


def default_space_path(task: str, kind: str | None = None) -> Path:
    """`search_spaces/<task>.yaml`, or `<task>_<kind>.yaml` where one exists (the jsonl task of a multi-label
    kind: its losses are another family)."""
    by_kind = SPACES_DIR / f"{task}_{kind}.yaml"
    return by_kind if kind and by_kind.is_file() else SPACES_DIR / f"{task}.yaml"
