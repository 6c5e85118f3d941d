"""``--set KEY=VALUE``: a shared setting that wins over the search space file everywhere (a loss that searches
it has it pinned). Split, key- and type-checked when the command line is read, typed when the search is
planned."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tune_as.errors import UserError
from tune_as.settings import coerce_field
from tune_as.space.search_space import TRIAL_KEYS, _trial_problem
from tune_as.space.strict_yaml import clip as _clip
from tune_as.space.strict_yaml import show as _show

# Settings with their own command-line option: --set refuses them, so each has one way in.
# (tests/test_request.py keeps it equal to the request's flags: this layer may not import the engine)
OWN_OPTIONS = {"backbone": "--backbone", "encoder": "--encoder", "data_dir": "--data-dir", "seed": "--seed",
               "encode_precision": "--encode-precision",
               "max_train_samples": "--max-train-samples", "max_eval_samples": "--max-eval-samples",
               "epochs": "--max-epochs", "max_length": "--max-length",
               "eval_every_steps": "--eval-every-steps"}
OVERRIDE_KEYS = frozenset(TRIAL_KEYS - set(OWN_OPTIONS))


def _check_override_key(key: str) -> None:
    if key in OVERRIDE_KEYS:
        return
    if key in OWN_OPTIONS:
        raise UserError(f"--set: expected a key without its own option, got {_show(key)} "
                        f"(use {OWN_OPTIONS[key]})")
    raise UserError(f"--set: expected one of {sorted(OVERRIDE_KEYS)}, got unknown key {_show(key)}")


def check_overrides(overrides: dict[str, str], fixed: dict[str, Any]) -> dict[str, Any]:
    """``--set`` values (text) typed once by their field's annotation and judged by the settings classes'
    rules (together with the file's `fixed`). Any problem is one UserError line."""
    typed = {}
    for key, value in overrides.items():
        _check_override_key(key)
        typed[key] = _typed(key, value)
    problem = _trial_problem({**fixed, **typed})
    if problem:
        raise UserError(f"--set: {_clip(problem, 300)}")
    return typed


def _typed(key: str, value: str) -> Any:
    """A ``--set`` value typed by its field's annotation; a value of the wrong type is one UserError line."""
    try:
        return coerce_field(key, value)
    except ValueError as exc:
        raise UserError(f"--set {key}: expected {exc}, got {_show(value)}") from None


def parse_overrides(items: Sequence[str]) -> dict[str, str]:
    """``--set KEY=VALUE`` items as {key: text} (``["lr=2e-5"]`` -> ``{"lr": "2e-5"}``): split, the keys and
    the values' types checked here (before torch loads); the values are typed for use by `check_overrides`,
    when the search is planned, with the same rule."""
    raw: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UserError(f"--set: expected KEY=VALUE, got {_show(item)}")
        _check_override_key(key)
        if key in raw:
            raise UserError(f"--set: expected each key once, got {key} twice "
                            f"({_show(raw[key])} and {_show(value.strip())})")
        raw[key] = value.strip()
        _typed(key, raw[key])
    return raw
