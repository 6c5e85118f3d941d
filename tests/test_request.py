"""The request's one declaration per option (tune_as.engine.request): each field says its help and whether it
changes results, and the CLI (tune_as.search) reaches every field through the flag that declaration names."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from tune_as.engine.request import OPTIONS, RESULT_OPTIONS, SearchRequest, flag
from tune_as.search import build_parser, request_from_args, typed_options

FIELDS = {f.name: f for f in dataclasses.fields(SearchRequest)}
HINTS = typing.get_type_hints(SearchRequest)
# What a resume compares, as it was when the hand-kept list became derived: a field added later must choose.
RESULT_BEFORE = {"task", "noise", "losses", "trials_per_loss", "max_epochs", "backbone", "encoder",
                 "encode_precision", "max_length", "data_dir", "max_train_samples", "max_eval_samples",
                 "task_args", "search_space", "seed", "overrides", "eval_every_steps", "grace_period",
                 "reduction_factor", "asha", "asha_scope", "smoke", "confirm", "confirm_top", "sampler",
                 "warm_start", "race", "max_seeds", "margin", "baseline", "budget", "seeds_per_trial"}
API_ONLY = {"cache_dir", "typed"}  # set by the engine's callers (tests, benchmarks, the CLI itself), no flag


def test_every_field_declares_its_help_and_whether_it_changes_results() -> None:
    missing = {name for name, f in FIELDS.items() if "option" not in f.metadata}
    assert not missing, f"expected option(...) on every SearchRequest field, got none on {sorted(missing)}"
    vague = {name for name, o in OPTIONS.items() if not o.help.strip() or not isinstance(o.result, bool)}
    assert not vague, f"expected a help text and result=True/False, got neither on {sorted(vague)}"
    assert set(RESULT_OPTIONS) == RESULT_BEFORE, (f"added: {sorted(set(RESULT_OPTIONS) - RESULT_BEFORE)}, "
                                                  f"dropped: {sorted(RESULT_BEFORE - set(RESULT_OPTIONS))}")
    assert {name for name, o in OPTIONS.items() if not o.cli} == API_ONLY


def test_a_unit_is_named_in_the_help_a_user_reads() -> None:
    unnamed = {name: o.unit for name, o in OPTIONS.items()
               if o.unit and o.unit.removesuffix("s") not in o.help}
    assert not unnamed, f"expected each unit in its option's help, got none for {unnamed}"


def _typed_value(name: str) -> list[str]:
    """What a user types after the flag of `name`: a value other than the default (nothing for a switch)."""
    o, default = OPTIONS[name], FIELDS[name].default
    kind = next((a for a in typing.get_args(HINTS[name]) if a is not type(None)), HINTS[name])
    if o.const is not None or kind is bool:
        return []
    if o.choices:
        return [next(c for c in o.choices if c != default)]
    samples = {int: "7", float: "7.5", Path: "elsewhere", str: "x"}
    return [samples.get(kind, "lr=0.1")]  # a tuple: --losses' list, or a KEY=VALUE pair (lr is a --set key)


@pytest.mark.parametrize("name", sorted(set(FIELDS) - API_ONLY))
def test_every_field_is_set_by_its_own_flag(name: str) -> None:
    argv = ([] if name == "task" else ["--task", "digits"]) + [flag(name), *_typed_value(name)]
    args = build_parser().parse_args(argv)
    request = request_from_args(args, typed_options(args, argv))
    got, default = getattr(request, name), FIELDS[name].default
    assert got != default, \
        f"{' '.join(argv)}: expected {name} other than its default {default!r}, got {got!r}"
    assert request.typed == {name, "task"}, \
        f"{' '.join(argv)}: expected {name} and task typed, got {request.typed}"


def test_environment_defaults_are_defaults_not_typed_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///env.db")
    argv = ["--task", "digits"]
    args = build_parser().parse_args(argv)
    request = request_from_args(args, typed_options(args, argv))
    assert (request.address, request.mlflow_uri) == ("auto", "sqlite:///env.db")
    assert request.typed == {"task"}, f"expected only --task typed, got {request.typed}"


def test_a_setting_with_its_own_flag_has_one_way_in() -> None:
    """`--set` refuses a setting that has its own option and names that option: the table it names them by
    (space.overrides.OWN_OPTIONS, which may not import the engine) is the request's own flags."""
    from tune_as.settings import DATA_FIELDS, TRIAL_FIELDS
    from tune_as.space.overrides import OWN_OPTIONS

    settings = (set(TRIAL_FIELDS) | set(DATA_FIELDS)) - {"loss", "task"}
    expected = {name: flag(name) for name in settings & set(FIELDS)} | {"epochs": flag("max_epochs")}
    assert expected == OWN_OPTIONS
    flags = {s for a in build_parser()._actions for s in a.option_strings}  # noqa: SLF001
    assert set(OWN_OPTIONS.values()) <= flags


def test_a_search_saved_before_the_noise_option_resumes_with_the_rule_it_ran_with() -> None:
    """A saved state without `noise` (tune_as before 2026-12-07) decided per-loss: its resume keeps that rule,
    while a state that names it keeps its own (engine.resume.BEFORE_OPTIONS)."""
    from tune_as.engine.resume import restore_request

    saved = {f.name: getattr(SearchRequest(task="digits"), f.name) for f in dataclasses.fields(SearchRequest)
             if f.name in RESULT_OPTIONS}
    saved = {k: (list(v) if isinstance(v, tuple) else str(v) if isinstance(v, Path) else v)
             for k, v in saved.items()}
    old = {k: v for k, v in saved.items() if k != "noise"}
    resumed = SearchRequest(task="", resume=True, name="s")
    assert restore_request(resumed, {"task": "digits", "request": old}, "s").noise == "per-loss"
    assert restore_request(resumed, {"task": "digits", "request": saved}, "s").noise == "moderated"


def test_help_groups_every_option_once_and_shows_examples(capsys: pytest.CaptureFixture[str]) -> None:
    """--help in the groups a user looks for (issue 69), each CLI option in exactly one, and three
    examples."""
    from tune_as.engine.request import HELP_GROUPS

    grouped = [name for _, names in HELP_GROUPS for name in names]
    assert sorted(grouped) == sorted(name for name, o in OPTIONS.items() if o.cli), "each option in one group"
    assert len(grouped) == len(set(grouped))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    shown = capsys.readouterr().out
    for title, _ in HELP_GROUPS:
        assert f"\n{title}:\n" in shown, title
    examples = shown[shown.index("examples:"):].splitlines()
    assert sum(line.startswith("  python -m tune_as.search ") for line in examples) == 3
