"""Search spaces: every shipped YAML loads and names real (task, loss) pairs; bad files fail clearly."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tune_as.errors import UserError
from tune_as.losses import LOSSES
from tune_as.settings import TrialSettings
from tune_as.space.overrides import OVERRIDE_KEYS, OWN_OPTIONS, check_overrides, parse_overrides
from tune_as.space.search_space import (
    SPACES_DIR,
    SearchSpace,
    config_key,
    default_space_path,
    load_search_space,
)
from tune_as.tasks import TASKS, build_task

SHIPPED = sorted(SPACES_DIR.glob("*.yaml"))


def _kind(path: Path) -> str:
    return "multilabel" if path.stem == "jsonl_multilabel" else build_task(path.stem).kind


def test_every_task_has_a_search_space() -> None:
    assert {p.stem for p in SHIPPED} >= set(TASKS)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_space_loads_and_names_real_pairs(path: Path) -> None:
    space = load_search_space(path, _kind(path))
    assert space.task in TASKS
    assert space.losses, "a search space without losses searches nothing"
    for name, loss_space in space.losses.items():
        assert _kind(path) in LOSSES[name].kinds
        if loss_space.paper:  # the warm start is inside the searched ranges
            for dist in loss_space.params:
                value = loss_space.paper.get(dist.name)
                if value is not None:
                    d = dist.dist
                    inside = value in d.choices if dist.type == "categorical" else d.low <= value <= d.high
                    assert inside, (name, dist.name, value)


def test_paper_settings_match_table6() -> None:
    clinc = load_search_space(SPACES_DIR / "clinc_oos.yaml", "multiclass")
    assert clinc.losses["as_softmax"].paper == {"delta": 0.3, "warmup_r": 0.15}
    assert clinc.losses["as_speed"].paper == {"delta": 0.3, "warmup_r": 0.15, "lam": 0.5, "max_steps": 5}
    assert clinc.fixed == {"epochs": 10, "batch_size": 32, "lr": 2e-5, "max_length": 64}
    assert load_search_space(SPACES_DIR / "sst5.yaml", "multiclass").losses["am_softmax"].paper == \
        {"s": 10, "m": 0.3}


def test_param_names_route_to_trainer_or_loss() -> None:
    assert config_key("warmup_r") == "warmup_r"
    assert config_key("delta") == "loss.delta"


GOOD = """task: sst5
fixed: {epochs: 1}
losses:
  as_softmax:
    params:
      delta: {type: float, low: 0.1, high: 0.5}
