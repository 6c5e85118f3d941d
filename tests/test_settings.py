"""tune_as.settings: what MLflow logs of a trial's settings reads back as the same settings.

A run logs only the settings its task and loss use (`unused`): the report rebuilds its settings from those
params (`from_params`), so every loss, on an image task and on a text task, must read back exactly as it ran.
The params are taken where the search makes them: its MLflow callback's trial start (engine.callbacks).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from tune_as.engine.callbacks import MlflowCallback
from tune_as.losses import LOSSES
from tune_as.settings import DataSettings, TrialSettings, from_params, unused
from tune_as.tasks import TASKS
from tune_as.tracking import schema

FROZEN = DataSettings("clinc_oos", backbone="tiny", encoder="frozen", encode_precision="bf16", max_length=64)
DATA = {  # an image task (no tokenizer, nothing to freeze) and a text task, fine-tuned and frozen
    "image": DataSettings("digits", backbone="cnn"),
    "text": DataSettings("sst5", data_dir=Path("/data/sst5"), backbone="tiny", max_length=32),
    "frozen text": FROZEN,
}


class Started:
    """Stands in for the search's tracker: what the callback asks it to log when a trial starts, as strings,
    None left out (the tracker's own rule)."""

    search_id = "settings-test"

    def __init__(self) -> None:
        self.params: dict[str, str] = {}
        self.tags: dict[str, str] = {}

    def trial_started(self, trial_id: str, config: dict[str, Any], tags: dict[str, str], name: str,
                      settle: bool = False) -> None:
        self.params = {k: str(v) for k, v in config.items() if v is not None}
        self.tags = tags


@dataclasses.dataclass
class RayTrial:
    """The parts of a Tune trial the callback reads."""

    config: dict[str, Any]
    trial_id: str = "t1"
    experiment_tag: str = "3_loss=x"
    last_result: dict[str, Any] = dataclasses.field(default_factory=dict)


def logged(data: DataSettings, settings: TrialSettings) -> Started:
    tracker = Started()
    callback = MlflowCallback(tracker, "accuracy", schema.ROLE_TRIAL,  # type: ignore[arg-type]
                              data.to_params(), uses_backbone=TASKS[data.task].uses_backbone,
                              searched={settings.loss: tuple(f"loss.{k}" for k in settings.loss_params)})
    callback.on_trial_start(0, [], RayTrial(settings.to_dict()))
    return tracker


@pytest.mark.parametrize("kind", list(DATA))
@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_the_logged_params_read_back_as_the_settings_the_trial_ran(kind: str, loss: str) -> None:
    data = DATA[kind]
    settings = TrialSettings(loss=loss, epochs=3.0, batch_size=16, lr=2e-5, seed=7,
                             loss_params=LOSSES[loss]().hparams(),
                             warmup_r=0.1 if LOSSES[loss].supports_warmup else 0.0)
    params = logged(data, settings).params
    # the data settings as MLflow holds them: without where the cache is and which seed prepared the data
    assert from_params(params) == (dataclasses.replace(data, seed=0, cache_dir=DataSettings("x").cache_dir),
                                   settings)
    image = kind == "image"
    assert ("max_length" in params, "encoder" in params) == (not image, not image)
    assert ("encode_precision" in params) == (data.encoder == "frozen")
    assert ("warmup_r" in params) == LOSSES[loss].supports_warmup
    assert ("skip_masked_rows" in params) == LOSSES[loss].supports_row_skipping
    assert {"lr", "epochs", "batch_size", "seed", "loss", "task", "backbone"} <= set(params)


def test_a_setting_a_loss_ignores_is_still_logged_when_it_is_not_the_default() -> None:
    """Dropped, it would read back as the default: what was asked is kept, and reads back as asked."""
    data = dataclasses.replace(DATA["image"], max_length=64)
    settings = TrialSettings(loss="softmax", epochs=1.0, batch_size=8, lr=1e-3, warmup_r=0.2)
    params = logged(data, settings).params
    assert params["max_length"] == "64" and params["warmup_r"] == "0.2"
    assert from_params(params)[1] == settings
    assert unused({"loss": "softmax", "warmup_r": 0.0, "max_length": 128, "encoder": "finetune"},
                  uses_backbone=False) == {"warmup_r", "max_length", "encoder"}
    assert unused({"loss": "as_softmax", "warmup_r": 0.0, "skip_masked_rows": False}, uses_backbone=True) == \
        set()


def test_a_runs_tags_say_its_setting_as_the_answer_prints_it() -> None:
    settings = TrialSettings(loss="as_softmax", epochs=1.0, batch_size=8, lr=1e-3,
                             loss_params={"delta": 0.123456}, warmup_r=0.1)
    tags = logged(DATA["text"], settings).tags
    assert tags[schema.SETTING] == "delta=0.1235" and tags[schema.LOSS] == "as_softmax"
    plain = TrialSettings("softmax", 1.0, 8, 1e-3)
    assert logged(DATA["text"], plain).tags[schema.SETTING] == "none searched"
