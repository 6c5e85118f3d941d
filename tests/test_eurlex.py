"""The eurlex task's two layouts (tune_as/tasks/multilabel.py `EurLex`): EURLEX57K (JSON Lines + labels.json,
as ../shared/data/eurlex) and LexGLUE's eurlex (the hub or its save_to_disk copy). Each prepare says in one
line which label set it uses, built or read from the cache, and a printed label carries its concept name where
the data has one. Generated files of both layouts, and the real copy where present."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import fixtures_data as fx
import pytest
from conftest import shared_data

from tune_as.tasks import DataSettings, PreparedData, build_task, prepare


def eurlex(data_dir: Path | None, cache: Path, **kw: object) -> PreparedData:
    spec = DataSettings("eurlex", data_dir=data_dir, backbone="tiny", encoder=kw.pop("encoder", "finetune"),
                        max_length=kw.pop("max_length", 32), cache_dir=cache, **kw)  # type: ignore[arg-type]
    return prepare(build_task("eurlex"), spec)


def label_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("eurlex: ")
            and "concepts" in r.getMessage()]


@pytest.mark.parametrize("encoder", ["finetune", "frozen"])
def test_eurlex57k_says_its_label_set_once_per_prepare_built_or_cached(
        encoder: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = fx.eurlex57k(tmp_path / "eurlex")
    expected = ("eurlex: EURLEX57K, 12 EUROVOC concepts (labels present in train: 10, the model's outputs; "
                "most frequent: 'adhesive', 'State trading', 'retail trade')")
    for _ in ("built", "cached"):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="tune_as"):
            data = eurlex(folder, tmp_path / "cache", encoder=encoder)
        assert label_lines(caplog) == [expected]  # once, also when a frozen prepare tokenizes first
    assert sorted(data.label_names, key=int) == fx.EURLEX57K_IN_TRAIN  # the `labels` field: train's concepts


def test_a_training_subset_says_how_many_concepts_its_documents_carry(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = fx.eurlex57k(tmp_path / "eurlex")
    with caplog.at_level(logging.WARNING, logger="tune_as"):
        data = eurlex(folder, tmp_path / "cache", max_train_samples=3)
    present = int((data.train.columns["labels"].sum(0) > 0).sum())
    assert data.num_labels == 10 and present < 10  # the label map still comes from the whole train split
    (line,) = label_lines(caplog)
    assert f"(labels present in train: 10, the model's outputs; {present} of them in the 3 training " \
           "documents kept; " in line


def test_lexglue_save_to_disk_and_hub_say_level2_concepts(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    folder = fx.eurlex(tmp_path / "lexglue")
    with caplog.at_level(logging.WARNING, logger="tune_as"):
        eurlex(folder, tmp_path / "cache")
    assert label_lines(caplog) == [
        f"eurlex: LexGLUE eurlex, 12 level-2 EUROVOC concepts ({folder}; no concept names in the data)"]
    monkeypatch.setattr(datasets, "load_dataset",
                        lambda path, name=None: datasets.load_from_disk(str(folder)))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tune_as"):
        eurlex(None, tmp_path / "cache")
    assert label_lines(caplog) == [
        "eurlex: LexGLUE eurlex, 12 level-2 EUROVOC concepts (coastalcph/lex_glue (eurlex); no concept names "
        "in the data)"]


def test_a_printed_concept_carries_its_name(tmp_path: Path) -> None:
    """A validation concept that train lacks (here: `labels_all` copied into `labels`) is refused, named by id
    and name, and so are the training concepts the message lists."""
    import gzip

    folder = fx.eurlex57k(tmp_path / "eurlex")
    path = folder / "validation.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]
    fx.write_jsonl(path, [dict(row, labels=row["labels_all"]) for row in rows])
    # every fifth row has one
    zero_shot = next(c for c in rows[0]["labels_all"] if c not in fx.EURLEX57K_IN_TRAIN)
    with pytest.raises(ValueError) as err:
        eurlex(folder, tmp_path / "cache")
    assert str(err.value).startswith(
        f"{path}:1: label '{zero_shot}' ({fx.EURLEX57K_NAMES[zero_shot]}) in the validation split does not "
        "occur in the training split; expected one of the 10 training labels (10 (domestic trade), 11 "
        "(international trade), ")


@pytest.mark.slow
def test_the_real_eurlex57k_copy_says_4271_concepts_4108_in_train(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    folder = shared_data("eurlex")
    with caplog.at_level(logging.WARNING, logger="tune_as"):
        data = eurlex(folder, tmp_path, max_length=16, max_train_samples=200, max_eval_samples=20)
    (line,) = label_lines(caplog)
    assert data.num_labels == 4108
    assert line.startswith("eurlex: EURLEX57K, 4,271 EUROVOC concepts (labels present in train: 4,108, the "
                           "model's outputs; ") and \
        "of them in the 200 training documents kept; most frequent: '" in line