"""

BAD = [
    ("syntax", "task: sst5\nlosses: [unclosed\n", "invalid YAML at line"),
    ("unknown top key", GOOD + "colour: red\n", "unknown key(s) ['colour']"),
    ("unknown loss", GOOD.replace("as_softmax", "nosuchloss"), "losses.nosuchloss: unknown loss"),
    ("delta above 1", GOOD.replace("high: 0.5", "high: 1.5"), "losses.as_softmax.params.delta"),
    ("low above high", GOOD.replace("low: 0.1", "low: 0.6"),
     "params.delta: invalid float distribution: `low <= high`"),
    ("wrong type", GOOD.replace("low: 0.1", "low: high"), "params.delta.low: expected a float, got 'high'"),
    ("unknown param", GOOD.replace("delta:", "gamma:"), "unknown parameter(s) ['gamma']"),
    ("negative lambda",
     "task: sst5\nlosses:\n  as_speed:\n    params:\n      lam: {type: float, low: -1.0, high: 1.0}\n",
     "losses.as_speed.params.lam"),
    ("s below 1", "task: sst5\nlosses:\n  as_speed:\n    fixed: {max_steps: 0}\n", "losses.as_speed.fixed"),
    ("bad dist type", GOOD.replace("type: float", "type: gaussian"),
     "params.delta.type: expected one of ['categorical', 'float', 'int'], got 'gaussian'"),
    ("no losses", "task: sst5\nlosses: {}\n", "expected at least one loss"),
    ("trials not int", GOOD + "trials_per_loss: many\n", "trials_per_loss: expected an integer, got 'many'"),
    ("loss of wrong kind", "task: sst5\nlosses:\n  bce: {}\n", "does not apply to multiclass tasks"),
    ("bad trial setting", "task: sst5\nfixed: {epochs: -1}\nlosses:\n  softmax: {}\n",
     "fixed: epochs: expected a number > 0, got -1.0"),
]


@pytest.mark.parametrize(("label", "text", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_search_space_gets_one_clear_line(tmp_path: Path, label: str, text: str, message: str) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as info:
        load_search_space(path, "multiclass")
    text_of_error = str(info.value)
    assert message in text_of_error
    assert str(path) in text_of_error and "\n" not in text_of_error


def _space(tmp_path: Path, text: str) -> SearchSpace:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return load_search_space(path, "multiclass")


def _error(tmp_path: Path, text: str) -> str:
    """The one line a user sees for a bad file (it names the file)."""
    with pytest.raises(UserError) as info:
        _space(tmp_path, text)
    message = str(info.value)
    assert str(tmp_path / "space.yaml") in message and "\n" not in message
    return message


def _one_param(loss: str, name: str, spec: str) -> str:
    return f"task: sst5\nlosses:\n  {loss}:\n    params:\n      {name}: {{{spec}}}\n"


# Each of these loaded cleanly before optuna judged distributions at load time, and failed in the running
# search.
DISTRIBUTION_ERRORS = [
    ("type not a name", "as_softmax", "delta", "type: [float], low: 0.1, high: 0.5",
     "params.delta.type: expected one of ['categorical', 'float', 'int'], got ['float']"),
    ("log from 0", "as_softmax", "delta", "type: float, low: 0.0, high: 0.5, log: true",
     "params.delta: invalid float distribution: `low > 0` must hold for `log=True`"),
    ("log with step", "as_softmax", "delta", "type: float, low: 0.1, high: 0.5, log: true, step: 0.1",
     "params.delta: invalid float distribution: The parameter `step` is not supported when `log` is true."),
    ("step not a number", "as_softmax", "delta", "type: float, low: 0.1, high: 0.5, step: fine",
     "params.delta.step: expected a float, got 'fine'"),
    ("zero step", "as_softmax", "delta", "type: float, low: 0.1, high: 0.5, step: 0",
     "params.delta: invalid float distribution: `step > 0` must hold"),
    ("step not dividing the range", "as_softmax", "delta", "type: float, low: 0.1, high: 0.5, step: 0.3",
     "params.delta: invalid float distribution: The distribution is specified by [0.1, 0.5] and step=0.3, "
     "but the range is not divisible by `step`."),
    ("log not a bool", "as_softmax", "delta", "type: float, low: 0.1, high: 0.5, log: maybe",
     "params.delta.log: expected true or false, got 'maybe'"),
    ("infinite bound", "as_softmax", "delta", "type: float, low: 0.1, high: .inf",
     "params.delta.high: expected a finite number, got inf"),
    ("missing bound", "as_softmax", "delta", "type: float, low: 0.1",
     "params.delta.high: expected a float, got None"),
    ("choices not a list", "as_softmax", "delta", "type: categorical, choices: 0.3",
     "params.delta.choices: expected a list of values, got 0.3"),
    ("no choices", "as_softmax", "delta", "type: categorical, choices: []",
     "params.delta: invalid categorical distribution: The `choices` must contain one or more elements."),
    ("choice of the wrong type", "as_softmax", "delta", "type: categorical, choices: [0.3, [0.1]]",
     "params.delta.choices: expected a float, got [0.1]"),
    ("int step not an integer", "as_speed", "max_steps", "type: int, low: 2, high: 6, step: 0.5",
     "params.max_steps.step: expected an integer, got 0.5"),
    ("int bound not an integer", "as_speed", "max_steps", "type: int, low: 2.5, high: 6",
     "params.max_steps.low: expected an integer, got 2.5"),
    ("int log from 0", "as_speed", "max_steps", "type: int, low: 0, high: 6, log: true",
     "params.max_steps: invalid int distribution: `low >= 1` must hold for `log=True`"),
    ("low above high", "as_speed", "max_steps", "type: int, low: 6, high: 2",
     "params.max_steps: invalid int distribution: `low <= high` must hold"),
    ("float range for an integer", "as_speed", "max_steps", "type: float, low: 2, high: 6",
     "params.max_steps.type: expected categorical or int (max_steps takes an integer), got float"),
    ("range for a string", "taylor_softmax", "backward", "type: int, low: 1, high: 2",
     "params.backward.type: expected categorical (backward takes a string), got int"),
]


@pytest.mark.parametrize(("label", "loss", "name", "spec", "message"), DISTRIBUTION_ERRORS,
                         ids=[e[0] for e in DISTRIBUTION_ERRORS])
def test_optuna_judges_distributions_at_load(tmp_path: Path, label: str, loss: str, name: str, spec: str,
                                             message: str) -> None:
    assert f"losses.{loss}.{message}" in _error(tmp_path, _one_param(loss, name, spec))


def test_suggestions_come_from_the_distributions_validated_at_load(tmp_path: Path) -> None:
    space = _space(tmp_path, """task: sst5
