"""Multi-label tasks (tune_as/tasks/multilabel.py): goemotions end to end on generated files in its two
schemas (the local copy's JSON Lines, the hub's `simplified` config), where its data comes from without a
data_dir, the real copy in ../shared/data, and each multi-label loss's prediction rule through the trial's own
evaluation."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import fixtures_data as fx
import pytest
import torch
from conftest import REPO, shared_data

from tune_as.losses import LOSSES
from tune_as.tasks import DataSettings, PreparedData, Split, build_model, build_task, prepare
from tune_as.tasks.multilabel import multi_hot
from tune_as.tasks.sources import SHARED_DATA_ENV, shared_data_root
from tune_as.training.trial import Trial

HUB_ID = ("google-research-datasets/go_emotions", "simplified")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def goemotions(tmp_path_factory: pytest.TempPathFactory, cache: Path) -> PreparedData:
    """The generated copy of ../shared/data/goemotions, prepared as a search prepares it (tiny backbone)."""
    return tiny(fx.goemotions(tmp_path_factory.mktemp("goemotions")), cache)


def tiny(data_dir: Path | None, cache: Path) -> PreparedData:
    spec = DataSettings("goemotions", data_dir=data_dir, backbone="tiny", encoder="finetune", max_length=16,
                        cache_dir=cache)
    return prepare(build_task("goemotions"), spec)


def forbid_the_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail(f"went to the hub: {a}"))


# -- the task and its data -----------------------------------------------------------------------------------
def test_goemotions_is_a_multilabel_task_with_micro_f1_first() -> None:
    task = build_task("goemotions")
    assert (task.kind, task.metrics) == ("multilabel", ("micro_f1", "macro_f1"))  # [0] selects the trials
    d = task.defaults  # the GoEmotions authors' BERT baseline (docs/tasks.md)
    assert (d.epochs, d.batch_size, d.lr, d.max_length, d.backbone) == (4, 16, 5e-5, 50, "bert-base-cased")
    assert task.hub is not None and (task.hub.path, task.hub.name) == HUB_ID


def test_goemotions_files_prepare_to_28_multi_hot_columns(goemotions: PreparedData) -> None:
    data = goemotions
    assert data.test is not None
    assert (len(data.train), len(data.validation), len(data.test)) == fx.GOEMOTIONS_SIZES
    assert data.label_names == tuple(sorted(fx.GOEMOTIONS_LABELS))  # label names in a file: sorted ids
    for split, seed in ((data.train, 0), (data.test, 2)):
        rows = fx.goemotions_rows(len(split), seed)["labels"]
        names = [{fx.GOEMOTIONS_LABELS[i] for i in row} for row in rows]
        y = split.columns["labels"]
        assert y.dtype == torch.float32 and y.shape == (len(split), 28)
        assert [{data.label_names[c] for c in r.nonzero().flatten().tolist()} for r in y] == names
    batch = data.train.batch(torch.arange(5))
    assert build_model(data, head="linear", seed=0)(batch).shape == (5, 28)


def f1(tp: int, fp: int, fn: int) -> float:
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0


def test_goemotions_scores_micro_and_macro_f1_over_the_labels_present(goemotions: PreparedData) -> None:
    """Macro-F1 averages over the columns with a gold or predicted positive in the split
    (tune_as/tasks/metrics.py)."""
    split, task = goemotions.validation, build_task("goemotions")
    gold = split.columns["labels"].bool()
    # some of the 28 classes have no gold positive here: they must not count as 0
    assert not gold.any(0).all()
    assert task.score([gold[:7], gold[7:]], split) == {"micro_f1": 1.0, "macro_f1": 1.0}
    missed = gold.clone()
    c = int(gold[0].nonzero()[0])
    missed[0, c] = False  # one positive left out: a false negative
    extra = int((~gold.any(0)).nonzero()[0])
    # one class that no row has, predicted once: a false positive, and a class present
    missed[0, extra] = True
    # by hand, column by column: (tp, fp, fn), over the columns with a gold or predicted positive
    counts = [(int(gold[:, j].sum()) - (j == c), int(j == extra), int(j == c)) for j in range(28)]
    present = [k for k in counts if sum(k)]
    expected = {"micro_f1": f1(*(sum(k[i] for k in counts) for i in range(3))),
                "macro_f1": sum(f1(*k) for k in present) / len(present)}
    assert len(present) == int(gold.any(0).sum()) + 1
    assert task.score([missed], split) == pytest.approx(expected)
    assert expected["micro_f1"] < 1.0 and expected["macro_f1"] < task.score([gold], split)["macro_f1"]


# -- where the data comes from without a data_dir ------------------------------------------------------------
def test_shared_data_root_is_beside_the_checkout_unless_the_environment_names_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SHARED_DATA_ENV, raising=False)
    assert shared_data_root() == REPO.parent / "shared" / "data"
    monkeypatch.setenv(SHARED_DATA_ENV, str(tmp_path))
    assert shared_data_root() == tmp_path


def test_without_data_dir_the_shared_copy_is_read_and_a_data_dir_wins(
        tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = fx.goemotions(tmp_path / "shared" / "goemotions")
    mine = fx.goemotions(tmp_path / "mine", sizes=(40, 10, 10))
    monkeypatch.setenv(SHARED_DATA_ENV, str(tmp_path / "shared"))
    forbid_the_hub(monkeypatch)
    assert build_task("goemotions").default_data_dir() == copy
    data = tiny(None, cache)
    # the spec says what was read
    assert data.spec.data_dir == copy and len(data.train) == fx.GOEMOTIONS_SIZES[0]
    given = tiny(mine, cache)
    assert given.spec.data_dir == mine and len(given.train) == 40
    # a task without a shared copy keeps its hub dataset
    assert build_task("eurlex").default_data_dir() is None


def test_without_a_shared_copy_the_hub_simplified_config_is_loaded(
        tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    saved, calls = fx.goemotions_hub(tmp_path / "hub"), []

    def load_dataset(path: str, name: str | None = None) -> datasets.DatasetDict:
        calls.append((path, name))
        return datasets.load_from_disk(str(saved))

    monkeypatch.setenv(SHARED_DATA_ENV, str(tmp_path / "nothing here"))
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    assert build_task("goemotions").default_data_dir() is None
    data = tiny(None, cache)
    assert calls == [HUB_ID] and data.spec.data_dir is None
    assert data.label_names == tuple(fx.GOEMOTIONS_LABELS)  # the hub's ClassLabel order: neutral last
    assert data.test is not None
    assert (len(data.train), len(data.validation), len(data.test)) == fx.GOEMOTIONS_SIZES
    first = fx.goemotions_rows(fx.GOEMOTIONS_SIZES[0], 0)["labels"][0]
    assert data.train.columns["labels"][0].nonzero().flatten().tolist() == first


def test_the_real_goemotions_copy_has_the_published_splits_and_28_labels() -> None:
    folder = shared_data("goemotions")  # skips, naming the path, where ../shared/data is absent
    meta = json.loads((folder / "meta.json").read_text())
    task = build_task("goemotions")
    assert task.default_data_dir() == folder  # what a search without --data-dir reads
    raw, notes = task.raw_splits(folder)
    assert {s: len(r) for s, r in raw.items()} == {"train": 43410, "validation": 5426, "test": 5427} and \
        not notes
    labels = task.fit_labels(raw["train"])
    assert len(labels) == 28 and set(labels.names) == set(meta["labels"])
    # lists, read as lists
    several = {s: sum(len(row) > 1 for row in r.columns["labels"]) for s, r in raw.items()}
    assert several == meta["multi_label_rows"] == {"train": 7102, "validation": 878, "test": 837}


# -- prediction rules, through the trial's evaluation --------------------------------------------------------
# Hand-set logits of classes 0-3 (the other 24 are -4) and the label sets each rule gives. Eq. 14 and its
# variants (multilabel_softmax, _t_softmax, _sparse_softmax, _as_softmax, as_speed) predict o > 0 (o / tau > 0
# for tau > 0 is the same set); bce predicts sigmoid(o) > 0.5, i.e. o > 0 as well.
LOGITS = [
    [2.0, -1.0, 0.5, -3.0],  # {0, 2}
    [-0.5, -0.2, -2.0, -1.0],  # {}: no positive logit predicts nothing (no fallback to the highest)
    [0.0, 1e-3, -1e-3, -2.0],  # {1}: strictly above 0 (sigmoid(0) = 0.5 is not > 0.5; sigmoid(1e-3) is)
    [3.0, 2.9, 2.8, 0.1],  # {0, 1, 2, 3}
]
EXPECTED = [[0, 2], [], [1], [0, 1, 2, 3]]
HPARAMS: dict[str, dict[str, Any]] = {  # settings away from the defaults where they could change the rule
    "multilabel_t_softmax": {"loss.tau": 0.5}, "multilabel_sparse_softmax": {"loss.k": 2},
    "multilabel_as_softmax": {"loss.delta": 0.3}, "as_speed": {"loss.delta": 0.3},
}
MULTILABEL_LOSSES = sorted(name for name, cls in LOSSES.items() if "multilabel" in cls.kinds)


class RowLogits(torch.nn.Module):
    """A model whose logits for row i are `logits[i]` (the split's "row" column)."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = logits

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.logits[batch["row"]]


class NoReports:
    def wants_checkpoint(self, final: bool) -> bool:
        return False

    def report(self, metrics: dict[str, Any], checkpoint_dir: Path | None) -> None:
        raise AssertionError("evaluation reports nothing")


def evaluate(data: PreparedData, loss: str, logits: list[list[float]],
             gold: list[list[int]]) -> tuple[dict[str, float], float]:
    """The scores and mean loss `Trial.evaluate` gives for these logits (classes 0-3; the rest -4) and gold
    sets."""
    full = torch.full((len(logits), data.num_labels), -4.0)
    full[:, :4] = torch.tensor(logits)
    split = Split({"row": torch.arange(len(logits)), "labels": multi_hot(gold, data.num_labels)})
    config = {"loss": loss, "epochs": 1.0, "batch_size": 8, "lr": 1e-3, **HPARAMS.get(loss, {})}
    trial = Trial(config, data, build_task("goemotions"), NoReports())
    trial.model = RowLogits(full)
    scores, mean_loss, _ = trial.evaluate(split)
    return scores, mean_loss


def test_the_documented_rules_name_every_multilabel_loss() -> None:
    """docs/losses.md's "Multi-label prediction" table has one row per multi-label loss of the registry."""
    section = (REPO / "docs" / "losses.md").read_text().split("### Multi-label prediction")[1].split("\n#")[0]
    documented = re.findall(r"^\| `(\w+)` \|", section, flags=re.M)
    assert sorted(documented) == MULTILABEL_LOSSES and len(MULTILABEL_LOSSES) == 6
    assert set(HPARAMS) <= set(MULTILABEL_LOSSES)


@pytest.mark.parametrize("loss", MULTILABEL_LOSSES)
def test_each_multilabel_loss_predicts_its_documented_label_sets(loss: str, goemotions: PreparedData) -> None:
    # Gold = the expected sets: micro F1 is 1 iff every predicted set equals its expected set (no row may gain
    # or lose a class); macro F1 averages the 4 columns with positives (the other 24 have none, gold or
    # predicted).
    scores, _ = evaluate(goemotions, loss, LOGITS, EXPECTED)
    assert scores == {"micro_f1": 1.0, "macro_f1": 1.0}


@pytest.mark.parametrize("loss", ["multilabel_as_softmax", "as_speed"])
def test_an_as_masked_row_can_still_be_predicted_wrong(loss: str, goemotions: PreparedData) -> None:
    """The gap the AS-Softmax paper names (Sec. 4.4): Eq. 15-17 compare probabilities, the test rule compares
    logits with 0. Gold {0}, o_0 = -1 and every other logit -4: p_0 beats each negative by more than delta, so
    the row is masked (loss 0), yet no logit is above 0 and the row predicts no label."""
    scores, mean_loss = evaluate(goemotions, loss, [[-1.0, -4.0, -4.0, -4.0]], [[0]])
    assert mean_loss == 0.0 and scores["micro_f1"] == 0.0
    # Eq. 14 pushes
    assert evaluate(goemotions, "multilabel_softmax", [[-1.0, -4.0, -4.0, -4.0]], [[0]])[1] > 0.5
