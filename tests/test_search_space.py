"""Search spaces: every shipped YAML loads and names real (task, loss) pairs; bad files fail clearly."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tune_as.config import TrialConfig
from tune_as.errors import UserError
from tune_as.losses import LOSSES
from tune_as.search_space import SPACES_DIR, config_key, load_search_space
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
                if value is not None and dist.type != "categorical":
                    assert dist.low <= value <= dist.high, (name, dist.name, value)


def test_paper_settings_match_table6() -> None:
    clinc = load_search_space(SPACES_DIR / "clinc_oos.yaml", "multiclass")
    assert clinc.losses["as_softmax"].paper == {"delta": 0.3, "warmup_r": 0.15}
    assert clinc.losses["as_speed"].paper == {"delta": 0.3, "warmup_r": 0.15, "lam": 0.5, "max_steps": 5}
    assert clinc.fixed == {"epochs": 10, "batch_size": 32, "lr": 2e-5, "max_length": 64}
    assert load_search_space(SPACES_DIR / "sst5.yaml", "multiclass").losses["am_softmax"].paper == {"s": 10, "m": 0.3}


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
    ("empty range", GOOD.replace("low: 0.1", "low: 0.5"), "expected low < high"),
    ("wrong type", GOOD.replace("low: 0.1", "low: high"), "expected low to be a number, got 'high'"),
    ("unknown param", GOOD.replace("delta:", "gamma:"), "unknown parameter(s) ['gamma']"),
    ("negative lambda", "task: sst5\nlosses:\n  as_speed:\n    params:\n      lam: {type: float, low: -1.0, high: 1.0}\n",
     "losses.as_speed.params.lam"),
    ("s below 1", "task: sst5\nlosses:\n  as_speed:\n    fixed: {max_steps: 0}\n", "losses.as_speed.fixed"),
    ("bad dist type", GOOD.replace("type: float", "type: gaussian"), "expected type one of"),
    ("no losses", "task: sst5\nlosses: {}\n", "expected at least one loss"),
    ("trials not int", GOOD + "trials_per_loss: many\n", "trials_per_loss: expected an integer >= 1, got 'many'"),
    ("loss of wrong kind", "task: sst5\nlosses:\n  bce: {}\n", "does not apply to multiclass tasks"),
    ("bad trial setting", "task: sst5\nfixed: {epochs: -1}\nlosses:\n  softmax: {}\n", "epochs must be > 0"),
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


def test_k_above_classes_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "space.yaml"
    path.write_text("task: sst5\nlosses:\n  sparse_softmax:\n    params:\n      k: {type: int, low: 2, high: 10}\n")
    space = load_search_space(path, "multiclass")
    with pytest.raises(UserError, match=r"expected k <= 5 \(the task's classes\), got k=10"):
        space.check_classes(5)


def test_fingerprint_changes_with_content(tmp_path: Path) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(GOOD)
    b.write_text(GOOD.replace("high: 0.5", "high: 0.4"))
    fa, fb = load_search_space(a, "multiclass").fingerprint(), load_search_space(b, "multiclass").fingerprint()
    assert fa != fb and fa == load_search_space(a, "multiclass").fingerprint()


def test_trial_config_rejects_unknown_keys_and_round_trips() -> None:
    flat = {"task": "sst5", "loss": "as_softmax", "epochs": 2.0, "batch_size": 8, "lr": 1e-3, "max_length": 16,
            "backbone": "tiny", "loss.delta": 0.3, "warmup_r": 0.1}
    cfg = TrialConfig.from_dict(flat)
    assert cfg.loss_params == {"delta": 0.3}
    assert TrialConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match=r"unknown trial config keys \['lrr'\]"):
        TrialConfig.from_dict({**flat, "lrr": 1.0})


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
    from tune_as.tuning import config_from_params

    flat = TrialConfig.from_dict({"task": "sst5", "loss": "taylor_softmax", "epochs": 2.0, "batch_size": 8,
                                  "lr": 1e-3, "max_length": 16, "backbone": "tiny", "loss.n": 4,
                                  "loss.backward": "inf", "seed": 3}).to_dict()
    params = {k: str(v) for k, v in flat.items()} | {"git_commit": "abc"}
    assert config_from_params(params) == flat
    assert config_from_params(params)["loss.backward"] == "inf"