losses:
  as_speed:
    params:
      delta: {type: float, low: 0.1, high: 0.5, step: 0.1}
      lam: {type: float, low: 0.1, high: 10.0, log: true}
      max_steps: {type: int, low: 2, high: 8, step: 2}
  taylor_softmax:
    params:
      backward: {type: categorical, choices: [finite, inf]}
""")
    params = [d for loss in space.losses.values() for d in loss.params]
    assert [d.type for d in params] == ["float", "float", "int", "categorical"]
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    drawn: dict[str, set[Any]] = {d.name: set() for d in params}
    for _ in range(30):
        trial = study.ask()
        for d in params:
            drawn[d.name].add(d.suggest(trial))
            assert trial.distributions[d.name] == d.dist  # the very distribution optuna validated at load
        study.tell(trial, 0.0)
    assert {round(x, 9) for x in drawn["delta"]} == {0.1, 0.2, 0.3, 0.4, 0.5}
    assert all(0.1 <= x <= 10.0 for x in drawn["lam"]) and max(drawn["lam"]) > 1.0 > min(drawn["lam"])
    assert drawn["max_steps"] <= {2, 4, 6, 8} and drawn["backward"] == {"finite", "inf"}


def test_a_distribution_with_one_value_is_a_constant(tmp_path: Path) -> None:
    """A constant searched 20 times gives 20 identical trials; as a constant the loss repeats over seeds."""
    space = _space(tmp_path, """task: sst5
losses:
  sparse_softmax:
    params:
      k: {type: categorical, choices: [2]}
  as_speed:
    params:
      max_steps: {type: int, low: 3, high: 3}
      lam: {type: float, low: 0.5, high: 1.0}
""")
    assert space.losses["sparse_softmax"].params == () and space.losses["sparse_softmax"].fixed == {"k": 2}
    assert [d.name for d in space.losses["as_speed"].params] == ["lam"]
    assert space.losses["as_speed"].constants() == {"loss.max_steps": 3}
    mnli = load_search_space(SPACES_DIR / "mnli.yaml", "multiclass").losses["sparse_softmax"]
    assert mnli.params == () and mnli.fixed == {"k": 2}


def test_a_name_both_searched_and_fixed_is_refused(tmp_path: Path) -> None:
    text = GOOD + "    fixed: {delta: 0.3}\n"
    assert "losses.as_softmax.fixed: expected each name in params or in fixed, got ['delta'] " \
           "in both" in _error(tmp_path, text)


def test_numbers_yaml_reads_as_strings_are_numbers(tmp_path: Path) -> None:
    """PyYAML (YAML 1.1) reads 2e-5 as a string; the loader types values by TrialSettings and the loss."""
    space = _space(tmp_path, """task: sst5
fixed: {lr: 2e-5, weight_decay: "1e-2", epochs: 3}
losses:
  t_softmax:
    params:
      tau: {type: float, low: 1e-1, high: 1e+1, log: true}
    paper: {tau: 5e-1}
  softmax:
    params:
      lr: {type: categorical, choices: [1e-5, 3e-5]}
  as_speed:
    fixed: {max_steps: "3"}
""")
    assert space.fixed == {"lr": 2e-5, "weight_decay": 0.01, "epochs": 3.0}
    assert isinstance(space.fixed["epochs"], float)
    tau = space.losses["t_softmax"].params[0].dist
    assert (tau.low, tau.high) == (0.1, 10.0) and space.losses["t_softmax"].paper == {"tau": 0.5}
    assert space.losses["softmax"].params[0].dist.choices == (1e-5, 3e-5)
    assert space.losses["as_speed"].fixed == {"max_steps": 3}


WRONG_TYPES = [
    ("fixed: {lr: fast}", "softmax: {}", "fixed.lr: expected a float, got 'fast'"),
    ("fixed: {batch_size: 3.5}", "softmax: {}", "fixed.batch_size: expected an integer, got 3.5"),
    ("fixed: {skip_masked_rows: maybe}", "softmax: {}",
     "fixed.skip_masked_rows: expected true or false, got 'maybe'"),
    ("fixed: {eval_every_steps: often}", "softmax: {}",
     "fixed.eval_every_steps: expected an integer or none, got 'often'"),
    ("fixed: {precision: 16}", "softmax: {}", "fixed.precision: expected a string, got 16"),
    ("", "as_speed: {fixed: {max_steps: 2.5}}",
     "losses.as_speed.fixed.max_steps: expected an integer, got 2.5"),
    ("", "taylor_softmax: {paper: {n: two}}",
     "losses.taylor_softmax.paper.n: expected an integer, got 'two'"),
    ("", "as_softmax: {fixed: {warmup_r: soon}}",
     "losses.as_softmax.fixed.warmup_r: expected a float, got 'soon'"),
]


@pytest.mark.parametrize(("top", "loss", "message"), WRONG_TYPES,
                         ids=[w[2].split(":")[0] for w in WRONG_TYPES])
def test_a_value_of_the_wrong_type_names_key_and_type(tmp_path: Path, top: str, loss: str,
                                                      message: str) -> None:
    assert message in _error(tmp_path, f"task: sst5\n{top}\nlosses:\n  {loss}\n")


BOMB = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True))


def test_alias_bomb_is_refused_fast_in_one_short_line(tmp_path: Path) -> None:
    """Nine levels of nine aliases (~400 bytes) expand to 387 million strings; the loader never expands
    them."""
    start = time.perf_counter()
    message = _error(tmp_path, BOMB)
    assert "invalid YAML at line 2, column 8: expected no aliases (write each value out), got *a" in message
    assert len(message) < 300 and time.perf_counter() - start < 5


FILE_SHAPES = [
    ("empty", "", "top level: expected a mapping with task and losses, got an empty file"),
    ("only comments", "# a search space\n",
     "top level: expected a mapping with task and losses, got an empty file"),
    ("a list", "- softmax\n", "top level: expected a mapping with task and losses, got list ['softmax']"),
    ("a scalar", "clinc_oos\n", "top level: expected a mapping with task and losses, got str 'clinc_oos'"),
    ("duplicate key", GOOD + "task: sst2\n",
     "invalid YAML at line 7, column 1: expected each key once, got 'task' twice"),
    ("duplicate nested key", GOOD.replace("high: 0.5", "high: 0.5, low: 0.2"),
     "expected each key once, got 'low' twice"),
    ("a key that is not a name", "task: sst5\nlosses:\n  softmax: {}\n  1: {}\n",
     "losses: expected names as keys, got int 1"),
    ("deep nesting", "[" * 20_000 + "]" * 20_000,
     "invalid YAML: expected a few levels of nesting, got too many"),
]


@pytest.mark.parametrize(("label", "text", "message"), FILE_SHAPES, ids=[f[0] for f in FILE_SHAPES])
def test_a_file_of_the_wrong_shape_gets_one_clear_line(tmp_path: Path, label: str, text: str,
                                                       message: str) -> None:
    assert message in _error(tmp_path, text)


def test_bytes_that_are_not_utf8_are_a_yaml_error(tmp_path: Path) -> None:
    path = tmp_path / "space.yaml"
    path.write_bytes(b"task: sst5\xff\n")
    with pytest.raises(UserError, match="invalid YAML"):
        load_search_space(path, "multiclass")


LONG = "x" * 100_000


@pytest.mark.parametrize("text", [
    f"task: sst5\nfixed: {{precision: {LONG}}}\nlosses: {{softmax: {{}}}}\n",  # TrialSettings's own message
    f"task: sst5\nfixed: {{lr: {LONG}}}\nlosses: {{softmax: {{}}}}\n",
    f"task: [{LONG}]\nlosses: {{softmax: {{}}}}\n",
    f"task: sst5\nlosses:\n  softmax: {{}}\n  ? {LONG}\n  : {{}}\n",  # YAML's explicit key: no length limit
    f"task: sst5\n? {LONG}\n: 1\n",
    f"task: sst5\nlosses:\n  softmax:\n    params:\n      ? {LONG}\n      : {{type: float}}\n",
    f"task: sst5\nlosses: {{taylor_softmax: {{fixed: {{backward: {LONG}}}}}}}\n",  # the loss's own message
], ids=["trial check", "type", "task", "loss name", "top key", "param name", "loss check"])
def test_a_long_value_is_quoted_as_a_short_excerpt(tmp_path: Path, text: str) -> None:
    message = _error(tmp_path, text)
    assert len(message) < 600 and "x" * 100 not in message


# -- --set KEY=VALUE ---------------------------------------------------------------------------------------
def _set(items: list[str]) -> dict[str, object]:
    """--set as the engine types it: split, then typed once and checked by the settings classes."""
    return check_overrides(parse_overrides(items), {})


def test_set_keys_are_the_trial_settings_without_their_own_option() -> None:
    fields = {f.name for f in dataclasses.fields(TrialSettings)}
    assert fields - {"loss", "loss_params"} - set(OWN_OPTIONS) == OVERRIDE_KEYS
    assert {"lr", "batch_size", "warmup_r", "precision"} <= OVERRIDE_KEYS
    # one way in: a setting with its own flag is refused by --set, which names the flag (the flags themselves:
    # tests/test_request.py)
    assert {"backbone", "encoder", "encode_precision", "data_dir", "max_train_samples", "max_eval_samples",
            "seed", "epochs", "max_length", "eval_every_steps"} == set(OWN_OPTIONS)


def test_set_values_are_typed_by_trial_config() -> None:
    assert parse_overrides(["lr=2e-5"]) == {"lr": "2e-5"}, "split only: typed once, by check_overrides"
    got = _set(["lr=2e-5", "batch_size = 16", "skip_masked_rows=true", "precision=fp32", "max_grad_norm=1"])
    assert got == {"lr": 2e-5, "batch_size": 16, "skip_masked_rows": True, "precision": "fp32",
                   "max_grad_norm": 1.0}
    assert [type(got[k]) for k in ("batch_size", "max_grad_norm")] == [int, float]
    assert _set([]) == {}


@pytest.mark.parametrize(("text", "value"), [("true", True), ("FALSE", False), ("1", True), ("0", False)])
def test_set_booleans(text: str, value: bool) -> None:
    assert _set([f"skip_masked_rows={text}"]) == {"skip_masked_rows": value}


@given(st.floats(min_value=0.0, exclude_min=True, allow_infinity=False))
def test_set_float_round_trips_its_repr(x: float) -> None:
    assert _set([f"max_grad_norm={x!r}"]) == {"max_grad_norm": x}


@pytest.mark.parametrize(("item", "message"), [
    ("max_grad_norm=0", "max_grad_norm: expected a number > 0"),
    ("batch_size=0", "batch_size: expected an integer"),
    ("weight_decay=-0.1", "weight_decay: expected a number >= 0"), ("lr=inf", "lr: expected a finite number"),
    ("lr=nan", "lr: expected a finite number")])
def test_set_refuses_settings_the_trainer_cannot_use(item: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        _set([item])


SET_ERRORS = [
    (["lr"], "--set: expected KEY=VALUE, got 'lr'"),
    (["=3"], "--set: expected KEY=VALUE, got '=3'"),
    (["no_such_key=1"], "--set: expected one of ['batch_size', 'lr', "),
    (["seed=3"], "--set: expected a key without its own option, got 'seed' (use --seed)"),
    (["epochs=3"], "--set: expected a key without its own option, got 'epochs' (use --max-epochs)"),
    (["max_length=64"], "--set: expected a key without its own option, got 'max_length' (use --max-length)"),
    (["loss=softmax"], "--set: expected one of"),
    (["lr=abc"], "--set lr: expected a float, got 'abc'"),
    (["batch_size=3.5"], "--set batch_size: expected an integer, got '3.5'"),
    (["skip_masked_rows=maybe"], "--set skip_masked_rows: expected true or false, got 'maybe'"),
    (["warmup_r=1.5"], "--set: warmup_r: expected a number in [0, 1), got 1.5"),
    (["precision=fp8"], "--set: precision: expected one of ('auto', 'fp32', 'bf16', 'fp16'), got 'fp8'"),
    (["lr=1e-3", "lr=2e-3"], "--set: expected each key once, got lr twice ('1e-3' and '2e-3')"),
    ([f"precision={LONG}"], "--set: precision: expected one of ('auto', 'fp32', 'bf16', 'fp16'), got 'xxxx"),
]


@pytest.mark.parametrize(("items", "message"), SET_ERRORS, ids=[e[1][:40] for e in SET_ERRORS])
def test_set_errors_are_one_line(items: list[str], message: str) -> None:
    with pytest.raises(UserError) as info:
        _set(items)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value) and len(str(info.value)) < 600


def test_with_overrides_sets_the_shared_fixed_settings() -> None:
    clinc = load_search_space(SPACES_DIR / "clinc_oos.yaml", "multiclass")
    faster = clinc.with_overrides(_set(["lr=1e-4", "batch_size=8"]))
    assert faster.overrides == {"batch_size": 8, "lr": 1e-4}
    assert clinc.fixed["lr"] == 2e-5, "the original space is unchanged"
    assert faster.losses == clinc.losses
    assert faster.fingerprint() != clinc.fingerprint()
    assert clinc.with_overrides({}).fingerprint() == clinc.fingerprint()
    assert clinc.with_overrides({"lr": 2e-5}).fingerprint() == clinc.fingerprint(), \
        "the file's own value: same space"


def test_with_overrides_pins_a_setting_a_loss_searches() -> None:
    """--set warmup_r=0 must reach every trial: as_softmax stops searching warmup_r instead of ignoring
    --set."""
    clinc = load_search_space(SPACES_DIR / "clinc_oos.yaml", "multiclass")
    pinned = clinc.with_overrides({"warmup_r": 0.0})
    for loss in ("as_softmax", "as_speed"):
        assert "warmup_r" in [d.name for d in clinc.losses[loss].params]
        assert "warmup_r" not in [d.name for d in pinned.losses[loss].params]
        assert "warmup_r" not in (pinned.losses[loss].paper or {}) and \
            "warmup_r" not in pinned.losses[loss].fixed
    assert pinned.losses["as_softmax"].paper == {"delta": 0.3}
    assert pinned.overrides["warmup_r"] == 0.0 and pinned.fingerprint() != clinc.fingerprint()


def test_with_overrides_pins_a_loss_fixed_setting_and_can_leave_nothing_to_search(tmp_path: Path) -> None:
    space = _space(tmp_path, """task: sst5
losses:
  as_softmax:
    params:
      warmup_r: {type: float, low: 0.0, high: 0.3}
  softmax:
    fixed: {lr: 1.0e-3}
""").with_overrides({"lr": 5e-4, "warmup_r": 0.1})
    assert space.losses["as_softmax"].params == (), "nothing left to search: the loss repeats over seeds"
    assert space.losses["softmax"].constants() == {}
    assert space.overrides == {"lr": 5e-4, "warmup_r": 0.1}


def test_with_overrides_checks_what_it_is_given() -> None:
    clinc = load_search_space(SPACES_DIR / "clinc_oos.yaml", "multiclass")
    with pytest.raises(UserError, match=r"^--set: expected one of .*, got unknown key 'delta'$"):
        check_overrides({"delta": "0.3"}, clinc.fixed)
    with pytest.raises(UserError, match=r"^--set batch_size: expected an integer, got '2.5'$"):
        check_overrides({"batch_size": "2.5"}, clinc.fixed)
    with pytest.raises(UserError, match=r"^--set: lr: expected a number > 0, got -1.0$"):
        check_overrides({"lr": "-1"}, clinc.fixed)


def test_k_above_classes_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "space.yaml"
    path.write_text("task: sst5\nlosses:\n  sparse_softmax:\n    params:\n"
                    "      k: {type: int, low: 2, high: 10}\n")
    space = load_search_space(path, "multiclass")
    with pytest.raises(UserError, match=r"expected k <= 5 \(the task's classes\), got k=10"):
        space.check_classes(5)


def test_fingerprint_changes_with_content(tmp_path: Path) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(GOOD)
    b.write_text(GOOD.replace("high: 0.5", "high: 0.4"))
    fa, fb = load_search_space(a, "multiclass").fingerprint(), \
        load_search_space(b, "multiclass").fingerprint()
    assert fa != fb and fa == load_search_space(a, "multiclass").fingerprint()


def test_trial_settings_reject_unknown_keys_and_round_trip() -> None:
    flat = {"loss": "as_softmax", "epochs": 2.0, "batch_size": 8, "lr": 1e-3, "loss.delta": 0.3,
            "warmup_r": 0.1}
    cfg = TrialSettings.from_dict(flat)
    assert cfg.loss_params == {"delta": 0.3}
    assert TrialSettings.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match=r"unknown trial setting\(s\) \['lrr'\]"):
        TrialSettings.from_dict({**flat, "lrr": 1.0})
    with pytest.raises(ValueError,
                       match=r"\['max_length'\] \(max_length: data settings, fixed for the whole search\)"):
        TrialSettings.from_dict({**flat, "max_length": 16})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=200))
def test_loader_fuzz_never_crashes_with_anything_but_user_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_text(text)
    try:
        load_search_space(path, "multiclass")
    except UserError as exc:
        assert "\n" not in str(exc)


def test_config_round_trips_through_mlflow_params() -> None:
    """What the report's --confirm rebuilds from a child run's params equals what the trial ran."""
    from tune_as.settings import DataSettings, from_params

    trial = TrialSettings.from_dict({"loss": "taylor_softmax", "epochs": 2.0, "batch_size": 8, "lr": 1e-3,
                                     "loss.n": 4, "loss.backward": "inf", "seed": 3,
                                     "eval_every_steps": None})
    data = DataSettings("sst5", data_dir=Path("/data/sst5"), backbone="tiny", max_length=16)
    params = {k: str(v) for k, v in {**data.to_params(), **trial.to_dict()}.items()} | {"git_commit": "abc"}
    got_data, got_trial = from_params(params)
    assert got_trial == trial and got_data == data
    assert got_trial.loss_params == {"n": 4, "backward": "inf"} and type(got_trial.epochs) is float


def test_the_default_space_follows_the_task_kind() -> None:
    """--task jsonl --task-arg kind=multilabel must not get the multi-class losses of jsonl.yaml."""
    assert default_space_path("jsonl", "multilabel").name == "jsonl_multilabel.yaml"
    assert default_space_path("jsonl", "multiclass").name == "jsonl.yaml"
    assert default_space_path("clinc_oos", "multiclass").name == "clinc_oos.yaml"
    space = load_search_space(default_space_path("jsonl", "multilabel"), "multilabel")
    assert "multilabel_softmax" in space.losses and "softmax" not in space.losses


def test_the_size_of_a_finite_space_is_counted_not_listed(tmp_path: Path) -> None:
    """A float range with step 1e-12 has ~10^11 values: counting them must not list them (it hung the
    driver)."""
    path = tmp_path / "space.yaml"
    path.write_text("task: digits\nlosses:\n  as_softmax:\n    params:\n"
                    "      delta: {type: float, low: 0.1, high: 0.2, step: 1.0e-12}\n"
                    "      warmup_r: {type: categorical, choices: [0.0, 0.1]}\n")
    space = load_search_space(path, "multiclass").losses["as_softmax"]
    assert space.size() == 2 * (round(0.1 / 1e-12) + 1)
    small = {d.name: d
             for d in load_search_space(SPACES_DIR / "digits.yaml", "multiclass").losses["sm_softmax"].params}
    assert all(d.count() == (len(d.values() or []) or None) for d in small.values())
